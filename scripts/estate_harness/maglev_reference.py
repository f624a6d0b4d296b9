#!/usr/bin/env python3
"""Independent reference for Spillway's weighted Maglev tables.

Written from the specifications, not translated from the C++:
  * SipHash-c-d over a byte string (Aumasson and Bernstein, 2012), checked
    against the paper's SipHash-2-4 test vectors;
  * FlowHasher's key expansion: k0 = splitmix64(seed),
    k1 = splitmix64(seed ^ 0x5370696c6c776179);
  * hashId(id, domain) = SipHash-1-3 of the 16-byte message id || domain, both
    little-endian 64-bit words;
  * the permutation fill of Eisenbud et al., NSDI'16, section 3.4, with
    Envoy's turn rule for weights, computing each permutation entry directly as
    (offset + j * skip) mod M and probing the table itself;
  * FlowTableHasher (the flow table's per-packet hash, the outer GUE source
    port's entropy): AES rounds from FIPS-197, checked against its appendix B.

Prints the golden tables that tests/unit/maglev_test.cpp holds literally.
Run: /usr/bin/python3 scripts/estate_harness/maglev_reference.py
"""

import struct

MASK = (1 << 64) - 1


def rotl(x, b):
    return ((x << b) | (x >> (64 - b))) & MASK


def siphash(c, d, k0, k1, message):
    v0 = k0 ^ 0x736F6D6570736575
    v1 = k1 ^ 0x646F72616E646F6D
    v2 = k0 ^ 0x6C7967656E657261
    v3 = k1 ^ 0x7465646279746573

    def sip_round():
        nonlocal v0, v1, v2, v3
        v0 = (v0 + v1) & MASK
        v1 = rotl(v1, 13) ^ v0
        v0 = rotl(v0, 32)
        v2 = (v2 + v3) & MASK
        v3 = rotl(v3, 16) ^ v2
        v0 = (v0 + v3) & MASK
        v3 = rotl(v3, 21) ^ v0
        v2 = (v2 + v1) & MASK
        v1 = rotl(v1, 17) ^ v2
        v2 = rotl(v2, 32)

    padded = bytearray(message)
    padded += bytes((8 - (len(message) + 1) % 8) % 8)
    padded.append(len(message) & 0xFF)
    assert len(padded) % 8 == 0
    for off in range(0, len(padded), 8):
        m = int.from_bytes(padded[off:off + 8], "little")
        v3 ^= m
        for _ in range(c):
            sip_round()
        v0 ^= m
    v2 ^= 0xFF
    for _ in range(d):
        sip_round()
    return v0 ^ v1 ^ v2 ^ v3


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


class FlowHasher:
    def __init__(self, seed):
        self.k0 = splitmix64(seed)
        self.k1 = splitmix64(seed ^ 0x5370696C6C776179)

    def hash_id(self, ident, domain):
        message = ident.to_bytes(8, "little") + domain.to_bytes(8, "little")
        return siphash(1, 3, self.k0, self.k1, message)


# FlowTableHasher (flow_key.hpp): the per-packet hash of the flow table and
# of the outer GUE source port / IPv6 flow label, from FIPS-197 and the
# design note, not from the C++.
TABLE_KEY_DOMAIN = 0x66746B6579000000  # "ftkey"


def _gf_mul(a, b):
    r = 0
    while b:
        if b & 1:
            r ^= a
        a = ((a << 1) ^ (0x11B if a & 0x80 else 0)) & 0xFF
        b >>= 1
    return r


def _aes_sbox():
    """FIPS-197 5.1.1: the inverse in GF(2^8), then the affine map with 0x63."""
    def rot(v, n):
        return ((v << n) | (v >> (8 - n))) & 0xFF
    box = []
    for x in range(256):
        inv = next((y for y in range(1, 256) if _gf_mul(x, y) == 1), 0) if x else 0
        box.append(inv ^ rot(inv, 1) ^ rot(inv, 2) ^ rot(inv, 3) ^ rot(inv, 4) ^ 0x63)
    return box


AES_SBOX = _aes_sbox()


def aes_round(state, key):
    """One AES encryption round (SubBytes, ShiftRows, MixColumns,
    AddRoundKey; the aesenc instruction) on 16 bytes, byte 4c + r being row r
    of column c (FIPS-197 5.1)."""
    t = [AES_SBOX[state[4 * ((c + r) % 4) + r]] for c in range(4) for r in range(4)]
    out = []
    for c in range(4):
        a = t[4 * c:4 * c + 4]
        for r in range(4):
            out.append(_gf_mul(a[r], 2) ^ _gf_mul(a[(r + 1) % 4], 3) ^ a[(r + 2) % 4]
                       ^ a[(r + 3) % 4])
    return bytes(o ^ k for o, k in zip(out, key))


