// Operator intent: the journal's format and replay (every command, torn tail,
// corrupt record, compaction), the overlay and its merge with the file, and
// the control plane's use of both: replay at start, atomic reload that keeps
// intent, clear-overrides, and a journal that cannot be written.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "control/intent/intent_journal.hpp"
#include "control/intent/intent_merge.hpp"
#include "control/plane/control_plane.hpp"
#include "estate_fixture.hpp"
#include "fake_dataplane.hpp"
#include "plane_on_file.hpp"

namespace spillway {
namespace {

namespace fs = std::filesystem;

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("intent") {}
};
using test::readAll;
using test::writeAll;

IntentRecord record(IntentOp op, std::string name, std::uint64_t id = 7) {
  IntentRecord r;
  r.op = op;
  r.backend = std::move(name);
  r.id = id;
  r.wallMs = 1'700'000'000'000;
  return r;
}

IntentRecord addRecord(std::string name, std::string address, bool mac) {
  IntentRecord r = record(IntentOp::Add, std::move(name), 4242);
  r.address = parseIpAddress(address).value();
  r.pool = "a";
  r.port = "p0";
  r.weight = 70;
  if (mac) r.mac = parseMacAddress("02:00:00:00:00:42").value();
  return r;
}

// One record of every kind a command can write.
std::vector<IntentRecord> everyCommand() {
  std::vector<IntentRecord> v;
  v.push_back(addRecord("b5", "10.0.0.15", true));
  v.push_back(addRecord("b6", "2001:db8::6", false));
  v.push_back(record(IntentOp::Drain, "b1"));
  v.push_back(record(IntentOp::Disable, "b2"));
  v.push_back(record(IntentOp::Enable, "b2"));
  v.push_back(record(IntentOp::Drain, "b3"));
  v.push_back(record(IntentOp::Undrain, "b3"));
  IntentRecord w = record(IntentOp::Weight, "b4");
  w.weight = 250;
  w.baseWeight = 100;
  v.push_back(w);
  v.push_back(record(IntentOp::Remove, "b6"));
  v.push_back(record(IntentOp::Remove, "b7"));
  v.push_back(record(IntentOp::Drain, "b8"));
  v.push_back(record(IntentOp::ClearOverrides, "b8"));
  return v;
}

TEST(IntentRecord, EncodeDecodeRoundTripEveryOp) {
  std::string bytes;
  std::vector<IntentRecord> records = everyCommand();
  records.push_back(record(IntentOp::ClearOverrides, ""));
  std::uint64_t seq = 1;
  for (IntentRecord& r : records) {
    r.seq = seq++;
    bytes += encodeIntentRecord(r);
  }
  const IntentDecoded d =
      decodeIntentRecords({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()}, "x");
  EXPECT_FALSE(d.damage);
  EXPECT_EQ(d.goodBytes, bytes.size());
  EXPECT_EQ(d.records, records);
  // The layout the header's design note states.
  EXPECT_EQ(encodeIntentRecord(record(IntentOp::Drain, "gpu-a1")).size(), 54u);
}

TEST(IntentOverlay, FoldRules) {
  IntentOverlay o;
  std::uint64_t seq = 1;
  for (IntentRecord r : everyCommand()) {
    r.seq = seq++;
    o.apply(r);
  }
  ASSERT_NE(o.find("b1"), nullptr);
  EXPECT_EQ(o.find("b1")->admin, AdminState::Draining);
  EXPECT_EQ(o.find("b2")->admin, AdminState::Enabled);
  EXPECT_EQ(o.find("b3")->admin, AdminState::Enabled);
  EXPECT_EQ(o.find("b4")->weight, 250u);
  EXPECT_EQ(o.find("b4")->weightReplaced, 100u);
  ASSERT_TRUE(o.find("b5")->added);
  EXPECT_TRUE(o.find("b5")->added->mac);
  EXPECT_TRUE(o.find("b6")->added && o.find("b6")->removed);  // removal may still drain
  EXPECT_TRUE(o.find("b7")->removed);
  EXPECT_EQ(o.find("b8"), nullptr);  // cleared
  // Its records fold into the same overlay.
  IntentOverlay again;
  for (const IntentRecord& r : o.toRecords()) again.apply(r);
  EXPECT_EQ(again, o);
}

TEST(IntentJournal, AppendReplayEveryCommand) {
  TempDir dir;
  IntentOverlay expected;
  {
    IntentJournal j(dir.path());
    ASSERT_TRUE(j.open()) << j.error();
    for (IntentRecord r : everyCommand()) {
      ASSERT_FALSE(j.append(r));
      expected.apply(r);
    }
    EXPECT_EQ(j.lastSeq(), everyCommand().size());
    EXPECT_EQ(j.overlay(), expected);
  }
  IntentJournal j(dir.path());
  ASSERT_TRUE(j.open()) << j.error();
  EXPECT_TRUE(j.damage().empty());
  EXPECT_EQ(j.replayedRecords(), everyCommand().size());
  EXPECT_EQ(j.lastSeq(), everyCommand().size());
  EXPECT_EQ(j.overlay(), expected);
  // Sequence numbers continue after a restart.
  IntentRecord r = record(IntentOp::Drain, "b9");
  ASSERT_FALSE(j.append(r));
  EXPECT_EQ(r.seq, everyCommand().size() + 1);
}

TEST(IntentJournal, TornTailIsIgnoredAndCutOff) {
  TempDir dir;
  {
    IntentJournal j(dir.path());
    ASSERT_TRUE(j.open());
    for (const char* name : {"b1", "b2", "b3"}) {
      IntentRecord r = record(IntentOp::Drain, name);
      ASSERT_FALSE(j.append(r));
    }
  }
  const std::string path = dir / "intent.journal";
  const std::string whole = readAll(path);
  // A crash in the middle of the third record's write.
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(whole.size() - 10)), 0);
  {
    IntentJournal j(dir.path());
    ASSERT_TRUE(j.open()) << j.error();
    ASSERT_EQ(j.damage().size(), 1u);
    EXPECT_EQ(j.damage()[0].kind, IntentDamage::Kind::TornTail);
    EXPECT_EQ(j.replayedRecords(), 2u);
    EXPECT_NE(j.overlay().find("b2"), nullptr);
    EXPECT_EQ(j.overlay().find("b3"), nullptr);
    EXPECT_EQ(readAll(path).size(), whole.size() / 3 * 2);  // cut back to the whole records
    IntentRecord r = record(IntentOp::Drain, "b4");
    ASSERT_FALSE(j.append(r));
    EXPECT_EQ(r.seq, 3u);
  }
  IntentJournal j(dir.path());
  ASSERT_TRUE(j.open());
  EXPECT_TRUE(j.damage().empty());
  EXPECT_EQ(j.replayedRecords(), 3u);
  EXPECT_NE(j.overlay().find("b4"), nullptr);
}

