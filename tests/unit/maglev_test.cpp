#include "spillway/maglev.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

namespace spillway {
namespace {

// The seed of the golden tables below (scripts/estate_harness/maglev_reference.py uses it too).
constexpr std::uint64_t kSeed = 0x5350494C4C574159;

using Entries = std::vector<std::uint32_t>;

Entries entriesOf(const MaglevBuild& build) {
  return {build.table.entries().begin(), build.table.entries().end()};
}

MaglevBuild mustBuild(MaglevBuilder& builder, std::span<const MaglevBackend> backends,
                      std::uint32_t tableSize, std::uint64_t seed = kSeed,
                      const MaglevTable* previous = nullptr) {
  MaglevBuildResult result = builder.build(backends, FlowHasher(seed), tableSize, previous);
  EXPECT_TRUE(result.ok()) << result.error();
  return std::move(result).value();
}

// Backends with ids 1000 + 7 * i (not insertion indices), indices i + 1.
std::vector<MaglevBackend> makeBackends(std::size_t n, std::uint32_t weight = 1) {
  std::vector<MaglevBackend> backends;
  for (std::size_t i = 0; i < n; ++i) {
    backends.push_back({1000 + 7 * i, weight, static_cast<std::uint32_t>(i + 1)});
  }
  return backends;
}

std::map<std::uint32_t, std::uint32_t> countByIndex(const MaglevTable& table) {
  std::map<std::uint32_t, std::uint32_t> counts;
  for (std::uint32_t e : table.entries()) ++counts[e];
  return counts;
}

TEST(Maglev, PaperTable1) {
  // NSDI'16 Table 1: B0 offset 3 skip 4, B1 offset 0 skip 2, B2 offset 3 skip 1;
  // B0..B2 store indices 1..3.
  const std::vector<MaglevPermutation> all = {{3, 4, 1, 1}, {0, 2, 1, 2}, {3, 1, 1, 3}};
  MaglevBuilder builder;
  MaglevBuildResult before = builder.buildFromPermutations(all, 7);
  ASSERT_TRUE(before.ok()) << before.error();
  EXPECT_EQ(entriesOf(before.value()), (Entries{2, 1, 2, 1, 3, 3, 1}));

  const std::vector<MaglevPermutation> withoutB1 = {all[0], all[2]};
  MaglevBuildResult after = builder.buildFromPermutations(withoutB1, 7, &before.value().table);
  ASSERT_TRUE(after.ok()) << after.error();
  EXPECT_EQ(entriesOf(after.value()), (Entries{1, 1, 1, 1, 3, 3, 3}));
  EXPECT_EQ(after.value().changed, 3u);  // B1's two slots and slot 6
  EXPECT_EQ(after.value().shares[0].entries, 4u);
  EXPECT_EQ(after.value().shares[1].entries, 3u);
}

// Golden values from `/usr/bin/python3 scripts/estate_harness/maglev_reference.py`, an
// independent Python reimplementation of SipHash-1-3, FlowHasher's seed
// expansion, hashId and the weighted fill; they are pasted here literally.
TEST(Maglev, GoldenHashesAndPermutationsMatchReference) {
  const FlowHasher hasher(kSeed);
  EXPECT_EQ(hasher.k0(), 0x8c06ee6cad354803u);
  EXPECT_EQ(hasher.k1(), 0x15257ccd1a8a5620u);
  EXPECT_EQ(hasher.hashId(101, 0), 0x5c3922db4fb6c5fau);
  EXPECT_EQ(hasher.hashId(101, 1), 0xf7dfe3960011d36cu);
  EXPECT_EQ(hasher.hashId(303, 1), 0x2ca2b33e64809055u);

  const MaglevPermutation p101 = maglevPermutation(hasher, 101, 13);
  const MaglevPermutation p202 = maglevPermutation(hasher, 202, 13);
  const MaglevPermutation p303 = maglevPermutation(hasher, 303, 13);
  EXPECT_EQ(std::pair(p101.offset, p101.skip), std::pair(3u, 5u));
  EXPECT_EQ(std::pair(p202.offset, p202.skip), std::pair(5u, 2u));
  EXPECT_EQ(std::pair(p303.offset, p303.skip), std::pair(10u, 2u));
}

TEST(Maglev, GoldenTablesAtM13MatchReference) {
  MaglevBuilder builder;
  const std::vector<MaglevBackend> equal = {{101, 1, 1}, {202, 1, 2}, {303, 1, 3}};
  EXPECT_EQ(entriesOf(mustBuild(builder, equal, 13)),
            (Entries{1, 3, 1, 1, 3, 2, 1, 2, 1, 2, 3, 2, 3}));

  const std::vector<MaglevBackend> weighted = {{101, 3, 1}, {202, 1, 2}, {303, 2, 3}};
  EXPECT_EQ(entriesOf(mustBuild(builder, weighted, 13)),
            (Entries{1, 3, 1, 1, 1, 2, 1, 2, 1, 3, 3, 2, 3}));

  const std::vector<MaglevBackend> oneDrained = {{101, 1, 1}, {202, 0, 2}, {303, 1, 3}};
  EXPECT_EQ(entriesOf(mustBuild(builder, oneDrained, 13)),
            (Entries{1, 3, 1, 1, 1, 1, 1, 3, 1, 3, 3, 3, 3}));
}

TEST(Maglev, TableIgnoresInputOrder) {
  std::mt19937_64 rng(7);
  std::vector<MaglevBackend> backends = makeBackends(50);
  for (std::size_t i = 0; i < backends.size(); ++i) {
    backends[i].id = rng();
    backends[i].weight = static_cast<std::uint32_t>(rng() % 5);  // zeros included
  }
  MaglevBuilder builder;
  const MaglevBuild reference = mustBuild(builder, backends, 1009);
  for (int round = 0; round < 20; ++round) {
    std::shuffle(backends.begin(), backends.end(), rng);
    const MaglevBuild shuffled = mustBuild(builder, backends, 1009);
    ASSERT_EQ(shuffled.table, reference.table) << "round " << round;
    ASSERT_EQ(shuffled.shares.size(), reference.shares.size());
    for (std::size_t i = 0; i < shuffled.shares.size(); ++i) {
      EXPECT_EQ(shuffled.shares[i].id, reference.shares[i].id);
      EXPECT_EQ(shuffled.shares[i].entries, reference.shares[i].entries);
    }
  }
  // A fresh builder (no reused scratch) agrees too.
  MaglevBuilder fresh;
  EXPECT_EQ(mustBuild(fresh, backends, 1009).table, reference.table);
}

TEST(Maglev, UnweightedBalanceIsFloorOrCeil) {
  MaglevBuilder builder;
  for (std::uint32_t m : {7u, 13u, 1009u, 65537u}) {
    for (std::size_t n : {1u, 2u, 3u, 10u, 20u, 100u, 1000u}) {
      const std::vector<MaglevBackend> backends = makeBackends(n, 5);
      const MaglevBuild build = mustBuild(builder, backends, m);
      const auto counts = countByIndex(build.table);
      EXPECT_EQ(counts.count(0), 0u);
      std::uint32_t total = 0;
      for (const MaglevShare& share : build.shares) {
        EXPECT_GE(share.entries, m / n) << "M=" << m << " N=" << n;
        EXPECT_LE(share.entries, (m + n - 1) / n) << "M=" << m << " N=" << n;
        const auto it = counts.find(share.backendIndex);
        EXPECT_EQ(it == counts.end() ? 0u : it->second, share.entries);
        total += share.entries;
      }
      EXPECT_EQ(total, m);
    }
  }
}

// Bound of the turn rule. With M > N the fill ends in some iteration T >= 2,
// and backend i has taken n_i turns with
//   floor((T-1) u_i) + 1 <= n_i <= floor(T u_i) + 1,   u_i = w_i / w_max,
// so n_i = (T-1) u_i + d_i with 0 < d_i <= 1 + u_i. Summing, M = (T-1) U + sum d
// (U = sum u), hence
//   n_i - M w_i / W = d_i - (u_i / U) sum d  in  (-(rho_i + u_i), 1 + u_i),
// rho_i = N w_i / W (weight relative to the mean). So every count lies in
// (expected - (1 + rho_i), expected + 2). The relative error is then at most 1%
// whenever expected >= 100 * max(2, 1 + rho_i), which the cases below satisfy.
TEST(Maglev, WeightedSharesFollowWeights) {
  struct Case {
    std::uint32_t m;
    std::size_t n;
    std::uint32_t minWeight, maxWeight;
  };
  // Every case has M >= 100 N and every expected count >= 233.
  const Case cases[] = {{5003, 10, 50, 100}, {65537, 100, 50, 150}, {655373, 1000, 20, 40}};
  MaglevBuilder builder;
  std::mt19937_64 rng(11);
  for (const Case& c : cases) {
    std::vector<MaglevBackend> backends = makeBackends(c.n);
    std::uint64_t total = 0;
    for (MaglevBackend& b : backends) {
      b.weight = c.minWeight + static_cast<std::uint32_t>(rng() % (c.maxWeight - c.minWeight + 1));
      total += b.weight;
    }
    const MaglevBuild build = mustBuild(builder, backends, c.m);
    for (const MaglevShare& share : build.shares) {
      const double expected = double(c.m) * share.weight / double(total);
      const double rho = double(c.n) * share.weight / double(total);
      const double dev = double(share.entries) - expected;
      ASSERT_GE(expected, 100.0 * std::max(2.0, 1.0 + rho));
      EXPECT_LT(dev, 2.0) << "M=" << c.m << " id " << share.id;
      EXPECT_GT(dev, -(1.0 + rho)) << "M=" << c.m << " id " << share.id;
      EXPECT_LE(std::abs(dev) / expected, 0.01) << "M=" << c.m << " id " << share.id;
    }
  }
}

TEST(Maglev, SkewedWeightsStayWithinTheBound) {
  // Weights spanning five orders of magnitude: the relative bound is loose for
  // the light ones, the absolute bound still holds for all.
  std::vector<MaglevBackend> backends = makeBackends(40);
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < backends.size(); ++i) {
    backends[i].weight = std::uint32_t{1} << (i % 17);
    total += backends[i].weight;
  }
  MaglevBuilder builder;
  const MaglevBuild build = mustBuild(builder, backends, 65537);
  for (const MaglevShare& share : build.shares) {
    const double expected = 65537.0 * share.weight / double(total);
    const double rho = double(backends.size()) * share.weight / double(total);
    EXPECT_LT(share.entries - expected, 2.0) << "id " << share.id;
    EXPECT_GT(share.entries - expected, -(1.0 + rho)) << "id " << share.id;
  }
}

TEST(Maglev, ZeroWeightBackendsOwnNothing) {
  std::vector<MaglevBackend> backends = makeBackends(10);
  backends[3].weight = 0;
  backends[7].weight = 0;
  MaglevBuilder builder;
  const MaglevBuild build = mustBuild(builder, backends, 1009);
  const auto counts = countByIndex(build.table);
  EXPECT_EQ(counts.count(backends[3].backendIndex), 0u);
  EXPECT_EQ(counts.count(backends[7].backendIndex), 0u);
  EXPECT_EQ(counts.count(0), 0u);
  EXPECT_FALSE(build.allNone);
  for (const MaglevShare& share : build.shares) {
    if (share.weight == 0) {
      EXPECT_EQ(share.entries, 0u);
    }
  }
  EXPECT_EQ(build.shares.size(), 10u);  // zero-weight backends are still reported
}

TEST(Maglev, NoBackendOrAllZeroGivesAllNone) {
  MaglevBuilder builder;
  const MaglevBuild empty = mustBuild(builder, {}, 13);
  EXPECT_TRUE(empty.allNone);
  EXPECT_EQ(entriesOf(empty), Entries(13, 0));
  EXPECT_EQ(empty.table.lookup(0x0123456789abcdefULL), 0u);

  const std::vector<MaglevBackend> zeros = makeBackends(5, 0);
  const MaglevBuild drained = mustBuild(builder, zeros, 13);
  EXPECT_TRUE(drained.allNone);
  EXPECT_EQ(entriesOf(drained), Entries(13, 0));
  EXPECT_EQ(drained.shares.size(), 5u);

  const MaglevTable unbuilt;
  EXPECT_EQ(unbuilt.size(), 1u);
  EXPECT_EQ(unbuilt.lookup(~0ULL), 0u);
}

TEST(Maglev, WeightChangeMovesMostlyThatBackendsEntries) {
  std::vector<MaglevBackend> backends = makeBackends(100, 100);
  MaglevBuilder builder;
  const MaglevBuild before = mustBuild(builder, backends, 65537);
  for (std::uint32_t newWeight : {0u, 50u, 150u, 200u}) {
    backends[42].weight = newWeight;
    const MaglevBuild after = mustBuild(builder, backends, 65537, kSeed, &before.table);
    const std::uint32_t changedIndex = backends[42].backendIndex;
    std::uint32_t involving = 0;
    std::uint32_t others = 0;
    for (std::uint32_t s = 0; s < 65537; ++s) {
      const std::uint32_t a = before.table.entries()[s];
      const std::uint32_t b = after.table.entries()[s];
      if (a == b) continue;
      (a == changedIndex || b == changedIndex ? involving : others) += 1;
    }
    EXPECT_EQ(involving + others, after.changed);
    // The unavoidable move is |delta| slots to or from backend 42. Maglev adds
    // some reshuffling among the others (here 0.5 to 1 times |delta|; the
    // paper, section 3.4, trades minimal disruption for balance), but nothing
    // like a rehash of the table.
    const std::uint32_t delta = std::max(after.shares[42].entries, before.shares[42].entries) -
                                std::min(after.shares[42].entries, before.shares[42].entries);
    EXPECT_GE(involving, delta) << "weight " << newWeight;
    EXPECT_LE(others, delta + delta / 4) << "weight " << newWeight;
    EXPECT_LE(after.changed, 5 * delta / 2) << "weight " << newWeight;
  }
}

TEST(Maglev, RemovingOrAddingOneOf100MovesAtMost2Percent) {
  const std::vector<MaglevBackend> all = makeBackends(100, 1);
  MaglevBuilder builder;
  const MaglevBuild full = mustBuild(builder, all, 65537);
  for (std::size_t removed : {0u, 17u, 42u, 99u}) {
    std::vector<MaglevBackend> fewer = all;
    fewer.erase(fewer.begin() + static_cast<std::ptrdiff_t>(removed));
    const MaglevBuild smaller = mustBuild(builder, fewer, 65537, kSeed, &full.table);
    EXPECT_EQ(smaller.changed, countChanged(full.table, smaller.table));
    EXPECT_LE(smaller.changed, 65537u * 2 / 100) << "removed " << removed;
    // Every slot of the removed backend moved.
    EXPECT_GE(smaller.changed, full.shares[removed].entries);

    const MaglevBuild restored = mustBuild(builder, all, 65537, kSeed, &smaller.table);
    EXPECT_LE(restored.changed, 65537u * 2 / 100) << "added back " << removed;
    EXPECT_EQ(restored.table, full.table);
  }
}

// The fill written as plainly as possible (the loop of the turn rule, a walk
// per turn probing the table itself), for comparing against the builder's
// optimised phases and turn drivers on many inputs.
Entries naiveFill(std::vector<MaglevBackend> backends, const FlowHasher& hasher, std::uint32_t m) {
  std::sort(backends.begin(), backends.end(),
            [](const MaglevBackend& a, const MaglevBackend& b) { return a.id < b.id; });
  std::erase_if(backends, [](const MaglevBackend& b) { return b.weight == 0; });
  Entries table(m, 0);
  if (backends.empty()) return table;
  std::uint64_t maxWeight = 0;
  for (const MaglevBackend& b : backends) maxWeight = std::max<std::uint64_t>(maxWeight, b.weight);
  std::vector<std::uint64_t> position(backends.size(), 0), target(backends.size(), 0);
  std::uint32_t placed = 0;
  for (std::uint64_t t = 1;; ++t) {
    for (std::size_t i = 0; i < backends.size(); ++i) {
      if (t * backends[i].weight < target[i]) continue;
      target[i] += maxWeight;
      const MaglevPermutation p = maglevPermutation(hasher, backends[i].id, m);
      std::uint64_t slot;
      do {
        slot = (p.offset + position[i]++ * p.skip) % m;
      } while (table[slot] != 0);
      table[slot] = backends[i].backendIndex;
      if (++placed == m) return table;
    }
  }
}

TEST(Maglev, MatchesPlainFillOnRandomInputs) {
  std::mt19937_64 rng(2024);
  MaglevBuilder builder;
  const std::uint32_t sizes[] = {2, 3, 5, 7, 13, 61, 251, 1009, 4093, 10007};
  for (int round = 0; round < 120; ++round) {
    const std::uint32_t m = sizes[rng() % std::size(sizes)];
    const std::size_t n = 1 + rng() % 60;
    std::vector<MaglevBackend> backends(n);
    for (std::size_t i = 0; i < n; ++i) {
      backends[i].id = rng() % 1000;  // ids collide now and then: rejected below
      backends[i].backendIndex = static_cast<std::uint32_t>(i + 1);
      // Equal weights (the round-robin driver), moderate ones (the loop),
      // some zero, and one heavy backend (the heap).
      const std::uint32_t weights[] = {
          7, 50 + static_cast<std::uint32_t>(rng() % 101), static_cast<std::uint32_t>(rng() % 4),
          i == 0 ? 1000000 : 1 + static_cast<std::uint32_t>(rng() % 100)};
      backends[i].weight = weights[round % 4];
    }
    std::sort(backends.begin(), backends.end(),
              [](const MaglevBackend& a, const MaglevBackend& b) { return a.id < b.id; });
    backends.erase(
        std::unique(backends.begin(), backends.end(),
                    [](const MaglevBackend& a, const MaglevBackend& b) { return a.id == b.id; }),
        backends.end());
    std::shuffle(backends.begin(), backends.end(), rng);
    const FlowHasher hasher(rng());
    MaglevBuildResult result = builder.build(backends, hasher, m);
    ASSERT_TRUE(result.ok()) << result.error();
    ASSERT_EQ(entriesOf(result.value()), naiveFill(backends, hasher, m))
        << "round " << round << " M=" << m << " N=" << backends.size();
    std::uint32_t total = 0;
    for (const MaglevShare& share : result.value().shares) total += share.entries;
    EXPECT_EQ(total, result.value().allNone ? 0 : m);
  }
}

TEST(Maglev, TableSizeValidation) {
  EXPECT_EQ(validateMaglevTableSize(65536).value_or(""),
            "table size 65536 is not prime; use a prime such as 65537");
  EXPECT_EQ(validateMaglevTableSize(0).value_or(""),
            "table size 0 is not prime; use a prime such as 65537");
  EXPECT_EQ(validateMaglevTableSize(1).value_or(""),
            "table size 1 is not prime; use a prime such as 65537");
  EXPECT_EQ(validateMaglevTableSize(1000).value_or(""),
            "table size 1000 is not prime; use a prime such as 1009");
  EXPECT_EQ(validateMaglevTableSize(16777259).value_or(""),
            "table size 16777259 exceeds the maximum 16777216; use a prime such as 16777213");
  for (std::uint32_t tooLarge : {16777259u, 2147483647u, 4294967291u}) {  // all prime
    EXPECT_NE(validateMaglevTableSize(tooLarge).value_or("").find("exceeds the maximum"),
              std::string::npos);
  }

  for (std::uint32_t prime : {2u, 3u, 7u, 13u, 251u, 65537u, 655373u, 5000011u, 16777213u}) {
    EXPECT_EQ(validateMaglevTableSize(prime), std::nullopt) << prime;
  }
  for (std::uint32_t composite : {4u, 9u, 65535u, 5000013u, 4294967295u}) {
    EXPECT_TRUE(validateMaglevTableSize(composite).has_value()) << composite;
  }

  MaglevBuilder builder;
  const std::vector<MaglevBackend> backends = makeBackends(3);
  MaglevBuildResult bad = builder.build(backends, FlowHasher(kSeed), 65536);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error(), "table size 65536 is not prime; use a prime such as 65537");
  EXPECT_FALSE(builder.buildFromPermutations({}, 10).ok());

