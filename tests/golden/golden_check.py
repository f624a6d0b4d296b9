"""Independent checks of spillwayd's output for a golden case.

Nothing here comes from spillwayd's code. From the case's config.toml and the
fate make_inputs.py wrote for every input frame, this module predicts what
spillwayd must transmit and count, and checks the actual output against it:

  - the model: the flow key of each packet (parsed by hand), its SipHash-1-3
    hash (the identity) and the VIP's weighted Maglev table, and the flow
    table's AES-round hash (the outer source port and flow label), all from
    scripts/estate_harness/maglev_reference.py (written from the papers, not from the C++),
    give the backend of every new flow; a dict plays the flow table, so later
    packets of a flow, and ICMP errors quoting it, keep its backend;
  - every output packet is paired, in order (one worker lcore keeps the input
    order), with the input frame whose fate is forward or reply, and decoded
    with scapy: L2 addresses and tag, outer header fields (addresses of the
    right family, encapsulation, DF, TTL, DSCP/ECN, IPv6 flow label and GUE
    UDP source port from the flow hash, GUE port and header), every outer
    checksum verified with scapy's checksum routines, the inner packet equal
    to the input's with the TTL decremented; ICMP replies decoded field by
    field (MTU from the backend's encapsulation overhead, quote limits);
  - no output beyond those, and a flow's packets all on one backend;
  - the statistics the model implies (per fate, per drop reason, per backend
    packets and new flows) equal spillwayd's JSON.

validate() returns a list of problems (empty: all good).
"""

import ipaddress
import socket
import struct
import tomllib
from collections import Counter, defaultdict

from scapy.layers.inet import IP as ScapyIP
from scapy.layers.inet import UDP as ScapyUDP
from scapy.layers.inet import in4_chksum
from scapy.layers.inet6 import IPv6 as ScapyIPv6
from scapy.layers.inet6 import in6_chksum
from scapy.utils import checksum as inet_checksum

# The project's independent SipHash + Maglev (scripts/estate_harness; meson
# puts scripts/ on PYTHONPATH).
from estate_harness import maglev_reference

# DPDK's net_pcap reports 02:70:63:61:70:<n> ("pcap") for its n-th device;
# the port's `mac` key applies only where the driver has no MAC of its own.
NET_PCAP_MAC = "02:70:63:61:70:00"
# Outer IP, plus UDP (8) and GUE (4) for GUE.
ENCAP_OVERHEAD = {"ipip4": 20, "ipip6": 40, "gue4": 32, "gue6": 52}
OUTER_TTL = 64
ICMP_ERROR_TOS = 0xC0
TCP, UDP, ICMP4, ICMP6 = 6, 17, 1, 58
IPV6_EXTENSIONS = (0, 43, 60, 44)


def fnv1a64(name):
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & ((1 << 64) - 1)
    return h


def as_int(value):
    return int(value, 16) if isinstance(value, str) else int(value)


def packed(address_text):
    return ipaddress.ip_address(address_text).packed


def mac_text(data):
    return ":".join("%02x" % b for b in data)


# ---------------------------------------------------------------------------
# Frames, parsed by hand (no scapy port bindings, no guessing).


class Frame:
    """Ethernet / one optional 802.1Q tag / IP of an input frame."""

    def __init__(self, data):
        self.data = data
        self.dst_mac, self.src_mac = mac_text(data[0:6]), mac_text(data[6:12])
        self.tci = None
        at = 14
        etype = struct.unpack("!H", data[12:14])[0]
        if etype == 0x8100:
            self.tci = struct.unpack("!H", data[14:16])[0]
            etype = struct.unpack("!H", data[16:18])[0]
            at = 18
        self.etype = etype
        self.l3 = at
        self.ip = None
        if etype == 0x0800:
            length = struct.unpack("!H", data[at + 2:at + 4])[0]
            self.ip = data[at:at + length]
        elif etype == 0x86DD:
            self.ip = data[at:at + 40 + struct.unpack("!H", data[at + 4:at + 6])[0]]


def ip_key(ip):
    """(version, src, dst, proto, l4 offset) of an IP packet's bytes."""
    version = ip[0] >> 4
    if version == 4:
        return 4, ip[12:16], ip[16:20], ip[9], (ip[0] & 15) * 4
    nh, at = ip[6], 40
    while nh in IPV6_EXTENSIONS:
        nh, at = ip[at], at + (8 if nh == 44 else (ip[at + 1] + 1) * 8)
    return 6, ip[8:24], ip[24:40], nh, at


