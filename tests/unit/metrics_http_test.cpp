// The metrics endpoint over real loopback TCP (GET /metrics, other paths and
// methods, malformed and oversized requests, clients that hang up, the
// connection limit, timeouts, IPv6) and MetricsWriter's exposition text,
// checked by `promtool check metrics` where promtool is installed.
#include "control/api/metrics_http.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fake_control_api.hpp"

namespace spillway {
namespace {

using testing::FakeControlApi;
using Clock = std::chrono::steady_clock;

constexpr auto kDeadline = std::chrono::seconds(20);

bool pumpUntil(MetricsHttpServer& server, const std::function<bool()>& done,
               std::vector<int> extraFds = {}) {
  const auto deadline = Clock::now() + kDeadline;
  for (;;) {
    server.poll();
    if (done()) return true;
    if (Clock::now() >= deadline) return false;
    std::vector<pollfd> fds{{server.pollFd(), POLLIN, 0}};
    for (int fd : extraFds) fds.push_back({fd, POLLIN, 0});
    (void)::poll(fds.data(), fds.size(), 10);
  }
}

class TcpClient {
 public:
  TcpClient(bool ipv6, std::uint16_t port) {
    fd_ = socket(ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (ipv6) {
      sockaddr_in6 sa{};
      sa.sin6_family = AF_INET6;
      sa.sin6_port = htons(port);
      sa.sin6_addr = in6addr_loopback;
      connected_ = ::connect(fd_, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0;
    } else {
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_port = htons(port);
      sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      connected_ = ::connect(fd_, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0;
    }
  }
  ~TcpClient() { close(); }
  TcpClient(const TcpClient&) = delete;
  TcpClient& operator=(const TcpClient&) = delete;

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  [[nodiscard]] bool connected() const { return connected_; }
  [[nodiscard]] int fd() const { return fd_; }
  bool send(std::string_view data) {
    return ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }
  // Reads what is there; true once the server closed.
  bool readSome() {
    char buffer[65536];
    for (;;) {
      const ssize_t n = recv(fd_, buffer, sizeof buffer, MSG_DONTWAIT);
      if (n > 0) {
        received.append(buffer, static_cast<std::size_t>(n));
        continue;
      }
      return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    }
  }

  std::string received;

 private:
  int fd_ = -1;
  bool connected_ = false;
};

struct HttpResponse {
  int status = 0;
  std::string head;
  std::string body;
};

HttpResponse parseResponse(const std::string& raw) {
  HttpResponse r;
  const auto end = raw.find("\r\n\r\n");
  if (end == std::string::npos || raw.size() < 12) return r;
  r.head = raw.substr(0, end + 2);
  r.body = raw.substr(end + 4);
  r.status = std::atoi(raw.substr(9, 3).c_str());
  return r;
}

std::optional<std::string> header(const HttpResponse& r, const std::string& name) {
  const auto at = r.head.find("\r\n" + name + ": ");
  if (at == std::string::npos) return std::nullopt;
  const auto start = at + 4 + name.size();
  return r.head.substr(start, r.head.find("\r\n", start) - start);
}

class MetricsHttpTest : public ::testing::Test {
 protected:
  void open(MetricsHttpOptions options = {}) {
    if (options.listen == MetricsHttpOptions{}.listen) options.listen = "127.0.0.1:0";
    server_ = std::make_unique<MetricsHttpServer>(api_, options);
    std::string error;
    ASSERT_TRUE(server_->open(error)) << error;
    ASSERT_TRUE(server_->enabled());
    ASSERT_NE(server_->port(), 0);
  }

  // Sends `request` and reads until the server closes.
  HttpResponse exchange(std::string_view request, bool ipv6 = false) {
    TcpClient client(ipv6, server_->port());
    EXPECT_TRUE(client.connected());
    EXPECT_TRUE(client.send(request));
    EXPECT_TRUE(pumpUntil(*server_, [&] { return client.readSome(); }, {client.fd()}));
    return parseResponse(client.received);
  }

  FakeControlApi api_;
  std::unique_ptr<MetricsHttpServer> server_;
};

TEST(ListenAddress, Parses) {
  const auto v4 = parseListenAddress("127.0.0.1:9550");
  ASSERT_TRUE(v4.has_value());
  EXPECT_EQ(v4->host, "127.0.0.1");
  EXPECT_EQ(v4->port, 9550);
  EXPECT_FALSE(v4->ipv6);
  const auto v6 = parseListenAddress("[::1]:9550");
  ASSERT_TRUE(v6.has_value());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_TRUE(v6->ipv6);
  EXPECT_TRUE(parseListenAddress("0.0.0.0:0").has_value());
  EXPECT_TRUE(parseListenAddress("[2001:db8::1]:65535").has_value());
  for (const char* bad :
       {"", "localhost:9550", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "::1:9550", "[::1]9550",
        "[::1]:", "1.2.3.4:-1", "[127.0.0.1]:80", "1.2.3:80", "127.0.0.1:95x0", "[::1:80",
        " 127.0.0.1:80", "127.0.0.1:000009550"}) {
    EXPECT_FALSE(parseListenAddress(bad).has_value()) << bad;
  }
}

TEST_F(MetricsHttpTest, GetMetricsServesTheApiText) {
  open();
  const HttpResponse r = exchange("GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
  EXPECT_EQ(r.status, 200) << r.head;
  EXPECT_EQ(header(r, "Content-Type"), "text/plain; version=0.0.4");
  EXPECT_EQ(header(r, "Content-Length"), std::to_string(api_.metrics.size()));
  EXPECT_EQ(header(r, "Connection"), "close");
  EXPECT_EQ(r.body, api_.metrics);
  // Once the client has read the response and closed, nothing is left open.
  EXPECT_TRUE(pumpUntil(*server_, [&] { return server_->clientCount() == 0; }));
}

TEST_F(MetricsHttpTest, LargeBodiesArriveWhole) {
  api_.metrics.clear();
  for (int i = 0; i < 40000; ++i) {
    api_.metrics += "spillway_x{i=\"" + std::to_string(i) + "\"} " + std::to_string(i) + "\n";
  }
  open();
  const HttpResponse r = exchange("GET /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, api_.metrics);
}

TEST_F(MetricsHttpTest, OtherPathsMethodsAndMalformedRequests) {
  open();
  EXPECT_EQ(exchange("GET / HTTP/1.1\r\n\r\n").status, 404);
  EXPECT_EQ(exchange("GET /metricsx HTTP/1.1\r\n\r\n").status, 404);
  EXPECT_EQ(exchange("GET /metrics?name[]=x HTTP/1.1\r\n\r\n").status, 200);
  const HttpResponse post = exchange("POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc");
  EXPECT_EQ(post.status, 405);
  EXPECT_EQ(header(post, "Allow"), "GET, HEAD");
  EXPECT_EQ(exchange("garbage\r\n\r\n").status, 400);
  EXPECT_EQ(exchange("GET  /metrics HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(exchange("GET metrics HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(exchange("GET /metrics HTTP/2.0\r\n\r\n").status, 505);
  EXPECT_EQ(exchange(std::string("\x00\xff\r\n\r\n", 6)).status, 400);
  EXPECT_EQ(exchange("GET /metrics HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n").status,
            431);
  // Bare LF line ends are accepted.
  EXPECT_EQ(exchange("GET /metrics HTTP/1.0\n\n").status, 200);

  const HttpResponse head = exchange("HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(header(head, "Content-Length"), std::to_string(api_.metrics.size()));
  EXPECT_TRUE(head.body.empty());
}

TEST_F(MetricsHttpTest, RequestInPiecesAndHangUps) {
  open();
  {
    TcpClient slow(false, server_->port());
    ASSERT_TRUE(slow.send("GET /met"));
    ASSERT_TRUE(pumpUntil(*server_, [&] { return server_->clientCount() == 1; }));
    server_->poll();
    ASSERT_TRUE(slow.send("rics HTTP/1.1\r\n"));
    server_->poll();
    ASSERT_TRUE(slow.send("\r\n"));
    ASSERT_TRUE(pumpUntil(*server_, [&] { return slow.readSome(); }, {slow.fd()}));
    EXPECT_EQ(parseResponse(slow.received).status, 200);
  }
  {
    TcpClient quitter(false, server_->port());
    ASSERT_TRUE(quitter.send("GET /metrics HTTP/1.1\r\n"));  // and leaves mid-request
  }
  ASSERT_TRUE(pumpUntil(*server_, [&] { return server_->clientCount() == 0; }));
  EXPECT_EQ(exchange("GET /metrics HTTP/1.1\r\n\r\n").status, 200);
}

TEST_F(MetricsHttpTest, ConnectionLimitAndTimeouts) {
  Clock::time_point now = Clock::now();
  MetricsHttpOptions options;
  options.listen = "127.0.0.1:0";
  options.maxClients = 1;
  options.timeout = std::chrono::seconds(5);
  options.requestTimeout = std::chrono::seconds(2);
  options.clock = [&] { return now; };
  open(options);
  // At the limit, a new connection closes the idle one and is served.
  TcpClient idle(false, server_->port());
  ASSERT_TRUE(pumpUntil(*server_, [&] { return server_->clientCount() == 1; }));
  TcpClient scraper(false, server_->port());
  ASSERT_TRUE(pumpUntil(*server_, [&] { return idle.readSome(); }, {idle.fd()}));
  EXPECT_TRUE(idle.received.empty()) << "the idle connection is closed without an answer";
  ASSERT_TRUE(scraper.send("GET /metrics HTTP/1.1\r\n\r\n"));
  ASSERT_TRUE(pumpUntil(*server_, [&] { return scraper.readSome(); }, {scraper.fd()}));
  EXPECT_EQ(parseResponse(scraper.received).status, 200);
  scraper.close();
  ASSERT_TRUE(pumpUntil(*server_, [&] { return server_->clientCount() == 0; }));

  // A request head not complete within requestTimeout: closed.
  TcpClient silent(false, server_->port());
  ASSERT_TRUE(pumpUntil(*server_, [&] { return server_->clientCount() == 1; }));
  now += std::chrono::milliseconds(1999);
  server_->poll();
  EXPECT_EQ(server_->clientCount(), 1u);
  now += std::chrono::milliseconds(1);
  server_->poll();
  EXPECT_EQ(server_->clientCount(), 0u);
  EXPECT_TRUE(pumpUntil(*server_, [&] { return silent.readSome(); }, {silent.fd()}));
}

// Issue #13: 16 idle TCP clients (the default limit) must not lock out a scraper.
TEST_F(MetricsHttpTest, IdleClientsDoNotLockOutAScraper) {
  open();
  std::vector<std::unique_ptr<TcpClient>> idle;
  for (int i = 0; i < 16; ++i) {
    idle.push_back(std::make_unique<TcpClient>(false, server_->port()));
  }
  ASSERT_TRUE(pumpUntil(*server_, [&] { return server_->clientCount() == 16; }));
  const HttpResponse r = exchange("GET /metrics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(r.status, 200) << r.head;
  EXPECT_EQ(r.body, api_.metrics);
  EXPECT_LE(server_->clientCount(), 16u);
}

// When every connection is mid-response, a new one reads a 503, not a reset.
TEST_F(MetricsHttpTest, BusyWhenEveryConnectionIsSending) {
  api_.metrics.assign(32 << 20, 'x');  // far more than the socket buffers hold
  MetricsHttpOptions options;
  options.listen = "127.0.0.1:0";
  options.maxClients = 1;
  open(options);
  TcpClient hog(false, server_->port());
  const int small = 4096;
  ASSERT_EQ(setsockopt(hog.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
  ASSERT_TRUE(hog.send("GET /metrics HTTP/1.1\r\n\r\n"));  // and never reads
  ASSERT_TRUE(pumpUntil(*server_, [&] { return server_->clientCount() == 1; }));
  for (int i = 0; i < 20; ++i) server_->poll();
  TcpClient extra(false, server_->port());
  ASSERT_TRUE(pumpUntil(*server_, [&] { return extra.readSome(); }, {extra.fd()}));
  const HttpResponse busy = parseResponse(extra.received);
  EXPECT_EQ(busy.status, 503) << extra.received;
  EXPECT_NE(busy.body.find("busy"), std::string::npos) << busy.body;
}

TEST_F(MetricsHttpTest, Ipv6Loopback) {
  MetricsHttpOptions options;
  options.listen = "[::1]:0";
  server_ = std::make_unique<MetricsHttpServer>(api_, options);
  std::string error;
  if (!server_->open(error)) GTEST_SKIP() << "no IPv6 loopback here: " << error;
  const HttpResponse r = exchange("GET /metrics HTTP/1.1\r\n\r\n", /*ipv6=*/true);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, api_.metrics);
}

TEST(MetricsHttpServer, EmptyListenDisables) {
  FakeControlApi api;
  MetricsHttpOptions options;
  options.listen = "";
  MetricsHttpServer server(api, options);
  std::string error;
  EXPECT_TRUE(server.open(error));
  EXPECT_FALSE(server.enabled());
  EXPECT_EQ(server.pollFd(), -1);
  server.poll();
}

TEST(MetricsHttpServer, BadAddressesAreErrors) {
  FakeControlApi api;
  for (const char* listen : {"localhost:9550", "127.0.0.1"}) {
    MetricsHttpOptions options;
    options.listen = listen;
    MetricsHttpServer server(api, options);
    std::string error;
    EXPECT_FALSE(server.open(error)) << listen;
    EXPECT_NE(error.find(listen), std::string::npos) << error;
  }
  MetricsHttpOptions options;
  options.listen = "127.0.0.1:0";
  MetricsHttpServer first(api, options);
  std::string error;
  ASSERT_TRUE(first.open(error)) << error;
  options.listen = "127.0.0.1:" + std::to_string(first.port());
  MetricsHttpServer second(api, options);
  EXPECT_FALSE(second.open(error));
  EXPECT_NE(error.find("Address already in use"), std::string::npos) << error;
}

TEST(MetricsHttpServer, FromConfig) {
  ControlConfig config;
  EXPECT_EQ(MetricsHttpOptions::fromConfig(config).listen, "127.0.0.1:9550");
  config.metricsListen = "[::1]:9551";
  EXPECT_EQ(MetricsHttpOptions::fromConfig(config).listen, "[::1]:9551");
}

// --- MetricsWriter ---------------------------------------------------------------

std::string sampleText() {
  MetricsWriter w;
  const MetricLabel drainLabels[] = {{"backend", "gpu-a1"}, {"pool", "onprem"}};
  w.gauge("spillway_backend_state", "Backend state (0 active, 1 draining, 2 failed, 3 disabled).",
          drainLabels, 1);
  w.counter("spillway_drops", "Packets dropped, by reason.", {{"reason", "not_vip"}}, 12);
  w.gauge("spillway_backend_state", "ignored: the first help stays",
          {{"backend", "gpu-c1"}, {"pool", "cloud"}}, 0);
  w.counter("spillway_drops_total", "", {{"reason", "flow_table_full"}}, 0);
  w.gauge("spillway_backend_rtt_seconds", "Smoothed health-check RTT.",
          {{"backend", "we\"ird\\name\nx"}}, 0.00025);
  w.gauge("spillway_backend_gpu_utilization_ratio", "Mean GPU utilisation (0..1).",
          {{"backend", "gpu-a1"}}, std::numeric_limits<double>::quiet_NaN());
  w.gauge("spillway_pool_share_ratio", "Share of new flows.", {{"pool", "cloud\xff"}}, 0.125);
  w.counter("spillway_lcore_rx_packets", "Packets received per lcore.", {{"lcore", "1"}},
            18446744073709551615.0);
  const HistogramBucket buckets[] = {{0.001, 3}, {0.01, 7}, {0.1, 9}};
  w.histogram("spillway_publish_latency_seconds", "Decision to dataplane use.", {}, buckets, 0.123,
              10);
  w.gauge("spillway_up", "Whether spillwayd runs.", {}, 1);
  return w.text();
}

TEST(MetricsWriter, FamiliesOnceAndContiguous) {
  const std::string text = sampleText();
  const auto count = [&](const std::string& needle) {
    std::size_t n = 0;
    for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("# TYPE spillway_backend_state gauge\n"), 1u);
  EXPECT_EQ(count("# HELP spillway_backend_state "), 1u);
  EXPECT_EQ(count("# TYPE spillway_drops_total counter\n"), 1u);
  EXPECT_EQ(count("# TYPE spillway_publish_latency_seconds histogram\n"), 1u);
  // Both backend_state samples sit under their one header, before the next family.
  const auto header = text.find("# TYPE spillway_backend_state");
  const auto next = text.find("# HELP spillway_drops_total");
  EXPECT_LT(header, text.find("spillway_backend_state{backend=\"gpu-c1\",pool=\"cloud\"} 0\n"));
  EXPECT_LT(text.find("spillway_backend_state{backend=\"gpu-c1\""), next);
  EXPECT_NE(text.find("spillway_drops_total{reason=\"not_vip\"} 12\n"), std::string::npos);
  EXPECT_NE(text.find("spillway_drops_total{reason=\"flow_table_full\"} 0\n"), std::string::npos);
}

TEST(MetricsWriter, EscapingAndValues) {
  const std::string text = sampleText();
  EXPECT_NE(text.find(R"(spillway_backend_rtt_seconds{backend="we\"ird\\name\nx"} 0.00025)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("spillway_backend_gpu_utilization_ratio{backend=\"gpu-a1\"} NaN\n"),
            std::string::npos);
  EXPECT_NE(text.find("spillway_pool_share_ratio{pool=\"cloud\xef\xbf\xbd\"} 0.125\n"),
            std::string::npos);
  EXPECT_NE(text.find("spillway_lcore_rx_packets_total{lcore=\"1\"} 18446744073709551616\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("spillway_publish_latency_seconds_bucket{le=\"0.001\"} 3\n"),
            std::string::npos);
  EXPECT_NE(text.find("spillway_publish_latency_seconds_bucket{le=\"+Inf\"} 10\n"),
            std::string::npos);
  EXPECT_NE(text.find("spillway_publish_latency_seconds_sum 0.123\n"), std::string::npos);
  EXPECT_NE(text.find("spillway_publish_latency_seconds_count 10\n"), std::string::npos);
  EXPECT_NE(text.find("spillway_up 1\n"), std::string::npos);

  EXPECT_EQ(MetricsWriter::formatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(MetricsWriter::formatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(MetricsWriter::formatValue(-3), "-3");
  EXPECT_EQ(MetricsWriter::formatValue(1e20), "1e+20");
  EXPECT_EQ(MetricsWriter::escapeHelp("a\\b\nc\"d"), "a\\\\b\\nc\"d");
}

TEST(MetricsWriter, NamesAreMadeValid) {
  EXPECT_EQ(MetricsWriter::metricName("spillway_ok:sub"), "spillway_ok:sub");
  EXPECT_EQ(MetricsWriter::metricName("vllm:num-requests waiting"), "vllm:num_requests_waiting");
  EXPECT_EQ(MetricsWriter::metricName("9lives"), "_9lives");
  EXPECT_EQ(MetricsWriter::metricName(""), "_");
  EXPECT_EQ(MetricsWriter::labelName("gpu.uuid"), "gpu_uuid");
  EXPECT_EQ(MetricsWriter::labelName("a:b"), "a_b");
  EXPECT_EQ(MetricsWriter::labelName("0x"), "_0x");
}

TEST(MetricsWriter, ConflictsAndDuplicatesAreDropped) {
  MetricsWriter w;
  w.gauge("spillway_x", "x", {{"a", "1"}}, 1);
  w.gauge("spillway_x", "x", {{"a", "1"}}, 2);              // same series again
  w.counter("spillway_x_total", "x", {{"a", "1"}}, 1);      // a different family: fine
  w.histogram("spillway_x", "x", {}, {}, 0, 0);             // spillway_x is a gauge
  w.gauge("spillway_y", "y", {{"a", "1"}, {"a", "2"}}, 1);  // repeated label name: first kept
  EXPECT_EQ(w.dropped(), 2u);
  const std::string text = w.text();
  EXPECT_NE(text.find("spillway_x{a=\"1\"} 1\n"), std::string::npos);
  EXPECT_EQ(text.find("spillway_x{a=\"1\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("spillway_y{a=\"1\"} 1\n"), std::string::npos);
}

TEST(MetricsWriter, PromtoolAcceptsTheOutput) {
  const char* candidates[] = {"/usr/bin/promtool", "/usr/local/bin/promtool"};
  std::string promtool;
  for (const char* c : candidates) {
    if (access(c, X_OK) == 0) promtool = c;
  }
  if (promtool.empty()) GTEST_SKIP() << "promtool not installed (Debian package prometheus)";
  char path[] = "/tmp/spillway-metrics-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string text = sampleText();
  ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(fd);
  const std::string out = std::string(path) + ".out";
  const std::string command = promtool + " check metrics < " + path + " > " + out + " 2>&1";
  const int status = std::system(command.c_str());
  std::string report;
  if (std::FILE* f = std::fopen(out.c_str(), "r")) {
    char buffer[4096];
    std::size_t n = 0;
    while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) report.append(buffer, n);
    std::fclose(f);
  }
  std::remove(path);
  std::remove(out.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << report << "\n" << text;
  EXPECT_TRUE(report.empty()) << report;
}

}  // namespace
}  // namespace spillway
