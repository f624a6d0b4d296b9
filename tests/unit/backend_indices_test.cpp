// Backend indices and readiness, driven through ControlPlane and
// SnapshotBuilder with a fake data path behind the Dataplane interface (two workers
// that apply snapshots late, count live flows and purge indices when asked),
// without EAL:
//  - 10,000 backend add/remove cycles: indices stay bounded, a backend with
//    live flows drains (its removal waits for them) whatever its index, and
//    an index is handed out again only after every worker applied a snapshot
//    in which its old backend is gone and every worker purged the entries
//    naming it;
//  - the bound on backends known at once is refused with a clear error that
//    changes nothing;
//  - a backend added at run time stays out of the tables until its next hop
//    resolves, enters with an event, and keeps its MAC across remove/re-add.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "control/backends/neighbours.hpp"
#include "control/backends/next_hop_refresh.hpp"
#include "control/backends/snapshot_builder.hpp"
#include "control/config/config.hpp"
#include "control/plane/control_plane.hpp"
#include "estate_fixture.hpp"

namespace spillway {
namespace {

constexpr Millis kTick = 100;
constexpr std::uint32_t kTableSize = 251;

std::string estateText(const std::string& portExtra) {
  return test::estateHead(test::Head().lcores("[1, 2]").nextHopMac("").portExtra(portExtra)) +
         test::poolToml("a", "onprem") + test::vipToml({"a"}) + "\n[policy]\ndrain_timeout = 5\n" +
         test::backendToml("base", "10.0.0.11", "a");
}

Config estate(const std::string& portExtra = "next_hop_mac = \"02:00:00:00:00:01\"\n") {
  ConfigResult r = loadConfigFromString(estateText(portExtra), "test.toml");
  EXPECT_TRUE(r.ok()) << formatErrors(r.errors());
  return std::move(r).value();
}

const Json& ok(const ApiResult& r) {
  static const Json kNull;
  if (const auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << e->code << ": " << e->message;
    return kNull;
  }
  return std::get<Json>(r);
}

// Two workers. Each applies the newest published snapshot only when step()
// reaches it (they take turns, so one lags); on every step it opens a flow
// to every backend in its snapshot's table, as new SYNs would. Counts and
// purges are done at a later step, as the real ones take several drain
// periods. Entries are per worker: live flows, and stale ones (ended or
// re-steered flows whose entries still name the index until they expire or
// are purged).
class LaggingDataplane final : public Dataplane {
 public:
  static constexpr int kWorkers = 2;

  struct Worker {
    std::shared_ptr<const ForwardingSnapshot> snapshot;
    std::map<std::uint32_t, std::uint64_t> live;   // by index
    std::map<std::uint32_t, std::uint64_t> stale;  // by index
    std::uint64_t countDone = 0;
    std::vector<std::uint64_t> counts;
    std::uint64_t purgeDone = 0;
  };

