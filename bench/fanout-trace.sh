#!/bin/bash
# Times one change's way from the benchmark's file rename to the simulated nodes, at the
# system-call level, while `kpng-bench api` runs (issue #19, "one change reaches all").
#
#   kpng-bench api --clients 5000 --read frames --changes 40 &
#   bench/fanout-trace.sh $! /tmp/fanout 14      # as root; records 14 s of changes
#   bench/fanout-split.py /tmp/fanout.txt $(cat /tmp/fanout.pids)
#
# Waits for the benchmark's first change (its manifests directory changes), then records with
# `perf` the benchmark's renames (a change's start), the brain's `writev`s of more than 40
# bytes (a change set to a node; pings and window updates are smaller), the nodes' `recvfrom`s
# of more than 40 bytes and their `sync` lines (writes to stdout). Set PROBES to add uprobes,
# e.g. PROBES="-e probe_kpng:applyin" after (perf's parser takes the mangled name, not `::`)
#   perf probe -x target/release/kpng -a "applyin=$(nm target/release/kpng |
#     grep -o '_ZN8kpng_api3hub3Hub9apply_all[0-9a-zA-Z_]*' | head -1)"
# and `perf probe -d probe_kpng:applyin` when done. Context switches of every thread of the
# three processes: PROBES="-e sched:sched_switch".
set -eu
bench=$1; out=$2; secs=${3:-12}
# The benchmark's scratch directory (`/tmp/kpng-bench-PID-apiN`, N its Services).
dir=""
while [ -z "$dir" ]; do
  for d in /tmp/kpng-bench-"$bench"-api*/manifests; do [ -d "$d" ] && dir=$d; done
  sleep 0.5
done
brain=""; clients=""
while [ -z "$clients" ] || [ -z "$brain" ]; do
  for c in $(pgrep -P "$bench"); do
    case "$(tr '\0' ' ' < "/proc/$c/cmdline")" in
      *api-clients*) clients=$c;;
      *to-api*) brain=$c;;
    esac
  done
  sleep 0.5
done
m0=$(stat -c %y "$dir")
while [ "$(stat -c %y "$dir")" = "$m0" ]; do sleep 0.05; done
echo "$bench $brain $clients" > "$out.pids"
# shellcheck disable=SC2086
perf record -q -o "$out" \
  -e syscalls:sys_enter_rename -e syscalls:sys_enter_renameat2 \
  -e syscalls:sys_exit_writev --filter 'ret > 40' \
  -e syscalls:sys_exit_recvfrom --filter 'ret > 40' \
  -e syscalls:sys_enter_write --filter 'fd == 1' \
  ${PROBES:-} -p "$bench,$brain,$clients" -- sleep "$secs"
perf script -i "$out" -F pid,tid,time,event,trace > "$out.txt"
