// The 5-tuple that names a flow, and the keyed hash every Spillway component
// uses for it.
//
// One FlowKey layout serves IPv4 and IPv6: an IPv4 address fills the first four
// bytes of its 16-byte field and the rest stay zero, so keys compare with
// memcmp and hash without branches on the address family beyond the length.
//
// Two keyed hashes, each where its threat and its cost fit (the threat model:
// ARCHITECTURE.md, "Flow hashes and what a collision costs").
//
// FlowHasher is SipHash-1-3 keyed by a 128-bit key expanded from the
// configured 64-bit seed: the flow's identity, the one value that leaves the
// lcore (Maglev slot, exception table, flows.ckpt, history.bin, peer
// records, connection-list rebuild). Every instance configured with the same seed hashes
// a flow to the same 64-bit value, so every load balancer behind ECMP picks
// the same backend for it; an attacker who does not know the seed cannot
// craft 5-tuples that collide (hash flooding). Why SipHash-1-3 rather than
// CRC32C or xxh3: see BENCHMARKS.md, "Flow hash".
//
//
// FlowTableHasher is the per-packet hash: the key of the lcore's own flow
// table only, never persisted, never sent, never compared between processes.
// Four AES rounds (AES-NI `aesenc`) per 16-byte block with five 128-bit
// round keys derived one-way from the seed (FlowHasher::hashId under their
// own domains), chained over the blocks and folded to 64 bits:
// about 15 instructions for an IPv4 key against SipHash-1-3's 128. Where the
// CPU has no AES-NI (checked once, at construction) a portable AES round
// gives the same value bit for bit (a unit test compares both). Not a PRF
// with a proof, as SipHash is: a keyed mix whose key the attacker does not
// know and cannot learn from any output the load balancer sends, so it cannot
// aim 5-tuples at one bucket; the same middle ground as aHash (Rust) or
// VPP's hardware hashes, with a key where those have none.
//
// Thread contract: both are immutable after construction; any number of
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

class FlowTableHasher {
 public:
  // 16-byte AES state or round key as two little-endian words.
  struct Block {
    std::uint64_t lo = 0;
    std::uint64_t hi = 0;
    friend bool operator==(const Block&, const Block&) = default;
  };
  static constexpr std::size_t kRoundKeys = 5;  // whitening + 4 rounds

  // Round keys from FlowHasher(seed).hashId under their own domains; AES-NI
  // where the CPU has it.
  explicit FlowTableHasher(std::uint64_t seed) noexcept;
  // As above; accelerated = false forces the portable path (tests).
  FlowTableHasher(std::uint64_t seed, bool accelerated) noexcept;

  [[nodiscard]] std::uint64_t hash(const FlowKey& key) const noexcept;

  [[nodiscard]] bool accelerated() const noexcept { return aesNi_; }
  [[nodiscard]] static bool cpuHasAesNi() noexcept;

  // One AES encryption round (SubBytes, ShiftRows, MixColumns, then the
  // round key added), exactly as the `aesenc` instruction computes it; the
  // portable path. Exposed for the test against the instruction.
  [[nodiscard]] static Block aesRound(Block state, Block roundKey) noexcept;

 private:
  std::array<Block, kRoundKeys> keys_{};
  bool aesNi_ = false;
};

}  // namespace spillway
