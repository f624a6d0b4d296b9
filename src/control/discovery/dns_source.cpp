#include "control/discovery/dns_source.hpp"

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

namespace spillway {

namespace {

constexpr std::size_t kAnswerShown = 64;  // answer lines kept for `discovery`

}  // namespace

DnsSource::DnsSource(DiscoveryConfig config, std::unique_ptr<DnsResolver> resolver)
    : config_(std::move(config)), resolver_(std::move(resolver)) {
  if (!resolver_) {
    resolver_ =
        std::make_unique<CaresResolver>(config_.server, config_.serverPort, config_.timeout);
  }
}

DnsSource::~DnsSource() {
  resolver_->cancel();
}

std::string DnsSource::origin() const {
  return std::string("dns ") + dnsTypeName(config_.dnsType) + " " + config_.dnsName;
}

void DnsSource::start(Millis now) {
  ++round_;
  phase_ = Phase::Name;
  started_ = now;
  nameAnswer_.reset();
  targets_.clear();
  targetInvalid_.clear();
  const std::uint64_t round = round_;
  resolver_->query(config_.dnsName, config_.dnsType, [this, round](DnsAnswer a) {
    if (round == round_) nameAnswer_ = std::move(a);
  });
}

DiscoveryRefresh DnsSource::fail(Millis now, std::string why) {
  phase_ = Phase::Idle;
  ++round_;
  resolver_->cancel();
  next_ = now + config_.minTtl;
  DiscoveryRefresh r;
  r.read = true;
  r.error = origin() + ": " + why + "; the last good set stays (" + std::to_string(good_.size()) +
            " backends), next try in " + std::to_string(config_.minTtl) + " ms";
  return r;
}

DiscoveryRefresh DnsSource::succeed(Millis now, std::vector<DiscoveredBackend> set,
                                    std::vector<std::string> invalid, std::uint32_t ttl) {
  phase_ = Phase::Idle;
  const Millis ttlMs =
      std::clamp<Millis>(static_cast<Millis>(ttl) * 1000, config_.minTtl, config_.maxTtl);
  lastTtl_ = ttlMs;
  next_ = now + ttlMs;
  if (set.empty()) {
    DiscoveryRefresh r = fail(now, "no usable entry in the answer");
    next_ = now + config_.minTtl;
    r.invalid = std::move(invalid);
    return r;
  }
  good_ = std::move(set);
  lastGood_ = now;
  DiscoveryRefresh r;
  r.read = true;
  r.invalid = std::move(invalid);
  return r;
}

std::optional<DiscoveryRefresh> DnsSource::advance(Millis now) {
  if (phase_ == Phase::Name && nameAnswer_) {
    DnsAnswer a = std::move(*nameAnswer_);
    nameAnswer_.reset();
    if (a.status != DnsStatus::Ok) return fail(now, a.error);
    std::vector<std::string> answer;
    std::vector<std::string> invalid;
    std::uint32_t ttl = ~0U;
    if (config_.dnsType != DnsRecordType::Srv) {
      std::vector<DiscoveredBackend> set;
      std::set<std::uint64_t> seen;
      std::size_t overCap = 0;
      for (const DnsRecord& r : a.records) {
        ttl = std::min(ttl, r.ttl);
        const std::string text = formatIpAddress(r.address);
        if (answer.size() < kAnswerShown) answer.push_back(text + " ttl " + std::to_string(r.ttl));
        DiscoveredBackend b;
        b.address = r.address;
        b.id = discoveredBackendId(r.address);
        b.name = discoveredBackendName(r.address);
        if (!seen.insert(b.id).second) {
          invalid.push_back(text + " is in the answer twice");
          continue;
        }
        if (set.size() >= config_.maxEntries) {
          ++overCap;
          continue;
        }
        set.push_back(std::move(b));
      }
      if (overCap != 0) {
        invalid.push_back(std::to_string(overCap) + " addresses beyond max_entries = " +
                          std::to_string(config_.maxEntries) + " left out");
      }
      lastAnswer_ = std::move(answer);
      return succeed(now, std::move(set), std::move(invalid), ttl);
    }
    // SRV: the lowest priority's records, one per target, then their addresses.
    std::uint16_t best = 0xffff;
    for (const DnsRecord& r : a.records) best = std::min(best, r.priority);
    std::set<std::string> names;
    std::size_t overCap = 0;
    for (const DnsRecord& r : a.records) {
      if (answer.size() < kAnswerShown) {
        answer.push_back(r.target + ":" + std::to_string(r.port) + " priority " +
                         std::to_string(r.priority) + " weight " + std::to_string(r.weight) +
                         " ttl " + std::to_string(r.ttl));
      }
      if (r.priority != best) continue;
      ttl = std::min(ttl, r.ttl);
      if (r.target.empty() || r.target == ".") {
        invalid.push_back("SRV record with the target \".\" (no service there)");
        continue;
      }
      if (!names.insert(r.target).second) {
        invalid.push_back("SRV target " + r.target + " is in the answer twice");
        continue;
      }
      if (targets_.size() >= config_.maxEntries) {
        ++overCap;
        continue;
      }
      Target t;
      t.name = r.target;
      t.weight = r.weight;
      t.port = r.port;
      t.ttl = r.ttl;
      targets_.push_back(std::move(t));
    }
    if (overCap != 0) {
      invalid.push_back(std::to_string(overCap) + " SRV targets beyond max_entries = " +
                        std::to_string(config_.maxEntries) + " left out");
    }
    lastAnswer_ = std::move(answer);
    targetInvalid_ = std::move(invalid);
    if (targets_.empty()) return succeed(now, {}, std::move(targetInvalid_), ttl);
    phase_ = Phase::Targets;
    const std::uint64_t round = round_;
    for (std::size_t i = 0; i < targets_.size(); ++i) {
      targets_[i].ttl = std::min(targets_[i].ttl, ttl);
      resolver_->query(targets_[i].name, config_.targetType, [this, round, i](DnsAnswer t) {
        if (round == round_ && i < targets_.size()) targets_[i].answer = std::move(t);
      });
    }
  }
  if (phase_ == Phase::Targets) {
    const bool all = std::all_of(targets_.begin(), targets_.end(),
                                 [](const Target& t) { return t.answer.has_value(); });
    if (!all) return std::nullopt;
    std::vector<DiscoveredBackend> set;
    std::vector<std::string> invalid = std::move(targetInvalid_);
    std::set<std::uint64_t> seen;
    std::uint32_t ttl = ~0U;
    for (const Target& t : targets_) {
      const DnsAnswer& a = *t.answer;
      if (a.status == DnsStatus::NxDomain || a.status == DnsStatus::NoData) {
        invalid.push_back("SRV target " + t.name + ": " + a.error);
        continue;
      }
      if (a.status != DnsStatus::Ok) return fail(now, "SRV target " + t.name + ": " + a.error);
      ttl = std::min(ttl, t.ttl);
      for (const DnsRecord& r : a.records) {
        ttl = std::min(ttl, r.ttl);
        DiscoveredBackend b;
        b.address = r.address;
        b.id = discoveredBackendId(r.address);
        b.name = discoveredBackendName(r.address);
        b.weight = std::min<std::uint32_t>(t.weight, kMaxBackendWeight);
        if (!seen.insert(b.id).second) {
          invalid.push_back("SRV target " + t.name + ": " + formatIpAddress(r.address) +
                            " is in the answer twice");
          continue;
        }
        if (set.size() >= config_.maxEntries) {
          invalid.push_back("SRV target " + t.name + ": " + formatIpAddress(r.address) +
                            " beyond max_entries = " + std::to_string(config_.maxEntries));
          continue;
        }
        set.push_back(std::move(b));
      }
    }
    return succeed(now, std::move(set), std::move(invalid), ttl);
  }
  return std::nullopt;
}

DiscoveryRefresh DnsSource::poll(Millis now) {
  resolver_->process();
  if (auto r = advance(now)) return *r;
  if (phase_ != Phase::Idle && now >= started_ + config_.timeout) {
    return fail(now, "no answer within timeout = " + std::to_string(config_.timeout) + " ms");
  }
  if (phase_ == Phase::Idle && now >= next_) {
    start(now);
    if (auto r = advance(now)) return *r;  // an immediate failure
  }
  return {};
}

DiscoveryRefresh DnsSource::prime(Millis now) {
  // Before the control loop runs: wait (real time, at most the timeout
  // twice: the name, then SRV targets) for the first round to end.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(2 * config_.timeout + 100);
  DiscoveryRefresh r = poll(now);
  while (!r.read && inFlight() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    r = poll(now);
  }
  if (!r.read && inFlight()) {
    r = fail(now, "no answer at start within " + std::to_string(2 * config_.timeout) + " ms");
  }
  return r;
}

nlohmann::json DnsSource::describe(Millis now) const {
  nlohmann::json j{{"kind", "dns"},
                   {"name", config_.dnsName},
                   {"type", dnsTypeName(config_.dnsType)},
                   {"server", resolver_->servers()},
                   {"min_ttl_ms", config_.minTtl},
                   {"max_ttl_ms", config_.maxTtl},
                   {"timeout_ms", config_.timeout},
                   {"in_flight", inFlight()},
                   {"answer", lastAnswer_}};
  if (config_.dnsType == DnsRecordType::Srv) j["target_type"] = dnsTypeName(config_.targetType);
  j["ttl_ms"] = lastTtl_ ? nlohmann::json(*lastTtl_) : nlohmann::json(nullptr);
  j["last_good_ms_ago"] = lastGood_ ? nlohmann::json(now - *lastGood_) : nlohmann::json(nullptr);
  j["next_query_in_ms"] = inFlight() ? nlohmann::json(nullptr) : nlohmann::json(next_ - now);
  return j;
}

}  // namespace spillway
