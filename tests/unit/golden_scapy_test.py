#!/usr/bin/python3
"""Independent decoder of the golden frames in tests/data/golden.

Spillway's own tests compare its writers byte for byte with these files; this
test decodes the same files with scapy, which shares no code with Spillway,
and checks them against the expected fields in <case>.json:

  - every checksum (outer IPv4 header, UDP, inner IPv4 header, inner TCP/UDP,
    ICMP, ICMPv6) equals the one scapy computes when the field is deleted and
    the packet rebuilt;
  - encapsulation: L2, outer addresses, protocol numbers, TTL, TOS / traffic
    class, IPv4 DF, IPv6 flow label and UDP source port (also recomputed from
    the flow hash), GUE header (decoded by hand: scapy has no GUE layer), the
    inner 5-tuple, TTL and TOS, and the inner packet equal to the input's with
    only the TTL decremented and the IPv4 checksum rebuilt;
  - ICMP replies: addresses reversed, type, code, MTU field, quote = the start
    of the original IP packet within the 576 / 1280-byte limits; echo replies
    echo identifier, sequence and data.

Usage: golden_scapy_test.py GOLDEN_DIR. Exit 0 when every case passes, 1 on
any mismatch, 77 (meson: skipped) when /usr/bin/python3 cannot import scapy.
"""

import glob
import json
import os
import sys

try:
    import logging

    logging.getLogger("scapy.runtime").setLevel(logging.ERROR)
    from scapy.layers.inet import ICMP, IP, TCP, UDP
    from scapy.layers.inet6 import (
        ICMPv6EchoReply,
        ICMPv6EchoRequest,
        ICMPv6PacketTooBig,
        IPv6,
    )
    from scapy.layers.l2 import Dot1Q, Ether
    from scapy.packet import Raw
except ImportError as error:  # pragma: no cover - depends on the host
    print(
        "golden-scapy: SKIP: /usr/bin/python3 cannot import scapy (%s); "
        "install Debian's python3-scapy" % error
    )
    sys.exit(77)

GUE_VERSION_SHIFT = 6


class Mismatch(Exception):
    pass


def eq(actual, expected, what):
    if actual != expected:
        raise Mismatch("%s: got %r, expected %r" % (what, actual, expected))


def expect(condition, what):
    if not condition:
        raise Mismatch(what)


def read_hex(path):
    with open(path, encoding="ascii") as f:
        return bytes.fromhex(f.read())


# --- decoding from raw slices -------------------------------------------------
# Each layer is dissected from exactly its own bytes and leaves end in Raw, so
# no scapy port binding (DNS on 53, ...) reinterprets a payload, and rebuilding
# the stack reproduces the input byte for byte when every field is right.


def bare(layer):
    layer.remove_payload()
    return layer


def decode_l4(proto, data):
    """L4 header over `data` (the rest of the IP packet), payload as Raw."""
    if proto == 6:
        length = (data[12] >> 4) * 4
        return bare(TCP(data[:length])) / Raw(data[length:])
    if proto == 17:
        return bare(UDP(data[:8])) / Raw(data[8:])
    if proto == 1:
        return bare(ICMP(data[:8])) / Raw(data[8:])
    if proto == 58:
        kind = {2: ICMPv6PacketTooBig, 128: ICMPv6EchoRequest, 129: ICMPv6EchoReply}.get(data[0])
        if kind is None:
            raise Mismatch("unexpected ICMPv6 type %d" % data[0])
        if kind is ICMPv6PacketTooBig:
            return bare(kind(data[:8])) / Raw(data[8:])
        return bare(kind(data))  # echo: id, seq and data are fields
    return Raw(data)


def decode_ip(data):
    """An IPv4 / IPv6 packet (no IPv6 extension headers) as header / L4."""
    version = data[0] >> 4
    if version == 4:
        ihl = (data[0] & 0xF) * 4
        header = bare(IP(data[:ihl]))
        return header / decode_l4(header.proto, data[ihl:])
    if version == 6:
        header = bare(IPv6(data[:40]))
        return header / decode_l4(header.nh, data[40:])
    raise Mismatch("IP version %d" % version)


def decode_frame(raw):
    """Ethernet (+ one 802.1Q tag) / IP / L4, and the L3 offset."""
    eth = bare(Ether(raw[:14]))
    offset = 14
    stack = eth
    if eth.type == 0x8100:
        stack = stack / bare(Dot1Q(raw[14:18]))
        offset = 18
    return stack / decode_ip(raw[offset:]), offset


def checksum_fields(packet):
    fields = []
    layer = packet
    while layer is not None and not isinstance(layer, Raw):
        for name in ("chksum", "cksum"):
            if name in layer.fields:
                fields.append((layer, name))
        layer = layer.payload if layer.payload else None
    return fields


