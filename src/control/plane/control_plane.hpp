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
// through the Dataplane interface (spillway/dataplane.hpp).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "control/announce/announce_exchange.hpp"
#include "control/api/control_api.hpp"
#include "control/api/event_log.hpp"
#include "control/backends/backend_state.hpp"
#include "control/backends/snapshot_builder.hpp"
#include "control/config/config.hpp"
#include "control/discovery/file_source.hpp"
#include "control/discovery/membership.hpp"
#include "control/discovery/source.hpp"
#include "control/health/conn_rebuild.hpp"
#include "control/health/conn_scraper.hpp"
#include "control/health/health.hpp"
#include "control/health/scraper.hpp"
#include "control/intent/affinity_keeper.hpp"
#include "control/intent/intent_journal.hpp"
#include "control/policy/byte_rates.hpp"
#include "control/policy/policy.hpp"
#include "control/sys/loop_durations.hpp"
#include "control/tier/peer_channel.hpp"
#include "spillway/dataplane.hpp"

namespace spillway {

class MetricsWriter;

// Operator intent (intent_journal.hpp, intent_merge.hpp): the constructor
// opens the journal in config.control.stateDir, replays it and lays the
// overlay over `config` (the file); every accepted mutating command is
// validated, journaled (durable) and only then applied; a journal that cannot
// be written rejects the command and changes nothing. `config reload` and
// `config clear-overrides` build the whole next configuration (file +
// overlay + backends still draining), trial-build its snapshot and sync the
// VIP map before changing anything: a failure anywhere changes nothing.
// A backend the new file no longer names drains (its flows continue) and is
// removed when its flows end or at the drain deadline.
class ControlPlane final : public ControlApi {
 public:
  // `dataplane` may be null (no data path attached: stats say so, flows are
  // not counted, nothing is checkpointed); it must outlive this object.
  // wallClockMs: Unix time in ms (journal records, drain ages and checkpoint
  // ages across restarts); default the system clock.
  ControlPlane(Config config, std::string configPath, SnapshotBuilder& builder,
               Dataplane* dataplane, Millis now, std::function<std::int64_t()> wallClockMs = {});
  ~ControlPlane() override;
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;

  // Advances checks, states and policy. True when a new snapshot should be
  // built and published (takeSnapshot()).
  //
  // Make-before-break (control_plane_step.cpp). With peers to send to and
  // [tier] make_before_break > 0, a snapshot that moves Maglev entries is
  // built here and held: the keeper has the workers export every flow that
  // is an exception now or would be one under the held tables, the records
  // go to the peers (written to every sending connection), and only then
  // does tick() return true; past make_before_break it returns true anyway
  // (counted). Changes made while a step is held wait for the next step (one
  // for all of them). A snapshot that moves nothing is published at once.
  bool tick(Millis now);
  // The next snapshot: the held one, else a new build; null (with the reason
  // logged as an event) when the build failed, in which case the running one
  // stays.
  std::unique_ptr<ForwardingSnapshot> takeSnapshot(Millis now);
  [[nodiscard]] std::uint64_t generation() const noexcept { return generation_; }
  // Something outside the policy changed the snapshot's inputs (next hops).
  void markDirty() noexcept { dirty_ = true; }
  // File descriptors to wait on (health probes, scrapes) besides the timers.
  [[nodiscard]] std::vector<int> pollFds() const;
  [[nodiscard]] const Config& config() const noexcept { return config_; }
  [[nodiscard]] EventLog& events() noexcept { return events_; }
  // True while the start-up tables are held (warm-up, see tick()).
  [[nodiscard]] bool warmingUp() const noexcept { return warmup_; }
  // The last checkpoint, from the stopped workers' exceptions (SIGTERM).
  void finalCheckpoint(Millis now, std::vector<ExportedFlow> flows);
  [[nodiscard]] const AffinityKeeper& affinity() const noexcept { return keeper_; }
  // The daemon: checkpoints are written on a thread of their own, never
  // inline in tick() (an fsync can stall for seconds on a busy host).
  void writeCheckpointsInBackground() { keeper_.writeInBackground(); }
  [[nodiscard]] DurableWriter& checkpointWriterForTest() noexcept {
    return keeper_.writerForTest();
  }
  // What the start did with the intent journal (replayed, damage found,
  // overrides dropped), one line each, for the daemon's log.
  [[nodiscard]] const std::vector<std::string>& startupReport() const noexcept {
    return startupReport_;
  }
  [[nodiscard]] const IntentJournal& intent() const noexcept { return journal_; }
  // How long one round of the daemon's control loop (tick, CLI, metrics,
  // publish) took, by the daemon's clock; exported with the metrics.
  void recordLoopDuration(double seconds) noexcept { loopDurations_.record(seconds); }
  [[nodiscard]] const LoopDurations& loopDurations() const noexcept { return loopDurations_; }

