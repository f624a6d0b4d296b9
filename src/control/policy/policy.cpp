#include "control/policy/policy.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace spillway {

namespace {

double clamp01(double v) noexcept {
  return std::isnan(v) ? 0.0 : std::clamp(v, 0.0, 1.0);
}

std::string percent(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f%%", v * 100.0);
  return buf;
}

std::string millis(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f ms", ms);
  return buf;
}

std::uint32_t toWeight(double share) {
  if (!(share > 0)) return 0;
  const double w = std::round(share * kWeightScale);
  return static_cast<std::uint32_t>(std::clamp(w, 1.0, static_cast<double>(kWeightScale)));
}

}  // namespace

bool nextSaturated(const PolicyConfig& c, bool wasSaturated, const BackendLoad& load) noexcept {
  const bool gpuHigh = load.gpu && *load.gpu >= c.gpuHigh;
  const bool queueHigh = load.queue && *load.queue >= c.queueHigh;
  if (gpuHigh || queueHigh) return true;
  if (!wasSaturated) return false;
  const bool gpuLow = !load.gpu || *load.gpu <= c.gpuLow;
  const bool queueLow = !load.queue || *load.queue <= c.queueLow;
  return !(gpuLow && queueLow);
}

double loadFactor(const PolicyConfig& c, bool saturated, const BackendLoad& load) noexcept {
  if (!saturated) return 1.0;
  double pg = 0;
  if (load.gpu && c.gpuLow < 100.0) pg = clamp01((*load.gpu - c.gpuLow) / (100.0 - c.gpuLow));
  double pq = 0;
  const double queueSpan = 2.0 * c.queueHigh - c.queueLow;
  if (load.queue && queueSpan > 0) pq = clamp01((*load.queue - c.queueLow) / queueSpan);
  return std::max(c.minLoadFactor, 1.0 - std::max(pg, pq));
}

double quantiseLoadFactor(const PolicyConfig& c, double raw, std::optional<double> held) noexcept {
  const double step = c.loadFactorStep;
  if (!(step > 0)) return raw;
  if (held && std::abs(raw - *held) <= step * (0.5 + c.loadFactorHysteresis)) return *held;
  const double q = 1.0 - step * std::round((1.0 - raw) / step);
  return std::clamp(q, std::min(c.minLoadFactor, 1.0), 1.0);
}

std::vector<double> spillShares(std::span<const double> available, double overprovisioning) {
  std::vector<double> shares(available.size(), 0.0);
  double remaining = 1.0;
  double total = 0;
  for (std::size_t k = 0; k < available.size(); ++k) {
    const double want = std::max(0.0, available[k] * overprovisioning);
    shares[k] = std::clamp(want, 0.0, std::max(0.0, remaining));
    remaining -= shares[k];
    total += shares[k];
  }
  if (total > 0 && total < 1.0) {
    for (double& s : shares) s /= total;
  }
  return shares;
}

std::string_view toString(LatencyMark mark) noexcept {
  switch (mark) {
    case LatencyMark::Normal:
      return "normal";
    case LatencyMark::Degraded:
      return "degraded";
    case LatencyMark::Recovering:
      return "recovering";
  }
  return "?";
}

std::optional<double> medianOf(std::vector<double> values) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2.0;
}

bool isRegionLevel(const PolicyConfig& config, const PolicyInput& input, std::uint32_t priority) {
  if (config.latencyRegions == LatencyRegions::Off) return false;
  std::size_t pools = 0;
  for (const PolicyPool& p : input.pools) {
    if (p.priority != priority) continue;
    if (config.latencyRegions == LatencyRegions::Cloud && p.site != PoolSite::Cloud) return false;
    ++pools;
  }
  return pools >= 2;
}