TEST(IntentJournal, ZeroFilledTailIsTorn) {
  TempDir dir;
  {
    IntentJournal j(dir.path());
    ASSERT_TRUE(j.open());
    IntentRecord r = record(IntentOp::Drain, "b1");
    ASSERT_FALSE(j.append(r));
  }
  std::ofstream(dir / "intent.journal", std::ios::binary | std::ios::app) << std::string(40, '\0');
  IntentJournal j(dir.path());
  ASSERT_TRUE(j.open());
  ASSERT_EQ(j.damage().size(), 1u);
  EXPECT_EQ(j.damage()[0].kind, IntentDamage::Kind::TornTail);
  EXPECT_EQ(j.replayedRecords(), 1u);
}

TEST(IntentJournal, CorruptRecordIsReportedAndSetAside) {
  TempDir dir;
  {
    IntentJournal j(dir.path());
    ASSERT_TRUE(j.open());
    for (const char* name : {"b1", "b2", "b3"}) {
      IntentRecord r = record(IntentOp::Disable, name);
      ASSERT_FALSE(j.append(r));
    }
  }
  const std::string path = dir / "intent.journal";
  std::string bytes = readAll(path);
  const std::size_t recordBytes = bytes.size() / 3;
  bytes[recordBytes + kIntentHeaderBytes + 20] ^= 0x5A;  // the second record's name
  writeAll(path, bytes);
  {
    IntentJournal j(dir.path());
    ASSERT_TRUE(j.open()) << j.error();
    ASSERT_EQ(j.damage().size(), 1u);
    EXPECT_EQ(j.damage()[0].kind, IntentDamage::Kind::Corrupt);
    EXPECT_EQ(j.damage()[0].offset, recordBytes);
    EXPECT_EQ(j.replayedRecords(), 1u);
    EXPECT_NE(j.overlay().find("b1"), nullptr);
    EXPECT_EQ(j.overlay().find("b3"), nullptr);
    bool aside = false;
    for (const auto& e : fs::directory_iterator(dir.path())) {
      aside = aside || e.path().filename().string().starts_with("intent.journal.damaged-");
    }
    EXPECT_TRUE(aside);
    EXPECT_EQ(readAll(path).size(), 0u);  // compacted into the snapshot
    IntentRecord r = record(IntentOp::Drain, "b4");
    ASSERT_FALSE(j.append(r));
    EXPECT_EQ(r.seq, 2u);
  }
  IntentJournal j(dir.path());
  ASSERT_TRUE(j.open());
  EXPECT_TRUE(j.damage().empty());
  EXPECT_NE(j.overlay().find("b1"), nullptr);
  EXPECT_NE(j.overlay().find("b4"), nullptr);
}

TEST(IntentJournal, RandomDamageNeverCrashes) {
  TempDir dir;
  std::string good;
  {
    IntentJournal j(dir.path());
    ASSERT_TRUE(j.open());
    for (IntentRecord r : everyCommand()) ASSERT_FALSE(j.append(r));
    good = readAll(dir / "intent.journal");
  }
  std::mt19937 rng(1);
  for (int i = 0; i < 50; ++i) {
    std::string bytes = good;
    for (int k = 0; k < 3; ++k) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    bytes.resize(rng() % (bytes.size() + 1));
    std::error_code ec;
    fs::remove(dir / "intent.snapshot", ec);
    writeAll(dir / "intent.journal", bytes);
    IntentJournal j(dir.path());
    EXPECT_TRUE(j.open()) << j.error();
    EXPECT_LE(j.replayedRecords(), everyCommand().size());
  }
}

TEST(IntentJournal, CompactionKeepsTheOverlay) {
  TempDir dir;
  IntentOverlay expected;
  std::string before;
  {
    IntentJournal j(dir.path());
    ASSERT_TRUE(j.open());
    for (IntentRecord r : everyCommand()) {
      ASSERT_FALSE(j.append(r));
      expected.apply(r);
    }
    before = readAll(dir / "intent.journal");
    ASSERT_FALSE(j.compact());
    EXPECT_EQ(j.journalRecords(), 0u);
    EXPECT_EQ(readAll(dir / "intent.journal").size(), 0u);
    EXPECT_FALSE(fs::exists(dir / "intent.snapshot.tmp"));
  }
  {
    IntentJournal j(dir.path());
    ASSERT_TRUE(j.open());
    EXPECT_TRUE(j.damage().empty());
    EXPECT_EQ(j.overlay(), expected);
    EXPECT_EQ(j.lastSeq(), everyCommand().size());
  }
  // A crash between the snapshot's rename and the journal's truncate: the
  // old records are covered by the snapshot and not applied twice.
  writeAll(dir / "intent.journal", before);
  IntentJournal j(dir.path());
  ASSERT_TRUE(j.open());
  EXPECT_EQ(j.overlay(), expected);
  EXPECT_EQ(j.lastSeq(), everyCommand().size());
}

TEST(IntentJournal, CompactsAutomatically) {
  TempDir dir;
  IntentJournal j(dir.path());
  ASSERT_TRUE(j.open());
  for (std::size_t i = 0; i < kCompactRecords; ++i) {
    IntentRecord r = record(i % 2 ? IntentOp::Drain : IntentOp::Undrain, "b1");
    ASSERT_FALSE(j.append(r));
  }
  EXPECT_EQ(j.journalRecords(), 0u);
  EXPECT_TRUE(fs::exists(dir / "intent.snapshot"));
  IntentJournal again(dir.path());
  ASSERT_TRUE(again.open());
  EXPECT_EQ(again.overlay(), j.overlay());
  EXPECT_EQ(again.lastSeq(), kCompactRecords);
}

