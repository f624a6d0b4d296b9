#include "daemon.hpp"

#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "control/announce/announcer.hpp"
#include "control/api/cli_server.hpp"
#include "control/api/metrics_http.hpp"
#include "control/backends/neighbours.hpp"
#include "control/backends/next_hop_refresh.hpp"
#include "control/backends/snapshot_builder.hpp"
#include "control/host/privileges.hpp"
#include "control/plane/control_plane.hpp"
#include "control/plane/stats_view.hpp"
#include "control/sys/durable_file.hpp"
#include "dpdk_dataplane.hpp"
#include "spillway/errno_text.hpp"

namespace spillway {
namespace {

using Clock = std::chrono::steady_clock;

// The control loop's pacing timer.
constexpr long kLoopPeriodMs = 5;

std::atomic<bool> gStop{false};

// Waits until any watched fd is readable or the periodic timer fires.
class ControlLoopWait {
 public:
  ControlLoopWait() = default;
  ~ControlLoopWait() {
    if (timerFd_ >= 0) ::close(timerFd_);
    if (epollFd_ >= 0) ::close(epollFd_);
  }
  ControlLoopWait(const ControlLoopWait&) = delete;
  ControlLoopWait& operator=(const ControlLoopWait&) = delete;

  std::optional<std::string> open(long periodMs) {
    epollFd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epollFd_ < 0) return "epoll_create1: " + errnoText(errno);
    timerFd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (timerFd_ < 0) return "timerfd_create: " + errnoText(errno);
    itimerspec period{};
    period.it_interval.tv_nsec = periodMs * 1'000'000;
    period.it_value = period.it_interval;
    if (timerfd_settime(timerFd_, 0, &period, nullptr) != 0) {
      return "timerfd_settime: " + errnoText(errno);
    }
    return watch(timerFd_);
  }
  std::optional<std::string> watch(int fd) {
    if (fd < 0) return std::nullopt;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &ev) != 0 && errno != EEXIST) {
      return "epoll_ctl: " + errnoText(errno);
    }
    return std::nullopt;
  }
  // Returns after an event, a timer period, or a signal.
  void wait() {
    epoll_event events[16];
    const int n = epoll_wait(epollFd_, events, 16, static_cast<int>(kLoopPeriodMs * 2));
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == timerFd_) {
        std::uint64_t expirations = 0;
        (void)::read(timerFd_, &expirations, sizeof expirations);
      }
    }
  }

 private:
  int epollFd_ = -1;
  int timerFd_ = -1;
};

void writeStatsFile(const std::string& path, const Json& stats) {
  // Best effort and not fsynced: a statistics view, rewritten every period.
  const std::string tmp = path + ".tmp";
  if (std::FILE* f = std::fopen(tmp.c_str(), "w")) {
    const std::string text = stats.dump() + "\n";
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) == 0 && ok) std::rename(tmp.c_str(), path.c_str());
  }
}

// Before the EAL starts: the user exists, and a state_dir that is not there
// yet is made by root for that user (an existing one is checked after the
// drop, where the kernel itself answers).
std::optional<std::string> prepareRunAs(const Config& config, std::optional<RunAsUser>& runAs) {
  if (config.control.user.empty()) return std::nullopt;
  if (geteuid() != 0) {
    return "[control] user = \"" + config.control.user +
           "\": spillwayd must start as root to set up the ports and then become that user; "
           "start it as root, or set user = \"\"";
  }
  std::string error;
  runAs = lookupRunAsUser(config.control.user, error);
  if (!runAs) return error;
  const std::string& dir = config.control.stateDir;
  struct stat st {};
  if (!dir.empty() && ::lstat(dir.c_str(), &st) != 0 && errno == ENOENT) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return "state_dir " + dir + ": cannot create it: " + ec.message();
    if (::chown(dir.c_str(), runAs->uid, runAs->gid) != 0 || ::chmod(dir.c_str(), 0700) != 0) {
      return "state_dir " + dir + ": cannot give it to user " + runAs->name + ": " +
             errnoText(errno);
    }
  }
  return std::nullopt;
}

// Just before the drop: the files of this start that root made in the
// user's state_dir (the journal it opened) become the user's, as every later
// one will be. Only in a folder the user owns, where it could replace them
// anyway; symbolic links are not followed.
void giveStateFiles(const std::string& dir, const RunAsUser& user) {
  struct stat st {};
  if (dir.empty() || ::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
      st.st_uid != user.uid) {
    return;
  }
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string path = entry.path().string();
    if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0) {
      (void)::lchown(path.c_str(), user.uid, user.gid);
    }
  }
}

