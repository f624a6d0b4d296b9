#include "control/health/scraper.hpp"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <system_error>
#include <utility>

#include "control/sys/epoll_loop.hpp"
#include "spillway/errno_text.hpp"

namespace spillway {
namespace {

// DCGM_FI_DEV_GPU_UTIL and its kind: percent.
constexpr double kMaxUtilisation = 100.0;

Millis staggerOffset(std::uint64_t id, Millis interval) noexcept {
  if (interval <= 1) return 0;
  const std::uint64_t mixed = (id ^ (id >> 29)) * 0xbf58476d1ce4e5b9ULL;
  return (mixed >> 32) % interval;
}

bool sameSource(const LoadSourceConfig& a, const LoadSourceConfig& b) noexcept {
  return a.enabled == b.enabled && a.port == b.port && a.path == b.path &&
         a.gpuMetric == b.gpuMetric && a.queueMetric == b.queueMetric && a.interval == b.interval &&
         a.timeout == b.timeout && a.staleAfter == b.staleAfter && a.smoothing == b.smoothing;
}

double clampSmoothing(double s) noexcept {
  return s > 0.0 && s <= 1.0 ? s : 1.0;
}

}  // namespace

// ---------------------------------------------------------------------------
// LoadSignal

void LoadSignal::update(Millis now, double sample, double smoothing, Millis staleAfter) noexcept {
  const bool fresh = updatedAt_ && now >= *updatedAt_ && now - *updatedAt_ <= staleAfter;
  const double a = clampSmoothing(smoothing);
  smoothed_ = fresh && smoothed_ ? a * sample + (1.0 - a) * *smoothed_ : sample;
  raw_ = sample;
  updatedAt_ = now;
}

std::optional<double> LoadSignal::value(Millis now, Millis staleAfter) const noexcept {
  if (!updatedAt_ || !smoothed_) return std::nullopt;
  if (now > *updatedAt_ && now - *updatedAt_ > staleAfter) return std::nullopt;
  return smoothed_;
}

// ---------------------------------------------------------------------------
// LoadScraper

struct LoadScraper::Entry {
  explicit Entry(ScrapeTarget t) : target(std::move(t)) {}

  ScrapeTarget target;
  LoadSignal gpu;
  LoadSignal queue;
  LoadStatus status;
  std::optional<Millis> due;
  bool scraping = false;
  Millis scrapeStart = 0;
  std::uint64_t tag = 0;
  HttpExchange exchange;
  // Whether an out-of-range value of the metric raises a notice: true until
  // one did, and again once the metric reports an in-range value.
  bool gpuNoticeArmed = true;
  bool queueNoticeArmed = true;
};

LoadScraper::LoadScraper(LoadScraperOptions options) : options_(options) {
  epollFd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epollFd_ < 0) initError_ = "epoll_create1: " + errnoText(errno);
}

LoadScraper::~LoadScraper() {
  entries_.clear();
  if (epollFd_ >= 0) ::close(epollFd_);
}

void LoadScraper::endScrape(Entry& e) noexcept {
  if (e.tag != 0) byTag_.erase(e.tag);
  e.tag = 0;
  e.exchange.abort("aborted");
  e.scraping = false;
}

