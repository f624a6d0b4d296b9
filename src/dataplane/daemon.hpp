// spillwayd's process: EAL start, ports, the worker lcores, and the control
// loop on the main lcore that builds and publishes forwarding snapshots,
// reclaims old ones after their grace period, resolves next hops and writes
// statistics. The control-plane issue grows the control loop (health checks,
// load feedback, the CLI socket); the data path does not change for it.
//
// Lifecycle: run() returns the process exit code. SIGINT and SIGTERM stop the
// workers, which flush their TX buffers; the ports are stopped and the EAL
// cleaned up. A restart with the same configuration and seed builds the same
// tables (Maglev is a pure function of them), so flows still open in the
// network keep their backends; mid-flow packets are tracked as established.
//
// Thread contract: the Daemon object lives on the main lcore; workers run on
// their own lcores and share only the snapshot publisher, the QSBR domain and
// the stop flag.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "control/config.hpp"

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
};

// Set from the signal handler; polled by the control loop.
std::atomic<bool>& daemonStopRequested() noexcept;

int runDaemon(const Config& config, const DaemonOptions& options);

}  // namespace spillway
