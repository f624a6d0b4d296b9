// Tier-wide operator intent (tier_intent.hpp, intent_wire.hpp): the stamp
// order, last-writer-wins per (backend, field), tombstones, the fold into a
// target, merge as a join (any order, any grouping, repeated), the digest and
// the count of differing entries; the entry codec, the file and the peer
// channel's Intent frames, with bad and unknown records.
#include "control/intent/tier_intent.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "control/tier/intent_wire.hpp"

namespace spillway {
namespace {

IntentRecord rec(IntentOp op, const std::string& backend, std::uint32_t weight = 0) {
  IntentRecord r;
  r.op = op;
  r.backend = backend;
  r.id = 7;
  r.weight = weight;
  r.wallMs = 1000;
  return r;
}

TierIntentEntry entry(IntentOp op, const std::string& backend, std::uint64_t clock,
                      const std::string& origin, std::uint32_t weight = 0) {
  TierIntentEntry e;
  e.field = *tierFieldOf(op);
  e.stamp = TierStamp{clock, origin};
  e.record = rec(op, backend, weight);
  return e;
}

TEST(TierIntent, LocalStampsFollowWallTimeAndNeverRunBackwards) {
  TierIntent t;
  const auto a = t.local(rec(IntentOp::Drain, "b1"), "lb-a", 5000);
  EXPECT_EQ(a.stamp.clock, 5000u);
  EXPECT_EQ(a.stamp.origin, "lb-a");
  // The wall clock stepped back: the stamp still grows.
  const auto b = t.local(rec(IntentOp::Undrain, "b1"), "lb-a", 4000);
  EXPECT_EQ(b.stamp.clock, 5001u);
  // A peer's change with a clock ahead of ours: our next change orders after it.
  (void)t.merge(std::vector{entry(IntentOp::Weight, "b2", 9000, "lb-b", 50)});
  const auto c = t.local(rec(IntentOp::Drain, "b3"), "lb-a", 6000);
  EXPECT_EQ(c.stamp.clock, 9001u);
  EXPECT_EQ(t.size(), 3u);
}

TEST(TierIntent, LastWriterWinsPerBackendAndFieldTiesByOrigin) {
  TierIntent t;
  EXPECT_EQ(t.merge(std::vector{entry(IntentOp::Drain, "b1", 10, "lb-a")}),
            std::vector<std::string>{"b1"});
  // Older: ignored; the same change again: no change.
  EXPECT_TRUE(t.merge(std::vector{entry(IntentOp::Enable, "b1", 9, "lb-z")}).empty());
  EXPECT_TRUE(t.merge(std::vector{entry(IntentOp::Drain, "b1", 10, "lb-a")}).empty());
  EXPECT_EQ(t.target("b1").admin, AdminState::Draining);
  // Same clock, greater origin: wins.
  EXPECT_FALSE(t.merge(std::vector{entry(IntentOp::Disable, "b1", 10, "lb-b")}).empty());
  EXPECT_EQ(t.target("b1").admin, AdminState::Disabled);
  // Same clock, smaller origin: loses.
  EXPECT_TRUE(t.merge(std::vector{entry(IntentOp::Enable, "b1", 10, "lb-0")}).empty());
  EXPECT_EQ(t.target("b1").admin, AdminState::Disabled);
  // Another field of the same backend is independent.
  (void)t.merge(std::vector{entry(IntentOp::Weight, "b1", 3, "lb-a", 40)});
  EXPECT_EQ(t.target("b1").weight, 40u);
  EXPECT_EQ(t.target("b1").admin, AdminState::Disabled);
}

TEST(TierIntent, FoldFollowsTheJournalsRules) {
  TierIntent t;
  // Remove is a tombstone; a later enable cancels it, an earlier one does not.
  (void)t.merge(std::vector{entry(IntentOp::Enable, "b1", 5, "lb-a"),
                            entry(IntentOp::Remove, "b1", 6, "lb-b")});
  EXPECT_TRUE(t.target("b1").removed);
  (void)t.merge(std::vector{entry(IntentOp::Undrain, "b1", 7, "lb-a")});
  EXPECT_FALSE(t.target("b1").removed);
  EXPECT_EQ(t.target("b1").admin, AdminState::Enabled);
  // An Add forgets the older drain and weight of the name.
  (void)t.merge(std::vector{entry(IntentOp::Drain, "b2", 5, "lb-a"),
                            entry(IntentOp::Weight, "b2", 5, "lb-a", 10)});
  auto add = entry(IntentOp::Add, "b2", 8, "lb-b", 77);
  add.record.address = IpAddress{};
  add.record.pool = "gpu";
  add.record.port = "wire";
  (void)t.merge(std::vector{add});
  const TierTarget target = t.target("b2");
  ASSERT_TRUE(target.added);
  EXPECT_EQ(target.added->weight, 77u);
  EXPECT_FALSE(target.admin);
  EXPECT_FALSE(target.weight);
  // A drain after the add holds.
  (void)t.merge(std::vector{entry(IntentOp::Drain, "b2", 9, "lb-a")});
  EXPECT_EQ(t.target("b2").admin, AdminState::Draining);
  EXPECT_TRUE(t.target("b2").added);
}

TEST(TierIntent, MergeIsAJoinWhateverTheOrderAndGrouping) {
  std::vector<TierIntentEntry> all;
  const std::vector<IntentOp> ops{IntentOp::Drain,  IntentOp::Undrain, IntentOp::Disable,
                                  IntentOp::Enable, IntentOp::Weight,  IntentOp::Remove,
                                  IntentOp::Add};
  std::mt19937_64 rng(42);
  for (int i = 0; i < 200; ++i) {
    const IntentOp op = ops[rng() % ops.size()];
    all.push_back(entry(op, "b" + std::to_string(rng() % 5), rng() % 20,
                        "lb-" + std::string(1, static_cast<char>('a' + rng() % 3)),
                        static_cast<std::uint32_t>(rng() % 100)));
  }
  // Entries with equal stamps must be the same change (a stamp names one
  // change); keep the first of each stamp per key.
  std::vector<TierIntentEntry> unique;
  for (const auto& e : all) {
    const bool seen = std::any_of(unique.begin(), unique.end(), [&](const TierIntentEntry& u) {
      return u.record.backend == e.record.backend && u.field == e.field && u.stamp == e.stamp;
    });
    if (!seen) unique.push_back(e);
  }
  TierIntent reference;
  (void)reference.merge(unique);
  for (int round = 0; round < 20; ++round) {
    std::vector<TierIntentEntry> shuffled = unique;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    // Two instances each get part, then exchange their sets, twice over.
    const std::size_t cut = rng() % shuffled.size();
    TierIntent a, b;
    (void)a.merge(std::span(shuffled).first(cut));
    (void)b.merge(std::span(shuffled).subspan(cut));
    const auto fromA = a.entries();
    (void)b.merge(fromA);
    (void)a.merge(b.entries());
    (void)a.merge(fromA);  // idempotent
    EXPECT_EQ(a, reference);
    EXPECT_EQ(b, reference);
    EXPECT_EQ(a.digest(), reference.digest());
    for (const std::string& name : reference.backends()) {
      EXPECT_EQ(a.target(name), reference.target(name)) << name;
    }
  }
}

TEST(TierIntent, AnEmptyIntentHasTheDigestItsDumpIsCheckedAgainst) {
  // A receiver checks a dump's entries against the digest it carries
  // (PeerChannel::receiveIntent): an empty intent must agree with itself.
  EXPECT_EQ(TierIntent{}.digest(), tierIntentDigest({}));
}

TEST(TierIntent, DigestAndDifferingCount) {
  TierIntent a, b;
  EXPECT_EQ(a.digest(), b.digest());
  (void)a.merge(std::vector{entry(IntentOp::Drain, "b1", 10, "lb-a"),
                            entry(IntentOp::Weight, "b2", 11, "lb-a", 5)});
  (void)b.merge(std::vector{entry(IntentOp::Drain, "b1", 10, "lb-a")});
  EXPECT_NE(a.digest(), b.digest());
  EXPECT_EQ(tierIntentDiffering(a.entries(), b.entries()), 1u);
  (void)b.merge(std::vector{entry(IntentOp::Weight, "b2", 12, "lb-b", 6),
                            entry(IntentOp::Disable, "b3", 1, "lb-b")});
  // b2's stamp differs, b3 only in b.
  EXPECT_EQ(tierIntentDiffering(a.entries(), b.entries()), 2u);
  EXPECT_EQ(tierIntentDigest(b.entries()), b.digest());
  (void)a.merge(b.entries());
  (void)b.merge(a.entries());
  EXPECT_EQ(a.digest(), b.digest());
  EXPECT_EQ(tierIntentDiffering(a.entries(), b.entries()), 0u);
}

TEST(TierIntent, EntriesThatDoNotFitAreRejectedAndCounted) {
  TierIntent t;
  auto wrongField = entry(IntentOp::Drain, "b1", 1, "lb-a");
  wrongField.field = TierField::Weight;
  auto noName = entry(IntentOp::Drain, "", 1, "lb-a");
  auto noOrigin = entry(IntentOp::Drain, "b1", 1, "");
  auto notTierWide = entry(IntentOp::Drain, "b1", 1, "lb-a");
  notTierWide.record.op = IntentOp::LbDrain;
  EXPECT_TRUE(t.merge(std::vector{wrongField, noName, noOrigin, notTierWide}).empty());
  EXPECT_EQ(t.rejected(), 4u);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_FALSE(tierFieldOf(IntentOp::ClearOverrides));
  EXPECT_FALSE(tierFieldOf(IntentOp::LbUndrain));
}

TEST(TierIntentCodec, EntryRoundTripsAndDamageIsAnError) {
  auto add = entry(IntentOp::Add, "gpu-a1", 0x0102030405060708ULL, "lb-west-2", 120);
  add.record.address = *parseIpAddress("10.1.2.3");
  add.record.pool = "gpu";
  add.record.port = "wire";
  add.record.mac = *parseMacAddress("02:00:00:00:00:07");
  add.record.id = 99;
  const std::string bytes = encodeTierIntentEntry(add);
  auto d = decodeTierIntentEntry(bytes);
  ASSERT_TRUE(std::holds_alternative<TierIntentEntry>(d)) << std::get<std::string>(d);
  EXPECT_EQ(std::get<TierIntentEntry>(d), add);
  // Every truncation is an error, never a crash.
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_TRUE(std::holds_alternative<std::string>(decodeTierIntentEntry(bytes.substr(0, n))))
        << n;
  }
  // A flipped byte in the record fails its CRC; a field that does not fit the op is refused.
  std::string flipped = bytes;
  flipped[bytes.size() - 3] ^= 0x40;
  EXPECT_TRUE(std::holds_alternative<std::string>(decodeTierIntentEntry(flipped)));
  std::string field = bytes;
  field[0] = static_cast<char>(TierField::Weight);
  EXPECT_TRUE(std::holds_alternative<std::string>(decodeTierIntentEntry(field)));
  field[0] = 9;
  EXPECT_TRUE(std::holds_alternative<std::string>(decodeTierIntentEntry(field)));
}

TEST(TierIntentCodec, FileRoundTripsAndAMissingFileIsEmpty) {
  char tmpl[] = "/tmp/spillway-tierintent-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string file = dir + "/tier.intent";
  auto missing = loadTierIntent(file);
  ASSERT_TRUE(std::holds_alternative<TierIntent>(missing));
  EXPECT_EQ(std::get<TierIntent>(missing).size(), 0u);
  TierIntent t;
  (void)t.merge(std::vector{entry(IntentOp::Drain, "b1", 10, "lb-a"),
                            entry(IntentOp::Weight, "b2", 11, "lb-b", 5),
                            entry(IntentOp::Remove, "b3", 12, "lb-a")});
  ASSERT_FALSE(saveTierIntent(file, t));
  auto loaded = loadTierIntent(file);
  ASSERT_TRUE(std::holds_alternative<TierIntent>(loaded)) << std::get<std::string>(loaded);
  EXPECT_EQ(std::get<TierIntent>(loaded), t);
  EXPECT_EQ(std::get<TierIntent>(loaded).digest(), t.digest());
  EXPECT_EQ(std::get<TierIntent>(loaded).clock(), 12u);
  // A damaged file is an error with the file's name.
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 5);
  auto damaged = loadTierIntent(file);
  ASSERT_TRUE(std::holds_alternative<std::string>(damaged));
  EXPECT_NE(std::get<std::string>(damaged).find("tier.intent"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(IntentWire, ADumpRoundTripsAcrossFrames) {
  std::vector<TierIntentEntry> entries;
  for (int i = 0; i < 2000; ++i) {
    entries.push_back(entry(IntentOp::Weight, "backend-" + std::to_string(i), 100 + i, "lb-a",
                            static_cast<std::uint32_t>(i)));
  }
  const std::uint64_t digest = tierIntentDigest(entries);
  const auto frames = encodeIntentDump(entries, digest);
  ASSERT_GT(frames.size(), 1u);
  std::vector<TierIntentEntry> got;
  for (std::size_t i = 0; i < frames.size(); ++i) {
    EXPECT_LE(frames[i].size(), kIntentFrameBudget + kIntentWireHeader);
    auto d = decodeIntentFrame(frames[i]);
    ASSERT_TRUE(std::holds_alternative<IntentWireFrame>(d)) << std::get<std::string>(d);
    const IntentWireFrame& f = std::get<IntentWireFrame>(d);
    EXPECT_EQ((f.flags & kIntentFlagBegin) != 0, i == 0);
    EXPECT_EQ((f.flags & kIntentFlagEnd) != 0, i + 1 == frames.size());
    EXPECT_EQ(f.total, entries.size());
    EXPECT_EQ(f.digest, digest);
    got.insert(got.end(), f.entries.begin(), f.entries.end());
  }
  EXPECT_EQ(got, entries);
  // An empty intent is one frame, Begin and End.
  const auto empty = encodeIntentDump({}, tierIntentDigest({}));
  ASSERT_EQ(empty.size(), 1u);
  auto d = decodeIntentFrame(empty[0]);
  ASSERT_TRUE(std::holds_alternative<IntentWireFrame>(d));
  EXPECT_EQ(std::get<IntentWireFrame>(d).flags, kIntentFlagBegin | kIntentFlagEnd);
}

TEST(IntentWire, UnknownKindsAreSkippedAndCountedOtherVersionsIgnoredBadFramesRefused) {
  const std::vector<TierIntentEntry> one{entry(IntentOp::Drain, "b1", 10, "lb-a")};
  std::string frame = encodeIntentDump(one, tierIntentDigest(one)).front();
  // Append a record of kind 200 (a later version's) and count it in the header.
  frame[2] = 2;
  frame += std::string{static_cast<char>(200), 0, 3, 0} + "xyz";
  auto d = decodeIntentFrame(frame);
  ASSERT_TRUE(std::holds_alternative<IntentWireFrame>(d)) << std::get<std::string>(d);
  EXPECT_EQ(std::get<IntentWireFrame>(d).unknownRecords, 1u);
  EXPECT_EQ(std::get<IntentWireFrame>(d).entries, one);

  std::string other = frame;
  other[0] = 2;
  auto o = decodeIntentFrame(other);
  ASSERT_TRUE(std::holds_alternative<IntentWireFrame>(o));
  EXPECT_TRUE(std::get<IntentWireFrame>(o).otherVersion);

  // Every truncation, trailing bytes, unknown flags: an error, never a crash.
  for (std::size_t n = 0; n < frame.size(); ++n) {
    EXPECT_TRUE(std::holds_alternative<std::string>(decodeIntentFrame(frame.substr(0, n)))) << n;
  }
  EXPECT_TRUE(std::holds_alternative<std::string>(decodeIntentFrame(frame + "x")));
  std::string flags = frame;
  flags[1] = static_cast<char>(0x80);
  EXPECT_TRUE(std::holds_alternative<std::string>(decodeIntentFrame(flags)));
  // Random bytes never crash.
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string junk(rng() % 64, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    if (!junk.empty()) junk[0] = static_cast<char>(kIntentWireVersion);
    (void)decodeIntentFrame(junk);
  }
}

}  // namespace
}  // namespace spillway