TEST(IntentJournal, CorruptSnapshotIsReported) {
  TempDir dir;
  {
    IntentJournal j(dir.path());
    ASSERT_TRUE(j.open());
    IntentRecord r = record(IntentOp::Drain, "b1");
    ASSERT_FALSE(j.append(r));
    ASSERT_FALSE(j.compact());
    IntentRecord r2 = record(IntentOp::Drain, "b2");
    ASSERT_FALSE(j.append(r2));
  }
  std::string snap = readAll(dir / "intent.snapshot");
  snap[snap.size() - 3] ^= 1;
  writeAll(dir / "intent.snapshot", snap);
  IntentJournal j(dir.path());
  ASSERT_TRUE(j.open());
  ASSERT_EQ(j.damage().size(), 1u);
  EXPECT_EQ(j.damage()[0].kind, IntentDamage::Kind::CorruptSnapshot);
  EXPECT_EQ(j.overlay().find("b1"), nullptr);  // lost, and said so
  EXPECT_NE(j.overlay().find("b2"), nullptr);
}

TEST(IntentJournal, UnusableDirectoryRefusesEveryAppend) {
  TempDir dir;
  writeAll(dir / "file", "x");
  IntentJournal j(dir / "file/state");
  EXPECT_FALSE(j.open());
  EXPECT_FALSE(j.usable());
  IntentRecord r = record(IntentOp::Drain, "b1");
  const auto e = j.append(r);
  ASSERT_TRUE(e);
  EXPECT_NE(e->find("cannot be saved"), std::string::npos) << *e;
  EXPECT_TRUE(j.overlay().empty());
}

TEST(IntentJournal, EmptyDirectoryKeepsIntentInMemory) {
  IntentJournal j("");
  ASSERT_TRUE(j.open());
  IntentRecord r = record(IntentOp::Drain, "b1");
  ASSERT_FALSE(j.append(r));
  EXPECT_EQ(r.seq, 1u);
  EXPECT_NE(j.overlay().find("b1"), nullptr);
}

// --- Control plane ---------------------------------------------------------------

std::string configText(const std::string& stateDir, const std::string& extra = {},
                       const std::string& b2Weight = "100", bool withB3 = true) {
  std::string t = test::fileEstateHead(stateDir) + R"(
[[vip]]
name = "v"
address = "192.0.2.1"
protocol = "tcp"
table_size = 251
pools = ["a"]
)";
  t += test::backendToml("b1", "10.0.0.11", "a");
  t += test::backendToml("b2", "10.0.0.12", "a", "weight = " + b2Weight + "\n");
  if (withB3) t += test::backendToml("b3", "10.0.0.13", "a");
  t += test::backendToml("b4", "10.0.0.14", "a");
  return t + extra;
}

constexpr const char* kSecondVip = R"(
[[vip]]
name = "w"
address = "192.0.2.2"
protocol = "tcp"
table_size = 251
pools = ["a"]
)";

const std::string& okJson(const ApiResult& r, std::string& storage) {
  if (const auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << e->code << ": " << e->message;
    storage.clear();
    return storage;
  }
  storage = std::get<Json>(r).dump();
  return storage;
}

#define EXPECT_OK(call)       \
  do {                        \
    std::string s_;           \
    (void)okJson((call), s_); \
  } while (false)

// A control plane on a file in a temporary directory, with a fake wall
// clock and flow counts of 0 from a fake data path.
class Daemon : public test::PlaneOnFile {
 public:
  Daemon(const TempDir& dir, const std::string& text, const std::int64_t* wall, Millis now = 1000)
      : PlaneOnFile(dir, text, now, wall) {}

  SnapshotBuilder& builder() { return builder_; }
  void rewrite(const std::string& text) { writeAll(path_, text); }
  const BackendConfig* backend(const std::string& name) const {
    for (const BackendConfig& b : cp_->config().backends) {
      if (b.name == name) return &b;
    }
    return nullptr;
  }
  std::optional<std::string> state(const std::string& name) {
    const ApiResult r = cp_->backendList();
    for (const Json& b : std::get<Json>(r)) {
      if (b["name"] == name) return b["state"].get<std::string>();
    }
    return std::nullopt;
  }
  // Ticks until the flow count (0) reached the states, within a bound.
  void settleFlows(Millis& now) {
    for (int i = 0; i < 5; ++i) {
      now += 1100;
      (void)cp_->tick(now);
      (void)cp_->tick(now);
    }
  }

  [[nodiscard]] std::size_t vipSyncs() const { return dp_.vipSyncs.size(); }
  [[nodiscard]] std::size_t vipCount() const {
    return dp_.vipSyncs.empty() ? 0 : dp_.vipSyncs.back().size();
  }
  void failVipSync(bool fail) {
    dp_.vipSyncError = fail ? std::optional<std::string>("bpf map update failed") : std::nullopt;
  }
};

BackendSpec spec(std::string name, std::string address, std::uint32_t weight = 100) {
  BackendSpec s;
  s.name = std::move(name);
  s.address = std::move(address);
  s.pool = "a";
  s.weight = weight;
  return s;
}

