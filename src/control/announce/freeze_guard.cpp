#include "control/announce/freeze_guard.hpp"

#include <linux/capability.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <new>
#include <utility>

#include "control/announce/announce_device.hpp"
#include "spillway/errno_text.hpp"

namespace spillway {
namespace {

Millis monotonicMs() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<Millis>(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
}

// The guard process's life; never returns.
[[noreturn]] void runGuard(FreezeGuardPage& page, const FreezeGuard::Options& options,
                           pid_t parent) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(0);  // spillwayd died before the line above
  ::setpgid(0, 0);
  ::prctl(PR_SET_NAME, "spillway-guard");
  const auto log = [&](const std::string& line) {
    if (options.log) options.log("freeze guard: " + line);
  };
  if (options.runAs) {
    const std::vector<KeptCapability> keep{
        {CAP_NET_ADMIN, "cap_net_admin", "sets the announce device down on a freeze"}};
    if (auto e = dropPrivileges(*options.runAs, keep)) {
      log("dropping root: " + *e + "; no freeze guard");
      ::_exit(1);
    }
  }
  FreezeWatch watch(options.freezeMs);
  const timespec period{static_cast<time_t>(options.periodMs / 1000),
                        static_cast<long>(options.periodMs % 1000) * 1'000'000};
  Millis frozenFrom = 0;  // for the log: when the beat last moved
  for (;;) {
    ::nanosleep(&period, nullptr);
    if (::getppid() != parent) ::_exit(0);
    const std::uint64_t beat = page.beat.load(std::memory_order_relaxed);
    const Millis now = monotonicMs();
    const bool wasTripped = watch.tripped();
    if (!watch.observe(beat, now)) {
      if (wasTripped && !watch.tripped()) {
        log("the announcer beats again after " + std::to_string(now - frozenFrom) + " ms");
      }
      continue;
    }
    frozenFrom = now - options.freezeMs;
    const auto error = options.act ? options.act(options.device) : setLinkUp(options.device, false);
    page.trips.fetch_add(1, std::memory_order_release);
    log("no announcer round for " + std::to_string(options.freezeMs) + " ms: " +
        (error ? "could not set " + options.device + " down: " + *error
               : options.device + " set down, every VIP route withdrawn"));
  }
}

}  // namespace

bool FreezeWatch::observe(std::uint64_t beat, Millis now) noexcept {
  if (beat != last_ || changedAt_ == 0) {
    last_ = beat;
    changedAt_ = now;
    tripped_ = false;
    return false;
  }
  if (beat == 0 || tripped_ || now < changedAt_ + limitMs_) return false;
  tripped_ = true;
  return true;
}

std::unique_ptr<FreezeGuard> FreezeGuard::start(Options options, std::string& error) {
  void* memory = ::mmap(nullptr, sizeof(FreezeGuardPage), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) {
    error = "freeze guard: mmap: " + errnoText(errno);
    return nullptr;
  }
  auto* page = new (memory) FreezeGuardPage;
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    error = "freeze guard: fork: " + errnoText(errno);
    ::munmap(memory, sizeof(FreezeGuardPage));
    return nullptr;
  }
  if (pid == 0) runGuard(*page, options, parent);
  return std::unique_ptr<FreezeGuard>(new FreezeGuard(page, pid));
}

void FreezeGuard::stop() noexcept {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = 0;
  }
}

FreezeGuard::~FreezeGuard() {
  stop();
  ::munmap(page_, sizeof(FreezeGuardPage));
}

}  // namespace spillway
