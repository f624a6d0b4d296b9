#include "control/announce/announcer.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

namespace spillway {

Announcer::Announcer(Options options, AnnounceExchange& exchange, const Dataplane& dataplane,
                     std::unique_ptr<VipRoutes> routes)
    : options_(std::move(options)),
      exchange_(exchange),
      dataplane_(dataplane),
      policy_(AnnounceSettings{options_.config.stallMs, options_.config.controlStallMs,
                               options_.config.holdDownMs}) {
  device_ = std::move(routes);
  outcome_.device = options_.config.device;
}

Announcer::~Announcer() {
  stop();
}

std::optional<std::string> Announcer::openDevice() {
  if (auto e = device_->open(options_.config.device)) return "announce device: " + *e;
  outcome_.stateSince = options_.clock();
  return std::nullopt;
}

std::optional<std::string> Announcer::start() {
  if (auto e = openDevice()) return e;
  thread_ = std::thread([this] { run(); });
  return std::nullopt;
}

void Announcer::stop() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  device_->close();
}

void Announcer::run() {
  using Clock = std::chrono::steady_clock;
  const auto period = std::chrono::milliseconds(options_.config.periodMs);
  auto next = Clock::now();
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      if (wake_.wait_until(lock, next, [&] { return stop_; })) return;
    }
    next += period;
    if (next < Clock::now()) next = Clock::now() + period;  // late: no catch-up burst
    round(options_.clock());
  }
}

void Announcer::round(Millis now) {
  AnnounceControlInputs in = exchange_.inputs();
  AnnounceInput input;
  input.now = now;
  input.warm = in.warm;
  input.drained = in.drained;
  input.stopping = in.stopping;
  input.disabled = in.disabled;
  if (in.settings) policy_.setSettings(*in.settings);
  if (options_.guard != nullptr) {
    options_.guard->beat();
    // The guard set the device down while this process did not run: the
    // kernel dropped the routes; bring the device back with none, and let
    // the policy hold the VIPs down like after any stall.
    if (const std::uint64_t trips = options_.guard->trips(); trips != guardTrips_) {
      guardTrips_ = trips;
      input.frozen = true;
      installed_.clear();
      ++outcome_.freezes;
      const auto e = device_->restore();
      if (options_.log) {
        options_.log("announce: this process was frozen for about " +
                     std::to_string(now - lastRound_) + " ms; the freeze guard withdrew every VIP" +
                     (e ? "; bringing the device up failed: " + *e : ""));
      }
    }
  }
  lastRound_ = now;
  input.workerRounds = dataplane_.workerRounds();
  input.controlRounds = exchange_.controlBeats();
  input.vips = std::move(in.vips);
  const std::vector<VipAnnouncement>& decided = policy_.decide(input);

  const auto wanted = [&](const IpAddress& a) {
    return std::any_of(decided.begin(), decided.end(),
                       [&](const VipAnnouncement& d) { return d.announced && d.address == a; });
  };
  std::string error;
  // Withdrawals first; a route whose deletion failed stays listed and is
  // tried again next period.
  std::erase_if(installed_, [&](const VipAnnouncement& r) {
    if (wanted(r.address)) return false;
    if (auto e = device_->withdraw(r.address)) {
      error = *e;
      return false;
    }
    return true;
  });
  for (const VipAnnouncement& d : decided) {
    if (!d.announced) continue;
    if (std::any_of(installed_.begin(), installed_.end(),
                    [&](const VipAnnouncement& r) { return r.address == d.address; })) {
      continue;
    }
    if (auto e = device_->announce(d.address)) {
      error = *e;
    } else {
      installed_.push_back(d);
    }
  }

  std::vector<AnnounceTransition> transitions;
  for (const VipAnnouncement& d : decided) {
    const auto old = std::find_if(outcome_.vips.begin(), outcome_.vips.end(),
                                  [&](const VipAnnouncement& o) { return o.name == d.name; });
    const bool changed = old == outcome_.vips.end() ? d.announced
                                                    : old->announced != d.announced ||
                                                          (!d.announced && old->reason != d.reason);
    if (!changed) continue;
    transitions.push_back(AnnounceTransition{now, d.name, d.announced, d.reason});
    if (options_.log) {
      options_.log(
          "announce: VIP " + d.name + " " + formatIpAddress(d.address) +
          (d.announced ? " announced" : " withdrawn (" + std::string(toString(d.reason)) + ")") +
          " at " + std::to_string(now) + " ms");
    }
  }
  if (!error.empty() && error != outcome_.error && options_.log) options_.log("announce: " + error);
  const AnnounceState state = policy_.state();
  if (state != outcome_.state) outcome_.stateSince = now;
  outcome_.state = state;
  outcome_.vips = decided;
  outcome_.error = error;
  ++outcome_.decisions;
  exchange_.publish(outcome_, std::move(transitions));
}

}  // namespace spillway
