#!/usr/bin/env bash
# Runs the Windows kpng.exe under Wine and checks it gives what the Linux binary gives:
#   scripts/wine-compare.sh path/to/kpng.exe path/to/kpng
# - `kpng version`: the same version line;
# - `kpng file --input examples/cluster.yaml … to-file --output -`: the same model, and the same
#   `kpng status` and `kpng trace` answers (a named pipe on Windows, a Unix socket on Linux);
# - `kpng file … to-local hns --hcn-simulator F`: the same HCN state (the simulator's GUIDs are
#   deterministic, so the files are compared as they are);
# - `kpng file … to-local hns --dry-run`: the same printed HCN plan, the simulator's file untouched;
# - beside a running kube-proxy.exe, `to-local hns` and `cleanup` refuse, naming it;
# - `--windows-service`: refused from a console; run by Wine's Service Control Manager
#   (`sc create`, `net start`, `net stop`) it programs HCN, reports RUNNING, then STOPPED (0).
# Wine 8.0 (Debian 12) lacks bcryptprimitives.dll, which Rust's std imports, and
# computenetwork.dll (HCN), which kpng.exe imports: shims (scripts/wine/*.c) are built with mingw
# and put beside the exe.
set -euo pipefail
# Absolute paths: the checks run in a scratch directory.
exe=$(realpath "$1")
linux=$(realpath "$2")
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
# On every exit, a failed check's too: Wine's processes are stopped (the wineserver), and so is
# every process started here in the background and still running (the Linux kpng's `to-file`,
# which no wineserver stops), SIGTERM then, after 10 s, SIGKILL; all are reaped and the scratch
# directory removed, so a failed comparison leaves nothing behind.
cleanup() {
  local i left
  wineserver -k >/dev/null 2>&1 || true
  left=$(jobs -pr)
  [ -z "$left" ] || kill $left 2>/dev/null || true
  for i in $(seq 1 100); do
    left=$(jobs -pr)
    [ -z "$left" ] && break
    sleep 0.1
  done
  [ -z "$left" ] || kill -KILL $left 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
cp "$exe" "$work/kpng.exe"
x86_64-w64-mingw32-gcc -shared -o "$work/bcryptprimitives.dll" \
  "$here/scripts/wine/bcryptprimitives.c" -ladvapi32
# Wine has no computenetwork.dll either (HCN): a stand-in that answers "HNS unavailable".
x86_64-w64-mingw32-gcc -shared -o "$work/computenetwork.dll" "$here/scripts/wine/computenetwork.c"
export WINEPREFIX="$work/prefix" WINEDEBUG=-all
cp "$here/examples/cluster.yaml" "$work/cluster.yaml"
cd "$work"
win() { wine "$work/kpng.exe" "$@"; }

fail() { echo "FAILED: $*"; exit 1; }
# Waits (up to 30 s) until FILE contains PATTERN; the caller checks whether it did.
wait_logged() {
  local i
  for i in $(seq 1 300); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
}

# 1. version
wv=$(win version 2>/dev/null | sed -n 1p | tr -d '\r')
lv=$("$linux" version | sed -n 1p)
[ "$wv" = "$lv" ] || fail "kpng.exe version says '$wv', kpng says '$lv'"
win version 2>/dev/null | tr -d '\r' | grep -q 'platform: *windows/amd64' \
  || fail "kpng.exe version does not say windows/amd64"
echo "ok: kpng.exe version: $wv (windows/amd64)"

# Runs `kpng … to-local hns --hcn-simulator STATE` until STATE holds a synced state, then stops it.
serving=(file --input cluster.yaml --node-name node1 --min-sync-period 0
         --metrics-bind-address= --healthz-bind-address=127.0.0.1:0)
common=("${serving[@]}" --admin-socket=)
run_hns() {
  local state=$1; shift
  # HCN as the CNI leaves node1: its network and its two pods' endpoints.
  cat > "$state" <<'JSON'
{"Networks": [{"ID": "NET", "Name": "cbr0", "Type": "L2Bridge"}],
 "Endpoints": [
  {"ID": "CNI-2", "HostComputeNetwork": "NET", "IpConfigurations": [{"IpAddress": "10.244.1.2"}]},
  {"ID": "CNI-3", "HostComputeNetwork": "NET", "IpConfigurations": [{"IpAddress": "10.244.1.3"}]}],
 "LoadBalancers": []}
JSON
  "$@" "${common[@]}" --network-name cbr0 to-local hns --hcn-simulator "$state" >"$state.log" 2>&1 &
  local pid=$! i
  for i in $(seq 1 600); do
    if grep -q '"FrontendVIPs"' "$state" 2>/dev/null; then
      sleep 0.5
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill "$pid" 2>/dev/null || true
  cat "$state.log"
  return 1
}

# 2. the model, and what `kpng status` and `kpng trace` say about it
pipe='\\.\pipe\kpng-compare'
"$linux" "${serving[@]}" --admin-socket "$work/admin.sock" to-file --output linux.yaml \
  >linux-file.log 2>&1 &
lp=$!
wine "$work/kpng.exe" "${serving[@]}" --admin-socket "$pipe" to-file --output windows.yaml \
  >windows-file.log 2>&1 &
wp=$!
for i in $(seq 1 600); do
  [ -s linux.yaml ] && [ -s windows.yaml ] && break
  sleep 0.1
done
sleep 0.5
[ -s windows.yaml ] || { cat windows-file.log; fail "kpng.exe to-file wrote nothing"; }
tr -d '\r' < windows.yaml > windows.lf.yaml
diff -u linux.yaml windows.lf.yaml || fail "kpng.exe and kpng give different models"
echo "ok: kpng.exe to-file: the same model ($(wc -l < linux.yaml) lines)"
# The first line has the sync's time and duration; the input's line its load time; each line
# of the sync history (`recent syncs`) its time and duration.
answers() {
  sed -E -e 1d -e 's/last good input [^ ]*/last good input T/' \
    -e 's/^  [0-9]{4}-[0-9-]+T[0-9:.]+Z  /  T  /' \
    -e '/^  T  /s/  [0-9.]+ ?(ns|µs|us|ms|s)  /  D  /'
}
"$linux" status -o wide --admin-socket "$work/admin.sock" | answers > linux-status.txt
win status -o wide --admin-socket "$pipe" 2>windows-status.err | tr -d '\r' | answers \
  > windows-status.txt || true
[ -s windows-status.txt ] || { cat windows-status.err windows-file.log; fail "kpng.exe status answered nothing"; }
diff -u linux-status.txt windows-status.txt || fail "kpng.exe status and kpng status differ"
trace=(trace --from 10.244.1.9 --to 10.96.0.40:80)
"$linux" "${trace[@]}" --admin-socket "$work/admin.sock" > linux-trace.txt
win "${trace[@]}" --admin-socket "$pipe" 2>/dev/null | tr -d '\r' > windows-trace.txt || true
diff -u linux-trace.txt windows-trace.txt || fail "kpng.exe trace and kpng trace differ"
grep -q 'DNAT' linux-trace.txt || fail "the trace found no DNAT: $(cat linux-trace.txt)"
# A second kpng.exe asking for the same pipe is told another process serves it, and the first
# still answers.
wine "$work/kpng.exe" "${serving[@]}" --admin-socket "$pipe" to-file --output second.yaml \
  >second.log 2>&1 &
sp=$!
wait_logged second.log "another process serves it"
kill "$sp" 2>/dev/null || true
grep -q "another process serves it" second.log || { cat second.log; fail "a second kpng.exe took the served pipe"; }
win status --admin-socket "$pipe" 2>/dev/null | tr -d '\r' | grep -q '^input file cluster.yaml  ok' \
  || fail "the first kpng.exe no longer answers on $pipe"
kill "$lp" "$wp" 2>/dev/null || true
wait 2>/dev/null || true
echo "ok: kpng.exe status and trace over the named pipe $pipe: the same answers as kpng's ($(wc -l < linux-status.txt) status lines)"

# 3. the HCN state
run_hns linux.json "$linux" || fail "kpng to-local hns --hcn-simulator wrote no state"
run_hns windows.json wine "$work/kpng.exe" || fail "kpng.exe to-local hns --hcn-simulator wrote no state"
tr -d '\r' < windows.json > windows.lf.json
diff -u linux.json windows.lf.json || fail "kpng.exe and kpng leave different HCN states"
echo "ok: kpng.exe to-local hns: the same HCN state ($(grep -c '"ID"' linux.json) objects)"

# 4. the system HCN path (`--hcn system`, the Windows default) starts, calls computenetwork.dll
# and, HNS being unavailable (the stand-in), fails its syncs and backs off rather than crash.
# While it runs, `kpng.exe cleanup` refuses: that kpng would re-create what cleanup removes.
hns_pipe='\\.\pipe\kpng-hns'
wine "$work/kpng.exe" "${serving[@]}" --admin-socket "$hns_pipe" --network-name cbr0 to-local hns \
  >system.log 2>&1 &
sp=$!
wait_logged system.log "HNS unavailable"
if win cleanup --network-name cbr0 --admin-socket "$hns_pipe" >cleanup.out 2>cleanup.err; then
  cat cleanup.out cleanup.err; fail "kpng.exe cleanup ran while a kpng.exe programs HNS"
fi
grep -q 'programs HNS (kernelspace): it would re-create at once what cleanup removes' cleanup.err \
  || { cat cleanup.err; fail "kpng.exe cleanup did not name the running kpng.exe"; }
# Without the pipe to ask (--admin-socket=), the mutex still tells: cleanup and its dry run
# name it.
if win cleanup --network-name cbr0 --admin-socket= >cleanup.out 2>cleanup.err; then
  cat cleanup.out cleanup.err; fail "kpng.exe cleanup ran while a kpng.exe holds the mutex"
fi
grep -q 'holds the mutex Global\\kpng-hns): it would re-create' cleanup.err \
  || { cat cleanup.err; fail "kpng.exe cleanup did not name the mutex"; }
win cleanup --dry-run --network-name cbr0 --admin-socket= >cleanup.out 2>cleanup.err || true
grep -q 'holds the mutex Global\\kpng-hns); cleanup would refuse' cleanup.out \
  || { cat cleanup.out cleanup.err; fail "kpng.exe cleanup --dry-run did not name the mutex"; }
# Nor does a second kpng.exe start programming HNS beside it (the named mutex).
if win "${common[@]}" --network-name cbr0 to-local hns >second-hns.log 2>&1; then
  cat second-hns.log; fail "a second kpng.exe to-local hns started beside the first"
fi
grep -q 'another kpng already runs `to-local hns` on this node' second-hns.log \
  || { cat second-hns.log; fail "the second kpng.exe did not say why it stops"; }
# Its status says, unasked, that no sync has found the HNS network yet.
win status --admin-socket "$hns_pipe" 2>/dev/null | tr -d '\r' >system-status.txt || true
grep -q '^HNS network: not found yet; PROBLEM: no sync has found the CNI' system-status.txt \
  || { cat system-status.txt; fail "kpng.exe status does not say the HNS network is not found"; }
kill "$sp" 2>/dev/null || true
wait "$sp" 2>/dev/null || true
grep -q "HNS unavailable" system.log || { cat system.log; fail "kpng.exe --hcn system did not report HNS unavailable"; }
echo "ok: kpng.exe to-local hns (system HCN): calls computenetwork.dll, reports HNS unavailable and retries, and its status says the network is not found; cleanup and a second kpng.exe refuse while it runs"

# 4b. `--dry-run`: reads HCN (here the simulator's file; on a node, the system's) and prints the
# HCN calls it would make, the same under Wine as on Linux; the CNI's endpoints in the file are
# found (no "has no HNS endpoint" warning for them) and the file is not written.
dry_hns() {
  local out=$1; shift
  cat > "$out.json" <<'JSON'
{"Networks": [{"ID": "NET", "Name": "cbr0", "Type": "L2Bridge"}],
 "Endpoints": [
  {"ID": "CNI-2", "HostComputeNetwork": "NET", "IpConfigurations": [{"IpAddress": "10.244.1.2"}]},
  {"ID": "CNI-3", "HostComputeNetwork": "NET", "IpConfigurations": [{"IpAddress": "10.244.1.3"}]}],
 "LoadBalancers": []}
JSON
  cp "$out.json" "$out.before"
  "$@" "${common[@]}" --network-name cbr0 to-local hns --dry-run --hcn-simulator "$out.json" \
    >"$out.txt" 2>"$out.log" &
  local pid=$! i
  for i in $(seq 1 600); do
    grep -q 'HcnCreateLoadBalancer' "$out.txt" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  sleep 1
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  grep -q 'HcnCreateLoadBalancer' "$out.txt" || { cat "$out.log"; return 1; }
}
dry_hns linux-dry "$linux" || fail "kpng to-local hns --dry-run printed no HCN call"
dry_hns windows-dry wine "$work/kpng.exe" || fail "kpng.exe to-local hns --dry-run printed no HCN call"
tr -d '\r' < windows-dry.txt > windows-dry.lf.txt
diff -u linux-dry.txt windows-dry.lf.txt || fail "kpng.exe and kpng --dry-run print different HCN plans"
cmp -s windows-dry.json windows-dry.before || fail "kpng.exe --dry-run wrote the simulator's file"
if grep -q 'local endpoint 10\.244\.1\.[23] has no HNS endpoint' windows-dry.log; then
  cat windows-dry.log; fail "kpng.exe --dry-run did not see the CNI's endpoints"
fi
grep -q 'HcnCreateLoadBalancer: 10.96.0.10:80/TCP → 10.244.1.2' windows-dry.txt \
  || { cat windows-dry.txt; fail "kpng.exe --dry-run does not plan web's load balancer over the CNI's endpoint"; }
# Without the simulator it reads the system's HCN (computenetwork.dll: the stand-in answers
# "HNS unavailable"), rather than planning against an empty network.
wine "$work/kpng.exe" "${common[@]}" --network-name cbr0 to-local hns --dry-run \
  >dry-system.txt 2>dry-system.log &
dp=$!
wait_logged dry-system.log "HNS unavailable"
kill "$dp" 2>/dev/null || true
wait "$dp" 2>/dev/null || true
grep -q "HNS unavailable" dry-system.log || { cat dry-system.log; fail "kpng.exe --dry-run did not read the system's HCN"; }
echo "ok: kpng.exe to-local hns --dry-run: the same HCN plan as kpng ($(grep -c '^# Hcn' linux-dry.txt) calls), the CNI's endpoints found, the file untouched; without a file it reads the system's HCN"

# 4c. A kube-proxy.exe running on the node (here a copy of kpng.exe under that name): kpng.exe
# refuses to program HNS beside it, naming it, and so does its cleanup; its dry run says a real
# run would refuse.
cp "$work/kpng.exe" "$work/kube-proxy.exe"
wine "$work/kube-proxy.exe" "${common[@]}" to-file --output kube-proxy.yaml >kube-proxy.log 2>&1 &
kp=$!
for i in $(seq 1 600); do
  [ -s kube-proxy.yaml ] && break
  sleep 0.1
done
[ -s kube-proxy.yaml ] || { cat kube-proxy.log; fail "the stand-in kube-proxy.exe did not start"; }
# (Bounded: a kpng.exe that does not refuse would run on; it is stopped after 30 s.)
if timeout 30 wine "$work/kpng.exe" "${common[@]}" --network-name cbr0 to-local hns \
    >beside.log 2>&1; then
  kill "$kp" 2>/dev/null || true
  cat beside.log; fail "kpng.exe to-local hns started beside a running kube-proxy.exe"
fi
grep -q 'kube-proxy.exe (pid [0-9]*) runs on this node; `to-local hns` beside it' beside.log \
  || { kill "$kp" 2>/dev/null || true; cat beside.log; fail "kpng.exe did not name the running kube-proxy.exe"; }
# `kpng.exe cleanup` refuses too: kube-proxy.exe would re-create what it removes.
if win cleanup --network-name cbr0 >kp-cleanup.out 2>kp-cleanup.err; then
  kill "$kp" 2>/dev/null || true
  cat kp-cleanup.out kp-cleanup.err; fail "kpng.exe cleanup ran beside a running kube-proxy.exe"
fi
grep -q 'kube-proxy.exe (pid [0-9]*) runs on this node and programs HNS: it would re-create' kp-cleanup.err \
  || { kill "$kp" 2>/dev/null || true; cat kp-cleanup.err; fail "kpng.exe cleanup did not name the running kube-proxy.exe"; }
wine "$work/kpng.exe" "${common[@]}" --network-name cbr0 to-local hns --dry-run \
  >beside-dry.txt 2>beside-dry.log &
bp=$!
wait_logged beside-dry.log "a real run would refuse"
kill "$bp" "$kp" 2>/dev/null || true
wait "$bp" "$kp" 2>/dev/null || true
grep -q "a real run would refuse" beside-dry.log \
  || { cat beside-dry.log; fail "kpng.exe --dry-run did not say a real run would refuse beside kube-proxy.exe"; }
echo "ok: kpng.exe to-local hns and cleanup refuse beside a running kube-proxy.exe, naming it (the dry run warns)"

# 5. `--windows-service`: from a console it refuses (no Service Control Manager), as
# kube-proxy; installed with `sc create` and started with `net start` under Wine's SCM it
# programs HCN, reports RUNNING, and `net stop` stops it with exit code 0.
if win "${common[@]}" --windows-service --network-name cbr0 to-local hns \
    --hcn-simulator console.json >console.log 2>&1; then
  fail "kpng.exe --windows-service from a console did not fail"
fi
grep -q "Service Control Manager" console.log \
  || { cat console.log; fail "kpng.exe --windows-service from a console: no SCM error"; }
# Wine's SCM (services.exe) lives as long as the wineserver: let the current one end, then
# start one that stays up until the trap.
wineserver -w
wineserver -p >/dev/null 2>&1
cat > service.json <<'JSON'
{"Networks": [{"ID": "NET", "Name": "cbr0", "Type": "L2Bridge"}],
 "Endpoints": [
  {"ID": "CNI-2", "HostComputeNetwork": "NET", "IpConfigurations": [{"IpAddress": "10.244.1.2"}]},
  {"ID": "CNI-3", "HostComputeNetwork": "NET", "IpConfigurations": [{"IpAddress": "10.244.1.3"}]}],
 "LoadBalancers": []}
JSON
dir=$(winepath -w "$work" | tr -d '\r')
svc_args="file --input $dir\\cluster.yaml --node-name node1 --min-sync-period 0 --metrics-bind-address= --healthz-bind-address=127.0.0.1:0 --admin-socket= --log-file $dir\\kpng-service.log --windows-service --network-name cbr0 to-local hns --hcn-simulator $dir\\service.json"
wine sc create kpng binPath= "$dir\\kpng.exe $svc_args" >/dev/null 2>&1 \
  || fail "sc create kpng failed"
wine net start kpng >service.log 2>&1 || { cat service.log; fail "net start kpng failed"; }
for i in $(seq 1 300); do
  grep -q '"FrontendVIPs"' service.json 2>/dev/null && break
  sleep 0.1
done
grep -q '"FrontendVIPs"' service.json || fail "kpng.exe as a service programmed nothing"
wine sc query kpng 2>/dev/null | tr -d '\r' | grep -q 'STATE *: 4 *RUNNING' \
  || { wine sc query kpng; fail "the kpng service is not RUNNING"; }
wine net stop kpng >>service.log 2>&1 || { cat service.log; fail "net stop kpng failed"; }
stopped=""
for i in $(seq 1 100); do
  if wine sc query kpng 2>/dev/null | tr -d '\r' | grep -q 'STATE *: 1 *STOPPED'; then
    stopped=yes
    break
  fi
  sleep 0.1
done
[ -n "$stopped" ] || { wine sc query kpng; fail "the kpng service did not stop"; }
wine sc query kpng 2>/dev/null | tr -d '\r' | grep -q 'WIN32_EXIT_CODE *: 0 ' \
  || { wine sc query kpng; fail "the kpng service stopped with an error"; }
# A service has no standard error: its log is in --log-file.
grep -q 'running as a Windows service' kpng-service.log && grep -q ' synced ' kpng-service.log \
  || { cat kpng-service.log 2>/dev/null; fail "the kpng service's --log-file has no log"; }
echo "ok: kpng.exe --windows-service: refuses without an SCM; under Wine's SCM it runs, programs HCN, logs to its --log-file and stops on net stop"