  // BGP announcement (control_plane_announce.cpp): the exchange with the
  // announcer thread (null: announce disabled). syncAnnounce() runs every
  // loop round: it beats the control heartbeat, hands over the inputs and
  // turns the announcer's transitions into events.
  void attachAnnounce(AnnounceExchange* exchange) noexcept { announce_ = exchange; }
  void syncAnnounce(Millis now);
  // Health and load known once (or the warm-up limit passed): VIPs may be
  // announced.
  [[nodiscard]] bool announceReady(Millis now) const;
  // With peers: every live peer's exceptions are in a snapshot the workers
  // applied (or kPeerSyncLimit passed since the start). Without: true.
  [[nodiscard]] bool peersReady(Millis now) const;
  // Without a start-up rebuild from the backends: true. With one: once it
  // ended (answered, failed or kConnRebuildLimit) and its exceptions are in
  // a snapshot the workers applied (control_plane_rebuild.cpp).
  [[nodiscard]] bool rebuildReady() const;
  [[nodiscard]] const ConnRebuild* rebuild() const noexcept { return rebuild_.get(); }

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
  ApiResult tableDigest(const std::string& vip, std::optional<std::uint32_t> chunk) override;
  ApiResult flows() override;
  ApiResult flowsAdopted() override;
  ApiResult stats() override;
  ApiResult health() override;
  ApiResult events(std::uint64_t after, std::uint32_t limit) override;
  ApiResult configCheck(const std::string& path, const PeerCredentials* caller) override;
  ApiResult configReload(const std::string& path, const PeerCredentials* caller) override;
  // The daemon's own calls (start-up replay, signals, tests): no caller.
  ApiResult configCheck(const std::string& path) { return configCheck(path, nullptr); }
  ApiResult configReload(const std::string& path) { return configReload(path, nullptr); }
  ApiResult configDump(bool effective) override;
  ApiResult configClearOverrides(const std::string& backend) override;
  ApiResult lbDrain() override;
  ApiResult lbUndrain() override;
  ApiResult lbStatus() override;
  std::string metricsText() override;
  // Discovery sources, one per pool with `discovery` (control_plane_discovery.cpp).
  ApiResult discovery() override;