  void requestFlowCounts(std::uint64_t n) override { countAsked_ = n; }
  std::optional<std::vector<LcoreFlowCounts>> collectFlowCounts(std::uint64_t n) override {
    std::vector<LcoreFlowCounts> out;
    for (unsigned w = 0; w < kWorkers; ++w) {
      if (workers_[w].countDone < n) return std::nullopt;
      out.push_back(LcoreFlowCounts{w + 1, workers_[w].counts});
    }
    ++countsCollected_;
    return out;
  }
  std::uint64_t appliedGeneration() const override { return applied(); }
  std::uint64_t publishedGeneration() const override { return latest_ ? latest_->generation : 0; }
  void requestPurge(std::uint64_t n, const std::vector<std::uint32_t>& indices) override {
    EXPECT_EQ(purgeAsked_, lastPurgeFinished()) << "a purge was asked before the last ended";
    purgeAsked_ = n;
    purgeIndices_ = indices;
    for (std::uint32_t i : indices) {
      // The grace period: every worker is on a snapshot that lists the
      // index's backend as Removed, in no table.
      for (const Worker& w : workers_) {
        EXPECT_TRUE(w.snapshot);
        if (!w.snapshot) continue;
        const SnapshotBackend* b = w.snapshot->backend(i);
        EXPECT_TRUE(b == nullptr || b->state == BackendState::Removed) << "index " << i;
        EXPECT_FALSE(inTable(*w.snapshot, i)) << "index " << i;
      }
      purgeRequested_.insert(i);
    }
  }
  bool purgeDone(std::uint64_t n) const override { return lastPurgeFinished() >= n; }
  void publish(std::unique_ptr<const ForwardingSnapshot> s) override { latest_ = std::move(s); }
  std::size_t reclaim() override { return 0; }
  void requestExceptionExport(std::uint64_t, const ForwardingSnapshot*) override {}
  void forgetExportNext() override {}
  std::optional<std::vector<ExportedFlow>> collectExceptionExport(std::uint64_t) override {
    return std::nullopt;
  }
  std::optional<std::string> syncVips(std::span<const VipKey>) override { return std::nullopt; }
  DataplaneCounters counters() const override { return {}; }
  std::uint64_t placedOffTable() const override { return 0; }
  void backendBytes(std::span<std::uint64_t> out) const override {
    std::fill(out.begin(), out.end(), 0);
  }
  std::vector<std::uint64_t> workerRounds() const override { return {}; }

  void step() {
    Worker& w = workers_[turn_];
    turn_ = (turn_ + 1) % kWorkers;
    w.snapshot = latest_;
    // New flows follow this worker's table.
    if (w.snapshot) {
      std::set<std::uint32_t> inTable(w.snapshot->vips[0].table.entries().begin(),
                                      w.snapshot->vips[0].table.entries().end());
      for (std::uint32_t i : inTable) {
        if (i != 0) ++w.live[i];
      }
    }
    if (w.countDone < countAsked_) {
      w.counts.assign(w.snapshot ? w.snapshot->backends.size() : 1, 0);
      for (const auto& [i, n] : w.live) {
        if (i < w.counts.size()) w.counts[i] = n;
      }
      w.countDone = countAsked_;
    }
    if (w.purgeDone < purgeAsked_) {
      for (std::uint32_t i : purgeIndices_) {
        w.live.erase(i);
        w.stale.erase(i);
      }
      w.purgeDone = purgeAsked_;
      if (lastPurgeFinished() == purgeAsked_) {
        for (std::uint32_t i : purgeIndices_) purged_.insert(i);
      }
    }
  }

  // The flows on `index` end; their entries stay until purged or expired.
  void endFlows(std::uint32_t index) {
    for (Worker& w : workers_) {
      if (auto it = w.live.find(index); it != w.live.end()) {
        w.stale[index] += it->second;
        w.live.erase(it);
      }
    }
  }

  [[nodiscard]] std::uint64_t liveFlows(std::uint32_t index) const {
    std::uint64_t n = 0;
    for (const Worker& w : workers_) {
      if (auto it = w.live.find(index); it != w.live.end()) n += it->second;
    }
    return n;
  }
  [[nodiscard]] std::uint64_t entriesNaming(std::uint32_t index) const {
    std::uint64_t n = liveFlows(index);
    for (const Worker& w : workers_) {
      if (auto it = w.stale.find(index); it != w.stale.end()) n += it->second;
    }
    return n;
  }
  // Whether `index` was purged on every worker since it was last handed out.
  [[nodiscard]] bool purgedSinceLastUse(std::uint32_t index) const {
    return purged_.count(index) != 0;
  }
  void handedOut(std::uint32_t index) {
    purged_.erase(index);
    purgeRequested_.erase(index);
  }
  [[nodiscard]] bool inEveryTable(std::uint32_t index) const {
    return std::all_of(workers_.begin(), workers_.end(),
                       [&](const Worker& w) { return w.snapshot && inTable(*w.snapshot, index); });
  }
  [[nodiscard]] std::uint64_t countsCollected() const { return countsCollected_; }

