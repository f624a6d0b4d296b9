#include "control/backends/backend_state.hpp"

#include <algorithm>
#include <utility>

#include "control/backends/drain_rule.hpp"

namespace spillway {

std::string_view toString(BackendState state) noexcept {
  switch (state) {
    case BackendState::Active:
      return "active";
    case BackendState::Draining:
      return "draining";
    case BackendState::Disabled:
      return "disabled";
    case BackendState::Failed:
      return "failed";
    case BackendState::Removed:
      return "removed";
  }
  return "?";
}

std::string_view toString(AdminState state) noexcept {
  switch (state) {
    case AdminState::Enabled:
      return "enabled";
    case AdminState::Draining:
      return "draining";
    case AdminState::Disabled:
      return "disabled";
    case AdminState::Removing:
      return "removing";
  }
  return "?";
}

std::string_view toString(HealthVerdict state) noexcept {
  return state == HealthVerdict::Up ? "up" : "down";
}

std::string_view StateResult::codeName() const noexcept {
  switch (code_) {
    case Code::Ok:
      return "ok";
    case Code::NotFound:
      return "not_found";
    case Code::Conflict:
      return "conflict";
  }
  return "?";
}

namespace {

std::string with(std::string_view what, std::string_view cause) {
  std::string s(what);
  if (!cause.empty()) {
    s += ": ";
    s += cause;
  }
  return s;
}

std::string flowsText(const std::optional<std::uint64_t>& flows) {
  return flows ? std::to_string(*flows) + " live flows" : "an unknown number of live flows";
}

}  // namespace

BackendStates::BackendStates(EventLog& events, Millis drainTimeout)
    : events_(events), drainTimeout_(drainTimeout) {}

BackendStates::Entry* BackendStates::lookup(std::uint64_t id, StateResult& error) {
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    error = StateResult::notFound("no backend with id " + std::to_string(id));
    return nullptr;
  }
  return &it->second;
}

BackendStates::Entry* BackendStates::lookupPresent(std::uint64_t id, StateResult& error) {
  Entry* e = lookup(id, error);
  if (e != nullptr && e->removed) {
    error = StateResult::conflict("\"" + e->status.name + "\" is removed; add it again first");
    return nullptr;
  }
  return e;
}

BackendState BackendStates::effectiveOf(const Entry& e) noexcept {
  if (e.removed) return BackendState::Removed;
  if (e.status.health == HealthVerdict::Down) return BackendState::Failed;
  switch (e.status.admin) {
    case AdminState::Disabled:
      return BackendState::Disabled;
    case AdminState::Draining:
      return e.drain && e.drain->expired ? BackendState::Failed : BackendState::Draining;
    case AdminState::Removing:
      return BackendState::Draining;
    case AdminState::Enabled:
      break;
  }
  return BackendState::Active;
}

void BackendStates::settle(Entry& e, Millis now, std::string cause) {
  const BackendState next = effectiveOf(e);
  if (next == e.status.effective) return;
  const BackendState prev = e.status.effective;
  e.status.effective = next;
  e.status.since = now;
  e.status.cause = cause;
  ++generation_;
  events_.append(now, e.status.name, kEventState, std::move(cause), prev, next);
}

void BackendStates::startDrain(Entry& e, Millis now, bool removing, Millis elapsed) {
  if (e.drain) {
    // Already draining: keep the clock (a removal of a draining backend).
    e.drain->removing = removing;
    return;
  }
  DrainProgress d;
  d.started = now - std::min(now, elapsed);
  d.deadline = now + (elapsed < drainTimeout_ ? drainTimeout_ - elapsed : 0);
  d.flowsAtStart = e.status.liveFlows;
  d.flowsNow = e.status.liveFlows;
  d.removing = removing;
  const DrainJudgement j =
      judgeDrain({e.status.liveFlows, e.status.backendConnections, e.status.backendZeroSince}, now,
                 e.status.drainGrace);
  d.complete = j != DrainJudgement::Open;
  d.judgedBy = std::string(judgedBy(j));
  e.drain = d;
}

void BackendStates::logAdmin(const Entry& e, Millis now, std::string_view action,
                             std::string_view cause) {
  events_.append(now, e.status.name, kEventAdmin, with(action, cause));
}

void BackendStates::completeIfDone(Entry& e, Millis now) {
  if (e.removed || e.status.admin != AdminState::Removing || !e.drain) return;
  if (e.status.health == HealthVerdict::Down) {
    e.removed = true;
    settle(e, now, "removed: failed, its flows are re-steered already");
  } else if (e.drain->complete) {
    e.removed = true;
    settle(e, now,
           e.drain->judgedBy == "backend"
               ? "removed: drained, the backend reports no connections (this instance still "
                 "tracked " +
                     flowsText(e.status.liveFlows) + " of flows that moved or closed unseen)"
               : "removed: drained, no live flows left");
  } else if (e.drain->expired) {
    e.removed = true;
    settle(e, now, "removed: its drain deadline had passed, its flows are re-steered already");
  }
}

