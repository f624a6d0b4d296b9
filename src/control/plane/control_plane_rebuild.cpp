// The start-up rebuild of flow exceptions from the backends' connection
// agents (control/health/conn_rebuild.hpp; the keeper's side in
// control/intent/affinity_keeper.hpp).
//
// When. At every start, with or without a checkpoint: a checkpoint misses
// the flows whose entries moved after it was written (up to minInterval +
// the export before a kill -9), a peer may be gone too, and the backend is
// the truth for each flow; the cost is one request per backend (bounded, in
// parallel, before the announcement, which waits anyway for health and load).
// A pool opts in with [pool.connections] token_file (rebuild = false opts out).
#include <algorithm>

#include "control/api/metrics_http.hpp"
#include "control/plane/control_plane.hpp"
#include "control/plane/control_plane_json.hpp"

namespace spillway {

using namespace plane_json;  // NOLINT(google-build-using-namespace)

namespace {

// Flows kept over all backends: 4M exceptions (~130 MiB of exception table
// at worst, transiently twice while a snapshot is merged).
constexpr std::size_t kMaxRebuiltFlows = std::size_t{4} << 20;
// Backends named one by one in the summary event; the others are counted.
constexpr std::size_t kRebuildErrorsNamed = 8;

}  // namespace

void ControlPlane::startRebuild(Millis now) {
  std::vector<RebuildTarget> targets;
  for (const BackendConfig& b : config_.backends) {
    const ConnSourceConfig& c = config_.pools[b.poolIndex].connections;
    if (!c.enabled || !c.rebuild || c.token.empty()) continue;
    RebuildTarget t;
    t.id = b.id;
    t.name = b.name;
    t.address = b.address;
    t.port = c.port;
    t.path = c.listPath;
    t.token = c.token;
    t.timeout = c.rebuildTimeout;
    for (const VipConfig& v : config_.vips) {
      if (v.protocol != IpProto::Tcp) continue;  // the agent lists TCP sockets
      if (std::find(v.poolIndices.begin(), v.poolIndices.end(), b.poolIndex) ==
          v.poolIndices.end()) {
        continue;
      }
      const VipKey key{v.address.bytes, v.address.version, static_cast<std::uint8_t>(v.protocol),
                       v.port};
      t.vips.push_back(RebuildVip{v.address, v.port, vipTagOf(key)});
    }
    if (!t.vips.empty()) targets.push_back(std::move(t));
  }
  if (targets.empty()) return;
  const std::size_t n = targets.size();
  rebuild_ = std::make_unique<ConnRebuild>(std::move(targets), config_.dataplane.hashSeed,
                                           kMaxRebuiltFlows);
  events_.append(now, "", kEventRebuild,
                 "asking " + std::to_string(n) +
                     " backend(s) for the connections they hold before announcing (at most " +
                     std::to_string(kConnRebuildLimit) + " ms)");
  rebuild_->poll(now);
}

bool ControlPlane::rebuildReady() const {
  if (!rebuild_) return true;
  if (!rebuildHanded_) return false;
  return dataplane_ == nullptr || dataplane_->appliedGeneration() >= rebuildGeneration_;
}

void ControlPlane::tickRebuild(Millis now) {
  if (!rebuild_ || rebuildHanded_) return;
  rebuild_->poll(now);
  if (!rebuild_->done()) return;
  rebuildHanded_ = true;
  keeper_.addRebuilt(rebuild_->flows(), now);
  const RebuildTotals& t = rebuild_->totals();
  std::string failures;
  std::size_t named = 0;
  for (const RebuildBackendStatus& s : rebuild_->backends()) {
    if (s.outcome != RebuildBackendStatus::Outcome::Failed) continue;
    if (named++ < kRebuildErrorsNamed) {
      failures += (failures.empty() ? "; not answered: " : ", ") + s.name + " (" + s.error + ")";
    }
  }
  if (named > kRebuildErrorsNamed) {
    failures += " and " + std::to_string(named - kRebuildErrorsNamed) + " more";
  }
  const Millis took = rebuild_->startedAt() ? now - *rebuild_->startedAt() : 0;
  events_.append(
      now, "", kEventRebuild,
      "rebuilt " + std::to_string(t.flows) + " flows from " + std::to_string(t.answered) + " of " +
          std::to_string(rebuild_->backends().size()) + " backend(s) in " + std::to_string(took) +
          " ms (" + std::to_string(t.truncated) + " list(s) truncated, " +
          std::to_string(t.conflicts) + " conflict(s), " + std::to_string(t.invalid) +
          " entr(ies) refused, " + std::to_string(t.overCap) + " over the cap, " +
          std::to_string(keeper_.stats().rebuiltOverrode) + " checkpoint record(s) overridden)" +
          failures);
  // The base (checkpoint and peers) is kept from now on for the merges.
  refreshExceptions();
  dirty_ = true;
  rebuildGeneration_ = generation_ + 1;  // takeSnapshot() publishes it next
}

void ControlPlane::mergeRebuilt(ForwardingSnapshot& snapshot, Millis now) {
  std::vector<ExceptionEntry> entries = baseExceptions_;
  const std::size_t before = entries.size();
  keeper_.rebuiltEntries(
      now, snapshot, baseTable_.get(), [&](std::uint64_t id) { return builder_.indexOf(id); },
      [&](std::uint64_t id) {
        const std::optional<BackendState> s = states_.state(id);
        return s && keepsTrackedFlows(*s);
      },
      entries);
  if (entries.size() == before) return;  // the base alone, as built
  snapshot.exceptions = std::make_shared<const ExceptionTable>(entries);
}

Json ControlPlane::rebuildJson() const {
  if (!rebuild_) return Json{{"enabled", false}};
  const RebuildTotals& t = rebuild_->totals();
  const CheckpointStats& c = keeper_.stats();
  Json backends = Json::array();
  for (const RebuildBackendStatus& s : rebuild_->backends()) {
    const char* outcome = s.outcome == RebuildBackendStatus::Outcome::Answered ? "answered"
                          : s.outcome == RebuildBackendStatus::Outcome::Failed ? "failed"
                                                                               : "pending";
    Json b{{"backend", s.name}, {"outcome", outcome}, {"ms", s.tookMs}};
    if (s.outcome == RebuildBackendStatus::Outcome::Failed) b["error"] = s.error;
    if (s.outcome == RebuildBackendStatus::Outcome::Answered) {
      b["listed"] = s.listed;
      b["total"] = s.total;
      b["flows"] = s.flows;
      b["truncated"] = s.truncated;
      b["refused"] = s.invalid + s.foreign;
    }
    backends.push_back(std::move(b));
  }
  return Json{{"enabled", true},
              {"done", rebuild_->done()},
              {"ready", rebuildReady()},
              {"flows", t.flows},
              {"alive", c.rebuiltAlive},
              {"in_table", c.rebuiltInTable},
              {"answered", t.answered},
              {"failed", t.failed},
              {"truncated", t.truncated},
              {"conflicts", t.conflicts},
              {"refused", t.invalid},
              {"over_cap", t.overCap},
              {"overrode_checkpoint", c.rebuiltOverrode},
              {"backends", std::move(backends)}};
}

void ControlPlane::rebuildMetrics(MetricsWriter& m) const {
  if (!rebuild_) return;
  const RebuildTotals& t = rebuild_->totals();
  const CheckpointStats& c = keeper_.stats();
  m.gauge("spillway_rebuilt_flows",
          "Flows the backends' agents listed at start (the start-up rebuild).", {},
          static_cast<double>(t.flows));
  m.gauge("spillway_rebuilt_exceptions",
          "Rebuilt flows in the last snapshot's exception table (their table entry moved).", {},
          static_cast<double>(c.rebuiltInTable));
  m.gauge("spillway_rebuilt_alive", "Rebuilt flows still kept (neither expired nor tracked).", {},
          static_cast<double>(c.rebuiltAlive));
  for (const RebuildBackendStatus& s : rebuild_->backends()) {
    m.gauge("spillway_rebuild_backend_failed",
            "1 when the backend's agent gave no usable connection list at start.",
            {{"backend", s.name}}, s.outcome == RebuildBackendStatus::Outcome::Failed ? 1.0 : 0.0);
    if (s.outcome == RebuildBackendStatus::Outcome::Answered) {
      m.gauge("spillway_rebuild_backend_refused_entries",
              "Entries of the backend's list that were refused (malformed or not a VIP of it).",
              {{"backend", s.name}}, static_cast<double>(s.invalid + s.foreign));
      m.gauge("spillway_rebuild_backend_truncated",
              "1 when the backend's agent cut its list (--list-cap).", {{"backend", s.name}},
              s.truncated ? 1.0 : 0.0);
    }
  }
}

}  // namespace spillway
