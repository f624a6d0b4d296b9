#include "spillway/flow_key.hpp"

#include <bit>

namespace spillway {
namespace {

struct SipState {
  std::uint64_t v0, v1, v2, v3;

  SipState(std::uint64_t k0, std::uint64_t k1) noexcept
      : v0(k0 ^ 0x736f6d6570736575ULL),
        v1(k1 ^ 0x646f72616e646f6dULL),
        v2(k0 ^ 0x6c7967656e657261ULL),
        v3(k1 ^ 0x7465646279746573ULL) {}

  void round() noexcept {
    v0 += v1;
    v1 = std::rotl(v1, 13);
    v1 ^= v0;
    v0 = std::rotl(v0, 32);
    v2 += v3;
    v3 = std::rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = std::rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = std::rotl(v1, 17);
    v1 ^= v2;
    v2 = std::rotl(v2, 32);
  }

  template <int C>
  void absorb(std::uint64_t m) noexcept {
    v3 ^= m;
    for (int i = 0; i < C; ++i) round();
    v0 ^= m;
  }

  template <int D>
  std::uint64_t finish() noexcept {
    v2 ^= 0xff;
    for (int i = 0; i < D; ++i) round();
    return v0 ^ v1 ^ v2 ^ v3;
  }
};

// splitmix64 (Steele, Lea, Flood 2014): expands the 64-bit configured seed into
// the two SipHash key words.
constexpr std::uint64_t splitMix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

template <int C, int D>
std::uint64_t sipHash(std::uint64_t k0, std::uint64_t k1,
                      std::span<const std::byte> message) noexcept {
  SipState s(k0, k1);
  const std::size_t whole = message.size() & ~std::size_t{7};
  for (std::size_t i = 0; i < whole; i += 8) s.absorb<C>(loadLe64(message.data() + i));
  std::uint64_t last = std::uint64_t{message.size() & 0xff} << 56;
  for (std::size_t i = whole; i < message.size(); ++i) {
    last |= std::uint64_t{std::to_integer<std::uint8_t>(message[i])} << (8 * (i - whole));
  }
  s.absorb<C>(last);
  return s.finish<D>();
}

template std::uint64_t sipHash<1, 3>(std::uint64_t, std::uint64_t,
                                     std::span<const std::byte>) noexcept;
template std::uint64_t sipHash<2, 4>(std::uint64_t, std::uint64_t,
                                     std::span<const std::byte>) noexcept;

FlowHasher::FlowHasher(std::uint64_t seed) noexcept
    : k0_(splitMix64(seed)), k1_(splitMix64(seed ^ 0x5370696c6c776179ULL)) {}

std::uint64_t FlowHasher::hash(const FlowKey& key) const noexcept {
  const auto* src = key.src.data();
  const auto* dst = key.dst.data();
  // Tail word: srcPort, dstPort, proto, version, two zero bytes, little-endian.
  const std::uint64_t tail =
      std::uint64_t{key.srcPort.raw[0]} | (std::uint64_t{key.srcPort.raw[1]} << 8) |
      (std::uint64_t{key.dstPort.raw[0]} << 16) | (std::uint64_t{key.dstPort.raw[1]} << 24) |
      (std::uint64_t{key.proto} << 32) |
      (std::uint64_t{static_cast<std::uint8_t>(key.version)} << 40);
  SipState s(k0_, k1_);
  if (key.version == IpVersion::V4) {
    std::uint32_t s4, d4;
    std::memcpy(&s4, src, 4);
    std::memcpy(&d4, dst, 4);
    if constexpr (std::endian::native == std::endian::big) {
      s4 = __builtin_bswap32(s4);
      d4 = __builtin_bswap32(d4);
    }
    s.absorb<1>(std::uint64_t{s4} | (std::uint64_t{d4} << 32));
    s.absorb<1>(tail);
    s.absorb<1>(std::uint64_t{16} << 56);
  } else {
    s.absorb<1>(loadLe64(src));
    s.absorb<1>(loadLe64(src + 8));
    s.absorb<1>(loadLe64(dst));
    s.absorb<1>(loadLe64(dst + 8));
    s.absorb<1>(tail);
    s.absorb<1>(std::uint64_t{40} << 56);
  }
  return s.finish<3>();
}

std::uint64_t FlowHasher::hashId(std::uint64_t id, std::uint64_t domain) const noexcept {
  SipState s(k0_, k1_);
  s.absorb<1>(id);
  s.absorb<1>(domain);
  s.absorb<1>(std::uint64_t{16} << 56);
  return s.finish<3>();
}

}  // namespace spillway
