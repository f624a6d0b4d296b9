// Forwarded byte rates per backend index, from the workers' cumulative byte
// counters: what byte-aware placement (spillway/placement.hpp) balances.
//
// Each sample(now, bytes) takes the counters summed over the workers; the rate
// of index i is an exponentially weighted moving average of the instantaneous
// rates between samples, with time constant `smoothing` (the weight of a
// sample dt after the previous one is 1 - exp(-dt / smoothing), so irregular
// sampling smooths the same). A counter that went down (its index was purged
// and recycled for another backend) restarts that index at rate 0.
//
// Thread contract: owned by the control thread; no clock (time is passed in),
// no I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "spillway/flow_table.hpp"

namespace spillway {

class ByteRateMeter {
 public:
  explicit ByteRateMeter(Millis smoothing) : smoothing_(smoothing) {}

  void setSmoothing(Millis smoothing) noexcept { smoothing_ = smoothing; }
  void sample(Millis now, std::span<const std::uint64_t> bytes);
  // Bytes per second; 0 for an index never sampled.
  [[nodiscard]] double rate(std::uint32_t index) const noexcept {
    return index < rates_.size() ? rates_[index] : 0.0;
  }
  [[nodiscard]] std::size_t size() const noexcept { return rates_.size(); }

 private:
  Millis smoothing_;
  std::optional<Millis> lastAt_;
  std::vector<std::uint64_t> last_;
  std::vector<double> rates_;
};

}  // namespace spillway
