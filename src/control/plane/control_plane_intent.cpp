// The ControlPlane's operator intent: replaying the journal at start,
// applying the journaled states, and planning, journaling and committing a
// change of configuration (reload, clear-overrides).
#include <algorithm>
#include <set>

#include "control/intent/intent_merge.hpp"
#include "control/plane/control_plane.hpp"
#include "control/plane/control_plane_json.hpp"

namespace spillway {

using namespace plane_json;  // NOLINT(google-build-using-namespace)

// --- Operator intent ------------------------------------------------------------

void ControlPlane::report(const std::string& line) {
  events_.append(now_, "", kEventIntent, line);
  startupReport_.push_back(line);
}

void ControlPlane::replayIntent(Millis now) {
  now_ = now;
  const bool opened = journal_.open();
  for (const IntentDamage& d : journal_.damage()) {
    if (d.kind == IntentDamage::Kind::Unreadable) continue;  // said below
    report("operator intent: " + std::string(toString(d.kind)) + " in " + d.file + " at byte " +
           std::to_string(d.offset) + " (" + std::to_string(d.bytes) +
           " bytes not replayed): " + d.what);
  }
  if (!opened) {
    report("operator intent: " + journal_.error() +
           "; nothing replayed, and commands that change state are refused until it is fixed");
    return;
  }
  if (!journal_.persistent()) return;
  if (journal_.replayedRecords() > 0) {
    report("operator intent: replayed " + std::to_string(journal_.replayedRecords()) +
           " record(s) from " + journal_.directory() + " (last seq " +
           std::to_string(journal_.lastSeq()) + ")");
  }
  if (journal_.overlay().empty()) return;
  IntentMerge m = mergeIntent(withDiscovered(fileConfig_), journal_.overlay(), wallNow(),
                              fileConfig_.policy.drainTimeout);
  for (const std::string& d : m.dropped) report("operator intent: " + d);
  for (const std::string& c : m.conflicts) {
    report("operator intent: dropped, it conflicts with the file: " + c);
  }
  if (!(m.overlay == journal_.overlay())) {
    if (auto e = journal_.rewrite(m.overlay)) {
      report("operator intent: cannot save the pruned overrides: " + *e);
    }
  }
  config_ = std::move(m.config);
  if (auto e = builder_.setConfig(config_)) {
    report("operator intent: the merged configuration cannot be built (" + *e +
           "); running the file alone");
    config_ = withDiscovered(fileConfig_);
    (void)builder_.setConfig(config_);
  }
}

// Puts the backends' states where the overlay says (a drain keeps its age).
// only: one backend's name, else all.
void ControlPlane::applyIntentStates(Millis now, const std::string* only) {
  const std::int64_t wall = wallNow();
  auto age = [&](const IntentStamp& s) -> Millis {
    return wall > s.wallMs ? static_cast<Millis>(wall - s.wallMs) : 0;
  };
  for (const auto& [name, o] : journal_.overlay().backends()) {
    if (only != nullptr && *only != name) continue;
    const BackendConfig* b = backendNamed(name);
    if (b == nullptr) continue;
    const std::string seq = " (journal seq ";
    if (o.removed) {
      (void)states_.remove(b->id, now,
                           "operator: remove" + seq + std::to_string(o.removed->seq) + ")", false,
                           age(*o.removed));
    } else if (o.admin == AdminState::Draining) {
      (void)states_.drain(b->id, now,
                          "operator: drain" + seq + std::to_string(o.adminStamp.seq) + ")",
                          age(o.adminStamp));
    } else if (o.admin == AdminState::Disabled) {
      (void)states_.disable(b->id, now,
                            "operator: disable" + seq + std::to_string(o.adminStamp.seq) + ")");
    } else if (o.admin == AdminState::Enabled) {
      const BackendStatus* st = states_.find(b->id);
      if (st != nullptr && st->admin != AdminState::Enabled) {
        (void)states_.enable(b->id, now,
                             "operator: enable" + seq + std::to_string(o.adminStamp.seq) + ")");
      }
    }
  }
}

std::optional<std::string> ControlPlane::trialBuild(const Config& next) {
  SnapshotBuilder trial = builder_;
  if (auto e = trial.setConfig(next)) return e;
  for (const BackendConfig& b : next.backends) {
    if (auto s = states_.state(b.id)) trial.setState(b.id, *s);
  }
  if (!trial.build(generation_ + 1)) return trial.lastError();
  return std::nullopt;
}

std::optional<ApiError> ControlPlane::precheck(IntentOp op, std::uint64_t id) const {
  const BackendStatus* st = states_.find(id);
  if (st == nullptr) return ApiError{"not_found", "no backend with id " + std::to_string(id)};
  const std::string name = "\"" + st->name + "\"";
  if (st->effective == BackendState::Removed) {
    return ApiError{"conflict", name + " is removed; add it again first"};
  }
  if (op == IntentOp::Drain && st->admin == AdminState::Removing) {
    return ApiError{"conflict", name +
                                    " is being removed (draining already); undrain cancels "
                                    "the removal"};
  }
  if (op == IntentOp::Undrain && st->admin == AdminState::Disabled) {
    return ApiError{"conflict", name + " is disabled, not draining; use enable"};
  }
  return std::nullopt;
}

std::optional<ApiError> ControlPlane::journal(IntentRecord& record) {
  record.wallMs = wallNow();
  if (auto e = journal_.append(record)) {
    events_.append(now_, record.backend, kEventIntent,
                   "operator: " + std::string(toString(record.op)) + " refused: " + *e);
    return ApiError{"unavailable", "not applied: the change could not be saved: " + *e};
  }
  noteTierChange(record);
  return std::nullopt;
}

std::uint32_t ControlPlane::fileBaseWeight(const BackendConfig& b) const {
  if (const BackendOverride* o = journal_.overlay().find(b.name); o && o->added) {
    return o->added->weight;
  }
  for (const BackendConfig& f : fileConfig_.backends) {
    if (f.name == b.name) return f.weight;
  }
  return b.weight;
}

Json ControlPlane::stampJson(const IntentStamp& s) const {
  const std::time_t t = static_cast<std::time_t>(s.wallMs / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &tm);
  char ms[8];
  std::snprintf(ms, sizeof ms, ".%03dZ", static_cast<int>(s.wallMs % 1000));
  return Json{{"source", "runtime"}, {"seq", s.seq}, {"time", std::string(text) + ms}};
}

std::variant<ControlPlane::ApplyPlan, ApiError> ControlPlane::planApply(
    Config file, const IntentOverlay& overlay) {
  ApplyPlan plan;
  IntentMerge m = mergeIntent(withDiscovered(file), overlay, wallNow(), file.policy.drainTimeout);
  if (!m.conflicts.empty()) {
    std::string text;
    for (const std::string& c : m.conflicts) text += (text.empty() ? "" : "; ") + c;
    return ApiError{"conflict", text +
                                    " (keep it out of the file, or clear it first: "
                                    "spillwayctl config clear-overrides --backend NAME)"};
  }
  Config next = std::move(m.config);
  std::erase_if(next.backends, [&](const BackendConfig& b) { return removedAndGone(b.id); });
  for (const BackendConfig& b : config_.backends) {
    const bool named = std::any_of(next.backends.begin(), next.backends.end(),
                                   [&](const BackendConfig& n) { return n.id == b.id; });
    if (named) {
      if (retiring_.count(b.id) != 0) plan.unretire.push_back(b.id);
      continue;
    }
    // Discovered backends stay while their pool keeps its source (the
    // source, not the file, says when they go).
    const bool discoveredStays = discoveryKeeps(b, next);
    const BackendStatus* st = states_.find(b.id);
    if (st == nullptr || st->effective == BackendState::Removed) continue;
    // It drains: keep it in the next configuration until its flows end.
    BackendConfig k = b;
    bool pool = false, port = false, clash = false;
    for (std::uint32_t p = 0; p < next.pools.size(); ++p) {
      if (next.pools[p].name == b.pool) k.poolIndex = p, pool = true;
    }
    for (std::uint32_t p = 0; p < next.ports.size(); ++p) {
      if (next.ports[p].name == b.port) k.portIndex = p, port = true;
    }
    for (const BackendConfig& n : next.backends) {
      clash = clash || n.name == b.name || n.address == b.address;
    }
    if (port) {
      const PortConfig& pc = next.ports[k.portIndex];
      port = (b.address.version == IpVersion::V4 ? pc.address : pc.address6).has_value();
    }
    if (!pool || !port || clash) {
      plan.retireNow.push_back(b.name);
      continue;
    }
    next.backends.push_back(k);
    if (st->admin != AdminState::Removing && !discoveredStays) plan.retire.push_back(b.id);
  }
  if (auto e = trialBuild(next)) {
    return ApiError{"invalid", "the new configuration cannot be built: " + *e};
  }
  plan.file = std::move(file);
  plan.next = std::move(next);
  plan.overlay = std::move(m.overlay);
  plan.dropped = std::move(m.dropped);
  return plan;
}

namespace {

std::string vipKey(const VipConfig& v) {
  return formatIpAddress(v.address) + "/" + (v.protocol == IpProto::Udp ? "udp" : "tcp") + "/" +
         std::to_string(v.port);
}

}  // namespace

std::optional<ApiError> ControlPlane::commitApply(ApplyPlan& plan, const std::string& cause,
                                                  Json& changes) {
  // The fallible steps first; nothing has changed while any can still fail.
  std::set<std::string> vipsBefore, vipsAfter;
  for (const VipConfig& v : config_.vips) vipsBefore.insert(vipKey(v));
  for (const VipConfig& v : plan.next.vips) vipsAfter.insert(vipKey(v));
  const bool vipsChange = vipsBefore != vipsAfter;
  if (vipsChange && dataplane_ != nullptr) {
    if (auto e = dataplane_->syncVips(vipKeysOf(plan.next))) {
      return ApiError{"unavailable", "the data path's VIP map cannot follow: " + *e};
    }
  }
  if (!(plan.overlay == journal_.overlay())) {
    if (auto e = journal_.rewrite(plan.overlay)) {
      if (vipsChange && dataplane_ != nullptr) (void)dataplane_->syncVips(vipKeysOf(config_));
      return ApiError{"unavailable", "the pruned operator overrides cannot be saved: " + *e};
    }
  }

  Json added = Json::array(), draining = Json::array(), removed = Json::array(),
       weights = Json::array(), vipsAdded = Json::array(), vipsRemoved = Json::array();
  for (const BackendConfig& n : plan.next.backends) {
    const BackendConfig* old = nullptr;
    for (const BackendConfig& o : config_.backends) {
      if (o.id == n.id) old = &o;
    }
    if (old == nullptr) {
      added.push_back(n.name);
    } else if (old->weight != n.weight) {
      weights.push_back({{"backend", n.name}, {"from", old->weight}, {"to", n.weight}});
    }
  }
  for (std::uint64_t id : plan.retire) {
    for (const BackendConfig& b : config_.backends) {
      if (b.id == id) draining.push_back(b.name);
    }
  }
  for (const std::string& n : plan.retireNow) removed.push_back(n);
  for (const VipConfig& v : plan.next.vips) {
    if (vipsBefore.count(vipKey(v)) == 0) vipsAdded.push_back(v.name);
  }
  for (const VipConfig& v : config_.vips) {
    if (vipsAfter.count(vipKey(v)) == 0) vipsRemoved.push_back(v.name);
  }
  changes = Json{{"backends_added", added},
                 {"backends_draining", draining},
                 {"backends_removed", removed},
                 {"weights_changed", weights},
                 {"vips_added", vipsAdded},
                 {"vips_removed", vipsRemoved},
                 {"overrides_kept", journal_.overlay().backends().size()},
                 {"overrides_dropped", plan.dropped}};

  plan.next.control.stateDir = config_.control.stateDir;  // the journal stays where it is
  plan.next.control.user = config_.control.user;          // privileges are dropped once
  fileConfig_ = std::move(plan.file);
  reconfigure(std::move(plan.next), now_, cause);
  for (std::uint64_t id : plan.retire) {
    (void)states_.remove(id, now_, cause + ": no longer in the file");
    retiring_.insert(id);
  }
  for (std::uint64_t id : plan.unretire) {
    (void)states_.undrain(id, now_, cause + ": in the file again");
    retiring_.erase(id);
  }
  for (const std::string& d : plan.dropped) {
    events_.append(now_, "", kEventIntent, "override dropped: " + d);
  }
  if (!draining.empty() || !removed.empty() || !plan.unretire.empty()) {
    for (const BackendConfig& b : config_.backends) {
      if (auto s = states_.state(b.id)) builder_.setState(b.id, *s);
    }
    statesSeen_ = states_.generation();
    (void)applyPolicy(now_, true);
  }
  return std::nullopt;
}

ApiResult ControlPlane::configClearOverrides(const std::string& backend) {
  if (!backend.empty() && journal_.overlay().find(backend) == nullptr) {
    return ApiError{"not_found", "backend '" + backend + "' has no runtime override"};
  }
  IntentOverlay after = journal_.overlay();
  std::vector<std::string> cleared;
  if (backend.empty()) {
    for (const auto& [name, o] : after.backends()) cleared.push_back(name);
    after = IntentOverlay{};
  } else {
    after.erase(backend);
    cleared.push_back(backend);
  }
  auto planned = planApply(fileConfig_, after);
  if (auto* e = std::get_if<ApiError>(&planned)) return *e;
  ApplyPlan& plan = std::get<ApplyPlan>(planned);
  IntentRecord r;
  r.op = IntentOp::ClearOverrides;
  r.backend = backend;
  if (auto e = journal(r)) return *e;
  Json changes;
  if (auto e = commitApply(plan, "operator: clear-overrides", changes)) return *e;
  // Cleared backends that stay get the file's state back.
  for (const std::string& name : cleared) {
    const BackendConfig* b = backendNamed(name);
    if (b == nullptr || retiring_.count(b->id) != 0) continue;
    const BackendStatus* st = states_.find(b->id);
    if (st == nullptr || st->effective == BackendState::Removed) continue;
    const bool fileDisabled = b->initialState == BackendState::Disabled;
    if (fileDisabled && st->admin != AdminState::Disabled) {
      (void)states_.disable(b->id, now_, "operator: clear-overrides (the file says disabled)");
    } else if (!fileDisabled && st->admin != AdminState::Enabled) {
      (void)states_.enable(b->id, now_, "operator: clear-overrides");
    }
  }
  refreshOperatorRemoved();
  lastChurn_ = 0;
  return Json{{"cleared", cleared}, {"intent_seq", r.seq}, {"changes", changes}};
}

}  // namespace spillway
