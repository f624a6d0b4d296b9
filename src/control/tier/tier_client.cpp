#include "control/tier/tier_client.hpp"

#include <algorithm>
#include <map>
#include <thread>

#include "control/api/cli_server.hpp"
#include "control/backends/table_digest.hpp"
#include "spillway/maglev.hpp"

namespace spillway {

namespace {

TierOutcome failure(std::string code, std::string message) {
  TierOutcome out;
  out.errorCode = std::move(code);
  out.errorMessage = std::move(message);
  return out;
}

// One VIP's digest as one instance reported it.
struct VipDigest {
  std::string fingerprint;
  std::uint64_t tableSize = 0;
  std::vector<std::string> chunks;
};

// Reads a table.digest reply; an error message when it is malformed.
std::string readDigest(const Json& result, std::map<std::string, VipDigest>& out) {
  const auto tables = result.find("tables");
  if (!result.is_object() || tables == result.end() || !tables->is_array()) {
    return "table.digest reply has no \"tables\" array";
  }
  for (const Json& t : *tables) {
    if (!t.is_object() || !t.contains("vip") || !t["vip"].is_string() ||
        !t.contains("fingerprint") || !t["fingerprint"].is_string() || !t.contains("table_size") ||
        !t["table_size"].is_number_unsigned() || !t.contains("chunks") || !t["chunks"].is_array()) {
      return "table.digest reply has a malformed table entry";
    }
    VipDigest d;
    d.fingerprint = t["fingerprint"].get<std::string>();
    d.tableSize = t["table_size"].get<std::uint64_t>();
    if (d.tableSize > kMaglevMaxTableSize ||
        t["chunks"].size() != (d.tableSize + kDigestChunkEntries - 1) / kDigestChunkEntries) {
      return "table.digest reply for " + t["vip"].get<std::string>() + ": " +
             std::to_string(t["chunks"].size()) + " chunk hashes for a table of " +
             std::to_string(d.tableSize) + " entries";
    }
    for (const Json& c : t["chunks"]) {
      if (!c.is_string()) return "table.digest reply has a non-string chunk hash";
      d.chunks.push_back(c.get<std::string>());
    }
    out[t["vip"].get<std::string>()] = std::move(d);
  }
  return {};
}

}  // namespace

TierCall socketTierCall(std::chrono::milliseconds timeout) {
  return [timeout](const TierInstance& instance, std::string_view command, const Json& args) {
    CliClient client;
    std::string error;
    if (!client.connect(instance.socketPath, error, timeout)) return failure("connect", error);
    std::string reply;
    if (!client.call(makeRequest(command, args), reply, timeout, error)) {
      return failure(error.starts_with("no reply") ? "timeout" : "exchange", error);
    }
    std::optional<Reply> parsed = parseReply(reply);
    if (!parsed) return failure("malformed", "malformed reply from " + instance.socketPath);
    if (!parsed->ok) return failure(parsed->errorCode, parsed->errorMessage);
    TierOutcome out;
    out.ok = true;
    out.result = std::move(parsed->result);
    return out;
  };
}

std::vector<TierOutcome> fanOut(const TierFile& tier, std::string_view command, const Json& args,
                                const TierCall& call) {
  std::vector<TierOutcome> outcomes(tier.instances.size());
  std::vector<std::thread> threads;
  threads.reserve(tier.instances.size());
  for (std::size_t i = 0; i < tier.instances.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        outcomes[i] = call(tier.instances[i], command, args);
      } catch (const std::exception& e) {
        outcomes[i] = failure("internal", e.what());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return outcomes;
}

Json fanOutJson(const TierFile& tier, const std::vector<TierOutcome>& outcomes) {
  Json out = Json::object();
  for (std::size_t i = 0; i < tier.instances.size() && i < outcomes.size(); ++i) {
    const TierOutcome& o = outcomes[i];
    out[tier.instances[i].name] =
        o.ok ? Json{{"ok", true}, {"result", o.result}}
             : Json{{"ok", false},
                    {"error", Json{{"code", o.errorCode}, {"message", o.errorMessage}}}};
  }
  return out;
}

Json tierStatus(const TierFile& tier, const TierCall& call) {
  const std::size_t n = tier.instances.size();
  const std::vector<TierOutcome> digests = fanOut(tier, "table.digest", Json::object(), call);
  std::vector<std::map<std::string, VipDigest>> parsed(n);
  Json instances = Json::object();
  std::vector<std::string> vipOrder;
  for (std::size_t i = 0; i < n; ++i) {
    Json entry = Json::object();
    const TierOutcome& o = digests[i];
    std::string problem =
        o.ok ? readDigest(o.result, parsed[i]) : o.errorCode + ": " + o.errorMessage;
    entry["ok"] = problem.empty();
    if (!problem.empty()) {
      entry["error"] = problem;
      parsed[i].clear();
    } else {
      entry["generation"] = o.result.value("generation", Json(nullptr));
      entry["warmup"] = o.result.value("warmup", Json(nullptr));
      if (o.result.contains("intent")) entry["intent"] = o.result["intent"];
      entry["vips"] = Json::object();
      for (const auto& [vip, d] : parsed[i]) {
        if (std::find(vipOrder.begin(), vipOrder.end(), vip) == vipOrder.end()) {
          vipOrder.push_back(vip);
        }
      }
    }
    instances[tier.instances[i].name] = std::move(entry);
  }

  // Chunks fetched once per (instance, vip, chunk).
  std::map<std::tuple<std::size_t, std::string, std::size_t>, DecodedChunk> fetched;
  const auto chunkOf = [&](std::size_t i, const std::string& vip,
                           std::size_t chunk) -> const DecodedChunk& {
    const auto key = std::make_tuple(i, vip, chunk);
    auto it = fetched.find(key);
    if (it != fetched.end()) return it->second;
    const TierOutcome o =
        call(tier.instances[i], "table.digest", Json{{"vip", vip}, {"chunk", chunk}});
    DecodedChunk d;
    if (o.ok) {
      d = decodeTableChunk(o.result);
    } else {
      d.error = o.errorCode + ": " + o.errorMessage;
    }
    if (!d.error.empty()) d.error = tier.instances[i].name + ": " + d.error;
    return fetched.emplace(key, std::move(d)).first->second;
  };

  Json vips = Json::object();
  for (const std::string& vip : vipOrder) {
    std::map<std::string, std::vector<std::size_t>> byFingerprint;
    std::vector<std::string> fingerprintOrder;
    for (std::size_t i = 0; i < n; ++i) {
      const auto it = parsed[i].find(vip);
      if (it == parsed[i].end()) continue;
      auto& holders = byFingerprint[it->second.fingerprint];
      if (holders.empty()) fingerprintOrder.push_back(it->second.fingerprint);
      holders.push_back(i);
    }
    std::string reference = fingerprintOrder.front();
    for (const std::string& f : fingerprintOrder) {
      if (byFingerprint[f].size() > byFingerprint[reference].size()) reference = f;
    }
    const std::size_t ref = byFingerprint[reference].front();
    const VipDigest& refDigest = parsed[ref].at(vip);
    Json refNames = Json::array();
    for (std::size_t i : byFingerprint[reference]) refNames.push_back(tier.instances[i].name);
    std::size_t reporting = 0;
    for (const auto& [f, holders] : byFingerprint) reporting += holders.size();
    vips[vip] = Json{{"reference_fingerprint", reference},
                     {"reference_instances", refNames},
                     {"agreeing", byFingerprint[reference].size()},
                     {"reporting", reporting}};

    for (std::size_t i = 0; i < n; ++i) {
      const auto it = parsed[i].find(vip);
      if (it == parsed[i].end()) continue;
      const VipDigest& d = it->second;
      Json row{{"fingerprint", d.fingerprint},
               {"table_size", d.tableSize},
               {"reference", d.fingerprint == reference}};
      if (d.fingerprint == reference) {
        row["differing_entries"] = 0;
      } else if (d.tableSize != refDigest.tableSize) {
        row["differing_entries"] = std::max(d.tableSize, refDigest.tableSize);
        row["differing_note"] =
            "table size differs from the reference's " + std::to_string(refDigest.tableSize);
      } else {
        std::uint64_t differing = 0;
        std::string error;
        bool anyChunk = false;
        for (std::size_t c = 0; c < d.chunks.size() && error.empty(); ++c) {
          if (c < refDigest.chunks.size() && d.chunks[c] == refDigest.chunks[c]) continue;
          anyChunk = true;
          const DecodedChunk& mine = chunkOf(i, vip, c);
          const DecodedChunk& theirs = chunkOf(ref, vip, c);
          error = !mine.error.empty() ? mine.error : theirs.error;
          if (error.empty()) differing += countDiffering(mine.ids, theirs.ids);
        }
        if (!anyChunk && d.chunks.size() == refDigest.chunks.size()) {
          error = "the fingerprint differs from the reference's but no chunk hash does";
        }
        row["differing_entries"] = error.empty() ? Json(differing) : Json(nullptr);
        if (!error.empty()) row["differing_error"] = error;
      }
      instances[tier.instances[i].name]["vips"][vip] = std::move(row);
    }
  }
  // Operator intent: the instances grouped by the digest of the intent they
  // hold; each instance's own view of its peers says how many entries differ.
  Json intentDigests = Json::object();
  std::size_t intentReporting = 0;
  for (const TierInstance& t : tier.instances) {
    const Json& e = instances[t.name];
    if (!e.contains("intent") || !e["intent"].contains("digest")) continue;
    ++intentReporting;
    intentDigests[e["intent"]["digest"].get<std::string>()].push_back(t.name);
  }
  const bool intentAgree = intentDigests.size() <= 1;
  Json intent{{"digests", std::move(intentDigests)},
              {"reporting", intentReporting},
              {"agree", intentAgree}};
  return Json{{"instances", std::move(instances)},
              {"vips", std::move(vips)},
              {"intent", std::move(intent)}};
}

}  // namespace spillway