def flow_key(ip):
    """The 5-tuple of a client packet: (version, src, dst, proto, sport, dport)."""
    version, src, dst, proto, l4 = ip_key(ip)
    sport = dport = 0
    if proto in (TCP, UDP):
        sport, dport = struct.unpack("!HH", ip[l4:l4 + 4])
    return version, src, dst, proto, sport, dport


def quoted_client_flow(ip):
    """The client flow an ICMP error quotes (the quote went VIP -> client)."""
    version, _, _, _, l4 = ip_key(ip)
    quote = ip[l4 + 8:]
    qv, qsrc, qdst, qproto, ql4 = ip_key(quote)
    sport, dport = struct.unpack("!HH", quote[ql4:ql4 + 4])
    assert qv == version
    return version, qdst, qsrc, qproto, dport, sport


# ---------------------------------------------------------------------------
# The model.


class Model:
    def __init__(self, config_path):
        with open(config_path, "rb") as f:
            config = tomllib.load(f)
        dp = config["dataplane"]
        maglev_reference.self_check()  # the model against its known answers first
        self.hasher = maglev_reference.FlowHasher(as_int(dp["hash_seed"]))
        assert len(config["port"]) == 1, "golden cases use one port"
        port = config["port"][0]
        self.port_mac = port.get("mac", NET_PCAP_MAC)
        self.next_hop = port.get("next_hop_mac")
        self.source4 = packed(port["address"]) if "address" in port else None
        self.source6 = packed(port["address6"]) if "address6" in port else None
        self.mtu = port.get("mtu", 1500)
        self.vlan = port.get("vlan")
        # Host traffic reaches the kernel through an exception tap, or by
        # itself on af_packet / af_xdp; on any other port (net_pcap here) it
        # has nowhere to go and is dropped as no_exception_path.
        device = port["devargs"].split(",")[0]
        self.kernel_path = (port.get("exception", "none") == "tap" or
                            device.startswith(("net_af_packet", "net_af_xdp")))
        pools = {p["name"]: p for p in config["pool"]}
        self.backends = []
        for b in config["backend"]:
            address = ipaddress.ip_address(b["address"])
            pool = pools[b["pool"]]
            family = "4" if address.version == 4 else "6"
            weight = b.get("weight", 100)
            if b.get("state", "active") == "disabled":
                weight = 0
            self.backends.append({
                "name": b["name"],
                "id": as_int(b["id"]) if "id" in b else fnv1a64(b["name"]),
                "version": address.version,
                "address": address.packed,
                "pool": b["pool"],
                "encap": pool.get("encap", "ipip"),
                "kind": pool.get("encap", "ipip") + family,
                "gue_port": pool.get("gue_port", 6080),
                "mac": b.get("mac", self.next_hop),
                "weight": weight,
            })
        self.vips = []
        for v in config["vip"]:
            address = ipaddress.ip_address(v["address"])
            members = [(b["id"], b["weight"], i + 1) for i, b in enumerate(self.backends)
                       if b["pool"] in v["pools"]]
            size = v.get("table_size", 65537)
            self.vips.append({
                "name": v["name"],
                "version": address.version,
                "address": address.packed,
                "proto": {"tcp": TCP, "udp": UDP}[v["protocol"]],
                "port": v.get("port", 0),
                "answer_ping": v.get("answer_ping", False),
                "size": size,
                "table": maglev_reference.build(self.hasher, members, size),
            })

    def flow_hash(self, key):
        """FlowHasher::hash: SipHash-1-3 over the key's canonical bytes."""
        version, src, dst, proto, sport, dport = key
        message = (src + dst + struct.pack("!HH", sport, dport) + bytes([proto, version])
                   + b"\0\0")
        assert len(message) == (16 if version == 4 else 40)
        return maglev_reference.siphash(1, 3, self.hasher.k0, self.hasher.k1, message)

    def table_hash(self, key):
        """FlowTableHasher::hash: the outer GUE source port's and flow label's
        entropy (maglev_reference.table_hash)."""
        return maglev_reference.table_hash(self.hasher, key)

    def vip_for(self, key):
        version, _, dst, proto, _, dport = key
        exact = [v for v in self.vips if v["version"] == version and v["address"] == dst
                 and v["proto"] == proto and v["port"] == dport]
        wild = [v for v in self.vips if v["version"] == version and v["address"] == dst
                and v["proto"] == proto and v["port"] == 0]
        return (exact + wild + [None])[0]

    def maglev(self, vip, flow_hash):
        """Backend (or None) of the VIP's table slot for this hash."""
        slot = ((flow_hash >> 32) * vip["size"]) >> 32
        label = vip["table"][slot]
        return self.backends[label - 1] if label else None


