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
// Backend indices (1..kMaxBackends, 0 = none) are stable across snapshots
// while their backend is configured. A backend that leaves the configuration
// stays in backends[] as Removed, in no table, until its index is recycled;
// an index is given to another backend only after every worker has applied a
// snapshot in which it is Removed (the grace period: from then on no worker
// inserts an entry naming it) and every worker's flow table has been purged
// of entries naming it (FlowTable::beginPurge), so no tracked flow of the old
// backend can land on the new one. The control plane runs that protocol
// (control/snapshot_builder.hpp); nothing waits for the flow timeout.
//
// Thread contract: a ForwardingSnapshot is written by the control thread
// before publish and only read afterwards, by any number of lcores.
// SnapshotPublisher: one writer (publish, reclaim), N readers (current).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "spillway/encap.hpp"
#include "spillway/flow_exceptions.hpp"
#include "spillway/flow_key.hpp"
#include "spillway/maglev.hpp"
#include "spillway/rcu.hpp"

namespace spillway {

enum class BackendState : std::uint8_t { Active, Draining, Disabled, Failed, Removed };

// At most this many backends are known at once (configured, plus removed ones
// whose index is not yet recycled); indices run 1..kMaxBackends. Per-index
// arrays (the workers' packet, new-flow and live-flow counters) have
// kBackendSlots entries, so every index has its counters.
inline constexpr std::uint32_t kMaxBackends = 65'535;
inline constexpr std::uint32_t kBackendSlots = kMaxBackends + 1;

[[nodiscard]] constexpr bool keepsTrackedFlows(BackendState s) noexcept {
  return s == BackendState::Active || s == BackendState::Draining || s == BackendState::Disabled;
}

struct SnapshotBackend {
  std::uint64_t id = 0;
  BackendState state = BackendState::Removed;
  std::uint16_t egressPort = 0;  // the port it leaves by: index into the configured ports
  bool nextHopResolved = true;   // false: the next-hop MAC is not known yet
  EncapTarget encap{};
  // encap's outer headers ready to copy (encap.hpp), built by
  // ForwardingSnapshot::indexVips(): what the lcores write per packet.
  EncapTemplate encapTemplate{};
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

// The flow-table tag of a VIP (flow_exceptions.hpp): FNV-1a of its key, folded
// to 1 .. 31 (FlowTable::kMaxVipTag).
[[nodiscard]] constexpr std::uint8_t vipTagOf(const VipKey& key) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&h](std::uint8_t b) {
    h ^= b;
    h *= 0x100000001b3ULL;
  };
  for (const std::byte b : key.address) mix(static_cast<std::uint8_t>(b));
  mix(static_cast<std::uint8_t>(key.version));
  mix(key.proto);
  mix(static_cast<std::uint8_t>(key.port >> 8));
  mix(static_cast<std::uint8_t>(key.port & 0xff));
  return static_cast<std::uint8_t>(h % FlowTable::kMaxVipTag + 1);
}

struct VipPlacement;

struct SnapshotVip {
  VipKey key{};
  std::uint8_t tag = 0;  // vipTagOf(key), set by the builder; 0 = unknown
  std::string name;
  MaglevTable table;
  bool answerEcho = false;  // reply to ICMP echo requests sent to the address
  // Byte-aware placement of new TCP connections (placement.hpp); null: the
  // table alone places them.
  std::shared_ptr<const VipPlacement> placement;
  // Second chance (ARCHITECTURE.md): by table slot, the backend index that
  // held the slot before its last change, while that change is younger than
  // [dataplane] second_chance_hold_ms (the builder clears it after); 0 =
  // none. Same size as table, or null when no slot has a previous owner.
  // Shared by successive snapshots while it does not change.
  std::shared_ptr<const std::vector<std::uint32_t>> previousOwner;

  // The previous owner of the slot `flowHash` maps to, or 0.
  [[nodiscard]] std::uint32_t previousOwnerOf(std::uint64_t flowHash) const noexcept {
    if (previousOwner == nullptr) return 0;
    const std::uint32_t slot = MaglevTable::slotOf(flowHash, table.size());
    return slot < previousOwner->size() ? (*previousOwner)[slot] : 0;
  }
};

// An address of the gateway itself (a port's tunnel source): no client has
// it, so a packet to a VIP from it is forged (steering drops it).
struct OwnAddress {
  IpBytes address{};
  IpVersion version = IpVersion::V4;
};

// Open-addressing index from (address, proto, port) to a VIP, with linear
// probing over a power-of-two array at most half full. It also marks the
// gateway's own addresses, so one probe tells whether a source is a VIP's or
// the gateway's (isOwnAddress). Built once per
// snapshot; lookups never allocate. A slot holds its key as three words (the
// address's two halves, then version, proto and port) so a probe compares
// and hashes words, not bytes. Addresses are canonical IpBytes (an IPv4
// address's last 12 bytes zero), as the parser and the config produce them.
class VipIndex {
 public:
  static constexpr std::uint32_t kNone = UINT32_MAX;

  VipIndex() = default;
  explicit VipIndex(const std::vector<SnapshotVip>& vips,
                    const std::vector<OwnAddress>& gatewayAddresses = {});

