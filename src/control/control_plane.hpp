// The control thread's brain: it ties configuration, backend states, health
// checks, load scraping and the weight/spillover policy to snapshot builds,
// and answers the operator (ControlApi: the CLI socket and the metrics).
//
// Each tick (a few milliseconds apart, on spillwayd's main lcore):
//   health probes and load scrapes advance (non-blocking) -> health verdicts
//   drive BackendStates -> live flow counts from the workers complete drains
//   -> the policy turns states, base weights and smoothed load into per-VIP
//   Maglev weights, limited by the churn budget (health, drains and disables
//   apply at once) -> when anything changed, a new snapshot is built
//   (changed VIPs in parallel) for the daemon to publish -> indices of
//   removed backends past the grace period are purged from the workers' flow
//   tables and recycled (snapshot_builder.hpp) -> backends held out of the
//   tables until their next hop resolves are logged when held and when they
//   enter.
// Decisions and their causes go to the event log; the time from a decision to
// the moment every worker uses its snapshot is measured (publish latency).
//
// Thread contract: control thread only. The data path is reached only
// through DataplaneHooks.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "control/backend_state.hpp"
#include "control/config.hpp"
#include "control/control_api.hpp"
#include "control/event_log.hpp"
#include "control/health.hpp"
#include "control/policy.hpp"
#include "control/scraper.hpp"
#include "control/snapshot_builder.hpp"

namespace spillway {

struct DataplaneHooks {
  // The data path's counters as JSON (the daemon's stats document).
  std::function<Json()> stats;
  // Ask every worker for a live-flow count (n increasing).
  std::function<void(std::uint64_t n)> requestFlowCounts;
  // Per worker lcore: live flows by backend index, once every worker
  // finished count n; std::nullopt while any is still counting.
  std::function<std::optional<std::vector<std::pair<unsigned, std::vector<std::uint64_t>>>>(
      std::uint64_t n)>
      collectFlowCounts;
  // The oldest snapshot generation any worker is still using.
  std::function<std::uint64_t()> appliedGeneration;
  // Backend-index recycling (snapshot_builder.hpp): ask every worker to erase
  // the flow-table entries that name `indices` (n increasing; the next request
  // comes only after purgeDone(n)); true once every worker finished n.
  // Without these (and appliedGeneration) removed backends' indices are never
  // reused.
  std::function<void(std::uint64_t n, const std::vector<std::uint32_t>& indices)> requestPurge;
  std::function<bool(std::uint64_t n)> purgeDone;
};

class ControlPlane final : public ControlApi {
 public:
  ControlPlane(Config config, std::string configPath, SnapshotBuilder& builder,
               DataplaneHooks hooks, Millis now);

  // Advances checks, states and policy. True when a new snapshot should be
  // built and published (takeSnapshot()).
  bool tick(Millis now);
  // Builds the next snapshot; null (with the reason logged as an event) when
  // the build failed, in which case the running one stays.
  std::unique_ptr<ForwardingSnapshot> takeSnapshot(Millis now);
  [[nodiscard]] std::uint64_t generation() const noexcept { return generation_; }
  // Something outside the policy changed the snapshot's inputs (next hops).
  void markDirty() noexcept { dirty_ = true; }
  // File descriptors to wait on (health probes, scrapes) besides the timers.
  [[nodiscard]] std::vector<int> pollFds() const;
  [[nodiscard]] const Config& config() const noexcept { return config_; }
  [[nodiscard]] EventLog& events() noexcept { return events_; }

  // ControlApi.
  ApiResult status() override;
  ApiResult vipList() override;
  ApiResult vipShow(const std::string& name) override;
  ApiResult poolList() override;
  ApiResult poolShow(const std::string& name) override;
  ApiResult backendList() override;
  ApiResult backendAdd(const BackendSpec& spec) override;
  ApiResult backendRemove(const std::string& name) override;
  ApiResult backendDrain(const std::string& name) override;
  ApiResult backendUndrain(const std::string& name) override;
  ApiResult backendDisable(const std::string& name) override;
  ApiResult backendEnable(const std::string& name) override;
  ApiResult backendWeight(const std::string& name, std::uint32_t weight, bool dryRun) override;
  ApiResult tableShow(const std::string& vip) override;
  ApiResult flows() override;
  ApiResult stats() override;
  ApiResult health() override;
  ApiResult events(std::uint64_t after, std::uint32_t limit) override;
  ApiResult configCheck(const std::string& path) override;
  ApiResult configReload(const std::string& path) override;
  ApiResult configDump() override;
  std::string metricsText() override;

 private:
  const BackendConfig* backendNamed(const std::string& name) const;
  Json backendJson(const BackendConfig& b) const;
  void applyTargets();  // health and scrape targets from config_
  // Turns states + load into per-VIP weights; returns whether any changed.
  bool applyPolicy(Millis now, bool forceChurn);
  PolicyInput policyInput(const VipConfig& vip, Millis now,
                          const std::map<std::uint64_t, std::uint32_t>* baseOverride) const;
  ApiResult stateResult(const StateResult& r, const std::string& name, const char* verb);
  void reconfigure(Config next, Millis now, const std::string& cause);
  void collectFlows(Millis now);
  void recycleIndices();
  void noteHolds(Millis now);

  Config config_;
  std::string configPath_;
  SnapshotBuilder& builder_;
  DataplaneHooks hooks_;
  Millis started_;
  Millis now_;
  EventLog events_;
  BackendStates states_;
  WeightPolicy policy_;
  HealthChecker health_;
  LoadScraper scraper_;

  std::uint64_t generation_ = 0;
  bool dirty_ = true;
  std::uint64_t statesSeen_ = 0;
  Millis lastChurn_ = 0;
  std::map<std::string, PolicyDecision> decisions_;                          // by VIP
  std::map<std::string, std::map<std::uint64_t, std::uint32_t>> weights_;  // applied, by VIP

  std::uint64_t flowCountAsked_ = 0;
  Millis flowCountAt_ = 0;  // when the pending count was asked; 0 = none pending
  Millis lastFlowRequest_ = 0;
  std::vector<std::pair<unsigned, std::vector<std::uint64_t>>> lastFlows_;
  // Indices recycled while the pending flow count ran: its numbers for them
  // may include the purged entries, so they are not used.
  std::set<std::uint32_t> recycledDuringCount_;

  // Index purge in flight: request number (0 = none) and its indices.
  std::uint64_t purgeAsked_ = 0;
  std::uint64_t purgeRequests_ = 0;
  std::vector<std::uint32_t> purging_;

  // Backends held out of the tables until their next hop resolves: since when.
  std::map<std::uint64_t, Millis> heldSince_;
  std::uint64_t heldEntered_ = 0;  // holds that ended with the backend entering

  // Publish latency: decision time of the newest published generation, and
  // the last few measured latencies.
  std::optional<std::pair<std::uint64_t, Millis>> pendingApply_;
  std::vector<Millis> applyLatencies_;
  std::uint64_t publishes_ = 0;
};

}  // namespace spillway
