// JSON pieces the ControlPlane's role files share (control_plane.cpp and its
// _views, _intent and _metrics parts): error replies and the spelling of
// states, addresses, protocols and the keeper's and scraper's counters.
// Internal to the plane room; not part of ControlPlane's interface.
//
// Thread contract: pure functions, safe on any thread.
#pragma once

#include <string>

#include "control/plane/control_plane.hpp"

namespace spillway::plane_json {

inline ApiError notFound(const std::string& what, const std::string& name) {
  return ApiError{"not_found", "no " + what + " named '" + name + "'"};
}

inline std::string stateName(BackendState s) {
  return std::string(toString(s));
}

inline Json ipJson(const IpAddress& a) {
  return formatIpAddress(a);
}

inline std::string protocolName(IpProto p) {
  return p == IpProto::Udp ? "udp" : "tcp";
}

inline Json checkpointStatsJson(const AffinityKeeper& keeper, Millis now) {
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

inline Json scrapeJson(const LoadStatus& s) {
  return Json{{"scrapes", s.scrapes},
              {"failures", s.failures},
              {"out_of_range", {{"gpu", s.gpuOutOfRange}, {"queue", s.queueOutOfRange}}},
              {"last_error", s.lastError}};
}

}  // namespace spillway::plane_json
