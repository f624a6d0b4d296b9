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
#include "control/health/scrape_rounds.hpp"
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

class ConnScraper final : public ScrapeRounds {
 public:
  ConnScraper() = default;

  // A target whose address, source and VIPs are unchanged keeps its report.
  void setTargets(std::vector<ConnTarget> targets);
  void poll(Millis now) noexcept { pollRounds(now); }

  // std::nullopt for an unknown id or a target that is not scraped.
  [[nodiscard]] std::optional<BackendConnReport> report(std::uint64_t id, Millis now) const;

 private:
  struct Entry;
  [[nodiscard]] Timing timing(const Slot& slot) const noexcept override;
  [[nodiscard]] HttpRequest request(const Slot& slot) const override;
  bool received(Slot& slot, Millis now, std::string_view body) override;
  void failed(Slot& slot, Millis now, std::string error) noexcept override;
};

}  // namespace spillway