 private:
  const BackendConfig* backendNamed(const std::string& name) const;
  Json backendJson(const BackendConfig& b) const;
  // SRTT, RTTVAR, the latency score and the policy's latency mark.
  void latencyJson(Json& j, std::uint64_t id) const;
  void applyTargets();  // health and scrape targets from config_
  // Turns states + load into per-VIP weights; returns whether any changed.
  bool applyPolicy(Millis now, bool forceChurn);
  PolicyInput policyInput(const VipConfig& vip, Millis now,
                          const std::map<std::uint64_t, std::uint32_t>* baseOverride) const;
  ApiResult stateResult(const StateResult& r, const std::string& name, const char* verb);
  void reconfigure(Config next, Millis now, const std::string& cause);
  void collectFlows(Millis now);
  // Start-up: the last process's tables and exceptions (affinity_keeper.hpp).
  void restoreAffinity(Millis now);
  [[nodiscard]] bool warmupComplete() const;
  // What a checkpoint writes for the tables just built (at `now`).
  [[nodiscard]] TablesState tablesState(Millis now) const;
  [[nodiscard]] std::uint64_t unixNow() const;
  void recycleIndices();
  void noteHolds(Millis now);
  // LB tier (control_plane_tier.cpp). The snapshot's exception table: the
  // peers' exceptions on backends that take flows here, then the restored
  // ones (which win).
  void startPeers();
  // config reload and [tier] / [announce] (control_plane_tier.cpp): what a
  // running instance cannot take (a restart can), then applying the rest
  // once the reload committed; `changes` gets what changed.
  [[nodiscard]] std::optional<ApiError> reloadRefusesTierOrAnnounce(const Config& next) const;
  void applyTierAndAnnounce(const Config& before, Json& changes);
  void refreshExceptions();
  // The start-up rebuild from the backends' agents (control_plane_rebuild.cpp):
  // started by the constructor for every backend of a pool with
  // [pool.connections] token_file, polled each tick until it ends, then
  // handed to the keeper. mergeRebuilt() gives a snapshot just built the
  // rebuilt flows its own tables need, over the checkpoint's and peers'.
  void startRebuild(Millis now);
  void tickRebuild(Millis now);
  void mergeRebuilt(ForwardingSnapshot& snapshot, Millis now);
  Json rebuildJson() const;
  void rebuildMetrics(MetricsWriter& m) const;
  // The peer channel: poll, and rebuild the exceptions at most every 250 ms.
  void tickPeers(Millis now, bool statesChanged);
  // Make-before-break and the join gate (control_plane_step.cpp).
  void tickKeeper(Millis now);
  // What tick() returns: whether a snapshot is due now.
  bool stepDue(Millis now);
  bool heldStepReady(Millis now);
  [[nodiscard]] bool makeBeforeBreakApplies() const;
  // The held step is handed over: counters, and the workers forget it.
  void releaseHeldStep(Millis now);
  // Joining: false while a peer reported a table step within kJoinQuiet
  // (bounded by kJoinQuietLimit), with an event when held and when the
  // bound lets this instance in.
  bool joinQuiet(Millis now);
  [[nodiscard]] Json stepJson() const;
  void stepMetrics(MetricsWriter& m) const;
  // Load-aware placement (control_plane_placement.cpp): every [placement]
  // rate_interval and after every flow count, the backends' loads and each
  // placing VIP's total, written where the snapshots' VipPlacement reads.
  void samplePlacement(Millis now);
  [[nodiscard]] bool anyVipPlaces() const;
  [[nodiscard]] double placementLoad(std::uint32_t index) const;

  // Discovery (control_plane_discovery.cpp): each source's answer, damped
  // by its membership, is reconciled with config_: wanted and missing
  // backends are added like `backend add` (validated the same way, batched,
  // trial-built; they enter the tables when healthy and their next hop
  // resolves), discovered backends no longer wanted drain like `backend
  // remove`. Nothing else of an existing backend is touched, so the
  // operator's drain, disable and weight stay; a discovered backend the
  // operator removed is not added back while the source lists it.
  struct DiscoverySource {
    std::string pool;
    std::unique_ptr<DiscoveryFeed> feed;  // a watched file or a DNS name
    DiscoveryMembership membership{0};
    std::uint64_t reconciled = ~0ULL;  // membership generation last reconciled
    std::optional<Millis> lastRefresh;
    std::optional<Millis> lastChange;
    std::string lastChangeText;
    std::optional<std::string> lastError;
    std::vector<std::string> lastInvalid;  // of the last answer and reconcile
    std::uint64_t refreshes = 0, errors = 0, invalid = 0, joined = 0, left = 0;
  };
  void syncDiscoverySources();
  // Start-up, before the journal's replay: the sources' first answers join
  // the configuration directly, so the operator's overrides of discovered
  // backends (drain, disable, remove) find them and apply again. The last
  // process's discovered backends (tables.json) come first: those it had
  // in its tables are wanted as if listed just before the first answer (a
  // source that does not answer keeps them; one its answer lacks leaves
  // after the hold, as at run time), and those whose drain a source had
  // started are added back and drain on (restoreLeavingDiscovered) with
  // their drain's age, so their flows are not reset by a restart.
  void primeDiscovery(Millis now);
  // After the states are added at start: the restored leaving backends' drain.
  void applyRestoredLeaving(Millis now);
  // A discovered endpoint as a backend of `next` in pool s.pool, with the
  // checks of `backend add`; the problem otherwise.
  [[nodiscard]] std::variant<BackendConfig, std::string> discoveredBackendFor(
      const Config& next, const std::string& pool, const DiscoveredBackend& d) const;
  void restoreLeavingDiscovered(const DiscoverySource& s,
                                const std::vector<DiscoveredRecord>& saved);
  void tickDiscovery(Millis now, const std::vector<std::uint64_t>& gone);
  void reconcileDiscovery(DiscoverySource& s, Millis now, bool starting = false);
  // `file` plus the discovered backends that stay (their pool keeps its
  // source): the base the operator's overlay is merged with.
  [[nodiscard]] Config withDiscovered(const Config& file) const;
  // Discovered backends the operator removed (the journal's overlay): not
  // added back while their source lists them.
  void refreshOperatorRemoved();
  [[nodiscard]] bool removedAndGone(std::uint64_t id) const;
  // Discovered backends a reload keeps: their pool still has its source.
  [[nodiscard]] bool discoveryKeeps(const BackendConfig& b, const Config& next) const;
  [[nodiscard]] std::string originOf(const BackendConfig& b) const;
  void discoveryMetrics(MetricsWriter& m) const;
  std::vector<DiscoverySource> discovery_;
  std::map<std::uint64_t, std::string> discovered_;  // backend id -> its source (pool name)
  std::set<std::uint64_t> operatorRemoved_;          // discovered, removed by the operator
  // Discovered backends their source stopped listing: when (Unix ms) their
  // drain began, kept in tables.json until their removal completes.
  std::map<std::uint64_t, std::uint64_t> discoveredLeaving_;
  struct RestoredLeaving {
    std::uint64_t id = 0;
    std::string pool;
    Millis elapsed = 0;  // age of the drain at start
  };
  std::vector<RestoredLeaving> restoredLeaving_;  // start-up only

