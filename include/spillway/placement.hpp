// Load-aware placement of new connections ("elephants"): for a VIP with
// `placement = "bytes"`, a new TCP connection goes to the backend its Maglev
// table gives unless that backend already carries more than its share of
// the VIP's load; then to the next backend of the table that does not.
//
// Why: NCCL opens a few long, heavy flows. Hashing 16 of them over 8
// backends lands them 2-3x unevenly whatever the table's entry balance (a
// simulation of 20,000 draws: max/mean 2.1 with one choice, 1.5 with the
// power of two choices, 1.2 with eight). Bounded loads (Mirrokni, Thorup and
// Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA 2018; HAProxy's
// `hash-balance-factor`) keep every backend within a factor of its share.
//
// Load is counted in flows, weighted by bytes: the control thread publishes
// for every backend
//     load_b = max(C_b, R_b / e)
// C_b its live tracked flows (all workers' flow tables, counted once a
// second), R_b its forwarded byte rate (EWMA), e the mean byte rate of a flow
// over the placing VIPs' backends (sum R / sum C). A backend of equal flows
// has load C_b; one whose flows are heavier than the mean counts by its bytes.
// A flow's own rate is unknown at its SYN, so counts are what a burst of new
// connections is balanced by, and bytes steer the next ones away from heavy
// backends; the meter's lag never makes a new flow look free.
//
// Each lcore adds P_b: the connections it placed since the flow count that
// load_b comes from began (PlacementLedger: per-epoch counters, an epoch
// being one flow count, so nothing is counted twice or missed for long).
//
//   candidates  c_0 = the table's entry for the flow's hash (plain Maglev),
//               then the distinct backends of the entries after it, up to
//               `candidates` of them. Entries are owned in proportion to the
//               Maglev weights, so drained, failed and spilled-from backends
//               are never candidates and weights keep their meaning.
//   bound       accept the first candidate with
//                   L_b + 1 <= max(f * s_b * (L + P + 1), 1)
//               L_b = load_b + P_b, s_b = the share of the table's entries b
//               owns, L = the sum of load over the VIP's backends, P = the
//               VIP's placements on this lcore since that count, f =
//               balance_factor (1.25). (The max: an idle backend may always
//               take a flow, like the ceiling in bounded loads, so the first
//               flows keep their table entries.)
//   fallback    none within bound: the candidate with the least
//               (L_b + 1) / s_b, the earliest on ties (with no load
//               anywhere: c_0).
//
// The choice depends on measured load, not only on the hash, so a flow placed
// off its table entry is a flow exception (flow_exceptions.hpp): the lcore's
// flow table pins it, the exception export checkpoints it and shares it with
// peer instances, and a restart or an ECMP move keeps it on its backend.
//
// Thread contract: BackendLoads and VipLoad are written by the control thread
// (relaxed single-writer words; the epoch last, with release) and read by any
// number of lcores; VipPlacement is immutable once in a published snapshot;
// a PlacementLedger belongs to one lcore. Nothing here allocates after
// construction, locks or throws on the packet path.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "spillway/flow_table.hpp"
#include "spillway/maglev.hpp"
#include "spillway/stats.hpp"

namespace spillway {

inline constexpr std::uint32_t kMaxPlacementCandidates = 16;
// Table entries a placement looks at, at most, to find its candidates.
inline constexpr std::uint32_t kMaxPlacementWalk = 128;
// Loads are published in thousandths of a flow.
inline constexpr double kLoadScale = 1000.0;

// load_b per backend index, and the flow count it comes from.
class BackendLoads {
 public:
  explicit BackendLoads(std::size_t slots)
      : loads_(std::make_unique<RelaxedU64[]>(slots)), slots_(slots) {}

  // Thousandths of a flow.
  void set(std::uint32_t index, std::uint64_t milliFlows) noexcept {
    if (index < slots_) loads_[index] = milliFlows;
  }
  [[nodiscard]] double flows(std::uint32_t index) const noexcept {
    return index < slots_
               ? static_cast<double>(static_cast<std::uint64_t>(loads_[index])) / kLoadScale
               : 0.0;
  }
  // The flow count (Dataplane::requestFlowCounts' n) the loads include; 0
  // before the first.
  void setEpoch(std::uint64_t n) noexcept { epoch_.store(n, std::memory_order_release); }
  [[nodiscard]] std::uint64_t epoch() const noexcept {
    return epoch_.load(std::memory_order_acquire);
  }
  [[nodiscard]] std::size_t slots() const noexcept { return slots_; }

 private:
  std::unique_ptr<RelaxedU64[]> loads_;
  std::size_t slots_;
  std::atomic<std::uint64_t> epoch_{0};
};

// One VIP's total, kept by the control thread across snapshots.
struct VipLoad {
  RelaxedU64 milliFlows;  // L: the sum of load_b over the VIP's table backends
};

// What a placing VIP's snapshot entry carries.
struct VipPlacement {
  double balanceFactor = 1.25;  // f
  std::uint32_t candidates = 8;
  // s_b by backend index: entries owned / table size (0 for non-members).
  std::vector<float> share;
  std::shared_ptr<const BackendLoads> loads;  // never null in a published snapshot
  std::shared_ptr<const VipLoad> load;        // never null in a published snapshot
};

// Connections one lcore placed, per flow-count epoch, per backend index and
// per VIP tag. Epoch n begins when the lcore starts flow count n; placements
// since the epoch of the published loads are the ones those loads lack.
class PlacementLedger {
 public:
  explicit PlacementLedger(std::size_t slots);

  // The lcore starts flow count n (n increasing): a new epoch.
  void beginEpoch(std::uint64_t n) noexcept;
  void add(std::uint32_t index, std::uint8_t tag) noexcept;
  // Placements since epoch `since` began (all kept ones when it is older).
  [[nodiscard]] std::uint32_t backend(std::uint32_t index, std::uint64_t since) const noexcept;
  [[nodiscard]] std::uint32_t vip(std::uint8_t tag, std::uint64_t since) const noexcept;
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }

 private:
  static constexpr std::size_t kEpochs = 3;
  template <class Read>
  [[nodiscard]] std::uint32_t sum(std::uint64_t since, Read read) const noexcept {
    std::uint32_t n = 0;
    const std::uint64_t first = since + kEpochs > epoch_ ? since : epoch_ - (kEpochs - 1);
    for (std::uint64_t e = first; e <= epoch_; ++e) n += read(e % kEpochs);
    return n;
  }

  std::array<std::unique_ptr<std::uint32_t[]>, kEpochs> byBackend_;
  std::array<std::array<std::uint32_t, FlowTable::kMaxVipTag + 1>, kEpochs> byVip_{};
  std::size_t slots_;
  std::uint64_t epoch_ = 0;
};

struct Placement {
  std::uint32_t backend = 0;       // 0: the table has no backend for the flow
  std::uint32_t tableBackend = 0;  // c_0
  std::uint32_t candidates = 0;    // looked at
};

// The backend for a new flow of a placing VIP (the design note's rule), not
// yet recorded in the ledger (the caller adds it once the flow is tracked).
[[nodiscard]] Placement placeNewFlow(const MaglevTable& table, const VipPlacement& placement,
                                     const PlacementLedger& ledger, std::uint64_t hash,
                                     std::uint8_t vipTag) noexcept;

}  // namespace spillway
