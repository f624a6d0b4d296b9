#include "control/health/conn_scraper.hpp"

#include <sys/epoll.h>
#include <unistd.h>

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

struct ConnScraper::Entry {
  explicit Entry(ConnTarget t) : target(std::move(t)) {}
  ConnTarget target;
  BackendConnReport report;
  std::optional<Millis> due;
  bool scraping = false;
  Millis scrapeStart = 0;
  std::uint64_t tag = 0;
  HttpExchange exchange;
};

ConnScraper::ConnScraper() {
  epollFd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epollFd_ < 0) initError_ = "epoll_create1: " + errnoText(errno);
}

ConnScraper::~ConnScraper() {
  entries_.clear();
  if (epollFd_ >= 0) ::close(epollFd_);
}

void ConnScraper::endScrape(Entry& e) noexcept {
  if (e.tag != 0) byTag_.erase(e.tag);
  e.tag = 0;
  e.exchange.abort("aborted");
  e.scraping = false;
}

void ConnScraper::setTargets(std::vector<ConnTarget> targets) {
  std::unordered_map<std::uint64_t, std::unique_ptr<Entry>> old;
  for (auto& e : entries_) old.emplace(e->target.id, std::move(e));
  entries_.clear();
  byId_.clear();
  for (ConnTarget& t : targets) {
    if (byId_.contains(t.id)) continue;
    std::unique_ptr<Entry> entry;
    if (const auto it = old.find(t.id); it != old.end()) {
      if (it->second->target.address == t.address &&
          sameSource(it->second->target.config, t.config) && it->second->target.vips == t.vips) {
        entry = std::move(it->second);
        entry->target.name = t.name;
      }
      if (it->second) endScrape(*it->second);
      old.erase(it);
    }
    if (!entry) entry = std::make_unique<Entry>(std::move(t));
    byId_.emplace(entry->target.id, entry.get());
    entries_.push_back(std::move(entry));
  }
  for (auto& [id, e] : old) endScrape(*e);
}

std::optional<BackendConnReport> ConnScraper::report(std::uint64_t id, Millis now) const {
  const auto it = byId_.find(id);
  if (it == byId_.end() || !it->second->target.config.enabled) return std::nullopt;
  BackendConnReport r = it->second->report;
  const Millis stale = it->second->target.config.staleAfter;
  if (!r.lastSuccess || (now > *r.lastSuccess && now - *r.lastSuccess > stale)) {
    r.connections.reset();
    r.zeroSince.reset();
  }
  return r;
}

void ConnScraper::poll(Millis now) noexcept {
  try {
    if (epollFd_ >= 0) {
      drainReady(epollFd_, [&](const epoll_event& ev) {
        const auto it = byTag_.find(ev.data.u64);
        if (it == byTag_.end()) return;
        Entry& e = *it->second;
        e.exchange.onEvent(ev.events);
        if (e.exchange.finished()) finishScrape(e, now);
      });
    }
    for (auto& ep : entries_) {
      Entry& e = *ep;
      const ConnSourceConfig& c = e.target.config;
      if (!c.enabled) continue;
      const Millis timeout = std::max<Millis>(c.timeout, 1);
      if (e.scraping && now >= e.scrapeStart + timeout) {
        const std::string what =
            e.exchange.connected() ? "no complete response" : "connect timeout";
        endScrape(e);
        fail(e, what + " within " + std::to_string(timeout) + " ms");
      }
      if (!e.due) e.due = now;
      if (!e.scraping && *e.due <= now) startScrape(e, now);
    }
  } catch (...) {
    // Allocation failure: scrapes in flight time out later.
  }
}

void ConnScraper::startScrape(Entry& e, Millis now) noexcept {
  const ConnSourceConfig& c = e.target.config;
  e.scraping = true;
  e.scrapeStart = now;
  e.due = now + std::max<Millis>(c.interval, 1);
  if (epollFd_ < 0) {
    e.scraping = false;
    fail(e, initError_);
    return;
  }
  try {
    HttpRequest request;
    request.mode = HttpExchangeMode::FullResponse;
    request.address = e.target.address;
    request.port = c.port;
    request.path = c.path.empty() ? "/" : c.path;
    request.accept = "text/plain;version=0.0.4";
    request.maxResponseBytes = kMaxResponseBytes;
    e.tag = nextTag_++;
    byTag_[e.tag] = &e;
    e.exchange.start(request, epollFd_, e.tag);
  } catch (...) {
    endScrape(e);
    fail(e, "out of memory");
    return;
  }
  if (e.exchange.finished()) finishScrape(e, now);
}

void ConnScraper::finishScrape(Entry& e, Millis now) noexcept {
  if (e.exchange.state() == HttpExchange::State::Failed) {
    std::string error = e.exchange.error();
    endScrape(e);
    fail(e, std::move(error));
    return;
  }
  if (e.exchange.status() != 200) {
    const int code = e.exchange.status();
    endScrape(e);
    fail(e, "HTTP status " + std::to_string(code) + ", expected 200");
    return;
  }
  try {
    (void)ingestInto(e, now, e.exchange.body());
  } catch (...) {
    fail(e, "out of memory");
  }
  endScrape(e);
}

void ConnScraper::fail(Entry& e, std::string error) noexcept {
  ++e.report.scrapes;
  ++e.report.failures;
  e.report.lastError = std::move(error);
}

bool ConnScraper::ingest(std::uint64_t id, Millis now, std::string_view body) noexcept {
  const auto it = byId_.find(id);
  if (it == byId_.end()) return false;
  try {
    return ingestInto(*it->second, now, body);
  } catch (...) {
    fail(*it->second, "out of memory");
    return false;
  }
}

bool ConnScraper::ingestInto(Entry& e, Millis now, std::string_view body) {
  const std::array<std::string_view, 1> keep{kBackendConnectionsMetric};
  PrometheusParseOptions options;
  options.keepNames = keep;
  const PrometheusParseResult parsed = parsePrometheusText(body, options);
  if (!parsed.ok()) {
    fail(e, "invalid exposition text: " + formatError(*parsed.error));
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
      fail(e, "no " + std::string(kBackendConnectionsMetric) + " for VIP " + formatIpAddress(vip) +
                  " (is the agent given --vip " + formatIpAddress(vip) + "?)");
      return false;
    }
    if (!std::isfinite(*value) || *value < 0.0 || *value != std::floor(*value) || *value > 1e15) {
      fail(e, std::string(kBackendConnectionsMetric) + " for VIP " + formatIpAddress(vip) +
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
