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
# The status page's test loads it in a real browser (headless).
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# The eBPF backend's programs are C, compiled by clang against libbpf's headers from build.rs,
# which runs at the first cargo command below (clippy): installed before it. Its tests list the
# attached programs with bpftool.
command -v clang >/dev/null 2>&1 || need+=(clang)
[ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
command -v bpftool >/dev/null 2>&1 || need+=(bpftool)
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

# A clean checkout gains nothing from cargo's incremental cache (gigabytes, written once).
if [ "${CI:-}" = true ]; then
  export CARGO_INCREMENTAL=0
fi
# The build needs several gigabytes; when the disk fills, the linker dies with a "Bus error"
# that does not say why. Say it first.
# Where cargo builds: CARGO_TARGET_DIR, a `target-dir` in a cargo config, else target/.
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
target_dir="${target_dir:-target}"
mkdir -p "$target_dir"
free_kb=$(df -Pk "$target_dir" | awk 'NR == 2 {print $4}')
if [ -n "$free_kb" ] && [ "$free_kb" -lt $((8 * 1024 * 1024)) ]; then
  echo "== WARNING: only $((free_kb / 1024)) MB free under $target_dir; the build and tests need about 8 GB"
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

# Broken intra-doc links and public docs pointing at private items fail here, not in a reader's
# browser.
echo "== cargo doc"
RUSTDOCFLAGS='-D warnings' cargo doc --workspace --no-deps --locked

# kpng's default admin socket: every kpng a test starts names its own (--admin-socket under its
# temp dir, or "" for none), so the suite leaves no /run/kpng/kpng.sock behind. One left (a new
# file, or another than before) means a test ran kpng with the default and killed it (SIGKILL
# skips the removal at shutdown): it would stay on the host, and two such tests at once share it.
default_admin_socket=/run/kpng/kpng.sock
admin_socket_id() { stat -c '%i %Y' "$default_admin_socket" 2>/dev/null || echo none; }
admin_socket_before=$(admin_socket_id)
check_default_admin_socket() {
  local now
  # A test (or kpng) that replaced /dev/null with a file would break every later command.
  if [ ! -c /dev/null ]; then
    echo "FAILED: $1 replaced /dev/null (no longer a character device)"
    exit 1
  fi
  now=$(admin_socket_id)
  if [ "$now" != none ] && [ "$now" != "$admin_socket_before" ]; then
    echo "FAILED: $1 left kpng's default admin socket $default_admin_socket: a kpng was started"
    echo "without --admin-socket and killed. Give every test kpng its own (a path under its temp"
    echo "dir, or --admin-socket= for none)."
    exit 1
  fi
}

echo "== cargo test"
# Root-only tests that cannot run record their names here (kpng_testkit::require_root!), so a
# skip is counted and named below instead of passing unnoticed.
skipped=$(mktemp)
export KPNG_SKIPPED_TESTS="$skipped"
cargo test --workspace --locked
if [ -s "$skipped" ]; then
  echo "== $(sort -u "$skipped" | wc -l) root-only tests SKIPPED (not root; they did not run):"
  sort -u "$skipped" | sed 's/^/   /'
else
  echo "== every root-only test ran"
fi
rm -f "$skipped"
check_default_admin_socket "cargo test"

# Every crate under crates/backend-*, read from the tree so that a new backend is checked without
# editing this script: the [package] name of each Cargo.toml. kpng-backend-kit is what the
# backends share (they all depend on it), so it is checked for Kubernetes types but is not a
# backend for the check below; the contract, kpng-backend, lives in crates/backend.
package_name() {
  awk '/^\[package\]/ { p = 1; next } /^\[/ { p = 0 } p && /^name *=/ { gsub(/^name *= *"|".*$/, ""); print; exit }' "$1"
}
backend_crates=$(for manifest in crates/backend-*/Cargo.toml; do package_name "$manifest"; done)
backends=$(printf '%s\n' $backend_crates | grep -vx 'kpng-backend-kit' || true)
if [ -z "$backends" ]; then
  echo "no backend crates found under crates/backend-*"
  exit 1
fi

echo "== the contract and every backend build without Kubernetes types"
for crate in kpng-model kpng-backend kpng-runner $backend_crates kpng-sink-file kpng-api; do
  if cargo tree --locked -e normal -p "$crate" | grep -q 'k8s-openapi'; then
    echo "$crate depends on k8s-openapi (cargo tree -e normal -p $crate): conversion belongs in kpng-k8s"
    exit 1
  fi
done
echo "ok ($(echo $backend_crates | wc -w) crates/backend-* checked: $(echo $backend_crates))"

echo "== backends do not depend on each other (to-local ebpf composes nft in the binary)"
for crate in $backends; do
  if cargo tree --locked -e normal -p "$crate" --prefix none | awk '{print $1}' | grep -vx "$crate" \
      | grep -qxF "$backends"; then
    echo "$crate depends on another backend (cargo tree -e normal -p $crate)"
    exit 1
  fi
done
echo "ok ($(echo $backends | wc -w) backends checked: $(echo $backends))"

echo "== Windows build (cargo check --target x86_64-pc-windows-gnu -p kpng)"
windows_target=x86_64-pc-windows-gnu
if ! rustup target list --installed 2>/dev/null | grep -qx "$windows_target"; then
  rustup target add "$windows_target" >/tmp/kpng-rustup-target.log 2>&1 || true
fi
if ! command -v x86_64-w64-mingw32-gcc >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-mingw-w64-x86-64 >/dev/null 2>&1 \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-mingw-w64-x86-64 >/dev/null; } || true
fi
if ! rustup target list --installed 2>/dev/null | grep -qx "$windows_target"; then
  echo "SKIPPED the Windows check: the $windows_target standard library could not be installed"
  echo "(rustup target add $windows_target: $(tail -n 1 /tmp/kpng-rustup-target.log 2>/dev/null))"
