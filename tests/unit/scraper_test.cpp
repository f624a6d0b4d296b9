// Load scraping: the smoothed signal on its own, the text a scrape ingests,
// then real scrapes over loopback (in-test servers and tests/tools/
// fake_exporter.py) with injected time: EWMA, staleness, bounded and
// malformed responses.
#include "control/health/scraper.hpp"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "control/health/http_client.hpp"
#include "loopback_servers.hpp"

extern char** environ;

namespace spillway {
namespace {

using test::LoopbackHttpServer;

IpAddress loopback() {
  return parseIpAddress("127.0.0.1").value();
}

std::string dcgm(std::initializer_list<double> gpus, std::optional<double> queue = std::nullopt) {
  std::string text =
      "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
      "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n";
  int i = 0;
  for (double u : gpus) {
    text += "DCGM_FI_DEV_GPU_UTIL{gpu=\"" + std::to_string(i) + "\",UUID=\"GPU-" +
            std::to_string(i) + "\",device=\"nvidia" + std::to_string(i) +
            "\",modelName=\"NVIDIA H100 80GB HBM3\"} " + std::to_string(u) + "\n";
    ++i;
  }
  text += "# TYPE DCGM_FI_DEV_FB_USED gauge\nDCGM_FI_DEV_FB_USED{gpu=\"0\"} 1234\n";
  if (queue) {
    text +=
        "# TYPE vllm:num_requests_waiting gauge\n"
        "vllm:num_requests_waiting{model_name=\"a\"} " +
        std::to_string(*queue / 2) +
        "\n"
        "vllm:num_requests_waiting{model_name=\"b\"} " +
        std::to_string(*queue / 2) + "\n";
  }
  return text;
}

LoadSourceConfig source(std::uint16_t port = 9400) {
  LoadSourceConfig c;
  c.enabled = true;
  c.port = port;
  c.queueMetric = "vllm:num_requests_waiting";
  c.interval = 1000;
  c.timeout = 500;
  c.staleAfter = 5000;
  c.smoothing = 0.5;
  return c;
}

ScrapeTarget target(std::uint64_t id, LoadSourceConfig config) {
  return ScrapeTarget{id, "b" + std::to_string(id), loopback(), std::move(config)};
}

LoadScraperOptions unstaggered() {
  LoadScraperOptions o;
  o.staggerStart = false;
  return o;
}

// ---------------------------------------------------------------------------
// The HTTP client's request and status line

TEST(HttpClient, GetRequest) {
  EXPECT_EQ(buildHttpGet(loopback(), 9400, "/metrics", "text/plain;version=0.0.4"),
            "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9400\r\nUser-Agent: spillway\r\n"
            "Accept: text/plain;version=0.0.4\r\nConnection: close\r\n\r\n");
  const std::string v6 = buildHttpGet(parseIpAddress("2001:db8::1").value(), 80, "health", "*/*");
  EXPECT_EQ(v6.rfind("GET /health HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n", 0), 0u) << v6;
  const std::string odd = buildHttpGet(loopback(), 1, "/a b\r\nX: y\xff", "*/*");
  EXPECT_EQ(odd.rfind("GET /a%20b%0D%0AX:%20y%FF HTTP/1.1\r\n", 0), 0u) << odd;
  EXPECT_EQ(buildHttpGet(loopback(), 1, "", "*/*").rfind("GET / HTTP/1.1\r\n", 0), 0u);
}

TEST(HttpClient, StatusLine) {
  EXPECT_EQ(parseHttpStatusLine("HTTP/1.1 200 OK"), 200);
  EXPECT_EQ(parseHttpStatusLine("HTTP/1.0 503 Service Unavailable\r"), 503);
  EXPECT_EQ(parseHttpStatusLine("HTTP/1.1 204"), 204);
  EXPECT_EQ(parseHttpStatusLine("HTTP/1.1 200OK"), -1);
  EXPECT_EQ(parseHttpStatusLine("HTTP/1.1 20 OK"), -1);
  EXPECT_EQ(parseHttpStatusLine("HTTP/1.1 700 What"), -1);
  EXPECT_EQ(parseHttpStatusLine("HTTP/x.1 200 OK"), -1);
  EXPECT_EQ(parseHttpStatusLine("ICY 200 OK"), -1);
  EXPECT_EQ(parseHttpStatusLine(""), -1);
}

// A response without a socket (HttpExchange::startDetached), fed in pieces
// of `piece` bytes and then closed.
struct Fed {
  HttpExchange::State state;
  int status;
  std::string body;
  std::string error;
};
Fed feedResponse(std::string_view response, std::size_t piece,
                 HttpExchangeMode mode = HttpExchangeMode::FullResponse,
                 std::size_t bound = std::size_t{1} << 20) {
  HttpRequest request;
  request.mode = mode;
  request.address = loopback();
  request.port = 9400;
  request.maxResponseBytes = bound;
  HttpExchange x;
  x.startDetached(request);
  x.feed(response, piece);
  x.feedEnd();
  return Fed{x.state(), x.status(), std::string(x.body()), x.error()};
}

// However a response is split into reads, it comes to the same: a head or a
// status line whose end arrives in another read than its start, and lines
// over their limit, which are refused whether their CRLF came in the same
// read or not (a 1,500-byte chunk-size line used to pass when it arrived in
// one read).
TEST(HttpClient, ResponsesSplitAnyWayParseTheSame) {
  const std::string chunked = test::httpChunked(std::string(3000, 'm'), 700);
  const std::string longSizeLine = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;" +
                                   std::string(1500, 'e') + "\r\nabcd\r\n0\r\n\r\n";
  const std::string longTrailer =
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
      "4\r\nabcd\r\n0\r\nX-T: " +
      std::string(1500, 't') + "\r\n\r\n";
  for (const std::size_t piece :
       {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{7}, std::size_t{1} << 20}) {
    const Fed ok = feedResponse(test::httpOk("hello") + "trailing", piece);
    EXPECT_EQ(ok.state, HttpExchange::State::Done) << piece << ": " << ok.error;
    EXPECT_EQ(ok.body, "hello") << piece;
    const Fed c = feedResponse(chunked, piece);
    EXPECT_EQ(c.state, HttpExchange::State::Done) << piece << ": " << c.error;
    EXPECT_EQ(c.body, std::string(3000, 'm')) << piece;
    const Fed status =
        feedResponse("HTTP/1.1 503 Busy\r\nX: y\r\n", piece, HttpExchangeMode::StatusLine);
    EXPECT_EQ(status.status, 503) << piece;
    const Fed line = feedResponse(longSizeLine, piece);
    EXPECT_EQ(line.state, HttpExchange::State::Failed) << piece;
    EXPECT_EQ(line.error, "chunk size line too long") << piece;
    const Fed trailer = feedResponse(longTrailer, piece);
    EXPECT_EQ(trailer.state, HttpExchange::State::Failed) << piece;
    EXPECT_EQ(trailer.error, "trailer line too long") << piece;
  }
}

// A chunk size past the bound is "too large", not "malformed", however many
// digits it has.
TEST(HttpClient, AbsurdChunkSizeIsTooLarge) {
  const Fed f = feedResponse(
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffffffff\r\nx", 1 << 20,
      HttpExchangeMode::FullResponse, 4096);
  EXPECT_EQ(f.state, HttpExchange::State::Failed);
  EXPECT_EQ(f.error, "response larger than 4096 bytes");
}

// ---------------------------------------------------------------------------
// The signal

TEST(LoadSignal, EwmaStalenessAndRestart) {
  LoadSignal s;
  EXPECT_FALSE(s.value(0, 5000));
  s.update(1000, 40.0, 0.3, 5000);
  EXPECT_DOUBLE_EQ(s.value(1000, 5000).value(), 40.0);
  s.update(2000, 80.0, 0.3, 5000);
  EXPECT_DOUBLE_EQ(s.value(2000, 5000).value(), 0.3 * 80 + 0.7 * 40);
  EXPECT_DOUBLE_EQ(s.raw().value(), 80.0);
  EXPECT_TRUE(s.value(7000, 5000));   // exactly staleAfter old: still fresh
  EXPECT_FALSE(s.value(7001, 5000));  // older: unknown
  // A sample after the gap starts over instead of blending with stale data.
  s.update(9000, 10.0, 0.3, 5000);
  EXPECT_DOUBLE_EQ(s.value(9000, 5000).value(), 10.0);
  // Smoothing 1 follows the newest sample; out-of-range smoothing is 1.
  s.update(9100, 20.0, 1.0, 5000);
  EXPECT_DOUBLE_EQ(s.smoothed().value(), 20.0);
  s.update(9200, 30.0, 0.0, 5000);
  EXPECT_DOUBLE_EQ(s.smoothed().value(), 30.0);
  EXPECT_EQ(s.updatedAt().value(), 9200u);
}

// ---------------------------------------------------------------------------
// Ingesting text (no sockets)

TEST(LoadScraper, IngestAveragesGpusAndSumsQueues) {
  LoadScraper scraper;
  scraper.setTargets({target(1, source())});
  ASSERT_TRUE(scraper.ingest(1, 100, dcgm({30, 50, 100}, 8.0)));
  const ScrapedLoad l = scraper.load(1, 100);
  EXPECT_DOUBLE_EQ(l.gpuUtilization.value(), 60.0);
  EXPECT_DOUBLE_EQ(l.queueDepth.value(), 8.0);
  const LoadStatus s = *scraper.status(1);
  EXPECT_EQ(s.lastError, "");
  EXPECT_EQ(s.gpuSamples, 3u);
  EXPECT_EQ(s.lastSuccess, 100u);
  EXPECT_EQ(s.scrapes, 1u);
  EXPECT_EQ(s.failures, 0u);

  ASSERT_TRUE(scraper.ingest(1, 1100, dcgm({90, 90, 90}, 0.0)));  // smoothing 0.5
  EXPECT_DOUBLE_EQ(scraper.load(1, 1100).gpuUtilization.value(), 75.0);
  EXPECT_DOUBLE_EQ(scraper.load(1, 1100).queueDepth.value(), 4.0);
  EXPECT_DOUBLE_EQ(scraper.status(1)->rawGpu.value(), 90.0);
  EXPECT_DOUBLE_EQ(scraper.status(1)->smoothedGpu.value(), 75.0);
}

TEST(LoadScraper, EachSignalGoesStaleOnItsOwn) {
  LoadScraper scraper;
  scraper.setTargets({target(1, source())});
  ASSERT_TRUE(scraper.ingest(1, 0, dcgm({50}, 6.0)));
  ASSERT_TRUE(scraper.ingest(1, 3000, dcgm({70})));  // the queue metric vanished
  EXPECT_EQ(scraper.status(1)->lastError, "no samples of vllm:num_requests_waiting");
  EXPECT_TRUE(scraper.load(1, 5000).queueDepth);
  const ScrapedLoad later = scraper.load(1, 6000);
  EXPECT_DOUBLE_EQ(later.gpuUtilization.value(), 60.0);
  EXPECT_FALSE(later.queueDepth);  // last updated at 0, stale after 5000
  EXPECT_FALSE(scraper.load(1, 8001).gpuUtilization);
  EXPECT_FALSE(scraper.load(99, 0).gpuUtilization);  // unknown id
}

TEST(LoadScraper, RejectedTextChangesNothing) {
  LoadScraper scraper;
  scraper.setTargets({target(1, source())});
  ASSERT_TRUE(scraper.ingest(1, 0, dcgm({40}, 2.0)));
  EXPECT_FALSE(scraper.ingest(1, 1000, "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\" 99\n"));
  EXPECT_EQ(scraper.status(1)->lastError,
            "invalid exposition text: line 1, column 30: expected ',' or '}', found '99'");
  EXPECT_DOUBLE_EQ(scraper.load(1, 1000).gpuUtilization.value(), 40.0);
  EXPECT_EQ(scraper.status(1)->failures, 1u);
  EXPECT_EQ(scraper.status(1)->lastSuccess, 0u);

  EXPECT_TRUE(scraper.ingest(
      1, 2000, "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} -5\nvllm:num_requests_waiting NaN\n"));
  EXPECT_EQ(scraper.status(1)->lastError,
            "DCGM_FI_DEV_GPU_UTIL is not a utilisation (-5.000000; a percentage is 0 to 100); no "
            "samples of "
            "vllm:num_requests_waiting");
  EXPECT_DOUBLE_EQ(scraper.load(1, 2000).gpuUtilization.value(), 40.0);
}

// A utilisation above 100 % (one GPU of several, or an absurd 1e308) is no
// reading at all: the last good one stays, and a backend is never marked
// saturated by it. 100 itself and 0 are readings.
TEST(LoadScraper, UtilisationOutsideZeroToHundredIsNotAReading) {
  LoadScraper scraper;
  scraper.setTargets({target(1, source())});
  ASSERT_TRUE(scraper.ingest(1, 0, dcgm({40}, 2.0)));
  for (const char* bad : {"250", "1e308", "100.5", "-0.5", "+Inf", "NaN"}) {
    const std::string text = std::string("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} 10\n") +
                             "DCGM_FI_DEV_GPU_UTIL{gpu=\"1\"} " + bad + "\n";
    EXPECT_TRUE(scraper.ingest(1, 1000, text)) << bad;
    EXPECT_NE(scraper.status(1)->lastError.find("DCGM_FI_DEV_GPU_UTIL is not a utilisation"),
              std::string::npos)
        << bad << ": " << scraper.status(1)->lastError;
    EXPECT_DOUBLE_EQ(scraper.load(1, 1000).gpuUtilization.value(), 40.0) << bad;
  }
  ASSERT_TRUE(scraper.ingest(1, 2000, dcgm({100, 0}, 2.0)));  // a reading of 50
  EXPECT_EQ(scraper.status(1)->lastError, "");
  EXPECT_GT(scraper.load(1, 2000).gpuUtilization.value(), 40.0);  // smoothed toward 50
}

// Out-of-range values are counted per metric on every scrape, but raise one
// notice (one event) until the metric reports an in-range value again.
TEST(LoadScraper, OutOfRangeIsCountedAndNoticedOnce) {
  LoadScraper scraper;
  scraper.setTargets({target(1, source())});
  ASSERT_TRUE(scraper.ingest(1, 0, dcgm({40}, 2.0)));
  EXPECT_TRUE(scraper.takeNotices().empty());
  EXPECT_EQ(scraper.status(1)->gpuOutOfRange, 0u);

  for (Millis t : {1000, 2000, 3000}) {
    ASSERT_TRUE(scraper.ingest(1, t, dcgm({250}, 2.0)));
  }
  EXPECT_EQ(scraper.status(1)->gpuOutOfRange, 3u);
  EXPECT_EQ(scraper.status(1)->queueOutOfRange, 0u);
  std::vector<ScrapeNotice> notices = scraper.takeNotices();
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].id, 1u);
  EXPECT_EQ(notices[0].backend, "b1");
  EXPECT_EQ(notices[0].time, 1000);
  EXPECT_NE(notices[0].text.find("DCGM_FI_DEV_GPU_UTIL is not a utilisation (250.000000"),
            std::string::npos)
      << notices[0].text;
  EXPECT_TRUE(scraper.takeNotices().empty());

