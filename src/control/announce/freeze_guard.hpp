// The freeze guard: what takes a frozen instance's VIPs off the router when
// nothing in the instance can run any more (SIGSTOP, a process stuck in the
// kernel, a host so overloaded that the announcer misses its timer while
// bfdd, a process of its own, still answers BFD). The announcer
// (announcer.hpp) withdraws by itself when the control loop or a worker
// stalls; a freeze stops the announcer too, so the routes would stay and the
// router would go on sending flows into a process that does not run.
//
// A small process of its own, forked by spillwayd before the EAL and any
// thread start, shares one page with spillwayd (MAP_SHARED | MAP_ANONYMOUS):
// the announcer bumps `beat` every round; the guard reads it every period and,
// when it has not moved for `freeze_ms` ([announce] freeze_ms), sets the
// announce device down. The kernel drops every route through a down device,
// zebra sees them go and bgpd withdraws the prefixes: the router stops
// sending within freeze_ms + one period + the speaker's update (measured in
// drill lb-freeze). The guard counts the trip in the page and waits for the
// beat to move again. It needs nothing from the frozen process.
//
// When the instance runs again, the announcer's next round sees the trip
// count changed, brings the device up with no route, and its policy treats
// the freeze as an automatic withdrawal (reason "frozen"): the VIPs come back
// after hold_down_ms, like after any stall, and only if the workers and the
// control loop beat again.
//
// The guard runs as [control] user with cap_net_admin only, dies with
// spillwayd (PR_SET_PDEATHSIG, and a parent check every period), and is in a
// process group of its own, so a signal to spillwayd's group does not freeze
// it too. systemd's watchdog (WatchdogSec) restarts a frozen service; the
// guard also covers a hand-started spillwayd and withdraws without killing,
// so an instance that resumes keeps its flow tables.
//
// Thread contract: start() once on the main thread before any other thread;
// beat() and trips() from the announcer thread (lock-free atomics in shared
// memory); stop() on the main thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "control/config/config.hpp"
#include "control/host/privileges.hpp"

namespace spillway {

// The guard's decision, a pure function of the beats it reads: trips once
// when the beat has not moved for the limit, then waits for it to move again.
class FreezeWatch {
 public:
  explicit FreezeWatch(Millis limitMs) : limitMs_(limitMs) {}
  // True when the guard must act now (once per freeze). A beat of 0 means the
  // announcer has not started: never a freeze.
  [[nodiscard]] bool observe(std::uint64_t beat, Millis now) noexcept;
  [[nodiscard]] bool tripped() const noexcept { return tripped_; }

 private:
  Millis limitMs_;
  std::uint64_t last_ = 0;
  Millis changedAt_ = 0;
  bool tripped_ = false;
};

// The page spillwayd and its guard share.
struct FreezeGuardPage {
  std::atomic<std::uint64_t> beat{0};   // the announcer's rounds
  std::atomic<std::uint64_t> trips{0};  // freezes the guard acted on
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

class FreezeGuard {
 public:
  struct Options {
    std::string device;  // the announce device to set down
    Millis freezeMs = 300;
    Millis periodMs = 20;
    std::optional<RunAsUser> runAs;  // the guard's user (cap_net_admin kept)
    // What the guard does on a trip; the default sets `device` down. Tests
    // pass their own (it runs in the guard process).
    std::function<std::optional<std::string>(const std::string& device)> act;
    std::function<void(const std::string&)> log;  // runs in the guard process too
  };

  // Forks the guard. nullptr and `error` when it cannot.
  [[nodiscard]] static std::unique_ptr<FreezeGuard> start(Options options, std::string& error);
  ~FreezeGuard();
  FreezeGuard(const FreezeGuard&) = delete;
  FreezeGuard& operator=(const FreezeGuard&) = delete;

  void beat() noexcept { page_->beat.fetch_add(1, std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t trips() const noexcept {
    return page_->trips.load(std::memory_order_acquire);
  }
  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  // Ends the guard and reaps it (also done by the destructor).
  void stop() noexcept;

 private:
  FreezeGuard(FreezeGuardPage* page, pid_t pid) : page_(page), pid_(pid) {}
  FreezeGuardPage* page_;
  pid_t pid_;
};

}  // namespace spillway