PolicyDecision computeWeights(const PolicyConfig& config, const PolicyInput& input,
                              const std::vector<bool>& saturated,
                              std::span<const double> loadFactors, const LatencyPlan* latency) {
  PolicyDecision d;
  const std::size_t nPools = input.pools.size();
  const std::size_t n = input.backends.size();

  struct Sums {
    double eligible = 0;   // sum(w) of backends neither Disabled nor Removed
    double active = 0;     // sum(w) of Active ones
    double activeLf = 0;   // sum(w * lf) of Active ones
    double activeLfm = 0;  // sum(w * lf * m) of Active ones (m: the degraded multiplier)
  };
  std::vector<Sums> pool(nPools);
  d.pools.resize(nPools);
  for (std::size_t p = 0; p < nPools; ++p) {
    d.pools[p].name = input.pools[p].name;
    d.pools[p].priority = input.pools[p].priority;
  }
  d.backends.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const PolicyBackend& b = input.backends[i];
    BackendDecision& out = d.backends[i];
    out.id = b.id;
    out.name = b.name;
    out.saturated = i < saturated.size() && saturated[i];
    out.loadFactor =
        i < loadFactors.size()
            ? loadFactors[i]
            : quantiseLoadFactor(config, loadFactor(config, out.saturated, b.load), std::nullopt);
    out.forced = b.state != BackendState::Active;
    out.latencyMs = b.latencyMs;
    if (latency != nullptr && i < latency->weightFactors.size()) {
      out.latencyFactor = latency->weightFactors[i];
    }
    if (b.pool >= nPools) continue;  // not in any of the VIP's pools: no share
    const double w = b.weight;
    Sums& s = pool[b.pool];
    if (b.state != BackendState::Disabled && b.state != BackendState::Removed) s.eligible += w;
    if (b.state == BackendState::Active) {
      s.active += w;
      s.activeLf += w * out.loadFactor;
      s.activeLfm += w * out.loadFactor * out.latencyFactor;
      ++d.pools[b.pool].active;
      if (out.saturated) ++d.pools[b.pool].saturated;
    }
  }
  // Pool latency P: the median L of its Active backends with a known L.
  for (std::size_t p = 0; p < nPools; ++p) {
    std::vector<double> known;
    for (const PolicyBackend& b : input.backends) {
      if (b.pool == p && b.state == BackendState::Active && b.latencyMs) {
        known.push_back(*b.latencyMs);
      }
    }
    d.pools[p].latencyMs = medianOf(std::move(known));
    d.pools[p].region = isRegionLevel(config, input, input.pools[p].priority);
  }
  Sums all;
  for (std::size_t p = 0; p < nPools; ++p) {
    all.eligible += pool[p].eligible;
    all.active += pool[p].active;
    d.pools[p].healthyFraction = pool[p].eligible > 0 ? pool[p].active / pool[p].eligible : 0;
    d.pools[p].available = pool[p].eligible > 0 ? pool[p].activeLf / pool[p].eligible : 0;
  }
  d.healthyCapacity = all.eligible > 0 ? all.active / all.eligible : 0;
  d.panic = d.healthyCapacity < config.panicThreshold;

  // Every backend's share of new flows.
  std::vector<double> share(n, 0.0);
  if (d.panic) {
    for (std::size_t i = 0; i < n; ++i) {
      const PolicyBackend& b = input.backends[i];
      if (b.pool < nPools && b.state == BackendState::Active && all.active > 0) {
        share[i] = b.weight / all.active;
      }
    }
  } else {
    // Priority levels, lowest priority value first.
    std::vector<std::uint32_t> priorities;
    for (const PolicyPool& p : input.pools) priorities.push_back(p.priority);
    std::sort(priorities.begin(), priorities.end());
    priorities.erase(std::unique(priorities.begin(), priorities.end()), priorities.end());
    std::vector<Sums> level(priorities.size());
    std::vector<std::size_t> levelOf(nPools);
    for (std::size_t p = 0; p < nPools; ++p) {
      levelOf[p] = static_cast<std::size_t>(
          std::lower_bound(priorities.begin(), priorities.end(), input.pools[p].priority) -
          priorities.begin());
      level[levelOf[p]].eligible += pool[p].eligible;
      level[levelOf[p]].active += pool[p].active;
      level[levelOf[p]].activeLf += pool[p].activeLf;
      level[levelOf[p]].activeLfm += pool[p].activeLfm;
    }
    std::vector<double> available(level.size());
    for (std::size_t k = 0; k < level.size(); ++k) {
      available[k] = level[k].eligible > 0 ? level[k].activeLf / level[k].eligible : 0;
    }
    const std::vector<double> levelShare = spillShares(available, config.overprovisioning);
    // Region levels: the level's share fills its regions in order, each up
    // to its capacity c_p; poolShare < 0 marks pools that share by level.
    std::vector<double> poolShare(nPools, -1.0);
    if (latency != nullptr) {
      for (const auto& [priority, order] : latency->regionOrder) {
        const auto it = std::lower_bound(priorities.begin(), priorities.end(), priority);
        if (it == priorities.end() || *it != priority || order.empty()) continue;
        const std::size_t k = static_cast<std::size_t>(it - priorities.begin());
        std::vector<double> fill;
        for (const std::uint32_t p : order) {
          const double cap = level[k].eligible > 0
                                 ? config.overprovisioning * pool[p].activeLf / level[k].eligible
                                 : 0.0;
          fill.push_back(levelShare[k] > 0 ? cap / levelShare[k] : 0.0);
        }
        const std::vector<double> fraction = spillShares(fill, 1.0);
        for (std::size_t j = 0; j < order.size(); ++j) {
          poolShare[order[j]] = levelShare[k] * fraction[j];
        }
        d.pools[order.front()].preferred = true;
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      const PolicyBackend& b = input.backends[i];
      if (b.pool >= nPools || b.state != BackendState::Active) continue;
      const double wlfm = b.weight * d.backends[i].loadFactor * d.backends[i].latencyFactor;
      if (poolShare[b.pool] >= 0) {
        if (pool[b.pool].activeLfm > 0) {
          share[i] = poolShare[b.pool] * wlfm / pool[b.pool].activeLfm;
        }
        continue;
      }
      const std::size_t k = levelOf[b.pool];
      if (level[k].activeLfm > 0) share[i] = levelShare[k] * wlfm / level[k].activeLfm;
    }
  }

  d.empty = true;
  for (std::size_t i = 0; i < n; ++i) {
    BackendDecision& out = d.backends[i];
    out.share = share[i];
    out.weight = toWeight(share[i]);
    if (out.weight > 0) d.empty = false;
    if (input.backends[i].pool < nPools) d.pools[input.backends[i].pool].share += share[i];
  }

  // The summary: "panic: ..." or "onprem 86% (...), cloud 14% (...)".
  std::string& s = d.summary;
  if (d.empty) {
    s = "no backend takes new flows (none Active): the table is empty";
  } else if (d.panic) {
    std::uint32_t active = 0;
    for (const PoolDecision& p : d.pools) active += p.active;
    s = "panic: " + percent(d.healthyCapacity) + " healthy < " + percent(config.panicThreshold) +
        " threshold; new flows spread over all " + std::to_string(active) +
        " active backends by base weight";
  } else {
    for (const PoolDecision& p : d.pools) {
      if (!s.empty()) s += ", ";
      s += p.name + " " + percent(p.share) + " (healthy " + percent(p.healthyFraction) +
           ", available " + percent(p.available);
      if (p.saturated > 0) {
        s += ", " + std::to_string(p.saturated) + "/" + std::to_string(p.active) + " saturated";
      }
      if (p.region && p.latencyMs) s += ", latency " + millis(*p.latencyMs);
      if (p.preferred) s += ", preferred region";
      s += ")";
    }
  }
  return d;
}

