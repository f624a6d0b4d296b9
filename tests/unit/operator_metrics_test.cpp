// The metrics the alert rules (conf/spillway.rules.yml) read that no other
// test covers: VIPs without an active backend, spillover share, the table
// fingerprint, health and load-scrape failures per pool, flow-table fill and
// SYN-flood mode per lcore, and the control loop's rounds and longest gap. A
// real ControlPlane over a fake data path, with injected time; the health
// probes and scrapes go to an address nobody answers.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <variant>

#include "control/backends/snapshot_builder.hpp"
#include "control/config/config.hpp"
#include "control/plane/control_plane.hpp"
#include "estate_fixture.hpp"
#include "fake_dataplane.hpp"

namespace spillway {
namespace {

// op1 at a documentation address nobody answers: its probes and scrapes time out.
const std::string kEstate =
    test::estateHead(test::Head().lcores("[1, 2]").dataplaneExtra("flow_capacity = 1000\n")) +
    test::poolToml("onprem", "onprem", 0,
                   "[pool.health]\nkind = \"tcp\"\nport = 1\ninterval = 0.1\ntimeout = 0.05\n"
                   "[pool.load]\nport = 1\ninterval = 0.1\ntimeout = 0.05\n") +
    test::poolToml("cloud", "cloud", 1) + test::vipToml({"onprem", "cloud"}) +
    "\n[control]\nstate_dir = \"\"\n" + test::backendToml("op1", "198.51.100.77", "onprem") +
    test::backendToml("c1", "10.0.0.21", "cloud");

struct Rig {
  explicit Rig(const std::string& text = kEstate) {
    ConfigResult r = loadConfigFromString(text, "test.toml");
    EXPECT_TRUE(r.ok()) << formatErrors(r.errors());
    EXPECT_FALSE(builder.setConfig(r.value()));
    control = std::make_unique<ControlPlane>(r.value(), "test.toml", builder, &dp, now);
  }
  void step(Millis by = 100) {
    if (control->tick(now += by)) {
      if (auto s = control->takeSnapshot(now)) dp.publish(std::move(s));
    }
  }
  bool has(const std::string& line) { return control->metricsText().find(line) != npos; }
  static constexpr auto npos = std::string::npos;

