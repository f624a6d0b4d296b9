// Load-aware placement (spillway/placement.hpp): the bounded-load rule on its
// own (counts, published loads, weights, ledger epochs), and through the data path
// (a placed connection is tracked, stays, is an exception, and falls back to
// the table's entry when it cannot be tracked).
#include "spillway/placement.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "packet_builder.hpp"
#include "spillway/flow_exceptions.hpp"
#include "spillway/steering.hpp"
#include "steering_frame.hpp"

namespace spillway {
namespace {

using test::PacketBuilder;

constexpr std::uint64_t kSeed = 0x5eed;
constexpr std::size_t kHeadroom = test::kFrameHeadroom;
constexpr std::uint32_t kTableSize = 1009;

using test::Frame;

// One VIP (192.0.2.10, TCP, all ports) over backends 1..n with the given
// weights (0: not in the table, as a draining backend), placing by bytes.
class PlacementTest : public ::testing::Test {
 protected:
  void publish(const std::vector<std::uint32_t>& weights, bool placing = true,
               std::size_t flowCapacity = 1 << 16) {
    auto s = std::make_unique<ForwardingSnapshot>();
    s->generation = ++generation_;
    s->backends.resize(weights.size() + 1);
    std::vector<MaglevBackend> mb;
    for (std::uint32_t i = 1; i <= weights.size(); ++i) {
      auto& b = s->backends[i];
      b.id = 1000 + i;
      b.state = weights[i - 1] > 0 ? BackendState::Active : BackendState::Draining;
      b.encap.kind = EncapKind::IpInIp4;
      b.encap.source = test::ipBytes("10.0.0.2");
      b.encap.backend = test::ipBytes("10.0.1." + std::to_string(i));
      b.encap.nextHopMac = {2, 0, 0, 0, 1, static_cast<std::uint8_t>(i)};
      b.encap.ourMac = {2, 0, 0, 0, 0, 2};
      mb.push_back({b.id, weights[i - 1], i});
    }
    SnapshotVip v;
    v.key = {test::ipBytes("192.0.2.10"), IpVersion::V4, 6, 0};
    v.name = "nccl";
    v.tag = vipTagOf(v.key);
    MaglevBuild built = builder_.build(mb, FlowHasher(kSeed), kTableSize).value();
    v.table = built.table;
    if (placing) {
      auto p = std::make_shared<VipPlacement>();
      p->share.assign(weights.size() + 1, 0.0F);
      for (const MaglevShare& sh : built.shares) {
        p->share[sh.backendIndex] = static_cast<float>(sh.entries) / kTableSize;
      }
      p->loads = loads_;
      p->load = load_;
      placement_ = p;
      v.placement = p;
    }
    s->vips = {std::move(v)};
    s->vipsOfBackend.assign(weights.size() + 1, {0});
    s->indexVips();
    snapshot_ = std::move(s);
    if (flowCapacity != steering_->flowTable().capacity()) {
      steering_ = std::make_unique<Steering>(FlowTableConfig{.capacity = flowCapacity}, kSeed);
    }
  }

  static std::vector<std::byte> tcp(std::uint16_t sport, std::uint8_t flags) {
    return PacketBuilder().ipv4("10.9.0.1", "192.0.2.10").tcp(sport, 5000, flags).build();
  }
  static std::uint64_t hashOf(std::uint16_t sport) {
    Frame f(tcp(sport, kTcpSyn));
    return FlowHasher(kSeed).hash(parsePacket(f.ref.buffer.subspan(kHeadroom, f.ref.length)).key);
  }
  SteerResult steer(std::uint16_t sport, std::uint8_t flags = kTcpSyn) {
    Frame f(tcp(sport, flags));
    SteerResult r;
    steering_->steerBurst(std::span(&f.ref, 1), std::span(&r, 1), *snapshot_, now_);
    return r;
  }
  // Publishes backend `index`'s load (in flows), the VIP's total over
  // `backends`, as of flow count `epoch`.
  void setLoad(std::uint32_t index, double flows, std::uint32_t backends, std::uint64_t epoch = 0) {
    loads_->set(index, static_cast<std::uint64_t>(flows * kLoadScale));
    double total = 0;
    for (std::uint32_t i = 1; i <= backends; ++i) total += loads_->flows(i);
    load_->milliFlows = static_cast<std::uint64_t>(total * kLoadScale);
    loads_->setEpoch(epoch);
  }
  // Backends of `flows` new connections (source ports from `first`).
  std::map<std::uint32_t, int> openFlows(int flows, std::uint16_t first = 20000) {
    std::map<std::uint32_t, int> perBackend;
    for (int i = 0; i < flows; ++i) {
      const SteerResult r = steer(static_cast<std::uint16_t>(first + i));
      EXPECT_EQ(r.verdict, Verdict::Forward) << dropReasonName(r.drop);
      ++perBackend[r.backend];
    }
    return perBackend;
  }
  std::map<std::uint32_t, int> tableFlows(int flows, std::uint16_t first = 20000) const {
    std::map<std::uint32_t, int> perBackend;
    for (int i = 0; i < flows; ++i) {
      ++perBackend[snapshot_->vips[0].table.lookup(hashOf(static_cast<std::uint16_t>(first + i)))];
    }
    return perBackend;
  }
  static int maxOf(const std::map<std::uint32_t, int>& m) {
    int most = 0;
    for (const auto& [b, n] : m) most = std::max(most, n);
    return most;
  }

