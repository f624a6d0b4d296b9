// policy_divergence: how often two instances of a tier publish different
// tables when they read the same load with independent noise, before and
// after load-factor quantisation. Two PolicyPipelines (policy_pipeline.hpp)
// per configuration; reports, per (step, hysteresis, noise), the share of
// churn intervals whose tables differ (all of them, and those at least 10
// intervals into a plateau of the load), the mean number of differing
// entries (over all intervals, and over those that differ), the largest, and
// the longest run of differing intervals.
//
//   policy_divergence [INTERVALS] [TABLE_SIZE]     (defaults 3000, 65537)
//
// The true load: four on-prem backends around a common GPU level that holds
// plateaus (20..120 intervals) and ramps between them in 82..99 %, each
// backend offset by a fixed 0..1.5 points. Noise: uniform in +-N GPU points,
// per instance, backend and interval (one GPU point = one default grid step).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "tests/tier/policy_pipeline.hpp"

namespace {

using spillway::MaglevTable;
using spillway::PolicyConfig;
using spillway::testing::PolicyPipeline;

struct Trace {
  std::vector<double> gpu;
  std::vector<bool> settled;  // at least kSettle intervals into a plateau
};

constexpr int kSettle = 10;

Trace trueLoad(int intervals) {
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> level(82, 99);
  std::uniform_int_distribution<int> length(20, 120);
  Trace out;
  double now = 85;
  while (static_cast<int>(out.gpu.size()) < intervals) {
    const double next = level(rng);
    const int ramp = length(rng) / 4;
    for (int i = 1; i <= ramp; ++i) {
      out.gpu.push_back(now + (next - now) * i / ramp);
      out.settled.push_back(false);
    }
    now = next;
    const int hold = length(rng);
    for (int i = 0; i < hold; ++i) {
      out.gpu.push_back(now);
      out.settled.push_back(i >= kSettle);
    }
  }
  out.gpu.resize(static_cast<std::size_t>(intervals));
  out.settled.resize(static_cast<std::size_t>(intervals));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int intervals = argc > 1 ? std::atoi(argv[1]) : 3000;
  const auto tableSize = static_cast<std::uint32_t>(argc > 2 ? std::atol(argv[2]) : 65537);
  const Trace trace = trueLoad(intervals);
  const int settledIntervals =
      static_cast<int>(std::count(trace.settled.begin(), trace.settled.end(), true));
  const double offsets[4] = {0.0, 0.5, 1.0, 1.5};
  std::printf("%-6s %-5s %-6s %10s %10s %12s %12s %10s %9s\n", "step", "hyst", "noise", "differing",
              "settled", "mean_entries", "mean_if_diff", "max", "longest");
  for (const double step : {0.0, 0.04, 0.08}) {
    for (const double hysteresis : {0.0, 0.25, 0.45}) {
      if (step == 0.0 && hysteresis > 0) continue;
      for (const double noise : {0.25, 0.5, 1.0}) {
        PolicyConfig config;
        config.loadFactorStep = step;
        config.loadFactorHysteresis = hysteresis;
        PolicyPipeline a(config, tableSize);
        PolicyPipeline b(config, tableSize);
        std::mt19937_64 rng(7);
        std::uniform_real_distribution<double> jitter(-noise, noise);
        int differing = 0;
        int differingSettled = 0;
        int run = 0;
        int longest = 0;
        std::uint64_t entries = 0;
        std::uint32_t most = 0;
        for (std::size_t t = 0; t < trace.gpu.size(); ++t) {
          const double value = trace.gpu[t];
          std::vector<double> readA(4);
          std::vector<double> readB(4);
          for (int k = 0; k < 4; ++k) {
            readA[k] = value + offsets[k] + jitter(rng);
            readB[k] = value + offsets[k] + jitter(rng);
          }
          const MaglevTable& ta = a.step(readA);
          const MaglevTable& tb = b.step(readB);
          const std::uint32_t changed = spillway::countChanged(ta, tb);
          if (changed > 0) {
            ++differing;
            if (trace.settled[t]) ++differingSettled;
            longest = std::max(longest, ++run);
          } else {
            run = 0;
          }
          entries += changed;
          most = std::max(most, changed);
        }
        std::printf("%-6.2f %-5.2f %-6.2f %9.1f%% %9.1f%% %12.1f %12.1f %10u %9d\n", step,
                    hysteresis, noise, 100.0 * differing / intervals,
                    100.0 * differingSettled / std::max(settledIntervals, 1),
                    static_cast<double>(entries) / intervals,
                    differing > 0 ? static_cast<double>(entries) / differing : 0.0, most, longest);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
