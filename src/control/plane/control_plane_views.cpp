// The ControlPlane's read views for the operator API (ControlApi): status,
// VIPs, pools, backends, tables, flows, stats, health, events and the
// configuration dump, each as the JSON the CLI socket returns.
#include <algorithm>
#include <map>
#include <set>

#include "control/backends/table_digest.hpp"
#include "control/intent/intent_merge.hpp"
#include "control/plane/control_plane.hpp"
#include "control/plane/control_plane_json.hpp"
#include "control/plane/stats_view.hpp"

namespace spillway {

using namespace plane_json;  // NOLINT(google-build-using-namespace)

namespace {

// The fields every view of a VIP shows.
Json vipJson(const VipConfig& v) {
  return Json{{"name", v.name},
              {"address", ipJson(v.address)},
              {"protocol", protocolName(v.protocol)},
              {"port", v.port},
              {"table_size", v.tableSize}};
}

// The settings `vip show` and the configuration dump add.
void addVipSettings(Json& j, const VipConfig& v) {
  j["answer_ping"] = v.answerPing;
  j["placement"] = v.placement == VipPlacementMode::Bytes ? "bytes" : "table";
}

}  // namespace

// --- ControlApi: reads --------------------------------------------------------

ApiResult ControlPlane::status() {
  Json vips = Json::array();
  for (const auto& [name, d] : decisions_) {
    vips.push_back({{"vip", name}, {"panic", d.panic}, {"empty", d.empty}, {"summary", d.summary}});
  }
  std::map<std::string, int> byState;
  for (const BackendConfig& b : config_.backends) {
    ++byState[stateName(states_.state(b.id).value_or(BackendState::Removed))];
  }
  Json latency = nullptr;
  if (!applyLatencies_.empty()) latency = applyLatencies_.back();
  const BackendIndexStats ix = builder_.indexStats();
  // The wall clock's ms of the last step (null before the first): comparable
  // across the instances of a tier on one host.
  const Json changedUnix = tablesChangedUnixMs_ ? Json(tablesChangedUnixMs_) : Json(nullptr);
  return Json{{"generation", generation_},
              {"uptime_ms", now_ - started_},
              {"now_ms", now_},  // the clock of events' time_ms
              {"worker_lcores", config_.dataplane.lcores},
              {"vips", config_.vips.size()},
              {"pools", config_.pools.size()},
              {"backends", config_.backends.size()},
              {"backends_by_state", byState},
              {"publishes", publishes_},
              {"tables_changed_ms", tablesChangedMs_},
              {"tables_changed_unix_ms", changedUnix},
              {"last_publish_latency_ms", latency},
              {"backend_indices",
               {{"max", ix.maxBackends},
                {"in_use", ix.inUse},
                {"retiring", ix.retiring},
                {"purging", ix.purging},
                {"free", ix.free},
                {"recycled", ix.recycled}}},
              {"held_for_next_hop", heldSince_.size()},
              {"policy", vips},
              {"config", configPath_},
              {"warmup", warmup_},
              {"warmup_ms", warmup_       ? Json(now_ - warmupStarted_)
                            : warmupTook_ ? Json(*warmupTook_)
                                          : Json(nullptr)},
              {"checkpoint", checkpointStatsJson(keeper_, now_)},
              {"rebuild", rebuildJson()},
              {"announce", announceJson()},
              {"tier", peers_ ? peers_->status(now_) : Json{{"enabled", false}}},
              {"make_before_break", stepJson()}};
}

ApiResult ControlPlane::vipList() {
  Json out = Json::array();
  for (const VipConfig& v : config_.vips) {
    auto d = decisions_.find(v.name);
    Json j = vipJson(v);
    j["pools"] = v.pools;
    j["panic"] = d != decisions_.end() && d->second.panic;
    out.push_back(std::move(j));
  }
  return out;
}

ApiResult ControlPlane::vipShow(const std::string& name) {
  for (const VipConfig& v : config_.vips) {
    if (v.name != name) continue;
    Json out = vipJson(v);
    addVipSettings(out, v);
    if (VipLoad* load = builder_.vipLoad(v.name)) {
      out["placement_load_flows"] =
          static_cast<double>(static_cast<std::uint64_t>(load->milliFlows)) / kLoadScale;
    }
    auto d = decisions_.find(v.name);
    if (d != decisions_.end()) {
      Json pools = Json::array();
      for (const PoolDecision& p : d->second.pools) {
        pools.push_back({{"pool", p.name},
                         {"priority", p.priority},
                         {"share", p.share},
                         {"healthy_fraction", p.healthyFraction},
                         {"available", p.available},
                         {"active", p.active},
                         {"saturated", p.saturated},
                         {"degraded", p.degraded},
                         {"latency_ms", p.latencyMs ? Json(*p.latencyMs) : Json(nullptr)},
                         {"region", p.region},
                         {"preferred", p.preferred}});
      }
      Json backends = Json::array();
      for (const BackendDecision& b : d->second.backends) {
        backends.push_back(
            {{"backend", b.name},
             {"weight", b.weight},
             {"share", b.share},
             {"load_factor", b.loadFactor},
             {"saturated", b.saturated},
             {"latency_ms", b.latencyMs ? Json(*b.latencyMs) : Json(nullptr)},
             {"latency", std::string(toString(b.latency))},
             {"latency_factor", b.latencyFactor},
             {"latency_bound_ms", b.latencyBoundMs ? Json(*b.latencyBoundMs) : Json(nullptr)}});
      }
      out["pools"] = pools;
      out["backends"] = backends;
      out["panic"] = d->second.panic;
      out["healthy_capacity"] = d->second.healthyCapacity;
      out["summary"] = d->second.summary;
    }
    return out;
  }
  return notFound("vip", name);
}

ApiResult ControlPlane::poolList() {
  Json out = Json::array();
  for (std::uint32_t p = 0; p < config_.pools.size(); ++p) {
    const PoolConfig& pool = config_.pools[p];
    int members = 0, active = 0;
    for (const BackendConfig& b : config_.backends) {
      if (b.poolIndex != p) continue;
      ++members;
      active += states_.state(b.id) == BackendState::Active;
    }
    out.push_back({{"name", pool.name},
                   {"site", std::string(toString(pool.site))},
                   {"priority", pool.priority},
                   {"encap", std::string(toString(pool.encap))},
                   {"backends", members},
                   {"active", active}});
  }
  return out;
}

ApiResult ControlPlane::poolShow(const std::string& name) {
  for (std::uint32_t p = 0; p < config_.pools.size(); ++p) {
    if (config_.pools[p].name != name) continue;
    Json backends = Json::array();
    for (const BackendConfig& b : config_.backends) {
      if (b.poolIndex == p) backends.push_back(backendJson(b));
    }
    Json shares = Json::array();
    for (const auto& [vip, d] : decisions_) {
      for (const PoolDecision& pd : d.pools) {
        if (pd.name == name) {
          shares.push_back(
              {{"vip", vip}, {"share", pd.share}, {"healthy_fraction", pd.healthyFraction}});
        }
      }
    }
    const PoolConfig& pool = config_.pools[p];
    return Json{{"name", pool.name},
                {"site", std::string(toString(pool.site))},
                {"priority", pool.priority},
                {"encap", std::string(toString(pool.encap))},
                {"share_of_new_flows", shares},
                {"backends", backends}};
  }
  return notFound("pool", name);
}

Json ControlPlane::backendJson(const BackendConfig& b) const {
  Json j{{"name", b.name},
         {"pool", b.pool},
         {"address", ipJson(b.address)},
         {"id", b.id},
         {"index", builder_.indexOf(b.id)},
         {"base_weight", b.weight}};
  if (const BackendStatus* st = states_.find(b.id)) {
    j["state"] = stateName(st->effective);
    j["admin"] = std::string(toString(st->admin));
    j["health"] = std::string(toString(st->health));
    j["cause"] = st->cause;
    j["live_flows"] = st->liveFlows ? Json(*st->liveFlows) : Json(nullptr);
    // The backend's own count (spillway-decap's agent), null without a fresh report.
    j["backend_connections"] =
        st->backendConnections ? Json(*st->backendConnections) : Json(nullptr);
    if (auto d = states_.drainProgress(b.id)) {
      j["drain"] = Json{{"complete", d->complete},
                        {"judged_by", d->judgedBy},
                        {"expired", d->expired},
                        {"removing", d->removing}};
    }
  }
  if (auto c = connScraper_.report(b.id, now_); c && c->scrapes > 0) {
    j["connections_scrape"] =
        Json{{"scrapes", c->scrapes}, {"failures", c->failures}, {"last_error", c->lastError}};
  }
  Json weights = Json::object();
  for (const auto& [vip, w] : weights_) {
    auto it = w.find(b.id);
    if (it != w.end()) weights[vip] = it->second;
  }
  j["weight"] = weights;
  if (auto h = health_.status(b.id)) {
    j["rtt_ms"] = h->rttMs ? Json(*h->rttMs) : Json(nullptr);
    j["last_error"] = h->lastError;
  }
  latencyJson(j, b.id);
  const ScrapedLoad load = scraper_.load(b.id, now_);
  j["gpu_utilization"] = load.gpuUtilization ? Json(*load.gpuUtilization) : Json(nullptr);
  j["queue_depth"] = load.queueDepth ? Json(*load.queueDepth) : Json(nullptr);
  if (auto s = scraper_.status(b.id); s && s->scrapes > 0) j["scrape"] = scrapeJson(*s);
  j["saturated"] = policy_.saturated(b.id);
  const BackendRuntime* rt = builder_.runtime(b.id);
  j["next_hop_resolved"] = rt != nullptr && rt->nextHopMac.has_value();
  j["held_for_next_hop"] = heldSince_.count(b.id) != 0;
  // Placement's measurements (0 until a placing VIP makes the meter run).
  j["byte_rate"] = byteRates_.rate(builder_.indexOf(b.id));
  j["placement_load_flows"] = placementLoad(builder_.indexOf(b.id));
  return j;
}

void ControlPlane::latencyJson(Json& j, std::uint64_t id) const {
  const std::optional<HealthStatus> h = health_.status(id);
  const bool known = h && h->rtt;
  j["srtt_ms"] = known ? Json(h->rtt->srttMs) : Json(nullptr);
  j["rttvar_ms"] = known ? Json(h->rtt->rttVarMs) : Json(nullptr);
  j["latency_ms"] = known ? Json(h->rtt->scoreMs()) : Json(nullptr);
  j["latency"] = std::string(toString(policy_.latencyMark(id)));
  j["latency_factor"] = policy_.latencyFactor(id);
}

ApiResult ControlPlane::backendList() {
  Json out = Json::array();
  for (const BackendConfig& b : config_.backends) out.push_back(backendJson(b));
  return out;
}

ApiResult ControlPlane::tableShow(const std::string& vip) {
  Json out = Json::array();
  bool found = vip.empty();
  for (const VipConfig& v : config_.vips) {
    if (!vip.empty() && v.name != vip) continue;
    found = true;
    const MaglevTable* t = builder_.currentTable(v.name);
    std::map<std::uint32_t, std::uint32_t> entries;
    if (t != nullptr) {
      for (std::uint32_t e : t->entries()) ++entries[e];
    }
    Json backends = Json::array();
    for (const BackendConfig& b : config_.backends) {
      const std::uint32_t index = builder_.indexOf(b.id);
      auto it = entries.find(index);
      if (it == entries.end()) continue;
      backends.push_back({{"backend", b.name}, {"index", index}, {"entries", it->second}});
    }
    out.push_back({{"vip", v.name},
                   {"table_size", v.tableSize},
                   {"empty_entries", entries.count(0) ? entries[0] : 0},
                   {"backends", backends}});
  }
  if (!found) return notFound("vip", vip);
  return Json{{"generation", generation_}, {"tables", out}};
}

std::vector<std::uint64_t> ControlPlane::tableIds(const std::string& vip) const {
  std::map<std::uint32_t, std::uint64_t> idOf;  // backend index -> id
  for (const BackendConfig& b : config_.backends) idOf[builder_.indexOf(b.id)] = b.id;
  std::vector<std::uint64_t> ids;
  if (const MaglevTable* t = builder_.currentTable(vip)) {
    for (const std::uint32_t e : t->entries()) ids.push_back(e == 0 ? 0 : idOf[e]);
  }
  return ids;
}

ApiResult ControlPlane::tableDigest(const std::string& vip, std::optional<std::uint32_t> chunk) {
  Json tables = Json::array();
  for (const VipConfig& v : config_.vips) {
    if (!vip.empty() && v.name != vip) continue;
    const std::vector<std::uint64_t> ids = tableIds(v.name);
    if (!chunk) {
      tables.push_back(tableDigestJson(v.name, ids));
      continue;
    }
    std::optional<Json> c = tableChunkJson(v.name, ids, *chunk);
    if (!c) return ApiError{"invalid", "vip " + v.name + " has no chunk " + std::to_string(*chunk)};
    (*c)["generation"] = generation_;
    return *c;
  }
  if (!vip.empty() && tables.empty()) return notFound("vip", vip);
  Json out{{"generation", generation_}, {"warmup", warmup_}, {"tables", tables}};
  if (peers_) {
    // The tier's operator intent as this instance holds it, and per peer
    // whether the peer's last dump agreed (tier status compares them).
    Json tier = peers_->status(now_);
    Json intent = tier["intent"];
    Json per = Json::object();
    for (const Json& p : tier["peers"]) per[p["name"].get<std::string>()] = p["intent"];
    intent["peers"] = std::move(per);
    out["intent"] = std::move(intent);
  }
  return out;
}

ApiResult ControlPlane::flows() {
  Json perBackend = Json::array();
  for (const BackendConfig& b : config_.backends) {
    const std::uint32_t index = builder_.indexOf(b.id);
    Json lcores = Json::object();
    std::uint64_t total = 0;
    for (const LcoreFlowCounts& l : lastFlows_) {
      const std::uint64_t n = index < l.byBackend.size() ? l.byBackend[index] : 0;
      lcores[std::to_string(l.lcore)] = n;
      total += n;
    }
    perBackend.push_back({{"backend", b.name}, {"flows", total}, {"per_lcore", lcores}});
  }
  return Json{{"backends", perBackend}};
}

ApiResult ControlPlane::flowsAdopted() {
  if (dataplane_ == nullptr) return ApiError{"unavailable", "no data path attached"};
  std::map<std::uint32_t, const BackendConfig*> byIndex;
  std::map<std::uint64_t, const BackendConfig*> byId;
  for (const BackendConfig& b : config_.backends) {
    byIndex[builder_.indexOf(b.id)] = &b;
    byId[b.id] = &b;
  }
  // A VIP is named by its tag (the ring's record); two VIPs that share a tag
  // are both named.
  std::map<std::uint8_t, std::string> vipsOfTag;
  for (const VipConfig& v : config_.vips) {
    const std::uint8_t tag = vipTagOf(
        VipKey{v.address.bytes, v.address.version, static_cast<std::uint8_t>(v.protocol), v.port});
    std::string& names = vipsOfTag[tag];
    names += (names.empty() ? "" : ",") + v.name;
  }
  const std::uint64_t unixMs = unixNow();
  Json adopted = Json::array();
  for (const LcoreAdoptedFlow& a : dataplane_->adoptedFlows()) {
    const auto b = byIndex.find(a.flow.backend);
    const auto v = vipsOfTag.find(a.flow.vipTag);
    adopted.push_back({{"hash", a.flow.hash},
                       {"vip", v != vipsOfTag.end() ? Json(v->second) : Json(nullptr)},
                       {"backend", b != byIndex.end() ? Json(b->second->name) : Json(nullptr)},
                       {"backend_index", a.flow.backend},
                       {"origin", toString(a.flow.origin)},
                       {"lcore", a.lcore},
                       {"age_ms", a.ageMs},
                       {"at_unix_ms", unixMs > a.ageMs ? unixMs - a.ageMs : 0}});
  }
  const DataplaneCounters c = dataplane_->counters();
  Json byOrigin = Json::object();
  for (std::size_t o = 0; o < kExceptionOriginCount; ++o) {
    byOrigin[toString(static_cast<ExceptionOrigin>(o))] = c.exceptionHitsByOrigin[o];
  }
  // The flow table's own: tracked flows whose table moved, as of the last
  // export (capped: the reply must stay under the protocol's limit).
  constexpr std::size_t kMaxListed = 20'000;
  const std::span<const FlowExceptionRecord> tracked = keeper_.lastTracked();
  Json kept = Json::array();
  for (std::size_t i = 0; i < tracked.size() && i < kMaxListed; ++i) {
    const auto b = byId.find(tracked[i].backendId);
    kept.push_back({{"hash", tracked[i].hash},
                    {"backend", b != byId.end() ? Json(b->second->name) : Json(nullptr)}});
  }
  const std::optional<Millis> exportAt = keeper_.lastExportAt();
  return Json{{"adopted", std::move(adopted)},
              {"adopted_by_origin", std::move(byOrigin)},
              {"ring_capacity_per_lcore", AdoptedFlowRing::kCapacity},
              {"flow_table",
               {{"export_age_ms", exportAt ? Json(now_ - *exportAt) : Json(nullptr)},
                {"total", tracked.size()},
                {"truncated", tracked.size() > kMaxListed},
                {"flows", std::move(kept)}}}};
}

ApiResult ControlPlane::stats() {
  if (dataplane_ == nullptr) return ApiError{"unavailable", "no data path attached"};
  return statsDocument(dataplane_->counters(), config_, builder_, generation_);
}

ApiResult ControlPlane::health() {
  Json out = Json::array();
  for (const BackendConfig& b : config_.backends) {
    const PoolConfig& pool = config_.pools[b.poolIndex];
    Json j{{"backend", b.name}, {"pool", pool.name}, {"check", toString(pool.health.kind)}};
    if (auto h = health_.status(b.id)) {
      j["up"] = h->up;
      j["consecutive_ok"] = h->consecutiveOk;
      j["consecutive_fail"] = h->consecutiveFail;
      j["last_error"] = h->lastError;
      j["rtt_ms"] = h->rttMs ? Json(*h->rttMs) : Json(nullptr);
      j["rttvar_ms"] = h->rtt ? Json(h->rtt->rttVarMs) : Json(nullptr);
      j["latency_ms"] = h->rtt ? Json(h->rtt->scoreMs()) : Json(nullptr);
      j["probes"] = h->probes;
      j["failures"] = h->failures;
    }
    if (auto s = scraper_.status(b.id); s && s->scrapes > 0) j["scrape"] = scrapeJson(*s);
    out.push_back(j);
  }
  return out;
}

ApiResult ControlPlane::events(std::uint64_t after, std::uint32_t limit) {
  const EventPage page = events_.since(after, limit);
  Json list = Json::array();
  for (const Event& e : page.events) {
    Json j{{"seq", e.seq},
           {"time_ms", e.time},
           {"backend", e.backend},
           {"kind", e.kind},
           {"cause", e.cause}};
    if (e.from) j["from"] = stateName(*e.from);
    if (e.to) j["to"] = stateName(*e.to);
    list.push_back(j);
  }
  return Json{{"events", list}, {"next", page.next}, {"missed", page.missed}};
}

ApiResult ControlPlane::configDump(bool effective) {
  Json pools = Json::array();
  for (const PoolConfig& p : config_.pools) {
    pools.push_back({{"name", p.name},
                     {"site", std::string(toString(p.site))},
                     {"priority", p.priority},
                     {"encap", std::string(toString(p.encap))}});
  }
  Json vips = Json::array();
  for (const VipConfig& v : config_.vips) {
    Json j = vipJson(v);
    j["pools"] = v.pools;
    addVipSettings(j, v);
    vips.push_back(std::move(j));
  }
  Json backends = Json::array();
  const Json fromFile{{"source", "file"}};
  for (const BackendConfig& b : config_.backends) {
    Json j{{"name", b.name}, {"id", b.id},         {"address", ipJson(b.address)},
           {"pool", b.pool}, {"weight", b.weight}, {"port", b.port}};
    if (b.metricsPort) j["metrics"] = formatMetricsUrl(b.address, *b.metricsPort, b.metricsPath);
    if (effective) {
      // Where each value comes from: the file, or a journaled command.
      const BackendOverride* o = journal_.overlay().find(b.name);
      Json src = Json::object();
      src["definition"] = o && o->added ? stampJson({o->added->seq, o->added->wallMs})
                          : retiring_.count(b.id) != 0
                              ? Json{{"source", "previous file (draining until removed)"}}
                              : fromFile;
      src["weight"] = fromFile;
      if (o && o->weight) {
        src["weight"] = stampJson(o->weightStamp);
        src["weight"]["replaced"] = o->weightReplaced;
      }
      src["admin"] = fromFile;
      if (o && o->removed) src["admin"] = stampJson(*o->removed);
      if (o && o->admin) src["admin"] = stampJson(o->adminStamp);
      if (const BackendStatus* st = states_.find(b.id)) {
        j["admin"] = std::string(toString(st->admin));
        j["state"] = stateName(st->effective);
      }
      j["sources"] = src;
      j["origin"] = originOf(b);
    }
    backends.push_back(j);
  }
  Json overrides = Json::array();
  if (effective) {
    for (const auto& [name, o] : journal_.overlay().backends()) {
      Json j{{"backend", name}};
      if (o.added) j["added"] = stampJson({o.added->seq, o.added->wallMs});
      if (o.removed) j["removed"] = stampJson(*o.removed);
      if (o.admin) {
        j["admin"] = stampJson(o.adminStamp);
        j["admin"]["value"] = std::string(toString(*o.admin));
      }
      if (o.weight) {
        j["weight"] = stampJson(o.weightStamp);
        j["weight"]["value"] = *o.weight;
        j["weight"]["replaced"] = o.weightReplaced;
      }
      overrides.push_back(j);
      // A file backend the operator removed is not in the running set.
      if (o.removed && backendNamed(name) == nullptr) {
        backends.push_back(
            {{"name", name},
             {"id", o.id},
             {"state", "removed"},
             {"sources", {{"definition", fromFile}, {"admin", stampJson(*o.removed)}}}});
      }
    }
  }
  Json ports = Json::array();
  for (const PortConfig& p : config_.ports) {
    ports.push_back({{"name", p.name}, {"devargs", p.devargs}, {"mtu", p.mtu}});
  }
  Json out{
      {"path", configPath_},
      {"dataplane",
       {{"lcores", config_.dataplane.lcores}, {"flow_capacity", config_.dataplane.flowCapacity}}},
      {"ports", ports},
      {"pools", pools},
      {"vips", vips},
      {"backends", backends},
      {"policy",
       {{"gpu_high", config_.policy.gpuHigh},
        {"gpu_low", config_.policy.gpuLow},
        {"queue_high", config_.policy.queueHigh},
        {"queue_low", config_.policy.queueLow},
        {"overprovisioning", config_.policy.overprovisioning},
        {"panic_threshold", config_.policy.panicThreshold},
        {"churn_budget", config_.policy.churnBudget},
        {"drain_timeout_ms", config_.policy.drainTimeout},
        {"latency_regions", std::string(toString(config_.policy.latencyRegions))},
        {"latency_window_ms", config_.policy.latencyWindow},
        {"region_switch_margin", config_.policy.regionSwitchMargin},
        {"region_switch_margin_ms", config_.policy.regionSwitchMarginMs},
        {"region_switch_windows", config_.policy.regionSwitchWindows},
        {"degraded_latency_ms", config_.policy.degradedLatencyMs},
        {"degraded_latency_factor", config_.policy.degradedLatencyFactor},
        {"degraded_latency_min_ms", config_.policy.degradedLatencyMinMs},
        {"degraded_windows", config_.policy.degradedWindows},
        {"degraded_weight", config_.policy.degradedWeight},
        {"degraded_max_fraction", config_.policy.degradedMaxFraction},
        {"degraded_restore_step", config_.policy.degradedRestoreStep}}}};
  out["announce"] = announceConfigJson(config_.announce);
  out["placement"] = {{"balance_factor", config_.placement.balanceFactor},
                      {"candidates", config_.placement.candidates},
                      {"rate_interval_ms", config_.placement.rateInterval},
                      {"rate_smoothing_ms", config_.placement.rateSmoothing}};
  if (effective) {
    const auto& drained = journal_.overlay().lbDrained();
    out["lb"] = {{"drained", drained.has_value()},
                 {"source", drained ? stampJson(*drained) : Json{{"source", "file"}}}};
    out["overrides"] = overrides;
    out["journal"] = Json{{"state_dir", journal_.directory()},
                          {"usable", journal_.usable()},
                          {"error", journal_.error()},
                          {"last_seq", journal_.lastSeq()},
                          {"journal_records", journal_.journalRecords()},
                          {"journal_bytes", journal_.journalBytes()}};
  }
  return out;
}

}  // namespace spillway
