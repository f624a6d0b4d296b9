// Byte-aware placement of new flows ("elephants"): for a VIP with
// `placement = "bytes"`, a new TCP connection goes to the backend its Maglev
// table gives unless that backend already carries more than its share of
// the VIP's bytes; then to the next backend of the table that does not.
//
// Why: NCCL opens a few long, heavy flows. Hashing 16 of them over 8
// backends lands them 2-3x unevenly whatever the table's entry balance (a
// simulation of 20,000 draws: max/mean 2.1 with one choice, 1.5 with the
// power of two choices, 1.2 with eight). Bounded loads (Mirrokni, Thorup and
// Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA 2018; HAProxy's
// `hash-balance-factor`) keep every backend within a factor of its share:
//
//   candidates  c_0 = the table's entry for the flow's hash (plain Maglev),
//               then the distinct backends of the entries after it, up to
//               `candidates` of them. Entries are owned in proportion to the
//               Maglev weights, so drained, failed and spilled-from backends
//               are never candidates and weights keep their meaning.
//   load        L_b = R_b + E * P_b: R_b the backend's measured forwarded
//               byte rate (control thread, EWMA), P_b the flows this lcore
//               placed on b lately (decayed with a half-life, so a flow
//               counts before its bytes show in R_b), E = the VIP's mean byte
//               rate per backend, at least 1 byte/s (the weight of a flow not
//               yet measured: with no bytes measured anywhere, loads are
//               counts of placed flows).
//   bound       accept the first candidate with
//                   L_b + E <= max(f * s_b * (T + E * (P + 1)), E)
//               (the max: an idle backend may always take one flow, like the
//               ceiling of bounded loads, so the first flows keep their table
//               entries), s_b = the share of the table's entries b owns, T = the sum of
//               R over the VIP's backends, P = the VIP's recent placements on
//               this lcore, f = balance_factor (1.25).
//   fallback    none within bound: the candidate with the least (L_b + E) /
//               s_b, the earliest on ties (so with no load anywhere c_0).
//
// The choice depends on measured load, not only on the hash, so a flow placed
// off its table entry is a flow exception (flow_exceptions.hpp): the lcore's
// flow table pins it, the exception export checkpoints it and shares it with
// peer instances, and a restart or an ECMP move keeps it on its backend.
//
// Thread contract: BackendRates and VipLoad are written by the control thread
// (relaxed single-writer words) and read by any number of lcores;
// VipPlacement is immutable once in a published snapshot; RecentPlacements
// belongs to one lcore. Nothing here allocates after construction, locks or
// throws on the packet path.
#pragma once

#include <array>
#include <cmath>
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
inline constexpr Millis kDefaultPlacementHalfLife = 1000;
// Table entries a placement looks at, at most, to find its candidates.
inline constexpr std::uint32_t kMaxPlacementWalk = 128;

// Measured forwarded byte rate per backend index (bytes per second).
class BackendRates {
 public:
  explicit BackendRates(std::size_t slots)
      : rates_(std::make_unique<RelaxedU64[]>(slots)), slots_(slots) {}

  void set(std::uint32_t index, std::uint64_t bytesPerSecond) noexcept {
    if (index < slots_) rates_[index] = bytesPerSecond;
  }
  [[nodiscard]] std::uint64_t get(std::uint32_t index) const noexcept {
    return index < slots_ ? static_cast<std::uint64_t>(rates_[index]) : 0;
  }
  [[nodiscard]] std::size_t slots() const noexcept { return slots_; }

 private:
  std::unique_ptr<RelaxedU64[]> rates_;
  std::size_t slots_;
};

// One VIP's totals, kept by the control thread across snapshots.
struct VipLoad {
  RelaxedU64 totalRate;    // T: bytes/s over the VIP's table backends
  RelaxedU64 backendRate;  // E: T / their number, at least 1
};

// What a placing VIP's snapshot entry carries.
struct VipPlacement {
  double balanceFactor = 1.25;  // f
  std::uint32_t candidates = 8;
  // s_b by backend index: entries owned / table size (0 for non-members).
  std::vector<float> share;
  std::shared_ptr<const BackendRates> rates;  // never null in a published snapshot
  std::shared_ptr<const VipLoad> load;        // never null in a published snapshot
};

// Flows an lcore placed lately, per backend index and per VIP tag,
// exponentially decayed (lazily, on access) with the given half-life.
class RecentPlacements {
 public:
  RecentPlacements(std::size_t slots, Millis halfLife);

  [[nodiscard]] double backend(std::uint32_t index, Millis now) const noexcept {
    return index < slots_ ? decayed(byBackend_[index], now) : 0.0;
  }
  [[nodiscard]] double vip(std::uint8_t tag, Millis now) const noexcept {
    return decayed(byVip_[tag & FlowTable::kMaxVipTag], now);
  }
  void add(std::uint32_t index, std::uint8_t tag, Millis now) noexcept;
  [[nodiscard]] Millis halfLife() const noexcept { return halfLife_; }

 private:
  struct Decayed {
    float count = 0;
    std::uint32_t stamp = 0;  // low 32 bits of the time of `count`
  };
  [[nodiscard]] double decayed(const Decayed& d, Millis now) const noexcept {
    if (d.count == 0) return 0.0;
    const auto age = static_cast<std::uint32_t>(now) - d.stamp;
    // After 30 half-lives nothing is left worth a float.
    if (age >= 30 * halfLife_) return 0.0;
    return d.count * std::exp2(-static_cast<double>(age) / static_cast<double>(halfLife_));
  }
  void bump(Decayed& d, Millis now) noexcept;

  std::unique_ptr<Decayed[]> byBackend_;
  std::size_t slots_;
  std::array<Decayed, FlowTable::kMaxVipTag + 1> byVip_{};
  std::uint32_t halfLife_;
};

struct Placement {
  std::uint32_t backend = 0;  // 0: the table has no backend for the flow
  std::uint32_t tableBackend = 0;  // c_0
  std::uint32_t candidates = 0;    // looked at
};

// The backend for a new flow of a placing VIP (the design note's rule), not
// yet recorded in `recent` (the caller adds it once the flow is tracked).
[[nodiscard]] Placement placeNewFlow(const MaglevTable& table, const VipPlacement& placement,
                                     const RecentPlacements& recent, std::uint64_t hash,
                                     std::uint8_t vipTag, Millis now) noexcept;

}  // namespace spillway
