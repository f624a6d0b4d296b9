// Internet checksum (RFC 1071) and its incremental update (RFC 1624).
//
// Sums are kept unfolded in 32 bits while accumulating and folded once at the
// end. Pure functions; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "spillway/byte_order.hpp"
#include "spillway/wire.hpp"

namespace spillway {

// One's-complement sum of `bytes` (big-endian 16-bit words; an odd last byte
// is padded with zero) added to `initial`. Not folded.
[[nodiscard]] std::uint32_t checksumPartial(std::span<const std::byte> bytes,
                                            std::uint32_t initial = 0) noexcept;

// Folds a partial sum to 16 bits and complements it: the value to store in a
// checksum field.
[[nodiscard]] constexpr std::uint16_t checksumFinish(std::uint32_t sum) noexcept {
  sum = (sum & 0xffff) + (sum >> 16);
  sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<std::uint16_t>(~sum);
}

[[nodiscard]] inline std::uint16_t internetChecksum(std::span<const std::byte> bytes) noexcept {
  return checksumFinish(checksumPartial(bytes));
}

// The checksum of an IPv4 header without options, summed from its fields (the
// checksum field as it stands, normally 0): equal to internetChecksum() over
// its 20 bytes, without a loop, and without reading back a header just built
// field by field, which would stall store forwarding.
[[nodiscard]] constexpr std::uint16_t ipv4HeaderChecksum(const Ipv4Header& h) noexcept {
  const auto word = [](std::uint8_t high, std::uint8_t low) {
    return static_cast<std::uint32_t>((high << 8) | low);
  };
  std::uint32_t sum = word(h.versionIhl, h.tos) + h.totalLength.host() + h.id.host() +
                      h.flagsFragment.host() + word(h.ttl, h.protocol) + h.checksum.host();
  sum += word(h.src[0], h.src[1]) + word(h.src[2], h.src[3]);
  sum += word(h.dst[0], h.dst[1]) + word(h.dst[2], h.dst[3]);
  return checksumFinish(sum);
}

// RFC 1624 eqn. 3: the new checksum after one 16-bit word of the covered data
// changes from `oldWord` to `newWord`.
[[nodiscard]] constexpr std::uint16_t checksumUpdate16(std::uint16_t oldChecksum,
                                                       std::uint16_t oldWord,
                                                       std::uint16_t newWord) noexcept {
  std::uint32_t sum = static_cast<std::uint16_t>(~oldChecksum);
  sum += static_cast<std::uint16_t>(~oldWord);
  sum += newWord;
  return checksumFinish(sum);
}

// The IPv4 header checksum after the TTL (the high byte of its 16-bit word)
// drops by one, for a TTL of at least 2: RFC 1624 eqn. 3 for that change
// (checksumUpdate16(c, ttl << 8 | p, (ttl - 1) << 8 | p) for every c, ttl >=
// 2 and p; checksum_test checks all of them), as one add and a carry.
[[nodiscard]] constexpr std::uint16_t checksumAfterTtlDecrement(std::uint16_t checksum) noexcept {
  const std::uint32_t sum = std::uint32_t{checksum} + 0x0100;
  return static_cast<std::uint16_t>(sum + (sum >= 0xffff ? 1 : 0));
}

// Pseudo-header sums for TCP/UDP/ICMPv6 checksums (RFC 793, RFC 8200 §8.1).
[[nodiscard]] std::uint32_t pseudoHeaderSumV4(std::span<const std::uint8_t, 4> src,
                                              std::span<const std::uint8_t, 4> dst,
                                              std::uint8_t protocol,
                                              std::uint32_t l4Length) noexcept;
[[nodiscard]] std::uint32_t pseudoHeaderSumV6(std::span<const std::uint8_t, 16> src,
                                              std::span<const std::uint8_t, 16> dst,
                                              std::uint8_t nextHeader,
                                              std::uint32_t l4Length) noexcept;

}  // namespace spillway
