#!/usr/bin/python3
"""Traffic side of the spillway-decap end-to-end test (driven by decap_test.sh).

Two roles:
  serve  -- runs in the backend namespace: a TCP echo server on the VIPs
            (IPv4 and IPv6, port 8080) that answers "echo:<data>" and closes.
  run    -- runs in the client namespace: for every case, sends with scapy what
            a Spillway LB would send (client -> VIP, encapsulated to the
            backend's tunnel address), and checks the backend's answer on the
            wire: a SYN-ACK and then the echoed data, from the VIP straight to
            the client, not encapsulated (DSR). The client addresses are not
            assigned in the client namespace, so its kernel never answers (no
            RST) and scapy owns the connection. Negative cases (not our
            address, bad GUE, a fragment, ...) must reach the right counter of
            `spillway-decap stats` and get no answer.
Every wait polls against a deadline; the only fixed wait is the short window in
which a negative case must stay unanswered.
"""
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scapy_traffic  # noqa: E402
from scapy_traffic import Wire, serve_echo, summarize  # noqa: E402

PORT = 8080
ANSWER_DEADLINE_S = 5.0
COUNTER_DEADLINE_S = 5.0
SILENCE_WINDOW_S = 1.0


def serve(args):
    serve_echo(PORT, args.vip4, args.vip6, 64, args.ready)


def read_counters(stats_cmd):
    out = subprocess.run(stats_cmd, shell=True, check=True, capture_output=True, text=True)
    data = json.loads(out.stdout)
    return {name: value["packets"] for name, value in data["counters"].items()}


def wait_counter(stats_cmd, before, name, expected_delta, exact):
    """Polls until counter `name` rose by expected_delta (exactly, or at least)."""
    counted, delta, _ = scapy_traffic.wait_counter(lambda: read_counters(stats_cmd), before, name,
                                                   expected_delta, exact, COUNTER_DEADLINE_S)
    return counted, delta


