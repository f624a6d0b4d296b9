// Weighted Maglev consistent hashing: the table that maps a flow hash to a
// backend for new flows of one VIP.
//
// Follows Eisenbud et al., "Maglev: A Fast and Reliable Software Network Load
// Balancer", NSDI'16, section 3.4: every backend has a permutation of the M
// table slots, p(j) = (offset + j * skip) mod M with M prime, and the backends
// take turns claiming their next unclaimed preferred slot until the table is
// full. Weights use Envoy's turn rule: in iteration t (from 1) backend i takes a
// turn when t * w_i >= target_i (target_i starts at 0), then target_i += w_max.
// A backend of weight 0 takes no turn and owns no slot.
//
// The table is a pure function of (backend ids, weights, backend indices, hash
// seed, M): backends are ordered by id before the fill, offset and skip come
// from FlowHasher::hashId(id, 0) % M and hashId(id, 1) % (M - 1) + 1. Every
// load balancer instance given the same state builds the same table.
//
// Lookup is one multiply-shift of the high 32 bits of the flow hash (the flow
// table indexes with the low bits) and one load: no division, no branch.
//
// Thread contract: a MaglevBuilder belongs to one thread (the control thread);
// it keeps scratch buffers between builds. A MaglevTable is immutable once
// published in a snapshot; any number of lcores may call lookup() on it
// concurrently.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "spillway/flow_key.hpp"

namespace spillway {

inline constexpr std::uint32_t kMaglevDefaultTableSize = 65537;
// Bounds the table at 64 MiB of entries, and keeps the range-reduction bias of
// a 32-bit hash over M slots (at most M / 2^32 relative) below 0.4 %.
inline constexpr std::uint32_t kMaglevMaxTableSize = std::uint32_t{1} << 24;

// std::nullopt when tableSize is a prime in [2, kMaglevMaxTableSize]; otherwise
// why not, with a prime to use instead.
[[nodiscard]] std::optional<std::string> validateMaglevTableSize(std::uint32_t tableSize);

struct MaglevBackend {
  std::uint64_t id = 0;            // stable identity: orders the fill, seeds the permutation
  std::uint32_t weight = 0;        // 0: no new flows
  std::uint32_t backendIndex = 0;  // value stored in the table; >= 1 (0 means "none")
};

// One backend's permutation, given explicitly. Turn order is the input order.
struct MaglevPermutation {
  std::uint32_t offset = 0;  // in [0, M)
  std::uint32_t skip = 1;    // in [1, M)
  std::uint32_t weight = 1;
  std::uint32_t backendIndex = 0;
};

// The permutation of backend `id` in a table of `tableSize` slots.
[[nodiscard]] MaglevPermutation maglevPermutation(const FlowHasher& hasher, std::uint64_t id,
                                                  std::uint32_t tableSize) noexcept;

class MaglevTable {
 public:
  // One slot holding "none", so lookup() is defined on a default table.
  MaglevTable() : entries_(1, 0), size_(1) {}

  [[nodiscard]] std::uint32_t size() const noexcept { return size_; }
  [[nodiscard]] std::span<const std::uint32_t> entries() const noexcept { return entries_; }

  // Backend index for a new flow with this hash; 0 means "none".
  [[nodiscard]] std::uint32_t lookup(std::uint64_t flowHash) const noexcept {
    return entries_[slotOf(flowHash, size_)];
  }

  [[nodiscard]] static constexpr std::uint32_t slotOf(std::uint64_t flowHash,
                                                      std::uint32_t tableSize) noexcept {
    return static_cast<std::uint32_t>(((flowHash >> 32) * tableSize) >> 32);
  }

  friend bool operator==(const MaglevTable&, const MaglevTable&) = default;

