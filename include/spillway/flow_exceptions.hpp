// Flow exceptions: tracked flows whose backend is not what the current
// Maglev table gives them, and the read-only table the data path consults
// for them when its own flow table has no entry.
//
// A flow is placed by its VIP's table when its first packet arrives and then
// stays on that backend (the lcore's FlowTable). Tables move on purpose
// (spillover, load weights, drains, an added backend), so the longer
// spillwayd runs, the more live flows sit on entries that have since moved:
// those are the exceptions. A flow that is not an exception needs nothing to
// survive a restart (the same inputs build the same table, maglev.hpp); an
// exception needs its (flow hash, backend) pair kept: checkpointed to disk
// for a restart or a crash, and (the LB-tier issue) sent to peer instances
// for an ECMP move. Both sides name the backend by its id, never by an
// index, and the flow by its FlowHasher hash under the configured hash_seed,
// which every instance shares.
//
// Classification (isTableException): the flow table records, beside the
// backend, a 5-bit tag of the VIP that placed the flow (SnapshotVip::tag:
// vipTagOf(its address, protocol and port), 1 .. 31; 0 = unknown). The tag is
// a function of the VIP's key, not of its place in the configuration, so a
// reload that adds, removes or reorders VIPs re-tags nothing. A flow on
// backend b is "not an exception" only when every VIP with that tag whose
// table b belongs to gives b for the flow's hash; otherwise it is kept. Two
// VIPs that share a tag (or an unknown tag) only make it conservative: it may
// keep a few flows that did not need it, never drop one that did.
//
// Origin: every entry says where the control plane learnt it (restored from
// this instance's checkpoint, received from a tier peer, rebuilt from the
// backends' connection lists), so that a worker whose flow-table miss an
// entry resolves can record which layer kept the flow (adopted_flows.hpp).
//
// ExceptionTable: open addressing over a power-of-two array at most half
// full (on huge pages where offered), 16 bytes a slot (fingerprint, backend
// index | state << 24, origin); built once by the control thread, immutable
// afterwards, shared by successive snapshots. A lookup is one or two cache
// lines, no allocation, no write. Only a flow-table miss consults it.
//
// Thread contract: ExceptionTable is built on the control thread and only
// read afterwards (by any number of lcores through the published snapshot).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "spillway/flow_table.hpp"
#include "spillway/table_memory.hpp"

namespace spillway {

struct ForwardingSnapshot;

// One tracked flow as its worker reports it: 16 bytes.
struct ExportedFlow {
  std::uint64_t hash = 0;     // FlowHasher hash (0 is reported as 1)
  std::uint32_t backend = 0;  // backend index in the worker's snapshot
  FlowState state = FlowState::Established;
  std::uint32_t idleMs = 0;  // since its last packet
};

// One exception as it outlives the process (checkpoint) or crosses to a
// peer: the backend by id.
struct FlowExceptionRecord {
  std::uint64_t hash = 0;
  std::uint64_t backendId = 0;
  FlowState state = FlowState::Established;
  std::uint32_t idleMs = 0;

  friend bool operator==(const FlowExceptionRecord&, const FlowExceptionRecord&) = default;
};

// True when the flow `hash` on backend index `backend`, placed by a VIP
// tagged `vipTag`, is not what every such table that holds `backend` gives it
// (see the design note).
[[nodiscard]] bool isTableException(const ForwardingSnapshot& snapshot, std::uint64_t hash,
                                    std::uint32_t backend, std::uint8_t vipTag) noexcept;

// What a worker's export keeps (worker.hpp): a flow on a backend that keeps
// tracked flows and is an exception against `current`, or, with `next` (a
// snapshot built and not yet published: make-before-break), one that `next`
// would make an exception (its backend differs from next's entry).
[[nodiscard]] bool exportsFlow(const ForwardingSnapshot& current, const ForwardingSnapshot* next,
                               std::uint64_t hash, std::uint32_t backend,
                               std::uint8_t vipTag) noexcept;

// Where an exception came from (the layer of flow affinity that kept it).
enum class ExceptionOrigin : std::uint8_t {
  Unknown = 0,
  Checkpoint = 1,  // restored at start from this instance's flows.ckpt
  Peer = 2,        // received from a tier peer (peer_channel.hpp)
  Backend = 3,     // rebuilt at start from the backends' connection lists
};
inline constexpr std::size_t kExceptionOriginCount = 4;

[[nodiscard]] constexpr const char* toString(ExceptionOrigin origin) noexcept {
  switch (origin) {
    case ExceptionOrigin::Checkpoint:
      return "checkpoint";
    case ExceptionOrigin::Peer:
      return "peer";
    case ExceptionOrigin::Backend:
      return "backend";
    case ExceptionOrigin::Unknown:
      break;
  }
  return "unknown";
}

struct ExceptionEntry {
  std::uint64_t hash = 0;
  std::uint32_t backend = 0;  // index, 1 .. FlowTable::kMaxBackend
  FlowState state = FlowState::Established;
  ExceptionOrigin origin = ExceptionOrigin::Unknown;
};

class ExceptionTable {
 public:
  struct Hit {
    std::uint32_t backend = 0;  // 0 = no exception for this flow
    FlowState state = FlowState::Established;
    ExceptionOrigin origin = ExceptionOrigin::Unknown;
  };

