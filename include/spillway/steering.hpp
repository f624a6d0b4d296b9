// The per-lcore data path, DPDK-free: one burst of received frames in, one
// verdict per frame out. The DPDK worker (src/dataplane/worker.cpp) is a thin
// loop around it: RX burst, steerBurst(), then TX, kernel path or free by
// verdict. Unit tests drive the very same code with byte buffers.
//
// Per frame (DESIGN.md, "Data path"):
//   parse -> not IP: to the kernel
//         -> IP, not to a VIP address: to the kernel
//         -> ICMP error quoting a VIP flow: forwarded to that flow's backend
//         -> ICMP echo to a VIP that answers pings: replied in place
//         -> VIP flow: flow table (hit: its backend, re-selected only if that
//            backend no longer keeps flows; miss: the VIP's Maglev table, then
//            insert) -> encapsulate for the backend -> forward
//   and every drop has a DropReason and a counter. A packet that would exceed
//   the egress MTU once encapsulated is answered with ICMP "fragmentation
//   needed" / ICMPv6 "packet too big" built in place of the frame. Echo
//   replies and those errors pass the lcore's IcmpRateLimiter first
//   (icmp_rate_limit.hpp); a refused one is dropped as icmp_rate_limited.
// The burst is processed in stages (parse and hash all, then batched flow
// table lookups with prefetch, then select and encapsulate) so the flow
// table's cache misses overlap.
//
// Thread contract: a Steering object belongs to one lcore. steerBurst() takes
// the snapshot the lcore loaded for this burst; counters() may be read by the
// control thread at any time (stats.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "spillway/adopted_flows.hpp"
#include "spillway/flow_key.hpp"
#include "spillway/flow_table.hpp"
#include "spillway/icmp_rate_limit.hpp"
#include "spillway/packet.hpp"
#include "spillway/placement.hpp"
#include "spillway/snapshot.hpp"
#include "spillway/stats.hpp"

namespace spillway {

inline constexpr std::size_t kMaxBurst = 64;

enum class Verdict : std::uint8_t {
  Forward,   // encapsulated; send frame [dataOffset, +length) out of egressPort
  Reply,     // an ICMP reply to the sender, built in place; send it out of the ingress port
  ToKernel,  // host traffic, unchanged: the exception path's
  Drop,      // `drop` says why; already counted
};

// One received frame: `buffer` is its whole buffer (headroom + data),
// the frame is buffer[dataOffset, dataOffset + length).
struct FrameRef {
  std::span<std::byte> buffer;
  std::size_t dataOffset = 0;
  std::size_t length = 0;
};

struct SteerResult {
  Verdict verdict = Verdict::Drop;
  DropReason drop = DropReason::None;  // with Drop
  std::uint16_t egressPort = 0;
  std::uint32_t backend = 0;  // with Forward
  bool newFlow = false;       // with Forward: this packet opened a tracked flow
  bool secondChance = false;  // with Forward: it carries a second-chance hop
  std::size_t dataOffset = 0;
  std::size_t length = 0;
};

// Every received frame ends in exactly one of forwarded, replies, toKernel
// and drops, so rxPackets is their sum.
struct SteeringCounters {
  Counter rxPackets;
  Counter rxBytes;
  Counter forwarded;
  Counter forwardedBytes;
  Counter replies;     // echo replies and MTU errors sent back
  Counter mtuReplies;  // of which "fragmentation needed" / "packet too big"
  Counter toKernel;
  Counter newFlows;
  Counter resteered;         // tracked flows moved off a failed or removed backend
  Counter flowInsertFailed;  // forwarded by the table, but not tracked
  Counter icmpErrorsSteered;
  Counter exceptionHits;  // flows tracked anew on the backend a restored or peer exception named
  // ... by the exception's origin (ExceptionOrigin): which layer kept them
  std::array<Counter, kExceptionOriginCount> exceptionHitsByOrigin{};
  Counter placedOffTable;  // new connections a placing VIP sent elsewhere than its table's entry
  // Mid-flow TCP packets placed by the table on a slot that changed within
  // the second-chance hold time: sent with the previous owner as a hop
  // (untracked), or without it (IPIP / IP6IP6, outer families differ, no
  // room under the MTU): those would have needed it.
  Counter secondChanceSent;
  Counter secondChanceUnsent;
  DropCounters drops;
};

class Steering {
 public:
  Steering(const FlowTableConfig& flowTable, std::uint64_t hashSeed,
           const IcmpRateLimits& icmpLimits = {});

