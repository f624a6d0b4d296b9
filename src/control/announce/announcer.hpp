// The owner of the BGP announcement: a thread of its own, on its own timer
// ([announce] period_ms), that owns the announce device (its TAP fd and
// netlink socket, announce_device.hpp). Each period it reads the control
// thread's inputs and heartbeat and the workers' round counters (Dataplane::
// workerRounds), decides with AnnouncePolicy, adds and deletes routes to
// match, and publishes the outcome (announce_exchange.hpp). Being its own
// thread, it withdraws everything when the control loop stops beating too,
// not only when the workers stop.
//
// Thread contract: start() and stop() on the control thread; the loop runs on
// the announcer thread; the dataplane's workerRounds() is read from it.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "control/announce/announce_device.hpp"
#include "control/announce/announce_exchange.hpp"
#include "control/announce/announce_policy.hpp"
#include "control/announce/freeze_guard.hpp"
#include "control/config/config.hpp"
#include "spillway/dataplane.hpp"

namespace spillway {

class Announcer {
 public:
  struct Options {
    AnnounceConfig config;
    std::function<Millis()> clock;                // the control plane's clock
    std::function<void(const std::string&)> log;  // called on the announcer thread
    FreezeGuard* guard = nullptr;                 // beaten every round; none in tests
  };
  // `routes`: the announce device (a fake in tests).
  Announcer(Options options, AnnounceExchange& exchange, const Dataplane& dataplane,
            std::unique_ptr<VipRoutes> routes = std::make_unique<AnnounceDevice>());
  ~Announcer();
  Announcer(const Announcer&) = delete;
  Announcer& operator=(const Announcer&) = delete;

  // Creates the device and starts the thread.
  [[nodiscard]] std::optional<std::string> start();
  // Stops the thread and destroys the device (every route goes with it).
  void stop();
  // One period's work (what the thread runs): decide, apply, publish. Tests
  // call it directly, on an opened device and without the thread.
  void round(Millis now);
  [[nodiscard]] std::optional<std::string> openDevice();

 private:
  void run();

  Options options_;
  AnnounceExchange& exchange_;
  const Dataplane& dataplane_;
  AnnouncePolicy policy_;
  std::unique_ptr<VipRoutes> device_;
  AnnounceOutcome outcome_;
  std::vector<VipAnnouncement> installed_;  // routes in the kernel now
  std::uint64_t guardTrips_ = 0;            // the guard's trips already handled
  Millis lastRound_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
};

}  // namespace spillway
