#!/bin/bash
# Why does "add 1 service" cost more than "change 1 endpoint" on a big table?
# Compare adding 1 element to a plain set / data map / verdict map (goto) with
# N services loaded.  Average over 20 runs, ms, incl. ~2-5 ms of `ip netns exec`.
. "$(dirname "$0")/lib.sh"
WORK=${WORK:-/tmp/nftp-perf}; mkdir -p "$WORK"
N=${1:-100000}; E=${2:-2}
python3 "$HERE/gen.py" full $N $E > "$WORK/full-v.nft"
mkns NS vm
ip netns exec $NS nft -f "$WORK/full-v.nft"
avg() { # avg LABEL TEMPLATE(with %d)
	local t0 t1; t0=$(date +%s%N)
	for k in $(seq 1 20); do printf "$2\n" $k | ip netns exec $NS nft -f - || return; done
	t1=$(date +%s%N); printf '%-52s %8.2f ms\n' "$1" "$(echo "($t1-$t0)/20000000" | bc -l)"
}
echo "table with $N services x $E endpoints"
avg "add 1 elem to set cluster-ips"                     "add element ip kpng cluster-ips { 10.99.0.%d }"
avg "add 1 elem to data map cluster-endpoints"          "add element ip kpng cluster-endpoints { 10.99.0.%d . tcp . 80 . 0 : 10.0.0.1 . 80 }"
avg "add 1 elem to vmap service-ips (goto svc-cluster)" "add element ip kpng service-ips { 10.99.1.%d . tcp . 80 : goto svc-cluster }"
avg "add 1 elem to vmap cluster-pick (goto cluster-nE)" "add element ip kpng cluster-pick { 10.99.2.%d . tcp . 80 : goto cluster-n$E }"
avg "add 1 elem to vmap service-ips (verdict drop)"     "add element ip kpng service-ips { 10.99.3.%d . tcp . 80 : drop }"