TEST(ControlIntent, ReplayRestoresEveryCommand) {
  TempDir dir;
  std::int64_t wall = 1'700'000'000'000;
  const std::string text = configText(dir / "state");
  {
    Daemon d(dir, text, &wall);
    d.setFlows(3);  // the drain has flows to wait for
    EXPECT_OK(d.cp().backendDrain("b1"));
    EXPECT_OK(d.cp().backendDisable("b2"));
    EXPECT_OK(d.cp().backendWeight("b3", 250, false));
    EXPECT_OK(d.cp().backendAdd(spec("b5", "10.0.0.15", 70)));
    EXPECT_OK(d.cp().backendRemove("b4"));
    EXPECT_EQ(d.cp().intent().lastSeq(), 5u);
  }
  wall += 10'000;  // the restart took 10 s
  Daemon d(dir, text, &wall, 500);
  EXPECT_EQ(d.state("b1"), "draining");
  EXPECT_EQ(d.state("b2"), "disabled");
  EXPECT_EQ(d.state("b3"), "active");
  ASSERT_NE(d.backend("b3"), nullptr);
  EXPECT_EQ(d.backend("b3")->weight, 250u);
  ASSERT_NE(d.backend("b5"), nullptr);
  EXPECT_EQ(d.backend("b5")->weight, 70u);
  EXPECT_EQ(d.backend("b5")->address, parseIpAddress("10.0.0.15").value());
  EXPECT_EQ(d.state("b5"), "active");
  // b4's removal was journaled; with no live flows after the restart it
  // completes, and b4 stays out.
  Millis now = 500;
  d.settleFlows(now);
  EXPECT_EQ(d.backend("b4"), nullptr);
  // The drain kept its clock: 60 s deadline, 10 s already spent.
  const BackendConfig* b1 = d.backend("b1");
  ASSERT_NE(b1, nullptr);
  const auto& report = d.cp().startupReport();
  ASSERT_FALSE(report.empty());
  EXPECT_NE(report[0].find("replayed 5 record(s)"), std::string::npos) << report[0];
  const Json dump = std::get<Json>(d.cp().configDump(true));
  bool sawDrain = false;
  for (const Json& b : dump["backends"]) {
    if (b["name"] == "b1") {
      sawDrain = true;
      EXPECT_EQ(b["sources"]["admin"]["source"], "runtime");
      EXPECT_EQ(b["sources"]["admin"]["seq"], 1);
      EXPECT_EQ(b["sources"]["weight"]["source"], "file");
    }
    if (b["name"] == "b3") {
      EXPECT_EQ(b["sources"]["weight"]["seq"], 3);
    }
    if (b["name"] == "b5") {
      EXPECT_EQ(b["sources"]["definition"]["seq"], 4);
    }
    if (b["name"] == "b4") {
      EXPECT_EQ(b["state"], "removed");
    }
  }
  EXPECT_TRUE(sawDrain);
}

TEST(ControlIntent, ReplayedDrainKeepsItsDeadline) {
  TempDir dir;
  std::int64_t wall = 1'700'000'000'000;
  const std::string text = configText(dir / "state");
  {
    Daemon d(dir, text, &wall);
    EXPECT_OK(d.cp().backendDrain("b1"));
  }
  wall += 50'000;  // 50 of the 60 s spent
  Daemon d(dir, text, &wall, 100);
  d.setFlows(5);
  Millis now = 100;
  d.settleFlows(now);  // 5.5 s
  EXPECT_EQ(d.state("b1"), "draining");
  now += 5'000;  // past the replayed deadline, flows still live
  (void)d.cp().tick(now);
  EXPECT_EQ(d.state("b1"), "failed");
}

TEST(ControlIntent, WriteFailureRejectsAndChangesNothing) {
  TempDir dir;
  writeAll(dir / "not-a-dir", "x");
  std::int64_t wall = 1'700'000'000'000;
  Daemon d(dir, configText(dir / "not-a-dir/state"), &wall);
  const std::uint64_t generation = d.cp().generation();
  for (const ApiResult& r :
       {d.cp().backendDrain("b1"), d.cp().backendDisable("b2"), d.cp().backendRemove("b3"),
        d.cp().backendWeight("b4", 7, false), d.cp().backendAdd(spec("b5", "10.0.0.15"))}) {
    ASSERT_TRUE(std::holds_alternative<ApiError>(r));
    EXPECT_EQ(std::get<ApiError>(r).code, "unavailable");
    EXPECT_NE(std::get<ApiError>(r).message.find("not applied"), std::string::npos);
  }
  for (const char* name : {"b1", "b2", "b3", "b4"}) EXPECT_EQ(d.state(name), "active") << name;
  EXPECT_EQ(d.backend("b4")->weight, 100u);
  EXPECT_EQ(d.backend("b5"), nullptr);
  EXPECT_FALSE(d.cp().tick(2000));
  EXPECT_EQ(d.cp().generation(), generation);
  // A dry run changes nothing and needs no journal.
  EXPECT_OK(d.cp().backendWeight("b4", 7, true));
}

TEST(ControlIntent, AppendFailureAfterOpenRejects) {
  TempDir dir;
  std::int64_t wall = 1'700'000'000'000;
  Daemon d(dir, configText(dir / "state"), &wall);
  EXPECT_OK(d.cp().backendDrain("b1"));
  // The disk is full (as far as this process may write).
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto previous = std::signal(SIGXFSZ, SIG_IGN);
  rlimit tight = old;
  tight.rlim_cur = static_cast<rlim_t>(d.cp().intent().journalBytes());
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &tight), 0);
  const ApiResult r = d.cp().backendDisable("b2");
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, previous);
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).code, "unavailable");
  EXPECT_EQ(d.state("b2"), "active");
  EXPECT_EQ(d.cp().intent().lastSeq(), 1u);
  // The next command goes through, and the journal holds just the two.
  EXPECT_OK(d.cp().backendDisable("b2"));
  IntentJournal j(dir / "state");
  ASSERT_TRUE(j.open());
  EXPECT_TRUE(j.damage().empty());
  EXPECT_EQ(j.replayedRecords(), 2u);
}

TEST(ControlIntent, ReloadKeepsIntentAndSaysWhatChanged) {
  TempDir dir;
  std::int64_t wall = 1'700'000'000'000;
  Daemon d(dir, configText(dir / "state"), &wall);
  EXPECT_OK(d.cp().backendDrain("b1"));
  EXPECT_OK(d.cp().backendWeight("b2", 300, false));
  EXPECT_OK(d.cp().backendAdd(spec("b5", "10.0.0.15")));
  d.rewrite(configText(dir / "state", kSecondVip));
  const ApiResult r = d.cp().configReload("");
  std::string s;
  ASSERT_FALSE(okJson(r, s).empty());
  const Json j = std::get<Json>(r);
  EXPECT_EQ(j["applied"], true);
  EXPECT_EQ(j["changes"]["vips_added"], Json::array({"w"}));
  EXPECT_EQ(j["changes"]["backends_added"], Json::array());
  EXPECT_EQ(j["changes"]["backends_draining"], Json::array());
  EXPECT_EQ(d.vipSyncs(), 1u);
  EXPECT_EQ(d.vipCount(), 2u);
  EXPECT_EQ(d.state("b1"), "draining");
  EXPECT_EQ(d.backend("b2")->weight, 300u);
  EXPECT_NE(d.backend("b5"), nullptr);
  EXPECT_EQ(d.cp().config().vips.size(), 2u);
}

