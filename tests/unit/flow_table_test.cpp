#include "spillway/flow_table.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace spillway {
namespace {

constexpr Millis kSecond = 1'000;
constexpr Millis kTwoPow32 = Millis{1} << 32;

FlowEvent tcp(std::uint8_t flags) {
  return FlowEvent{flags};
}

// A segment that carries data.
FlowEvent tcpData(std::uint8_t flags) {
  return FlowEvent{flags, true};
}

// The state of the live entry for `hash`, or nullopt.
std::optional<FlowState> stateOf(const FlowTable& table, std::uint64_t hash, Millis now) {
  std::optional<FlowState> found;
  const std::uint64_t fp = hash == 0 ? 1 : hash;
  table.forEachLive(now, 0, table.bucketCount(),
                    [&](std::uint64_t h, std::uint32_t, FlowState s, std::uint32_t, std::uint8_t) {
                      if (h == fp) found = s;
                    });
  return found;
}

// A hash whose candidate buckets are exactly (first, second) in a table of at
// most 2^16 buckets; `tag` makes hashes with the same pair distinct.
std::uint64_t craftedHash(std::uint32_t first, std::uint32_t second, std::uint32_t tag) {
  return (std::uint64_t{tag} << 48) | (std::uint64_t{second} << 32) | (std::uint64_t{tag} << 16) |
         first;
}

// A table of 32 buckets (capacity 100 -> 125 slots -> 32 buckets of 4).
FlowTable smallTable() {
  FlowTable table(FlowTableConfig{.capacity = 100});
  EXPECT_EQ(table.bucketCount(), 32u);
  return table;
}

// The model: a map from fingerprint to entry, with the same states, timeouts
// and transitions, and 64-bit time (no wrap-around to worry about).
class Oracle {
 public:
  explicit Oracle(const FlowTimeouts& timeouts) : timeouts_(timeouts) {}

  std::uint32_t lookup(std::uint64_t hash, Millis now, std::optional<std::uint8_t> tcpFlags,
                       bool payload = false) {
    auto it = map_.find(key(hash));
    if (it == map_.end()) return 0;
    Entry& e = it->second;
    if (!live(e, now)) {
      map_.erase(it);
      return 0;
    }
    e.stamp = now;
    if (tcpFlags && isTcp(e.state)) {
      const std::uint8_t f = *tcpFlags;
      const bool wasOpen = e.state == FlowState::Established || e.state == FlowState::Ending;
      if (f & (kTcpFin | kTcpRst)) {
        e.state = wasOpen ? FlowState::Ending : FlowState::Closing;
      } else if (f & kTcpSyn) {
        if (e.state == FlowState::Closing) e.state = FlowState::Embryonic;
      } else if (e.state == FlowState::Embryonic) {
        e.state = FlowState::Established;
      } else if (payload) {
        e.state = FlowState::Established;
      }
    }
    return e.backend;
  }

  InsertResult insert(std::uint64_t hash, std::uint32_t backend, FlowState state, Millis now) {
    auto it = map_.find(key(hash));
    const bool wasLive = it != map_.end() && live(it->second, now);
    map_[key(hash)] = Entry{backend, state, now};
    return wasLive ? InsertResult::Updated : InsertResult::Inserted;
  }

  // When the entry for `hash` stops being live (its last live millisecond).
  std::optional<Millis> deadline(std::uint64_t hash) const {
    auto it = map_.find(key(hash));
    if (it == map_.end()) return std::nullopt;
    return it->second.stamp + timeout(it->second.state);
  }

  bool updateBackend(std::uint64_t hash, std::uint32_t backend, Millis now) {
    auto it = map_.find(key(hash));
    if (it == map_.end() || !live(it->second, now)) return false;
    it->second.backend = backend;
    return true;
  }

  // True when a live entry was erased.
  bool erase(std::uint64_t hash, Millis now) {
    auto it = map_.find(key(hash));
    if (it == map_.end()) return false;
    const bool wasLive = live(it->second, now);
    map_.erase(it);
    return wasLive;
  }

  std::size_t liveCount(Millis now) const {
    return static_cast<std::size_t>(std::count_if(
        map_.begin(), map_.end(), [&](const auto& kv) { return live(kv.second, now); }));
  }

  // What countByBackend counts: live, but not an Ending flow silent past
  // the closing timeout.
  std::size_t countedCount(Millis now) const {
    return static_cast<std::size_t>(std::count_if(
        map_.begin(), map_.end(), [&](const auto& kv) { return counted(kv.second, now); }));
  }
  std::vector<std::uint32_t> countByBackend(std::size_t size, Millis now) const {
    std::vector<std::uint32_t> counts(size, 0);
    for (const auto& [k, e] : map_) {
      if (counted(e, now) && e.backend < size) ++counts[e.backend];
    }
    return counts;
  }

 private:
  struct Entry {
    std::uint32_t backend;
    FlowState state;
    Millis stamp;
  };
  static std::uint64_t key(std::uint64_t hash) { return hash == 0 ? 1 : hash; }
  static bool isTcp(FlowState s) {
    return s == FlowState::Embryonic || s == FlowState::Established || s == FlowState::Closing ||
           s == FlowState::Ending;
  }
  Millis timeout(FlowState s) const {
    switch (s) {
      case FlowState::Embryonic:
        return timeouts_.embryonic;
      case FlowState::Established:
      case FlowState::Ending:
        return timeouts_.established;
      case FlowState::Closing:
        return timeouts_.closing;
      case FlowState::Udp:
        return timeouts_.udp;
      case FlowState::Other:
        return timeouts_.other;
    }
    return 0;
  }
  bool live(const Entry& e, Millis now) const { return now - e.stamp <= timeout(e.state); }
  bool counted(const Entry& e, Millis now) const {
    return live(e, now) && !(e.state == FlowState::Ending && now - e.stamp > timeouts_.closing);
  }

