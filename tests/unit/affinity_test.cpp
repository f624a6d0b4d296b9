// Flow affinity across restarts without EAL: the checkpoint file formats
// (damage is refused whole), and a ControlPlane that checkpoints through fake
// worker hooks and a second one that starts from what the first left: the
// same tables, the exceptions in its first snapshot, restored flows leaving
// the set when tracked again or expired.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "control/backends/snapshot_builder.hpp"
#include "control/config/config.hpp"
#include "control/intent/affinity_keeper.hpp"
#include "control/intent/flow_checkpoint.hpp"
#include "control/plane/control_plane.hpp"
#include "control/sys/durable_writer.hpp"
#include "estate_fixture.hpp"
#include "fake_dataplane.hpp"

namespace spillway {
namespace {

constexpr std::uint64_t kSeed = 0x0123456789abcdefULL;

TEST(Crc32c, KnownVector) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  // The word-at-a-time path and the byte path agree on every length.
  std::string s;
  for (int i = 0; i < 40; ++i) {
    s += static_cast<char>(i * 7);
    std::uint32_t crc = ~0u;
    for (char c : s) {
      crc ^= static_cast<std::uint8_t>(c);
      for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82f63b78u : crc >> 1;
    }
    EXPECT_EQ(crc32c(s), ~crc) << i;
  }
}

std::vector<FlowExceptionRecord> sampleRecords() {
  return {{0x1111, 7, FlowState::Established, 12'345},
          {0x2222, 9, FlowState::Udp, 0},
          {0x3333, 7, FlowState::Closing, 999},
          {0, 1ULL << 60, FlowState::Embryonic, 4'000'000'000u}};
}

TEST(FlowCheckpointFile, RoundTripKeepsEveryRecordWithIdleInWholeSeconds) {
  const auto records = sampleRecords();
  const std::string bytes = encodeFlowCheckpoint(kSeed, 1'700'000'000'000ULL, records);
  EXPECT_EQ(bytes.size(), 40u + 3 * 8 + 4 * 16 + 4);  // 16 bytes a record, 8 a backend
  auto parsed = decodeFlowCheckpoint(bytes, kSeed);
  ASSERT_TRUE(std::holds_alternative<FlowCheckpoint>(parsed)) << std::get<std::string>(parsed);
  const auto& c = std::get<FlowCheckpoint>(parsed);
  EXPECT_EQ(c.writtenUnixMs, 1'700'000'000'000ULL);
  ASSERT_EQ(c.records.size(), records.size());
  for (std::size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(c.records[i].hash, records[i].hash);
    EXPECT_EQ(c.records[i].backendId, records[i].backendId);
    EXPECT_EQ(c.records[i].state, records[i].state);
  }
  EXPECT_EQ(c.records[0].idleMs, 12'000u);
  EXPECT_EQ(c.records[2].idleMs, 0u);
  EXPECT_EQ(c.records[3].idleMs, 4'000'000'000u);
}

TEST(FlowCheckpointFile, DamageIsRefusedWhole) {
  const std::string good = encodeFlowCheckpoint(kSeed, 1, sampleRecords());
  auto error = [](const std::variant<FlowCheckpoint, std::string>& r) {
    return std::holds_alternative<std::string>(r) ? std::get<std::string>(r) : std::string();
  };
  EXPECT_NE(error(decodeFlowCheckpoint(good.substr(0, good.size() - 1), kSeed)), "");
  EXPECT_NE(error(decodeFlowCheckpoint(good.substr(0, 20), kSeed)), "");
  EXPECT_NE(error(decodeFlowCheckpoint("", kSeed)), "");
  for (std::size_t at : {std::size_t{0}, std::size_t{9}, std::size_t{50}, good.size() - 2}) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x40);
    EXPECT_NE(error(decodeFlowCheckpoint(bad, kSeed)), "") << "byte " << at;
  }
  EXPECT_NE(error(decodeFlowCheckpoint(good, kSeed + 1)).find("hash_seed"), std::string::npos);
  // A header that claims more records than the file holds.
  std::string big = good;
  big[32] = '\x7f';
  EXPECT_NE(error(decodeFlowCheckpoint(big, kSeed)), "");
}

TEST(FlowCheckpointFile, LargestIdleFieldDoesNotWrapToFresh) {
  std::string bytes = encodeFlowCheckpoint(kSeed, 1, {{{0x42, 7, FlowState::Established, 0}}});
  // Set the record's idle seconds to the field's maximum, and fix the CRC.
  const std::size_t meta = 40 + 8 + 12;
  const std::uint32_t v = (static_cast<std::uint32_t>(FlowState::Established) << 24) | 0xffffff;
  std::memcpy(bytes.data() + meta, &v, 4);
  const std::uint32_t crc = crc32c(std::string_view(bytes).substr(0, bytes.size() - 4));
  std::memcpy(bytes.data() + bytes.size() - 4, &crc, 4);
  auto parsed = decodeFlowCheckpoint(bytes, kSeed);
  ASSERT_TRUE(std::holds_alternative<FlowCheckpoint>(parsed)) << std::get<std::string>(parsed);
  EXPECT_EQ(std::get<FlowCheckpoint>(parsed).records[0].idleMs, UINT32_MAX);
}

TEST(SlotHistoryFile, RoundTripAgesByTheTimeSinceWritingAndDamageIsRefused) {
  SlotHistory h;
  h["nccl"] = {65'537, {{0, 7, 9, 100}, {65'536, 1ULL << 62, 7, 0}, {12, 9, 0, 4'000'000'000u}}};
  h["grpc"] = {1'009, {}};
  const std::string bytes = encodeSlotHistory(kSeed, 1'000'000, h);
  auto parsed = decodeSlotHistory(bytes, kSeed, 1'000'250);
  ASSERT_TRUE(std::holds_alternative<SlotHistory>(parsed)) << std::get<std::string>(parsed);
  SlotHistory want = h;
  want["nccl"].slots[0].ageMs = 350;  // written 250 ms before
  want["nccl"].slots[1].ageMs = 250;
  want["nccl"].slots[2].ageMs = 4'000'000'250u;
  EXPECT_EQ(std::get<SlotHistory>(parsed), want);
  // A clock that went back ages nothing.
  EXPECT_EQ(std::get<SlotHistory>(decodeSlotHistory(bytes, kSeed, 5)), h);

  auto error = [](const std::variant<SlotHistory, std::string>& r) {
    return std::holds_alternative<std::string>(r) ? std::get<std::string>(r) : std::string();
  };
  EXPECT_NE(error(decodeSlotHistory(bytes, kSeed + 1, 0)).find("hash_seed"), std::string::npos);
  EXPECT_NE(error(decodeSlotHistory("", kSeed, 0)), "");
  for (std::size_t cut = 1; cut < bytes.size(); cut += 7) {
    EXPECT_NE(error(decodeSlotHistory(bytes.substr(0, cut), kSeed, 0)), "") << "cut at " << cut;
  }
  for (std::size_t at = 0; at + 4 < bytes.size(); at += 5) {
    std::string bad = bytes;
    bad[at] = static_cast<char>(bad[at] ^ 0x10);
    EXPECT_NE(error(decodeSlotHistory(bad, kSeed, 0)), "") << "byte " << at;
  }
  // Well-formed bytes (CRC fixed) with a slot past the table or an ordinal
  // past the backends: refused, not read.
  SlotHistory outOfTable;
  outOfTable["v"] = {10, {{10, 7, 7, 1}}};
  EXPECT_NE(
      error(decodeSlotHistory(encodeSlotHistory(kSeed, 1, outOfTable), kSeed, 1)).find("invalid"),
      std::string::npos);
}

TEST(TablesStateFile, RoundTripAndMalformed) {
  TablesState t;
  t.writtenUnixMs = 5;
  t.generation = 42;
  t.weights["nccl"] = {{1, 500'000}, {18446744073709551615ULL, 0}};
  t.weights["grpc"] = {};
  t.saturated = {1, 3};
  auto parsed = decodeTablesState(encodeTablesState(t));
  ASSERT_TRUE(std::holds_alternative<TablesState>(parsed)) << std::get<std::string>(parsed);
  const auto& u = std::get<TablesState>(parsed);
  EXPECT_EQ(u.generation, 42u);
  EXPECT_EQ(u.weights, t.weights);
  EXPECT_EQ(u.saturated, t.saturated);
  for (
      const char* bad :
      {"", "[]", "{\"version\":2}", "{\"version\":1}",
       R"({"version":1,"written_unix_ms":1,"generation":1,"weights":{"v":{"x1":3}},"saturated":[]})",
       R"({"version":1,"written_unix_ms":1,"generation":1,"weights":{"v":{"1":-3}},"saturated":[]})"}) {
    EXPECT_TRUE(std::holds_alternative<std::string>(decodeTablesState(bad))) << bad;
  }
}

TEST(TablesStateFile, DiscoveredBackendsRoundTripAndBadEntriesRefuseTheFile) {
  TablesState t;
  t.generation = 7;
  DiscoveredRecord listed;
  listed.pool = "cloud";
  listed.backend.address = *parseIpAddress("10.3.0.5");
  listed.backend.id = discoveredBackendId(listed.backend.address);
  listed.backend.name = "gpu-a";
  listed.backend.weight = 250;
  listed.backend.mac = parseMacAddress("02:00:00:00:00:05");
  listed.backend.metricsPort = 9400;
  listed.backend.metricsPath = "/metrics";
  DiscoveredRecord leaving;
  leaving.pool = "cloud";
  leaving.backend.address = *parseIpAddress("2001:db8::6");
  leaving.backend.id = discoveredBackendId(leaving.backend.address);
  leaving.backend.name = discoveredBackendName(leaving.backend.address);
  leaving.leavingSinceUnixMs = 1'700'000'000'123ULL;
  t.discovered = {listed, leaving};
  const std::string text = encodeTablesState(t);
  auto parsed = decodeTablesState(text);
  ASSERT_TRUE(std::holds_alternative<TablesState>(parsed)) << std::get<std::string>(parsed);
  EXPECT_EQ(std::get<TablesState>(parsed).discovered, t.discovered);

  // A file from before "discovered" existed reads as none.
  auto old = decodeTablesState(
      R"({"version":1,"written_unix_ms":1,"generation":1,"weights":{},"saturated":[]})");
  ASSERT_TRUE(std::holds_alternative<TablesState>(old));
  EXPECT_TRUE(std::get<TablesState>(old).discovered.empty());

  // An entry that a source could not have given is never half-used: the file
  // is refused whole, as for any other damage.
  const auto refused = [&](const std::string& from, const std::string& to) {
    std::string bad = text;
    const auto at = bad.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at == std::string::npos) return;
    bad.replace(at, from.size(), to);
    EXPECT_TRUE(std::holds_alternative<std::string>(decodeTablesState(bad))) << to;
  };
  refused("\"10.3.0.5\"", "\"10.3.0.9\"");  // the id is another address's
  refused("\"10.3.0.5\"", "\"not an address\"");
  refused("\"gpu-a\"", "\"bad name!\"");
  refused("250", "2000000");  // over the weight cap
  refused("\"02:00:00:00:00:05\"", "\"02:00\"");
  refused("\"pool\": \"cloud\"", "\"pool\": 3");
  refused("\"discovered\": [", "\"discovered\": [7, ");
  // The same backend twice.
  TablesState twice = t;
  twice.discovered.push_back(listed);
  EXPECT_TRUE(std::holds_alternative<std::string>(decodeTablesState(encodeTablesState(twice))));
}

// --- A ControlPlane across a restart ------------------------------------------

std::string configText(const std::string& stateDir) {
  return test::onePoolEstate(4) + "\n[control]\nstate_dir = \"" + stateDir + "\"\n";
}

class AffinityRestart : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/spillway-affinity-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  Config config() {
    auto r = loadConfigFromString(configText(dir_), "test.toml");
    EXPECT_TRUE(r) << formatErrors(r.errors());
    return r.value();
  }

  // Publishes while there is something to publish, as the daemon loop does;
  // returns the snapshot published, or null.
  std::shared_ptr<const ForwardingSnapshot> run(ControlPlane& c, Millis now) {
    if (!c.tick(now)) return nullptr;
    auto s = c.takeSnapshot(now);
    if (!s) return nullptr;
    dp_.publish(std::move(s));
    return dp_.latest;
  }
  // The estate with second chance on (a 10-minute hold).
  Config secondChanceConfig() {
    Config c = config();
    c.dataplane.secondChanceHoldMs = 600'000;
    return c;
  }
  std::shared_ptr<const ForwardingSnapshot> first(ControlPlane& c) {
    dp_.publish(c.takeSnapshot(0));
    return dp_.latest;
  }

  std::string dir_;
  test::FakeDataplane dp_;
};

TEST_F(AffinityRestart, SecondProcessStartsWithTheFirstOnesTablesAndExceptions) {
  SnapshotBuilder builderA;
  ASSERT_FALSE(builderA.setConfig(config()));
  ControlPlane a(config(), "test.toml", builderA, &dp_, 0);
  auto firstTables = first(a);
  ASSERT_NE(firstTables, nullptr);
  // The operator drains b2: its entries move to the others.
  ASSERT_TRUE(std::holds_alternative<Json>(a.backendDrain("b2")));
  auto second = run(a, 10);
  ASSERT_NE(second, nullptr);
  const std::uint32_t b2 = builderA.indexOf(backendIdFromName("b2"));
  // Two flows still on b2 (exceptions now), one of them idle for 5 s.
  std::uint64_t onB2 = 0;
  for (std::uint64_t h = 1; onB2 < 2; ++h) {
    if (firstTables->vips[0].table.lookup(h * 7919) == b2) {
      dp_.exportFlows.push_back(
          ExportedFlow{h * 7919, b2, FlowState::Established, onB2 == 0 ? 0u : 5'000u});
      ++onB2;
    }
  }
  for (Millis t = 20; t < 400 && a.affinity().stats().checkpoints == 0; t += 10) run(a, t);
  ASSERT_EQ(a.affinity().stats().checkpoints, 1u) << a.affinity().stats().lastError;
  EXPECT_EQ(a.affinity().stats().lastExceptions, 2u);
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/flows.ckpt"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/tables.json"));

  // A new process (b2 is Active again: this test has no journal). Its first
  // snapshot has the first one's table and knows both flows.
  SnapshotBuilder builderB;
  ASSERT_FALSE(builderB.setConfig(config()));
  dp_.reset();
  ControlPlane b(config(), "test.toml", builderB, &dp_, 0);
  EXPECT_TRUE(b.warmingUp());
  auto restarted = first(b);
  ASSERT_NE(restarted, nullptr);
  const auto before = second->vips[0].table.entries();
  const auto after = restarted->vips[0].table.entries();
  ASSERT_EQ(before.size(), after.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < before.size(); ++i) {
    differ += builderA.idAt(before[i]) != builderB.idAt(after[i]);
  }
  EXPECT_EQ(differ, 0u);
  ASSERT_NE(restarted->exceptions, nullptr);
  EXPECT_EQ(restarted->exceptions->size(), 2u);
  const std::uint32_t b2InB = builderB.indexOf(backendIdFromName("b2"));
  std::size_t found = 0;
  for (std::uint64_t h = 1; h < 100000; ++h) {
    const ExceptionTable::Hit hit = restarted->exceptions->find(h * 7919);
    if (hit.backend != b2InB) continue;
    ++found;
    // Restored: a worker that adopts it records the checkpoint as its keeper.
    EXPECT_EQ(hit.origin, ExceptionOrigin::Checkpoint);
  }
  EXPECT_EQ(found, 2u);
  EXPECT_EQ(b.affinity().stats().restoredAtStart, 2u);
}

// Second chance across a restart: the new process's first tables name the
// same previous owner for every slot as the old one's last (history.bin).
TEST_F(AffinityRestart, SecondProcessNamesTheSamePreviousOwners) {
  const Config c = secondChanceConfig();
  SnapshotBuilder builderA;
  ASSERT_FALSE(builderA.setConfig(c));
  ControlPlane a(c, "test.toml", builderA, &dp_, 0);
  auto firstTables = first(a);
  ASSERT_NE(firstTables, nullptr);
  ASSERT_TRUE(std::holds_alternative<Json>(a.backendDrain("b2")));
  auto second = run(a, 10);
  ASSERT_NE(second, nullptr);
  ASSERT_NE(second->vips[0].previousOwner, nullptr);
  // The first checkpoint may have begun on the first tables: wait for one of
  // the second's.
  for (Millis t = 20; t < 60'000 && a.affinity().stats().checkpoints < 2; t += 10) run(a, t);
  ASSERT_GE(a.affinity().stats().checkpoints, 2u) << a.affinity().stats().lastError;
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/history.bin"));

  SnapshotBuilder builderB;
  ASSERT_FALSE(builderB.setConfig(c));
  dp_.reset();
  ControlPlane b(c, "test.toml", builderB, &dp_, 1'000);
  auto restarted = first(b);
  ASSERT_NE(restarted, nullptr);
  std::string said;
  for (const Event& e : b.events().since(0, 100).events) said += e.kind + ": " + e.cause + "\n";
  EXPECT_NE(said.find("second chance: the slot history of 1 VIP(s) restored"), std::string::npos)
      << said;
  ASSERT_NE(restarted->vips[0].previousOwner, nullptr) << "the history came back";
  const auto& was = *second->vips[0].previousOwner;
  const auto& is = *restarted->vips[0].previousOwner;
  ASSERT_EQ(was.size(), is.size());
  std::size_t named = 0;
  for (std::size_t slot = 0; slot < was.size(); ++slot) {
    ASSERT_EQ(builderA.idAt(was[slot]), builderB.idAt(is[slot])) << "slot " << slot;
    named += was[slot] != 0;
  }
  EXPECT_GT(named, 0u);
  std::size_t namedB2 = 0;
  for (const std::uint32_t owner : is) {
    namedB2 += owner != 0 && builderB.idAt(owner) == backendIdFromName("b2");
  }
  EXPECT_GT(namedB2, named * 9 / 10) << "mostly b2's slots moved (Maglev moves a few others)";
  // Without the file the new process starts with no history.
  std::filesystem::remove(dir_ + "/history.bin");
  SnapshotBuilder builderC;
  ASSERT_FALSE(builderC.setConfig(c));
  dp_.reset();
  ControlPlane d(c, "test.toml", builderC, &dp_, 1'000);
  auto bare = first(d);
  ASSERT_NE(bare, nullptr);
  EXPECT_EQ(bare->vips[0].previousOwner, nullptr);
}

// A checkpoint cut short (a kill part-way through its files, or a file that
// cannot be written) never leaves tables newer than their history: a
// restarted instance would take the newer tables' owners as the origins of
// the slots the step moved and name them on second chance.
TEST_F(AffinityRestart, CheckpointCutShortNeverLeavesTablesNewerThanTheirHistory) {
  const Config c = secondChanceConfig();
  SnapshotBuilder builderA;
  ASSERT_FALSE(builderA.setConfig(c));
  ControlPlane a(c, "test.toml", builderA, &dp_, 0);
  auto firstTables = first(a);
  ASSERT_NE(firstTables, nullptr);
  Millis t = 10;
  for (; t < 60'000 && a.affinity().stats().checkpoints < 1; t += 10) run(a, t);
  ASSERT_GE(a.affinity().stats().checkpoints, 1u) << a.affinity().stats().lastError;
  const auto checkpointed = dp_.latest;  // the tables the checkpoint wrote
  // history.bin cannot be written from now on (its temporary file's name is
  // a directory).
  ASSERT_TRUE(std::filesystem::create_directory(dir_ + "/history.bin.tmp"));
  ASSERT_TRUE(std::holds_alternative<Json>(a.backendDrain("b2")));
  auto second = run(a, t += 500);
  ASSERT_NE(second, nullptr);
  ASSERT_NE(second->vips[0].previousOwner, nullptr);
  for (t += 10; t < 30'000 && a.affinity().stats().failures == 0; t += 10) run(a, t);
  ASSERT_GE(a.affinity().stats().failures, 1u);

  // tables.json still holds the checkpointed tables (the history beside it
  // is theirs), not the drain's.
  std::string error;
  const auto text = readStateFile(dir_ + "/tables.json", 1 << 20, error);
  ASSERT_TRUE(text) << error;
  const auto saved = decodeTablesState(*text);
  ASSERT_TRUE(std::holds_alternative<TablesState>(saved));
  EXPECT_EQ(std::get<TablesState>(saved).generation, checkpointed->generation);
  EXPECT_LT(checkpointed->generation, second->generation);
}

// `flows adopted` (ControlApi::flowsAdopted): what the workers adopted, named
// (VIP, backend, origin, when), the counts per origin, and the last export's
// tracked flows (the flow table's own exceptions), backends by name.
TEST_F(AffinityRestart, FlowsAdoptedNamesEachAdoptionAndTheFlowTablesOwn) {
  SnapshotBuilder builder;
  ASSERT_FALSE(builder.setConfig(config()));
  ControlPlane a(config(), "test.toml", builder, &dp_, 0);
  auto s = first(a);
  ASSERT_NE(s, nullptr);
  const std::uint32_t b2 = builder.indexOf(backendIdFromName("b2"));
  const std::uint32_t b3 = builder.indexOf(backendIdFromName("b3"));
  dp_.adopted = {
      LcoreAdoptedFlow{3, AdoptedFlow{0x77, b2, ExceptionOrigin::Peer, s->vips[0].tag, 5'000}, 250},
      LcoreAdoptedFlow{4, AdoptedFlow{0x78, b3, ExceptionOrigin::Checkpoint, s->vips[0].tag, 9},
                       1'000}};
  dp_.stats.exceptionHitsByOrigin = {0, 2, 5, 0};
  dp_.exportFlows = {{0x99, b3, FlowState::Established, 0}};
  for (Millis t = 0; t < 400 && a.affinity().stats().checkpoints == 0; t += 10) run(a, t);
  ASSERT_EQ(a.affinity().stats().checkpoints, 1u) << a.affinity().stats().lastError;

  const auto r = a.flowsAdopted();
  ASSERT_TRUE(std::holds_alternative<Json>(r)) << std::get<ApiError>(r).message;
  const Json& j = std::get<Json>(r);
  ASSERT_EQ(j.at("adopted").size(), 2u);
  const Json& p = j.at("adopted")[0];
  EXPECT_EQ(p.at("hash"), 0x77u);
  EXPECT_EQ(p.at("vip"), s->vips[0].name);
  EXPECT_EQ(p.at("backend"), "b2");
  EXPECT_EQ(p.at("origin"), "peer");
  EXPECT_EQ(p.at("lcore"), 3u);
  EXPECT_EQ(p.at("age_ms"), 250u);
  EXPECT_GT(p.at("at_unix_ms").get<std::uint64_t>(), 1'600'000'000'000ULL);
  EXPECT_EQ(j.at("adopted")[1].at("origin"), "checkpoint");
  EXPECT_EQ(j.at("adopted")[1].at("backend"), "b3");
  EXPECT_EQ(j.at("adopted_by_origin"),
            (Json{{"unknown", 0}, {"checkpoint", 2}, {"peer", 5}, {"backend", 0}}));
  EXPECT_EQ(j.at("flow_table").at("total"), 1u);
  EXPECT_EQ(j.at("flow_table").at("flows"),
            (Json::array({Json{{"hash", 0x99}, {"backend", "b3"}}})));
  EXPECT_FALSE(j.at("flow_table").at("export_age_ms").is_null());

  // The same counts in stats and the metrics.
  const Json stats = std::get<Json>(a.stats());
  EXPECT_EQ(stats.at("exception_hits_by_origin").at("peer"), 5u);
  EXPECT_NE(a.metricsText().find("spillway_exception_hits_total{origin=\"checkpoint\"} 2"),
            std::string::npos);
}

TEST_F(AffinityRestart, RestoredFlowsLeaveWhenTrackedAgainOrExpired) {
  {
    SnapshotBuilder builder;
    ASSERT_FALSE(builder.setConfig(config()));
    ControlPlane a(config(), "test.toml", builder, &dp_, 0);
    (void)first(a);
    const std::uint32_t b1 = builder.indexOf(backendIdFromName("b1"));
    dp_.exportFlows = {{0xA, b1, FlowState::Established, 0},
                       {0xB, b1, FlowState::Closing, 2'000},  // 8 s left of 10
                       {0xC, b1, FlowState::Established, 0}};
    for (Millis t = 0; t < 200 && a.affinity().stats().checkpoints == 0; t += 10) run(a, t);
    ASSERT_EQ(a.affinity().stats().checkpoints, 1u);
  }
  SnapshotBuilder builder;
  ASSERT_FALSE(builder.setConfig(config()));
  dp_.reset();
  ControlPlane b(config(), "test.toml", builder, &dp_, 0);
  ASSERT_EQ(b.affinity().stats().restoredAtStart, 3u);
  auto s = first(b);
  ASSERT_NE(s->exceptions, nullptr);
  EXPECT_EQ(s->exceptions->size(), 3u);
  // 0xA is tracked again by a worker; 0xB's closing timeout runs out.
  dp_.exportFlows = {{0xA, builder.indexOf(backendIdFromName("b1")), FlowState::Established, 0}};
  std::shared_ptr<const ForwardingSnapshot> latest;
  for (Millis t = 11'000; t < 40'000 && b.affinity().stats().restoredAlive != 1; t += 100) {
    if (auto n = run(b, t)) latest = n;
  }
  EXPECT_EQ(b.affinity().stats().restoredAlive, 1u);
  for (Millis t = 40'000; t < 40'500; t += 100) {
    if (auto n = run(b, t)) latest = n;
  }
  ASSERT_NE(latest, nullptr);
  ASSERT_NE(latest->exceptions, nullptr);
  EXPECT_EQ(latest->exceptions->size(), 1u);
  EXPECT_NE(latest->exceptions->find(0xC).backend, 0u);
  EXPECT_EQ(latest->exceptions->find(0xA).backend, 0u);
  EXPECT_EQ(latest->exceptions->find(0xB).backend, 0u);
}

TEST_F(AffinityRestart, DamagedCheckpointIsIgnoredWithAnEventAndNothingBlocksTheStart) {
  {
    std::FILE* f = std::fopen((dir_ + "/flows.ckpt").c_str(), "w");
    std::fputs("SPWFLOW1 truncated", f);
    std::fclose(f);
    f = std::fopen((dir_ + "/tables.json").c_str(), "w");
    std::fputs("{not json", f);
    std::fclose(f);
  }
  SnapshotBuilder builder;
  ASSERT_FALSE(builder.setConfig(config()));
  ControlPlane c(config(), "test.toml", builder, &dp_, 0);
  EXPECT_FALSE(c.warmingUp());
  auto s = first(c);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->exceptions, nullptr);
  const auto page = c.events().since(0, 100);
  int ignored = 0;
  for (const auto& e : page.events)
    ignored += e.kind == kEventCheckpoint && e.cause.find("ignored") != std::string::npos;
  EXPECT_EQ(ignored, 2);
}

TEST_F(AffinityRestart, NoStateDirWritesNothing) {
  Config cfg = config();
  cfg.control.stateDir = "";
  SnapshotBuilder builder;
  ASSERT_FALSE(builder.setConfig(cfg));
  ControlPlane c(cfg, "test.toml", builder, &dp_, 0);
  (void)first(c);
  for (Millis t = 0; t < 500; t += 10) run(c, t);
  EXPECT_EQ(dp_.exportAsked, 0u);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/flows.ckpt"));
}

TEST_F(AffinityRestart, UnwritableStateDirIsCountedNotFatal) {
  Config cfg = config();
  cfg.control.stateDir = dir_ + "/file";
  std::FILE* f = std::fopen(cfg.control.stateDir.c_str(), "w");
  std::fclose(f);
  SnapshotBuilder builder;
  ASSERT_FALSE(builder.setConfig(cfg));
  ControlPlane c(cfg, "test.toml", builder, &dp_, 0);
  (void)first(c);
  for (Millis t = 0; t < 500; t += 10) run(c, t);
  EXPECT_GE(c.affinity().stats().failures, 1u);
  EXPECT_NE(c.affinity().stats().lastError, "");
  EXPECT_EQ(c.affinity().stats().checkpoints, 0u);
}

// A checkpoint written on the writer's thread: while the disk stalls (the
// writer held) the control loop goes on ticking and publishing, the peers'
// exports go on, no second checkpoint starts; once the disk answers, the
// checkpoint counts with the files on disk.
TEST_F(AffinityRestart, CheckpointOnAStalledDiskNeverStallsTheControlLoop) {
  Config cfg = config();
  cfg.tier.node = "lb1";  // a peer: exports for it every sync_interval too
  cfg.tier.peers = {{"lb2", "127.0.0.1:9"}};
  SnapshotBuilder builder;
  ASSERT_FALSE(builder.setConfig(cfg));
  ControlPlane c(cfg, "test.toml", builder, &dp_, 0);
  c.writeCheckpointsInBackground();
  DurableWriter& writer = c.checkpointWriterForTest();
  writer.holdForTest(true);
  (void)first(c);
  const std::uint32_t b1 = builder.indexOf(backendIdFromName("b1"));
  dp_.exportFlows = {{0xA, b1, FlowState::Established, 0}};
  Millis t = 0;
  for (; t < 1'000 && !writer.busy(); t += 10) run(c, t);
  ASSERT_TRUE(writer.busy()) << "no checkpoint started";
  const std::uint64_t asked = dp_.exportAsked;
  // Twenty seconds of control loop while the disk does not answer: tables
  // go out, the peers' exports go on, no second checkpoint starts.
  ASSERT_TRUE(std::holds_alternative<Json>(c.backendDrain("b2")));
  std::uint64_t published = 0;
  for (const Millis end = t + 20'000; t < end; t += 50) published += run(c, t) != nullptr;
  EXPECT_GE(published, 1u);
  EXPECT_GE(dp_.exportAsked, asked + 10);  // sync_interval 1 s over 20 s
  EXPECT_EQ(c.affinity().stats().checkpoints, 0u);
  EXPECT_TRUE(writer.busy());
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/flows.ckpt"));
  // The disk answers: the checkpoint counts at the next tick, files on disk,
  // and the drain's tables get their own checkpoint after it.
  writer.holdForTest(false);
  writer.waitFinishedForTest();
  run(c, t);
  EXPECT_EQ(c.affinity().stats().checkpoints, 1u) << c.affinity().stats().lastError;
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/flows.ckpt"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/tables.json"));
  for (Millis end = t + 1'000; t < end && !writer.busy(); t += 10) run(c, t);
  ASSERT_TRUE(writer.busy()) << "the newer tables were never checkpointed";
  writer.waitFinishedForTest();
  run(c, t + 10);
  EXPECT_EQ(c.affinity().stats().checkpoints, 2u);
  EXPECT_EQ(c.affinity().stats().lastGeneration, c.generation());
}

TEST(DurableWriterThread, WritesInOrderOneBatchAtATimeAndFlushesOnDestruction) {
  char tmpl[] = "/tmp/spillway-writer-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  {
    DurableWriter w(DurableWriter::Mode::Thread);
    w.holdForTest(true);
    ASSERT_TRUE(w.submit({{dir + "/a", "one"}, {dir + "/b", "two"}}));
    EXPECT_TRUE(w.busy());
    EXPECT_FALSE(w.submit({{dir + "/c", "refused"}}));  // one batch at a time
    EXPECT_FALSE(w.poll().has_value());                 // held: not written yet
    w.holdForTest(false);
    auto r = w.wait();
    ASSERT_TRUE(r.has_value());
    EXPECT_FALSE(r->error.has_value()) << *r->error;
    EXPECT_FALSE(w.busy());
    EXPECT_FALSE(w.poll().has_value());  // the result is handed back once
    std::string error;
    EXPECT_EQ(readStateFile(dir + "/a", 100, error).value_or(""), "one");
    EXPECT_EQ(readStateFile(dir + "/b", 100, error).value_or(""), "two");
    EXPECT_FALSE(std::filesystem::exists(dir + "/c"));
    // A failing batch says why; the next one is accepted.
    ASSERT_TRUE(w.submit({{dir + "/missing/x", "no"}}));
    r = w.wait();
    ASSERT_TRUE(r.has_value() && r->error.has_value());
    EXPECT_NE(r->error->find(dir + "/missing"), std::string::npos) << *r->error;
    // Destroyed with a batch queued: it is written before the thread ends.
    ASSERT_TRUE(w.submit({{dir + "/d", "last"}}));
  }
  std::string error;
  EXPECT_EQ(readStateFile(dir + "/d", 100, error).value_or(""), "last");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace spillway
