// Latency in the policy (policy.hpp, "Latency"): the preferred region of a
// level of cloud pools (first choice, the switch margin held for N windows,
// no flapping on a jittery WAN, unknown latency, a region with nothing
// active), the fill order up to each region's capacity, mixed levels left
// alone, and degraded backends (bound, windows, the cap per pool, the
// gradual restore, never ejected), every change a budgeted (not forced)
// weight. Windows are passed in; RTT samples come from a seeded generator
// through the health checker's RttFilter; nothing reads a clock.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "control/health/health.hpp"
#include "control/policy/policy.hpp"

namespace spillway {
namespace {

using S = BackendState;

constexpr double kEps = 1e-9;

// On-prem (priority 0, `onprem` backends, GPU `gpu` %) and two cloud regions
// "east" and "west" (priority 1, two backends each); ids 1.. in order,
// weight 100.
PolicyInput regions(std::size_t onprem = 2, double gpu = 92) {
  PolicyInput in;
  in.vip = "nccl";
  in.pools = {
      {"onprem", 0, PoolSite::OnPrem}, {"east", 1, PoolSite::Cloud}, {"west", 1, PoolSite::Cloud}};
  std::uint64_t id = 1;
  for (std::size_t i = 0; i < onprem; ++i) {
    PolicyBackend b;
    b.id = id++;
    b.name = "op" + std::to_string(i + 1);
    b.pool = 0;
    b.weight = 100;
    b.load.gpu = gpu;
    in.backends.push_back(b);
  }
  for (const char* name : {"e1", "e2", "w1", "w2"}) {
    PolicyBackend b;
    b.id = id++;
    b.name = name;
    b.pool = name[0] == 'e' ? 1 : 2;
    b.weight = 100;
    in.backends.push_back(b);
  }
  return in;
}

void setPoolLatency(PolicyInput& in, std::uint32_t pool, std::optional<double> ms) {
  for (PolicyBackend& b : in.backends) {
    if (b.pool == pool) b.latencyMs = ms;
  }
}

const PoolDecision& poolNamed(const PolicyDecision& d, const std::string& name) {
  for (const PoolDecision& p : d.pools) {
    if (p.name == name) return p;
  }
  ADD_FAILURE() << "no pool " << name;
  return d.pools.front();
}

// Runs `windows` windows from `first` with the same input; the last decision.
PolicyDecision runWindows(WeightPolicy& policy, PolicyInput& in, std::uint64_t& window,
                          std::uint32_t windows) {
  PolicyDecision d;
  for (std::uint32_t i = 0; i < windows; ++i) {
    in.latencyWindow = ++window;
    d = policy.decide(in);
  }
  return d;
}

// ---------------------------------------------------------------------------
// Regions

TEST(Regions, NoPreferenceUntilLatencyIsKnownThenTheLowest) {
  WeightPolicy policy{PolicyConfig{}};
  PolicyInput in = regions();
  std::uint64_t w = 0;
  // No latency: the cloud level shares by capacity, as before issue #12.
  PolicyDecision d = runWindows(policy, in, w, 3);
  // On-prem at 92 %: lf 0.32 (quantised: 0.32), keeps 0.448; the cloud 0.552.
  EXPECT_NEAR(poolNamed(d, "onprem").share, 0.448, 1e-6);
  EXPECT_NEAR(poolNamed(d, "east").share, 0.276, 1e-6);
  EXPECT_NEAR(poolNamed(d, "west").share, 0.276, 1e-6);
  EXPECT_TRUE(poolNamed(d, "east").region);
  EXPECT_FALSE(poolNamed(d, "onprem").region);
  EXPECT_EQ(policy.preferredRegion("nccl", 1), "");

  setPoolLatency(in, 1, 90.0);
  setPoolLatency(in, 2, 120.0);
  d = runWindows(policy, in, w, 1);
  EXPECT_EQ(policy.preferredRegion("nccl", 1), "east");
  EXPECT_TRUE(poolNamed(d, "east").preferred);
  EXPECT_FALSE(poolNamed(d, "west").preferred);
  // The preferred region takes the level's whole share (0.552 < its
  // capacity 1.4 * 200/400 = 0.7); the other none; on-prem unchanged.
  EXPECT_NEAR(poolNamed(d, "onprem").share, 0.448, 1e-6);
  EXPECT_NEAR(poolNamed(d, "east").share, 0.552, 1e-6);
  EXPECT_NEAR(poolNamed(d, "west").share, 0.0, kEps);
  EXPECT_NEAR(poolNamed(d, "east").latencyMs.value(), 90.0, kEps);
  EXPECT_NE(d.summary.find("preferred region"), std::string::npos) << d.summary;
}

TEST(Regions, FirstChoiceWaitsForEveryRegionOrForTheSwitchWindows) {
  PolicyConfig c;
  c.regionSwitchWindows = 3;
  WeightPolicy policy(c);
  PolicyInput in = regions();
  setPoolLatency(in, 2, 200.0);  // west known, east not yet
  std::uint64_t w = 0;
  runWindows(policy, in, w, 3);
  EXPECT_EQ(policy.preferredRegion("nccl", 1), "");
  // A region that never reports (no health check) does not block for ever.
  runWindows(policy, in, w, 1);
  EXPECT_EQ(policy.preferredRegion("nccl", 1), "west");
}

TEST(Regions, ThePreferredRegionFillsUpToItsCapacityThenTheNext) {
  WeightPolicy policy{PolicyConfig{}};
  PolicyInput in = regions(2, 99);  // lf 0.1 (min_load_factor)
  setPoolLatency(in, 1, 30.0);
  setPoolLatency(in, 2, 40.0);
  std::uint64_t w = 0;
  const PolicyDecision d = runWindows(policy, in, w, 1);
  // On-prem keeps 0.1 * 1.4 = 0.14; the cloud level 0.86: east takes its
  // capacity 0.7, west the other 0.16.
  EXPECT_NEAR(poolNamed(d, "onprem").share, 0.14, 1e-6);
  EXPECT_NEAR(poolNamed(d, "east").share, 0.7, 1e-6);
  EXPECT_NEAR(poolNamed(d, "west").share, 0.16, 1e-6);
  double total = 0;
  for (const BackendDecision& b : d.backends) total += b.share;
  EXPECT_NEAR(total, 1.0, 1e-9);
}

TEST(Regions, SwitchesOnlyAfterTheMarginHeldForTheWindows) {
  PolicyConfig c;  // margin max(20 %, 10 ms), 10 windows
  WeightPolicy policy(c);
  PolicyInput in = regions();
  setPoolLatency(in, 1, 30.0);
  setPoolLatency(in, 2, 40.0);
  std::uint64_t w = 0;
  runWindows(policy, in, w, 1);
  ASSERT_EQ(policy.preferredRegion("nccl", 1), "east");

  // East to 45: west (40) is better, but not by max(0.2 * 45, 10) = 10.
  setPoolLatency(in, 1, 45.0);
  runWindows(policy, in, w, 50);
  EXPECT_EQ(policy.preferredRegion("nccl", 1), "east");

  // East to 150: west is better by 110 > 30. Nine windows are not enough...
  setPoolLatency(in, 1, 150.0);
  runWindows(policy, in, w, c.regionSwitchWindows - 1);
  EXPECT_EQ(policy.preferredRegion("nccl", 1), "east");
  // ... and one window back within the margin starts the count again.
  setPoolLatency(in, 1, 45.0);
  runWindows(policy, in, w, 1);
  setPoolLatency(in, 1, 150.0);
  runWindows(policy, in, w, c.regionSwitchWindows - 1);
  EXPECT_EQ(policy.preferredRegion("nccl", 1), "east");
  const PolicyDecision d = runWindows(policy, in, w, 1);
  EXPECT_EQ(policy.preferredRegion("nccl", 1), "west");
  EXPECT_NEAR(poolNamed(d, "west").share, 0.552, 1e-6);
  EXPECT_NEAR(poolNamed(d, "east").share, 0.0, kEps);
}

TEST(Regions, ManyCallsInOneWindowCountOnce) {
  PolicyConfig c;
  c.regionSwitchWindows = 3;
  WeightPolicy policy(c);
  PolicyInput in = regions();
  setPoolLatency(in, 1, 30.0);
  setPoolLatency(in, 2, 40.0);
  std::uint64_t w = 0;
  runWindows(policy, in, w, 1);
  setPoolLatency(in, 1, 150.0);
  in.latencyWindow = ++w;
  for (int i = 0; i < 20; ++i) (void)policy.decide(in);  // state changes, dry runs
  PolicyInput grpc = in;  // another VIP over the same pools keeps its own choice
  grpc.vip = "grpc";
  (void)policy.decide(grpc);
  EXPECT_EQ(policy.preferredRegion("nccl", 1), "east");
  EXPECT_EQ(policy.preferredRegion("grpc", 1), "west");  // its first choice
  runWindows(policy, in, w, 1);
  EXPECT_EQ(policy.preferredRegion("nccl", 1), "east");
  runWindows(policy, in, w, 1);
  EXPECT_EQ(policy.preferredRegion("nccl", 1), "west");
}

TEST(Regions, UnknownLatencyChangesNothing) {
  PolicyConfig c;
  c.regionSwitchWindows = 2;
  WeightPolicy policy(c);
  PolicyInput in = regions();
  setPoolLatency(in, 1, 30.0);
  setPoolLatency(in, 2, 40.0);
  std::uint64_t w = 0;
  runWindows(policy, in, w, 1);
  setPoolLatency(in, 1, std::nullopt);
  setPoolLatency(in, 2, 5.0);
  const PolicyDecision d = runWindows(policy, in, w, 20);
  EXPECT_EQ(policy.preferredRegion("nccl", 1), "east");
  EXPECT_NEAR(poolNamed(d, "east").share, 0.552, 1e-6);
  EXPECT_FALSE(poolNamed(d, "east").latencyMs.has_value());
}

TEST(Regions, APreferredRegionWithNothingActiveIsLeftAtOnce) {
  WeightPolicy policy{PolicyConfig{}};
  PolicyInput in = regions();
  setPoolLatency(in, 1, 30.0);
  setPoolLatency(in, 2, 80.0);
  std::uint64_t w = 0;
  runWindows(policy, in, w, 1);
  ASSERT_EQ(policy.preferredRegion("nccl", 1), "east");
  for (PolicyBackend& b : in.backends) {
    if (b.pool == 1) b.state = S::Failed;
  }
  // Within the window already: east has no capacity, west takes the level.
  in.latencyWindow = w;
  PolicyDecision d = policy.decide(in);
  EXPECT_NEAR(poolNamed(d, "east").share, 0.0, kEps);
  EXPECT_NEAR(poolNamed(d, "west").share, 0.552, 1e-6);
  d = runWindows(policy, in, w, 1);
  EXPECT_EQ(policy.preferredRegion("nccl", 1), "west");
  // East back (and better): it must win by the margin for the windows again.
  for (PolicyBackend& b : in.backends) {
    if (b.pool == 1) b.state = S::Active;
  }
  runWindows(policy, in, w, PolicyConfig{}.regionSwitchWindows - 1);
  EXPECT_EQ(policy.preferredRegion("nccl", 1), "west");
  runWindows(policy, in, w, 1);
  EXPECT_EQ(policy.preferredRegion("nccl", 1), "east");
}

TEST(Regions, MixedLevelsShareByWeightUnlessAll) {
  // cloud-latency-spike's shape: on-prem and cloud both priority 0.
  PolicyInput in;
  in.vip = "nccl";
  in.pools = {{"onprem", 0, PoolSite::OnPrem}, {"cloud", 0, PoolSite::Cloud}};
  for (std::uint64_t id = 1; id <= 4; ++id) {
    PolicyBackend b;
    b.id = id;
    b.name = "b" + std::to_string(id);
    b.pool = id <= 2 ? 0 : 1;
    b.weight = 100;
    b.latencyMs = id <= 2 ? 1.0 : 30.0;
    in.backends.push_back(b);
  }
  WeightPolicy cloudOnly{PolicyConfig{}};
  std::uint64_t w = 0;
  PolicyDecision d = runWindows(cloudOnly, in, w, 20);
  EXPECT_NEAR(d.pools[0].share, 0.5, kEps);
  EXPECT_NEAR(d.pools[1].share, 0.5, kEps);
  EXPECT_FALSE(d.pools[0].region);

  PolicyConfig all;
  all.latencyRegions = LatencyRegions::All;
  WeightPolicy anyLevel(all);
  w = 0;
  d = runWindows(anyLevel, in, w, 1);
  EXPECT_TRUE(d.pools[0].preferred);
  EXPECT_NEAR(d.pools[0].share, 0.7, 1e-6);  // its capacity: 1.4 * 200/400
  EXPECT_NEAR(d.pools[1].share, 0.3, 1e-6);

  PolicyConfig off;
  off.latencyRegions = LatencyRegions::Off;
  WeightPolicy none(off);
  PolicyInput two = regions();
  setPoolLatency(two, 1, 30.0);
  setPoolLatency(two, 2, 300.0);
  w = 0;
  d = runWindows(none, two, w, 20);
  EXPECT_NEAR(poolNamed(d, "east").share, 0.276, 1e-6);
  EXPECT_NEAR(poolNamed(d, "west").share, 0.276, 1e-6);
}

// Two regions behind equally jittery WANs, 60 ms +- 30 ms (each direction
// 30 +- 15, as the drill's delay lines make it), one probe per backend per
// window: an hour of windows at the default margin and windows switches
// never; a real step (30 -> 150 ms) switches within the windows.
class JitteryWan : public ::testing::Test {
 protected:
  std::mt19937_64 rng_{12};
  std::vector<RttFilter> rtt_ = std::vector<RttFilter>(6);