  // Steers frames[i] into results[i] for every i (results.size() >=
  // frames.size(); frames.size() <= kMaxBurst). `now` is the lcore's clock
  // in milliseconds.
  void steerBurst(std::span<const FrameRef> frames, std::span<SteerResult> results,
                  const ForwardingSnapshot& snapshot, Millis now) noexcept;

  [[nodiscard]] const SteeringCounters& counters() const noexcept { return counters_; }
  [[nodiscard]] FlowTable& flowTable() noexcept { return flows_; }
  [[nodiscard]] const FlowTable& flowTable() const noexcept { return flows_; }
  [[nodiscard]] const FlowHasher& hasher() const noexcept { return hasher_; }
  // The flow table's key for a flow (flowTable().lookup(tableHash(key), ...)).
  [[nodiscard]] std::uint64_t tableHash(const FlowKey& key) const noexcept {
    return tableHasher_.hash(key);
  }
  // The owner lcore starts flow count n (placement.hpp's epochs).
  void beginPlacementEpoch(std::uint64_t n) noexcept { ledger_.beginEpoch(n); }
  [[nodiscard]] const PlacementLedger& placementLedger() const noexcept { return ledger_; }
  // The flows this lcore adopted from an exception (adopted_flows.hpp); any
  // thread may read it.
  [[nodiscard]] const AdoptedFlowRing& adoptedFlows() const noexcept { return adopted_; }

 private:
  // Per-frame state between the stages.
  // hash: FlowTableHasher's, the flow table's key and the encapsulation's
  // entropy, every packet; identity: FlowHasher's (Maglev slot, exception
  // table, what the export reports), only when a packet needs it.
  struct Pending {
    PacketView view;
    std::uint64_t hash = 0;
    std::uint64_t identity = 0;
    bool identityKnown = false;
    std::uint32_t vip = 0;
  };
  [[nodiscard]] std::uint64_t identityOf(Pending& p) const noexcept {
    if (!p.identityKnown) {
      p.identity = hasher_.hash(p.view.key);
      p.identityKnown = true;
    }
    return p.identity;
  }
  // A new connection of a placing VIP: placeNewFlow(), tracked before the
  // SYN leaves (an off-table choice that cannot be tracked falls back to the
  // table's entry, which the flow's next packets would reach anyway).
  void placeAndForward(const FrameRef& frame, Pending& p, SteerResult& r,
                       const ForwardingSnapshot& snapshot, Millis now) noexcept;
  void finishVipFrame(const FrameRef& frame, Pending& p, SteerResult& r,
                      const ForwardingSnapshot& snapshot, Millis now) noexcept;
  // Inlined where it is called (steering.cpp only): one call level less per
  // packet, the writer's call being the only one left.
  [[gnu::always_inline]] inline void encapsulateTo(const FrameRef& frame, const PacketView& view,
                                                   std::uint64_t hash, std::uint32_t backendIndex,
                                                   SteerResult& r,
                                                   const ForwardingSnapshot& snapshot,
                                                   const IpBytes* secondChance = nullptr) noexcept;
  // A packet too big once encapsulated: the ICMP error for its client, or a
  // drop (rare: kept out of encapsulateTo's registers and stack).
  [[gnu::cold, gnu::noinline]] void replyMtuExceeded(const FrameRef& frame, const PacketView& view,
                                                     std::uint16_t icmpMtu,
                                                     SteerResult& r) noexcept;
  void drop(SteerResult& r, DropReason reason) noexcept;

  FlowHasher hasher_;
  FlowTableHasher tableHasher_;
  FlowTable flows_;
  IcmpRateLimiter icmpLimiter_;
  Millis burstNow_ = 0;  // steerBurst()'s `now`, for the ICMP limiter
  PlacementLedger ledger_;
  SteeringCounters counters_;
  AdoptedFlowRing adopted_;
  // The burst's working state lives here, not on the stack, so no burst pays
  // for value-initialising it; steerBurst() writes every element it reads.
  std::array<Pending, kMaxBurst> pending_;
  std::array<std::uint64_t, kMaxBurst> batchHashes_;
  std::array<FlowEvent, kMaxBurst> batchEvents_;
  std::array<std::uint32_t, kMaxBurst> batchHits_;
  std::array<std::uint8_t, kMaxBurst> batchFrames_;  // batch entry -> frame
};

}  // namespace spillway
