#!/usr/bin/python3
"""Seeds the fuzz corpora from tests/data/malformed_packets.txt: every frame
seeds fuzz_packet; the IP packet of every frame seeds fuzz_icmp as a quote
(first byte selects ICMP (even) or ICMPv6 (odd))."""
import hashlib
import os

here = os.path.dirname(os.path.abspath(__file__))
src = os.path.join(here, "..", "data", "malformed_packets.txt")
for d in ("fuzz_packet", "fuzz_icmp"):
    os.makedirs(os.path.join(here, "corpus", d), exist_ok=True)


def write(target, data):
    name = hashlib.sha1(data).hexdigest()
    with open(os.path.join(here, "corpus", target, name), "wb") as f:
        f.write(data)


for line in open(src):
    if line.startswith("#") or not line.strip():
        continue
    name, reason, hexdata = line.split()
    frame = bytes.fromhex(hexdata)
    write("fuzz_packet", frame)
    if len(frame) > 14:
        ip = frame[14:]
        if frame[12:14] == b"\x81\x00":
            ip = frame[18:]
        selector = b"\x01" if (ip[:1] and ip[0] >> 4 == 6) else b"\x00"
        write("fuzz_icmp", selector + ip)
