// Turns configuration plus runtime backend state into a ForwardingSnapshot
// (spillway/snapshot.hpp) for the dataplane to publish.
//
// The builder holds the Config, the runtime state of every backend (its
// BackendState, effective weight and resolved next-hop MAC) and the port
// bindings the dataplane supplies (DPDK port id and MAC per configured port).
// build() makes a complete snapshot: the backend array with each backend's
// EncapTarget, and one SnapshotVip per configured VIP whose Maglev table is
// built over the backends of the VIP's pools.
//
// Backend indices. Index 0 means "none"; indices run 1..maxBackends()
// (kMaxBackends unless a test asks for fewer). A configured backend keeps its
// index. One that leaves the configuration stays in backends[] as Removed (so
// a tracked flow that still names it is re-selected) while its index goes
// through, like Katran's recycled real indices:
//   retiring: the next build lists it as Removed; that build's generation is
//             its goneAt;
//   purging:  startIndexPurge(applied) found every worker on goneAt or later
//             (no worker can insert an entry naming it any more) and handed it
//             out to be purged from every flow table;
//   free:     indicesPurged() confirmed that every worker finished the purge;
//             the index joins a FIFO and may be given to another backend.
// New backends take the oldest recycled index first, then a never-used one,
// so the index space (and backends[]) stays as small as the most backends
// known at once, whatever number was ever added. At most maxBackends are known
// at once (configured plus retiring or purging); setConfig() refuses a
// configuration beyond that with an error and changes nothing (admits() asks
// first). An id that comes back while its index is still retiring gets it
// back; once the purge started it gets another. Backends new in one
// setConfig() are numbered in id order, so instances with the same history
// have the same indices (a fresh start in particular); indices are local to
// an instance all the same: tables are compared across instances by id.
//
// Readiness (a backend is ready before it takes flows). A backend that joins
// a running configuration (added, or re-added, after the first setConfig())
// is held out of the tables (weight 0) until its next hop is known, so its
// first SYNs are not dropped as next_hop_unresolved; heldForNextHop() lists
// them for the caller to resolve at once, and takeEnteredTables() reports
// those that entered since. A backend of the first configuration is not held
// (the first tables stay a pure function of the configuration, for restarts),
// and one already in the tables stays there if its MAC is lost. Kernel-
// resolved MACs are remembered by (port, address) across a remove and re-add
// (at most maxBackends of them), so a re-added backend starts resolved.
//
// Table inputs, per VIP: every backend of the VIP's pools, with its effective
// weight when it is Active and not held for its next hop; with weight 0
// otherwise (Draining, Disabled, Failed, Removed, or held), so it owns no slot
// but keeps its place in backends[]. A backend whose MAC becomes unknown after
// it entered keeps its slots (the data path drops and counts its packets).
// All listed pools share by weight (pool priority and spillover come with the
// control-plane issue). MaglevBuilder orders by id, so the tables are a pure
// function of (ids, weights, indices, seed, table size): same inputs, same
// tables on every instance. A VIP whose inputs did not change since the last
// build reuses its previous table without rebuilding it.
//
// Thread contract: one thread (the control thread) owns a SnapshotBuilder and
// calls every member. The snapshot it returns is independent of the builder
// (no shared state) and is handed to SnapshotPublisher::publish().
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "control/backends/neighbours.hpp"
#include "control/backends/slot_history.hpp"
#include "control/config/config.hpp"
#include "spillway/flow_exceptions.hpp"
#include "spillway/flow_key.hpp"
#include "spillway/maglev.hpp"
#include "spillway/placement.hpp"
#include "spillway/snapshot.hpp"
#include "spillway/wire.hpp"

