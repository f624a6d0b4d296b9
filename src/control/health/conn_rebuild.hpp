// The start-up rebuild of flow exceptions from the backends: an instance asks
// the connection agent of every backend whose pool has `[pool.connections]
// token_file` (spillway-decap agent, src/dataplane/xdp/conn_agent.hpp) for
// the connections it holds, `GET /connections` with the pool's bearer token,
// and turns each (VIP, client address, client port) into the flow's hash:
// the FlowHasher hash of the 5-tuple client -> VIP as the data path hashes a
// packet (the VIP's port from the agent's `vip_port`, TCP). The plane hands
// the result to the AffinityKeeper, which puts an exception in the snapshots
// wherever a table would send such a flow elsewhere (affinity_keeper.hpp).
// Why the backend: it is the one place that knows whether a connection
// exists, so an instance that lost its memory (no checkpoint, no peer) can
// still keep every flow (issue 24; README "The layers of flow affinity").
//
// Bounds. One request per backend, at most kRebuildParallel in flight, each
// given its pool's `rebuild_timeout` (default 2 s); the whole rebuild ends
// at kConnRebuildLimit (10 s) after it started, whatever is still pending
// then is counted as not answered. An answer is at most kRebuildMaxBytes
// (8 MiB: ~80,000 connections at the agent's ~100 bytes each); at most
// `maxFlows` flows are kept over all backends (the rest are counted). A
// truncated list (the agent's --list-cap) is used as far as it goes and
// counted. Bad answers (connect failures, HTTP errors such as 401 for a
// wrong token, bodies that are not the agent's JSON, entries that are not a
// client address and port of a VIP this backend serves) are counted per
// backend; none stops the rebuild of the others, none throws.
//
// Two backends that claim the same flow: an ESTABLISHED socket beats one in
// another state, otherwise the first answer wins; counted as conflicts.
//
// Thread contract: the control thread owns it: pollFd() in its epoll,
// poll(now) on events and every round; never blocks; no exceptions escape;
// time injected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "control/config/config.hpp"
#include "control/health/http_client.hpp"
#include "spillway/flow_key.hpp"
#include "spillway/flow_table.hpp"

namespace spillway {

inline constexpr std::size_t kRebuildParallel = 64;
inline constexpr std::size_t kRebuildMaxBytes = std::size_t{8} << 20;

// A TCP VIP the backend serves; port 0 = every port.
struct RebuildVip {
  IpAddress address;
  std::uint16_t port = 0;
  std::uint8_t tag = 0;  // vipTagOf(its key): the flow table's VIP tag
};

struct RebuildTarget {
  std::uint64_t id = 0;
  std::string name;
  IpAddress address;
  std::uint16_t port = 9411;
  std::string path = "/connections";
  std::string token;
  Millis timeout = 2000;
  std::vector<RebuildVip> vips;
};

// One connection a backend holds, as the snapshot's exceptions need it.
struct RebuiltFlow {
  std::uint64_t hash = 0;
  std::uint64_t backendId = 0;
  std::uint8_t vipTag = 0;
  bool established = true;  // the agent's state was ESTABLISHED (or not given)
};

// What one agent's answer gave.
struct ConnListAnswer {
  std::vector<RebuiltFlow> flows;
  std::size_t listed = 0;   // entries read
  std::size_t total = 0;    // the agent's "total" (listed when absent)
  bool truncated = false;   // the agent cut its list (--list-cap)
  std::size_t invalid = 0;  // entries that are not a client address and port
  std::size_t foreign = 0;  // entries of an address or port that is no VIP of this backend
};

// Parses the agent's JSON list (conn_agent.cpp, renderConnList) for
// `target`: an error (why) when the body is not that JSON at all.
[[nodiscard]] std::variant<ConnListAnswer, std::string> parseConnList(std::string_view body,
                                                                      const RebuildTarget& target,
                                                                      const FlowHasher& hasher);

struct RebuildBackendStatus {
  std::string name;
  std::uint64_t id = 0;
  enum class Outcome : std::uint8_t { Pending, Answered, Failed } outcome = Outcome::Pending;
  std::string error;  // with Failed
  std::size_t listed = 0, total = 0, flows = 0, invalid = 0, foreign = 0;
  bool truncated = false;
  Millis tookMs = 0;
};

struct RebuildTotals {
  std::size_t flows = 0;      // distinct flows kept (flows().size())
  std::size_t answered = 0;   // backends that answered with a list
  std::size_t failed = 0;     // backends that did not (error, timeout, bad answer)
  std::size_t truncated = 0;  // answers the agent cut
  std::size_t overCap = 0;    // flows beyond maxFlows, dropped
  std::size_t conflicts = 0;  // flows two backends claimed
  std::size_t invalid = 0;    // entries refused (invalid + foreign)
};

class ConnRebuild {
 public:
  ConnRebuild(std::vector<RebuildTarget> targets, std::uint64_t hashSeed, std::size_t maxFlows);
  ~ConnRebuild();
  ConnRebuild(const ConnRebuild&) = delete;
  ConnRebuild& operator=(const ConnRebuild&) = delete;

  [[nodiscard]] int pollFd() const noexcept { return epollFd_; }
  // Starts requests (the first call starts the clock), takes answers,
  // applies timeouts and the overall limit.
  void poll(Millis now) noexcept;
  // Every backend answered or failed (or the overall limit passed).
  [[nodiscard]] bool done() const noexcept { return done_; }
  [[nodiscard]] std::optional<Millis> nextDeadline() const noexcept;
  [[nodiscard]] std::optional<Millis> startedAt() const noexcept { return started_; }
  [[nodiscard]] std::optional<Millis> finishedAt() const noexcept { return finished_; }

  // What one backend's exchange ended with, as poll() records it; public so
  // that tests can feed bodies without a server.
  void record(std::size_t index, Millis now, int status, std::string_view body) noexcept;
  void recordFailure(std::size_t index, Millis now, std::string error) noexcept;

  [[nodiscard]] const std::vector<RebuiltFlow>& flows() const noexcept { return flows_; }
  [[nodiscard]] const std::vector<RebuildBackendStatus>& backends() const noexcept {
    return status_;
  }
  [[nodiscard]] const RebuildTotals& totals() const noexcept { return totals_; }

 private:
  struct Request;
  void start(std::size_t index, Millis now) noexcept;
  void finish(std::size_t index, Millis now) noexcept;
  void checkDone(Millis now) noexcept;

  std::vector<RebuildTarget> targets_;
  std::vector<RebuildBackendStatus> status_;
  std::vector<std::unique_ptr<Request>> requests_;
  FlowHasher hasher_;
  std::size_t maxFlows_;
  int epollFd_ = -1;
  std::string initError_;
  std::size_t nextToStart_ = 0;
  std::size_t inFlight_ = 0;
  std::optional<Millis> started_;
  std::optional<Millis> finished_;
  bool done_ = false;
  std::vector<RebuiltFlow> flows_;
  std::unordered_map<std::uint64_t, std::size_t> byHash_;  // into flows_
  RebuildTotals totals_;
};

}  // namespace spillway