def gue_source_port(flow_hash):
    return 0xC000 | (flow_hash >> 50)


def flow_label(flow_hash):
    return ((flow_hash >> 30) & 0xFFFFF) or 1


def forwarded_inner(ip):
    """The input IP packet as the backend must receive it: TTL - 1."""
    inner = bytearray(ip)
    if inner[0] >> 4 == 4:
        inner[8] -= 1
        ihl = (inner[0] & 15) * 4
        inner[10:12] = b"\0\0"
        inner[10:12] = struct.pack("!H", inet_checksum(bytes(inner[:ihl])))
    else:
        inner[7] -= 1
    return bytes(inner)


def traffic_class(ip):
    return ip[1] if ip[0] >> 4 == 4 else ((ip[0] & 15) << 4) | (ip[1] >> 4)


# ---------------------------------------------------------------------------
# Output checks. Each raises Problem with what differs.


class Problem(Exception):
    pass


def shown(value):
    """Addresses as text in messages."""
    if isinstance(value, bytes) and len(value) in (4, 16):
        return str(ipaddress.ip_address(value))
    if isinstance(value, tuple):
        return tuple(shown(v) for v in value)
    return value


def eq(actual, expected, what):
    if actual != expected:
        raise Problem("%s: got %r, expected %r" % (what, shown(actual), shown(expected)))


def check_l2(out, dst, src, tci):
    eq(mac_text(out[0:6]), dst, "Ethernet destination")
    eq(mac_text(out[6:12]), src, "Ethernet source")
    etype = struct.unpack("!H", out[12:14])[0]
    if tci is None:
        if etype == 0x8100:
            raise Problem("802.1Q tag present, none expected")
        return 14, etype
    eq(etype, 0x8100, "EtherType (802.1Q tag expected)")
    eq(struct.unpack("!H", out[14:16])[0], tci, "802.1Q TCI")
    return 18, struct.unpack("!H", out[16:18])[0]


def check_ipv4_header(ip, what):
    """Scapy's IPv4 header checksum over the header must fold to zero."""
    ihl = (ip[0] & 15) * 4
    if inet_checksum(ip[:ihl]) != 0:
        raise Problem("%s: IPv4 header checksum 0x%04x does not verify" % (
            what, struct.unpack("!H", ip[10:12])[0]))