// After the drop: what the daemon writes and reads while running is within
// the user's reach, or start-up fails saying how to fix it.
std::optional<std::string> checkRunAsPaths(const Config& config, const DaemonOptions& options,
                                           const RunAsUser& user) {
  const std::string who = "user " + user.name + " (uid " + std::to_string(user.uid) + ")";
  // The nearest folder above `path` the user cannot enter, if any.
  const auto closedAbove = [](const std::string& path) -> std::string {
    namespace fs = std::filesystem;
    const fs::path absolute = fs::absolute(path);
    std::string closed;
    for (fs::path p = absolute.parent_path(); !p.empty(); p = p.parent_path()) {
      if (::access(p.c_str(), X_OK) != 0) closed = p.string();
      if (p == p.root_path()) break;
    }
    return closed;
  };
  const auto writable = [&](const std::string& dir,
                            const std::string& what) -> std::optional<std::string> {
    if (::access(dir.c_str(), W_OK | X_OK) == 0) return std::nullopt;
    const std::string why = errnoText(errno);
    if (const std::string closed = closedAbove(dir); !closed.empty()) {
      return what + " " + dir + " is out of reach of " + who + ": it cannot enter " + closed +
             " (chmod o+x " + closed + ", or choose another folder)";
    }
    return what + " " + dir + " is not writable by " + who + ": " + why + " (chown " + user.name +
           ": " + dir + ")";
  };
  if (!config.control.stateDir.empty()) {
    if (auto e = writable(config.control.stateDir, "state_dir")) return e;
  }
  if (!options.statsFile.empty()) {
    const std::string dir = std::filesystem::path(options.statsFile).parent_path().string();
    if (auto e = writable(dir.empty() ? "." : dir, "the --stats-file directory")) return e;
  }
  const auto readable = [&](const std::string& file, const std::string& what,
                            const std::string& fix) -> std::optional<std::string> {
    if (::access(file.c_str(), R_OK) == 0) return std::nullopt;
    if (const std::string closed = closedAbove(file); !closed.empty()) {
      return what + " " + file + " is out of reach of " + who + ", so `config reload` would " +
             "fail: it cannot enter " + closed + " (chmod o+x " + closed + ")";
    }
    return what + " " + file + " is not readable by " + who +
           ", so `config reload` would fail: " + errnoText(errno) + " (" + fix + ")";
  };
  const std::string& file = options.configPath;
  if (auto e = readable(file, "the configuration",
                        "chgrp " + user.name + " " + file + " && chmod g+r " + file)) {
    return e;
  }
  // The secret stays readable by its owner only: the user must own it.
  const std::string& secret = config.tier.secretFile;
  if (!secret.empty()) {
    if (auto e = readable(secret, "[tier] secret_file", "chown " + user.name + ": " + secret)) {
      return e;
    }
  }
  return std::nullopt;
}

}  // namespace

std::atomic<bool>& daemonStopRequested() noexcept {
  return gStop;
}

