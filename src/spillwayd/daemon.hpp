// spillwayd's composition root: it wires the DPDK data path
// (src/dataplane/dpdk_dataplane.hpp), the snapshot builder and next-hop
// resolver, the control plane, the CLI socket and the metrics endpoint, and
// runs the control loop on the main lcore.
//
// The control loop waits in epoll on the servers' and probers' epoll fds and
// a periodic timer (kLoopPeriodMs): a CLI request, a health probe's answer or
// a scrape wakes it at once; the timer paces what the workers answer on their
// own lcores (applied generations, flow counts, exception exports, snapshot
// reclamation), the next-hop refresh and the statistics file.
//
// Lifecycle: run() returns the process exit code. SIGINT and SIGTERM stop the
// workers, which flush their TX buffers; the control plane writes a last
// flow-affinity checkpoint from the stopped flow tables; the ports are closed
// and the EAL cleaned up. A restart finds the journal and the checkpoint in
// [control] state_dir (affinity_keeper.hpp): the same intent, the last
// published tables held through a warm-up, and every flow whose table entry
// had moved kept on its backend.
//
// Thread contract: runs on the main lcore; the workers run on theirs.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "control/config/config.hpp"

namespace spillway {

struct DaemonOptions {
  std::string configPath;
  std::vector<std::string> ealArgs;  // as given after the program name, before "--"
  std::string statsFile;             // JSON statistics, rewritten every statsIntervalMs
  std::uint32_t statsIntervalMs = 1000;
  // Stop by itself once no packet arrived for this long after the first one
  // (0 = never): for pcap replays and tests.
  std::uint32_t exitAfterIdleMs = 0;
  // Stop by itself after this long (0 = never).
  std::uint32_t runForMs = 0;
  bool quiet = false;
  // Override [control] socket / metrics_listen (tests run several daemons).
  std::optional<std::string> controlSocket;
  std::optional<std::string> metricsListen;
  // Override [control] state_dir ("" keeps no state).
  std::optional<std::string> stateDir;
  // Override [control] user ("" stays root).
  std::optional<std::string> user;
};

// Set from the signal handler; polled by the control loop.
std::atomic<bool>& daemonStopRequested() noexcept;

int runDaemon(const Config& config, const DaemonOptions& options);

}  // namespace spillway
