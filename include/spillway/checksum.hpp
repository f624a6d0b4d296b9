// Internet checksum (RFC 1071) and its incremental update (RFC 1624).
//
// Sums are kept unfolded in 32 bits while accumulating and folded once at the
// end. Pure functions; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "spillway/byte_order.hpp"

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
