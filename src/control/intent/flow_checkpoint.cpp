#include "control/intent/flow_checkpoint.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "control/config/config.hpp"
#include "control/sys/durable_file.hpp"
#include "spillway/errno_text.hpp"

namespace spillway {
namespace {

static_assert(std::endian::native == std::endian::little, "the checkpoint is little-endian");

constexpr char kMagic[8] = {'S', 'P', 'W', 'F', 'L', 'O', 'W', '1'};
constexpr std::uint32_t kVersion = 1;
constexpr std::size_t kHeaderBytes = 40;
constexpr std::size_t kRecordBytes = 16;
constexpr std::uint32_t kMaxIdleSeconds = (std::uint32_t{1} << 24) - 1;

template <class T>
void put(std::string& out, T value) {
  char b[sizeof(T)];
  std::memcpy(b, &value, sizeof(T));
  out.append(b, sizeof(T));
}

template <class T>
T get(std::string_view bytes, std::size_t at) {
  T v;
  std::memcpy(&v, bytes.data() + at, sizeof(T));
  return v;
}

}  // namespace

std::uint64_t hashSeedTag(std::uint64_t seed) noexcept {
  // splitmix64's finaliser, twice: one-way enough that the file does not
  // carry the secret seed, deterministic so every instance agrees.
  std::uint64_t z = seed + 0x9e3779b97f4a7c15ULL;
  for (int i = 0; i < 2; ++i) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
  }
  return z;
}

std::string encodeFlowCheckpoint(std::uint64_t hashSeed, std::uint64_t writtenUnixMs,
                                 std::span<const FlowExceptionRecord> records) {
  std::map<std::uint64_t, std::uint32_t> ordinal;
  std::vector<std::uint64_t> ids;
  for (const FlowExceptionRecord& r : records) {
    if (ordinal.emplace(r.backendId, static_cast<std::uint32_t>(ids.size())).second) {
      ids.push_back(r.backendId);
    }
  }
  std::string out;
  out.reserve(kHeaderBytes + ids.size() * 8 + records.size() * kRecordBytes + 4);
  out.append(kMagic, sizeof kMagic);
  put<std::uint32_t>(out, kVersion);
  put<std::uint32_t>(out, static_cast<std::uint32_t>(ids.size()));
  put<std::uint64_t>(out, hashSeedTag(hashSeed));
  put<std::uint64_t>(out, writtenUnixMs);
  put<std::uint64_t>(out, records.size());
  for (const std::uint64_t id : ids) put<std::uint64_t>(out, id);
  for (const FlowExceptionRecord& r : records) {
    const std::uint32_t idle = std::min(r.idleMs / 1000, kMaxIdleSeconds);
    put<std::uint64_t>(out, r.hash);
    put<std::uint32_t>(out, ordinal.at(r.backendId));
    put<std::uint32_t>(out, (static_cast<std::uint32_t>(r.state) << 24) | idle);
  }
  put<std::uint32_t>(out, crc32c(out));
  return out;
}

std::variant<FlowCheckpoint, std::string> decodeFlowCheckpoint(std::string_view bytes,
                                                               std::uint64_t hashSeed) {
  if (bytes.size() < kHeaderBytes + 4) return std::string("truncated (shorter than its header)");
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    return std::string("not a Spillway flow checkpoint (bad magic)");
  }
  const auto version = get<std::uint32_t>(bytes, 8);
  if (version != kVersion) return "version " + std::to_string(version) + ", expected 1";
  const auto backends = get<std::uint32_t>(bytes, 12);
  const auto tag = get<std::uint64_t>(bytes, 16);
  FlowCheckpoint c;
  c.writtenUnixMs = get<std::uint64_t>(bytes, 24);
  const auto count = get<std::uint64_t>(bytes, 32);
  const std::uint64_t expected =
      kHeaderBytes + std::uint64_t{backends} * 8 + count * kRecordBytes + 4;
  if (count > bytes.size() / kRecordBytes || expected != bytes.size()) {
    return "size " + std::to_string(bytes.size()) + " bytes does not match its header (" +
           std::to_string(count) + " records, " + std::to_string(backends) + " backends)";
  }
  const std::uint32_t crc = get<std::uint32_t>(bytes, bytes.size() - 4);
  if (crc != crc32c(bytes.substr(0, bytes.size() - 4))) return std::string("CRC mismatch");
  if (tag != hashSeedTag(hashSeed)) {
    return std::string("written under another hash_seed: its flow hashes name other flows");
  }
  std::vector<std::uint64_t> ids(backends);
  for (std::uint32_t i = 0; i < backends; ++i)
    ids[i] = get<std::uint64_t>(bytes, kHeaderBytes + i * 8);
  const std::size_t base = kHeaderBytes + std::size_t{backends} * 8;
  c.records.reserve(count);
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::size_t at = base + i * kRecordBytes;
    const auto ord = get<std::uint32_t>(bytes, at + 8);
    const auto meta = get<std::uint32_t>(bytes, at + 12);
    const auto state = static_cast<FlowState>(meta >> 24);
    if (ord >= backends || state < FlowState::Embryonic || state > FlowState::Ending) {
      return "record " + std::to_string(i) + " is invalid";
    }
    const std::uint64_t idleMs = std::uint64_t{meta & kMaxIdleSeconds} * 1000;
    c.records.push_back(FlowExceptionRecord{
        get<std::uint64_t>(bytes, at), ids[ord], state,
        static_cast<std::uint32_t>(std::min<std::uint64_t>(idleMs, UINT32_MAX))});
  }
  return c;
}