  SnapshotBuilder builder;
  test::FakeDataplane dp;
  Millis now = 1'000;
  std::unique_ptr<ControlPlane> control;
};

TEST(OperatorMetrics, ControlLoopRoundsAndTheLongestGap) {
  Rig rig;
  for (int i = 0; i < 5; ++i) rig.step(100);
  EXPECT_TRUE(rig.has("spillway_control_loop_rounds_total 5\n")) << rig.control->metricsText();
  EXPECT_TRUE(rig.has("spillway_control_loop_max_gap_seconds 0.1\n"));
  rig.step(4'000);  // the loop stalled for 4 s
  rig.step(100);
  EXPECT_TRUE(rig.has("spillway_control_loop_max_gap_seconds 4\n")) << rig.control->metricsText();
  // Forgotten after one to two windows of 30 s.
  for (int i = 0; i < 700; ++i) rig.step(100);
  EXPECT_TRUE(rig.has("spillway_control_loop_max_gap_seconds 0.1\n")) << rig.control->metricsText();
}

TEST(OperatorMetrics, ActiveBackendsSpilloverAndFingerprintPerVip) {
  Rig rig;
  rig.step();
  EXPECT_TRUE(rig.has("spillway_vip_active_backends{vip=\"v\"} 2\n")) << rig.control->metricsText();
  EXPECT_TRUE(rig.has("spillway_vip_spilled_share{vip=\"v\"} 0\n"));
  ASSERT_TRUE(std::holds_alternative<Json>(rig.control->backendDisable("op1")));
  rig.step();
  // On-prem is gone: every new flow goes to the second priority level.
  EXPECT_TRUE(rig.has("spillway_vip_spilled_share{vip=\"v\"} 1\n")) << rig.control->metricsText();
  ASSERT_TRUE(std::holds_alternative<Json>(rig.control->backendDisable("c1")));
  rig.step();
  EXPECT_TRUE(rig.has("spillway_vip_active_backends{vip=\"v\"} 0\n")) << rig.control->metricsText();

  // Equal tables give equal fingerprints; a different table another one.
  Rig a, b;
  a.step();
  b.step();
  const auto fingerprint = [](Rig& r) {
    const std::string text = r.control->metricsText();
    const std::string key = "spillway_vip_table_fingerprint{vip=\"v\"} ";
    const auto at = text.find(key);
    EXPECT_NE(at, std::string::npos) << text;
    return text.substr(at + key.size(), text.find('\n', at) - at - key.size());
  };
  EXPECT_EQ(fingerprint(a), fingerprint(b));
  EXPECT_NE(fingerprint(a), "0");
  ASSERT_TRUE(std::holds_alternative<Json>(b.control->backendWeight("c1", 300, false)));
  for (int i = 0; i < 50; ++i) b.step();
  EXPECT_NE(fingerprint(a), fingerprint(b));
}

TEST(OperatorMetrics, FlowTableFillAndSynFloodPerLcore) {
  Rig rig;
  rig.dp.stats.lcores.push_back({.lcore = 1, .flowTableOccupancy = 900, .synFlood = true});
  rig.dp.stats.lcores.push_back({.lcore = 2, .flowTableOccupancy = 10});
  rig.step();
  EXPECT_TRUE(rig.has("spillway_flow_table_entries{lcore=\"1\"} 900\n"))
      << rig.control->metricsText();
  EXPECT_TRUE(rig.has("spillway_flow_table_capacity{lcore=\"1\"} 1000\n"));
  EXPECT_TRUE(rig.has("spillway_flow_table_syn_flood{lcore=\"1\"} 1\n"));
  EXPECT_TRUE(rig.has("spillway_flow_table_syn_flood{lcore=\"2\"} 0\n"));
}

// The worker's poll-round histogram (round_histogram.hpp) as a Prometheus
// histogram: cumulative buckets at 1 us, 2 us, ... 8.192 ms, then +Inf.
TEST(OperatorMetrics, WorkerRoundHistogramPerLcore) {
  EXPECT_EQ(roundBucket(0), 0u);
  EXPECT_EQ(roundBucket(999), 0u);
  EXPECT_EQ(roundBucket(1000), 1u);
  EXPECT_EQ(roundBucket(1999), 1u);
  EXPECT_EQ(roundBucket(2000), 2u);
  EXPECT_EQ(roundBucket(40'000), 6u);  // [32, 64) us
  EXPECT_EQ(roundBucket(8'191'999), 13u);
  EXPECT_EQ(roundBucket(8'192'000), 14u);
  EXPECT_EQ(roundBucket(~std::uint64_t{0}), 14u);

  Rig rig;
  DataplaneCounters::Lcore l{.lcore = 1};
  l.rounds.buckets[0] = 1000;  // under 1 us
  l.rounds.buckets[6] = 3;     // 32 to 64 us
  l.rounds.buckets[14] = 1;    // 8.192 ms or more
  l.rounds.sumNs = 20'000'000;
  l.rounds.maxNs = 9'000'000;
  rig.dp.stats.lcores.push_back(l);
  rig.step();
  const std::string text = rig.control->metricsText();
  EXPECT_TRUE(rig.has("spillway_worker_round_seconds_bucket{lcore=\"1\",le=\"1e-06\"} 1000\n"))
      << text;
  EXPECT_TRUE(rig.has("spillway_worker_round_seconds_bucket{lcore=\"1\",le=\"3.2e-05\"} 1000\n"));
  EXPECT_TRUE(rig.has("spillway_worker_round_seconds_bucket{lcore=\"1\",le=\"6.4e-05\"} 1003\n"));
  EXPECT_TRUE(rig.has("spillway_worker_round_seconds_bucket{lcore=\"1\",le=\"0.008192\"} 1003\n"));
  EXPECT_TRUE(rig.has("spillway_worker_round_seconds_bucket{lcore=\"1\",le=\"+Inf\"} 1004\n"));
  EXPECT_TRUE(rig.has("spillway_worker_round_seconds_count{lcore=\"1\"} 1004\n"));
  EXPECT_TRUE(rig.has("spillway_worker_round_seconds_sum{lcore=\"1\"} 0.02\n"));
  EXPECT_TRUE(rig.has("spillway_worker_round_max_seconds{lcore=\"1\"} 0.009\n"));
}

TEST(OperatorMetrics, HealthAndScrapeFailuresPerPool) {
  // "An address nobody answers" must not depend on the host's network (a
  // transparent proxy may accept any TCP connection): the probing thread
  // moves to a network namespace of its own, with no route at all.
  if (geteuid() != 0) GTEST_SKIP() << "needs root for its own network namespace (CI runs as root)";
  ASSERT_EQ(unshare(CLONE_NEWNET), 0) << std::strerror(errno);
  Rig rig;
  EXPECT_FALSE(rig.has("spillway_backend_health_up"));  // nothing probed yet
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  const std::string failures =
      "spillway_backend_health_failures_total{backend=\"op1\",pool=\"onprem\"} ";
  while (!(rig.has(failures) && !rig.has(failures + "0\n") &&
           rig.has("spillway_backend_load_scrape_up{backend=\"op1\",pool=\"onprem\"} 0\n"))) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << rig.control->metricsText();
    rig.step();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(rig.has("spillway_backend_health_up{backend=\"op1\",pool=\"onprem\"} "));
  // The cloud pool has no health check and no load source: no series.
  EXPECT_FALSE(rig.has("spillway_backend_health_up{backend=\"c1\""));
  EXPECT_FALSE(rig.has("spillway_backend_load_scrape_up{backend=\"c1\""));
}

}  // namespace
}  // namespace spillway
