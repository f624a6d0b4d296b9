// Two instances of a tier, reduced to what makes their tables: a WeightPolicy,
// the churn budget (limitChurn) and the Maglev build, fed one VIP's load each
// churn interval. Shared by the convergence unit test and the
// policy_divergence measurement; DPDK-free, deterministic (the noise comes
// from a seeded generator the caller owns).
//
// The VIP is the drill estate's shape: an on-prem pool (priority 0) and a
// cloud pool (priority 1), four backends each, base weight 100; the on-prem
// backends report GPU utilisation, the cloud ones nothing.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "control/policy/policy.hpp"
#include "spillway/flow_key.hpp"
#include "spillway/maglev.hpp"

namespace spillway::testing {

inline constexpr std::uint64_t kPipelineSeed = 0x5eed;

inline PolicyInput tierVip() {
  PolicyInput in;
  in.pools = {{"onprem", 0, PoolSite::OnPrem}, {"cloud", 1, PoolSite::Cloud}};
  for (std::uint32_t i = 0; i < 8; ++i) {
    PolicyBackend b;
    b.id = 1000 + i;
    b.name = (i < 4 ? "onprem" : "cloud") + std::to_string(i % 4);
    b.pool = i < 4 ? 0 : 1;
    b.weight = 100;
    in.backends.push_back(b);
  }
  return in;
}

class PolicyPipeline {
 public:
  PolicyPipeline(const PolicyConfig& config, std::uint32_t tableSize)
      : policy_(config), config_(config), tableSize_(tableSize), hasher_(kPipelineSeed) {}

  // One churn interval: the on-prem backends read `gpu[i]` (% utilisation).
  // Returns the table published after it.
  const MaglevTable& step(const std::vector<double>& gpu) {
    PolicyInput in = tierVip();
    for (std::size_t i = 0; i < gpu.size() && i < in.backends.size(); ++i) {
      in.backends[i].load.gpu = gpu[i];
    }
    const PolicyDecision d = policy_.decide(in);
    const std::vector<std::uint32_t> target = weightsOf(d);
    std::vector<std::uint32_t> next = target;
    if (!current_.empty() && current_ != target) {
      next = limitChurn(current_, target, forcedOf(d),
                        churnBudgetEntries(config_.churnBudget, tableSize_),
                        [&](const std::vector<std::uint32_t>& w) { return build(w).changed; })
                 .weights;
    }
    if (next != current_ || current_.empty()) {
      current_ = next;
      table_ = build(next).table;
    }
    return table_;
  }

  [[nodiscard]] const std::vector<std::uint32_t>& weights() const { return current_; }

 private:
  MaglevBuild build(const std::vector<std::uint32_t>& weights) {
    std::vector<MaglevBackend> input;
    for (std::uint32_t i = 0; i < weights.size(); ++i) {
      input.push_back(MaglevBackend{1000 + i, weights[i], i + 1});
    }
    MaglevBuildResult r =
        maglev_.build(input, hasher_, tableSize_, current_.empty() ? nullptr : &table_);
    return std::move(r).value();
  }

  WeightPolicy policy_;
  PolicyConfig config_;
  std::uint32_t tableSize_;
  FlowHasher hasher_;
  MaglevBuilder maglev_;
  std::vector<std::uint32_t> current_;
  MaglevTable table_;
};

}  // namespace spillway::testing
