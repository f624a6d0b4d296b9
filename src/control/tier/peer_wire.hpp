// The wire of the peer channel (peer_channel.hpp): how spillwayd instances of
// one tier authenticate each other and frame the flow exceptions they share.
// Pure functions over bytes, no sockets, so the codec is unit-tested and
// fuzzed (tests/fuzz/fuzz_peer_wire.cpp) without a network.
//
// Frame, little-endian (PeerFrameHeader):
//   u32 payload length (at most kPeerMaxPayload), u8 type, 3 zero bytes,
//   payload, and after the handshake a u64 tag:
//     SipHash-2-4(session key of this direction, u64 sequence || header || payload)
//   The sequence is not sent: each side counts the frames of a direction from
//   0, so a replayed, reordered, dropped or reflected frame (the two
//   directions have different keys) fails its tag, and the connection is
//   dropped.
//
// Handshake (the connecting side C sends its exceptions; the accepting side S
// only receives them):
//   S -> C  Hello   u32 version, 16-byte server nonce, node name
//   C -> S  Auth    u32 version, 16-byte client nonce, u64 seed tag, node name,
//                   u64 MAC(master; "auth-c", nonces, seed tag, C's name)
//   S -> C  Accept  u64 MAC(master; "auth-s", nonces, seed tag, S's name)
//        or Refuse  a reason in words (unknown node, bad MAC, another hash_seed)
//   The master key is derived from the shared secret file; each direction's
//   session key from the master key and both nonces (fresh per connection),
//   so frames recorded on one connection are useless on another.
// SipHash-2-4 (Aumasson and Bernstein 2012, a keyed PRF with a 64-bit tag;
// spillway/flow_key.hpp, checked there against the paper's vectors) is the
// only primitive: no OpenSSL. A 64-bit tag is forgeable with probability
// 2^-64 per try, and every failure drops the connection and is counted.
//
// Records frames carry the flow checkpoint's encoding
// (encodeFlowCheckpoint: 16 bytes a record, backends by id, CRC, seed tag),
// at most kPeerRecordsPerFrame records; Removed frames carry u32 count and
// count x u64 flow hashes.
//
// Thread contract: plain functions; control thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "control/config/peer_secret.hpp"
#include "spillway/flow_exceptions.hpp"

namespace spillway {

inline constexpr std::uint32_t kPeerVersion = 1;
inline constexpr std::size_t kPeerHeaderBytes = 8;
inline constexpr std::size_t kPeerTagBytes = 8;
inline constexpr std::size_t kPeerMaxFrame = 65536;  // header + payload + tag
inline constexpr std::size_t kPeerMaxPayload = kPeerMaxFrame - kPeerHeaderBytes - kPeerTagBytes;
inline constexpr std::size_t kPeerNonceBytes = 16;
inline constexpr std::size_t kPeerMaxNameBytes = 64;
// Records frame: 40 + 8 x backends + 16 x records + 4 <= 49,196 bytes.
inline constexpr std::size_t kPeerRecordsPerFrame = 2048;
inline constexpr std::size_t kPeerRemovedPerFrame = 8000;

enum class PeerFrameType : std::uint8_t {
  Hello = 1,
  Auth = 2,
  Accept = 3,
  Refuse = 4,
  Heartbeat = 16,
  DumpBegin = 17,  // what follows until DumpEnd replaces everything sent before
  Records = 18,    // added or changed exceptions
  Removed = 19,    // flow hashes no longer exceptions here
  DumpEnd = 20,
  Intent = 21,  // tier-wide operator intent (intent_wire.hpp)
};

struct PeerFrameHeader {
  std::uint8_t length[4];  // little-endian payload length
  std::uint8_t type;
  std::uint8_t zero[3];
};
static_assert(sizeof(PeerFrameHeader) == kPeerHeaderBytes);

struct SipKey {
  std::uint64_t k0 = 0;
  std::uint64_t k1 = 0;
  friend bool operator==(const SipKey&, const SipKey&) = default;
};

using PeerNonce = std::array<std::byte, kPeerNonceBytes>;

// The long-term key of a tier from the secret file's bytes.
[[nodiscard]] SipKey peerMasterKey(std::string_view secret) noexcept;
// The session key of one direction ("c2s" or "s2c") of one connection.
[[nodiscard]] SipKey peerSessionKey(const SipKey& master, std::string_view direction,
                                    const PeerNonce& server, const PeerNonce& client) noexcept;
// The handshake MAC of `role` ("auth-c" or "auth-s") naming `node`.
[[nodiscard]] std::uint64_t peerAuthMac(const SipKey& master, std::string_view role,
                                        const PeerNonce& server, const PeerNonce& client,
                                        std::uint64_t seedTag, std::string_view node) noexcept;

// One frame. With a key, the tag is appended (sequence `seq`).
[[nodiscard]] std::string encodePeerFrame(PeerFrameType type, std::string_view payload,
                                          const SipKey* key = nullptr, std::uint64_t seq = 0);

struct PeerFrame {
  PeerFrameType type{};
  std::string_view payload;  // into the decoded buffer
  std::size_t consumed = 0;  // bytes of the buffer this frame took
};
struct PeerNeedMore {};
struct PeerBadFrame {
  std::string reason;
};
using PeerDecoded = std::variant<PeerFrame, PeerNeedMore, PeerBadFrame>;

// The first frame at the start of `buffer`: a whole frame, a request for more
// bytes, or why the bytes can never make a frame (oversized, bad padding,
// unknown type, wrong tag). With a key the frame must carry a tag valid for
// sequence `seq`; without one it must be a handshake frame.
[[nodiscard]] PeerDecoded decodePeerFrame(std::string_view buffer, const SipKey* key,
                                          std::uint64_t seq) noexcept;

struct PeerHello {
  std::uint32_t version = kPeerVersion;
  PeerNonce nonce{};
  std::string node;
};
struct PeerAuth {
  std::uint32_t version = kPeerVersion;
  PeerNonce nonce{};
  std::uint64_t seedTag = 0;
  std::string node;
  std::uint64_t mac = 0;
};

[[nodiscard]] std::string encodePeerHello(const PeerHello& hello);
[[nodiscard]] std::optional<PeerHello> decodePeerHello(std::string_view payload);
[[nodiscard]] std::string encodePeerAuth(const PeerAuth& auth);
[[nodiscard]] std::optional<PeerAuth> decodePeerAuth(std::string_view payload);
[[nodiscard]] std::string encodePeerU64(std::uint64_t value);  // Accept's MAC
[[nodiscard]] std::optional<std::uint64_t> decodePeerU64(std::string_view payload);

// Records and Removed payloads.
[[nodiscard]] std::string encodePeerRecords(std::uint64_t hashSeed,
                                            std::span<const FlowExceptionRecord> records);
[[nodiscard]] std::variant<std::vector<FlowExceptionRecord>, std::string> decodePeerRecords(
    std::string_view payload, std::uint64_t hashSeed);
[[nodiscard]] std::string encodePeerRemoved(std::span<const std::uint64_t> hashes);
[[nodiscard]] std::optional<std::vector<std::uint64_t>> decodePeerRemoved(std::string_view payload);

}  // namespace spillway
