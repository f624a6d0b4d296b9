// How long a worker's poll rounds take, for the latency tail (issue #16): a
// round is the time from one round's start to the next one's (everything the
// worker did for it, and any time the kernel took the core away), left out
// when the worker paused on purpose (idle sleep). Buckets by log2 of
// microseconds: bucket 0 counts rounds under 1 us, bucket b in 1..13 those in
// [2^(b-1), 2^b) us, bucket 14 those of 8.192 ms and more. A frame that
// arrives as a round starts waits at most that round, so a tail of rounds
// longer than the frames' p99 points inside the worker; none points outside
// it (the generator, the link, the paced rate).
//
// Thread contract: pure functions; DPDK-free.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace spillway {

inline constexpr std::size_t kRoundBuckets = 15;

// The bucket of a round of `ns` nanoseconds.
[[nodiscard]] constexpr std::size_t roundBucket(std::uint64_t ns) noexcept {
  const std::uint64_t us = ns / 1000;
  const auto b = static_cast<std::size_t>(std::bit_width(us));
  return b < kRoundBuckets ? b : kRoundBuckets - 1;
}

// The upper bound of bucket b in seconds (Prometheus `le`); the last is +Inf.
[[nodiscard]] constexpr double roundBucketUpperSeconds(std::size_t b) noexcept {
  return static_cast<double>(std::uint64_t{1} << b) / 1e6;
}

// Rounds per bucket and their total time.
struct RoundHistogram {
  std::array<std::uint64_t, kRoundBuckets> buckets{};
  std::uint64_t sumNs = 0;
  std::uint64_t maxNs = 0;
};

}  // namespace spillway