 private:
  static bool inTable(const ForwardingSnapshot& s, std::uint32_t index) {
    const auto& e = s.vips[0].table.entries();
    return std::find(e.begin(), e.end(), index) != e.end();
  }
  [[nodiscard]] std::uint64_t applied() const {
    std::uint64_t g = UINT64_MAX;
    for (const Worker& w : workers_) g = std::min(g, w.snapshot ? w.snapshot->generation : 0);
    return g;
  }
  [[nodiscard]] std::uint64_t lastPurgeFinished() const {
    std::uint64_t n = UINT64_MAX;
    for (const Worker& w : workers_) n = std::min(n, w.purgeDone);
    return n;
  }

  std::array<Worker, kWorkers> workers_;
  unsigned turn_ = 0;
  std::shared_ptr<const ForwardingSnapshot> latest_;
  std::uint64_t countAsked_ = 0;
  std::uint64_t countsCollected_ = 0;
  std::uint64_t purgeAsked_ = 0;
  std::vector<std::uint32_t> purgeIndices_;
  std::set<std::uint32_t> purgeRequested_;
  std::set<std::uint32_t> purged_;
};

// A control plane, its builder and the fake, with time.
struct Rig {
  explicit Rig(Config config, std::uint32_t maxBackends = kMaxBackends)
      : builder(maxBackends), control(init(std::move(config)), "test.toml", builder, &fake, now) {
    fake.publish(control.takeSnapshot(now));
    for (int i = 0; i < LaggingDataplane::kWorkers; ++i) fake.step();
  }
  Config init(Config config) {
    config.control.stateDir = "";  // no journal or checkpoint: nothing outlives the test
    EXPECT_FALSE(builder.setConfig(config));
    builder.setPortMac(0, MacAddress{2, 0, 0, 0, 0, 0x10});
    return config;
  }
  // One control-loop round: tick, publish, one worker step.
  void round() {
    now += kTick;
    if (control.tick(now)) {
      if (auto s = control.takeSnapshot(now)) fake.publish(std::move(s));
    }
    fake.step();
  }
  [[nodiscard]] Json backend(const std::string& name) {
    const Json list = ok(control.backendList());
    for (const Json& b : list) {
      if (b["name"] == name) return b;
    }
    return Json();
  }
  [[nodiscard]] bool configured(const std::string& name) const {
    const auto& bs = control.config().backends;
    return std::any_of(bs.begin(), bs.end(),
                       [&](const BackendConfig& b) { return b.name == name; });
  }

