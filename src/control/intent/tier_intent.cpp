#include "control/intent/tier_intent.hpp"

#include <algorithm>

#include "control/sys/durable_file.hpp"
#include "control/sys/le_bytes.hpp"

namespace spillway {
namespace {

constexpr std::uint32_t kTierFileMagic = 0x31545753;  // "SWT1"
constexpr std::size_t kTierMaxFileBytes = std::size_t{64} << 20;

// FNV-1a, 64 bit: a digest to compare sets, not a MAC (the channel's frames
// are authenticated already).
void mix(std::uint64_t& h, std::string_view bytes) {
  for (const char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
}

void mixEntry(std::uint64_t& h, const TierIntentEntry& e) {
  std::string key;
  putLe(key, e.record.backend.size(), 2);
  key += e.record.backend;
  key.push_back(static_cast<char>(e.field));
  putLe(key, e.stamp.clock, 8);
  putLe(key, e.stamp.origin.size(), 1);
  key += e.stamp.origin;
  mix(h, key);
}

constexpr std::uint64_t kFnvBasis = 0xcbf29ce484222325ULL;

}  // namespace

std::string_view toString(TierField field) noexcept {
  switch (field) {
    case TierField::Member:
      return "member";
    case TierField::Admin:
      return "admin";
    case TierField::Weight:
      return "weight";
  }
  return "?";
}

std::optional<TierField> tierFieldOf(IntentOp op) noexcept {
  switch (op) {
    case IntentOp::Add:
    case IntentOp::Remove:
      return TierField::Member;
    case IntentOp::Drain:
    case IntentOp::Undrain:
    case IntentOp::Disable:
    case IntentOp::Enable:
      return TierField::Admin;
    case IntentOp::Weight:
      return TierField::Weight;
    default:
      return std::nullopt;
  }
}

TierIntentEntry TierIntent::local(IntentRecord record, std::string_view origin,
                                  std::int64_t wallMs) {
  TierIntentEntry e;
  e.field = tierFieldOf(record.op).value_or(TierField::Admin);
  const std::uint64_t wall = wallMs > 0 ? static_cast<std::uint64_t>(wallMs) : 0;
  e.stamp.clock = std::max(wall, clock_ + 1);
  e.stamp.origin = std::string(origin.substr(0, kTierMaxOrigin));
  record.seq = 0;
  e.record = std::move(record);
  (void)put(e);
  rehash();
  return e;
}

bool TierIntent::put(const TierIntentEntry& e) {
  const auto field = tierFieldOf(e.record.op);
  if (!field || *field != e.field || e.record.backend.empty() || e.stamp.origin.empty() ||
      e.stamp.origin.size() > kTierMaxOrigin) {
    ++rejected_;
    return false;
  }
  clock_ = std::max(clock_, e.stamp.clock);
  const Key key{e.record.backend, e.field};
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    if (entries_.size() >= kTierMaxEntries) {
      ++rejected_;
      return false;
    }
    entries_.emplace(key, e);
    return true;
  }
  if (!(it->second.stamp < e.stamp)) return false;  // older, or the same change
  it->second = e;
  return true;
}

std::vector<std::string> TierIntent::merge(std::span<const TierIntentEntry> entries) {
  std::vector<std::string> changed;
  for (const TierIntentEntry& e : entries) {
    TierIntentEntry copy = e;
    copy.record.seq = 0;
    if (put(copy)) changed.push_back(e.record.backend);
  }
  std::sort(changed.begin(), changed.end());
  changed.erase(std::unique(changed.begin(), changed.end()), changed.end());
  if (!changed.empty()) rehash();
  return changed;
}

void TierIntent::rehash() {
  std::uint64_t h = kFnvBasis;
  for (const auto& [key, e] : entries_) mixEntry(h, e);
  digest_ = h;
}

std::vector<TierIntentEntry> TierIntent::entries() const {
  std::vector<TierIntentEntry> out;
  out.reserve(entries_.size());
  for (const auto& [key, e] : entries_) out.push_back(e);
  return out;
}

std::vector<std::string> TierIntent::backends() const {
  std::vector<std::string> out;
  for (const auto& [key, e] : entries_) {
    if (out.empty() || out.back() != key.first) out.push_back(key.first);
  }
  return out;
}

const TierIntentEntry* TierIntent::find(const std::string& backend, TierField field) const {
  auto it = entries_.find(Key{backend, field});
  return it == entries_.end() ? nullptr : &it->second;
}

TierTarget TierIntent::target(const std::string& backend) const {
  std::vector<const TierIntentEntry*> mine;
  for (auto it = entries_.lower_bound(Key{backend, TierField::Member});
       it != entries_.end() && it->first.first == backend; ++it) {
    mine.push_back(&it->second);
  }
  std::sort(mine.begin(), mine.end(),
            [](const TierIntentEntry* a, const TierIntentEntry* b) { return a->stamp < b->stamp; });
  TierTarget t;
  for (const TierIntentEntry* e : mine) {
    const IntentRecord& r = e->record;
    switch (r.op) {
      case IntentOp::Add:
        t = TierTarget{};
        t.added = r;
        break;
      case IntentOp::Remove:
        t.removed = true;
        break;
      case IntentOp::Drain:
        t.admin = AdminState::Draining;
        t.adminStamp = e->stamp;
        break;
      case IntentOp::Undrain:
      case IntentOp::Enable:
        t.admin = AdminState::Enabled;
        t.adminStamp = e->stamp;
        t.removed = false;
        break;
      case IntentOp::Disable:
        t.admin = AdminState::Disabled;
        t.adminStamp = e->stamp;
        t.removed = false;
        break;
      case IntentOp::Weight:
        t.weight = r.weight;
        t.weightStamp = e->stamp;
        break;
      default:
        break;
    }
  }
  return t;
}

std::uint64_t tierIntentDigest(std::span<const TierIntentEntry> entries) {
  std::vector<const TierIntentEntry*> sorted;
  sorted.reserve(entries.size());
  for (const TierIntentEntry& e : entries) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](const TierIntentEntry* a, const TierIntentEntry* b) {
    return std::pair(a->record.backend, a->field) < std::pair(b->record.backend, b->field);
  });
  std::uint64_t h = kFnvBasis;
  for (const TierIntentEntry* e : sorted) mixEntry(h, *e);
  return h;
}

