#include "control/backends/next_hop_refresh.hpp"

#include <algorithm>
#include <vector>

namespace spillway {

void NextHopRefresh::prime(const Config& config, Millis nowMs) {
  lastRefreshMs_ = nowMs;
  resolver_.refresh(config);
  builder_.refreshNextHops(resolver_);
  resolver_.solicitUnresolved(config);
}

bool NextHopRefresh::poll(const Config& config, Millis nowMs) {
  bool changed = false;
  if (nowMs - lastRefreshMs_ >= kRefreshPeriodMs) {
    lastRefreshMs_ = nowMs;
    resolver_.refresh(config);
    changed = builder_.refreshNextHops(resolver_) > 0;
    // Unresolved next hops: have the kernel ask (ARP / ND) for the next round.
    resolver_.solicitUnresolved(config);
  }
  // Backends added at run time stay out of the tables until their next hop
  // resolves: the kernel is asked at once and looked at every round.
  const std::vector<std::uint64_t> held = builder_.heldForNextHop();
  if (held.empty()) {
    solicitedHeld_.clear();
    return changed;
  }
  resolver_.refresh(config, held);
  if (builder_.refreshNextHops(resolver_) > 0) changed = true;
  std::vector<std::uint64_t> ask;
  for (std::uint64_t id : builder_.heldForNextHop()) {
    if (solicitedHeld_.insert(id).second) ask.push_back(id);
  }
  if (!ask.empty()) resolver_.solicitUnresolved(config, ask);
  std::erase_if(solicitedHeld_, [&](std::uint64_t id) {
    return std::find(held.begin(), held.end(), id) == held.end();
  });
  return changed;
}

}  // namespace spillway