TEST(ControlIntent, ReloadFileWinsOnAChangedWeight) {
  TempDir dir;
  std::int64_t wall = 1'700'000'000'000;
  Daemon d(dir, configText(dir / "state"), &wall);
  EXPECT_OK(d.cp().backendWeight("b2", 300, false));
  d.rewrite(configText(dir / "state", "", "150"));
  const Json j = std::get<Json>(d.cp().configReload(""));
  ASSERT_EQ(j["changes"]["overrides_dropped"].size(), 1u);
  EXPECT_EQ(j["changes"]["weights_changed"][0]["to"], 150);
  EXPECT_EQ(d.backend("b2")->weight, 150u);
  EXPECT_TRUE(d.cp().intent().overlay().empty());
}

TEST(ControlIntent, ReloadDroppingABackendDrainsIt) {
  TempDir dir;
  std::int64_t wall = 1'700'000'000'000;
  Daemon d(dir, configText(dir / "state"), &wall);
  Millis now = 1000;
  d.setFlows(4);
  d.settleFlows(now);
  d.rewrite(configText(dir / "state", "", "100", false));
  const Json j = std::get<Json>(d.cp().configReload(""));
  EXPECT_EQ(j["changes"]["backends_draining"], Json::array({"b3"}));
  EXPECT_EQ(d.state("b3"), "draining");
  ASSERT_NE(d.backend("b3"), nullptr);  // its flows continue
  // Its table entries are gone, its index stays for the tracked flows.
  (void)d.cp().tick(now);
  ASSERT_TRUE(d.cp().takeSnapshot(now));
  const Json table = std::get<Json>(d.cp().tableShow("v"));
  for (const Json& b : table["tables"][0]["backends"]) EXPECT_NE(b["backend"], "b3");
  // The flows end: it is removed.
  d.setFlows(0);
  d.settleFlows(now);
  EXPECT_EQ(d.backend("b3"), nullptr);
}

