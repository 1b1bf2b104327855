#!/bin/bash
# Real-packet test of affinity variant S (traffic-v4-affinity-s.nft) and of
# packet-path `update` semantics on an existing map element.
. "$(dirname "$0")/lib.sh"
mkns NODE node; mkns CLI cli
ip link add n0 netns "$NODE" type veth peer name c0 netns "$CLI"
ip -n "$NODE" addr add 10.1.0.1/24 dev n0; ip -n "$NODE" link set n0 up
ip -n "$CLI" addr add 10.1.0.2/24 dev c0; ip -n "$CLI" addr add 10.1.0.3/24 dev c0
ip -n "$CLI" link set c0 up; ip -n "$CLI" route add default via 10.1.0.1
for i in 1 2 3 4; do ip -n "$NODE" addr add 10.0.0.$i/32 dev lo; done
ip -n "$NODE" route add 10.96.0.0/12 via 10.1.0.2
ip netns exec "$NODE" python3 "$HERE/echo_servers.py" 10.0.0.{1,2,3,4}:8080 >/dev/null &
PIDS+=($!)
sleep 0.7
ip netns exec "$NODE" nft -f "$HERE/traffic-v4-affinity-s.nft" || exit 1
cli()  { ip netns exec "$CLI"  python3 "$HERE/client.py" "$@"; }
nftn() { ip netns exec "$NODE" nft "$@"; }
echo "== S1. same client, three entry points of one service port (id 0x17)"
echo -n "10.1.0.2 -> 10.96.0.12:80 : "; cli tcp 10.96.0.12 80 20 --src 10.1.0.2
echo -n "10.1.0.2 -> 10.96.0.13:80 : "; cli tcp 10.96.0.13 80 20 --src 10.1.0.2
echo -n "10.1.0.2 -> nodeport 30081: "; cli tcp 10.1.0.1 30081 20 --src 10.1.0.2
echo -n "10.1.0.3 -> 10.96.0.12:80 : "; cli tcp 10.96.0.12 80 20 --src 10.1.0.3
nftn list map ip kpngs affinity | grep -A3 elements
echo "== S2. stale guard: delete 10.1.0.2's endpoint from id-endpoints + id-endpoint-valid (compact slots)"
EP=$(nftn list map ip kpngs affinity | grep -o '10.1.0.2 . 0x00000017 [^:]*: [0-9.]*' | awk '{print $NF}')
echo "  sticky endpoint of 10.1.0.2 was $EP"
# rebuild the 4 slots as 3 slots without $EP, in one transaction
{
  # NOTE: the chain must be created BEFORE any vmap element that jumps/gotos
  # to it in the same batch, else "Could not process rule: No such file or directory"
  echo "add chain ip kpngs cluster-n3"
  for key in "10.96.0.12 . tcp . 80" "10.96.0.13 . tcp . 80"; do
    for s in 0 1 2 3; do echo "delete element ip kpngs cluster-endpoints { $key . $s }"; done
    s=0; for i in 1 2 3 4; do [ "10.0.0.$i" = "$EP" ] && continue
      echo "add element ip kpngs cluster-endpoints { $key . $s : 10.0.0.$i . 8080 }"; s=$((s+1)); done
    echo "delete element ip kpngs cluster-pick { $key }"
    echo "add element ip kpngs cluster-pick { $key : goto cluster-n3 }"
  done
  echo "delete element ip kpngs id-endpoint-valid { 0x17 . $EP . 8080 }"
  echo "flush chain ip kpngs cluster-n3"
  echo "add rule ip kpngs cluster-n3 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @cluster-endpoints"
} | nftn -f - && echo "  endpoint removed (one transaction)"
ip netns exec "$NODE" ip addr del $EP/32 dev lo
START=$(date +%s.%N)
echo -n "  10.1.0.2 next 10 conns  : "; cli tcp 10.96.0.12 80 10 --src 10.1.0.2
echo "  (elapsed $(echo "$(date +%s.%N) - $START" | bc) s; first SYN dropped by guard -> 1 s retransmit)"
nftn list chain ip kpngs aff-t10800 | grep counter
nftn list map ip kpngs affinity | grep -A3 elements
ip netns exec "$NODE" ip addr add $EP/32 dev lo
echo "== S3. does packet-path 'update' overwrite DATA / refresh timeout of an existing element?"
nftn add element ip kpngs affinity "{ 10.1.0.3 . 0x99 timeout 10800s expires 100s : 10.0.0.9 . 9999 }"
# craft: connection whose ct mark = 0x99 goes through random pick (temporarily map 10.96.0.14 -> id 0x99)
nftn -f - <<'NFT'
add chain ip kpngs svc-random-99
add element ip kpngs service-ips { 10.96.0.14 . tcp . 80 : goto svc-random-99 }
add rule ip kpngs svc-random-99 meta l4proto tcp ct mark set 0x99 dnat ip to 10.0.0.1:8080
add element ip kpngs affinity-timeout { 0x99 : goto aff-t10800 }
add element ip kpngs id-endpoint-valid { 0x99 . 10.0.0.1 . 8080 }
NFT
echo -n "  before: "; nftn list map ip kpngs affinity | grep -o '10.1.0.3 . 0x00000099[^,}]*'
echo -n "  conn  : "; cli tcp 10.96.0.14 80 1 --src 10.1.0.3
echo -n "  after : "; nftn list map ip kpngs affinity | grep -o '10.1.0.3 . 0x00000099[^,}]*'
