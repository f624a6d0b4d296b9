// Operator intent that outlives the process: an append-only journal of every
// accepted mutating command (backend add/remove/drain/undrain/disable/enable/
// weight, config clear-overrides), folded into an IntentOverlay that the
// control plane lays over the configuration file at start and at every reload.
// HAProxy's `server-state-file` is the model users know; this differs in that
// it is written on every change (not only when an operator dumps it) and
// names the command that made each value.
//
// Files, in ControlConfig::stateDir (created 0750 if missing):
//   intent.snapshot   the overlay as of sequence S: a checkpoint record, then
//                     one record per override (see IntentOverlay::toRecords);
//                     replaced atomically (write intent.snapshot.tmp, fsync it,
//                     rename, fsync the directory).
//   intent.journal    records with seq > S, appended with O_APPEND; each one
//                     is followed by fdatasync() before append() returns, so a
//                     command is durable before the reply says ok.
//   intent.journal.damaged-<unix ms>
//                     a journal in which replay found a corrupt record, moved
//                     aside (kept for people to look at, never read again).
//
// Record layout (little-endian; the same in both files):
//    0  u32  magic 0x31495753 ("SWI1")
//    4  u32  body length N (36 .. kMaxIntentBody)
//    8  u32  CRC-32C (Castagnoli) of the body
//   12  body:
//        0  u64  seq (1, 2, ... ; never reused)
//        8  i64  wall time, ms since the Unix epoch (when the command came)
//       16  u8   op (IntentOp)
//       17  u8   flags: bit 0 a MAC follows (Add)
//       18  u16  name length L, then L bytes of the backend's name
//      +0   u64  backend id
//      +8   u32  weight (Weight: the new base weight; Add: the spec's;
//                Checkpoint: the number of records that follow)
//      +12  u32  base weight the Weight command replaced (Weight), else 0
//      Add only, then:
//      +16  u8   IP version (4 or 6), 16 bytes of address (IPv4 in the first 4)
//      +33  u16  pool name length P, P bytes; u16 port name length Q, Q bytes
//      +37+P+Q   6 bytes of MAC when flags bit 0
// So a record is 48 + L bytes (a drain of "gpu-a1": 54 bytes), and an Add is
// 48 + L + 21 + P + Q (+ 6 with a MAC): about 90 bytes.
//
// fsync points: every append (fdatasync of the journal); creation of the
// journal file (fsync of the directory); a compaction (fsync of the snapshot
// tmp file, rename, fsync of the directory, then ftruncate of the journal to
// 0 and its fdatasync). A crash between the rename and the truncate leaves
// journal records with seq <= S: replay skips them.
//
// Compaction: when the journal holds kCompactRecords records or
// kCompactBytes bytes after an append, and after a start that found damage.
// A failed compaction leaves the journal as it was (the command that
// triggered it is durable already) and is reported by lastError().
//
// Replay (open()): the snapshot, then the journal, folded in seq order.
// Damage never stops a start and never crashes; each kind is reported in
// damage() (the control plane turns each into an event and a log line):
//   - torn tail: the last record is shorter than its header says (a crash
//     in the middle of a write): ignored; the journal is truncated to the
//     last whole record.
//   - corrupt record: bad CRC, bad magic, impossible length or an unknown op:
//     that record and everything after it in the file are not replayed (their
//     boundaries cannot be trusted); the journal is moved aside as
//     intent.journal.damaged-<ms> and the state replayed so far is compacted
//     into a fresh snapshot, so the next appends land in a clean file.
//   - corrupt snapshot: replay continues with the journal alone (intent older
//     than the snapshot is lost, and said so); the snapshot is rewritten.
//   - an unreadable state_dir or file: no intent is replayed, and append()
//     refuses every command with that reason (usable() is false), so no
//     change is ever accepted that would not survive a restart.
// With an empty directory name nothing is written: append() only numbers and
// folds the record (intent is kept in memory for this process).
//
// Thread contract: control thread only; every call does blocking file I/O
// (one append is one write() plus one fdatasync()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "control/backends/backend_state.hpp"
#include "control/config/config.hpp"