TEST(ControlIntent, RejectedReloadChangesNothing) {
  TempDir dir;
  std::int64_t wall = 1'700'000'000'000;
  Daemon d(dir, configText(dir / "state"), &wall);
  EXPECT_OK(d.cp().backendAdd(spec("b5", "10.0.0.15")));
  EXPECT_OK(d.cp().backendDrain("b1"));
  Millis now = 2000;
  (void)d.cp().tick(now);
  (void)d.cp().tick(now);  // the flow count asked by the first tick arrives
  ASSERT_TRUE(d.cp().takeSnapshot(now));
  const std::uint64_t generation = d.cp().generation();
  const std::string backends = std::get<Json>(d.cp().backendList()).dump();
  const std::string tables = std::get<Json>(d.cp().tableShow("")).dump();
  const std::string dump = std::get<Json>(d.cp().configDump(true)).dump();
  const IntentOverlay overlay = d.cp().intent().overlay();
  auto unchanged = [&](const char* why) {
    EXPECT_FALSE(d.cp().tick(now)) << why;
    EXPECT_EQ(d.cp().generation(), generation) << why;
    EXPECT_EQ(std::get<Json>(d.cp().backendList()).dump(), backends) << why;
    EXPECT_EQ(std::get<Json>(d.cp().tableShow("")).dump(), tables) << why;
    EXPECT_EQ(std::get<Json>(d.cp().configDump(true)).dump(), dump) << why;
    EXPECT_EQ(d.cp().intent().overlay(), overlay) << why;
  };
  // 1. Does not parse.
  d.rewrite("[dataplane\n");
  ASSERT_TRUE(std::holds_alternative<ApiError>(d.cp().configReload("")));
  unchanged("syntax error");
  // 2. The VIP map cannot follow the new VIP set.
  d.failVipSync(true);
  d.rewrite(configText(dir / "state", kSecondVip, "100", false));
  const ApiResult r = d.cp().configReload("");
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_NE(std::get<ApiError>(r).message.find("VIP map"), std::string::npos);
  unchanged("vip sync failed");
  d.failVipSync(false);
  // 3. The file takes the address of a backend the operator added.
  d.rewrite(configText(dir / "state", R"(
[[backend]]
name = "other"
address = "10.0.0.15"
pool = "a"
)"));
  const ApiResult c = d.cp().configReload("");
  ASSERT_TRUE(std::holds_alternative<ApiError>(c));
  EXPECT_EQ(std::get<ApiError>(c).code, "conflict");
  EXPECT_NE(std::get<ApiError>(c).message.find("b5"), std::string::npos);
  unchanged("conflict with a runtime backend");
  // 4. Not a regular file.
  const ApiResult z = d.cp().configReload("/dev/zero");
  ASSERT_TRUE(std::holds_alternative<ApiError>(z));
  EXPECT_NE(std::get<ApiError>(z).message.find("not a regular file"), std::string::npos);
  unchanged("/dev/zero");
}

// --- config check|reload PATH from the CLI socket (issue #13) -------------------

// A socket-group member that is not root, and root.
PeerCredentials member() {
  PeerCredentials p;
  p.uid = 65534;
  p.gid = 65534;
  return p;
}
PeerCredentials rootCaller() {
  PeerCredentials p;
  p.uid = 0;
  p.gid = 0;
  return p;
}

std::string errorOf(const ApiResult& r) {
  const auto* e = std::get_if<ApiError>(&r);
  return e ? e->code + ": " + e->message : std::string("ok");
}

TEST(ControlConfigAccess, NonRootNamesOnlyFilesUnderTheConfigDirectory) {
  TempDir dir;
  TempDir other;
  std::int64_t wall = 1'700'000'000'000;
  Daemon d(dir, configText(dir / "state"), &wall);
  writeAll(other / "x.toml", configText(dir / "state"));
  writeAll(dir / "next.toml", configText(dir / "state"));
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  ASSERT_EQ(::chmod(other.path().c_str(), 0755), 0);
  ASSERT_EQ(::chmod((other / "x.toml").c_str(), 0644), 0);
  ASSERT_EQ(::symlink((other / "x.toml").c_str(), (dir / "link.toml").c_str()), 0);
  const PeerCredentials m = member();
  const PeerCredentials r = rootCaller();

  for (const std::string& path :
       {other / "x.toml", std::string("next.toml"),
        dir / ("../" + fs::path(other.path()).filename().string() + "/x.toml"), dir / "link.toml",
        std::string("/etc/passwd")}) {
    const ApiResult check = d.cp().configCheck(path, &m);
    ASSERT_TRUE(std::holds_alternative<ApiError>(check)) << path;
    EXPECT_EQ(std::get<ApiError>(check).code, "forbidden") << path;
    EXPECT_NE(std::get<ApiError>(check).message.find("only root"), std::string::npos)
        << errorOf(check);
    const ApiResult reload = d.cp().configReload(path, &m);
    EXPECT_EQ(errorOf(reload).rfind("forbidden: ", 0), 0u) << errorOf(reload);
  }
  // The passwd file's contents are never part of the answer.
  EXPECT_EQ(errorOf(d.cp().configCheck("/etc/passwd", &m)).find("root:"), std::string::npos);
  // Under the directory, and the running file itself, are fine; root may name any file.
  EXPECT_EQ(errorOf(d.cp().configCheck(dir / "next.toml", &m)), "ok");
  EXPECT_EQ(errorOf(d.cp().configCheck("", &m)), "ok");
  EXPECT_EQ(errorOf(d.cp().configCheck(other / "x.toml", &r)), "ok");
  EXPECT_EQ(errorOf(d.cp().configReload(dir / "next.toml", &m)), "ok");
}

TEST(ControlConfigAccess, ErrorsOfAFileTheCallerCannotReadQuoteNothingOfIt) {
  TempDir dir;
  std::int64_t wall = 1'700'000'000'000;
  Daemon d(dir, configText(dir / "state"), &wall);
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  const std::string bad = dir / "bad.toml";
  writeAll(bad, configText(dir / "state", R"(
[[backend]]
name = "b9"
address = "secret-token-42"
pool = "a"
)"));
  const std::string broken = dir / "broken.toml";
  writeAll(broken, "[dataplane]\nsecret-syntax-99 = = \"hunter2\"\n");
  const PeerCredentials m = member();
  const PeerCredentials r = rootCaller();

  ASSERT_EQ(::chmod(bad.c_str(), 0600), 0);
  ASSERT_EQ(::chmod(broken.c_str(), 0600), 0);
  const std::string withheld = errorOf(d.cp().configCheck(bad, &m));
  EXPECT_EQ(withheld.rfind("invalid: ", 0), 0u) << withheld;
  EXPECT_EQ(withheld.find("secret-token-42"), std::string::npos) << withheld;
  EXPECT_NE(withheld.find(bad + ":"), std::string::npos) << withheld;  // where: file:line:column
  EXPECT_NE(withheld.find("address"), std::string::npos) << withheld;  // and the field
  EXPECT_NE(withheld.find("withheld"), std::string::npos) << withheld;
  const std::string syntax = errorOf(d.cp().configCheck(broken, &m));
  EXPECT_EQ(syntax.find("secret-syntax-99"), std::string::npos) << syntax;
  EXPECT_EQ(syntax.find("hunter2"), std::string::npos) << syntax;
  // A rejected reload tells the caller (and the event log) no more.
  const std::string reload = errorOf(d.cp().configReload(bad, &m));
  EXPECT_EQ(reload.find("secret-token-42"), std::string::npos) << reload;
  const std::string events = std::get<Json>(d.cp().events(0, 1000)).dump();
  EXPECT_EQ(events.find("secret-token-42"), std::string::npos) << events;
  EXPECT_NE(events.find("rejected " + bad), std::string::npos) << events;

  // Root, or a caller that may read the file, is told everything.
  EXPECT_NE(errorOf(d.cp().configCheck(bad, &r)).find("secret-token-42"), std::string::npos);
  ASSERT_EQ(::chmod(bad.c_str(), 0644), 0);
  EXPECT_NE(errorOf(d.cp().configCheck(bad, &m)).find("secret-token-42"), std::string::npos);
  // Unless a directory above it is closed to the caller.
  ASSERT_EQ(::chmod(dir.path().c_str(), 0700), 0);
  EXPECT_EQ(errorOf(d.cp().configCheck(bad, &m)).find("secret-token-42"), std::string::npos);
}

TEST(ControlIntent, FileDefiningARuntimeBackendWins) {
  TempDir dir;
  std::int64_t wall = 1'700'000'000'000;
  Daemon d(dir, configText(dir / "state"), &wall);
  EXPECT_OK(d.cp().backendAdd(spec("b5", "10.0.0.15", 70)));
  EXPECT_OK(d.cp().backendDrain("b5"));
  d.rewrite(configText(dir / "state", R"(
[[backend]]
name = "b5"
address = "10.0.0.15"
pool = "a"
weight = 90
)"));
  const Json j = std::get<Json>(d.cp().configReload(""));
  EXPECT_EQ(j["changes"]["overrides_dropped"].size(), 1u);
  EXPECT_EQ(d.backend("b5")->weight, 90u);
  EXPECT_EQ(d.state("b5"), "draining");  // the drain stays
  const BackendOverride* o = d.cp().intent().overlay().find("b5");
  ASSERT_NE(o, nullptr);
  EXPECT_FALSE(o->added);
  EXPECT_EQ(o->admin, AdminState::Draining);
}

TEST(ControlIntent, ClearOverrides) {
  TempDir dir;
  std::int64_t wall = 1'700'000'000'000;
  const std::string text = configText(dir / "state");
  Daemon d(dir, text, &wall);
  EXPECT_OK(d.cp().backendDrain("b1"));
  EXPECT_OK(d.cp().backendWeight("b2", 300, false));
  EXPECT_OK(d.cp().backendAdd(spec("b5", "10.0.0.15")));
  EXPECT_OK(d.cp().backendRemove("b4"));
  ASSERT_TRUE(std::holds_alternative<ApiError>(d.cp().configClearOverrides("b3")));

  EXPECT_OK(d.cp().configClearOverrides("b1"));
  EXPECT_EQ(d.state("b1"), "active");
  EXPECT_EQ(d.backend("b2")->weight, 300u);

  const Json j = std::get<Json>(d.cp().configClearOverrides(""));
  EXPECT_EQ(j["changes"]["backends_draining"], Json::array({"b5"}));  // not in the file
  EXPECT_EQ(d.backend("b2")->weight, 100u);
  EXPECT_EQ(d.state("b4"), "active");  // the removal is cancelled
  EXPECT_TRUE(d.cp().intent().overlay().empty());
  EXPECT_EQ(d.cp().intent().lastSeq(), 6u);  // both clears are journaled

  // After a restart nothing comes back.
  wall += 1000;
  Daemon again(dir, text, &wall);
  EXPECT_EQ(again.state("b1"), "active");
  EXPECT_EQ(again.backend("b2")->weight, 100u);
  EXPECT_EQ(again.backend("b5"), nullptr);
  EXPECT_NE(again.backend("b4"), nullptr);
}

TEST(ControlIntent, DamagedJournalIsReportedAtStart) {
  TempDir dir;
  std::int64_t wall = 1'700'000'000'000;
  const std::string text = configText(dir / "state");
  {
    Daemon d(dir, text, &wall);
    EXPECT_OK(d.cp().backendDrain("b1"));
    EXPECT_OK(d.cp().backendDisable("b2"));
  }
  const std::string path = dir / "state/intent.journal";
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(readAll(path).size() - 3)), 0);
  Daemon d(dir, text, &wall);
  EXPECT_EQ(d.state("b1"), "draining");
  EXPECT_EQ(d.state("b2"), "active");
  bool reported = false;
  for (const std::string& line : d.cp().startupReport()) {
    reported = reported || line.find("torn_tail") != std::string::npos;
  }
  EXPECT_TRUE(reported);
  const Json events = std::get<Json>(d.cp().events(0, 1000));
  bool event = false;
  for (const Json& e : events["events"]) {
    event = event || (e["kind"] == "intent" &&
                      e["cause"].get<std::string>().find("torn_tail") != std::string::npos);
  }
  EXPECT_TRUE(event);
}

TEST(ConfigFile, OnlyABoundedRegularFileIsRead) {
  TempDir dir;
  const std::string fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {fifo, std::string("/dev/zero"), dir.path()}) {
    const ConfigResult r = loadConfig(path);  // returns at once, no writer needed
    ASSERT_FALSE(r.ok()) << path;
    EXPECT_NE(formatErrors(r.errors()).find("not a regular file"), std::string::npos)
        << formatErrors(r.errors());
  }
  const std::string big = dir / "big.toml";
  writeAll(big, std::string(kMaxConfigBytes + 1, '#'));
  const ConfigResult r = loadConfig(big);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(formatErrors(r.errors()).find("more than"), std::string::npos);
}

