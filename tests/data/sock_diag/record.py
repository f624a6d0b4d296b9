#!/usr/bin/env python3
"""Records the kernel's NETLINK_SOCK_DIAG answers that tests/unit/sock_diag_test
parses (tcp4-N.bin, tcp6-N.bin: datagram N of each dump, as recv() returned it).
Run as root inside a fresh network namespace:
  ip netns add rec; ip -n rec link set lo up
  ip -n rec addr add 192.0.2.10/32 dev lo; ip -n rec addr add 198.51.100.7/32 dev lo
  ip -n rec addr add 2001:db8:ffff::10/128 dev lo nodad
  ip -n rec addr add 2001:db8:c::7/128 dev lo nodad
  ip netns exec rec python3 record.py OUTDIR; ip netns del rec
Connections (fixed client ports so the test can name them):
  198.51.100.7:40001 -> 192.0.2.10:8080        IPv4, established
  2001:db8:c::7:40002 -> [2001:db8:ffff::10]:8080   IPv6, established
  198.51.100.7:40003 -> 192.0.2.10:9090 on a dual-stack [::] listener
                                      (the accepted socket is v4-mapped IPv6)
Both ends of each are in the dump, and the listeners are not (their state is
not in the request's mask). Request: sequence 7, states 0x1b3a (SYN_RECV to
LAST_ACK and NEW_SYN_RECV)."""
import socket
import struct
import sys

out = sys.argv[1]
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 1, 0x300
STATES = (1 << 1) | (1 << 3) | (1 << 4) | (1 << 5) | (1 << 8) | (1 << 9) | (1 << 11) | (1 << 12)


def listener(family, addr, port, v6only=None):
    s = socket.socket(family, socket.SOCK_STREAM)
    if v6only is not None:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
    s.bind((addr, port))
    s.listen(4)
    return s


def connect(family, src, sport, dst, dport, server):
    c = socket.socket(family, socket.SOCK_STREAM)
    c.bind((src, sport))
    c.connect((dst, dport))
    a, _ = server.accept()
    return c, a


l4 = listener(socket.AF_INET, "192.0.2.10", 8080)
l6 = listener(socket.AF_INET6, "2001:db8:ffff::10", 8080)
dual = listener(socket.AF_INET6, "::", 9090, v6only=0)
keep = [connect(socket.AF_INET, "198.51.100.7", 40001, "192.0.2.10", 8080, l4),
        connect(socket.AF_INET6, "2001:db8:c::7", 40002, "2001:db8:ffff::10", 8080, l6),
        connect(socket.AF_INET, "198.51.100.7", 40003, "192.0.2.10", 9090, dual)]

nl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4)  # NETLINK_SOCK_DIAG
for family, name in ((socket.AF_INET, "tcp4"), (socket.AF_INET6, "tcp6")):
    body = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, STATES) + bytes(48)
    header = struct.pack("=IHHII", 16 + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP,
                         7, 0)
    nl.sendto(header + body, (0, 0))
    # Each datagram as recv() returned it, until the one with NLMSG_DONE (3).
    n, done = 0, False
    while not done:
        data = nl.recv(65536)
        offset = 0
        while offset < len(data):
            length, kind = struct.unpack_from("=IH", data, offset)
            done = done or kind == 3
            offset += (length + 3) & ~3
        open(f"{out}/{name}-{n}.bin", "wb").write(data)
        print(f"{name}-{n}.bin", len(data), "bytes")
        n += 1