def table_hash(hasher, key):
    """FlowTableHasher::hash of key = (version, src, dst, proto, sport, dport),
    addresses as 4 or 16 bytes. Round keys k_i = hash_id(2i, D) and
    hash_id(2i + 1, D), little-endian, D = "ftkey", i < 5; IPv4 one block
    (src, dst, ports, proto, version, two zero bytes), IPv6 three (src; dst;
    ports, proto, version, ten zero bytes); s = E(s xor block) from s = k0,
    E = four AES rounds under k1..k4; the state's low 8 bytes xor its high 8."""
    version, src, dst, proto, sport, dport = key
    tail = struct.pack("!HH", sport, dport) + bytes([proto, version]) + b"\0\0"
    keys = [hasher.hash_id(2 * i, TABLE_KEY_DOMAIN).to_bytes(8, "little")
            + hasher.hash_id(2 * i + 1, TABLE_KEY_DOMAIN).to_bytes(8, "little")
            for i in range(5)]
    blocks = [src + dst + tail] if version == 4 else [src, dst, tail + bytes(8)]
    state = keys[0]
    for n, block in enumerate(blocks):
        state = bytes(a ^ b for a, b in zip(state if n else keys[0], block))
        for k in keys[1:]:
            state = aes_round(state, k)
    return int.from_bytes(state[:8], "little") ^ int.from_bytes(state[8:], "little")


def permutation(hasher, ident, m):
    offset = hasher.hash_id(ident, 0) % m
    skip = hasher.hash_id(ident, 1) % (m - 1) + 1
    return offset, skip


def fill(perms, m):
    """perms: list of (offset, skip, weight, value) in turn order."""
    table = [0] * m
    takers = [p for p in perms if p[2] > 0]
    if not takers:
        return table
    w_max = max(p[2] for p in takers)
    nxt = [0] * len(takers)      # j: position in the backend's permutation
    target = [0] * len(takers)
    placed = 0
    t = 1
    while True:
        for i, (offset, skip, weight, value) in enumerate(takers):
            if t * weight < target[i]:
                continue
            target[i] += w_max
            while True:
                slot = (offset + nxt[i] * skip) % m
                nxt[i] += 1
                if table[slot] == 0:
                    break
            table[slot] = value
            placed += 1
            if placed == m:
                return table
        t += 1


def build(hasher, backends, m):
    """backends: list of (id, weight, backendIndex), any order."""
    perms = []
    for ident, weight, index in sorted(backends):
        offset, skip = permutation(hasher, ident, m)
        perms.append((offset, skip, weight, index))
    return fill(perms, m)


def self_check():
    key = bytes(range(16))
    k0 = int.from_bytes(key[:8], "little")
    k1 = int.from_bytes(key[8:], "little")
    # SipHash paper, appendix A, and the first entry of its vectors.h.
    assert siphash(2, 4, k0, k1, bytes(range(15))) == 0xA129CA6149BE45E5
    assert siphash(2, 4, k0, k1, b"") == 0x726FDB47DD0E0E31
    # NSDI'16 Table 1.
    paper = [(3, 4, 1, 1), (0, 2, 1, 2), (3, 1, 1, 3)]
    assert fill(paper, 7) == [2, 1, 2, 1, 3, 3, 1]
    assert fill([paper[0], paper[2]], 7) == [1, 1, 1, 1, 3, 3, 3]
    assert fill([], 7) == [0] * 7
    # FIPS-197 appendix B, round 1; flow_key_test's pinned table hashes.
    assert aes_round(bytes.fromhex("193de3bea0f4e22b9ac68d2ae9f84808"),
                     bytes.fromhex("a0fafe1788542cb123a339392a6c7605")) == \
        bytes.fromhex("a49c7ff2689f352b6b5bea43026a5049")
    h0 = FlowHasher(0)
    v4 = (4, bytes([10, 1, 2, 3]), bytes([192, 0, 2, 10]), 6, 40000, 443)
    assert table_hash(h0, v4) == 0xDF4FB693CA30BCA7
    v6 = (6, bytes.fromhex("20010db8000000000000000000000001"),
          bytes.fromhex("20010db8000000000000000000000010"), 6, 40000, 443)
    assert table_hash(h0, v6) == 0x619852F1A6581CEE


def c_array(values):
    return "{" + ", ".join(str(v) for v in values) + "}"


def main():
    self_check()
    seed = 0x5350494C4C574159
    hasher = FlowHasher(seed)
    print(f"seed 0x{seed:016x}: k0 0x{hasher.k0:016x} k1 0x{hasher.k1:016x}")
    for ident in (101, 202, 303):
        print(f"hashId({ident}, 0) = 0x{hasher.hash_id(ident, 0):016x}  "
              f"hashId({ident}, 1) = 0x{hasher.hash_id(ident, 1):016x}")
    m = 13
    for ident in (101, 202, 303):
        offset, skip = permutation(hasher, ident, m)
        print(f"M={m} id {ident}: offset {offset} skip {skip}")
    cases = [
        ("equal weights", [(101, 1, 1), (202, 1, 2), (303, 1, 3)]),
        ("weights 3:1:2", [(101, 3, 1), (202, 1, 2), (303, 2, 3)]),
        ("weights 1:0:1", [(101, 1, 1), (202, 0, 2), (303, 1, 3)]),
    ]
    for name, backends in cases:
        print(f"M={m} {name} {backends}: {c_array(build(hasher, backends, m))}")


if __name__ == "__main__":
    main()
