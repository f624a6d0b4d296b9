// Backend states: what the operator wants (AdminState), what health checks
// say (HealthVerdict), and the effective BackendState the dataplane acts on
// (spillway/snapshot.hpp), with drains tracked to completion and every change
// logged with its cause.
//
// The effective state, first rule that applies:
//   1. Removed   when a removal completed (or was immediate);
//   2. Failed    when health is Down, whatever the intent: a dead backend's
//                flows are re-steered at once (only its flows);
//   3. Disabled  when the intent is Disabled;
//   4. Failed    when the intent is Draining and the drain deadline passed
//                with flows still live ("drain deadline"): the remaining
//                flows are re-steered, the same as for a dead backend;
//   5. Draining  when the intent is Draining or Removing;
//   6. Active    otherwise.
// So health and intent are independent: a draining backend that fails and
// recovers is Draining again (not Active); a disabled one that fails and
// recovers is Disabled; draining a failed backend starts the drain clock and
// shows Draining once it recovers.
//
// Drains (GLB Director's drain, Envoy's drain): drain() and remove() start a
// drain clock at `now` with deadline now + PolicyConfig::drainTimeout (a
// removal of a backend that was already draining keeps the running clock).
// setLiveFlows(), fed from the dataplane's per-backend flow counts, and
// setBackendConnections(), fed from the backend's own report (ConnScraper),
// complete them by the rule of drain_rule.hpp (never while the backend reports
// connections; its zeros held for a grace outvote this instance's count; without
// a report the count decides at 0): a removal becomes Removed; a plain drain
// stays Draining and is marked complete (the operator may now take the host down).
// tick() enforces deadlines: a removal past its deadline becomes Removed, a
// plain drain becomes Failed (rule 4). Both re-steer what was left. A removal
// of a backend that is Failed completes at once: its flows are re-steered
// already. remove(immediate) skips the drain.
//
// Odd orders are defined, not rejected: undrain() cancels a removal; disable()
// and enable() replace any drain; add() of an id that is Removed re-adds it
// fresh (health Up, no drain). What is rejected comes back as a StateResult
// error that says why: an unknown id (not_found), an action on a Removed
// backend, add() of an id that exists, undrain() of a Disabled one, drain() of
// one being removed (conflict).
//
// Every operator action appends an "admin" event, every health verdict change
// a "health" event, and every effective-state change a "state" event with
// from, to and cause (EventLog). generation() moves on every effective-state
// change, so the caller knows when the tables need a rebuild.
//
// Thread contract: control thread only. Time is injected (`now`); nothing here
// reads a clock, sleeps or does I/O.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "control/api/event_log.hpp"
#include "spillway/flow_table.hpp"
#include "spillway/snapshot.hpp"

namespace spillway {

enum class AdminState : std::uint8_t { Enabled, Draining, Disabled, Removing };
enum class HealthVerdict : std::uint8_t { Up, Down };

[[nodiscard]] std::string_view toString(BackendState state) noexcept;   // "active", ...
[[nodiscard]] std::string_view toString(AdminState state) noexcept;     // "enabled", ...
[[nodiscard]] std::string_view toString(HealthVerdict state) noexcept;  // "up", "down"

// The outcome of an operation: ok, or an error with a stable code (the
// ControlApi's ApiError codes) and a message for people.
class StateResult {
 public:
  enum class Code : std::uint8_t { Ok, NotFound, Conflict };

  [[nodiscard]] static StateResult success() { return StateResult(Code::Ok, {}); }
  [[nodiscard]] static StateResult notFound(std::string message) {
    return StateResult(Code::NotFound, std::move(message));
  }
  [[nodiscard]] static StateResult conflict(std::string message) {
    return StateResult(Code::Conflict, std::move(message));
  }

  [[nodiscard]] bool ok() const noexcept { return code_ == Code::Ok; }
  explicit operator bool() const noexcept { return ok(); }
  [[nodiscard]] Code code() const noexcept { return code_; }
  // "ok", "not_found", "conflict".
  [[nodiscard]] std::string_view codeName() const noexcept;
  // Empty when ok().
  [[nodiscard]] const std::string& message() const noexcept { return message_; }

 private:
  StateResult(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  Code code_;
  std::string message_;
};

struct DrainProgress {
  Millis started = 0;
  Millis deadline = 0;
  std::optional<std::uint64_t> flowsAtStart;  // std::nullopt: no count reported yet
  std::optional<std::uint64_t> flowsNow;
  bool removing = false;  // completes as Removed
  bool complete = false;  // live flows reached 0 (a plain drain; a removal is then Removed)
  bool expired = false;   // the deadline passed with flows live
  std::string judgedBy;   // with complete: "backend and instance", "backend" or "instance"
};

struct BackendStatus {
  std::uint64_t id = 0;
  std::string name;
  AdminState admin = AdminState::Enabled;
  HealthVerdict health = HealthVerdict::Up;
  BackendState effective = BackendState::Active;
  Millis since = 0;   // when `effective` last changed (or the backend was added)
  std::string cause;  // why it changed
  std::optional<std::uint64_t> liveFlows;  // last count from the dataplane
  // The backend's own report (spillway-decap's agent), when fresh.
  std::optional<std::uint64_t> backendConnections;
  std::optional<Millis> backendZeroSince;
  Millis drainGrace = 0;
};

class BackendStates {
 public:
  // `events` must outlive this object. drainTimeout: PolicyConfig::drainTimeout.
  BackendStates(EventLog& events, Millis drainTimeout);