def check_forward(model, inp, out, backend, fhash):
    """An encapsulated packet to `backend` for input frame `inp`."""
    at, etype = check_l2(out, backend["mac"], model.port_mac, model.vlan)
    inner = forwarded_inner(inp.ip)
    kind = backend["kind"]
    outer = out[at:]
    inner_proto = 4 if inner[0] >> 4 == 4 else 41
    gue = kind.startswith("gue")
    proto = UDP if gue else inner_proto
    payload_len = len(inner) + (12 if gue else 0)
    if backend["version"] == 4:
        eq(etype, 0x0800, "outer EtherType (IPv4 backend)")
        h = ScapyIP(outer[:20])
        eq(h.version, 4, "outer version")
        eq(h.ihl, 5, "outer IHL")
        eq(h.tos, traffic_class(inp.ip), "outer TOS (DSCP+ECN copied from inner)")
        eq(h.len, 20 + payload_len, "outer total length")
        eq(h.id, 0, "outer id")
        eq(int(h.flags), 2, "outer flags (DF)")
        eq(h.frag, 0, "outer fragment offset")
        eq(h.ttl, OUTER_TTL, "outer TTL")
        eq(h.proto, proto, "outer protocol")
        eq(packed(h.src), model.source4, "outer source")
        eq(packed(h.dst), backend["address"],
           "outer destination (the model's backend %s)" % backend["name"])
        check_ipv4_header(outer, "outer")
        ip_header = h
        rest = outer[20:]
        eq(len(outer), 20 + payload_len, "frame length after L2 (no padding, nothing after)")
    else:
        eq(etype, 0x86DD, "outer EtherType (IPv6 backend)")
        h = ScapyIPv6(outer[:40])
        eq(h.version, 6, "outer version")
        eq(h.tc, traffic_class(inp.ip), "outer traffic class (copied from inner)")
        eq(h.fl, flow_label(fhash), "outer flow label (table hash bits 49..30)")
        eq(h.plen, payload_len, "outer payload length")
        eq(h.nh, proto, "outer next header")
        eq(h.hlim, OUTER_TTL, "outer hop limit")
        eq(packed(h.src), model.source6, "outer source")
        eq(packed(h.dst), backend["address"],
           "outer destination (the model's backend %s)" % backend["name"])
        ip_header = h
        rest = outer[40:]
        eq(len(outer), 40 + payload_len, "frame length after L2 (no padding, nothing after)")
    if gue:
        u = ScapyUDP(rest[:8])
        eq(u.sport, gue_source_port(fhash), "GUE UDP source port (0xc000 | table hash >> 50)")
        eq(u.dport, backend["gue_port"], "GUE UDP destination port (the pool's)")
        eq(u.len, len(rest), "UDP length")
        if u.chksum == 0:
            raise Problem("UDP checksum 0 (absent); Spillway always sets it")
        chk = (in4_chksum if backend["version"] == 4 else in6_chksum)(UDP, ip_header, rest)
        if chk != 0:
            raise Problem("outer UDP checksum 0x%04x does not verify" % u.chksum)
        eq(rest[8:12].hex(), bytes([0, inner_proto, 0, 0]).hex(),
           "GUE header (version 0, C 0, hlen 0, proto, flags 0)")
        rest = rest[12:]
    if rest != inner:
        diff = next((i for i in range(min(len(rest), len(inner))) if rest[i] != inner[i]),
                    min(len(rest), len(inner)))
        raise Problem("inner packet differs from the input's with TTL - 1 at byte %d "
                      "(%d bytes vs %d)" % (diff, len(rest), len(inner)))
    if inner[0] >> 4 == 4:
        check_ipv4_header(rest, "inner")


def check_reply_l3(inp, out):
    """L2 of a reply: MACs swapped, the input's tag kept. Returns the IP bytes."""
    at, etype = check_l2(out, inp.src_mac, inp.dst_mac, inp.tci)
    eq(etype, inp.etype, "reply EtherType")
    return out[at:]


def check_echo_reply(inp, out):
    ip = check_reply_l3(inp, out)
    version, src, dst, proto, l4 = ip_key(inp.ip)
    if version == 4:
        h = ScapyIP(ip[:20])
        eq(h.ihl, 5, "echo reply IHL (options not reflected)")
        eq(h.len, len(ip), "echo reply total length (no padding)")
        eq((packed(h.src), packed(h.dst)), (dst, src), "echo reply addresses")
        eq(h.ttl, 64, "echo reply TTL")
        eq(h.proto, ICMP4, "echo reply protocol")
        check_ipv4_header(ip, "echo reply")
        icmp = ip[20:]
        if inet_checksum(icmp) != 0:
            raise Problem("ICMP checksum does not verify")
        eq((icmp[0], icmp[1]), (0, 0), "ICMP type/code (echo reply)")
    else:
        h = ScapyIPv6(ip[:40])
        eq(h.plen + 40, len(ip), "echo reply length")
        eq(h.nh, ICMP6, "echo reply next header (extension headers not reflected)")
        eq((packed(h.src), packed(h.dst)), (dst, src), "echo reply addresses")
        eq(h.hlim, 64, "echo reply hop limit")
        icmp = ip[40:]
        if in6_chksum(ICMP6, h, icmp) != 0:
            raise Problem("ICMPv6 checksum does not verify")
        eq((icmp[0], icmp[1]), (129, 0), "ICMPv6 type/code (echo reply)")
    request = inp.ip[l4:]
    eq(icmp[4:].hex(), request[4:].hex(), "identifier, sequence and data echoed")


