#include "control/intent/affinity_keeper.hpp"

#include "control/sys/durable_file.hpp"
#include "spillway/snapshot.hpp"

namespace spillway {
namespace {

// The flows.ckpt read at start is refused above this (10M exceptions fit).
constexpr std::size_t kMaxCheckpointBytes = std::size_t{1} << 30;
constexpr std::size_t kMaxTablesBytes = std::size_t{64} << 20;
// An export that has not finished by then is abandoned (a stalled worker);
// the next one starts over.
constexpr Millis kExportGiveUp = 30'000;

}  // namespace

AffinityKeeper::AffinityKeeper(Options options, EventLog& events)
    : options_(std::move(options)), events_(events) {}

std::string AffinityKeeper::path(const char* file) const {
  return options_.stateDir + "/" + file;
}

Millis AffinityKeeper::timeoutOf(FlowState s) const noexcept {
  switch (s) {
    case FlowState::Embryonic:
      return options_.timeouts.embryonic;
    case FlowState::Established:
    case FlowState::Ending:
      return options_.timeouts.established;
    case FlowState::Closing:
      return options_.timeouts.closing;
    case FlowState::Udp:
      return options_.timeouts.udp;
    case FlowState::Other:
      return options_.timeouts.other;
  }
  return 0;
}

const std::optional<TablesState>& AffinityKeeper::savedTables(Millis now, std::uint64_t unixMs) {
  if (savedTables_) return *savedTables_;
  std::optional<TablesState>& tables = savedTables_.emplace();
  if (!enabled()) return tables;
  std::string error;
  if (auto text = readStateFile(path(kTablesStateFile), kMaxTablesBytes, error)) {
    auto parsed = decodeTablesState(*text);
    if (auto* t = std::get_if<TablesState>(&parsed)) {
      tables = std::move(*t);
    } else {
      events_.append(now, "", kEventCheckpoint,
                     "ignored " + path(kTablesStateFile) + ": " + std::get<std::string>(parsed) +
                         " (the first tables follow the configuration)");
    }
  } else if (!error.empty()) {
    events_.append(now, "", kEventCheckpoint, "ignored tables state: " + error);
  }
  if (tables) {
    if (auto bytes = readStateFile(path(kSlotHistoryFile), kMaxCheckpointBytes, error)) {
      auto parsed = decodeSlotHistory(*bytes, options_.hashSeed, unixMs);
      if (auto* h = std::get_if<SlotHistory>(&parsed)) {
        tables->history = std::move(*h);
      } else {
        events_.append(now, "", kEventCheckpoint,
                       "ignored " + path(kSlotHistoryFile) + ": " + std::get<std::string>(parsed) +
                           " (second chance starts without history)");
      }
    } else if (!error.empty()) {
      events_.append(now, "", kEventCheckpoint, "ignored slot history: " + error);
    }
  }
  return tables;
}

std::optional<TablesState> AffinityKeeper::restore(Millis now, std::uint64_t unixMs) {
  if (!enabled()) return std::nullopt;
  (void)savedTables(now, unixMs);
  std::optional<TablesState> tables = std::move(*savedTables_);  // restore() takes it
  savedTables_->reset();
  std::string error;
  if (auto bytes = readStateFile(path(kFlowCheckpointFile), kMaxCheckpointBytes, error)) {
    auto parsed = decodeFlowCheckpoint(*bytes, options_.hashSeed);
    if (auto* c = std::get_if<FlowCheckpoint>(&parsed)) {
      const Millis down = unixMs > c->writtenUnixMs ? unixMs - c->writtenUnixMs : 0;
      std::size_t expired = 0;
      for (const FlowExceptionRecord& r : c->records) {
        const Millis spent = Millis{r.idleMs} + down;
        const Millis timeout = timeoutOf(r.state);
        if (spent >= timeout) {
          ++expired;
          continue;
        }
        restored_[r.hash] = Restored{r.backendId, r.state, now + (timeout - spent)};
      }
      stats_.restoredAtStart = restored_.size();
      stats_.restoredAlive = restored_.size();
      restoredChanged_ = !restored_.empty();
      events_.append(now, "", kEventCheckpoint,
                     "restored " + std::to_string(restored_.size()) + " flow exceptions from " +
                         path(kFlowCheckpointFile) + " (written " + std::to_string(down) +
                         " ms ago; " + std::to_string(expired) + " expired meanwhile)");
    } else {
      events_.append(now, "", kEventCheckpoint,
                     "ignored " + path(kFlowCheckpointFile) + ": " + std::get<std::string>(parsed));
    }
  } else if (!error.empty()) {
    events_.append(now, "", kEventCheckpoint, "ignored flow checkpoint: " + error);
  }
  return tables;
}

void AffinityKeeper::restoredEntries(const std::function<std::uint32_t(std::uint64_t id)>& indexOf,
                                     std::vector<ExceptionEntry>& out) const {
  out.reserve(out.size() + restored_.size());
  for (const auto& [hash, r] : restored_) {
    const std::uint32_t index = indexOf(r.backendId);
    if (index != 0)
      out.push_back(ExceptionEntry{hash, index, r.state, ExceptionOrigin::Checkpoint});
  }
}

void AffinityKeeper::addRebuilt(std::span<const RebuiltFlow> flows, Millis now) {
  const Millis deadline = now + options_.timeouts.established;
  rebuilt_.reserve(rebuilt_.size() + flows.size());
  for (const RebuiltFlow& f : flows) {
    rebuilt_[f.hash] = Rebuilt{f.backendId, f.vipTag, deadline};
    const auto r = restored_.find(f.hash);
    if (r != restored_.end() && r->second.backendId != f.backendId) {
      restored_.erase(r);
      ++stats_.rebuiltOverrode;
      restoredChanged_ = true;
    }
  }
  stats_.rebuiltAtStart += flows.size();
  stats_.rebuiltAlive = rebuilt_.size();
  stats_.restoredAlive = restored_.size();
}

void AffinityKeeper::rebuiltEntries(Millis now, const ForwardingSnapshot& snapshot,
                                    const ExceptionTable* base,
                                    const std::function<std::uint32_t(std::uint64_t id)>& indexOf,
                                    const std::function<bool(std::uint64_t id)>& keeps,
                                    std::vector<ExceptionEntry>& out) {
  std::size_t added = 0;
  for (auto it = rebuilt_.begin(); it != rebuilt_.end();) {
    const Rebuilt& r = it->second;
    if (r.deadline <= now) {
      it = rebuilt_.erase(it);
      continue;
    }
    const std::uint32_t index = indexOf(r.backendId);
    if (index != 0 && keeps(r.backendId)) {
      const std::uint32_t other = base != nullptr ? base->find(it->first).backend : 0;
      if ((other != 0 && other != index) ||
          isTableException(snapshot, it->first, index, r.vipTag)) {
        out.push_back(
            ExceptionEntry{it->first, index, FlowState::Established, ExceptionOrigin::Backend});
        ++added;
      }
    }
    ++it;
  }
  stats_.rebuiltAlive = rebuilt_.size();
  stats_.rebuiltInTable = added;
}

bool AffinityKeeper::takeRestoredChanged() noexcept {
  const bool c = restoredChanged_;
  restoredChanged_ = false;
  return c;
}

void AffinityKeeper::tick(Millis now, std::uint64_t unixMs, std::uint64_t published,
                          std::uint64_t applied, const std::function<TablesState()>& tables,
                          const std::function<std::uint64_t(std::uint32_t)>& idOf,
                          const ExceptionExportHooks& hooks) {
  if ((!enabled() && options_.exportInterval == 0 && ahead_ == Ahead::None) || !hooks.request ||
      !hooks.collect) {
    return;
  }
  finishWrite(now, false);
  if (exporting_) {
    if (auto flows = hooks.collect(exportN_)) {
      exporting_ = false;
      if (ahead_ == Ahead::Exporting) {
        syncOnly_ = true;
        complete(now, unixMs, *flows, TablesState{}, idOf);
        ahead_ = Ahead::Shared;
        return;
      }
      const bool writes = !syncOnly_;
      complete(now, unixMs, *flows, std::move(*exportTables_), idOf);
      exportTables_.reset();
      if (writes) checkpointedGeneration_ = exportGeneration_;
      exportedGeneration_ = exportGeneration_;
    } else if (now - exportStarted_ > kExportGiveUp) {
      exporting_ = false;
      if (ahead_ == Ahead::Exporting) ahead_ = Ahead::Wanted;
      ++stats_.failures;
      stats_.lastError = "a worker did not finish exporting its flows within 30 s";
      events_.append(now, "", kEventCheckpoint, "checkpoint abandoned: " + stats_.lastError);
    }
    return;
  }
  if (ahead_ == Ahead::Wanted) {
    if (!hooks.requestAhead || applied < published || published == 0) return;
    ahead_ = Ahead::Exporting;
    exporting_ = true;
    exportStarted_ = now;
    hooks.requestAhead(++exportN_);
    return;
  }
  if (ahead_ != Ahead::None) return;  // shared: nothing replaces that set before the step
  const bool changed = published > checkpointedGeneration_;
  const bool placed = placedTotal_ != placedAtWrite_;
  const bool write = enabled() && !writer_.busy() &&
                     (!lastWriteStart_ || (changed && now >= *lastStart_ + options_.minInterval) ||
                      (placed && now >= *lastWriteStart_ + options_.placedInterval) ||
                      now >= *lastWriteStart_ + options_.maxInterval);
  const bool sync =
      options_.exportInterval > 0 &&
      (!lastStart_ || now >= *lastStart_ + options_.exportInterval ||
       (published > exportedGeneration_ && now >= *lastStart_ + options_.minInterval));
  if (!(write || sync) || applied < published || published == 0) return;
  syncOnly_ = !write;
  if (write) {
    lastWriteStart_ = now;
    placedAtWrite_ = placedTotal_;
  }
  exporting_ = true;
  exportStarted_ = now;
  lastStart_ = now;
  exportGeneration_ = published;
  exportTables_ = tables();
  hooks.request(++exportN_);
}

void AffinityKeeper::startAhead() noexcept {
  if (ahead_ == Ahead::None) ahead_ = Ahead::Wanted;
}

void AffinityKeeper::endAhead() noexcept {
  if (ahead_ == Ahead::Exporting && exporting_) {
    exporting_ = false;  // abandoned: its chunks are dropped by the next request
    syncOnly_ = false;
  }
  ahead_ = Ahead::None;
}

void AffinityKeeper::finalCheckpoint(Millis now, std::uint64_t unixMs,
                                     std::vector<ExportedFlow> flows, const TablesState& tables,
                                     const std::function<std::uint64_t(std::uint32_t)>& idOf) {
  if (!enabled()) return;
  finishWrite(now, true);  // the one in flight first: files are replaced in order
  exportStarted_ = now;
  syncOnly_ = false;
  complete(now, unixMs, flows, tables, idOf);
  finishWrite(now, true);
}

void AffinityKeeper::complete(Millis now, std::uint64_t unixMs,
                              const std::vector<ExportedFlow>& flows, TablesState tables,
                              const std::function<std::uint64_t(std::uint32_t)>& idOf) {
  std::vector<FlowExceptionRecord>& records = records_;
  records.clear();
  records.reserve(flows.size() + restored_.size());
  // Tracked flows, with how long their entries live on without a packet.
  std::unordered_map<std::uint64_t, Millis> tracked;
  tracked.reserve(flows.size());
  for (const ExportedFlow& f : flows) {
    const std::uint64_t id = idOf(f.backend);
    if (id == 0) continue;
    const Millis timeout = timeoutOf(f.state);
    const Millis left = timeout > f.idleMs ? timeout - f.idleMs : 0;
    if (!tracked.emplace(f.hash, left).second) continue;  // on two lcores: keep the first
    records.push_back(FlowExceptionRecord{f.hash, id, f.state, f.idleMs});
  }
  trackedCount_ = records.size();
  lastExportAt_ = now;
  const std::size_t before = restored_.size();
  for (auto it = restored_.begin(); it != restored_.end();) {
    // A restored flow leaves once a worker tracks it for at least as long as
    // the restored record would have kept it.
    auto t = tracked.find(it->first);
    const bool covered = t != tracked.end() && now + t->second >= it->second.deadline;
    if (it->second.deadline <= now || covered) {
      it = restored_.erase(it);
      continue;
    }
    const Millis left = it->second.deadline - now;
    const Millis timeout = timeoutOf(it->second.state);
    records.push_back(
        FlowExceptionRecord{it->first, it->second.backendId, it->second.state,
                            static_cast<std::uint32_t>(timeout > left ? timeout - left : 0)});
    ++it;
  }
  if (restored_.size() != before) restoredChanged_ = true;
  // A rebuilt flow that a worker tracks as an exception for at least as
  // long is kept by the export from now on.
  for (auto it = rebuilt_.begin(); it != rebuilt_.end();) {
    auto t = tracked.find(it->first);
    if (it->second.deadline <= now ||
        (t != tracked.end() && now + t->second >= it->second.deadline)) {
      it = rebuilt_.erase(it);
    } else {
      ++it;
    }
  }
  stats_.rebuiltAlive = rebuilt_.size();
  stats_.restoredAlive = restored_.size();
  if (options_.onExport) options_.onExport(records);
  if (std::exchange(syncOnly_, false)) return;

  if (!dirReady_) {
    if (auto e = ensureStateDirectory(options_.stateDir)) {
      ++stats_.failures;
      stats_.lastError = *e;
      events_.append(now, "", kEventCheckpoint, "checkpoint failed: " + *e);
      return;
    }
    dirReady_ = true;
  }
  tables.writtenUnixMs = unixMs;
  // tables.json last: a process killed part-way through the batch (or a
  // file that fails, which stops the batch) leaves the previous tables
  // beside a history at least as new, never newer tables beside an older
  // history. The history of a step includes its moves; restored with the
  // tables before the step, the step's slots move again from their owners
  // there and keep the origins the tier's other instances name. Tables with
  // an older history would make the restored owners the origins of those
  // slots' runs, and second chance would name them instead of the owner the
  // flows began on (lb-kill-after-step: a kill 50 ms after a step).
  std::vector<DurableWriter::File> files;
  files.push_back(
      {path(kSlotHistoryFile), encodeSlotHistory(options_.hashSeed, unixMs, tables.history)});
  files.push_back(
      {path(kFlowCheckpointFile), encodeFlowCheckpoint(options_.hashSeed, unixMs, records)});
  files.push_back({path(kTablesStateFile), encodeTablesState(tables)});
  const Writing w{exportStarted_, tables.generation, records.size(), files[1].bytes.size()};
  if (!writer_.submit(std::move(files))) return;  // not reached: tick() waits for the writer
  writing_ = w;
  finishWrite(now, false);  // inline mode: done already
}

void AffinityKeeper::finishWrite(Millis now, bool wait) {
  if (!writing_) return;
  std::optional<DurableWriter::Result> r = wait ? writer_.wait() : writer_.poll();
  if (!r) return;
  const Writing w = *std::exchange(writing_, std::nullopt);
  if (r->error) {
    ++stats_.failures;
    stats_.lastError = *r->error;
    dirReady_ = false;
    events_.append(now, "", kEventCheckpoint, "checkpoint failed: " + *r->error);
    return;
  }
  // An event for the first checkpoint, the first after a failure, and then
  // at most one a minute (status and the metrics show every one).
  const bool quiet = lastEventAt_ && stats_.lastError.empty() && now < *lastEventAt_ + 60'000;
  ++stats_.checkpoints;
  stats_.lastAt = now;
  stats_.lastGeneration = w.generation;
  stats_.lastExceptions = w.records;
  stats_.lastBytes = w.bytes;
  stats_.lastWriteMs = r->writeMs;
  // Inline or waited for, `now` is still the export's completion time: add
  // the write; polled, `now` is after it.
  stats_.lastDurationMs = now - w.exportStarted +
                          (wait || writer_.mode() == DurableWriter::Mode::Inline ? r->writeMs : 0);
  stats_.lastError.clear();
  if (!quiet) {
    lastEventAt_ = now;
    events_.append(now, "", kEventCheckpoint,
                   "checkpoint: generation " + std::to_string(w.generation) + ", " +
                       std::to_string(w.records) + " flow exceptions (" +
                       std::to_string(restored_.size()) + " restored), " + std::to_string(w.bytes) +
                       " bytes in " + std::to_string(r->writeMs) + " ms");
  }
}

}  // namespace spillway
