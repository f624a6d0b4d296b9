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
#include "control/plane/control_plane_json.hpp"
#include "control/plane/stats_view.hpp"

namespace spillway {
namespace {

constexpr Millis kFlowCountPeriod = 1000;
// The longest the start-up tables are held waiting for health and load data.
constexpr Millis kWarmupLimit = 15'000;
}  // namespace

using namespace plane_json;  // NOLINT(google-build-using-namespace)

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
  primeDiscovery(now);
  replayIntent(now);
  refreshOperatorRemoved();
  for (const BackendConfig& b : config_.backends) {
    (void)states_.add(
        b.id, b.name, now, "configured",
        b.initialState == BackendState::Disabled ? AdminState::Disabled : AdminState::Enabled);
  }
  applyIntentStates(now, nullptr);
  applyRestoredLeaving(now);
  applyTargets();
  for (const BackendConfig& b : config_.backends) {
    if (auto s = states_.state(b.id)) builder_.setState(b.id, *s);
  }
  statesSeen_ = states_.generation();
  (void)applyPolicy(now, true);
  restoreAffinity(now);
  lastChurn_ = now;
  startPeers();
  startRebuild(now);
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
  // Second chance: the slots' previous owners as the last process knew them,
  // so a flow on its second chance that comes back here keeps its hop.
  if (!tables->history.empty()) {
    std::size_t slots = 0;
    for (const auto& [vip, h] : tables->history) slots += h.slots.size();
    events_.append(now, "", kEventWarmup,
                   "second chance: the slot history of " + std::to_string(tables->history.size()) +
                       " VIP(s) restored (" + std::to_string(slots) + " slots)");
    builder_.restoreSlotHistory(tables->history);
  }
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
  return !warmup_ && (warmupComplete() || now >= started_ + kWarmupLimit) && peersReady(now) &&
         rebuildReady();
}

