// One worker lcore, run to completion: RX burst from every port, the core's
// steering pipeline (steering.hpp), then buffered TX, the exception path or a
// free by verdict; TX buffers drain on a deadline (DPDK examples/l3fwd).
//
// The worker loads the published snapshot once per burst round and reports a
// quiescent state after it (rcu.hpp), so the control thread can free old
// snapshots. Per packet: no lock, no read-modify-write atomic, no allocation,
// no exception, no log line.
//
// Per-backend counters (packets, bytes, new flows, live flows) are arrays of
// kBackendSlots (snapshot.hpp), one entry per possible backend index. Work
// the control thread asks for runs in the idle housekeeping of each drain
// period, a slice of the flow table at a time, never per packet:
//  - live-flow counts by backend index (requestFlowCount), for drains;
//  - purges of backend indices (requestPurge): before a removed backend's
//    index is given to another backend, the worker erases every flow-table
//    entry naming it (FlowTable::beginPurge) and then zeroes the index's
//    packet and new-flow counters, so nothing of the old backend reaches the
//    new one. Nothing can be counted on the index between the purge and its
//    reuse: the snapshots in use list it in no table.
//
// Thread contract: a Worker is built by the main thread, then run() on its
// own lcore until stop is set; counters are single-writer (stats.hpp) and
// read by the control thread.
#pragma once

#include <rte_ethdev.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ports.hpp"
#include "spillway/flow_exceptions.hpp"
#include "spillway/rcu.hpp"
#include "spillway/round_histogram.hpp"
#include "spillway/snapshot.hpp"
#include "spillway/steering.hpp"

namespace spillway {

struct WorkerConfig {
  unsigned lcore = 0;
  std::uint16_t queue = 0;     // this worker's RX/TX queue on every port
  std::size_t qsbrReader = 0;  // this worker's slot in the QSBR domain
  std::uint16_t burst = 32;
  std::uint32_t txDrainUs = 100;
  // Send buffered frames at once in a round that found every RX queue empty
  // (low added latency below line rate); false: only full bursts and the drain
  // deadline send (tests that hold frames buffered).
  bool flushWhenIdle = true;
  // 0: poll without pause (a dedicated core). Otherwise, after
  // kIdleRoundsBeforeSleep rounds in a row found every RX queue empty, the
  // worker sleeps this many microseconds between rounds until a frame comes:
  // cores shared with other work (kernel-port modes, several instances on one
  // host) at the cost of up to this much added latency for the first frame.
  std::uint32_t idleSleepUs = 0;
  // Above idleSleepUs: each further empty pause doubles, up to this
  // (spillway/idle_backoff.hpp), so an idle worker wakes rarely while the
  // first pause after traffic stays short. 0 or idleSleepUs: a fixed pause.
  std::uint32_t idleSleepMaxUs = 0;
  FlowTableConfig flowTable{};
  std::uint64_t hashSeed = 0;
  IcmpRateLimits icmpLimits{};  // the replies the worker builds itself
};

// What a worker forwarded to one backend index: side by side, so a
// forwarded frame touches one cache line for both.
struct BackendTraffic {
  Counter packets;
  Counter bytes;  // frames as encapsulated
};

struct WorkerCounters {
  WorkerCounters()
      : backendTraffic(std::make_unique<BackendTraffic[]>(kBackendSlots)),
        backendNewFlows(std::make_unique<Counter[]>(kBackendSlots)) {}

