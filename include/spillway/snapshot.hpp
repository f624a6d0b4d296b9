// The forwarding snapshot: everything an lcore needs to steer a packet, built
// by the control thread, immutable once published.
//
// A snapshot holds the VIPs (each with its Maglev table), the backend array
// (state and encapsulation per backend, index 0 = "none") and a generation
// number. Lcores load the current snapshot once per burst through
// SnapshotPublisher::current() and report a quiescent state after the burst;
// the control thread publishes the next snapshot with one store and frees the
// old one only after every online lcore has been quiescent since (QSBR,
// rcu.hpp). No lock, read-modify-write or allocation on the lcore side.
//
// Backend states as the data path sees them (the control plane's state
// machine maps onto these):
//  - Active: in the Maglev tables with its weight; tracked flows continue.
//  - Draining / Disabled: weight 0 in the tables (no new flows); tracked
//    flows continue until they end (or the control plane's drain deadline
//    turns the backend Failed).
//  - Failed / Removed: no new flows, and a tracked flow that hits it is
//    re-selected through the VIP's table at once; no other flow moves.
// Backend indices are stable across snapshots: an index is reused only after
// the grace period and the longest flow timeout (the control plane's rule).
//
// Thread contract: a ForwardingSnapshot is written by the control thread
// before publish and only read afterwards, by any number of lcores.
// SnapshotPublisher: one writer (publish, reclaim), N readers (current).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "spillway/encap.hpp"
#include "spillway/flow_key.hpp"
#include "spillway/maglev.hpp"
#include "spillway/rcu.hpp"

namespace spillway {

enum class BackendState : std::uint8_t { Active, Draining, Disabled, Failed, Removed };

[[nodiscard]] constexpr bool keepsTrackedFlows(BackendState s) noexcept {
  return s == BackendState::Active || s == BackendState::Draining ||
         s == BackendState::Disabled;
}

struct SnapshotBackend {
  std::uint64_t id = 0;
  BackendState state = BackendState::Removed;
  std::uint16_t egressPort = 0;  // the port it leaves by: index into the configured ports
  bool nextHopResolved = true;   // false: the next-hop MAC is not known yet
  EncapTarget encap{};
};

// What a VIP answers: an address, a protocol (TCP or UDP) and a port, or all
// ports when port is 0.
struct VipKey {
  IpBytes address{};
  IpVersion version = IpVersion::V4;
  std::uint8_t proto = 0;
  std::uint16_t port = 0;  // host order; 0 = every port

  friend bool operator==(const VipKey&, const VipKey&) = default;
};

struct SnapshotVip {
  VipKey key{};
  std::string name;
  MaglevTable table;
  bool answerEcho = false;  // reply to ICMP echo requests sent to the address
};

// Open-addressing index from (address, proto, port) to a VIP, with linear
// probing over a power-of-two array at most half full. Built once per
// snapshot; lookups never allocate.
class VipIndex {
 public:
  static constexpr std::uint32_t kNone = UINT32_MAX;

  VipIndex() = default;
  explicit VipIndex(const std::vector<SnapshotVip>& vips);

  // The VIP serving this destination: the exact port first, then the VIP
  // for all ports of the address; kNone when neither exists.
  [[nodiscard]] std::uint32_t find(const IpBytes& dst, IpVersion version, std::uint8_t proto,
                                   std::uint16_t port) const noexcept;
  // True when any VIP has this address (for ICMP to the VIP, and to drop
  // rather than hand to the kernel traffic for a VIP's unserved port).
  [[nodiscard]] bool isVipAddress(const IpBytes& dst, IpVersion version) const noexcept;

 private:
  struct Slot {
    VipKey key{};
    std::uint32_t vip = kNone;  // kNone = empty; kAddressOnly = address marker
  };
  static constexpr std::uint32_t kAddressOnly = UINT32_MAX - 1;
  [[nodiscard]] std::uint32_t probe(const VipKey& key) const noexcept;
  std::vector<Slot> slots_;
  std::uint32_t mask_ = 0;
};

struct ForwardingSnapshot {
  std::uint64_t generation = 0;
  std::vector<SnapshotVip> vips;
  std::vector<SnapshotBackend> backends;  // [0] is the "none" placeholder
  VipIndex vipIndex;

  // Call after vips are final, before publish.
  void indexVips() { vipIndex = VipIndex(vips); }

  [[nodiscard]] const SnapshotBackend* backend(std::uint32_t index) const noexcept {
    return index != 0 && index < backends.size() ? &backends[index] : nullptr;
  }
};

class SnapshotPublisher {
 public:
  explicit SnapshotPublisher(QsbrDomain& qsbr) : qsbr_(qsbr) {}
  ~SnapshotPublisher();
  SnapshotPublisher(const SnapshotPublisher&) = delete;
  SnapshotPublisher& operator=(const SnapshotPublisher&) = delete;

  // Lcore side: the snapshot to use for this burst (may be null before the
  // first publish). Valid until the lcore's next quiescent report.
  [[nodiscard]] const ForwardingSnapshot* current() const noexcept {
    // seq_cst pairs with QsbrDomain::online() (a store-load handshake); on
    // x86 and ARMv8 it costs the same as an acquire load.
    return current_.load(std::memory_order_seq_cst);
  }

  // Control side: makes `next` current with one store and retires the old
  // snapshot, which reclaim() frees after the grace period.
  void publish(std::unique_ptr<const ForwardingSnapshot> next);
  // Frees retired snapshots whose grace period has passed; returns how many.
  std::size_t reclaim() noexcept;
  // Snapshots retired but not yet freed.
  [[nodiscard]] std::size_t pending() const noexcept { return retired_.size(); }

 private:
  struct Retired {
    std::uint64_t token;
    std::unique_ptr<const ForwardingSnapshot> snapshot;
  };
  QsbrDomain& qsbr_;
  std::atomic<const ForwardingSnapshot*> current_{nullptr};
  std::unique_ptr<const ForwardingSnapshot> owned_;  // what current_ points to
  std::deque<Retired> retired_;
};

}  // namespace spillway
