// Load feedback, the I/O half: scrapes each backend's Prometheus text
// endpoint (the DCGM exporter, vLLM, Triton) from the control thread and
// keeps two smoothed signals per backend: GPU utilisation, the average of
// cfg.gpuMetric over its samples (DCGM reports one per GPU), and queue depth,
// the sum of cfg.queueMetric over its samples (one per model). What the
// weight policy makes of them is not decided here.
//
// Every cfg.interval (from the start of the previous scrape; scrapes of one
// backend never overlap) an HTTP/1.1 GET http://address:port/path with a
// bounded response (LoadScraperOptions::maxResponseBytes) and a deadline of
// cfg.timeout. A response that is not 200, not valid exposition text, or
// larger than the bound is an error and changes no signal. Each signal is an
// EWMA with weight cfg.smoothing for the newest sample; a signal not updated
// for more than cfg.staleAfter is stale, and load() reports it as unknown
// (std::nullopt: neutral for the policy). A sample that arrives after the
// signal went stale restarts the average rather than blending with old data.
//
// A value outside its meaning (a GPU utilisation outside 0..100, a queue
// depth that is negative or not finite) leaves its signal unchanged (unknown
// once stale), is counted per backend and metric (LoadStatus::*OutOfRange),
// and raises one notice (takeNotices()) the first time; the next notice for
// that metric waits until the backend has reported an in-range value, or
// until the target is replaced (re-added, address or load source changed).
//
// Thread contract: one thread (the control thread) owns a LoadScraper: it
// waits on pollFd() (epoll) and calls poll(now) when it is readable or
// nextDeadline() has come. poll() never blocks; no threads; no exceptions
// escape; time is injected as `now`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "control/config/config.hpp"
#include "control/health/http_client.hpp"
#include "control/health/prometheus_text.hpp"
#include "control/health/scrape_rounds.hpp"
#include "spillway/flow_table.hpp"

namespace spillway {

struct ScrapeTarget {
  std::uint64_t id = 0;
  std::string name;
  IpAddress address;
  LoadSourceConfig config;  // a target with enabled == false is never scraped
};

// What the load scrape of backend `b` in a pool with [pool.load] `pool`
// reads: the pool's source, at the backend's own metrics port and path
// where it has them (a discovered backend's "metrics" label).
[[nodiscard]] LoadSourceConfig loadSourceFor(const LoadSourceConfig& pool, const BackendConfig& b);

// The smoothed signals of a backend at a given time; std::nullopt for a
// signal that is unknown (never scraped, not configured) or stale.
struct ScrapedLoad {
  std::optional<double> gpuUtilization;  // percent, averaged over the host's GPUs
  std::optional<double> queueDepth;      // requests waiting, summed over label sets
};

// One smoothed signal: EWMA with staleness; no I/O.
class LoadSignal {
 public:
  void update(Millis now, double sample, double smoothing, Millis staleAfter) noexcept;
  [[nodiscard]] std::optional<double> value(Millis now, Millis staleAfter) const noexcept;
  [[nodiscard]] std::optional<double> raw() const noexcept { return raw_; }
  [[nodiscard]] std::optional<double> smoothed() const noexcept { return smoothed_; }
  [[nodiscard]] std::optional<Millis> updatedAt() const noexcept { return updatedAt_; }

 private:
  std::optional<double> raw_;
  std::optional<double> smoothed_;
  std::optional<Millis> updatedAt_;
};

struct LoadStatus {
  std::string lastError;              // of the latest scrape; empty when it fully worked
  std::optional<Millis> lastAttempt;  // when the latest scrape ended
  std::optional<Millis> lastSuccess;  // ... that returned valid exposition text
  std::optional<double> rawGpu;       // latest sample, smoothed value, when updated
  std::optional<double> smoothedGpu;
  std::optional<Millis> gpuUpdated;
  std::optional<double> rawQueue;
  std::optional<double> smoothedQueue;
  std::optional<Millis> queueUpdated;
  std::size_t gpuSamples = 0;  // label sets (GPUs) of gpuMetric in the latest success
  std::size_t responseBytes = 0;
  std::uint64_t scrapes = 0;  // ended scrapes
  std::uint64_t failures = 0;
  // Successful scrapes whose gpuMetric had a sample outside 0..100, and whose
  // queueMetric summed to a negative or non-finite depth.
  std::uint64_t gpuOutOfRange = 0;
  std::uint64_t queueOutOfRange = 0;
};

// Something an operator should hear about once (the control plane logs it as
// an event): a backend's metric went out of range.
struct ScrapeNotice {
  std::uint64_t id = 0;
  std::string backend;  // the target's name
  Millis time = 0;
  std::string text;
};

struct LoadScraperOptions {
  std::size_t maxResponseBytes = 4 << 20;  // headers and body
  PrometheusParseLimits parseLimits{};
  bool staggerStart = true;  // spread first scrapes over one interval, by id
};

class LoadScraper final : public ScrapeRounds {
 public:
  explicit LoadScraper(LoadScraperOptions options = {}) : options_(options) {}

  // Replaces the set of targets. A target whose id, address and load source
  // are unchanged keeps its signals and schedule; otherwise it starts
  // unknown. Scrapes of removed or changed targets are aborted.
  void setTargets(std::vector<ScrapeTarget> targets);

  void poll(Millis now) noexcept { pollRounds(now); }
  // When poll() next has something to do without a socket event; may be in
  // the past (poll at once); std::nullopt when nothing is scheduled.
  [[nodiscard]] std::optional<Millis> nextDeadline() const noexcept;

  [[nodiscard]] ScrapedLoad load(std::uint64_t id, Millis now) const noexcept;
  [[nodiscard]] std::optional<LoadStatus> status(std::uint64_t id) const;
  [[nodiscard]] std::size_t targetCount() const noexcept { return entries_.size(); }
  [[nodiscard]] std::size_t scrapesInFlight() const noexcept;

  // What poll() does when target `id`'s scrape, started at `now`, receives
  // `response` from the server (in recv()-sized pieces of `piece` bytes)
  // and the server closes: the same client, limits and ingest, without a
  // socket; for replays and fuzzing. Aborts a scrape of `id` in flight.
  void replayResponse(std::uint64_t id, Millis now, std::string_view response,
                      std::size_t piece = 16 * 1024) noexcept;

  // The notices raised since the last call, oldest first.
  [[nodiscard]] std::vector<ScrapeNotice> takeNotices();

 private:
  struct Entry;

  [[nodiscard]] Timing timing(const Slot& slot) const noexcept override;
  [[nodiscard]] HttpRequest request(const Slot& slot) const override;
  bool received(Slot& slot, Millis now, std::string_view body) override;
  void failed(Slot& slot, Millis now, std::string error) noexcept override;
  void noteOutOfRange(Entry& e, Millis now, bool& armed, const std::string& text);

  LoadScraperOptions options_;
  std::vector<ScrapeNotice> notices_;
};

}  // namespace spillway
