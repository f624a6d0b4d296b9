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
// Latency (issue #12; anchors: Finagle/Linkerd and Envoy peak-EWMA,
// Cloudflare's dynamic steering, NGINX least_time, RFC 6298). Each backend's
// latency L = SRTT + 4 * RTTVAR of its health probes (health.hpp; unknown
// without a check or before the first successful probe). The policy looks at
// it once per latency window: WeightPolicy keeps its state per window index
// (PolicyInput::latencyWindow, Unix time / latency_window), so the many
// decide() calls of one window (several VIPs, state changes, dry runs) count
// as one.
//
//  Regions: in a level of two or more pools that are all cloud pools
//  (latency_regions = "cloud"; "all": any level of two or more pools; "off":
//  none) each pool is a region. A pool's latency P is the median L of its
//  Active backends with a known L. The level keeps a preferred region (per
//  VIP and priority): the first is the region with the lowest P, chosen once
//  every region with an Active backend has a P (or region_switch_windows
//  windows after the first P was known, among those known); then it
//  switches to the best other region q only when
//      P_q < P_pref - max(region_switch_margin * P_pref, region_switch_margin_ms)
//  in region_switch_windows consecutive windows (the same q each time). An
//  unknown P changes nothing; a preferred region with no Active backend is
//  left at once for the best known one. The level's share s_k then fills
//  the regions in order, preferred first, the rest by P (unknown last), each
//  up to its capacity c_p = overprovisioning * sum(w * lf, Active in p) /
//  sum(w, level), and what none can take is spread as spillShares() does.
//  Until a level has a preferred region its pools share by capacity, as at
//  every other level.
//
//  Degraded: a backend whose L stays above its bound
//      B = min(degraded_latency_ms,                                 (0: off)
//              max(degraded_latency_factor * M, degraded_latency_min_ms))
//  (M: the median L of the other Active backends of its pool with a known
//  L; factor 0: off) for degraded_windows consecutive windows is degraded:
//  its share within its pool (region levels) or level is that of weight
//  w * lf * degraded_weight. It keeps every tracked flow and is never
//  ejected or failed for latency. At most floor(degraded_max_fraction * n) of
//  a pool's n backends (not disabled or removed) are degraded at once, the
//  worst (highest L / B) first. A degraded backend below its bound for
//  degraded_windows windows (or displaced by a worse one) recovers: its
//  multiplier climbs by degraded_restore_step per window back to 1.
//  Degraded backends do not reduce the level's capacity a_k: latency moves
//  new flows between healthy peers, never down the priorities.
//
//  Every weight these change goes through the churn budget like load does.
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
#include <string_view>
#include <utility>
#include <vector>

#include "control/config/config.hpp"
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
  std::optional<double> latencyMs;  // SRTT + 4 * RTTVAR; std::nullopt = unknown
};

// One VIP's backends.
struct PolicyInput {
  std::vector<PolicyPool> pools;
  std::vector<PolicyBackend> backends;
  std::string vip;  // keys the VIP's preferred regions in WeightPolicy
  // The latency window (Unix time / latency_window): latency state moves at
  // most once per window. 0: before any window (latency state never moves).
  std::uint64_t latencyWindow = 0;
};

// A backend's latency mark.
enum class LatencyMark : std::uint8_t {
  Normal,
  Degraded,    // weight x degraded_weight
  Recovering,  // the multiplier climbing back to 1
};
[[nodiscard]] std::string_view toString(LatencyMark mark) noexcept;

// What computeWeights takes from the latency state: per input backend the
// degraded multiplier, and per priority level with a preferred region its
// pools in the order they fill (preferred first).
struct LatencyPlan {
  std::vector<double> weightFactors;                                // empty: all 1
  std::map<std::uint32_t, std::vector<std::uint32_t>> regionOrder;  // by priority
};

