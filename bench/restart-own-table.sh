#!/bin/bash
# A restart over kpng's own nftables table, several binaries side by side (docs/benchmarks.md,
# follow-up "a restart over its own table, the diff-only refill"). For each repetition, each
# binary in turn (alternating, so that the machine's load falls on all alike), in a fresh
# network namespace:
# a cold start until the first sync is logged, SIGTERM (the rules stay), then a restart under
# `/usr/bin/time -v` until its first sync is logged, SETTLE seconds more, SIGTERM.
#
# One row per restart: start → programmed (launch to the `synced` line's timestamp), the first
# sync's duration and operations (as logged), kpng's user and system CPU when programmed
# (/proc/PID/stat: every thread, the kernel's work on kpng's netlink calls included), its peak
# RSS then (VmHWM) and over the whole run (/usr/bin/time's "Maximum resident set size", MiB),
# its system CPU over the whole run; then the log's lines about adopting the table (the
# diff-only refill logs "its sets read once", its fallback "differ too much").
#
# With LISTEN=1 a foreign process subscribes to nftables notifications during each restart
# (as `nft monitor` would, never reading: the kernel checks for listeners host-wide, across
# network namespaces, and then builds one notification per element a transaction touches).
# Other kpngs running on the host are such listeners too (their monitors): the count of kpng
# processes not started here is printed with each row.
#
# Not a test: a shared, noisy machine; the figures are for comparing binaries in one run.
#
# usage (root): [LISTEN=1] [REPS=3] [SETTLE=5] bench/restart-own-table.sh WORKLOAD_DIR LABEL=KPNG...
#   e.g. bench/restart-own-table.sh /tmp/wl old=/path/old/kpng new=/path/new/kpng
#   (WORKLOAD_DIR from `kpng-bench gen --services 30000 --endpoints 4 --out /tmp/wl`)
set -u
INPUT=$1; shift
REPS=${REPS:-3}; SETTLE=${SETTLE:-5}
TMP=$(mktemp -d)
args=(file --input "$INPUT" --node-name node1 --min-sync-period 0 --metrics-bind-address ""
  --admin-socket= --healthz-bind-address 127.0.0.1:10256 --cluster-cidr 10.128.0.0/9
  --service-node-port-range 20000-59999 to-local nft)
NS=; P=; L=
cleanup() {
  [ -n "$P" ] && kill -TERM "$P" 2>/dev/null && wait "$P" 2>/dev/null
  [ -n "$L" ] && kill "$L" 2>/dev/null && wait "$L" 2>/dev/null
  if [ -n "$NS" ]; then
    ino=$(stat -L -c %i "/run/netns/$NS" 2>/dev/null) && rm -f /run/kpng/*."$ino"
    ip netns del "$NS" 2>/dev/null
  fi
  NS=; P=; L=
}
trap 'cleanup; rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM

# Seconds since the epoch of the first `synced` line of log $1, waiting for it.
synced_at() {
  local line
  until line=$(grep -m1 ' synced ' "$1" 2>/dev/null); do sleep 0.05; done
  date -d "${line%%Z *}Z" +%s.%N
}
# /proc/PID/stat's utime and stime, in seconds.
cpu_of() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f %.2f", $14 / hz, $15 / hz }' "/proc/$1/stat"; }
hwm_of() { awk '/^VmHWM:/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }
others() { ps -C kpng -o pid= | grep -cv -w -e "${1:-0}"; }

printf '| binary | rep | cold start → programmed | restart: start → programmed | first sync | operations | user / sys CPU to programmed | VmHWM at programmed | sys CPU, whole run | max RSS, whole run | other kpngs on the host |\n|---|---|---|---|---|---|---|---|---|---|---|\n'
for rep in $(seq 1 "$REPS"); do
  for spec in "$@"; do
    label=${spec%%=*}; kpng=${spec#*=}
    NS=m41-rst-$$-$label-$rep
    ip netns add "$NS" && ip netns exec "$NS" ip link set lo up
    ip netns exec "$NS" ip addr add 192.168.200.1/32 dev lo
    # 1. Cold start; SIGTERM leaves its rules in place.
    rm -f "$TMP/cold" "$TMP/restart"  # else the last run's `synced` line may be read first
    t0=$(date +%s.%N)
    ip netns exec "$NS" "$kpng" "${args[@]}" > "$TMP/cold" 2>&1 &
    P=$!
    cold=$(echo "$(synced_at "$TMP/cold") - $t0" | bc)
    kill -TERM "$P"; wait "$P"; P=
    # 2. The restart (with LISTEN=1, beside a foreign listener that never reads).
    if [ "${LISTEN:-0}" = 1 ]; then
      python3 "$(dirname "$0")/nft-listener.py" &
      L=$!
      sleep 0.5
    fi
    t0=$(date +%s.%N)
    /usr/bin/time -v -o "$TMP/time" ip netns exec "$NS" "$kpng" "${args[@]}" > "$TMP/restart" 2>&1 &
    P=$!
    K=; until K=$(pgrep -P "$P"); do sleep 0.01; done
    at=$(synced_at "$TMP/restart")
    cpu=$(cpu_of "$K"); hwm=$(hwm_of "$K")
    n_others=$(others "$K")
    [ -n "$L" ] && kill "$L" && wait "$L" 2>/dev/null; L=
    sleep "$SETTLE"
    kill -TERM "$K"; wait "$P"; P=
    line=$(grep -m1 ' synced ' "$TMP/restart")
    dur=$(grep -o 'duration=[^ ]*' <<< "$line"); ops=$(grep -o 'operations=[^ ]*' <<< "$line")
    sys=$(awk -F': ' '/System time/ { print $2 }' "$TMP/time")
    rss=$(awk -F': ' '/Maximum resident set size/ { printf "%.1f", $2 / 1024 }' "$TMP/time")
    printf '| %s | %s | %.2f s | %.2f s | %s | %s | %s s | %s MiB | %s s | %s MiB | %s |\n' \
      "$label" "$rep" "$cold" "$(echo "$at - $t0" | bc)" "${dur#duration=}" "${ops#operations=}" \
      "${cpu/ / \/ }" "$hwm" "$sys" "$rss" "$n_others"
    grep -E 'adopting|refill|differ' "$TMP/restart" | sed 's/^/    /' >&2
    cleanup
  done
done