def check_checksums(packet, raw, where):
    """Each checksum field equals scapy's own once deleted and rebuilt."""
    eq(bytes(packet), raw, "%s: scapy rebuild of the dissected frame" % where)
    fields = checksum_fields(packet)  # none for IPv6 over IPv6
    for index, (layer, name) in enumerate(fields):
        copy = packet.copy()
        target_layer, _ = checksum_fields(copy)[index]
        delattr(target_layer, name)
        rebuilt = bytes(copy)
        if rebuilt != raw:
            ours = getattr(layer, name)
            recomputed = checksum_fields(type(packet)(rebuilt))
            scapy_value = None
            for (other, other_name) in recomputed:
                if type(other) is type(layer) and other_name == name:
                    scapy_value = getattr(other, other_name)
                    break
            raise Mismatch(
                "%s: %s.%s is 0x%04x, scapy computes %s"
                % (where, type(layer).__name__, name, ours,
                   "0x%04x" % scapy_value if scapy_value is not None else "a different value")
            )
    return len(fields)


def ip_fields(header):
    """version, src, dst, proto, ttl, tos, total length of an IP header layer."""
    if isinstance(header, IP):
        return 4, header.src, header.dst, header.proto, header.ttl, header.tos, header.len
    return 6, header.src, header.dst, header.nh, header.hlim, header.tc, header.plen + 40


def check_eth(stack, expected, where):
    eq(stack[Ether].src, expected["src"], where + ": Ethernet source")
    eq(stack[Ether].dst, expected["dst"], where + ": Ethernet destination")
    vlan = stack[Dot1Q].vlan if Dot1Q in stack else None
    eq(vlan, expected["vlan"], where + ": VLAN")


def check_ip(header, expected, where):
    version, src, dst, proto, ttl, tos, length = ip_fields(header)
    eq(version, expected["version"], where + " version")
    eq(src, expected["src"], where + " source")
    eq(dst, expected["dst"], where + " destination")
    eq(proto, expected["proto"], where + " protocol")
    eq(ttl, expected["ttl"], where + " TTL")
    eq(tos, expected["tos"], where + " TOS / traffic class")
    eq(length, expected["length"], where + " length")


def ip_layer(stack):
    return stack[IP] if IP in stack else stack[IPv6]


# --- cases ---------------------------------------------------------------------


def check_encap(case, expected, raw, original):
    stack, l3 = decode_frame(raw)
    count = check_checksums(stack, raw, "outer frame")
    check_eth(stack, expected["eth"], "outer")
    outer = ip_layer(stack)
    check_ip(outer, expected["outer"], "outer")
    eq(len(raw), l3 + expected["outer"]["length"], "frame length (no padding, nothing after)")
    flow_hash = int(expected["flow_hash"], 16)
    if isinstance(outer, IP):
        eq(outer.flags.DF, True, "outer DF")
        eq(outer.frag, 0, "outer fragment offset")
    else:
        label = (flow_hash >> 30) & 0xFFFFF or 1
        eq(outer.fl, expected["outer"]["flow_label"], "outer flow label")
        eq(outer.fl, label, "outer flow label from the flow hash")

    if expected["gue"] is not None:
        udp = stack[UDP]
        eq(udp.sport, expected["udp"]["sport"], "UDP source port")
        eq(udp.sport, 0xC000 | (flow_hash >> 50), "UDP source port from the high hash bits")
        expect(49152 <= udp.sport <= 65535, "UDP source port in the dynamic range")
        eq(udp.dport, expected["udp"]["dport"], "UDP destination port")
        expect(udp.chksum != 0, "UDP checksum present")
        payload = bytes(udp.payload)
        eq(udp.len, 8 + len(payload), "UDP length")
        gue = payload[:4]
        eq(gue[0] >> GUE_VERSION_SHIFT, expected["gue"]["version"], "GUE version")
        eq((gue[0] >> 5) & 1, 0, "GUE C bit")
        eq(gue[0] & 0x1F, 0, "GUE Hlen")
        eq(gue[1], expected["gue"]["proto"], "GUE proto")
        eq(gue[2:4], b"\0\0", "GUE flags")
        inner_raw = payload[4:]
    else:
        eq(expected["udp"], None, "json: udp without GUE")
        inner_raw = bytes(outer.payload)
        eq(ip_fields(outer)[3], 4 if inner_raw[0] >> 4 == 4 else 41, "outer protocol vs inner")

    inner = decode_ip(inner_raw)
    count += check_checksums(inner, inner_raw, "inner packet")
    exp = expected["inner"]
    check_ip(inner, exp, "inner")
    eq(inner.payload.sport, exp["sport"], "inner source port")
    eq(inner.payload.dport, exp["dport"], "inner destination port")
    eq(ip_fields(outer)[5], ip_fields(inner)[5], "DSCP/ECN copied from inner to outer")
    proto_of_inner = 4 if exp["version"] == 4 else 41
    eq(expected["gue"]["proto"] if expected["gue"] else ip_fields(outer)[3], proto_of_inner,
       "encapsulated protocol number")

    # The inner packet is the input's IP packet with TTL - 1 (and for IPv4 the
    # header checksum scapy recomputes), nothing else changed or added.
    source, l3_in = decode_frame(original)
    original_ip = ip_layer(source)
    original_raw = original[l3_in:l3_in + ip_fields(original_ip)[6]]
    forwarded = decode_ip(original_raw)
    if isinstance(forwarded, IP):
        forwarded.ttl -= 1
        del forwarded.chksum
    else:
        forwarded.hlim -= 1
    eq(bytes(forwarded).hex(), inner_raw.hex(), "inner packet vs input with TTL - 1")
    return count


