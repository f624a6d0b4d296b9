// Flow affinity across restarts and crashes: the control thread's side of
// flow exceptions (spillway/flow_exceptions.hpp).
//
// Checkpoints. After a snapshot that moved table entries is in use by every
// worker (the published generation is applied), and at least every
// maxInterval, the keeper asks the workers for their exceptions (a slice of
// flow table per drain period, against the snapshot they use), maps indices
// to backend ids, merges the flows restored at start that are still alive
// and not tracked again, and writes flows.ckpt and tables.json
// (flow_checkpoint.hpp) with the weights the tables were published with.
// Checkpoints start at most every minInterval (batching bursts of changes).
// On SIGTERM the daemon stops the workers and hands the keeper every
// exception of the stopped tables for a last checkpoint.
//
// Flows placed off their table entry by bytes (spillway/placement.hpp) are
// exceptions from their first packet, with no table change: when the data
// path's count of them grew (notePlacedOffTable), a checkpoint starts
// placedInterval after the last one.
//
// Loss window after kill -9: a flow is lost only when its entry moved after
// the last completed checkpoint: at most minInterval + the export walk + the
// write after a table change (measured in BENCHMARKS.md), placedInterval +
// the walk + the write for a flow placed by bytes, and nothing for flows
// whose entry never moved. Flows that began after the last
// checkpoint on the current tables need nothing: the restarted daemon
// publishes the same tables (tables.json) until its warm-up ends.
//
// Make-before-break (ControlPlane, control_plane_step.cpp). With peers, a
// snapshot that moves table entries is built and held; startAhead() asks for
// an export of every flow that is an exception against the snapshot the
// workers use or against the held one (the hooks' requestAhead), as soon as
// no other export is in flight and every worker runs the published
// generation (so the union covers everything the peers held before: the
// peers replace this instance's set with each export's). Its records go to
// onExport like a sync export's (no checkpoint is written); aheadShared()
// then says so, and no other export starts until endAhead() (the step was
// published), which abandons one still in flight.
//
// Restore. At start the keeper reads both files; restored exceptions keep a
// deadline (their state's idle timeout, less their idle time at the
// checkpoint, less the downtime) and go into every snapshot's
// ExceptionTable, consulted when a worker's flow table misses. A restored
// flow seen again in a worker's export is tracked there and leaves the
// restored set; the rest leave at their deadline.
//
// Rebuilt from the backends (conn_rebuild.hpp, ControlPlane's start-up
// rebuild): flows a backend's agent says it holds, kept with a deadline of
// the established idle timeout from the rebuild (their idle time is
// unknown). Unlike restored and peer exceptions, which name the backend a
// table once gave, a rebuilt flow goes into a snapshot's exception table
// only where that snapshot's own tables would send it elsewhere
// (isTableException) or where a checkpoint or peer exception names another
// backend: the backend holding the connection wins over every other layer
// but the worker's flow table (it is the truth for that flow). The test runs
// against each snapshot as it is built (rebuiltEntries), so a table step
// after the rebuild moves no untracked flow. They are neither checkpointed
// nor sent to peers: every start rebuilds, on every instance. They leave at
// their deadline or once a worker tracks the flow as an exception for longer.
//
// Thread contract: control thread only. Time is injected (`now`, steady ms;
// `unixMs` for what is written to disk).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "control/api/event_log.hpp"
#include "control/health/conn_rebuild.hpp"
#include "control/intent/flow_checkpoint.hpp"
#include "control/sys/durable_writer.hpp"
#include "spillway/flow_exceptions.hpp"
#include "spillway/flow_table.hpp"