namespace spillway {

struct BackendRuntime {
  BackendState state = BackendState::Active;
  std::uint32_t effectiveWeight = 0;     // what the tables use while Active
  std::optional<MacAddress> nextHopMac;  // std::nullopt: unresolved
};

// The data path's key of every configured VIP (a port filter's VIP set).
[[nodiscard]] std::vector<VipKey> vipKeysOf(const Config& config);

struct VipBuildReport {
  std::string name;
  std::uint32_t tableSize = 0;
  std::uint32_t changed = 0;  // slots that differ from this VIP's previous table; all when new
  bool rebuilt = false;       // false: inputs unchanged, previous table reused
  bool allNone = false;       // no backend could take new flows: every slot is 0
  std::vector<MaglevShare> shares;  // every member backend, in id order
};

struct BackendIndexStats {
  std::uint32_t maxBackends = 0;  // the bound on backends known at once
  std::uint32_t inUse = 0;        // configured backends
  std::uint32_t retiring = 0;     // removed, waiting for the grace period
  std::uint32_t purging = 0;      // removed, flow-table purge running
  std::uint32_t free = 0;         // recycled, ready for reuse
  std::uint32_t limit = 1;        // 1 + the highest index ever used: backends[].size()
  std::uint64_t recycled = 0;     // indices recycled since start
};

class SnapshotBuilder {
 public:
  explicit SnapshotBuilder(std::uint32_t maxBackends = kMaxBackends);

  // Takes a new configuration (the first, or a reload); the caller has
  // validated it with loadConfig(). Backends are matched by id:
  //  - new ones get the next indices (in id order), their initial state, their
  //    configured weight, and the static next hop (backend.mac or
  //    port.next_hop_mac), else unresolved;
  //  - kept ones keep index and runtime state; a changed configured weight
  //    resets the effective weight, a changed `state` key applies, and a changed
  //    address, port or static MAC drops the resolved MAC;
  //  - missing ones become Removed; their index retires (see above); if
  //    they reappear before it is purged they get it back, with their
  //    initial state again.
  // Port bindings are matched by port name. Returns an error and changes
  // nothing when more than maxBackends() backends would be known at once.
  [[nodiscard]] std::optional<std::string> setConfig(Config config);
  // The error setConfig(config) would return for the index bound, if any.
  [[nodiscard]] std::optional<std::string> admits(const Config& config) const;
  [[nodiscard]] const Config& config() const noexcept { return config_; }

  // Dataplane bindings of configured port `portIndex` (into config().ports):
  // the MAC of the DPDK port (which wins over the port's configured `mac`) and
  // the DPDK port id (default: portIndex). Ignored for an unknown index.
  void setPortMac(std::uint32_t portIndex, const MacAddress& mac);
  void setPortId(std::uint32_t portIndex, std::uint16_t dpdkPortId);

  // Runtime state of the configured backend `id`; false when there is none
  // (or the weight exceeds kMaxBackendWeight).
  bool setState(std::uint64_t id, BackendState state);
  bool setEffectiveWeight(std::uint64_t id, std::uint32_t weight);
  bool setNextHopMac(std::uint64_t id, std::optional<MacAddress> mac);
  // Takes every backend's next hop from the resolver. A MAC once resolved is
  // kept while the kernel no longer lists it (neighbour entries age out of a
  // table that the dataplane's traffic never refreshes); a different MAC
  // replaces it. Returns how many backends' MACs changed. Both this and
  // setNextHopMac() remember the MAC and end a hold (see Readiness).
  std::size_t refreshNextHops(const NeighbourResolver& resolver);

  [[nodiscard]] const BackendRuntime* runtime(std::uint64_t id) const;
  // The backend's index, or 0 when the id is unknown (never seen, or removed
  // and its index recycled).
  [[nodiscard]] std::uint32_t indexOf(std::uint64_t id) const;
  // The id of the backend that holds a backend index (in use, or retiring
  // after a removal), or 0 when the index is 0, free or being purged.
  [[nodiscard]] std::uint64_t idAt(std::uint32_t index) const {
    if (index == 0 || index >= slots_.size()) return 0;
    const IndexSlot& slot = slots_[index];
    return slot.use == IndexUse::InUse || slot.use == IndexUse::Retiring ? slot.id : 0;
  }

