// Make-before-break and the join gate of an LB tier (issue 24, item 4).
//
// Make-before-break. A table step that moves Maglev entries turns the live
// flows on those entries into exceptions, and today's exports (after every
// worker applied the step) reach the peers tens to hundreds of milliseconds
// later: an instance killed in between takes them along. With peers, the
// step is built and held instead; the keeper asks the workers for every flow
// that is an exception now or under the held tables (the worker classifies
// each live flow against both: a flow whose backend differs from the held
// table's entry is one the step would move), the records go out like any
// export's, and the step is published once every sending connection wrote
// them to its socket, or at [tier] make_before_break (counted). A peer that
// receives an exception for a flow whose entry has not moved there yet (its
// own tables have not stepped) sends the flow where its table already
// sends it: the record names the backend the flow is on, and the exception
// table is consulted only on a flow-table miss. Indices are stable between
// the published and the held snapshot: the builder frees an index only
// after a purge, and no purge starts while an export is in flight.
//
// The join gate. Every instance tells its peers how long ago it last stepped
// (Step frames, peer_wire.hpp); a joining instance latches "synced" (and so
// announces) only once no connected peer stepped within kJoinQuiet, or after
// kJoinQuietLimit of waiting for that, with an event either way.
//
// Thread contract: control thread (ControlPlane).
#include <algorithm>

#include "control/api/metrics_http.hpp"
#include "control/plane/control_plane.hpp"

