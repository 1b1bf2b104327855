#!/bin/bash
# /livez under a CPU quota (docs/deploy.md, "Sizing"): a kpng restarts over its own nftables
# rules in a cgroup v1 `cpu` group limited to QUOTA_US per 100 ms, and /livez is probed once a
# second (curl -m 5) until the first sync is logged. Prints each probe's code and time.
#
# Not a test: how long a probe waits depends on the machine's load and kernel (preemption
# model), so no bound holds on a shared 2-core machine. 2026-12-07, debug build, 30k Services
# (`kpng-bench gen --services 30000 --endpoints 4`), QUOTA_US=10000: the restart took ~170 s
# and 2 probes of 5 s timed out while the sync committed.
#
# usage (root): bench/cpu-quota-livez.sh KPNG WORKLOAD_DIR [QUOTA_US]
set -u
KPNG=$1; INPUT=$2; QUOTA=${3:-10000}
NS=kpng-quota-$$
CG=/sys/fs/cgroup/cpu/kpng-quota-$$
LOG=$(mktemp -d)
args=(file --input "$INPUT" --node-name node1 --min-sync-period 0 --metrics-bind-address ""
  --admin-socket= --healthz-bind-address 127.0.0.1:10256 --cluster-cidr 10.128.0.0/9
  --service-node-port-range 20000-59999 to-local nft)
cleanup() {
  [ -n "${P:-}" ] && kill -TERM "$P" 2>/dev/null && wait "$P" 2>/dev/null
  ino=$(stat -L -c %i "/run/netns/$NS" 2>/dev/null) && rm -f /run/kpng/*."$ino"
  ip netns del "$NS" 2>/dev/null
  rmdir "$CG" 2>/dev/null
  rm -rf "$LOG"
}
trap cleanup EXIT
ip netns add "$NS" && ip netns exec "$NS" ip link set lo up
ip netns exec "$NS" ip addr add 192.168.200.1/32 dev lo
mkdir "$CG"
# 1. A cold start, unlimited; SIGTERM leaves its rules in place.
ip netns exec "$NS" "$KPNG" "${args[@]}" > "$LOG/cold" 2>&1 &
P=$!
until grep -q " synced " "$LOG/cold"; do sleep 1; done
kill -TERM "$P"; wait "$P"; P=
# 2. The restart, in the limited group.
echo "$QUOTA" > "$CG/cpu.cfs_quota_us"
sh -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' "$CG" ip netns exec "$NS" "$KPNG" "${args[@]}" > "$LOG/restart" 2>&1 &
P=$!
start=$(date +%s)
while ! grep -q " synced " "$LOG/restart"; do
  echo "$(( $(date +%s) - start ))s $(ip netns exec "$NS" curl -s -m 5 -o /dev/null -w '%{http_code} %{time_total}s' http://127.0.0.1:10256/livez)"
  sleep 1
done
echo "first sync after $(( $(date +%s) - start ))s: $(grep -o 'duration=[^ ]*' "$LOG/restart" | head -1)"
