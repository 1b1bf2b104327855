#!/usr/bin/env python3
"""Connect N times to a target and histogram which endpoint answered.

usage: client.py tcp|udp HOST PORT N [--src ADDR]
Each attempt uses a fresh socket (fresh source port => fresh conntrack entry).
Prints a JSON dict {endpoint: count, "FAIL": count}.
"""
import json, socket, sys, collections
proto, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
src = sys.argv[sys.argv.index("--src") + 1] if "--src" in sys.argv else None
fam = socket.AF_INET6 if ":" in host else socket.AF_INET
hist = collections.Counter()
for _ in range(n):
    s = socket.socket(fam, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
    s.settimeout(1.0)
    try:
        if src: s.bind((src, 0))
        if proto == "tcp":
            s.connect((host, port)); data = s.recv(100)
        else:
            s.sendto(b"x", (host, port)); data, _ = s.recvfrom(100)
        hist[data.decode()] += 1
    except Exception as e:
        hist["FAIL:" + type(e).__name__] += 1
    finally:
        s.close()
print(json.dumps(dict(sorted(hist.items()))))
