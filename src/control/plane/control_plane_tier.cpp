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
  return !peers_ || peersSynced_ || now >= started_ + kPeerSyncLimit;
}

void ControlPlane::startPeers() {
  if (config_.tier.peers.empty()) return;
  peers_ = std::make_unique<PeerChannel>(config_.tier, config_.dataplane.hashSeed, events_);
  if (auto e = peers_->open()) {
    report(*e + " (this instance still sends to its peers; they cannot send to it)");
  }
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
  // A backend that stops taking flows here takes the peers' records on it out.
  if (peers_->takeChanged() || statesChanged) peersPending_ = true;
  // Synced once the dumps of every live peer are in a snapshot the workers
  // applied: from then on this instance can take any of their flows.
  if (!peersSynced_ && peers_->synced()) {
    if (peersSyncGeneration_ == 0) {
      // One rebuild after the last dump, then its snapshot applied.
      peersPending_ = true;
      peersBuiltAt_ = 0;
    } else if (dataplane_ != nullptr && dataplane_->appliedGeneration() >= peersSyncGeneration_) {
      peersSynced_ = true;
      events_.append(now, "", kEventPeer,
                     "synced: every live peer's exceptions are in the applied tables (" +
                         std::to_string(peers_->heldTotal()) + " held)");
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
  if (!peersSynced_ && peers_->synced() && peersSyncGeneration_ == 0) {
    peersSyncGeneration_ = generation_ + 1;  // takeSnapshot() publishes it next
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
      entries.push_back(ExceptionEntry{e.hash, index, e.state});
    }
    peers_->noteUse(entries.size(), ignored);
  }
  keeper_.restoredEntries(indexOf, entries);
  builder_.setExceptions(entries.empty() ? nullptr
                                         : std::make_shared<const ExceptionTable>(entries));
}

}  // namespace spillway