namespace spillway {

// How the keeper reaches the workers (the control plane wraps its Dataplane).
struct ExceptionExportHooks {
  std::function<void(std::uint64_t n)> request;
  // Every worker's exceptions for request n once all finished; nullopt until.
  std::function<std::optional<std::vector<ExportedFlow>>(std::uint64_t n)> collect;
  // Request n against the snapshot about to be published as well
  // (make-before-break; spillway/dataplane.hpp). Unset: none is made.
  std::function<void(std::uint64_t n)> requestAhead{};
};

struct CheckpointStats {
  std::uint64_t checkpoints = 0;
  std::uint64_t failures = 0;
  std::optional<Millis> lastAt;  // steady ms of the last completed checkpoint
  std::uint64_t lastGeneration = 0;
  std::size_t lastExceptions = 0;  // records written (tracked + restored)
  std::size_t lastBytes = 0;
  Millis lastDurationMs = 0;  // from the export request to the file on disk
  Millis lastWriteMs = 0;     // encoding and writing alone
  std::string lastError;
  std::size_t restoredAtStart = 0;
  std::size_t restoredAlive = 0;    // restored, neither expired nor tracked again
  std::size_t rebuiltAtStart = 0;   // flows the backends listed (addRebuilt)
  std::size_t rebuiltAlive = 0;     // rebuilt, neither expired nor tracked as exceptions
  std::size_t rebuiltInTable = 0;   // in the last snapshot's exception table
  std::size_t rebuiltOverrode = 0;  // restored records a backend contradicted (dropped)
};

class AffinityKeeper {
 public:
  struct Options {
    std::string stateDir;  // "" = keep nothing
    std::uint64_t hashSeed = 0;
    FlowTimeouts timeouts{};
    Millis minInterval = 250;
    Millis maxInterval = 60'000;
    Millis placedInterval = 1'000;
    // LB tier (peer_channel.hpp): also export this often, and after a table
    // change (minInterval apart) even without a stateDir, and hand every
    // export's records (tracked and restored) to onExport; an export due
    // only to this writes no checkpoint. 0 = no such exports.
    Millis exportInterval = 0;
    std::function<void(std::span<const FlowExceptionRecord>)> onExport;
  };

  AffinityKeeper(Options options, EventLog& events);

  [[nodiscard]] bool enabled() const noexcept { return !options_.stateDir.empty(); }
  // Checkpoint files are written on a thread of their own (the daemon; see
  // durable_writer.hpp), not inline in tick() (the default, for tests that
  // step time by hand). A checkpoint counts once its files are durable; no
  // new one starts while one is being written (exports for the peers go on).
  void writeInBackground() { (void)writer_.setMode(DurableWriter::Mode::Thread); }
  [[nodiscard]] DurableWriter& writerForTest() noexcept { return writer_; }
  // A reload's [tier] sync_interval (0: no peers, no such exports).
  void setExportInterval(Millis interval) noexcept { options_.exportInterval = interval; }

  // At start: what the previous process left. Returns its tables state when
  // usable; restored exceptions are kept (see restoredEntries()).
  std::optional<TablesState> restore(Millis now, std::uint64_t unixMs);
  // The previous process's tables state (tables.json and history.bin), read
  // once (a damaged file is said once); restore() takes it (empty after).
  // Lets the plane read the discovered backends before it builds its
  // configuration.
  const std::optional<TablesState>& savedTables(Millis now, std::uint64_t unixMs);

  // The restored exceptions still alive, as ExceptionTable entries over the
  // indices `indexOf` gives (0: unknown backend, skipped), appended to `out`.
  void restoredEntries(const std::function<std::uint32_t(std::uint64_t id)>& indexOf,
                       std::vector<ExceptionEntry>& out) const;
  // True once after the restored set changed (so the caller republishes).
  bool takeRestoredChanged() noexcept;

  // The start-up rebuild's flows (see the design note): kept until now +
  // the established timeout; a restored record of the same flow on another
  // backend is dropped.
  void addRebuilt(std::span<const RebuiltFlow> flows, Millis now);
  [[nodiscard]] bool hasRebuilt() const noexcept { return !rebuilt_.empty(); }
  // Appends to `out` the rebuilt flows that `snapshot` needs as exceptions:
  // on a backend `indexOf` knows (0: skipped) and `keeps` accepts, where the
  // snapshot's tables would place the flow elsewhere or `base` (the
  // checkpoint's and peers' exceptions) names another backend. Drops the
  // expired ones first.
  void rebuiltEntries(Millis now, const ForwardingSnapshot& snapshot, const ExceptionTable* base,
                      const std::function<std::uint32_t(std::uint64_t id)>& indexOf,
                      const std::function<bool(std::uint64_t id)>& keeps,
                      std::vector<ExceptionEntry>& out);

