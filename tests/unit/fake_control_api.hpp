// A ControlApi for tests of the CLI socket, spillwayctl and the metrics
// endpoint: records every call as text ("backendDrain(gpu-a1)") and answers
// with canned results shaped like the control plane's, or with a scripted
// reply per method (`replies["backendDrain"] = ApiError{...}`).
//
// Thread contract: one thread (the test's), like the real one.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "control/api/control_api.hpp"

namespace spillway::testing {

class FakeControlApi : public ControlApi {
 public:
  std::vector<std::string> calls;
  std::map<std::string, ApiResult> replies;  // by method name; overrides the canned result
  BackendSpec lastSpec;
  std::optional<PeerCredentials> lastCaller;  // of config.check / config.reload
  std::string metrics =
      "# HELP spillway_up Whether spillwayd runs.\n# TYPE spillway_up gauge\nspillway_up 1\n";

  ApiResult status() override {
    return answer("status", "status()",
                  Json{{"version", "0.1.0"},
                       {"uptime_seconds", 42},
                       {"generation", 7},
                       {"lcores", 2},
                       {"vips", 1},
                       {"pools", 2},
                       {"backends", 3},
                       {"panic", false}});
  }
  ApiResult vipList() override {
    return answer("vipList", "vipList()",
                  Json::array({Json{{"name", "nccl"},
                                    {"address", "192.0.2.10"},
                                    {"port", 0},
                                    {"protocol", "tcp"},
                                    {"backends", 3}}}));
  }
  ApiResult vipShow(const std::string& name) override {
    return answer("vipShow", "vipShow(" + name + ")",
                  Json{{"name", name}, {"address", "192.0.2.10"}, {"table_size", 65537}});
  }
  ApiResult poolList() override {
    return answer(
        "poolList", "poolList()",
        Json::array({Json{{"name", "onprem"}, {"site", "onprem"}, {"priority", 0}, {"share", 1.0}},
                     Json{{"name", "cloud"}, {"site", "cloud"}, {"priority", 1}, {"share", 0.0}}}));
  }
  ApiResult poolShow(const std::string& name) override {
    return answer("poolShow", "poolShow(" + name + ")", Json{{"name", name}, {"priority", 0}});
  }
  ApiResult backendList() override {
    return answer("backendList", "backendList()",
                  Json::array({Json{{"name", "gpu-a1"},
                                    {"pool", "onprem"},
                                    {"address", "10.0.0.1"},
                                    {"state", "active"},
                                    {"weight", 100},
                                    {"effective_weight", 87},
                                    {"rtt_ms", 0.25},
                                    {"gpu_util", 0.5},
                                    {"flows", 12}},
                               Json{{"name", "gpu-c1"},
                                    {"pool", "cloud"},
                                    {"address", "2001:db8::1"},
                                    {"state", "draining"},
                                    {"weight", 50},
                                    {"effective_weight", 0},
                                    {"rtt_ms", 61.5},
                                    {"gpu_util", nullptr},
                                    {"flows", 3}}}));
  }
  ApiResult backendAdd(const BackendSpec& spec) override {
    lastSpec = spec;
    return answer("backendAdd", "backendAdd(" + spec.name + ")",
                  Json{{"name", spec.name}, {"state", "active"}});
  }
  ApiResult backendRemove(const std::string& name) override {
    return answer("backendRemove", "backendRemove(" + name + ")", Json::object());
  }
  ApiResult backendDrain(const std::string& name) override {
    return answer("backendDrain", "backendDrain(" + name + ")",
                  Json{{"name", name}, {"state", "draining"}});
  }
  ApiResult backendUndrain(const std::string& name) override {
    return answer("backendUndrain", "backendUndrain(" + name + ")",
                  Json{{"name", name}, {"state", "active"}});
  }
  ApiResult backendDisable(const std::string& name) override {
    return answer("backendDisable", "backendDisable(" + name + ")",
                  Json{{"name", name}, {"state", "disabled"}});
  }
  ApiResult backendEnable(const std::string& name) override {
    return answer("backendEnable", "backendEnable(" + name + ")",
                  Json{{"name", name}, {"state", "active"}});
  }
  ApiResult backendWeight(const std::string& name, std::uint32_t weight, bool dryRun) override {
    return answer("backendWeight",
                  "backendWeight(" + name + "," + std::to_string(weight) + "," +
                      (dryRun ? "dry" : "apply") + ")",
                  Json{{"name", name},
                       {"weight", weight},
                       {"dry_run", dryRun},
                       {"moved", Json{{"nccl", 1234}}}});
  }
  ApiResult tableShow(const std::string& vip) override {
    return answer(
        "tableShow", "tableShow(" + vip + ")",
        Json{{"generation", 7},
             {"vips",
              Json::array({Json{{"vip", "nccl"},
                                {"entries", Json{{"gpu-a1", 40000}, {"gpu-c1", 25537}}}}})}});
  }
  ApiResult tableDigest(const std::string& vip, std::optional<std::uint32_t> chunk) override {
    return answer("tableDigest",
                  "tableDigest(" + vip + (chunk ? "," + std::to_string(*chunk) : "") + ")",
                  Json{{"generation", 7}, {"warmup", false}, {"tables", Json::array()}});
  }
  ApiResult flows() override {
    return answer("flows", "flows()",
                  Json{{"backends", Json::array({Json{{"backend", "gpu-a1"}, {"flows", 12}}})},
                       {"lcores", Json::array({Json{{"lcore", 1}, {"flows", 12}}})}});
  }
  ApiResult flowsAdopted() override {
    return answer(
        "flowsAdopted", "flowsAdopted()",
        Json{{"adopted",
              Json::array({Json{
                  {"hash", 42}, {"vip", "nccl"}, {"backend", "gpu-a1"}, {"origin", "peer"}}})}});
  }
  ApiResult stats() override {
    return answer(
        "stats", "stats()",
        Json{{"rx_packets", 1000}, {"tx_packets", 990}, {"drops", Json{{"not_vip", 10}}}});
  }
  ApiResult health() override {
    return answer("health", "health()",
                  Json::array({Json{{"backend", "gpu-a1"}, {"up", true}, {"rtt_ms", 0.25}}}));
  }
  ApiResult events(std::uint64_t after, std::uint32_t limit) override {
    Json list = Json::array();
    for (std::uint64_t seq = after + 1; seq <= eventCount && list.size() < limit; ++seq) {
      list.push_back(
          Json{{"seq", seq}, {"backend", "gpu-a1"}, {"to", "draining"}, {"cause", "operator"}});
    }
    const std::uint64_t next = list.empty() ? after : list.back()["seq"].get<std::uint64_t>();
    return answer("events", "events(" + std::to_string(after) + "," + std::to_string(limit) + ")",
                  Json{{"events", list}, {"next", next}});
  }
  ApiResult configCheck(const std::string& path, const PeerCredentials* caller) override {
    lastCaller = caller ? std::optional<PeerCredentials>(*caller) : std::nullopt;
    return answer(
        "configCheck", "configCheck(" + path + ")",
        Json{{"path", path.empty() ? "/etc/spillway/spillway.toml" : path}, {"valid", true}});
  }
  ApiResult configReload(const std::string& path, const PeerCredentials* caller) override {
    lastCaller = caller ? std::optional<PeerCredentials>(*caller) : std::nullopt;
    return answer("configReload", "configReload(" + path + ")",
                  Json{{"generation", 8}, {"changed", true}});
  }
  ApiResult configDump(bool effective) override {
    return answer("configDump", effective ? "configDump(effective)" : "configDump()",
                  Json{{"vips", Json::array()}});
  }
  ApiResult configClearOverrides(const std::string& backend) override {
    return answer("configClearOverrides", "configClearOverrides(" + backend + ")",
                  Json{{"cleared", Json::array()}});
  }
  ApiResult lbDrain() override {
    return answer("lbDrain", "lbDrain()", Json{{"drained", true}, {"withdrawn", Json::array()}});
  }
  ApiResult lbUndrain() override {
    return answer("lbUndrain", "lbUndrain()", Json{{"drained", false}});
  }
  ApiResult lbStatus() override {
    return answer("lbStatus", "lbStatus()", Json{{"state", "disabled"}});
  }
  ApiResult discovery() override {
    return answer("discovery", "discovery()", Json{{"sources", Json::array()}});
  }
  std::string metricsText() override {
    calls.push_back("metricsText()");
    return metrics;
  }

  std::uint64_t eventCount = 5;

 private:
  ApiResult answer(const std::string& method, std::string call, Json canned) {
    calls.push_back(std::move(call));
    const auto it = replies.find(method);
    if (it != replies.end()) return it->second;
    return canned;
  }
};

}  // namespace spillway::testing
