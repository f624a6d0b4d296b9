// The operations an operator can ask of a running spillwayd, as the CLI
// socket (cli_server.hpp) and the metrics endpoint see them. The control
// plane (control_plane.hpp) implements it; tests implement fakes.
//
// Every call returns a JSON value: on success the reply's payload; on a
// rejected request an ApiError (which the socket turns into an error reply),
// and the running state is unchanged. Calls never throw.
//
// Thread contract: called on the control thread only (the socket server and
// the metrics endpoint are polled from the control loop).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace spillway {

using Json = nlohmann::json;

// Who sent a request, as the kernel reports it (SO_PEERCRED, SO_PEERGROUPS).
struct PeerCredentials {
  std::int32_t pid = 0;
  std::uint32_t uid = 65534;  // nobody until read
  std::uint32_t gid = 65534;
  std::vector<std::uint32_t> groups;  // supplementary groups, may be empty
};

struct ApiError {
  std::string code;     // stable, machine readable: "not_found", "invalid", "conflict", ...
  std::string message;  // for people: what was wrong and what to do
};

using ApiResult = std::variant<Json, ApiError>;

// A backend to add at run time (spillwayctl backend add).
struct BackendSpec {
  std::string name;
  std::string address;
  std::string pool;
  std::uint32_t weight = 100;
  std::optional<std::uint64_t> id;
  std::optional<std::string> mac;
  std::optional<std::string> port;
};

class ControlApi {
 public:
  virtual ~ControlApi() = default;

  // status: version, uptime, generation, lcores, VIP/pool/backend counts,
  // panic and spillover summary.
  virtual ApiResult status() = 0;
  virtual ApiResult vipList() = 0;
  virtual ApiResult vipShow(const std::string& name) = 0;
  virtual ApiResult poolList() = 0;
  virtual ApiResult poolShow(const std::string& name) = 0;
  // Each backend: name, pool, address, state (and why), base and effective
  // weight, table entries per VIP, health (up/down, RTT), GPU utilisation,
  // queue depth, live flows.
  virtual ApiResult backendList() = 0;
  virtual ApiResult backendAdd(const BackendSpec& spec) = 0;
  virtual ApiResult backendRemove(const std::string& name) = 0;
  virtual ApiResult backendDrain(const std::string& name) = 0;
  virtual ApiResult backendUndrain(const std::string& name) = 0;
  virtual ApiResult backendDisable(const std::string& name) = 0;
  virtual ApiResult backendEnable(const std::string& name) = 0;
  // dryRun: the predicted move (entries per VIP that would change) without
  // applying it.
  virtual ApiResult backendWeight(const std::string& name, std::uint32_t weight, bool dryRun) = 0;
  // Entries per backend of a VIP's table (all VIPs when name is empty), and
  // the generation.
  virtual ApiResult tableShow(const std::string& vip) = 0;
  // A tier's comparison of tables (table_digest.hpp): without a chunk, the
  // generation, warm-up and every VIP's fingerprint and chunk hashes (one VIP
  // when named); with one, that chunk of the VIP's table.
  virtual ApiResult tableDigest(const std::string& vip, std::optional<std::uint32_t> chunk) {
    (void)vip;
    (void)chunk;
    return ApiError{"unsupported", "table.digest is not served here"};
  }
  // Live tracked flows per backend and per lcore.
  virtual ApiResult flows() = 0;
  // The flows the workers adopted from exceptions (adopted_flows.hpp): per
  // flow its hash, VIP, backend, the exception's origin (checkpoint, peer,
  // backend) and when; the counts per origin; and the flows the last export
  // found tracked on a backend their table no longer gives (the flow
  // table's own). What the drills attribute surviving flows with.
  virtual ApiResult flowsAdopted() {
    return ApiError{"unsupported", "flows.adopted is not served here"};
  }
  // The data path's counters (packets, drops by reason, per lcore).
  virtual ApiResult stats() = 0;
  // Health per backend: state, consecutive results, last error, RTT.
  virtual ApiResult health() = 0;
  // Events with sequence number > after, at most limit; the reply says the
  // next sequence number to ask for.
  virtual ApiResult events(std::uint64_t after, std::uint32_t limit) = 0;
  // Validate a configuration file (default: the running one's path).
  // `caller` is the CLI peer that asked (nullptr: the daemon itself): one
  // other than root may name only files under the running configuration's
  // directory, and is told nothing the file holds unless it could read the
  // file itself (config_access.hpp).
  virtual ApiResult configCheck(const std::string& path, const PeerCredentials* caller) = 0;
  // Load and apply a configuration (default: the running one's path); a
  // rejected file changes nothing. `caller` as for configCheck.
  virtual ApiResult configReload(const std::string& path, const PeerCredentials* caller) = 0;
  // The running configuration; effective: the file merged with the
  // operator's runtime overrides, each overridden value with its source
  // (file, or runtime with journal sequence and time).
  virtual ApiResult configDump(bool effective) = 0;
  // Forgets the runtime overrides of one backend (all when empty): the file's
  // values apply again. Journaled like every change.
  virtual ApiResult configClearOverrides(const std::string& backend) = 0;
  // The instance's BGP announcement (announce_exchange.hpp): lb drain
  // withdraws every VIP (journaled, kept across restarts) and replies with
  // what it withdraws; lb undrain announces them again; lb status shows the
  // state and every VIP's announcement and reason.
  virtual ApiResult lbDrain() = 0;
  virtual ApiResult lbUndrain() = 0;
  virtual ApiResult lbStatus() = 0;
  // Discovery sources ([[pool]] discovery): per source its last refresh,
  // entries, errors and last change.
  virtual ApiResult discovery() = 0;
  // The Prometheus text exposition of every metric.
  virtual std::string metricsText() = 0;
};

}  // namespace spillway