  // The VIP serving this destination: the exact port first, then the VIP
  // for all ports of the address; kNone when neither exists.
  [[nodiscard]] std::uint32_t find(const IpBytes& dst, IpVersion version, std::uint8_t proto,
                                   std::uint16_t port) const noexcept {
    if (proto == 0) return kNone;  // proto 0 keys are address markers
    std::uint32_t v = probe(packKey(dst, version, proto, port));
    if (v == kNone && port != 0) v = probe(packKey(dst, version, proto, 0));
    return v >= kGatewayAddress ? kNone : v;
  }
  // True when any VIP has this address (for ICMP to the VIP, and to drop
  // rather than hand to the kernel traffic for a VIP's unserved port).
  // find() != kNone implies it.
  [[nodiscard]] bool isVipAddress(const IpBytes& dst, IpVersion version) const noexcept {
    return probe(packKey(dst, version, 0, 0)) == kAddressOnly;
  }
  // True when a VIP or the gateway itself has this address. Asked of every
  // VIP packet's source, so a 1024-bit filter of those addresses answers
  // most sources with one multiply and one load; only a filter hit probes.
  [[nodiscard]] bool isOwnAddress(const IpBytes& address, IpVersion version) const noexcept {
    const PackedKey key = packKey(address, version, 0, 0);
    const std::uint32_t bit = filterBit(key);
    if (((ownFilter_[bit / 64] >> (bit % 64)) & 1U) == 0) return false;
    return probe(key) != kNone;
  }

 private:
  struct PackedKey {
    std::uint64_t low = 0;
    std::uint64_t high = 0;
    std::uint32_t rest = 0;  // version << 24 | proto << 16 | port

    friend bool operator==(const PackedKey&, const PackedKey&) = default;
  };
  struct Slot {
    PackedKey key{};
    std::uint32_t vip = kNone;  // kNone = empty; kAddressOnly = address marker
  };
  static constexpr std::uint32_t kAddressOnly = UINT32_MAX - 1;     // a VIP's address
  static constexpr std::uint32_t kGatewayAddress = UINT32_MAX - 2;  // the gateway's, no VIP's

  [[nodiscard]] static PackedKey packKey(const IpBytes& address, IpVersion version,
                                         std::uint8_t proto, std::uint16_t port) noexcept {
    PackedKey k;
    std::memcpy(&k.low, address.data(), sizeof k.low);
    std::memcpy(&k.high, address.data() + sizeof k.low, sizeof k.high);
    k.rest = (std::uint32_t{static_cast<std::uint8_t>(version)} << 24) |
             (std::uint32_t{proto} << 16) | port;
    return k;
  }
  // Control-plane keys: no flooding concern; one multiply per word and a
  // multiply-xorshift finish spread them well enough for a half-empty table.
  [[nodiscard]] static std::uint32_t slotHash(const PackedKey& k) noexcept {
    std::uint64_t h = (k.low * 0x9e3779b97f4a7c15ULL) ^ (k.high * 0xc2b2ae3d27d4eb4fULL) ^ k.rest;
    h ^= h >> 32;
    h *= 0xbf58476d1ce4e5b9ULL;
    return static_cast<std::uint32_t>(h ^ (h >> 29));
  }
  [[nodiscard]] static std::uint32_t filterBit(const PackedKey& k) noexcept {
    return static_cast<std::uint32_t>(((k.low ^ k.high) * 0x9e3779b97f4a7c15ULL) >> 54);
  }
  [[nodiscard]] std::uint32_t probe(const PackedKey& key) const noexcept {
    if (slots_.empty()) return kNone;
    std::uint32_t i = slotHash(key) & mask_;
    while (slots_[i].vip != kNone) {
      if (slots_[i].key == key) return slots_[i].vip;
      i = (i + 1) & mask_;
    }
    return kNone;
  }

  std::vector<Slot> slots_;
  std::uint32_t mask_ = 0;
  std::array<std::uint64_t, 16> ownFilter_{};  // filterBit() of every address marker
};

struct ForwardingSnapshot {
  std::uint64_t generation = 0;
  std::vector<SnapshotVip> vips;
  std::vector<SnapshotBackend> backends;  // [0] is the "none" placeholder
  VipIndex vipIndex;
  // The gateway's own port addresses ([[port]] address / address6).
  std::vector<OwnAddress> gatewayAddresses;
  // By backend index: the VIPs (indices into vips) whose tables the backend
  // belongs to. Read by the workers' exception export, not per packet.
  std::vector<std::vector<std::uint32_t>> vipsOfBackend;
  // Flows placed before this process's tables (a checkpoint restored after a
  // restart or a crash; peers' flows with the LB tier): consulted when the
  // lcore's flow table has no entry, before the VIP's table. Shared by
  // successive snapshots; null when there is none.
  std::shared_ptr<const ExceptionTable> exceptions;

  // Call after vips, backends and gatewayAddresses are final, before
  // publish (and again after any of them changes): indexes the VIPs and
  // builds each backend's encapsulation template from its EncapTarget.
  void indexVips() {
    vipIndex = VipIndex(vips, gatewayAddresses);
    for (SnapshotBackend& b : backends) b.encapTemplate = EncapTemplate::build(b.encap);
  }

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