  // Intent.
  struct ApplyPlan {
    Config file;
    Config next;                          // file + overlay + backends still draining
    IntentOverlay overlay;                // the overrides that still apply
    std::vector<std::string> dropped;     // overrides that no longer apply
    std::vector<std::uint64_t> retire;    // no longer named: drain, then removed
    std::vector<std::string> retireNow;   // no longer named and cannot stay (pool or port gone)
    std::vector<std::uint64_t> unretire;  // draining because unnamed, named again
  };
  std::int64_t wallNow() const { return wallClock_(); }
  void report(const std::string& line);
  void replayIntent(Millis now);
  void applyIntentStates(Millis now, const std::string* only);
  std::variant<ApplyPlan, ApiError> planApply(Config file, const IntentOverlay& overlay);
  std::optional<ApiError> commitApply(ApplyPlan& plan, const std::string& cause, Json& changes);
  std::optional<std::string> trialBuild(const Config& next);
  // Journals an accepted command before it is applied; an error when it
  // could not be written (then the command must not be applied).
  std::optional<ApiError> journal(IntentRecord& record);
  // Tier-wide intent (tier_intent.hpp; control_plane_tier.cpp): loading it
  // at start, stamping a change taken here, merging a peer's dump and
  // bringing one backend to what the merged intent asks.
  void startTierIntent();
  void noteTierChange(const IntentRecord& record);
  void mergeTierIntent(const PeerIntentDump& dump);
  bool reconcileTier(const std::string& backend, const std::string& from);
  void saveAndPublishTier();
  [[nodiscard]] bool intentReady(Millis now) const;
  std::optional<ApiError> precheck(IntentOp op, std::uint64_t id) const;
  std::uint32_t fileBaseWeight(const BackendConfig& b) const;
  Json stampJson(const IntentStamp& s) const;
  // The VIP's current table as backend ids (0 for an empty slot).
  std::vector<std::uint64_t> tableIds(const std::string& vip) const;

  Config config_;      // running: file + overlay + backends still draining
  Config fileConfig_;  // the file as last loaded (the base of the overlay)
  std::string configPath_;
  SnapshotBuilder& builder_;
  Dataplane* dataplane_;
  Millis started_;
  Millis now_;
  EventLog events_;
  BackendStates states_;
  WeightPolicy policy_;
  HealthChecker health_;
  LoadScraper scraper_;
  ConnScraper connScraper_;  // the backends' agents: drains judged by what they hold
  LoopDurations loopDurations_;
  std::function<std::int64_t()> wallClock_;
  IntentJournal journal_;
  std::set<std::uint64_t> retiring_;  // draining because the file no longer names them
  std::vector<std::string> startupReport_;

