// spillwayd: the Spillway load balancer daemon.
//
//   spillwayd [EAL options] -- --config FILE [options]
//   spillwayd --check-config FILE
//
// EAL options (lcores, memory, --no-huge, --file-prefix, ...) go before "--";
// the ports' devices are added from the configuration. Without -l, the EAL
// gets the configured worker lcores plus the lowest free lcore as the main
// (control) lcore.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "control/config/config.hpp"
#include "control/host/host_checks.hpp"
#include "daemon.hpp"

namespace {

void onSignal(int) {
  spillway::daemonStopRequested().store(true);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> eal;
  std::vector<std::string> app;
  int split = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--") {
      split = i;
      break;
    }
  }
  for (int i = 1; i < argc; ++i) {
    if (split < 0 || i > split) {
      app.emplace_back(argv[i]);
    } else if (i < split) {
      eal.emplace_back(argv[i]);
    }
  }

  CLI::App cli{"spillwayd: kernel-bypass L4 load balancer for hybrid GPU estates"};
  spillway::DaemonOptions options;
  std::string checkPath;
  cli.add_option("--config,-c", options.configPath, "configuration file (TOML)");
  cli.add_option("--check-config", checkPath,
                 "validate a configuration file and exit (no EAL, no root needed)");
  cli.add_option("--stats-file", options.statsFile, "write JSON statistics to this file");
  cli.add_option("--stats-interval-ms", options.statsIntervalMs, "statistics period")
      ->check(CLI::Range(10u, 3'600'000u));
  cli.add_option("--exit-after-idle-ms", options.exitAfterIdleMs,
                 "stop once no packet arrived for this long after the first (tests, replays)");
  cli.add_option("--run-for-ms", options.runForMs, "stop after this long");
  cli.add_flag("--quiet,-q", options.quiet, "no progress messages on stderr");
  std::string controlSocket, metricsListen, stateDir, user;
  auto* socketOpt = cli.add_option("--control-socket", controlSocket,
                                   "CLI socket path (overrides [control] socket)");
  auto* metricsOpt = cli.add_option("--metrics-listen", metricsListen,
                                    "metrics address, \"\" for none (overrides [control])");
  auto* stateOpt = cli.add_option("--state-dir", stateDir,
                                  "journal and checkpoint directory, \"\" for none (overrides "
                                  "[control] state_dir)");
  auto* userOpt = cli.add_option("--user", user,
                                 "after start-up run as this user, \"\" to stay root "
                                 "(overrides [control] user)");
  std::vector<std::string> reversed(app.rbegin(), app.rend());
  try {
    cli.parse(reversed);
  } catch (const CLI::ExtrasError&) {
    // Arguments spillwayd does not take: most often EAL options given
    // without the "--" that separates them from spillwayd's own.
    std::vector<std::string> extras;
    for (const std::string& a : cli.remaining()) extras.push_back(a);
    std::string listed;
    for (const std::string& a : extras) listed += (listed.empty() ? "" : " ") + a;
    std::fprintf(stderr, "spillwayd: unexpected arguments: %s\n", listed.c_str());
    if (split < 0) {
      std::fprintf(stderr,
                   "spillwayd: EAL options (-l, -m, --no-huge, --file-prefix, ...) go before "
                   "\"--\", spillwayd's after it:\n"
                   "  spillwayd --no-huge -m 512 -- --config FILE\n");
    }
    std::fprintf(stderr, "spillwayd: spillwayd --help lists spillwayd's options\n");
    return 2;
  } catch (const CLI::ParseError& e) {
    return cli.exit(e);
  }

  if (!checkPath.empty()) {
    const auto result = spillway::loadConfig(checkPath);
    if (!result) {
      std::fprintf(stderr, "%s", spillway::formatErrors(result.errors()).c_str());
      return 2;
    }
    const auto& c = result.value();
    std::printf(
        "%s: configuration OK (%zu ports, %zu pools, %zu VIPs, %zu backends, %zu worker "
        "lcores)\n",
        checkPath.c_str(), c.ports.size(), c.pools.size(), c.vips.size(), c.backends.size(),
        c.dataplane.lcores.size());
    // What start-up will need from this host (host_checks.hpp).
    const auto checks = spillway::runHostChecks(c, spillway::systemHostProbe());
    std::printf("host checks (this host, this network namespace):\n%s",
                spillway::formatHostChecks(checks).c_str());
    if (spillway::anyFailed(checks)) {
      std::printf("%s: start-up would fail on this host: see FAILED above\n", checkPath.c_str());
      return 1;
    }
    return 0;
  }
  if (options.configPath.empty()) {
    std::fprintf(stderr, "spillwayd: --config FILE is required (or --check-config FILE)\n");
    return 2;
  }
  auto result = spillway::loadConfig(options.configPath);
  if (!result) {
    std::fprintf(stderr, "%s", spillway::formatErrors(result.errors()).c_str());
    return 2;
  }
  options.ealArgs = eal;
  if (socketOpt->count() > 0) options.controlSocket = controlSocket;
  if (userOpt->count() > 0) options.user = user;
  if (metricsOpt->count() > 0) options.metricsListen = metricsListen;
  if (stateOpt->count() > 0) {
    if (!stateDir.empty() && stateDir[0] != '/') {
      std::fprintf(stderr, "spillwayd: --state-dir must be an absolute path, or \"\"\n");
      return 2;
    }
    options.stateDir = stateDir;
  }
  std::signal(SIGINT, onSignal);
  std::signal(SIGTERM, onSignal);
  return spillway::runDaemon(result.value(), options);
}
