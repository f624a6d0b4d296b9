// The announcement as the operator sees it: status JSON, metrics and the
// configuration dump (declared in announce_exchange.hpp).
#include <string>

#include "control/announce/announce_exchange.hpp"
#include "control/api/metrics_http.hpp"

namespace spillway {

Json announceStatusJson(const AnnounceConfig& config, const AnnounceOutcome* outcome, bool drained,
                        Millis now) {
  Json out{{"enabled", config.enabled}, {"drained", drained}, {"device", config.device}};
  if (outcome == nullptr) {
    out["state"] = "disabled";
    out["vips"] = Json::array();
    return out;
  }
  out["state"] = std::string(toString(outcome->state));
  out["since_ms"] = outcome->stateSince;
  out["for_ms"] = now >= outcome->stateSince ? now - outcome->stateSince : 0;
  out["freezes"] = outcome->freezes;
  if (!outcome->error.empty()) out["error"] = outcome->error;
  Json vips = Json::array();
  for (const VipAnnouncement& v : outcome->vips) {
    Json j{{"vip", v.name},
           {"address", formatIpAddress(v.address)},
           {"announced", v.announced},
           {"since_ms", v.since},
           {"for_ms", now >= v.since ? now - v.since : 0}};
    j["reason"] = v.announced ? Json(nullptr) : Json(std::string(toString(v.reason)));
    vips.push_back(std::move(j));
  }
  out["vips"] = std::move(vips);
  return out;
}

void appendAnnounceMetrics(MetricsWriter& m, const AnnounceOutcome* outcome, bool drained) {
  m.gauge("spillway_announce_enabled", "1 when spillwayd controls the BGP announcement.", {},
          outcome != nullptr ? 1 : 0);
  m.gauge("spillway_lb_drained", "1 while the operator drains this instance (lb drain).", {},
          drained ? 1 : 0);
  if (outcome == nullptr) return;
  m.counter("spillway_announce_freezes_total",
            "Times this process stopped running long enough for the freeze guard to set the "
            "announce device down ([announce] freeze_ms).",
            {}, outcome->freezes);
  for (const VipAnnouncement& v : outcome->vips) {
    m.gauge("spillway_vip_announced",
            "1 when the VIP's route is announced to the router, 0 when withdrawn.",
            {{"vip", v.name}}, v.announced ? 1 : 0);
  }
}

Json announceConfigJson(const AnnounceConfig& c) {
  return Json{{"enabled", c.enabled},
              {"device", c.device},
              {"period_ms", c.periodMs},
              {"stall_ms", c.stallMs},
              {"control_stall_ms", c.controlStallMs},
              {"hold_down_ms", c.holdDownMs},
              {"freeze_ms", c.freezeMs},
              {"withdraw_grace_ms", c.withdrawGraceMs}};
}

}  // namespace spillway