  MaglevBuildResult large = builder.build(backends, FlowHasher(kSeed), 5000011);
  ASSERT_TRUE(large.ok()) << large.error();
  EXPECT_EQ(large.value().table.size(), 5000011u);
  EXPECT_EQ(countByIndex(large.value().table).count(0), 0u);
}

TEST(Maglev, RejectsBadBackends) {
  MaglevBuilder builder;
  const FlowHasher hasher(kSeed);

  const std::vector<MaglevBackend> duplicateId = {{101, 1, 1}, {202, 1, 2}, {101, 3, 3}};
  MaglevBuildResult r = builder.build(duplicateId, hasher, 13);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error(), "duplicate backend id 101");

  const std::vector<MaglevBackend> indexZero = {{101, 1, 1}, {202, 1, 0}};
  r = builder.build(indexZero, hasher, 13);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error(),
            "backend id 202 has backendIndex 0, which means \"none\"; indices start at 1");

  const std::vector<MaglevBackend> duplicateIndex = {{101, 1, 4}, {202, 1, 4}};
  r = builder.build(duplicateIndex, hasher, 13);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error(), "backendIndex 4 is used by two backends");

  const std::vector<MaglevBackend> sparseDuplicate = {
      {101, 1, 1u << 30}, {202, 1, 5}, {303, 1, 1u << 30}};
  r = builder.build(sparseDuplicate, hasher, 13);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error(), "backendIndex 1073741824 is used by two backends");
  const std::vector<MaglevBackend> sparseDistinct = {{101, 1, 1u << 30}, {202, 1, 5}};
  EXPECT_TRUE(builder.build(sparseDistinct, hasher, 13).ok());

  const std::vector<MaglevPermutation> badSkip = {{0, 7, 1, 1}};
  r = builder.buildFromPermutations(badSkip, 7);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error(), "permutation 0 has skip 7; skip must be in [1, 7)");
  const std::vector<MaglevPermutation> badOffset = {{1, 1, 1, 1}, {9, 1, 1, 2}};
  r = builder.buildFromPermutations(badOffset, 7);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error(), "permutation 1 has offset 9; offset must be in [0, 7)");

  // A rejected build leaves the builder usable.
  const std::vector<MaglevBackend> good = {{101, 1, 1}, {202, 1, 2}, {303, 1, 3}};
  EXPECT_EQ(entriesOf(mustBuild(builder, good, 13)),
            (Entries{1, 3, 1, 1, 3, 2, 1, 2, 1, 2, 3, 2, 3}));
}

