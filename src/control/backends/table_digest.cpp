#include "control/backends/table_digest.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

namespace spillway {

namespace {

constexpr std::uint64_t kFnvOffset = 0xcbf29ce484222325ULL;
constexpr std::uint64_t kFnvPrime = 0x100000001b3ULL;

std::uint64_t mix(std::uint64_t h, std::uint64_t value) noexcept {
  for (int i = 0; i < 8; ++i) {
    h ^= (value >> (8 * i)) & 0xff;
    h *= kFnvPrime;
  }
  return h;
}

int hexDigit(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

std::uint64_t tableHash(std::span<const std::uint64_t> ids, std::uint64_t salt) noexcept {
  std::uint64_t h = mix(kFnvOffset, salt);
  for (const std::uint64_t id : ids) h = mix(h, id);
  return h;
}

std::string hashText(std::uint64_t hash) {
  char buffer[17];
  std::snprintf(buffer, sizeof buffer, "%016llx", static_cast<unsigned long long>(hash));
  return buffer;
}

Json tableDigestJson(const std::string& vip, std::span<const std::uint64_t> ids) {
  Json chunks = Json::array();
  for (std::size_t first = 0; first < ids.size(); first += kDigestChunkEntries) {
    const std::size_t n = std::min<std::size_t>(kDigestChunkEntries, ids.size() - first);
    chunks.push_back(hashText(tableHash(ids.subspan(first, n), first)));
  }
  return Json{{"vip", vip},
              {"table_size", ids.size()},
              {"fingerprint", hashText(tableHash(ids, ids.size()))},
              {"chunks", std::move(chunks)}};
}

std::optional<Json> tableChunkJson(const std::string& vip, std::span<const std::uint64_t> ids,
                                   std::uint32_t chunk) {
  const std::size_t first = std::size_t{chunk} * kDigestChunkEntries;
  if (first >= ids.size()) return std::nullopt;
  const auto slots =
      ids.subspan(first, std::min<std::size_t>(kDigestChunkEntries, ids.size() - first));
  std::map<std::uint64_t, std::uint32_t> ordinal;
  Json backends = Json::array();
  std::string entries;
  entries.reserve(slots.size() * 4);
  for (const std::uint64_t id : slots) {
    std::uint32_t k = 0;
    if (id != 0) {
      auto [it, added] = ordinal.try_emplace(id, static_cast<std::uint32_t>(ordinal.size() + 1));
      if (added) backends.push_back(id);
      k = it->second;
    }
    char hex[5];
    std::snprintf(hex, sizeof hex, "%04x", k & 0xffff);
    entries += hex;
  }
  return Json{{"vip", vip},
              {"chunk", chunk},
              {"first", first},
              {"backends", std::move(backends)},
              {"entries", std::move(entries)}};
}

DecodedChunk decodeTableChunk(const Json& reply) {
  DecodedChunk out;
  if (!reply.is_object()) {
    out.error = "a chunk reply must be an object";
    return out;
  }
  const auto backends = reply.find("backends");
  const auto entries = reply.find("entries");
  if (backends == reply.end() || !backends->is_array() || entries == reply.end() ||
      !entries->is_string()) {
    out.error = "a chunk reply needs \"backends\" (array) and \"entries\" (string)";
    return out;
  }
  std::vector<std::uint64_t> dictionary;
  for (const Json& id : *backends) {
    if (!id.is_number_unsigned()) {
      out.error = "chunk dictionary holds a non-integer backend id";
      return out;
    }
    dictionary.push_back(id.get<std::uint64_t>());
  }
  const auto& hex = entries->get_ref<const std::string&>();
  if (hex.size() % 4 != 0 || hex.size() / 4 > kDigestChunkEntries) {
    out.error = "chunk entries of " + std::to_string(hex.size()) +
                " hex digits are not whole 4-digit slots within a chunk";
    return out;
  }
  out.ids.reserve(hex.size() / 4);
  for (std::size_t i = 0; i < hex.size(); i += 4) {
    std::uint32_t k = 0;
    for (std::size_t j = 0; j < 4; ++j) {
      const int d = hexDigit(hex[i + j]);
      if (d < 0) {
        out.ids.clear();
        out.error = "chunk entries hold a non-hex character";
        return out;
      }
      k = k * 16 + static_cast<std::uint32_t>(d);
    }
    if (k > dictionary.size()) {
      out.ids.clear();
      out.error = "chunk slot names backend " + std::to_string(k) + " of a dictionary of " +
                  std::to_string(dictionary.size());
      return out;
    }
    out.ids.push_back(k == 0 ? 0 : dictionary[k - 1]);
  }
  return out;
}

std::uint32_t countDiffering(std::span<const std::uint64_t> a,
                             std::span<const std::uint64_t> b) noexcept {
  const std::size_t common = std::min(a.size(), b.size());
  std::uint32_t n = 0;
  for (std::size_t i = 0; i < common; ++i) n += a[i] != b[i] ? 1 : 0;
  return n + static_cast<std::uint32_t>(std::max(a.size(), b.size()) - common);
}

}  // namespace spillway
