#!/usr/bin/env python3
"""A foreign nftables notification listener that never reads.

While any socket on the host is a member of NFNLGRP_NFTABLES, the kernel builds one
notification per element of every nftables commit (it checks for listeners host-wide), the
cost firewalld, `nft monitor` or another kpng put on kpng's commits. The bench scripts run this
beside kpng with LISTEN=1; it exits after an hour or when killed.
"""
import socket
import time

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_ADD_MEMBERSHIP = 1
NFNLGRP_NFTABLES = 7

s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
s.bind((0, 0))
s.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, NFNLGRP_NFTABLES)
time.sleep(3600)