  Counter txPackets;
  Counter txDropped;      // TX ring full: freed; the stats add these to drops.tx_queue_full
  Counter exceptionRx;    // from the kernel (tap) to the wire
  Counter exceptionTx;    // from the wire to the kernel (tap)
  Counter unsteered;      // received but never steered (chained mbufs), in drops too
  Counter kernelDropped;  // steered to the kernel on a port with no kernel path, in drops too
  DropCounters drops;     // drops the adapter decides: multi_segment, no_exception_path,
                          // and bad egress ports (no_backend)
  Counter idlePolls;
  Counter idleSleeps;          // pauses of an idle-sleeping worker (WorkerConfig::idleSleepUs)
  Counter snapshotGeneration;  // the generation this worker last used
  // Its poll rounds (round_histogram.hpp), all and those with housekeeping.
  struct Rounds {
    std::array<Counter, kRoundBuckets> buckets;
    Counter sumNs;
    Counter maxNs;
    void add(std::uint64_t ns) noexcept {
      buckets[roundBucket(ns)].add(1);
      sumNs.add(ns);
      if (ns > maxNs.read()) maxNs.set(ns);
    }
    [[nodiscard]] RoundHistogram read() const noexcept {
      RoundHistogram h;
      for (std::size_t b = 0; b < kRoundBuckets; ++b) h.buckets[b] = buckets[b].read();
      h.sumNs = sumNs.read();
      h.maxNs = maxNs.read();
      return h;
    }
  };
  Rounds rounds;
  Rounds housekeepingRounds;
  std::unique_ptr<BackendTraffic[]> backendTraffic;  // forwarded, by backend index
  std::unique_ptr<Counter[]> backendNewFlows;        // flows opened, by backend index
};

class Worker {
 public:
  Worker(const WorkerConfig& config, const std::vector<OpenPort>& ports, QsbrDomain& qsbr,
         const SnapshotPublisher& publisher);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // The lcore loop; returns when `stop` is set, after flushing every TX buffer.
  void run(const std::atomic<bool>& stop) noexcept;

  [[nodiscard]] const SteeringCounters& steering() const noexcept { return steering_.counters(); }
  [[nodiscard]] const FlowTableCounters& flowTable() const noexcept {
    return steering_.flowTable().counters();
  }
  [[nodiscard]] const WorkerCounters& counters() const noexcept { return counters_; }
  [[nodiscard]] const WorkerConfig& config() const noexcept { return config_; }

  // Live tracked flows per backend index, counted by the worker itself a
  // slice of its flow table per drain period (so a 10M-flow table never
  // stalls the lcore). The control thread asks with requestFlowCount(n) (n
  // increasing), and reads liveFlows() once flowCountDone() == n.
  void requestFlowCount(std::uint64_t n) noexcept {
    flowCountRequest_.store(n, std::memory_order_release);
  }
  [[nodiscard]] std::uint64_t flowCountDone() const noexcept {
    return flowCountDone_.load(std::memory_order_acquire);
  }
  [[nodiscard]] const Counter* liveFlows() const noexcept { return liveFlows_.get(); }

  // Exception export (spillway/flow_exceptions.hpp). The control thread asks
  // with requestExceptionExport(n) (n increasing, once every worker runs the
  // snapshot the export is about); the worker walks its flow table a slice
  // per drain period against the snapshot it is using and fills a chunk of at
  // most kExportChunk exceptions. A chunk is ready when exportPublished() !=
  // the last value passed to takeExportChunk(); the control thread reads
  // exportChunk() and exportChunkLast(), then takes it, and the worker goes
  // on. exportChunkLast() == n marks the final chunk of request n.
  // With `next` (make-before-break, spillway/dataplane.hpp) a flow is also
  // exported when `next` would make it an exception; the worker reads `next`
  // once per slice, between two quiescent reports, and abandons the walk
  // once forgetExportNext() cleared it.
  static constexpr std::size_t kExportChunk = 16384;
  void requestExceptionExport(std::uint64_t n, const ForwardingSnapshot* next) noexcept {
    exportNext_.store(next, std::memory_order_release);
    exportRequest_.store(n, std::memory_order_release);
  }
  void forgetExportNext() noexcept { exportNext_.store(nullptr, std::memory_order_release); }
  [[nodiscard]] std::uint64_t exportPublished() const noexcept {
    return exportPublished_.load(std::memory_order_acquire);
  }
  [[nodiscard]] std::span<const ExportedFlow> exportChunk() const noexcept {
    return {exportChunk_.data(), exportChunkSize_};
  }
  [[nodiscard]] std::uint64_t exportChunkLast() const noexcept { return exportChunkLast_; }
  // The request the ready chunk belongs to.
  [[nodiscard]] std::uint64_t exportChunkFor() const noexcept { return exportChunkFor_; }
  void takeExportChunk(std::uint64_t published) noexcept {
    exportTaken_.store(published, std::memory_order_release);
  }
  // After run() returned (no lcore owns the table any more): every exception
  // of the whole table against `snapshot`, appended to `out`.
  void exportAllStopped(const ForwardingSnapshot& snapshot, std::vector<ExportedFlow>& out) const;
  // Purge of backend indices (control thread): the worker erases the
  // flow-table entries naming `indices` (each below kBackendSlots) a slice per
  // drain period, zeroes their packet and new-flow counters, then reports
  // purgeDone() == n. Call only when purgeDone() has reached the previous
  // request (the worker reads the indices until then); n increasing.
  void requestPurge(std::uint64_t n, const std::vector<std::uint32_t>& indices) noexcept;
  [[nodiscard]] std::uint64_t purgeDone() const noexcept {
    return purgeDone_.load(std::memory_order_acquire);
  }
  // The heartbeat: poll rounds run so far (one relaxed store per round by
  // the lcore, no read-modify-write; any thread reads it).
  [[nodiscard]] std::uint64_t rounds() const noexcept {
    return rounds_.load(std::memory_order_relaxed);
  }
  // The flows it adopted from exceptions, and its clock (ms, the `now` it
  // steers with) at its last round: any thread.
  [[nodiscard]] const AdoptedFlowRing& adoptedFlows() const noexcept {
    return steering_.adoptedFlows();
  }
  [[nodiscard]] std::uint64_t clockMs() const noexcept {
    return clockMs_.load(std::memory_order_relaxed);
  }

