#include "control/backends/snapshot_builder.hpp"

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

}  // namespace

SnapshotBuilder::SnapshotBuilder(std::uint32_t maxBackends)
    : maxBackends_(std::clamp<std::uint32_t>(maxBackends, 1, kMaxBackends)),
      placementLoads_(std::make_shared<BackendLoads>(kBackendSlots)) {}

VipLoad* SnapshotBuilder::vipLoad(const std::string& vip) {
  auto it = vipLoads_.find(vip);
  return it == vipLoads_.end() ? nullptr : it->second.get();
}

BackendRuntime SnapshotBuilder::initialRuntime(const Config& config, const BackendConfig& b) const {
  BackendRuntime r;
  r.state = b.initialState;
  r.effectiveWeight = b.weight;
  if (auto s = staticNextHop(config, b)) {
    r.nextHopMac = s->mac;
  } else {
    r.nextHopMac = knownMac(config, b);
  }
  return r;
}

namespace {

std::string macKey(const Config& config, const BackendConfig& c) {
  const std::string port = c.portIndex < config.ports.size() ? config.ports[c.portIndex].name : "";
  return port + "|" + formatIpAddress(c.address);
}

}  // namespace

void SnapshotBuilder::rememberMac(const BackendConfig& c, const MacAddress& mac) {
  if (staticNextHop(config_, c)) return;
  const std::string key = macKey(config_, c);
  auto [it, inserted] = knownMacs_.insert_or_assign(key, mac);
  if (!inserted) return;
  knownMacOrder_.push_back(key);
  while (knownMacs_.size() > maxBackends_) {
    knownMacs_.erase(knownMacOrder_.front());
    knownMacOrder_.pop_front();
  }
}

std::optional<MacAddress> SnapshotBuilder::knownMac(const Config& config,
                                                    const BackendConfig& c) const {
  auto it = knownMacs_.find(macKey(config, c));
  if (it == knownMacs_.end()) return std::nullopt;
  return it->second;
}

void SnapshotBuilder::releaseIfResolved(std::uint64_t id, Backend& b) {
  if (b.held && b.runtime.nextHopMac) {
    b.held = false;
    entered_.push_back(id);
  }
}

// Ids of `config` that need an index they do not have: new ones, and removed
// ones coming back whose old index is already being purged.
std::size_t SnapshotBuilder::indicesNeeded(const Config& config) const {
  std::size_t needed = 0;
  for (const BackendConfig& b : config.backends) {
    auto it = backends_.find(b.id);
    if (it == backends_.end()) {
      ++needed;
    } else if (!it->second.configIndex && slots_[it->second.index].use != IndexUse::Retiring) {
      ++needed;
    }
  }
  return needed;
}

std::uint32_t SnapshotBuilder::availableIndices() const noexcept {
  const auto everUsed = static_cast<std::uint32_t>(slots_.size() - 1);
  return static_cast<std::uint32_t>(freeIndices_.size()) + (maxBackends_ - everUsed);
}

std::optional<std::string> SnapshotBuilder::admits(const Config& config) const {
  const std::size_t needed = indicesNeeded(config);
  if (needed <= availableIndices()) return std::nullopt;
  const BackendIndexStats st = indexStats();
  return "too many backends: " + std::to_string(needed) + " new would need an index, " +
         std::to_string(availableIndices()) + " free; at most " + std::to_string(maxBackends_) +
         " backends are known at once (now " + std::to_string(st.inUse) + " configured and " +
         std::to_string(st.retiring + st.purging) +
         " removed ones whose flow-table entries are not yet purged)";
}