  ExceptionTable() = default;
  // Entries with backend 0 or above FlowTable::kMaxBackend are skipped; of two
  // entries with one hash the later wins.
  explicit ExceptionTable(std::span<const ExceptionEntry> entries);

  [[nodiscard]] Hit find(std::uint64_t hash) const noexcept {
    if (size_ == 0) return {};
    const std::uint64_t fp = hash | static_cast<std::uint64_t>(hash == 0);
    if (!filterHas(fp)) return {};
    std::size_t i = slotOf(fp);
    while (slots_[i].fingerprint != 0) {
      if (slots_[i].fingerprint == fp) {
        return Hit{slots_[i].meta & FlowTable::kMaxBackend,
                   static_cast<FlowState>(slots_[i].meta >> 24),
                   static_cast<ExceptionOrigin>(slots_[i].origin)};
      }
      i = (i + 1) & mask_;
    }
    return {};
  }
  // False only for a flow the table does not hold; true for every flow it
  // holds and ~5 % of the others (the filter in front of the slots).
  [[nodiscard]] bool mayHold(std::uint64_t hash) const noexcept {
    return size_ != 0 && filterHas(hash | static_cast<std::uint64_t>(hash == 0));
  }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t memoryBytes() const noexcept {
    return size_ == 0 ? 0 : (mask_ + 1) * sizeof(Slot) + (filterMask_ + 1) * sizeof(std::uint64_t);
  }

 private:
  struct Slot {
    std::uint64_t fingerprint = 0;  // 0 = empty
    std::uint32_t meta = 0;         // backend | state << 24
    std::uint32_t origin = 0;       // ExceptionOrigin
  };
  static_assert(sizeof(Slot) == 16);

  [[nodiscard]] std::size_t slotOf(std::uint64_t fp) const noexcept {
    return static_cast<std::size_t>(fp ^ (fp >> 32)) & mask_;
  }
  // The filter: a blocked Bloom filter, one 64-bit word per 16 slots (8 bits
  // an entry at most), two bits a flow in one word, both from the flow's
  // hash multiplied by an odd constant (so they do not follow slotOf's bits).
  // At 1M exceptions it is 1 MiB, where the slots are 32 MiB: most misses of
  // the flow table (every new flow) end in it instead of a random read of
  // the slots (+~100 ns a SYN in BENCHMARKS.md, #16).
  [[nodiscard]] static std::uint64_t filterMix(std::uint64_t fp) noexcept {
    return fp * 0x9e3779b97f4a7c15ULL;
  }
  [[nodiscard]] static std::uint64_t filterBits(std::uint64_t mixed) noexcept {
    return (std::uint64_t{1} << (mixed >> 58)) | (std::uint64_t{1} << ((mixed >> 52) & 63));
  }
  [[nodiscard]] bool filterHas(std::uint64_t fp) const noexcept {
    const std::uint64_t mixed = filterMix(fp);
    const std::uint64_t bits = filterBits(mixed);
    return (filter_[(mixed >> 12) & filterMask_] & bits) == bits;
  }

  TableMemory<Slot> slots_;            // huge pages: table_memory.hpp
  TableMemory<std::uint64_t> filter_;  // (filterMask_ + 1) words
  std::size_t filterMask_ = 0;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

}  // namespace spillway
