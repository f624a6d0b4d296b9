// The backends' own word on their connections: scrapes spillway-decap's
// agent (src/dataplane/xdp/conn_agent.hpp) the way LoadScraper scrapes GPU
// load (the same HttpExchange, bounds and Prometheus parser), and keeps per
// backend the sum of spillway_backend_connections{vip} over the VIPs that
// backend serves, and since when that sum has been zero without a break.
//
// A scrape that fails (connect, status other than 200, invalid text, a VIP of
// the backend missing from the answer, a value that is not a count) changes
// nothing; a report older than cfg.staleAfter is no report (report() gives
// std::nullopt connections): BackendStates then judges by the instance's own
// count. The zero streak restarts on a non-zero count and after a gap longer
// than staleAfter between successful scrapes (connections may have come and
// gone unseen).
//
// Thread contract: the control thread owns it, like LoadScraper: pollFd()
// in its epoll, poll(now) on events and every round; never blocks; no
// exceptions escape; time injected.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "control/config/config.hpp"
#include "control/health/http_client.hpp"
#include "spillway/flow_table.hpp"

namespace spillway {

constexpr std::string_view kBackendConnectionsMetric = "spillway_backend_connections";

struct ConnTarget {
  std::uint64_t id = 0;
  std::string name;
  IpAddress address;
  ConnSourceConfig config;      // enabled == false: never scraped
  std::vector<IpAddress> vips;  // the VIP addresses this backend serves
};

struct BackendConnReport {
  std::optional<std::uint64_t> connections;  // fresh sum over the VIPs; nullopt: none
  std::optional<Millis> zeroSince;           // with connections == 0
  std::optional<Millis> lastSuccess;
  std::string lastError;  // of the latest scrape; empty when it worked
  std::uint64_t scrapes = 0;
  std::uint64_t failures = 0;
};

class ConnScraper {
 public:
  ConnScraper();
  ~ConnScraper();
  ConnScraper(const ConnScraper&) = delete;
  ConnScraper& operator=(const ConnScraper&) = delete;

  [[nodiscard]] const std::string& initError() const noexcept { return initError_; }

  // A target whose address, source and VIPs are unchanged keeps its report.
  void setTargets(std::vector<ConnTarget> targets);
  [[nodiscard]] int pollFd() const noexcept { return epollFd_; }
  void poll(Millis now) noexcept;

  // std::nullopt for an unknown id or a target that is not scraped.
  [[nodiscard]] std::optional<BackendConnReport> report(std::uint64_t id, Millis now) const;

  // What poll() does with a 200 response's body; for tests and replays.
  bool ingest(std::uint64_t id, Millis now, std::string_view body) noexcept;

 private:
  struct Entry;
  void startScrape(Entry& e, Millis now) noexcept;
  void finishScrape(Entry& e, Millis now) noexcept;
  void endScrape(Entry& e) noexcept;
  bool ingestInto(Entry& e, Millis now, std::string_view body);
  static void fail(Entry& e, std::string error) noexcept;

  std::string initError_;
  int epollFd_ = -1;
  std::vector<std::unique_ptr<Entry>> entries_;
  std::unordered_map<std::uint64_t, Entry*> byId_;
  std::unordered_map<std::uint64_t, Entry*> byTag_;
  std::uint64_t nextTag_ = 1;
};

}  // namespace spillway
