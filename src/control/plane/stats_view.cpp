#include "control/plane/stats_view.hpp"

namespace spillway {

namespace {

Json exceptionHitsByOrigin(const DataplaneCounters& c) {
  Json out = Json::object();
  for (std::size_t o = 0; o < kExceptionOriginCount; ++o) {
    out[toString(static_cast<ExceptionOrigin>(o))] = c.exceptionHitsByOrigin[o];
  }
  return out;
}

}  // namespace

Json statsDocument(const DataplaneCounters& c, const Config& config, const SnapshotBuilder& builder,
                   std::uint64_t generation) {
  Json drops = Json::object();
  for (std::size_t r = 1; r < c.drops.size(); ++r) {
    if (c.drops[r] != 0)
      drops[std::string(dropReasonName(static_cast<DropReason>(r)))] = c.drops[r];
  }
  Json backends = Json::array();
  for (const BackendConfig& b : config.backends) {
    const std::uint32_t index = builder.indexOf(b.id);
    const BackendRuntime* rt = builder.runtime(b.id);
    backends.push_back(
        {{"name", b.name},
         {"pool", b.pool},
         {"address", formatIpAddress(b.address)},
         {"index", index},
         {"next_hop_resolved", rt != nullptr && rt->nextHopMac.has_value()},
         {"packets", index != 0 && index < c.backendPackets.size() ? c.backendPackets[index] : 0},
         {"new_flows",
          index != 0 && index < c.backendNewFlows.size() ? c.backendNewFlows[index] : 0},
         {"bytes", index != 0 && index < c.backendBytes.size() ? c.backendBytes[index] : 0}});
  }
  const auto rounds = [](const RoundHistogram& h) {
    return Json{{"buckets", h.buckets}, {"sum_ns", h.sumNs}, {"max_ns", h.maxNs}};
  };
  Json workers = Json::array();
  for (const DataplaneCounters::Lcore& l : c.lcores) {
    workers.push_back({{"lcore", l.lcore},
                       {"rx_packets", l.rxPackets},
                       {"forwarded", l.forwarded},
                       {"new_flows", l.newFlows},
                       {"flow_table_occupancy", l.flowTableOccupancy},
                       {"syn_flood", l.synFlood},
                       {"snapshot_generation", l.snapshotGeneration},
                       {"idle_sleeps", l.idleSleeps},
                       {"flow_embryonic_rejected", l.embryonicRejected},
                       {"flow_syn_flood_inserts", l.synFloodInserts},
                       {"flow_evictions", l.evictions},
                       {"rounds", rounds(l.rounds)},
                       {"housekeeping_rounds", rounds(l.housekeepingRounds)}});
  }
  Json ports = Json::array();
  for (const DataplaneCounters::Port& p : c.ports) {
    ports.push_back({{"name", p.name},
                     {"driver", p.driver},
                     {"rx_packets", p.rxPackets},
                     {"rx_missed", p.rxMissed},
                     {"rx_errors", p.rxErrors},
                     {"rx_no_mbuf", p.rxNoMbuf}});
  }
  Json doc{{"generation", generation},
           {"rx_packets", c.rxPackets},
           {"forwarded", c.forwarded},
           {"replies", c.replies},
           {"to_kernel", c.toKernel},
           {"new_flows", c.newFlows},
           {"resteered", c.resteered},
           {"flow_insert_failed", c.flowInsertFailed},
           {"icmp_errors_steered", c.icmpErrorsSteered},
           {"exception_hits", c.exceptionHits},
           {"exception_hits_by_origin", exceptionHitsByOrigin(c)},
           {"placed_off_table", c.placedOffTable},
           {"second_chance_sent", c.secondChanceSent},
           {"second_chance_unsent", c.secondChanceUnsent},
           {"tx_dropped", c.txDropped},
           {"exception_rx", c.exceptionRx},
           {"exception_tx", c.exceptionTx},
           {"dropped", c.dropped},
           {"drops", drops},
           {"backends", backends},
           {"workers", workers},
           {"ports", ports}};
  if (c.kernelReassembly) {
    const KernelReassembly& k = *c.kernelReassembly;
    doc["kernel_reassembly"] = {
        {"requests", k.requests}, {"ok", k.ok}, {"failed", k.failed}, {"timeouts", k.timeouts}};
  }
  return doc;
}

}  // namespace spillway