struct BackendDecision {
  std::uint64_t id = 0;
  std::string name;
  std::uint32_t weight = 0;  // the Maglev weight
  double share = 0;          // of the VIP's new flows, [0, 1]
  double loadFactor = 1;
  bool saturated = false;
  bool forced = false;  // not Active: its weight is 0 and applies at once (no churn budget)
  LatencyMark latency = LatencyMark::Normal;
  double latencyFactor = 1;              // the degraded multiplier, (0, 1]
  std::optional<double> latencyMs;       // L, as the policy saw it
  std::optional<double> latencyBoundMs;  // B, when one applies
};

struct PoolDecision {
  std::string name;
  std::uint32_t priority = 0;
  double share = 0;                 // of the VIP's new flows
  double healthyFraction = 0;       // h of the pool alone
  double available = 0;             // a of the pool alone
  std::uint32_t active = 0;         // Active backends
  std::uint32_t saturated = 0;      // of those, saturated
  std::uint32_t degraded = 0;       // backends marked degraded (latency)
  std::optional<double> latencyMs;  // P: median L of its Active backends with a known L
  bool region = false;              // a region of a level that chooses by latency
  bool preferred = false;           // ... and that level's preferred region
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
// `latency`, when given, applies the degraded multipliers and the region
// orders (WeightPolicy::decide() builds it from its latency state).
[[nodiscard]] PolicyDecision computeWeights(const PolicyConfig& config, const PolicyInput& input,
                                            const std::vector<bool>& saturated,
                                            std::span<const double> loadFactors = {},
                                            const LatencyPlan* latency = nullptr);
// The median of the values (the mean of the middle two for an even count);
// std::nullopt for none.
[[nodiscard]] std::optional<double> medianOf(std::vector<double> values);
// Whether the pools of level `priority` choose a preferred region.
[[nodiscard]] bool isRegionLevel(const PolicyConfig& config, const PolicyInput& input,
                                 std::uint32_t priority);

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
  // Drops a backend's saturation and latency state (a removed backend).
  void forget(std::uint64_t id) {
    saturated_.erase(id);
    heldLoadFactor_.erase(id);
    latency_.erase(id);
  }
  // A backend's latency mark and multiplier (Normal, 1 when none).
  [[nodiscard]] LatencyMark latencyMark(std::uint64_t id) const;
  [[nodiscard]] double latencyFactor(std::uint64_t id) const;
  // The preferred region (pool name) of a VIP's level; empty when none yet.
  [[nodiscard]] std::string preferredRegion(const std::string& vip, std::uint32_t priority) const;

 private:
  struct BackendLatency {
    std::uint64_t window = 0;  // the last window counted
    bool counted = false;
    std::uint32_t above = 0;  // consecutive windows above the bound
    std::uint32_t below = 0;  // ... at or below it
    LatencyMark mark = LatencyMark::Normal;
    double factor = 1.0;
    std::optional<double> boundMs;
    std::optional<double> latencyMs;
  };
  struct RegionChoice {
    std::uint64_t window = 0;
    bool counted = false;
    std::string preferred;           // pool name; empty: none yet
    std::string challenger;          // the region that has been better by the margin
    std::uint32_t held = 0;          // ... for this many consecutive windows
    std::uint32_t waited = 0;        // windows with a known latency but no first choice yet
    std::vector<std::string> order;  // the fill order, as of the last window
  };
  void updateDegraded(const PolicyInput& input);
  LatencyPlan updateRegions(const PolicyInput& input);

  PolicyConfig config_;
  std::map<std::uint64_t, bool> saturated_;
  std::map<std::uint64_t, double> heldLoadFactor_;  // quantised lf of saturated backends
  std::map<std::uint64_t, BackendLatency> latency_;
  std::map<std::pair<std::string, std::uint32_t>, RegionChoice> regions_;  // by (VIP, priority)
};

// What changed between two decisions of the same VIP, worth an event:
// kind "panic" (entered / left), "spillover" (a pool's share moved by at least
// shareStep), "weight" (a backend became or stopped being saturated),
// "latency" (a level's preferred region changed; a backend became degraded,
// started recovering or was restored). subject
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
