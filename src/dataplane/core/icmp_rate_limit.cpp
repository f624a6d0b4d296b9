#include "spillway/icmp_rate_limit.hpp"

#include <algorithm>
#include <cstring>

namespace spillway {
namespace {

constexpr std::uint32_t kMilli = 1000;
constexpr std::uint64_t kSourceDomain = 0x69636d70'72617465ULL;  // "icmprate"

}  // namespace

IcmpRateLimiter::IcmpRateLimiter(const IcmpRateLimits& limits, const FlowHasher& hasher) noexcept
    : limits_(limits), hasher_(hasher) {
  // Buckets hold at most burst * 1000 milli-tokens in 32 bits.
  limits_.burst = std::min<std::uint32_t>(limits_.burst, 4'000'000);
  limits_.perSourceBurst = std::min<std::uint32_t>(limits_.perSourceBurst, 4'000'000);
  total_.milliTokens = limits_.burst * kMilli;
  for (Bucket& b : sources_) b.milliTokens = limits_.perSourceBurst * kMilli;
}

bool IcmpRateLimiter::refill(Bucket& b, std::uint32_t now32, std::uint32_t perSecond,
                             std::uint32_t burst) noexcept {
  const std::uint64_t cap = std::uint64_t{burst} * kMilli;
  // perSecond tokens a second = perSecond milli-tokens a millisecond.
  const std::uint64_t gained = std::uint64_t{now32 - b.stamp} * perSecond;
  b.milliTokens = static_cast<std::uint32_t>(std::min(cap, b.milliTokens + gained));
  b.stamp = now32;
  return b.milliTokens >= kMilli;
}

bool IcmpRateLimiter::allow(const IpBytes& source, std::uint64_t nowMs) noexcept {
  const auto now32 = static_cast<std::uint32_t>(nowMs);
  std::uint64_t low;
  std::uint64_t high;
  std::memcpy(&low, source.data(), sizeof low);
  std::memcpy(&high, source.data() + sizeof low, sizeof high);
  const std::uint64_t h = hasher_.hashId(low ^ ((high << 29) | (high >> 35)), kSourceDomain);
  Bucket& perSource = sources_[h & (kSourceBuckets - 1)];
  const bool sourceOk =
      refill(perSource, now32, limits_.perSourcePerSecond, limits_.perSourceBurst);
  const bool totalOk = refill(total_, now32, limits_.perSecond, limits_.burst);
  if (!sourceOk || !totalOk) return false;
  perSource.milliTokens -= kMilli;
  total_.milliTokens -= kMilli;
  return true;
}

}  // namespace spillway
