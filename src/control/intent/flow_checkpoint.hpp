// The on-disk form of flow affinity (state_dir): what a restarted or crashed
// spillwayd reads to keep every flow on the backend it had.
//
// flows.ckpt: the flow exceptions (spillway/flow_exceptions.hpp), binary,
// little-endian, written whole by writeFileDurably():
//   header   40 bytes: magic "SPWFLOW1", u32 version (1), u32 backend count B,
//            u64 seed tag (a one-way mix of hash_seed: flow hashes are only
//            meaningful under the seed they were computed with), u64 wall
//            time of writing (Unix ms), u64 record count N
//   ids      B x u64: the backend ids the records name, by ordinal
//   records  N x 16 bytes: u64 flow hash, u32 backend ordinal,
//            u32 state << 24 | idle seconds (saturated at 2^24 - 1)
//   trailer  u32 CRC-32C of everything before it
// 16 bytes per exception plus 8 per backend: 16 MB at 1M exceptions,
// 160 MB at 10M (the worst case, every tracked flow an exception).
//
// tables.json: the weights each VIP's table was last published with, by
// backend id, the policy's saturation states, the resolved next-hop MACs,
// the generation and the wall time; so the first tables after a start are
// the last tables before it, and a restarted daemon forwards at once even
// when starting its port flushed the kernel's neighbour table; and the
// backends discovery sources added ("discovered": pool, id, name, address,
// weight, MAC, metrics port and path, and for one its source stopped listing
// the wall time its drain began), so a restart keeps a leaving backend in its
// drain and starts from the last good set when a source does not answer.
// Files without "discovered" (before it was added) read as none.
//
// history.bin: second chance's slot history (snapshot_builder.hpp) of each
// VIP, so a restarted instance names the same previous owners as its peers
// (a flow on its second chance that ECMP moves back to it keeps its hop):
// binary, little-endian, written in each checkpoint before flows.ckpt and
// tables.json (tables.json last: a checkpoint cut short leaves the older
// tables beside a history at least as new, never the reverse, which would
// make the newer tables' owners the origins of the slots their step moved):
//   header   32 bytes: magic "SPWHIST1", u32 version (1), u32 VIP count,
//            u64 seed tag (as flows.ckpt: slots are only meaningful under
//            the seed), u64 wall time of writing (Unix ms)
//   per VIP  u16 name length, the name, u32 table size, u32 backend count B,
//            B x u64 backend ids, u32 record count N, N x 16 bytes: u32 slot,
//            u32 previous owner's ordinal, u32 the owner before the run of
//            moves' ordinal, u32 age of the slot's last move (ms)
//   trailer  u32 CRC-32C of everything before it
// 16 bytes per slot that moved within the hold.
//
// A file that is missing, truncated, of another version, of another seed or
// failing its CRC is refused as a whole with a reason; nothing half-read is
// used.
//
// Thread contract: plain functions, blocking I/O, control thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "control/backends/slot_history.hpp"
#include "control/discovery/file_sd.hpp"
#include "control/sys/durable_file.hpp"
#include "spillway/flow_exceptions.hpp"
#include "spillway/wire.hpp"

namespace spillway {

inline constexpr const char* kFlowCheckpointFile = "flows.ckpt";
inline constexpr const char* kTablesStateFile = "tables.json";
inline constexpr const char* kSlotHistoryFile = "history.bin";

struct FlowCheckpoint {
  std::uint64_t writtenUnixMs = 0;
  std::vector<FlowExceptionRecord> records;
};

// A backend a discovery source added, as the tables were built.
struct DiscoveredRecord {
  std::string pool;
  DiscoveredBackend backend;
  // The source stopped listing it: its drain began then (Unix ms).
  std::optional<std::uint64_t> leavingSinceUnixMs;
  friend bool operator==(const DiscoveredRecord&, const DiscoveredRecord&) = default;
};

struct TablesState {
  std::uint64_t writtenUnixMs = 0;
  std::uint64_t generation = 0;
  std::map<std::string, std::map<std::uint64_t, std::uint32_t>> weights;  // by VIP, by id
  std::vector<std::uint64_t> saturated;                                   // backend ids
  std::map<std::uint64_t, MacAddress> nextHops;  // resolved next-hop MACs, by backend id
  std::vector<DiscoveredRecord> discovered;      // by backend id
  // Second chance's slot history as the tables were built (history.bin,
  // not tables.json); ages as of the build.
  SlotHistory history;
};

// A one-way mix of hash_seed that names it without revealing it (checkpoint
// header, peer handshake).
[[nodiscard]] std::uint64_t hashSeedTag(std::uint64_t seed) noexcept;

// The bytes of flows.ckpt (exposed for tests and the size benchmark).
[[nodiscard]] std::string encodeFlowCheckpoint(std::uint64_t hashSeed, std::uint64_t writtenUnixMs,
                                               std::span<const FlowExceptionRecord> records);
// Parses flows.ckpt bytes; the error says what is wrong.
[[nodiscard]] std::variant<FlowCheckpoint, std::string> decodeFlowCheckpoint(
    std::string_view bytes, std::uint64_t hashSeed);

// history.bin's bytes; ages as given (the caller ages them to the write).
[[nodiscard]] std::string encodeSlotHistory(std::uint64_t hashSeed, std::uint64_t writtenUnixMs,
                                            const SlotHistory& history);
// Parses history.bin; ages grow by the time since it was written
// (`nowUnixMs`). The error says what is wrong.
[[nodiscard]] std::variant<SlotHistory, std::string> decodeSlotHistory(std::string_view bytes,
                                                                       std::uint64_t hashSeed,
                                                                       std::uint64_t nowUnixMs);

[[nodiscard]] std::string encodeTablesState(const TablesState& state);
[[nodiscard]] std::variant<TablesState, std::string> decodeTablesState(std::string_view text);

}  // namespace spillway
