#include "control/announce/announce_policy.hpp"

#include <algorithm>

namespace spillway {
namespace {

bool automatic(WithdrawReason r) noexcept {
  return r == WithdrawReason::Frozen || r == WithdrawReason::ControlStalled ||
         r == WithdrawReason::DataplaneStalled || r == WithdrawReason::NoActiveBackend;
}

}  // namespace

std::string_view toString(WithdrawReason reason) noexcept {
  switch (reason) {
    case WithdrawReason::None:
      return "";
    case WithdrawReason::Stopping:
      return "stopping";
    case WithdrawReason::Frozen:
      return "frozen";
    case WithdrawReason::ControlStalled:
      return "control_stalled";
    case WithdrawReason::DataplaneStalled:
      return "dataplane_stalled";
    case WithdrawReason::WarmingUp:
      return "warming_up";
    case WithdrawReason::Drained:
      return "drained";
    case WithdrawReason::Disabled:
      return "announce_disabled";
    case WithdrawReason::NoActiveBackend:
      return "no_active_backend";
    case WithdrawReason::HoldDown:
      return "hold_down";
  }
  return "unknown";
}

std::string_view toString(AnnounceState state) noexcept {
  switch (state) {
    case AnnounceState::Announced:
      return "announced";
    case AnnounceState::Partial:
      return "partial";
    case AnnounceState::Withdrawn:
      return "withdrawn";
    case AnnounceState::Warming:
      return "warming";
    case AnnounceState::Drained:
      return "drained";
    case AnnounceState::Disabled:
      return "disabled";
  }
  return "unknown";
}

bool AnnouncePolicy::stalled(Beat& beat, std::uint64_t value, Millis now, Millis limit) {
  if (!beat.seen || value != beat.value) {
    beat = Beat{value, now, true};
    return false;
  }
  return now >= beat.changedAt + limit;
}

const std::vector<VipAnnouncement>& AnnouncePolicy::decide(const AnnounceInput& in) {
  const Millis now = in.now;
  if (in.warm) warm_ = true;
  if (workers_.size() != in.workerRounds.size()) workers_.assign(in.workerRounds.size(), Beat{});
  bool dataplaneStalled = false;
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    // Every worker is judged (and its beat recorded), not only up to the first.
    dataplaneStalled |= stalled(workers_[i], in.workerRounds[i], now, settings_.stallMs);
  }
  const bool controlStalled = stalled(control_, in.controlRounds, now, settings_.controlStallMs);

  WithdrawReason global = WithdrawReason::None;
  if (in.stopping) {
    global = WithdrawReason::Stopping;
  } else if (in.disabled) {
    global = WithdrawReason::Disabled;
  } else if (in.frozen) {
    global = WithdrawReason::Frozen;
  } else if (controlStalled) {
    global = WithdrawReason::ControlStalled;
  } else if (dataplaneStalled) {
    global = WithdrawReason::DataplaneStalled;
  } else if (!warm_) {
    global = WithdrawReason::WarmingUp;
  } else if (in.drained) {
    global = WithdrawReason::Drained;
  }
  global_ = global;

  std::vector<VipAnnouncement> next;
  std::vector<std::optional<Millis>> lastAutomatic;
  next.reserve(in.vips.size());
  lastAutomatic.reserve(in.vips.size());
  for (const AnnounceVipInput& v : in.vips) {
    const auto old = std::find_if(vips_.begin(), vips_.end(),
                                  [&](const VipAnnouncement& a) { return a.name == v.name; });
    const bool known = old != vips_.end();
    std::optional<Millis> lastAuto =
        known ? lastAutomatic_[static_cast<std::size_t>(old - vips_.begin())] : std::nullopt;
    WithdrawReason reason = global;
    if (reason == WithdrawReason::None && v.activeBackends == 0) {
      reason = WithdrawReason::NoActiveBackend;
    }
    if (automatic(reason)) lastAuto = now;
    if (reason == WithdrawReason::None && lastAuto && now < *lastAuto + settings_.holdDownMs) {
      reason = WithdrawReason::HoldDown;
    }
    VipAnnouncement a;
    a.name = v.name;
    a.address = v.address;
    a.announced = reason == WithdrawReason::None;
    a.reason = reason;
    a.since =
        known && old->announced == a.announced && old->address == a.address ? old->since : now;
    next.push_back(std::move(a));
    lastAutomatic.push_back(lastAuto);
  }
  vips_ = std::move(next);
  lastAutomatic_ = std::move(lastAutomatic);
  return vips_;
}

AnnounceState AnnouncePolicy::state() const noexcept {
  const auto announced = static_cast<std::size_t>(std::count_if(
      vips_.begin(), vips_.end(), [](const VipAnnouncement& a) { return a.announced; }));
  if (announced > 0) {
    return announced == vips_.size() ? AnnounceState::Announced : AnnounceState::Partial;
  }
  if (global_ == WithdrawReason::WarmingUp) return AnnounceState::Warming;
  if (global_ == WithdrawReason::Drained) return AnnounceState::Drained;
  if (global_ == WithdrawReason::Disabled) return AnnounceState::Disabled;
  return AnnounceState::Withdrawn;
}

}  // namespace spillway
