#!/usr/bin/python3
"""Traffic side of the AF_XDP-mode end-to-end test (driven by af_xdp_redirect_test.sh).

Two roles:
  serve  -- runs in the gateway namespace: a TCP echo server on the host's own
            addresses (port 2222), standing for SSH / BGP / health checks that
            must keep working through the XDP program.
  run    -- runs in the client namespace: sends each case with scapy to the
            gateway's veth, then checks the bucket the program counted it in
            (xdp_redirect_probe counters, through XdpVipMap) and what the
            gateway's kernel answered:
              * host traffic (ARP, ND, ping, a real TCP connection) and traffic
                to a VIP address/port that is not in vip_map: passed, and the
                kernel answers (echo reply, RST from the VIP on lo, ...);
              * VIP traffic: with --testpmd-log (DPDK's net_af_xdp PMD owns the
                sockets) redirected, received by testpmd (its RX counter rises
                by exactly the number of VIP frames) and never answered by the
                kernel although the VIPs sit on its loopback; without it
                (program attached alone, no socket in xsks_map) counted as
                passed_no_socket.
The client addresses of the crafted packets (198.51.100.7, 2001:db8:c::7) are
not assigned in the client namespace, so its kernel never interferes. Every
wait polls against a deadline; the only fixed wait is the window in which the
VIP packets must stay unanswered.
"""
import json
import os
import random
import re
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scapy_traffic  # noqa: E402
from scapy_traffic import Wire, serve_echo, summarize  # noqa: E402

HOST_PORT = 2222
ANSWER_DEADLINE_S = 5.0
COUNTER_DEADLINE_S = 5.0
TESTPMD_DEADLINE_S = 6.0  # testpmd prints its counters once a second
SILENCE_WINDOW_S = 1.5


def serve(args):
    serve_echo(HOST_PORT, args.host4, args.host6, 16, args.ready)