  Millis now = 1'000;
  LaggingDataplane fake;
  SnapshotBuilder builder;
  ControlPlane control;
};

BackendSpec specFor(int k) {
  BackendSpec s;
  s.name = "b" + std::to_string(k);
  // Addresses 10.1.0.0/16 onwards, unique per cycle.
  s.address = "10." + std::to_string(1 + k / 65536) + "." + std::to_string((k / 256) % 256) + "." +
              std::to_string(k % 256);
  s.pool = "a";
  s.id = 0x5000'0000'0000ULL + static_cast<std::uint64_t>(k) * 7919;  // far above any index
  return s;
}

TEST(BackendIndices, TenThousandAddRemoveCyclesStayBoundedDrainAndRecycleSafely) {
  Rig rig(estate());
  constexpr int kCycles = 10'000;
  std::uint32_t highestIndex = 0;
  std::map<std::uint32_t, int> uses;  // by index
  int deadlineRemovals = 0;
  for (int k = 0; k < kCycles; ++k) {
    SCOPED_TRACE("cycle " + std::to_string(k));
    const BackendSpec spec = specFor(k);
    const Json added = ok(rig.control.backendAdd(spec));
    const std::uint32_t index = added["index"].get<std::uint32_t>();
    ASSERT_EQ(index, rig.builder.indexOf(*spec.id));
    ASSERT_NE(index, 0u);
    // Reuse only after the grace period and the purge on every worker.
    if (uses[index]++ > 0) {
      ASSERT_TRUE(rig.fake.purgedSinceLastUse(index)) << "index " << index;
    }
    ASSERT_EQ(rig.fake.entriesNaming(index), 0u) << "index " << index;
    rig.fake.handedOut(index);
    highestIndex = std::max(highestIndex, index);

    // It takes flows on every worker.
    for (int r = 0; r < 40 && !rig.fake.inEveryTable(index); ++r) rig.round();
    ASSERT_TRUE(rig.fake.inEveryTable(index));
    // The control plane has counted them (a removal with a last count of 0
    // would complete at once, as it should for a backend without flows).
    for (int r = 0; r < 40 && rig.backend(spec.name)["live_flows"].is_null(); ++r) rig.round();
    for (int r = 0; r < 40 && rig.backend(spec.name)["live_flows"] == 0; ++r) rig.round();
    ASSERT_GT(rig.backend(spec.name)["live_flows"].get<std::uint64_t>(), 0u);
    ASSERT_GT(rig.fake.liveFlows(index), 0u);

    // Removal drains: while flows live, counts come and go and it stays.
    ASSERT_EQ(ok(rig.control.backendRemove(spec.name))["state"], "draining");
    const std::uint64_t counted = rig.fake.countsCollected();
    while (rig.fake.countsCollected() < counted + 2) rig.round();
    ASSERT_TRUE(rig.configured(spec.name));
    const Json draining = rig.backend(spec.name);
    ASSERT_EQ(draining["state"], "draining");
    ASSERT_GT(draining["live_flows"].get<std::uint64_t>(), 0u);

    // Most flows end (their entries stay until purged); every tenth backend
    // keeps them until the drain deadline re-steers them.
    const bool deadline = k % 10 == 9;
    if (!deadline) rig.fake.endFlows(index);
    deadlineRemovals += deadline;
    int rounds = 0;
    while (rig.configured(spec.name)) {
      rig.round();
      ASSERT_LT(++rounds, 200) << "the removal never completed";
    }
    // A few rounds more, so purges overlap the next cycles (or not).
    for (int r = k % 4; r > 0; --r) rig.round();
  }
  const BackendIndexStats st = rig.builder.indexStats();
  // base + the cycle's backend + those still retiring or purging.
  EXPECT_LE(highestIndex, 6u);
  EXPECT_LE(st.limit, 7u);
  EXPECT_GT(st.recycled, static_cast<std::uint64_t>(kCycles) - 10);
  EXPECT_EQ(deadlineRemovals, kCycles / 10);
  EXPECT_EQ(st.inUse, 1u);
}

TEST(BackendIndices, TheBoundIsRefusedClearlyUntilAnIndexIsPurged) {
  Rig rig(estate(), 3);  // base + 2
  ASSERT_TRUE(std::holds_alternative<Json>(rig.control.backendAdd(specFor(1))));
  ASSERT_TRUE(std::holds_alternative<Json>(rig.control.backendAdd(specFor(2))));
  const ApiResult refused = rig.control.backendAdd(specFor(3));
  ASSERT_TRUE(std::holds_alternative<ApiError>(refused));
  const ApiError& e = std::get<ApiError>(refused);
  EXPECT_EQ(e.code, "exhausted");
  EXPECT_NE(e.message.find("at most 3 backends are known at once"), std::string::npos) << e.message;
  EXPECT_FALSE(rig.configured("b3"));  // nothing changed
  EXPECT_EQ(rig.control.config().backends.size(), 3u);

  // b1 goes (no flows: at once); until its index is purged the bound holds.
  for (int r = 0; r < 30; ++r) rig.round();  // a flow count with b1's flows
  rig.fake.endFlows(rig.builder.indexOf(*specFor(1).id));
  ASSERT_TRUE(std::holds_alternative<Json>(rig.control.backendRemove("b1")));
  int rounds = 0;
  while (rig.configured("b1")) {
    rig.round();
    ASSERT_LT(++rounds, 100);
  }
  const ApiResult stillRefused = rig.control.backendAdd(specFor(3));
  ASSERT_TRUE(std::holds_alternative<ApiError>(stillRefused));
  EXPECT_NE(std::get<ApiError>(stillRefused).message.find("not yet purged"), std::string::npos);
  while (rig.builder.indexStats().free == 0) {
    rig.round();
    ASSERT_LT(++rounds, 200);
  }
  const Json added = ok(rig.control.backendAdd(specFor(3)));
  EXPECT_LE(added["index"].get<std::uint32_t>(), 3u);
}

TEST(BackendIndices, AnIdBackBeforeThePurgeKeepsItsIndex) {
  SnapshotBuilder b;
  Config config = estate();
  ASSERT_FALSE(b.setConfig(config));
  BackendConfig extra = config.backends[0];
  extra.name = "x";
  extra.id = 77;
  extra.address = parseIpAddress("10.0.0.77").value();
  Config with = config;
  with.backends.push_back(extra);
  ASSERT_FALSE(b.setConfig(with));
  const std::uint32_t x = b.indexOf(77);
  ASSERT_TRUE(b.build(1));
  ASSERT_FALSE(b.setConfig(config));  // x leaves: retiring
  ASSERT_TRUE(b.build(2));
  EXPECT_TRUE(b.startIndexPurge(1).empty());  // generation 2 not applied yet
  ASSERT_FALSE(b.setConfig(with));            // back before the purge: same index
  EXPECT_EQ(b.indexOf(77), x);
  EXPECT_EQ(b.indexStats().retiring, 0u);

  ASSERT_FALSE(b.setConfig(config));
  ASSERT_TRUE(b.build(3));
  const std::vector<std::uint32_t> purging = b.startIndexPurge(3);
  ASSERT_EQ(purging, std::vector<std::uint32_t>{x});
  ASSERT_FALSE(b.setConfig(with));  // back while purging: another index
  const std::uint32_t x2 = b.indexOf(77);
  EXPECT_NE(x2, x);
  auto s = b.build(4);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->backend(x)->state, BackendState::Removed);  // still no one's
  EXPECT_EQ(s->backend(x2)->id, 77u);
  b.indicesPurged(purging);
  EXPECT_EQ(b.indexOf(77), x2);  // the purge of the old index leaves it alone
  EXPECT_EQ(b.indexStats().free, 1u);
}

TEST(BackendIndices, RecycledIndicesAreReusedOldestFirstAndBackendsDoNotGrow) {
  SnapshotBuilder b;
  const Config base = estate();
  ASSERT_FALSE(b.setConfig(base));
  auto withIds = [&](std::initializer_list<std::uint64_t> ids) {
    Config c = base;
    for (std::uint64_t id : ids) {
      BackendConfig x = base.backends[0];
      x.id = id;
      x.name = "x" + std::to_string(id);
      x.address = parseIpAddress("10.0.1." + std::to_string(id)).value();
      c.backends.push_back(x);
    }
    return c;
  };
  ASSERT_FALSE(b.setConfig(withIds({10, 11, 12})));  // indices 2, 3, 4 in id order
  EXPECT_EQ(b.indexOf(10), 2u);
  EXPECT_EQ(b.indexOf(12), 4u);
  ASSERT_FALSE(b.setConfig(withIds({11})));  // 10 and 12 leave
  ASSERT_TRUE(b.build(1));
  ASSERT_FALSE(b.setConfig(withIds({})));  // 11 leaves later
  ASSERT_TRUE(b.build(2));
  std::vector<std::uint32_t> first = b.startIndexPurge(1);
  EXPECT_EQ(first, (std::vector<std::uint32_t>{2, 4}));
  b.indicesPurged({4});  // finished in this order: 4 is the oldest free one
  b.indicesPurged({2});
  const std::vector<std::uint32_t> second = b.startIndexPurge(2);
  EXPECT_EQ(second, std::vector<std::uint32_t>{3});
  EXPECT_EQ(b.indexOf(10), 0u);  // forgotten once recycled
  ASSERT_FALSE(b.setConfig(withIds({20, 21, 22})));
  EXPECT_EQ(b.indexOf(20), 4u);
  EXPECT_EQ(b.indexOf(21), 2u);
  EXPECT_EQ(b.indexOf(22), 5u);  // 3 is still purging: a never-used one
  auto s = b.build(3);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->backends.size(), 6u);
  EXPECT_EQ(s->backend(3)->state, BackendState::Removed);
  EXPECT_EQ(s->backend(4)->id, 20u);
  const BackendIndexStats st = b.indexStats();
  EXPECT_EQ(st.inUse, 4u);
  EXPECT_EQ(st.purging, 1u);
  EXPECT_EQ(st.free, 0u);
  EXPECT_EQ(st.recycled, 2u);
}

