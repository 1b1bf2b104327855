#!/usr/bin/env bash
# The demo: builds kpng, creates a sandbox node with pods in network namespaces, runs kpng on
# examples/cluster.yaml with the nftables backend (or the one named: nft, iptables, userspace,
# ebpf), and shows traffic being balanced. Every line is checked; the demo exits 1 when one
# does not hold.
#
#   ./scripts/demo.sh [nft|iptables|userspace|ebpf]
#
# Needs root (namespaces, nftables); installs what it uses when missing: nftables and
# iproute2, clang and libbpf-dev (kpng's build compiles the eBPF backend's programs), and
# iptables for the iptables backend. A node built by hand instead needs hairpin on the bridge
# ports, a default route and routes for the LB IPs (docs/architecture.md, "sandbox node").
set -euo pipefail
cd "$(dirname "$0")/.."
backend="${1:-nft}"
case "$backend" in
  nft|iptables|userspace|ebpf) ;;
  -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "unknown backend \"$backend\": nft, iptables, userspace or ebpf" >&2; exit 2 ;;
esac
if [ "$(id -u)" != 0 ]; then
  echo "the demo needs root: it creates network namespaces and programs nftables inside them" >&2
  exit 1
fi
need=()
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v clang >/dev/null 2>&1 || need+=(clang)
[ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
if [ "$backend" = iptables ]; then
  command -v iptables >/dev/null 2>&1 || need+=(iptables)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
echo "== building"
cargo build --quiet -p kpng -p kpng-testkit --bins
# Where cargo put them: CARGO_TARGET_DIR or a `target-dir` in a cargo config moves them out of
# target/ (and a stale target/debug/kpng left there must not be run instead).
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bin="${target_dir:?cargo metadata did not name the target directory}/debug"
echo "== the node-local model kpng computes for node1 (kpng file --input examples/cluster.yaml to-file):"
timeout 3 "$bin/kpng" file --input examples/cluster.yaml --node-name node1 \
  --healthz-bind-address 127.0.0.1:0 --metrics-bind-address "" --admin-socket "" \
  --log-level warn to-file --output - \
  | sed -n '1,40p' || true
echo "   … (full model: examples/cluster.node1.yaml)"
echo
exec "$bin/kpng-demo" --kpng "$bin/kpng" --input examples/cluster.yaml --backend "$backend"