def check_icmp(case, expected, raw, original):
    stack, l3 = decode_frame(raw)
    count = check_checksums(stack, raw, "ICMP frame")
    check_eth(stack, expected["eth"], "ICMP")
    header = ip_layer(stack)
    check_ip(header, expected["ip"], "ICMP IP")
    eq(len(raw), l3 + expected["ip"]["length"], "frame length")
    message = bytes(header.payload)
    eq(message[0], expected["icmp"]["type"], "ICMP type")
    eq(message[1], expected["icmp"]["code"], "ICMP code")

    source, l3_in = decode_frame(original)
    request_ip = ip_layer(source)
    original_raw = original[l3_in:l3_in + ip_fields(request_ip)[6]]
    eq(request_ip.src, header.dst, "reply goes to the original source")
    eq(request_ip.dst, header.src, "reply comes from the original destination")

    if expected["quote"] is None:  # echo reply
        eq(int.from_bytes(message[4:6], "big"), expected["icmp"]["id"], "echo identifier")
        eq(int.from_bytes(message[6:8], "big"), expected["icmp"]["seq"], "echo sequence")
        request = bytes(request_ip.payload)
        eq(message[4:], request[4:], "identifier, sequence and data echoed")
        return count

    quote = message[8:]
    if isinstance(header, IP):
        eq(int.from_bytes(message[4:6], "big"), 0, "unused high 16 bits")
        eq(int.from_bytes(message[6:8], "big"), expected["icmp"]["mtu"], "next-hop MTU")
        expect(expected["ip"]["length"] <= 576, "ICMP error within 576 bytes (RFC 1812)")
    else:
        eq(int.from_bytes(message[4:8], "big"), expected["icmp"]["mtu"], "packet too big MTU")
        expect(expected["ip"]["length"] <= 1280, "ICMPv6 error within 1280 bytes (RFC 4443)")
    eq(len(quote), expected["quote"]["length"], "quote length")
    eq(quote, original_raw[:len(quote)], "quote is the start of the original IP packet")
    quoted = decode_ip(quote)
    version, src, dst, proto, _, _, _ = ip_fields(quoted)
    eq(src, expected["quote"]["src"], "quoted source")
    eq(dst, expected["quote"]["dst"], "quoted destination")
    eq(proto, expected["quote"]["proto"], "quoted protocol")
    eq(quoted.payload.sport, expected["quote"]["sport"], "quoted source port")
    eq(quoted.payload.dport, expected["quote"]["dport"], "quoted destination port")
    return count


def main(argv):
    directory = argv[1] if len(argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "data", "golden")
    cases = sorted(glob.glob(os.path.join(directory, "*.json")))
    if not cases:
        print("golden-scapy: FAIL: no <case>.json in %s" % directory)
        return 1
    passed = failed = checksums = 0
    for path in cases:
        case = os.path.basename(path)[:-len(".json")]
        try:
            with open(path, encoding="utf-8") as f:
                expected = json.load(f)
            eq(expected.get("case"), case, "json case name")
            raw = read_hex(os.path.join(directory, case + ".out.hex"))
            original = read_hex(os.path.join(directory, case + ".in.hex"))
            if expected["type"] == "encap":
                checksums += check_encap(case, expected, raw, original)
            elif expected["type"] == "icmp":
                checksums += check_icmp(case, expected, raw, original)
            else:
                raise Mismatch("unknown type %r" % expected["type"])
            passed += 1
        except (Mismatch, OSError, ValueError, KeyError, IndexError, TypeError,
                AttributeError) as error:
            failed += 1
            print("golden-scapy: FAIL %s: %s: %s" % (case, type(error).__name__, error))
    print("golden-scapy: %d passed, %d failed (%d checksums verified)" % (passed, failed, checksums))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
