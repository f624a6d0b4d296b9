// ScrapeRounds: the periodic HTTP scrape that LoadScraper (GPU load) and
// ConnScraper (a backend's connections) both run, once: per target a slot
// with its schedule, one HttpExchange at a time on the scraper's own epoll
// fd, a timeout per scrape, and the outcome handed to the owner (a 200
// response's body, or why there was none).
//
// The owner derives its entry type from Slot (adding what it keeps per
// target), implements the four hooks, and calls pollRounds() from its
// poll(). Entries live in `entries_` (owned) and `byId_`; replaceTargets()
// swaps the target set keeping the entries whose target is unchanged.
//
// Thread contract: the owner's (the control thread); never blocks; no
// exceptions escape pollRounds(); time injected.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "control/health/http_client.hpp"
#include "spillway/flow_table.hpp"

namespace spillway {

class ScrapeRounds {
 public:
  ScrapeRounds(const ScrapeRounds&) = delete;
  ScrapeRounds& operator=(const ScrapeRounds&) = delete;

  // Empty when the scraper works; otherwise why its epoll fd could not be made.
  [[nodiscard]] const std::string& initError() const noexcept { return initError_; }
  [[nodiscard]] int pollFd() const noexcept { return epollFd_; }

  // What a scrape does with a 200 response's body, for target `id` at
  // `now`; public so that tests and replays can feed exposition text
  // directly. False for an unknown id or text the owner rejected (its
  // status says why).
  bool ingest(std::uint64_t id, Millis now, std::string_view body) noexcept;

 protected:
  struct Slot {
    virtual ~Slot() = default;
    std::uint64_t id = 0;
    std::optional<Millis> due;
    bool scraping = false;
    Millis scrapeStart = 0;
    std::uint64_t tag = 0;
    HttpExchange exchange;
  };
  struct Timing {
    bool enabled = false;
    Millis interval = 1000;
    Millis timeout = 1000;
    Millis firstDelay = 0;  // the first scrape: this long after the slot is first seen
  };

  ScrapeRounds();
  virtual ~ScrapeRounds();

  [[nodiscard]] virtual Timing timing(const Slot& slot) const noexcept = 0;
  [[nodiscard]] virtual HttpRequest request(const Slot& slot) const = 0;
  // A 200 response's body: false when rejected (may throw: counted as "out
  // of memory").
  virtual bool received(Slot& slot, Millis now, std::string_view body) = 0;
  virtual void failed(Slot& slot, Millis now, std::string error) noexcept = 0;

  // Socket events, timeouts, and the scrapes that are due.
  void pollRounds(Millis now) noexcept;
  // Ends a scrape in flight (its exchange aborted); nothing is recorded.
  void endScrape(Slot& slot) noexcept;
  // What pollRounds() does with a finished exchange (also for replays).
  void finishScrape(Slot& slot, Millis now) noexcept;

  // Replaces the targets (each with .id); an entry whose target `same(old,
  // new)` holds is kept with its state (the caller's `keep(entry, target)`
  // updates what may change), others start afresh; scrapes of removed or
  // replaced entries are aborted.
  template <class Entry, class Target, class Same, class Keep>
  void replaceTargets(std::vector<Target> targets, Same same, Keep keep) {
    std::unordered_map<std::uint64_t, std::unique_ptr<Slot>> old;
    for (auto& e : entries_) old.emplace(e->id, std::move(e));
    entries_.clear();
    byId_.clear();
    for (Target& t : targets) {
      if (byId_.contains(t.id)) continue;
      std::unique_ptr<Slot> entry;
      if (const auto it = old.find(t.id); it != old.end()) {
        if (same(static_cast<const Entry&>(*it->second), t)) {
          entry = std::move(it->second);
          keep(static_cast<Entry&>(*entry), t);
        }
        if (it->second) endScrape(*it->second);
        old.erase(it);
      }
      if (!entry) {
        entry = std::make_unique<Entry>(std::move(t));
        entry->id = static_cast<const Entry&>(*entry).target.id;
      }
      byId_.emplace(entry->id, entry.get());
      entries_.push_back(std::move(entry));
    }
    for (auto& [id, e] : old) endScrape(*e);
  }

  [[nodiscard]] Slot* slot(std::uint64_t id) const noexcept {
    const auto it = byId_.find(id);
    return it == byId_.end() ? nullptr : it->second;
  }

  std::string initError_;
  int epollFd_ = -1;
  std::vector<std::unique_ptr<Slot>> entries_;
  std::unordered_map<std::uint64_t, Slot*> byId_;

 private:
  void startScrape(Slot& slot, Millis now) noexcept;
  bool ingestInto(Slot& slot, Millis now, std::string_view body) noexcept;

  std::unordered_map<std::uint64_t, Slot*> byTag_;
  std::uint64_t nextTag_ = 1;
};

}  // namespace spillway