TEST(Maglev, LookupStaysInRangeAndReachesEverySlot) {
  MaglevBuilder builder;
  const std::vector<MaglevBackend> backends = makeBackends(37);
  for (std::uint32_t m : {2u, 7u, 13u, 65537u, 655373u}) {
    const MaglevBuild build = mustBuild(builder, backends, m);
    std::mt19937_64 rng(m);
    for (int i = 0; i < 100000; ++i) {
      const std::uint64_t h = rng();
      const std::uint32_t slot = MaglevTable::slotOf(h, m);
      ASSERT_LT(slot, m);
      ASSERT_EQ(build.table.lookup(h), build.table.entries()[slot]);
      ASSERT_GE(build.table.lookup(h), 1u);
      ASSERT_LE(build.table.lookup(h), 37u);
    }
    EXPECT_EQ(MaglevTable::slotOf(0, m), 0u);
    EXPECT_EQ(MaglevTable::slotOf(~0ULL, m), m - 1);
    // Slot s is hit by the high words in [ceil(s 2^32 / M), ceil((s+1) 2^32 / M)).
    for (std::uint64_t s = 0; s < std::min<std::uint64_t>(m, 1000); ++s) {
      const std::uint64_t high = ((s << 32) + m - 1) / m;
      ASSERT_EQ(MaglevTable::slotOf(high << 32, m), s);
      if (s > 0) {
        ASSERT_EQ(MaglevTable::slotOf((high << 32) - 1, m), s - 1);
      }
    }
  }
}

TEST(Maglev, CountChanged) {
  MaglevBuilder builder;
  const std::vector<MaglevBackend> backends = makeBackends(3);
  const MaglevBuild a = mustBuild(builder, backends, 13);
  EXPECT_EQ(a.changed, 13u);  // no previous table: every slot is new
  EXPECT_EQ(countChanged(a.table, a.table), 0u);
  const MaglevBuild b = mustBuild(builder, backends, 13, kSeed + 1);
  EXPECT_EQ(countChanged(a.table, b.table), countChanged(b.table, a.table));
  const MaglevBuild c = mustBuild(builder, backends, 7);
  EXPECT_EQ(countChanged(a.table, c.table), 7u);
  EXPECT_EQ(countChanged(MaglevTable{}, a.table), 13u);
}

}  // namespace
}  // namespace spillway
