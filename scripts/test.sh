#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs the system packages the tests need (when
# missing and when we are root), then runs every test, clippy and rustfmt.
#
# Root-only tests (real packets in network namespaces) run when this runs as root; without root
# they print why they skip, and under CI=true they fail instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v conntrack >/dev/null 2>&1 || need+=(conntrack)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
command -v curl >/dev/null 2>&1 || need+=(curl)
# The bench's plots label their axes with DejaVu Sans.
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "== installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "== missing ${need[*]} and not root: root-only tests will skip"
  fi
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo test"
cargo test --workspace --locked

echo "== benchmark smoke run (kpng-bench all --quick)"
if [ "$(id -u)" = 0 ]; then
  cargo build --quiet --locked -p kpng -p kpng-bench
  target/debug/kpng-bench all --quick --kpng target/debug/kpng > /tmp/kpng-bench-quick.md
  tail -n 12 /tmp/kpng-bench-quick.md
else
  echo "skipping the benchmark smoke run: needs root (network namespaces, nftables)"
fi