 private:
  struct PortIo;
  // Returns how many frames the RX burst brought.
  std::uint16_t pollPort(PortIo& io, const ForwardingSnapshot& snapshot,
                         std::uint64_t nowMs) noexcept;
  void pollTap(PortIo& io) noexcept;
  void send(PortIo& to, rte_mbuf* m) noexcept;
  void sendToTap(PortIo& io, rte_mbuf* m) noexcept;
  void flushAll() noexcept;
  void countFlowsSlice(std::uint64_t nowMs) noexcept;
  void exportExceptionsSlice(const ForwardingSnapshot& snapshot, std::uint64_t nowMs) noexcept;
  void purgeSlice() noexcept;

  WorkerConfig config_;
  QsbrDomain& qsbr_;
  const SnapshotPublisher& publisher_;
  Steering steering_;
  // pollPort()'s burst of frames and verdicts: members, so a burst does not
  // value-initialise 4 KiB of stack; every element passed on is written first.
  std::array<FrameRef, kMaxBurst> burstFrames_;
  std::array<SteerResult, kMaxBurst> burstResults_;
  std::vector<std::unique_ptr<PortIo>> ports_;
  WorkerCounters counters_;

  std::atomic<std::uint64_t> flowCountRequest_{0};
  std::atomic<std::uint64_t> flowCountDone_{0};
  std::atomic<std::uint64_t> rounds_{0};
  std::atomic<std::uint64_t> clockMs_{0};  // lastNowMs_, for other threads
  std::uint64_t countingFor_ = 0;          // request being counted; 0 = none
  std::size_t countCursor_ = 0;
  std::vector<std::uint32_t> countScratch_;
  std::unique_ptr<Counter[]> liveFlows_;

  std::atomic<std::uint64_t> exportRequest_{0};
  std::atomic<std::uint64_t> exportPublished_{0};
  std::atomic<std::uint64_t> exportTaken_{0};
  std::atomic<const ForwardingSnapshot*> exportNext_{nullptr};
  bool exportAhead_ = false;        // the request being walked came with a next snapshot
  std::uint64_t exportingFor_ = 0;  // request being walked; 0 = none
  std::uint64_t exportDoneFor_ = 0;
  std::size_t exportCursor_ = 0;
  std::vector<ExportedFlow> exportChunk_;  // kExportChunk, allocated once
  std::size_t exportChunkSize_ = 0;
  std::uint64_t exportChunkLast_ = 0;  // the request this chunk ends, else 0
  std::uint64_t exportChunkFor_ = 0;   // the request this chunk belongs to
  bool exportChunkOut_ = false;        // published, not yet known to be taken
  std::uint64_t lastNowMs_ = 0;        // the lcore clock at its last round
  // Written by the control thread before it stores purgeRequest_, read by
  // this worker until it stores purgeDone_ (release/acquire both ways).
  std::vector<std::uint64_t> purgeBits_;     // bitmap over kBackendSlots
  std::vector<std::uint32_t> purgeIndices_;  // the same indices, listed
  std::atomic<std::uint64_t> purgeRequest_{0};
  std::atomic<std::uint64_t> purgeDone_{0};
  std::uint64_t purgingFor_ = 0;  // request being purged; 0 = none
};

}  // namespace spillway
