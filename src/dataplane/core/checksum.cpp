#include "spillway/checksum.hpp"

#include <cstring>

namespace spillway {

std::uint32_t checksumPartial(std::span<const std::byte> bytes, std::uint32_t initial) noexcept {
  // 64-bit accumulator of 32-bit big-endian words; folded at the end. Carries
  // cannot overflow 64 bits for any packet size Spillway handles.
  std::uint64_t sum = initial;
  const std::byte* p = bytes.data();
  std::size_t n = bytes.size();
  while (n >= 4) {
    std::uint32_t w;
    std::memcpy(&w, p, 4);
    sum += __builtin_bswap32(w);
    p += 4;
    n -= 4;
  }
  if (n >= 2) {
    sum += (std::to_integer<std::uint32_t>(p[0]) << 8) | std::to_integer<std::uint32_t>(p[1]);
    p += 2;
    n -= 2;
  }
  if (n == 1) sum += std::to_integer<std::uint32_t>(p[0]) << 8;
  sum = (sum & 0xffffffffULL) + (sum >> 32);
  sum = (sum & 0xffffffffULL) + (sum >> 32);
  // Fold the 32-bit value into 16 bits' worth so callers can keep adding.
  std::uint32_t s = static_cast<std::uint32_t>(sum);
  s = (s & 0xffff) + (s >> 16);
  return s;
}

std::uint32_t pseudoHeaderSumV4(std::span<const std::uint8_t, 4> src,
                                std::span<const std::uint8_t, 4> dst, std::uint8_t protocol,
                                std::uint32_t l4Length) noexcept {
  std::uint32_t sum = 0;
  sum += (std::uint32_t{src[0]} << 8) | src[1];
  sum += (std::uint32_t{src[2]} << 8) | src[3];
  sum += (std::uint32_t{dst[0]} << 8) | dst[1];
  sum += (std::uint32_t{dst[2]} << 8) | dst[3];
  sum += protocol;
  sum += l4Length & 0xffff;
  sum += l4Length >> 16;
  return sum;
}

std::uint32_t pseudoHeaderSumV6(std::span<const std::uint8_t, 16> src,
                                std::span<const std::uint8_t, 16> dst, std::uint8_t nextHeader,
                                std::uint32_t l4Length) noexcept {
  std::uint32_t sum = 0;
  for (std::size_t i = 0; i < 16; i += 2) {
    sum += (std::uint32_t{src[i]} << 8) | src[i + 1];
    sum += (std::uint32_t{dst[i]} << 8) | dst[i + 1];
  }
  sum += l4Length >> 16;
  sum += l4Length & 0xffff;
  sum += nextHeader;
  return sum;
}

}  // namespace spillway
