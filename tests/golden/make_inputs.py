#!/usr/bin/python3
"""The golden pcap cases: each case's configuration and input frames, built
with scapy, and what must become of every frame.

A case is a spillwayd configuration (TOML text, one net_pcap port) and a list
of input frames, each annotated with its fate as the design says it must be
(DESIGN.md "Data path", include/spillway/steering.hpp):

  forward            a VIP flow packet, encapsulated to the flow's backend;
                     WHICH backend is not written here: golden_check.py
                     predicts it from the configuration (SipHash-1-3 flow hash
                     and Maglev table, via scripts/estate_harness/maglev_reference.py)
  forward_icmp       an ICMP error quoting a VIP flow, steered to that flow's
                     backend (same prediction, from the quoted flow)
  reply echo         ICMP / ICMPv6 echo reply from a VIP with answer_ping
  reply frag_needed  ICMP "fragmentation needed" / ICMPv6 "packet too big"
                     back to the client: too big once encapsulated
  kernel             not for a VIP: the exception path's (counted to_kernel on
                     a port with a kernel path; on these net_pcap ports without
                     a tap, dropped as no_exception_path; nothing leaves)
  drop REASON        dropped and counted under drops[REASON]

Run as a program it writes cases/<case>/config.toml and cases/<case>/in.pcap
for the named cases (default: all):

  /usr/bin/python3 tests/golden/make_inputs.py [--cases-dir DIR] [CASE ...]

run_golden.py imports it to get the annotations and to check that the
committed config.toml and in.pcap are still what this file builds. The
expected outputs come from run_golden.py (SPILLWAY_REGENERATE_GOLDEN=1); see
README.md.
"""

import argparse
import logging
import os
import random
import struct
import sys

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)
from scapy.all import (  # noqa: E402
    ARP,
    ICMP,
    IP,
    TCP,
    UDP,
    Dot1Q,
    Ether,
    ICMPv6EchoRequest,
    ICMPv6ND_NS,
    ICMPv6ND_RA,
    ICMPv6NDOptSrcLLAddr,
    ICMPv6PacketTooBig,
    ICMPv6TimeExceeded,
    ICMPv6DestUnreach,
    IPv6,
    IPv6ExtHdrHopByHop,
    Raw,
    raw,
)

HERE = os.path.dirname(os.path.abspath(__file__))
CASES_DIR = os.path.join(HERE, "cases")
CORPUS = os.path.join(HERE, "..", "data", "malformed_packets.txt")

# The same on every case: one worker lcore (so the output order is the input
# order), one one-armed net_pcap port, a static next hop (no neighbour lookup).
CLIENT_MAC = "02:00:00:00:00:01"
LB_MAC = "02:70:63:61:70:00"  # what net_pcap reports for its first device
NEXT_HOP_MAC = "02:00:5e:10:00:01"
HOST4 = "198.51.100.2"        # the port's tunnel source = the host's address
HOST6 = "2001:db8:100::2"
PCAP_TIME = 1_700_000_000

DATAPLANE = """\
[dataplane]
lcores = [1]
hash_seed = "{seed}"
flow_capacity = 4096
"""

PORT = """\
[[port]]
name = "p0"
devargs = "net_pcap0,rx_pcap=in.pcap,tx_pcap=out.pcap"
address = "198.51.100.2"
address6 = "2001:db8:100::2"
next_hop_mac = "%s"
{extra}""" % NEXT_HOP_MAC


def fate(kind, detail=None):
    return {"fate": kind, "detail": detail}


FORWARD = fate("forward")
FORWARD_ICMP = fate("forward_icmp")
KERNEL = fate("kernel")
ECHO = fate("reply", "echo")
TOO_BIG = fate("reply", "frag_needed")


def drop(reason):
    return fate("drop", reason)


class Case:
    def __init__(self, name, doc, config):
        self.name = name
        self.doc = doc
        self.config = config
        self.frames = []  # (bytes, fate, note)
        # Checked by golden_check.py on the output: (inner IP version,
        # encapsulation kind) pairs some packet must take, and whether every
        # backend that may take new flows must have received some.
        self.cover = []
        self.spread = False

    def add(self, pkt, what, note=""):
        data = pkt if isinstance(pkt, bytes) else raw(pkt)
        self.frames.append((data, what, note))

    def write(self, cases_dir):
        out = os.path.join(cases_dir, self.name)
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "config.toml"), "w") as f:
            f.write(self.config)
        write_pcap(os.path.join(out, "in.pcap"), [data for data, _, _ in self.frames])


def write_pcap(path, frames):
    """A classic pcap (microseconds, Ethernet) with fixed timestamps, 1 ms
    apart, so the file changes only when a frame does. Written by hand: scapy
    would dissect and rebuild, and some corpus frames are too short for it."""
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for i, data in enumerate(frames):
            f.write(struct.pack("<IIII", PCAP_TIME + i // 1000, i % 1000 * 1000, len(data),
                                len(data)))
            f.write(data)


