// Placement's control side: the byte-rate meter, the [placement] keys and
// a VIP's `placement`, and a ControlPlane that measures the fake workers'
// byte counters and hands every snapshot's placing VIP the rates, totals and
// entry shares that spillway/placement.hpp balances by.
#include "control/policy/byte_rates.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numeric>

#include "control/plane/control_plane.hpp"
#include "estate_fixture.hpp"
#include "fake_dataplane.hpp"

namespace spillway {
namespace {

TEST(ByteRateMeter, SmoothsTowardTheInstantRateWithItsTimeConstant) {
  ByteRateMeter m(1000);
  std::vector<std::uint64_t> bytes{0, 0, 0};
  m.sample(0, bytes);
  EXPECT_EQ(m.rate(1), 0.0);
  // 1 MB/s on index 1 for 100 ms: weight 1 - e^-0.1 of the way there.
  bytes[1] = 100'000;
  m.sample(100, bytes);
  EXPECT_NEAR(m.rate(1), 1e6 * (1 - std::exp(-0.1)), 1.0);
  EXPECT_EQ(m.rate(2), 0.0);
  // Held for 10 s: the average is the rate.
  for (Millis t = 200; t <= 10'000; t += 100) {
    bytes[1] += 100'000;
    m.sample(t, bytes);
  }
  EXPECT_NEAR(m.rate(1), 1e6, 1e6 * 1e-3);
  // Irregular sampling smooths the same: one 1 s step equals ten 100 ms ones.
  ByteRateMeter a(1000);
  ByteRateMeter b(1000);
  std::vector<std::uint64_t> x{0, 0};
  a.sample(0, x);
  b.sample(0, x);
  for (Millis t = 100; t <= 1000; t += 100) {
    x[1] = t * 500;
    b.sample(t, x);
  }
  a.sample(1000, x);
  EXPECT_NEAR(a.rate(1), b.rate(1), 1.0);
}

TEST(ByteRateMeter, ARecycledIndexRestartsAndNewIndicesHaveNoPast) {
  ByteRateMeter m(100);
  std::vector<std::uint64_t> bytes{0, 5'000'000};
  m.sample(0, bytes);
  bytes[1] += 1'000'000;
  m.sample(1000, bytes);
  EXPECT_GT(m.rate(1), 900'000.0);
  bytes[1] = 10;  // purged and reused
  m.sample(1100, bytes);
  EXPECT_EQ(m.rate(1), 0.0);
  bytes.push_back(7'000'000'000);  // a new index, counted before it was sampled
  m.sample(1200, bytes);
  EXPECT_EQ(m.rate(2), 0.0);
  m.sample(1200, bytes);  // no time passed: nothing changes, nothing divides by 0
  EXPECT_EQ(m.rate(2), 0.0);
}

std::string placingEstate(const std::string& extra = "") {
  std::string text = test::onePoolEstate(4);
  const std::string anchor = "pools = [\"onprem\"]\n";
  text.insert(text.find(anchor) + anchor.size(), "placement = \"bytes\"\n");
  return text + extra;
}

TEST(PlacementConfig, KeysAreReadAndBadValuesNamed) {
  auto ok = loadConfigFromString(placingEstate("\n[placement]\nbalance_factor = 1.5\n"
                                               "candidates = 4\n"
                                               "rate_interval = 0.2\nrate_smoothing = 3\n"),
                                 "t.toml");
  ASSERT_TRUE(ok) << formatErrors(ok.errors());
  EXPECT_EQ(ok.value().vips[0].placement, VipPlacementMode::Bytes);
  EXPECT_DOUBLE_EQ(ok.value().placement.balanceFactor, 1.5);
  EXPECT_EQ(ok.value().placement.candidates, 4u);
  EXPECT_EQ(ok.value().placement.rateInterval, 200u);
  EXPECT_EQ(ok.value().placement.rateSmoothing, 3000u);
  auto plain = loadConfigFromString(test::onePoolEstate(2), "t.toml");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain.value().vips[0].placement, VipPlacementMode::Table);

  const std::pair<std::string, std::string> bad[] = {
      {"\n[placement]\nbalance_factor = 1.0\n", "balance_factor"},
      {"\n[placement]\nbalance_factor = 11\n", "balance_factor"},
      {"\n[placement]\ncandidates = 0\n", "candidates"},
      {"\n[placement]\ncandidates = 17\n", "candidates"},
      {"\n[placement]\nrate_interval = 0\n", "rate_interval"},
      {"\n[placement]\nrate_interval = -1\n", "rate_interval"},
      {"\n[placement]\nrate_smoothing = \"1s\"\n", "rate_smoothing"},
      {"\n[placement]\nbalance = 2\n", "balance"},
  };
  for (const auto& [extra, field] : bad) {
    auto r = loadConfigFromString(placingEstate(extra), "t.toml");
    ASSERT_FALSE(r) << extra;
    EXPECT_NE(formatErrors(r.errors()).find(field), std::string::npos) << formatErrors(r.errors());
  }
  std::string wrongMode = placingEstate();
  wrongMode.replace(wrongMode.find("\"bytes\""), 7, "\"least_conn\"");
  auto r = loadConfigFromString(wrongMode, "t.toml");
  ASSERT_FALSE(r);
  EXPECT_NE(formatErrors(r.errors()).find("placement"), std::string::npos);
  std::string udp = placingEstate();
  udp.replace(udp.find("protocol = \"tcp\""), 16, "protocol = \"udp\"");
  r = loadConfigFromString(udp, "t.toml");
  ASSERT_FALSE(r);
  EXPECT_NE(formatErrors(r.errors()).find("UDP"), std::string::npos) << formatErrors(r.errors());
}

class PlacementControl : public ::testing::Test {
 protected:
  Config config(const std::string& extra = "") {
    auto r =
        loadConfigFromString(placingEstate(extra + "\n[control]\nstate_dir = \"\"\n"), "test.toml");
    EXPECT_TRUE(r) << formatErrors(r.errors());
    return r.value();
  }
  test::FakeDataplane dp_;
};

TEST_F(PlacementControl, SnapshotsCarryTheSharesAndTheLoads) {
  SnapshotBuilder builder;
  ASSERT_FALSE(builder.setConfig(config()));
  ControlPlane c(config(), "test.toml", builder, &dp_, 0);
  dp_.publish(c.takeSnapshot(0));
  const auto first = dp_.latest;
  ASSERT_NE(first, nullptr);
  ASSERT_NE(first->vips[0].placement, nullptr);
  const VipPlacement& p = *first->vips[0].placement;
  EXPECT_DOUBLE_EQ(p.balanceFactor, 1.25);
  const double shares = std::accumulate(p.share.begin(), p.share.end(), 0.0);
  EXPECT_NEAR(shares, 1.0, 1e-6);
  for (int i = 1; i <= 4; ++i) {
    EXPECT_NEAR(p.share[builder.indexOf(backendIdFromName("b" + std::to_string(i)))], 0.25, 0.01);
  }

  // The workers forward 3 MB/s to b1 (one flow), 1 MB/s to b3 (one flow),
  // and b4 holds two idle flows: the mean flow carries 1 MB/s, so b1 counts
  // as 3 flows, b3 as 1, b4 as its 2.
  const std::uint32_t b1 = builder.indexOf(backendIdFromName("b1"));
  const std::uint32_t b3 = builder.indexOf(backendIdFromName("b3"));
  const std::uint32_t b4 = builder.indexOf(backendIdFromName("b4"));
  dp_.stats.backendBytes.assign(8, 0);
  dp_.flowCounts = {LcoreFlowCounts{1, std::vector<std::uint64_t>(8, 0)}};
  dp_.flowCounts[0].byBackend[b1] = 1;
  dp_.flowCounts[0].byBackend[b3] = 1;
  dp_.flowCounts[0].byBackend[b4] = 2;
  dp_.answerFlowCounts = true;
  for (Millis t = 0; t <= 5000; t += 50) {
    dp_.stats.backendBytes[b1] = t * 3000;
    dp_.stats.backendBytes[b3] = t * 1000;
    (void)c.tick(t);
  }
  EXPECT_NEAR(p.loads->flows(b1), 3.0, 0.06);
  EXPECT_NEAR(p.loads->flows(b3), 1.0, 0.02);
  EXPECT_NEAR(p.loads->flows(b4), 2.0, 1e-9);
  EXPECT_NEAR(static_cast<double>(p.load->milliFlows) / kLoadScale, 6.0, 0.1);
  EXPECT_GT(p.loads->epoch(), 0u) << "the loads name the flow count they hold";
  // The views show them.
  const Json list = std::get<Json>(c.backendList());
  EXPECT_NEAR(list[0]["byte_rate"].get<double>(), 3e6, 3e6 * 0.02);
  EXPECT_NEAR(list[0]["placement_load_flows"].get<double>(), 3.0, 0.06);
  const Json vip = std::get<Json>(c.vipShow("nccl"));
  EXPECT_EQ(vip["placement"], "bytes");
  const Json dump = std::get<Json>(c.configDump(false));
  EXPECT_EQ(dump["vips"][0]["placement"], "bytes");
  EXPECT_DOUBLE_EQ(dump["placement"]["balance_factor"].get<double>(), 1.25);
  EXPECT_NEAR(vip["placement_load_flows"].get<double>(), 6.0, 0.1);
  EXPECT_NE(c.metricsText().find("spillway_backend_placement_load{backend=\"b1\"}"),
            std::string::npos);

  // A later snapshot (b2 drained) reads the same loads; b2 owns no entry.
  ASSERT_TRUE(std::holds_alternative<Json>(c.backendDrain("b2")));
  ASSERT_TRUE(c.tick(5050));
  dp_.publish(c.takeSnapshot(5050));
  const auto second = dp_.latest;
  ASSERT_NE(second->vips[0].placement, nullptr);
  EXPECT_EQ(second->vips[0].placement->load, p.load);
  EXPECT_EQ(second->vips[0].placement->loads, p.loads);
  EXPECT_EQ(second->vips[0].placement->share[builder.indexOf(backendIdFromName("b2"))], 0.0F);
}

TEST_F(PlacementControl, APlainVipHasNoPlacement) {
  auto plain =
      loadConfigFromString(test::onePoolEstate(2) + "\n[control]\nstate_dir = \"\"\n", "test.toml");
  ASSERT_TRUE(plain);
  SnapshotBuilder builder;
  ASSERT_FALSE(builder.setConfig(plain.value()));
  ControlPlane c(plain.value(), "test.toml", builder, &dp_, 0);
  dp_.publish(c.takeSnapshot(0));
  EXPECT_EQ(dp_.latest->vips[0].placement, nullptr);
  EXPECT_EQ(std::get<Json>(c.vipShow("nccl"))["placement"], "table");
}

}  // namespace
}  // namespace spillway

namespace spillway {
namespace {

// Flows placed off their table entry are exceptions with no table change:
// the next checkpoint comes [placement]-soon (AffinityKeeper placedInterval),
// not a minute later.
TEST_F(PlacementControl, FlowsPlacedOffTheTableAreCheckpointedWithinASecond) {
  char tmpl[] = "/tmp/spillway-placed-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto r = loadConfigFromString(placingEstate("\n[control]\nstate_dir = \"" + dir + "\"\n"),
                                "test.toml");
  ASSERT_TRUE(r) << formatErrors(r.errors());
  SnapshotBuilder builder;
  ASSERT_FALSE(builder.setConfig(r.value()));
  ControlPlane c(r.value(), "test.toml", builder, &dp_, 0);
  dp_.publish(c.takeSnapshot(0));
  const auto tick = [&](Millis t) {
    if (c.tick(t)) dp_.publish(c.takeSnapshot(t));
  };
  Millis t = 0;
  for (; t <= 3000; t += 10) tick(t);
  const std::uint64_t before = c.affinity().stats().checkpoints;
  ASSERT_GE(before, 1u) << c.affinity().stats().lastError;
  for (; t <= 6000; t += 10) tick(t);
  EXPECT_EQ(c.affinity().stats().checkpoints, before) << "no change, no placement: no checkpoint";
  // A worker places a flow on b3 whose table entry is elsewhere.
  const std::uint32_t b3 = builder.indexOf(backendIdFromName("b3"));
  std::uint64_t hash = 1;
  while (dp_.latest->vips[0].table.lookup(hash) == b3) hash += 7919;
  dp_.exportFlows.push_back(ExportedFlow{hash, b3, FlowState::Established, 0});
  dp_.stats.placedOffTable = 1;
  const Millis placedAt = t;
  for (; t <= placedAt + 1500 && c.affinity().stats().checkpoints == before; t += 10) tick(t);
  EXPECT_EQ(c.affinity().stats().checkpoints, before + 1);
  EXPECT_LE(t - placedAt, 1200u);
  EXPECT_EQ(c.affinity().stats().lastExceptions, 1u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace spillway