  // Control loop: starts and completes checkpoints. `published`: the newest
  // snapshot generation; `applied`: the oldest any worker uses; `tables`:
  // what to write as tables.json with it; `idOf`: backend index -> id (0
  // when none).
  void tick(Millis now, std::uint64_t unixMs, std::uint64_t published, std::uint64_t applied,
            const std::function<TablesState()>& tables,
            const std::function<std::uint64_t(std::uint32_t index)>& idOf,
            const ExceptionExportHooks& hooks);
  // The last checkpoint, from a stopped dataplane's flows.
  void finalCheckpoint(Millis now, std::uint64_t unixMs, std::vector<ExportedFlow> flows,
                       const TablesState& tables,
                       const std::function<std::uint64_t(std::uint32_t index)>& idOf);

  // The data path's running count of flows placed off their table entry.
  void notePlacedOffTable(std::uint64_t total) noexcept { placedTotal_ = total; }

  [[nodiscard]] const CheckpointStats& stats() const noexcept { return stats_; }
  // The last completed export's tracked flows: exceptions a worker's flow
  // table holds (on a backend their table no longer gives), by hash and
  // backend id; and when it completed (steady ms). Kept until the next export
  // (its records are built in the same vector).
  [[nodiscard]] std::span<const FlowExceptionRecord> lastTracked() const noexcept {
    return {records_.data(), trackedCount_};
  }
  [[nodiscard]] std::optional<Millis> lastExportAt() const noexcept { return lastExportAt_; }
  // An export asked of the workers and not yet collected.
  [[nodiscard]] bool exporting() const noexcept { return exporting_; }

  // Make-before-break (see above).
  void startAhead() noexcept;
  [[nodiscard]] bool aheadShared() const noexcept { return ahead_ == Ahead::Shared; }
  void endAhead() noexcept;

 private:
  struct Restored {
    std::uint64_t backendId = 0;
    FlowState state = FlowState::Established;
    Millis deadline = 0;
  };
  void complete(Millis now, std::uint64_t unixMs, const std::vector<ExportedFlow>& flows,
                TablesState tables, const std::function<std::uint64_t(std::uint32_t)>& idOf);
  // Takes the writer's result, if any (waiting for it when `wait`).
  void finishWrite(Millis now, bool wait);
  [[nodiscard]] Millis timeoutOf(FlowState s) const noexcept;
  [[nodiscard]] std::string path(const char* file) const;

  enum class Ahead : std::uint8_t { None, Wanted, Exporting, Shared };

  Options options_;
  EventLog& events_;
  Ahead ahead_ = Ahead::None;
  CheckpointStats stats_;
  std::unordered_map<std::uint64_t, Restored> restored_;  // by flow hash
  // The last export's records: the tracked flows first (trackedCount_), then
  // the restored ones.
  std::vector<FlowExceptionRecord> records_;
  std::size_t trackedCount_ = 0;
  std::optional<Millis> lastExportAt_;
  struct Rebuilt {
    std::uint64_t backendId = 0;
    std::uint8_t vipTag = 0;
    Millis deadline = 0;
  };
  std::unordered_map<std::uint64_t, Rebuilt> rebuilt_;  // by flow hash
  bool restoredChanged_ = false;
  bool dirReady_ = false;
  std::optional<std::optional<TablesState>> savedTables_;  // outer: read yet

  std::uint64_t exportN_ = 0;
  bool exporting_ = false;
  Millis exportStarted_ = 0;
  std::uint64_t exportGeneration_ = 0;
  std::optional<TablesState> exportTables_;
  std::uint64_t checkpointedGeneration_ = 0;
  std::optional<Millis> lastStart_;
  std::optional<Millis> lastWriteStart_;  // of the last export that writes a checkpoint
  bool syncOnly_ = false;                 // the export in flight writes no checkpoint
  std::uint64_t exportedGeneration_ = 0;  // of the last export completed (any kind)
  std::optional<Millis> lastEventAt_;     // of the last "checkpoint" event
  std::uint64_t placedTotal_ = 0;
  std::uint64_t placedAtWrite_ = 0;  // placedTotal_ when the last writing export started

  // The checkpoint being written: what its stats will say once durable.
  struct Writing {
    Millis exportStarted = 0;
    std::uint64_t generation = 0;
    std::size_t records = 0;
    std::size_t bytes = 0;
  };
  DurableWriter writer_;
  std::optional<Writing> writing_;
};

}  // namespace spillway