TablesState ControlPlane::tablesState(Millis now) const {
  TablesState t;
  t.generation = generation_;
  t.history = builder_.slotHistory(now);
  for (const auto& [vip, w] : weights_) t.weights[vip] = w;
  for (const BackendConfig& b : config_.backends) {
    if (auto d = discovered_.find(b.id); d != discovered_.end()) {
      DiscoveredRecord r;
      r.pool = d->second;
      r.backend = DiscoveredBackend{.id = b.id,
                                    .name = b.name,
                                    .address = b.address,
                                    .weight = b.weight,
                                    .mac = b.mac,
                                    .encap = std::nullopt,
                                    .metricsPort = b.metricsPort,
                                    .metricsPath = b.metricsPath};
      const BackendStatus* st = states_.find(b.id);
      auto leaving = discoveredLeaving_.find(b.id);
      if (leaving != discoveredLeaving_.end() && st != nullptr &&
          st->admin == AdminState::Removing) {
        r.leavingSinceUnixMs = leaving->second;
      }
      t.discovered.push_back(std::move(r));
    }
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
  std::vector<ConnTarget> conns;
  for (const BackendConfig& b : config_.backends) {
    const PoolConfig& pool = config_.pools[b.poolIndex];
    if (pool.connections.enabled) {
      ConnTarget c{b.id, b.name, b.address, pool.connections, {}};
      for (const VipConfig& v : config_.vips) {
        const bool serves = std::find(v.poolIndices.begin(), v.poolIndices.end(), b.poolIndex) !=
                            v.poolIndices.end();
        if (serves && std::find(c.vips.begin(), c.vips.end(), v.address) == c.vips.end()) {
          c.vips.push_back(v.address);
        }
      }
      conns.push_back(std::move(c));
    }
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
    scrapes.push_back(ScrapeTarget{b.id, b.name, b.address, loadSourceFor(pool.load, b)});
  }
  health_.setTargets(std::move(checks));
  scraper_.setTargets(std::move(scrapes));
  connScraper_.setTargets(std::move(conns));
}

std::vector<int> ControlPlane::pollFds() const {
  std::vector<int> fds;
  if (peers_ && peers_->pollFd() >= 0) fds.push_back(peers_->pollFd());
  if (health_.pollFd() >= 0) fds.push_back(health_.pollFd());
  if (scraper_.pollFd() >= 0) fds.push_back(scraper_.pollFd());
  if (connScraper_.pollFd() >= 0) fds.push_back(connScraper_.pollFd());
  if (rebuild_ && rebuild_->pollFd() >= 0) fds.push_back(rebuild_->pollFd());
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
  connScraper_.poll(now);
  for (const BackendConfig& b : config_.backends) {
    const ConnSourceConfig& c = config_.pools[b.poolIndex].connections;
    if (!c.enabled) continue;
    const auto report = connScraper_.report(b.id, now);
    (void)states_.setBackendConnections(b.id, report ? report->connections : std::nullopt,
                                        report ? report->zeroSince : std::nullopt, c.grace, now);
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
  tickDiscovery(now, gone);

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
  tickRebuild(now);
  samplePlacement(now);
  tickKeeper(now);
  if (keeper_.takeRestoredChanged()) {
    refreshExceptions();
    dirty_ = true;
  }
  recycleIndices();
  noteHolds(now);
  // A slot's second-chance hold ended: the next snapshot forgets its
  // previous owner.
  if (const auto ends = builder_.secondChanceHoldEnds(); ends && now >= *ends) dirty_ = true;
  if (pendingApply_ && dataplane_ != nullptr &&
      dataplane_->appliedGeneration() >= pendingApply_->first) {
    applyLatencies_.push_back(now - pendingApply_->second);
    if (applyLatencies_.size() > 64) applyLatencies_.erase(applyLatencies_.begin());
    pendingApply_.reset();
  }
  return stepDue(now);
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
  std::unique_ptr<ForwardingSnapshot> s;
  Millis decided = now;
  std::optional<TablesState> builtWith;
  if (heldStep_) {
    // Built when tick() held it; changes made since wait for the next step.
    s = std::move(heldStep_);
    decided = stepBuiltAt_;
    builtWith = std::move(heldTables_);
    heldTables_.reset();
    releaseHeldStep(now);
  } else {
    s = builder_.build(generation_ + 1, now);
    if (!s) {
      events_.append(now, "", kEventConfig, "snapshot build failed: " + builder_.lastError());
      dirty_ = false;
      return nullptr;
    }
    dirty_ = false;
    // A step that moves entries (not the first tables) is one the peers hear
    // of (the join gate); it was not held: no peer to send to, or no bound.
    if (generation_ > 0 && peers_) {
      bool moves = false;
      for (const VipBuildReport& r : builder_.lastBuild()) moves = moves || r.changed > 0;
      if (moves) {
        ++stepStats_.unheld;
        peers_->noteStep(now);
      }
    }
  }
  ++generation_;
  ++publishes_;
  if (keeper_.hasRebuilt()) mergeRebuilt(*s, now);
  // What a checkpoint writes with the exceptions judged against this
  // snapshot: the weights it was built with, not later ones.
  TablesState tables = builtWith ? std::move(*builtWith) : tablesState(now);
  tables.generation = generation_;
  if (tables.weights != publishedTables_.weights) {
    tablesChangedMs_ = now;
    tablesChangedUnixMs_ = unixNow();
  }
  publishedTables_ = std::move(tables);
  pendingApply_ = {generation_, decided};
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
  if (auto e = reloadRefusesTierOrAnnounce(next)) return reject(*e);
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
  const Config before = config_;
  if (auto e = commitApply(std::get<ApplyPlan>(planned), "configuration reloaded from " + file,
                           changes)) {
    return reject(*e);
  }
  configPath_ = file;
  applyTierAndAnnounce(before, changes);
  syncDiscoverySources();
  refreshOperatorRemoved();
  events_.append(now_, "", kEventConfig, "reloaded " + file + ": " + changes.dump());
  return Json{{"path", file},
              {"applied", true},
              {"backends", config_.backends.size()},
              {"changes", changes}};
}

// --- ControlApi: changes ------------------------------------------------------

ApiResult ControlPlane::backendAdd(const BackendSpec& spec) {
  if (const BackendConfig* existing = backendNamed(spec.name)) {
    // In a tier, `spillwayctl --tier backend add` may reach this instance
    // after a peer's copy of the same command did (tier intent): the same
    // spec again is that command, done.
    if (peers_ && !applyingTier_) {
      const TierIntentEntry* e = tierIntent_.find(spec.name, TierField::Member);
      const auto address = parseIpAddress(spec.address);
      if (e != nullptr && e->record.op == IntentOp::Add && address &&
          *address == e->record.address && *address == existing->address &&
          spec.pool == e->record.pool && spec.weight == e->record.weight &&
          spec.id.value_or(backendIdFromName(spec.name)) == existing->id &&
          (!spec.port || *spec.port == existing->port)) {
        return Json{{"backend", spec.name},
                    {"action", "add"},
                    {"id", existing->id},
                    {"index", builder_.indexOf(existing->id)},
                    {"already", "added by the tier's intent (from " + e->stamp.origin + ")"}};
      }
    }
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
  refreshOperatorRemoved();  // a discovered backend is not added back
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

}  // namespace spillway
