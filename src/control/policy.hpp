// The weight and spillover policy: turns the backends of one VIP (their pools'
// priorities, base weights, effective states and smoothed load) into the
// integer Maglev weights of its table, and bounds how many table entries one
// step may move (the churn budget).
//
// In the spirit of Envoy's priority levels with an overprovisioning factor
// (envoyproxy.io, "Priority levels", "Panic threshold"), extended from health
// to load:
//
//  Saturation, per backend, with hysteresis (state kept in WeightPolicy per
//  backend id across calls): it turns on when gpu >= gpu_high or queue >=
//  queue_high, and off only when gpu <= gpu_low and queue <= queue_low. A
//  signal that is unknown or stale (std::nullopt) counts as no load: it
//  neither turns saturation on nor keeps it on; with both unknown a backend is
//  neutral (not saturated, load factor 1).
//
//  Load factor lf: 1 when not saturated; when saturated
//      lf = max(min_load_factor, 1 - max(pg, pq))
//      pg = clamp((gpu - gpu_low) / (100 - gpu_low), 0, 1)
//      pq = clamp((queue - queue_low) / (2 * queue_high - queue_low), 0, 1)
//  (an unknown signal's pressure is 0). So a backend that crosses gpu_high
//  drops at once to its pressure's share (gpu_low 75, gpu_high 90: 0.4 at
//  90 %), then recovers smoothly through the hysteresis band to 1 at gpu_low.
//  min_load_factor > 0 (config) keeps a fully loaded estate taking flows.
//
//  Quantisation (so that instances of a tier, each scraping load on its own,
//  publish the same tables): a saturated backend's lf is rounded to the grid
//  1 - k * load_factor_step, then clamped to [min_load_factor, 1], and held
//  at that grid point (per backend id, in WeightPolicy) until the raw lf
//  leaves the held point's cell by more than load_factor_hysteresis steps,
//  i.e. |raw - held| > step * (0.5 + hysteresis). Readings that differ by
//  less than the hysteresis band map to the same weight, and a reading that
//  hovers at a cell edge does not flip back and forth. A backend that is not
//  saturated has lf 1 exactly. Step 0 turns quantisation off. The default
//  step 0.04 is one GPU percentage point with gpu_low 75.
//
//  Priority levels: the VIP's pools grouped by priority (lowest first; pools
//  of equal priority form one level). Over a level's backends that are not
//  Disabled or Removed, with base weights w:
//      healthy    h_k = sum(w, Active) / sum(w)
//      available  a_k = sum(w * lf, Active) / sum(w)
//      share      s_k = min(1 - (s_0 + ... + s_{k-1}), a_k * overprovisioning)
//  and when the shares add up to less than 1 they are divided by their sum
//  (Envoy's normalisation: what no level can absorb goes to all in
//  proportion). Within a level, backend b gets s_k * w_b*lf_b / sum(w*lf,
//  Active in the level). Draining and Failed backends count in sum(w), so
//  losing them moves new flows down the priorities.
//
//  Panic: H = sum(w, Active) / sum(w) over every pool of the VIP (the same as
//  sum_k h_k * W_k / W). When H < panic_threshold, priorities and saturation
//  are ignored: every Active backend of the VIP gets w_b / sum(w, Active).
//  Unlike Envoy, panic never sends to Failed (or Draining, Disabled) backends:
//  an L4 balancer has no retry above it, so a new flow sent to a dead backend
//  is a broken connection; spreading over all healthy capacity is the useful
//  part. With no Active backend at all the table is empty (every entry
//  "none": new flows are dropped and counted, tracked flows are unaffected).
//
//  Output weights: round(share_b * kWeightScale), at least 1 when share_b > 0,
//  0 for a backend that is not Active.
//
// Churn budget (limitChurn): moves a table from its current weights toward the
// target by the largest step whose predicted change stays within the budget
// (binary search over the step, interpolated weights). Safety first: the
// weights of backends marked `forced` (not Active: Failed, Removed, Draining,
// Disabled) jump to their target before the search and the entries that costs
// are not charged; only load-, spillover- and weight-driven moves are
// budgeted. A recovering or new backend therefore ramps up within the budget.
//
// Thread contract: pure functions, and a WeightPolicy owned by the control
// thread. No I/O, no clock.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "control/config.hpp"
#include "spillway/snapshot.hpp"