namespace spillway {

namespace {
// A joining instance waits for the tier's tables to have been quiet this long
constexpr Millis kJoinQuiet = 1000;
// ... for at most this long after a peer's step first held it.
constexpr Millis kJoinQuietLimit = 10'000;
}  // namespace

ControlPlane::~ControlPlane() {
  // The workers may still hold the held step's address (spillway/dataplane.hpp).
  if (heldStep_ && dataplane_ != nullptr) dataplane_->forgetExportNext();
}

void ControlPlane::tickKeeper(Millis now) {
  if (dataplane_ == nullptr) return;
  keeper_.tick(
      now, unixNow(), generation_, dataplane_->appliedGeneration(),
      [&] { return publishedTables_; }, [&](std::uint32_t index) { return builder_.idAt(index); },
      ExceptionExportHooks{
          [&](std::uint64_t n) { dataplane_->requestExceptionExport(n, nullptr); },
          [&](std::uint64_t n) { return dataplane_->collectExceptionExport(n); },
          [&](std::uint64_t n) { dataplane_->requestExceptionExport(n, heldStep_.get()); }});
}

bool ControlPlane::makeBeforeBreakApplies() const {
  return peers_ && dataplane_ != nullptr && config_.tier.makeBeforeBreak > 0 && peersSynced_ &&
         generation_ > 0 && peers_->sending() > 0;
}

bool ControlPlane::stepDue(Millis now) {
  if (heldStep_) return heldStepReady(now);
  if (!dirty_) return false;
  if (!makeBeforeBreakApplies()) return true;  // takeSnapshot() builds it
  auto s = builder_.build(generation_ + 1, now);
  if (!s) {
    events_.append(now, "", kEventConfig, "snapshot build failed: " + builder_.lastError());
    dirty_ = false;
    return false;
  }
  dirty_ = false;
  heldStep_ = std::move(s);
  heldTables_ = tablesState(now);
  stepBuiltAt_ = now;
  stepMoves_ = std::any_of(builder_.lastBuild().begin(), builder_.lastBuild().end(),
                           [](const VipBuildReport& r) { return r.changed > 0; });
  stepTimedOut_ = false;
  stepCoalesced_ = false;
  if (!stepMoves_) {
    stepReady_ = true;  // nothing moves: nothing to tell the peers first
    return true;
  }
  stepReady_ = false;
  ++stepStats_.steps;
  keeper_.startAhead();
  tickKeeper(now);  // the request goes out this round
  return heldStepReady(now);
}

bool ControlPlane::heldStepReady(Millis now) {
  if (stepReady_) return true;
  if (dirty_) stepCoalesced_ = true;
  if (keeper_.aheadShared()) {
    peers_->pushLocal();
    if (peers_->localDelivered()) {
      stepReady_ = true;
      return true;
    }
  }
  if (now - stepBuiltAt_ >= config_.tier.makeBeforeBreak) {
    stepReady_ = true;
    stepTimedOut_ = true;
    return true;
  }
  return false;
}

void ControlPlane::releaseHeldStep(Millis now) {
  // Before the snapshot is published (and so may later be freed): no worker
  // reads its address past its next quiescent report.
  if (dataplane_ != nullptr) dataplane_->forgetExportNext();
  keeper_.endAhead();
  if (stepMoves_) {
    const Millis delay = now - stepBuiltAt_;
    stepStats_.lastDelayMs = delay;
    stepStats_.maxDelayMs = std::max(stepStats_.maxDelayMs, delay);
    if (stepTimedOut_ || !stepReady_) {
      ++stepStats_.timeouts;
      events_.append(now, "", kEventPeer,
                     "table step published after " + std::to_string(delay) +
                         " ms without its exceptions reaching every peer first "
                         "(make_before_break " +
                         std::to_string(config_.tier.makeBeforeBreak) + " ms)");
    } else {
      ++stepStats_.exports;
    }
    if (stepCoalesced_) ++stepStats_.coalesced;
    if (peers_) peers_->noteStep(now);
  }
  stepMoves_ = stepReady_ = stepTimedOut_ = stepCoalesced_ = false;
}

bool ControlPlane::joinQuiet(Millis now) {
  const auto step = peers_->lastPeerStep();
  const bool quiet = !step || now - step->at >= kJoinQuiet;
  if (quiet) {
    if (quietWaitSince_ && !quietOk_) {
      quietWaitedMs_ = now - *quietWaitSince_;
      events_.append(now, "", kEventPeer,
                     "join: the tier's tables have been quiet for " + std::to_string(kJoinQuiet) +
                         " ms, after waiting " + std::to_string(*quietWaitedMs_) + " ms");
    }
    quietOk_ = true;
    return true;
  }
  if (!quietWaitSince_) {
    quietWaitSince_ = now;
    events_.append(now, "", kEventPeer,
                   "join held: peer " + step->peer + " stepped its tables " +
                       std::to_string(now - step->at) +
                       " ms ago; this instance joins once the tier's tables have been quiet "
                       "for " +
                       std::to_string(kJoinQuiet) + " ms (at most " +
                       std::to_string(kJoinQuietLimit) + " ms from now)");
  }
  if (now - *quietWaitSince_ >= kJoinQuietLimit) {
    if (!quietOk_) {
      quietWaitedMs_ = now - *quietWaitSince_;
      events_.append(now, "", kEventPeer,
                     "join: the tier's tables kept stepping (peer " + step->peer + " " +
                         std::to_string(now - step->at) + " ms ago); joining after the " +
                         std::to_string(kJoinQuietLimit) + " ms bound");
    }
    quietOk_ = true;
    return true;
  }
  quietOk_ = false;
  return false;
}

Json ControlPlane::stepJson() const {
  return Json{{"enabled", peers_ != nullptr && config_.tier.makeBeforeBreak > 0},
              {"limit_ms", config_.tier.makeBeforeBreak},
              {"holding", heldStep_ != nullptr && stepMoves_},
              {"held_steps", stepStats_.steps},
              {"exports", stepStats_.exports},
              {"timeouts", stepStats_.timeouts},
              {"coalesced", stepStats_.coalesced},
              {"unheld_steps", stepStats_.unheld},
              {"last_delay_ms", stepStats_.lastDelayMs},
              {"max_delay_ms", stepStats_.maxDelayMs},
              {"join_quiet_waited_ms", quietWaitedMs_ ? Json(*quietWaitedMs_) : Json(nullptr)}};
}

void ControlPlane::stepMetrics(MetricsWriter& m) const {
  if (!peers_) return;
  m.counter("spillway_mbb_steps_total",
            "Table steps that moved entries and were held for their exceptions to reach the peers.",
            {}, static_cast<double>(stepStats_.steps));
  m.counter("spillway_mbb_exports_total",
            "Held table steps published once their exceptions were written to every peer.", {},
            static_cast<double>(stepStats_.exports));
  m.counter("spillway_mbb_timeouts_total",
            "Held table steps published at make_before_break without that.", {},
            static_cast<double>(stepStats_.timeouts));
  m.counter("spillway_mbb_coalesced_total",
            "Held table steps during which more changes came (published as one next step).", {},
            static_cast<double>(stepStats_.coalesced));
  m.counter("spillway_mbb_unheld_steps_total",
            "Table steps that moved entries and were published at once (no peer to send to).", {},
            static_cast<double>(stepStats_.unheld));
  m.gauge("spillway_mbb_step_delay_last_seconds", "Build to publish of the last held table step.",
          {}, static_cast<double>(stepStats_.lastDelayMs) / 1000.0);
  m.gauge("spillway_mbb_step_delay_max_seconds",
          "Build to publish of the longest held table step since start.", {},
          static_cast<double>(stepStats_.maxDelayMs) / 1000.0);
}

}  // namespace spillway