def read_counters(cmd):
    out = subprocess.run(cmd, shell=True, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def wait_counter(cmd, before, name, expected, exact):
    """Polls until counter `name` rose by `expected` (exactly, or at least)."""
    return scapy_traffic.wait_counter(lambda: read_counters(cmd), before, name, expected, exact,
                                      COUNTER_DEADLINE_S)


def testpmd_rx(log_path):
    """The last RX-packets of port 0 that testpmd printed, or None."""
    try:
        with open(log_path, errors="replace") as log:
            text = log.read()
    except OSError:
        return None
    values = re.findall(r"NIC statistics for port 0.*?RX-packets:\s+(\d+)", text, re.S)
    return int(values[-1]) if values else None


def wait_testpmd_rx(log_path, expected):
    end = time.monotonic() + TESTPMD_DEADLINE_S
    while True:
        value = testpmd_rx(log_path)
        if value == expected or time.monotonic() > end:
            return value
        time.sleep(0.1)


def run(args):
    from scapy.all import (ARP, ICMP, IP, TCP, UDP, Dot1Q, Ether, ICMPv6EchoReply,
                           ICMPv6EchoRequest, ICMPv6ND_NA, ICMPv6ND_NS, ICMPv6NDOptSrcLLAddr,
                           IPOption, IPv6, IPv6ExtHdrDestOpt, IPv6ExtHdrFragment, Raw,
                           conf, in6_getnsma, in6_getnsmac)

    wire = Wire(args.iface)
    sender = conf.L2socket(iface=args.iface)
    with_sockets = bool(args.testpmd_log)
    vip_bucket = "redirected" if with_sockets else "passed_no_socket"
    c4, c6 = args.client4, args.client6
    exact4, udp4, marker4 = args.vip4_exact, args.vip4_udp, args.vip4_marker
    vip6, exact6 = args.vip6_marker, args.vip6_exact

    def l2():
        return Ether(src=args.client_mac, dst=args.gateway_mac)

    def from_gateway(pkt):
        return pkt.haslayer(Ether) and pkt[Ether].src == args.gateway_mac

    def rst_from(vip, dport, sport):
        def match(pkt):
            if not from_gateway(pkt) or not pkt.haslayer(TCP):
                return False
            net = pkt[IP] if pkt.haslayer(IP) else pkt[IPv6]
            tcp = pkt[TCP]
            return net.src == vip and tcp.sport == dport and tcp.dport == sport and "R" in tcp.flags
        return match

    def echo_reply_from(src, ident):
        def match(pkt):
            if not from_gateway(pkt):
                return False
            if pkt.haslayer(ICMP) and pkt.haslayer(IP):
                return pkt[IP].src == src and pkt[ICMP].type == 0 and pkt[ICMP].id == ident
            if pkt.haslayer(ICMPv6EchoReply):
                return pkt[IPv6].src == src and pkt[ICMPv6EchoReply].id == ident
            return False
        return match

    def arp_reply(pkt):
        return (from_gateway(pkt) and pkt.haslayer(ARP) and pkt[ARP].op == 2
                and pkt[ARP].psrc == args.host4 and pkt[ARP].hwsrc == args.gateway_mac)

    def nd_advert(pkt):
        return (from_gateway(pkt) and pkt.haslayer(ICMPv6ND_NA)
                and pkt[ICMPv6ND_NA].tgt == args.host6)

    vips = {exact4, udp4, marker4, vip6, exact6}

    def kernel_answer_from_vip(pkt):
        # What the kernel would send if it saw a VIP case: a RST, an echo
        # reply, a port unreachable. Not "fragment reassembly time exceeded",
        # which a passed fragment of an earlier case may trigger 30 s later.
        if not from_gateway(pkt):
            return False
        if pkt.haslayer(IP) and pkt[IP].src in vips:
            return not pkt.haslayer(ICMP) or pkt[ICMP].type in (0, 3)
        if pkt.haslayer(IPv6) and pkt[IPv6].src in vips:
            nh = pkt[IPv6].nh
            return nh in (6, 17) or (nh == 58 and bytes(pkt[IPv6].payload)[:1] in (b"\x01", b"\x81"))
        return False

    sport = random.randint(20000, 40000)

    def syn4(dst, dport, **ip):
        return l2() / IP(src=c4, dst=dst, **ip) / TCP(sport=sport, dport=dport, flags="S")

    def syn6(dst, dport, *ext):
        frame = l2() / IPv6(src=c6, dst=dst)
        for header in ext:
            frame = frame / header
        return frame / TCP(sport=sport, dport=dport, flags="S")

    ident = random.randint(1, 65000)
    host6_bytes = socket.inet_pton(socket.AF_INET6, args.host6)
    solicited = socket.inet_ntop(socket.AF_INET6, in6_getnsma(host6_bytes))
    solicited_mac = in6_getnsmac(in6_getnsma(host6_bytes))

    # name -> (frame, bucket, answer matcher or None). Bucket "vip" is
    # redirected with sockets, passed_no_socket without.
    cases = {
        # --- the kernel keeps these -------------------------------------------
        "arp-host": (Ether(src=args.client_mac, dst="ff:ff:ff:ff:ff:ff")
                     / ARP(op=1, hwsrc=args.client_mac, psrc=args.peer4, pdst=args.host4),
                     "passed_non_ip", arp_reply),
        "nd-host": (Ether(src=args.client_mac, dst=solicited_mac)
                    / IPv6(src=args.peer6, dst=solicited)
                    / ICMPv6ND_NS(tgt=args.host6) / ICMPv6NDOptSrcLLAddr(lladdr=args.client_mac),
                    "passed_not_vip", nd_advert),
        "ping-host": (l2() / IP(src=c4, dst=args.host4) / ICMP(id=ident, seq=1),
                      "passed_not_vip", echo_reply_from(args.host4, ident)),
        "ping6-host": (l2() / IPv6(src=c6, dst=args.host6) / ICMPv6EchoRequest(id=ident, seq=1),
                       "passed_not_vip", echo_reply_from(args.host6, ident)),
        "tcp4-vip-other-port": (syn4(exact4, 81), "passed_not_vip", rst_from(exact4, 81, sport)),
        "tcp4-to-udp-vip": (syn4(udp4, 80), "passed_not_vip", rst_from(udp4, 80, sport)),
        "ping-exact-vip-no-marker": (l2() / IP(src=c4, dst=exact4) / ICMP(id=ident, seq=2),
                                     "passed_not_vip", echo_reply_from(exact4, ident)),
        "tcp6-vip-other-port": (syn6(exact6, 444), "passed_not_vip", rst_from(exact6, 444, sport)),
        "tcp6-ext-header-no-marker": (syn6(exact6, 443, IPv6ExtHdrDestOpt()), "passed_not_vip",
                                      rst_from(exact6, 443, sport)),
        "frag4-first-exact-vip-no-marker": (
            l2() / IP(src=c4, dst=exact4, flags="MF", proto=6)
            / TCP(sport=sport, dport=80, flags="S") / Raw(b"x" * 16), "passed_not_vip", None),
        "tcp4-truncated-l4": (l2() / IP(src=c4, dst=exact4, proto=6) / Raw(b"\x00\x50"),
                              "passed_not_vip", None),
        "ipv4-truncated": (Ether(src=args.client_mac, dst=args.gateway_mac, type=0x0800)
                           / Raw(b"\x45\x00\x00\x14\x00\x00"), "passed_malformed", None),
        # --- spillwayd gets these ---------------------------------------------
        "tcp4-exact": (syn4(exact4, 80), "vip", None),
        "tcp4-exact-vlan": (l2() / Dot1Q(vlan=7) / IP(src=c4, dst=exact4)
                            / TCP(sport=sport, dport=80, flags="S"), "vip", None),
        "tcp4-exact-ip-options": (syn4(exact4, 80, options=IPOption(b"\x01" * 8)), "vip", None),
        "udp4-all-ports": (l2() / IP(src=c4, dst=udp4) / UDP(sport=sport, dport=5353)
                           / Raw(b"q"), "vip", None),
        "frag4-udp-all-ports": (l2() / IP(src=c4, dst=udp4, frag=100, proto=17) / Raw(b"y" * 8),
                                "vip", None),
        "tcp4-marker": (syn4(marker4, 22), "vip", None),
        "ping-marker": (l2() / IP(src=c4, dst=marker4) / ICMP(id=ident, seq=3), "vip", None),
        "frag4-marker": (l2() / IP(src=c4, dst=marker4, flags="MF", proto=17)
                         / UDP(sport=sport, dport=53) / Raw(b"z" * 16), "vip", None),
        "tcp6-exact-no-marker": (syn6(exact6, 443), "vip", None),
        "tcp6-marker": (syn6(vip6, 22), "vip", None),
        "ping6-marker": (l2() / IPv6(src=c6, dst=vip6) / ICMPv6EchoRequest(id=ident, seq=4),
                         "vip", None),
        "tcp6-ext-header-marker": (syn6(vip6, 443, IPv6ExtHdrDestOpt()), "vip", None),
        "frag6-marker": (l2() / IPv6(src=c6, dst=vip6) / IPv6ExtHdrFragment(m=1, id=7)
                         / UDP(sport=sport, dport=53) / Raw(b"w" * 16), "vip", None),
        # --- only on request: after the marker of vip4_marker was removed -------
        "ping-removed-marker": (l2() / IP(src=c4, dst=marker4) / ICMP(id=ident, seq=5),
                                "passed_not_vip", echo_reply_from(marker4, ident)),
    }
    on_request = {"ping-removed-marker"}
    names = args.cases.split(",") if args.cases else [n for n in cases if n not in on_request]
    unknown = [n for n in names if n not in cases]
    if unknown:
        print(f"af_xdp: unknown cases {unknown}", flush=True)
        return 2

    results = []

    def record(name, ok, detail):
        results.append((name, ok))
        print(f"af_xdp: {'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)

    start = read_counters(args.counters_cmd)
    rx_start = testpmd_rx(args.testpmd_log) if with_sockets else None

    # Passed cases first: each must be answered by the kernel (if it answers at
    # all) and must not touch the VIP buckets.
    for name in [n for n in names if cases[n][1] != "vip"]:
        frame, bucket, answer = cases[name]
        before = read_counters(args.counters_cmd)
        sender.send(frame)
        counted, delta, now = wait_counter(args.counters_cmd, before, bucket, 1, exact=False)
        vip_delta = sum(now[k] - before[k] for k in ("redirected", "passed_no_socket"))
        reply = wire.wait_for(answer, ANSWER_DEADLINE_S) if answer else True
        if not counted:
            record(name, False, f"{bucket} rose by {delta}, expected at least 1")
        elif vip_delta:
            record(name, False, f"counted as VIP traffic ({vip_delta})")
        elif reply is None:
            record(name, False, f"counted in {bucket}, but the kernel did not answer")
        else:
            record(name, True, f"{bucket} +{delta}" + (", kernel answered" if answer else ""))

    # VIP cases: exactly one count each in the VIP bucket.
    vip_names = [n for n in names if cases[n][1] == "vip"]
    wire.collect(0.2)
    wire.seen.clear()
    for name in vip_names:
        frame, _, _ = cases[name]
        before = read_counters(args.counters_cmd)
        sender.send(frame)
        counted, delta, _ = wait_counter(args.counters_cmd, before, vip_bucket, 1, exact=True)
        if not counted:
            record(name, False, f"{vip_bucket} rose by {delta}, expected exactly 1")
        elif not with_sockets:
            record(name, True, f"{vip_bucket} +1 (no socket in xsks_map)")
        else:
            results.append((name, None))  # decided after the silence window

    if with_sockets and vip_names:
        wire.collect(SILENCE_WINDOW_S)
        leaked = [p for p in wire.seen if kernel_answer_from_vip(p)]
        pending = [n for n, ok in results if ok is None]
        results[:] = [(n, ok) for n, ok in results if ok is not None]
        for name in pending:
            if leaked:
                record(name, False, f"the kernel answered from a VIP: {leaked[0].summary()}")
            else:
                record(name, True, "redirected +1, no kernel answer")
        expected = rx_start + len(vip_names) if rx_start is not None else None
        rx = wait_testpmd_rx(args.testpmd_log, expected) if expected is not None else None
        end = read_counters(args.counters_cmd)
        redirected = end["redirected"] - start["redirected"]
        record("testpmd-received-vip-frames", rx == expected,
               f"testpmd RX-packets {rx_start} -> {rx}, expected +{len(vip_names)}")
        record("redirected-equals-vip-frames", redirected == len(vip_names),
               f"redirected +{redirected}, VIP frames sent {len(vip_names)}")

    # A real TCP connection through the kernel to the host's own service.
    if not args.cases:
        for family, host in ((socket.AF_INET, args.host4), (socket.AF_INET6, args.host6)):
            name = f"kernel-tcp-{'v4' if family == socket.AF_INET else 'v6'}"
            try:
                with socket.create_connection((host, HOST_PORT), timeout=ANSWER_DEADLINE_S) as s:
                    s.sendall(b"hello")
                    data = s.recv(64)
                record(name, data == b"echo:hello", f"echo {data!r} from {host}:{HOST_PORT}")
            except OSError as error:
                record(name, False, f"connect to {host}:{HOST_PORT}: {error}")

    end = read_counters(args.counters_cmd)
    print("af_xdp: counters: " + json.dumps(end), flush=True)
    return summarize("af_xdp", results)


def main():
    def extras(r):
        r.add_argument("--testpmd-log", default="")
        r.add_argument("--cases", default="")

    return scapy_traffic.main(
        __doc__, serve, run, ("host4", "host6", "ready"),
        ("iface", "client-mac", "gateway-mac", "host4", "host6", "peer4", "peer6",
         "client4", "client6", "vip4-exact", "vip4-udp", "vip4-marker", "vip6-marker",
         "vip6-exact", "counters-cmd"), extras)


if __name__ == "__main__":
    sys.exit(main())