namespace spillway {

enum class IntentOp : std::uint8_t {
  Add = 1,
  Remove = 2,
  Drain = 3,
  Undrain = 4,
  Disable = 5,
  Enable = 6,
  Weight = 7,
  ClearOverrides = 8,  // backend "" = all
  Checkpoint = 9,      // first record of intent.snapshot
  LbDrain = 10,        // spillwayctl lb drain: withdraw every VIP (backend "")
  LbUndrain = 11,
};

[[nodiscard]] std::string_view toString(IntentOp op) noexcept;  // "add", "remove", ...

inline constexpr std::uint32_t kIntentMagic = 0x31495753;  // "SWI1"
inline constexpr std::size_t kIntentHeaderBytes = 12;
inline constexpr std::size_t kIntentMinBody = 36;
inline constexpr std::size_t kMaxIntentBody = 4096;
inline constexpr std::size_t kCompactRecords = 1024;
inline constexpr std::size_t kCompactBytes = std::size_t{1} << 20;

struct IntentRecord {
  std::uint64_t seq = 0;
  std::int64_t wallMs = 0;
  IntentOp op = IntentOp::Drain;
  std::string backend;  // the backend's name; "" for ClearOverrides of all
  std::uint64_t id = 0;
  std::uint32_t weight = 0;
  std::uint32_t baseWeight = 0;
  // Add only: the resolved spec (pool and egress port by name).
  IpAddress address{};
  std::string pool;
  std::string port;
  std::optional<MacAddress> mac;

  friend bool operator==(const IntentRecord&, const IntentRecord&) = default;
};

// Header + body, as written to the files.
[[nodiscard]] std::string encodeIntentRecord(const IntentRecord& record);

struct IntentDamage {
  enum class Kind : std::uint8_t { TornTail, Corrupt, CorruptSnapshot, Unreadable };
  Kind kind = Kind::Corrupt;
  std::string file;
  std::uint64_t offset = 0;  // where the damage starts
  std::uint64_t bytes = 0;   // bytes not replayed from there
  std::string what;          // for people
};

[[nodiscard]] std::string_view toString(IntentDamage::Kind kind) noexcept;

struct IntentDecoded {
  std::vector<IntentRecord> records;
  std::optional<IntentDamage> damage;  // decoding stops at the first
  std::uint64_t goodBytes = 0;         // length of the whole records before any damage
};

// Decodes a file's bytes; `file` names it in the damage report.
[[nodiscard]] IntentDecoded decodeIntentRecords(std::span<const std::byte> bytes,
                                                std::string_view file);

struct IntentStamp {
  std::uint64_t seq = 0;
  std::int64_t wallMs = 0;
  friend bool operator==(const IntentStamp&, const IntentStamp&) = default;
};

// What the operator changed about one backend, by name.
struct BackendOverride {
  std::string name;
  std::uint64_t id = 0;
  std::optional<IntentRecord> added;    // added at run time: the Add record (full spec)
  std::optional<IntentStamp> removed;   // removed by the operator (a removal in progress
                                        // or done)
  std::optional<AdminState> admin;      // Draining, Disabled or Enabled
  IntentStamp adminStamp;               // when `admin` was set (a drain's start)
  std::optional<std::uint32_t> weight;  // base weight
  std::uint32_t weightReplaced = 0;     // the base weight the override replaced
  IntentStamp weightStamp;