StateResult BackendStates::add(std::uint64_t id, std::string name, Millis now,
                               std::string_view cause, AdminState initial) {
  auto it = entries_.find(id);
  if (it != entries_.end() && !it->second.removed) {
    return StateResult::conflict("backend id " + std::to_string(id) + " (\"" +
                                 it->second.status.name + "\") exists and is " +
                                 std::string(toString(it->second.status.effective)));
  }
  const bool again = it != entries_.end();
  const BackendState prev = again ? it->second.status.effective : BackendState::Removed;
  Entry e;
  e.status.id = id;
  e.status.name = std::move(name);
  e.status.admin = initial == AdminState::Disabled ? AdminState::Disabled : AdminState::Enabled;
  e.status.health = HealthVerdict::Up;
  e.status.effective = effectiveOf(e);
  e.status.since = now;
  e.status.cause = with(again ? "added again" : "added", cause);
  Entry& stored = entries_.insert_or_assign(id, std::move(e)).first->second;
  ++generation_;
  logAdmin(stored, now, again ? "add (again)" : "add", cause);
  events_.append(now, stored.status.name, kEventState, stored.status.cause,
                 again ? std::optional<BackendState>(prev) : std::nullopt, stored.status.effective);
  return StateResult::success();
}

StateResult BackendStates::drain(std::uint64_t id, Millis now, std::string_view cause,
                                 Millis elapsed) {
  StateResult r = StateResult::success();
  Entry* e = lookupPresent(id, r);
  if (e == nullptr) return r;
  if (e->status.admin == AdminState::Removing) {
    return StateResult::conflict("\"" + e->status.name +
                                 "\" is being removed (draining already); undrain cancels the "
                                 "removal");
  }
  if (e->status.admin == AdminState::Draining) {
    logAdmin(*e, now, "drain (already draining)", cause);
    return r;
  }
  logAdmin(*e, now, "drain", cause);
  e->status.admin = AdminState::Draining;
  startDrain(*e, now, false, elapsed);
  settle(*e, now, with("drain", cause));
  return r;
}

StateResult BackendStates::undrain(std::uint64_t id, Millis now, std::string_view cause) {
  StateResult r = StateResult::success();
  Entry* e = lookupPresent(id, r);
  if (e == nullptr) return r;
  switch (e->status.admin) {
    case AdminState::Disabled:
      return StateResult::conflict("\"" + e->status.name +
                                   "\" is disabled, not draining; use enable");
    case AdminState::Enabled:
      logAdmin(*e, now, "undrain (not draining)", cause);
      return r;
    case AdminState::Draining:
    case AdminState::Removing: {
      const bool removing = e->status.admin == AdminState::Removing;
      const char* what = removing ? "undrain (cancels the removal)" : "undrain";
      logAdmin(*e, now, what, cause);
      e->status.admin = AdminState::Enabled;
      e->drain.reset();
      settle(*e, now, with(what, cause));
      return r;
    }
  }
  return r;
}

StateResult BackendStates::disable(std::uint64_t id, Millis now, std::string_view cause) {
  return setAdmin(id, now, cause, AdminState::Disabled);
}

StateResult BackendStates::enable(std::uint64_t id, Millis now, std::string_view cause) {
  return setAdmin(id, now, cause, AdminState::Enabled);
}

StateResult BackendStates::setAdmin(std::uint64_t id, Millis now, std::string_view cause,
                                    AdminState target) {
  StateResult r = StateResult::success();
  Entry* e = lookupPresent(id, r);
  if (e == nullptr) return r;
  const std::string verb = target == AdminState::Disabled ? "disable" : "enable";
  if (e->status.admin == target) {
    logAdmin(*e, now, verb + " (already " + std::string(toString(target)) + ")", cause);
    return r;
  }
  const std::string what = e->status.admin == AdminState::Removing ? verb + " (cancels the removal)"
                           : e->status.admin == AdminState::Draining ? verb + " (ends the drain)"
                                                                     : verb;
  logAdmin(*e, now, what, cause);
  e->status.admin = target;
  e->drain.reset();
  settle(*e, now, with(what, cause));
  return r;
}

StateResult BackendStates::remove(std::uint64_t id, Millis now, std::string_view cause,
                                  bool immediate, Millis elapsed) {
  StateResult r = StateResult::success();
  Entry* e = lookup(id, r);
  if (e == nullptr) return r;
  if (e->removed) {
    return StateResult::conflict("\"" + e->status.name + "\" is removed already");
  }
  if (immediate) {
    logAdmin(*e, now, "remove (immediate)", cause);
    e->status.admin = AdminState::Removing;
    e->removed = true;
    settle(*e, now, with("removed at once, live flows re-steered", cause));
    return r;
  }
  logAdmin(*e, now,
           e->status.admin == AdminState::Removing ? "remove (already removing)" : "remove", cause);
  e->status.admin = AdminState::Removing;
  startDrain(*e, now, true, elapsed);
  settle(*e, now, with("remove: draining", cause));
  completeIfDone(*e, now);
  return r;
}

