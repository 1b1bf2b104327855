#!/bin/bash
# What a repair of someone else's change costs kpng's nftables backend (docs/nftables.md,
# "full syncs": a repair over kpng's own table sends only what differs): a kpng fills its
# table in a network namespace of its own, then, one after the other, someone inserts a rule in `services` (the rules put back, no set
# element changed) and flushes the `service-ips` map (one element per Service port); for each
# repair, the `synced` line's duration and the CPU kpng's process used meanwhile, in the
# kernel (stime: the netlink transactions, and the notifications built for a listener) and in
# user space. With LISTEN=1 a foreign process subscribes to nftables notifications (as `nft
# monitor` or another node agent would; the kernel checks for listeners host-wide).
#
# Not a test: the figures depend on the machine's load and kernel. Run old and new builds
# alternately on the same workload (`kpng-bench gen --services 30000 --endpoints 4`), release
# builds both. Tried at 1,000 Services only (main's release build, this branch's debug
# build); no 30k figures recorded yet.
#
# usage (root): [LISTEN=1] bench/repair-cost.sh KPNG WORKLOAD_DIR
set -u
KPNG=$1; INPUT=$2
NS=kpng-repair-$$
LOG=$(mktemp -d)
HZ=$(getconf CLK_TCK)
args=(file --input "$INPUT" --node-name node1 --min-sync-period 0 --metrics-bind-address ""
  --admin-socket= --healthz-bind-address "" --cluster-cidr 10.128.0.0/9
  --service-node-port-range 20000-59999 to-local nft)
cleanup() {
  [ -n "${P:-}" ] && kill -TERM "$P" 2>/dev/null && wait "$P" 2>/dev/null
  ino=$(stat -L -c %i "/run/netns/$NS" 2>/dev/null) && rm -f /run/kpng/*."$ino"
  ip netns exec "$NS" nft delete table ip kpng 2>/dev/null
  ip netns exec "$NS" nft delete table ip6 kpng 2>/dev/null
  ip netns del "$NS" 2>/dev/null
  [ -n "${L:-}" ] && kill "$L" 2>/dev/null
  rm -rf "$LOG"
}
trap cleanup EXIT
ip netns add "$NS" && ip netns exec "$NS" ip link set lo up
ip netns exec "$NS" ip addr add 192.168.200.1/32 dev lo
ip netns exec "$NS" "$KPNG" "${args[@]}" > "$LOG/kpng" 2>&1 &
P=$!
until grep -q " synced " "$LOG/kpng"; do sleep 1; done
sleep 5
if [ "${LISTEN:-0}" = 1 ]; then
  python3 "$(dirname "$0")/nft-listener.py" &
  L=$!
fi
# utime and stime of kpng's process (every thread), in seconds.
cpu() { awk -v hz="$HZ" '{ printf "%.2f %.2f", $14 / hz, $15 / hz }' "/proc/$P/stat"; }
repair() {
  local what=$1; shift
  local before; before=$(grep -c "repair after" "$LOG/kpng")
  read -r u0 s0 < <(cpu)
  ip netns exec "$NS" nft "$@"
  until [ "$(grep " synced " "$LOG/kpng" | grep -c "repair after")" -gt "$before" ]; do sleep 0.2; done
  sleep 2
  read -r u1 s1 < <(cpu)
  local line; line=$(grep " synced " "$LOG/kpng" | grep "repair after" | tail -1)
  echo "$what: $(grep -o 'duration_ms=[^ ]*' <<< "$line") kernel_cpu=$(echo "$s1 - $s0" | bc)s user_cpu=$(echo "$u1 - $u0" | bc)s"
  grep -a "table ip kpng: " "$LOG/kpng" | tail -1 | cut -c1-400
}
repair "rule inserted" insert rule ip kpng services ip daddr 10.96.0.10 drop
repair "service-ips flushed" flush map ip kpng service-ips
