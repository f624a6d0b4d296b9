#include "control/snapshot_builder.hpp"

#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <set>
#include <utility>

namespace spillway {
namespace {

bool sameInput(const std::vector<MaglevBackend>& a, const std::vector<MaglevBackend>& b) {
  return std::equal(
      a.begin(), a.end(), b.begin(), b.end(), [](const MaglevBackend& x, const MaglevBackend& y) {
        return x.id == y.id && x.weight == y.weight && x.backendIndex == y.backendIndex;
      });
}

BackendRuntime initialRuntime(const Config& config, const BackendConfig& b) {
  BackendRuntime r;
  r.state = b.initialState;
  r.effectiveWeight = b.weight;
  if (auto s = staticNextHop(config, b)) r.nextHopMac = s->mac;
  return r;
}

}  // namespace

std::optional<std::string> SnapshotBuilder::setConfig(Config config) {
  std::vector<const BackendConfig*> fresh;
  for (const BackendConfig& b : config.backends) {
    if (backends_.find(b.id) == backends_.end()) fresh.push_back(&b);
  }
  const std::size_t used = idByIndex_.size() - 1;
  if (used + fresh.size() > kMaxBackendIndex) {
    return "backend indices exhausted: " + std::to_string(used) + " in use, " +
           std::to_string(fresh.size()) + " new, at most " + std::to_string(kMaxBackendIndex) +
           " per process; restart spillwayd";
  }

  // Port bindings follow the port's name.
  std::vector<PortBinding> ports(config.ports.size());
  for (std::size_t i = 0; i < config.ports.size(); ++i) {
    for (std::size_t j = 0; j < config_.ports.size() && j < ports_.size(); ++j) {
      if (config_.ports[j].name == config.ports[i].name) ports[i] = ports_[j];
    }
  }

  std::set<std::uint64_t> present;
  for (std::uint32_t ci = 0; ci < config.backends.size(); ++ci) {
    const BackendConfig& now = config.backends[ci];
    present.insert(now.id);
    auto it = backends_.find(now.id);
    if (it == backends_.end()) continue;
    Backend& b = it->second;
    if (!b.configIndex) {
      b.runtime = initialRuntime(config, now);  // reappears
    } else {
      const BackendConfig& was = config_.backends[*b.configIndex];
      if (was.weight != now.weight) b.runtime.effectiveWeight = now.weight;
      if (was.initialState != now.initialState) b.runtime.state = now.initialState;
      auto staticNow = staticNextHop(config, now);
      auto staticWas = staticNextHop(config_, was);
      const bool pathChanged = !(was.address == now.address) || was.port != now.port ||
                               (staticNow ? staticNow->mac : std::nullopt) !=
                                   (staticWas ? staticWas->mac : std::nullopt);
      if (staticNow) {
        b.runtime.nextHopMac = staticNow->mac;
      } else if (pathChanged) {
        b.runtime.nextHopMac.reset();
      }
    }
    b.configIndex = ci;
  }
  for (auto& [id, b] : backends_) {
    if (present.count(id) == 0 && b.configIndex) {
      b.configIndex.reset();
      b.runtime.state = BackendState::Removed;
    }
  }
  std::sort(fresh.begin(), fresh.end(),
            [](const BackendConfig* x, const BackendConfig* y) { return x->id < y->id; });
  for (const BackendConfig* f : fresh) {
    Backend b;
    b.index = static_cast<std::uint32_t>(idByIndex_.size());
    b.configIndex = static_cast<std::uint32_t>(f - config.backends.data());
    b.runtime = initialRuntime(config, *f);
    idByIndex_.push_back(f->id);
    backends_.emplace(f->id, std::move(b));
  }

  config_ = std::move(config);
  ports_ = std::move(ports);
  return std::nullopt;
}

void SnapshotBuilder::setPortMac(std::uint32_t portIndex, const MacAddress& mac) {
  if (portIndex < ports_.size()) ports_[portIndex].mac = mac;
}

void SnapshotBuilder::setPortId(std::uint32_t portIndex, std::uint16_t dpdkPortId) {
  if (portIndex < ports_.size()) ports_[portIndex].id = dpdkPortId;
}

SnapshotBuilder::Backend* SnapshotBuilder::find(std::uint64_t id) {
  auto it = backends_.find(id);
  return it == backends_.end() || !it->second.configIndex ? nullptr : &it->second;
}

bool SnapshotBuilder::setState(std::uint64_t id, BackendState state) {
  Backend* b = find(id);
  if (b == nullptr) return false;
  b->runtime.state = state;
  return true;
}

bool SnapshotBuilder::setEffectiveWeight(std::uint64_t id, std::uint32_t weight) {
  Backend* b = find(id);
  if (b == nullptr || weight > kMaxBackendWeight) return false;
  b->runtime.effectiveWeight = weight;
  return true;
}

bool SnapshotBuilder::setNextHopMac(std::uint64_t id, std::optional<MacAddress> mac) {
  Backend* b = find(id);
  if (b == nullptr) return false;
  b->runtime.nextHopMac = mac;
  return true;
}

std::size_t SnapshotBuilder::refreshNextHops(const NeighbourResolver& resolver) {
  std::size_t changed = 0;
  for (auto& [id, b] : backends_) {
    if (!b.configIndex) continue;
    const NextHop hop = resolver.resolve(config_, config_.backends[*b.configIndex]);
    if (hop.mac && hop.mac != b.runtime.nextHopMac) {
      b.runtime.nextHopMac = hop.mac;
      ++changed;
    }
  }
  return changed;
}

const BackendRuntime* SnapshotBuilder::runtime(std::uint64_t id) const {
  auto it = backends_.find(id);
  return it == backends_.end() ? nullptr : &it->second.runtime;
}

std::uint32_t SnapshotBuilder::indexOf(std::uint64_t id) const {
  auto it = backends_.find(id);
  return it == backends_.end() ? 0 : it->second.index;
}

std::optional<MacAddress> SnapshotBuilder::ourMac(std::uint32_t portIndex) const {
  if (portIndex < ports_.size() && ports_[portIndex].mac) return ports_[portIndex].mac;
  if (portIndex < config_.ports.size()) return config_.ports[portIndex].mac;
  return std::nullopt;
}

// Whether the backend is in the tables. Deliberately not whether its next hop
// is resolved: the tables must be the same on every instance and across
// restarts (a pure function of ids, weights, states and seed), and a MAC
// being learnt must not send flows elsewhere for good. Packets to a backend
// whose MAC is still unknown are dropped and counted by the data path until
// it resolves.
bool SnapshotBuilder::takesNewFlows(const Backend& b) const {
  return b.configIndex && b.runtime.state == BackendState::Active;
}

SnapshotBackend SnapshotBuilder::snapshotBackend(const Backend& b) const {
  const BackendConfig& c = config_.backends[*b.configIndex];
  const PortConfig& port = config_.ports[c.portIndex];
  const PoolConfig& pool = config_.pools[c.poolIndex];
  SnapshotBackend s;
  s.id = c.id;
  s.state = b.runtime.state;
  s.egressPort = c.portIndex < ports_.size() && ports_[c.portIndex].id
                     ? *ports_[c.portIndex].id
                     : static_cast<std::uint16_t>(c.portIndex);
  EncapTarget& e = s.encap;
  e.kind = encapKindFor(pool.encap, c.address.version);
  const std::optional<IpAddress>& source =
      c.address.version == IpVersion::V4 ? port.address : port.address6;
  if (source) e.source = source->bytes;  // loadConfig guarantees it
  e.backend = c.address.bytes;
  e.nextHopMac = b.runtime.nextHopMac.value_or(MacAddress{});
  s.nextHopResolved = b.runtime.nextHopMac.has_value() &&
                      ourMac(config_.backends[*b.configIndex].portIndex).has_value();
  e.ourMac = ourMac(c.portIndex).value_or(MacAddress{});
  e.vlanTci = port.vlan;
  e.gueDstPort = pool.guePort;
  e.mtu = port.mtu;
  return s;
}

std::vector<MaglevBackend> SnapshotBuilder::tableInput(
    const VipConfig& v, const std::map<std::uint64_t, std::uint32_t>* weights) const {
  std::vector<MaglevBackend> input;
  auto overrides = vipWeights_.find(v.name);
  for (const BackendConfig& c : config_.backends) {
    if (std::find(v.poolIndices.begin(), v.poolIndices.end(), c.poolIndex) ==
        v.poolIndices.end()) {
      continue;
    }
    const Backend& b = backends_.at(c.id);
    std::uint32_t w = b.runtime.effectiveWeight;
    if (weights != nullptr) {
      auto it = weights->find(c.id);
      if (it != weights->end()) w = it->second;
    } else if (overrides != vipWeights_.end()) {
      auto it = overrides->second.find(c.id);
      if (it != overrides->second.end()) w = it->second;
    }
    input.push_back(MaglevBackend{c.id, takesNewFlows(b) ? w : 0, b.index});
  }
  std::sort(input.begin(), input.end(),
            [](const MaglevBackend& x, const MaglevBackend& y) { return x.id < y.id; });
  return input;
}

void SnapshotBuilder::setVipWeights(const std::string& vip,
                                    std::map<std::uint64_t, std::uint32_t> weights) {
  vipWeights_[vip] = std::move(weights);
}

void SnapshotBuilder::clearVipWeights() { vipWeights_.clear(); }

const MaglevTable* SnapshotBuilder::currentTable(const std::string& vip) const {
  auto it = previous_.find(vip);
  return it == previous_.end() ? nullptr : &it->second.table;
}

std::optional<std::uint32_t> SnapshotBuilder::predictChanged(
    const std::string& vip, const std::map<std::uint64_t, std::uint32_t>& weights) {
  const VipConfig* v = nullptr;
  for (const VipConfig& c : config_.vips) {
    if (c.name == vip) v = &c;
  }
  if (v == nullptr) return std::nullopt;
  const std::vector<MaglevBackend> input = tableInput(*v, &weights);
  const MaglevTable* before = currentTable(vip);
  MaglevBuildResult result =
      maglev_.build(input, FlowHasher(config_.dataplane.hashSeed), v->tableSize, before);
  if (!result) return std::nullopt;
  return result.value().changed;
}

std::unique_ptr<ForwardingSnapshot> SnapshotBuilder::build(std::uint64_t generation) {
  lastError_.clear();
  auto snapshot = std::make_unique<ForwardingSnapshot>();
  snapshot->generation = generation;
  snapshot->backends.resize(idByIndex_.size());
  for (auto& [id, b] : backends_) {
    if (b.configIndex) {
      b.last = snapshotBackend(b);
    } else {
      b.last.id = id;
      b.last.state = BackendState::Removed;
    }
    snapshot->backends[b.index] = b.last;
  }

  const std::uint64_t seed = config_.dataplane.hashSeed;
  const FlowHasher hasher(seed);
  const std::size_t n = config_.vips.size();
  std::vector<VipBuildReport> reports(n);
  std::vector<std::vector<MaglevBackend>> inputs(n);
  std::vector<const PreviousVip*> before(n, nullptr);
  std::vector<std::size_t> toBuild;
  snapshot->vips.resize(n);
  snapshot->vipsOfBackend.resize(idByIndex_.size());
  snapshot->exceptions = exceptions_;
  for (std::size_t i = 0; i < n; ++i) {
    const VipConfig& v = config_.vips[i];
    inputs[i] = tableInput(v, nullptr);
    for (const MaglevBackend& m : inputs[i]) {
      if (m.backendIndex < snapshot->vipsOfBackend.size()) {
        snapshot->vipsOfBackend[m.backendIndex].push_back(static_cast<std::uint32_t>(i));
      }
    }
    SnapshotVip& sv = snapshot->vips[i];
    sv.key =
        VipKey{v.address.bytes, v.address.version, static_cast<std::uint8_t>(v.protocol), v.port};
    sv.name = v.name;
    sv.answerEcho = v.answerPing;
    VipBuildReport& r = reports[i];
    r.name = v.name;
    r.tableSize = v.tableSize;
    auto prev = previous_.find(v.name);
    before[i] = prev == previous_.end() ? nullptr : &prev->second;
    if (before[i] != nullptr && before[i]->tableSize == v.tableSize && before[i]->seed == seed &&
        sameInput(before[i]->input, inputs[i])) {
      sv.table = before[i]->table;
      r.shares = before[i]->shares;
      r.allNone = std::all_of(inputs[i].begin(), inputs[i].end(),
                              [](const MaglevBackend& m) { return m.weight == 0; });
      continue;
    }
    toBuild.push_back(i);
  }

  // Tables that changed are rebuilt in parallel (one MaglevBuilder and its
  // scratch per TBB worker thread); each build is a pure function of its
  // input, so the result does not depend on the schedule.
  std::vector<std::optional<MaglevBuildResult>> results(n);
  auto buildOne = [&](MaglevBuilder& builder, std::size_t i) {
    const VipConfig& v = config_.vips[i];
    results[i].emplace(builder.build(inputs[i], hasher, v.tableSize,
                                     before[i] != nullptr ? &before[i]->table : nullptr));
  };
  if (toBuild.size() > 1) {
    tbb::enumerable_thread_specific<MaglevBuilder> builders;
    tbb::parallel_for(std::size_t{0}, toBuild.size(),
                      [&](std::size_t k) { buildOne(builders.local(), toBuild[k]); });
  } else if (toBuild.size() == 1) {
    buildOne(maglev_, toBuild[0]);
  }

  std::map<std::string, PreviousVip> next;
  for (std::size_t i = 0; i < n; ++i) {
    const VipConfig& v = config_.vips[i];
    if (!results[i]) {
      if (before[i] != nullptr) next.emplace(v.name, *before[i]);
      continue;
    }
    if (!*results[i]) {
      lastError_ = "vip " + v.name + ": " + results[i]->error();
      return nullptr;
    }
    MaglevBuild& built = results[i]->value();
    VipBuildReport& r = reports[i];
    r.changed = built.changed;
    r.rebuilt = true;
    r.allNone = built.allNone;
    r.shares = built.shares;
    snapshot->vips[i].table = built.table;
    next.insert_or_assign(v.name, PreviousVip{std::move(inputs[i]), v.tableSize, seed,
                                              std::move(built.table), std::move(built.shares)});
  }
  previous_ = std::move(next);
  lastBuild_ = std::move(reports);
  snapshot->indexVips();
  return snapshot;
}

}  // namespace spillway
