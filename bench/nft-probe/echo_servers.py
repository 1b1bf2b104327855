#!/usr/bin/env python3
"""Tiny identity servers for nft-probe traffic tests.

usage: echo_servers.py ADDR:PORT [ADDR:PORT ...]
For every ADDR:PORT it opens a TCP listener and a UDP socket. Each TCP
connection / UDP datagram is answered with the string "ADDR:PORT" so the
client can tell which endpoint the (DNATed) connection landed on.
Works for IPv4 and IPv6 ("[fd00::1]:8080").
"""
import socket, sys, threading

def parse(s):
    host, port = s.rsplit(":", 1)
    host = host.strip("[]")
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    return fam, host, int(port), s

def tcp(fam, host, port, ident):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port)); s.listen(512)
    while True:
        c, _ = s.accept()
        try: c.sendall(ident.encode())
        finally: c.close()

def udp(fam, host, port, ident):
    s = socket.socket(fam, socket.SOCK_DGRAM)
    s.bind((host, port))
    while True:
        _, peer = s.recvfrom(2048)
        s.sendto(ident.encode(), peer)

for a in sys.argv[1:]:
    fam, host, port, ident = parse(a)
    for fn in (tcp, udp):
        threading.Thread(target=fn, args=(fam, host, port, ident), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
