// libFuzzer target for what a backend's HTTP server may send the control
// plane: the input's first byte picks how the bytes arrive (recv()-sized
// pieces of 1 to 64 bytes or 16 KiB) and the rest is the server's response,
// after which it closes. Three consumers of one response:
//  - the client in FullResponse mode, at a small and the default bound, fed
//    in pieces and all at once: whatever the bytes, it finishes, a body stays
//    within the bound, and how the bytes were split changes nothing;
//  - the client in StatusLine mode (HTTP health checks);
//  - the whole scrape path (LoadScraper::replayResponse: response, exposition
//    text, the backend's load status): one ended scrape per response, and a
//    load signal is a percentage and a finite, non-negative depth or unknown.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "control/health/http_client.hpp"
#include "control/health/scraper.hpp"

namespace {

using namespace spillway;

void check(bool condition, int line = __builtin_LINE()) {
  if (!condition) {
    std::fprintf(stderr, "fuzz_http: check at line %d failed\n", line);
    std::abort();
  }
}

struct Outcome {
  HttpExchange::State state;
  int status;
  std::string body;
};

Outcome exchange(HttpExchangeMode mode, std::size_t bound, std::string_view response,
                 std::size_t piece) {
  HttpRequest request;
  request.mode = mode;
  request.address = parseIpAddress("192.0.2.7").value();
  request.port = 9400;
  request.maxResponseBytes = bound;
  HttpExchange x;
  x.startDetached(request);
  check(x.state() == HttpExchange::State::Receiving);
  x.feed(response, piece);
  x.feedEnd();
  check(x.finished());
  if (x.state() == HttpExchange::State::Failed) {
    check(!x.error().empty());
  } else {
    check(x.status() >= 100 && x.status() <= 599);
    check(x.body().size() <= bound);
    if (mode == HttpExchangeMode::StatusLine) check(x.body().empty());
  }
  return Outcome{x.state(), x.status(), std::string(x.body())};
}

LoadScraper& scraper() {
  static LoadScraper* s = [] {
    LoadScraperOptions options;
    options.maxResponseBytes = 64 * 1024;
    options.staggerStart = false;
    return new LoadScraper(options);
  }();
  return *s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t piece = data[0] < 0xc0 ? 1 + (data[0] & 0x3f) : 16 * 1024;
  const std::string_view response(reinterpret_cast<const char*>(data + 1), size - 1);

  for (const std::size_t bound : {std::size_t{512}, std::size_t{1} << 20}) {
    const Outcome split = exchange(HttpExchangeMode::FullResponse, bound, response, piece);
    const Outcome whole =
        exchange(HttpExchangeMode::FullResponse, bound, response, response.size() + 1);
    check(split.state == whole.state);
    if (split.state == HttpExchange::State::Done) {
      check(split.status == whole.status);
      check(split.body == whole.body);
    }
  }
  const Outcome a = exchange(HttpExchangeMode::StatusLine, 16 * 1024, response, piece);
  const Outcome b =
      exchange(HttpExchangeMode::StatusLine, 16 * 1024, response, response.size() + 1);
  check(a.state == b.state && a.status == b.status);

  LoadScraper& s = scraper();
  LoadSourceConfig source;
  source.enabled = true;
  source.port = 9400;
  source.queueMetric = "vllm:num_requests_waiting";
  source.staleAfter = 5000;
  source.smoothing = 0.5;
  s.setTargets({});
  s.setTargets({ScrapeTarget{1, "b1", parseIpAddress("192.0.2.7").value(), source}});
  for (const Millis now : {Millis{1000}, Millis{2000}}) {
    s.replayResponse(1, now, response, piece);
    const std::optional<LoadStatus> st = s.status(1);
    check(st.has_value());
    check(st->scrapes == static_cast<std::uint64_t>(now / 1000));
    check(st->failures <= st->scrapes);
    check(st->gpuOutOfRange + st->queueOutOfRange <= 2 * st->scrapes);
    check(s.scrapesInFlight() == 0);
    const ScrapedLoad load = s.load(1, now);
    if (load.gpuUtilization) check(*load.gpuUtilization >= 0.0 && *load.gpuUtilization <= 100.0);
    if (load.queueDepth) check(std::isfinite(*load.queueDepth) && *load.queueDepth >= 0.0);
  }
  check(s.takeNotices().size() <= 2);
  return 0;
}
