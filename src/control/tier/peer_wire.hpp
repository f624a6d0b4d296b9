// The wire of the peer channel (peer_channel.hpp): how spillwayd instances of
// one tier authenticate each other and frame the flow exceptions they share.
// Pure functions over bytes, no sockets, so the codec is unit-tested and
// fuzzed (tests/fuzz/fuzz_peer_wire.cpp) without a network.
//
// Frame, little-endian (PeerFrameHeader):
//   u32 payload length (at most kPeerMaxPayload), u8 type, 3 zero bytes,
//   payload, and after the handshake a 32-byte tag:
//     HMAC-SHA-512-256(session key of this direction, u64 sequence || header || payload)
//   The sequence is not sent: each side counts the frames of a direction from
//   0, so a replayed, reordered, dropped or reflected frame (the two
//   directions have different keys) fails its tag, and the connection is
//   dropped.
//
// Handshake, protocol version 2 (the connecting side C sends its exceptions;
// the accepting side S only receives them):
//   S -> C  Hello   u32 version, 32-byte server nonce Ns, S's name
//   C -> S  Auth    u32 version, 32-byte client nonce Nc, u64 seed tag, C's name,
//                   32-byte MAC(master; "auth-c" transcript)
//   S -> C  Accept  32-byte MAC(master; "auth-s" transcript)
//        or Refuse  a reason in words (unknown node, bad MAC, another hash_seed)
//   transcript = version, Ns, Nc, seed tag, S's name, C's name. Each side
//   proves it holds the secret over the other's fresh nonce (a challenge
//   and its response), and the MACs bind both names and the seed.
//   The master key is BLAKE2b-256 of the shared secret file (domain-separated);
//   each direction's session key is BLAKE2b-256 keyed with the master over the
//   direction and both nonces (fresh per connection), so frames recorded on
//   one connection are useless on another.
// Primitives come from libsodium (crypto_generichash, crypto_auth,
// crypto_verify_32, randombytes_buf); no cryptography of our own. A hello of
// another version (the first four bytes of its payload, where version 1 put
// them too) is refused with peerVersionMismatch's words, which name the side
// to upgrade.
//
// Step frames (sent on the connection that carries the sender's exceptions,
// when it comes up, with every heartbeat and at each table step) carry u64
// milliseconds since the sender last published tables that moved Maglev
// entries, or kPeerNoStep; a joining instance waits for a quiet tier
// (ControlPlane::tickPeers). An older build drops a connection that sends
// one (unknown frame type), as it does for Intent frames.
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

inline constexpr std::uint32_t kPeerVersion = 2;
inline constexpr std::size_t kPeerHeaderBytes = 8;
inline constexpr std::size_t kPeerTagBytes = 32;     // crypto_auth_BYTES
inline constexpr std::size_t kPeerKeyBytes = 32;     // crypto_auth_KEYBYTES
inline constexpr std::size_t kPeerMaxFrame = 65536;  // header + payload + tag
inline constexpr std::size_t kPeerMaxPayload = kPeerMaxFrame - kPeerHeaderBytes - kPeerTagBytes;
inline constexpr std::size_t kPeerNonceBytes = 32;
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
  Step = 22,    // u64 ms since the sender's last table step (kPeerNoStep: none)
};

struct PeerFrameHeader {
  std::uint8_t length[4];  // little-endian payload length
  std::uint8_t type;
  std::uint8_t zero[3];
};
static_assert(sizeof(PeerFrameHeader) == kPeerHeaderBytes);

struct PeerKey {
  std::array<unsigned char, kPeerKeyBytes> bytes{};
  friend bool operator==(const PeerKey&, const PeerKey&) = default;
};

using PeerNonce = std::array<std::byte, kPeerNonceBytes>;
using PeerMac = std::array<std::byte, kPeerTagBytes>;

// A fresh random nonce (libsodium's randombytes: getrandom underneath).
[[nodiscard]] PeerNonce peerFreshNonce() noexcept;
// The long-term key of a tier from the secret file's bytes.
[[nodiscard]] PeerKey peerMasterKey(std::string_view secret) noexcept;
// The session key of one direction ("c2s" or "s2c") of one connection.
[[nodiscard]] PeerKey peerSessionKey(const PeerKey& master, std::string_view direction,
                                     const PeerNonce& server, const PeerNonce& client) noexcept;
// The handshake MAC of `role` ("auth-c" or "auth-s") over the transcript.
struct PeerTranscript {
  PeerNonce server{};
  PeerNonce client{};
  std::uint64_t seedTag = 0;
  std::string_view serverNode;
  std::string_view clientNode;
};
[[nodiscard]] PeerMac peerAuthMac(const PeerKey& master, std::string_view role,
                                  const PeerTranscript& transcript);
// Constant-time comparison (crypto_verify_32).
[[nodiscard]] bool peerMacEqual(const PeerMac& a, const PeerMac& b) noexcept;

// What an instance says of a peer of another protocol version: which one to
// upgrade.
[[nodiscard]] std::string peerVersionMismatch(std::string_view peer, std::uint32_t theirs);

// One frame. With a key, the tag is appended (sequence `seq`).
[[nodiscard]] std::string encodePeerFrame(PeerFrameType type, std::string_view payload,
                                          const PeerKey* key = nullptr, std::uint64_t seq = 0);

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
[[nodiscard]] PeerDecoded decodePeerFrame(std::string_view buffer, const PeerKey* key,
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
  PeerMac mac{};
};

// The protocol version a Hello or Auth payload announces (its first four
// bytes in every version), whatever follows; nullopt for fewer bytes.
[[nodiscard]] std::optional<std::uint32_t> peerPayloadVersion(std::string_view payload) noexcept;
// Decoders of this version's messages: nullopt for another version or a bad
// format (check peerPayloadVersion first to tell the two apart).
[[nodiscard]] std::string encodePeerHello(const PeerHello& hello);
[[nodiscard]] std::optional<PeerHello> decodePeerHello(std::string_view payload);
[[nodiscard]] std::string encodePeerAuth(const PeerAuth& auth);
[[nodiscard]] std::optional<PeerAuth> decodePeerAuth(std::string_view payload);
[[nodiscard]] std::string encodePeerMac(const PeerMac& mac);  // Accept's payload
[[nodiscard]] std::optional<PeerMac> decodePeerMac(std::string_view payload);

// Records and Removed payloads.
[[nodiscard]] std::string encodePeerRecords(std::uint64_t hashSeed,
                                            std::span<const FlowExceptionRecord> records);
[[nodiscard]] std::variant<std::vector<FlowExceptionRecord>, std::string> decodePeerRecords(
    std::string_view payload, std::uint64_t hashSeed);
[[nodiscard]] std::string encodePeerRemoved(std::span<const std::uint64_t> hashes);
[[nodiscard]] std::optional<std::vector<std::uint64_t>> decodePeerRemoved(std::string_view payload);

// Step payloads: nullopt for a payload of the wrong size; a nullopt inside
// for "no step since the sender started".
inline constexpr std::uint64_t kPeerNoStep = ~std::uint64_t{0};
[[nodiscard]] std::string encodePeerStep(std::optional<std::uint64_t> msAgo);
[[nodiscard]] std::optional<std::optional<std::uint64_t>> decodePeerStep(std::string_view payload);

}  // namespace spillway
