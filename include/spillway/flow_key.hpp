// The 5-tuple that names a flow, and the keyed hash every Spillway component
// uses for it.
//
// One FlowKey layout serves IPv4 and IPv6: an IPv4 address fills the first four
// bytes of its 16-byte field and the rest stay zero, so keys compare with
// memcmp and hash without branches on the address family beyond the length.
//
// FlowHasher is SipHash-1-3 keyed by a 128-bit key expanded from the
// configured 64-bit seed. Every instance configured with the same seed hashes
// a flow to the same 64-bit value, so every load balancer behind ECMP picks
// the same backend for it; an attacker who does not know the seed cannot
// craft 5-tuples that collide (hash flooding). Why SipHash-1-3 rather than
// CRC32C or xxh3: see BENCHMARKS.md, "Flow hash".
//
// Thread contract: FlowHasher is immutable after construction; any number of
// threads may call hash() concurrently.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "spillway/byte_order.hpp"

namespace spillway {

enum class IpVersion : std::uint8_t { V4 = 4, V6 = 6 };

enum class IpProto : std::uint8_t {
  Icmp = 1,
  Ipip = 4,
  Tcp = 6,
  Udp = 17,
  Ipv6 = 41,
  Icmpv6 = 58,
};

using IpBytes = std::array<std::byte, 16>;

struct FlowKey {
  IpBytes src{};
  IpBytes dst{};
  Be16 srcPort{};
  Be16 dstPort{};
  std::uint8_t proto = 0;
  IpVersion version = IpVersion::V4;
  std::array<std::uint8_t, 2> pad{};  // always zero: keys compare bytewise

  friend bool operator==(const FlowKey&, const FlowKey&) = default;
};
static_assert(sizeof(FlowKey) == 40);
static_assert(alignof(FlowKey) == 1);

// Builds an IpBytes value from an IPv4 address in host order.
[[nodiscard]] constexpr IpBytes ipv4Bytes(std::uint32_t hostOrder) noexcept {
  IpBytes b{};
  b[0] = std::byte(hostOrder >> 24);
  b[1] = std::byte(hostOrder >> 16);
  b[2] = std::byte(hostOrder >> 8);
  b[3] = std::byte(hostOrder);
  return b;
}

// SipHash-c-d (Aumasson and Bernstein, 2012) over an arbitrary byte string.
// Exposed for known-answer tests and for comparing round counts; flows use
// FlowHasher.
template <int CompressionRounds, int FinalizationRounds>
[[nodiscard]] std::uint64_t sipHash(std::uint64_t k0, std::uint64_t k1,
                                    std::span<const std::byte> message) noexcept;

extern template std::uint64_t sipHash<1, 3>(std::uint64_t, std::uint64_t,
                                            std::span<const std::byte>) noexcept;
extern template std::uint64_t sipHash<2, 4>(std::uint64_t, std::uint64_t,
                                            std::span<const std::byte>) noexcept;

class FlowHasher {
 public:
  explicit FlowHasher(std::uint64_t seed) noexcept;

  // Hash of the flow. The message hashed is the key's canonical form: for
  // IPv4 src(4) dst(4) srcPort(2) dstPort(2) proto(1) version(1) padded to
  // 16 bytes; for IPv6 src(16) dst(16) srcPort dstPort proto version padded
  // to 40 bytes.
  [[nodiscard]] std::uint64_t hash(const FlowKey& key) const noexcept;

  // Hash of an arbitrary 64-bit value under the same key, with a domain
  // separator, for things that are not flows (backend ids in Maglev).
  [[nodiscard]] std::uint64_t hashId(std::uint64_t id, std::uint64_t domain) const noexcept;

  [[nodiscard]] std::uint64_t k0() const noexcept { return k0_; }
  [[nodiscard]] std::uint64_t k1() const noexcept { return k1_; }

 private:
  std::uint64_t k0_;
  std::uint64_t k1_;
};

}  // namespace spillway
