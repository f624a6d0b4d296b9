// ControlPlane's part of the BGP announcement (control_plane.hpp): the
// operator's lb drain / undrain / status and the hand-over to the announcer
// thread (announce_exchange.hpp).
#include <algorithm>
#include <string>

#include "control/plane/control_plane.hpp"

namespace spillway {

void ControlPlane::syncAnnounce(Millis now) {
  if (announce_ == nullptr) return;
  announce_->beat();
  AnnounceControlInputs in;
  in.warm = announceReady(now);
  in.drained = journal_.overlay().lbDrained().has_value();
  in.disabled = !config_.announce.enabled;
  in.settings = AnnounceSettings{config_.announce.stallMs, config_.announce.controlStallMs,
                                 config_.announce.holdDownMs};
  for (const VipConfig& v : config_.vips) {
    AnnounceVipInput vip{v.name, v.address, 0};
    if (auto w = weights_.find(v.name); w != weights_.end()) {
      vip.activeBackends = static_cast<std::uint32_t>(std::count_if(
          w->second.begin(), w->second.end(), [](const auto& entry) { return entry.second > 0; }));
    }
    in.vips.push_back(std::move(vip));
  }
  announce_->setInputs(std::move(in));
  for (const AnnounceTransition& t : announce_->takeTransitions()) {
    events_.append(
        t.at, "", kEventAnnounce,
        "VIP " + t.vip +
            (t.announced ? " announced" : " withdrawn: " + std::string(toString(t.reason))));
  }
}

Json ControlPlane::announceJson() const {
  const auto outcome = announce_ ? std::optional(announce_->outcome()) : std::nullopt;
  return announceStatusJson(config_.announce, outcome ? &*outcome : nullptr,
                            journal_.overlay().lbDrained().has_value(), now_);
}

ApiResult ControlPlane::lbStatus() {
  return announceJson();
}

ApiResult ControlPlane::lbDrain() {
  const bool already = journal_.overlay().lbDrained().has_value();
  IntentRecord r;
  r.op = IntentOp::LbDrain;
  if (!already) {
    if (auto e = journal(r)) return *e;
    events_.append(now_, "", kEventAdmin,
                   "operator: lb drain: every VIP is withdrawn from the router");
  }
  // What this drain withdraws: the VIPs announced until now.
  Json withdrawn = Json::array();
  if (announce_ != nullptr) {
    for (const VipAnnouncement& v : announce_->outcome().vips) {
      if (v.announced) withdrawn.push_back(v.name);
    }
  }
  syncAnnounce(now_);
  Json out{{"action", "lb drain"},
           {"drained", true},
           {"already", already},
           {"announce", config_.announce.enabled ? "enabled" : "disabled"},
           {"withdrawn", withdrawn}};
  if (!already) out["intent_seq"] = r.seq;
  return out;
}

ApiResult ControlPlane::lbUndrain() {
  const bool was = journal_.overlay().lbDrained().has_value();
  IntentRecord r;
  r.op = IntentOp::LbUndrain;
  if (was) {
    if (auto e = journal(r)) return *e;
    events_.append(now_, "", kEventAdmin, "operator: lb undrain: VIPs may be announced again");
  }
  syncAnnounce(now_);
  Json out{{"action", "lb undrain"},
           {"drained", false},
           {"already", !was},
           {"announce", config_.announce.enabled ? "enabled" : "disabled"}};
  if (was) out["intent_seq"] = r.seq;
  return out;
}

}  // namespace spillway
