// spillway-decap's connection agent: the backend tells the load balancers
// which connections it really holds, per VIP, from the kernel's socket
// diagnostics (sock_diag.hpp), so that a drain completes on what is true
// rather than on each spillwayd's own flow-table count (ARCHITECTURE.md,
// "Drains judged by the backend").
//
// Served over HTTP/1.1 (one request per connection, Connection: close):
//   GET /metrics            Prometheus text, unauthenticated, like the GPU
//                           load endpoint spillwayd already scrapes:
//                             spillway_backend_connections{vip="A"} N
//                           one line per --vip (0 included), plus the agent's
//                           own counters (refused requests, dump errors);
//                           503 when the socket dump failed, so a scraper
//                           never takes a failed dump for zero.
//   GET /connections[?vip=A] the connections themselves (JSON: per VIP, the
//                           client address and port and the VIP's port),
//                           at most `listCap` in all ("truncated": true and
//                           the full "total" when cut); only with the header
//                           `Authorization: Bearer TOKEN` (the --token-file's
//                           contents): anything else is 401 and counted,
//                           and without a token file the list is disabled (403).
// Anything else is 404 / 405 / 400; a request larger than kMaxRequestBytes or
// slower than the read timeout is dropped and counted. Clients are read side
// by side (poll, at most kMaxPending at once, the oldest dropped beyond), so a
// client that sends nothing delays no one else's answer.
//
// The pure parts (request parsing, tallying, rendering, the authorisation
// check) are functions that the unit tests call; runConnAgent() is the loop
// (answers are written in turn; the dump of a few thousand sockets takes well
// under a millisecond).
// Thread contract: single-threaded; no exceptions escape runConnAgent().
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sock_diag.hpp"

namespace spillway {

constexpr std::size_t kMaxRequestBytes = 8 * 1024;
constexpr std::size_t kMaxPending = 64;

struct ConnAgentOptions {
  std::string listen = "0.0.0.0:9411";  // ADDRESS:PORT, [IPv6]:PORT
  std::vector<std::string> vips;        // addresses whose connections are reported
  std::string tokenFile;                // empty: the list endpoint is disabled
  std::size_t listCap = 10'000;         // connections in one list answer
  int readTimeoutMs = 2000;
};

struct AgentRequest {
  std::string method;
  std::string path;    // without the query
  std::string vip;     // ?vip=..., empty when absent
  std::string bearer;  // Authorization: Bearer ... (empty when absent)
};

// Parses the request head (up to the blank line). std::nullopt when it is not
// an HTTP/1.x request line with headers.
[[nodiscard]] std::optional<AgentRequest> parseAgentRequest(std::string_view head);

struct AgentCounters {
  std::uint64_t requests = 0;
  std::uint64_t refused = 0;      // list requests without the right token
  std::uint64_t badRequests = 0;  // unparsable, too large, too slow
  std::uint64_t dumpErrors = 0;
};

// The agent's view of one dump: the sockets whose local address is a VIP.
struct ConnView {
  std::vector<DiagAddress> vips;
  std::vector<std::uint64_t> counts;                        // per vip
  std::vector<std::pair<std::size_t, DiagSocket>> sockets;  // (vip index, socket)
  // Adds a socket of the dump; ignored unless its local address is a VIP.
  void add(const DiagSocket& socket);
};

[[nodiscard]] std::string renderConnMetrics(const ConnView& view, const AgentCounters& counters);
// JSON; `only`: one VIP's connections (empty: all). At most `cap` entries.
[[nodiscard]] std::string renderConnList(const ConnView& view, const std::string& only,
                                         std::size_t cap);

// Constant-time comparison of the presented token with the configured one;
// false when either is empty.
[[nodiscard]] bool tokenMatches(std::string_view presented, std::string_view token) noexcept;

struct AgentResponse {
  int status = 200;
  std::string contentType = "text/plain; version=0.0.4";
  std::string body;
};

// The answer to one request. `dump` fills a view (returns false with an
// error on failure); it is called only for the requests that need it.
template <typename Dump>
AgentResponse answerAgentRequest(const AgentRequest& request, const std::vector<DiagAddress>& vips,
                                 const std::string& token, std::size_t cap, AgentCounters& counters,
                                 Dump&& dump);

// Runs the agent until SIGTERM / SIGINT; returns the exit status.
int runConnAgent(const ConnAgentOptions& options);

// ---------------------------------------------------------------------------

template <typename Dump>
AgentResponse answerAgentRequest(const AgentRequest& request, const std::vector<DiagAddress>& vips,
                                 const std::string& token, std::size_t cap, AgentCounters& counters,
                                 Dump&& dump) {
  ++counters.requests;
  AgentResponse r;
  const bool metrics = request.path == "/metrics";
  const bool list = request.path == "/connections";
  if (!metrics && !list) {
    r.status = 404;
    r.body = "not found: GET /metrics or /connections\n";
    return r;
  }
  if (request.method != "GET") {
    r.status = 405;
    r.body = "only GET\n";
    return r;
  }
  if (list) {
    if (token.empty()) {
      r.status = 403;
      r.body = "the connection list is disabled (the agent has no --token-file)\n";
      return r;
    }
    if (!tokenMatches(request.bearer, token)) {
      ++counters.refused;
      r.status = 401;
      r.body = "unauthorised: Authorization: Bearer TOKEN required\n";
      return r;
    }
  }
  ConnView view;
  view.vips = vips;
  view.counts.assign(vips.size(), 0);
  std::string error;
  if (!dump(view, error)) {
    ++counters.dumpErrors;
    r.status = 503;
    r.body = "socket diagnostics failed: " + error + "\n";
    return r;
  }
  if (metrics) {
    r.body = renderConnMetrics(view, counters);
  } else {
    r.contentType = "application/json";
    r.body = renderConnList(view, request.vip, cap);
  }
  return r;
}

}  // namespace spillway