  // The queue has its own count and its own notice.
  ASSERT_TRUE(scraper.ingest(1, 4000, dcgm({250}, -4.0)));
  ASSERT_TRUE(
      scraper.ingest(1, 5000, "DCGM_FI_DEV_GPU_UTIL 300\nvllm:num_requests_waiting +Inf\n"));
  EXPECT_EQ(scraper.status(1)->gpuOutOfRange, 5u);
  EXPECT_EQ(scraper.status(1)->queueOutOfRange, 2u);
  notices = scraper.takeNotices();
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].time, 4000);
  EXPECT_NE(notices[0].text.find("vllm:num_requests_waiting is not a queue depth"),
            std::string::npos)
      << notices[0].text;

  // A good GPU value re-arms the GPU notice only; counts stay.
  ASSERT_TRUE(scraper.ingest(1, 6000, dcgm({50}, -4.0)));
  EXPECT_TRUE(scraper.takeNotices().empty());
  ASSERT_TRUE(scraper.ingest(1, 7000, dcgm({101}, -4.0)));
  notices = scraper.takeNotices();
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].time, 7000);
  EXPECT_NE(notices[0].text.find("DCGM_FI_DEV_GPU_UTIL"), std::string::npos);
  EXPECT_EQ(scraper.status(1)->gpuOutOfRange, 6u);
  EXPECT_EQ(scraper.status(1)->queueOutOfRange, 4u);

  // A re-added target starts over: counts at 0, notices armed.
  scraper.setTargets({});
  scraper.setTargets({target(1, source())});
  EXPECT_EQ(scraper.status(1)->gpuOutOfRange, 0u);
  ASSERT_TRUE(scraper.ingest(1, 8000, dcgm({101}, 2.0)));
  EXPECT_EQ(scraper.takeNotices().size(), 1u);
  EXPECT_EQ(scraper.status(1)->gpuOutOfRange, 1u);
}

