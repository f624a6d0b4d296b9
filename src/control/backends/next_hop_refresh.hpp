// The control loop's next-hop policy: when the kernel is asked about the
// backends' next hops, and when its answers go into the snapshot builder.
//
// prime() at start-up reads every kernel-resolved backend's next hop once and
// asks the kernel (ARP / ND) for those it does not know. Then, in each round
// of the control loop, poll():
//  - every refresh period (250 ms) re-reads every backend's next hop into the
//    builder and asks the kernel again for the unresolved ones;
//  - every round, looks at the backends the builder holds out of the tables
//    until their next hop resolves (backends added at run time,
//    SnapshotBuilder::heldForNextHop()), and asks the kernel once for each
//    of them while it stays held.
// poll() says whether a next hop changed, so the caller rebuilds the tables
// (ControlPlane::markDirty()). Time is an argument (milliseconds of any
// monotonic clock), so tests drive it.
//
// Thread contract: the control thread only, like the resolver and the builder
// it writes into.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>

#include "control/backends/neighbours.hpp"
#include "control/backends/snapshot_builder.hpp"
#include "control/config/config.hpp"
#include "spillway/flow_table.hpp"

namespace spillway {

class NextHopRefresh {
 public:
  static constexpr Millis kRefreshPeriodMs = 250;

  NextHopRefresh(NeighbourResolver& resolver, SnapshotBuilder& builder)
      : resolver_(resolver), builder_(builder) {}

  // The first look, before the first snapshot; the first periodic refresh
  // comes one period after `nowMs`.
  void prime(const Config& config, Millis nowMs);

  // One round of the control loop at `nowMs`; true when a backend's next hop
  // changed in the builder.
  [[nodiscard]] bool poll(const Config& config, Millis nowMs);

 private:
  NeighbourResolver& resolver_;
  SnapshotBuilder& builder_;
  Millis lastRefreshMs_ = 0;
  std::set<std::uint64_t> solicitedHeld_;  // held backends the kernel was asked about
};

}  // namespace spillway
