#include "control/tier/intent_wire.hpp"

#include "control/sys/le_bytes.hpp"

namespace spillway {
namespace {

std::string header(std::uint8_t flags, std::size_t records, std::size_t total,
                   std::uint64_t digest) {
  std::string h;
  h.push_back(static_cast<char>(kIntentWireVersion));
  h.push_back(static_cast<char>(flags));
  putLe(h, records, 2);
  putLe(h, total, 4);
  putLe(h, digest, 8);
  return h;
}

}  // namespace

std::vector<std::string> encodeIntentDump(std::span<const TierIntentEntry> entries,
                                          std::uint64_t digest) {
  std::vector<std::string> frames;
  std::string body;
  std::size_t records = 0;
  const auto emit = [&](bool last) {
    std::uint8_t flags = frames.empty() ? kIntentFlagBegin : 0;
    if (last) flags |= kIntentFlagEnd;
    frames.push_back(header(flags, records, entries.size(), digest) + body);
    body.clear();
    records = 0;
  };
  for (const TierIntentEntry& e : entries) {
    const std::string one = encodeTierIntentEntry(e);
    if (one.size() > 0xFFFF) continue;  // cannot happen: a record is at most 4 KiB
    if (records > 0 && (body.size() + 4 + one.size() > kIntentFrameBudget || records == 0xFFFF)) {
      emit(false);
    }
    body.push_back(static_cast<char>(kIntentRecordEntry));
    body.push_back(0);
    putLe(body, one.size(), 2);
    body += one;
    ++records;
  }
  emit(true);
  return frames;
}

std::variant<IntentWireFrame, std::string> decodeIntentFrame(std::string_view in) {
  if (in.size() < kIntentWireHeader) return std::string("intent frame shorter than its header");
  IntentWireFrame f;
  if (static_cast<std::uint8_t>(in[0]) != kIntentWireVersion) {
    f.otherVersion = true;
    return f;
  }
  f.flags = static_cast<std::uint8_t>(in[1]);
  if ((f.flags & ~(kIntentFlagBegin | kIntentFlagEnd)) != 0) {
    return std::string("intent frame: unknown flags");
  }
  const std::size_t records = getLe(in, 2, 2);
  f.total = static_cast<std::uint32_t>(getLe(in, 4, 4));
  f.digest = getLe(in, 8, 8);
  if (f.total > kTierMaxEntries) return std::string("intent frame: more entries than allowed");
  std::size_t at = kIntentWireHeader;
  for (std::size_t i = 0; i < records; ++i) {
    if (in.size() - at < 4) return std::string("intent frame: truncated record header");
    const auto kind = static_cast<std::uint8_t>(in[at]);
    const std::size_t length = getLe(in, at + 2, 2);
    at += 4;
    if (in.size() - at < length) return std::string("intent frame: truncated record");
    if (kind != kIntentRecordEntry) {
      ++f.unknownRecords;
    } else {
      auto d = decodeTierIntentEntry(in.substr(at, length));
      if (auto* e = std::get_if<std::string>(&d)) return *e;
      f.entries.push_back(std::get<TierIntentEntry>(std::move(d)));
    }
    at += length;
  }
  if (at != in.size()) return std::string("intent frame: bytes after the last record");
  return f;
}

}  // namespace spillway
