// When a drain is done: the rule that combines what this instance tracks
// with what the backend says it holds (ARCHITECTURE.md, "Drains judged by
// the backend"). Pure; BackendStates applies it whenever either count or the
// time changes.
//
// In a tier, ECMP moves flows between instances: the instance that placed a
// flow keeps its established flow-table entry for the established timeout
// (7,200 s) after the flow went elsewhere, so its own count cannot say when
// a backend is empty, and no instance's count says whether another instance
// still carries one of its flows. The backend knows (spillway-decap's agent
// counts its sockets whose local address is a VIP), so:
//   1. the backend reports connections          -> open, whatever the own count;
//   2. the backend reports 0, own count 0        -> done (both agree);
//   3. the backend reports 0, own count > 0      -> done once the backend's
//      zeros have lasted `grace` without a break (the entries left here are
//      flows ECMP moved away or whose close this instance never saw; the grace
//      covers a connection between the backend's SYN queue and accept, and one
//      scrape's lag);
//   4. no fresh report (no agent, or it stopped answering) -> the own count
//      decides, as before the agent: done at 0.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "spillway/flow_table.hpp"

namespace spillway {

struct DrainEvidence {
  std::optional<std::uint64_t> localFlows;          // this instance's tracked flows
  std::optional<std::uint64_t> backendConnections;  // the agent's fresh sum; nullopt: none
  std::optional<Millis> backendZeroSince;           // with backendConnections == 0
};

enum class DrainJudgement : std::uint8_t {
  Open,          // not done
  BothEmpty,     // rule 2
  BackendEmpty,  // rule 3
  LocalEmpty,    // rule 4
};

[[nodiscard]] constexpr DrainJudgement judgeDrain(const DrainEvidence& e, Millis now,
                                                  Millis grace) noexcept {
  if (e.backendConnections) {
    if (*e.backendConnections != 0) return DrainJudgement::Open;
    if (e.localFlows == std::uint64_t{0}) return DrainJudgement::BothEmpty;
    if (e.backendZeroSince && now >= *e.backendZeroSince && now - *e.backendZeroSince >= grace) {
      return DrainJudgement::BackendEmpty;
    }
    return DrainJudgement::Open;
  }
  return e.localFlows == std::uint64_t{0} ? DrainJudgement::LocalEmpty : DrainJudgement::Open;
}

// "backend and instance", "backend", "instance" (JSON and events).
[[nodiscard]] constexpr std::string_view judgedBy(DrainJudgement j) noexcept {
  switch (j) {
    case DrainJudgement::BothEmpty:
      return "backend and instance";
    case DrainJudgement::BackendEmpty:
      return "backend";
    case DrainJudgement::LocalEmpty:
      return "instance";
    case DrainJudgement::Open:
      break;
  }
  return "";
}

}  // namespace spillway
