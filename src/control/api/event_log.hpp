// The control plane's event log: every backend state change and operator
// action, health verdict, weight, spillover and panic change, and
// configuration reload, each with its cause, in a bounded ring that the CLI
// follows (`spillwayctl events --follow`).
//
// Events carry a sequence number, monotonic from 1 for the life of the log.
// A reader remembers the last number it saw and asks for what came after
// (since()); when the ring has overwritten events it had not read yet, the
// page says how many it missed, so a follower can print a gap instead of
// silently skipping. Time is injected (the caller's clock), so tests are
// deterministic.
//
// Thread contract: control thread only (no locking). Readers on the CLI socket
// are served from the control loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "spillway/flow_table.hpp"
#include "spillway/snapshot.hpp"

namespace spillway {

// Event kinds (Event::kind).
inline constexpr const char* kEventState = "state";          // a backend's effective state changed
inline constexpr const char* kEventAdmin = "admin";          // an operator action was accepted
inline constexpr const char* kEventHealth = "health";        // health verdict up/down
inline constexpr const char* kEventWeight = "weight";        // load factor / saturation / weight
inline constexpr const char* kEventConfig = "config";        // configuration loaded or rejected
inline constexpr const char* kEventSpillover = "spillover";  // a pool's share of new flows moved
inline constexpr const char* kEventPanic = "panic";          // panic mode entered or left
inline constexpr const char* kEventLatency = "latency";      // preferred region; degraded backend
inline constexpr const char* kEventCheckpoint = "checkpoint";  // flow affinity saved or restored
inline constexpr const char* kEventWarmup = "warmup";          // start-up tables held / released
inline constexpr const char* kEventAnnounce = "announce";      // a VIP announced or withdrawn (BGP)
inline constexpr const char* kEventScrape = "scrape";          // a load value out of range (once)
inline constexpr const char* kEventDiscovery = "discovery";  // a source's answer refused or applied
inline constexpr const char* kEventIntent =
    "intent";  // operator intent journaled, replayed or dropped
inline constexpr const char* kEventRebuild =
    "rebuild";  // flow exceptions rebuilt from the backends' connections at start

struct Event {
  std::uint64_t seq = 0;  // from 1, +1 per event
  Millis time = 0;
  std::string backend;               // the backend's name; empty when the event is not about one
  std::string kind;                  // one of the kEvent* values
  std::optional<BackendState> from;  // effective states, for "state" events
  std::optional<BackendState> to;
  std::string cause;
};

struct EventPage {
  std::vector<Event> events;  // seq ascending, all > the `after` asked for
  std::uint64_t next = 0;     // pass as `after` in the next call
  std::uint64_t missed = 0;   // events after `after` that the ring overwrote before this read
};

class EventLog {
 public:
  // capacity 0 is taken as 1.
  explicit EventLog(std::size_t capacity);

  // Appends and returns the event's sequence number. Overwrites the oldest
  // event when full.
  std::uint64_t append(Millis time, std::string backend, std::string kind, std::string cause,
                       std::optional<BackendState> from = std::nullopt,
                       std::optional<BackendState> to = std::nullopt);

  // Events with seq > after, oldest first, at most `limit` (0: no limit). An
  // `after` beyond the last event (a reader from an earlier run of the
  // daemon) is taken as the last event: the reader follows from now on.
  [[nodiscard]] EventPage since(std::uint64_t after, std::size_t limit) const;

  // Events overwritten since the log began (whether anyone read them or not).
  [[nodiscard]] std::uint64_t dropped() const noexcept { return dropped_; }
  // The last sequence number given out; 0 before the first event.
  [[nodiscard]] std::uint64_t lastSeq() const noexcept { return nextSeq_ - 1; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return ring_.size(); }

 private:
  std::vector<Event> ring_;
  std::size_t head_ = 0;  // where the next event goes
  std::size_t size_ = 0;
  std::uint64_t nextSeq_ = 1;
  std::uint64_t dropped_ = 0;
};

}  // namespace spillway