PolicyDecision WeightPolicy::decide(const PolicyInput& input) {
  std::vector<bool> flags(input.backends.size());
  std::vector<double> factors(input.backends.size(), 1.0);
  for (std::size_t i = 0; i < input.backends.size(); ++i) {
    const PolicyBackend& b = input.backends[i];
    bool& state = saturated_[b.id];
    state = nextSaturated(config_, state, b.load);
    flags[i] = state;
    if (!state) {
      heldLoadFactor_.erase(b.id);
      continue;
    }
    const auto held = heldLoadFactor_.find(b.id);
    factors[i] = quantiseLoadFactor(
        config_, loadFactor(config_, true, b.load),
        held == heldLoadFactor_.end() ? std::nullopt : std::optional(held->second));
    heldLoadFactor_[b.id] = factors[i];
  }
  updateDegraded(input);
  LatencyPlan plan = updateRegions(input);
  plan.weightFactors.resize(input.backends.size(), 1.0);
  for (std::size_t i = 0; i < input.backends.size(); ++i) {
    plan.weightFactors[i] = latencyFactor(input.backends[i].id);
  }
  PolicyDecision d = computeWeights(config_, input, flags, factors, &plan);
  for (BackendDecision& b : d.backends) {
    const auto it = latency_.find(b.id);
    if (it == latency_.end()) continue;
    b.latency = it->second.mark;
    b.latencyBoundMs = it->second.boundMs;
  }
  for (std::size_t i = 0; i < d.backends.size(); ++i) {  // in input order
    const std::uint32_t pool = input.backends[i].pool;
    if (d.backends[i].latency == LatencyMark::Degraded && pool < d.pools.size()) {
      ++d.pools[pool].degraded;
    }
  }
  return d;
}