  friend bool operator==(const BackendOverride&, const BackendOverride&) = default;
};

// The fold of the journal: the runtime overlay on the configuration file.
//   Add      the backend is defined by the spec; any earlier override of the
//            name is forgotten (a fresh backend).
//   Remove   marks it removed; a backend defined by the file also forgets its
//            admin and weight overrides (nothing left to apply them to).
//   Drain    admin Draining since the record's time.
//   Undrain, Enable   admin Enabled; Disable   admin Disabled; all three cancel
//            a removal (as in BackendStates).
//   Weight   base weight override (and the base it replaced).
//   ClearOverrides   forgets the backend's override (all of them for "");
//            never the instance's drain.
//   LbDrain, LbUndrain   the instance's drain (announcements withdrawn).
class IntentOverlay {
 public:
  void apply(const IntentRecord& record);
  [[nodiscard]] const std::map<std::string, BackendOverride>& backends() const noexcept {
    return backends_;
  }
  [[nodiscard]] const BackendOverride* find(const std::string& name) const;
  void erase(const std::string& name) { backends_.erase(name); }
  void put(BackendOverride o) { backends_[o.name] = std::move(o); }
  [[nodiscard]] bool empty() const noexcept { return backends_.empty() && !lbDrained_; }
  // Since when the instance is drained (lb drain); std::nullopt when not.
  [[nodiscard]] const std::optional<IntentStamp>& lbDrained() const noexcept { return lbDrained_; }
  // Records (with their original seq and time) whose fold is this overlay,
  // in seq order.
  [[nodiscard]] std::vector<IntentRecord> toRecords() const;

  friend bool operator==(const IntentOverlay&, const IntentOverlay&) = default;

 private:
  std::map<std::string, BackendOverride> backends_;
  std::optional<IntentStamp> lbDrained_;
};

class IntentJournal {
 public:
  // dir: ControlConfig::stateDir; "" keeps nothing on disk.
  explicit IntentJournal(std::string dir);
  ~IntentJournal();
  IntentJournal(const IntentJournal&) = delete;
  IntentJournal& operator=(const IntentJournal&) = delete;

  // Creates the directory and files as needed and replays them into
  // overlay(). False when the directory or a file cannot be used (then
  // usable() is false and error() says why); damage found in readable files
  // is not a failure (see damage()).
  bool open();
  [[nodiscard]] bool usable() const noexcept { return usable_; }
  [[nodiscard]] const std::string& directory() const noexcept { return dir_; }
  [[nodiscard]] bool persistent() const noexcept { return !dir_.empty(); }
  // Why the journal is not usable, or what the last compaction failed on.
  [[nodiscard]] const std::string& error() const noexcept { return error_; }
  [[nodiscard]] const std::vector<IntentDamage>& damage() const noexcept { return damage_; }
  [[nodiscard]] std::size_t replayedRecords() const noexcept { return replayed_; }

  // Numbers the record (seq), writes it durably and folds it into overlay().
  // On an error nothing is folded, the file is cut back to where it was, and
  // the reason comes back; the caller must then not apply the change.
  [[nodiscard]] std::optional<std::string> append(IntentRecord& record);
  // Writes overlay() as the snapshot and empties the journal.
  [[nodiscard]] std::optional<std::string> compact();
  // Replaces the overlay (a start that pruned overrides that no longer apply)
  // and compacts.
  [[nodiscard]] std::optional<std::string> rewrite(IntentOverlay overlay);

  [[nodiscard]] const IntentOverlay& overlay() const noexcept { return overlay_; }
  [[nodiscard]] std::uint64_t lastSeq() const noexcept { return lastSeq_; }
  [[nodiscard]] std::size_t journalRecords() const noexcept { return journalRecords_; }
  [[nodiscard]] std::uint64_t journalBytes() const noexcept { return journalBytes_; }
  [[nodiscard]] std::string journalPath() const;
  [[nodiscard]] std::string snapshotPath() const;

 private:
  std::optional<std::string> openJournalFile();

  std::string dir_;
  int fd_ = -1;
  bool usable_ = false;
  std::string error_;
  std::vector<IntentDamage> damage_;
  std::size_t replayed_ = 0;
  IntentOverlay overlay_;
  std::uint64_t lastSeq_ = 0;
  std::size_t journalRecords_ = 0;
  std::uint64_t journalBytes_ = 0;
};

}  // namespace spillway
