#!/bin/bash
# Transaction semantics of nft 1.0.6 on this kernel: destroy, element overwrite,
# verdict-map value change, -c (check only).  Runs in a throwaway netns.
. "$(dirname "$0")/lib.sh"
mkns NS sem
n() { ip netns exec "$NS" nft "$@"; }
f() { ip netns exec "$NS" nft -f - ; }
try() { local label=$1; shift; if out=$("$@" 2>&1); then echo "OK   : $label"; else echo "FAIL : $label"; echo "$out" | sed 's/^/       | /'; fi; }
cat <<'NFT' | f
table ip kpng {
	chain a { }
	chain b { }
	set s { type ipv4_addr . inet_proto . inet_service; }
	map m { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service; }
	map vm { type ipv4_addr . inet_proto . inet_service : verdict; elements = { 10.96.0.1 . tcp . 80 : goto a } }
}
NFT
echo "== destroy (not in nft 1.0.6; added in nft 1.0.8)"
try "destroy table ip nosuch"              n destroy table ip nosuch
try "destroy chain ip kpng nosuch"         n destroy chain ip kpng nosuch
try "destroy element ip kpng s {nonexist}" n destroy element ip kpng s '{ 1.2.3.4 . tcp . 1 }'
echo "== add element that exists with a DIFFERENT value"
n add element ip kpng m '{ 10.96.0.1 . tcp . 80 : 10.0.0.1 . 8080 }'
try "add   element m (same key, other value)"  n add element ip kpng m '{ 10.96.0.1 . tcp . 80 : 10.0.0.2 . 8080 }'
n list map ip kpng m | grep -o '10.96.0.1 . tcp . 80 : [0-9.]* . [0-9]*' | sed 's/^/       value now: /'
try "create element m (same key, same value)"  n create element ip kpng m '{ 10.96.0.1 . tcp . 80 : 10.0.0.1 . 8080 }'
try "add   element m (same key, same value)"   n add element ip kpng m '{ 10.96.0.1 . tcp . 80 : 10.0.0.1 . 8080 }'
try "add   element vm (same key, goto b)"      n add element ip kpng vm '{ 10.96.0.1 . tcp . 80 : goto b }'
n list map ip kpng vm | grep -o '10.96.0.1 . tcp . 80 : goto [a-z]*' | sed 's/^/       value now: /'
try "delete+add element vm in one -f" f <<'NFT'
delete element ip kpng vm { 10.96.0.1 . tcp . 80 }
add element ip kpng vm { 10.96.0.1 . tcp . 80 : goto b }
NFT
n list map ip kpng vm | grep -o '10.96.0.1 . tcp . 80 : goto [a-z]*' | sed 's/^/       value now: /'
try "delete element + add element + delete chain a in one -f (chain a no longer referenced)" f <<'NFT'
delete element ip kpng vm { 10.96.0.1 . tcp . 80 }
add element ip kpng vm { 10.96.0.1 . tcp . 80 : goto b }
delete chain ip kpng a
NFT
try "delete chain still referenced by vmap element" n delete chain ip kpng b
try "delete element that does not exist"  n delete element ip kpng s '{ 1.2.3.4 . tcp . 1 }'
try "batch: 1 bad delete aborts whole batch (add s elem + delete missing)" f <<'NFT'
add element ip kpng s { 9.9.9.9 . tcp . 9 }
delete element ip kpng s { 1.2.3.4 . tcp . 1 }
NFT
n list set ip kpng s | grep -q 9.9.9.9 && echo "       9.9.9.9 present (NOT atomic!)" || echo "       9.9.9.9 absent -> batch is atomic"
try "idempotent delete idiom: add element then delete element in same batch" f <<'NFT'
add element ip kpng s { 1.2.3.4 . tcp . 1 }
delete element ip kpng s { 1.2.3.4 . tcp . 1 }
NFT
try "idempotent chain idiom: add chain; flush chain; add rule" f <<'NFT'
add chain ip kpng c
flush chain ip kpng c
add rule ip kpng c counter
NFT
try "idempotent table idiom: add table; delete table; table {...}" f <<'NFT'
add table ip kpngx
delete table ip kpngx
table ip kpngx {
	chain z {
	}
}
NFT
echo "== element comment / timeout syntax"
try "element comment in add element" n add element ip kpng s '{ 5.5.5.5 . udp . 53 comment "kube-system/dns:dns" }'
n list set ip kpng s | grep -o '5.5.5.5[^,}]*' | sed 's/^/       listed: /'
echo "== nft -c (check only) side effects"
n list ruleset > /tmp/nftp-before.$$
echo "       (note: a one-line  table x { chain z { } }  is a SYNTAX ERROR in 1.0.6; empty chain braces need a newline)"
printf 'table ip kpngc {\n chain z {\n }\n}\nadd element ip kpng s { 7.7.7.7 . tcp . 7 }\n' | ip netns exec "$NS" nft -c -f - && echo "OK   : nft -c -f accepted"
n list ruleset > /tmp/nftp-after.$$
cmp -s /tmp/nftp-before.$$ /tmp/nftp-after.$$ && echo "       ruleset unchanged after -c" || echo "       RULESET CHANGED after -c"
printf 'add element ip kpng s { 1.2.3.4 . tcp . 1 }\ndelete element ip kpng s { 8.8.8.8 . tcp . 8 }\n' | ip netns exec "$NS" nft -c -f - 2>&1 | head -3 | sed 's/^/       -c on bad delete: /'
printf 'add element ip kpng vm { 1.2.3.4 . tcp . 1 : goto nochain }\n' | ip netns exec "$NS" nft -c -f - 2>&1 | head -2 | sed 's/^/       -c on goto missing chain: /'
echo "       root-ns ruleset tables (must be unaffected): $(nft list tables 2>/dev/null | grep -c kpng) kpng tables"
rm -f /tmp/nftp-before.$$ /tmp/nftp-after.$$
