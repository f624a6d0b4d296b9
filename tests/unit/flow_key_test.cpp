#include "spillway/flow_key.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "packet_builder.hpp"

namespace spillway {
namespace {

std::vector<std::byte> bytesOf(std::initializer_list<int> v) {
  std::vector<std::byte> out;
  for (int b : v) out.push_back(std::byte(b));
  return out;
}

std::vector<std::byte> sequence(std::size_t n) {
  std::vector<std::byte> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back(std::byte(i));
  return out;
}

// Known answers from the SipHash paper (Aumasson & Bernstein, appendix A) and
// the reference implementation's vectors.h: key 00..0f, message 00..(n-1).
TEST(SipHash, ReferenceVectors24) {
  const std::uint64_t k0 = 0x0706050403020100ULL;
  const std::uint64_t k1 = 0x0f0e0d0c0b0a0908ULL;
  EXPECT_EQ((sipHash<2, 4>(k0, k1, sequence(0))), 0x726fdb47dd0e0e31ULL);
  EXPECT_EQ((sipHash<2, 4>(k0, k1, sequence(15))), 0xa129ca6149be45e5ULL);
  EXPECT_EQ((sipHash<2, 4>(k0, k1, sequence(1))), 0x74f839c593dc67fdULL);
}

FlowKey v4Key(const char* src, const char* dst, std::uint16_t sp, std::uint16_t dp) {
  FlowKey k;
  k.version = IpVersion::V4;
  k.src = test::ipBytes(src);
  k.dst = test::ipBytes(dst);
  k.srcPort = Be16::fromHost(sp);
  k.dstPort = Be16::fromHost(dp);
  k.proto = 6;
  return k;
}

// The specialised flow hash equals generic SipHash-1-3 of the documented
// canonical message, so another implementation can reproduce it.
TEST(FlowHasher, MatchesCanonicalMessage) {
  FlowHasher h(42);
  FlowKey k = v4Key("10.1.2.3", "192.0.2.10", 40000, 443);
  std::vector<std::byte> msg;
  for (int i = 0; i < 4; ++i) msg.push_back(k.src[i]);
  for (int i = 0; i < 4; ++i) msg.push_back(k.dst[i]);
  for (auto b : k.srcPort.raw) msg.push_back(std::byte(b));
  for (auto b : k.dstPort.raw) msg.push_back(std::byte(b));
  msg.push_back(std::byte(6));
  msg.push_back(std::byte(4));
  msg.push_back(std::byte(0));
  msg.push_back(std::byte(0));
  EXPECT_EQ(h.hash(k), (sipHash<1, 3>(h.k0(), h.k1(), msg)));

  FlowKey k6;
  k6.version = IpVersion::V6;
  k6.src = test::ipBytes("2001:db8::1");
  k6.dst = test::ipBytes("2001:db8::10");
  k6.srcPort = Be16::fromHost(1);
  k6.dstPort = Be16::fromHost(2);
  k6.proto = 17;
  std::vector<std::byte> msg6;
  for (auto b : k6.src) msg6.push_back(b);
  for (auto b : k6.dst) msg6.push_back(b);
  for (auto b : bytesOf({0, 1, 0, 2, 17, 6, 0, 0})) msg6.push_back(b);
  EXPECT_EQ(h.hash(k6), (sipHash<1, 3>(h.k0(), h.k1(), msg6)));
}

// SipHash-1-3 of the canonical message of 10.1.2.3:40000 -> 192.0.2.10:443
// TCP under seed 0, computed by an independent Python SipHash-1-3 with the
// same seed expansion (the one in scripts/estate_harness/maglev_reference.py).
constexpr std::uint64_t kPinnedHashSeed0 = 4260534513905693514ULL;

TEST(FlowHasher, SameSeedSameHashEverywhere) {
  FlowKey k = v4Key("10.1.2.3", "192.0.2.10", 40000, 443);
  EXPECT_EQ(FlowHasher(7).hash(k), FlowHasher(7).hash(k));
  EXPECT_NE(FlowHasher(7).hash(k), FlowHasher(8).hash(k));
  // Pinned value: a change of the hash silently re-steers every flow after an
  // upgrade, so it must be deliberate (update this and the release notes).
  EXPECT_EQ(FlowHasher(0).hash(k), kPinnedHashSeed0);
  EXPECT_EQ(FlowHasher(7).hashId(1001, 0), FlowHasher(7).hashId(1001, 0));
  EXPECT_NE(FlowHasher(7).hashId(1001, 0), FlowHasher(7).hashId(1001, 1));
}

TEST(FlowHasher, EveryFieldMatters) {
  FlowHasher h(1);
  const FlowKey base = v4Key("10.1.2.3", "192.0.2.10", 40000, 443);
  std::set<std::uint64_t> seen{h.hash(base)};
  auto vary = [&](auto mutate) {
    FlowKey k = base;
    mutate(k);
    EXPECT_TRUE(seen.insert(h.hash(k)).second);
  };
  vary([](FlowKey& k) { k.src[3] = std::byte(4); });
  vary([](FlowKey& k) { k.dst[0] = std::byte(193); });
  vary([](FlowKey& k) { k.srcPort = Be16::fromHost(40001); });
  vary([](FlowKey& k) { k.dstPort = Be16::fromHost(444); });
  vary([](FlowKey& k) { k.proto = 17; });
  vary([](FlowKey& k) { std::swap(k.srcPort, k.dstPort); });
  vary([](FlowKey& k) { k.version = IpVersion::V6; });
}

// Low and high halves are both used (flow table buckets, Maglev index, GUE
// source port): each bit should be set about half the time.
TEST(FlowHasher, BitsAreBalanced) {
  FlowHasher h(99);
  std::mt19937_64 rng(5);
  std::array<int, 64> ones{};
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    FlowKey k = v4Key("10.0.0.1", "192.0.2.10", 0, 443);
    const auto r = rng();
    k.src = ipv4Bytes(static_cast<std::uint32_t>(r));
    k.srcPort = Be16::fromHost(static_cast<std::uint16_t>(r >> 32));
    const auto v = h.hash(k);
    for (int b = 0; b < 64; ++b) ones[b] += (v >> b) & 1;
  }
  for (int b = 0; b < 64; ++b) {
    EXPECT_NEAR(ones[b], n / 2, n / 20) << "bit " << b;  // 10 sigma is about 700
  }
}

// FlowTableHasher -------------------------------------------------------

using Block = FlowTableHasher::Block;

Block blockOf(std::initializer_list<int> bytes) {
  Block b;
  int i = 0;
  for (int v : bytes) {
    (i < 8 ? b.lo : b.hi) |= std::uint64_t(v) << (8 * (i % 8));
    ++i;
  }
  return b;
}

// FIPS-197 appendix B, round 1: the state after the initial AddRoundKey,
// round key 1, and the state that starts round 2.
TEST(FlowTableHasher, AesRoundMatchesFips197) {
  const Block in = blockOf({0x19, 0x3d, 0xe3, 0xbe, 0xa0, 0xf4, 0xe2, 0x2b, 0x9a, 0xc6, 0x8d, 0x2a,
                            0xe9, 0xf8, 0x48, 0x08});
  const Block key = blockOf({0xa0, 0xfa, 0xfe, 0x17, 0x88, 0x54, 0x2c, 0xb1, 0x23, 0xa3, 0x39, 0x39,
                             0x2a, 0x6c, 0x76, 0x05});
  const Block out = blockOf({0xa4, 0x9c, 0x7f, 0xf2, 0x68, 0x9f, 0x35, 0x2b, 0x6b, 0x5b, 0xea, 0x43,
                             0x02, 0x6a, 0x50, 0x49});
  EXPECT_EQ(FlowTableHasher::aesRound(in, key), out);
}

FlowKey randomKey(std::mt19937_64& rng, IpVersion version) {
  FlowKey k;
  k.version = version;
  const std::size_t n = version == IpVersion::V4 ? 4 : 16;
  for (std::size_t i = 0; i < n; ++i) {
    k.src[i] = std::byte(rng());
    k.dst[i] = std::byte(rng());
  }
  k.srcPort = Be16::fromHost(static_cast<std::uint16_t>(rng()));
  k.dstPort = Be16::fromHost(static_cast<std::uint16_t>(rng()));
  k.proto = rng() % 2 == 0 ? 6 : 17;
  return k;
}

// The portable path is the instruction's twin, bit for bit, so a host
// without AES-NI computes the same table hash (and the same outer entropy).
TEST(FlowTableHasher, PortableEqualsAesNi) {
  if (!FlowTableHasher::cpuHasAesNi()) GTEST_SKIP() << "no AES-NI on this CPU";
  std::mt19937_64 rng(11);
  for (int i = 0; i < 10'000; ++i) {
    const FlowTableHasher fast(rng(), true);
    ASSERT_TRUE(fast.accelerated());
    const std::uint64_t seed = rng();
    const FlowTableHasher a(seed, true);
    const FlowTableHasher b(seed, false);
    ASSERT_FALSE(b.accelerated());
    const FlowKey k = randomKey(rng, i % 2 == 0 ? IpVersion::V4 : IpVersion::V6);
    ASSERT_EQ(a.hash(k), b.hash(k)) << i;
  }
}

// A change silently re-keys nothing persisted (the table hash never leaves
// the process) but changes every outer GUE source port and IPv6 flow label:
// scripts/estate_harness/maglev_reference.py models the same values (its
// self_check, which tests/golden/golden_check.py runs).
TEST(FlowTableHasher, PinnedValue) {
  const FlowKey k = v4Key("10.1.2.3", "192.0.2.10", 40000, 443);
  EXPECT_EQ(FlowTableHasher(0, false).hash(k), FlowTableHasher(0).hash(k));
  EXPECT_EQ(FlowTableHasher(0, false).hash(k), 0xdf4fb693ca30bca7ULL);
  FlowKey k6 = k;
  k6.version = IpVersion::V6;
  k6.src = test::ipBytes("2001:db8::1");
  k6.dst = test::ipBytes("2001:db8::10");
  EXPECT_EQ(FlowTableHasher(0, false).hash(k6), FlowTableHasher(0).hash(k6));
  EXPECT_EQ(FlowTableHasher(0, false).hash(k6), 0x619852f1a6581ceeULL);
}

TEST(FlowTableHasher, EveryFieldMattersAndTheFamilyToo) {
  const FlowTableHasher h(1);
  const FlowKey base = v4Key("10.1.2.3", "192.0.2.10", 40000, 443);
  std::set<std::uint64_t> seen{h.hash(base)};
  auto vary = [&](auto mutate) {
    FlowKey k = base;
    mutate(k);
    EXPECT_TRUE(seen.insert(h.hash(k)).second);
  };
  vary([](FlowKey& k) { k.src[3] = std::byte(4); });
  vary([](FlowKey& k) { k.dst[0] = std::byte(193); });
  vary([](FlowKey& k) { k.srcPort = Be16::fromHost(40001); });
  vary([](FlowKey& k) { k.dstPort = Be16::fromHost(444); });
  vary([](FlowKey& k) { k.proto = 17; });
  vary([](FlowKey& k) { std::swap(k.srcPort, k.dstPort); });
  vary([](FlowKey& k) { std::swap(k.src, k.dst); });
  vary([](FlowKey& k) { k.version = IpVersion::V6; });
  vary([](FlowKey& k) {
    k.version = IpVersion::V6;
    k.dst[15] = std::byte(1);
  });
}

// Keyed: another seed is another table. The identity (FlowHasher) and the
// table hash of one seed are unrelated values.
TEST(FlowTableHasher, AnotherSeedPlacesFlowsElsewhere) {
  const FlowTableHasher a(7);
  const FlowTableHasher b(8);
  const FlowHasher identity(7);
  constexpr std::uint64_t kMask = 1023;  // 1024 buckets
  int sameBucket = 0;
  int sameAsIdentity = 0;
  const int n = 10'000;
  for (int i = 0; i < n; ++i) {
    FlowKey k = v4Key("10.0.0.1", "192.0.2.10", static_cast<std::uint16_t>(1024 + i), 443);
    sameBucket += (a.hash(k) & kMask) == (b.hash(k) & kMask);
    sameAsIdentity += (a.hash(k) & kMask) == (identity.hash(k) & kMask);
    EXPECT_NE(a.hash(k), b.hash(k));
  }
  // Independent placements agree about n / 1024 times (~10; 50 is >12 sigma).
  EXPECT_LT(sameBucket, 50);
  EXPECT_LT(sameAsIdentity, 50);
}

// What an attacker sends most cheaply: one source address, consecutive
// ports; or consecutive addresses, one port. Both halves of the hash (b1 from
// the low bits, b2 from the high) spread them over 4096 buckets like random
// values (chi-square, 4095 degrees of freedom: mean 4095, sd ~90; the bound is
// ~10 sd), every bit set about half the time, and no 64-bit collision.
TEST(FlowTableHasher, StructuredKeysSpreadOverBuckets) {
  const FlowTableHasher h(99);
  constexpr int kBuckets = 4096;
  constexpr int n = 1 << 18;
  for (int pattern = 0; pattern < 3; ++pattern) {
    std::vector<int> low(kBuckets), high(kBuckets);
    std::array<int, 64> ones{};
    std::vector<std::uint64_t> all;
    all.reserve(n);
    for (int i = 0; i < n; ++i) {
      FlowKey k = v4Key("10.0.0.1", "192.0.2.10", 0, 443);
      if (pattern == 0) {
        k.srcPort = Be16::fromHost(static_cast<std::uint16_t>(i));
        k.src = ipv4Bytes(0x0a000000u + static_cast<std::uint32_t>(i >> 16));
      } else if (pattern == 1) {
        k.src = ipv4Bytes(0x0a000000u + static_cast<std::uint32_t>(i));
        k.srcPort = Be16::fromHost(40000);
      } else {
        k.version = IpVersion::V6;
        k.src[0] = std::byte(0x20);
        k.src[1] = std::byte(0x01);
        k.src[13] = std::byte(i >> 16);
        k.src[14] = std::byte(i >> 8);
        k.src[15] = std::byte(i);
        k.dst[15] = std::byte(1);
      }
      const std::uint64_t v = h.hash(k);
      all.push_back(v);
      ++low[v % kBuckets];
      ++high[(v >> 32) % kBuckets];
      for (int b = 0; b < 64; ++b) ones[b] += (v >> b) & 1;
    }
    for (const auto* counts : {&low, &high}) {
      const double expected = double(n) / kBuckets;
      double chi = 0;
      for (int c : *counts) chi += (c - expected) * (c - expected) / expected;
      EXPECT_LT(chi, 4095 + 900) << "pattern " << pattern;
      EXPECT_GT(chi, 4095 - 900) << "pattern " << pattern;
    }
    for (int b = 0; b < 64; ++b) {
      EXPECT_NEAR(ones[b], n / 2, n / 100) << "pattern " << pattern << " bit " << b;  // ~10 sd
    }
    std::sort(all.begin(), all.end());
    EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "pattern " << pattern;
  }
}

}  // namespace
}  // namespace spillway