void WeightPolicy::updateDegraded(const PolicyInput& input) {
  const std::uint64_t window = input.latencyWindow;
  if (window == 0) return;
  const PolicyConfig& c = config_;
  for (std::uint32_t p = 0; p < input.pools.size(); ++p) {
    std::vector<std::size_t> members;  // neither Disabled nor Removed
    for (std::size_t i = 0; i < input.backends.size(); ++i) {
      const PolicyBackend& b = input.backends[i];
      if (b.pool == p && b.state != BackendState::Disabled && b.state != BackendState::Removed) {
        members.push_back(i);
      }
    }
    std::vector<bool> due(members.size(), false);
    bool any = false;
    for (std::size_t j = 0; j < members.size(); ++j) {
      const BackendLatency& st = latency_[input.backends[members[j]].id];
      due[j] = !st.counted || st.window < window;
      any = any || due[j];
    }
    if (!any) continue;  // this window was counted (another VIP, another call)

    // Count this window: above or below the bound.
    for (std::size_t j = 0; j < members.size(); ++j) {
      if (!due[j]) continue;
      const PolicyBackend& b = input.backends[members[j]];
      BackendLatency& st = latency_[b.id];
      st.window = window;
      st.counted = true;
      st.latencyMs = b.latencyMs;
      if (b.state != BackendState::Active || !b.latencyMs) continue;  // unknown: no change
      std::vector<double> peers;
      for (const std::size_t other : members) {
        const PolicyBackend& o = input.backends[other];
        if (o.id != b.id && o.state == BackendState::Active && o.latencyMs) {
          peers.push_back(*o.latencyMs);
        }
      }
      double bound = std::numeric_limits<double>::infinity();
      if (c.degradedLatencyMs > 0) bound = c.degradedLatencyMs;
      if (const auto median = medianOf(std::move(peers)); median && c.degradedLatencyFactor > 0) {
        bound =
            std::min(bound, std::max(c.degradedLatencyFactor * *median, c.degradedLatencyMinMs));
      }
      st.boundMs = std::isfinite(bound) ? std::optional(bound) : std::nullopt;
      if (*b.latencyMs > bound) {
        ++st.above;
        st.below = 0;
      } else {
        ++st.below;
        st.above = 0;
      }
    }

    // Who is degraded: those above their bound for degraded_windows (or
    // degraded and not yet below it that long), the worst first, at most
    // floor(degraded_max_fraction * members).
    struct Want {
      std::uint64_t id;
      double severity;
      bool degraded;
    };
    std::vector<Want> want;
    for (const std::size_t i : members) {
      const BackendLatency& st = latency_[input.backends[i].id];
      const bool sustained = st.above >= c.degradedWindows;
      const bool held = st.mark == LatencyMark::Degraded && st.below < c.degradedWindows;
      if (!sustained && !held) continue;
      const double severity =
          st.latencyMs && st.boundMs && *st.boundMs > 0 ? *st.latencyMs / *st.boundMs : 0.0;
      want.push_back({input.backends[i].id, severity, st.mark == LatencyMark::Degraded});
    }
    std::sort(want.begin(), want.end(), [](const Want& a, const Want& b) {
      if (a.severity != b.severity) return a.severity > b.severity;
      if (a.degraded != b.degraded) return a.degraded;
      return a.id < b.id;
    });
    const auto cap = static_cast<std::size_t>(
        std::floor(c.degradedMaxFraction * static_cast<double>(members.size()) + 1e-9));
    if (want.size() > cap) want.resize(cap);
    for (std::size_t j = 0; j < members.size(); ++j) {
      const std::uint64_t id = input.backends[members[j]].id;
      BackendLatency& st = latency_[id];
      const bool chosen =
          std::any_of(want.begin(), want.end(), [&](const Want& w) { return w.id == id; });
      if (chosen) {
        st.mark = LatencyMark::Degraded;
        st.factor = c.degradedWeight;
      } else if (st.mark != LatencyMark::Normal && due[j]) {
        st.factor = std::min(1.0, st.factor + c.degradedRestoreStep);
        st.mark = st.factor >= 1.0 ? LatencyMark::Normal : LatencyMark::Recovering;
      }
    }
  }
}