  // Index recycling (see above), driven by the control plane. The retiring
  // indices whose goneAt generation every worker has applied (`applied`: the
  // oldest generation in use) become purging; returns them (empty: nothing to
  // purge). The caller has the workers purge them, then calls indicesPurged().
  [[nodiscard]] std::vector<std::uint32_t> startIndexPurge(std::uint64_t applied);
  // Every worker finished purging `indices` (from startIndexPurge): they are free.
  void indicesPurged(const std::vector<std::uint32_t>& indices);
  [[nodiscard]] BackendIndexStats indexStats() const;
  [[nodiscard]] std::uint32_t maxBackends() const noexcept { return maxBackends_; }

  // Configured backends held out of the tables until their next hop
  // resolves, by id.
  [[nodiscard]] std::vector<std::uint64_t> heldForNextHop() const;
  // Backends that left the hold (next hop resolved) since the last call.
  [[nodiscard]] std::vector<std::uint64_t> takeEnteredTables();

  // A complete snapshot, or nullptr with lastError() set (a table build
  // rejected its input, which a validated Config does not cause). `now`
  // (milliseconds, any monotonic epoch) stamps the slots whose owner changed
  // for second chance: each VIP's previousOwner names a slot's owner before
  // its last change until [dataplane] second_chance_hold_ms has passed since
  // (cleared by the first build after that; secondChanceHoldEnds() says
  // when one is due). A changed table size forgets the history.
  [[nodiscard]] std::unique_ptr<ForwardingSnapshot> build(std::uint64_t generation, Millis now = 0);
  // The earliest time a build would forget a previous owner, if any.
  [[nodiscard]] std::optional<Millis> secondChanceHoldEnds() const;
  // The slot history of the last build, by backend id, aged to `now`
  // (what a restarted instance restores: history.bin).
  [[nodiscard]] SlotHistory slotHistory(Millis now) const;
  // At start, before the first build: the history the last process left.
  // A VIP's first table takes it where the table size matches (entries of
  // unknown backends, or older than the hold, are left out); later builds
  // go on from there.
  void restoreSlotHistory(SlotHistory history) { restoredHistory_ = std::move(history); }

  // Per-VIP weights from the policy (load feedback, spillover), by backend
  // id; a backend without one uses its effective weight. Only backends that
  // take new flows (Active) get a non-zero weight either way.
  void setVipWeights(const std::string& vip, std::map<std::uint64_t, std::uint32_t> weights);
  void clearVipWeights();
  // The exception table every later snapshot carries (flow_exceptions.hpp);
  // null for none.
  void setExceptions(std::shared_ptr<const ExceptionTable> exceptions) {
    exceptions_ = std::move(exceptions);
  }
  // Load-aware placement (spillway/placement.hpp): the per-backend loads
  // and the per-VIP totals that every snapshot's placing VIPs point to,
  // written by the control plane between builds. vipLoad() is null for a VIP
  // that does not place by bytes (or does not exist).
  [[nodiscard]] BackendLoads& placementLoads() noexcept { return *placementLoads_; }
  [[nodiscard]] VipLoad* vipLoad(const std::string& vip);
  // The VIP's table as last built, or null.
  [[nodiscard]] const MaglevTable* currentTable(const std::string& vip) const;
  // Entries of the VIP's table that would change with these weights (by id;
  // others as now), without applying anything: dry runs and churn budgets.
  [[nodiscard]] std::optional<std::uint32_t> predictChanged(
      const std::string& vip, const std::map<std::uint64_t, std::uint32_t>& weights);
  // One report per VIP of the last build, in config order.
  [[nodiscard]] const std::vector<VipBuildReport>& lastBuild() const noexcept { return lastBuild_; }
  [[nodiscard]] const std::string& lastError() const noexcept { return lastError_; }