  std::uint64_t generation_ = 0;
  // Control rounds (tick()) and the longest gap between two of them in the
  // current and the previous window of kRoundGapWindowMs (metrics: a stalled
  // loop shows once it runs again; while stalled, scrapes time out).
  std::uint64_t rounds_ = 0;
  std::optional<Millis> lastRound_;
  Millis roundWindowStart_ = 0;
  Millis roundGapMax_ = 0;
  Millis roundGapMaxPrevious_ = 0;
  bool dirty_ = true;
  std::uint64_t statesSeen_ = 0;
  Millis lastChurn_ = 0;
  std::uint64_t lastChurnSlot_ = 0;  // with peers: the wall-clock slot of the last step
  std::map<std::string, PolicyDecision> decisions_;                        // by VIP
  std::map<std::string, std::map<std::uint64_t, std::uint32_t>> weights_;  // applied, by VIP

  std::uint64_t flowCountAsked_ = 0;
  Millis flowCountAt_ = 0;  // when the pending count was asked; 0 = none pending
  Millis lastFlowRequest_ = 0;
  std::vector<LcoreFlowCounts> lastFlows_;
  std::uint64_t flowsCounted_ = 0;  // the request number lastFlows_ answers
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

  AffinityKeeper keeper_;
  TablesState publishedTables_;            // as of the newest snapshot taken
  Millis tablesChangedMs_ = 0;             // when a snapshot last carried other weights (tables)
  std::uint64_t tablesChangedUnixMs_ = 0;  // the same moment by the wall clock (0: never)
  // LB tier ([tier]): null without peers.
  std::unique_ptr<PeerChannel> peers_;
  ByteRateMeter byteRates_;
  std::vector<std::uint64_t> bytesScratch_;
  Millis nextRateSample_ = 0;
  std::uint64_t loadsEpoch_ = 0;  // flowsCounted_ as last published to the placement loads
  bool peersPending_ = false;     // the peers' exceptions changed since the last rebuild
  Millis peersBuiltAt_ = 0;
  std::uint64_t peersSyncGeneration_ = 0;  // the first snapshot built once synced
  bool peersSynced_ = false;               // latched: peersReady()
  TierIntent tierIntent_;                  // with peers: the tier's operator intent
  bool applyingTier_ = false;              // a command replays the tier's intent
  bool intentHoldNoted_ = false;           // the event "held: intent differs" was written
  // Warm-up: the start-up tables are the last process's (tables.json) and
  // the policy holds them until every backend has a settled health verdict
  // and, where its pool scrapes load, a successful sample; or kWarmupLimit.
  bool warmup_ = false;
  Millis warmupStarted_ = 0;
  std::optional<Millis> warmupTook_;  // how long the last warm-up held the tables

  // Make-before-break: the step built and held until its exceptions reached
  // the peers, and what the steps cost.
  struct StepStats {
    std::uint64_t steps = 0;      // moving steps held for their export
    std::uint64_t exports = 0;    // ... published once their records were written to the peers
    std::uint64_t timeouts = 0;   // ... published at make_before_break without that
    std::uint64_t coalesced = 0;  // held steps during which more changes came (one next step)
    Millis lastDelayMs = 0;       // build to publish of the last held step
    Millis maxDelayMs = 0;
    std::uint64_t unheld = 0;  // moving steps published at once (no peer to send to)
  };
  std::unique_ptr<ForwardingSnapshot> heldStep_;
  std::optional<TablesState> heldTables_;  // the weights it was built with
  Millis stepBuiltAt_ = 0;
  bool stepMoves_ = false;      // the held step moves table entries
  bool stepReady_ = false;      // tick() said so: takeSnapshot() hands it over
  bool stepTimedOut_ = false;   // ... at the bound
  bool stepCoalesced_ = false;  // changes came while it was held
  StepStats stepStats_;
  // The join gate: since when a peer's step holds the sync; events written.
  std::optional<Millis> quietWaitSince_;
  bool quietOk_ = false;  // latched once the gate let this instance in
  std::optional<Millis> quietWaitedMs_;
  // Start-up rebuild from the backends: null when no pool asks for it.
  std::unique_ptr<ConnRebuild> rebuild_;
  std::uint64_t rebuildGeneration_ = 0;  // the first snapshot carrying its flows
  bool rebuildHanded_ = false;           // its flows are with the keeper
  // The checkpoint's and peers' exceptions (refreshExceptions), kept while
  // rebuilt flows live so each snapshot can merge them (mergeRebuilt).
  std::vector<ExceptionEntry> baseExceptions_;
  std::shared_ptr<const ExceptionTable> baseTable_;

  AnnounceExchange* announce_ = nullptr;
  [[nodiscard]] Json announceJson() const;
};

}  // namespace spillway