def run(args):
    from scapy.all import (IP, TCP, UDP, Dot1Q, Ether, IPOption, IPv6, Raw, sendp)

    wire = Wire(args.iface)
    l2 = lambda: Ether(src=args.client_mac, dst=args.backend_mac)  # noqa: E731

    def outer4(dst=None, **kw):
        return IP(src=args.lb4, dst=dst or args.backend4, **kw)

    def outer6(dst=None):
        return IPv6(src=args.lb6, dst=dst or args.backend6)

    def gue(proto, first=0x00, flags=0):
        return UDP(sport=random.randint(49152, 65535), dport=args.gue_port) / Raw(
            bytes([first, proto, flags >> 8, flags & 0xff]))

    def inner(version, sport, **tcp):
        if version == 4:
            ip = IP(src=args.client4, dst=args.vip4)
        else:
            ip = IPv6(src=args.client6, dst=args.vip6)
        return ip / TCP(sport=sport, dport=PORT, **tcp)

    # name, counter, inner family, outer builder (frame up to the inner packet)
    positive = [
        ("ipip", "decap_ip4in4", 4, lambda: l2() / outer4(proto=4)),
        ("ip6ip6", "decap_ip6in6", 6, lambda: l2() / outer6()),
        ("ip4in6", "decap_ip4in6", 4, lambda: l2() / outer6()),
        ("gue4", "decap_gue_ip4in4", 4, lambda: l2() / outer4() / gue(4)),
        ("gue6", "decap_gue_ip6in6", 6, lambda: l2() / outer6() / gue(41)),
        # beyond the five required: the other combinations the LB writes
        ("ip6in4", "decap_ip6in4", 6, lambda: l2() / outer4(proto=41)),
        ("gue4-inner6", "decap_gue_ip6in4", 6, lambda: l2() / outer4() / gue(41)),
        ("gue6-inner4", "decap_gue_ip4in6", 4, lambda: l2() / outer6() / gue(4)),
        # outer IPv4 with 40 bytes of options (IHL 15)
        ("ipip-ihl15", "decap_ip4in4", 4,
         lambda: l2() / outer4(proto=4, options=IPOption(b"\x01" * 40))),
        # 802.1Q priority tag (VID 0): the tag is kept in front of the inner
        # packet; the kernel accepts VID 0 without a VLAN device
        ("vlan0-ipip", "decap_ip4in4", 4,
         lambda: Ether(src=args.client_mac, dst=args.backend_mac) / Dot1Q(vlan=0, prio=3)
         / outer4(proto=4)),
    ]

    def fix_next_header(frame, version):
        # Plain IP-in-IP: make the outer protocol / next header explicit.
        net = frame[Ether].payload
        if isinstance(net, Dot1Q):
            net = net.payload
        if isinstance(net.payload, UDP):
            return frame
        if isinstance(net, IP):
            net.proto = 4 if version == 4 else 41
        else:
            net.nh = 4 if version == 4 else 41
        return frame

    def answer_from_vip(version, client_port, want):
        vip = args.vip4 if version == 4 else args.vip6
        client = args.client4 if version == 4 else args.client6
        layer = IP if version == 4 else IPv6

        def match(pkt):
            if not pkt.haslayer(Ether) or pkt[Ether].src != args.backend_mac:
                return False
            net = pkt[Ether].payload
            if isinstance(net, Dot1Q):
                net = net.payload
            # DSR: the answer is a bare TCP segment from the VIP, no tunnel
            if not isinstance(net, layer) or not isinstance(net.payload, TCP):
                return False
            if net.src != vip or net.dst != client:
                return False
            tcp = net.payload
            return tcp.sport == PORT and tcp.dport == client_port and want(tcp)
        return match

    results = []

    def record(name, ok, detail):
        results.append((name, ok))
        print(f"decap: {'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)

    for name, counter, version, outer in positive:
        sport = random.randint(20000, 60000)
        isn = random.randint(0, 2**31)
        before = read_counters(args.stats_cmd)
        syn = fix_next_header(outer() / inner(version, sport, flags="S", seq=isn), version)
        sendp(syn, iface=args.iface, verbose=False)
        synack = wire.wait_for(answer_from_vip(version, sport, lambda t: t.flags == "SA"),
                               ANSWER_DEADLINE_S)
        if synack is None:
            after = read_counters(args.stats_cmd)
            record(name, False, f"no SYN-ACK from the VIP within {ANSWER_DEADLINE_S}s "
                   f"({counter} +{after[counter] - before[counter]})")
            continue
        if synack[TCP].ack != isn + 1:
            record(name, False, f"SYN-ACK acks {synack[TCP].ack}, expected {isn + 1}")
            continue
        # Finish the handshake with data; the server echoes it and closes.
        payload = f"spillway-{name}".encode()
        server_isn = synack[TCP].seq
        data = fix_next_header(outer() / inner(version, sport, flags="PA", seq=isn + 1,
                                               ack=server_isn + 1) / Raw(payload), version)
        sendp(data, iface=args.iface, verbose=False)
        echo = wire.wait_for(
            answer_from_vip(version, sport,
                            lambda t: bytes(t.payload).startswith(b"echo:" + payload)),
            ANSWER_DEADLINE_S)
        rst = fix_next_header(outer() / inner(version, sport, flags="R",
                                              seq=isn + 1 + len(payload)), version)
        sendp(rst, iface=args.iface, verbose=False)
        counted, delta = wait_counter(args.stats_cmd, before, counter, 3, exact=True)
        if echo is None:
            record(name, False, "SYN-ACK, but no echoed data from the VIP")
        elif not counted:
            record(name, False, f"{counter} rose by {delta}, expected 3")
        else:
            record(name, True, f"SYN-ACK + echo direct from VIP, {counter} +{delta}")

    # Negative cases: passed to the kernel untouched, counted, never answered.
    negative = [
        ("not-our-address", "pass_not_local", 4,
         lambda: l2() / outer4(dst=args.other4, proto=4), False),
        ("not-our-address6", "pass_not_local", 6,
         lambda: l2() / outer6(dst=args.other6), False),
        ("gue-version-1", "malformed", 4, lambda: l2() / outer4() / gue(4, first=0x40), True),
        ("gue-c-bit", "malformed", 4, lambda: l2() / outer4() / gue(4, first=0x20), True),
        ("gue-hlen", "malformed", 6, lambda: l2() / outer6() / gue(41, first=0x01), True),
        ("gue-flags", "malformed", 4, lambda: l2() / outer4() / gue(4, flags=0x8000), True),
        ("gue-proto-17", "malformed", 4, lambda: l2() / outer4() / gue(17), True),
        ("ipip-inner-is-v6", "malformed", 6, lambda: l2() / outer4(proto=4), True),
        ("ipip-fragment", "fragment", 4, lambda: l2() / outer4(proto=4, flags="MF"), True),
    ]
    silent_ports = []
    for name, counter, version, outer, exact in negative:
        sport = random.randint(20000, 60000)
        before = read_counters(args.stats_cmd)
        frame = outer() / inner(version, sport, flags="S", seq=1)
        if name == "ipip-inner-is-v6":
            frame.getlayer(IP).proto = 4  # claims IPv4 inside, carries IPv6
        elif not frame.haslayer(UDP):
            frame = fix_next_header(frame, version)
        sendp(frame, iface=args.iface, verbose=False)
        counted, delta = wait_counter(args.stats_cmd, before, counter, 1, exact=exact)
        decapsulated = sum(read_counters(args.stats_cmd)[k] - before[k]
                           for k in before if k.startswith("decap_"))
        if not counted:
            record(name, False, f"{counter} rose by {delta}, expected 1")
        elif decapsulated:
            record(name, False, f"decapsulated ({decapsulated} decap_* counted)")
        else:
            silent_ports.append((name, version, sport, counter, delta))
    wire.collect(SILENCE_WINDOW_S)
    for name, version, sport, counter, delta in silent_ports:
        answered = wire.wait_for(answer_from_vip(version, sport, lambda t: True), 0)
        if answered is not None:
            record(name, False, "was answered by the VIP, so it was decapsulated")
        else:
            record(name, True, f"passed untouched, {counter} +{delta}, no answer")

    return summarize("decap", results)


def main():
    return scapy_traffic.main(
        __doc__, serve, run, ("vip4", "vip6", "ready"),
        ("iface", "client-mac", "backend-mac", "lb4", "lb6", "backend4", "backend6",
         "client4", "client6", "vip4", "vip6", "other4", "other6", "stats-cmd"),
        lambda r: r.add_argument("--gue-port", type=int, default=6080))


if __name__ == "__main__":
    sys.exit(main())