// --- Readiness: held out of the tables until the next hop resolves ----------

class MapNeighbours final : public NeighbourSource {
 public:
  std::vector<NeighbourEntry> entries;
  std::vector<std::string> solicited;
  NeighbourTable read(const std::string&, IpVersion) override {
    return NeighbourTable{entries, {}};
  }
  NeighbourRoute route(const IpAddress& destination, const std::string&) override {
    return NeighbourRoute{destination, std::nullopt};
  }
  std::optional<std::string> solicit(const IpAddress& destination, const std::string&) override {
    solicited.push_back(formatIpAddress(destination));
    return std::nullopt;
  }
};

std::uint32_t entriesOf(const ForwardingSnapshot& s, std::uint32_t index) {
  const auto& e = s.vips[0].table.entries();
  return static_cast<std::uint32_t>(std::count(e.begin(), e.end(), index));
}

TEST(BackendReadiness, RunTimeAddIsHeldUntilItsNextHopResolvesThenEntersWithAnEvent) {
  MapNeighbours kernel;
  NeighbourResolver resolver(kernel);
  // Next hops come from the kernel; base is in the first configuration.
  Rig rig(estate("kernel_interface = \"sw-p0\"\n"));
  const std::uint32_t base = rig.builder.indexOf(backendIdFromName("base"));
  auto first = rig.builder.build(100);
  ASSERT_TRUE(first);
  EXPECT_GT(entriesOf(*first, base), 0u);  // not held: the first tables are the config's
  EXPECT_TRUE(rig.builder.heldForNextHop().empty());

  BackendSpec spec = specFor(1);
  spec.id.reset();
  ASSERT_TRUE(std::holds_alternative<Json>(rig.control.backendAdd(spec)));
  const std::uint64_t id = backendIdFromName(spec.name);
  const std::uint32_t index = rig.builder.indexOf(id);
  EXPECT_EQ(rig.builder.heldForNextHop(), std::vector<std::uint64_t>{id});
  for (int r = 0; r < 5; ++r) rig.round();
  auto s = rig.builder.build(200);
  EXPECT_EQ(entriesOf(*s, index), 0u);
  EXPECT_EQ(s->backend(index)->state, BackendState::Active);
  EXPECT_TRUE(rig.backend(spec.name)["held_for_next_hop"].get<bool>());
  EXPECT_NE(rig.control.metricsText().find("spillway_backends_held_for_next_hop 1"),
            std::string::npos);

  // What the daemon does every few ms for held backends.
  const std::vector<std::uint64_t> held = rig.builder.heldForNextHop();
  resolver.refresh(rig.control.config(), held);
  EXPECT_EQ(rig.builder.refreshNextHops(resolver), 0u);
  EXPECT_EQ(resolver.solicitUnresolved(rig.control.config(), held), 1u);
  EXPECT_EQ(kernel.solicited, std::vector<std::string>{spec.address});  // only the held one

  const MacAddress mac{2, 0, 0, 0, 0, 0x42};
  kernel.entries.push_back(NeighbourEntry{parseIpAddress(spec.address).value(), mac});
  resolver.refresh(rig.control.config(), held);
  EXPECT_EQ(rig.builder.refreshNextHops(resolver), 1u);
  EXPECT_TRUE(rig.builder.heldForNextHop().empty());
  rig.round();
  s = rig.builder.build(300);
  EXPECT_GT(entriesOf(*s, index), 0u);
  EXPECT_TRUE(s->backend(index)->nextHopResolved);
  EXPECT_FALSE(rig.backend(spec.name)["held_for_next_hop"].get<bool>());
  EXPECT_NE(rig.control.metricsText().find("spillway_backend_next_hop_holds_total 1"),
            std::string::npos);
  const Json events = ok(rig.control.events(0, 1000))["events"];
  bool heldEvent = false, enteredEvent = false;
  for (const Json& e : events) {
    if (e["backend"] != spec.name) continue;
    const std::string cause = e["cause"];
    heldEvent = heldEvent || cause.find("held out of the tables") != std::string::npos;
    enteredEvent =
        enteredEvent || cause.find("enters the tables after 600 ms") != std::string::npos;
  }
  EXPECT_TRUE(heldEvent);
  EXPECT_TRUE(enteredEvent) << events.dump();

  // Removed and re-added: the MAC is remembered, so no hold at all, even
  // once the kernel has forgotten the neighbour.
  rig.fake.endFlows(index);
  ASSERT_TRUE(std::holds_alternative<Json>(rig.control.backendRemove(spec.name)));
  int rounds = 0;
  while (rig.configured(spec.name)) {
    rig.round();
    ASSERT_LT(++rounds, 100);
  }
  kernel.entries.clear();
  resolver.refresh(rig.control.config());
  ASSERT_TRUE(std::holds_alternative<Json>(rig.control.backendAdd(spec)));
  EXPECT_TRUE(rig.builder.heldForNextHop().empty());
  ASSERT_NE(rig.builder.runtime(id), nullptr);
  EXPECT_EQ(rig.builder.runtime(id)->nextHopMac, mac);
  s = rig.builder.build(400);
  EXPECT_GT(entriesOf(*s, rig.builder.indexOf(id)), 0u);
}

