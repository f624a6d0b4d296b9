// Discovery in the plane (control_plane.hpp, "Discovery"): sources per pool,
// their answers reconciled with the running configuration with the checks
// and paths of `backend add` and `backend remove`, and their views.
#include <algorithm>

#include "control/api/metrics_http.hpp"
#include "control/plane/control_plane.hpp"
#include "control/plane/control_plane_json.hpp"

namespace spillway {

using plane_json::ipJson;

namespace {

constexpr std::size_t kInvalidKept = 20;  // reasons kept per source for `discovery`

// A discovered endpoint as a backend of the pool at poolIndex (its port is
// chosen by the caller).
BackendConfig backendOf(std::uint64_t id, const DiscoveredBackend& d, const std::string& pool,
                        std::uint32_t poolIndex) {
  BackendConfig b;
  b.name = d.name;
  b.id = id;
  b.address = d.address;
  b.weight = d.weight;
  b.mac = d.mac;
  b.metricsPort = d.metricsPort;
  b.metricsPath = d.metricsPath;
  b.pool = pool;
  b.poolIndex = poolIndex;
  return b;
}

}  // namespace

void ControlPlane::syncDiscoverySources() {
  std::vector<DiscoverySource> next;
  for (const PoolConfig& p : config_.pools) {
    if (p.discovery.kind == DiscoveryKind::None) continue;
    auto same = std::find_if(discovery_.begin(), discovery_.end(), [&](const DiscoverySource& s) {
      return s.pool == p.name && s.feed->config() == p.discovery;
    });
    if (same != discovery_.end()) {
      next.push_back(std::move(*same));
      continue;
    }
    DiscoverySource s;
    s.pool = p.name;
    s.feed = makeDiscoveryFeed(p.discovery);
    s.membership.setHold(p.discovery.hold);
    // A source that replaces one of the same pool keeps what it wanted, so
    // its backends do not drain while the new one reads its first answer.
    auto old = std::find_if(discovery_.begin(), discovery_.end(),
                            [&](const DiscoverySource& o) { return o.pool == p.name; });
    if (old != discovery_.end())
      s.membership = old->membership, s.membership.setHold(p.discovery.hold);
    next.push_back(std::move(s));
  }
  discovery_ = std::move(next);
}

bool ControlPlane::discoveryKeeps(const BackendConfig& b, const Config& next) const {
  auto it = discovered_.find(b.id);
  if (it == discovered_.end()) return false;
  return std::any_of(next.pools.begin(), next.pools.end(), [&](const PoolConfig& p) {
    return p.name == it->second && p.discovery.kind != DiscoveryKind::None;
  });
}

Config ControlPlane::withDiscovered(const Config& file) const {
  Config out = file;
  for (const BackendConfig& b : config_.backends) {
    if (!discoveryKeeps(b, file)) continue;
    const bool clash = std::any_of(file.backends.begin(), file.backends.end(), [&](const auto& f) {
      return f.id == b.id || f.name == b.name || f.address == b.address;
    });
    if (clash) continue;  // the file now defines it: the file's definition wins
    BackendConfig k = b;
    bool port = false;
    for (std::uint32_t p = 0; p < out.pools.size(); ++p) {
      if (out.pools[p].name == b.pool) k.poolIndex = p;
    }
    for (std::uint32_t p = 0; p < out.ports.size(); ++p) {
      if (out.ports[p].name == b.port) k.portIndex = p, port = true;
    }
    if (port) out.backends.push_back(k);
  }
  // Those the operator removed and whose removal completed: still defined by
  // their source, so the overlay's removal is kept (planApply takes them
  // out of the merged configuration again).
  for (const DiscoverySource& src : discovery_) {
    std::optional<std::uint32_t> poolIndex;
    for (std::uint32_t p = 0; p < out.pools.size(); ++p) {
      if (out.pools[p].name == src.pool && out.pools[p].discovery.kind != DiscoveryKind::None) {
        poolIndex = p;
      }
    }
    if (!poolIndex) continue;
    for (const auto& entry : src.membership.wanted()) {
      const auto& [id, d] = entry;
      if (operatorRemoved_.count(id) == 0) continue;
      // Lambdas capture the pair, not its bindings (clang refuses those).
      const bool clash = std::any_of(out.backends.begin(), out.backends.end(), [&](const auto& f) {
        return f.id == entry.first || f.name == entry.second.name ||
               f.address == entry.second.address;
      });
      if (clash) continue;
      BackendConfig k = backendOf(id, d, src.pool, *poolIndex);
      for (std::uint32_t p = 0; p < out.ports.size(); ++p) {
        if (out.ports[p].role != PortRole::Client && k.port.empty()) {
          k.port = out.ports[p].name;
          k.portIndex = p;
        }
      }
      if (!k.port.empty()) out.backends.push_back(k);
    }
  }
  return out;
}

bool ControlPlane::removedAndGone(std::uint64_t id) const {
  return operatorRemoved_.count(id) != 0 &&
         std::none_of(config_.backends.begin(), config_.backends.end(),
                      [&](const BackendConfig& b) { return b.id == id; });
}

void ControlPlane::refreshOperatorRemoved() {
  const std::set<std::uint64_t> before = operatorRemoved_;
  for (const DiscoverySource& s : discovery_) {
    for (const auto& [id, d] : s.membership.wanted()) {
      const BackendOverride* o = journal_.overlay().find(d.name);
      if (o != nullptr && o->removed) {
        operatorRemoved_.insert(id);
      } else {
        operatorRemoved_.erase(id);
      }
    }
  }
  if (operatorRemoved_ != before) {
    for (DiscoverySource& s : discovery_) s.reconciled = ~0ULL;  // reconcile at the next tick
  }
}

std::variant<BackendConfig, std::string> ControlPlane::discoveredBackendFor(
    const Config& next, const std::string& poolName, const DiscoveredBackend& d) const {
  const std::string at = d.name + " (" + formatIpAddress(d.address) + ")";
  std::uint32_t poolIndex = 0;
  const PoolConfig* pool = nullptr;
  for (std::uint32_t p = 0; p < next.pools.size(); ++p) {
    if (next.pools[p].name == poolName) pool = &next.pools[p], poolIndex = p;
  }
  if (pool == nullptr) return at + ": pool " + poolName + " is not configured";
  if (auto bad = backendAddressProblem(next, d.address)) return at + ": " + *bad;
  if (d.encap && *d.encap != pool->encap) {
    return at + ": encap " + std::string(toString(*d.encap)) + " is not pool " + poolName + "'s " +
           std::string(toString(pool->encap)) + " (the encapsulation is the pool's)";
  }
  for (const BackendConfig& o : next.backends) {
    if (o.id == d.id) return at + ": the id is taken by " + o.name;
    if (o.address == d.address) return at + ": address belongs to " + o.name;
    if (o.name == d.name) {
      return at + ": the name is taken by a backend at " + formatIpAddress(o.address);
    }
  }
  BackendConfig b = backendOf(d.id, d, poolName, poolIndex);
  bool portFound = false;
  for (std::uint32_t p = 0; p < next.ports.size() && !portFound; ++p) {
    if (next.ports[p].role == PortRole::Client) continue;
    b.port = next.ports[p].name;
    b.portIndex = p;
    portFound = true;
  }
  if (!portFound) return at + ": no port reaches backends";
  const PortConfig& port = next.ports[b.portIndex];
  if ((b.address.version == IpVersion::V4 ? port.address : port.address6) == std::nullopt) {
    return at + ": port " + port.name + " has no tunnel source address for IPv" +
           (b.address.version == IpVersion::V4 ? "4" : "6");
  }
  return b;
}

void ControlPlane::primeDiscovery(Millis now) {
  syncDiscoverySources();
  static const std::vector<DiscoveredRecord> kNone;
  const std::optional<TablesState>& savedTables = keeper_.savedTables(now, unixNow());
  const std::vector<DiscoveredRecord>& saved = savedTables ? savedTables->discovered : kNone;
  for (DiscoverySource& s : discovery_) {
    // What the last process had in its tables: wanted as if listed just
    // before the first answer.
    std::vector<DiscoveredBackend> before;
    for (const DiscoveredRecord& r : saved) {
      if (r.pool == s.pool && !r.leavingSinceUnixMs) before.push_back(r.backend);
    }
    if (!before.empty()) s.membership.update(before, now);
    DiscoveryRefresh r = s.feed->prime(now);
    s.lastRefresh = now;
    ++s.refreshes;
    if (r.error) {
      ++s.errors;
      s.lastError = r.error;
      report("discovery: pool " + s.pool + ": " + *r.error);
      if (!before.empty()) {
        report("discovery: pool " + s.pool + ": starting from the " +
               std::to_string(before.size()) +
               " backend(s) it had before the restart until its source answers");
        reconcileDiscovery(s, now, true);
      }
      restoreLeavingDiscovered(s, saved);
      continue;
    }
    s.invalid += r.invalid.size();
    s.lastInvalid = std::move(r.invalid);
    if (s.lastInvalid.size() > kInvalidKept) s.lastInvalid.resize(kInvalidKept);
    if (!s.lastInvalid.empty()) {
      events_.append(now, "", kEventDiscovery,
                     "pool " + s.pool + ": " + std::to_string(s.lastInvalid.size()) +
                         " entries left out, first: " + s.lastInvalid.front());
    }
    s.membership.update(s.feed->backends(), now);
    reconcileDiscovery(s, now, true);
    report("discovery: pool " + s.pool + ": " + std::to_string(s.joined) + " backend(s) from " +
           s.feed->origin());
    restoreLeavingDiscovered(s, saved);
  }
}

void ControlPlane::restoreLeavingDiscovered(const DiscoverySource& s,
                                            const std::vector<DiscoveredRecord>& saved) {
  Config next = config_;
  std::vector<RestoredLeaving> restored;
  std::vector<std::string> refused;
  const std::uint64_t wall = unixNow();
  for (const DiscoveredRecord& r : saved) {
    if (r.pool != s.pool || !r.leavingSinceUnixMs) continue;
    if (s.membership.wanted().count(r.backend.id) != 0) continue;  // listed again: joined
    auto made = discoveredBackendFor(next, s.pool, r.backend);
    if (auto* bad = std::get_if<std::string>(&made)) {
      refused.push_back(std::move(*bad));
      continue;
    }
    next.backends.push_back(std::get<BackendConfig>(made));
    const std::uint64_t since = std::min(*r.leavingSinceUnixMs, wall);
    restored.push_back({r.backend.id, s.pool, static_cast<Millis>(wall - since)});
  }
  if (!restored.empty()) {
    std::optional<std::string> problem = builder_.admits(next);
    if (!problem) {
      if (auto t = trialBuild(next)) problem = "cannot be built into the tables: " + *t;
    }
    if (problem) {
      refused.push_back(std::to_string(restored.size()) +
                        " backend(s) in their drain: " + *problem);
      restored.clear();
    } else {
      config_ = std::move(next);
      (void)builder_.setConfig(config_);
      for (const RestoredLeaving& l : restored) {
        discovered_[l.id] = s.pool;
        discoveredLeaving_[l.id] = wall - static_cast<std::uint64_t>(l.elapsed);
        restoredLeaving_.push_back(l);
      }
      report("discovery: pool " + s.pool + ": " + std::to_string(restored.size()) +
             " backend(s) its source had stopped listing drain on after the restart");
    }
  }
  for (const std::string& why : refused) {
    report("discovery: pool " + s.pool + ": not restored in its drain (its flows end): " + why);
  }
}

void ControlPlane::applyRestoredLeaving(Millis now) {
  for (const RestoredLeaving& l : restoredLeaving_) {
    const BackendStatus* st = states_.find(l.id);
    if (st == nullptr || st->admin == AdminState::Removing) continue;
    (void)states_.remove(l.id, now,
                         "discovery: pool " + l.pool +
                             "'s source no longer lists it (drain restored after a restart)",
                         false, l.elapsed);
  }
  restoredLeaving_.clear();
}

std::string ControlPlane::originOf(const BackendConfig& b) const {
  if (auto it = discovered_.find(b.id); it != discovered_.end()) {
    return "discovered:" + it->second;
  }
  const bool inFile = std::any_of(fileConfig_.backends.begin(), fileConfig_.backends.end(),
                                  [&](const BackendConfig& f) { return f.id == b.id; });
  return inFile ? "file" : "runtime";
}

void ControlPlane::tickDiscovery(Millis now, const std::vector<std::uint64_t>& gone) {
  bool removalsCompleted = false;
  for (std::uint64_t id : gone) {
    removalsCompleted = discovered_.erase(id) != 0 || removalsCompleted;
    discoveredLeaving_.erase(id);
  }
  for (DiscoverySource& s : discovery_) {
    DiscoveryRefresh r = s.feed->poll(now);
    if (r.read) {
      s.lastRefresh = now;
      ++s.refreshes;
      if (r.error) {
        ++s.errors;
        if (s.lastError != r.error) {
          events_.append(now, "", kEventDiscovery,
                         "pool " + s.pool + ": answer refused: " + *r.error);
        }
        s.lastError = r.error;
      } else {
        if (s.lastError) {
          events_.append(now, "", kEventDiscovery, "pool " + s.pool + ": the source reads again");
        }
        s.lastError.reset();
        s.invalid += r.invalid.size();
        if (r.invalid.size() > kInvalidKept) r.invalid.resize(kInvalidKept);
        // The same entries left out again (a DNS source asks every TTL): counted
        // each time, said once.
        const bool again = !r.invalid.empty() && s.lastInvalid.size() >= r.invalid.size() &&
                           std::equal(r.invalid.begin(), r.invalid.end(), s.lastInvalid.begin());
        s.lastInvalid = std::move(r.invalid);
        if (!s.lastInvalid.empty() && !again) {
          events_.append(now, "", kEventDiscovery,
                         "pool " + s.pool + ": " + std::to_string(s.lastInvalid.size()) +
                             " entries left out, first: " + s.lastInvalid.front());
        }
        s.membership.update(s.feed->backends(), now);
      }
    }
    (void)s.membership.expire(now);
    if (s.membership.generation() != s.reconciled || removalsCompleted) reconcileDiscovery(s, now);
  }
}

void ControlPlane::reconcileDiscovery(DiscoverySource& s, Millis now, bool starting) {
  s.reconciled = s.membership.generation();
  const auto& wanted = s.membership.wanted();
  std::erase_if(operatorRemoved_, [&](std::uint64_t id) {
    return discovered_.count(id) == 0 && wanted.count(id) == 0;
  });
  const PoolConfig* pool = nullptr;
  for (const PoolConfig& p : config_.pools) {
    if (p.name == s.pool) pool = &p;
  }
  if (pool == nullptr) return;
  const std::uint32_t cap = pool->discovery.maxPoolBackends;

  // Leaves: discovered here, no longer wanted: drain like `backend remove`.
  std::vector<std::string> left;
  for (const auto& [id, source] : discovered_) {
    if (source != s.pool || wanted.count(id) != 0) continue;
    const BackendStatus* st = states_.find(id);
    if (st == nullptr || st->effective == BackendState::Removed ||
        st->admin == AdminState::Removing) {
      continue;
    }
    const BackendConfig* b = nullptr;
    for (const BackendConfig& c : config_.backends) {
      if (c.id == id) b = &c;
    }
    (void)states_.remove(id, now,
                         "discovery: pool " + s.pool + "'s source no longer lists it (absent for " +
                             std::to_string(pool->discovery.hold) + " ms)");
    discoveredLeaving_.emplace(id, unixNow());
    left.push_back(b != nullptr ? b->name : std::to_string(id));
    ++s.left;
  }

  // Joins: wanted, not in the configuration: the checks of `backend add`.
  Config next = config_;
  std::uint32_t inPool = static_cast<std::uint32_t>(
      std::count_if(next.backends.begin(), next.backends.end(),
                    [&](const BackendConfig& b) { return b.pool == s.pool; }));
  std::vector<std::string> invalid;
  std::vector<std::string> joined;
  std::vector<std::uint64_t> joinedIds;
  std::size_t overCap = 0;
  for (const auto& [id, d] : wanted) {
    const std::uint64_t wantedId = id;
    const bool present = std::any_of(next.backends.begin(), next.backends.end(),
                                     [&](const BackendConfig& b) { return b.id == wantedId; });
    if (present || operatorRemoved_.count(id) != 0) continue;
    auto made = discoveredBackendFor(next, s.pool, d);
    if (auto* bad = std::get_if<std::string>(&made)) {
      invalid.push_back(std::move(*bad));
      continue;
    }
    const BackendConfig& b = std::get<BackendConfig>(made);
    if (inPool >= cap) {
      ++overCap;
      continue;
    }
    ++inPool;
    next.backends.push_back(b);
    joined.push_back(b.name);
    joinedIds.push_back(b.id);
  }
  if (overCap != 0) {
    invalid.push_back(std::to_string(overCap) + " left out: pool " + s.pool +
                      " is at max_pool_backends = " + std::to_string(cap));
  }
  if (!joined.empty()) {
    std::optional<std::string> refused;
    if (auto e = builder_.admits(next)) {
      refused = *e;
    } else if (auto t = trialBuild(next)) {
      refused = "cannot be built into the tables: " + *t;
    }
    if (refused) {
      invalid.push_back(std::to_string(joined.size()) + " new backends refused: " + *refused);
      joined.clear();
    } else {
      for (std::uint64_t id : joinedIds) discovered_[id] = s.pool;
      if (starting) {  // the constructor adds every backend of config_ to the states
        config_ = std::move(next);
        (void)builder_.setConfig(config_);
      } else {
        reconfigure(std::move(next), now, "discovered by pool " + s.pool + "'s source");
      }
      s.joined += joined.size();
    }
  }
  if (!invalid.empty()) {
    s.invalid += invalid.size();
    events_.append(now, "", kEventDiscovery,
                   "pool " + s.pool + ": " + std::to_string(invalid.size()) +
                       " entries not applied, first: " + invalid.front());
    for (std::string& i : invalid) {
      if (s.lastInvalid.size() < kInvalidKept) s.lastInvalid.push_back(std::move(i));
    }
  }
  if (!joined.empty() || !left.empty()) {
    std::string text;
    for (const std::string& n : joined) text += (text.empty() ? "+" : ", +") + n;
    for (const std::string& n : left) text += (text.empty() ? "-" : ", -") + n + " (drains)";
    s.lastChange = now;
    s.lastChangeText = text;
    events_.append(now, "", kEventDiscovery, "pool " + s.pool + ": " + text);
  }
}

ApiResult ControlPlane::discovery() {
  Json sources = Json::array();
  for (const DiscoverySource& s : discovery_) {
    Json j = s.feed->describe(now_);
    j.update(Json{{"pool", s.pool},
                  {"hold_ms", s.feed->config().hold},
                  {"refreshes", s.refreshes},
                  {"errors", s.errors},
                  {"invalid", s.invalid},
                  {"joined", s.joined},
                  {"left", s.left},
                  {"damped", s.membership.damped()}});
    j["last_refresh_ms_ago"] = s.lastRefresh ? Json(now_ - *s.lastRefresh) : Json(nullptr);
    j["last_error"] = s.lastError ? Json(*s.lastError) : Json(nullptr);
    j["last_invalid"] = s.lastInvalid;
    j["last_change_ms_ago"] = s.lastChange ? Json(now_ - *s.lastChange) : Json(nullptr);
    j["last_change"] = s.lastChangeText;
    Json entries = Json::array();
    for (const auto& [id, d] : s.membership.wanted()) {
      Json e{{"name", d.name}, {"id", id}, {"address", ipJson(d.address)}, {"weight", d.weight}};
      e["listed"] = s.membership.listed(id);
      e["in_config"] = discovered_.count(id) != 0;
      e["operator_removed"] = operatorRemoved_.count(id) != 0;
      entries.push_back(e);
    }
    j["entries"] = entries;
    sources.push_back(j);
  }
  return Json{{"sources", sources}};
}

void ControlPlane::discoveryMetrics(MetricsWriter& m) const {
  for (const DiscoverySource& s : discovery_) {
    const auto c = [&](const char* name, const char* help, std::uint64_t v) {
      m.counter(name, help, {{"pool", s.pool}}, static_cast<double>(v));
    };
    c("spillway_discovery_refreshes_total", "Answers read from the pool's discovery source.",
      s.refreshes);
    c("spillway_discovery_errors_total",
      "Answers refused (malformed, too large, missing); the last good set stayed.", s.errors);
    c("spillway_discovery_invalid_total",
      "Entries left out (invalid, duplicate, over a cap, refused as a backend).", s.invalid);
    c("spillway_discovery_joined_total", "Backends added from the source.", s.joined);
    c("spillway_discovery_left_total",
      "Discovered backends drained because the source stopped listing them.", s.left);
    c("spillway_discovery_damped_total", "Absences that ended within the hold (nothing moved).",
      s.membership.damped());
    m.gauge("spillway_discovery_entries", "Backends the source wants (listed or in hold).",
            {{"pool", s.pool}}, static_cast<double>(s.membership.wanted().size()));
    m.gauge("spillway_discovery_failing", "1 while the source's last answer was refused.",
            {{"pool", s.pool}}, s.lastError ? 1.0 : 0.0);
  }
}

}  // namespace spillway
