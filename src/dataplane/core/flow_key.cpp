#include "spillway/flow_key.hpp"

#include <bit>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

// FlowTableHasher ---------------------------------------------------------

namespace {

// FIPS-197 S-box.
constexpr std::array<std::uint8_t, 256> kAesSbox = {
    0x63, 0x7c, 0x77, 0x7b, 0xf2, 0x6b, 0x6f, 0xc5, 0x30, 0x01, 0x67, 0x2b, 0xfe, 0xd7, 0xab, 0x76,
    0xca, 0x82, 0xc9, 0x7d, 0xfa, 0x59, 0x47, 0xf0, 0xad, 0xd4, 0xa2, 0xaf, 0x9c, 0xa4, 0x72, 0xc0,
    0xb7, 0xfd, 0x93, 0x26, 0x36, 0x3f, 0xf7, 0xcc, 0x34, 0xa5, 0xe5, 0xf1, 0x71, 0xd8, 0x31, 0x15,
    0x04, 0xc7, 0x23, 0xc3, 0x18, 0x96, 0x05, 0x9a, 0x07, 0x12, 0x80, 0xe2, 0xeb, 0x27, 0xb2, 0x75,
    0x09, 0x83, 0x2c, 0x1a, 0x1b, 0x6e, 0x5a, 0xa0, 0x52, 0x3b, 0xd6, 0xb3, 0x29, 0xe3, 0x2f, 0x84,
    0x53, 0xd1, 0x00, 0xed, 0x20, 0xfc, 0xb1, 0x5b, 0x6a, 0xcb, 0xbe, 0x39, 0x4a, 0x4c, 0x58, 0xcf,
    0xd0, 0xef, 0xaa, 0xfb, 0x43, 0x4d, 0x33, 0x85, 0x45, 0xf9, 0x02, 0x7f, 0x50, 0x3c, 0x9f, 0xa8,
    0x51, 0xa3, 0x40, 0x8f, 0x92, 0x9d, 0x38, 0xf5, 0xbc, 0xb6, 0xda, 0x21, 0x10, 0xff, 0xf3, 0xd2,
    0xcd, 0x0c, 0x13, 0xec, 0x5f, 0x97, 0x44, 0x17, 0xc4, 0xa7, 0x7e, 0x3d, 0x64, 0x5d, 0x19, 0x73,
    0x60, 0x81, 0x4f, 0xdc, 0x22, 0x2a, 0x90, 0x88, 0x46, 0xee, 0xb8, 0x14, 0xde, 0x5e, 0x0b, 0xdb,
    0xe0, 0x32, 0x3a, 0x0a, 0x49, 0x06, 0x24, 0x5c, 0xc2, 0xd3, 0xac, 0x62, 0x91, 0x95, 0xe4, 0x79,
    0xe7, 0xc8, 0x37, 0x6d, 0x8d, 0xd5, 0x4e, 0xa9, 0x6c, 0x56, 0xf4, 0xea, 0x65, 0x7a, 0xae, 0x08,
    0xba, 0x78, 0x25, 0x2e, 0x1c, 0xa6, 0xb4, 0xc6, 0xe8, 0xdd, 0x74, 0x1f, 0x4b, 0xbd, 0x8b, 0x8a,
    0x70, 0x3e, 0xb5, 0x66, 0x48, 0x03, 0xf6, 0x0e, 0x61, 0x35, 0x57, 0xb9, 0x86, 0xc1, 0x1d, 0x9e,
    0xe1, 0xf8, 0x98, 0x11, 0x69, 0xd9, 0x8e, 0x94, 0x9b, 0x1e, 0x87, 0xe9, 0xce, 0x55, 0x28, 0xdf,
    0x8c, 0xa1, 0x89, 0x0d, 0xbf, 0xe6, 0x42, 0x68, 0x41, 0x99, 0x2d, 0x0f, 0xb0, 0x54, 0xbb, 0x16,
};

constexpr std::uint8_t xtime(std::uint8_t x) noexcept {
  return static_cast<std::uint8_t>((x << 1) ^ ((x & 0x80) != 0 ? 0x1b : 0));
}

// The round keys' domain for FlowHasher::hashId ("ftkey").
constexpr std::uint64_t kTableKeyDomain = 0x6674'6b65'7900'0000ULL;

using Block = FlowTableHasher::Block;

// The key's blocks: IPv4 one (src, dst, then key bytes 32..39: ports,
// protocol, version, padding); IPv6 three (src, dst, bytes 32..39 and 8
// zero bytes). Little-endian words, so Block.lo's byte i is the message's.
std::uint64_t loadLe32(const std::byte* p) noexcept {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap32(v);
  return v;
}

std::uint64_t tailWord(const FlowKey& key) noexcept {
  static_assert(offsetof(FlowKey, srcPort) == 32 && offsetof(FlowKey, pad) == 38);
  return loadLe64(reinterpret_cast<const std::byte*>(&key) + 32);
}

Block xorBlock(Block a, Block b) noexcept {
  return Block{a.lo ^ b.lo, a.hi ^ b.hi};
}

[[gnu::noinline]] std::uint64_t hashPortable(
    const std::array<Block, FlowTableHasher::kRoundKeys>& k, const FlowKey& key) noexcept {
  auto encrypt = [&k](Block s) noexcept {
    for (std::size_t r = 1; r < FlowTableHasher::kRoundKeys; ++r) {
      s = FlowTableHasher::aesRound(s, k[r]);
    }
    return s;
  };
  Block s;
  if (key.version == IpVersion::V4) {
    s = encrypt(xorBlock(
        Block{loadLe32(key.src.data()) | (loadLe32(key.dst.data()) << 32), tailWord(key)}, k[0]));
  } else {
    s = encrypt(xorBlock(Block{loadLe64(key.src.data()), loadLe64(key.src.data() + 8)}, k[0]));
    s = encrypt(xorBlock(s, Block{loadLe64(key.dst.data()), loadLe64(key.dst.data() + 8)}));
    s = encrypt(xorBlock(s, Block{tailWord(key), 0}));
  }
  return s.lo ^ s.hi;
}

#if defined(__x86_64__)
#define SPILLWAY_AES_TARGET __attribute__((target("aes,sse4.1")))

SPILLWAY_AES_TARGET inline __m128i encryptAesNi(__m128i s, const __m128i* k) noexcept {
  s = _mm_aesenc_si128(s, _mm_loadu_si128(k + 1));
  s = _mm_aesenc_si128(s, _mm_loadu_si128(k + 2));
  s = _mm_aesenc_si128(s, _mm_loadu_si128(k + 3));
  return _mm_aesenc_si128(s, _mm_loadu_si128(k + 4));
}

SPILLWAY_AES_TARGET inline std::uint64_t hashAesNi(
    const std::array<Block, FlowTableHasher::kRoundKeys>& k, const FlowKey& key) noexcept {
  static_assert(sizeof(Block) == 16 && std::endian::native == std::endian::little);
  const auto* kp = reinterpret_cast<const __m128i*>(k.data());
  const __m128i k0 = _mm_loadu_si128(kp);
  const auto tail = static_cast<long long>(tailWord(key));
  __m128i s;
  if (key.version == IpVersion::V4) {
    const auto lo =
        static_cast<long long>(loadLe32(key.src.data()) | (loadLe32(key.dst.data()) << 32));
    s = encryptAesNi(_mm_xor_si128(_mm_set_epi64x(tail, lo), k0), kp);
  } else {
    const auto* src = reinterpret_cast<const __m128i*>(key.src.data());
    const auto* dst = reinterpret_cast<const __m128i*>(key.dst.data());
    s = encryptAesNi(_mm_xor_si128(_mm_loadu_si128(src), k0), kp);
    s = encryptAesNi(_mm_xor_si128(s, _mm_loadu_si128(dst)), kp);
    s = encryptAesNi(_mm_xor_si128(s, _mm_set_epi64x(0, tail)), kp);
  }
  return static_cast<std::uint64_t>(_mm_cvtsi128_si64(s)) ^
         static_cast<std::uint64_t>(_mm_extract_epi64(s, 1));
}
#endif

}  // namespace

