#include "worker.hpp"

#include <rte_cycles.h>
#include <rte_malloc.h>
#include <rte_mbuf.h>
#include <rte_prefetch.h>
#include <sys/prctl.h>

#include <algorithm>
#include <ctime>
#include <stdexcept>

#include "spillway/idle_backoff.hpp"

namespace spillway {

namespace {
// The whole-table walks of the drain period (live-flow count, purge of a
// removed backend's index): 256 buckets, 16 KiB of table, per period, a few
// microseconds at 1M flows. 8192 (512 KiB) made a 64-128 us round every drain
// period while a walk ran, the worker's largest source of long rounds at 1M
// flows; 1024 still left ~300-600 housekeeping rounds of 16-32 us per bench
// run, 256 leaves 70-90 (BENCHMARKS.md, #16). A count then takes 0.1 s at 1M
// flows and 0.8 s at 10M (2M buckets), inside the control thread's 1 s ask.
constexpr std::size_t kWalkBucketsPerDrain = 256;
}  // namespace

struct Worker::PortIo {
  std::uint16_t portId = 0;
  bool hasTap = false;
  bool kernelHasCopy = false;  // af_packet / af_xdp: the kernel keeps its own path
  // af_packet: a frame longer than this (MTU + Ethernet header + one VLAN
  // tag) cannot have arrived on the interface: it is an IPv4 datagram the
  // PMD's fanout (PACKET_FANOUT_FLAG_DEFRAG) had the kernel reassemble,
  // often cut at the ring's frame size. 0: no such check.
  std::uint32_t reassembledAbove = 0;
  std::uint16_t tapPortId = 0;
  rte_eth_dev_tx_buffer* tx = nullptr;
  rte_eth_dev_tx_buffer* tapTx = nullptr;
};

namespace {

rte_eth_dev_tx_buffer* makeTxBuffer(std::uint16_t size, Counter* dropped, int socket) {
  auto* b = static_cast<rte_eth_dev_tx_buffer*>(
      rte_zmalloc_socket("swd_txbuf", RTE_ETH_TX_BUFFER_SIZE(size), 0, socket));
  if (b == nullptr) throw std::runtime_error("cannot allocate a TX buffer");
  rte_eth_tx_buffer_init(b, size);
  rte_eth_tx_buffer_set_err_callback(
      b,
      [](rte_mbuf** unsent, std::uint16_t count, void* user) {
        rte_pktmbuf_free_bulk(unsent, count);
        static_cast<Counter*>(user)->add(count);
      },
      dropped);
  return b;
}

// EtherType IPv4, directly or behind one 802.1Q/802.1ad tag.
bool carriesIpv4(const std::uint8_t* f, std::uint32_t len) noexcept {
  if (len < 18) return false;
  const unsigned type = unsigned{f[12]} << 8 | f[13];
  if (type == 0x0800) return true;
  return (type == 0x8100 || type == 0x88a8) && (unsigned{f[16]} << 8 | f[17]) == 0x0800;
}

}  // namespace

Worker::Worker(const WorkerConfig& config, const std::vector<OpenPort>& ports, QsbrDomain& qsbr,
               const SnapshotPublisher& publisher)
    : config_(config),
      qsbr_(qsbr),
      publisher_(publisher),
      steering_(config.flowTable, config.hashSeed, config.icmpLimits),
      countScratch_(kBackendSlots, 0),
      liveFlows_(std::make_unique<Counter[]>(kBackendSlots)),
      exportChunk_(kExportChunk),
      purgeBits_((kBackendSlots + 63) / 64, 0) {
  purgeIndices_.reserve(kBackendSlots);
  const int socket = static_cast<int>(rte_lcore_to_socket_id(config.lcore));
  for (const auto& p : ports) {
    auto io = std::make_unique<PortIo>();
    io->portId = p.portId;
    io->hasTap = p.hasTap;
    io->tapPortId = p.tapPortId;
    io->kernelHasCopy = p.driver == "net_af_packet" || p.driver == "net_af_xdp";
    if (p.driver == "net_af_packet") io->reassembledAbove = p.spec.mtu + 14u + 4u;
    io->tx = makeTxBuffer(config.burst, &counters_.txDropped, socket);
    if (p.hasTap) io->tapTx = makeTxBuffer(config.burst, &counters_.txDropped, socket);
    ports_.push_back(std::move(io));
  }
}

Worker::~Worker() {
  for (auto& io : ports_) {
    rte_free(io->tx);
    rte_free(io->tapTx);
  }
}

void Worker::send(PortIo& to, rte_mbuf* m) noexcept {
  counters_.txPackets.add(rte_eth_tx_buffer(to.portId, config_.queue, to.tx, m));
}

void Worker::sendToTap(PortIo& io, rte_mbuf* m) noexcept {
  rte_eth_tx_buffer(io.tapPortId, config_.queue, io.tapTx, m);
}

std::uint16_t Worker::pollPort(PortIo& io, const ForwardingSnapshot& snapshot,
                               std::uint64_t nowMs) noexcept {
  std::array<rte_mbuf*, kMaxBurst> mbufs;
  const std::uint16_t want = config_.burst < kMaxBurst ? config_.burst : kMaxBurst;
  const std::uint16_t n = rte_eth_rx_burst(io.portId, config_.queue, mbufs.data(), want);
  if (n == 0) return 0;
  std::array<FrameRef, kMaxBurst>& frames = burstFrames_;
  std::array<SteerResult, kMaxBurst>& results = burstResults_;
  std::array<rte_mbuf*, kMaxBurst> kept;
  std::uint16_t k = 0;
  for (std::uint16_t i = 0; i < n; ++i) {
    rte_mbuf* m = mbufs[i];
    if (m->nb_segs != 1) [[unlikely]] {
      counters_.unsteered.add();
      counters_.drops.add(DropReason::MultiSegment);
      rte_pktmbuf_free(m);
      continue;
    }
    if (m->data_len > io.reassembledAbove && io.reassembledAbove != 0 &&
        carriesIpv4(rte_pktmbuf_mtod(m, const std::uint8_t*), m->data_len)) [[unlikely]] {
      // Fragments, reassembled by the kernel: counted as the other port
      // modes count the fragments themselves.
      counters_.unsteered.add();
      counters_.drops.add(DropReason::Ipv4Fragment);
      rte_pktmbuf_free(m);
      continue;
    }
    frames[k] = FrameRef{std::span(static_cast<std::byte*>(m->buf_addr), m->buf_len), m->data_off,
                         m->data_len};
    kept[k++] = m;
  }
  steering_.steerBurst(std::span(frames.data(), k), std::span(results.data(), k), snapshot, nowMs);
  for (std::uint16_t i = 0; i < k; ++i) {
    rte_mbuf* m = kept[i];
    const SteerResult& r = results[i];
    switch (r.verdict) {
      case Verdict::Forward:
      case Verdict::Reply: {
        m->data_off = static_cast<std::uint16_t>(r.dataOffset);
        m->data_len = static_cast<std::uint16_t>(r.length);
        m->pkt_len = static_cast<std::uint32_t>(r.length);
        PortIo* out = &io;
        if (r.verdict == Verdict::Forward) {
          if (r.egressPort >= ports_.size()) [[unlikely]] {  // a snapshot bug; never silently
            counters_.drops.add(DropReason::NoBackend);
            rte_pktmbuf_free(m);
            break;
          }
          out = ports_[r.egressPort].get();
          if (r.backend < kBackendSlots) {
            BackendTraffic& t = counters_.backendTraffic[r.backend];
            t.packets.add();
            t.bytes.add(r.length);
            if (r.newFlow) counters_.backendNewFlows[r.backend].add();
          }
        }
        send(*out, m);
        break;
      }
      case Verdict::ToKernel:
        if (io.hasTap) {
          sendToTap(io, m);
          counters_.exceptionTx.add();
        } else if (io.kernelHasCopy) {
          // af_packet and af_xdp: the kernel already has its own copy, or
          // the XDP program passed it there before it reached us.
          rte_pktmbuf_free(m);
        } else {
          counters_.kernelDropped.add();
          counters_.drops.add(DropReason::NoExceptionPath);
          rte_pktmbuf_free(m);
        }
        break;
      case Verdict::Drop:
        rte_pktmbuf_free(m);
        break;
    }
  }
  return n;
}

void Worker::pollTap(PortIo& io) noexcept {
  std::array<rte_mbuf*, kMaxBurst> mbufs;
  const std::uint16_t want = config_.burst < kMaxBurst ? config_.burst : kMaxBurst;
  const std::uint16_t n = rte_eth_rx_burst(io.tapPortId, config_.queue, mbufs.data(), want);
  for (std::uint16_t i = 0; i < n; ++i) send(io, mbufs[i]);
  counters_.exceptionRx.add(n);
}

void Worker::flushAll() noexcept {
  for (auto& io : ports_) {
    counters_.txPackets.add(rte_eth_tx_buffer_flush(io->portId, config_.queue, io->tx));
    // (frames lost at a full ring are counted by the buffer's error callback)
    if (io->hasTap) (void)rte_eth_tx_buffer_flush(io->tapPortId, config_.queue, io->tapTx);
  }
}

void Worker::countFlowsSlice(std::uint64_t nowMs) noexcept {
  constexpr std::size_t kBucketsPerSlice = kWalkBucketsPerDrain;
  if (countingFor_ == 0) {
    const std::uint64_t req = flowCountRequest_.load(std::memory_order_acquire);
    if (req == flowCountDone_.load(std::memory_order_relaxed)) return;
    countingFor_ = req;
    countCursor_ = 0;
    steering_.beginPlacementEpoch(req);
    std::fill(countScratch_.begin(), countScratch_.end(), 0);
  }
  FlowTable& table = steering_.flowTable();
  table.countByBackend(countScratch_, nowMs, countCursor_, kBucketsPerSlice);
  countCursor_ += kBucketsPerSlice;
  if (countCursor_ < table.bucketCount()) return;
  for (std::size_t i = 0; i < countScratch_.size(); ++i) liveFlows_[i].set(countScratch_[i]);
  flowCountDone_.store(countingFor_, std::memory_order_release);
  countingFor_ = 0;
}

void Worker::exportExceptionsSlice(const ForwardingSnapshot& snapshot,
                                   std::uint64_t nowMs) noexcept {
  // 16 KiB of table per drain period: ~15 us of a 100 us period at full
  // load (BENCHMARKS.md), so forwarding keeps most of the core during a walk.
  constexpr std::size_t kBucketsPerSlice = 256;
  static_assert(kBucketsPerSlice * FlowTable::kSlotsPerBucket <= kExportChunk);
  if (exportPublished_.load(std::memory_order_relaxed) !=
      exportTaken_.load(std::memory_order_acquire)) {
    return;  // the control thread has not taken the last chunk yet
  }
  if (exportChunkOut_) {  // taken: the next chunk starts empty
    exportChunkOut_ = false;
    exportChunkSize_ = 0;
    exportChunkLast_ = 0;
  }
  const std::uint64_t req = exportRequest_.load(std::memory_order_acquire);
  if (exportingFor_ != 0 && req != exportingFor_) {
    exportingFor_ = 0;  // a newer request (the old one was given up): start over
  }
  if (exportingFor_ == 0) {
    if (req == exportDoneFor_) return;
    exportingFor_ = req;
    exportCursor_ = 0;
    exportChunkSize_ = 0;
    exportAhead_ = exportNext_.load(std::memory_order_acquire) != nullptr;
  }
  // Make-before-break: the snapshot about to be published, read afresh each
  // slice (the control thread keeps it alive until it clears the pointer).
  const ForwardingSnapshot* next =
      exportAhead_ ? exportNext_.load(std::memory_order_acquire) : nullptr;
  if (exportAhead_ && next == nullptr) {
    // The step was published without waiting for this walk: no one collects it.
    exportDoneFor_ = exportingFor_;
    exportingFor_ = 0;
    exportChunkSize_ = 0;
    return;
  }
  const FlowTable& table = steering_.flowTable();
  table.forEachLive(nowMs, exportCursor_, kBucketsPerSlice,
                    [&](std::uint64_t hash, std::uint32_t backend, FlowState state,
                        std::uint32_t idle, std::uint8_t vipTag) {
                      if (exportsFlow(snapshot, next, hash, backend, vipTag)) {
                        exportChunk_[exportChunkSize_++] = ExportedFlow{hash, backend, state, idle};
                      }
                    });
  exportCursor_ += kBucketsPerSlice;
  const bool finished = exportCursor_ >= table.bucketCount();
  if (!finished &&
      exportChunkSize_ + kBucketsPerSlice * FlowTable::kSlotsPerBucket <= kExportChunk) {
    return;  // room for another slice
  }
  exportChunkLast_ = finished ? exportingFor_ : 0;
  exportChunkFor_ = exportingFor_;
  exportChunkOut_ = true;
  exportPublished_.store(exportPublished_.load(std::memory_order_relaxed) + 1,
                         std::memory_order_release);
  if (finished) {
    exportDoneFor_ = exportingFor_;
    exportingFor_ = 0;
  }
}

void Worker::exportAllStopped(const ForwardingSnapshot& snapshot,
                              std::vector<ExportedFlow>& out) const {
  const FlowTable& table = steering_.flowTable();
  table.forEachLive(lastNowMs_, 0, table.bucketCount(),
                    [&](std::uint64_t hash, std::uint32_t backend, FlowState state,
                        std::uint32_t idle, std::uint8_t vipTag) {
                      if (exportsFlow(snapshot, nullptr, hash, backend, vipTag)) {
                        out.push_back(ExportedFlow{hash, backend, state, idle});
                      }
                    });
}

void Worker::requestPurge(std::uint64_t n, const std::vector<std::uint32_t>& indices) noexcept {
  for (std::uint32_t i : purgeIndices_) purgeBits_[i / 64] = 0;
  purgeIndices_.clear();
  for (std::uint32_t i : indices) {
    if (i == 0 || i >= kBackendSlots || purgeIndices_.size() == purgeIndices_.capacity()) continue;
    purgeBits_[i / 64] |= std::uint64_t{1} << (i % 64);
    purgeIndices_.push_back(i);
  }
  purgeRequest_.store(n, std::memory_order_release);
}

void Worker::purgeSlice() noexcept {
  constexpr std::size_t kBucketsPerSlice = kWalkBucketsPerDrain;
  FlowTable& table = steering_.flowTable();
  if (purgingFor_ == 0) {
    const std::uint64_t req = purgeRequest_.load(std::memory_order_acquire);
    if (req == purgeDone_.load(std::memory_order_relaxed)) return;
    purgingFor_ = req;
    table.beginPurge(purgeBits_);
  }
  if (!table.purgeSlice(kBucketsPerSlice)) return;
  for (std::uint32_t i : purgeIndices_) {
    counters_.backendTraffic[i].packets.set(0);
    counters_.backendTraffic[i].bytes.set(0);
    counters_.backendNewFlows[i].set(0);
  }
  purgeDone_.store(purgingFor_, std::memory_order_release);
  purgingFor_ = 0;
}

void Worker::run(const std::atomic<bool>& stop) noexcept {
  const std::uint64_t hz = rte_get_tsc_hz();
  const std::uint64_t drainTsc = hz / 1'000'000 * config_.txDrainUs;
  const std::uint64_t start = rte_get_tsc_cycles();
  std::uint64_t lastDrain = start;
  std::uint64_t lastExport = start;
  // The steering clock: milliseconds of TSC time since the worker started,
  // offset so that it never sits near zero (flow stamps are 32-bit).
  const std::uint64_t tscPerMs = hz / 1000 == 0 ? 1 : hz / 1000;
  // Past 256 empty rounds in a row an idle-sleeping worker pauses between
  // rounds, from idleSleepUs doubling up to idleSleepMaxUs.
  IdleBackoff backoff(config_.idleSleepUs, config_.idleSleepMaxUs);
  if (config_.idleSleepUs != 0) {
    // The kernel's default 50 us timer slack would add to every pause.
    (void)prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  }
  // Round durations: TSC cycles to ns as (cycles * nsPerCycle20) >> 20.
  const std::uint64_t nsPerCycle20 = (std::uint64_t{1'000'000'000} << 20) / (hz == 0 ? 1 : hz);
  std::uint64_t roundStart = 0;
  bool timed = false;         // the previous round counts (it did not pause)
  bool housekeeping = false;  // the previous round did the drain period's work
  qsbr_.online(config_.qsbrReader);
  std::uint64_t rounds = rounds_.load(std::memory_order_relaxed);
  while (!stop.load(std::memory_order_relaxed)) {
    rounds_.store(++rounds, std::memory_order_relaxed);
    const std::uint64_t tsc = rte_get_tsc_cycles();
    if (timed) [[likely]] {
      // Capped at 2^40 cycles (minutes) so the product stays in 64 bits.
      const std::uint64_t ns =
          (std::min(tsc - roundStart, std::uint64_t{1} << 40) * nsPerCycle20) >> 20;
      counters_.rounds.add(ns);
      if (housekeeping) counters_.housekeepingRounds.add(ns);
    }
    roundStart = tsc;
    timed = true;
    housekeeping = false;
    const std::uint64_t nowMs = (tsc - start) / tscPerMs + 1'000'000;
    const ForwardingSnapshot* snapshot = publisher_.current();
    unsigned received = 0;
    lastNowMs_ = nowMs;
    clockMs_.store(nowMs, std::memory_order_relaxed);
    if (snapshot != nullptr) [[likely]] {
      for (auto& io : ports_) received += pollPort(*io, *snapshot, nowMs);
      counters_.snapshotGeneration.set(snapshot->generation);
      // Needs the snapshot, so before the quiescent report; one slice per
      // drain period.
      if (tsc - lastExport >= drainTsc) {
        lastExport = tsc;
        housekeeping = true;
        exportExceptionsSlice(*snapshot, nowMs);
      }
    }
    for (auto& io : ports_) {
      if (io->hasTap) pollTap(*io);
    }
    // No pointer into the snapshot survives past this point.
    qsbr_.quiescent(config_.qsbrReader);
    // A round that found every RX queue empty sends what is buffered at once:
    // below line rate frames leave without waiting for a full burst or the
    // drain deadline (BENCHMARKS.md: p50 at 80 % load fell from ~20 us to
    // ~3 us), and at line rate no round is empty, so bursts stay whole.
    if (received == 0 && config_.flushWhenIdle) flushAll();
    if (const std::uint32_t pauseUs = backoff.afterRound(received); pauseUs != 0) {
      // After the quiescent report, so a grace period waits at most one pause.
      counters_.idleSleeps.add(1);
      timed = false;  // a pause on purpose is no round time
      const timespec pause{static_cast<time_t>(pauseUs / 1'000'000),
                           static_cast<long>(pauseUs % 1'000'000) * 1000};
      (void)nanosleep(&pause, nullptr);
    }
    if (tsc - lastDrain >= drainTsc) {
      flushAll();
      lastDrain = tsc;
      housekeeping = true;
      // Idle-time housekeeping: a few flow-table buckets per drain period.
      (void)steering_.flowTable().sweep(nowMs, 64);
      countFlowsSlice(nowMs);
      purgeSlice();
    }
  }
  flushAll();
  qsbr_.offline(config_.qsbrReader);
}

}  // namespace spillway