 private:
  struct Backend {
    std::uint32_t index = 0;
    std::optional<std::uint32_t> configIndex;  // into config_.backends; empty when removed
    BackendRuntime runtime;
    bool held = false;  // joined at run time, next hop not yet known: weight 0
  };
  enum class IndexUse : std::uint8_t { Free, InUse, Retiring, Purging };
  struct IndexSlot {
    IndexUse use = IndexUse::Free;
    std::uint64_t id = 0;                 // the backend that has (or last had) it
    std::optional<std::uint64_t> goneAt;  // retiring: generation that first lists it Removed
  };
  struct PreviousVip {
    std::vector<MaglevBackend> input;  // by id
    std::uint32_t tableSize = 0;
    std::uint64_t seed = 0;
    MaglevTable table;
    std::vector<MaglevShare> shares;
    // Second chance: by slot, the owner before the last change (0 = none)
    // and the low 32 bits of `now` at that change; the earliest time an
    // entry's hold ends (0 = no entry).
    std::shared_ptr<const std::vector<std::uint32_t>> previousOwner;
    std::vector<std::uint32_t> changedAt;
    // By slot, its owner before the current run of moves began (a move
    // within the hold of the slot's last one continues the run).
    std::vector<std::uint32_t> origin;
    Millis holdEnds = 0;
  };
  // Records the slots that differ between `before` and `after` (same size)
  // as changed at `now`, and forgets those whose hold ended.
  void noteChanges(PreviousVip& history, const MaglevTable* before, const MaglevTable& after,
                   Millis now) const;
  // Forgets the entries whose hold ended, when one is due (or always, with
  // `recount`), and sets holdEnds to the next end.
  void expireHistory(PreviousVip& history, Millis now, bool recount = false) const;
  // A VIP's first build: its restored history, if any (and forgets it).
  void takeRestoredHistory(const std::string& vip, std::uint32_t size, PreviousVip& history,
                           Millis now);
  struct PortBinding {
    std::optional<MacAddress> mac;
    std::optional<std::uint16_t> id;
  };

  Backend* find(std::uint64_t id);
  [[nodiscard]] BackendRuntime initialRuntime(const Config& config, const BackendConfig& b) const;
  [[nodiscard]] std::size_t indicesNeeded(const Config& config) const;
  [[nodiscard]] std::uint32_t availableIndices() const noexcept;
  std::uint32_t acquireIndex(std::uint64_t id);
  void rememberMac(const BackendConfig& c, const MacAddress& mac);
  [[nodiscard]] std::optional<MacAddress> knownMac(const Config& config,
                                                   const BackendConfig& c) const;
  void releaseIfResolved(std::uint64_t id, Backend& b);
  [[nodiscard]] std::vector<MaglevBackend> tableInput(
      const VipConfig& v, const std::map<std::uint64_t, std::uint32_t>* weights) const;
  [[nodiscard]] std::optional<MacAddress> ourMac(std::uint32_t portIndex) const;
  [[nodiscard]] SnapshotBackend snapshotBackend(const Backend& b) const;
  [[nodiscard]] bool takesNewFlows(const Backend& b) const;

  Config config_;
  bool configured_ = false;  // the first setConfig() is done
  std::uint32_t maxBackends_;
  std::map<std::uint64_t, Backend> backends_;  // by id: configured, retiring, purging
  std::vector<IndexSlot> slots_{1};            // by index; [0] = "none"
  std::deque<std::uint32_t> freeIndices_;      // recycled, oldest first
  std::uint64_t recycled_ = 0;
  std::map<std::string, MacAddress> knownMacs_;  // by "port|address"
  std::deque<std::string> knownMacOrder_;        // oldest first, for the bound
  std::vector<std::uint64_t> entered_;           // left the hold since takeEnteredTables()
  std::vector<PortBinding> ports_;               // by config port index
  std::map<std::string, PreviousVip> previous_;  // by VIP name
  SlotHistory restoredHistory_;                  // until each VIP's first build
  std::map<std::string, std::map<std::uint64_t, std::uint32_t>> vipWeights_;
  MaglevBuilder maglev_;
  std::shared_ptr<const ExceptionTable> exceptions_;
  std::shared_ptr<BackendLoads> placementLoads_;
  std::map<std::string, std::shared_ptr<VipLoad>> vipLoads_;  // placing VIPs, by name
  std::vector<VipBuildReport> lastBuild_;
  std::string lastError_;
};

}  // namespace spillway