namespace {
constexpr char kHistoryMagic[8] = {'S', 'P', 'W', 'H', 'I', 'S', 'T', '1'};
constexpr std::size_t kHistoryHeaderBytes = 32;
constexpr std::size_t kHistoryRecordBytes = 16;
}  // namespace

std::string encodeSlotHistory(std::uint64_t hashSeed, std::uint64_t writtenUnixMs,
                              const SlotHistory& history) {
  std::size_t size = kHistoryHeaderBytes + 4;
  for (const auto& [name, vip] : history) {
    size += 2 + name.size() + 12 + vip.slots.size() * kHistoryRecordBytes + 8 * 64;
  }
  std::string out;
  out.reserve(size);
  out.append(kHistoryMagic, sizeof kHistoryMagic);
  put<std::uint32_t>(out, kVersion);
  put<std::uint32_t>(out, static_cast<std::uint32_t>(history.size()));
  put<std::uint64_t>(out, hashSeedTag(hashSeed));
  put<std::uint64_t>(out, writtenUnixMs);
  std::vector<std::uint32_t> rows;  // per record: previous, origin ordinals
  for (const auto& [name, vip] : history) {
    // Backend ids by ordinal (0: none); a table names a few dozen backends,
    // so the last one looked up is almost always the next.
    std::unordered_map<std::uint64_t, std::uint32_t> ordinal{{0, 0}};
    std::vector<std::uint64_t> ids{0};
    const auto ordinalOf = [&](std::uint64_t id) {
      auto [it, fresh] = ordinal.try_emplace(id, static_cast<std::uint32_t>(ids.size()));
      if (fresh) ids.push_back(id);
      return it->second;
    };
    rows.resize(vip.slots.size() * 2);
    std::uint64_t lastId[2] = {0, 0};
    std::uint32_t lastOrd[2] = {0, 0};
    for (std::size_t i = 0; i < vip.slots.size(); ++i) {
      const std::uint64_t id[2] = {vip.slots[i].previousId, vip.slots[i].originId};
      for (int k = 0; k < 2; ++k) {
        if (id[k] != lastId[k]) {
          lastId[k] = id[k];
          lastOrd[k] = ordinalOf(id[k]);
        }
        rows[i * 2 + static_cast<std::size_t>(k)] = lastOrd[k];
      }
    }
    put<std::uint16_t>(out, static_cast<std::uint16_t>(name.size()));
    out.append(name);
    put<std::uint32_t>(out, vip.tableSize);
    put<std::uint32_t>(out, static_cast<std::uint32_t>(ids.size()));
    for (const std::uint64_t id : ids) put<std::uint64_t>(out, id);
    put<std::uint32_t>(out, static_cast<std::uint32_t>(vip.slots.size()));
    const std::size_t at = out.size();
    out.resize(at + vip.slots.size() * kHistoryRecordBytes);
    char* w = out.data() + at;
    for (std::size_t i = 0; i < vip.slots.size(); ++i, w += kHistoryRecordBytes) {
      const std::uint32_t rec[4] = {vip.slots[i].slot, rows[i * 2], rows[i * 2 + 1],
                                    vip.slots[i].ageMs};
      std::memcpy(w, rec, sizeof rec);
    }
  }
  put<std::uint32_t>(out, crc32c(out));
  return out;
}

