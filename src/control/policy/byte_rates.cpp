#include "control/policy/byte_rates.hpp"

#include <algorithm>
#include <cmath>

namespace spillway {

void ByteRateMeter::sample(Millis now, std::span<const std::uint64_t> bytes) {
  if (bytes.size() > last_.size()) {
    // New indices start from their current count: their past is not a rate.
    for (std::size_t i = last_.size(); i < bytes.size(); ++i) last_.push_back(bytes[i]);
    rates_.resize(bytes.size(), 0.0);
  }
  if (!lastAt_ || now <= *lastAt_) {
    if (!lastAt_) lastAt_ = now;
    for (std::size_t i = 0; i < bytes.size(); ++i) last_[i] = bytes[i];
    return;
  }
  const double dt = static_cast<double>(now - *lastAt_) / 1000.0;
  const double weight = 1.0 - std::exp(-static_cast<double>(now - *lastAt_) /
                                       static_cast<double>(std::max<Millis>(1, smoothing_)));
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] < last_[i]) {
      rates_[i] = 0.0;
    } else {
      const double instant = static_cast<double>(bytes[i] - last_[i]) / dt;
      rates_[i] += weight * (instant - rates_[i]);
    }
    last_[i] = bytes[i];
  }
  lastAt_ = now;
}

}  // namespace spillway