// The control loop's next-hop policy (NextHopRefresh), on injected time:
// every backend once a period, a held one every round and asked for once.
TEST(NextHopRefresh, EveryBackendEachPeriodAHeldOneEveryRoundAskedForOnce) {
  MapNeighbours kernel;
  NeighbourResolver resolver(kernel);
  Rig rig(estate("kernel_interface = \"sw-p0\"\n"));
  NextHopRefresh nextHops(resolver, rig.builder);
  const BackendConfig base = rig.control.config().backends.at(0);
  nextHops.prime(rig.control.config(), 0);
  EXPECT_EQ(kernel.solicited, std::vector<std::string>{formatIpAddress(base.address)});
  ASSERT_NE(rig.builder.runtime(base.id), nullptr);
  EXPECT_FALSE(rig.builder.runtime(base.id)->nextHopMac);

  // The kernel learns base's MAC: taken at the next period, not before.
  const MacAddress baseMac{2, 0, 0, 0, 0, 0x21};
  kernel.entries.push_back(NeighbourEntry{base.address, baseMac});
  EXPECT_FALSE(nextHops.poll(rig.control.config(), 100));
  EXPECT_FALSE(rig.builder.runtime(base.id)->nextHopMac);
  EXPECT_FALSE(nextHops.poll(rig.control.config(), NextHopRefresh::kRefreshPeriodMs - 1));
  EXPECT_TRUE(nextHops.poll(rig.control.config(), NextHopRefresh::kRefreshPeriodMs));
  EXPECT_EQ(rig.builder.runtime(base.id)->nextHopMac, baseMac);
  EXPECT_FALSE(nextHops.poll(rig.control.config(), NextHopRefresh::kRefreshPeriodMs + 5));

  // A backend added at run time is held: looked at every round, the kernel
  // asked for it once however many rounds it stays held.
  BackendSpec spec = specFor(1);
  spec.id.reset();
  ASSERT_TRUE(std::holds_alternative<Json>(rig.control.backendAdd(spec)));
  const std::uint64_t id = backendIdFromName(spec.name);
  ASSERT_EQ(rig.builder.heldForNextHop(), std::vector<std::uint64_t>{id});
  kernel.solicited.clear();
  for (Millis t = 260; t < 280; t += 5) EXPECT_FALSE(nextHops.poll(rig.control.config(), t));
  EXPECT_EQ(kernel.solicited, std::vector<std::string>{spec.address});
  const MacAddress mac{2, 0, 0, 0, 0, 0x42};
  kernel.entries.push_back(NeighbourEntry{parseIpAddress(spec.address).value(), mac});
  EXPECT_TRUE(nextHops.poll(rig.control.config(), 285));  // within the period: held
  EXPECT_TRUE(rig.builder.heldForNextHop().empty());
  EXPECT_EQ(rig.builder.runtime(id)->nextHopMac, mac);
  EXPECT_FALSE(nextHops.poll(rig.control.config(), 290));
  EXPECT_EQ(kernel.solicited, std::vector<std::string>{spec.address});
}

