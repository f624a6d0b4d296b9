#include "control/health/scrape_rounds.hpp"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "control/sys/epoll_loop.hpp"
#include "spillway/errno_text.hpp"

namespace spillway {

ScrapeRounds::ScrapeRounds() {
  epollFd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epollFd_ < 0) initError_ = "epoll_create1: " + errnoText(errno);
}

ScrapeRounds::~ScrapeRounds() {
  entries_.clear();
  if (epollFd_ >= 0) ::close(epollFd_);
}

void ScrapeRounds::endScrape(Slot& s) noexcept {
  if (s.tag != 0) byTag_.erase(s.tag);
  s.tag = 0;
  s.exchange.abort("aborted");
  s.scraping = false;
}

void ScrapeRounds::pollRounds(Millis now) noexcept {
  try {
    if (epollFd_ >= 0) {
      drainReady(epollFd_, [&](const epoll_event& ev) {
        const auto it = byTag_.find(ev.data.u64);
        if (it == byTag_.end()) return;
        Slot& s = *it->second;
        s.exchange.onEvent(ev.events);
        if (s.exchange.finished()) finishScrape(s, now);
      });
    }
    for (auto& sp : entries_) {
      Slot& s = *sp;
      const Timing t = timing(s);
      if (!t.enabled) continue;
      const Millis timeout = std::max<Millis>(t.timeout, 1);
      if (s.scraping && now >= s.scrapeStart + timeout) {
        const std::string what =
            s.exchange.connected() ? "no complete response" : "connect timeout";
        endScrape(s);
        failed(s, now, what + " within " + std::to_string(timeout) + " ms");
      }
      if (!s.due) s.due = now + t.firstDelay;
      if (!s.scraping && *s.due <= now) startScrape(s, now);
    }
  } catch (...) {
    // Allocation failure: scrapes in flight time out later.
  }
}

void ScrapeRounds::startScrape(Slot& s, Millis now) noexcept {
  s.scraping = true;
  s.scrapeStart = now;
  s.due = now + std::max<Millis>(timing(s).interval, 1);
  if (epollFd_ < 0) {
    s.scraping = false;
    failed(s, now, initError_);
    return;
  }
  try {
    const HttpRequest r = request(s);
    s.tag = nextTag_++;
    byTag_[s.tag] = &s;
    s.exchange.start(r, epollFd_, s.tag);
  } catch (...) {
    endScrape(s);
    failed(s, now, "out of memory");
    return;
  }
  if (s.exchange.finished()) finishScrape(s, now);
}

void ScrapeRounds::finishScrape(Slot& s, Millis now) noexcept {
  if (s.exchange.state() == HttpExchange::State::Failed) {
    std::string error = s.exchange.error();
    endScrape(s);
    failed(s, now, std::move(error));
    return;
  }
  if (s.exchange.status() != 200) {
    const int code = s.exchange.status();
    endScrape(s);
    failed(s, now, "HTTP status " + std::to_string(code) + ", expected 200");
    return;
  }
  (void)ingestInto(s, now, s.exchange.body());
  endScrape(s);
}

bool ScrapeRounds::ingestInto(Slot& s, Millis now, std::string_view body) noexcept {
  try {
    return received(s, now, body);
  } catch (...) {
    failed(s, now, "out of memory");
    return false;
  }
}

bool ScrapeRounds::ingest(std::uint64_t id, Millis now, std::string_view body) noexcept {
  Slot* s = slot(id);
  return s != nullptr && ingestInto(*s, now, body);
}

}  // namespace spillway
