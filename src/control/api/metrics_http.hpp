// The metrics endpoint: a minimal HTTP/1.1 server that answers
// `GET /metrics` (and HEAD) with ControlApi::metricsText() as Prometheus text
// exposition 0.0.4, and MetricsWriter, which renders that text correctly.
//
// The server listens on ControlConfig's metrics_listen ("127.0.0.1:9550" by
// default, "[::1]:9550" for IPv6, an empty string disables it); only IP
// literals, so start-up never waits on a resolver. One request per
// connection: the request head is read (at most maxRequestBytes, else 431),
// the response is written with Content-Length and `Connection: close`, the
// write side is shut and the connection closed once the peer has closed or
// the per-connection timeout passed. Other paths are 404, other methods 405,
// malformed heads 400. Request bodies are not read.
//
// At most maxClients connections are open. When all are taken, a new one
// closes the oldest that is not sending a response (idle, or waiting for its
// peer's close); when every one is sending, the new one is answered 503
// (busy) and closed. A connection whose request head is not complete within
// requestTimeout is closed, so idle connections cannot lock a scraper out.
//
// MetricsWriter collects samples in any order and renders each family once,
// contiguously: `# HELP` and `# TYPE` once per family, label values and help
// escaped (backslash, double quote, newline), invalid UTF-8 replaced, metric
// and label names made valid ([a-zA-Z_:][a-zA-Z0-9_:]*), counter names ending
// in `_total` (appended when missing), histograms with cumulative `le`
// buckets ending in +Inf, `_sum` and `_count`. A sample whose family was
// declared with another type, or whose label set repeats, is dropped and
// counted (dropped()), so the output always parses.
//
// Thread contract: the control thread only (poll() calls ControlApi). A
// MetricsWriter is a value used by one thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "control/api/control_api.hpp"
#include "control/config/config.hpp"

namespace spillway {

// "127.0.0.1:9550", "[::1]:9550", "0.0.0.0:9550"; port 0 picks a free port.
struct ListenAddress {
  std::string host;  // the IP literal, without brackets
  std::uint16_t port = 0;
  bool ipv6 = false;
};

// std::nullopt when `text` is not an IP literal and a port.
[[nodiscard]] std::optional<ListenAddress> parseListenAddress(std::string_view text);

struct MetricsHttpOptions {
  std::string listen = ControlConfig{}.metricsListen;  // empty: disabled
  std::size_t maxClients = 16;
  std::size_t maxRequestBytes = 8192;
  std::chrono::milliseconds timeout{std::chrono::seconds(10)};        // per connection
  std::chrono::milliseconds requestTimeout{std::chrono::seconds(2)};  // for the request head
  std::function<std::chrono::steady_clock::time_point()> clock;       // default: steady_clock::now

  [[nodiscard]] static MetricsHttpOptions fromConfig(const ControlConfig& config);
};

class MetricsHttpServer {
 public:
  MetricsHttpServer(ControlApi& api, MetricsHttpOptions options);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Binds and listens; with an empty listen address succeeds and stays
  // disabled (pollFd() is -1). On failure `error` names the address and why.
  [[nodiscard]] bool open(std::string& error);
  void close() noexcept;

  [[nodiscard]] bool enabled() const noexcept { return listenFd_ >= 0; }
  [[nodiscard]] int pollFd() const noexcept { return epollFd_; }
  // Accepts, reads, answers whatever is ready; never blocks.
  void poll() noexcept;
  // The bound port (the chosen one when the configured port is 0).
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }
  [[nodiscard]] std::size_t clientCount() const noexcept { return clients_.size(); }

 private:
  enum class Phase : std::uint8_t { Reading, Writing, Draining };
  struct Client {
    int fd = -1;
    Phase phase = Phase::Reading;
    std::string in;
    std::string out;
    std::size_t sent = 0;
    std::chrono::steady_clock::time_point deadline;
    std::chrono::steady_clock::time_point requestDeadline;
  };

  void acceptClients() noexcept;
  void readRequest(std::uint64_t id, Client& client) noexcept;
  void respond(Client& client) noexcept;
  void writeResponse(std::uint64_t id, Client& client) noexcept;
  void drain(std::uint64_t id, Client& client) noexcept;
  void closeClient(std::uint64_t id) noexcept;
  [[nodiscard]] std::chrono::steady_clock::time_point now() const;

  ControlApi& api_;
  MetricsHttpOptions options_;
  int listenFd_ = -1;
  int epollFd_ = -1;
  std::uint16_t port_ = 0;
  std::uint64_t nextId_ = 1;
  std::map<std::uint64_t, Client> clients_;
};

enum class MetricType : std::uint8_t { Counter, Gauge, Histogram, Untyped };

struct MetricLabel {
  std::string_view name;
  std::string_view value;
};

struct HistogramBucket {
  double upperBound;    // `le`
  std::uint64_t count;  // cumulative: observations <= upperBound
};

class MetricsWriter {
 public:
  using Labels = std::initializer_list<MetricLabel>;

  void counter(std::string_view name, std::string_view help, Labels labels, double value) {
    counter(name, help, std::span<const MetricLabel>(labels.begin(), labels.size()), value);
  }
  void counter(std::string_view name, std::string_view help, std::span<const MetricLabel> labels,
               double value);
  void gauge(std::string_view name, std::string_view help, Labels labels, double value) {
    gauge(name, help, std::span<const MetricLabel>(labels.begin(), labels.size()), value);
  }
  void gauge(std::string_view name, std::string_view help, std::span<const MetricLabel> labels,
             double value);
  // `buckets` in increasing order; a +Inf bucket equal to `count` is added
  // when the last one is not +Inf.
  void histogram(std::string_view name, std::string_view help, std::span<const MetricLabel> labels,
                 std::span<const HistogramBucket> buckets, double sum, std::uint64_t count);

  // The exposition text, families in the order they first appeared.
  [[nodiscard]] std::string text() const;
  [[nodiscard]] std::size_t dropped() const noexcept { return dropped_; }

  // Helpers, exposed for tests.
  [[nodiscard]] static std::string metricName(std::string_view name);
  [[nodiscard]] static std::string labelName(std::string_view name);
  [[nodiscard]] static std::string escapeLabelValue(std::string_view value);
  [[nodiscard]] static std::string escapeHelp(std::string_view help);
  [[nodiscard]] static std::string formatValue(double value);

 private:
  struct Family {
    std::string name;
    MetricType type;
    std::string help;
    std::string samples;
    std::set<std::string> series;  // rendered label sets seen
  };

  Family* family(std::string_view name, MetricType type, std::string_view help);
  void sample(std::string_view name, MetricType type, std::string_view help,
              std::span<const MetricLabel> labels, double value);

  std::vector<Family> families_;
  std::map<std::string, std::size_t, std::less<>> index_;
  std::size_t dropped_ = 0;
};

}  // namespace spillway
