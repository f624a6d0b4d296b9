#include "control/plane/control_plane.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <optional>
#include <set>

#include "control/api/config_access.hpp"
#include "control/api/metrics_http.hpp"
#include "control/backends/table_digest.hpp"
#include "control/intent/intent_merge.hpp"
#include "control/plane/stats_view.hpp"

namespace spillway {
namespace {

constexpr Millis kFlowCountPeriod = 1000;
// The longest the start-up tables are held waiting for health and load data.
constexpr Millis kWarmupLimit = 15'000;

ApiError notFound(const std::string& what, const std::string& name) {
  return ApiError{"not_found", "no " + what + " named '" + name + "'"};
}

std::string stateName(BackendState s) {
  return std::string(toString(s));
}

Json ipJson(const IpAddress& a) {
  return formatIpAddress(a);
}

std::string protocolName(IpProto p) {
  return p == IpProto::Udp ? "udp" : "tcp";
}

Json checkpointStatsJson(const AffinityKeeper& keeper, Millis now) {
  if (!keeper.enabled()) return Json{{"enabled", false}};
  const CheckpointStats& c = keeper.stats();
  return Json{{"enabled", true},
              {"checkpoints", c.checkpoints},
              {"failures", c.failures},
              {"last_ms", c.lastAt ? Json(*c.lastAt) : Json(nullptr)},
              {"age_ms", c.lastAt ? Json(now - *c.lastAt) : Json(nullptr)},
              {"generation", c.lastGeneration},
              {"exceptions", c.lastExceptions},
              {"bytes", c.lastBytes},
              {"duration_ms", c.lastDurationMs},
              {"write_ms", c.lastWriteMs},
              {"last_error", c.lastError},
              {"restored_at_start", c.restoredAtStart},
              {"restored_alive", c.restoredAlive}};
}

Json scrapeJson(const LoadStatus& s) {
  return Json{{"scrapes", s.scrapes},
              {"failures", s.failures},
              {"out_of_range", {{"gpu", s.gpuOutOfRange}, {"queue", s.queueOutOfRange}}},
              {"last_error", s.lastError}};
}

}  // namespace

ControlPlane::ControlPlane(Config config, std::string configPath, SnapshotBuilder& builder,
                           Dataplane* dataplane, Millis now,
                           std::function<std::int64_t()> wallClockMs)
    : config_(std::move(config)),
      fileConfig_(config_),
      configPath_(std::move(configPath)),
      builder_(builder),
      dataplane_(dataplane),
      started_(now),
      now_(now),
      events_(config_.control.eventLogSize),
      states_(events_, config_.policy.drainTimeout),
      policy_(config_.policy),
      wallClock_(std::move(wallClockMs)),
      journal_(config_.control.stateDir),
      keeper_(
          AffinityKeeper::Options{
              .stateDir = config_.control.stateDir,
              .hashSeed = config_.dataplane.hashSeed,
              .timeouts = config_.dataplane.timeouts,
              .exportInterval = config_.tier.peers.empty() ? 0 : config_.tier.syncInterval,
              .onExport =
                  [this](std::span<const FlowExceptionRecord> r) {
                    if (peers_) peers_->publishLocal(r);
                  }},
          events_),
      byteRates_(config_.placement.rateSmoothing) {
  if (!wallClock_) {
    wallClock_ = [] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
          .count();
    };
  }
  replayIntent(now);
  for (const BackendConfig& b : config_.backends) {
    (void)states_.add(
        b.id, b.name, now, "configured",
        b.initialState == BackendState::Disabled ? AdminState::Disabled : AdminState::Enabled);
  }
  applyIntentStates(now, nullptr);
  applyTargets();
  for (const BackendConfig& b : config_.backends) {
    if (auto s = states_.state(b.id)) builder_.setState(b.id, *s);
  }
  statesSeen_ = states_.generation();
  (void)applyPolicy(now, true);
  restoreAffinity(now);
  lastChurn_ = now;
  startPeers();
}

std::uint64_t ControlPlane::unixNow() const {
  const std::int64_t ms = wallNow();
  return ms > 0 ? static_cast<std::uint64_t>(ms) : 0;
}

void ControlPlane::restoreAffinity(Millis now) {
  const std::optional<TablesState> tables = keeper_.restore(now, unixNow());
  if (keeper_.takeRestoredChanged()) {
    refreshExceptions();
  }
  if (!tables) return;
  // Next hops the kernel does not know yet (starting an af_packet port
  // flushes its neighbour table) start from the last ones resolved; the
  // resolver replaces any that changed.
  std::size_t macs = 0;
  for (const BackendConfig& b : config_.backends) {
    auto saved = tables->nextHops.find(b.id);
    const BackendRuntime* rt = builder_.runtime(b.id);
    if (saved != tables->nextHops.end() && rt != nullptr && !rt->nextHopMac &&
        builder_.setNextHopMac(b.id, saved->second)) {
      ++macs;
    }
  }
  if (macs > 0) {
    events_.append(now, "", kEventWarmup,
                   std::to_string(macs) + " next hop(s) start from the last resolved MAC");
    dirty_ = true;
  }
  // A VIP's restored weights are used only when they name exactly its
  // current backends (the journal replayed, the file unchanged); otherwise
  // its first table follows the policy.
  std::size_t held = 0;
  for (const VipConfig& vip : config_.vips) {
    auto it = tables->weights.find(vip.name);
    if (it == tables->weights.end()) continue;
    std::set<std::uint64_t> members;
    for (const BackendConfig& b : config_.backends) {
      if (std::find(vip.poolIndices.begin(), vip.poolIndices.end(), b.poolIndex) !=
          vip.poolIndices.end()) {
        members.insert(b.id);
      }
    }
    std::set<std::uint64_t> saved;
    for (const auto& [id, w] : it->second) saved.insert(id);
    if (saved != members) {
      events_.append(now, "", kEventWarmup,
                     "vip " + vip.name +
                         ": the saved tables name other backends than the "
                         "configuration; its first table follows the policy");
      continue;
    }
    weights_[vip.name] = it->second;
    builder_.setVipWeights(vip.name, it->second);
    ++held;
  }
  for (const std::uint64_t id : tables->saturated) policy_.restoreSaturated(id);
  if (held > 0) {
    warmup_ = true;
    warmupStarted_ = now;
    events_.append(now, "", kEventWarmup,
                   "holding the last published tables of " + std::to_string(held) +
                       " VIP(s) (generation " + std::to_string(tables->generation) +
                       ") until health and load are known");
  }
}

bool ControlPlane::warmupComplete() const {
  for (const BackendConfig& b : config_.backends) {
    const PoolConfig& pool = config_.pools[b.poolIndex];
    if (pool.health.kind != HealthCheckKind::None) {
      // A settled verdict: rise successes, or fall failures (or already down).
      auto h = health_.status(b.id);
      if (!h || !(h->consecutiveOk >= pool.health.rise || h->consecutiveFail >= pool.health.fall ||
                  !h->up)) {
        return false;
      }
    }
    if (pool.load.enabled) {
      auto l = scraper_.status(b.id);
      if (!l || !l->lastSuccess) return false;  // a sample, not only attempts
    }
  }
  return true;
}

bool ControlPlane::announceReady(Millis now) const {
  return !warmup_ && (warmupComplete() || now >= started_ + kWarmupLimit) && peersReady(now);
}

TablesState ControlPlane::tablesState() const {
  TablesState t;
  t.generation = generation_;
  for (const auto& [vip, w] : weights_) t.weights[vip] = w;
  for (const BackendConfig& b : config_.backends) {
    if (policy_.saturated(b.id)) t.saturated.push_back(b.id);
    if (const BackendRuntime* rt = builder_.runtime(b.id); rt != nullptr && rt->nextHopMac) {
      t.nextHops[b.id] = *rt->nextHopMac;
    }
  }
  return t;
}

void ControlPlane::finalCheckpoint(Millis now, std::vector<ExportedFlow> flows) {
  keeper_.finalCheckpoint(now, unixNow(), std::move(flows), publishedTables_,
                          [&](std::uint32_t index) { return builder_.idAt(index); });
}

void ControlPlane::applyTargets() {
  std::vector<HealthTarget> checks;
  std::vector<ScrapeTarget> scrapes;
  for (const BackendConfig& b : config_.backends) {
    const PoolConfig& pool = config_.pools[b.poolIndex];
    HealthTarget h;
    h.id = b.id;
    h.name = b.name;
    h.address = b.address;
    h.config = pool.health;
    if (pool.health.kind == HealthCheckKind::Encap) {
      // Probe through the tunnel to the first VIP that lists this pool.
      const PortConfig& port = config_.ports[b.portIndex];
      const auto& source = b.address.version == IpVersion::V4 ? port.address : port.address6;
      for (const VipConfig& v : config_.vips) {
        const bool serves = std::find(v.poolIndices.begin(), v.poolIndices.end(), b.poolIndex) !=
                            v.poolIndices.end();
        if (!serves || !source) continue;
        EncapProbeTarget e;
        e.vip = v.address;
        e.vipPort = v.port != 0 ? v.port : pool.health.port;
        e.tunnelSource = *source;
        e.kind = encapKindFor(pool.encap, b.address.version);
        e.guePort = pool.guePort;
        h.encap = e;
        break;
      }
      if (!h.encap) h.config.kind = HealthCheckKind::None;
    }
    checks.push_back(h);
    scrapes.push_back(ScrapeTarget{b.id, b.name, b.address, pool.load});
  }
  health_.setTargets(std::move(checks));
  scraper_.setTargets(std::move(scrapes));
}

