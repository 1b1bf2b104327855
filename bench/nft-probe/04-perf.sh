#!/bin/bash
# Load-time benchmark of the kpng element-only design. Every measurement runs
# in a fresh throwaway netns. Generated files go to $WORK (default /tmp/nftp-perf).
# usage: 04-perf.sh [N1xE1 N2xE2 ...]    default: 30000x4 100000x2
. "$(dirname "$0")/lib.sh"
WORK=${WORK:-/tmp/nftp-perf}; mkdir -p "$WORK"
TF="%e %U %S %M"     # wall user sys maxRSS(KiB)
SIZES=${*:-30000x4 100000x2}
hdr() { printf '%-44s %8s %8s %8s %10s\n' "case" "wall_s" "user_s" "sys_s" "maxRSS_MB"; }
row() { # row LABEL timefile
	read -r e u s m < <(tail -1 "$2")
	printf '%-44s %8s %8s %8s %10.1f\n' "$1" "$e" "$u" "$s" "$(echo "$m/1024" | bc -l)"
}
tnft() { # tnft NS LABEL nft-args...  (time one nft invocation)
	local ns=$1 label=$2; shift 2
	if ! /usr/bin/time -f "$TF" -o "$WORK/t" ip netns exec "$ns" nft "$@" >"$WORK/out" 2>"$WORK/err"; then
		echo "ERROR in $label:"; head -5 "$WORK/err"; return 1; fi
	row "$label" "$WORK/t"
}
hdr
for sz in $SIZES; do
	N=${sz%x*}; E=${sz#*x}
	python3 "$HERE/gen.py" full $N $E > "$WORK/full-$sz.nft"
	python3 "$HERE/gen.py" ep-change $N $E > "$WORK/ep-$sz.nft"
	python3 "$HERE/gen.py" add-svc $N $E > "$WORK/svc-$sz.nft"
	python3 "$HERE/gen.py" affinity 10000 > "$WORK/aff10k.nft"
	nel=$(( N*3 + N*E ))
	mkns NS perf
	tnft $NS "[$sz] full load, 1 file ($nel elems)" -f "$WORK/full-$sz.nft"
	tnft $NS "[$sz]   1 endpoint change (del+add 1 elem)" -f "$WORK/ep-$sz.nft"
	tnft $NS "[$sz]   add 1 service (3+$E elems)" -f "$WORK/svc-$sz.nft"
	python3 "$HERE/gen.py" add-svc $((N+1)) $E > "$WORK/svc2-$sz.nft"
	tnft $NS "[$sz]   same, 2nd svc via stdin" -f - < "$WORK/svc2-$sz.nft"
	# small transactions: average of 20 runs, in ms (time(1) has 10ms resolution)
	for k in $(seq 2 21); do python3 "$HERE/gen.py" add-svc $((N+k)) $E > "$WORK/svc-$sz-$k.nft"; done
	t0=$(date +%s%N); for k in $(seq 2 21); do ip netns exec $NS nft -f "$WORK/svc-$sz-$k.nft"; done; t1=$(date +%s%N)
	printf '%-44s %8.2f ms avg of 20 (incl. ip netns exec)\n' "[$sz]   add 1 service" "$(echo "($t1-$t0)/20000000" | bc -l)"
	t0=$(date +%s%N); for k in $(seq 20); do ip netns exec $NS nft -f "$WORK/ep-$sz.nft"; done; t1=$(date +%s%N)
	printf '%-44s %8.2f ms avg of 20 (incl. ip netns exec)\n' "[$sz]   1 endpoint change" "$(echo "($t1-$t0)/20000000" | bc -l)"
	t0=$(date +%s%N); for k in $(seq 20); do ip netns exec $NS true; done; t1=$(date +%s%N)
	printf '%-44s %8.2f ms avg of 20\n' "   (baseline: ip netns exec true)" "$(echo "($t1-$t0)/20000000" | bc -l)"
	tnft $NS "[$sz]   nft list map cluster-endpoints" list map ip kpng cluster-endpoints
	tnft $NS "[$sz]   nft list ruleset" list ruleset
	tnft $NS "[$sz]   nft list ruleset -j" -j list ruleset
	tnft $NS "[$sz]   nft -t list ruleset (terse)" -t list ruleset
	tnft $NS "[$sz]   flush table ip kpng" flush table ip kpng
	ip netns del $NS
	mkns NS perf
	tnft $NS "[$sz] full load via stdin (nft -f -)" -f - < "$WORK/full-$sz.nft"
	tnft $NS "[$sz]   replace all: delete table + full (1 tx)" -f <(echo "delete table ip kpng"; cat "$WORK/full-$sz.nft")
	ip netns del $NS
	mkns NS perf
	tnft $NS "[$sz] nft -c -f (check only) full" -c -f "$WORK/full-$sz.nft"
	ip netns del $NS
	# split into ~5000-element batches
	rm -rf "$WORK/batch-$sz"; python3 "$HERE/gen.py" batch $N $E 5000 "$WORK/batch-$sz"
	mkns NS perf
	nb=$(ls "$WORK/batch-$sz" | wc -l)
	/usr/bin/time -f "$TF" -o "$WORK/tb" bash -c "for f in $WORK/batch-$sz/*.nft; do ip netns exec $NS nft -f \$f || exit 1; done"
	row "[$sz] split: $nb nft -f calls (~5000 elems)" "$WORK/tb"
	# dynamic affinity map with 10k entries: cost of listing it
	tnft $NS "[$sz]   add 10k affinity elems (ctl plane)" -f "$WORK/aff10k.nft"
	tnft $NS "[$sz]   nft list map affinity (10k)" list map ip kpng affinity
	tnft $NS "[$sz]   nft -j list map affinity (10k)" -j list map ip kpng affinity
	ip netns del $NS
done