LatencyPlan WeightPolicy::updateRegions(const PolicyInput& input) {
  LatencyPlan plan;
  const PolicyConfig& c = config_;
  std::vector<std::uint32_t> priorities;
  for (const PolicyPool& p : input.pools) priorities.push_back(p.priority);
  std::sort(priorities.begin(), priorities.end());
  priorities.erase(std::unique(priorities.begin(), priorities.end()), priorities.end());
  for (const std::uint32_t k : priorities) {
    if (!isRegionLevel(c, input, k)) continue;
    struct Region {
      std::uint32_t pool;
      std::optional<double> latency;
      std::uint32_t active = 0;
    };
    std::vector<Region> regions;
    for (std::uint32_t p = 0; p < input.pools.size(); ++p) {
      if (input.pools[p].priority != k) continue;
      Region r{p, std::nullopt, 0};
      std::vector<double> known;
      for (const PolicyBackend& b : input.backends) {
        if (b.pool != p || b.state != BackendState::Active) continue;
        ++r.active;
        if (b.latencyMs) known.push_back(*b.latencyMs);
      }
      r.latency = medianOf(std::move(known));
      regions.push_back(r);
    }
    const auto nameOf = [&](const Region& r) -> const std::string& {
      return input.pools[r.pool].name;
    };
    // The best region with an Active backend and a known latency (lowest P,
    // then the first in the input), other than `except`.
    const auto best = [&](const std::string* except) -> const Region* {
      const Region* out = nullptr;
      for (const Region& r : regions) {
        if (r.active == 0 || !r.latency || (except != nullptr && nameOf(r) == *except)) continue;
        if (out == nullptr || *r.latency < *out->latency) out = &r;
      }
      return out;
    };
    RegionChoice& rc = regions_[{input.vip, k}];
    const bool due = input.latencyWindow != 0 && (!rc.counted || rc.window < input.latencyWindow);
    if (due) {
      rc.window = input.latencyWindow;
      rc.counted = true;
      const Region* pref = nullptr;
      for (const Region& r : regions) {
        if (nameOf(r) == rc.preferred) pref = &r;
      }
      const Region* top = best(nullptr);
      if (pref == nullptr) {
        // The first choice: once every region with an Active backend has a
        // latency, or region_switch_windows windows after the first did.
        rc.preferred.clear();
        rc.challenger.clear();
        rc.held = 0;
        if (top != nullptr) {
          const bool all = std::all_of(regions.begin(), regions.end(), [](const Region& r) {
            return r.active == 0 || r.latency.has_value();
          });
          ++rc.waited;
          if (all || rc.waited > c.regionSwitchWindows) {
            rc.preferred = nameOf(*top);
            rc.waited = 0;
          }
        }
      } else if (pref->active == 0) {
        // Nothing there takes new flows: the best known region at once.
        if (top != nullptr) rc.preferred = nameOf(*top);
        rc.challenger.clear();
        rc.held = 0;
      } else if (!pref->latency) {
        rc.challenger.clear();  // unknown: no change
        rc.held = 0;
      } else {
        const Region* q = best(&rc.preferred);
        const double margin =
            std::max(c.regionSwitchMargin * *pref->latency, c.regionSwitchMarginMs);
        if (q != nullptr && *q->latency < *pref->latency - margin) {
          if (rc.challenger == nameOf(*q)) {
            ++rc.held;
          } else {
            rc.challenger = nameOf(*q);
            rc.held = 1;
          }
          if (rc.held >= c.regionSwitchWindows) {
            rc.preferred = rc.challenger;
            rc.challenger.clear();
            rc.held = 0;
          }
        } else {
          rc.challenger.clear();
          rc.held = 0;
        }
      }
      // The fill order: preferred first, the rest by latency (unknown last).
      rc.order.clear();
      if (!rc.preferred.empty()) {
        std::vector<const Region*> rest;
        for (const Region& r : regions) {
          if (nameOf(r) != rc.preferred) rest.push_back(&r);
        }
        std::stable_sort(rest.begin(), rest.end(), [](const Region* a, const Region* b) {
          if (a->latency.has_value() != b->latency.has_value()) return a->latency.has_value();
          return a->latency && *a->latency < *b->latency;
        });
        rc.order.push_back(rc.preferred);
        for (const Region* r : rest) rc.order.push_back(nameOf(*r));
      }
    }
    if (rc.order.empty()) continue;
    std::vector<std::uint32_t> order;
    for (const std::string& name : rc.order) {
      for (const Region& r : regions) {
        if (nameOf(r) == name) order.push_back(r.pool);
      }
    }
    for (const Region& r : regions) {  // a region new since the last window: last
      if (std::find(order.begin(), order.end(), r.pool) == order.end()) order.push_back(r.pool);
    }
    if (!order.empty() && input.pools[order.front()].name == rc.preferred) {
      plan.regionOrder[k] = std::move(order);
    }
  }
  return plan;
}