std::variant<SlotHistory, std::string> decodeSlotHistory(std::string_view bytes,
                                                         std::uint64_t hashSeed,
                                                         std::uint64_t nowUnixMs) {
  if (bytes.size() < kHistoryHeaderBytes + 4) {
    return std::string("truncated (shorter than its header)");
  }
  if (std::memcmp(bytes.data(), kHistoryMagic, sizeof kHistoryMagic) != 0) {
    return std::string("not a Spillway slot history (bad magic)");
  }
  const auto version = get<std::uint32_t>(bytes, 8);
  if (version != kVersion) return "version " + std::to_string(version) + ", expected 1";
  const std::uint32_t crc = get<std::uint32_t>(bytes, bytes.size() - 4);
  if (crc != crc32c(bytes.substr(0, bytes.size() - 4))) return std::string("CRC mismatch");
  if (get<std::uint64_t>(bytes, 16) != hashSeedTag(hashSeed)) {
    return std::string("written under another hash_seed: its slots name other flows");
  }
  const auto vips = get<std::uint32_t>(bytes, 12);
  const std::uint64_t written = get<std::uint64_t>(bytes, 24);
  const std::uint64_t since = nowUnixMs > written ? nowUnixMs - written : 0;
  const std::size_t end = bytes.size() - 4;
  std::size_t at = kHistoryHeaderBytes;
  const auto need = [&](std::uint64_t n) { return n <= end && at <= end - n; };
  SlotHistory out;
  for (std::uint32_t v = 0; v < vips; ++v) {
    const std::string where = "VIP " + std::to_string(v);
    if (!need(2)) return where + ": truncated";
    const auto nameBytes = get<std::uint16_t>(bytes, at);
    at += 2;
    if (!need(std::uint64_t{nameBytes} + 8)) return where + ": truncated";
    std::string name(bytes.substr(at, nameBytes));
    at += nameBytes;
    VipSlotHistory vip;
    vip.tableSize = get<std::uint32_t>(bytes, at);
    const auto idCount = get<std::uint32_t>(bytes, at + 4);
    at += 8;
    if (!need(std::uint64_t{idCount} * 8 + 4)) return where + ": truncated backend ids";
    std::vector<std::uint64_t> ids(idCount);
    for (std::uint32_t i = 0; i < idCount; ++i) ids[i] = get<std::uint64_t>(bytes, at + i * 8);
    at += std::size_t{idCount} * 8;
    const auto count = get<std::uint32_t>(bytes, at);
    at += 4;
    if (!need(std::uint64_t{count} * kHistoryRecordBytes)) return where + ": truncated records";
    vip.slots.reserve(count);
    for (std::uint32_t i = 0; i < count; ++i, at += kHistoryRecordBytes) {
      SlotHistoryRecord r;
      r.slot = get<std::uint32_t>(bytes, at);
      const auto prev = get<std::uint32_t>(bytes, at + 4);
      const auto origin = get<std::uint32_t>(bytes, at + 8);
      if (r.slot >= vip.tableSize || prev >= idCount || origin >= idCount) {
        return where + ": record " + std::to_string(i) + " is invalid";
      }
      r.previousId = ids[prev];
      r.originId = ids[origin];
      r.ageMs = static_cast<std::uint32_t>(
          std::min<std::uint64_t>(get<std::uint32_t>(bytes, at + 12) + since, UINT32_MAX));
      vip.slots.push_back(r);
    }
    if (!out.emplace(std::move(name), std::move(vip)).second) {
      return where + ": a VIP named twice";
    }
  }
  if (at != end) return "size " + std::to_string(bytes.size()) + " bytes does not match its VIPs";
  return out;
}

std::string encodeTablesState(const TablesState& state) {
  nlohmann::json vips = nlohmann::json::object();
  for (const auto& [vip, weights] : state.weights) {
    nlohmann::json w = nlohmann::json::object();
    for (const auto& [id, weight] : weights) w[std::to_string(id)] = weight;
    vips[vip] = w;
  }
  nlohmann::json macs = nlohmann::json::object();
  for (const auto& [id, mac] : state.nextHops) macs[std::to_string(id)] = formatMacAddress(mac);
  nlohmann::json discovered = nlohmann::json::array();
  for (const DiscoveredRecord& r : state.discovered) {
    const DiscoveredBackend& b = r.backend;
    nlohmann::json d{{"pool", r.pool},
                     {"id", b.id},
                     {"name", b.name},
                     {"address", formatIpAddress(b.address)},
                     {"weight", b.weight}};
    if (b.mac) d["mac"] = formatMacAddress(*b.mac);
    if (b.metricsPort) d["metrics_port"] = *b.metricsPort, d["metrics_path"] = b.metricsPath;
    if (r.leavingSinceUnixMs) d["leaving_since_unix_ms"] = *r.leavingSinceUnixMs;
    discovered.push_back(std::move(d));
  }
  return nlohmann::json{{"version", 1},
                        {"written_unix_ms", state.writtenUnixMs},
                        {"generation", state.generation},
                        {"weights", vips},
                        {"saturated", state.saturated},
                        {"next_hops", macs},
                        {"discovered", discovered}}
             .dump(1) +
         "\n";
}