elif ! command -v x86_64-w64-mingw32-gcc >/dev/null 2>&1; then
  echo "SKIPPED the Windows check: no x86_64-w64-mingw32-gcc (Debian gcc-mingw-w64-x86-64) to build ring's C code"
else
  cargo check --locked --target "$windows_target" -p kpng 2>&1 | tee /tmp/kpng-windows-check.log
  # Code only Linux uses must be cfg-gated, not left to warn on every Windows build.
  if grep -q '^warning' /tmp/kpng-windows-check.log; then
    echo "FAILED: the Windows build has warnings (above)"
    exit 1
  fi
  windows_ok=1
fi

echo "== Windows binary under Wine (kpng.exe: version, to-file, to-local hns --hcn-simulator)"
if [ -z "${windows_ok:-}" ]; then
  echo "SKIPPED: the Windows target could not be built (above)"
else
  if ! command -v wine >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wine64 wine >/dev/null 2>&1 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wine64 wine >/dev/null; } || true
  fi
  if ! command -v wine >/dev/null 2>&1; then
    echo "SKIPPED: no wine (Debian wine64; not root, or the install failed)"
  else
    # A debug build: a release Windows build takes many minutes on 2 cores.
    cargo build --quiet --locked --target "$windows_target" -p kpng
    cargo build --quiet --locked -p kpng
    scripts/wine-compare.sh "$target_dir/$windows_target/debug/kpng.exe" "$target_dir/debug/kpng"
  fi
fi

echo "== benchmark smoke run (kpng-bench all --quick --check)"
if [ "$(id -u)" = 0 ]; then
  cargo build --quiet --locked -p kpng -p kpng-bench
  # --check: exits non-zero on a missing figure, failed connections, or kpng's nft one change
  # grossly slower than the nft binary's one-element change timed in the same run
  # (docs/benchmarks.md, "The smoke run's checks"); the checks are printed either way.
  bench_status=0
  "$target_dir/debug/kpng-bench" all --quick --check --kpng "$target_dir/debug/kpng" \
    > /tmp/kpng-bench-quick.md || bench_status=$?
  sed -n '/^## Targets/,$p' /tmp/kpng-bench-quick.md
  if [ "$bench_status" != 0 ]; then
    echo "FAILED: kpng-bench all --quick --check exited $bench_status (the checks above; the whole report: /tmp/kpng-bench-quick.md)"
    exit 1
  fi
  check_default_admin_socket "kpng-bench all --quick"
else
  echo "skipping the benchmark smoke run: needs root (network namespaces, nftables)"
fi
