#include "control/health/conn_scraper.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <utility>

#include "control/health/prometheus_text.hpp"
#include "control/sys/epoll_loop.hpp"
#include "spillway/errno_text.hpp"

namespace spillway {
namespace {

constexpr std::size_t kMaxResponseBytes = 1 << 20;

bool sameSource(const ConnSourceConfig& a, const ConnSourceConfig& b) noexcept {
  return a.enabled == b.enabled && a.port == b.port && a.path == b.path &&
         a.interval == b.interval && a.timeout == b.timeout && a.staleAfter == b.staleAfter &&
         a.grace == b.grace;
}

}  // namespace

struct ConnScraper::Entry : Slot {
  explicit Entry(ConnTarget t) : target(std::move(t)) {}
  ConnTarget target;
  BackendConnReport report;
};

void ConnScraper::setTargets(std::vector<ConnTarget> targets) {
  replaceTargets<Entry>(
      std::move(targets),
      [](const Entry& e, const ConnTarget& t) {
        return e.target.address == t.address && sameSource(e.target.config, t.config) &&
               e.target.vips == t.vips;
      },
      [](Entry& e, const ConnTarget& t) { e.target.name = t.name; });
}

std::optional<BackendConnReport> ConnScraper::report(std::uint64_t id, Millis now) const {
  const auto* e = static_cast<const Entry*>(slot(id));
  if (e == nullptr || !e->target.config.enabled) return std::nullopt;
  BackendConnReport r = e->report;
  const Millis stale = e->target.config.staleAfter;
  if (!r.lastSuccess || (now > *r.lastSuccess && now - *r.lastSuccess > stale)) {
    r.connections.reset();
    r.zeroSince.reset();
  }
  return r;
}

ScrapeRounds::Timing ConnScraper::timing(const Slot& slot) const noexcept {
  const ConnSourceConfig& c = static_cast<const Entry&>(slot).target.config;
  return Timing{c.enabled, c.interval, c.timeout, 0};
}

HttpRequest ConnScraper::request(const Slot& slot) const {
  const Entry& e = static_cast<const Entry&>(slot);
  HttpRequest request;
  request.mode = HttpExchangeMode::FullResponse;
  request.address = e.target.address;
  request.port = e.target.config.port;
  request.path = e.target.config.path.empty() ? "/" : e.target.config.path;
  request.accept = "text/plain;version=0.0.4";
  request.maxResponseBytes = kMaxResponseBytes;
  return request;
}

void ConnScraper::failed(Slot& slot, Millis now, std::string error) noexcept {
  (void)now;
  BackendConnReport& r = static_cast<Entry&>(slot).report;
  ++r.scrapes;
  ++r.failures;
  r.lastError = std::move(error);
}

bool ConnScraper::received(Slot& slot, Millis now, std::string_view body) {
  Entry& e = static_cast<Entry&>(slot);
  const std::array<std::string_view, 1> keep{kBackendConnectionsMetric};
  PrometheusParseOptions options;
  options.keepNames = keep;
  const PrometheusParseResult parsed = parsePrometheusText(body, options);
  if (!parsed.ok()) {
    failed(e, now, "invalid exposition text: " + formatError(*parsed.error));
    return false;
  }
  std::uint64_t sum = 0;
  for (const IpAddress& vip : e.target.vips) {
    std::optional<double> value;
    for (const PrometheusSample& s : parsed.samples) {
      const auto label = s.label("vip");
      if (!label) continue;
      const auto address = parseIpAddress(*label);
      if (address && *address == vip) value = value.value_or(0.0) + s.value;
    }
    if (!value) {
      failed(e, now,
             "no " + std::string(kBackendConnectionsMetric) + " for VIP " + formatIpAddress(vip) +
                 " (is the agent given --vip " + formatIpAddress(vip) + "?)");
      return false;
    }
    if (!std::isfinite(*value) || *value < 0.0 || *value != std::floor(*value) || *value > 1e15) {
      failed(e, now,
             std::string(kBackendConnectionsMetric) + " for VIP " + formatIpAddress(vip) +
                 " is not a count: " + std::to_string(*value));
      return false;
    }
    sum += static_cast<std::uint64_t>(*value);
  }
  BackendConnReport& r = e.report;
  const bool gap =
      !r.lastSuccess || now < *r.lastSuccess || now - *r.lastSuccess > e.target.config.staleAfter;
  ++r.scrapes;
  r.lastError.clear();
  r.connections = sum;
  if (sum != 0) {
    r.zeroSince.reset();
  } else if (gap || !r.zeroSince) {
    r.zeroSince = now;
  }
  r.lastSuccess = now;
  return true;
}

}  // namespace spillway
