// The seam between the control plane and a data path (Katran's
// BaseBpfAdapter): everything the control thread asks of the workers goes
// through this interface, so the control plane, reloads, restarts, journal
// replay and warm-up run under gtest against a fake (tests/unit/
// fake_dataplane.hpp), and spillwayd's DPDK adapter (src/dataplane/
// dpdk_dataplane.hpp) is one implementation among others. DPDK-free.
//
// Requests that the workers answer on their own lcores (flow counts,
// exception exports) are split into request(n) and collect(n): n increases,
// collect returns std::nullopt until every worker has finished n, and never
// blocks.
//
// Thread contract: every member is called on the control thread, except
// workerRounds(), which any thread may call (the BGP announcer's does).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "spillway/adopted_flows.hpp"
#include "spillway/drop_reason.hpp"
#include "spillway/flow_exceptions.hpp"
#include "spillway/kernel_reassembly.hpp"
#include "spillway/round_histogram.hpp"
#include "spillway/snapshot.hpp"

namespace spillway {

// Live tracked flows of one worker lcore, by backend index.
struct LcoreFlowCounts {
  unsigned lcore = 0;
  std::vector<std::uint64_t> byBackend;
};

// A flow a worker adopted from an exception (adopted_flows.hpp), and how
// long ago on that worker's clock.
struct LcoreAdoptedFlow {
  unsigned lcore = 0;
  AdoptedFlow flow;
  Millis ageMs = 0;
};

// The data path's counters, summed where the field says so.
struct DataplaneCounters {
  std::uint64_t rxPackets = 0;  // received, steered or not
  std::uint64_t forwarded = 0;
  std::uint64_t replies = 0;
  std::uint64_t toKernel = 0;  // handed to the kernel
  std::uint64_t newFlows = 0;
  std::uint64_t resteered = 0;
  std::uint64_t flowInsertFailed = 0;
  std::uint64_t icmpErrorsSteered = 0;
  std::uint64_t exceptionHits = 0;
  // ... by the exception's origin (index: ExceptionOrigin)
  std::array<std::uint64_t, kExceptionOriginCount> exceptionHitsByOrigin{};
  std::uint64_t placedOffTable = 0;  // new connections placed off their table entry (placement.hpp)
  std::uint64_t secondChanceSent = 0;    // mid-flow packets sent with a second-chance hop
  std::uint64_t secondChanceUnsent = 0;  // ... that needed one but went without (steering.hpp)
  std::uint64_t txDropped = 0;
  std::uint64_t exceptionRx = 0;  // from the kernel's exception path to the wire
  std::uint64_t exceptionTx = 0;  // from the wire to the kernel's exception path
  std::uint64_t dropped = 0;      // every drop, whatever the reason
  std::array<std::uint64_t, static_cast<std::size_t>(DropReason::kCount)> drops{};
  // By backend index (as long as the largest index in use).
  std::vector<std::uint64_t> backendPackets;
  std::vector<std::uint64_t> backendNewFlows;
  std::vector<std::uint64_t> backendBytes;  // forwarded frame bytes, as encapsulated
  struct Lcore {
    unsigned lcore = 0;
    std::uint64_t rxPackets = 0;
    std::uint64_t forwarded = 0;
    std::uint64_t newFlows = 0;
    std::uint64_t flowTableOccupancy = 0;
    bool synFlood = false;                 // its flow table is in SYN-flood mode
    std::uint64_t snapshotGeneration = 0;  // the one it last used
    std::uint64_t idleSleeps = 0;          // pauses of an idle-sleeping worker
    // Its flow table (flow_table.hpp, FlowTableCounters): handshake inserts
    // refused in full buckets, inserts in SYN-flood mode (no cuckoo step),
    // handshake entries pushed out by new flows.
    std::uint64_t embryonicRejected = 0;
    std::uint64_t synFloodInserts = 0;
    std::uint64_t evictions = 0;
    // Its poll rounds (round_histogram.hpp): all of them, and those that
    // also did the drain period's housekeeping (TX flush, flow-table sweep,
    // flow count and purge slices, exception export).
    RoundHistogram rounds{};
    RoundHistogram housekeepingRounds{};
  };
  std::vector<Lcore> lcores;
  // What each port's driver counted before the workers saw a frame
  // (rte_eth_stats): frames it missed (ring full: imissed), receive errors,
  // and mbuf allocation failures. The af_packet PMD of DPDK 22.11 reports
  // none of them (its socket's drops stay in the kernel: PACKET_STATISTICS);
  // for such a port rxMissed adds them (packet_socket_drops.hpp).
  struct Port {
    std::string name;
    std::string driver;
    std::uint64_t rxPackets = 0;
    std::uint64_t rxMissed = 0;
    std::uint64_t rxErrors = 0;
    std::uint64_t rxNoMbuf = 0;
  };
  std::vector<Port> ports;
  // With an af_packet port: the kernel's IPv4 reassembly counters of this
  // namespace (the PMD's fanout defragments; kernel_reassembly.hpp).
  std::optional<KernelReassembly> kernelReassembly;
};

class Dataplane {
 public:
  virtual ~Dataplane() = default;

