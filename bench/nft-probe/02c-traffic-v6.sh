#!/bin/bash
# Real-packet IPv6 test (traffic-v6.nft): slot-map spread, NodePort, affinity
# variant S (two dynamic maps), stale guard, LB source ranges, no-endpoint
# reject/drop, cluster-ip reject, hairpin masquerade.
. "$(dirname "$0")/lib.sh"
N=${N:-300}
mkns NODE node6; mkns CLI cli6
ip link add n0 netns "$NODE" type veth peer name c0 netns "$CLI"
ip -n "$NODE" addr add fd00:1::1/64 dev n0 nodad; ip -n "$NODE" link set n0 up
ip -n "$CLI" addr add fd00:1::2/64 dev c0 nodad; ip -n "$CLI" addr add fd00:1::3/64 dev c0 nodad
ip -n "$CLI" link set c0 up; ip -n "$CLI" -6 route add default via fd00:1::1
ip netns exec "$NODE" sysctl -qw net.ipv6.conf.all.forwarding=1
for i in 1 2 3; do ip -n "$NODE" addr add fd00::$i/128 dev lo nodad; done
ip -n "$NODE" -6 route add fd00:96::/108 via fd00:1::2
ip netns exec "$NODE" python3 "$HERE/echo_servers.py" '[fd00::1]:8080' '[fd00::2]:8080' '[fd00::3]:8080' >/dev/null &
PIDS+=($!)
sleep 1
ip netns exec "$NODE" nft -f "$HERE/traffic-v6.nft" || exit 1
cli()  { ip netns exec "$CLI"  python3 "$HERE/client.py" "$@"; }
node() { ip netns exec "$NODE" python3 "$HERE/client.py" "$@"; }
nftn() { ip netns exec "$NODE" nft "$@"; }
echo "== 1. ClusterIP fd00:96::10 (3 endpoints), $N conns"
echo -n "remote tcp : "; cli tcp fd00:96::10 80 $N
echo -n "local  tcp : "; node tcp fd00:96::10 80 $N
echo "== 2. NodePort fd00:1::1:30080 (fd00::2, fd00::3)"
echo -n "remote tcp : "; cli tcp fd00:1::1 30080 $N
echo "== 3. affinity fd00:96::11 (variant S, maps affinity-addr/-port)"
echo -n "fd00:1::2  : "; cli tcp fd00:96::11 80 30 --src fd00:1::2
echo -n "fd00:1::3  : "; cli tcp fd00:96::11 80 30 --src fd00:1::3
echo -n "local      : "; node tcp fd00:96::11 80 30
nftn list map ip6 kpng affinity-addr | grep -A3 elements
EP=$(ip netns exec "$CLI" python3 "$HERE/client.py" tcp fd00:96::11 80 1 --src fd00:1::2 | grep -o 'fd00::[0-9]')
echo "== 3b. stale guard: remove $EP (sticky endpoint of fd00:1::2) from the service"
{
  echo "add chain ip6 kpng cluster-n2"
  echo "add rule ip6 kpng cluster-n2 dnat ip6 to ip6 daddr . meta l4proto . th dport . numgen random mod 2 map @cluster-endpoints"
  for s in 0 1 2; do echo "delete element ip6 kpng cluster-endpoints { fd00:96::11 . tcp . 80 . $s }"; done
  s=0; for i in 1 2 3; do [ "fd00::$i" = "$EP" ] && continue
    echo "add element ip6 kpng cluster-endpoints { fd00:96::11 . tcp . 80 . $s : fd00::$i . 8080 }"; s=$((s+1)); done
  echo "delete element ip6 kpng cluster-pick { fd00:96::11 . tcp . 80 }"
  echo "add element ip6 kpng cluster-pick { fd00:96::11 . tcp . 80 : goto cluster-n2 }"
  echo "delete element ip6 kpng id-endpoint-valid { 0x21 . $EP . 8080 }"
} | nftn -f - && echo "   removed in one transaction"
ip netns exec "$NODE" ip addr del $EP/128 dev lo
echo -n "fd00:1::2 after removal: "; cli tcp fd00:96::11 80 10 --src fd00:1::2
nftn list chain ip6 kpng aff-t10800 | grep -o 'counter packets [0-9]*'
ip netns exec "$NODE" ip addr add $EP/128 dev lo nodad
echo "== 4. LB source ranges: fd00:96::10 allows fd00:1::/64, fd00:96::13 allows only fd00:2::/64"
echo -n "fd00:96::10 from fd00:1::2: "; cli tcp fd00:96::10 80 5
echo -n "fd00:96::13 from fd00:1::2: "; cli tcp fd00:96::13 80 3
echo "== 5. no endpoints: fd00:96::12 tcp/80 -> goto reject-chain, udp/53 -> drop"
echo -n "tcp remote : "; cli tcp fd00:96::12 80 3
echo -n "tcp local  : "; node tcp fd00:96::12 80 3
echo -n "udp remote : "; cli udp fd00:96::12 53 2
echo "== 6. cluster IP on a non-service port -> reject"
echo -n "fd00:96::10:81 remote: "; cli tcp fd00:96::10 81 3
echo "reject-chain $(nftn list chain ip6 kpng reject-chain | grep -o "counter packets [0-9]*")"
echo "== 7. hairpin: endpoint fd00::1 connecting to its own service is masqueraded"
nftn add element ip6 kpng hairpin-connections '{ fd00::2 . fd00::2 . tcp . 8080, fd00::3 . fd00::3 . tcp . 8080 }'
ip netns exec "$NODE" conntrack -F 2>/dev/null
echo -n "local from fd00::1 : "; node tcp fd00:96::10 80 30 --src fd00::1
ip netns exec "$NODE" conntrack -L -f ipv6 -p tcp 2>/dev/null | grep 'src=fd00::1 dst=fd00:96::10' | awk '{for(i=1;i<=NF;i++) if($i ~ /^(src|dst)=/) printf "%s ", $i; print ""}' | sort | uniq -c | head -4