std::uint32_t SnapshotBuilder::acquireIndex(std::uint64_t id) {
  std::uint32_t index = 0;
  if (!freeIndices_.empty()) {
    index = freeIndices_.front();
    freeIndices_.pop_front();
  } else {
    index = static_cast<std::uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  slots_[index] = IndexSlot{IndexUse::InUse, id, std::nullopt};
  return index;
}

std::optional<std::string> SnapshotBuilder::setConfig(Config config) {
  if (auto e = admits(config)) return e;

  // Port bindings follow the port's name.
  std::vector<PortBinding> ports(config.ports.size());
  for (std::size_t i = 0; i < config.ports.size(); ++i) {
    for (std::size_t j = 0; j < config_.ports.size() && j < ports_.size(); ++j) {
      if (config_.ports[j].name == config.ports[i].name) ports[i] = ports_[j];
    }
  }

  const bool running = configured_;
  std::set<std::uint64_t> present;
  std::vector<const BackendConfig*> fresh;  // need an index
  for (std::uint32_t ci = 0; ci < config.backends.size(); ++ci) {
    const BackendConfig& now = config.backends[ci];
    present.insert(now.id);
    auto it = backends_.find(now.id);
    if (it == backends_.end()) {
      fresh.push_back(&now);
      continue;
    }
    Backend& b = it->second;
    if (!b.configIndex) {
      // Reappears: its old index back while it is only retiring.
      if (slots_[b.index].use != IndexUse::Retiring) {
        fresh.push_back(&now);
        continue;
      }
      slots_[b.index] = IndexSlot{IndexUse::InUse, now.id, std::nullopt};
      b.runtime = initialRuntime(config, now);
      b.held = running && !b.runtime.nextHopMac;
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
        b.runtime.nextHopMac = knownMac(config, now);
      }
    }
    b.configIndex = ci;
  }
  for (auto& [id, b] : backends_) {
    if (present.count(id) == 0 && b.configIndex) {
      b.configIndex.reset();
      b.runtime.state = BackendState::Removed;
      b.held = false;
      slots_[b.index] = IndexSlot{IndexUse::Retiring, id, std::nullopt};
    }
  }
  std::sort(fresh.begin(), fresh.end(),
            [](const BackendConfig* x, const BackendConfig* y) { return x->id < y->id; });
  for (const BackendConfig* f : fresh) {
    Backend& b = backends_[f->id];  // a new record, or a returning id whose index is purging
    b.index = acquireIndex(f->id);
    b.configIndex = static_cast<std::uint32_t>(f - config.backends.data());
    b.runtime = initialRuntime(config, *f);
    b.held = running && !b.runtime.nextHopMac;
  }

  config_ = std::move(config);
  ports_ = std::move(ports);
  configured_ = true;
  for (auto& [id, b] : backends_) {
    if (b.configIndex) releaseIfResolved(id, b);
  }
  return std::nullopt;
}

std::vector<std::uint32_t> SnapshotBuilder::startIndexPurge(std::uint64_t applied) {
  std::vector<std::uint32_t> out;
  for (std::uint32_t i = 1; i < slots_.size(); ++i) {
    IndexSlot& s = slots_[i];
    if (s.use == IndexUse::Retiring && s.goneAt && *s.goneAt <= applied) {
      s.use = IndexUse::Purging;
      out.push_back(i);
    }
  }
  return out;
}

void SnapshotBuilder::indicesPurged(const std::vector<std::uint32_t>& indices) {
  for (std::uint32_t i : indices) {
    if (i == 0 || i >= slots_.size() || slots_[i].use != IndexUse::Purging) continue;
    auto it = backends_.find(slots_[i].id);
    if (it != backends_.end() && !it->second.configIndex && it->second.index == i) {
      backends_.erase(it);  // gone for good; its MAC stays in knownMacs_
    }
    slots_[i] = IndexSlot{};
    freeIndices_.push_back(i);
    ++recycled_;
  }
}

BackendIndexStats SnapshotBuilder::indexStats() const {
  BackendIndexStats st;
  st.maxBackends = maxBackends_;
  st.limit = static_cast<std::uint32_t>(slots_.size());
  st.recycled = recycled_;
  st.free = static_cast<std::uint32_t>(freeIndices_.size());
  for (std::uint32_t i = 1; i < slots_.size(); ++i) {
    switch (slots_[i].use) {
      case IndexUse::InUse:
        ++st.inUse;
        break;
      case IndexUse::Retiring:
        ++st.retiring;
        break;
      case IndexUse::Purging:
        ++st.purging;
        break;
      case IndexUse::Free:
        break;
    }
  }
  return st;
}