  // Makes `snapshot` current for every worker (one release store); the
  // previous one is freed by reclaim() after its grace period.
  virtual void publish(std::unique_ptr<const ForwardingSnapshot> snapshot) = 0;
  // Frees retired snapshots whose grace period passed; returns how many.
  virtual std::size_t reclaim() = 0;
  // The newest published generation (0 before the first publish).
  [[nodiscard]] virtual std::uint64_t publishedGeneration() const = 0;
  // The oldest snapshot generation any worker still uses.
  [[nodiscard]] virtual std::uint64_t appliedGeneration() const = 0;

  virtual void requestFlowCounts(std::uint64_t n) = 0;
  [[nodiscard]] virtual std::optional<std::vector<LcoreFlowCounts>> collectFlowCounts(
      std::uint64_t n) = 0;

  // `next` (may be null): a snapshot built and not yet published
  // (make-before-break, affinity_keeper.hpp). With it, a flow is exported
  // when it is an exception against the snapshot its worker uses or against
  // `next` (its backend differs from next's entry: the step would make it
  // one). The workers read `next` until forgetExportNext() or the next
  // request; the caller keeps it alive until then (a worker reads it only
  // between two quiescent reports, so once it is forgotten, freeing it after
  // a grace period is safe).
  virtual void requestExceptionExport(std::uint64_t n, const ForwardingSnapshot* next) = 0;
  virtual void forgetExportNext() = 0;
  [[nodiscard]] virtual std::optional<std::vector<ExportedFlow>> collectExceptionExport(
      std::uint64_t n) = 0;

  // Backend-index recycling (snapshot_builder.hpp): every worker erases the
  // flow-table entries that name `indices` (and zeroes their counters); the
  // next request comes only after purgeDone(n).
  virtual void requestPurge(std::uint64_t n, const std::vector<std::uint32_t>& indices) = 0;
  [[nodiscard]] virtual bool purgeDone(std::uint64_t n) const = 0;

  // The VIP set a port-side filter must let through (AF_XDP's vip_map); an
  // error leaves the previous set in place.
  [[nodiscard]] virtual std::optional<std::string> syncVips(std::span<const VipKey> vips) = 0;

  [[nodiscard]] virtual DataplaneCounters counters() const = 0;
  // Forwarded bytes of backend indices [0, out.size()), summed over the
  // workers, into out (cheaper than counters(): the placement's rate meter
  // reads it ten times a second). A purged index reads 0 again.
  virtual void backendBytes(std::span<std::uint64_t> out) const = 0;
  // DataplaneCounters::placedOffTable alone: new flow exceptions the
  // checkpoint should take soon.
  [[nodiscard]] virtual std::uint64_t placedOffTable() const = 0;

  // The flows each worker adopted from an exception, the last
  // AdoptedFlowRing::kCapacity of each, oldest first per worker. Lock-free
  // reads of the workers' rings; a data path without them has none.
  [[nodiscard]] virtual std::vector<LcoreAdoptedFlow> adoptedFlows() const { return {}; }

  // Worker heartbeats: one round counter per worker, advanced once per poll
  // round (busy or idle). A counter that stops moving is a stalled or
  // stopped lcore.
  [[nodiscard]] virtual std::vector<std::uint64_t> workerRounds() const = 0;
};

}  // namespace spillway
