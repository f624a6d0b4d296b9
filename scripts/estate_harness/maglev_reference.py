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
    (offset + j * skip) mod M and probing the table itself.

Prints the golden tables that tests/unit/maglev_test.cpp holds literally.
Run: /usr/bin/python3 scripts/estate_harness/maglev_reference.py
"""

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