void LoadScraper::setTargets(std::vector<ScrapeTarget> targets) {
  std::unordered_map<std::uint64_t, std::unique_ptr<Entry>> old;
  for (auto& e : entries_) old.emplace(e->target.id, std::move(e));
  entries_.clear();
  byId_.clear();
  for (ScrapeTarget& t : targets) {
    if (byId_.contains(t.id)) continue;
    std::unique_ptr<Entry> entry;
    if (const auto it = old.find(t.id); it != old.end()) {
      if (it->second->target.address == t.address &&
          sameSource(it->second->target.config, t.config)) {
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

std::optional<Millis> LoadScraper::nextDeadline() const noexcept {
  std::optional<Millis> next;
  const auto consider = [&next](Millis t) {
    if (!next || t < *next) next = t;
  };
  for (const auto& e : entries_) {
    if (!e->target.config.enabled) continue;
    if (e->scraping) {
      consider(e->scrapeStart + std::max<Millis>(e->target.config.timeout, 1));
    } else {
      consider(e->due.value_or(0));
    }
  }
  return next;
}

std::size_t LoadScraper::scrapesInFlight() const noexcept {
  std::size_t n = 0;
  for (const auto& e : entries_) n += e->scraping ? 1 : 0;
  return n;
}

ScrapedLoad LoadScraper::load(std::uint64_t id, Millis now) const noexcept {
  const auto it = byId_.find(id);
  if (it == byId_.end() || !it->second->target.config.enabled) return {};
  const Entry& e = *it->second;
  const Millis stale = e.target.config.staleAfter;
  ScrapedLoad l;
  l.gpuUtilization = e.gpu.value(now, stale);
  if (!e.target.config.queueMetric.empty()) l.queueDepth = e.queue.value(now, stale);
  return l;
}

std::optional<LoadStatus> LoadScraper::status(std::uint64_t id) const {
  const auto it = byId_.find(id);
  if (it == byId_.end()) return std::nullopt;
  const Entry& e = *it->second;
  LoadStatus s = e.status;
  s.rawGpu = e.gpu.raw();
  s.smoothedGpu = e.gpu.smoothed();
  s.gpuUpdated = e.gpu.updatedAt();
  s.rawQueue = e.queue.raw();
  s.smoothedQueue = e.queue.smoothed();
  s.queueUpdated = e.queue.updatedAt();
  return s;
}

void LoadScraper::poll(Millis now) noexcept {
  try {
    if (epollFd_ >= 0) {
      drainReady(epollFd_, [&](const epoll_event& ev) {
        const auto it = byTag_.find(ev.data.u64);
        if (it == byTag_.end()) return;
        Entry& e = *it->second;
        e.exchange.onEvent(ev.events);
        if (e.exchange.finished()) onExchangeFinished(e, now);
      });
    }
    for (auto& ep : entries_) {
      Entry& e = *ep;
      const LoadSourceConfig& c = e.target.config;
      if (!c.enabled) continue;
      const Millis timeout = std::max<Millis>(c.timeout, 1);
      if (e.scraping && now >= e.scrapeStart + timeout) {
        const std::string what =
            e.exchange.connected() ? "no complete response" : "connect timeout";
        endScrape(e);
        recordFailure(e, now, what + " within " + std::to_string(timeout) + " ms");
      }
      if (!e.due)
        e.due = now + (options_.staggerStart ? staggerOffset(e.target.id, c.interval) : 0);
      if (!e.scraping && *e.due <= now) startScrape(e, now);
    }
  } catch (...) {
    // Allocation failure: scrapes in flight time out later.
  }
}

HttpRequest LoadScraper::scrapeRequest(const Entry& e) const {
  const LoadSourceConfig& c = e.target.config;
  HttpRequest request;
  request.mode = HttpExchangeMode::FullResponse;
  request.address = e.target.address;
  request.port = c.port;
  request.path = c.path.empty() ? "/" : c.path;
  request.accept = "text/plain;version=0.0.4";
  request.maxResponseBytes = options_.maxResponseBytes;
  return request;
}

void LoadScraper::replayResponse(std::uint64_t id, Millis now, std::string_view response,
                                 std::size_t piece) noexcept {
  const auto it = byId_.find(id);
  if (it == byId_.end()) return;
  Entry& e = *it->second;
  endScrape(e);
  try {
    e.exchange.startDetached(scrapeRequest(e));
  } catch (...) {
    recordFailure(e, now, "out of memory");
    return;
  }
  e.scraping = true;
  e.scrapeStart = now;
  e.exchange.feed(response, piece);
  e.exchange.feedEnd();
  onExchangeFinished(e, now);
}

void LoadScraper::startScrape(Entry& e, Millis now) noexcept {
  const LoadSourceConfig& c = e.target.config;
  e.scraping = true;
  e.scrapeStart = now;
  e.due = now + std::max<Millis>(c.interval, 1);
  if (epollFd_ < 0) {
    e.scraping = false;
    recordFailure(e, now, initError_);
    return;
  }
  try {
    const HttpRequest request = scrapeRequest(e);
    e.tag = nextTag_++;
    byTag_[e.tag] = &e;
    e.exchange.start(request, epollFd_, e.tag);
  } catch (...) {
    endScrape(e);
    recordFailure(e, now, "out of memory");
    return;
  }
  if (e.exchange.finished()) onExchangeFinished(e, now);
}

void LoadScraper::onExchangeFinished(Entry& e, Millis now) noexcept {
  if (e.exchange.state() == HttpExchange::State::Failed) {
    std::string error = e.exchange.error();
    endScrape(e);
    recordFailure(e, now, std::move(error));
    return;
  }
  if (e.exchange.status() != 200) {
    const int code = e.exchange.status();
    endScrape(e);
    recordFailure(e, now, "HTTP status " + std::to_string(code) + ", expected 200");
    return;
  }
  try {
    (void)ingestInto(e, now, e.exchange.body());
  } catch (...) {
    recordFailure(e, now, "out of memory");
  }
  endScrape(e);
}

void LoadScraper::recordFailure(Entry& e, Millis now, std::string error) noexcept {
  ++e.status.scrapes;
  ++e.status.failures;
  e.status.lastAttempt = now;
  e.status.lastError = std::move(error);
}

void LoadScraper::noteOutOfRange(Entry& e, Millis now, bool& armed, const std::string& text) {
  if (!armed) return;
  armed = false;
  notices_.push_back(ScrapeNotice{e.target.id, e.target.name, now,
                                  text +
                                      "; the signal is unknown (neutral) until an in-range value; "
                                      "counted, logged once"});
}

std::vector<ScrapeNotice> LoadScraper::takeNotices() {
  return std::exchange(notices_, {});
}

bool LoadScraper::ingest(std::uint64_t id, Millis now, std::string_view body) noexcept {
  const auto it = byId_.find(id);
  if (it == byId_.end()) return false;
  try {
    return ingestInto(*it->second, now, body);
  } catch (...) {
    recordFailure(*it->second, now, "out of memory");
    return false;
  }
}

bool LoadScraper::ingestInto(Entry& e, Millis now, std::string_view body) {
  const LoadSourceConfig& c = e.target.config;
  std::array<std::string_view, 2> keep{c.gpuMetric, c.queueMetric};
  PrometheusParseOptions options;
  options.limits = options_.parseLimits;
  options.keepNames = std::span<const std::string_view>(keep.data(), c.queueMetric.empty() ? 1 : 2);
  const PrometheusParseResult parsed = parsePrometheusText(body, options);
  if (!parsed.ok()) {
    recordFailure(e, now, "invalid exposition text: " + formatError(*parsed.error));
    return false;
  }
  ++e.status.scrapes;
  e.status.lastAttempt = now;
  e.status.lastSuccess = now;
  e.status.responseBytes = body.size();
  std::string problems;
  const auto note = [&problems](const std::string& text) {
    if (!problems.empty()) problems += "; ";
    problems += text;
  };

  e.status.gpuSamples = 0;
  for (const PrometheusSample& s : parsed.samples)
    e.status.gpuSamples += s.name == c.gpuMetric ? 1 : 0;
  const std::optional<double> gpu = averageOf(parsed.samples, c.gpuMetric);
  // A utilisation is a percentage: one GPU reporting 250 or 1e308 makes the
  // whole reading unknown (neutral), never a saturated backend.
  const auto outOfRange =
      std::find_if(parsed.samples.begin(), parsed.samples.end(), [&](const PrometheusSample& s) {
        return s.name == c.gpuMetric && !(s.value >= 0.0 && s.value <= kMaxUtilisation);
      });
  if (!gpu) {
    note("no samples of " + c.gpuMetric);
  } else if (outOfRange != parsed.samples.end()) {
    const std::string text = c.gpuMetric + " is not a utilisation (" +
                             std::to_string(outOfRange->value) + "; a percentage is 0 to 100)";
    note(text);
    ++e.status.gpuOutOfRange;
    noteOutOfRange(e, now, e.gpuNoticeArmed, text);
  } else {
    e.gpu.update(now, *gpu, c.smoothing, c.staleAfter);
    e.gpuNoticeArmed = true;
  }
  if (!c.queueMetric.empty()) {
    const std::optional<double> queue = sumOf(parsed.samples, c.queueMetric);
    if (!queue) {
      note("no samples of " + c.queueMetric);
    } else if (!std::isfinite(*queue) || *queue < 0.0) {
      const std::string text = c.queueMetric + " is not a queue depth (" + std::to_string(*queue) +
                               "; a depth is finite and not negative)";
      note(text);
      ++e.status.queueOutOfRange;
      noteOutOfRange(e, now, e.queueNoticeArmed, text);
    } else {
      e.queue.update(now, *queue, c.smoothing, c.staleAfter);
      e.queueNoticeArmed = true;
    }
  }
  e.status.lastError = std::move(problems);
  return true;
}

}  // namespace spillway