  double sample(double rttMs, double jitterMs) {
    std::uniform_real_distribution<double> half(-jitterMs / 2, jitterMs / 2);
    return rttMs + half(rng_) + half(rng_);
  }
  // One probe per backend; the cloud backends' scores into the input.
  void probe(PolicyInput& in, double east, double eastJitter, double west, double westJitter) {
    for (std::size_t i = 0; i < in.backends.size(); ++i) {
      PolicyBackend& b = in.backends[i];
      if (b.pool == 0) continue;
      const double r = b.pool == 1 ? sample(east, eastJitter) : sample(west, westJitter);
      if (const auto& e = rtt_[i].add(r)) b.latencyMs = e->scoreMs();
    }
  }

  // Switches of the preferred region over `windows` windows of both regions
  // at 60 +- 30 ms.
  int switchesAtJitter(WeightPolicy& policy, PolicyInput& in, std::uint64_t& w, int windows) {
    std::string last;
    int switches = 0;
    for (int i = 0; i < windows; ++i) {
      probe(in, 60, 30, 60, 30);
      runWindows(policy, in, w, 1);
      const std::string now = policy.preferredRegion("nccl", 1);
      if (!last.empty() && now != last) ++switches;
      last = now;
    }
    return switches;
  }
};

TEST_F(JitteryWan, NoFlappingAt60PlusMinus30AndASwitchOnARealStep) {
  WeightPolicy policy{PolicyConfig{}};
  PolicyInput in = regions();
  std::uint64_t w = 0;
  EXPECT_EQ(switchesAtJitter(policy, in, w, 3600), 0);

  // Settle both at 30 ms, then the preferred one steps to 150 ms.
  for (int i = 0; i < 100; ++i) {
    probe(in, 30, 0, 30, 0);
    runWindows(policy, in, w, 1);
  }
  const std::string before = policy.preferredRegion("nccl", 1);
  const bool eastFirst = before == "east";
  int took = 0;
  while (policy.preferredRegion("nccl", 1) == before && took < 100) {
    probe(in, eastFirst ? 150 : 30, 0, eastFirst ? 30 : 150, 0);
    runWindows(policy, in, w, 1);
    ++took;
  }
  // The windows, and one: the step's first probe is a lone outlier to RttFilter.
  EXPECT_EQ(took, static_cast<int>(PolicyConfig{}.regionSwitchWindows) + 1);
}

// Why the default is 10 windows: the same hour with 5 does flap.
TEST_F(JitteryWan, FiveWindowsAreTooFewAt60PlusMinus30) {
  PolicyConfig c;
  c.regionSwitchWindows = 5;
  WeightPolicy policy(c);
  PolicyInput in = regions();
  std::uint64_t w = 0;
  const int switches = switchesAtJitter(policy, in, w, 3600);
  std::printf("region switches in an hour of 1 s windows at 60 +- 30 ms with 5 windows: %d\n",
              switches);
  EXPECT_GT(switches, 0);
}

// ---------------------------------------------------------------------------
// Degraded backends

// Three on-prem backends (weight 100, idle) in one pool, latencies given.
PolicyInput rack(std::vector<std::optional<double>> latency) {
  PolicyInput in;
  in.vip = "nccl";
  in.pools = {{"onprem", 0, PoolSite::OnPrem}, {"cloud", 1, PoolSite::Cloud}};
  for (std::size_t i = 0; i < latency.size(); ++i) {
    PolicyBackend b;
    b.id = i + 1;
    b.name = "op" + std::to_string(i + 1);
    b.pool = 0;
    b.weight = 100;
    b.latencyMs = latency[i];
    in.backends.push_back(b);
  }
  return in;
}

TEST(Degraded, MarkedAfterTheWindowsGetsALowerShareNeverEjected) {
  PolicyConfig c;  // factor 3 x peers' median, at least 20 ms; 5 windows; x 0.25
  WeightPolicy policy(c);
  PolicyInput in = rack({0.3, 0.4, 80.0});
  std::uint64_t w = 0;
  PolicyDecision d = runWindows(policy, in, w, c.degradedWindows - 1);
  EXPECT_EQ(d.backends[2].latency, LatencyMark::Normal);
  EXPECT_NEAR(d.backends[2].share, 1.0 / 3, 1e-9);
  EXPECT_NEAR(d.backends[2].latencyBoundMs.value(), 20.0, kEps);  // max(3 x 0.35, 20)

  d = runWindows(policy, in, w, 1);
  EXPECT_EQ(d.backends[2].latency, LatencyMark::Degraded);
  EXPECT_EQ(policy.latencyMark(3), LatencyMark::Degraded);
  EXPECT_NEAR(d.backends[2].latencyFactor, 0.25, kEps);
  // Its share within the pool: 0.25 / 2.25; the pool's share is unchanged.
  EXPECT_NEAR(d.backends[2].share, 0.25 / 2.25, 1e-9);
  EXPECT_NEAR(d.backends[0].share, 1.0 / 2.25, 1e-9);
  EXPECT_NEAR(d.pools[0].share, 1.0, 1e-9);
  EXPECT_EQ(d.pools[0].degraded, 1u);
  // A lower weight, never zero, never forced (the churn budget applies).
  EXPECT_GT(d.backends[2].weight, 0u);
  EXPECT_FALSE(d.backends[2].forced);

  const std::vector<PolicyNote> notes = policyNotes(nullptr, d);
  bool noted = false;
  for (const PolicyNote& n : notes) noted = noted || (n.kind == "latency" && n.subject == "op3");
  EXPECT_TRUE(noted);

  // However long it stays slow: degraded, never more.
  d = runWindows(policy, in, w, 100);
  EXPECT_EQ(d.backends[2].latency, LatencyMark::Degraded);
  EXPECT_NEAR(d.backends[2].share, 0.25 / 2.25, 1e-9);
}

TEST(Degraded, RestoredGraduallyAfterTheWindowsBelowTheBound) {
  PolicyConfig c;
  WeightPolicy policy(c);
  PolicyInput in = rack({0.3, 0.4, 80.0});
  std::uint64_t w = 0;
  runWindows(policy, in, w, c.degradedWindows);
  ASSERT_EQ(policy.latencyMark(3), LatencyMark::Degraded);
  in.backends[2].latencyMs = 0.5;
  PolicyDecision d = runWindows(policy, in, w, c.degradedWindows - 1);
  EXPECT_EQ(d.backends[2].latency, LatencyMark::Degraded);
  // Then 0.5, 0.75, 1: a step per window.
  std::vector<double> steps;
  for (int i = 0; i < 4; ++i) {
    d = runWindows(policy, in, w, 1);
    steps.push_back(d.backends[2].latencyFactor);
  }
  EXPECT_EQ(steps, (std::vector<double>{0.5, 0.75, 1.0, 1.0}));
  EXPECT_EQ(d.backends[2].latency, LatencyMark::Normal);
  EXPECT_NEAR(d.backends[2].share, 1.0 / 3, 1e-9);
}

TEST(Degraded, AtMostTheCapPerPoolTheWorstFirst) {
  PolicyConfig c;
  c.degradedMaxFraction = 0.25;  // 1 of 4
  WeightPolicy policy(c);
  PolicyInput in = rack({0.3, 0.4, 60.0, 90.0});
  std::uint64_t w = 0;
  PolicyDecision d = runWindows(policy, in, w, c.degradedWindows);
  EXPECT_EQ(d.backends[2].latency, LatencyMark::Normal);
  EXPECT_EQ(d.backends[3].latency, LatencyMark::Degraded);  // the worst (90 / 20)
  EXPECT_EQ(d.pools[0].degraded, 1u);

  // The worst recovers: the other, above its bound all along, takes its
  // place at the next window, and the first is restored step by step.
  in.backends[3].latencyMs = 0.4;
  d = runWindows(policy, in, w, 1);
  EXPECT_EQ(d.backends[2].latency, LatencyMark::Degraded);
  EXPECT_EQ(d.backends[3].latency, LatencyMark::Recovering);
  EXPECT_NEAR(d.backends[3].latencyFactor, 0.5, kEps);
  EXPECT_EQ(d.pools[0].degraded, 1u);

  // With the default cap (half a pool) both slow ones of four are degraded;
  // two slow ones of three are not even above the bound: their peers'
  // median is the other slow one (the bound is relative to the pool).
  WeightPolicy half(PolicyConfig{});
  PolicyInput four = rack({0.3, 0.4, 60.0, 90.0});
  w = 0;
  d = runWindows(half, four, w, c.degradedWindows);
  EXPECT_EQ(d.pools[0].degraded, 2u);

  // A pool of one backend is never degraded (nothing to shift its flows to).
  WeightPolicy alone(c);
  PolicyInput one = rack({500.0});
  w = 0;
  d = runWindows(alone, one, w, 50);
  EXPECT_EQ(d.backends[0].latency, LatencyMark::Normal);
}

TEST(Degraded, AbsoluteBoundAndUnknownLatency) {
  PolicyConfig c;
  c.degradedLatencyFactor = 0;  // the relative bound off
  c.degradedLatencyMs = 50;
  c.degradedWindows = 2;
  WeightPolicy policy(c);
  PolicyInput in = rack({40.0, 45.0, 70.0, std::nullopt});
  std::uint64_t w = 0;
  PolicyDecision d = runWindows(policy, in, w, 2);
  EXPECT_EQ(d.backends[2].latency, LatencyMark::Degraded);
  EXPECT_NEAR(d.backends[2].latencyBoundMs.value(), 50.0, kEps);
  EXPECT_EQ(d.backends[3].latency, LatencyMark::Normal);  // unknown: never marked
  EXPECT_FALSE(d.backends[3].latencyBoundMs.has_value());
  // Unknown later changes nothing either way.
  in.backends[2].latencyMs = std::nullopt;
  d = runWindows(policy, in, w, 10);
  EXPECT_EQ(d.backends[2].latency, LatencyMark::Degraded);

  // Both bounds off: nothing is ever degraded.
  PolicyConfig off;
  off.degradedLatencyFactor = 0;
  WeightPolicy never(off);
  PolicyInput slow = rack({0.3, 0.3, 900.0});
  w = 0;
  d = runWindows(never, slow, w, 50);
  EXPECT_EQ(d.backends[2].latency, LatencyMark::Normal);
}

TEST(Degraded, SaturatedAndDegradedMultiply) {
  PolicyConfig c;
  WeightPolicy policy(c);
  PolicyInput in = rack({0.3, 0.4, 80.0});
  in.backends[2].load.gpu = 95;  // lf 0.2
  std::uint64_t w = 0;
  const PolicyDecision d = runWindows(policy, in, w, c.degradedWindows);
  ASSERT_EQ(d.backends[2].latency, LatencyMark::Degraded);
  // On-prem a = (100 + 100 + 20) / 300 -> x 1.4 > 1: keeps all; op3 weighs
  // 100 * 0.2 * 0.25 = 5 against 100 + 100.
  EXPECT_NEAR(d.backends[2].share, 5.0 / 205.0, 1e-6);
}

// The drill's rack on a busy host: three 0.3 ms LAN backends probed every
// 0.2 s, windows of 0.5 s, 3 windows to degrade (degraded-backend.toml), and
// now and then a probe the host stalls for 150 ms (one in five, never two in
// a row). Scored from raw samples, that marks healthy backends degraded (so
// new flows move off them); through the filter it never does, and a real
// step to 60 ms still degrades within the windows.
TEST(Degraded, LoneLateProbesOnABusyHostNeverDegradeALanBackend) {
  PolicyConfig c;
  c.degradedWindows = 3;
  const auto run = [&](bool filtered, int stepAt, int windows) {
    WeightPolicy policy(c);
    PolicyInput in = rack({0.3, 0.3, 0.3});
    std::vector<RttFilter> filters(3);
    std::vector<std::optional<RttEstimate>> raw(3);
    std::mt19937_64 rng(7);
    std::uint64_t w = 0;
    int probe = 0;
    int degradedWindows = 0;
    int lastLate = -2;
    for (int i = 0; i < windows; ++i) {
      // Two or three probes per backend per 0.5 s window (every 0.2 s).
      const int probes = (i % 2 == 0) ? 3 : 2;
      for (int k = 0; k < probes; ++k, ++probe) {
        const bool late = probe - lastLate > 1 && rng() % 5 == 0;
        if (late) lastLate = probe;
        for (std::size_t b = 0; b < 3; ++b) {
          double r = 0.3;
          if (late && b == static_cast<std::size_t>(probe) % 3) r = 150.0;
          if (stepAt >= 0 && i >= stepAt && b == 2) r = 60.0;
          if (filtered) {
            if (const auto& e = filters[b].add(r)) in.backends[b].latencyMs = e->scoreMs();
          } else {
            raw[b] = nextRttEstimate(raw[b], r);
            in.backends[b].latencyMs = raw[b]->scoreMs();
          }
        }
      }
      const PolicyDecision d = runWindows(policy, in, w, 1);
      for (const BackendDecision& b : d.backends) {
        if (b.latency != LatencyMark::Normal) ++degradedWindows;
      }
      if (stepAt >= 0 && i == stepAt + 1 + static_cast<int>(c.degradedWindows)) {
        EXPECT_EQ(d.backends[2].latency, LatencyMark::Degraded);
      }
    }
    return degradedWindows;
  };
  EXPECT_GT(run(false, -1, 600), 0);  // why the filter is there
  EXPECT_EQ(run(true, -1, 7200), 0);  // an hour of windows
  EXPECT_GT(run(true, 100, 120), 0);  // a real step still degrades
}

}  // namespace
}  // namespace spillway
