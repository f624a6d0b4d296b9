#include "spillway/checksum.hpp"

#include <gtest/gtest.h>

#include <array>
#include <random>
#include <vector>

namespace spillway {
namespace {

// RFC 1071 §3 example: words 0001 f203 f4f5 f6f7 sum to ddf2 (folded).
// The TTL decrement's one-add update equals RFC 1624 eqn. 3 for every
// checksum, every TTL the encapsulation decrements (>= 2) and every protocol.
TEST(Checksum, TtlDecrementMatchesRfc1624ForEveryChecksumTtlAndProtocol) {
  std::uint64_t mismatches = 0;
  for (std::uint32_t c = 0; c <= 0xffff; ++c) {
    const auto expected = checksumAfterTtlDecrement(static_cast<std::uint16_t>(c));
    for (std::uint32_t ttl = 2; ttl <= 255; ++ttl) {
      for (const std::uint32_t proto : {0u, 4u, 6u, 17u, 41u, 255u}) {
        mismatches +=
            checksumUpdate16(static_cast<std::uint16_t>(c),
                             static_cast<std::uint16_t>(ttl << 8 | proto),
                             static_cast<std::uint16_t>((ttl - 1) << 8 | proto)) != expected;
      }
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(Checksum, Rfc1071Example) {
  std::vector<std::byte> data;
  for (int b : {0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}) data.push_back(std::byte(b));
  EXPECT_EQ(checksumFinish(checksumPartial(data)), static_cast<std::uint16_t>(~0xddf2));
}

TEST(Checksum, OddLengthPadsWithZero) {
  std::vector<std::byte> odd{std::byte{0x12}, std::byte{0x34}, std::byte{0x56}};
  std::vector<std::byte> even{std::byte{0x12}, std::byte{0x34}, std::byte{0x56}, std::byte{0}};
  EXPECT_EQ(internetChecksum(odd), internetChecksum(even));
}

// A 20-byte IPv4 header from RFC 1071 style worked examples: checksum b861.
TEST(Checksum, KnownIpv4Header) {
  std::vector<std::byte> h;
  for (int b : {0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11,
                0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7}) {
    h.push_back(std::byte(b));
  }
  EXPECT_EQ(internetChecksum(h), 0xb861);
}

// The field-wise IPv4 header checksum equals the generic RFC 1071 sum over
// the header's bytes, for random headers (checksum field zero or not, so
// carries of every size are exercised), and the known header above.
TEST(Checksum, Ipv4HeaderChecksumMatchesGeneric) {
  std::mt19937 rng(11);
  for (int iter = 0; iter < 100000; ++iter) {
    std::array<std::byte, sizeof(Ipv4Header)> bytes;
    for (auto& b : bytes) b = std::byte(rng());
    if (iter % 4 == 0) bytes[10] = bytes[11] = std::byte{0};
    if (iter % 16 == 1) bytes.fill(std::byte{0xff});
    const auto header = loadAt<Ipv4Header>(bytes, 0);
    ASSERT_EQ(ipv4HeaderChecksum(header), internetChecksum(bytes)) << iter;
  }
  std::array<std::byte, sizeof(Ipv4Header)> known;
  const int knownBytes[] = {0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11,
                            0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7};
  for (std::size_t i = 0; i < known.size(); ++i) known[i] = std::byte(knownBytes[i]);
  EXPECT_EQ(ipv4HeaderChecksum(loadAt<Ipv4Header>(known, 0)), 0xb861);
  static_assert(sizeof(Ipv4Header) == 20);
}

TEST(Checksum, IncrementalUpdateMatchesRecompute) {
  std::mt19937 rng(3);
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<std::byte> data(40);
    for (auto& b : data) b = std::byte(rng());
    data[10] = data[11] = std::byte{0};
    const auto c = internetChecksum(data);
    data[10] = std::byte(c >> 8);
    data[11] = std::byte(c & 0xff);
    const std::size_t at = 2 * (rng() % 20);
    if (at == 10) continue;
    const std::uint16_t oldWord = static_cast<std::uint16_t>((std::to_integer<int>(data[at]) << 8) |
                                                             std::to_integer<int>(data[at + 1]));
    const std::uint16_t newWord = static_cast<std::uint16_t>(rng());
    data[at] = std::byte(newWord >> 8);
    data[at + 1] = std::byte(newWord & 0xff);
    const auto updated = checksumUpdate16(c, oldWord, newWord);
    // The updated header verifies: the sum over everything including the
    // checksum is 0xffff (folded), i.e. its complement is 0.
    data[10] = std::byte(updated >> 8);
    data[11] = std::byte(updated & 0xff);
    EXPECT_EQ(internetChecksum(data), 0) << iter;
  }
}

}  // namespace
}  // namespace spillway