namespace spillway {

// The sum of a VIP's weights when every backend is Active (a share of 1.0).
inline constexpr std::uint32_t kWeightScale = 1'000'000;

// Smoothed load; std::nullopt = unknown or stale.
struct BackendLoad {
  std::optional<double> gpu;    // utilisation in %, averaged over the host's GPUs
  std::optional<double> queue;  // requests waiting
};

struct PolicyPool {
  std::string name;
  std::uint32_t priority = 0;
  PoolSite site = PoolSite::OnPrem;
};

struct PolicyBackend {
  std::uint64_t id = 0;
  std::string name;
  std::uint32_t pool = 0;    // index into PolicyInput::pools
  std::uint32_t weight = 0;  // base weight (configured, or set by the operator)
  BackendState state = BackendState::Active;
  BackendLoad load;
};

// One VIP's backends.
struct PolicyInput {
  std::vector<PolicyPool> pools;
  std::vector<PolicyBackend> backends;
};

struct BackendDecision {
  std::uint64_t id = 0;
  std::string name;
  std::uint32_t weight = 0;  // the Maglev weight
  double share = 0;          // of the VIP's new flows, [0, 1]
  double loadFactor = 1;
  bool saturated = false;
  bool forced = false;  // not Active: its weight is 0 and applies at once (no churn budget)
};

struct PoolDecision {
  std::string name;
  std::uint32_t priority = 0;
  double share = 0;             // of the VIP's new flows
  double healthyFraction = 0;   // h of the pool alone
  double available = 0;         // a of the pool alone
  std::uint32_t active = 0;     // Active backends
  std::uint32_t saturated = 0;  // of those, saturated
};

struct PolicyDecision {
  std::vector<BackendDecision> backends;  // in input order
  std::vector<PoolDecision> pools;        // in input order
  bool panic = false;
  double healthyCapacity = 0;  // H
  bool empty = false;          // no backend takes new flows
  std::string summary;         // one line for people
};

// Saturation after a sample, given the state before it (the hysteresis).
[[nodiscard]] bool nextSaturated(const PolicyConfig& config, bool wasSaturated,
                                 const BackendLoad& load) noexcept;
// lf as defined above.
[[nodiscard]] double loadFactor(const PolicyConfig& config, bool saturated,
                                const BackendLoad& load) noexcept;
// lf on the grid: the grid point nearest `raw`, or `held` (the point used
// before) while raw stays within step * (0.5 + hysteresis) of it.
[[nodiscard]] double quantiseLoadFactor(const PolicyConfig& config, double raw,
                                        std::optional<double> held) noexcept;
// Shares of the priority levels from their available capacity a_k (in
// priority order): spill, then normalise. All zero when every a_k is 0.
[[nodiscard]] std::vector<double> spillShares(std::span<const double> available,
                                              double overprovisioning);
// The decision for the given saturation flags (one per input backend), with
// no state: WeightPolicy::decide() without the hysteresis bookkeeping. The
// load factors, when given (one per input backend), are used as they are;
// otherwise each is loadFactor() quantised with nothing held.
[[nodiscard]] PolicyDecision computeWeights(const PolicyConfig& config, const PolicyInput& input,
                                            const std::vector<bool>& saturated,
                                            std::span<const double> loadFactors = {});

class WeightPolicy {
 public:
  explicit WeightPolicy(PolicyConfig config) : config_(config) {}

  // Keeps the saturation states.
  void setConfig(const PolicyConfig& config) { config_ = config; }
  [[nodiscard]] const PolicyConfig& config() const noexcept { return config_; }

  // Updates each backend's saturation and held load factor from its load, then computes the
  // weights. Calling it again with the same load changes nothing, so a
  // backend that serves several VIPs may appear in each VIP's input.
  PolicyDecision decide(const PolicyInput& input);

  [[nodiscard]] bool saturated(std::uint64_t id) const;
  // Marks a backend saturated, as a restarted daemon's checkpoint says it was
  // (hysteresis carries over a restart).
  void restoreSaturated(std::uint64_t id) { saturated_[id] = true; }
  // Drops a backend's saturation state (a removed backend).
  void forget(std::uint64_t id) {
    saturated_.erase(id);
    heldLoadFactor_.erase(id);
  }

 private:
  PolicyConfig config_;
  std::map<std::uint64_t, bool> saturated_;
  std::map<std::uint64_t, double> heldLoadFactor_;  // quantised lf of saturated backends
};

// What changed between two decisions of the same VIP, worth an event:
// kind "panic" (entered / left), "spillover" (a pool's share moved by at least
// shareStep), "weight" (a backend became or stopped being saturated). subject
// is the pool or backend name (empty for panic). `before` may be null (the
// first decision): then only panic and saturated backends are noted.
struct PolicyNote {
  std::string kind;
  std::string subject;
  std::string cause;
};
[[nodiscard]] std::vector<PolicyNote> policyNotes(const PolicyDecision* before,
                                                  const PolicyDecision& after,
                                                  double shareStep = 0.05);

// floor(churnBudget * tableSize), at least 1.
[[nodiscard]] std::uint32_t churnBudgetEntries(double churnBudget,
                                               std::uint32_t tableSize) noexcept;

// Predicted table entries that differ from the current table if the weights
// were these (e.g. a MaglevBuilder build with the current table as previous).
using ChangedEntries = std::function<std::uint32_t(const std::vector<std::uint32_t>&)>;

struct ChurnStep {
  std::vector<std::uint32_t> weights;  // what to build now
  std::uint32_t predictedChanged = 0;  // changedEntries(weights)
  std::uint32_t mandatoryChanged = 0;  // of those, what the forced weights cost (not budgeted)
  double step = 1.0;                   // how far along base -> target, [0, 1]
  bool limited = false;                // step < 1: call again next churn interval
};

// current, target and forced are per backend, in the same order (a backend
// new to the table has current weight 0; missing entries count as 0 / not
// forced). The base is `current` with every forced weight set to its target;
// the result is base + step * (target - base), rounded, for the largest step
// (target itself when it fits; else a binary search of 8 probes, then a few
// halvings if even 1/256 is too much) with
//     changedEntries(weights) <= changedEntries(base) + budgetEntries.
// step 0 (the base alone) when nothing fits. changedEntries is called at most
// 16 times.
[[nodiscard]] ChurnStep limitChurn(std::span<const std::uint32_t> current,
                                   std::span<const std::uint32_t> target,
                                   const std::vector<bool>& forced, std::uint32_t budgetEntries,
                                   const ChangedEntries& changedEntries);

// The weights and forced flags of a decision, for limitChurn.
[[nodiscard]] std::vector<std::uint32_t> weightsOf(const PolicyDecision& decision);
[[nodiscard]] std::vector<bool> forcedOf(const PolicyDecision& decision);

}  // namespace spillway
