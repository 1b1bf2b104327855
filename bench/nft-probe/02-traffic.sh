#!/bin/bash
# Real-packet test of the kpng design (IPv4) in throwaway namespaces.
#  node ns : endpoints 10.0.0.1-4:8080 (tcp+udp) on lo, veth n0 10.1.0.1/24,
#            ruleset traffic-v4.nft
#  cli  ns : veth c0 10.1.0.2/24 + 10.1.0.3/24, default route via node
# Results on stdout.
. "$(dirname "$0")/lib.sh"
N=${N:-300}
mkns NODE node; mkns CLI cli
ip link add n0 netns "$NODE" type veth peer name c0 netns "$CLI"
ip -n "$NODE" addr add 10.1.0.1/24 dev n0; ip -n "$NODE" link set n0 up
ip -n "$CLI" addr add 10.1.0.2/24 dev c0; ip -n "$CLI" addr add 10.1.0.3/24 dev c0
ip -n "$CLI" link set c0 up; ip -n "$CLI" route add default via 10.1.0.1
for i in 1 2 3 4; do ip -n "$NODE" addr add 10.0.0.$i/32 dev lo; done
# a route for the service CIDR must exist so locally generated packets get
# to the nat output hook (the DNAT then re-routes them).
ip -n "$NODE" route add 10.96.0.0/12 via 10.1.0.2
ip netns exec "$NODE" python3 "$HERE/echo_servers.py" 10.0.0.{1,2,3,4}:8080 >/dev/null &
PIDS+=($!)
sleep 0.7
ip netns exec "$NODE" nft -f "$HERE/traffic-v4.nft" || exit 1

cli()  { ip netns exec "$CLI"  python3 "$HERE/client.py" "$@"; }
node() { ip netns exec "$NODE" python3 "$HERE/client.py" "$@"; }

echo "== 1. ClusterIP 10.96.0.10 (3 endpoints, numgen slot map), $N conns each"
echo -n "remote tcp (prerouting): "; cli tcp 10.96.0.10 80 $N
echo -n "remote udp (prerouting): "; cli udp 10.96.0.10 53 $N
echo -n "local  tcp (output)    : "; node tcp 10.96.0.10 80 $N
echo -n "local  udp (output)    : "; node udp 10.96.0.10 53 $N
echo "== 2. NodePort (2 endpoints 10.0.0.3/4) via node IP 10.1.0.1"
echo -n "remote tcp :30080      : "; cli tcp 10.1.0.1 30080 $N
echo -n "remote udp :30053      : "; cli udp 10.1.0.1 30053 $N
echo -n "local  tcp :30080      : "; node tcp 10.1.0.1 30080 $N
echo "== 3. ClientIP affinity 10.96.0.11 (4 endpoints)"
echo -n "client 10.1.0.2 tcp    : "; cli tcp 10.96.0.11 80 50 --src 10.1.0.2
echo -n "client 10.1.0.3 tcp    : "; cli tcp 10.96.0.11 80 50 --src 10.1.0.3
echo -n "client 10.1.0.2 udp    : "; cli udp 10.96.0.11 53 50 --src 10.1.0.2
echo -n "local node tcp         : "; node tcp 10.96.0.11 80 50
echo "affinity map now:"; ip netns exec "$NODE" nft list map ip kpng affinity | grep -A8 elements
echo "== 3b. control plane deletes the affinity entry of client 10.1.0.3 -> next conn is random again, then sticky"
ip netns exec "$NODE" nft delete element ip kpng affinity '{ 10.1.0.3 . 10.96.0.11 . tcp . 80 }'
for k in 1 2 3; do echo -n "  round $k (10 conns): "; cli tcp 10.96.0.11 80 10 --src 10.1.0.3; ip netns exec "$NODE" nft delete element ip kpng affinity '{ 10.1.0.3 . 10.96.0.11 . tcp . 80 }'; done
echo "== 3c. stale: remove the endpoint client 10.1.0.2 sticks to from cluster-endpoints only (affinity entry kept)"
EP=$(ip netns exec "$NODE" nft list map ip kpng affinity | grep -o '10.1.0.2 . 10.96.0.11 . tcp . 80 [^:]*: [0-9.]* . 8080' | awk '{print $NF, $(NF-2)}')
echo "  client 10.1.0.2 sticky endpoint (port ip): $EP"
EPIP=$(echo $EP | awk '{print $2}')
ip netns exec "$NODE" ip addr del $EPIP/32 dev lo   # endpoint really gone
echo -n "  after endpoint gone, stale affinity: "; cli tcp 10.96.0.11 80 5 --src 10.1.0.2
ip netns exec "$NODE" ip addr add $EPIP/32 dev lo
echo "== 3d. INCREMENTAL: add chain cluster-n2 in a later transaction, shrink 10.96.0.10 udp/53 to 2 endpoints"
ip netns exec "$NODE" nft -f - <<'NFT' && echo "   applied"
add chain ip kpng cluster-n2
add rule ip kpng cluster-n2 meta l4proto tcp dnat ip to ip daddr . tcp dport . numgen random mod 2 map @cluster-endpoints-tcp
add rule ip kpng cluster-n2 meta l4proto udp dnat ip to ip daddr . udp dport . numgen random mod 2 map @cluster-endpoints-udp
delete element ip kpng cluster-endpoints-udp { 10.96.0.10 . 53 . 2 }
delete element ip kpng cluster-pick { 10.96.0.10 . udp . 53 }
add element ip kpng cluster-pick { 10.96.0.10 . udp . 53 : goto cluster-n2 }
NFT
echo -n "remote udp 10.96.0.10:53 : "; cli udp 10.96.0.10 53 $N
echo "== 4. affinity entry timeout / counters"
ip netns exec "$NODE" nft list map ip kpng affinity | grep -c expires
