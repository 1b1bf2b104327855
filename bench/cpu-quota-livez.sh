#!/bin/bash
# /livez under a CPU quota (docs/deploy.md, "Sizing"): a kpng restarts over its own nftables
# rules in a cgroup v1 `cpu` group limited to QUOTA_US per 100 ms, and /livez is probed once a
# second (curl -m 5) until the first sync is logged. Prints each probe's code and time, then
# the group's `cpu.stat` (how often and how long CFS throttled it). Ends with the longest time
# between two answered probes and the most probes unanswered in a row, and the first sync's
# log lines (a restart that read its table logs "its sets read once").
#
# Why probes stalled (before 2026-12-07: a restart, a repair and the periodic full sync now
# send only what differs from the table, nothing after a plain restart; a table created anew
# and the fallbacks still fill or refill it, docs/deploy.md "Sizing"): the restart
# refilled every set in one nftables transaction, one `sendmsg`
# the kernel runs without preemption (PREEMPT_NONE) for ~0.5 s (30k Services), far past the
# quota; CFS then throttles every thread of the group, the health server's too, until that
# debt is paid (~5 s at 10 ms per 100 ms). With LISTEN=1 a foreign process subscribes to
# nftables notifications (as `nft monitor` would; the kernel checks for listeners host-wide,
# across network namespaces) and the kernel also builds one notification per element in that
# call: ~6.5 s of kernel CPU, a freeze of about a minute.
#
# Not a test: how long a probe waits depends on the machine's load, its kernel (preemption
# model) and whether anything on the host listens to nftables notifications (other kpngs'
# monitors do), so no bound holds on a shared 2-core machine. 2026-12-07, release build, 30k
# Services (`kpng-bench gen --services 30000 --endpoints 4`), QUOTA_US=10000, builds running
# beside: LISTEN=1, the sync took 53-81 s and 7-12 probes in a row timed out; without a
# listener on the host, 7.5-8 s and none (the slowest 1.4-4.1 s). 2026-12-07 10:30-10:50, the
# builds before (94946be) and after the diff-only refill alternating, 3 runs each, LISTEN=1, load
# 9-12: before, the sync took 82-132 s, 13-21 probes in a row timed out (gap 77-129 s); after,
# 14.5-14.8 s and none (gap 1.2-1.3 s). Other kpngs running on the host listen too (their
# monitors): LISTEN=0 runs then look like LISTEN=1 ones. More in docs/deploy.md, "Sizing", and
# docs/benchmarks.md ("a restart over its own table, the diff-only refill").
#
# usage (root): [LISTEN=1] bench/cpu-quota-livez.sh KPNG WORKLOAD_DIR [QUOTA_US]
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
  [ -n "${L:-}" ] && kill "$L" 2>/dev/null
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
until grep -q " synced " "$LOG/cold" 2>/dev/null; do sleep 1; done
kill -TERM "$P"; wait "$P"; P=
# 2. The restart, in the limited group (with LISTEN=1, a foreign listener that never reads).
if [ "${LISTEN:-0}" = 1 ]; then
  python3 "$(dirname "$0")/nft-listener.py" &
  L=$!
fi
echo "$QUOTA" > "$CG/cpu.cfs_quota_us"
sh -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' "$CG" ip netns exec "$NS" "$KPNG" "${args[@]}" > "$LOG/restart" 2>&1 &
P=$!
start=$(date +%s.%N)
# One probe: prints "<seconds since start>s <code> <time>s"; the time it was answered (start +
# time taken) goes to $LOG/answered when the code is 200.
probe() {
  local t r
  t=$(date +%s.%N)
  r=$(ip netns exec "$NS" curl -s -m 5 -o /dev/null -w '%{http_code} %{time_total}' http://127.0.0.1:10256/livez)
  printf '%.1fs %ss\n' "$(echo "$t - $start" | bc)" "$r"
  echo "${r%% *}" >> "$LOG/codes"
  [ "${r%% *}" = 200 ] && echo "$t + ${r#* }" | bc >> "$LOG/answered"
}
sleep 0.5  # the health server's bind
while ! grep -q " synced " "$LOG/restart"; do
  probe
  sleep 1
done
probe  # the first after the sync: closes a gap that lasted until then
line=$(grep -m1 " synced " "$LOG/restart")
printf 'first sync logged %.1fs after the start: %s\n' "$(echo "$(date -d "${line%%Z *}Z" +%s.%N) - $start" | bc)" "$(grep -o 'duration=[^ ]*' <<< "$line")"
# The longest time between two answered probes (a probe is sent every second or after the
# previous one's 5 s timeout, so ~1 s means no gap).
awk 'NR > 1 && $1 - p > m { m = $1 - p } { p = $1 } END { printf "longest /livez gap: %.1fs", m }' "$LOG/answered"
awk '$1 != 200 { n++; if (n > m) m = n; next } { n = 0 } END { printf ", probes unanswered in a row: %d\n", m }' "$LOG/codes"
echo "$(tr '\n' ' ' < "$CG/cpu.stat")"
grep -E 'its sets read once|differ too much|synced' "$LOG/restart" | head -2
