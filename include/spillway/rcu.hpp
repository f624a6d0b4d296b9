// Quiescent-state-based reclamation (QSBR) for the forwarding snapshot: the
// DPDK-free equivalent of rte_rcu_qsbr, so the publication protocol is unit
// tested under TSan and ASan without EAL.
//
// Readers (lcores) each own one slot. A reader reports a quiescent state
// between bursts, when it holds no pointer into any snapshot: it copies the
// global epoch into its slot (one acquire load, one release store; no
// read-modify-write). The writer (control thread) publishes a new snapshot,
// then calls start(), which advances the epoch and returns a token; the old
// snapshot may be freed once check(token) is true, i.e. every online reader
// has reported a quiescent state since. An offline reader (stopped, or parked
// in a long idle sleep) never holds a pointer and is not waited for.
//
// Thread contract: reader i alone calls online(i), offline(i), quiescent(i);
// one writer calls start() and check(); all of them concurrently.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace spillway {

class QsbrDomain {
 public:
  explicit QsbrDomain(std::size_t readers);

  [[nodiscard]] std::size_t readers() const noexcept { return readers_; }

  // Reader side: the caller's own slot only.
  void online(std::size_t reader) noexcept {
    slots_[reader].epoch.store(epoch_.load(std::memory_order_seq_cst), std::memory_order_seq_cst);
  }
  void offline(std::size_t reader) noexcept {
    slots_[reader].epoch.store(kOffline, std::memory_order_release);
  }
  void quiescent(std::size_t reader) noexcept {
    slots_[reader].epoch.store(epoch_.load(std::memory_order_acquire), std::memory_order_release);
  }

  // Writer side. Call start() after the new pointer is stored.
  [[nodiscard]] std::uint64_t start() noexcept {
    return epoch_.fetch_add(1, std::memory_order_seq_cst) + 1;
  }
  [[nodiscard]] bool check(std::uint64_t token) const noexcept;

 private:
  static constexpr std::uint64_t kOffline = 0;
  struct alignas(64) Slot {
    std::atomic<std::uint64_t> epoch{kOffline};
  };
  std::size_t readers_;
  std::unique_ptr<Slot[]> slots_;
  alignas(64) std::atomic<std::uint64_t> epoch_{1};
};

}  // namespace spillway