StateResult BackendStates::setHealth(std::uint64_t id, bool up, Millis now,
                                     std::string_view cause) {
  StateResult r = StateResult::success();
  Entry* e = lookup(id, r);
  if (e == nullptr) return r;
  const HealthVerdict next = up ? HealthVerdict::Up : HealthVerdict::Down;
  if (next == e->status.health) return r;
  e->status.health = next;
  if (e->removed) return r;
  const std::string what = with(up ? "health up" : "health down", cause);
  events_.append(now, e->status.name, kEventHealth, what);
  settle(*e, now, what);
  completeIfDone(*e, now);
  return r;
}

StateResult BackendStates::setLiveFlows(std::uint64_t id, std::uint64_t flows, Millis now) {
  StateResult r = StateResult::success();
  Entry* e = lookup(id, r);
  if (e == nullptr) return r;
  e->status.liveFlows = flows;
  if (e->removed || !e->drain) return r;
  DrainProgress& d = *e->drain;
  d.flowsNow = flows;
  if (!d.flowsAtStart) d.flowsAtStart = flows;
  judge(*e, now);
  return r;
}

StateResult BackendStates::setBackendConnections(std::uint64_t id,
                                                 std::optional<std::uint64_t> connections,
                                                 std::optional<Millis> zeroSince, Millis grace,
                                                 Millis now) {
  StateResult r = StateResult::success();
  Entry* e = lookup(id, r);
  if (e == nullptr) return r;
  e->status.backendConnections = connections;
  e->status.backendZeroSince = connections == std::uint64_t{0} ? zeroSince : std::nullopt;
  e->status.drainGrace = grace;
  if (!e->removed && e->drain) judge(*e, now);
  return r;
}

void BackendStates::judge(Entry& e, Millis now) {
  DrainProgress& d = *e.drain;
  if (d.complete || d.expired) return;
  const DrainJudgement j =
      judgeDrain({e.status.liveFlows, e.status.backendConnections, e.status.backendZeroSince}, now,
                 e.status.drainGrace);
  if (j == DrainJudgement::Open) return;
  d.complete = true;
  d.judgedBy = std::string(judgedBy(j));
  if (e.status.admin == AdminState::Removing) {
    completeIfDone(e, now);
    return;
  }
  std::string why;
  switch (j) {
    case DrainJudgement::BothEmpty:
      why = "drained: the backend reports no connections and no live flows are left";
      break;
    case DrainJudgement::BackendEmpty:
      why = "drained: the backend has reported no connections for " +
            std::to_string(now - *e.status.backendZeroSince) + " ms (this instance still tracks " +
            flowsText(e.status.liveFlows) +
            ": entries of flows that moved to another instance or closed unseen)";
      break;
    default:
      why = "drained: no live flows left";
      break;
  }
  events_.append(now, e.status.name, kEventState, std::move(why), e.status.effective,
                 e.status.effective);
}

void BackendStates::tick(Millis now) {
  for (auto& [id, e] : entries_) {
    if (!e.removed && e.drain) judge(e, now);  // a backend's zeros outlasting the grace
    if (e.removed || !e.drain || e.drain->complete || e.drain->expired) continue;
    if (now < e.drain->deadline) continue;
    e.drain->expired = true;
    const std::string why =
        "drain deadline passed with " + flowsText(e.drain->flowsNow) + ": they are re-steered";
    if (e.status.admin == AdminState::Removing) {
      e.removed = true;
      settle(e, now, "removed: " + why);
    } else {
      settle(e, now, why);
    }
  }
}

StateResult BackendStates::erase(std::uint64_t id) {
  StateResult r = StateResult::success();
  Entry* e = lookup(id, r);
  if (e == nullptr) return r;
  if (!e->removed) {
    return StateResult::conflict("\"" + e->status.name + "\" is " +
                                 std::string(toString(e->status.effective)) +
                                 "; only a removed backend can be forgotten");
  }
  entries_.erase(id);
  return r;
}

std::optional<BackendState> BackendStates::state(std::uint64_t id) const {
  const BackendStatus* s = find(id);
  if (s == nullptr) return std::nullopt;
  return s->effective;
}

const BackendStatus* BackendStates::find(std::uint64_t id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second.status;
}

std::optional<DrainProgress> BackendStates::drainProgress(std::uint64_t id) const {
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.drain;
}

std::vector<std::uint64_t> BackendStates::ids() const {
  std::vector<std::uint64_t> out;
  out.reserve(entries_.size());
  for (const auto& [id, e] : entries_) out.push_back(id);
  return out;
}

}  // namespace spillway