  MaglevBuilder builder_;
  std::uint64_t generation_ = 0;
  std::shared_ptr<BackendLoads> loads_ = std::make_shared<BackendLoads>(kBackendSlots);
  std::shared_ptr<VipLoad> load_ = std::make_shared<VipLoad>();
  std::shared_ptr<const VipPlacement> placement_;
  std::unique_ptr<ForwardingSnapshot> snapshot_;
  std::unique_ptr<Steering> steering_ =
      std::make_unique<Steering>(FlowTableConfig{.capacity = 1 << 16}, kSeed);
  Millis now_ = 1'000'000;
};

TEST(PlacementLedger, CountsPlacementsSinceAnEpoch) {
  PlacementLedger ledger(16);
  ledger.add(3, 7);
  ledger.add(3, 7);
  EXPECT_EQ(ledger.backend(3, 0), 2u);
  EXPECT_EQ(ledger.vip(7, 0), 2u);
  ledger.beginEpoch(1);  // flow count 1 starts: it will include those two
  ledger.add(3, 7);
  EXPECT_EQ(ledger.backend(3, 0), 3u);  // the published loads are still count 0's
  EXPECT_EQ(ledger.backend(3, 1), 1u);  // count 1's are out: only what it may lack
  EXPECT_EQ(ledger.vip(7, 1), 1u);
  EXPECT_EQ(ledger.backend(4, 1), 0u);
  EXPECT_EQ(ledger.backend(99, 0), 0u);  // beyond the slots: nothing, no crash
  ledger.beginEpoch(2);
  ledger.beginEpoch(2);  // again: nothing changes
  ledger.add(3, 7);
  EXPECT_EQ(ledger.backend(3, 1), 2u);
  EXPECT_EQ(ledger.backend(3, 2), 1u);
  // Counts the lcore never started, and loads older than the epochs kept:
  // the kept epochs, all of them.
  ledger.beginEpoch(9);
  ledger.add(3, 7);
  EXPECT_EQ(ledger.backend(3, 9), 1u);
  EXPECT_EQ(ledger.backend(3, 2), 1u);
  EXPECT_EQ(ledger.backend(3, 3), 1u);
}

// Sixteen NCCL connections opened at once over eight equal backends: nothing
// is measured yet, so the loads are the flows just placed, and every backend
// ends with two (plain Maglev, for the same connections, stacks three or more
// on one backend).
TEST_F(PlacementTest, SimultaneousConnectionsSpreadEvenly) {
  publish(std::vector<std::uint32_t>(8, 100));
  ASSERT_GE(maxOf(tableFlows(16)), 3) << "the data must show plain Maglev's imbalance";
  const auto placed = openFlows(16);
  EXPECT_EQ(placed.size(), 8u);
  EXPECT_EQ(maxOf(placed), 2);
  EXPECT_GT(steering_->counters().placedOffTable.read(), 0u);
  EXPECT_EQ(steering_->counters().newFlows.read(), 16u);
}

TEST_F(PlacementTest, WithoutPlacementTheTableDecides) {
  publish(std::vector<std::uint32_t>(8, 100), /*placing=*/false);
  EXPECT_EQ(openFlows(16), tableFlows(16));
  EXPECT_EQ(steering_->counters().placedOffTable.read(), 0u);
}

TEST_F(PlacementTest, TheFirstFlowAndBalancedLoadsKeepTheTableEntry) {
  publish(std::vector<std::uint32_t>(4, 100));
  const SteerResult r = steer(30000);
  EXPECT_EQ(r.backend, snapshot_->vips[0].table.lookup(hashOf(30000)));
  EXPECT_EQ(steering_->counters().placedOffTable.read(), 0u);
}

// A loaded backend (published load: 10 flows, or their bytes) gets no new
// flow until the others carry as much, whatever the table says.
TEST_F(PlacementTest, PublishedLoadSteersAwayFromTheLoadedBackend) {
  publish(std::vector<std::uint32_t>(4, 100));
  setLoad(2, 10, 4);
  const auto placed = openFlows(24, 31000);
  EXPECT_EQ(placed.count(2), 0u);
  // Bounded: f * (10 + 24) / 4 = 10.6 flows a backend at most.
  EXPECT_LE(maxOf(placed), 10);
  // Balanced now (10, 8, 8, 8 within the factor): backend 2 takes its turn.
  EXPECT_GT(openFlows(16, 32000).count(2), 0u);
}

// The lcore's own placements count until a flow count holds them, then
// only the count does: after count 1 found none of the first burst's flows
// (they ended), new flows are as free as in an empty estate and keep their
// table entries.
TEST_F(PlacementTest, PlacementsCountUntilAFlowCountHoldsThem) {
  publish(std::vector<std::uint32_t>(4, 100));
  ASSERT_EQ(maxOf(openFlows(8, 33000)), 2);
  steering_->beginPlacementEpoch(1);
  setLoad(1, 0, 4, /*epoch=*/1);
  for (std::uint16_t port = 34000; port < 34003; ++port) {
    // One at a time, each on a fresh lcore epoch: none is held by the others.
    EXPECT_EQ(steer(port).backend, snapshot_->vips[0].table.lookup(hashOf(port))) << port;
    steering_->beginPlacementEpoch(port - 34000 + 2);
    setLoad(1, 0, 4, port - 34000 + 2);
  }
  const PlacementLedger& ledger = steering_->placementLedger();
  EXPECT_EQ(
      ledger.backend(1, 4) + ledger.backend(2, 4) + ledger.backend(3, 4) + ledger.backend(4, 4),
      0u);
}

// Weights keep their meaning: no backend takes more than the balance
// factor times its share (bounded loads bound from above only), a backend
// with twice the weight takes about twice the new flows, and one out of the
// table (draining) takes none.
TEST_F(PlacementTest, SharesFollowTheTableWeights) {
  publish({200, 100, 100, 100, 100, 100, 100, 0});
  const int flows = 70;
  const auto placed = openFlows(flows);
  EXPECT_EQ(placed.count(8), 0u);
  double others = 0;
  for (std::uint32_t b = 1; b <= 7; ++b) {
    EXPECT_LE(placed.at(b), 1.25 * placement_->share[b] * flows + 1) << b;
    if (b > 1) others += placed.at(b) / 6.0;
  }
  EXPECT_GT(placed.at(1), 1.6 * others);
}

// A placed connection is tracked where it was placed: its next packets
// follow it, and it is a flow exception (checkpointed, shared with peers).
TEST_F(PlacementTest, PlacedConnectionsStayAndAreExceptions) {
  publish(std::vector<std::uint32_t>(8, 100));
  std::map<std::uint16_t, std::uint32_t> placed;
  for (std::uint16_t port = 20000; port < 20016; ++port) placed[port] = steer(port).backend;
  int offTable = 0;
  for (const auto& [port, backend] : placed) {
    const std::uint64_t h = hashOf(port);
    const std::uint32_t table = snapshot_->vips[0].table.lookup(h);
    EXPECT_EQ(steer(port, kTcpAck).backend, backend);
    EXPECT_EQ(steer(port, kTcpAck | kTcpPsh).backend, backend);
    EXPECT_EQ(isTableException(*snapshot_, h, backend, snapshot_->vips[0].tag), backend != table);
    offTable += backend != table;
  }
  EXPECT_EQ(static_cast<std::uint64_t>(offTable), steering_->counters().placedOffTable.read());
  // A retransmitted SYN of a tracked connection is not placed again.
  for (const auto& [port, backend] : placed) EXPECT_EQ(steer(port).backend, backend);
}

// A connection that cannot be tracked (its flow-table buckets are full of
// embryonic entries it may not evict) goes to the table's entry, where its
// next packets would go too.
TEST_F(PlacementTest, AnUntrackablePlacementFallsBackToTheTable) {
  publish(std::vector<std::uint32_t>(4, 100), true, /*flowCapacity=*/4);
  for (std::uint16_t port = 40000; port < 40200; ++port) (void)steer(port);  // fill it
  setLoad(1, 1000, 4);
  setLoad(2, 1000, 4);
  setLoad(3, 1000, 4);
  int checked = 0;
  for (std::uint16_t port = 41000; port < 41400; ++port) {
    const std::uint32_t table = snapshot_->vips[0].table.lookup(hashOf(port));
    if (table == 4) continue;  // the placement's own choice
    const std::uint64_t failedBefore = steering_->counters().flowInsertFailed.read();
    const SteerResult r = steer(port);
    if (steering_->counters().flowInsertFailed.read() == failedBefore) continue;  // found room
    EXPECT_EQ(r.backend, table) << port;
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace spillway