TEST(BackendReadiness, StaticMacsAndTheFirstConfigurationAreNeverHeld) {
  SnapshotBuilder b;
  Config config = estate("kernel_interface = \"sw-p0\"\n");
  ASSERT_FALSE(b.setConfig(config));
  b.setPortMac(0, MacAddress{2, 0, 0, 0, 0, 0x10});
  Config next = config;
  BackendConfig withMac = config.backends[0];
  withMac.name = "m";
  withMac.id = 5;
  withMac.address = parseIpAddress("10.0.0.5").value();
  withMac.mac = MacAddress{2, 0, 0, 0, 0, 5};
  BackendConfig without = withMac;
  without.name = "k";
  without.id = 6;
  without.address = parseIpAddress("10.0.0.6").value();
  without.mac.reset();
  next.backends.push_back(withMac);
  next.backends.push_back(without);
  ASSERT_FALSE(b.setConfig(next));
  EXPECT_EQ(b.heldForNextHop(), std::vector<std::uint64_t>{6});
  auto s = b.build(1);
  EXPECT_GT(entriesOf(*s, b.indexOf(5)), 0u);
  EXPECT_EQ(entriesOf(*s, b.indexOf(6)), 0u);
  EXPECT_GT(entriesOf(*s, b.indexOf(backendIdFromName("base"))), 0u);  // unresolved, in
  ASSERT_TRUE(b.setNextHopMac(6, MacAddress{2, 0, 0, 0, 0, 6}));
  EXPECT_EQ(b.takeEnteredTables(), std::vector<std::uint64_t>{6});
  s = b.build(2);
  EXPECT_GT(entriesOf(*s, b.indexOf(6)), 0u);
  // Once in, a lost MAC does not take it out.
  ASSERT_TRUE(b.setNextHopMac(6, std::nullopt));
  s = b.build(3);
  EXPECT_GT(entriesOf(*s, b.indexOf(6)), 0u);
  EXPECT_TRUE(b.heldForNextHop().empty());
}

}  // namespace
}  // namespace spillway