  FlowTimeouts timeouts_;
  std::unordered_map<std::uint64_t, Entry> map_;
};

TEST(FlowTable, DifferentialAgainstUnorderedMapOracle) {
  const FlowTimeouts timeouts{};
  // 20k keys in 131072 slots: at most 15% load, so no insert may fail.
  FlowTable table(FlowTableConfig{.capacity = 65'536, .timeouts = timeouts});
  ASSERT_EQ(table.slotCount(), 131'072u);
  Oracle oracle(timeouts);
  std::mt19937_64 rng(0x5eed'f10e'7ab1eULL);

  std::vector<std::uint64_t> keys = {0, 1};  // alias each other: both are fingerprint 1
  for (std::uint32_t i = 0; i < 100; ++i) {  // both candidates in one bucket
    const std::uint64_t low = rng() & 0xffff'ffffULL;
    keys.push_back((low << 32) | low);
  }
  while (keys.size() < 20'000) keys.push_back(rng());

  const std::vector<std::uint8_t> flagChoices = {kTcpSyn,           kTcpSyn | kTcpAck, kTcpAck,
                                                 kTcpPsh | kTcpAck, kTcpFin | kTcpAck, kTcpRst,
                                                 kTcpRst | kTcpAck, kTcpSyn | kTcpFin, 0};
  const std::vector<FlowState> states = {FlowState::Embryonic, FlowState::Established,
                                         FlowState::Closing,   FlowState::Udp,
                                         FlowState::Other,     FlowState::Ending};
  // Steps that land exactly on, and one past, every timeout.
  const std::vector<Millis> boundaries = {
      timeouts.embryonic,   timeouts.embryonic + 1,  timeouts.closing, timeouts.closing + 1,
      timeouts.udp,         timeouts.udp + 1,        timeouts.other,   timeouts.other + 1,
      timeouts.established, timeouts.established + 1};

  // Half the operations go to 64 hot keys, so entries are hit while live.
  auto pickKey = [&] { return keys[rng() % (rng() % 2 == 0 ? 64 : keys.size())]; };
  auto pickBackend = [&]() -> std::uint32_t {
    return rng() % 10 == 0 ? 1 + static_cast<std::uint32_t>(rng() % FlowTable::kMaxBackend)
                           : 1 + static_cast<std::uint32_t>(rng() % 64);
  };

  // Start just below a 2^32 boundary so the 32-bit stamps wrap during the run.
  Millis now = kTwoPow32 - 10 * kSecond;
  // A full sweep pass every 256 operations; an operation advances time by at
  // most 8000 s, so no entry goes unswept for 2^32 ms.
  const std::size_t sweepPerOp = table.bucketCount() / 256;
  constexpr int kOps = 1'000'000;
  std::uint64_t lookups = 0;
  std::uint64_t hits = 0;
  std::uint64_t updates = 0;
  std::uint64_t inserts = 0;
  std::vector<std::uint64_t> batch;
  std::vector<FlowEvent> events;
  std::vector<std::uint32_t> out;

  for (int op = 0; op < kOps; ++op) {
    const unsigned advance = rng() % 10'000;  // below 7000: same millisecond
    if (advance >= 9'999) {
      now += rng() % (8'000 * kSecond);
    } else if (advance >= 9'989) {
      now += boundaries[rng() % boundaries.size()];
    } else if (advance >= 9'959) {
      // Jump to the last live millisecond of a hot entry, or one past it,
      // and look it up there.
      const std::uint64_t h = keys[rng() % 64];
      if (const auto last = oracle.deadline(h); last && *last >= now) {
        now = *last + rng() % 2;
        const std::uint8_t f = flagChoices[rng() % flagChoices.size()];
        const bool data = rng() % 2 == 0;
        const std::uint32_t expected = oracle.lookup(h, now, f, data);
        ASSERT_EQ(table.lookupAndTouch(h, now, FlowEvent{f, data}), expected) << "op " << op;
        ++lookups;
        hits += expected != 0;
      }
    } else if (advance >= 9'889) {
      now += rng() % (12 * kSecond);
    } else if (advance >= 7'000) {
      now += rng() % 50;
    }

    const unsigned kind = rng() % 100;
    if (kind < 30) {
      const std::uint64_t h = pickKey();
      const std::uint8_t f = flagChoices[rng() % flagChoices.size()];
      const bool data = rng() % 2 == 0;
      const std::uint32_t expected = oracle.lookup(h, now, f, data);
      ASSERT_EQ(table.lookupAndTouch(h, now, FlowEvent{f, data}), expected) << "op " << op;
      ++lookups;
      hits += expected != 0;
    } else if (kind < 45) {
      const std::uint64_t h = pickKey();
      const std::uint32_t expected = oracle.lookup(h, now, std::nullopt);
      ASSERT_EQ(table.lookup(h, now), expected) << "op " << op;
      ++lookups;
      hits += expected != 0;
    } else if (kind < 75) {
      const std::uint64_t h = pickKey();
      const std::uint32_t backend = pickBackend();
      const FlowState state = states[rng() % states.size()];
      const InsertResult expected = oracle.insert(h, backend, state, now);
      ASSERT_EQ(table.insert(h, backend, state, now), expected) << "op " << op;
      (expected == InsertResult::Updated ? updates : inserts) += 1;
    } else if (kind < 82) {
      const std::uint64_t h = pickKey();
      const std::uint32_t backend = pickBackend();
      ASSERT_EQ(table.updateBackend(h, backend, now), oracle.updateBackend(h, backend, now))
          << "op " << op;
    } else if (kind < 88) {
      const std::uint64_t h = pickKey();
      // A live entry must be erased; an expired one may still hold its slot.
      if (oracle.erase(h, now)) {
        ASSERT_TRUE(table.erase(h)) << "op " << op;
      } else {
        (void)table.erase(h);
      }
    } else if (kind < 94) {
      const std::size_t n = 1 + rng() % 40;
      const bool withTcp = rng() % 2 == 0;
      batch.resize(n);
      events.resize(n);
      out.assign(n, 0xdead'beef);
      for (std::size_t i = 0; i < n; ++i) {
        batch[i] = pickKey();
        events[i] = FlowEvent{flagChoices[rng() % flagChoices.size()], rng() % 2 == 0};
      }
      if (withTcp) {
        table.lookupAndTouchBatch(batch, events, out, now);
      } else {
        table.lookupBatch(batch, out, now);
      }
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t expected =
            oracle.lookup(batch[i], now, withTcp ? std::optional(events[i].tcpFlags) : std::nullopt,
                          events[i].payload);
        ASSERT_EQ(out[i], expected) << "op " << op << " batch item " << i;
        hits += expected != 0;
      }
      lookups += n;
    } else if (kind < 99) {
      // Lookups of keys never inserted.
      const std::uint64_t h = rng() | (std::uint64_t{1} << 63);
      const std::uint32_t expected = oracle.lookup(h, now, std::nullopt);
      ASSERT_EQ(table.lookup(h, now), expected);
      ++lookups;
      hits += expected != 0;
    } else {
      const std::size_t n = rng() % 3 == 0 ? table.bucketCount() : rng() % 64;
      table.sweep(now, n);
      if (n == table.bucketCount()) {
        ASSERT_EQ(table.counters().occupancy, oracle.liveCount(now)) << "op " << op;
        std::vector<std::uint32_t> counts(65, 0);
        ASSERT_EQ(table.countByBackend(counts, now), oracle.countedCount(now));
        ASSERT_EQ(counts, oracle.countByBackend(65, now)) << "op " << op;
      }
    }
    table.sweep(now, sweepPerOp);
  }

  table.sweep(now, table.bucketCount());
  EXPECT_EQ(table.counters().occupancy, oracle.liveCount(now));
  const FlowTableCounters& c = table.counters();
  EXPECT_EQ(c.insertFailures, 0u);
  EXPECT_EQ(c.embryonicRejected, 0u);
  EXPECT_EQ(c.evictions, 0u);
  EXPECT_EQ(c.lookups, lookups);
  EXPECT_EQ(c.hits, hits);
  EXPECT_EQ(c.inserts, inserts);
  EXPECT_EQ(c.updates, updates);
  EXPECT_GT(c.expiredReclaimed, 0u);
  EXPECT_GT(hits, lookups / 8);  // the run exercises hits, not only misses
}

// Near-full table: inserts relocate entries and sometimes fail. Only states
// that no insert may evict are used, so the oracle knows every entry's fate.
TEST(FlowTable, DifferentialAtHighLoadWithRelocationsAndFailures) {
  const FlowTimeouts timeouts{};
  FlowTable table(FlowTableConfig{.capacity = 1'024, .timeouts = timeouts});
  ASSERT_EQ(table.slotCount(), 2'048u);
  Oracle oracle(timeouts);
  std::mt19937_64 rng(0xc0ffee);
  std::vector<std::uint64_t> keys;
  while (keys.size() < 3'000) keys.push_back(rng());
  const std::vector<FlowState> states = {FlowState::Established, FlowState::Udp, FlowState::Other};
  Millis now = 0;
  std::uint64_t failures = 0;
  std::size_t peakLive = 0;
  for (int op = 0; op < 300'000; ++op) {
    const unsigned advance = rng() % 10'000;
    if (advance >= 9'990) {
      now += rng() % (400 * kSecond);
    } else if (advance >= 9'000) {
      now += rng() % 100;
    }
    const std::uint64_t h = keys[rng() % keys.size()];
    const unsigned kind = rng() % 100;
    if (kind < 45) {
      const auto backend = static_cast<std::uint32_t>(1 + rng() % 100);
      const FlowState state = states[rng() % states.size()];
      const InsertResult r = table.insert(h, backend, state, now);
      if (r == InsertResult::Full) {
        ++failures;
        ASSERT_FALSE(oracle.deadline(h) && *oracle.deadline(h) >= now) << "op " << op;
        (void)oracle.erase(h, now);
      } else {
        ASSERT_EQ(r, oracle.insert(h, backend, state, now)) << "op " << op;
      }
    } else if (kind < 90) {
      const std::uint8_t f = rng() % 2 == 0 ? kTcpAck : kTcpPsh | kTcpAck;
      ASSERT_EQ(table.lookupAndTouch(h, now, tcp(f)), oracle.lookup(h, now, f)) << "op " << op;
    } else if (kind < 94) {
      if (oracle.erase(h, now)) {
        ASSERT_TRUE(table.erase(h)) << "op " << op;
      } else {
        (void)table.erase(h);
      }
    } else {
      table.sweep(now, table.bucketCount());
      ASSERT_EQ(table.counters().occupancy, oracle.liveCount(now)) << "op " << op;
      peakLive = std::max(peakLive, oracle.liveCount(now));
    }
    table.sweep(now, 4);
  }
  EXPECT_EQ(table.counters().insertFailures, failures);
  EXPECT_EQ(table.counters().evictions, 0u);
  EXPECT_GT(table.counters().relocations, 0u);
  EXPECT_GT(peakLive, table.slotCount() * 85 / 100);
}

TEST(FlowTable, FullCandidateBucketsFailAndAreCounted) {
  FlowTable table = smallTable();
  const Millis t0 = 1'000;
  std::vector<std::uint64_t> flows;
  for (std::uint32_t tag = 1; tag <= 8; ++tag) {
    flows.push_back(craftedHash(3, 17, tag));
    ASSERT_EQ(table.insert(flows.back(), tag, FlowState::Established, t0), InsertResult::Inserted);
  }
  EXPECT_EQ(table.counters().occupancy, 8u);

  // Every entry of buckets 3 and 17 has its other candidate in the pair, so
  // nothing can move out of the way.
  EXPECT_EQ(table.insert(craftedHash(3, 17, 100), 9, FlowState::Established, t0),
            InsertResult::Full);
  EXPECT_EQ(table.insert(craftedHash(17, 3, 101), 9, FlowState::Udp, t0), InsertResult::Full);
  EXPECT_EQ(table.insert(craftedHash(3, 17, 102), 9, FlowState::Embryonic, t0),
            InsertResult::FullEmbryonic);
  EXPECT_EQ(table.insert(craftedHash(3, 17, 103), 9, FlowState::Closing, t0), InsertResult::Full);
  EXPECT_EQ(table.counters().insertFailures, 4u);
  EXPECT_EQ(table.counters().embryonicRejected, 1u);
  EXPECT_EQ(table.counters().evictions, 0u);
  EXPECT_EQ(table.counters().relocations, 0u);
  for (std::uint32_t i = 0; i < flows.size(); ++i) EXPECT_EQ(table.lookup(flows[i], t0), i + 1);
  EXPECT_EQ(table.lookup(craftedHash(3, 17, 100), t0), 0u);
  EXPECT_EQ(table.counters().occupancy, 8u);

  // An update of a present flow needs no free slot.
  EXPECT_EQ(table.insert(flows[0], 42, FlowState::Established, t0), InsertResult::Updated);
  EXPECT_EQ(table.lookup(flows[0], t0), 42u);
}

TEST(FlowTable, ExpiredSlotsOfFullBucketsAreReused) {
  FlowTable table = smallTable();
  const Millis t0 = 50'000;
  for (std::uint32_t tag = 1; tag <= 8; ++tag) {
    const FlowState state = tag <= 2 ? FlowState::Udp : FlowState::Established;
    ASSERT_EQ(table.insert(craftedHash(5, 9, tag), tag, state, t0), InsertResult::Inserted);
  }
  const std::uint64_t newcomer = craftedHash(5, 9, 50);
  EXPECT_EQ(table.insert(newcomer, 77, FlowState::Embryonic, t0 + table.timeouts().udp),
            InsertResult::FullEmbryonic);
  // One millisecond later both Udp entries have expired: their slots serve
  // new flows, even Embryonic ones, and the occupancy does not grow.
  const Millis t1 = t0 + table.timeouts().udp + 1;
  EXPECT_EQ(table.insert(newcomer, 77, FlowState::Embryonic, t1), InsertResult::Inserted);
  EXPECT_EQ(table.insert(craftedHash(9, 5, 51), 78, FlowState::Established, t1),
            InsertResult::Inserted);
  EXPECT_EQ(table.counters().occupancy, 8u);
  EXPECT_EQ(table.counters().expiredReclaimed, 2u);
  EXPECT_EQ(table.counters().evictions, 0u);
  EXPECT_EQ(table.lookup(craftedHash(5, 9, 1), t1), 0u);
  EXPECT_EQ(table.lookup(craftedHash(5, 9, 2), t1), 0u);
  EXPECT_EQ(table.lookup(newcomer, t1), 77u);
  for (std::uint32_t tag = 3; tag <= 8; ++tag) {
    EXPECT_EQ(table.lookup(craftedHash(5, 9, tag), t1), tag);
  }
}

TEST(FlowTable, SharedCandidateBucketHoldsFour) {
  FlowTable table = smallTable();
  for (std::uint32_t tag = 1; tag <= 4; ++tag) {
    ASSERT_EQ(table.insert(craftedHash(7, 7, tag), tag, FlowState::Established, 0),
              InsertResult::Inserted);
  }
  EXPECT_EQ(table.insert(craftedHash(7, 7, 5), 5, FlowState::Established, 0), InsertResult::Full);
  for (std::uint32_t tag = 1; tag <= 4; ++tag)
    EXPECT_EQ(table.lookup(craftedHash(7, 7, tag), 0), tag);
}

TEST(FlowTable, FullPairMakesRoomByMovingAnEntryToItsOtherBucket) {
  FlowTable table = smallTable();
  std::vector<std::pair<std::uint64_t, std::uint32_t>> flows;
  auto add = [&](std::uint32_t first, std::uint32_t second, std::uint32_t tag, FlowState state) {
    const std::uint64_t h = craftedHash(first, second, tag);
    ASSERT_EQ(table.insert(h, tag, state, 0), InsertResult::Inserted);
    flows.emplace_back(h, tag);
  };
  // Bucket 1 holds entries whose other buckets are 10..13 (empty); bucket 2
  // holds entries that cannot move (both candidates are bucket 2).
  for (std::uint32_t i = 0; i < 4; ++i) add(1, 10 + i, 1 + i, FlowState::Established);
  for (std::uint32_t i = 0; i < 4; ++i) add(2, 2, 5 + i, FlowState::Established);

  add(1, 2, 100, FlowState::Embryonic);
  EXPECT_EQ(table.counters().relocations, 1u);
  EXPECT_EQ(table.counters().insertFailures, 0u);
  for (const auto& [h, backend] : flows) EXPECT_EQ(table.lookup(h, 0), backend);
}

TEST(FlowTable, RelocationLooksTwoMovesDeepExceptForEmbryonicInserts) {
  FlowTable table = smallTable();
  std::vector<std::pair<std::uint64_t, std::uint32_t>> flows;
  auto add = [&](std::uint32_t first, std::uint32_t second, std::uint32_t tag) {
    const std::uint64_t h = craftedHash(first, second, tag);
    ASSERT_EQ(table.insert(h, tag, FlowState::Established, 0), InsertResult::Inserted);
    flows.emplace_back(h, tag);
  };
  // Buckets 10..13 are full of entries that may move to 20..23; bucket 1 is
  // full of entries whose other buckets are 10..13; bucket 2 cannot move.
  std::uint32_t tag = 1;
  for (std::uint32_t i = 0; i < 4; ++i) {
    for (std::uint32_t j = 0; j < 4; ++j) add(10 + i, 20 + i, tag++);
  }
  for (std::uint32_t i = 0; i < 4; ++i) add(1, 10 + i, tag++);
  for (std::uint32_t i = 0; i < 4; ++i) add(2, 2, tag++);

  EXPECT_EQ(table.insert(craftedHash(1, 2, 900), 900, FlowState::Embryonic, 0),
            InsertResult::FullEmbryonic);
  EXPECT_EQ(table.counters().relocations, 0u);
  EXPECT_EQ(table.insert(craftedHash(1, 2, 901), 901, FlowState::Established, 0),
            InsertResult::Inserted);
  flows.emplace_back(craftedHash(1, 2, 901), 901);
  EXPECT_EQ(table.counters().relocations, 2u);
  EXPECT_EQ(table.counters().evictions, 0u);
  for (const auto& [h, backend] : flows) EXPECT_EQ(table.lookup(h, 0), backend);
  EXPECT_EQ(table.counters().occupancy, flows.size());
}

TEST(FlowTable, SynFloodNeverDisplacesEstablishedFlows) {
  FlowTable table(FlowTableConfig{.capacity = 4'096});
  std::mt19937_64 rng(7);
  Millis now = 1'000'000;
  std::vector<std::pair<std::uint64_t, std::uint32_t>> established;
  // Fill to 95% of the slots with established flows.
  while (table.counters().occupancy < table.slotCount() * 95 / 100) {
    const std::uint64_t h = rng();
    const auto backend = static_cast<std::uint32_t>(1 + rng() % 1000);
    if (table.insert(h, backend, FlowState::Established, now) == InsertResult::Inserted) {
      established.emplace_back(h, backend);
    }
  }
  const std::uint64_t failuresBeforeFlood = table.counters().insertFailures;

  // 200k SYNs over 200 s: new embryonic entries take the free slots (and the
  // slots of SYNs that expired), the rest are rejected.
  std::uint64_t rejected = 0;
  for (int i = 0; i < 200'000; ++i) {
    now += 1;
    const InsertResult r = table.insert(rng(), 1, FlowState::Embryonic, now);
    ASSERT_TRUE(r == InsertResult::Inserted || r == InsertResult::FullEmbryonic);
    rejected += r == InsertResult::FullEmbryonic;
  }
  EXPECT_GT(rejected, 0u);
  EXPECT_EQ(table.counters().embryonicRejected, rejected);
  EXPECT_EQ(table.counters().insertFailures, failuresBeforeFlood + rejected);
  EXPECT_EQ(table.counters().evictions, 0u);
  for (const auto& [h, backend] : established) ASSERT_EQ(table.lookup(h, now), backend);
}

TEST(FlowTable, SynFloodModeSkipsTheRelocationStepUntilRoomAppears) {
  FlowTable table(FlowTableConfig{.capacity = 1'024});
  std::mt19937_64 rng(11);
  const Millis now = 1'000'000;
  std::vector<std::uint64_t> tracked;
  auto syn = [&](Millis at) {
    const std::uint64_t h = rng();
    const InsertResult r = table.insert(h, 1, FlowState::Embryonic, at);
    if (r == InsertResult::Inserted) tracked.push_back(h);
    return r;
  };
  // A table full of handshakes: embryonic inserts until 16 in a row fail
  // (the first time the mode can start), then until 200 in a row fail.
  int streak = 0;
  EXPECT_EQ(table.counters().synFlood, 0u);
  while (streak < 16) streak = syn(now) == InsertResult::FullEmbryonic ? streak + 1 : 0;
  EXPECT_EQ(table.counters().relocationsSkipped, 0u);  // not before the streak
  EXPECT_EQ(table.counters().synFlood, 1u);            // the mode, as metrics show it
  while (streak < 200) streak = syn(now) == InsertResult::FullEmbryonic ? streak + 1 : 0;

  // Flood mode: most rejected SYNs skip the cuckoo step. They are still
  // rejected and counted, and every tracked handshake stays where it is.
  const std::uint64_t skippedBefore = table.counters().relocationsSkipped;
  const std::uint64_t rejectedBefore = table.counters().embryonicRejected;
  for (int i = 0; i < 3'200; ++i) {
    const InsertResult r = syn(now);
    ASSERT_TRUE(r == InsertResult::Inserted || r == InsertResult::FullEmbryonic);
  }
  const std::uint64_t rejected = table.counters().embryonicRejected - rejectedBefore;
  const std::uint64_t skipped = table.counters().relocationsSkipped - skippedBefore;
  EXPECT_GT(rejected, 3'000u);
  EXPECT_GT(skipped, rejected * 8 / 10);
  EXPECT_LE(skipped, rejected);
  for (const std::uint64_t h : tracked) ASSERT_EQ(table.lookup(h, now), 1u);

  // Established flows always get the full search (and may evict embryonic).
  const std::uint64_t skippedNow = table.counters().relocationsSkipped;
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(table.insert(rng(), 2, FlowState::Established, now), InsertResult::Inserted);
  }
  EXPECT_EQ(table.counters().relocationsSkipped, skippedNow);

  // Once the handshakes expire there is room again: new SYNs are tracked,
  // and the mode is over: the next rejections try the relocation step again
  // (a mode that never ended would skip them).
  const Millis later = now + table.timeouts().embryonic + 1;
  for (int i = 0; i < 200; ++i) EXPECT_EQ(syn(later), InsertResult::Inserted);
  EXPECT_EQ(table.counters().synFlood, 0u);
  const std::uint64_t skippedAfterRoom = table.counters().relocationsSkipped;
  const std::uint64_t rejectedAfterRoom = table.counters().embryonicRejected;
  while (table.counters().embryonicRejected < rejectedAfterRoom + 8) (void)syn(later);
  EXPECT_EQ(table.counters().relocationsSkipped, skippedAfterRoom);
}

// A table that stays nearly full (room freed one slot at a time, taken at
// once) keeps the mode: a lone insert that finds room does not end it. Ending
// it there made the next 16 rejected SYNs each pay the full relocation
// search before the mode came back (#16: the memif bench's SYN rate with a
// full table). Room in several inserts in a row ends it.
TEST(FlowTable, SynFloodModeOutlastsLoneFreeSlots) {
  FlowTable table(FlowTableConfig{.capacity = 1'024});
  std::mt19937_64 rng(12);
  const Millis now = 1'000'000;
  std::vector<std::uint64_t> tracked;
  auto syn = [&](std::uint64_t h) {
    const InsertResult r = table.insert(h, 1, FlowState::Embryonic, now);
    if (r == InsertResult::Inserted) tracked.push_back(h);
    return r;
  };
  int streak = 0;
  while (streak < 16) streak = syn(rng()) == InsertResult::FullEmbryonic ? streak + 1 : 0;
  ASSERT_EQ(table.counters().synFlood, 1u);

  const std::uint64_t skippedBefore = table.counters().relocationsSkipped;
  const std::uint64_t rejectedBefore = table.counters().embryonicRejected;
  for (int round = 0; round < 100; ++round) {
    // One handshake ends (its slot is free) and a new one takes that room...
    const std::uint64_t gone = tracked[static_cast<std::size_t>(round)];
    ASSERT_TRUE(table.erase(gone));
    ASSERT_EQ(syn(gone), InsertResult::Inserted);
    // ...then the flood goes on.
    for (int i = 0; i < 31; ++i) (void)syn(rng());
    ASSERT_EQ(table.counters().synFlood, 1u) << "round " << round;
  }
  const std::uint64_t rejected = table.counters().embryonicRejected - rejectedBefore;
  const std::uint64_t skipped = table.counters().relocationsSkipped - skippedBefore;
  EXPECT_GT(rejected, 2'900u);
  // Every rejected SYN but the 1-in-32 probes skips the relocation step
  // (ending the mode at each freed slot: about half of them).
  EXPECT_GT(skipped, rejected * 9 / 10);

  // Four inserts in a row that find room in their own buckets end it.
  for (int i = 0; i < 4; ++i) {
    const std::uint64_t gone = tracked[static_cast<std::size_t>(200 + i)];
    ASSERT_TRUE(table.erase(gone));
    ASSERT_EQ(syn(gone), InsertResult::Inserted);
  }
  EXPECT_EQ(table.counters().synFlood, 0u);
}

TEST(FlowTable, NewEstablishedFlowEvictsTheOldestEmbryonicOrClosingEntry) {
  FlowTable table = smallTable();
  const Millis t0 = 10'000;
  std::vector<std::uint64_t> kept;
  for (std::uint32_t tag = 1; tag <= 4; ++tag) {
    kept.push_back(craftedHash(4, 6, tag));
    ASSERT_EQ(table.insert(kept.back(), tag, FlowState::Established, t0), InsertResult::Inserted);
  }
  // Four half-open or closing entries, the Closing one (tag 12) the oldest.
  const std::uint64_t closing = craftedHash(4, 6, 12);
  ASSERT_EQ(table.insert(craftedHash(4, 6, 11), 11, FlowState::Embryonic, t0 + 300),
            InsertResult::Inserted);
  ASSERT_EQ(table.insert(closing, 12, FlowState::Closing, t0 + 100), InsertResult::Inserted);
  ASSERT_EQ(table.insert(craftedHash(4, 6, 13), 13, FlowState::Embryonic, t0 + 200),
            InsertResult::Inserted);
  ASSERT_EQ(table.insert(craftedHash(4, 6, 14), 14, FlowState::Embryonic, t0 + 400),
            InsertResult::Inserted);
  const Millis t1 = t0 + 1'000;

  // A new SYN may not push anything out.
  EXPECT_EQ(table.insert(craftedHash(4, 6, 20), 20, FlowState::Embryonic, t1),
            InsertResult::FullEmbryonic);
  // A new established flow pushes out the oldest evictable entry.
  EXPECT_EQ(table.insert(craftedHash(4, 6, 21), 21, FlowState::Established, t1),
            InsertResult::Inserted);
  EXPECT_EQ(table.counters().evictions, 1u);
  EXPECT_EQ(table.lookup(closing, t1), 0u);
  // Then the oldest embryonic one (tag 13), for a new UDP flow.
  EXPECT_EQ(table.insert(craftedHash(4, 6, 22), 22, FlowState::Udp, t1), InsertResult::Inserted);
  EXPECT_EQ(table.counters().evictions, 2u);
  EXPECT_EQ(table.lookup(craftedHash(4, 6, 13), t1), 0u);
  EXPECT_EQ(table.lookup(craftedHash(4, 6, 11), t1), 11u);
  EXPECT_EQ(table.lookup(craftedHash(4, 6, 14), t1), 14u);
  // With only established entries left to push out, it fails.
  EXPECT_EQ(table.insert(craftedHash(4, 6, 23), 23, FlowState::Other, t1), InsertResult::Inserted);
  EXPECT_EQ(table.insert(craftedHash(4, 6, 24), 24, FlowState::Established, t1),
            InsertResult::Inserted);
  EXPECT_EQ(table.insert(craftedHash(4, 6, 25), 25, FlowState::Established, t1),
            InsertResult::Full);
  EXPECT_EQ(table.counters().evictions, 4u);
  for (std::uint32_t i = 0; i < kept.size(); ++i) EXPECT_EQ(table.lookup(kept[i], t1), i + 1);
  EXPECT_EQ(table.counters().occupancy, 8u);
}

TEST(FlowTable, IdleEstablishedFlowLivesForItsWholeTimeout) {
  FlowTable table(FlowTableConfig{.capacity = 1'024});
  const Millis timeout = table.timeouts().established;
  ASSERT_EQ(timeout, 7'200 * kSecond);
  const std::uint64_t h = 0x1234'5678'9abc'def0ULL;
  Millis now = 123'456;
  ASSERT_EQ(table.insert(h, 3, FlowState::Established, now), InsertResult::Inserted);
  // Sweeps every 10 minutes of idle time do not touch it.
  for (Millis t = now; t <= now + timeout; t += 600 * kSecond) {
    EXPECT_EQ(table.sweep(t, table.bucketCount()), 0u);
  }
  EXPECT_EQ(table.lookup(h, now + timeout), 3u);  // idle exactly the timeout: still live
  now += timeout;
  EXPECT_EQ(table.sweep(now + timeout, table.bucketCount()), 0u);
  EXPECT_EQ(table.sweep(now + timeout + 1, table.bucketCount()), 1u);
  EXPECT_EQ(table.counters().occupancy, 0u);
  EXPECT_EQ(table.lookup(h, now + timeout + 1), 0u);

  // Lazy expiry without a sweep.
  ASSERT_EQ(table.insert(h, 4, FlowState::Established, now), InsertResult::Inserted);
  EXPECT_EQ(table.lookup(h, now + timeout + 1), 0u);
  EXPECT_EQ(table.counters().occupancy, 0u);
}

TEST(FlowTable, StampsWrapAroundTwoPow32Milliseconds) {
  FlowTable table(FlowTableConfig{.capacity = 1'024});
  const std::uint64_t h = 0xfeed'face'cafe'beefULL;
  const Millis start = 7 * kTwoPow32 - 1'000;
  ASSERT_EQ(table.insert(h, 9, FlowState::Embryonic, start), InsertResult::Inserted);
  const Millis later = start + table.timeouts().embryonic;  // past the wrap of the low 32 bits
  ASSERT_LT(static_cast<std::uint32_t>(later), static_cast<std::uint32_t>(start));
  EXPECT_EQ(table.lookup(h, later), 9u);
  EXPECT_EQ(table.lookup(h, later + table.timeouts().embryonic + 1), 0u);
}

TEST(FlowTable, SweepKeepsEntriesIdleForTwoPow32MsFromComingBack) {
  FlowTable table(FlowTableConfig{.capacity = 1'024});
  std::mt19937_64 rng(11);
  std::vector<std::uint64_t> flows;
  const Millis start = 5'000;
  for (int i = 0; i < 500; ++i) {
    flows.push_back(rng());
    ASSERT_EQ(table.insert(flows.back(), 1, FlowState::Established, start), InsertResult::Inserted);
  }
  // An idle poll that sweeps 8 buckets an hour covers the table in 8 days.
  for (Millis t = start; t <= start + kTwoPow32 + 10; t += 3'600 * kSecond) table.sweep(t, 8);
  const Millis wrapped = start + kTwoPow32 + 10;  // stamp age reads 10 ms in 32 bits
  EXPECT_EQ(table.counters().occupancy, 0u);
  for (std::uint64_t h : flows) ASSERT_EQ(table.lookup(h, wrapped), 0u);
}

TEST(FlowTable, IncrementalSweepVisitsBucketsRoundRobin) {
  FlowTable table = smallTable();
  for (std::uint32_t b = 0; b < 32; ++b) {
    ASSERT_EQ(table.insert(craftedHash(b, b, 1), 1, FlowState::Closing, 0), InsertResult::Inserted);
  }
  const Millis later = table.timeouts().closing + 1;
  EXPECT_EQ(table.sweep(later, 10), 10u);
  EXPECT_EQ(table.sweep(later, 10), 10u);
  EXPECT_EQ(table.sweep(later, 100), 12u);  // at most one pass
  EXPECT_EQ(table.counters().occupancy, 0u);
  EXPECT_EQ(table.counters().expiredReclaimed, 32u);
}

TEST(FlowTable, TcpTransitions) {
  FlowTable table(FlowTableConfig{.capacity = 1'024});
  const FlowTimeouts& to = table.timeouts();
  const std::uint64_t h = 42;
  Millis now = 1'000;
  ASSERT_EQ(table.insert(h, 5, FlowState::Embryonic, now), InsertResult::Inserted);
  // A retransmitted SYN keeps it embryonic: it expires after the embryonic timeout.
  EXPECT_EQ(table.lookupAndTouch(h, now, tcp(kTcpSyn)), 5u);
  EXPECT_EQ(table.lookupAndTouch(h, now + to.embryonic + 1, tcp(kTcpAck)), 0u);

  ASSERT_EQ(table.insert(h, 5, FlowState::Embryonic, now), InsertResult::Inserted);
  EXPECT_EQ(table.lookupAndTouch(h, now, tcp(kTcpAck)), 5u);  // -> Established
  now += to.embryonic + 1;
  EXPECT_EQ(table.lookupAndTouch(h, now, tcp(kTcpSyn)), 5u);  // SYN on Established: stays
  now += to.closing + 1;
  EXPECT_EQ(table.lookupAndTouch(h, now, tcp(kTcpFin | kTcpAck)), 5u);     // -> Ending
  EXPECT_EQ(table.lookupAndTouch(h, now + to.closing, tcp(kTcpAck)), 5u);  // stays Ending
  now += to.closing;
  EXPECT_EQ(stateOf(table, h, now), FlowState::Ending);
  // Ending keeps the established timeout (a FIN or RST may be forged).
  EXPECT_EQ(table.lookup(h, now + to.established), 5u);
  now += to.established;
  EXPECT_EQ(table.lookup(h, now + to.established + 1), 0u);

  // A handshake that ends before it completes closes for real (short), and
  // port reuse: a SYN on a Closing entry starts a new handshake.
  ASSERT_EQ(table.insert(h, 6, FlowState::Embryonic, now), InsertResult::Inserted);
  EXPECT_EQ(table.lookupAndTouch(h, now, tcp(kTcpRst)), 6u);
  EXPECT_EQ(stateOf(table, h, now), FlowState::Closing);
  EXPECT_EQ(table.lookupAndTouch(h, now, tcp(kTcpSyn)), 6u);  // -> Embryonic
  EXPECT_EQ(table.lookup(h, now + to.embryonic), 6u);
  now += to.embryonic;
  EXPECT_EQ(table.lookup(h, now + to.embryonic + 1), 0u);

  // Flags do not change UDP or Other entries.
  ASSERT_EQ(table.insert(h, 7, FlowState::Udp, now), InsertResult::Inserted);
  EXPECT_EQ(table.lookupAndTouch(h, now, tcp(kTcpFin)), 7u);
  EXPECT_EQ(table.lookup(h, now + to.udp), 7u);
}

// Issue #13: one spoofed RST or FIN (a blind attacker knows the 4-tuple, not
// the sequence numbers) must not cut an established flow's lifetime: an NCCL
// flow may go silent for minutes right after it.
TEST(FlowTable, SpoofedRstOrFinKeepsTheEstablishedLifetime) {
  FlowTable table(FlowTableConfig{.capacity = 1'024});
  const FlowTimeouts& to = table.timeouts();
  for (const std::uint8_t flags :
       {kTcpRst, std::uint8_t{kTcpRst | kTcpAck}, kTcpFin, std::uint8_t{kTcpFin | kTcpAck}}) {
    const std::uint64_t h = 1000 + flags;
    Millis now = 5'000;
    ASSERT_EQ(table.insert(h, 3, FlowState::Established, now), InsertResult::Inserted);
    EXPECT_EQ(table.lookupAndTouch(h, now, tcp(flags)), 3u);
    // Silent for the whole established timeout: still tracked.
    now += to.established;
    EXPECT_EQ(table.lookup(h, now), 3u) << int{flags};
    // A spoofed SYN after it does not shorten it either.
    EXPECT_EQ(table.lookupAndTouch(h, now, tcp(kTcpSyn)), 3u);
    EXPECT_EQ(table.lookup(h, now + to.established), 3u) << int{flags};
    // Data from the real client: established again.
    now += to.established;
    EXPECT_EQ(table.lookupAndTouch(h, now, tcpData(kTcpAck | kTcpPsh)), 3u);
    EXPECT_EQ(stateOf(table, h, now), FlowState::Established) << int{flags};
  }
}

// A real close: FIN, then the last ACK (no data), then silence. The entry
// keeps the established timeout (it cannot be told from a spoofed FIN), but
// yields its slot: at once to a new established/UDP/other flow, and to a new
// handshake once idle for the closing timeout.
TEST(FlowTable, ClosedFlowLingersButYieldsItsSlot) {
  FlowTable table = smallTable();
  const FlowTimeouts& to = table.timeouts();
  const Millis t0 = 50'000;
  std::vector<std::uint64_t> ended;
  for (std::uint32_t tag = 1; tag <= 8; ++tag) {
    ASSERT_EQ(table.insert(craftedHash(4, 6, tag), tag, FlowState::Established, t0),
              InsertResult::Inserted);
  }
  for (std::uint32_t tag = 1; tag <= 2; ++tag) {
    const std::uint64_t h = craftedHash(4, 6, tag);
    ASSERT_EQ(table.lookupAndTouch(h, t0 + tag, tcp(kTcpFin | kTcpAck)), tag);
    ASSERT_EQ(table.lookupAndTouch(h, t0 + tag, tcp(kTcpAck)), tag);  // last ACK: no data
    EXPECT_EQ(stateOf(table, h, t0 + tag), FlowState::Ending);
    ended.push_back(h);
  }
  // Both buckets full; a new handshake may not push a just-closed flow out.
  const Millis soon = t0 + to.closing;
  EXPECT_EQ(table.insert(craftedHash(4, 6, 20), 20, FlowState::Embryonic, soon),
            InsertResult::FullEmbryonic);
  EXPECT_EQ(table.lookup(ended[0], soon), 1u);  // (a hit: ended[0] is the younger now)
  // Idle past the closing timeout, the older closed flow yields to it.
  const Millis later = t0 + 2 + to.closing + 1;
  EXPECT_EQ(table.insert(craftedHash(4, 6, 21), 21, FlowState::Embryonic, later),
            InsertResult::Inserted);
  EXPECT_EQ(table.lookup(ended[1], later), 0u);
  // A new established or UDP flow takes the other at once.
  EXPECT_EQ(table.insert(craftedHash(4, 6, 22), 22, FlowState::Udp, later), InsertResult::Inserted);
  EXPECT_EQ(table.lookup(ended[0], later), 0u);
  EXPECT_EQ(table.counters().evictions, 2u);
  for (std::uint32_t tag = 3; tag <= 8; ++tag) {
    EXPECT_EQ(table.lookup(craftedHash(4, 6, tag), later), tag);
  }
}

// A closed flow lingers, but counts (what a drain waits for) leave it out
// once it has been silent past the closing timeout: a drain completes as
// soon after its flows' FINs as it did before Ending existed.
TEST(FlowTable, EndedFlowsLeaveTheCountsAfterTheClosingTimeout) {
  FlowTable table = smallTable();
  const FlowTimeouts& to = table.timeouts();
  const Millis t0 = 50'000;
  ASSERT_EQ(table.insert(craftedHash(1, 2, 1), 1, FlowState::Established, t0),
            InsertResult::Inserted);
  ASSERT_EQ(table.insert(craftedHash(1, 2, 2), 1, FlowState::Established, t0),
            InsertResult::Inserted);
  ASSERT_EQ(table.lookupAndTouch(craftedHash(1, 2, 1), t0, tcp(kTcpFin | kTcpAck)), 1u);
  std::array<std::uint32_t, 4> counts{};
  EXPECT_EQ(table.countByBackend(counts, t0 + to.closing), 2u);
  EXPECT_EQ(counts[1], 2u);
  counts = {};
  const Millis later = t0 + to.closing + 1;
  EXPECT_EQ(table.countByBackend(counts, later), 1u);
  EXPECT_EQ(counts[1], 1u);
  EXPECT_EQ(table.lookup(craftedHash(1, 2, 1), later), 1u);  // still steered to its backend
}

TEST(FlowTable, BatchLookupMatchesSingleLookups) {
  const FlowTableConfig config{.capacity = 50'000};
  FlowTable batched(config);
  FlowTable single(config);
  std::mt19937_64 rng(3);
  std::vector<std::uint64_t> present;
  Millis now = 0;
  for (int i = 0; i < 40'000; ++i) {
    const std::uint64_t h = rng();
    const auto backend = static_cast<std::uint32_t>(1 + rng() % 500);
    const auto state = static_cast<FlowState>(1 + rng() % 5);
    now += rng() % 20;
    ASSERT_EQ(batched.insert(h, backend, state, now), single.insert(h, backend, state, now));
    present.push_back(h);
  }
  const std::vector<std::uint8_t> flagChoices = {kTcpSyn, kTcpAck, kTcpFin, kTcpRst, 0};
  for (std::size_t n : {0u, 1u, 7u, 31u, 32u, 33u, 64u, 100u, 257u, 4'000u}) {
    for (bool withTcp : {false, true}) {
      now += rng() % 3'000;  // some Embryonic and Closing entries expire
      std::vector<std::uint64_t> hashes(n);
      std::vector<FlowEvent> events(n);
      for (std::size_t i = 0; i < n; ++i) {
        // Repeats within a batch are processed in order, like single calls.
        hashes[i] = rng() % 8 == 0 ? rng() : present[rng() % present.size()];
        if (i > 0 && rng() % 16 == 0) hashes[i] = hashes[i - 1];
        events[i] = tcp(flagChoices[rng() % flagChoices.size()]);
      }
      std::vector<std::uint32_t> out(n, 0xdead'beef);
      if (withTcp) {
        batched.lookupAndTouchBatch(hashes, events, out, now);
      } else {
        batched.lookupBatch(hashes, out, now);
      }
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t expected = withTcp ? single.lookupAndTouch(hashes[i], now, events[i])
                                               : single.lookup(hashes[i], now);
        ASSERT_EQ(out[i], expected) << "n " << n << " item " << i;
      }
    }
  }
  EXPECT_EQ(batched.counters().lookups, single.counters().lookups);
  EXPECT_EQ(batched.counters().hits, single.counters().hits);
  EXPECT_EQ(batched.counters().occupancy, single.counters().occupancy);
  EXPECT_GT(batched.counters().hits, 0u);
  std::vector<std::uint32_t> a(501, 0);
  std::vector<std::uint32_t> b(501, 0);
  EXPECT_EQ(batched.countByBackend(a, now), single.countByBackend(b, now));
  EXPECT_EQ(a, b);
}

TEST(FlowTable, MemoryPerFlowAtCapacity) {
  for (std::size_t capacity : {std::size_t{1'000'000}, std::size_t{10'000'000}}) {
    const double perFlow =
        static_cast<double>(FlowTable::memoryBytesFor(capacity)) / static_cast<double>(capacity);
    EXPECT_LE(perFlow, 64.0) << capacity;
    RecordProperty("bytes_per_flow_" + std::to_string(capacity), std::to_string(perFlow));
  }
  // 64 bytes a bucket and 4 x 8 bytes of identities beside it.
  EXPECT_EQ(FlowTable::memoryBytesFor(1'000'000), std::size_t{48} << 20);    // 2^19 buckets
  EXPECT_EQ(FlowTable::memoryBytesFor(10'000'000), std::size_t{384} << 20);  // 2^22 buckets
  // Any capacity: at most 64 bytes per flow (capacity 1: its one bucket, 96)
  // and at most 80% slot load.
  std::mt19937_64 rng(5);
  std::vector<std::size_t> capacities;
  for (std::size_t c = 1; c <= 4'096; ++c) capacities.push_back(c);
  for (int shift = 12; shift <= 33; ++shift) {
    for (std::size_t delta : {std::size_t{0}, std::size_t{1}}) {
      capacities.push_back((std::size_t{1} << shift) - delta);
      capacities.push_back((std::size_t{1} << shift) + delta);
      capacities.push_back((std::size_t{1} << shift) * 4 / 5 + delta);
    }
  }
  for (int i = 0; i < 10'000; ++i) capacities.push_back(1 + rng() % FlowTable::kMaxCapacity);
  for (std::size_t c : capacities) {
    if (c > FlowTable::kMaxCapacity) continue;
    const std::size_t slots = FlowTable::bucketCountFor(c) * FlowTable::kSlotsPerBucket;
    ASSERT_LE(FlowTable::memoryBytesFor(c), c == 1 ? 96 : 64 * c) << c;
    ASSERT_LE(c * 5, slots * 4) << c;
    ASSERT_LE(FlowTable::bucketCountFor(c) - 1, 0xffff'ffffu) << c;  // b1, b2 from separate halves
  }

  FlowTable table(FlowTableConfig{.capacity = 1'000'000});
  EXPECT_EQ(table.memoryBytes(), FlowTable::memoryBytesFor(1'000'000));
  EXPECT_LE(table.bytesPerFlowAtCapacity(), 64.0);
  EXPECT_EQ(table.slotCount(), table.bucketCount() * 4);
}

// The identity given to insert (the flow's FlowHasher hash) is what
// forEachLive reports, for every live entry, through cuckoo relocations,
// updates of the flow's own slot and evictions; insert() without one reports
// the hash as stored.
TEST(FlowTable, IdentityFollowsItsEntryThroughRelocations) {
  FlowTable table(FlowTableConfig{.capacity = 4'096});
  std::mt19937_64 rng(17);
  auto identityOf = [](std::uint64_t hash) { return hash * 0x9e3779b97f4a7c15ULL ^ 0x5bd1e995; };
  std::unordered_map<std::uint64_t, std::uint32_t> live;  // identity -> backend
  Millis now = 1;
  for (int i = 0; i < 20'000; ++i) {
    const std::uint64_t hash = rng() | 2;  // never 0 or 1
    const auto backend = static_cast<std::uint32_t>(1 + rng() % 1000);
    const FlowState state = i % 3 == 0 ? FlowState::Embryonic : FlowState::Established;
    const InsertResult r = table.insert(hash, backend, state, now, 0, identityOf(hash));
    if (r == InsertResult::Inserted || r == InsertResult::Updated) live[identityOf(hash)] = backend;
    if (table.counters().occupancy >= table.slotCount() * 9 / 10) break;
  }
  ASSERT_GT(table.counters().relocations, 0u);
  std::size_t reported = 0;
  table.forEachLive(
      now, 0, table.bucketCount(),
      [&](std::uint64_t identity, std::uint32_t backend, FlowState, std::uint32_t, std::uint8_t) {
        ++reported;
        const auto it = live.find(identity);
        ASSERT_NE(it, live.end()) << std::hex << identity;
        EXPECT_EQ(it->second, backend);
      });
  // Evicted embryonic entries are gone from the table but not from `live`.
  EXPECT_EQ(reported + table.counters().evictions, live.size());

  FlowTable plain(FlowTableConfig{.capacity = 16});
  ASSERT_EQ(plain.insert(0x1234, 5, FlowState::Udp, 0), InsertResult::Inserted);
  std::uint64_t seen = 0;
  plain.forEachLive(0, 0, plain.bucketCount(),
                    [&](std::uint64_t identity, std::uint32_t, FlowState, std::uint32_t,
                        std::uint8_t) { seen = identity; });
  EXPECT_EQ(seen, 0x1234u);
}

TEST(FlowTable, HashZeroIsStoredAsOne) {
  FlowTable table(FlowTableConfig{.capacity = 16});
  EXPECT_EQ(table.insert(0, 8, FlowState::Udp, 0), InsertResult::Inserted);
  EXPECT_EQ(table.lookup(0, 0), 8u);
  EXPECT_EQ(table.lookup(1, 0), 8u);  // documented alias
  EXPECT_EQ(table.insert(1, 9, FlowState::Udp, 0), InsertResult::Updated);
  EXPECT_EQ(table.counters().occupancy, 1u);
  EXPECT_TRUE(table.erase(0));
  EXPECT_EQ(table.lookup(1, 0), 0u);
}

TEST(FlowTable, UpdateBackendReSteersOnlyLiveEntries) {
  FlowTable table(FlowTableConfig{.capacity = 16});
  ASSERT_EQ(table.insert(99, 1, FlowState::Embryonic, 0), InsertResult::Inserted);
  EXPECT_TRUE(table.updateBackend(99, 2, 10));
  EXPECT_EQ(table.lookupAndTouch(99, 10, tcp(kTcpAck)), 2u);  // state kept, then -> Established
  EXPECT_FALSE(table.updateBackend(99, 0, 10));
  EXPECT_FALSE(table.updateBackend(99, FlowTable::kMaxBackend + 1, 10));
  EXPECT_FALSE(table.updateBackend(100, 3, 10));
  EXPECT_TRUE(table.updateBackend(99, FlowTable::kMaxBackend, 10));
  EXPECT_EQ(table.lookup(99, 10), FlowTable::kMaxBackend);
  EXPECT_FALSE(table.updateBackend(99, 3, 10 + table.timeouts().established + 1));
  EXPECT_EQ(table.counters().occupancy, 0u);
}

TEST(FlowTable, RejectsInvalidArguments) {
  FlowTable table(FlowTableConfig{.capacity = 16});
  EXPECT_EQ(table.insert(5, 0, FlowState::Established, 0), InsertResult::Invalid);
  EXPECT_EQ(table.insert(5, FlowTable::kMaxBackend + 1, FlowState::Established, 0),
            InsertResult::Invalid);
  EXPECT_EQ(table.insert(5, 1, static_cast<FlowState>(0), 0), InsertResult::Invalid);
  EXPECT_EQ(table.insert(5, 1, static_cast<FlowState>(7), 0), InsertResult::Invalid);
  EXPECT_EQ(table.counters().occupancy, 0u);
  EXPECT_EQ(table.counters().insertFailures, 0u);

  EXPECT_THROW(FlowTable(FlowTableConfig{.capacity = 0}), std::invalid_argument);
  EXPECT_THROW(FlowTable(FlowTableConfig{.capacity = FlowTable::kMaxCapacity + 1}),
               std::invalid_argument);
  FlowTableConfig tooLong;
  tooLong.timeouts.udp = FlowTable::kMaxTimeout + 1;
  try {
    FlowTable rejected(tooLong);
    FAIL() << "accepted an over-long timeout";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("timeouts.udp"), std::string::npos) << e.what();
  }
}

TEST(FlowTable, EraseClearAndMove) {
  FlowTable table(FlowTableConfig{.capacity = 1'024});
  for (std::uint64_t h = 1; h <= 100; ++h) {
    ASSERT_EQ(table.insert(h * 0x9e37'79b9'7f4a'7c15ULL, 1, FlowState::Udp, 0),
              InsertResult::Inserted);
  }
  EXPECT_TRUE(table.erase(0x9e37'79b9'7f4a'7c15ULL));
  EXPECT_FALSE(table.erase(0x9e37'79b9'7f4a'7c15ULL));
  EXPECT_EQ(table.counters().occupancy, 99u);
  EXPECT_EQ(table.counters().erased, 1u);

  FlowTable moved(std::move(table));
  EXPECT_EQ(moved.counters().occupancy, 99u);
  EXPECT_EQ(moved.lookup(2 * 0x9e37'79b9'7f4a'7c15ULL, 0), 1u);
  moved.clear();
  EXPECT_EQ(moved.counters().occupancy, 0u);
  EXPECT_EQ(moved.lookup(2 * 0x9e37'79b9'7f4a'7c15ULL, 0), 0u);
}

// --- Purging backend indices --------------------------------------------------

// A bitmap of backend indices, as beginPurge() takes it.
std::vector<std::uint64_t> bitsOf(std::initializer_list<std::uint32_t> indices) {
  std::vector<std::uint64_t> bits(FlowTable::kMaxBackend / 64 + 1, 0);
  for (std::uint32_t i : indices) bits[i / 64] |= std::uint64_t{1} << (i % 64);
  return bits;
}

TEST(FlowTable, PurgeErasesLiveAndExpiredEntriesNamingTheIndicesAndNothingElse) {
  FlowTableConfig config{.capacity = 4'096};
  config.timeouts.udp = 10 * kSecond;
  FlowTable table(config);
  std::unordered_map<std::uint64_t, std::uint32_t> flows;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 3'000; ++i) {
    const std::uint64_t h = rng();
    const auto backend = static_cast<std::uint32_t>(1 + rng() % 8);
    // Half the flows are UDP: expired (not yet reclaimed) at 20 s.
    const FlowState state = i % 2 == 0 ? FlowState::Udp : FlowState::Established;
    ASSERT_EQ(table.insert(h, backend, state, 0), InsertResult::Inserted);
    if (state == FlowState::Established) flows[h] = backend;
  }
  const Millis now = 20 * kSecond;
  const std::size_t before = table.counters().occupancy;
  ASSERT_EQ(before, 3'000u);
  // Index 8 and an index far above: only 3 and 8 name entries.
  const std::vector<std::uint64_t> bits = bitsOf({3, 8, 70'000});
  std::vector<std::uint32_t> counts(9, 0);
  (void)table.countByBackend(counts, now);
  std::size_t namingLive = counts[3] + counts[8];
  EXPECT_GT(namingLive, 0u);

  const std::size_t erased = table.purgeBackends(bits);
  EXPECT_FALSE(table.purging());
  // Every entry naming 3 or 8, live or expired: roughly a quarter of all.
  EXPECT_GT(erased, namingLive);
  EXPECT_EQ(table.counters().purged, erased);
  EXPECT_EQ(table.counters().occupancy, before - erased);
  for (const auto& [h, backend] : flows) {
    EXPECT_EQ(table.lookup(h, now), backend == 3 || backend == 8 ? 0u : backend);
  }
  // No slot names them, expired ones included: a purge finds nothing more.
  EXPECT_EQ(table.purgeBackends(bits), 0u);
  std::fill(counts.begin(), counts.end(), 0);
  (void)table.countByBackend(counts, now);
  EXPECT_EQ(counts[3] + counts[8], 0u);
}

TEST(FlowTable, PurgeInSlicesAndEmptyPurges) {
  FlowTable table(FlowTableConfig{.capacity = 1'024});
  for (std::uint64_t h = 1; h <= 500; ++h) {
    ASSERT_EQ(table.insert(h * 0x9e37'79b9'7f4a'7c15ULL, 1 + h % 5, FlowState::Udp, 0),
              InsertResult::Inserted);
  }
  EXPECT_TRUE(table.purgeSlice(10));  // none running: complete at once
  EXPECT_EQ(table.purgeBackends({}), 0u);
  const std::vector<std::uint64_t> bits = bitsOf({2});
  table.beginPurge(bits);
  EXPECT_TRUE(table.purging());
  std::size_t slices = 1;
  while (!table.purgeSlice(100)) ++slices;
  EXPECT_EQ(slices, (table.bucketCount() + 99) / 100);
  EXPECT_FALSE(table.purging());
  EXPECT_EQ(table.counters().purged, 100u);  // h % 5 == 1 for 100 of 500
  EXPECT_EQ(table.counters().occupancy, 400u);

  table.beginPurge(bits);
  table.clear();  // ends the purge
  EXPECT_FALSE(table.purging());
}

// The case the relocation guard exists for: an entry naming a purged index,
// in a bucket the cursor has not reached, whose other bucket the cursor has
// passed. Moving it there would hide it from the pass for good.
TEST(FlowTable, PurgeIsNotDefeatedByARelocationBehindTheCursor) {
  FlowTable table = smallTable();
  const std::uint32_t kPurged = 9;
  const std::uint64_t stale = craftedHash(20, 3, 1);  // bucket 20, other bucket 3
  ASSERT_EQ(table.insert(stale, kPurged, FlowState::Established, 0), InsertResult::Inserted);
  for (std::uint32_t i = 0; i < 3; ++i) {
    ASSERT_EQ(table.insert(craftedHash(20, 24 + i, 2 + i), 1, FlowState::Established, 0),
              InsertResult::Inserted);
  }
  const std::vector<std::uint64_t> bits = bitsOf({kPurged});
  table.beginPurge(bits);
  ASSERT_FALSE(table.purgeSlice(10));  // buckets 0..9 done, 20 not yet
  // A flow whose only bucket is the full bucket 20 needs room there.
  const std::uint64_t fresh = craftedHash(20, 20, 50);
  ASSERT_EQ(table.insert(fresh, 2, FlowState::Established, 0), InsertResult::Inserted);
  while (!table.purgeSlice(10)) {
  }
  EXPECT_EQ(table.lookup(stale, 0), 0u);
  EXPECT_EQ(table.lookup(fresh, 0), 2u);
  std::vector<std::uint32_t> counts(kPurged + 1, 0);
  (void)table.countByBackend(counts, 0);
  EXPECT_EQ(counts[kPurged], 0u);
  EXPECT_EQ(table.counters().purged, 1u);
  EXPECT_EQ(table.counters().relocations, 0u);  // the purged slot was the room
}

// Differential: random traffic at high load (relocations, failures) with a
// purge of a few indices running in slices among the operations, as a worker
// does it. Inserts during a purge never name a purged index (the caller's
// contract: the snapshot lists them in no table). An entry naming a purged
// index may still be found until the cursor reaches it, but after the pass
// none is left, and every other entry is exactly as the oracle says.
TEST(FlowTable, PurgeDifferentialAgainstOracleAtHighLoad) {
  const FlowTimeouts timeouts{};
  FlowTable table(FlowTableConfig{.capacity = 1'024, .timeouts = timeouts});
  std::mt19937_64 rng(0x9a7e);
  std::vector<std::uint64_t> keys;
  while (keys.size() < 3'000) keys.push_back(rng());
  const std::vector<FlowState> states = {FlowState::Established, FlowState::Udp, FlowState::Other};
  constexpr std::uint32_t kBackends = 40;
  struct Model {
    std::uint32_t backend;
    bool purging;  // names a purged index; the table may or may not have erased it yet
  };
  std::unordered_map<std::uint64_t, Model> model;  // present entries (all live: time stands still)
  std::vector<std::uint64_t> bits;
  std::vector<bool> purged(kBackends + 1, false);
  int passes = 0;
  std::uint64_t relocationsDuringPurges = 0;
  const Millis now = 1'000;
  auto allowed = [&] {
    for (;;) {
      const auto b = static_cast<std::uint32_t>(1 + rng() % kBackends);
      if (!purged[b]) return b;
    }
  };
  for (int op = 0; op < 200'000; ++op) {
    if (!table.purging() && rng() % 500 == 0) {
      bits.assign(FlowTable::kMaxBackend / 64 + 1, 0);
      std::fill(purged.begin(), purged.end(), false);
      for (int k = 0; k < 3; ++k) {
        const auto b = static_cast<std::uint32_t>(1 + rng() % kBackends);
        purged[b] = true;
        bits[b / 64] |= std::uint64_t{1} << (b % 64);
      }
      for (auto& [h, m] : model) m.purging = purged[m.backend];
      table.beginPurge(bits);
    }
    const std::uint64_t h = keys[rng() % keys.size()];
    auto it = model.find(h);
    const unsigned kind = rng() % 100;
    const std::uint64_t relocationsBefore = table.counters().relocations;
    if (kind < 45) {
      const std::uint32_t backend = allowed();
      const InsertResult r = table.insert(h, backend, states[rng() % states.size()], now);
      if (r == InsertResult::Full) {
        ASSERT_TRUE(it == model.end() || it->second.purging) << "op " << op;
        if (it != model.end()) model.erase(it);
      } else {
        const bool present = it != model.end();
        if (present && it->second.purging) {
          ASSERT_TRUE(r == InsertResult::Updated || r == InsertResult::Inserted) << "op " << op;
        } else {
          ASSERT_EQ(r, present ? InsertResult::Updated : InsertResult::Inserted) << "op " << op;
        }
        model[h] = Model{backend, false};
      }
    } else if (kind < 85) {
      const std::uint32_t got = table.lookup(h, now);
      if (it == model.end()) {
        ASSERT_EQ(got, 0u) << "op " << op;
      } else if (it->second.purging && got == 0) {
        model.erase(it);  // the pass (or a relocation) erased it already
      } else {
        ASSERT_EQ(got, it->second.backend) << "op " << op;
      }
    } else if (kind < 92) {
      // A hit on a purged index is re-steered, as the data path does.
      const std::uint32_t backend = allowed();
      const bool updated = table.updateBackend(h, backend, now);
      if (it == model.end()) {
        ASSERT_FALSE(updated) << "op " << op;
      } else if (it->second.purging && !updated) {
        model.erase(it);
      } else {
        ASSERT_TRUE(updated) << "op " << op;
        it->second = Model{backend, false};
      }
    } else if (kind < 96) {
      const bool erased = table.erase(h);
      if (it != model.end()) {
        if (!it->second.purging) {
          ASSERT_TRUE(erased) << "op " << op;
        }
        model.erase(it);
      } else {
        ASSERT_FALSE(erased) << "op " << op;
      }
    }
    if (table.purging()) {
      relocationsDuringPurges += table.counters().relocations - relocationsBefore;
      if (table.purgeSlice(rng() % 4)) {
        ++passes;
        // Nothing names a purged index any more; the rest is the model.
        std::vector<std::uint32_t> counts(kBackends + 1, 0);
        ASSERT_EQ(table.countByBackend(counts, now), table.counters().occupancy) << "op " << op;
        std::erase_if(model, [](const auto& kv) { return kv.second.purging; });
        std::vector<std::uint32_t> expected(kBackends + 1, 0);
        for (const auto& [k, m] : model) ++expected[m.backend];
        ASSERT_EQ(counts, expected) << "op " << op;
        for (std::uint32_t b = 1; b <= kBackends; ++b) {
          if (purged[b]) {
            ASSERT_EQ(counts[b], 0u) << "op " << op << " backend " << b;
          }
        }
        std::fill(purged.begin(), purged.end(), false);
      }
    }
  }
  EXPECT_GT(passes, 100);
  EXPECT_GT(relocationsDuringPurges, 0u);  // the guard was exercised
  EXPECT_GT(table.counters().purged, 0u);
  EXPECT_GT(table.counters().occupancy, table.slotCount() * 80 / 100);
}

}  // namespace
}  // namespace spillway