std::vector<int> ControlPlane::pollFds() const {
  std::vector<int> fds;
  if (peers_ && peers_->pollFd() >= 0) fds.push_back(peers_->pollFd());
  if (health_.pollFd() >= 0) fds.push_back(health_.pollFd());
  if (scraper_.pollFd() >= 0) fds.push_back(scraper_.pollFd());
  return fds;
}

const BackendConfig* ControlPlane::backendNamed(const std::string& name) const {
  for (const BackendConfig& b : config_.backends) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

PolicyInput ControlPlane::policyInput(
    const VipConfig& vip, Millis now,
    const std::map<std::uint64_t, std::uint32_t>* baseOverride) const {
  PolicyInput in;
  std::map<std::uint32_t, std::uint32_t> poolPosition;
  for (std::uint32_t p : vip.poolIndices) {
    poolPosition[p] = static_cast<std::uint32_t>(in.pools.size());
    const PoolConfig& pool = config_.pools[p];
    in.pools.push_back(PolicyPool{pool.name, pool.priority, pool.site});
  }
  for (const BackendConfig& b : config_.backends) {
    auto pos = poolPosition.find(b.poolIndex);
    if (pos == poolPosition.end()) continue;
    PolicyBackend pb;
    pb.id = b.id;
    pb.name = b.name;
    pb.pool = pos->second;
    pb.weight = b.weight;
    if (baseOverride != nullptr) {
      auto o = baseOverride->find(b.id);
      if (o != baseOverride->end()) pb.weight = o->second;
    }
    pb.state = states_.state(b.id).value_or(BackendState::Removed);
    const ScrapedLoad load = scraper_.load(b.id, now);
    pb.load = BackendLoad{load.gpuUtilization, load.queueDepth};
    if (auto h = health_.status(b.id); h && h->rtt) pb.latencyMs = h->rtt->scoreMs();
    in.backends.push_back(pb);
  }
  in.vip = vip.name;
  // Windows on Unix time, so the instances of a tier count the same ones.
  in.latencyWindow = unixNow() / static_cast<std::uint64_t>(config_.policy.latencyWindow);
  return in;
}

bool ControlPlane::applyPolicy(Millis now, bool forceChurn) {
  (void)forceChurn;
  bool changed = false;
  for (const VipConfig& vip : config_.vips) {
    const PolicyInput in = policyInput(vip, now, nullptr);
    PolicyDecision decision = policy_.decide(in);
    const std::vector<std::uint32_t> target = weightsOf(decision);
    const std::vector<bool> forced = forcedOf(decision);
    auto& applied = weights_[vip.name];
    std::vector<std::uint32_t> current(in.backends.size(), 0);
    bool first = applied.empty();
    for (std::size_t i = 0; i < in.backends.size(); ++i) {
      auto it = applied.find(in.backends[i].id);
      if (it != applied.end()) current[i] = it->second;
    }
    // An empty table has no flow to move: filling it is not churn (and any
    // partial step would fill it whole, so the budget could never pass).
    first = first || std::all_of(current.begin(), current.end(), [](auto w) { return w == 0; });
    std::vector<std::uint32_t> next = target;
    if (!first && current != target) {
      auto toMap = [&](const std::vector<std::uint32_t>& w) {
        std::map<std::uint64_t, std::uint32_t> m;
        for (std::size_t i = 0; i < in.backends.size(); ++i) m[in.backends[i].id] = w[i];
        return m;
      };
      const ChurnStep step = limitChurn(
          current, target, forced, churnBudgetEntries(config_.policy.churnBudget, vip.tableSize),
          [&](const std::vector<std::uint32_t>& w) {
            return builder_.predictChanged(vip.name, toMap(w)).value_or(vip.tableSize);
          });
      next = step.weights;
      if (step.limited) {
        events_.append(now, "", kEventWeight,
                       "vip " + vip.name + ": churn budget: moved " +
                           std::to_string(step.predictedChanged) + " entries (" +
                           std::to_string(static_cast<int>(step.step * 100)) +
                           "% of the way to the target weights); more next interval");
      }
    }
    auto before = decisions_.find(vip.name);
    for (const PolicyNote& note :
         policyNotes(before == decisions_.end() ? nullptr : &before->second, decision)) {
      events_.append(now, note.subject, note.kind, "vip " + vip.name + ": " + note.cause);
    }
    decisions_[vip.name] = std::move(decision);
    std::map<std::uint64_t, std::uint32_t> m;
    for (std::size_t i = 0; i < in.backends.size(); ++i) m[in.backends[i].id] = next[i];
    if (m != applied) {
      applied = m;
      builder_.setVipWeights(vip.name, m);
      changed = true;
    }
  }
  return changed;
}

void ControlPlane::collectFlows(Millis now) {
  if (dataplane_ == nullptr) return;
  if (flowCountAsked_ != 0 && flowCountAt_ != 0) {
    if (auto counts = dataplane_->collectFlowCounts(flowCountAsked_)) {
      lastFlows_ = std::move(*counts);
      flowsCounted_ = flowCountAsked_;
      flowCountAt_ = 0;
      for (const BackendConfig& b : config_.backends) {
        const std::uint32_t index = builder_.indexOf(b.id);
        std::uint64_t total = 0;
        for (const LcoreFlowCounts& l : lastFlows_) {
          if (index < l.byBackend.size()) total += l.byBackend[index];
        }
        if (recycledDuringCount_.count(index) != 0) continue;  // the next count says
        (void)states_.setLiveFlows(b.id, total, now);
      }
      recycledDuringCount_.clear();
    }
    return;
  }
  static_assert(kFlowCountPeriod > 0);
  if (flowCountAsked_ == 0 || now >= lastFlowRequest_ + kFlowCountPeriod) {
    dataplane_->requestFlowCounts(++flowCountAsked_);
    flowCountAt_ = now;
    lastFlowRequest_ = now;
  }
}

bool ControlPlane::tick(Millis now) {
  constexpr Millis kRoundGapWindowMs = 30'000;
  ++rounds_;
  if (lastRound_ && now > *lastRound_) roundGapMax_ = std::max(roundGapMax_, now - *lastRound_);
  lastRound_ = now;
  if (now - roundWindowStart_ >= kRoundGapWindowMs) {
    roundGapMaxPrevious_ = roundGapMax_;
    roundGapMax_ = 0;
    roundWindowStart_ = now;
  }
  now_ = now;
  health_.poll(now);
  for (const HealthTransition& t : health_.takeTransitions()) {
    (void)states_.setHealth(t.id, t.up, now, t.cause);
  }
  scraper_.poll(now);
  for (ScrapeNotice& n : scraper_.takeNotices()) {
    events_.append(n.time, std::move(n.backend), kEventScrape, std::move(n.text));
  }
  collectFlows(now);
  states_.tick(now);

  // Backends whose removal completed leave the configuration.
  std::vector<std::uint64_t> gone;
  for (const BackendConfig& b : config_.backends) {
    if (states_.state(b.id) == BackendState::Removed) gone.push_back(b.id);
  }
  if (!gone.empty()) {
    Config next = config_;
    std::erase_if(next.backends, [&](const BackendConfig& b) {
      return std::find(gone.begin(), gone.end(), b.id) != gone.end();
    });
    reconfigure(std::move(next), now, "removal completed");
    for (auto id : gone) {
      (void)states_.erase(id);
      retiring_.erase(id);
    }
  }

  const bool statesChanged = states_.generation() != statesSeen_;
  if (statesChanged) {
    statesSeen_ = states_.generation();
    for (const BackendConfig& b : config_.backends) {
      if (auto s = states_.state(b.id)) builder_.setState(b.id, *s);
    }
    dirty_ = true;
  }
  if (warmup_ && (warmupComplete() || now >= warmupStarted_ + kWarmupLimit)) {
    warmup_ = false;
    warmupTook_ = now - warmupStarted_;
    events_.append(now, "", kEventWarmup,
                   std::string("warm-up over after ") + std::to_string(now - warmupStarted_) +
                       " ms (" + (warmupComplete() ? "health and load known" : "time limit") +
                       "); the policy moves the tables within the churn budget");
    lastChurn_ = 0;  // evaluate now
    lastChurnSlot_ = 0;
  }
  // In a tier, the policy steps on the wall clock's multiples of the churn
  // interval, so instances that see the same load step together and their
  // tables differ only for as long as their readings do (not for up to a
  // whole interval of phase). Alone, an interval after the last step.
  const std::uint64_t slot = unixNow() / static_cast<std::uint64_t>(config_.policy.churnInterval);
  const bool churnDue =
      peers_ ? slot != lastChurnSlot_ : now >= lastChurn_ + config_.policy.churnInterval;
  // During warm-up the held tables change only with backend states (the
  // builder zeroes a backend that is not Active).
  if (!warmup_ && (statesChanged || churnDue)) {
    if (applyPolicy(now, churnDue)) dirty_ = true;
    if (churnDue) {
      lastChurn_ = now;
      lastChurnSlot_ = slot;
    }
  }
  tickPeers(now, statesChanged);
  samplePlacement(now);
  if (dataplane_ != nullptr) {
    keeper_.tick(
        now, unixNow(), generation_, dataplane_->appliedGeneration(),
        [&] { return publishedTables_; }, [&](std::uint32_t index) { return builder_.idAt(index); },
        ExceptionExportHooks{
            [&](std::uint64_t n) { dataplane_->requestExceptionExport(n); },
            [&](std::uint64_t n) { return dataplane_->collectExceptionExport(n); }});
  }
  if (keeper_.takeRestoredChanged()) {
    refreshExceptions();
    dirty_ = true;
  }
  recycleIndices();
  noteHolds(now);
  if (pendingApply_ && dataplane_ != nullptr &&
      dataplane_->appliedGeneration() >= pendingApply_->first) {
    applyLatencies_.push_back(now - pendingApply_->second);
    if (applyLatencies_.size() > 64) applyLatencies_.erase(applyLatencies_.begin());
    pendingApply_.reset();
  }
  return dirty_;
}

void ControlPlane::recycleIndices() {
  if (dataplane_ == nullptr) return;
  if (purgeAsked_ != 0) {
    if (!dataplane_->purgeDone(purgeAsked_)) return;
    // Exported flows name backends by index until the export is collected:
    // no index is freed (and so reused) while one is in flight.
    if (keeper_.exporting()) return;
    builder_.indicesPurged(purging_);
    // Restored and peers' exceptions name backends by id: map them again, so
    // none keeps an index that may now go to another backend.
    if (keeper_.stats().restoredAlive > 0 || peers_) {
      refreshExceptions();
      dirty_ = true;
    }
    if (flowCountAt_ != 0) recycledDuringCount_.insert(purging_.begin(), purging_.end());
    purging_.clear();
    purgeAsked_ = 0;
  }
  purging_ = builder_.startIndexPurge(dataplane_->appliedGeneration());
  if (purging_.empty()) return;
  purgeAsked_ = ++purgeRequests_;
  dataplane_->requestPurge(purgeAsked_, purging_);
}

void ControlPlane::noteHolds(Millis now) {
  auto nameOf = [&](std::uint64_t id) -> std::string {
    for (const BackendConfig& b : config_.backends) {
      if (b.id == id) return b.name;
    }
    return {};
  };
  for (std::uint64_t id : builder_.takeEnteredTables()) {
    auto since = heldSince_.find(id);
    const Millis waited = since == heldSince_.end() ? 0 : now - since->second;
    ++heldEntered_;
    dirty_ = true;
    events_.append(
        now, nameOf(id), kEventState,
        "next hop resolved: enters the tables after " + std::to_string(waited) + " ms held");
  }
  std::map<std::uint64_t, Millis> held;
  for (std::uint64_t id : builder_.heldForNextHop()) {
    auto since = heldSince_.find(id);
    if (since != heldSince_.end()) {
      held.insert(*since);
      continue;
    }
    held[id] = now;
    events_.append(now, nameOf(id), kEventState,
                   "held out of the tables until its next hop resolves");
  }
  heldSince_ = std::move(held);
}

std::unique_ptr<ForwardingSnapshot> ControlPlane::takeSnapshot(Millis now) {
  auto s = builder_.build(generation_ + 1);
  if (!s) {
    events_.append(now, "", kEventConfig, "snapshot build failed: " + builder_.lastError());
    dirty_ = false;
    return nullptr;
  }
  ++generation_;
  ++publishes_;
  // What a checkpoint writes with the exceptions judged against this
  // snapshot: the weights it was built with, not later ones.
  publishedTables_ = tablesState();
  dirty_ = false;
  pendingApply_ = {generation_, now};
  return s;
}

void ControlPlane::reconfigure(Config next, Millis now, const std::string& cause) {
  // Backends new to the configuration join the state machine; those that
  // left it are removed at once (their tracked flows re-steered).
  for (const BackendConfig& b : next.backends) {
    if (!states_.find(b.id) || states_.state(b.id) == BackendState::Removed) {
      (void)states_.add(
          b.id, b.name, now, cause,
          b.initialState == BackendState::Disabled ? AdminState::Disabled : AdminState::Enabled);
    }
  }
  for (const BackendConfig& b : config_.backends) {
    const bool kept = std::any_of(next.backends.begin(), next.backends.end(),
                                  [&](const BackendConfig& n) { return n.id == b.id; });
    if (!kept && states_.state(b.id) != BackendState::Removed) {
      (void)states_.remove(b.id, now, cause, true);
    }
  }
  config_ = std::move(next);
  if (auto e = builder_.setConfig(config_)) {
    events_.append(now, "", kEventConfig, "configuration not applied: " + *e);
  }
  builder_.clearVipWeights();
  weights_.clear();
  policy_.setConfig(config_.policy);
  states_.setDrainTimeout(config_.policy.drainTimeout);
  applyTargets();
  for (const BackendConfig& b : config_.backends) {
    if (auto s = states_.state(b.id)) builder_.setState(b.id, *s);
  }
  statesSeen_ = states_.generation();
  (void)applyPolicy(now, true);
  noteHolds(now);
  dirty_ = true;
}

namespace {

IntentRecord intentRecord(IntentOp op, const std::string& name, std::uint64_t id) {
  IntentRecord r;
  r.op = op;
  r.backend = name;
  r.id = id;
  return r;
}

ApiResult intentReply(ApiResult result, const IntentRecord& r) {
  if (auto* j = std::get_if<Json>(&result)) (*j)["intent_seq"] = r.seq;
  return result;
}

}  // namespace

ApiResult ControlPlane::stateResult(const StateResult& r, const std::string& name,
                                    const char* verb) {
  if (!r) return ApiError{std::string(r.codeName()), r.message()};
  const BackendConfig* b = backendNamed(name);
  Json out{{"backend", name}, {"action", verb}};
  if (b != nullptr) {
    if (const BackendStatus* st = states_.find(b->id)) {
      out["state"] = stateName(st->effective);
      out["cause"] = st->cause;
    }
  }
  return out;
}

// --- ControlApi: reads --------------------------------------------------------

ApiResult ControlPlane::status() {
  Json vips = Json::array();
  for (const auto& [name, d] : decisions_) {
    vips.push_back({{"vip", name}, {"panic", d.panic}, {"empty", d.empty}, {"summary", d.summary}});
  }
  std::map<std::string, int> byState;
  for (const BackendConfig& b : config_.backends) {
    ++byState[stateName(states_.state(b.id).value_or(BackendState::Removed))];
  }
  Json latency = nullptr;
  if (!applyLatencies_.empty()) latency = applyLatencies_.back();
  const BackendIndexStats ix = builder_.indexStats();
  return Json{{"generation", generation_},
              {"uptime_ms", now_ - started_},
              {"now_ms", now_},  // the clock of events' time_ms
              {"worker_lcores", config_.dataplane.lcores},
              {"vips", config_.vips.size()},
              {"pools", config_.pools.size()},
              {"backends", config_.backends.size()},
              {"backends_by_state", byState},
              {"publishes", publishes_},
              {"last_publish_latency_ms", latency},
              {"backend_indices",
               {{"max", ix.maxBackends},
                {"in_use", ix.inUse},
                {"retiring", ix.retiring},
                {"purging", ix.purging},
                {"free", ix.free},
                {"recycled", ix.recycled}}},
              {"held_for_next_hop", heldSince_.size()},
              {"policy", vips},
              {"config", configPath_},
              {"warmup", warmup_},
              {"warmup_ms", warmup_       ? Json(now_ - warmupStarted_)
                            : warmupTook_ ? Json(*warmupTook_)
                                          : Json(nullptr)},
              {"checkpoint", checkpointStatsJson(keeper_, now_)},
              {"announce", announceJson()},
              {"tier", peers_ ? peers_->status(now_) : Json{{"enabled", false}}}};
}

ApiResult ControlPlane::vipList() {
  Json out = Json::array();
  for (const VipConfig& v : config_.vips) {
    auto d = decisions_.find(v.name);
    out.push_back({{"name", v.name},
                   {"address", ipJson(v.address)},
                   {"protocol", protocolName(v.protocol)},
                   {"port", v.port},
                   {"table_size", v.tableSize},
                   {"pools", v.pools},
                   {"panic", d != decisions_.end() && d->second.panic}});
  }
  return out;
}

ApiResult ControlPlane::vipShow(const std::string& name) {
  for (const VipConfig& v : config_.vips) {
    if (v.name != name) continue;
    Json out{{"name", v.name},
             {"address", ipJson(v.address)},
             {"protocol", protocolName(v.protocol)},
             {"port", v.port},
             {"table_size", v.tableSize},
             {"answer_ping", v.answerPing},
             {"placement", v.placement == VipPlacementMode::Bytes ? "bytes" : "table"}};
    if (VipLoad* load = builder_.vipLoad(v.name)) {
      out["placement_load_flows"] =
          static_cast<double>(static_cast<std::uint64_t>(load->milliFlows)) / kLoadScale;
    }
    auto d = decisions_.find(v.name);
    if (d != decisions_.end()) {
      Json pools = Json::array();
      for (const PoolDecision& p : d->second.pools) {
        pools.push_back({{"pool", p.name},
                         {"priority", p.priority},
                         {"share", p.share},
                         {"healthy_fraction", p.healthyFraction},
                         {"available", p.available},
                         {"active", p.active},
                         {"saturated", p.saturated},
                         {"degraded", p.degraded},
                         {"latency_ms", p.latencyMs ? Json(*p.latencyMs) : Json(nullptr)},
                         {"region", p.region},
                         {"preferred", p.preferred}});
      }
      Json backends = Json::array();
      for (const BackendDecision& b : d->second.backends) {
        backends.push_back(
            {{"backend", b.name},
             {"weight", b.weight},
             {"share", b.share},
             {"load_factor", b.loadFactor},
             {"saturated", b.saturated},
             {"latency_ms", b.latencyMs ? Json(*b.latencyMs) : Json(nullptr)},
             {"latency", std::string(toString(b.latency))},
             {"latency_factor", b.latencyFactor},
             {"latency_bound_ms", b.latencyBoundMs ? Json(*b.latencyBoundMs) : Json(nullptr)}});
      }
      out["pools"] = pools;
      out["backends"] = backends;
      out["panic"] = d->second.panic;
      out["healthy_capacity"] = d->second.healthyCapacity;
      out["summary"] = d->second.summary;
    }
    return out;
  }
  return notFound("vip", name);
}

ApiResult ControlPlane::poolList() {
  Json out = Json::array();
  for (std::uint32_t p = 0; p < config_.pools.size(); ++p) {
    const PoolConfig& pool = config_.pools[p];
    int members = 0, active = 0;
    for (const BackendConfig& b : config_.backends) {
      if (b.poolIndex != p) continue;
      ++members;
      active += states_.state(b.id) == BackendState::Active;
    }
    out.push_back({{"name", pool.name},
                   {"site", std::string(toString(pool.site))},
                   {"priority", pool.priority},
                   {"encap", std::string(toString(pool.encap))},
                   {"backends", members},
                   {"active", active}});
  }
  return out;
}

ApiResult ControlPlane::poolShow(const std::string& name) {
  for (std::uint32_t p = 0; p < config_.pools.size(); ++p) {
    if (config_.pools[p].name != name) continue;
    Json backends = Json::array();
    for (const BackendConfig& b : config_.backends) {
      if (b.poolIndex == p) backends.push_back(backendJson(b));
    }
    Json shares = Json::array();
    for (const auto& [vip, d] : decisions_) {
      for (const PoolDecision& pd : d.pools) {
        if (pd.name == name) {
          shares.push_back(
              {{"vip", vip}, {"share", pd.share}, {"healthy_fraction", pd.healthyFraction}});
        }
      }
    }
    const PoolConfig& pool = config_.pools[p];
    return Json{{"name", pool.name},
                {"site", std::string(toString(pool.site))},
                {"priority", pool.priority},
                {"encap", std::string(toString(pool.encap))},
                {"share_of_new_flows", shares},
                {"backends", backends}};
  }
  return notFound("pool", name);
}

Json ControlPlane::backendJson(const BackendConfig& b) const {
  Json j{{"name", b.name},
         {"pool", b.pool},
         {"address", ipJson(b.address)},
         {"id", b.id},
         {"index", builder_.indexOf(b.id)},
         {"base_weight", b.weight}};
  if (const BackendStatus* st = states_.find(b.id)) {
    j["state"] = stateName(st->effective);
    j["admin"] = std::string(toString(st->admin));
    j["health"] = std::string(toString(st->health));
    j["cause"] = st->cause;
    j["live_flows"] = st->liveFlows ? Json(*st->liveFlows) : Json(nullptr);
  }
  Json weights = Json::object();
  for (const auto& [vip, w] : weights_) {
    auto it = w.find(b.id);
    if (it != w.end()) weights[vip] = it->second;
  }
  j["weight"] = weights;
  if (auto h = health_.status(b.id)) {
    j["rtt_ms"] = h->rttMs ? Json(*h->rttMs) : Json(nullptr);
    j["last_error"] = h->lastError;
  }
  latencyJson(j, b.id);
  const ScrapedLoad load = scraper_.load(b.id, now_);
  j["gpu_utilization"] = load.gpuUtilization ? Json(*load.gpuUtilization) : Json(nullptr);
  j["queue_depth"] = load.queueDepth ? Json(*load.queueDepth) : Json(nullptr);
  if (auto s = scraper_.status(b.id); s && s->scrapes > 0) j["scrape"] = scrapeJson(*s);
  j["saturated"] = policy_.saturated(b.id);
  const BackendRuntime* rt = builder_.runtime(b.id);
  j["next_hop_resolved"] = rt != nullptr && rt->nextHopMac.has_value();
  j["held_for_next_hop"] = heldSince_.count(b.id) != 0;
  // Placement's measurements (0 until a placing VIP makes the meter run).
  j["byte_rate"] = byteRates_.rate(builder_.indexOf(b.id));
  j["placement_load_flows"] = placementLoad(builder_.indexOf(b.id));
  return j;
}

void ControlPlane::latencyJson(Json& j, std::uint64_t id) const {
  const std::optional<HealthStatus> h = health_.status(id);
  const bool known = h && h->rtt;
  j["srtt_ms"] = known ? Json(h->rtt->srttMs) : Json(nullptr);
  j["rttvar_ms"] = known ? Json(h->rtt->rttVarMs) : Json(nullptr);
  j["latency_ms"] = known ? Json(h->rtt->scoreMs()) : Json(nullptr);
  j["latency"] = std::string(toString(policy_.latencyMark(id)));
  j["latency_factor"] = policy_.latencyFactor(id);
}

ApiResult ControlPlane::backendList() {
  Json out = Json::array();
  for (const BackendConfig& b : config_.backends) out.push_back(backendJson(b));
  return out;
}

ApiResult ControlPlane::tableShow(const std::string& vip) {
  Json out = Json::array();
  bool found = vip.empty();
  for (const VipConfig& v : config_.vips) {
    if (!vip.empty() && v.name != vip) continue;
    found = true;
    const MaglevTable* t = builder_.currentTable(v.name);
    std::map<std::uint32_t, std::uint32_t> entries;
    if (t != nullptr) {
      for (std::uint32_t e : t->entries()) ++entries[e];
    }
    Json backends = Json::array();
    for (const BackendConfig& b : config_.backends) {
      const std::uint32_t index = builder_.indexOf(b.id);
      auto it = entries.find(index);
      if (it == entries.end()) continue;
      backends.push_back({{"backend", b.name}, {"index", index}, {"entries", it->second}});
    }
    out.push_back({{"vip", v.name},
                   {"table_size", v.tableSize},
                   {"empty_entries", entries.count(0) ? entries[0] : 0},
                   {"backends", backends}});
  }
  if (!found) return notFound("vip", vip);
  return Json{{"generation", generation_}, {"tables", out}};
}

std::vector<std::uint64_t> ControlPlane::tableIds(const std::string& vip) const {
  std::map<std::uint32_t, std::uint64_t> idOf;  // backend index -> id
  for (const BackendConfig& b : config_.backends) idOf[builder_.indexOf(b.id)] = b.id;
  std::vector<std::uint64_t> ids;
  if (const MaglevTable* t = builder_.currentTable(vip)) {
    for (const std::uint32_t e : t->entries()) ids.push_back(e == 0 ? 0 : idOf[e]);
  }
  return ids;
}

ApiResult ControlPlane::tableDigest(const std::string& vip, std::optional<std::uint32_t> chunk) {
  Json tables = Json::array();
  for (const VipConfig& v : config_.vips) {
    if (!vip.empty() && v.name != vip) continue;
    const std::vector<std::uint64_t> ids = tableIds(v.name);
    if (!chunk) {
      tables.push_back(tableDigestJson(v.name, ids));
      continue;
    }
    std::optional<Json> c = tableChunkJson(v.name, ids, *chunk);
    if (!c) return ApiError{"invalid", "vip " + v.name + " has no chunk " + std::to_string(*chunk)};
    (*c)["generation"] = generation_;
    return *c;
  }
  if (!vip.empty() && tables.empty()) return notFound("vip", vip);
  return Json{{"generation", generation_}, {"warmup", warmup_}, {"tables", tables}};
}

ApiResult ControlPlane::flows() {
  Json perBackend = Json::array();
  for (const BackendConfig& b : config_.backends) {
    const std::uint32_t index = builder_.indexOf(b.id);
    Json lcores = Json::object();
    std::uint64_t total = 0;
    for (const LcoreFlowCounts& l : lastFlows_) {
      const std::uint64_t n = index < l.byBackend.size() ? l.byBackend[index] : 0;
      lcores[std::to_string(l.lcore)] = n;
      total += n;
    }
    perBackend.push_back({{"backend", b.name}, {"flows", total}, {"per_lcore", lcores}});
  }
  return Json{{"backends", perBackend}};
}

ApiResult ControlPlane::stats() {
  if (dataplane_ == nullptr) return ApiError{"unavailable", "no data path attached"};
  return statsDocument(dataplane_->counters(), config_, builder_, generation_);
}

ApiResult ControlPlane::health() {
  Json out = Json::array();
  for (const BackendConfig& b : config_.backends) {
    const PoolConfig& pool = config_.pools[b.poolIndex];
    Json j{{"backend", b.name}, {"pool", pool.name}};
    switch (pool.health.kind) {
      case HealthCheckKind::None:
        j["check"] = "none";
        break;
      case HealthCheckKind::Tcp:
        j["check"] = "tcp";
        break;
      case HealthCheckKind::Http:
        j["check"] = "http";
        break;
      case HealthCheckKind::Encap:
        j["check"] = "encap";
        break;
    }
    if (auto h = health_.status(b.id)) {
      j["up"] = h->up;
      j["consecutive_ok"] = h->consecutiveOk;
      j["consecutive_fail"] = h->consecutiveFail;
      j["last_error"] = h->lastError;
      j["rtt_ms"] = h->rttMs ? Json(*h->rttMs) : Json(nullptr);
      j["rttvar_ms"] = h->rtt ? Json(h->rtt->rttVarMs) : Json(nullptr);
      j["latency_ms"] = h->rtt ? Json(h->rtt->scoreMs()) : Json(nullptr);
      j["probes"] = h->probes;
      j["failures"] = h->failures;
    }
    if (auto s = scraper_.status(b.id); s && s->scrapes > 0) j["scrape"] = scrapeJson(*s);
    out.push_back(j);
  }
  return out;
}

ApiResult ControlPlane::events(std::uint64_t after, std::uint32_t limit) {
  const EventPage page = events_.since(after, limit);
  Json list = Json::array();
  for (const Event& e : page.events) {
    Json j{{"seq", e.seq},
           {"time_ms", e.time},
           {"backend", e.backend},
           {"kind", e.kind},
           {"cause", e.cause}};
    if (e.from) j["from"] = stateName(*e.from);
    if (e.to) j["to"] = stateName(*e.to);
    list.push_back(j);
  }
  return Json{{"events", list}, {"next", page.next}, {"missed", page.missed}};
}

namespace {

// What a caller may be told about a file: everything (the daemon itself,
// root, or a caller that can read the file), or only where each error is.
struct ConfigRead {
  std::string file;                 // as named in replies and errors
  std::string open;                 // what is read: for a caller, with links resolved
  std::optional<ApiError> refused;  // the path is not the caller's to name
  bool mayQuote = true;
};

ConfigRead admitConfigPath(const std::string& path, const std::string& running,
                           const PeerCredentials* caller) {
  ConfigRead r;
  r.file = path.empty() ? running : path;
  r.open = r.file;
  if (caller == nullptr) return r;
  // The running file itself is always the caller's to name (even when the
  // daemon was started with a relative --config); only what it names is.
  std::error_code ec;
  const std::string dir =
      std::filesystem::absolute(std::filesystem::path(running), ec).parent_path().string();
  std::string resolved;
  if (std::string why = path.empty() ? "" : configPathProblem(r.file, dir, *caller, resolved);
      !why.empty()) {
    r.refused = ApiError{"forbidden", why};
    return r;
  }
  // The file checked is the file read, even if a link changes meanwhile.
  if (!resolved.empty()) r.open = resolved;
  r.mayQuote = callerMayRead(r.open, *caller);
  return r;
}

// Loads the file; errors name it as the caller named it, and hold only
// places when the caller could not read it.
ConfigResult loadFor(const ConfigRead& read, std::string& errors) {
  ConfigResult result = loadConfig(read.open);
  if (!result && read.open != read.file) {
    std::vector<ConfigError> named = result.errors();
    for (ConfigError& e : named) e.file = read.file;
    result = ConfigResult(std::move(named));
  }
  if (!result) {
    errors = read.mayQuote ? formatErrors(result.errors()) : formatErrorsWithheld(result.errors());
    if (!read.mayQuote) {
      errors += "(values and reasons withheld: the caller may not read " + read.file + ")\n";
    }
  }
  return result;
}

// A rejection after the file parsed (conflict, exhausted) may name what the
// file holds: withheld likewise.
ApiError withheld(const ConfigRead& read, ApiError e) {
  // "invalid" is already reduced to places; "forbidden" names only the path.
  if (read.mayQuote || e.code == "invalid" || e.code == "forbidden") return e;
  return ApiError{e.code, read.file + ": rejected (" + e.code +
                              "); details withheld: the caller may not read the file"};
}

}  // namespace

ApiResult ControlPlane::configCheck(const std::string& path, const PeerCredentials* caller) {
  const ConfigRead read = admitConfigPath(path, configPath_, caller);
  if (read.refused) return *read.refused;
  std::string errors;
  auto result = loadFor(read, errors);
  if (!result) return ApiError{"invalid", errors};
  const Config& c = result.value();
  return Json{
      {"path", read.file}, {"ok", true}, {"vips", c.vips.size()}, {"backends", c.backends.size()}};
}

ApiResult ControlPlane::configReload(const std::string& path, const PeerCredentials* caller) {
  const ConfigRead read = admitConfigPath(path, configPath_, caller);
  const std::string& file = read.file;
  auto reject = [&](ApiError e) {
    e = withheld(read, std::move(e));
    events_.append(now_, "", kEventConfig,
                   "rejected " + file + " (running configuration unchanged): " +
                       e.message.substr(0, e.message.find('\n')));
    return e;
  };
  if (read.refused) return reject(*read.refused);
  std::string errors;
  auto result = loadFor(read, errors);
  if (!result) return reject(ApiError{"invalid", errors});
  Config next = std::move(result).value();
  // What the data path was started with cannot change under it.
  const auto& a = config_.dataplane;
  const auto& b = next.dataplane;
  if (a.lcores != b.lcores || a.hashSeed != b.hashSeed || a.flowCapacity != b.flowCapacity ||
      config_.ports.size() != next.ports.size()) {
    return reject(ApiError{"conflict",
                           "the new file changes [dataplane] or the ports; restart spillwayd for "
                           "that"});
  }
  for (std::size_t i = 0; i < next.ports.size(); ++i) {
    if (next.ports[i].devargs != config_.ports[i].devargs ||
        next.ports[i].name != config_.ports[i].name) {
      return reject(ApiError{"conflict", "port " + next.ports[i].name +
                                             " changed its device; restart spillwayd for that"});
    }
  }
  auto planned = planApply(std::move(next), journal_.overlay());
  if (auto* e = std::get_if<ApiError>(&planned)) return reject(*e);
  if (auto e = builder_.admits(std::get<ApplyPlan>(planned).next)) {
    return reject(ApiError{"exhausted", *e});
  }
  Json changes;
  if (auto e = commitApply(std::get<ApplyPlan>(planned), "configuration reloaded from " + file,
                           changes)) {
    return reject(*e);
  }
  configPath_ = file;
  events_.append(now_, "", kEventConfig, "reloaded " + file + ": " + changes.dump());
  return Json{{"path", file},
              {"applied", true},
              {"backends", config_.backends.size()},
              {"changes", changes}};
}

ApiResult ControlPlane::configDump(bool effective) {
  Json pools = Json::array();
  for (const PoolConfig& p : config_.pools) {
    pools.push_back({{"name", p.name},
                     {"site", std::string(toString(p.site))},
                     {"priority", p.priority},
                     {"encap", std::string(toString(p.encap))}});
  }
  Json vips = Json::array();
  for (const VipConfig& v : config_.vips) {
    vips.push_back({{"name", v.name},
                    {"address", ipJson(v.address)},
                    {"protocol", protocolName(v.protocol)},
                    {"port", v.port},
                    {"table_size", v.tableSize},
                    {"pools", v.pools},
                    {"answer_ping", v.answerPing},
                    {"placement", v.placement == VipPlacementMode::Bytes ? "bytes" : "table"}});
  }
  Json backends = Json::array();
  const Json fromFile{{"source", "file"}};
  for (const BackendConfig& b : config_.backends) {
    Json j{{"name", b.name}, {"id", b.id},         {"address", ipJson(b.address)},
           {"pool", b.pool}, {"weight", b.weight}, {"port", b.port}};
    if (effective) {
      // Where each value comes from: the file, or a journaled command.
      const BackendOverride* o = journal_.overlay().find(b.name);
      Json src = Json::object();
      src["definition"] = o && o->added ? stampJson({o->added->seq, o->added->wallMs})
                          : retiring_.count(b.id) != 0
                              ? Json{{"source", "previous file (draining until removed)"}}
                              : fromFile;
      src["weight"] = fromFile;
      if (o && o->weight) {
        src["weight"] = stampJson(o->weightStamp);
        src["weight"]["replaced"] = o->weightReplaced;
      }
      src["admin"] = fromFile;
      if (o && o->removed) src["admin"] = stampJson(*o->removed);
      if (o && o->admin) src["admin"] = stampJson(o->adminStamp);
      if (const BackendStatus* st = states_.find(b.id)) {
        j["admin"] = std::string(toString(st->admin));
        j["state"] = stateName(st->effective);
      }
      j["sources"] = src;
    }
    backends.push_back(j);
  }
  Json overrides = Json::array();
  if (effective) {
    for (const auto& [name, o] : journal_.overlay().backends()) {
      Json j{{"backend", name}};
      if (o.added) j["added"] = stampJson({o.added->seq, o.added->wallMs});
      if (o.removed) j["removed"] = stampJson(*o.removed);
      if (o.admin) {
        j["admin"] = stampJson(o.adminStamp);
        j["admin"]["value"] = std::string(toString(*o.admin));
      }
      if (o.weight) {
        j["weight"] = stampJson(o.weightStamp);
        j["weight"]["value"] = *o.weight;
        j["weight"]["replaced"] = o.weightReplaced;
      }
      overrides.push_back(j);
      // A file backend the operator removed is not in the running set.
      if (o.removed && backendNamed(name) == nullptr) {
        backends.push_back(
            {{"name", name},
             {"id", o.id},
             {"state", "removed"},
             {"sources", {{"definition", fromFile}, {"admin", stampJson(*o.removed)}}}});
      }
    }
  }
  Json ports = Json::array();
  for (const PortConfig& p : config_.ports) {
    ports.push_back({{"name", p.name}, {"devargs", p.devargs}, {"mtu", p.mtu}});
  }
  Json out{
      {"path", configPath_},
      {"dataplane",
       {{"lcores", config_.dataplane.lcores}, {"flow_capacity", config_.dataplane.flowCapacity}}},
      {"ports", ports},
      {"pools", pools},
      {"vips", vips},
      {"backends", backends},
      {"policy",
       {{"gpu_high", config_.policy.gpuHigh},
        {"gpu_low", config_.policy.gpuLow},
        {"queue_high", config_.policy.queueHigh},
        {"queue_low", config_.policy.queueLow},
        {"overprovisioning", config_.policy.overprovisioning},
        {"panic_threshold", config_.policy.panicThreshold},
        {"churn_budget", config_.policy.churnBudget},
        {"drain_timeout_ms", config_.policy.drainTimeout},
        {"latency_regions", std::string(toString(config_.policy.latencyRegions))},
        {"latency_window_ms", config_.policy.latencyWindow},
        {"region_switch_margin", config_.policy.regionSwitchMargin},
        {"region_switch_margin_ms", config_.policy.regionSwitchMarginMs},
        {"region_switch_windows", config_.policy.regionSwitchWindows},
        {"degraded_latency_ms", config_.policy.degradedLatencyMs},
        {"degraded_latency_factor", config_.policy.degradedLatencyFactor},
        {"degraded_latency_min_ms", config_.policy.degradedLatencyMinMs},
        {"degraded_windows", config_.policy.degradedWindows},
        {"degraded_weight", config_.policy.degradedWeight},
        {"degraded_max_fraction", config_.policy.degradedMaxFraction},
        {"degraded_restore_step", config_.policy.degradedRestoreStep}}}};
  out["announce"] = announceConfigJson(config_.announce);
  out["placement"] = {{"balance_factor", config_.placement.balanceFactor},
                      {"candidates", config_.placement.candidates},
                      {"rate_interval_ms", config_.placement.rateInterval},
                      {"rate_smoothing_ms", config_.placement.rateSmoothing}};
  if (effective) {
    const auto& drained = journal_.overlay().lbDrained();
    out["lb"] = {{"drained", drained.has_value()},
                 {"source", drained ? stampJson(*drained) : Json{{"source", "file"}}}};
    out["overrides"] = overrides;
    out["journal"] = Json{{"state_dir", journal_.directory()},
                          {"usable", journal_.usable()},
                          {"error", journal_.error()},
                          {"last_seq", journal_.lastSeq()},
                          {"journal_records", journal_.journalRecords()},
                          {"journal_bytes", journal_.journalBytes()}};
  }
  return out;
}

// --- ControlApi: changes ------------------------------------------------------

ApiResult ControlPlane::backendAdd(const BackendSpec& spec) {
  if (backendNamed(spec.name) != nullptr) {
    return ApiError{"conflict", "a backend named '" + spec.name + "' exists"};
  }
  // The same checks as a [[backend]] in the file (config.hpp).
  if (auto bad = backendNameProblem(spec.name)) {
    return ApiError{"invalid", "name '" + spec.name.substr(0, 80) +
                                   (spec.name.size() > 80 ? "...'" : "'") + ": " + *bad};
  }
  Config next = config_;
  BackendConfig b;
  b.name = spec.name;
  auto address = parseIpAddress(spec.address);
  if (!address) return ApiError{"invalid", "address '" + spec.address + "' is not an IP address"};
  if (auto bad = backendAddressProblem(config_, *address)) {
    return ApiError{"invalid", "address " + spec.address + ": " + *bad};
  }
  b.address = *address;
  b.id = spec.id.value_or(backendIdFromName(spec.name));
  b.weight = spec.weight;
  if (b.weight > kMaxBackendWeight) {
    return ApiError{"invalid", "weight " + std::to_string(b.weight) + " is above " +
                                   std::to_string(kMaxBackendWeight)};
  }
  bool poolFound = false;
  for (std::uint32_t p = 0; p < next.pools.size(); ++p) {
    if (next.pools[p].name == spec.pool) {
      b.pool = spec.pool;
      b.poolIndex = p;
      poolFound = true;
    }
  }
  if (!poolFound) return notFound("pool", spec.pool);
  bool portFound = false;
  for (std::uint32_t p = 0; p < next.ports.size(); ++p) {
    const bool wanted =
        spec.port ? next.ports[p].name == *spec.port : next.ports[p].role != PortRole::Client;
    if (wanted && !portFound) {
      b.port = next.ports[p].name;
      b.portIndex = p;
      portFound = true;
    }
  }
  if (!portFound) return notFound("port", spec.port.value_or("(default)"));
  const PortConfig& port = next.ports[b.portIndex];
  if ((b.address.version == IpVersion::V4 ? port.address : port.address6) == std::nullopt) {
    return ApiError{"invalid", "port " + port.name + " has no tunnel source address for IPv" +
                                   std::string(b.address.version == IpVersion::V4 ? "4" : "6")};
  }
  if (spec.mac) {
    auto mac = parseMacAddress(*spec.mac);
    if (!mac) return ApiError{"invalid", "mac '" + *spec.mac + "' is not a MAC address"};
    if (!isUnicastMacAddress(*mac)) {
      return ApiError{"invalid", "mac " + *spec.mac +
                                     " must be a unicast MAC address (not zero, multicast or "
                                     "broadcast)"};
    }
    b.mac = *mac;
  }
  for (const BackendConfig& o : next.backends) {
    if (o.id == b.id)
      return ApiError{"conflict", "backend id " + std::to_string(b.id) + " is taken"};
    if (o.address == b.address) {
      return ApiError{"conflict", "address " + spec.address + " belongs to " + o.name};
    }
  }
  next.backends.push_back(b);
  if (auto e = builder_.admits(next)) return ApiError{"exhausted", *e};
  if (auto e = trialBuild(next)) {
    return ApiError{"invalid", "the backend cannot be built into the tables: " + *e};
  }
  IntentRecord r;
  r.op = IntentOp::Add;
  r.backend = b.name;
  r.id = b.id;
  r.weight = b.weight;
  r.address = b.address;
  r.pool = b.pool;
  r.port = b.port;
  r.mac = b.mac;
  if (auto e = journal(r)) return *e;
  reconfigure(std::move(next), now_, "added by operator");
  return Json{{"backend", b.name},
              {"action", "add"},
              {"id", b.id},
              {"index", builder_.indexOf(b.id)},
              {"intent_seq", r.seq}};
}

ApiResult ControlPlane::backendRemove(const std::string& name) {
  const BackendConfig* b = backendNamed(name);
  if (b == nullptr) return notFound("backend", name);
  if (auto e = precheck(IntentOp::Remove, b->id)) return *e;
  IntentRecord r = intentRecord(IntentOp::Remove, name, b->id);
  if (auto e = journal(r)) return *e;
  return intentReply(stateResult(states_.remove(b->id, now_, "operator: remove"), name, "remove"),
                     r);
}

ApiResult ControlPlane::backendDrain(const std::string& name) {
  const BackendConfig* b = backendNamed(name);
  if (b == nullptr) return notFound("backend", name);
  if (auto e = precheck(IntentOp::Drain, b->id)) return *e;
  IntentRecord r = intentRecord(IntentOp::Drain, name, b->id);
  if (auto e = journal(r)) return *e;
  return intentReply(stateResult(states_.drain(b->id, now_, "operator: drain"), name, "drain"), r);
}

ApiResult ControlPlane::backendUndrain(const std::string& name) {
  const BackendConfig* b = backendNamed(name);
  if (b == nullptr) return notFound("backend", name);
  if (auto e = precheck(IntentOp::Undrain, b->id)) return *e;
  IntentRecord r = intentRecord(IntentOp::Undrain, name, b->id);
  if (auto e = journal(r)) return *e;
  return intentReply(
      stateResult(states_.undrain(b->id, now_, "operator: undrain"), name, "undrain"), r);
}

ApiResult ControlPlane::backendDisable(const std::string& name) {
  const BackendConfig* b = backendNamed(name);
  if (b == nullptr) return notFound("backend", name);
  if (auto e = precheck(IntentOp::Disable, b->id)) return *e;
  IntentRecord r = intentRecord(IntentOp::Disable, name, b->id);
  if (auto e = journal(r)) return *e;
  return intentReply(
      stateResult(states_.disable(b->id, now_, "operator: disable"), name, "disable"), r);
}

ApiResult ControlPlane::backendEnable(const std::string& name) {
  const BackendConfig* b = backendNamed(name);
  if (b == nullptr) return notFound("backend", name);
  if (auto e = precheck(IntentOp::Enable, b->id)) return *e;
  IntentRecord r = intentRecord(IntentOp::Enable, name, b->id);
  if (auto e = journal(r)) return *e;
  return intentReply(stateResult(states_.enable(b->id, now_, "operator: enable"), name, "enable"),
                     r);
}

ApiResult ControlPlane::backendWeight(const std::string& name, std::uint32_t weight, bool dryRun) {
  const BackendConfig* b = backendNamed(name);
  if (b == nullptr) return notFound("backend", name);
  if (weight > kMaxBackendWeight) {
    return ApiError{"invalid", "weight " + std::to_string(weight) + " is above " +
                                   std::to_string(kMaxBackendWeight)};
  }
  // The predicted move: the policy's weights with the new base weight, built
  // aside and compared with each VIP's current table.
  Json moves = Json::array();
  std::map<std::uint64_t, std::uint32_t> base{{b->id, weight}};
  for (const VipConfig& v : config_.vips) {
    if (std::find(v.poolIndices.begin(), v.poolIndices.end(), b->poolIndex) ==
        v.poolIndices.end()) {
      continue;
    }
    const PolicyInput in = policyInput(v, now_, &base);
    WeightPolicy scratch = policy_;
    const PolicyDecision d = scratch.decide(in);
    std::map<std::uint64_t, std::uint32_t> w;
    for (std::size_t i = 0; i < in.backends.size(); ++i)
      w[in.backends[i].id] = d.backends[i].weight;
    const auto changed = builder_.predictChanged(v.name, w);
    moves.push_back(
        {{"vip", v.name},
         {"table_size", v.tableSize},
         {"entries_changed", changed ? Json(*changed) : Json(nullptr)},
         {"share_changed", changed ? Json(double(*changed) / v.tableSize) : Json(nullptr)},
         {"churn_budget_entries", churnBudgetEntries(config_.policy.churnBudget, v.tableSize)}});
  }
  Json out{{"backend", name},
           {"weight", weight},
           {"previous_weight", b->weight},
           {"dry_run", dryRun},
           {"predicted", moves}};
  if (!dryRun) {
    IntentRecord r = intentRecord(IntentOp::Weight, name, b->id);
    r.weight = weight;
    r.baseWeight = fileBaseWeight(*b);
    if (auto e = journal(r)) return *e;
    out["intent_seq"] = r.seq;
    for (BackendConfig& c : config_.backends) {
      if (c.id == b->id) c.weight = weight;
    }
    events_.append(now_, name, kEventWeight,
                   "operator: base weight " + std::to_string(out["previous_weight"].get<int>()) +
                       " -> " + std::to_string(weight));
    // Weight changes move within the churn budget: apply at the next interval.
    lastChurn_ = 0;
  }
  return out;
}

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
  IntentMerge m =
      mergeIntent(fileConfig_, journal_.overlay(), wallNow(), fileConfig_.policy.drainTimeout);
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
    config_ = fileConfig_;
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
  IntentMerge m = mergeIntent(file, overlay, wallNow(), file.policy.drainTimeout);
  if (!m.conflicts.empty()) {
    std::string text;
    for (const std::string& c : m.conflicts) text += (text.empty() ? "" : "; ") + c;
    return ApiError{"conflict", text +
                                    " (keep it out of the file, or clear it first: "
                                    "spillwayctl config clear-overrides --backend NAME)"};
  }
  Config next = std::move(m.config);
  for (const BackendConfig& b : config_.backends) {
    const bool named = std::any_of(next.backends.begin(), next.backends.end(),
                                   [&](const BackendConfig& n) { return n.id == b.id; });
    if (named) {
      if (retiring_.count(b.id) != 0) plan.unretire.push_back(b.id);
      continue;
    }
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
    if (st->admin != AdminState::Removing) plan.retire.push_back(b.id);
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
  lastChurn_ = 0;
  return Json{{"cleared", cleared}, {"intent_seq", r.seq}, {"changes", changes}};
}

// --- Metrics --------------------------------------------------------------------

std::string ControlPlane::metricsText() {
  MetricsWriter m;
  m.gauge("spillway_snapshot_generation", "Generation of the published forwarding snapshot.", {},
          static_cast<double>(generation_));
  m.counter("spillway_snapshot_publishes_total", "Snapshots published.", {},
            static_cast<double>(publishes_));
  if (!applyLatencies_.empty()) {
    m.gauge("spillway_publish_latency_seconds",
            "Time from the latest decision to its use by every worker.", {},
            static_cast<double>(applyLatencies_.back()) / 1000.0);
  }
  m.gauge("spillway_warmup", "1 while the start-up tables are held (warm-up).", {},
          warmup_ ? 1 : 0);
  m.counter("spillway_control_loop_rounds_total", "Rounds of the control loop.", {},
            static_cast<double>(rounds_));
  m.gauge("spillway_control_loop_max_gap_seconds",
          "Longest time between two control-loop rounds over the last 30 to 60 s.", {},
          static_cast<double>(std::max(roundGapMax_, roundGapMaxPrevious_)) / 1000.0);
  if (loopDurations_.count() > 0) {
    std::array<HistogramBucket, LoopDurations::kBounds.size()> buckets{};
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i < buckets.size(); ++i) {
      cumulative += loopDurations_.perBucket()[i];
      buckets[i] = HistogramBucket{LoopDurations::kBounds[i], cumulative};
    }
    m.histogram("spillway_control_loop_tick_seconds",
                "Duration of the control loop's rounds (checks, scrapes, CLI, metrics, publish).",
                {}, buckets, loopDurations_.sum(), loopDurations_.count());
    m.gauge("spillway_control_loop_tick_max_seconds",
            "The longest control loop round since the daemon started.", {}, loopDurations_.max());
  }
  {
    const auto outcome = announce_ ? std::optional(announce_->outcome()) : std::nullopt;
    appendAnnounceMetrics(m, outcome ? &*outcome : nullptr,
                          journal_.overlay().lbDrained().has_value());
  }
  if (keeper_.enabled()) {
    const CheckpointStats& c = keeper_.stats();
    m.counter("spillway_checkpoints_total", "Flow-affinity checkpoints written.", {},
              static_cast<double>(c.checkpoints));
    m.counter("spillway_checkpoint_failures_total", "Flow-affinity checkpoints that failed.", {},
              static_cast<double>(c.failures));
    m.gauge("spillway_checkpoint_exceptions", "Flow exceptions in the last checkpoint.", {},
            static_cast<double>(c.lastExceptions));
    m.gauge("spillway_checkpoint_bytes", "Size of the last flow checkpoint.", {},
            static_cast<double>(c.lastBytes));
    if (c.lastAt) {
      m.gauge("spillway_checkpoint_age_seconds", "Time since the last completed checkpoint.", {},
              static_cast<double>(now_ - *c.lastAt) / 1000.0);
    }
    m.gauge("spillway_restored_exceptions", "Restored flow exceptions still alive.", {},
            static_cast<double>(c.restoredAlive));
  }
  if (peers_) peers_->metrics(m, now_);
  const BackendIndexStats ix = builder_.indexStats();
  m.gauge("spillway_backend_indices_max", "Backends that may be known at once.", {},
          ix.maxBackends);
  for (const auto& [use, n] : {std::pair{"in_use", ix.inUse}, std::pair{"retiring", ix.retiring},
                               std::pair{"purging", ix.purging}, std::pair{"free", ix.free}}) {
    m.gauge("spillway_backend_indices",
            "Backend indices by use (retiring: waiting for the grace period; purging: "
            "flow-table entries being erased).",
            {{"use", use}}, n);
  }
  m.counter("spillway_backend_indices_recycled_total", "Backend indices recycled for reuse.", {},
            static_cast<double>(ix.recycled));
  m.gauge("spillway_backends_held_for_next_hop",
          "Backends added at run time held out of the tables until their next hop resolves.", {},
          static_cast<double>(heldSince_.size()));
  m.counter("spillway_backend_next_hop_holds_total",
            "Backends that entered the tables after a hold for their next hop.", {},
            static_cast<double>(heldEntered_));
  for (const VipConfig& v : config_.vips) {
    auto d = decisions_.find(v.name);
    if (d == decisions_.end()) continue;
    m.gauge("spillway_vip_panic", "1 when the VIP is in panic mode.", {{"vip", v.name}},
            d->second.panic ? 1 : 0);
    {
      std::uint32_t active = 0;
      std::optional<std::uint32_t> first;  // the first priority level
      for (const PoolDecision& p : d->second.pools) {
        active += p.active;
        first = std::min(first.value_or(p.priority), p.priority);
      }
      double spilled = 0;
      for (const PoolDecision& p : d->second.pools) {
        if (p.priority != first) spilled += p.share;
      }
      m.gauge("spillway_vip_active_backends",
              "Backends in state active in the VIP's pools (0: new flows have nowhere to go).",
              {{"vip", v.name}}, active);
      m.gauge("spillway_vip_spilled_share",
              "Share of the VIP's new flows sent past its first priority level (spillover).",
              {{"vip", v.name}}, spilled);
      // The low 48 bits of `tier status`'s fingerprint: exact in a double, and
      // equal on instances whose tables are equal.
      const std::vector<std::uint64_t> ids = tableIds(v.name);
      m.gauge("spillway_vip_table_fingerprint",
              "Low 48 bits of the VIP's Maglev table fingerprint (tier status).", {{"vip", v.name}},
              static_cast<double>(tableHash(ids, ids.size()) & ((std::uint64_t{1} << 48) - 1)));
    }
    for (const PoolDecision& p : d->second.pools) {
      m.gauge("spillway_pool_new_flow_share", "Share of the VIP's new flows sent to the pool.",
              {{"vip", v.name}, {"pool", p.name}}, p.share);
      m.gauge("spillway_pool_healthy_fraction", "Healthy share of the pool's capacity.",
              {{"vip", v.name}, {"pool", p.name}}, p.healthyFraction);
      if (p.latencyMs) {
        m.gauge("spillway_pool_latency_seconds",
                "Median latency score (SRTT + 4 RTTVAR) of the pool's active backends.",
                {{"vip", v.name}, {"pool", p.name}}, *p.latencyMs / 1000.0);
      }
      if (p.region) {
        m.gauge("spillway_pool_preferred_region",
                "1 for the preferred region of its priority level (latency), else 0.",
                {{"vip", v.name}, {"pool", p.name}}, p.preferred ? 1 : 0);
      }
    }
    const MaglevTable* t = builder_.currentTable(v.name);
    std::map<std::uint32_t, std::uint32_t> entries;
    if (t != nullptr) {
      for (std::uint32_t e : t->entries()) ++entries[e];
    }
    for (const BackendConfig& b : config_.backends) {
      auto w = weights_[v.name].find(b.id);
      if (w == weights_[v.name].end()) continue;
      m.gauge("spillway_backend_effective_weight", "Maglev weight of the backend in the VIP.",
              {{"vip", v.name}, {"backend", b.name}}, w->second);
      m.gauge("spillway_backend_table_entries", "Maglev table entries owned by the backend.",
              {{"vip", v.name}, {"backend", b.name}}, entries[builder_.indexOf(b.id)]);
    }
  }
  for (const BackendConfig& b : config_.backends) {
    const std::string state = stateName(states_.state(b.id).value_or(BackendState::Removed));
    for (const char* s : {"active", "draining", "disabled", "failed", "removed"}) {
      m.gauge("spillway_backend_state", "1 for the backend's current state.",
              {{"backend", b.name}, {"pool", b.pool}, {"state", s}}, state == s ? 1 : 0);
    }
    if (auto h = health_.status(b.id); h && h->lastProbe) {
      m.gauge("spillway_backend_health_up", "1 when the backend passes its health checks.",
              {{"backend", b.name}, {"pool", b.pool}}, h->up ? 1 : 0);
      m.counter("spillway_backend_health_failures_total", "Health probes that failed.",
                {{"backend", b.name}, {"pool", b.pool}}, static_cast<double>(h->failures));
    }
    if (auto l = scraper_.status(b.id); l && l->lastAttempt) {
      m.gauge("spillway_backend_load_scrape_up",
              "1 when the latest scrape of the backend's load exporter worked.",
              {{"backend", b.name}, {"pool", b.pool}}, l->lastError.empty() ? 1 : 0);
    }
    if (auto h = health_.status(b.id); h && h->rtt) {
      m.gauge("spillway_backend_rtt_seconds", "Smoothed health-check round trip (SRTT).",
              {{"backend", b.name}}, h->rtt->srttMs / 1000.0);
      m.gauge("spillway_backend_rttvar_seconds", "Health-check round-trip variation (RTTVAR).",
              {{"backend", b.name}}, h->rtt->rttVarMs / 1000.0);
      m.gauge("spillway_backend_latency_seconds", "Latency score SRTT + 4 RTTVAR.",
              {{"backend", b.name}}, h->rtt->scoreMs() / 1000.0);
    }
    m.gauge("spillway_backend_latency_degraded",
            "1 while the backend is marked degraded for latency (weight lowered, not ejected).",
            {{"backend", b.name}}, policy_.latencyMark(b.id) == LatencyMark::Degraded ? 1 : 0);
    m.gauge("spillway_backend_latency_weight_factor",
            "The latency multiplier of the backend's weight (1: normal).", {{"backend", b.name}},
            policy_.latencyFactor(b.id));
    const ScrapedLoad load = scraper_.load(b.id, now_);
    if (load.gpuUtilization) {
      m.gauge("spillway_backend_gpu_utilization_ratio", "Smoothed GPU utilisation (0-1).",
              {{"backend", b.name}}, *load.gpuUtilization / 100.0);
    }
    if (load.queueDepth) {
      m.gauge("spillway_backend_queue_depth", "Smoothed requests waiting.", {{"backend", b.name}},
              *load.queueDepth);
    }
    if (auto s = scraper_.status(b.id); s && config_.pools[b.poolIndex].load.enabled) {
      m.counter("spillway_scrapes_total", "Load scrapes that ended (success or failure).",
                {{"backend", b.name}}, static_cast<double>(s->scrapes));
      m.counter("spillway_scrape_failures_total",
                "Load scrapes that failed (connect, HTTP, size, exposition text).",
                {{"backend", b.name}}, static_cast<double>(s->failures));
      m.counter("spillway_scrape_out_of_range_total",
                "Scrapes whose value was outside its meaning (GPU utilisation outside 0-100, "
                "queue depth negative or not finite): taken as unknown.",
                {{"backend", b.name}, {"metric", "gpu"}}, static_cast<double>(s->gpuOutOfRange));
      m.counter("spillway_scrape_out_of_range_total",
                "Scrapes whose value was outside its meaning (GPU utilisation outside 0-100, "
                "queue depth negative or not finite): taken as unknown.",
                {{"backend", b.name}, {"metric", "queue"}},
                static_cast<double>(s->queueOutOfRange));
    }
    if (anyVipPlaces()) {
      m.gauge("spillway_backend_byte_rate", "Smoothed forwarded bytes per second (placement).",
              {{"backend", b.name}}, byteRates_.rate(builder_.indexOf(b.id)));
      m.gauge("spillway_backend_placement_load",
              "Load placement balances: max(live flows, bytes / mean bytes of a flow).",
              {{"backend", b.name}}, placementLoad(builder_.indexOf(b.id)));
    }
    if (const BackendStatus* st = states_.find(b.id); st && st->liveFlows) {
      m.gauge("spillway_backend_active_flows", "Tracked flows on the backend (all lcores).",
              {{"backend", b.name}}, static_cast<double>(*st->liveFlows));
    }
  }
  if (dataplane_ != nullptr) {
    const Json s = statsDocument(dataplane_->counters(), config_, builder_, generation_);
    auto num = [&](const char* key) { return s.contains(key) ? s[key].get<double>() : 0.0; };
    m.counter("spillway_rx_packets_total", "Frames received by the workers.", {},
              num("rx_packets"));
    m.counter("spillway_forwarded_packets_total", "Frames encapsulated to a backend.", {},
              num("forwarded"));
    m.counter("spillway_replies_total", "ICMP replies sent by the load balancer.", {},
              num("replies"));
    m.counter("spillway_kernel_packets_total", "Frames handed to the kernel.", {},
              num("to_kernel"));
    m.counter("spillway_new_flows_total", "Flows started.", {}, num("new_flows"));
    m.counter("spillway_placed_off_table_total",
              "New connections a placing VIP sent elsewhere than its table's entry (by bytes).", {},
              num("placed_off_table"));
    if (s.contains("drops")) {
      for (const auto& [reason, n] : s["drops"].items()) {
        m.counter("spillway_drops_total", "Frames dropped, by reason.", {{"reason", reason}},
                  n.get<double>());
      }
    }
    if (s.contains("backends")) {
      for (const Json& b : s["backends"]) {
        const std::string name = b["name"].get<std::string>();
        m.counter("spillway_backend_packets_total", "Frames forwarded to the backend.",
                  {{"backend", name}}, b["packets"].get<double>());
        m.counter("spillway_backend_new_flows_total", "Flows started on the backend.",
                  {{"backend", name}}, b["new_flows"].get<double>());
        m.counter("spillway_backend_bytes_total",
                  "Bytes forwarded to the backend (encapsulated frames).", {{"backend", name}},
                  b["bytes"].get<double>());
      }
    }
    if (s.contains("workers")) {
      for (const Json& w : s["workers"]) {
        const std::string lcore = std::to_string(w["lcore"].get<unsigned>());
        m.counter("spillway_lcore_rx_packets_total", "Frames received, per worker lcore.",
                  {{"lcore", lcore}}, w["rx_packets"].get<double>());
        m.counter("spillway_flow_embryonic_rejected_total",
                  "Handshake (SYN) flow inserts refused: both buckets full, per lcore.",
                  {{"lcore", lcore}}, w["flow_embryonic_rejected"].get<double>());
        m.counter("spillway_flow_syn_flood_inserts_total",
                  "Handshake flow inserts made in SYN-flood mode (no cuckoo step), per lcore.",
                  {{"lcore", lcore}}, w["flow_syn_flood_inserts"].get<double>());
        m.gauge("spillway_flow_table_entries",
                "Flow-table slots in use (live flows and expired ones not yet reclaimed).",
                {{"lcore", lcore}}, w["flow_table_occupancy"].get<double>());
        m.gauge("spillway_flow_table_capacity", "Flow-table capacity (flows) of the lcore.",
                {{"lcore", lcore}}, static_cast<double>(config_.dataplane.flowCapacity));
        m.gauge("spillway_flow_table_syn_flood",
                "1 while the lcore's flow table is in SYN-flood mode (handshakes fill it).",
                {{"lcore", lcore}}, w.value("syn_flood", false) ? 1 : 0);
        if (w.contains("rounds")) {
          const Json& r = w["rounds"];
          std::array<HistogramBucket, kRoundBuckets - 1> buckets{};  // the last is +Inf
          std::uint64_t cumulative = 0, count = 0;
          for (std::size_t b = 0; b < kRoundBuckets; ++b) {
            const auto n = r["buckets"][b].get<std::uint64_t>();
            count += n;
            if (b + 1 < kRoundBuckets) {
              cumulative += n;
              buckets[b] = HistogramBucket{roundBucketUpperSeconds(b), cumulative};
            }
          }
          const std::array<MetricLabel, 1> labels{MetricLabel{"lcore", lcore}};
          m.histogram("spillway_worker_round_seconds",
                      "Duration of the worker lcore's poll rounds (start to start, idle pauses "
                      "left out); a tail here is a tail of the frames' latency.",
                      labels, buckets, static_cast<double>(r["sum_ns"].get<std::uint64_t>()) / 1e9,
                      count);
          m.gauge("spillway_worker_round_max_seconds",
                  "The worker lcore's longest poll round since the daemon started.",
                  {{"lcore", lcore}}, static_cast<double>(r["max_ns"].get<std::uint64_t>()) / 1e9);
        }
      }
    }
    if (s.contains("ports")) {
      for (const Json& p : s["ports"]) {
        const std::string name = p["name"].get<std::string>();
        m.counter("spillway_port_rx_missed_total",
                  "Frames the port's driver missed (receive ring full), before any worker.",
                  {{"port", name}}, p["rx_missed"].get<double>());
        m.counter("spillway_port_rx_errors_total", "Receive errors the port's driver counted.",
                  {{"port", name}}, p["rx_errors"].get<double>());
        m.counter("spillway_port_rx_no_mbuf_total",
                  "Frames the port's driver could not take for want of an mbuf.", {{"port", name}},
                  p["rx_no_mbuf"].get<double>());
      }
    }
    if (s.contains("kernel_reassembly")) {
      for (const char* k : {"requests", "ok", "failed", "timeouts"}) {
        m.counter("spillway_kernel_reassembly_total",
                  "The kernel's IPv4 reassembly in spillwayd's namespace (af_packet ports).",
                  {{"result", k}}, s["kernel_reassembly"][k].get<double>());
      }
    }
  }
  return m.text();
}

}  // namespace spillway