 private:
  friend class MaglevBuilder;
  std::vector<std::uint32_t> entries_;
  std::uint32_t size_;
};

// Slots whose backend differs between two tables. Tables of different sizes map
// hashes to slots differently, so then every slot of `after` counts.
[[nodiscard]] std::uint32_t countChanged(const MaglevTable& before,
                                         const MaglevTable& after) noexcept;

struct MaglevShare {
  std::uint64_t id = 0;  // backend id; input position for buildFromPermutations
  std::uint32_t backendIndex = 0;
  std::uint32_t weight = 0;
  std::uint32_t entries = 0;  // slots owned
};

struct MaglevBuild {
  MaglevTable table;
  std::vector<MaglevShare> shares;  // one per input backend, in turn order (by id)
  std::uint32_t changed = 0;        // slots that differ from `previous`; all when none given
  bool allNone = false;             // no backend of positive weight: every slot is 0
};

struct MaglevError {
  std::string message;
};

// A build, or the reason the input was rejected.
class MaglevBuildResult {
 public:
  MaglevBuildResult(MaglevBuild build) : v_(std::move(build)) {}
  MaglevBuildResult(MaglevError error) : v_(std::move(error)) {}

  [[nodiscard]] bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }
  // value() on an error, or error() on a value, throws std::bad_variant_access.
  [[nodiscard]] MaglevBuild& value() & { return std::get<MaglevBuild>(v_); }
  [[nodiscard]] const MaglevBuild& value() const& { return std::get<MaglevBuild>(v_); }
  [[nodiscard]] MaglevBuild&& value() && { return std::get<MaglevBuild>(std::move(v_)); }
  [[nodiscard]] const std::string& error() const { return std::get<MaglevError>(v_).message; }

 private:
  std::variant<MaglevBuild, MaglevError> v_;
};

class MaglevBuilder {
 public:
  // Rejects a non-prime or too large size, a duplicate id, a duplicate
  // backendIndex and a backendIndex of 0. `previous`, when given, sets
  // MaglevBuild::changed.
  [[nodiscard]] MaglevBuildResult build(std::span<const MaglevBackend> backends,
                                        const FlowHasher& hasher,
                                        std::uint32_t tableSize = kMaglevDefaultTableSize,
                                        const MaglevTable* previous = nullptr);

  // The same fill from explicit permutations, taking turns in input order
  // (the paper's Table 1 example). Rejects what build() does, and an offset or
  // skip out of range.
  [[nodiscard]] MaglevBuildResult buildFromPermutations(
      std::span<const MaglevPermutation> permutations, std::uint32_t tableSize,
      const MaglevTable* previous = nullptr);

 private:
  void clearScratch(std::size_t capacity);
  void addTurnTaker(std::uint32_t offset, std::uint32_t skip, std::uint32_t weight,
                    std::uint32_t backendIndex);
  void fill(std::uint32_t tableSize, std::uint32_t* entries) noexcept;
  [[nodiscard]] MaglevBuildResult finish(std::uint32_t tableSize, const MaglevTable* previous);

  // Struct-of-arrays state of the backends that take turns (weight > 0), in
  // turn order, reused across builds.
  std::vector<std::uint32_t> next_;  // next preferred slot
  std::vector<std::uint32_t> skip_;
  std::vector<std::uint32_t> weight_;
  std::vector<std::uint32_t> value_;  // backendIndex
  std::vector<std::uint32_t> count_;
  std::vector<std::uint64_t> target_;
  std::vector<std::uint64_t> filled_;   // one bit per slot
  std::vector<std::uint32_t> empty_;    // the last empty slots
  std::vector<std::uint32_t> inverse_;  // skip^-1 mod M, 0 until needed
  std::vector<std::uint32_t> takers_;   // one iteration's turn takers
  std::vector<std::uint64_t> heap_;     // next turns, for skewed weights
  std::vector<MaglevBackend> sorted_;   // the input, by id
  std::vector<std::uint32_t> indices_;
  std::vector<std::uint64_t> seen_;
  std::vector<MaglevShare> shares_;
};

}  // namespace spillway