// A rejected text or a missing metric neither counts as out of range nor
// re-arms the notice.
TEST(LoadScraper, MissingOrRejectedTextDoesNotRearmTheNotice) {
  LoadScraper scraper;
  scraper.setTargets({target(1, source())});
  ASSERT_TRUE(scraper.ingest(1, 0, dcgm({250}, 2.0)));
  EXPECT_EQ(scraper.takeNotices().size(), 1u);
  EXPECT_FALSE(scraper.ingest(1, 1000, "DCGM_FI_DEV_GPU_UTIL{ 1\n"));
  ASSERT_TRUE(scraper.ingest(1, 2000, "other_metric 1\n"));
  EXPECT_EQ(scraper.status(1)->gpuOutOfRange, 1u);
  ASSERT_TRUE(scraper.ingest(1, 3000, dcgm({250}, 2.0)));
  EXPECT_TRUE(scraper.takeNotices().empty());
  EXPECT_EQ(scraper.status(1)->gpuOutOfRange, 2u);
}

TEST(LoadScraper, NoQueueMetricConfiguredMeansNoQueueSignal) {
  LoadSourceConfig c = source();
  c.queueMetric.clear();
  LoadScraper scraper;
  scraper.setTargets({target(1, c)});
  ASSERT_TRUE(scraper.ingest(1, 0, dcgm({10}, 4.0)));
  EXPECT_EQ(scraper.status(1)->lastError, "");
  EXPECT_TRUE(scraper.load(1, 0).gpuUtilization);
  EXPECT_FALSE(scraper.load(1, 0).queueDepth);
}

