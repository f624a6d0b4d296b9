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

struct LoadScraper::Entry : Slot {
  explicit Entry(ScrapeTarget t) : target(std::move(t)) {}

  ScrapeTarget target;
  LoadSignal gpu;
  LoadSignal queue;
  LoadStatus status;
  // Whether an out-of-range value of the metric raises a notice: true until
  // one did, and again once the metric reports an in-range value.
  bool gpuNoticeArmed = true;
  bool queueNoticeArmed = true;
};

void LoadScraper::setTargets(std::vector<ScrapeTarget> targets) {
  replaceTargets<Entry>(
      std::move(targets),
      [](const Entry& e, const ScrapeTarget& t) {
        return e.target.address == t.address && sameSource(e.target.config, t.config);
      },
      [](Entry& e, const ScrapeTarget& t) { e.target.name = t.name; });
}

std::optional<Millis> LoadScraper::nextDeadline() const noexcept {
  std::optional<Millis> next;
  const auto consider = [&next](Millis t) {
    if (!next || t < *next) next = t;
  };
  for (const auto& sp : entries_) {
    const Entry& e = static_cast<const Entry&>(*sp);
    if (!e.target.config.enabled) continue;
    if (e.scraping) {
      consider(e.scrapeStart + std::max<Millis>(e.target.config.timeout, 1));
    } else {
      consider(e.due.value_or(0));
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
  const auto* found = static_cast<const Entry*>(slot(id));
  if (found == nullptr || !found->target.config.enabled) return {};
  const Entry& e = *found;
  const Millis stale = e.target.config.staleAfter;
  ScrapedLoad l;
  l.gpuUtilization = e.gpu.value(now, stale);
  if (!e.target.config.queueMetric.empty()) l.queueDepth = e.queue.value(now, stale);
  return l;
}

std::optional<LoadStatus> LoadScraper::status(std::uint64_t id) const {
  const auto* found = static_cast<const Entry*>(slot(id));
  if (found == nullptr) return std::nullopt;
  const Entry& e = *found;
  LoadStatus s = e.status;
  s.rawGpu = e.gpu.raw();
  s.smoothedGpu = e.gpu.smoothed();
  s.gpuUpdated = e.gpu.updatedAt();
  s.rawQueue = e.queue.raw();
  s.smoothedQueue = e.queue.smoothed();
  s.queueUpdated = e.queue.updatedAt();
  return s;
}

LoadSourceConfig loadSourceFor(const LoadSourceConfig& pool, const BackendConfig& b) {
  LoadSourceConfig out = pool;
  if (b.metricsPort) {
    out.port = *b.metricsPort;
    out.path = b.metricsPath;
  }
  return out;
}

ScrapeRounds::Timing LoadScraper::timing(const Slot& slot) const noexcept {
  const Entry& e = static_cast<const Entry&>(slot);
  const LoadSourceConfig& c = e.target.config;
  return Timing{c.enabled, c.interval, c.timeout,
                options_.staggerStart ? staggerOffset(e.target.id, c.interval) : 0};
}

HttpRequest LoadScraper::request(const Slot& slot) const {
  const Entry& e = static_cast<const Entry&>(slot);
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
  auto* found = static_cast<Entry*>(slot(id));
  if (found == nullptr) return;
  Entry& e = *found;
  endScrape(e);
  try {
    e.exchange.startDetached(request(e));
  } catch (...) {
    failed(e, now, "out of memory");
    return;
  }
  e.scraping = true;
  e.scrapeStart = now;
  e.exchange.feed(response, piece);
  e.exchange.feedEnd();
  finishScrape(e, now);
}

void LoadScraper::failed(Slot& slot, Millis now, std::string error) noexcept {
  Entry& e = static_cast<Entry&>(slot);
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

bool LoadScraper::received(Slot& slot, Millis now, std::string_view body) {
  Entry& e = static_cast<Entry&>(slot);
  const LoadSourceConfig& c = e.target.config;
  std::array<std::string_view, 2> keep{c.gpuMetric, c.queueMetric};
  PrometheusParseOptions options;
  options.limits = options_.parseLimits;
  options.keepNames = std::span<const std::string_view>(keep.data(), c.queueMetric.empty() ? 1 : 2);
  const PrometheusParseResult parsed = parsePrometheusText(body, options);
  if (!parsed.ok()) {
    failed(e, now, "invalid exposition text: " + formatError(*parsed.error));
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