def check_too_big(model, inp, out, backend):
    ip = check_reply_l3(inp, out)
    version, src, dst, _, _ = ip_key(inp.ip)
    overhead = ENCAP_OVERHEAD[backend["kind"]]
    if version == 4:
        h = ScapyIP(ip[:20])
        eq((packed(h.src), packed(h.dst)), (dst, src), "frag-needed addresses (VIP -> client)")
        eq((h.ttl, h.tos, h.id, int(h.flags), h.proto), (64, ICMP_ERROR_TOS, 0, 2, ICMP4),
           "frag-needed TTL, TOS (CS6), id, flags (DF), protocol")
        eq(h.len, len(ip), "frag-needed total length")
        check_ipv4_header(ip, "frag-needed")
        icmp = ip[20:]
        if inet_checksum(icmp) != 0:
            raise Problem("ICMP checksum does not verify")
        eq((icmp[0], icmp[1]), (3, 4), "ICMP type/code (fragmentation needed)")
        eq(struct.unpack("!HH", icmp[4:8]), (0, max(68, model.mtu - overhead)),
           "unused / next-hop MTU (port MTU - %s overhead %d)" % (backend["kind"], overhead))
        eq(icmp[8:].hex(), inp.ip[:576 - 28].hex(), "quote (the original, within 576 bytes)")
    else:
        h = ScapyIPv6(ip[:40])
        eq((packed(h.src), packed(h.dst)), (dst, src),
           "packet-too-big addresses (VIP -> client)")
        eq((h.hlim, h.tc, h.nh), (64, ICMP_ERROR_TOS, ICMP6),
           "packet-too-big hop limit, traffic class (CS6), next header")
        eq(h.plen + 40, len(ip), "packet-too-big length")
        icmp = ip[40:]
        if in6_chksum(ICMP6, h, icmp) != 0:
            raise Problem("ICMPv6 checksum does not verify")
        eq((icmp[0], icmp[1]), (2, 0), "ICMPv6 type/code (packet too big)")
        eq(struct.unpack("!I", icmp[4:8])[0], max(1280, model.mtu - overhead),
           "MTU (port MTU - %s overhead %d)" % (backend["kind"], overhead))
        eq(icmp[8:].hex(), inp.ip[:1280 - 48].hex(), "quote (the original, within 1280 bytes)")


# ---------------------------------------------------------------------------


def predict(model, frames):
    """Per input: (fate, detail, backend, hash, new_flow), and the stats."""
    table = {}
    predictions = []
    stats = Counter()
    drops = Counter()
    per_backend = defaultdict(Counter)
    problems = []
    for i, (data, what, note) in enumerate(frames):
        fate, detail = what["fate"], what["detail"]
        inp = Frame(data) if fate in ("forward", "forward_icmp", "reply") else None
        backend = fhash = None
        new = False
        stats["rx_packets"] += 1
        if fate in ("forward", "forward_icmp") or (fate == "reply" and detail == "frag_needed"):
            key = quoted_client_flow(inp.ip) if fate == "forward_icmp" else flow_key(inp.ip)
            vip = model.vip_for(key)
            if vip is None:
                problems.append("input %d (%s): annotated %s, but no VIP serves it"
                                % (i, note, fate))
                predictions.append(None)
                continue
            fhash = model.flow_hash(key)
            if fhash in table:
                backend = table[fhash]
            else:
                backend = model.maglev(vip, fhash)
                if backend is None:
                    problems.append("input %d (%s): VIP %s has no backend" % (i, note, vip["name"]))
                    predictions.append(None)
                    continue
                if fate != "forward_icmp":
                    table[fhash] = backend
                    new = True
                    stats["new_flows"] += 1
                    per_backend[backend["name"]]["new_flows"] += 1
        if fate in ("forward", "forward_icmp"):
            stats["forwarded"] += 1
            per_backend[backend["name"]]["packets"] += 1
            if fate == "forward_icmp":
                stats["icmp_errors_steered"] += 1
        elif fate == "reply":
            stats["replies"] += 1
        elif fate == "kernel" and model.kernel_path:
            stats["to_kernel"] += 1
        elif fate == "kernel":
            stats["dropped"] += 1
            drops["no_exception_path"] += 1
        else:
            stats["dropped"] += 1
            drops[detail] += 1
        # The outer entropy comes from the flow table's hash, not the identity.
        entropy = model.table_hash(key) if fhash is not None else None
        predictions.append((inp, fate, detail, backend, entropy, new))
    expected = {k: stats[k] for k in ("rx_packets", "forwarded", "replies", "to_kernel",
                                      "new_flows", "icmp_errors_steered", "dropped")}
    expected.update({"resteered": 0, "flow_insert_failed": 0, "tx_dropped": 0,
                     "exception_rx": 0, "exception_tx": 0, "drops": dict(drops)})
    expected["backends"] = {b["name"]: {"packets": per_backend[b["name"]]["packets"],
                                        "new_flows": per_backend[b["name"]]["new_flows"]}
                            for b in model.backends}
    return predictions, expected, problems


