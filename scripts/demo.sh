#!/usr/bin/env bash
# The demo: builds kpng, creates a sandbox node with pods in network namespaces, runs kpng on
# examples/cluster.yaml with the nftables backend, and shows traffic being balanced.
# Needs root (namespaces, nftables); installs nftables/iproute2 when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "the demo needs root: it creates network namespaces and programs nftables inside them" >&2
  exit 1
fi
need=()
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
echo "== building"
cargo build --quiet -p kpng -p kpng-testkit --bins
echo "== the node-local model kpng computes for node1 (kpng file --input examples/cluster.yaml to-file):"
timeout 3 target/debug/kpng file --input examples/cluster.yaml --node-name node1 \
  --healthz-bind-address 127.0.0.1:0 --metrics-bind-address "" --log-level warn to-file --output - \
  | sed -n '1,40p' || true
echo "   … (full model: examples/cluster.node1.yaml)"
echo
exec target/debug/kpng-demo --kpng target/debug/kpng --input examples/cluster.yaml
