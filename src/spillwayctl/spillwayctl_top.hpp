// `spillwayctl top`: a live, full-screen view of one spillwayd, refreshed
// every interval: per VIP the pools (share of new flows, healthy fraction,
// active and saturated backends), per backend the state, health, live flows,
// packets and bytes per second (from two samples of `stats`), GPU, queue and
// RTT, and the latest events. Plain ANSI escapes (alternate screen, cursor
// home, erase), so it works over SSH in any terminal; q or Ctrl-C quits and
// the terminal is restored. With `once` it prints one plain-text report (two
// samples `interval` apart, for the rates) and exits: for scripts.
//
// Requests go over the CLI socket like every other command (protocol.hpp):
// status, vip.list, vip.show, backend.list, stats, events.
#pragma once

#include <string>

namespace spillway {

struct TopOptions {
  std::string socketPath;
  double timeoutSeconds = 10.0;
  double intervalSeconds = 1.0;
  bool once = false;
  unsigned eventLines = 8;  // events kept (and shown, room permitting)
};

// Exit codes as spillwayctl's: 0, 1 error, 3 cannot connect (once only; the
// live view keeps retrying and shows why).
int runTop(const TopOptions& options);

}  // namespace spillway
