// A discovery source as the plane sees it: polled from the control loop
// (never blocking it), it keeps the last good set of backends and says what
// each poll found. file_source.hpp (a watched file_sd file) and
// dns_source.hpp (a DNS name re-resolved by its TTL) are the two kinds.
//
// Thread contract: control thread; time is passed in.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "control/config/config.hpp"
#include "control/discovery/file_sd.hpp"

namespace spillway {

// What a poll found.
struct DiscoveryRefresh {
  bool read = false;                 // a new answer came (good or bad)
  std::optional<std::string> error;  // refused: why (the last good set stays)
  std::vector<std::string> invalid;  // entries left out
};

class DiscoveryFeed {
 public:
  virtual ~DiscoveryFeed() = default;
  // Non-blocking: what arrived since the last poll.
  virtual DiscoveryRefresh poll(Millis now) = 0;
  // At start, before the control loop runs: the first answer (a DNS source
  // waits for it, at most its timeout, so that the journal's intent meets
  // the discovered backends it names).
  virtual DiscoveryRefresh prime(Millis now) { return poll(now); }
  [[nodiscard]] virtual const DiscoveryConfig& config() const noexcept = 0;
  // The last good set (empty before the first good answer).
  [[nodiscard]] virtual const std::vector<DiscoveredBackend>& backends() const noexcept = 0;
  // The source's own fields for `spillwayctl discovery` (kind, path or name...).
  [[nodiscard]] virtual nlohmann::json describe(Millis now) const = 0;
  // "file /etc/x.json", "dns SRV _gpu._tcp.example": for messages.
  [[nodiscard]] virtual std::string origin() const = 0;
};

// The source a configuration names (kind file or dns).
[[nodiscard]] std::unique_ptr<DiscoveryFeed> makeDiscoveryFeed(const DiscoveryConfig& config);

}  // namespace spillway