// --- The instance's drain (lb drain) and the announcement hand-over ---------------

TEST(IntentRecord, LbDrainRoundTripsAndFolds) {
  IntentRecord drain;
  drain.seq = 7;
  drain.wallMs = 1234;
  drain.op = IntentOp::LbDrain;
  const std::string bytes = encodeIntentRecord(drain);
  const IntentDecoded d =
      decodeIntentRecords({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()}, "x");
  ASSERT_FALSE(d.damage);
  ASSERT_EQ(d.records.size(), 1u);
  EXPECT_EQ(d.records[0], drain);
  IntentOverlay o;
  o.apply(drain);
  EXPECT_FALSE(o.empty());
  ASSERT_TRUE(o.lbDrained());
  EXPECT_EQ(o.lbDrained()->seq, 7u);
  // Clearing every backend's overrides leaves the instance drained.
  IntentRecord clear;
  clear.seq = 8;
  clear.op = IntentOp::ClearOverrides;
  o.apply(clear);
  EXPECT_TRUE(o.lbDrained());
  IntentOverlay again;
  for (const IntentRecord& r : o.toRecords()) again.apply(r);
  EXPECT_EQ(again, o);
  IntentRecord undrain;
  undrain.seq = 9;
  undrain.op = IntentOp::LbUndrain;
  o.apply(undrain);
  EXPECT_FALSE(o.lbDrained());
  EXPECT_TRUE(o.empty());
}

TEST(ControlIntent, LbDrainIsJournaledAndSurvivesARestart) {
  TempDir dir;
  std::int64_t wall = 1'700'000'000'000;
  const std::string text = configText(dir / "state", "\n[announce]\nenabled = true\n");
  {
    Daemon d(dir, text, &wall);
    AnnounceExchange exchange;
    d.cp().attachAnnounce(&exchange);
    const Json first = std::get<Json>(d.cp().lbDrain());
    EXPECT_EQ(first["drained"], true);
    EXPECT_EQ(first["already"], false);
    EXPECT_EQ(exchange.inputs().drained, true);
    const Json again = std::get<Json>(d.cp().lbDrain());
    EXPECT_EQ(again["already"], true);  // not journaled twice
    EXPECT_EQ(d.cp().intent().lastSeq(), 1u);
  }
  Daemon d(dir, text, &wall, 500);
  AnnounceExchange exchange;
  d.cp().attachAnnounce(&exchange);
  d.cp().syncAnnounce(500);
  EXPECT_TRUE(exchange.inputs().drained);
  const Json dump = std::get<Json>(d.cp().configDump(true));
  EXPECT_EQ(dump["lb"]["drained"], true);
  EXPECT_EQ(dump["lb"]["source"]["seq"], 1);
  EXPECT_EQ(dump["announce"]["enabled"], true);
  EXPECT_EQ(std::get<Json>(d.cp().status())["announce"]["drained"], true);
  EXPECT_NE(d.cp().metricsText().find("spillway_lb_drained 1"), std::string::npos);
  const Json undrain = std::get<Json>(d.cp().lbUndrain());
  EXPECT_EQ(undrain["drained"], false);
  EXPECT_FALSE(exchange.inputs().drained);
  EXPECT_EQ(std::get<Json>(d.cp().configDump(true))["lb"]["drained"], false);
}

