# Shared helpers for nft-probe scripts. Source it; never run in the root netns.
# Every namespace created here is named nftp-<tag>-<pid> and removed on exit.
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NSLIST=()
PIDS=()
mkns() {  # mkns VAR tag  -> creates netns, brings lo up, stores name in VAR
	local n="nftp-$2-$$"
	ip netns add "$n"
	ip -n "$n" link set lo up
	NSLIST+=("$n")
	printf -v "$1" '%s' "$n"
}
cleanup() {
	for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done
	for n in "${NSLIST[@]:-}"; do [ -n "$n" ] && ip netns del "$n" 2>/dev/null; done
}
trap cleanup EXIT
# try_nft NS LABEL < nft-text : load text into NS, print OK/FAIL + error text
try_nft() {
	local ns=$1 label=$2 out
	if out=$(ip netns exec "$ns" nft -f - 2>&1); then
		echo "OK   : $label"
	else
		echo "FAIL : $label"; echo "$out" | sed 's/^/       | /'
	fi
}
