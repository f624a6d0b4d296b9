// The ControlPlane's Prometheus exposition (metricsText): every metric the
// metrics endpoint serves, from the plane's state and the data path's counters.
#include <algorithm>

#include "control/api/metrics_http.hpp"
#include "control/backends/table_digest.hpp"
#include "control/plane/control_plane.hpp"
#include "control/plane/control_plane_json.hpp"
#include "control/plane/stats_view.hpp"

namespace spillway {

using namespace plane_json;  // NOLINT(google-build-using-namespace)

// --- Metrics --------------------------------------------------------------------

std::string ControlPlane::metricsText() {
  MetricsWriter m;
  m.gauge("spillway_snapshot_generation", "Generation of the published forwarding snapshot.", {},
          static_cast<double>(generation_));
  m.counter("spillway_snapshot_publishes_total", "Snapshots published.", {},
            static_cast<double>(publishes_));
  if (!applyLatencies_.empty()) {
    m.gauge("spillway_publish_latency_seconds",
            "Time from the latest decision to its use by every worker.", {},
            static_cast<double>(applyLatencies_.back()) / 1000.0);
  }
  m.gauge("spillway_warmup", "1 while the start-up tables are held (warm-up).", {},
          warmup_ ? 1 : 0);
  m.counter("spillway_control_loop_rounds_total", "Rounds of the control loop.", {},
            static_cast<double>(rounds_));
  m.gauge("spillway_control_loop_max_gap_seconds",
          "Longest time between two control-loop rounds over the last 30 to 60 s.", {},
          static_cast<double>(std::max(roundGapMax_, roundGapMaxPrevious_)) / 1000.0);
  if (loopDurations_.count() > 0) {
    std::array<HistogramBucket, LoopDurations::kBounds.size()> buckets{};
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i < buckets.size(); ++i) {
      cumulative += loopDurations_.perBucket()[i];
      buckets[i] = HistogramBucket{LoopDurations::kBounds[i], cumulative};
    }
    m.histogram("spillway_control_loop_tick_seconds",
                "Duration of the control loop's rounds (checks, scrapes, CLI, metrics, publish).",
                {}, buckets, loopDurations_.sum(), loopDurations_.count());
    m.gauge("spillway_control_loop_tick_max_seconds",
            "The longest control loop round since the daemon started.", {}, loopDurations_.max());
  }
  {
    const auto outcome = announce_ ? std::optional(announce_->outcome()) : std::nullopt;
    appendAnnounceMetrics(m, outcome ? &*outcome : nullptr,
                          journal_.overlay().lbDrained().has_value());
  }
  if (keeper_.enabled()) {
    const CheckpointStats& c = keeper_.stats();
    m.counter("spillway_checkpoints_total", "Flow-affinity checkpoints written.", {},
              static_cast<double>(c.checkpoints));
    m.counter("spillway_checkpoint_failures_total", "Flow-affinity checkpoints that failed.", {},
              static_cast<double>(c.failures));
    m.gauge("spillway_checkpoint_exceptions", "Flow exceptions in the last checkpoint.", {},
            static_cast<double>(c.lastExceptions));
    m.gauge("spillway_checkpoint_bytes", "Size of the last flow checkpoint.", {},
            static_cast<double>(c.lastBytes));
    if (c.lastAt) {
      m.gauge("spillway_checkpoint_age_seconds", "Time since the last completed checkpoint.", {},
              static_cast<double>(now_ - *c.lastAt) / 1000.0);
    }
    m.gauge("spillway_restored_exceptions", "Restored flow exceptions still alive.", {},
            static_cast<double>(c.restoredAlive));
  }
  rebuildMetrics(m);
  if (peers_) peers_->metrics(m, now_);
  stepMetrics(m);
  const BackendIndexStats ix = builder_.indexStats();
  m.gauge("spillway_backend_indices_max", "Backends that may be known at once.", {},
          ix.maxBackends);
  for (const auto& [use, n] : {std::pair{"in_use", ix.inUse}, std::pair{"retiring", ix.retiring},
                               std::pair{"purging", ix.purging}, std::pair{"free", ix.free}}) {
    m.gauge("spillway_backend_indices",
            "Backend indices by use (retiring: waiting for the grace period; purging: "
            "flow-table entries being erased).",
            {{"use", use}}, n);
  }
  m.counter("spillway_backend_indices_recycled_total", "Backend indices recycled for reuse.", {},
            static_cast<double>(ix.recycled));
  m.gauge("spillway_backends_held_for_next_hop",
          "Backends added at run time held out of the tables until their next hop resolves.", {},
          static_cast<double>(heldSince_.size()));
  m.counter("spillway_backend_next_hop_holds_total",
            "Backends that entered the tables after a hold for their next hop.", {},
            static_cast<double>(heldEntered_));
  for (const VipConfig& v : config_.vips) {
    auto d = decisions_.find(v.name);
    if (d == decisions_.end()) continue;
    m.gauge("spillway_vip_panic", "1 when the VIP is in panic mode.", {{"vip", v.name}},
            d->second.panic ? 1 : 0);
    {
      std::uint32_t active = 0;
      std::optional<std::uint32_t> first;  // the first priority level
      for (const PoolDecision& p : d->second.pools) {
        active += p.active;
        first = std::min(first.value_or(p.priority), p.priority);
      }
      double spilled = 0;
      for (const PoolDecision& p : d->second.pools) {
        if (p.priority != first) spilled += p.share;
      }
      m.gauge("spillway_vip_active_backends",
              "Backends in state active in the VIP's pools (0: new flows have nowhere to go).",
              {{"vip", v.name}}, active);
      m.gauge("spillway_vip_spilled_share",
              "Share of the VIP's new flows sent past its first priority level (spillover).",
              {{"vip", v.name}}, spilled);
      // The low 48 bits of `tier status`'s fingerprint: exact in a double, and
      // equal on instances whose tables are equal.
      const std::vector<std::uint64_t> ids = tableIds(v.name);
      m.gauge("spillway_vip_table_fingerprint",
              "Low 48 bits of the VIP's Maglev table fingerprint (tier status).", {{"vip", v.name}},
              static_cast<double>(tableHash(ids, ids.size()) & ((std::uint64_t{1} << 48) - 1)));
    }
    for (const PoolDecision& p : d->second.pools) {
      m.gauge("spillway_pool_new_flow_share", "Share of the VIP's new flows sent to the pool.",
              {{"vip", v.name}, {"pool", p.name}}, p.share);
      m.gauge("spillway_pool_healthy_fraction", "Healthy share of the pool's capacity.",
              {{"vip", v.name}, {"pool", p.name}}, p.healthyFraction);
      if (p.latencyMs) {
        m.gauge("spillway_pool_latency_seconds",
                "Median latency score (SRTT + 4 RTTVAR) of the pool's active backends.",
                {{"vip", v.name}, {"pool", p.name}}, *p.latencyMs / 1000.0);
      }
      if (p.region) {
        m.gauge("spillway_pool_preferred_region",
                "1 for the preferred region of its priority level (latency), else 0.",
                {{"vip", v.name}, {"pool", p.name}}, p.preferred ? 1 : 0);
      }
    }
    const MaglevTable* t = builder_.currentTable(v.name);
    std::map<std::uint32_t, std::uint32_t> entries;
    if (t != nullptr) {
      for (std::uint32_t e : t->entries()) ++entries[e];
    }
    for (const BackendConfig& b : config_.backends) {
      auto w = weights_[v.name].find(b.id);
      if (w == weights_[v.name].end()) continue;
      m.gauge("spillway_backend_effective_weight", "Maglev weight of the backend in the VIP.",
              {{"vip", v.name}, {"backend", b.name}}, w->second);
      m.gauge("spillway_backend_table_entries", "Maglev table entries owned by the backend.",
              {{"vip", v.name}, {"backend", b.name}}, entries[builder_.indexOf(b.id)]);
    }
  }
  for (const BackendConfig& b : config_.backends) {
    const std::string state = stateName(states_.state(b.id).value_or(BackendState::Removed));
    for (const char* s : {"active", "draining", "disabled", "failed", "removed"}) {
      m.gauge("spillway_backend_state", "1 for the backend's current state.",
              {{"backend", b.name}, {"pool", b.pool}, {"state", s}}, state == s ? 1 : 0);
    }
    if (auto h = health_.status(b.id); h && h->lastProbe) {
      m.gauge("spillway_backend_health_up", "1 when the backend passes its health checks.",
              {{"backend", b.name}, {"pool", b.pool}}, h->up ? 1 : 0);
      m.counter("spillway_backend_health_failures_total", "Health probes that failed.",
                {{"backend", b.name}, {"pool", b.pool}}, static_cast<double>(h->failures));
    }
    if (auto l = scraper_.status(b.id); l && l->lastAttempt) {
      m.gauge("spillway_backend_load_scrape_up",
              "1 when the latest scrape of the backend's load exporter worked.",
              {{"backend", b.name}, {"pool", b.pool}}, l->lastError.empty() ? 1 : 0);
    }
    if (auto h = health_.status(b.id); h && h->rtt) {
      m.gauge("spillway_backend_rtt_seconds", "Smoothed health-check round trip (SRTT).",
              {{"backend", b.name}}, h->rtt->srttMs / 1000.0);
      m.gauge("spillway_backend_rttvar_seconds", "Health-check round-trip variation (RTTVAR).",
              {{"backend", b.name}}, h->rtt->rttVarMs / 1000.0);
      m.gauge("spillway_backend_latency_seconds", "Latency score SRTT + 4 RTTVAR.",
              {{"backend", b.name}}, h->rtt->scoreMs() / 1000.0);
    }
    m.gauge("spillway_backend_latency_degraded",
            "1 while the backend is marked degraded for latency (weight lowered, not ejected).",
            {{"backend", b.name}}, policy_.latencyMark(b.id) == LatencyMark::Degraded ? 1 : 0);
    m.gauge("spillway_backend_latency_weight_factor",
            "The latency multiplier of the backend's weight (1: normal).", {{"backend", b.name}},
            policy_.latencyFactor(b.id));
    const ScrapedLoad load = scraper_.load(b.id, now_);
    if (load.gpuUtilization) {
      m.gauge("spillway_backend_gpu_utilization_ratio", "Smoothed GPU utilisation (0-1).",
              {{"backend", b.name}}, *load.gpuUtilization / 100.0);
    }
    if (load.queueDepth) {
      m.gauge("spillway_backend_queue_depth", "Smoothed requests waiting.", {{"backend", b.name}},
              *load.queueDepth);
    }
    if (auto s = scraper_.status(b.id); s && config_.pools[b.poolIndex].load.enabled) {
      m.counter("spillway_scrapes_total", "Load scrapes that ended (success or failure).",
                {{"backend", b.name}}, static_cast<double>(s->scrapes));
      m.counter("spillway_scrape_failures_total",
                "Load scrapes that failed (connect, HTTP, size, exposition text).",
                {{"backend", b.name}}, static_cast<double>(s->failures));
      m.counter("spillway_scrape_out_of_range_total",
                "Scrapes whose value was outside its meaning (GPU utilisation outside 0-100, "
                "queue depth negative or not finite): taken as unknown.",
                {{"backend", b.name}, {"metric", "gpu"}}, static_cast<double>(s->gpuOutOfRange));
      m.counter("spillway_scrape_out_of_range_total",
                "Scrapes whose value was outside its meaning (GPU utilisation outside 0-100, "
                "queue depth negative or not finite): taken as unknown.",
                {{"backend", b.name}, {"metric", "queue"}},
                static_cast<double>(s->queueOutOfRange));
    }
    if (anyVipPlaces()) {
      m.gauge("spillway_backend_byte_rate", "Smoothed forwarded bytes per second (placement).",
              {{"backend", b.name}}, byteRates_.rate(builder_.indexOf(b.id)));
      m.gauge("spillway_backend_placement_load",
              "Load placement balances: max(live flows, bytes / mean bytes of a flow).",
              {{"backend", b.name}}, placementLoad(builder_.indexOf(b.id)));
    }
    if (const BackendStatus* st = states_.find(b.id); st && st->liveFlows) {
      m.gauge("spillway_backend_active_flows", "Tracked flows on the backend (all lcores).",
              {{"backend", b.name}}, static_cast<double>(*st->liveFlows));
    }
    if (const BackendStatus* st = states_.find(b.id); st && st->backendConnections) {
      m.gauge("spillway_backend_reported_connections",
              "Connections the backend itself reports over the VIPs it serves (its agent).",
              {{"backend", b.name}}, static_cast<double>(*st->backendConnections));
    }
    if (auto c = connScraper_.report(b.id, now_); c && c->scrapes > 0) {
      m.counter("spillway_backend_connections_scrape_failures_total",
                "Failed scrapes of the backend's connection agent.", {{"backend", b.name}},
                static_cast<double>(c->failures));
    }
  }
  if (dataplane_ != nullptr) {
    const Json s = statsDocument(dataplane_->counters(), config_, builder_, generation_);
    auto num = [&](const char* key) { return s.contains(key) ? s[key].get<double>() : 0.0; };
    m.counter("spillway_rx_packets_total", "Frames received by the workers.", {},
              num("rx_packets"));
    m.counter("spillway_forwarded_packets_total", "Frames encapsulated to a backend.", {},
              num("forwarded"));
    m.counter("spillway_replies_total", "ICMP replies sent by the load balancer.", {},
              num("replies"));
    m.counter("spillway_kernel_packets_total", "Frames handed to the kernel.", {},
              num("to_kernel"));
    m.counter("spillway_new_flows_total", "Flows started.", {}, num("new_flows"));
    m.counter("spillway_placed_off_table_total",
              "New connections a placing VIP sent elsewhere than its table's entry (by bytes).", {},
              num("placed_off_table"));
    if (s.contains("exception_hits_by_origin")) {
      for (const auto& [origin, n] : s["exception_hits_by_origin"].items()) {
        m.counter("spillway_exception_hits_total",
                  "Flows a worker adopted from a flow exception (its flow table had none), by "
                  "the exception's origin: checkpoint, peer, backend.",
                  {{"origin", origin}}, n.get<double>());
      }
    }
    if (s.contains("drops")) {
      for (const auto& [reason, n] : s["drops"].items()) {
        m.counter("spillway_drops_total", "Frames dropped, by reason.", {{"reason", reason}},
                  n.get<double>());
      }
    }
    if (s.contains("backends")) {
      for (const Json& b : s["backends"]) {
        const std::string name = b["name"].get<std::string>();
        m.counter("spillway_backend_packets_total", "Frames forwarded to the backend.",
                  {{"backend", name}}, b["packets"].get<double>());
        m.counter("spillway_backend_new_flows_total", "Flows started on the backend.",
                  {{"backend", name}}, b["new_flows"].get<double>());
        m.counter("spillway_backend_bytes_total",
                  "Bytes forwarded to the backend (encapsulated frames).", {{"backend", name}},
                  b["bytes"].get<double>());
      }
    }
    if (s.contains("workers")) {
      for (const Json& w : s["workers"]) {
        const std::string lcore = std::to_string(w["lcore"].get<unsigned>());
        m.counter("spillway_lcore_rx_packets_total", "Frames received, per worker lcore.",
                  {{"lcore", lcore}}, w["rx_packets"].get<double>());
        m.counter("spillway_flow_embryonic_rejected_total",
                  "Handshake (SYN) flow inserts refused: both buckets full, per lcore.",
                  {{"lcore", lcore}}, w["flow_embryonic_rejected"].get<double>());
        m.counter("spillway_flow_syn_flood_inserts_total",
                  "Handshake flow inserts made in SYN-flood mode (no cuckoo step), per lcore.",
                  {{"lcore", lcore}}, w["flow_syn_flood_inserts"].get<double>());
        m.gauge("spillway_flow_table_entries",
                "Flow-table slots in use (live flows and expired ones not yet reclaimed).",
                {{"lcore", lcore}}, w["flow_table_occupancy"].get<double>());
        m.gauge("spillway_flow_table_capacity", "Flow-table capacity (flows) of the lcore.",
                {{"lcore", lcore}}, static_cast<double>(config_.dataplane.flowCapacity));
        m.gauge("spillway_flow_table_syn_flood",
                "1 while the lcore's flow table is in SYN-flood mode (handshakes fill it).",
                {{"lcore", lcore}}, w.value("syn_flood", false) ? 1 : 0);
        if (w.contains("rounds")) {
          const Json& r = w["rounds"];
          std::array<HistogramBucket, kRoundBuckets - 1> buckets{};  // the last is +Inf
          std::uint64_t cumulative = 0, count = 0;
          for (std::size_t b = 0; b < kRoundBuckets; ++b) {
            const auto n = r["buckets"][b].get<std::uint64_t>();
            count += n;
            if (b + 1 < kRoundBuckets) {
              cumulative += n;
              buckets[b] = HistogramBucket{roundBucketUpperSeconds(b), cumulative};
            }
          }
          const std::array<MetricLabel, 1> labels{MetricLabel{"lcore", lcore}};
          m.histogram("spillway_worker_round_seconds",
                      "Duration of the worker lcore's poll rounds (start to start, idle pauses "
                      "left out); a tail here is a tail of the frames' latency.",
                      labels, buckets, static_cast<double>(r["sum_ns"].get<std::uint64_t>()) / 1e9,
                      count);
          m.gauge("spillway_worker_round_max_seconds",
                  "The worker lcore's longest poll round since the daemon started.",
                  {{"lcore", lcore}}, static_cast<double>(r["max_ns"].get<std::uint64_t>()) / 1e9);
        }
      }
    }
    if (s.contains("ports")) {
      for (const Json& p : s["ports"]) {
        const std::string name = p["name"].get<std::string>();
        m.counter("spillway_port_rx_missed_total",
                  "Frames the port's driver missed (receive ring full), before any worker.",
                  {{"port", name}}, p["rx_missed"].get<double>());
        m.counter("spillway_port_rx_errors_total", "Receive errors the port's driver counted.",
                  {{"port", name}}, p["rx_errors"].get<double>());
        m.counter("spillway_port_rx_no_mbuf_total",
                  "Frames the port's driver could not take for want of an mbuf.", {{"port", name}},
                  p["rx_no_mbuf"].get<double>());
      }
    }
    if (s.contains("kernel_reassembly")) {
      for (const char* k : {"requests", "ok", "failed", "timeouts"}) {
        m.counter("spillway_kernel_reassembly_total",
                  "The kernel's IPv4 reassembly in spillwayd's namespace (af_packet ports).",
                  {{"result", k}}, s["kernel_reassembly"][k].get<double>());
      }
    }
  }
  discoveryMetrics(m);
  return m.text();
}

}  // namespace spillway
