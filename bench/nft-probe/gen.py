#!/usr/bin/env python3
"""Generate a kpng-style IPv4 ruleset for N services x E endpoints.

usage:
  gen.py full  N E            > file   # one nft -f file: table + all elements
  gen.py skel  N E            > file   # table/maps/chains only (no elements)
  gen.py batch N E SIZE OUTDIR         # skeleton + element files of ~SIZE elems
  gen.py ep-change N E        > file   # change one endpoint of service 0 (delete+add)
  gen.py add-svc N E          > file   # add one whole new service (index N)
  gen.py affinity K           > file   # K elements for the dynamic affinity map
Service i: VIP 10.96.0.0+i, tcp/80; endpoint j of service i: 10.128.0.0+i*E+j :8080
Element counts: service-ips N, cluster-pick N, cluster-ips N, cluster-endpoints N*E.
"""
import ipaddress, os, sys

VIP0 = int(ipaddress.IPv4Address("10.96.0.0"))
EP0 = int(ipaddress.IPv4Address("10.128.0.0"))
ip = lambda n: str(ipaddress.IPv4Address(n))

def skeleton(E):
    nchains = "".join(
        f"\tchain cluster-n{k} {{\n\t\tdnat ip to ip daddr . meta l4proto . th dport . numgen random mod {k} map @cluster-endpoints\n\t}}\n"
        for k in sorted({1, E}))
    return f"""table ip kpng {{
	map service-ips {{
		type ipv4_addr . inet_proto . inet_service : verdict
	}}
	map cluster-pick {{
		type ipv4_addr . inet_proto . inet_service : verdict
	}}
	map cluster-endpoints {{
		typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . tcp dport
	}}
	set cluster-ips {{
		type ipv4_addr
	}}
	map affinity {{
		type ipv4_addr . ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service
		flags dynamic,timeout
		timeout 3h
		size 1048576
	}}
	chain nat-prerouting {{
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}}
	chain nat-output {{
		type nat hook output priority -100; policy accept;
		jump services
	}}
	chain services {{
		ip daddr . meta l4proto . th dport vmap @service-ips
	}}
	chain svc-cluster {{
		ip daddr . meta l4proto . th dport vmap @cluster-pick
	}}
	chain filter-forward {{
		type filter hook forward priority filter; policy accept;
		ct state new ip daddr @cluster-ips reject
	}}
{nchains}}}
"""

def elems(N, E, start=0):
    """yield (mapname, element-text) for services start..N-1"""
    for i in range(start, N):
        v = ip(VIP0 + i)
        yield "service-ips", f"{v} . tcp . 80 : goto svc-cluster"
        yield "cluster-pick", f"{v} . tcp . 80 : goto cluster-n{E}"
        yield "cluster-ips", v
        for j in range(E):
            yield "cluster-endpoints", f"{v} . tcp . 80 . {j} : {ip(EP0 + i * E + j)} . 8080"

def add_elements(it, chunk=1000):
    """render as 'add element' commands, grouped per map, `chunk` elems per cmd"""
    out, cur, buf = [], None, []
    def flush():
        if buf: out.append(f"add element ip kpng {cur} {{ " + ", ".join(buf) + " }\n")
    for m, e in it:
        if m != cur or len(buf) >= chunk:
            flush(); cur, buf = m, []
        buf.append(e)
    flush()
    return out

def main():
    cmd = sys.argv[1]
    if cmd == "affinity":
        K = int(sys.argv[2])
        it = (("affinity", f"{ip(int(ipaddress.IPv4Address('172.16.0.0')) + k)} . 10.96.0.1 . tcp . 80 : 10.128.0.1 . 8080") for k in range(K))
        sys.stdout.writelines(add_elements(it)); return
    N, E = int(sys.argv[2]), int(sys.argv[3])
    if cmd == "skel":
        sys.stdout.write(skeleton(E))
    elif cmd == "full":
        sys.stdout.write(skeleton(E))
        # sort by map so each map gets big add-element commands
        items = sorted(elems(N, E), key=lambda x: x[0])
        sys.stdout.writelines(add_elements(items))
    elif cmd == "batch":
        size, outdir = int(sys.argv[4]), sys.argv[5]
        os.makedirs(outdir, exist_ok=True)
        open(f"{outdir}/000-skel.nft", "w").write(skeleton(E))
        per_svc = 3 + E
        step = max(1, size // per_svc)
        for b, s in enumerate(range(0, N, step), 1):
            items = sorted(elems(min(N, s + step), E, s), key=lambda x: x[0])
            open(f"{outdir}/{b:03d}-elems.nft", "w").writelines(add_elements(items))
    elif cmd == "ep-change":
        v = ip(VIP0)
        print(f"delete element ip kpng cluster-endpoints {{ {v} . tcp . 80 . 0 }}")
        print(f"add element ip kpng cluster-endpoints {{ {v} . tcp . 80 . 0 : 10.200.0.1 . 8080 }}")
    elif cmd == "add-svc":
        sys.stdout.writelines(add_elements(elems(N + 1, E, N)))

main()
