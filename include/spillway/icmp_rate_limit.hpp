// Rate limits on the ICMP messages the load balancer itself sends (echo
// replies for a VIP that answers pings, "fragmentation needed" and "packet
// too big"), so that it cannot be made a reflector or an amplifier and a
// flood of pings or oversized packets costs it a bounded amount of work and
// uplink (issue #13; the idea of Linux's icmp_msgs_per_sec / icmp_msgs_burst
// in total and icmp_ratelimit per peer).
//
// Two token buckets must both hold a token for a reply to go: one per lcore
// for every reply, and one per source address, kept in a fixed array of
// kSourceBuckets buckets indexed by a keyed hash of the source (sources that
// share a bucket share its budget; the key hides which ones do). A reply
// refused by either is not built: the caller drops the packet with
// DropReason::IcmpRateLimited. A bucket holds at most `burst` tokens and
// gains `perSecond` a second, counted in thousandths of a token per
// millisecond, so rates from 1 a second upward are exact.
//
// Time is the caller's (`now` in milliseconds, monotonic); the limiter reads
// no clock. Stamps keep 32 bits: a bucket idle for more than ~49 days may be
// refilled or not, either of which is harmless.
//
// Thread contract: one owner lcore; no allocation after construction, no
// locks, noexcept.
#pragma once

#include <array>
#include <cstdint>

#include "spillway/flow_key.hpp"

namespace spillway {

struct IcmpRateLimits {
  std::uint32_t perSecond = 1'000;        // replies per second, per lcore in total
  std::uint32_t burst = 100;              // ... up to this many at once
  std::uint32_t perSourcePerSecond = 10;  // replies per second to one source
  std::uint32_t perSourceBurst = 20;
};

class IcmpRateLimiter {
 public:
  static constexpr std::size_t kSourceBuckets = 1024;  // power of two; 8 KiB

  IcmpRateLimiter(const IcmpRateLimits& limits, const FlowHasher& hasher) noexcept;

  // True, and one token taken from both buckets, when a reply to `source`
  // may go now; false (nothing taken) when either bucket is empty.
  [[nodiscard]] bool allow(const IpBytes& source, std::uint64_t nowMs) noexcept;

  [[nodiscard]] const IcmpRateLimits& limits() const noexcept { return limits_; }

 private:
  struct Bucket {
    std::uint32_t milliTokens = 0;  // the constructor fills every bucket
    std::uint32_t stamp = 0;
  };
  // Refills `b` for `now`; true when it holds a whole token.
  static bool refill(Bucket& b, std::uint32_t now32, std::uint32_t perSecond,
                     std::uint32_t burst) noexcept;

  IcmpRateLimits limits_;
  FlowHasher hasher_;
  Bucket total_{};
  std::array<Bucket, kSourceBuckets> sources_{};
};

}  // namespace spillway