int runDaemon(const Config& configIn, const DaemonOptions& options) {
  Config config = configIn;
  if (options.controlSocket) config.control.socketPath = *options.controlSocket;
  if (options.metricsListen) config.control.metricsListen = *options.metricsListen;
  if (options.stateDir) config.control.stateDir = *options.stateDir;
  if (options.user) config.control.user = *options.user;
  const auto log = [&](const std::string& line) {
    if (!options.quiet) std::fprintf(stderr, "spillwayd: %s\n", line.c_str());
  };
  const auto fail = [](const std::string& what) {
    std::fprintf(stderr, "spillwayd: %s\n", what.c_str());
    return 1;
  };

  std::optional<RunAsUser> runAs;
  if (auto e = prepareRunAs(config, runAs)) return fail(*e);
  // Before the freeze guard, the EAL and any thread: the bounding set holds
  // only the capabilities kept after the drop and no_new_privs is set, so
  // every thread inherits both (control/host/privileges.hpp).
  if (runAs) {
    if (auto e = restrictBeforeThreads(capabilitiesToKeep(config))) {
      return fail("restricting privileges before the first thread: " + *e);
    }
  }

  // The freeze guard ([announce]): a process of its own, forked before the
  // EAL and any thread start (control/announce/freeze_guard.hpp).
  std::unique_ptr<FreezeGuard> freezeGuard;
  if (config.announce.enabled) {
    std::string guardError;
    freezeGuard = FreezeGuard::start(FreezeGuard::Options{config.announce.device,
                                                          config.announce.freezeMs,
                                                          config.announce.periodMs,
                                                          runAs,
                                                          {},
                                                          log},
                                     guardError);
    if (!freezeGuard) return fail(guardError);
  }

  DpdkDataplane::Options dpOptions;
  dpOptions.ealArgs = options.ealArgs;
  dpOptions.lcores = config.dataplane.lcores;
  for (const auto& p : config.ports) {
    dpOptions.ports.push_back(PortSpec{p.name, p.devargs, p.mtu, p.exception == ExceptionMode::Tap,
                                       p.exceptionName, p.mac});
  }
  dpOptions.burst = static_cast<std::uint16_t>(config.dataplane.burst);
  dpOptions.txDrainUs = config.dataplane.txDrainUs;
  dpOptions.idleSleepUs = config.dataplane.idleSleepUs;
  dpOptions.idleSleepMaxUs = config.dataplane.idleSleepMaxUs;
  dpOptions.icmpLimits = config.dataplane.icmpLimits;
  dpOptions.flowTable = FlowTableConfig{config.dataplane.flowCapacity, config.dataplane.timeouts};
  dpOptions.hashSeed = config.dataplane.hashSeed;
  dpOptions.log = log;
  std::string error;
  std::unique_ptr<DpdkDataplane> dataplane = DpdkDataplane::open(dpOptions, error);
  if (!dataplane) return fail(error);

  SnapshotBuilder builder;
  if (auto e = builder.setConfig(config)) return fail(*e);
  for (std::uint32_t i = 0; i < dataplane->ports().size(); ++i) {
    builder.setPortMac(i, dataplane->ports()[i].mac);
  }
  if (auto e = dataplane->syncVips(vipKeysOf(config))) return fail(*e);

  KernelNeighbourSource kernel;
  NeighbourResolver resolver(kernel);
  const auto start = Clock::now();
  auto millis = [&] {
    return static_cast<Millis>(
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
  };
  NextHopRefresh nextHops(resolver, builder);
  nextHops.prime(config, millis());
  ControlPlane control(config, options.configPath, builder, dataplane.get(), millis());
  control.writeCheckpointsInBackground();
  for (const std::string& line : control.startupReport()) log(line);
  auto first = control.takeSnapshot(millis());
  if (!first) return fail(builder.lastError());
  dataplane->publish(std::move(first));
  log("published snapshot generation " + std::to_string(control.generation()) +
      (control.warmingUp() ? " (the last tables before this start, held for the warm-up)" : ""));

  // Peer credentials of every mutating request go to the log.
  CliServer cli(control, CliServerOptions::fromConfig(config.control, [&](std::string_view line) {
                  std::fprintf(stderr, "spillwayd: cli: %.*s\n", static_cast<int>(line.size()),
                               line.data());
                }));
  if (!cli.open(error)) return fail("CLI socket: " + error);
  MetricsHttpServer metrics(control, MetricsHttpOptions::fromConfig(config.control));
  if (!metrics.open(error)) return fail("metrics: " + error);
  log("CLI socket " + config.control.socketPath +
      (config.control.metricsListen.empty()
           ? std::string()
           : ", metrics on http://" + config.control.metricsListen + "/metrics"));

  ControlLoopWait loop;
  for (auto e :
       {loop.open(kLoopPeriodMs), loop.watch(cli.pollFd()), loop.watch(metrics.pollFd())}) {
    if (e) return fail("control loop: " + *e);
  }
  for (int fd : control.pollFds()) {
    if (auto e = loop.watch(fd)) return fail("control loop: " + *e);
  }

  // Everything that needs root is open: from here on spillwayd runs as
  // [control] user with the capabilities its running work needs
  // (control/privileges.hpp). Before any thread of ours starts, so that the
  // announcer inherits them.
  if (runAs) {
    giveStateFiles(config.control.stateDir, *runAs);
    const std::vector<KeptCapability> keep = capabilitiesToKeep(config);
    if (auto e = dropPrivileges(*runAs, keep)) return fail("dropping root: " + *e);
    if (auto e = checkRunAsPaths(config, options, *runAs)) return fail(*e);
    log("running as user " + runAs->name + " (uid " + std::to_string(runAs->uid) + ", gid " +
        std::to_string(runAs->gid) +
        "), no new privileges, capabilities kept: " + capabilityNames(keep));
    for (const KeptCapability& k : keep) log("  " + k.name + ": " + k.why);
  }

  // The BGP announcement ([announce]): its own thread and device; the
  // control loop hands it inputs every round (ControlPlane::syncAnnounce).
  AnnounceExchange announceExchange;
  std::unique_ptr<Announcer> announcer;
  if (config.announce.enabled) {
    announcer = std::make_unique<Announcer>(
        Announcer::Options{config.announce, millis, log, freezeGuard.get()}, announceExchange,
        *dataplane);
    control.attachAnnounce(&announceExchange);
    control.syncAnnounce(millis());
    if (auto e = announcer->start()) return fail(*e);
    log("announcing VIPs through device " + config.announce.device +
        " after warm-up; freeze guard pid " + std::to_string(freezeGuard->pid()) + ", " +
        std::to_string(config.announce.freezeMs) + " ms");
  }

  dataplane->start();
  log("running " + std::to_string(config.dataplane.lcores.size()) + " worker lcore(s)");

  auto lastStats = start, lastRx = start;
  std::uint64_t rxSeen = 0;
  // SIGTERM with VIPs announced: withdraw first, forward for the grace
  // period while the router moves the flows, then stop.
  std::optional<Clock::time_point> stopAt;
  for (;;) {
    if (gStop.load() && !stopAt) {
      stopAt = Clock::now();
      if (announcer) {
        const AnnounceOutcome o = announceExchange.outcome();
        announceExchange.setStopping();
        if (std::any_of(o.vips.begin(), o.vips.end(), [](const auto& v) { return v.announced; })) {
          // The running value: a reload may have changed it.
          const Millis grace = control.config().announce.withdrawGraceMs;
          *stopAt += std::chrono::milliseconds(grace);
          log("stopping: VIPs withdrawn, forwarding for " + std::to_string(grace) + " ms more");
        }
      }
    }
    if (stopAt && Clock::now() >= *stopAt) break;
    loop.wait();
    const auto now = Clock::now();
    const Millis nowMs = millis();
    dataplane->reclaim();
    cli.poll();
    // Next hops (src/control/backends/next_hop_refresh.hpp), after the
    // commands so a backend added this round is looked at at once.
    if (nextHops.poll(control.config(), nowMs)) control.markDirty();
    metrics.poll();
    control.syncAnnounce(nowMs);
    if (control.tick(nowMs)) {
      if (auto next = control.takeSnapshot(nowMs)) {
        dataplane->publish(std::move(next));
        if (!options.quiet) {
          log("published snapshot generation " + std::to_string(control.generation()));
        }
      }
    }
    if (!options.statsFile.empty() &&
        now - lastStats >= std::chrono::milliseconds(options.statsIntervalMs)) {
      lastStats = now;
      writeStatsFile(options.statsFile, statsDocument(dataplane->counters(), control.config(),
                                                      builder, control.generation()));
    }
    // The round's work, not its wait: spillway_control_loop_tick_seconds.
    control.recordLoopDuration(std::chrono::duration<double>(Clock::now() - now).count());
    const std::uint64_t rx = dataplane->rxTotal();
    if (rx != rxSeen) {
      rxSeen = rx;
      lastRx = now;
    }
    if (options.exitAfterIdleMs != 0 && rxSeen > 0 &&
        now - lastRx >= std::chrono::milliseconds(options.exitAfterIdleMs)) {
      log("idle, stopping");
      break;
    }
    if (options.runForMs != 0 && now - start >= std::chrono::milliseconds(options.runForMs)) {
      break;
    }
  }
  if (freezeGuard) freezeGuard->stop();  // before the announcer stops beating it
  if (announcer) announcer->stop();      // the device and any route left go with it
  dataplane->stop();
  // The last checkpoint: every exception of the stopped flow tables.
  {
    std::vector<ExportedFlow> flows;
    dataplane->exportAllStopped(flows);
    control.finalCheckpoint(millis(), std::move(flows));
    const CheckpointStats& c = control.affinity().stats();
    if (control.affinity().enabled()) {
      log("final checkpoint: " + std::to_string(c.lastExceptions) + " flow exceptions" +
          (c.lastError.empty() ? "" : " (failed: " + c.lastError + ")"));
    }
  }
  const Json stats =
      statsDocument(dataplane->counters(), control.config(), builder, control.generation());
  if (!options.statsFile.empty()) writeStatsFile(options.statsFile, stats);
  std::printf("%s\n", stats.dump().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace spillway
