#!/usr/bin/env bash
# The demo: builds kpng, creates a sandbox node with pods in network namespaces, runs kpng on
# examples/cluster.yaml with the nftables backend (or the one named: nft, iptables, userspace,
# ebpf), and shows traffic being balanced. Every line is checked; the demo exits 1 when one
# does not hold.
#
#   ./scripts/demo.sh [nft|iptables|userspace|ebpf]
#
# Needs root (namespaces, nftables) and, unless KPNG_BIN_DIR is set, Rust (cargo) at the
# version of Cargo.toml's rust-version or newer (https://rustup.rs); installs what else it
# uses when missing: nftables and iproute2, clang and libbpf-dev (kpng's build compiles the
# eBPF backend's programs), and iptables for the iptables backend. A node built by hand
# instead needs hairpin on the bridge ports, a default route and routes for the LB IPs
# (docs/architecture.md, "sandbox node").
#
# Environment:
#   KPNG_BIN_DIR=DIR           run DIR/kpng and DIR/kpng-demo, built already; no cargo needed
#   KPNG_DEMO_PAUSE_SECS=N     keep the sandbox N seconds before removing it, to run the
#                              printed `ip netns exec …`, `kpng status` and `kpng trace` lines
set -euo pipefail
cd "$(dirname "$0")/.."
backend="${1:-nft}"
case "$backend" in
  nft|iptables|userspace|ebpf) ;;
  # The comment block above, up to its first line that is not a comment.
  -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
  *) echo "unknown backend \"$backend\": nft, iptables, userspace or ebpf" >&2; exit 2 ;;
esac
if [ "$(id -u)" != 0 ]; then
  echo "the demo needs root: it creates network namespaces and programs nftables inside them" >&2
  exit 1
fi
need=()
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
if [ -z "${KPNG_BIN_DIR:-}" ]; then
  # Only the build needs them.
  command -v clang >/dev/null 2>&1 || need+=(clang)
  [ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
fi
if [ "$backend" = iptables ]; then
  command -v iptables >/dev/null 2>&1 || need+=(iptables)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ -n "${KPNG_BIN_DIR:-}" ]; then
  bin="$KPNG_BIN_DIR"
  for b in kpng kpng-demo; do
    [ -x "$bin/$b" ] || { echo "KPNG_BIN_DIR=$bin holds no executable $b" >&2; exit 1; }
  done
  echo "== using the binaries in $bin (KPNG_BIN_DIR)"
else
  rust_version=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
  if ! command -v cargo >/dev/null 2>&1; then
    echo "the demo builds kpng with cargo, which is not on PATH: install Rust $rust_version or newer (https://rustup.rs; as root, the demo runs as root), or set KPNG_BIN_DIR to a directory holding kpng and kpng-demo built already" >&2
    exit 1
  fi
  echo "== building kpng and kpng-demo (Rust $rust_version or newer; the first build takes minutes)"
  cargo build -p kpng -p kpng-testkit --bins
  # Where cargo put them: CARGO_TARGET_DIR or a `target-dir` in a cargo config moves them out of
  # target/ (and a stale target/debug/kpng left there must not be run instead).
  target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
  bin="${target_dir:?cargo metadata did not name the target directory}/debug"
fi
echo "== the node-local model kpng computes for node1 (kpng file --input examples/cluster.yaml to-file):"
timeout 3 "$bin/kpng" file --input examples/cluster.yaml --node-name node1 \
  --log-level warn to-file --output - \
  | sed -n '1,40p' || true
echo "   … (full model: examples/cluster.node1.yaml)"
echo
exec "$bin/kpng-demo" --kpng "$bin/kpng" --input examples/cluster.yaml --backend "$backend"
