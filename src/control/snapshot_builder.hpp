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
// Backend indices. Index 0 means "none". Every backend id gets an index the
// first time it appears and keeps it for the life of the process: a backend
// removed from the configuration stays in the array as Removed (so a tracked
// flow that still names it is re-selected), and an index is never given to a
// different id. The array therefore grows by one per distinct id ever seen;
// reclaiming indices after the grace period and the longest flow timeout
// (snapshot.hpp's rule) is left to the control-plane issue. Backends new in one
// setConfig() are numbered in id order, so instances with the same
// configuration history (a fresh start, in particular) have the same indices
// whatever the order of [[backend]] in the file.
//
// Table inputs, per VIP: every backend of the VIP's pools, with its effective
// weight when it is Active and both MACs of its frames are known (the next hop,
// and our port's MAC); with weight 0 otherwise (Draining, Disabled, Failed,
// Removed, or unresolved), so it owns no slot but keeps its place in backends[].
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
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "control/config.hpp"
#include "control/neighbours.hpp"
#include "spillway/flow_exceptions.hpp"
#include "spillway/flow_key.hpp"
#include "spillway/maglev.hpp"
#include "spillway/snapshot.hpp"
#include "spillway/wire.hpp"

namespace spillway {

struct BackendRuntime {
  BackendState state = BackendState::Active;
  std::uint32_t effectiveWeight = 0;     // what the tables use while Active
  std::optional<MacAddress> nextHopMac;  // std::nullopt: unresolved
};

struct VipBuildReport {
  std::string name;
  std::uint32_t tableSize = 0;
  std::uint32_t changed = 0;  // slots that differ from this VIP's previous table; all when new
  bool rebuilt = false;       // false: inputs unchanged, previous table reused
  bool allNone = false;       // no backend could take new flows: every slot is 0
  std::vector<MaglevShare> shares;  // every member backend, in id order
};

class SnapshotBuilder {
 public:
  static constexpr std::uint32_t kMaxBackendIndex = (std::uint32_t{1} << 24) - 1;

  SnapshotBuilder() = default;

  // Takes a new configuration (the first, or a reload); the caller has
  // validated it with loadConfig(). Backends are matched by id:
  //  - new ones get the next indices (in id order), their initial state, their
  //    configured weight, and the static next hop (backend.mac or
  //    port.next_hop_mac), else unresolved;
  //  - kept ones keep index and runtime state; a changed configured weight
  //    resets the effective weight, a changed `state` key applies, and a changed
  //    address, port or static MAC drops the resolved MAC;
  //  - missing ones become Removed and keep their index (back to their
  //    initial state if they reappear).
  // Port bindings are matched by port name. Returns an error and changes
  // nothing when the indices would run out.
  [[nodiscard]] std::optional<std::string> setConfig(Config config);
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
  // replaces it. Returns how many backends' MACs changed.
  std::size_t refreshNextHops(const NeighbourResolver& resolver);

  [[nodiscard]] const BackendRuntime* runtime(std::uint64_t id) const;
  // The backend's index, or 0 when the id was never seen.
  [[nodiscard]] std::uint32_t indexOf(std::uint64_t id) const;
  // The id at a backend index, or 0 when the index is 0 or unused.
  [[nodiscard]] std::uint64_t idAt(std::uint32_t index) const {
    return index < idByIndex_.size() ? idByIndex_[index] : 0;
  }

  // A complete snapshot, or nullptr with lastError() set (a table build
  // rejected its input, which a validated Config does not cause).
  [[nodiscard]] std::unique_ptr<ForwardingSnapshot> build(std::uint64_t generation);

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
    SnapshotBackend last;  // as last built, for a removed backend's slot
  };
  struct PreviousVip {
    std::vector<MaglevBackend> input;  // by id
    std::uint32_t tableSize = 0;
    std::uint64_t seed = 0;
    MaglevTable table;
    std::vector<MaglevShare> shares;
  };
  struct PortBinding {
    std::optional<MacAddress> mac;
    std::optional<std::uint16_t> id;
  };

  Backend* find(std::uint64_t id);
  [[nodiscard]] std::vector<MaglevBackend> tableInput(
      const VipConfig& v, const std::map<std::uint64_t, std::uint32_t>* weights) const;
  [[nodiscard]] std::optional<MacAddress> ourMac(std::uint32_t portIndex) const;
  [[nodiscard]] SnapshotBackend snapshotBackend(const Backend& b) const;
  [[nodiscard]] bool takesNewFlows(const Backend& b) const;

  Config config_;
  std::map<std::uint64_t, Backend> backends_;    // by id; never shrinks
  std::vector<std::uint64_t> idByIndex_{0};      // [0] = "none"
  std::vector<PortBinding> ports_;               // by config port index
  std::map<std::string, PreviousVip> previous_;  // by VIP name
  std::map<std::string, std::map<std::uint64_t, std::uint32_t>> vipWeights_;
  MaglevBuilder maglev_;
  std::shared_ptr<const ExceptionTable> exceptions_;
  std::vector<VipBuildReport> lastBuild_;
  std::string lastError_;
};

}  // namespace spillway