def eth(vlan=None):
    e = Ether(src=CLIENT_MAC, dst=LB_MAC)
    return e / Dot1Q(vlan=vlan) if vlan is not None else e


def client4(i):
    return "10.%d.%d.%d" % (1 + i // 65025, (i // 255) % 255, 1 + i % 255)


def client6(i):
    return "2001:db8:c1::%x" % (i + 1)


def config_text(seed, pools, vips, backends, port_extra=""):
    return (
        "# Generated by tests/golden/make_inputs.py: edit there, then regenerate.\n"
        + DATAPLANE.format(seed=seed)
        + "\n"
        + PORT.format(extra=port_extra)
        + "".join("\n" + p for p in pools)
        + "".join("\n" + v for v in vips)
        + "".join("\n" + b for b in backends)
    )


def pool(name, encap, site="onprem", gue_port=None):
    text = '[[pool]]\nname = "%s"\nsite = "%s"\nencap = "%s"\n' % (name, site, encap)
    if gue_port is not None:
        text += "gue_port = %d\n" % gue_port
    return text


def vip(name, address, pools, protocol="tcp", port=0, table_size=None, answer_ping=False):
    text = '[[vip]]\nname = "%s"\naddress = "%s"\nprotocol = "%s"\nport = %d\n' % (
        name, address, protocol, port)
    if table_size is not None:
        text += "table_size = %d\n" % table_size
    text += "pools = [%s]\n" % ", ".join('"%s"' % p for p in pools)
    if answer_ping:
        text += "answer_ping = true\n"
    return text


def backend(name, address, pool_name, weight=None, state=None, mac=None, ident=None):
    text = '[[backend]]\nname = "%s"\n' % name
    if ident is not None:
        text += "id = %s\n" % ident
    text += 'address = "%s"\npool = "%s"\n' % (address, pool_name)
    if weight is not None:
        text += "weight = %d\n" % weight
    if state is not None:
        text += 'state = "%s"\n' % state
    if mac is not None:
        text += 'mac = "%s"\n' % mac
    return text


# ---------------------------------------------------------------------------
# Flows to one VIP: a SYN from each client, then ACKs and data in another
# order (flow affinity on every case), some UDP.


def tcp_flows(case, rng, dst, count, first_client, v6=False, dport=None, vlan=None, tos=0):
    flows = []
    for i in range(count):
        src = client6(first_client + i) if v6 else client4(first_client + i)
        sport = rng.randrange(1024, 65536)
        port = dport if dport is not None else rng.choice([80, 443, 8000, 29500, 50051])
        flows.append((src, sport, port))
        ip = (IPv6(src=src, dst=dst, tc=tos, fl=rng.randrange(1 << 20)) if v6
              else IP(src=src, dst=dst, tos=tos, id=rng.randrange(65536), flags="DF"))
        case.add(eth(vlan) / ip / TCP(sport=sport, dport=port, flags="S", seq=1000 + i,
                                      options=[("MSS", 1460)]), FORWARD, "SYN")
    return flows


def tcp_followups(case, rng, dst, flows, v6=False, vlan=None):
    order = list(flows)
    rng.shuffle(order)
    for src, sport, port in order:
        ip = IPv6(src=src, dst=dst) if v6 else IP(src=src, dst=dst, flags="DF")
        case.add(eth(vlan) / ip / TCP(sport=sport, dport=port, flags="A", seq=1001, ack=5001),
                 FORWARD, "ACK")
    for src, sport, port in order[: len(order) // 2]:
        ip = IPv6(src=src, dst=dst) if v6 else IP(src=src, dst=dst, flags="DF")
        case.add(eth(vlan) / ip / TCP(sport=sport, dport=port, flags="PA", seq=1001, ack=5001)
                 / Raw(b"GET / HTTP/1.1\r\n\r\n"), FORWARD, "data")


def udp_flows(case, rng, dst, count, first_client, dport, v6=False, vlan=None):
    for i in range(count):
        src = client6(first_client + i) if v6 else client4(first_client + i)
        ip = IPv6(src=src, dst=dst) if v6 else IP(src=src, dst=dst)
        sport = rng.randrange(1024, 65536)
        for n in range(2):
            case.add(eth(vlan) / ip / UDP(sport=sport, dport=dport) / Raw(bytes([n]) * 24),
                     FORWARD, "UDP")


# ---------------------------------------------------------------------------
# The cases.


def case_ipv4_ipip():
    config = config_text(
        "0x9c4f1d2e7b3a5860",
        [pool("onprem", "ipip")],
        [vip("nccl", "192.0.2.10", ["onprem"]),
         vip("grpc", "192.0.2.11", ["onprem"], port=50051, table_size=251),
         vip("roce", "192.0.2.12", ["onprem"], protocol="udp", port=4791, table_size=13)],
        [backend("gpu-a1", "198.51.100.11", "onprem"),
         backend("gpu-a2", "198.51.100.12", "onprem"),
         backend("gpu-a3", "198.51.100.13", "onprem", weight=50),
         backend("gpu-a4", "198.51.100.14", "onprem", state="disabled"),
         backend("gpu-a5", "198.51.100.15", "onprem", weight=0),
         backend("gpu-a6", "198.51.100.16", "onprem", mac="02:00:00:00:0a:06")])
    c = Case("ipv4-ipip", "IPv4 VIPs over IPv4-in-IPv4 to six backends (weights 100/100/50, "
             "one disabled, one weight 0, one with its own next-hop MAC); three table sizes; "
             "TCP and UDP; DSCP/ECN copied; IPv4 options and TTL 2 carried", config)
    rng = random.Random(1)
    flows = tcp_flows(c, rng, "192.0.2.10", 40, 0)
    flows += tcp_flows(c, rng, "192.0.2.10", 4, 40, tos=0xb9)  # DSCP EF + ECT(1)
    grpc = tcp_flows(c, rng, "192.0.2.11", 12, 50, dport=50051)
    udp_flows(c, rng, "192.0.2.12", 8, 70, 4791)
    c.add(raw(eth() / IP(src=client4(91), dst="192.0.2.10") / TCP(sport=40001, dport=80, flags="S"))
          + b"\0" * 6, FORWARD, "SYN with Ethernet padding (not carried)")
    c.add(raw(eth() / IP(src=client4(91), dst="192.0.2.10") / TCP(sport=40001, dport=80, flags="A"))
          + b"\xee" * 6, FORWARD, "ACK with non-zero Ethernet padding (not carried)")
    c.add(eth() / IP(src=client4(90), dst="192.0.2.10", ttl=2, options=b"\x94\x04\x00\x00")
          / TCP(sport=40000, dport=80, flags="S"), FORWARD, "IPv4 router-alert option, TTL 2")
    tcp_followups(c, rng, "192.0.2.10", flows)
    tcp_followups(c, rng, "192.0.2.11", grpc)
    c.cover = [(4, "ipip4")]
    c.spread = True
    return c


def case_ipv4_gue():
    config = config_text(
        "0x0123456789abcdef",
        [pool("cloud-a", "gue", site="cloud"),
         pool("cloud-b", "gue", site="cloud", gue_port=7777)],
        [vip("infer", "192.0.2.20", ["cloud-a", "cloud-b"], table_size=65537),
         vip("infer-udp", "192.0.2.20", ["cloud-a"], protocol="udp", port=9000)],
        [backend("gpu-c1", "203.0.113.21", "cloud-a"),
         backend("gpu-c2", "203.0.113.22", "cloud-a", weight=200),
         backend("gpu-c3", "203.0.113.23", "cloud-b"),
         backend("gpu-c4", "203.0.113.24", "cloud-b", mac="02:00:5e:10:00:02")])
    c = Case("ipv4-gue", "IPv4 VIP over GUE in UDP/IPv4 (Gue4) to four backends of two pools "
             "(GUE ports 6080 and 7777); TCP and UDP; UDP source port from the flow hash",
             config)
    rng = random.Random(2)
    flows = tcp_flows(c, rng, "192.0.2.20", 36, 0, tos=0x02)
    udp_flows(c, rng, "192.0.2.20", 8, 100, 9000)
    tcp_followups(c, rng, "192.0.2.20", flows)
    c.cover = [(4, "gue4")]
    c.spread = True
    return c


def case_ipv6_ip6ip6():
    config = config_text(
        "0x5350494c4c574159",
        [pool("onprem6", "ipip")],
        [vip("nccl6", "2001:db8:200::10", ["onprem6"], table_size=1021),
         vip("dns6", "2001:db8:200::10", ["onprem6"], protocol="udp", port=53, table_size=1021)],
        [backend("gpu-b1", "2001:db8:b::11", "onprem6", ident=11),
         backend("gpu-b2", "2001:db8:b::12", "onprem6", ident='"0xfedcba9876543210"'),
         backend("gpu-b3", "2001:db8:b::13", "onprem6", weight=300)])
    c = Case("ipv6-ip6ip6", "IPv6 VIP over IPv6-in-IPv6 to three backends (explicit ids, one "
             "triple weight); flow label from the flow hash, traffic class copied; a "
             "hop-by-hop header carried", config)
    rng = random.Random(3)
    flows = tcp_flows(c, rng, "2001:db8:200::10", 36, 0, v6=True, tos=0x28)
    udp_flows(c, rng, "2001:db8:200::10", 6, 200, 53, v6=True)
    c.add(eth() / IPv6(src=client6(300), dst="2001:db8:200::10", hlim=2) / IPv6ExtHdrHopByHop()
          / UDP(sport=5353, dport=53) / Raw(b"q" * 20), FORWARD, "hop-by-hop header, hop limit 2")
    tcp_followups(c, rng, "2001:db8:200::10", flows, v6=True)
    c.cover = [(6, "ipip6")]
    c.spread = True
    return c


def case_ipv4_in_ipv6():
    config = config_text(
        "0x0000000000000001",
        [pool("onprem6", "ipip")],
        [vip("nccl", "192.0.2.40", ["onprem6"], table_size=4093)],
        [backend("gpu-d1", "2001:db8:d::1", "onprem6"),
         backend("gpu-d2", "2001:db8:d::2", "onprem6"),
         backend("gpu-d3", "2001:db8:d::3", "onprem6")])
    c = Case("ipv4-in-ipv6", "IPv4 VIP to IPv6 backends: IPv4-in-IPv6 (IpInIp6, next header 4)",
             config)
    rng = random.Random(4)
    flows = tcp_flows(c, rng, "192.0.2.40", 30, 0, tos=0x48)
    tcp_followups(c, rng, "192.0.2.40", flows)
    c.cover = [(4, "ipip6")]
    c.spread = True
    return c


def case_ipv6_gue6():
    config = config_text(
        "0x7fffffffffffffff",
        [pool("cloud6", "gue", site="cloud", gue_port=6081)],
        [vip("grpc6", "2001:db8:200::50", ["cloud6"], port=50051, table_size=65537),
         vip("quic6", "2001:db8:200::50", ["cloud6"], protocol="udp", port=443)],
        [backend("gpu-e1", "2001:db8:e::1", "cloud6"),
         backend("gpu-e2", "2001:db8:e::2", "cloud6"),
         backend("gpu-e3", "2001:db8:e::3", "cloud6", weight=10),
         backend("gpu-e4", "2001:db8:e::4", "cloud6", state="disabled")])
    c = Case("ipv6-gue6", "IPv6 VIP over GUE in UDP/IPv6 (Gue6, port 6081) to IPv6 backends; "
             "TCP and UDP (QUIC-like)", config)
    rng = random.Random(5)
    flows = tcp_flows(c, rng, "2001:db8:200::50", 30, 0, v6=True, dport=50051)
    udp_flows(c, rng, "2001:db8:200::50", 8, 100, 443, v6=True)
    tcp_followups(c, rng, "2001:db8:200::50", flows, v6=True)
    c.cover = [(6, "gue6")]
    c.spread = True
    return c


def case_mixed():
    config = config_text(
        "0x9c4f1d2e7b3a5860",
        [pool("onprem", "ipip"),
         pool("cloud", "gue", site="cloud")],
        [vip("any", "192.0.2.60", ["onprem", "cloud"], table_size=65537),
         vip("tls", "192.0.2.60", ["cloud"], port=443, table_size=251),
         vip("any6", "2001:db8:200::60", ["onprem", "cloud"], table_size=65537, answer_ping=True),
         vip("udp", "192.0.2.61", ["onprem"], protocol="udp")],
        [backend("on4-1", "198.51.100.31", "onprem", ident='"0x1001"'),
         backend("on4-2", "198.51.100.32", "onprem", ident='"0x1002"'),
         backend("on6-1", "2001:db8:b::31", "onprem", ident='"0x1003"'),
         backend("cl4-1", "203.0.113.31", "cloud", ident='"0x2001"',
                 mac="02:00:5e:10:00:02"),
         backend("cl6-1", "2001:db8:e::31", "cloud", ident='"0x2002"'),
         backend("cl6-2", "2001:db8:e::32", "cloud", ident='"0x2003"', weight=50)],
        port_extra="vlan = 100\n")
    c = Case("mixed", "IPv4 and IPv6 VIPs over two pools with IPv4 and IPv6 backends in one "
             "pcap: 4in4, 6in4, 4in6, 6in6, GUE over both; a port-specific VIP winning over "
             "the all-ports VIP of its address; tagged and untagged ingress, tagged egress "
             "(VLAN 100); host traffic and drops interleaved", config)
    rng = random.Random(6)
    v4 = tcp_flows(c, rng, "192.0.2.60", 24, 0)
    c.add(eth() / ARP(psrc=client4(0), pdst=HOST4), KERNEL, "ARP for the host")
    tls = tcp_flows(c, rng, "192.0.2.60", 10, 30, dport=443, vlan=7)
    v6 = tcp_flows(c, rng, "2001:db8:200::60", 24, 0, v6=True)
    c.add(eth() / IP(src=client4(1), dst="192.0.2.60") / UDP(sport=1, dport=2),
          drop("vip_port_not_served"), "UDP to a TCP-only VIP address")
    c.add(eth(vlan=7) / IPv6(src=client6(1), dst="2001:db8:200::60") / ICMPv6EchoRequest(
        id=7, seq=1, data=b"ping6 through a tag"), ECHO, "echo to the v6 VIP, tagged")
    udp_flows(c, rng, "192.0.2.61", 6, 50, 4791, vlan=7)
    c.add(eth() / IP(src=client4(2), dst=HOST4) / TCP(sport=50000, dport=22, flags="S"),
          KERNEL, "ssh to the host")
    tcp_followups(c, rng, "192.0.2.60", v4)
    tcp_followups(c, rng, "192.0.2.60", tls, vlan=7)
    tcp_followups(c, rng, "2001:db8:200::60", v6, v6=True)
    c.cover = [(v, k) for v in (4, 6) for k in ("ipip4", "ipip6", "gue4", "gue6")]
    c.spread = True
    return c


def case_exception():
    config = config_text(
        "0x9c4f1d2e7b3a5860",
        [pool("onprem", "ipip")],
        [vip("nccl", "192.0.2.70", ["onprem"], port=29500, table_size=13),
         vip("nccl6", "2001:db8:200::70", ["onprem"], table_size=13)],
        [backend("gpu-a1", "198.51.100.11", "onprem"),
         backend("gpu-b1", "2001:db8:b::11", "onprem")])
    c = Case("exception", "Host traffic on a port without an exception tap: ARP, ND, ssh, "
             "ping, BGP, DNS, LLDP, health-check replies; with no kernel path on the "
             "port all are dropped as no_exception_path and nothing is transmitted", config)
    nh = NEXT_HOP_MAC
    c.add(Ether(src=nh, dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, hwsrc=nh, psrc="198.51.100.1",
                                                          pdst=HOST4), KERNEL, "ARP who-has host")
    c.add(Ether(src=nh, dst=LB_MAC) / ARP(op=2, hwsrc=nh, psrc="198.51.100.1", hwdst=LB_MAC,
                                          pdst=HOST4), KERNEL, "ARP reply")
    c.add(Ether(src=nh, dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, hwsrc=nh, psrc="198.51.100.1",
                                                          pdst="192.0.2.70"), KERNEL,
          "ARP who-has the VIP")
    c.add(Ether(src=nh, dst="33:33:ff:00:00:02") / IPv6(src="fe80::1", dst="ff02::1:ff00:2",
                                                          hlim=255)
          / ICMPv6ND_NS(tgt=HOST6) / ICMPv6NDOptSrcLLAddr(lladdr=nh), KERNEL, "ND NS for host")
    c.add(Ether(src=nh, dst="33:33:00:00:00:01") / IPv6(src="fe80::1", dst="ff02::1", hlim=255)
          / ICMPv6ND_RA(), KERNEL, "router advertisement")
    c.add(Ether(src=nh, dst="33:33:ff:00:00:70") / IPv6(src="fe80::1", dst="ff02::1:ff00:70",
                                                          hlim=255)
          / ICMPv6ND_NS(tgt="2001:db8:200::70"), KERNEL, "ND NS for the VIP")
    for i in range(3):
        flags = "S" if i == 0 else "A"
        c.add(eth() / IP(src="203.0.113.5", dst=HOST4) / TCP(sport=51000, dport=22, flags=flags),
              KERNEL, "ssh to the host")
        c.add(eth() / IPv6(src="2001:db8:c1::5", dst=HOST6) / TCP(sport=51001, dport=22,
                                                                  flags=flags),
              KERNEL, "ssh to the host over IPv6")
    c.add(eth() / IP(src="203.0.113.5", dst=HOST4) / ICMP(type=8, id=1, seq=1), KERNEL,
          "ping the host")
    c.add(eth() / IPv6(src="2001:db8:c1::5", dst=HOST6) / ICMPv6EchoRequest(id=1, seq=1),
          KERNEL, "ping6 the host")
    c.add(eth() / IP(src="198.51.100.1", dst=HOST4, ttl=1) / TCP(sport=179, dport=40000,
                                                                flags="PA") / Raw(b"\xff" * 19),
          KERNEL, "BGP keepalive from the router, TTL 1")
    c.add(eth() / IP(src="198.51.100.11", dst=HOST4) / TCP(sport=8080, dport=41000, flags="SA"),
          KERNEL, "health-check reply from a backend")
    c.add(eth() / IP(src="198.51.100.1", dst=HOST4) / UDP(sport=53, dport=33000) / Raw(b"d" * 30),
          KERNEL, "DNS answer")
    c.add(eth() / IP(src="10.9.9.9", dst="255.255.255.255") / UDP(sport=68, dport=67),
          KERNEL, "broadcast")
    c.add(Ether(src=nh, dst="01:80:c2:00:00:0e", type=0x88CC) / Raw(b"\x02\x07\x04" + b"\0" * 40),
          KERNEL, "LLDP")
    c.add(eth() / IP(src="203.0.113.5", dst=HOST4) / TCP(sport=51000, dport=22, dataofs=2),
          KERNEL, "L4-malformed host traffic: the kernel's to judge")
    c.add(eth() / IP(src="203.0.113.5", dst="192.0.2.71") / TCP(sport=1, dport=29500),
          KERNEL, "next to a VIP address, not on it")
    return c


def corpus_frames():
    frames = []
    with open(CORPUS) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, reason, data = line.split()
            frames.append((name, reason, bytes.fromhex(data)))
    return frames


def case_malformed():
    # The corpus frames are addressed to 192.0.2.10 and 2001:db8::10: this
    # case makes those the VIPs (TCP and UDP, all ports), so every frame is
    # reused byte for byte and each parser drop is a drop of VIP traffic.
    config = config_text(
        "0x9c4f1d2e7b3a5860",
        [pool("onprem", "ipip"), pool("dark", "ipip")],
        [vip("v4", "192.0.2.10", ["onprem"], table_size=251),
         vip("v4-udp", "192.0.2.10", ["onprem"], protocol="udp", table_size=251),
         vip("v6", "2001:db8::10", ["onprem"], table_size=251),
         vip("v6-udp", "2001:db8::10", ["onprem"], protocol="udp", table_size=251),
         vip("tls", "192.0.2.11", ["onprem"], port=443, table_size=251),
         vip("dark", "192.0.2.12", ["dark"], table_size=251)],
        [backend("gpu-a1", "198.51.100.11", "onprem"),
         backend("gpu-a2", "198.51.100.12", "onprem"),
         backend("gpu-b1", "2001:db8:b::11", "onprem"),
         backend("gpu-z1", "198.51.100.99", "dark", state="disabled")])
    c = Case("malformed", "tests/data/malformed_packets.txt to the VIPs: each dropped and "
             "counted by its reason (the corpus' well-formed frames forwarded, ARP to the "
             "kernel); steering drops: no VIP on the port, no backend", config)
    for name, reason, data in corpus_frames():
        if reason != "none":
            what = drop(reason)
        elif data[12:14] == b"\x08\x06":
            what = KERNEL
        else:
            what = FORWARD
        c.add(data, what, "corpus " + name)
    c.add(eth() / IP(src=client4(1), dst="192.0.2.11") / TCP(sport=999, dport=80, flags="S"),
          drop("vip_port_not_served"), "TCP to port 80 of a port-443 VIP")
    c.add(eth() / IPv6(src=client6(1), dst="2001:db8::10") / ICMPv6EchoRequest(),
          drop("icmp_unsupported"), "echo to a VIP without answer_ping")
    c.add(eth() / IP(src=client4(1), dst="192.0.2.12") / TCP(sport=999, dport=80, flags="S"),
          drop("no_backend"), "VIP whose only backend is disabled")
    c.add(eth() / IP(src=client4(1), dst="192.0.2.10") / TCP(sport=999, dport=80, flags="S"),
          FORWARD, "a good one after the bad")
    return c


def icmp_error4(router, vip_addr, client, vip_port, client_port, icmp_type=3, code=4,
                mtu=1400, proto="tcp", quote_bytes=28):
    l4 = (TCP(sport=vip_port, dport=client_port, flags="SA") if proto == "tcp"
          else UDP(sport=vip_port, dport=client_port))
    quote = raw(IP(src=vip_addr, dst=client, flags="DF") / l4 / Raw(b"r" * 40))[:quote_bytes]
    return eth() / IP(src=router, dst=vip_addr) / ICMP(type=icmp_type, code=code,
                                                        nexthopmtu=mtu if code == 4 else 0) \
        / Raw(quote)


def case_icmp():
    config = config_text(
        "0x9c4f1d2e7b3a5860",
        [pool("cloud", "gue", site="cloud"), pool("onprem6", "ipip")],
        [vip("web", "192.0.2.30", ["cloud"], table_size=251, answer_ping=True),
         vip("quiet", "192.0.2.31", ["cloud"], table_size=251),
         vip("tls", "192.0.2.32", ["cloud"], port=443, table_size=251),
         vip("web6", "2001:db8:200::30", ["onprem6"], table_size=251, answer_ping=True)],
        [backend("gpu-c1", "203.0.113.21", "cloud"),
         backend("gpu-c2", "203.0.113.22", "cloud"),
         backend("gpu-c3", "203.0.113.23", "cloud"),
         backend("gpu-b1", "2001:db8:b::11", "onprem6"),
         backend("gpu-b2", "2001:db8:b::12", "onprem6")])
    c = Case("icmp", "ICMP: echo to VIPs with answer_ping (v4, v6, tagged) answered; errors "
             "quoting a VIP flow steered to its backend; too big once encapsulated "
             "(GUE4: 1468, IPv6-in-IPv6: 1460) answered with frag-needed / packet-too-big; "
             "the drops around them", config)
    v4, v6, router4, router6 = "192.0.2.30", "2001:db8:200::30", "203.0.113.1", "2001:db8:ffff::1"
    # Echo.
    c.add(eth() / IP(src=client4(1), dst=v4) / ICMP(type=8, id=0x1234, seq=1)
          / Raw(b"abcdefgh" * 7), ECHO, "echo to VIP")
    c.add(eth(vlan=5) / IP(src=client4(2), dst=v4) / ICMP(type=8, id=9, seq=2), ECHO,
          "echo to VIP, tagged")
    c.add(eth() / IPv6(src=client6(1), dst=v6)
          / ICMPv6EchoRequest(id=0x4321, seq=3, data=b"p" * 32), ECHO, "echo6 to VIP")
    c.add(raw(eth() / IP(src=client4(4), dst=v4) / ICMP(type=8, id=5, seq=5) / Raw(b"pad"))
          + b"\0" * 15, ECHO, "echo to VIP with Ethernet padding (not reflected)")
    c.add(eth() / IP(src=client4(5), dst=v4, options=b"\x94\x04\x00\x00")
          / ICMP(type=8, id=6, seq=6) / Raw(b"options"), ECHO,
          "echo to VIP with an IPv4 option (not reflected)")
    c.add(eth() / IPv6(src=client6(5), dst=v6) / IPv6ExtHdrHopByHop()
          / ICMPv6EchoRequest(id=6, seq=6, data=b"hbh"), ECHO,
          "echo6 to VIP with a hop-by-hop header (not reflected)")
    c.add(eth() / IP(src=client4(6), dst=v4) / ICMP(type=8, code=1, id=7, seq=7),
          drop("icmp_unsupported"), "echo request with code 1")
    c.add(eth() / IP(src=client4(3), dst="192.0.2.31") / ICMP(type=8, id=1, seq=1),
          drop("icmp_unsupported"), "echo to a VIP without answer_ping")
    c.add(eth() / IP(src=client4(3), dst=v4) / ICMP(type=13, ts_ori=1, ts_rx=0, ts_tx=0),
          drop("icmp_unsupported"),
          "timestamp request to a VIP")
    # Flows whose errors come later.
    rng = random.Random(7)
    flows4 = tcp_flows(c, rng, v4, 6, 10, dport=443)
    flows6 = tcp_flows(c, rng, v6, 6, 10, v6=True, dport=443)
    for src, sport, port in flows4:
        c.add(icmp_error4(router4, v4, src, port, sport), FORWARD_ICMP,
              "frag-needed quoting a tracked flow")
    for src, sport, port in flows6:
        quote = raw(IPv6(src=v6, dst=src) / TCP(sport=port, dport=sport, flags="SA")
                    / Raw(b"r" * 1300))[:1232]
        c.add(eth() / IPv6(src=router6, dst=v6) / ICMPv6PacketTooBig(mtu=1400) / Raw(quote),
              FORWARD_ICMP, "packet-too-big quoting a tracked flow")
    c.add(icmp_error4(router4, v4, client4(40), 443, 55555, code=3, proto="udp"),
          drop("icmp_unsupported"), "port unreachable quoting UDP: no UDP VIP")
    c.add(icmp_error4(router4, v4, client4(41), 443, 55556, icmp_type=11, code=0),
          FORWARD_ICMP, "time exceeded quoting an untracked flow: Maglev's choice")
    quote6 = raw(IPv6(src=v6, dst=client6(41)) / TCP(sport=443, dport=55557))[:48]
    c.add(eth() / IPv6(src=router6, dst=v6) / ICMPv6TimeExceeded() / Raw(quote6), FORWARD_ICMP,
          "ICMPv6 time exceeded quoting an untracked flow")
    c.add(icmp_error4(router4, "192.0.2.32", client4(42), 8443, 55558),
          drop("icmp_unsupported"), "quote from a port the VIP does not serve")
    c.add(icmp_error4(router4, v4, client4(43), 443, 55559, quote_bytes=22),
          drop("icmp_inner_truncated"), "quote cut before the ports")
    c.add(eth() / IP(src=router4, dst=v4) / ICMP(type=3, code=4, nexthopmtu=1400)
          / Raw(raw(IPv6(src=v6, dst=client6(43)) / TCP(sport=443, dport=1))[:48]),
          drop("icmp_inner_malformed"), "ICMPv4 quoting an IPv6 header")
    q6 = raw(IPv6(src=v6, dst=client6(44)) / TCP(sport=443, dport=55560))[:42]
    c.add(eth() / IPv6(src=router6, dst=v6) / ICMPv6DestUnreach(code=4) / Raw(q6),
          drop("icmp_inner_truncated"), "ICMPv6 quote cut before the ports")
    # Too big once encapsulated, on tracked flows: GUE over IPv4 adds 32 bytes
    # (IPv4 20, UDP 8, GUE 4), IPv6-in-IPv6 40.
    src, sport, port = flows4[0]
    c.add(eth() / IP(src=src, dst=v4, flags="DF") / TCP(sport=sport, dport=port, flags="A")
          / Raw(b"x" * (1468 - 40)), FORWARD, "1468 bytes: exactly the MTU once encapsulated")
    c.add(eth() / IP(src=src, dst=v4, flags="DF") / TCP(sport=sport, dport=port, flags="A")
          / Raw(b"x" * (1500 - 40)), TOO_BIG, "1500 bytes with DF: frag-needed, MTU 1468")
    c.add(eth(vlan=5) / IP(src=src, dst=v4, flags="DF") / TCP(sport=sport, dport=port, flags="A")
          / Raw(b"x" * (1469 - 40)), TOO_BIG, "1469 bytes with DF, tagged")
    c.add(eth() / IP(src=src, dst=v4) / TCP(sport=sport, dport=port, flags="A")
          / Raw(b"x" * (1500 - 40)), drop("mtu_exceeded_no_df"), "1500 bytes without DF")
    src, sport, port = flows6[0]
    c.add(eth() / IPv6(src=src, dst=v6) / TCP(sport=sport, dport=port, flags="A")
          / Raw(b"y" * (1460 - 60)), FORWARD, "1460 bytes: exactly the MTU in IPv6-in-IPv6")
    c.add(eth() / IPv6(src=src, dst=v6) / TCP(sport=sport, dport=port, flags="A")
          / Raw(b"y" * (1500 - 60)), TOO_BIG, "1500 bytes IPv6: packet too big, MTU 1460")
    tcp_followups(c, rng, v4, flows4)
    tcp_followups(c, rng, v6, flows6, v6=True)
    c.cover = [(4, "gue4"), (6, "ipip6")]
    return c


def case_affinity():
    config = config_text(
        "0x2545f4914f6cdd1d",
        [pool("onprem", "ipip")],
        [vip("nccl", "192.0.2.80", ["onprem"], table_size=251),
         vip("nccl6", "2001:db8:200::80", ["onprem"], table_size=251)],
        [backend("gpu-a1", "198.51.100.11", "onprem"),
         backend("gpu-a2", "198.51.100.12", "onprem"),
         backend("gpu-a3", "198.51.100.13", "onprem")])
    c = Case("affinity", "Flow affinity: SYNs, then ACKs, data, retransmitted SYNs, FIN and RST "
             "interleaved across flows; every packet of a flow on its SYN's backend; a flow "
             "picked up mid-stream (first packet an ACK) tracked as new", config)
    rng = random.Random(8)
    flows = [(client4(i), rng.randrange(1024, 65536), 29500, False) for i in range(16)]
    flows += [(client6(i), rng.randrange(1024, 65536), 29500, True) for i in range(8)]

    def pkt(flow, flags, payload=b""):
        src, sport, port, v6 = flow
        ip = IPv6(src=src, dst="2001:db8:200::80") if v6 else IP(src=src, dst="192.0.2.80",
                                                                   flags="DF")
        p = eth() / ip / TCP(sport=sport, dport=port, flags=flags)
        return p / Raw(payload) if payload else p

    for f in flows:
        c.add(pkt(f, "S"), FORWARD, "SYN")
    for round_ in range(3):
        order = list(flows)
        rng.shuffle(order)
        for f in order:
            c.add(pkt(f, "A" if round_ == 0 else "PA", b"" if round_ == 0 else b"z" * 100 * round_),
                  FORWARD, "ACK" if round_ == 0 else "data")
        c.add(pkt(order[0], "S"), FORWARD, "retransmitted SYN")
    for f in flows[:4]:
        c.add(pkt(f, "FA"), FORWARD, "FIN")
    c.add(pkt(flows[4], "R"), FORWARD, "RST")
    late = (client4(200), 33333, 29500, False)
    c.add(pkt(late, "A", b"mid-stream"), FORWARD, "mid-stream pickup: new established flow")
    c.add(pkt(late, "PA", b"more"), FORWARD, "mid-stream pickup, next packet")
    c.cover = [(4, "ipip4"), (6, "ipip4")]
    return c


CASES = {
    "ipv4-ipip": case_ipv4_ipip,
    "ipv4-gue": case_ipv4_gue,
    "ipv6-ip6ip6": case_ipv6_ip6ip6,
    "ipv4-in-ipv6": case_ipv4_in_ipv6,
    "ipv6-gue6": case_ipv6_gue6,
    "mixed": case_mixed,
    "exception": case_exception,
    "malformed": case_malformed,
    "icmp": case_icmp,
    "affinity": case_affinity,
}


def build(name):
    return CASES[name]()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases-dir", default=CASES_DIR)
    parser.add_argument("cases", nargs="*", default=sorted(CASES))
    args = parser.parse_args()
    for name in args.cases:
        if name not in CASES:
            sys.exit("make_inputs.py: unknown case %r (known: %s)" % (name, ", ".join(CASES)))
        case = build(name)
        case.write(args.cases_dir)
        print("%s: %d frames -> %s" % (name, len(case.frames), os.path.join(args.cases_dir, name)))


if __name__ == "__main__":
    main()
