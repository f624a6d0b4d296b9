// Table digests: what lets instances of a tier compare their Maglev tables
// without shipping them whole. A table is read as the backend *id* in each
// slot (0 = none), never the backend index, which is local to an instance;
// equal tables on two instances therefore give equal digests.
//
//   fingerprint   FNV-1a 64 over the table size and every slot's id (8 bytes,
//                 little-endian), as 16 hex digits
//   chunks        the same hash per run of kDigestChunkEntries slots
//   chunk         one run's slots, packed: a dictionary of the backend ids in
//                 it and 4 hex digits per slot (0 = none, k = dictionary[k-1])
//
// A digest reply holds at most kMaglevMaxTableSize / kDigestChunkEntries
// chunk hashes per VIP (4,096, about 80 KB), a chunk reply about 16 KB: both
// far below the socket protocol's kMaxReplyBytes. A client asks for the
// digests first and for chunks only where hashes differ.
//
// Thread contract: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "control/api/control_api.hpp"

namespace spillway {

inline constexpr std::uint32_t kDigestChunkEntries = 4096;

[[nodiscard]] std::uint64_t tableHash(std::span<const std::uint64_t> ids,
                                      std::uint64_t salt) noexcept;
[[nodiscard]] std::string hashText(std::uint64_t hash);

// {"vip", "table_size", "fingerprint", "chunks": [hex, ...]}
[[nodiscard]] Json tableDigestJson(const std::string& vip, std::span<const std::uint64_t> ids);
// {"vip", "chunk", "first", "backends": [id, ...], "entries": hex}; nullopt
// when the chunk is past the table's end.
[[nodiscard]] std::optional<Json> tableChunkJson(const std::string& vip,
                                                 std::span<const std::uint64_t> ids,
                                                 std::uint32_t chunk);

// The ids of a chunk reply, or why it is malformed.
struct DecodedChunk {
  std::vector<std::uint64_t> ids;
  std::string error;  // empty when ids are valid
};
[[nodiscard]] DecodedChunk decodeTableChunk(const Json& reply);

// Slots whose ids differ; a size mismatch counts the surplus slots too.
[[nodiscard]] std::uint32_t countDiffering(std::span<const std::uint64_t> a,
                                           std::span<const std::uint64_t> b) noexcept;

}  // namespace spillway