std::vector<std::uint64_t> SnapshotBuilder::heldForNextHop() const {
  std::vector<std::uint64_t> out;
  for (const auto& [id, b] : backends_) {
    if (b.configIndex && b.held) out.push_back(id);
  }
  return out;
}

std::vector<std::uint64_t> SnapshotBuilder::takeEnteredTables() {
  return std::exchange(entered_, {});
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
  if (mac) rememberMac(config_.backends[*b->configIndex], *mac);
  releaseIfResolved(id, *b);
  return true;
}

std::size_t SnapshotBuilder::refreshNextHops(const NeighbourResolver& resolver) {
  std::size_t changed = 0;
  for (auto& [id, b] : backends_) {
    if (!b.configIndex) continue;
    const BackendConfig& c = config_.backends[*b.configIndex];
    const NextHop hop = resolver.resolve(config_, c);
    if (hop.mac && hop.mac != b.runtime.nextHopMac) {
      b.runtime.nextHopMac = hop.mac;
      rememberMac(c, *hop.mac);
      ++changed;
    }
    releaseIfResolved(id, b);
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

// Whether the backend is in the tables. Whether its next hop is resolved
// counts only at entry (held): a backend of the first configuration, or one
// that entered once, stays in, so the tables stay the same across restarts
// and a MAC being relearnt sends no flow elsewhere for good; packets to a
// backend whose MAC is unknown then are dropped and counted by the data path.
bool SnapshotBuilder::takesNewFlows(const Backend& b) const {
  return b.configIndex && b.runtime.state == BackendState::Active && !b.held;
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
    if (std::find(v.poolIndices.begin(), v.poolIndices.end(), c.poolIndex) == v.poolIndices.end()) {
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

void SnapshotBuilder::clearVipWeights() {
  vipWeights_.clear();
}

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

std::vector<VipKey> vipKeysOf(const Config& config) {
  std::vector<VipKey> keys;
  for (const VipConfig& v : config.vips) {
    keys.push_back(
        VipKey{v.address.bytes, v.address.version, static_cast<std::uint8_t>(v.protocol), v.port});
  }
  return keys;
}

void SnapshotBuilder::expireHistory(PreviousVip& history, Millis now, bool recount) const {
  if (history.previousOwner == nullptr) return;
  if (!recount && (history.holdEnds == 0 || now < history.holdEnds)) return;
  const Millis hold = config_.dataplane.secondChanceHoldMs;
  const std::vector<std::uint32_t>& current = *history.previousOwner;
  std::shared_ptr<std::vector<std::uint32_t>> owners;  // a copy, once one entry ends
  Millis ends = 0;
  for (std::size_t slot = 0; slot < current.size(); ++slot) {
    if (current[slot] == 0) continue;
    const auto age =
        static_cast<std::uint32_t>(static_cast<std::uint32_t>(now) - history.changedAt[slot]);
    if (age >= hold) {
      if (owners == nullptr) owners = std::make_shared<std::vector<std::uint32_t>>(current);
      (*owners)[slot] = 0;
      continue;
    }
    const Millis end = now + (hold - age);
    ends = ends == 0 ? end : std::min(ends, end);
  }
  history.holdEnds = ends;
  if (ends == 0) {
    history.previousOwner.reset();
    history.changedAt.clear();
    history.origin.clear();
  } else if (owners != nullptr) {
    history.previousOwner = std::move(owners);
  }
}

void SnapshotBuilder::noteChanges(PreviousVip& history, const MaglevTable* before,
                                  const MaglevTable& after, Millis now) const {
  const Millis hold = config_.dataplane.secondChanceHoldMs;
  if (hold == 0 || before == nullptr || before->size() != after.size()) {
    history.previousOwner.reset();
    history.changedAt.clear();
    history.origin.clear();
    history.holdEnds = 0;
    return;
  }
  const std::span<const std::uint32_t> old = before->entries();
  const std::span<const std::uint32_t> fresh = after.entries();
  std::shared_ptr<std::vector<std::uint32_t>> owners;
  for (std::size_t slot = 0; slot < old.size(); ++slot) {
    if (old[slot] == fresh[slot] || old[slot] == 0) continue;
    if (owners == nullptr) {
      owners = history.previousOwner != nullptr
                   ? std::make_shared<std::vector<std::uint32_t>>(*history.previousOwner)
                   : std::make_shared<std::vector<std::uint32_t>>(old.size(), 0);
      history.changedAt.resize(old.size(), 0);
      history.origin.resize(old.size(), 0);
    }
    // Within a run of moves (each within the hold of the one before), the
    // slot names the owner it had before the run began, unless it is that
    // owner's again (then the one it leaves): a long-lived flow on its
    // second chance there (no instance tracks it) began on that owner, and
    // the churn budget's intermediate tables and the next load swings move
    // slots on through other owners; flows begun on an intermediate owner
    // are tracked by instances that export them.
    const auto age =
        static_cast<std::uint32_t>(static_cast<std::uint32_t>(now) - history.changedAt[slot]);
    const bool inRun = (*owners)[slot] != 0 && age < hold;
    if (!inRun) history.origin[slot] = old[slot];
    (*owners)[slot] = history.origin[slot] != fresh[slot] ? history.origin[slot] : old[slot];
    history.changedAt[slot] = static_cast<std::uint32_t>(now);
  }
  const bool changed = owners != nullptr;
  if (changed) history.previousOwner = std::move(owners);
  // Forgets what ended and finds the next end (one pass over the slots, as
  // the comparison above).
  expireHistory(history, now, changed);
}

SlotHistory SnapshotBuilder::slotHistory(Millis now) const {
  SlotHistory out;
  for (const auto& [name, p] : previous_) {
    if (p.previousOwner == nullptr) continue;
    VipSlotHistory& v = out[name];
    v.tableSize = p.tableSize;
    const std::vector<std::uint32_t>& prev = *p.previousOwner;
    v.slots.reserve(static_cast<std::size_t>(
        prev.size() - static_cast<std::size_t>(std::count(prev.begin(), prev.end(), 0u))));
    for (std::size_t slot = 0; slot < prev.size(); ++slot) {
      if (prev[slot] == 0) continue;
      const auto age =
          static_cast<std::uint32_t>(static_cast<std::uint32_t>(now) - p.changedAt[slot]);
      v.slots.push_back(SlotHistoryRecord{static_cast<std::uint32_t>(slot), idAt(prev[slot]),
                                          slot < p.origin.size() ? idAt(p.origin[slot]) : 0, age});
    }
  }
  return out;
}

void SnapshotBuilder::takeRestoredHistory(const std::string& vip, std::uint32_t size,
                                          PreviousVip& history, Millis now) {
  auto it = restoredHistory_.find(vip);
  if (it == restoredHistory_.end()) return;
  const VipSlotHistory restored = std::move(it->second);
  restoredHistory_.erase(it);
  const Millis hold = config_.dataplane.secondChanceHoldMs;
  if (hold == 0 || restored.tableSize != size) return;
  auto owners = std::make_shared<std::vector<std::uint32_t>>(size, 0);
  history.changedAt.assign(size, 0);
  history.origin.assign(size, 0);
  bool any = false;
  for (const SlotHistoryRecord& r : restored.slots) {
    const std::uint32_t previous = indexOf(r.previousId);
    if (r.slot >= size || previous == 0 || r.ageMs >= hold) continue;
    (*owners)[r.slot] = previous;
    history.origin[r.slot] = indexOf(r.originId);
    history.changedAt[r.slot] = static_cast<std::uint32_t>(now - r.ageMs);
    any = true;
  }
  if (!any) {
    history.changedAt.clear();
    history.origin.clear();
    return;
  }
  history.previousOwner = std::move(owners);
  expireHistory(history, now, true);
}

std::optional<Millis> SnapshotBuilder::secondChanceHoldEnds() const {
  std::optional<Millis> ends;
  for (const auto& [name, p] : previous_) {
    if (p.previousOwner == nullptr || p.holdEnds == 0) continue;
    if (!ends || p.holdEnds < *ends) ends = p.holdEnds;
  }
  return ends;
}

std::unique_ptr<ForwardingSnapshot> SnapshotBuilder::build(std::uint64_t generation, Millis now) {
  lastError_.clear();
  auto snapshot = std::make_unique<ForwardingSnapshot>();
  snapshot->generation = generation;
  // Unused and recycled slots stay default: Removed, id 0.
  snapshot->backends.resize(slots_.size());
  for (auto& [id, b] : backends_) {
    if (b.configIndex) {
      snapshot->backends[b.index] = snapshotBackend(b);
    } else {
      snapshot->backends[b.index].id = id;
    }
  }

  const std::uint64_t seed = config_.dataplane.hashSeed;
  const FlowHasher hasher(seed);
  const std::size_t n = config_.vips.size();
  std::vector<VipBuildReport> reports(n);
  std::vector<std::vector<MaglevBackend>> inputs(n);
  std::vector<const PreviousVip*> before(n, nullptr);
  std::vector<std::size_t> toBuild;
  snapshot->vips.resize(n);
  snapshot->vipsOfBackend.resize(slots_.size());
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
    sv.tag = vipTagOf(sv.key);
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
      if (before[i] != nullptr) {
        PreviousVip& kept = next.emplace(v.name, *before[i]).first->second;
        expireHistory(kept, now);
        snapshot->vips[i].previousOwner = kept.previousOwner;
      }
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
    PreviousVip history;
    if (before[i] != nullptr) {
      history.previousOwner = before[i]->previousOwner;
      history.changedAt = before[i]->changedAt;
      history.origin = before[i]->origin;
      history.holdEnds = before[i]->holdEnds;
    }
    noteChanges(history, before[i] != nullptr ? &before[i]->table : nullptr, built.table, now);
    if (before[i] == nullptr) takeRestoredHistory(v.name, built.table.size(), history, now);
    snapshot->vips[i].previousOwner = history.previousOwner;
    next.insert_or_assign(
        v.name,
        PreviousVip{std::move(inputs[i]), v.tableSize, seed, std::move(built.table),
                    std::move(built.shares), std::move(history.previousOwner),
                    std::move(history.changedAt), std::move(history.origin), history.holdEnds});
  }
  previous_ = std::move(next);
  // Placing VIPs: the share of each backend's entries, and the byte rates.
  std::map<std::string, std::shared_ptr<VipLoad>> loads;
  for (std::size_t i = 0; i < n; ++i) {
    const VipConfig& v = config_.vips[i];
    if (v.placement != VipPlacementMode::Bytes) continue;
    std::shared_ptr<VipLoad>& load = loads[v.name];
    auto kept = vipLoads_.find(v.name);
    load = kept != vipLoads_.end() ? kept->second : std::make_shared<VipLoad>();
    auto p = std::make_shared<VipPlacement>();
    p->balanceFactor = config_.placement.balanceFactor;
    p->candidates = config_.placement.candidates;
    p->share.assign(snapshot->backends.size(), 0.0F);
    for (const MaglevShare& s : reports[i].shares) {
      if (s.backendIndex < p->share.size() && v.tableSize > 0) {
        p->share[s.backendIndex] = static_cast<float>(s.entries) / static_cast<float>(v.tableSize);
      }
    }
    p->loads = placementLoads_;
    p->load = load;
    snapshot->vips[i].placement = std::move(p);
  }
  vipLoads_ = std::move(loads);
  lastBuild_ = std::move(reports);
  for (const PortConfig& port : config_.ports) {
    for (const auto& a : {port.address, port.address6}) {
      if (a) snapshot->gatewayAddresses.push_back(OwnAddress{a->bytes, a->version});
    }
  }
  snapshot->indexVips();
  // Retiring indices are listed Removed, in no table, from this generation on.
  for (IndexSlot& slot : slots_) {
    if (slot.use == IndexUse::Retiring && !slot.goneAt) slot.goneAt = generation;
  }
  return snapshot;
}

}  // namespace spillway