TEST(LoadScraper, DisabledSourceIsNeverScraped) {
  LoadSourceConfig c = source(test::refusingPort());
  c.enabled = false;
  LoadScraper scraper(unstaggered());
  scraper.setTargets({target(1, c)});
  scraper.poll(0);
  scraper.poll(100'000);
  EXPECT_EQ(scraper.scrapesInFlight(), 0u);
  EXPECT_EQ(scraper.status(1)->scrapes, 0u);
  EXPECT_FALSE(scraper.nextDeadline());
  EXPECT_FALSE(scraper.load(1, 0).gpuUtilization);
}

// ---------------------------------------------------------------------------
// Scrapes over loopback

TEST(LoadScraper, ScrapesContentLengthChunkedAndUntilClose) {
  LoopbackHttpServer server(test::httpOk(dcgm({20, 40}, 3.0)));
  LoadScraper scraper(unstaggered());
  ASSERT_EQ(scraper.initError(), "");
  scraper.setTargets({target(1, source(server.port()))});
  test::PollDriver<LoadScraper> d(scraper);
  ASSERT_TRUE(d.runUntil([&] { return scraper.status(1)->scrapes >= 1; }, 1000));
  EXPECT_EQ(scraper.status(1)->lastError, "");
  EXPECT_DOUBLE_EQ(scraper.load(1, d.now()).gpuUtilization.value(), 30.0);
  EXPECT_DOUBLE_EQ(scraper.load(1, d.now()).queueDepth.value(), 3.0);
  const std::string request = server.lastRequest();
  EXPECT_EQ(request.rfind("GET /metrics HTTP/1.1\r\n", 0), 0u) << request;
  EXPECT_NE(request.find("\r\nAccept: text/plain;version=0.0.4\r\n"), std::string::npos);
  EXPECT_NE(request.find("\r\nConnection: close\r\n"), std::string::npos);

  server.setResponse(test::httpChunked(dcgm({60, 80}, 5.0), 7));
  ASSERT_TRUE(d.runUntil([&] { return scraper.status(1)->scrapes >= 2; }, 2000));
  EXPECT_EQ(scraper.status(1)->lastError, "");
  EXPECT_DOUBLE_EQ(scraper.status(1)->rawGpu.value(), 70.0);
  EXPECT_DOUBLE_EQ(scraper.load(1, d.now()).gpuUtilization.value(), 50.0);  // (30 + 70) / 2

  server.setResponse(test::httpUntilClose(dcgm({100}, 9.0)));
  ASSERT_TRUE(d.runUntil([&] { return scraper.status(1)->scrapes >= 3; }, 3000));
  EXPECT_EQ(scraper.status(1)->lastError, "");
  EXPECT_DOUBLE_EQ(scraper.status(1)->rawGpu.value(), 100.0);
  EXPECT_DOUBLE_EQ(scraper.status(1)->rawQueue.value(), 9.0);
  EXPECT_EQ(scraper.status(1)->lastSuccess, 2000u);  // scrapes at 0, 1000, 2000
  EXPECT_EQ(scraper.status(1)->failures, 0u);
}

TEST(LoadScraper, OversizedResponsesAreRejected) {
  std::string big = dcgm({50});
  while (big.size() < 8192) big += "# padding padding padding padding padding padding\n";
  LoopbackHttpServer server(test::httpOk(big));
  LoadScraperOptions o = unstaggered();
  o.maxResponseBytes = 4096;
  LoadScraper scraper(o);
  scraper.setTargets({target(1, source(server.port()))});
  test::PollDriver<LoadScraper> d(scraper);
  ASSERT_TRUE(d.runUntil([&] { return scraper.status(1)->scrapes >= 1; }, 1000));
  EXPECT_EQ(scraper.status(1)->lastError,
            "response larger than 4096 bytes (Content-Length " + std::to_string(big.size()) + ")");
  EXPECT_FALSE(scraper.load(1, d.now()).gpuUtilization);

  server.setResponse(test::httpChunked(big, 1000));  // no length announced
  ASSERT_TRUE(d.runUntil([&] { return scraper.status(1)->scrapes >= 2; }, 2000));
  EXPECT_EQ(scraper.status(1)->lastError, "response larger than 4096 bytes");
  server.setResponse(test::httpUntilClose(big));
  ASSERT_TRUE(d.runUntil([&] { return scraper.status(1)->scrapes >= 3; }, 3000));
  EXPECT_EQ(scraper.status(1)->lastError, "response larger than 4096 bytes");
  EXPECT_EQ(scraper.status(1)->failures, 3u);
  EXPECT_FALSE(scraper.status(1)->lastSuccess);
}

TEST(LoadScraper, HttpErrorsAndMalformedResponses) {
  LoopbackHttpServer server(test::httpStatus(404, "Not Found"));
  LoadScraper scraper(unstaggered());
  scraper.setTargets({target(1, source(server.port()))});
  test::PollDriver<LoadScraper> d(scraper);
  const auto scrapeOnce = [&](std::string response) {
    server.setResponse(std::move(response));
    const std::uint64_t before = scraper.status(1)->scrapes;
    EXPECT_TRUE(d.runUntil([&] { return scraper.status(1)->scrapes > before; }, d.now() + 1500));
    return scraper.status(1)->lastError;
  };
  EXPECT_EQ(scrapeOnce(test::httpStatus(404, "Not Found")), "HTTP status 404, expected 200");
  EXPECT_EQ(scrapeOnce(test::httpOk("<html>502 Bad Gateway</html>\n")),
            "invalid exposition text: line 1, column 1: expected a metric name, '#' or a blank "
            "line, found '<html>502 Bad Ga...'");
  EXPECT_EQ(scrapeOnce("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort"),
            "connection closed after 5 of 100 body bytes");
  EXPECT_EQ(scrapeOnce("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
            "malformed chunk size 'zz'");
  EXPECT_EQ(scrapeOnce("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            "unsupported transfer coding 'gzip, chunked'");
  EXPECT_EQ(scrapeOnce("HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n\r\n"),
            "unsupported content coding 'gzip'");
  EXPECT_EQ(scrapeOnce("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx"),
            "conflicting Content-Length headers");
  EXPECT_EQ(scrapeOnce("HTTP/1.1 200 OK\r\nbroken header\r\n\r\n"),
            "malformed header line 'broken header'");
  EXPECT_EQ(scrapeOnce("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n"),
            "connection closed inside the response headers");
  EXPECT_EQ(scrapeOnce("ICY 200 OK\r\n\r\n"), "malformed status line 'ICY 200 OK'");
  EXPECT_EQ(scrapeOnce(""), "connection closed without a response");
  EXPECT_EQ(scrapeOnce(test::httpOk(dcgm({12}, 1.0))), "");
  EXPECT_DOUBLE_EQ(scraper.load(1, d.now()).gpuUtilization.value(), 12.0);
}

TEST(LoadScraper, TimeoutsAndRefusals) {
  LoopbackHttpServer silent;
  silent.setSilent(true);
  const std::uint16_t refused = test::refusingPort();
  LoadScraper scraper(unstaggered());
  scraper.setTargets({target(1, source(silent.port())), target(2, source(refused))});
  test::PollDriver<LoadScraper> d(scraper);
  ASSERT_TRUE(d.runUntil(
      [&] { return scraper.status(1)->scrapes >= 2 && scraper.status(2)->scrapes >= 2; }, 5000));
  EXPECT_EQ(scraper.status(1)->lastError, "no complete response within 500 ms");
  EXPECT_EQ(scraper.status(1)->lastAttempt, 1500u);
  EXPECT_EQ(scraper.status(2)->lastError, "connect: Connection refused");
  EXPECT_EQ(scraper.status(2)->failures, 2u);
}

TEST(LoadScraper, StaleWhenTheExporterStopsAnswering) {
  LoopbackHttpServer server(test::httpOk(dcgm({50}, 2.0)));
  LoadScraper scraper(unstaggered());
  LoadSourceConfig c = source(server.port());
  c.staleAfter = 2500;
  scraper.setTargets({target(1, c)});
  test::PollDriver<LoadScraper> d(scraper);
  ASSERT_TRUE(d.runUntil([&] { return scraper.status(1)->scrapes >= 1; }, 500));
  EXPECT_TRUE(scraper.load(1, d.now()).gpuUtilization);
  server.setResponse(test::httpStatus(503, "Service Unavailable"));
  d.advance(2500);  // scrapes at 1000 and 2000 fail; the value from 0 is still fresh at 2500
  EXPECT_EQ(scraper.status(1)->lastError, "HTTP status 503, expected 200");
  EXPECT_DOUBLE_EQ(scraper.load(1, 2500).gpuUtilization.value(), 50.0);
  EXPECT_FALSE(scraper.load(1, 2501).gpuUtilization);
  EXPECT_FALSE(scraper.load(1, 2501).queueDepth);
  // It answers again: the signal restarts from the new sample.
  server.setResponse(test::httpOk(dcgm({90}, 7.0)));
  ASSERT_TRUE(d.runUntil([&] { return !scraper.status(1)->lastError.size(); }, 10'000));
  EXPECT_DOUBLE_EQ(scraper.load(1, d.now()).gpuUtilization.value(), 90.0);
}

TEST(LoadScraper, SetTargetsKeepsUnchangedSources) {
  LoadScraper scraper;
  scraper.setTargets({target(1, source()), target(2, source())});
  ASSERT_TRUE(scraper.ingest(1, 0, dcgm({10})));
  ASSERT_TRUE(scraper.ingest(2, 0, dcgm({20})));
  LoadSourceConfig changed = source();
  changed.gpuMetric = "DCGM_FI_DEV_GPU_UTIL_AVG";
  scraper.setTargets({target(1, source()), target(2, changed), target(3, source())});
  EXPECT_DOUBLE_EQ(scraper.load(1, 0).gpuUtilization.value(), 10.0);
  EXPECT_FALSE(scraper.load(2, 0).gpuUtilization);  // another metric: starts unknown
  EXPECT_FALSE(scraper.load(3, 0).gpuUtilization);
  scraper.setTargets({});
  EXPECT_FALSE(scraper.status(1));
  EXPECT_EQ(scraper.targetCount(), 0u);
}

// ---------------------------------------------------------------------------
// Against tests/tools/fake_exporter.py

class FakeExporter {
 public:
  FakeExporter(std::vector<std::string> args) {
    int out[2];
    if (pipe(out) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    std::vector<std::string> argv = {
        "python3", std::string(SPILLWAY_SOURCE_ROOT) + "/tests/tools/fake_exporter.py", "--port",
        "0"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    if (posix_spawnp(&pid_, "python3", &actions, nullptr, cargv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    // Wait (with a deadline) for "listening on 127.0.0.1:PORT". Python's
    // start took over 10 s once on a host at load 13: a generous deadline
    // (the test asserts that it starts, not how fast).
    std::string line;
    pollfd p{out[0], POLLIN, 0};
    while (pid_ > 0 && line.find('\n') == std::string::npos && ::poll(&p, 1, 60'000) > 0) {
      char buf[256];
      const ssize_t n = read(out[0], buf, sizeof buf);
      if (n <= 0) break;
      line.append(buf, static_cast<std::size_t>(n));
    }
    close(out[0]);
    const auto colon = line.rfind(':');
    if (line.rfind("listening on ", 0) == 0 && colon != std::string::npos) {
      port_ = static_cast<std::uint16_t>(std::stoi(line.substr(colon + 1)));
    }
  }
  ~FakeExporter() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
  }
  std::uint16_t port() const { return port_; }

  // POST /set?query with a blocking client; returns the status line.
  std::string set(const std::string& query) const {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const sockaddr_in sin = test::loopbackAddress(port_);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&sin), sizeof sin) != 0) {
      close(fd);
      return "connect failed";
    }
    const std::string request =
        "POST /set?" + query +
        " HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    (void)!write(fd, request.data(), request.size());
    std::string response;
    char buf[1024];
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, 5000) > 0) {
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) break;
      response.append(buf, static_cast<std::size_t>(n));
    }
    close(fd);
    return response.substr(0, response.find("\r\n"));
  }

 private:
  pid_t pid_ = -1;
  std::uint16_t port_ = 0;
};

TEST(LoadScraper, FakeExporterDcgmAndVllm) {
  if (access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "needs python3 for fake_exporter.py";
  FakeExporter exporter({"--gpus", "4", "--gpu-util", "37", "--queue", "3"});
  ASSERT_NE(exporter.port(), 0) << "fake_exporter.py did not start";
  LoadScraper scraper(unstaggered());
  LoadSourceConfig c = source(exporter.port());
  c.timeout = 2000;  // a Python server on a busy CI host
  c.smoothing = 1.0;
  scraper.setTargets({target(1, c)});
  test::PollDriver<LoadScraper> d(scraper);
  ASSERT_TRUE(d.runUntil([&] { return scraper.status(1)->scrapes >= 1; }, 3000));
  ASSERT_EQ(scraper.status(1)->lastError, "");
  EXPECT_EQ(scraper.status(1)->gpuSamples, 4u);
  EXPECT_DOUBLE_EQ(scraper.load(1, d.now()).gpuUtilization.value(), 37.0);
  EXPECT_DOUBLE_EQ(scraper.load(1, d.now()).queueDepth.value(), 3.0);

  EXPECT_EQ(exporter.set("gpu=90&gpu3=10&queue=12"), "HTTP/1.1 200 OK");
  ASSERT_TRUE(d.runUntil([&] { return scraper.status(1)->scrapes >= 2; }, 6000));
  EXPECT_DOUBLE_EQ(scraper.load(1, d.now()).gpuUtilization.value(), 70.0);  // (90*3 + 10) / 4
  EXPECT_DOUBLE_EQ(scraper.load(1, d.now()).queueDepth.value(), 12.0);

  EXPECT_EQ(exporter.set("status=503"), "HTTP/1.1 200 OK");
  ASSERT_TRUE(d.runUntil([&] { return scraper.status(1)->scrapes >= 3; }, 9000));
  EXPECT_EQ(scraper.status(1)->lastError, "HTTP status 503, expected 200");
  EXPECT_EQ(exporter.set("status=200&garbage=1"), "HTTP/1.1 200 OK");
  ASSERT_TRUE(d.runUntil([&] { return scraper.status(1)->scrapes >= 4; }, 12000));
  EXPECT_EQ(scraper.status(1)->lastError.rfind("invalid exposition text: line 1", 0), 0u)
      << scraper.status(1)->lastError;
  EXPECT_EQ(exporter.set("bogus=1"), "HTTP/1.1 400 Bad Request");
}

}  // namespace
}  // namespace spillway