namespace {

// One "discovered" entry, checked as a source's answer is: an address, the
// id that address gives, a name fit for a backend, a weight in range.
std::variant<DiscoveredRecord, std::string> decodeDiscovered(const nlohmann::json& d) {
  if (!d.is_object()) return std::string("an entry is not an object");
  DiscoveredRecord r;
  r.pool = d.at("pool").get<std::string>();
  DiscoveredBackend& b = r.backend;
  b.name = d.at("name").get<std::string>();
  const std::string where = "backend '" + b.name.substr(0, 64) + "'";
  const auto address = parseIpAddress(d.at("address").get<std::string>());
  if (!address) return where + ": address is not an IP address";
  b.address = *address;
  b.id = d.at("id").get<std::uint64_t>();
  if (b.id != discoveredBackendId(b.address)) return where + ": id is not its address's";
  if (auto bad = backendNameProblem(b.name)) return where + ": " + *bad;
  if (r.pool.empty()) return where + ": no pool";
  const std::uint64_t weight = d.at("weight").get<std::uint64_t>();
  if (weight > kMaxBackendWeight) return where + ": weight out of range";
  b.weight = static_cast<std::uint32_t>(weight);
  if (d.contains("mac")) {
    b.mac = parseMacAddress(d.at("mac").get<std::string>());
    if (!b.mac) return where + ": mac is not a MAC address";
  }
  if (d.contains("metrics_port")) {
    b.metricsPort = d.at("metrics_port").get<std::uint16_t>();
    b.metricsPath = d.at("metrics_path").get<std::string>();
  }
  if (d.contains("leaving_since_unix_ms")) {
    r.leavingSinceUnixMs = d.at("leaving_since_unix_ms").get<std::uint64_t>();
  }
  return r;
}

}  // namespace

std::variant<TablesState, std::string> decodeTablesState(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::string("not JSON");
  try {
    if (j.at("version").get<int>() != 1) return std::string("version is not 1");
    TablesState s;
    s.writtenUnixMs = j.at("written_unix_ms").get<std::uint64_t>();
    s.generation = j.at("generation").get<std::uint64_t>();
    for (const auto& [vip, weights] : j.at("weights").items()) {
      auto& m = s.weights[vip];
      for (const auto& [id, w] : weights.items()) {
        std::size_t used = 0;
        const std::uint64_t key = std::stoull(id, &used);
        if (used != id.size()) return "vip " + vip + ": backend id '" + id + "' is not a number";
        if (!w.is_number_unsigned() || w.get<std::uint64_t>() > UINT32_MAX) {
          return "vip " + vip + ": weight of backend " + id + " is not a 32-bit unsigned number";
        }
        m[key] = w.get<std::uint32_t>();
      }
    }
    for (const auto& id : j.at("saturated")) {
      if (!id.is_number_unsigned()) return std::string("saturated: not a list of backend ids");
      s.saturated.push_back(id.get<std::uint64_t>());
    }
    if (j.contains("next_hops")) {
      for (const auto& [id, mac] : j.at("next_hops").items()) {
        std::size_t used = 0;
        const std::uint64_t key = std::stoull(id, &used);
        const auto parsed =
            mac.is_string() ? parseMacAddress(mac.get<std::string>()) : std::nullopt;
        if (used != id.size() || !parsed) return "next_hops: bad entry for '" + id + "'";
        s.nextHops[key] = *parsed;
      }
    }
    if (j.contains("discovered")) {
      std::set<std::uint64_t> ids;
      for (const auto& d : j.at("discovered")) {
        auto r = decodeDiscovered(d);
        if (auto* e = std::get_if<std::string>(&r)) return "discovered: " + *e;
        auto& record = std::get<DiscoveredRecord>(r);
        if (!ids.insert(record.backend.id).second) {
          return "discovered: backend '" + record.backend.name + "' is listed twice";
        }
        s.discovered.push_back(std::move(record));
      }
    }
    return s;
  } catch (const std::exception& e) {
    return std::string("malformed: ") + e.what();
  }
}

}  // namespace spillway
