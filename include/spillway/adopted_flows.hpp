// Adopted flows: which layer of flow affinity kept a flow that reached this
// instance without a flow-table entry.
//
// A worker whose flow-table miss is resolved by an exception (a restored
// checkpoint, a tier peer, the backends' connection lists:
// flow_exceptions.hpp, ExceptionOrigin) tracks the flow anew on the backend
// the exception names: it "adopts" it. It records the adoption here (flow
// hash, backend index, origin, VIP tag, its clock), and counts it per origin
// (SteeringCounters::exceptionHitsByOrigin). The drills read the records
// (`spillwayctl flows adopted`) to say per surviving flow which layer kept it
// (README "Failover drills", "Which layer kept each flow"). Flows that the
// flow table kept across a table change need no record: their entry is the
// flow table's.
//
// AdoptedFlowRing: a fixed ring of the last kCapacity adoptions, one writer
// (the owner lcore), read by the control thread at any time without a lock.
// The writer announces a record in `started_` before it writes the slot and
// publishes it in `done_` after; a reader copies the slots below `done_` and
// then keeps only those that `started_` (read after the copy) shows were not
// being overwritten meanwhile. Fields are release stores and acquire loads
// (plain moves on x86): a record costs a few stores, on a path taken once
// per adopted flow; a flow-table hit or a miss without an exception never
// touches it.
//
// Thread contract: record() on the owner lcore only; read() and recorded()
// on any thread.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "spillway/flow_exceptions.hpp"
#include "spillway/flow_table.hpp"

namespace spillway {

struct AdoptedFlow {
  std::uint64_t hash = 0;     // FlowHasher hash
  std::uint32_t backend = 0;  // backend index in the worker's snapshot
  ExceptionOrigin origin = ExceptionOrigin::Unknown;
  std::uint8_t vipTag = 0;  // SnapshotVip::tag of the VIP that received it
  Millis at = 0;            // the worker's clock (steady ms) when it adopted it

  friend bool operator==(const AdoptedFlow&, const AdoptedFlow&) = default;
};

class AdoptedFlowRing {
 public:
  static constexpr std::size_t kCapacity = 1024;  // per worker, 24 KiB

  void record(const AdoptedFlow& flow) noexcept {
    const std::uint64_t n = done_.load(std::memory_order_relaxed);
    Slot& s = slots_[n % kCapacity];
    started_.store(n + 1, std::memory_order_relaxed);
    // Release stores: a reader that acquires any of them sees started_ too
    // (no fences: ThreadSanitizer does not model them).
    s.hash.store(flow.hash, std::memory_order_release);
    s.meta.store(static_cast<std::uint64_t>(flow.backend) |
                     (static_cast<std::uint64_t>(flow.origin) << 32) |
                     (static_cast<std::uint64_t>(flow.vipTag) << 40),
                 std::memory_order_release);
    s.at.store(flow.at, std::memory_order_release);
    done_.store(n + 1, std::memory_order_release);
  }

  // Appends the records still held, oldest first, to `out`.
  void read(std::vector<AdoptedFlow>& out) const {
    const std::uint64_t done = done_.load(std::memory_order_acquire);
    const std::uint64_t first = done > kCapacity ? done - kCapacity : 0;
    const std::size_t base = out.size();
    out.reserve(base + static_cast<std::size_t>(done - first));
    for (std::uint64_t n = first; n < done; ++n) {
      const Slot& s = slots_[n % kCapacity];
      AdoptedFlow f;
      f.hash = s.hash.load(std::memory_order_acquire);
      const std::uint64_t meta = s.meta.load(std::memory_order_acquire);
      f.backend = static_cast<std::uint32_t>(meta);
      f.origin = static_cast<ExceptionOrigin>((meta >> 32) & 0xff);
      f.vipTag = static_cast<std::uint8_t>(meta >> 40);
      f.at = s.at.load(std::memory_order_acquire);
      out.push_back(f);
    }
    // The acquire loads above keep this load after them.
    // Records the writer began to overwrite while they were copied are torn:
    // drop them (they were the oldest).
    const std::uint64_t started = started_.load(std::memory_order_relaxed);
    const std::uint64_t valid = started > kCapacity ? started - kCapacity : 0;
    if (valid > first) {
      const auto torn = static_cast<std::size_t>(std::min(valid - first, done - first));
      out.erase(out.begin() + static_cast<std::ptrdiff_t>(base),
                out.begin() + static_cast<std::ptrdiff_t>(base + torn));
    }
  }

  // Adoptions recorded since start (those beyond kCapacity were overwritten).
  [[nodiscard]] std::uint64_t recorded() const noexcept {
    return done_.load(std::memory_order_relaxed);
  }

 private:
  struct Slot {
    std::atomic<std::uint64_t> hash{0};
    std::atomic<std::uint64_t> meta{0};  // backend | origin << 32 | vipTag << 40
    std::atomic<std::uint64_t> at{0};
  };
  std::array<Slot, kCapacity> slots_{};
  alignas(64) std::atomic<std::uint64_t> started_{0};
  std::atomic<std::uint64_t> done_{0};
};

}  // namespace spillway