LatencyMark WeightPolicy::latencyMark(std::uint64_t id) const {
  const auto it = latency_.find(id);
  return it == latency_.end() ? LatencyMark::Normal : it->second.mark;
}

double WeightPolicy::latencyFactor(std::uint64_t id) const {
  const auto it = latency_.find(id);
  return it == latency_.end() ? 1.0 : it->second.factor;
}

std::string WeightPolicy::preferredRegion(const std::string& vip, std::uint32_t priority) const {
  const auto it = regions_.find({vip, priority});
  return it == regions_.end() ? std::string() : it->second.preferred;
}

bool WeightPolicy::saturated(std::uint64_t id) const {
  auto it = saturated_.find(id);
  return it != saturated_.end() && it->second;
}

std::vector<PolicyNote> policyNotes(const PolicyDecision* before, const PolicyDecision& after,
                                    double shareStep) {
  std::vector<PolicyNote> notes;
  const bool wasPanic = before != nullptr && before->panic;
  if (after.panic != wasPanic) {
    notes.push_back({"panic", "",
                     after.panic ? "entered: " + after.summary
                                 : "left: " + percent(after.healthyCapacity) + " healthy"});
  }
  if (before != nullptr) {
    for (const PoolDecision& p : after.pools) {
      for (const PoolDecision& q : before->pools) {
        if (q.name != p.name) continue;
        if (std::abs(p.share - q.share) >= shareStep) {
          notes.push_back({"spillover", p.name,
                           "share of new flows " + percent(q.share) + " -> " + percent(p.share) +
                               " (healthy " + percent(p.healthyFraction) + ", available " +
                               percent(p.available) + ", " + std::to_string(p.saturated) + "/" +
                               std::to_string(p.active) + " saturated)"});
        }
        break;
      }
    }
  }
  if (before != nullptr) {
    for (const PoolDecision& p : after.pools) {
      if (!p.preferred) continue;
      bool was = false;
      bool had = false;  // the level had a preferred region before
      for (const PoolDecision& q : before->pools) {
        if (q.priority != p.priority) continue;
        had = had || q.preferred;
        if (q.name == p.name) was = q.preferred;
      }
      if (was) continue;
      std::string others;
      for (const PoolDecision& q : after.pools) {
        if (q.priority != p.priority || q.name == p.name) continue;
        others += ", " + q.name + " " + (q.latencyMs ? millis(*q.latencyMs) : "unknown");
      }
      notes.push_back({"latency", p.name,
                       std::string(had ? "preferred region now" : "preferred region") +
                           " (latency " + (p.latencyMs ? millis(*p.latencyMs) : "unknown") +
                           others + "): new spilled flows of its level go there first"});
    }
  }
  for (const BackendDecision& b : after.backends) {
    LatencyMark wasMark = LatencyMark::Normal;
    if (before != nullptr) {
      for (const BackendDecision& c : before->backends) {
        if (c.id == b.id) wasMark = c.latency;
      }
    }
    if (b.latency == wasMark) continue;
    char factor[32];
    std::snprintf(factor, sizeof factor, "%.2f", b.latencyFactor);
    const std::string seen =
        (b.latencyMs ? "latency " + millis(*b.latencyMs) : std::string("latency unknown")) +
        (b.latencyBoundMs ? ", bound " + millis(*b.latencyBoundMs) : std::string());
    if (b.latency == LatencyMark::Degraded) {
      notes.push_back({"latency", b.name,
                       "degraded (" + seen + "): weight x " + factor +
                           " for new flows; never ejected for latency"});
    } else if (b.latency == LatencyMark::Recovering && wasMark == LatencyMark::Degraded) {
      notes.push_back({"latency", b.name, "recovering (" + seen + "): weight x " + factor});
    } else if (b.latency == LatencyMark::Normal) {
      notes.push_back({"latency", b.name, "restored (" + seen + "): weight x 1"});
    }
  }
  for (const BackendDecision& b : after.backends) {
    bool was = false;
    if (before != nullptr) {
      for (const BackendDecision& c : before->backends) {
        if (c.id == b.id) {
          was = c.saturated;
          break;
        }
      }
    }
    if (b.saturated != was) {
      char lf[32];
      std::snprintf(lf, sizeof lf, "%.2f", b.loadFactor);
      notes.push_back({"weight", b.name,
                       b.saturated ? "saturated: load factor " + std::string(lf)
                                   : "no longer saturated: load factor 1"});
    }
  }
  return notes;
}