Block FlowTableHasher::aesRound(Block state, Block roundKey) noexcept {
  std::array<std::uint8_t, 16> b;
  for (unsigned i = 0; i < 8; ++i) {
    b[i] = static_cast<std::uint8_t>(state.lo >> (8 * i));
    b[8 + i] = static_cast<std::uint8_t>(state.hi >> (8 * i));
  }
  // SubBytes and ShiftRows: byte 4c + r is row r of column c; row r moves
  // left by r columns.
  std::array<std::uint8_t, 16> t;
  for (unsigned c = 0; c < 4; ++c) {
    for (unsigned r = 0; r < 4; ++r) t[4 * c + r] = kAesSbox[b[4 * ((c + r) % 4) + r]];
  }
  // MixColumns.
  std::array<std::uint8_t, 16> m;
  for (unsigned c = 0; c < 4; ++c) {
    const std::uint8_t a0 = t[4 * c], a1 = t[4 * c + 1], a2 = t[4 * c + 2], a3 = t[4 * c + 3];
    const std::uint8_t all = a0 ^ a1 ^ a2 ^ a3;
    m[4 * c] = static_cast<std::uint8_t>(a0 ^ all ^ xtime(a0 ^ a1));
    m[4 * c + 1] = static_cast<std::uint8_t>(a1 ^ all ^ xtime(a1 ^ a2));
    m[4 * c + 2] = static_cast<std::uint8_t>(a2 ^ all ^ xtime(a2 ^ a3));
    m[4 * c + 3] = static_cast<std::uint8_t>(a3 ^ all ^ xtime(a3 ^ a0));
  }
  Block out{};
  for (unsigned i = 0; i < 8; ++i) {
    out.lo |= std::uint64_t{m[i]} << (8 * i);
    out.hi |= std::uint64_t{m[8 + i]} << (8 * i);
  }
  return xorBlock(out, roundKey);
}

bool FlowTableHasher::cpuHasAesNi() noexcept {
#if defined(__x86_64__)
  return __builtin_cpu_supports("aes") && __builtin_cpu_supports("sse4.1");
#else
  return false;
#endif
}

FlowTableHasher::FlowTableHasher(std::uint64_t seed) noexcept : FlowTableHasher(seed, true) {}

FlowTableHasher::FlowTableHasher(std::uint64_t seed, bool accelerated) noexcept
    : aesNi_(accelerated && cpuHasAesNi()) {
  const FlowHasher derive(seed);
  for (std::size_t i = 0; i < kRoundKeys; ++i) {
    keys_[i] =
        Block{derive.hashId(2 * i, kTableKeyDomain), derive.hashId(2 * i + 1, kTableKeyDomain)};
  }
}

// Compiled for AES-NI so that hashAesNi() inlines (one call a packet, not
// two); the AES instructions run only where the constructor found them, and
// the portable path is an ordinary call (x86-64-v2 code, no AES).
#if defined(__x86_64__)
SPILLWAY_AES_TARGET
#endif
std::uint64_t FlowTableHasher::hash(const FlowKey& key) const noexcept {
#if defined(__x86_64__)
  if (aesNi_) [[likely]]
    return hashAesNi(keys_, key);
#endif
  return hashPortable(keys_, key);
}

}  // namespace spillway
