// Byte-aware placement's measurements (spillway/placement.hpp): the control
// thread samples the workers' per-backend byte counters every
// [placement] rate_interval, smooths them (ByteRateMeter) and writes, where
// every published snapshot's placing VIPs read them with relaxed loads, each
// backend's rate R_b and each placing VIP's total T and per-backend mean E.
#include <algorithm>

#include "control/control_plane.hpp"

namespace spillway {

bool ControlPlane::anyVipPlaces() const {
  return std::any_of(config_.vips.begin(), config_.vips.end(), [](const VipConfig& v) {
    return v.placement == VipPlacementMode::Bytes;
  });
}

void ControlPlane::samplePlacement(Millis now) {
  if (dataplane_ == nullptr || now < nextRateSample_ || !anyVipPlaces()) return;
  nextRateSample_ = now + config_.placement.rateInterval;
  byteRates_.setSmoothing(config_.placement.rateSmoothing);
  bytesScratch_.assign(builder_.indexStats().limit, 0);
  dataplane_->backendBytes(bytesScratch_);
  byteRates_.sample(now, bytesScratch_);
  BackendRates& rates = builder_.placementRates();
  for (std::uint32_t i = 1; i < bytesScratch_.size(); ++i) {
    rates.set(i, static_cast<std::uint64_t>(std::llround(byteRates_.rate(i))));
  }
  const auto& reports = builder_.lastBuild();
  for (std::size_t v = 0; v < config_.vips.size() && v < reports.size(); ++v) {
    VipLoad* load = builder_.vipLoad(config_.vips[v].name);
    if (load == nullptr) continue;
    double total = 0;
    std::uint32_t members = 0;
    for (const MaglevShare& s : reports[v].shares) {
      if (s.entries == 0) continue;
      total += byteRates_.rate(s.backendIndex);
      ++members;
    }
    load->totalRate = static_cast<std::uint64_t>(std::llround(total));
    load->backendRate = std::max<std::uint64_t>(
        1, members == 0 ? 0 : static_cast<std::uint64_t>(std::llround(total / members)));
  }
}

}  // namespace spillway