TEST(ControlIntent, AnnounceInputsAndTransitionsBecomeStatusAndEvents) {
  TempDir dir;
  std::int64_t wall = 1'700'000'000'000;
  Daemon d(dir, configText(dir / "state", kSecondVip), &wall);
  AnnounceExchange exchange;
  d.cp().attachAnnounce(&exchange);
  Millis now = 1000;
  d.settleFlows(now);
  d.cp().syncAnnounce(now);
  const AnnounceControlInputs in = exchange.inputs();
  EXPECT_TRUE(in.warm);  // no health checks, no load: known at once
  ASSERT_EQ(in.vips.size(), 2u);
  EXPECT_EQ(in.vips[0].name, "v");
  EXPECT_EQ(in.vips[0].activeBackends, 4u);
  EXPECT_GE(exchange.controlBeats(), 1u);
  // Disabling every backend empties both tables.
  for (const char* b : {"b1", "b2", "b3", "b4"}) EXPECT_OK(d.cp().backendDisable(b));
  (void)d.cp().tick(now + 10);
  d.cp().syncAnnounce(now + 10);
  EXPECT_EQ(exchange.inputs().vips[0].activeBackends, 0u);
  // Enabled again: the empty tables fill at once (no flow to move, so no
  // churn budget applies).
  for (const char* b : {"b1", "b2", "b3", "b4"}) EXPECT_OK(d.cp().backendEnable(b));
  (void)d.cp().tick(now + 15);
  d.cp().syncAnnounce(now + 15);
  EXPECT_EQ(exchange.inputs().vips[0].activeBackends, 4u);
  EXPECT_EQ(exchange.inputs().vips[1].activeBackends, 4u);

  // What the announcer publishes shows in status, metrics and events.
  AnnounceOutcome o;
  o.state = AnnounceState::Partial;
  o.device = "spillway0";
  o.vips = {{"v", *parseIpAddress("192.0.2.1"), true, WithdrawReason::None, 900},
            {"w", *parseIpAddress("192.0.2.2"), false, WithdrawReason::NoActiveBackend, 950}};
  exchange.publish(o, {{950, "w", false, WithdrawReason::NoActiveBackend}});
  d.cp().syncAnnounce(now + 20);
  const Json a = std::get<Json>(d.cp().lbStatus());
  EXPECT_EQ(a["state"], "partial");
  EXPECT_EQ(a["vips"][1]["reason"], "no_active_backend");
  EXPECT_EQ(a["vips"][0]["announced"], true);
  const std::string metrics = d.cp().metricsText();
  EXPECT_NE(metrics.find("spillway_vip_announced{vip=\"v\"} 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("spillway_vip_announced{vip=\"w\"} 0"), std::string::npos);
  bool sawEvent = false;
  const Json events = std::get<Json>(d.cp().events(0, 1000));
  for (const Json& e : events["events"]) {
    if (e["kind"] == "announce") {
      sawEvent = e["cause"] == "VIP w withdrawn: no_active_backend";
    }
  }
  EXPECT_TRUE(sawEvent) << events.dump();
}

TEST(ControlIntent, WithoutAnAnnouncerStatusSaysDisabled) {
  TempDir dir;
  std::int64_t wall = 1'700'000'000'000;
  Daemon d(dir, configText(dir / "state"), &wall);
  EXPECT_EQ(std::get<Json>(d.cp().lbStatus())["state"], "disabled");
  EXPECT_EQ(std::get<Json>(d.cp().lbDrain())["announce"], "disabled");
  EXPECT_NE(d.cp().metricsText().find("spillway_announce_enabled 0"), std::string::npos);
}

}  // namespace
}  // namespace spillway

namespace spillway {
namespace {

// `backend add` refuses what a [[backend]] in the file would be refused for
// (issue #13: it accepted 11 of these 20), says why, and changes nothing:
// no backend, no journal record.
TEST(ControlIntent, BackendAddRefusesWhatTheFileRefuses) {
  TempDir dir;
  std::int64_t wall = 1'700'000'000'000;
  Daemon d(dir, configText(dir / "state"), &wall);
  const std::string backends = std::get<Json>(d.cp().backendList()).dump();
  const std::uint64_t seq = d.cp().intent().lastSeq();
  struct Bad {
    BackendSpec spec;
    const char* says;
  };
  auto withMac = [](const char* mac) {
    BackendSpec s = spec("b9", "10.0.0.19");
    s.mac = mac;
    return s;
  };
  const std::vector<Bad> bad = {
      {spec("b9", "0.0.0.0"), "must be a unicast address"},
      {spec("b9", "255.255.255.255"), "must be a unicast address"},
      {spec("b9", "224.0.0.1"), "must be a unicast address"},
      {spec("b9", "ff02::1"), "must be a unicast address"},
      {spec("b9", "::"), "must be a unicast address"},
      {spec("b9", "127.0.0.1"), "a loopback address"},
      {spec("b9", "::1"), "a loopback address"},
      {spec("b9", "192.0.2.1"), "the address of VIP"},
      {spec("b9", "10.0.0.1"), "this gateway's own address"},
      {withMac("ff:ff:ff:ff:ff:ff"), "must be a unicast MAC address"},
      {withMac("00:00:00:00:00:00"), "must be a unicast MAC address"},
      {withMac("01:00:5e:00:00:01"), "must be a unicast MAC address"},
      {spec("gpu a1", "10.0.0.19"), "may hold only"},
      {spec("gpu\"a1", "10.0.0.19"), "may hold only"},
      {spec("", "10.0.0.19"), "must not be empty"},
      {spec(std::string(300, 'x'), "10.0.0.19"), "longer than 64 characters"},
  };
  for (const Bad& b : bad) {
    const ApiResult r = d.cp().backendAdd(b.spec);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << b.spec.name << " " << b.spec.address;
    const ApiError& e = std::get<ApiError>(r);
    EXPECT_EQ(e.code, "invalid") << e.message;
    EXPECT_NE(e.message.find(b.says), std::string::npos) << e.message;
    EXPECT_LT(e.message.size(), 200u) << "a 300-character name is not echoed whole";
  }
  EXPECT_EQ(std::get<Json>(d.cp().backendList()).dump(), backends);
  EXPECT_EQ(d.cp().intent().lastSeq(), seq);
  // What the file accepts, the command accepts.
  EXPECT_OK(d.cp().backendAdd(spec("gpu-a1.rack_2", "10.0.0.19")));
}

}  // namespace
}  // namespace spillway
