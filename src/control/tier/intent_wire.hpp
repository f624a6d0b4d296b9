// The record layer of the peer channel's tier-wide intent (tier_intent.hpp):
// the payload of PeerFrameType::Intent frames. Kept apart from peer_wire.hpp
// (frames, handshake, MAC), which it uses only through the frame type.
//
// A sender sends its whole intent as a dump: one or more Intent frames, the
// first flagged Begin, the last flagged End (a small intent is one frame with
// both). A receiver stages the entries of a dump and hands them over whole at
// End, with the sender's digest and entry count, so "received" always means
// a complete set.
//
// Payload, little-endian:
//    0  u8   version (kIntentWireVersion)
//    1  u8   flags: bit 0 Begin, bit 1 End
//    2  u16  records in this frame
//    4  u32  entries in the whole dump
//    8  u64  the sender's digest (TierIntent::digest) of the whole dump
//   16  records, each: u8 kind, u8 zero, u16 length L, L bytes
//       kind 1: a TierIntentEntry (encodeTierIntentEntry)
// A record of an unknown kind is skipped and counted (a later version may add
// kinds); a frame of another version is ignored whole and counted. A
// malformed frame (lengths that do not add up, a bad entry) is an error: the
// receiver counts it, drops the dump in progress and keeps the connection
// (the frame's MAC was good: it is a bug or a version skew, not an attack).
//
// Thread contract: plain functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "control/intent/tier_intent.hpp"

namespace spillway {

inline constexpr std::uint8_t kIntentWireVersion = 1;
inline constexpr std::uint8_t kIntentFlagBegin = 1;
inline constexpr std::uint8_t kIntentFlagEnd = 2;
inline constexpr std::uint8_t kIntentRecordEntry = 1;
inline constexpr std::size_t kIntentWireHeader = 16;
// Payload bytes a sender puts in one frame (below kPeerMaxPayload).
inline constexpr std::size_t kIntentFrameBudget = 48 * 1024;

struct IntentWireFrame {
  std::uint8_t flags = 0;
  std::uint32_t total = 0;
  std::uint64_t digest = 0;
  std::vector<TierIntentEntry> entries;
  std::size_t unknownRecords = 0;  // skipped: a kind this version does not know
  bool otherVersion = false;       // ignored whole
};

// The payloads of a whole dump of `entries` (at least one frame).
[[nodiscard]] std::vector<std::string> encodeIntentDump(std::span<const TierIntentEntry> entries,
                                                        std::uint64_t digest);
[[nodiscard]] std::variant<IntentWireFrame, std::string> decodeIntentFrame(
    std::string_view payload);

}  // namespace spillway
