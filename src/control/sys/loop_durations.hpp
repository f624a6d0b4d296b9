// How long the control loop's iterations take: the longest since start and a
// histogram with fixed buckets, exported as spillway_control_loop_tick_seconds
// (and _max_seconds). A long iteration delays health probes, scrapes and
// operator replies alike, so this is where a misbehaving backend that makes
// the loop wait would show. The caller measures (its own clock) and records.
//
// Thread contract: control thread only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace spillway {

class LoopDurations {
 public:
  // Upper bounds of the buckets, seconds; the +Inf bucket is count().
  static constexpr std::array<double, 12> kBounds{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                  0.05,   0.1,   0.25,   0.5,   1.0,  2.5};

  void record(double seconds) noexcept {
    if (!(seconds >= 0.0)) seconds = 0.0;
    ++count_;
    sum_ += seconds;
    if (seconds > max_) max_ = seconds;
    for (std::size_t i = 0; i < kBounds.size(); ++i) {
      if (seconds <= kBounds[i]) {
        ++perBucket_[i];
        break;
      }
    }
  }

  [[nodiscard]] std::uint64_t count() const noexcept { return count_; }
  [[nodiscard]] double sum() const noexcept { return sum_; }
  [[nodiscard]] double max() const noexcept { return max_; }
  // Observations in (kBounds[i-1], kBounds[i]]; not cumulative.
  [[nodiscard]] std::span<const std::uint64_t> perBucket() const noexcept { return perBucket_; }

 private:
  std::array<std::uint64_t, kBounds.size()> perBucket_{};
  std::uint64_t count_ = 0;
  double sum_ = 0.0;
  double max_ = 0.0;
};

}  // namespace spillway