def stats_view(stats):
    """The counters a golden case pins, from spillwayd's JSON."""
    view = {k: stats[k] for k in ("rx_packets", "forwarded", "replies", "to_kernel", "new_flows",
                                  "resteered", "flow_insert_failed", "icmp_errors_steered",
                                  "tx_dropped", "exception_rx", "exception_tx", "dropped")}
    view["drops"] = dict(stats["drops"])
    view["backends"] = {b["name"]: {"packets": b["packets"], "new_flows": b["new_flows"]}
                        for b in stats["backends"]}
    return view


def compare_stats(actual, expected, against):
    problems = []
    for key, want in expected.items():
        got = actual.get(key)
        if key == "backends":
            for name, counters in want.items():
                for k, v in counters.items():
                    g = (got or {}).get(name, {}).get(k)
                    if g != v:
                        problems.append("stats backends[%s].%s: got %r, %s %r" % (
                            name, k, g, against, v))
        elif got != want:
            problems.append("stats %s: got %r, %s %r" % (key, got, against, want))
    return problems


def validate(config_path, frames, outputs, stats, cover=(), spread=False):
    """All independent checks of one run; returns a list of problems."""
    model = Model(config_path)
    predictions, expected_stats, problems = predict(model, frames)
    if problems:
        return problems
    emitters = [(i, p) for i, p in enumerate(predictions) if p[1] in ("forward", "forward_icmp",
                                                                       "reply")]
    if len(outputs) != len(emitters):
        problems.append("%d packets transmitted, the model expects %d (forwarded + replies)"
                        % (len(outputs), len(emitters)))
    covered = set()
    for n, ((i, (inp, fate, detail, backend, fhash, _)), out) in enumerate(zip(emitters, outputs)):
        try:
            if fate == "reply" and detail == "echo":
                check_echo_reply(inp, out)
            elif fate == "reply":
                check_too_big(model, inp, out, backend)
            else:
                check_forward(model, inp, out, backend, fhash)
                covered.add((inp.ip[0] >> 4, backend["kind"]))
        except Problem as e:
            note = frames[i][2]
            problems.append("output %d (input %d, %s, %s%s): %s" % (
                n, i, note, fate,
                " to " + backend["name"] if backend else "", e))
    # Flow affinity, from the output alone: one outer destination per flow,
    # ICMP errors quoting the flow included.
    by_flow = defaultdict(set)
    for (i, (inp, fate, _, _, _, _)), out in zip(emitters, outputs):
        if fate == "forward":
            by_flow[flow_key(inp.ip)].add(outer_destination(out))
        elif fate == "forward_icmp":
            by_flow[quoted_client_flow(inp.ip)].add(outer_destination(out))
    for key, dsts in by_flow.items():
        if len(dsts) > 1:
            problems.append("flow %r went to several backends: %s" % (key, sorted(dsts)))
    for item in cover:
        if item not in covered:
            problems.append("case meant to cover inner IPv%d over %s, no packet did "
                            "(add flows in make_inputs.py)" % item)
    if spread:
        served = set()
        for vip in model.vips:
            served.update(label for label in vip["table"] if label)
        for label in sorted(served):
            name = model.backends[label - 1]["name"]
            if expected_stats["backends"][name]["new_flows"] == 0:
                problems.append("backend %s owns table slots but got no flow: the case should "
                                "spread over every backend (add flows in make_inputs.py)" % name)
    problems += compare_stats(stats_view(stats), expected_stats, "the model expects")
    return problems


def outer_destination(out):
    at = 18 if out[12:14] == b"\x81\x00" else 14
    etype = out[at - 2:at]
    if etype == b"\x08\x00":
        return socket.inet_ntop(socket.AF_INET, out[at + 16:at + 20])
    return socket.inet_ntop(socket.AF_INET6, out[at + 24:at + 40])
