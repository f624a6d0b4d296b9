#!/usr/bin/python3
"""Predicts which backend spillwayd gives a new flow, from its TOML
configuration alone, for the end-to-end tests and the drills.

The arithmetic is maglev_reference.py's (SipHash-1-3, the key
expansion, the weighted permutation fill), imported, not copied. What this
module adds is the mapping from a configuration to the table inputs, written
from the headers' contracts rather than from the C++:
  * backend id: `id`, else FNV-1a 64 of the name (config.hpp, backendIdFromName);
  * backend index: 1.. in id order over every configured backend (a fresh
    start numbers all backends in one setConfig(); snapshot_builder.hpp);
  * table input of a VIP: every backend of its pools, weight 0 when
    `state = "disabled"` (all next hops resolved is the caller's business);
  * flow hash: SipHash-1-3 of src(4) dst(4) sport(2, network order)
    dport(2) proto(1) version(1 = 4) and two zero bytes (flow_key.hpp);
  * slot: ((hash >> 32) * M) >> 32 (maglev.hpp, MaglevTable::slotOf).

Shares per backend, or one flow's backend (from the repository's root):
    PYTHONPATH=scripts python3 -m estate_harness.maglev_model CONFIG.toml [SRC SPORT VIP DPORT]
"""
import ipaddress
import math
import sys
import tomllib

from estate_harness import maglev_reference as ref

DEFAULT_WEIGHT = 100
DEFAULT_TABLE_SIZE = 65537
PROTOCOLS = {"tcp": 6, "udp": 17}


def fnv1a64(name):
    h = 0xCBF29CE484222325
    for b in name.encode():
        h ^= b
        h = (h * 0x100000001B3) & ref.MASK
    return h


def parse_u64(value):
    return int(value, 16) if isinstance(value, str) else int(value)


def flow_hash(hasher, src, dst, sport, dport, proto):
    """FlowHasher::hash of an IPv4 or IPv6 5-tuple (addresses as text)."""
    s, d = ipaddress.ip_address(src), ipaddress.ip_address(dst)
    if s.version != d.version:
        raise ValueError(f"mixed address families: {src} {dst}")
    tail = (sport.to_bytes(2, "big") + dport.to_bytes(2, "big") + bytes([proto, s.version]) +
            bytes(2))
    return ref.siphash(1, 3, hasher.k0, hasher.k1, s.packed + d.packed + tail)


def slot_of(flow_hash_value, table_size):
    return ((flow_hash_value >> 32) * table_size) >> 32


class Model:
    def __init__(self, config_path):
        with open(config_path, "rb") as f:
            conf = tomllib.load(f)
        self.seed = parse_u64(conf["dataplane"]["hash_seed"])
        self.hasher = ref.FlowHasher(self.seed)
        self.backends = {}  # name -> dict(id, index, weight, pool, address)
        for b in conf.get("backend", []):
            ident = parse_u64(b["id"]) if "id" in b else fnv1a64(b["name"])
            weight = b.get("weight", DEFAULT_WEIGHT)
            if b.get("state", "active") == "disabled":
                weight = 0
            self.backends[b["name"]] = {"id": ident, "weight": weight, "pool": b["pool"],
                                        "address": b["address"]}
        for index, name in enumerate(sorted(self.backends, key=lambda n: self.backends[n]["id"]),
                                     start=1):
            self.backends[name]["index"] = index
        self.by_index = {b["index"]: name for name, b in self.backends.items()}
        self.priority = {p["name"]: p.get("priority", 0) for p in conf.get("pool", [])}
        self.vips = {}  # (address, proto, port) -> dict(name, size, members)
        for v in conf.get("vip", []):
            key = (str(ipaddress.ip_address(v["address"])), PROTOCOLS[v["protocol"]],
                   v.get("port", 0))
            members = [n for n, b in self.backends.items() if b["pool"] in v["pools"]]
            self.vips[key] = {"name": v["name"], "size": v.get("table_size", DEFAULT_TABLE_SIZE),
                              "members": members, "table": None}

    def vip(self, address, proto, port):
        """The VIP that takes (address, proto, port): one on the port wins over
        one on every port of the address."""
        address = str(ipaddress.ip_address(address))
        for p in (port, 0):
            if (address, proto, p) in self.vips:
                return self.vips[(address, proto, p)]
        return None

    def policy_weights(self, vip):
        """The Maglev weights spillwayd's policy gives a VIP's backends when
        every backend is healthy and reports no load (see policy.hpp): the
        highest-priority level with capacity takes every new flow (its
        available capacity 1 times the overprovisioning factor >= 1); within
        it each backend gets round(10^6 * w / sum of w), at least 1 when w > 0;
        lower levels get 0."""
        members = [n for n in vip["members"] if self.backends[n]["weight"] > 0]
        if not members:
            return {n: 0 for n in vip["members"]}
        top = min(self.priority.get(self.backends[n]["pool"], 0) for n in members)
        level = [n for n in members if self.priority.get(self.backends[n]["pool"], 0) == top]
        total = float(sum(self.backends[n]["weight"] for n in level))
        weights = {n: 0 for n in vip["members"]}
        for n in level:
            share = self.backends[n]["weight"] / total
            weights[n] = min(10**6, max(1, math.floor(share * 10**6 + 0.5)))
        return weights

    def table(self, vip):
        if vip["table"] is None:
            weights = self.policy_weights(vip)
            inputs = [(self.backends[n]["id"], weights[n],
                       self.backends[n]["index"]) for n in vip["members"]]
            vip["table"] = ref.build(self.hasher, inputs, vip["size"])
        return vip["table"]

    def shares(self, vip):
        """Slots owned per member backend name."""
        table = self.table(vip)
        counts = {n: 0 for n in vip["members"]}
        for value in table:
            if value:
                counts[self.by_index[value]] += 1
        return counts

    def backend(self, src, sport, dst, dport, proto=6):
        """Backend name for a new flow, or None (no VIP, or an empty table)."""
        vip = self.vip(dst, proto, dport)
        if vip is None:
            return None
        h = flow_hash(self.hasher, src, dst, sport, dport, proto)
        value = self.table(vip)[slot_of(h, vip["size"])]
        return self.by_index.get(value)


def main():
    if len(sys.argv) not in (2, 6):
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    model = Model(sys.argv[1])
    if len(sys.argv) == 6:
        src, sport, dst, dport = sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
        print(model.backend(src, sport, dst, dport))
        return 0
    for (address, proto, port), vip in model.vips.items():
        shares = model.shares(vip)
        print(f"vip {vip['name']} {address} proto {proto} port {port} M={vip['size']}: " +
              ", ".join(f"{n} {c} ({100 * c / vip['size']:.1f} %)" for n, c in shares.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
