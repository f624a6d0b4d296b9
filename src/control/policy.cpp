#include "control/policy.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

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

PolicyDecision computeWeights(const PolicyConfig& config, const PolicyInput& input,
                              const std::vector<bool>& saturated,
                              std::span<const double> loadFactors) {
  PolicyDecision d;
  const std::size_t nPools = input.pools.size();
  const std::size_t n = input.backends.size();

  struct Sums {
    double eligible = 0;  // sum(w) of backends neither Disabled nor Removed
    double active = 0;    // sum(w) of Active ones
    double activeLf = 0;  // sum(w * lf) of Active ones
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
    if (b.pool >= nPools) continue;  // not in any of the VIP's pools: no share
    const double w = b.weight;
    Sums& s = pool[b.pool];
    if (b.state != BackendState::Disabled && b.state != BackendState::Removed) s.eligible += w;
    if (b.state == BackendState::Active) {
      s.active += w;
      s.activeLf += w * out.loadFactor;
      ++d.pools[b.pool].active;
      if (out.saturated) ++d.pools[b.pool].saturated;
    }
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
    }
    std::vector<double> available(level.size());
    for (std::size_t k = 0; k < level.size(); ++k) {
      available[k] = level[k].eligible > 0 ? level[k].activeLf / level[k].eligible : 0;
    }
    const std::vector<double> levelShare = spillShares(available, config.overprovisioning);
    for (std::size_t i = 0; i < n; ++i) {
      const PolicyBackend& b = input.backends[i];
      if (b.pool >= nPools || b.state != BackendState::Active) continue;
      const std::size_t k = levelOf[b.pool];
      if (level[k].activeLf > 0) {
        share[i] = levelShare[k] * b.weight * d.backends[i].loadFactor / level[k].activeLf;
      }
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
  return computeWeights(config_, input, flags, factors);
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