std::size_t tierIntentDiffering(std::span<const TierIntentEntry> a,
                                std::span<const TierIntentEntry> b) {
  std::map<std::pair<std::string, TierField>, const TierStamp*> left;
  for (const TierIntentEntry& e : a) left[{e.record.backend, e.field}] = &e.stamp;
  std::size_t differing = 0;
  std::size_t matched = 0;
  for (const TierIntentEntry& e : b) {
    auto it = left.find({e.record.backend, e.field});
    if (it == left.end()) {
      ++differing;
      continue;
    }
    ++matched;
    if (!(*it->second == e.stamp)) ++differing;
  }
  return differing + (left.size() - matched);
}

std::string encodeTierIntentEntry(const TierIntentEntry& e) {
  const std::string origin = e.stamp.origin.substr(0, kTierMaxOrigin);
  const std::string record = encodeIntentRecord(e.record);
  std::string out;
  out.reserve(14 + origin.size() + record.size());
  out.push_back(static_cast<char>(e.field));
  out.push_back(static_cast<char>(origin.size()));
  putLe(out, e.stamp.clock, 8);
  out += origin;
  putLe(out, record.size(), 4);
  out += record;
  return out;
}

std::variant<TierIntentEntry, std::string> decodeTierIntentEntry(std::string_view in) {
  if (in.size() < 14) return std::string("tier intent entry: shorter than its header");
  TierIntentEntry e;
  const auto field = static_cast<std::uint8_t>(in[0]);
  if (field < 1 || field > 3) return "tier intent entry: unknown field " + std::to_string(field);
  e.field = static_cast<TierField>(field);
  const std::size_t originLength = static_cast<unsigned char>(in[1]);
  if (originLength == 0 || originLength > kTierMaxOrigin) {
    return std::string("tier intent entry: origin length out of range");
  }
  e.stamp.clock = getLe(in, 2, 8);
  if (in.size() < 10 + originLength + 4) return std::string("tier intent entry: truncated origin");
  e.stamp.origin = std::string(in.substr(10, originLength));
  const std::size_t recordLength = getLe(in, 10 + originLength, 4);
  const std::size_t at = 14 + originLength;
  if (recordLength != in.size() - at) {
    return std::string("tier intent entry: record length does not fill the entry");
  }
  const std::string_view record = in.substr(at);
  const IntentDecoded d = decodeIntentRecords(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(record.data()), record.size()),
      "peer");
  if (d.damage) return "tier intent entry: " + d.damage->what;
  if (d.records.size() != 1) return std::string("tier intent entry: not exactly one record");
  e.record = d.records.front();
  const auto fieldOfOp = tierFieldOf(e.record.op);
  if (!fieldOfOp || *fieldOfOp != e.field) {
    return "tier intent entry: op " + std::string(toString(e.record.op)) + " in field " +
           std::string(toString(e.field));
  }
  if (e.record.backend.empty()) return std::string("tier intent entry: no backend name");
  e.record.seq = 0;
  return e;
}

std::optional<std::string> saveTierIntent(const std::string& file, const TierIntent& intent) {
  std::string bytes;
  putLe(bytes, kTierFileMagic, 4);
  putLe(bytes, intent.size(), 4);
  for (const TierIntentEntry& e : intent.entries()) {
    const std::string one = encodeTierIntentEntry(e);
    putLe(bytes, one.size(), 4);
    bytes += one;
  }
  return writeFileDurably(file, bytes);
}

std::variant<TierIntent, std::string> loadTierIntent(const std::string& file) {
  std::string error;
  const auto text = readStateFile(file, kTierMaxFileBytes, error);
  if (!text) {
    if (error.empty()) return TierIntent{};  // no file yet
    return file + ": " + error;
  }
  const std::string_view in = *text;
  if (in.size() < 8 || getLe(in, 0, 4) != kTierFileMagic) return file + ": not a tier intent file";
  const std::size_t count = getLe(in, 4, 4);
  if (count > kTierMaxEntries) return file + ": too many entries";
  std::vector<TierIntentEntry> entries;
  std::size_t at = 8;
  for (std::size_t i = 0; i < count; ++i) {
    if (in.size() - at < 4) return file + ": truncated at entry " + std::to_string(i);
    const std::size_t length = getLe(in, at, 4);
    at += 4;
    if (in.size() - at < length) return file + ": truncated at entry " + std::to_string(i);
    auto d = decodeTierIntentEntry(in.substr(at, length));
    if (auto* e = std::get_if<std::string>(&d))
      return file + ": entry " + std::to_string(i) + ": " + *e;
    entries.push_back(std::get<TierIntentEntry>(std::move(d)));
    at += length;
  }
  if (at != in.size()) return file + ": bytes after the last entry";
  TierIntent intent;
  (void)intent.merge(entries);
  return intent;
}

}  // namespace spillway
