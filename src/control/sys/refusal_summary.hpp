// RefusalSummary: refusals that anyone who can reach a socket causes at will
// (connections to the tier's peer port, handshakes from unknown nodes, CLI
// clients beyond the slots) are counted and summarised, not logged one by
// one: a stranger must not be able to fill the event log or the daemon's
// stderr. The first refusal after a quiet spell is logged at once (an
// operator sees the problem start), the rest as one line per interval that
// says how many, why, from how many sources and the last source; a spell
// ends when an interval passes with no refusal.
//
// Memory is bounded whatever the input: at most kMaxReasons distinct reasons
// (others count as "other") and kMaxSources distinct sources a window (more
// are counted, not kept). Time is injected (milliseconds, any epoch).
//
// Thread contract: one thread (the owner's); no locks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>

namespace spillway {

class RefusalSummary {
 public:
  static constexpr std::size_t kMaxReasons = 8;
  static constexpr std::size_t kMaxSources = 64;

  // `what` names the refusing place in every line ("peer listener").
  explicit RefusalSummary(std::string what, std::uint64_t intervalMs = 10000);

  // Counts one refusal. Returns the line to log now for the first refusal
  // of a spell; nullopt for the others (they go into the next summary).
  [[nodiscard]] std::optional<std::string> note(std::uint64_t nowMs, std::string_view source,
                                                std::string_view reason);
  // The summary of the refusals counted since the last line, once an
  // interval has passed; nullopt when nothing is due. Call it now and then
  // (each poll of the owner is fine).
  [[nodiscard]] std::optional<std::string> flush(std::uint64_t nowMs);

  [[nodiscard]] std::uint64_t total() const noexcept { return total_; }

 private:
  std::string what_;
  std::uint64_t interval_;
  std::optional<std::uint64_t> windowStart_;  // a spell is open
  std::uint64_t inWindow_ = 0;                // refusals since the last line
  std::map<std::string, std::uint64_t, std::less<>> reasons_;
  std::set<std::string, std::less<>> sources_;
  bool moreSources_ = false;
  std::string lastSource_;
  std::uint64_t total_ = 0;
};

}  // namespace spillway
