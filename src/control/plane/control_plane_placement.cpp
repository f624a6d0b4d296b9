// Load-aware placement's measurements (spillway/placement.hpp): the control
// thread samples the workers' per-backend byte counters every
// [placement] rate_interval (ByteRateMeter), and whenever a rate sample or a
// flow count is new it writes, where every published snapshot's placing VIPs
// read them, each backend's load max(C_b, R_b / e) and each placing VIP's
// total, then the flow count's number (the lcores' ledger epoch).
#include <algorithm>
#include <cmath>

#include "control/plane/control_plane.hpp"

namespace spillway {

bool ControlPlane::anyVipPlaces() const {
  return std::any_of(config_.vips.begin(), config_.vips.end(),
                     [](const VipConfig& v) { return v.placement == VipPlacementMode::Bytes; });
}

double ControlPlane::placementLoad(std::uint32_t index) const {
  return builder_.placementLoads().flows(index);
}

void ControlPlane::samplePlacement(Millis now) {
  if (dataplane_ == nullptr || !anyVipPlaces()) return;
  const bool rateDue = now >= nextRateSample_;
  const bool countNew = flowsCounted_ != loadsEpoch_;
  if (!rateDue && !countNew) return;
  const std::size_t limit = builder_.indexStats().limit;
  if (rateDue) {
    nextRateSample_ = now + config_.placement.rateInterval;
    byteRates_.setSmoothing(config_.placement.rateSmoothing);
    bytesScratch_.assign(limit, 0);
    dataplane_->backendBytes(bytesScratch_);
    byteRates_.sample(now, bytesScratch_);
    keeper_.notePlacedOffTable(dataplane_->placedOffTable());
  }

  // C_b from the last flow count, over every lcore.
  std::vector<double> flows(limit, 0.0);
  for (const LcoreFlowCounts& l : lastFlows_) {
    for (std::size_t i = 1; i < limit && i < l.byBackend.size(); ++i) {
      flows[i] += static_cast<double>(l.byBackend[i]);
    }
  }
  // e, the mean byte rate of a flow, over the placing VIPs' backends.
  const auto& reports = builder_.lastBuild();
  std::vector<bool> member(limit, false);
  for (std::size_t v = 0; v < config_.vips.size() && v < reports.size(); ++v) {
    if (config_.vips[v].placement != VipPlacementMode::Bytes) continue;
    for (const MaglevShare& s : reports[v].shares) {
      if (s.backendIndex < limit) member[s.backendIndex] = true;
    }
  }
  double bytes = 0;
  double counted = 0;
  for (std::size_t i = 1; i < limit; ++i) {
    if (!member[i]) continue;
    bytes += byteRates_.rate(static_cast<std::uint32_t>(i));
    counted += flows[i];
  }
  const double perFlow = bytes > 0 && counted > 0 ? bytes / counted : 0.0;
  BackendLoads& loads = builder_.placementLoads();
  std::vector<double> load(limit, 0.0);
  for (std::size_t i = 1; i < limit; ++i) {
    const double byBytes =
        perFlow > 0 ? byteRates_.rate(static_cast<std::uint32_t>(i)) / perFlow : 0;
    load[i] = std::max(flows[i], byBytes);
    loads.set(static_cast<std::uint32_t>(i),
              static_cast<std::uint64_t>(std::llround(load[i] * kLoadScale)));
  }
  for (std::size_t v = 0; v < config_.vips.size() && v < reports.size(); ++v) {
    VipLoad* total = builder_.vipLoad(config_.vips[v].name);
    if (total == nullptr) continue;
    double sum = 0;
    for (const MaglevShare& s : reports[v].shares) {
      if (s.entries != 0 && s.backendIndex < limit) sum += load[s.backendIndex];
    }
    total->milliFlows = static_cast<std::uint64_t>(std::llround(sum * kLoadScale));
  }
  loads.setEpoch(flowsCounted_);
  loadsEpoch_ = flowsCounted_;
}

}  // namespace spillway
