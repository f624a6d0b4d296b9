// A DNS name as a discovery source: A or AAAA records (one backend per
// address), or SRV records (target, port, weight; the targets resolved in
// turn), asked again when the answer's TTL runs out, clamped to
// [min_ttl, max_ttl]. A round that fails (timeout, NXDOMAIN, no records,
// a server error) keeps the last good set and says so; the next try comes
// after min_ttl.
//
// SRV: only the records of the lowest priority value are used (the others
// are standbys in SRV's own terms; Spillway spills by pools); each record's
// weight is its backend's weight; a target that does not exist (NXDOMAIN,
// no address) is left out and reported, a target that times out or fails
// otherwise fails the whole round (the last good set stays). The SRV port
// is shown, not used: the tunnel carries the client's destination port.
//
// A round never blocks: queries go out through the resolver and poll()
// collects what came back; a round still unanswered after `timeout` (by the
// time passed in) is abandoned.
//
// Thread contract: control thread; time is passed in.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "control/discovery/dns_resolver.hpp"
#include "control/discovery/source.hpp"

namespace spillway {

class DnsSource final : public DiscoveryFeed {
 public:
  // resolver: null for the real one (c-ares, asking config's server).
  explicit DnsSource(DiscoveryConfig config, std::unique_ptr<DnsResolver> resolver = nullptr);
  ~DnsSource() override;
  DnsSource(const DnsSource&) = delete;
  DnsSource& operator=(const DnsSource&) = delete;

  DiscoveryRefresh poll(Millis now) override;
  DiscoveryRefresh prime(Millis now) override;
  [[nodiscard]] const DiscoveryConfig& config() const noexcept override { return config_; }
  [[nodiscard]] const std::vector<DiscoveredBackend>& backends() const noexcept override {
    return good_;
  }
  [[nodiscard]] nlohmann::json describe(Millis now) const override;
  [[nodiscard]] std::string origin() const override;

  // When the next round starts (ms, the time passed in), and whether one is
  // under way.
  [[nodiscard]] Millis nextQuery() const noexcept { return next_; }
  [[nodiscard]] bool inFlight() const noexcept { return phase_ != Phase::Idle; }
  // The TTL the last good answer was re-asked by (clamped), in ms.
  [[nodiscard]] std::optional<Millis> lastTtl() const noexcept { return lastTtl_; }

 private:
  enum class Phase : std::uint8_t { Idle, Name, Targets };
  struct Target {
    std::string name;
    std::uint16_t weight = 0;
    std::uint16_t port = 0;
    std::uint32_t ttl = 0;
    std::optional<DnsAnswer> answer;
  };

  void start(Millis now);
  // Moves the round on; a refresh when it ended.
  std::optional<DiscoveryRefresh> advance(Millis now);
  DiscoveryRefresh fail(Millis now, std::string why);
  DiscoveryRefresh succeed(Millis now, std::vector<DiscoveredBackend> set,
                           std::vector<std::string> invalid, std::uint32_t ttl);

  DiscoveryConfig config_;
  std::unique_ptr<DnsResolver> resolver_;
  Phase phase_ = Phase::Idle;
  std::uint64_t round_ = 0;  // callbacks of an abandoned round are ignored
  Millis started_ = 0;
  Millis next_ = 0;  // the first poll asks
  std::optional<DnsAnswer> nameAnswer_;
  std::vector<Target> targets_;
  std::vector<std::string> targetInvalid_;
  std::vector<DiscoveredBackend> good_;
  std::optional<Millis> lastTtl_;
  std::optional<Millis> lastGood_;
  std::vector<std::string> lastAnswer_;  // "10.0.0.5 ttl 30", "gpu1.example:8000 w 10 ..."
};

}  // namespace spillway
