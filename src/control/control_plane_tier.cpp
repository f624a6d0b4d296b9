// The ControlPlane's side of the LB tier's peer channel (peer_channel.hpp):
// starting it, polling it from tick(), and the snapshot's exception table
// built from the peers' exceptions and the restored ones.
#include "control/control_plane.hpp"

namespace spillway {

namespace {
// The exception table is rebuilt from the peers' sets at most this often.
constexpr Millis kPeerRebuildPeriod = 250;
}  // namespace

void ControlPlane::startPeers() {
  if (config_.tier.peers.empty()) return;
  peers_ = std::make_unique<PeerChannel>(config_.tier, config_.dataplane.hashSeed, events_);
  if (auto e = peers_->open()) {
    report(*e + " (this instance still sends to its peers; they cannot send to it)");
  }
}

void ControlPlane::tickPeers(Millis now, bool statesChanged) {
  if (!peers_) return;
  peers_->poll(now);
  // A backend that stops taking flows here takes the peers' records on it out.
  if (peers_->takeChanged() || statesChanged) peersPending_ = true;
  if (!peersPending_ || now < peersBuiltAt_ + kPeerRebuildPeriod) return;
  peersPending_ = false;
  peersBuiltAt_ = now;
  refreshExceptions();
  dirty_ = true;
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
