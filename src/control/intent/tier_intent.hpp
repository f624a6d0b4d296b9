// Tier-wide operator intent: the operator's changes to backends (add,
// remove, drain, undrain, disable, enable, weight) as a set that every
// instance of an LB tier converges on, so an instance that starts or returns
// holds what the operator told the tier while it was away.
//
// Each change gets a tier-wide identity and order, its TierStamp:
//   clock   a hybrid logical clock in milliseconds: max(wall time of the
//           change, the largest clock this instance has seen + 1). It never
//           runs backwards, exceeds every stamp the changing instance had
//           seen (so a change made after seeing another orders after it), and
//           tracks wall time for changes made independently.
//   origin  the node name of the instance that took the command ([tier]
//           node), unique in a tier: two changes with the same clock are
//           ordered by the byte order of their origins.
// (clock, origin) is a total order; the intent keeps, per (backend, field),
// the entry with the greatest stamp (last writer wins). Fields:
//   Member  Add (with the full spec) or Remove (a tombstone: the removal is
//           kept, so a newcomer removes the backend too)
//   Admin   Drain, Undrain, Disable or Enable
//   Weight  the base weight
// What a backend should look like (target()) is the fold of its entries in
// stamp order with the journal's rules (intent_journal.hpp's IntentOverlay):
// an Add forgets the older Admin and Weight entries, Undrain/Enable/Disable
// after a Remove cancel it. So two instances that hold the same entries
// reach the same state whatever order the entries came in.
//
// Merge is a join (commutative, associative, idempotent): entry by entry the
// greater stamp wins; equal stamps are the same change. digest() hashes the
// (backend, field, stamp) triples in key order: equal digests mean equal
// sets (up to a 64-bit collision).
//
// Persistence: saveTierIntent() writes the whole set to FILE atomically
// (FILE.tmp, fsync, rename, fsync of the directory); loadTierIntent() reads
// it back. Each entry holds the intent journal's own record encoding
// (encodeIntentRecord, with its CRC), so a record is decoded by the code
// that decodes the journal.
//
// Thread contract: pure except save/load (blocking file I/O); control thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "control/intent/intent_journal.hpp"

namespace spillway {

enum class TierField : std::uint8_t { Member = 1, Admin = 2, Weight = 3 };

[[nodiscard]] std::string_view toString(TierField field) noexcept;
// The field an operator command changes; std::nullopt for commands that are
// not tier-wide (lb drain/undrain: one instance's announcements;
// clear-overrides: relative to one instance's file; checkpoints).
[[nodiscard]] std::optional<TierField> tierFieldOf(IntentOp op) noexcept;

inline constexpr std::size_t kTierMaxOrigin = 64;
inline constexpr std::size_t kTierMaxEntries = 65536;

struct TierStamp {
  std::uint64_t clock = 0;
  std::string origin;
  friend auto operator<=>(const TierStamp&, const TierStamp&) = default;
  friend bool operator==(const TierStamp&, const TierStamp&) = default;
};

struct TierIntentEntry {
  TierField field = TierField::Admin;
  TierStamp stamp;
  IntentRecord record;  // record.backend names the backend; seq is not kept
  friend bool operator==(const TierIntentEntry&, const TierIntentEntry&) = default;
};

// What the entries of one backend ask for.
struct TierTarget {
  std::optional<IntentRecord> added;  // the newest Add (its spec)
  bool removed = false;
  std::optional<AdminState> admin;  // Draining, Disabled or Enabled
  std::optional<TierStamp> adminStamp;
  std::optional<std::uint32_t> weight;
  std::optional<TierStamp> weightStamp;
  friend bool operator==(const TierTarget&, const TierTarget&) = default;
};

class TierIntent {
 public:
  // A change taken here: stamped (see above), stored, returned. The record's
  // op must have a tierFieldOf().
  TierIntentEntry local(IntentRecord record, std::string_view origin, std::int64_t wallMs);
  // Merges entries from a peer or a file. Entries with a field that does not
  // fit their op, an empty backend or origin, are skipped and counted in
  // rejected(). Returns the backends whose entries changed (sorted, unique).
  std::vector<std::string> merge(std::span<const TierIntentEntry> entries);

  [[nodiscard]] std::vector<TierIntentEntry> entries() const;  // in key order
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
  [[nodiscard]] std::uint64_t digest() const noexcept { return digest_; }
  [[nodiscard]] std::uint64_t clock() const noexcept { return clock_; }
  [[nodiscard]] std::uint64_t rejected() const noexcept { return rejected_; }
  [[nodiscard]] const TierIntentEntry* find(const std::string& backend, TierField field) const;
  [[nodiscard]] TierTarget target(const std::string& backend) const;
  [[nodiscard]] std::vector<std::string> backends() const;

  friend bool operator==(const TierIntent& a, const TierIntent& b) {
    return a.entries_ == b.entries_;
  }

 private:
  using Key = std::pair<std::string, TierField>;
  bool put(const TierIntentEntry& e);
  void rehash();

  std::map<Key, TierIntentEntry> entries_;
  std::uint64_t clock_ = 0;
  // FNV-1a's basis: the digest of no entries, as tierIntentDigest() gives it
  // (a peer compares the two; 0 here made every empty dump look corrupt).
  std::uint64_t digest_ = 0xcbf29ce484222325ULL;
  std::uint64_t rejected_ = 0;
};

// The digest of a list of entries as TierIntent::digest() computes it.
[[nodiscard]] std::uint64_t tierIntentDigest(std::span<const TierIntentEntry> entries);
// Keys whose stamps differ between two sets, plus keys only one of them has.
[[nodiscard]] std::size_t tierIntentDiffering(std::span<const TierIntentEntry> a,
                                              std::span<const TierIntentEntry> b);

// One entry's bytes (little-endian):
//   u8 field, u8 origin length O, u64 clock, O bytes of origin,
//   u32 record length R, R bytes of encodeIntentRecord(record)
[[nodiscard]] std::string encodeTierIntentEntry(const TierIntentEntry& entry);
// Exactly one entry filling `bytes`, or why not.
[[nodiscard]] std::variant<TierIntentEntry, std::string> decodeTierIntentEntry(
    std::string_view bytes);

// FILE: "SWT1", u32 count, then count x (u32 length, entry). A missing file
// is an empty intent; a damaged one an error (the caller starts empty and
// takes the tier's intent from its peers).
[[nodiscard]] std::optional<std::string> saveTierIntent(const std::string& file,
                                                        const TierIntent& intent);
[[nodiscard]] std::variant<TierIntent, std::string> loadTierIntent(const std::string& file);

}  // namespace spillway