std::uint32_t churnBudgetEntries(double churnBudget, std::uint32_t tableSize) noexcept {
  const double e = std::floor(clamp01(churnBudget) * tableSize);
  return std::max<std::uint32_t>(1, static_cast<std::uint32_t>(e));
}

ChurnStep limitChurn(std::span<const std::uint32_t> current, std::span<const std::uint32_t> target,
                     const std::vector<bool>& forced, std::uint32_t budgetEntries,
                     const ChangedEntries& changedEntries) {
  const std::size_t n = std::max(current.size(), target.size());
  std::vector<double> base(n, 0.0);
  std::vector<double> goal(n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    goal[i] = i < target.size() ? target[i] : 0;
    const bool force = i < forced.size() && forced[i];
    base[i] = force ? goal[i] : (i < current.size() ? current[i] : 0);
  }
  const auto at = [&](double t) {
    std::vector<std::uint32_t> w(n);
    for (std::size_t i = 0; i < n; ++i) {
      w[i] = t >= 1.0 ? static_cast<std::uint32_t>(goal[i])
                      : static_cast<std::uint32_t>(std::llround(base[i] + (goal[i] - base[i]) * t));
    }
    return w;
  };

  ChurnStep out;
  std::vector<std::uint32_t> baseWeights = at(0.0);
  out.mandatoryChanged = changedEntries(baseWeights);
  const std::uint64_t allowed = std::uint64_t{out.mandatoryChanged} + budgetEntries;
  out.weights = at(1.0);
  if (out.weights == baseWeights) {
    out.predictedChanged = out.mandatoryChanged;
    return out;
  }
  out.predictedChanged = changedEntries(out.weights);
  if (out.predictedChanged <= allowed) return out;

  out.limited = true;
  double lo = 0.0;
  double hi = 1.0;
  std::vector<std::uint32_t> best = baseWeights;
  std::uint32_t bestChanged = out.mandatoryChanged;
  const auto probe = [&](double t) {
    std::vector<std::uint32_t> w = at(t);
    const std::uint32_t c = changedEntries(w);
    if (c <= allowed) {
      lo = t;
      best = std::move(w);
      bestChanged = c;
      return true;
    }
    hi = t;
    return false;
  };
  for (int i = 0; i < 8; ++i) probe((lo + hi) / 2);
  for (int i = 0; i < 6 && lo == 0.0; ++i) probe(hi / 2);
  // A step too small to change any rounded weight is no step.
  out.step = best == baseWeights ? 0.0 : lo;
  out.weights = std::move(best);
  out.predictedChanged = bestChanged;
  return out;
}

std::vector<std::uint32_t> weightsOf(const PolicyDecision& decision) {
  std::vector<std::uint32_t> w;
  w.reserve(decision.backends.size());
  for (const BackendDecision& b : decision.backends) w.push_back(b.weight);
  return w;
}

std::vector<bool> forcedOf(const PolicyDecision& decision) {
  std::vector<bool> f;
  f.reserve(decision.backends.size());
  for (const BackendDecision& b : decision.backends) f.push_back(b.forced);
  return f;
}

}  // namespace spillway
