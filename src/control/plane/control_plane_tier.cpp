// The ControlPlane's side of the LB tier's peer channel (peer_channel.hpp):
// starting it, polling it from tick(), and the snapshot's exception table
// built from the peers' exceptions and the restored ones.
#include <algorithm>

#include "control/plane/control_plane.hpp"

namespace spillway {

namespace {
// The exception table is rebuilt from the peers' sets at most this often:
// 20 ms for small sets, longer as the sets grow (a rebuild costs about 65 ns
// per entry here, so the period keeps it near 1 % of the control thread).
constexpr Millis kPeerRebuildMin = 20;
constexpr Millis kPeerRebuildMax = 250;
constexpr std::size_t kEntriesPerRebuildMs = 2000;
// A joining instance waits at most this long for its live peers' dumps
// before it announces anyway (a peer that accepts but never sends).
constexpr Millis kPeerSyncLimit = 10'000;
}  // namespace

bool ControlPlane::peersReady(Millis now) const {
  if (!peers_ || peersSynced_) return true;
  // The bound covers peers that say nothing; a known divergence of intent
  // holds the announcement for as long as it lasts.
  return now >= started_ + kPeerSyncLimit && !peers_->intentAgreement().divergent && quietOk_;
}

bool ControlPlane::intentReady(Millis now) const {
  const IntentAgreement a = peers_->intentAgreement();
  if (a.agreed) return true;
  if (a.divergent) return false;
  // Reachable peers that sent no intent dump yet (or never will: an older
  // version): waited for up to kPeerSyncLimit.
  return now >= started_ + kPeerSyncLimit;
}

void ControlPlane::startPeers() {
  if (config_.tier.peers.empty()) return;
  peers_ = std::make_unique<PeerChannel>(config_.tier, config_.dataplane.hashSeed, events_);
  if (auto e = peers_->open()) {
    report(*e + " (this instance still sends to its peers; they cannot send to it)");
  }
  startTierIntent();
}

// --- Tier-wide operator intent ---------------------------------------------------

namespace {
std::string tierIntentPath(const std::string& dir) {
  return dir.empty() ? std::string() : dir + "/tier.intent";
}
}  // namespace

void ControlPlane::startTierIntent() {
  const std::string path = tierIntentPath(config_.control.stateDir);
  if (!path.empty()) {
    auto loaded = loadTierIntent(path);
    if (auto* e = std::get_if<std::string>(&loaded)) {
      report("tier intent: " + *e + "; starting from the journal and the peers' intent");
    } else {
      tierIntent_ = std::get<TierIntent>(std::move(loaded));
    }
  }
  // Journal overrides the tier's intent does not hold (made before this
  // instance had peers, or its tier.intent was lost) join it stamped with
  // their own time.
  std::vector<TierIntentEntry> seeded;
  for (const IntentRecord& r : journal_.overlay().toRecords()) {
    const auto field = tierFieldOf(r.op);
    if (!field || tierIntent_.find(r.backend, *field) != nullptr) continue;
    TierIntentEntry e;
    e.field = *field;
    e.stamp = TierStamp{r.wallMs > 0 ? static_cast<std::uint64_t>(r.wallMs) : 0, config_.tier.node};
    e.record = r;
    seeded.push_back(std::move(e));
  }
  (void)tierIntent_.merge(seeded);
  // What the file kept and the journal lost (or the reverse) is applied now.
  bool applied = false;
  for (const std::string& name : tierIntent_.backends()) {
    applied = reconcileTier(name, "tier.intent") || applied;
  }
  if (tierIntent_.size() > 0) {
    report("tier intent: " + std::to_string(tierIntent_.size()) + " entr" +
           (tierIntent_.size() == 1 ? "y" : "ies") + " held at start" +
           (applied ? " (some applied over the journal's)" : ""));
  }
  saveAndPublishTier();
}

void ControlPlane::saveAndPublishTier() {
  const std::string path = tierIntentPath(config_.control.stateDir);
  if (!path.empty()) {
    if (auto e = saveTierIntent(path, tierIntent_)) {
      events_.append(now_, "", kEventIntent, "tier intent cannot be saved: " + *e);
    }
  }
  if (peers_) peers_->publishIntent(tierIntent_.entries(), tierIntent_.digest());
}

void ControlPlane::noteTierChange(const IntentRecord& record) {
  if (!peers_ || applyingTier_ || !tierFieldOf(record.op)) return;
  (void)tierIntent_.local(record, config_.tier.node, record.wallMs);
  saveAndPublishTier();
}

void ControlPlane::mergeTierIntent(const PeerIntentDump& dump) {
  const std::vector<std::string> changed = tierIntent_.merge(dump.entries);
  if (changed.empty()) return;
  bool applied = false;
  for (const std::string& name : changed) applied = reconcileTier(name, dump.peer) || applied;
  saveAndPublishTier();
  if (!applied) return;
  // The new states reach the tables in the snapshot this tick publishes.
  for (const BackendConfig& b : config_.backends) {
    if (auto s = states_.state(b.id)) builder_.setState(b.id, *s);
  }
  statesSeen_ = states_.generation();
  if (!warmup_) (void)applyPolicy(now_, true);
  dirty_ = true;
}

bool ControlPlane::reconcileTier(const std::string& name, const std::string& from) {
  const TierTarget t = tierIntent_.target(name);
  applyingTier_ = true;
  bool applied = false;
  const auto note = [&](const std::string& what, const ApiResult& r) {
    const std::string head = "tier intent (from " + from + "): " + what;
    if (const auto* e = std::get_if<ApiError>(&r)) {
      events_.append(now_, name, kEventIntent, head + " not applied here: " + e->message);
    } else {
      events_.append(now_, name, kEventIntent, head + " applied");
      applied = true;
    }
  };
  if (t.added && !t.removed && backendNamed(name) == nullptr) {
    BackendSpec spec;
    spec.name = name;
    spec.address = formatIpAddress(t.added->address);
    spec.pool = t.added->pool;
    spec.port = t.added->port;
    spec.weight = t.added->weight;
    spec.id = t.added->id;
    if (t.added->mac) spec.mac = formatMacAddress(*t.added->mac);
    note("add", backendAdd(spec));
  }
  const BackendConfig* b = backendNamed(name);
  const BackendStatus* st = b != nullptr ? states_.find(b->id) : nullptr;
  if (st == nullptr || st->effective == BackendState::Removed) {
    if (!t.removed && (t.admin || t.weight)) {
      events_.append(now_, name, kEventIntent,
                     "tier intent (from " + from +
                         "): names a backend this instance does not "
                         "have; kept for the tier, nothing applied here");
    }
    applyingTier_ = false;
    return applied;
  }
  if (t.removed) {
    if (st->admin != AdminState::Removing) note("remove", backendRemove(name));
  } else {
    if (t.admin && *t.admin != st->admin) {
      switch (*t.admin) {
        case AdminState::Draining:
          note("drain", backendDrain(name));
          break;
        case AdminState::Disabled:
          note("disable", backendDisable(name));
          break;
        default:
          if (st->admin == AdminState::Disabled) {
            note("enable", backendEnable(name));
          } else {
            note("undrain", backendUndrain(name));
          }
          break;
      }
    }
    b = backendNamed(name);
    if (b != nullptr && t.weight && b->weight != *t.weight) {
      note("weight " + std::to_string(*t.weight), backendWeight(name, *t.weight, false));
    }
  }
  applyingTier_ = false;
  return applied;
}

std::optional<ApiError> ControlPlane::reloadRefusesTierOrAnnounce(const Config& next) const {
  const auto restart = [](std::string what) {
    return ApiError{"conflict", what + "; restart spillwayd for that"};
  };
  const TierConfig& a = config_.tier;
  const TierConfig& b = next.tier;
  if (peers_ && !b.peers.empty() && (a.node != b.node || a.listen != b.listen)) {
    return restart(
        "the new file changes [tier] node or listen (the peers know this instance by "
        "them)");
  }
  const AnnounceConfig& x = config_.announce;
  const AnnounceConfig& y = next.announce;
  if (announce_ == nullptr && y.enabled) {
    return restart(
        "the new file enables [announce]; this instance started without it (the "
        "announce device and the freeze guard are made at start)");
  }
  if (announce_ != nullptr &&
      (x.device != y.device || x.freezeMs != y.freezeMs || x.periodMs != y.periodMs)) {
    return restart("the new file changes [announce] device, freeze_ms or period_ms");
  }
  return std::nullopt;
}

void ControlPlane::applyTierAndAnnounce(const Config& before, Json& changes) {
  const TierConfig& a = before.tier;
  const TierConfig& b = config_.tier;
  const auto names = [](const TierConfig& t) {
    std::vector<std::string> out;
    for (const TierPeerConfig& p : t.peers) out.push_back(p.name + "@" + p.address);
    return out;
  };
  const bool tierChanged = names(a) != names(b) || a.secret != b.secret ||
                           a.syncInterval != b.syncInterval || a.holdTime != b.holdTime ||
                           a.maxRecordsPerPeer != b.maxRecordsPerPeer ||
                           a.maxOutputBytes != b.maxOutputBytes;
  if (tierChanged) {
    keeper_.setExportInterval(b.peers.empty() ? 0 : b.syncInterval);
    if (peers_) {
      peers_->reconfigure(b, now_);
    } else {
      startPeers();
    }
    peersPending_ = true;
    Json tier{{"peers", names(b)}};
    if (a.secret != b.secret) tier["secret"] = "changed";
    changes["tier"] = tier;
  }
  const AnnounceConfig& x = before.announce;
  const AnnounceConfig& y = config_.announce;
  if (x.enabled != y.enabled || x.holdDownMs != y.holdDownMs || x.stallMs != y.stallMs ||
      x.controlStallMs != y.controlStallMs || x.withdrawGraceMs != y.withdrawGraceMs) {
    changes["announce"] = Json{{"enabled", y.enabled},
                               {"hold_down_ms", y.holdDownMs},
                               {"stall_ms", y.stallMs},
                               {"control_stall_ms", y.controlStallMs},
                               {"withdraw_grace_ms", y.withdrawGraceMs}};
    syncAnnounce(now_);
  }
}

void ControlPlane::tickPeers(Millis now, bool statesChanged) {
  if (!peers_) return;
  peers_->poll(now);
  for (const PeerIntentDump& dump : peers_->takeIntent()) mergeTierIntent(dump);
  const bool intentOk = peersSynced_ || intentReady(now);
  if (!peersSynced_ && !intentOk && !intentHoldNoted_ && peers_->intentAgreement().divergent) {
    intentHoldNoted_ = true;
    events_.append(now, "", kEventPeer,
                   "held: the tier's operator intent differs from a peer's (spillwayctl tier "
                   "status); this instance does not announce until it agrees");
  }
  // A backend that stops taking flows here takes the peers' records on it out.
  if (peers_->takeChanged() || statesChanged) peersPending_ = true;
  // Synced once the dumps of every live peer are in a snapshot the workers
  // applied: from then on this instance can take any of their flows. It
  // joins only while the tier's tables are not stepping (joinQuiet, bounded).
  const bool quiet = peersSynced_ || joinQuiet(now);
  if (!peersSynced_ && peers_->synced() && intentOk && quiet) {
    if (peersSyncGeneration_ == 0) {
      // One rebuild after the last dump, then its snapshot applied.
      peersPending_ = true;
      peersBuiltAt_ = 0;
    } else if (dataplane_ != nullptr && dataplane_->appliedGeneration() >= peersSyncGeneration_) {
      peersSynced_ = true;
      events_.append(now, "", kEventPeer,
                     "synced: every live peer's exceptions and the tier's operator intent (" +
                         std::to_string(tierIntent_.size()) +
                         " entries) are in the applied tables (" +
                         std::to_string(peers_->heldTotal()) + " exceptions held)");
    }
  }
  const std::size_t size = peers_->heldTotal();
  const Millis period = std::clamp<Millis>(static_cast<Millis>(size / kEntriesPerRebuildMs),
                                           kPeerRebuildMin, kPeerRebuildMax);
  if (!peersPending_ || now < peersBuiltAt_ + period) return;
  peersPending_ = false;
  peersBuiltAt_ = now;
  refreshExceptions();
  dirty_ = true;
  if (!peersSynced_ && peers_->synced() && intentOk && peersSyncGeneration_ == 0) {
    // takeSnapshot() publishes it next (after a held step, if one is held).
    peersSyncGeneration_ = generation_ + (heldStep_ ? 2 : 1);
  }
}

void ControlPlane::refreshExceptions() {
  const auto indexOf = [&](std::uint64_t id) { return builder_.indexOf(id); };
  std::vector<ExceptionEntry> entries;
  if (peers_) {
    std::size_t ignored = 0;
    for (const PeerException& e : peers_->exceptions()) {
      const std::optional<BackendState> s = states_.state(e.backendId);
      const std::uint32_t index = indexOf(e.backendId);
      if (index == 0 || (s != BackendState::Active && s != BackendState::Draining)) {
        ++ignored;
        continue;
      }
      entries.push_back(ExceptionEntry{e.hash, index, e.state, ExceptionOrigin::Peer});
    }
    peers_->noteUse(entries.size(), ignored);
  }
  keeper_.restoredEntries(indexOf, entries);
  std::shared_ptr<const ExceptionTable> table =
      entries.empty() ? nullptr : std::make_shared<const ExceptionTable>(entries);
  builder_.setExceptions(table);
  if (keeper_.hasRebuilt()) {
    baseExceptions_ = std::move(entries);
    baseTable_ = std::move(table);
  } else {
    baseExceptions_.clear();
    baseTable_.reset();
  }
}

}  // namespace spillway