  // Applies to drains started afterwards.
  void setDrainTimeout(Millis drainTimeout) noexcept { drainTimeout_ = drainTimeout; }

  // A new backend (or a Removed one again): health Up, no drain, intent
  // `initial` (Enabled, or Disabled for `state = "disabled"`; Draining and
  // Removing are taken as Enabled). Conflict when the id exists and is not
  // Removed.
  StateResult add(std::uint64_t id, std::string name, Millis now, std::string_view cause,
                  AdminState initial = AdminState::Enabled);

  // No new flows; tracked flows continue until they end or the deadline.
  // Draining again is a no-op (the clock keeps running). Conflict when being
  // removed (undrain cancels a removal) or Removed. elapsed: how long ago the
  // drain began (a drain replayed from the intent journal keeps its deadline).
  StateResult drain(std::uint64_t id, Millis now, std::string_view cause, Millis elapsed = 0);
  // Back to Enabled from Draining or Removing (cancels the removal). A no-op
  // when Enabled; conflict when Disabled (use enable) or Removed.
  StateResult undrain(std::uint64_t id, Millis now, std::string_view cause);
  // No new flows, tracked flows continue, no deadline. Replaces a drain or
  // removal. Conflict when Removed.
  StateResult disable(std::uint64_t id, Millis now, std::string_view cause);
  // Back to Enabled from any intent (ends a drain or a removal). Conflict
  // when Removed.
  StateResult enable(std::uint64_t id, Millis now, std::string_view cause);
  // Drain, then Removed when live flows reach 0, at the deadline, or at once
  // when Failed or when the last count is already 0. immediate: Removed now.
  // Conflict when already Removed.
  StateResult remove(std::uint64_t id, Millis now, std::string_view cause, bool immediate = false,
                     Millis elapsed = 0);

  // The health checker's verdict (after its rise/fall damping). Accepted and
  // kept for a Removed backend, without effect.
  StateResult setHealth(std::uint64_t id, bool up, Millis now, std::string_view cause);
  // Live tracked flows of the backend, summed over lcores; completes drains.
  StateResult setLiveFlows(std::uint64_t id, std::uint64_t flows, Millis now);
  // The backend's own count of its connections over the VIPs it serves
  // (std::nullopt: no fresh report), since when it has been 0, and how long
  // zeros must last to outvote a non-zero live-flow count (drain_rule.hpp).
  StateResult setBackendConnections(std::uint64_t id, std::optional<std::uint64_t> connections,
                                    std::optional<Millis> zeroSince, Millis grace, Millis now);
  // Drain deadlines. Call at least once per second or so; cheap.
  void tick(Millis now);

  // Forgets a Removed backend entirely (its id may then be added again as new,
  // which add() allows anyway). Conflict unless Removed.
  StateResult erase(std::uint64_t id);

  [[nodiscard]] std::optional<BackendState> state(std::uint64_t id) const;
  [[nodiscard]] const BackendStatus* find(std::uint64_t id) const;
  // std::nullopt when the backend is not draining or being removed (a
  // finished removal keeps its progress until the backend is added again).
  [[nodiscard]] std::optional<DrainProgress> drainProgress(std::uint64_t id) const;
  // Every known id, ascending (Removed ones included until erased).
  [[nodiscard]] std::vector<std::uint64_t> ids() const;
  // Moves on every effective-state change of any backend.
  [[nodiscard]] std::uint64_t generation() const noexcept { return generation_; }

 private:
  struct Entry {
    BackendStatus status;
    bool removed = false;
    std::optional<DrainProgress> drain;
  };

  // Entry of a known id, else nullptr and `error` set.
  Entry* lookup(std::uint64_t id, StateResult& error);
  // Entry of a known id that is not removed, else nullptr and `error` set
  // (a conflict: add it again first).
  Entry* lookupPresent(std::uint64_t id, StateResult& error);
  // enable and disable: `target` is Enabled or Disabled; ends a drain or
  // cancels a removal on the way.
  StateResult setAdmin(std::uint64_t id, Millis now, std::string_view cause, AdminState target);
  static BackendState effectiveOf(const Entry& e) noexcept;
  // Recomputes the effective state; logs and counts a change.
  void settle(Entry& e, Millis now, std::string cause);
  void startDrain(Entry& e, Millis now, bool removing, Millis elapsed);
  void logAdmin(const Entry& e, Millis now, std::string_view action, std::string_view cause);
  // A removal whose drain is done becomes Removed.
  void completeIfDone(Entry& e, Millis now);
  // Applies drain_rule.hpp to a running drain; completes it when done.
  void judge(Entry& e, Millis now);

  EventLog& events_;
  Millis drainTimeout_;
  std::map<std::uint64_t, Entry> entries_;
  std::uint64_t generation_ = 0;
};

}  // namespace spillway
