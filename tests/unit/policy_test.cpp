// The weight and spillover policy at its edges: watermarks and hysteresis,
// load factors, Envoy-style priority spill with overprovisioning and
// normalisation, panic, all-down, unknown load, and the churn budget against a
// real MaglevBuilder (each step within budget, repeated steps converge, health
// changes bypass the budget).
#include "control/policy/policy.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "spillway/flow_key.hpp"
#include "spillway/maglev.hpp"

namespace spillway {
namespace {

using S = BackendState;

constexpr double kEps = 1e-9;

PolicyConfig defaults() {
  return PolicyConfig{};  // gpu 75/90, queue 4/16, overprovisioning 1.4, panic 0.5, min lf 0.1
}

BackendLoad gpu(double g) {
  return BackendLoad{g, std::nullopt};
}
BackendLoad queue(double q) {
  return BackendLoad{std::nullopt, q};
}

// A VIP over an on-prem pool (priority 0) and a cloud pool (priority 1) of
// `onprem` and `cloud` backends of weight 100; ids 1.. in order.
PolicyInput hybrid(std::size_t onprem, std::size_t cloud) {
  PolicyInput in;
  in.pools = {{"onprem", 0, PoolSite::OnPrem}, {"cloud", 1, PoolSite::Cloud}};
  for (std::size_t i = 0; i < onprem + cloud; ++i) {
    PolicyBackend b;
    b.id = i + 1;
    b.name = (i < onprem ? "op" : "cl") + std::to_string(i + 1);
    b.pool = i < onprem ? 0 : 1;
    b.weight = 100;
    in.backends.push_back(b);
  }
  return in;
}

double sumShares(const PolicyDecision& d) {
  double s = 0;
  for (const BackendDecision& b : d.backends) s += b.share;
  return s;
}

std::uint64_t sumWeights(const PolicyDecision& d) {
  std::uint64_t s = 0;
  for (const BackendDecision& b : d.backends) s += b.weight;
  return s;
}

// ------------------------------------------------------------ saturation

TEST(Saturation, TurnsOnExactlyAtTheHighWatermarks) {
  const PolicyConfig c = defaults();
  EXPECT_FALSE(nextSaturated(c, false, gpu(89.999)));
  EXPECT_TRUE(nextSaturated(c, false, gpu(90)));
  EXPECT_FALSE(nextSaturated(c, false, queue(15.999)));
  EXPECT_TRUE(nextSaturated(c, false, queue(16)));
  EXPECT_TRUE(nextSaturated(c, false, BackendLoad{10, 16}));  // either signal
  EXPECT_FALSE(nextSaturated(c, false, BackendLoad{}));
}

TEST(Saturation, TurnsOffOnlyAtOrBelowBothLowWatermarks) {
  const PolicyConfig c = defaults();
  EXPECT_TRUE(nextSaturated(c, true, gpu(89)));
  EXPECT_TRUE(nextSaturated(c, true, gpu(75.001)));
  EXPECT_FALSE(nextSaturated(c, true, gpu(75)));
  EXPECT_TRUE(nextSaturated(c, true, BackendLoad{70, 4.5}));  // queue still above low
  EXPECT_FALSE(nextSaturated(c, true, BackendLoad{70, 4}));
  EXPECT_TRUE(nextSaturated(c, true, BackendLoad{80, 0}));  // gpu still above low
  // An unknown signal does not hold saturation on.
  EXPECT_FALSE(nextSaturated(c, true, queue(4)));
  EXPECT_FALSE(nextSaturated(c, true, BackendLoad{}));
}

TEST(Saturation, LoadFactor) {
  const PolicyConfig c = defaults();
  EXPECT_DOUBLE_EQ(loadFactor(c, false, gpu(99)), 1.0);  // not saturated: full weight
  EXPECT_NEAR(loadFactor(c, true, gpu(90)), 0.4, kEps);  // 1 - 15/25
  EXPECT_NEAR(loadFactor(c, true, gpu(80)), 0.8, kEps);
  EXPECT_NEAR(loadFactor(c, true, gpu(75)), 1.0, kEps);
  EXPECT_NEAR(loadFactor(c, true, gpu(97.5)), 0.1, kEps);  // floor: min_load_factor
  EXPECT_NEAR(loadFactor(c, true, gpu(100)), 0.1, kEps);
  EXPECT_NEAR(loadFactor(c, true, queue(16)), 1.0 - 12.0 / 28.0, kEps);
  EXPECT_NEAR(loadFactor(c, true, queue(32)), 0.1, kEps);  // full pressure at 2 x queue_high
  EXPECT_NEAR(loadFactor(c, true, BackendLoad{80, 16}), 1.0 - 12.0 / 28.0, kEps);  // the worse
  EXPECT_NEAR(loadFactor(c, true, BackendLoad{}), 1.0, kEps);
  PolicyConfig high = c;
  high.minLoadFactor = 0.5;
  EXPECT_NEAR(loadFactor(high, true, gpu(90)), 0.5, kEps);
}

TEST(Saturation, HysteresisAcrossDecisions) {
  WeightPolicy policy(defaults());
  PolicyInput in = hybrid(1, 0);
  const auto at = [&](double g) {
    in.backends[0].load = gpu(g);
    return policy.decide(in).backends[0];
  };
  EXPECT_FALSE(at(89).saturated);
  EXPECT_DOUBLE_EQ(at(89).loadFactor, 1.0);
  EXPECT_TRUE(at(90).saturated);  // up past high
  EXPECT_TRUE(at(85).saturated);  // down into the band: still saturated
  EXPECT_NEAR(at(85).loadFactor, 0.6, kEps);
  EXPECT_TRUE(at(76).saturated);
  EXPECT_FALSE(at(75).saturated);  // at low: released
  EXPECT_FALSE(at(85).saturated);  // back into the band from below: not saturated
  EXPECT_DOUBLE_EQ(at(85).loadFactor, 1.0);
  EXPECT_TRUE(at(95).saturated);
  EXPECT_TRUE(policy.saturated(1));
  // Load gone stale: neutral, and the state is released.
  in.backends[0].load = BackendLoad{};
  const BackendDecision d = policy.decide(in).backends[0];
  EXPECT_FALSE(d.saturated);
  EXPECT_DOUBLE_EQ(d.loadFactor, 1.0);
  EXPECT_FALSE(policy.saturated(1));
  policy.forget(1);
  EXPECT_FALSE(policy.saturated(1));
}

TEST(Saturation, DecidingTwiceWithTheSameLoadChangesNothing) {
  WeightPolicy policy(defaults());
  PolicyInput in = hybrid(2, 1);
  in.backends[0].load = gpu(92);
  const PolicyDecision a = policy.decide(in);
  in.backends[0].load = gpu(80);
  const PolicyDecision b = policy.decide(in);
  const PolicyDecision c = policy.decide(in);  // e.g. the next VIP with the same backend
  EXPECT_TRUE(a.backends[0].saturated);
  EXPECT_TRUE(b.backends[0].saturated);
  EXPECT_TRUE(c.backends[0].saturated);
  EXPECT_EQ(weightsOf(b), weightsOf(c));
}

// ----------------------------------------------------------------- spill

TEST(Spill, SharesFollowEnvoyPriorityLevels) {
  const auto shares = [](std::vector<double> a) { return spillShares(a, 1.4); };
  std::vector<double> s = shares({1.0, 1.0});
  EXPECT_NEAR(s[0], 1.0, kEps);
  EXPECT_NEAR(s[1], 0.0, kEps);
  s = shares({0.5, 1.0});  // 0.7 stays, 0.3 spills
  EXPECT_NEAR(s[0], 0.7, kEps);
  EXPECT_NEAR(s[1], 0.3, kEps);
  s = shares({0.3, 0.2});  // 0.42 + 0.28 = 0.7 < 1: normalised
  EXPECT_NEAR(s[0], 0.6, kEps);
  EXPECT_NEAR(s[1], 0.4, kEps);
  s = shares({0.0, 1.0});
  EXPECT_NEAR(s[0], 0.0, kEps);
  EXPECT_NEAR(s[1], 1.0, kEps);
  s = shares({0.0, 0.0});
  EXPECT_EQ(s, (std::vector<double>{0.0, 0.0}));
  s = shares({0.5, 0.2, 1.0});  // three levels: 0.7, 0.28, 0.02
  EXPECT_NEAR(s[0], 0.7, kEps);
  EXPECT_NEAR(s[1], 0.28, kEps);
  EXPECT_NEAR(s[2], 0.02, kEps);
  EXPECT_TRUE(spillShares({}, 1.4).empty());
}

TEST(Spill, OverprovisionedOnPremAt72PercentHealthyStillTakesEverything) {
  // On-prem: weights 72 and 28, the 28 one Failed: h = 0.72, 0.72 x 1.4 = 1.008.
  PolicyInput in = hybrid(2, 2);
  in.backends[0].weight = 72;
  in.backends[1].weight = 28;
  in.backends[1].state = S::Failed;
  const PolicyDecision d = computeWeights(defaults(), in, {});
  EXPECT_FALSE(d.panic);
  EXPECT_NEAR(d.pools[0].healthyFraction, 0.72, kEps);
  EXPECT_NEAR(d.pools[0].share, 1.0, kEps);
  EXPECT_NEAR(d.pools[1].share, 0.0, kEps);
  EXPECT_EQ(d.backends[0].weight, kWeightScale);
  EXPECT_EQ(d.backends[1].weight, 0u);
  EXPECT_TRUE(d.backends[1].forced);
  EXPECT_EQ(d.backends[2].weight, 0u);
  EXPECT_EQ(d.backends[3].weight, 0u);
  EXPECT_FALSE(d.backends[2].forced);  // Active, just not needed
  // At 70 %: 0.98 stays, 0.02 spills.
  in.backends[0].weight = 70;
  in.backends[1].weight = 30;
  const PolicyDecision e = computeWeights(defaults(), in, {});
  EXPECT_NEAR(e.pools[0].share, 0.98, kEps);
  EXPECT_NEAR(e.pools[1].share, 0.02, kEps);
  EXPECT_EQ(e.backends[2].weight, 10'000u);
  EXPECT_EQ(e.backends[3].weight, 10'000u);
}

TEST(Spill, CloudShareGrowsAsOnPremSaturatesAndReturnsBelowTheLowWatermark) {
  WeightPolicy policy(defaults());
  PolicyInput in = hybrid(4, 2);
  const auto cloudShareAt = [&](double g) {
    for (std::size_t i = 0; i < 4; ++i) in.backends[i].load = gpu(g);
    for (std::size_t i = 4; i < 6; ++i) in.backends[i].load = gpu(20);
    const PolicyDecision d = policy.decide(in);
    EXPECT_NEAR(sumShares(d), 1.0, 1e-9);
    return d.pools[1].share;
  };
  EXPECT_NEAR(cloudShareAt(50), 0.0, kEps);
  EXPECT_NEAR(cloudShareAt(89.9), 0.0, kEps);              // under the high watermark: all on-prem
  EXPECT_NEAR(cloudShareAt(90), 1.0 - 0.4 * 1.4, kEps);    // 0.44
  EXPECT_NEAR(cloudShareAt(93), 1.0 - 0.28 * 1.4, kEps);   // 0.608
  EXPECT_NEAR(cloudShareAt(97.5), 1.0 - 0.1 * 1.4, kEps);  // min load factor: 0.86
  EXPECT_NEAR(cloudShareAt(100), 1.0 - 0.1 * 1.4, kEps);
  // Coming down: still saturated in the band, on-prem recovers its share as
  // the load factor rises (at 85: lf 0.6, a = 0.6, s0 = 0.84).
  EXPECT_NEAR(cloudShareAt(85), 0.16, kEps);
  EXPECT_NEAR(cloudShareAt(80), 0.0, kEps);  // lf 0.8 x 1.4 >= 1
  EXPECT_TRUE(policy.saturated(1));
  EXPECT_NEAR(cloudShareAt(74), 0.0, kEps);
  EXPECT_FALSE(policy.saturated(1));  // released below the low watermark
}

TEST(Spill, PartialSaturationSpillsLittle) {
  PolicyInput in = hybrid(4, 2);
  in.backends[0].load = gpu(90);
  in.backends[1].load = gpu(90);
  const PolicyDecision d = computeWeights(defaults(), in, {true, true, false, false});
  // a0 = (0.4 + 0.4 + 1 + 1) / 4 = 0.7; s0 = 0.98.
  EXPECT_NEAR(d.pools[0].available, 0.7, kEps);
  EXPECT_NEAR(d.pools[0].share, 0.98, kEps);
  EXPECT_EQ(d.pools[0].saturated, 2u);
  EXPECT_EQ(d.pools[0].active, 4u);
  // Within the pool by w x lf: 0.98 x 0.4 / 2.8 = 0.14, 0.98 x 1 / 2.8 = 0.35.
  EXPECT_NEAR(d.backends[0].share, 0.14, kEps);
  EXPECT_NEAR(d.backends[2].share, 0.35, kEps);
  EXPECT_EQ(d.backends[0].weight, 140'000u);
  EXPECT_EQ(d.backends[2].weight, 350'000u);
  EXPECT_EQ(d.backends[4].weight, 10'000u);
  EXPECT_EQ(sumWeights(d), kWeightScale);
  EXPECT_EQ(d.summary,
            "onprem 98% (healthy 100%, available 70%, 2/4 saturated), cloud 2% (healthy 100%, "
            "available 100%)");
}

TEST(Spill, DrainingAndFailedCountAgainstHealthDisabledAndRemovedDoNot) {
  PolicyInput in = hybrid(2, 2);
  in.backends[1].state = S::Disabled;
  PolicyDecision d = computeWeights(defaults(), in, {});
  EXPECT_NEAR(d.pools[0].healthyFraction, 1.0, kEps);
  EXPECT_NEAR(d.pools[0].share, 1.0, kEps);
  in.backends[1].state = S::Removed;
  d = computeWeights(defaults(), in, {});
  EXPECT_NEAR(d.pools[0].share, 1.0, kEps);
  in.backends[1].state = S::Draining;
  d = computeWeights(defaults(), in, {});
  EXPECT_NEAR(d.pools[0].healthyFraction, 0.5, kEps);
  EXPECT_NEAR(d.pools[0].share, 0.7, kEps);
  EXPECT_EQ(d.backends[1].weight, 0u);
  EXPECT_TRUE(d.backends[1].forced);
}

TEST(Spill, PoolsOfEqualPriorityShareOneLevelByWeight) {
  PolicyInput in;
  in.pools = {{"rack1", 0, PoolSite::OnPrem},
              {"rack2", 0, PoolSite::OnPrem},
              {"cloud", 1, PoolSite::Cloud}};
  in.backends = {{1, "a", 0, 300, S::Active, {}, std::nullopt},
                 {2, "b", 1, 100, S::Active, {}, std::nullopt},
                 {3, "c", 1, 100, S::Failed, {}, std::nullopt},
                 {4, "d", 2, 100, S::Active, {}, std::nullopt}};
  const PolicyDecision d = computeWeights(defaults(), in, {});
  // Level 0: h = 400/500 = 0.8 -> 1.12 -> takes all, split 3:1.
  EXPECT_NEAR(d.pools[0].share, 0.75, kEps);
  EXPECT_NEAR(d.pools[1].share, 0.25, kEps);
  EXPECT_NEAR(d.pools[1].healthyFraction, 0.5, kEps);
  EXPECT_NEAR(d.pools[2].share, 0.0, kEps);
}

TEST(Spill, WeightsAreProportionalAndSumToTheScale) {
  PolicyInput in = hybrid(3, 0);
  in.backends[0].weight = 100;
  in.backends[1].weight = 200;
  in.backends[2].weight = 700;
  const PolicyDecision d = computeWeights(defaults(), in, {});
  EXPECT_EQ(d.backends[0].weight, 100'000u);
  EXPECT_EQ(d.backends[1].weight, 200'000u);
  EXPECT_EQ(d.backends[2].weight, 700'000u);
  // A base weight of 0 takes nothing but is not forced (an operator's weight).
  in.backends[0].weight = 0;
  const PolicyDecision e = computeWeights(defaults(), in, {});
  EXPECT_EQ(e.backends[0].weight, 0u);
  EXPECT_FALSE(e.backends[0].forced);
  EXPECT_EQ(sumWeights(e), kWeightScale);
}

TEST(Spill, UnknownLoadIsNeutral) {
  WeightPolicy policy(defaults());
  PolicyInput in = hybrid(2, 1);
  in.backends[0].load = BackendLoad{};
  in.backends[1].load = BackendLoad{std::nullopt, 2.0};
  const PolicyDecision d = policy.decide(in);
  EXPECT_DOUBLE_EQ(d.backends[0].loadFactor, 1.0);
  EXPECT_DOUBLE_EQ(d.backends[1].loadFactor, 1.0);
  EXPECT_EQ(d.backends[0].weight, 500'000u);
  EXPECT_EQ(d.backends[1].weight, 500'000u);
  EXPECT_EQ(d.backends[2].weight, 0u);
}

// ----------------------------------------------------------------- panic

TEST(Panic, AtTheThresholdNoPanicBelowItSpreadOverEveryActiveBackend) {
  PolicyInput in = hybrid(10, 10);
  for (std::size_t i = 0; i < 6; ++i) in.backends[i].state = S::Failed;    // on-prem 4/10
  for (std::size_t i = 10; i < 14; ++i) in.backends[i].state = S::Failed;  // cloud 6/10
  PolicyDecision d = computeWeights(defaults(), in, {});
  EXPECT_NEAR(d.healthyCapacity, 0.5, kEps);
  EXPECT_FALSE(d.panic);  // exactly at the threshold
  EXPECT_NEAR(d.pools[0].share, 0.56, kEps);
  EXPECT_NEAR(d.pools[1].share, 0.44, kEps);

  in.backends[14].state = S::Failed;  // 9 of 20 healthy
  d = computeWeights(defaults(), in, {true, true, true, true, true, true, true, true, true, true});
  EXPECT_NEAR(d.healthyCapacity, 0.45, kEps);
  EXPECT_TRUE(d.panic);
  // Priorities and saturation ignored: by base weight over the 9 Active.
  EXPECT_NEAR(d.pools[0].share, 4.0 / 9.0, kEps);
  EXPECT_NEAR(d.pools[1].share, 5.0 / 9.0, kEps);
  for (std::size_t i = 0; i < 20; ++i) {
    const bool active = in.backends[i].state == S::Active;
    EXPECT_EQ(d.backends[i].weight, active ? 111'111u : 0u) << i;
  }
  EXPECT_EQ(d.summary,
            "panic: 45% healthy < 50% threshold; new flows spread over all 9 active backends by "
            "base weight");
}

TEST(Panic, ZeroThresholdNeverPanics) {
  PolicyConfig c = defaults();
  c.panicThreshold = 0;
  PolicyInput in = hybrid(2, 2);
  in.backends[0].state = S::Failed;
  in.backends[1].state = S::Failed;
  in.backends[2].state = S::Failed;
  const PolicyDecision d = computeWeights(c, in, {});
  EXPECT_FALSE(d.panic);
  EXPECT_EQ(d.backends[3].weight, kWeightScale);
}

TEST(Panic, AllDownIsAnEmptyTableNotAFailedBackend) {
  PolicyInput in = hybrid(2, 2);
  for (PolicyBackend& b : in.backends) b.state = S::Failed;
  for (double threshold : {0.0, 0.5}) {
    PolicyConfig c = defaults();
    c.panicThreshold = threshold;
    const PolicyDecision d = computeWeights(c, in, {});
    EXPECT_TRUE(d.empty);
    EXPECT_EQ(d.panic, threshold > 0);
    EXPECT_EQ(sumWeights(d), 0u);
    for (const BackendDecision& b : d.backends) EXPECT_TRUE(b.forced);
    EXPECT_EQ(d.summary, "no backend takes new flows (none Active): the table is empty");
  }
  // No backends at all.
  const PolicyDecision e = computeWeights(defaults(), hybrid(0, 0), {});
  EXPECT_TRUE(e.empty);
  EXPECT_TRUE(e.backends.empty());
}

TEST(Panic, NotesForPanicSpilloverAndSaturation) {
  PolicyInput in = hybrid(4, 4);
  const PolicyDecision calm = computeWeights(defaults(), in, {});
  EXPECT_TRUE(policyNotes(&calm, calm).empty());
  EXPECT_TRUE(policyNotes(nullptr, calm).empty());
  in.backends[0].load = gpu(95);
  const PolicyDecision busy = computeWeights(defaults(), in, {true});
  std::vector<PolicyNote> notes = policyNotes(&calm, busy);
  ASSERT_EQ(notes.size(), 1u);  // 0.85 x 1.4 > 1: no spill yet, one backend saturated
  EXPECT_EQ(notes[0].kind, "weight");
  EXPECT_EQ(notes[0].subject, "op1");
  EXPECT_EQ(notes[0].cause, "saturated: load factor 0.20");
  for (std::size_t i = 1; i < 4; ++i) in.backends[i].state = S::Failed;
  const PolicyDecision spill = computeWeights(defaults(), in, {true});
  notes = policyNotes(&busy, spill);
  ASSERT_GE(notes.size(), 2u);
  EXPECT_EQ(notes[0].kind, "spillover");
  EXPECT_EQ(notes[0].subject, "onprem");
  EXPECT_EQ(notes[1].subject, "cloud");
  for (std::size_t i = 4; i < 8; ++i) in.backends[i].state = S::Failed;
  const PolicyDecision panic = computeWeights(defaults(), in, {true});
  notes = policyNotes(&spill, panic);
  ASSERT_FALSE(notes.empty());
  EXPECT_EQ(notes[0].kind, "panic");
  EXPECT_EQ(notes[0].cause.rfind("entered: ", 0), 0u);
}

// ---------------------------------------------------------- churn budget

TEST(Churn, BudgetEntries) {
  EXPECT_EQ(churnBudgetEntries(0.05, 65537), 3276u);
  EXPECT_EQ(churnBudgetEntries(1.0, 65537), 65537u);
  EXPECT_EQ(churnBudgetEntries(1e-9, 65537), 1u);
}

TEST(Churn, TargetWithinBudgetIsTakenWhole) {
  int calls = 0;
  const ChangedEntries l1 = [&](const std::vector<std::uint32_t>& w) {
    ++calls;
    return static_cast<std::uint32_t>(std::abs(static_cast<int>(w[0]) - 100) +
                                      std::abs(static_cast<int>(w[1]) - 100));
  };
  const std::vector<std::uint32_t> cur{100, 100};
  const std::vector<std::uint32_t> tgt{90, 110};
  ChurnStep s = limitChurn(cur, tgt, {}, 20, l1);
  EXPECT_FALSE(s.limited);
  EXPECT_EQ(s.weights, tgt);
  EXPECT_EQ(s.predictedChanged, 20u);
  EXPECT_DOUBLE_EQ(s.step, 1.0);
  // Over budget: the largest step that fits (a binary search; ~8 probes).
  calls = 0;
  s = limitChurn(cur, tgt, {}, 10, l1);
  EXPECT_TRUE(s.limited);
  EXPECT_LE(s.predictedChanged, 10u);
  EXPECT_GE(s.predictedChanged, 8u);
  EXPECT_GE(s.step, 0.5);  // rounding lets a little more through: 0.55 x 10 = 5.5 -> 95, 105
  EXPECT_LT(s.step, 0.6);
  EXPECT_LE(calls, 16);
  // Nothing to do.
  s = limitChurn(cur, cur, {}, 0, l1);
  EXPECT_FALSE(s.limited);
  EXPECT_EQ(s.weights, cur);
  EXPECT_EQ(s.predictedChanged, 0u);
  // Nothing fits: the base, step 0.
  s = limitChurn(cur, tgt, {}, 0, l1);
  EXPECT_TRUE(s.limited);
  EXPECT_EQ(s.weights, cur);
  EXPECT_EQ(s.predictedChanged, 0u);
  EXPECT_DOUBLE_EQ(s.step, 0.0);
}

// A VIP table of kM entries over 10 backends, built by the real builder.
class ChurnMaglev : public ::testing::Test {
 protected:
  static constexpr std::uint32_t kM = 65537;
  static constexpr std::size_t kN = 10;
  FlowHasher hasher_{0x5eed};
  MaglevBuilder builder_;

  MaglevTable build(const std::vector<std::uint32_t>& weights, const MaglevTable* previous,
                    std::uint32_t* changed = nullptr) {
    std::vector<MaglevBackend> in;
    for (std::size_t i = 0; i < weights.size(); ++i) {
      in.push_back({1000 + i, weights[i], static_cast<std::uint32_t>(i + 1)});
    }
    MaglevBuildResult r = builder_.build(in, hasher_, kM, previous);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error());
    if (!r.ok()) return MaglevTable{};
    if (changed != nullptr) *changed = r.value().changed;
    return std::move(r).value().table;
  }

  ChangedEntries changedAgainst(const MaglevTable& current) {
    return [this, &current](const std::vector<std::uint32_t>& w) {
      std::uint32_t changed = 0;
      build(w, &current, &changed);
      return changed;
    };
  }

  static std::uint32_t entriesOf(const MaglevTable& t, std::uint32_t backendIndex) {
    std::uint32_t n = 0;
    for (std::uint32_t e : t.entries()) n += e == backendIndex ? 1 : 0;
    return n;
  }
};

TEST_F(ChurnMaglev, SpilloverMovesWithinBudgetAndConverges) {
  // 5 on-prem and 5 cloud backends; on-prem takes everything, then saturates
  // (gpu 90: 44 % of new flows go to the cloud).
  WeightPolicy policy(defaults());
  PolicyInput in = hybrid(5, 5);
  std::vector<std::uint32_t> weights = weightsOf(policy.decide(in));
  for (std::size_t i = 0; i < 5; ++i) in.backends[i].load = gpu(90);
  const PolicyDecision target = policy.decide(in);
  ASSERT_NEAR(target.pools[1].share, 0.44, kEps);
  const std::vector<std::uint32_t> goal = weightsOf(target);

  const std::uint32_t budget = churnBudgetEntries(0.05, kM);
  ASSERT_EQ(budget, 3276u);
  MaglevTable table = build(weights, nullptr);
  int steps = 0;
  std::uint64_t moved = 0;
  while (weights != goal) {
    ASSERT_LT(steps, 40) << "no convergence";
    const ChurnStep s = limitChurn(weights, goal, forcedOf(target), budget, changedAgainst(table));
    ASSERT_GT(s.step, 0.0) << "stuck at step " << steps;
    EXPECT_EQ(s.mandatoryChanged, 0u);
    EXPECT_LE(s.predictedChanged, budget);
    EXPECT_LE(s.predictedChanged, 3277u);
    std::uint32_t changed = 0;
    MaglevTable next = build(s.weights, &table, &changed);
    EXPECT_EQ(changed, s.predictedChanged);  // the prediction is the build
    EXPECT_EQ(s.limited, s.weights != goal);
    moved += changed;
    table = std::move(next);
    weights = s.weights;
    ++steps;
  }
  // 44 % of the table had to move: at least 9 budgeted steps.
  EXPECT_GE(steps, 9);
  RecordProperty("steps", steps);
  EXPECT_EQ(table, build(goal, nullptr));
  std::uint32_t cloud = 0;
  for (std::uint32_t b = 6; b <= 10; ++b) cloud += entriesOf(table, b);
  EXPECT_NEAR(static_cast<double>(cloud) / kM, 0.44, 0.01);
  EXPECT_GE(moved, static_cast<std::uint64_t>(0.44 * kM));
}

TEST_F(ChurnMaglev, AFailedBackendBypassesTheBudget) {
  WeightPolicy policy(defaults());
  PolicyInput in = hybrid(kN, 0);
  const std::vector<std::uint32_t> weights = weightsOf(policy.decide(in));
  const MaglevTable table = build(weights, nullptr);
  const std::uint32_t owned = entriesOf(table, 4);  // backend id 4 -> index 4
  ASSERT_GT(owned, 5000u);

  in.backends[3].state = S::Failed;
  const PolicyDecision target = policy.decide(in);
  ASSERT_TRUE(target.backends[3].forced);
  const std::uint32_t budget = 10;  // far less than the failed backend's entries
  const ChurnStep s =
      limitChurn(weights, weightsOf(target), forcedOf(target), budget, changedAgainst(table));
  EXPECT_EQ(s.weights[3], 0u);  // applied at once
  EXPECT_GE(s.mandatoryChanged, owned);
  EXPECT_LE(s.predictedChanged, s.mandatoryChanged + budget);
  const MaglevTable next = build(s.weights, &table);
  EXPECT_EQ(entriesOf(next, 4), 0u);

  // The same move without the forced flag would keep the dead backend in the
  // table: the budget only bounds load and spillover moves.
  const ChurnStep unforced =
      limitChurn(weights, weightsOf(target), {}, budget, changedAgainst(table));
  EXPECT_GT(unforced.weights[3], 0u);
  EXPECT_TRUE(unforced.limited);
}

TEST_F(ChurnMaglev, ARecoveredBackendRampsUpWithinTheBudget) {
  WeightPolicy policy(defaults());
  PolicyInput in = hybrid(kN, 0);
  in.backends[0].state = S::Failed;
  std::vector<std::uint32_t> weights = weightsOf(policy.decide(in));
  MaglevTable table = build(weights, nullptr);
  in.backends[0].state = S::Active;
  const PolicyDecision target = policy.decide(in);
  const std::uint32_t budget = 1000;
  const ChurnStep s =
      limitChurn(weights, weightsOf(target), forcedOf(target), budget, changedAgainst(table));
  EXPECT_TRUE(s.limited);
  EXPECT_LE(s.predictedChanged, budget);
  EXPECT_GT(s.weights[0], 0u);
  EXPECT_LT(s.weights[0], target.backends[0].weight);
}

}  // namespace
}  // namespace spillway
