// spillway-pktgen: a small DPDK TCP traffic generator for one port (a
// net_memif link to spillwayd, or to dpdk-testpmd as the reference), used by
// scripts/bench and the dpdk suite's memif test.
//
//   spillway-pktgen [EAL options] -- --flows N [--syn-share F] [--size B]
//       [--config spillway.toml] [--verify maglev|none] [--warm] [--duration S]
//       [--latency-duration S] [--latency-share F] [--queues Q] [--json]
//
// Queues: with --queues Q the port gets Q RX/TX queue pairs and each
// established flow always goes out on queue hash(5-tuple) % Q, the software
// stand-in for a NIC's RSS (a memif link has none), so the worker behind each
// queue sees whole flows; a SYN of a new flow is sent once, on whichever
// queue is being filled. The traffic lcores (every EAL lcore but the main
// one; the main one when it is alone) take the queues in turn (queue q on
// traffic lcore q % lcores), each with its own counters, histogram and
// phases, in step at a barrier between phases; the results are their sums
// (rates add; the latency histogram is the merged one) plus each queue's
// returned frames.
//
// Traffic: IPv4 TCP to the first TCP VIP of the configuration (or --vip
// A:PORT), N established flows cycled in order (10.0.0.0/10 sources) plus a
// share of SYNs that each open a new flow (10.128.0.0/9 sources). Every frame
// carries the TSC at its last 8 bytes, which both 5tswap (no length change)
// and encapsulation (headers in front) leave in place, so latency needs no
// parsing. Phases:
//   link up -> warm (optional, lossless, minimum-size frames: one SYN then
//   one ACK per flow, so the flows are established in the load balancer's
//   table; --warm-passes 1 sends the SYNs only) -> throughput
//   (as fast as the link takes frames; a warm-up second, then the window:
//   rate = frames returned per second) -> latency (paced at latency-share of
//   the measured rate; p50/p99 of return time from a histogram).
// Returned frames are counted; those that are IPv4-in-IPv4 count as
// encapsulated, and every --sample-every-th one is decoded: its inner 5-tuple
// is hashed with the configuration's seed, looked up in the Maglev table the
// same control-plane code builds for spillwayd, and the outer destination
// must be that backend's address (a mismatch is counted and reported).
//
// Thread contract: each traffic lcore sends and receives on its own queues
// only; the mbuf pools are shared (DPDK's per-lcore caches), the predictor
// and the flow-to-queue lists are read-only once traffic starts. Results go
// to stdout as one JSON object (--json, nlohmann-json) or
// text. Arguments after the EAL's "--" through CLI11; usage errors exit 2.
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "control/backends/snapshot_builder.hpp"
#include "control/config/config.hpp"
#include "control/plane/control_plane.hpp"
#include "spillway/flow_key.hpp"
#include "spillway/snapshot.hpp"

namespace spillway {
namespace {

std::atomic<bool> gStop{false};
// Set when a warm pass's link took no frame for kStallSeconds: DPDK 22.11's
// memif can leave a ring stuck after its link comes up under traffic (full
// on our side, empty on the peer's; README, "Benchmarks"). The run then ends
// with exit status kExitLinkStalled instead of spinning for ever.
std::atomic<bool> gLinkStalled{false};
constexpr double kStallSeconds = 3.0;
constexpr int kExitLinkStalled = 3;
void onSignal(int) {
  gStop.store(true);
}

constexpr std::uint16_t kBurst = 32;
constexpr std::uint16_t kPacedBurst = 4;
constexpr unsigned kTxMbufs = 8191;
constexpr unsigned kRxMbufs = 8191;
constexpr std::size_t kMinFrame = 64;  // Ethernet + IPv4 + TCP + 10 bytes (TSC)
constexpr std::size_t kMaxFrame = 1514;
constexpr std::size_t kHeaders = 14 + 20 + 20;
constexpr std::uint32_t kFlowsPerSource = 50000;
constexpr std::uint16_t kFirstPort = 10000;
constexpr std::uint32_t kEstablishedBase = 0x0a000001;  // 10.0.0.1
constexpr std::uint32_t kSynBase = 0x0a800001;          // 10.128.0.1
constexpr double kHistNs = 25.0;                        // histogram bucket width
constexpr std::size_t kHistBuckets = 40000;             // up to 1 ms; beyond: overflow

struct Options {
  std::uint64_t flows = 1000;
  double synShare = 0.0;
  std::size_t size = 64;
  std::string configPath;
  std::string verify = "maglev";
  bool warm = false;
  unsigned warmPasses = 2;  // 1: SYNs only (flows tracked, promoted by their first ACK)
  double duration = 2.0;
  double warmupSeconds = 0.5;
  double latencyDuration = 1.0;
  double latencyShare = 0.8;
  unsigned sampleEvery = 16;
  double linkTimeout = 15.0;
  bool json = false;
  std::optional<std::uint32_t> vipAddress;  // host order
  std::uint16_t vipPort = 80;
  std::uint16_t queues = 1;
  bool hold = false;
};

[[noreturn]] void usage(const std::string& error) {
  std::fprintf(stderr, "spillway-pktgen: %s (see -- --help)\n", error.c_str());
  std::exit(2);
}

std::optional<std::uint32_t> parseIpv4(const std::string& s) {
  unsigned a, b, c, d;
  char tail;
  if (std::sscanf(s.c_str(), "%u.%u.%u.%u%c", &a, &b, &c, &d, &tail) != 4 || a > 255 || b > 255 ||
      c > 255 || d > 255) {
    return std::nullopt;
  }
  return (a << 24) | (b << 16) | (c << 8) | d;
}

// The generator's options, after the EAL's "--". Usage errors exit 2.
Options parseOptions(int argc, char** argv) {
  Options o;
  std::string vip;
  CLI::App app(
      "spillway-pktgen: TCP traffic to a VIP through one DPDK port; "
      "EAL options first, then --, then these",
      "spillway-pktgen [EAL options] --");
  app.add_option("--config", o.configPath, "spillwayd's configuration (VIP, Maglev tables)");
  app.add_option("--vip", vip, "A.B.C.D:PORT to send to (default: the first IPv4 TCP VIP)");
  app.add_option("--flows", o.flows, "established flows, cycled")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{10'000'000}));
  app.add_option("--syn-share", o.synShare, "share of SYNs opening new flows")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--size", o.size, "frame size in bytes")
      ->capture_default_str()
      ->check(CLI::Range(kMinFrame, kMaxFrame));
  app.add_option("--verify", o.verify, "check returned frames against the Maglev table")
      ->capture_default_str()
      ->check(CLI::IsMember({"maglev", "none"}));
  app.add_option("--sample-every", o.sampleEvery, "decode every N-th returned frame")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1'000'000u));
  app.add_flag("--warm", o.warm, "establish the flows losslessly first");
  app.add_option("--warm-passes", o.warmPasses, "1: SYNs only; 2: SYN then ACK")
      ->capture_default_str()
      ->check(CLI::Range(1u, 2u));
  app.add_option("--duration", o.duration, "throughput window, seconds")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--warmup", o.warmupSeconds, "seconds before the window")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--latency-duration", o.latencyDuration, "latency phase, seconds (0: none)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--latency-share", o.latencyShare, "latency rate as a share of the measured")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1.0));
  app.add_option("--link-timeout", o.linkTimeout, "seconds to wait for the link")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--queues", o.queues, "RX/TX queue pairs; flows spread by a 5-tuple hash")
      ->capture_default_str()
      ->check(CLI::Range(std::uint16_t{1}, std::uint16_t{64}));
  app.add_flag("--hold", o.hold,
               "after the results, keep the port open (not polled) until stdin closes");
  app.add_flag("--json", o.json, "results as one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    std::exit(app.exit(help));
  } catch (const CLI::ParseError& error) {
    usage(error.what());
  }
  if (!vip.empty()) {
    const auto colon = vip.rfind(':');
    if (colon == std::string::npos) usage("--vip = \"" + vip + "\": expected A.B.C.D:PORT");
    o.vipAddress = parseIpv4(vip.substr(0, colon));
    if (!o.vipAddress) usage("--vip = \"" + vip + "\": not an IPv4 address");
    const std::string port = vip.substr(colon + 1);
    unsigned value = 0;
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535) {
      usage("--vip = \"" + vip + "\": port not in [1, 65535]");
    }
    o.vipPort = static_cast<std::uint16_t>(value);
  }
  if (o.verify == "maglev" && o.configPath.empty()) {
    usage("--verify maglev needs --config (the configuration spillwayd runs)");
  }
  if (o.configPath.empty() && !o.vipAddress) usage("give --config or --vip");
  return o;
}

// --- frames -------------------------------------------------------------

inline void put16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v >> 8);
  p[1] = static_cast<std::uint8_t>(v);
}
inline void put32(std::uint8_t* p, std::uint32_t v) {
  put16(p, static_cast<std::uint16_t>(v >> 16));
  put16(p + 2, static_cast<std::uint16_t>(v));
}
inline std::uint16_t get16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>((p[0] << 8) | p[1]);
}
inline std::uint32_t get32(const std::uint8_t* p) {
  return (std::uint32_t{get16(p)} << 16) | get16(p + 2);
}

constexpr std::uint8_t kSyn = 0x02, kAck = 0x10;

struct FlowAddr {
  std::uint32_t src;
  std::uint16_t port;
};

inline FlowAddr establishedFlow(std::uint64_t i) {
  return {kEstablishedBase + static_cast<std::uint32_t>(i / kFlowsPerSource),
          static_cast<std::uint16_t>(kFirstPort + i % kFlowsPerSource)};
}
inline FlowAddr synFlow(std::uint64_t j) {
  return {kSynBase + static_cast<std::uint32_t>((j / kFlowsPerSource) & 0x7fffff),
          static_cast<std::uint16_t>(kFirstPort + j % kFlowsPerSource)};
}

// The queue of an established flow: a hash of its 5-tuple (the source is all
// that varies; splitmix64's finaliser), the stand-in for a NIC's RSS.
inline std::uint16_t queueOf(FlowAddr a, std::uint16_t queues) {
  std::uint64_t x = (std::uint64_t{a.src} << 16) | a.port;
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return static_cast<std::uint16_t>(x % queues);
}

// The established flows of each queue, in order (indices for establishedFlow).
std::vector<std::vector<std::uint32_t>> flowsByQueue(std::uint64_t flows, std::uint16_t queues) {
  std::vector<std::vector<std::uint32_t>> out(queues);
  for (auto& v : out) v.reserve(flows / queues + flows / (4 * queues) + 16);
  for (std::uint64_t i = 0; i < flows; ++i) {
    out[queueOf(establishedFlow(i), queues)].push_back(static_cast<std::uint32_t>(i));
  }
  return out;
}

// Traffic lcores wait here for each other between phases.
class Barrier {
 public:
  explicit Barrier(unsigned parties) : parties_(parties) {}
  void wait() {
    const unsigned gen = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == parties_) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_acq_rel);
      return;
    }
    while (generation_.load(std::memory_order_acquire) == gen) rte_pause();
  }

 private:
  const unsigned parties_;
  std::atomic<unsigned> arrived_{0};
  std::atomic<unsigned> generation_{0};
};

class FrameWriter {
 public:
  FrameWriter(std::size_t size, std::uint32_t dst, std::uint16_t dstPort)
      : size_(size), dst_(dst), dstPort_(dstPort) {
    std::memset(tmpl_.data(), 0, tmpl_.size());
    std::uint8_t* f = tmpl_.data();
    const std::uint8_t dmac[6] = {0x02, 0, 0, 0, 0, 0x02}, smac[6] = {0x02, 0, 0, 0, 0, 0x01};
    std::memcpy(f, dmac, 6);
    std::memcpy(f + 6, smac, 6);
    put16(f + 12, 0x0800);
    std::uint8_t* ip = f + 14;
    ip[0] = 0x45;
    put16(ip + 2, static_cast<std::uint16_t>(size - 14));
    put16(ip + 6, 0x4000);  // DF
    ip[8] = 64;
    ip[9] = 6;
    put32(ip + 16, dst);
    std::uint8_t* tcp = ip + 20;
    put16(tcp + 2, dstPort);
    put32(tcp + 4, 1);
    tcp[12] = 0x50;
    put16(tcp + 14, 65535);
    for (std::size_t i = kHeaders; i < size; ++i) f[i] = static_cast<std::uint8_t>(i);
    // The IPv4 checksum's sum over every word but the source address.
    baseSum_ = 0;
    for (int w = 0; w < 10; ++w) {
      if (w == 6 || w == 7 || w == 5) continue;  // source, checksum
      baseSum_ += get16(ip + 2 * w);
    }
  }

  // The whole template, once per mbuf buffer (payloads never change after).
  void fill(std::uint8_t* p) const { std::memcpy(p, tmpl_.data(), size_); }

  // Headers only: the payload bytes are the template's already.
  inline void write(std::uint8_t* p, FlowAddr a, std::uint8_t flags, std::uint64_t tsc) const {
    std::memcpy(p, tmpl_.data(), kHeaders);
    std::uint8_t* ip = p + 14;
    put32(ip + 12, a.src);
    std::uint32_t sum = baseSum_ + (a.src >> 16) + (a.src & 0xffff);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    put16(ip + 10, static_cast<std::uint16_t>(~sum));
    std::uint8_t* tcp = ip + 20;
    put16(tcp, a.port);
    tcp[13] = flags;
    std::memcpy(p + size_ - 8, &tsc, 8);
  }
  [[nodiscard]] std::size_t size() const { return size_; }

 private:
  std::size_t size_;
  std::uint32_t dst_;
  std::uint16_t dstPort_;
  std::uint32_t baseSum_ = 0;
  std::array<std::uint8_t, kMaxFrame> tmpl_{};
};

// --- prediction ---------------------------------------------------------

struct Predictor {
  std::unique_ptr<ForwardingSnapshot> snapshot;
  std::unique_ptr<FlowHasher> hasher;
  std::uint32_t vip = 0;  // index into snapshot->vips

  // The outer IPv4 destination spillwayd must use for this flow, or 0.
  [[nodiscard]] std::uint32_t expectedBackend(std::uint32_t src, std::uint16_t srcPort,
                                              std::uint32_t dst, std::uint16_t dstPort) const {
    FlowKey k;
    k.src = ipv4Bytes(src);
    k.dst = ipv4Bytes(dst);
    k.srcPort = Be16::fromHost(srcPort);
    k.dstPort = Be16::fromHost(dstPort);
    k.proto = 6;
    k.version = IpVersion::V4;
    const std::uint32_t b = snapshot->vips[vip].table.lookup(hasher->hash(k));
    const SnapshotBackend* sb = snapshot->backend(b);
    if (sb == nullptr) return 0;
    const auto& a = sb->encap.backend;
    return (std::to_integer<std::uint32_t>(a[0]) << 24) |
           (std::to_integer<std::uint32_t>(a[1]) << 16) |
           (std::to_integer<std::uint32_t>(a[2]) << 8) | std::to_integer<std::uint32_t>(a[3]);
  }
};

// Builds the snapshot spillwayd builds from the same file at start.
std::optional<Predictor> makePredictor(const Config& fileConfig, const std::string& path,
                                       std::uint32_t vipIndex, std::string& error) {
  // The file alone: no journal or checkpoint of a running daemon is read.
  Config config = fileConfig;
  config.control.stateDir = "";
  SnapshotBuilder builder;
  if (auto e = builder.setConfig(config)) {
    error = *e;
    return std::nullopt;
  }
  for (std::uint32_t i = 0; i < config.ports.size(); ++i) {
    builder.setPortMac(i, config.ports[i].mac.value_or(MacAddress{2, 0, 0, 0, 0, 2}));
  }
  ControlPlane control(config, path, builder, nullptr, 0);
  Predictor p;
  p.snapshot = control.takeSnapshot(0);
  if (!p.snapshot) {
    error = "snapshot build failed: " + builder.lastError();
    return std::nullopt;
  }
  p.hasher = std::make_unique<FlowHasher>(config.dataplane.hashSeed);
  p.vip = vipIndex;
  return p;
}

// --- results ------------------------------------------------------------

struct Counters {
  std::uint64_t tx = 0, rx = 0, encapsulated = 0, sampled = 0, matched = 0, mismatched = 0,
                undecodable = 0, unknownFlow = 0, txRefused = 0, syns = 0;
  Counters& operator+=(const Counters& o) {
    tx += o.tx;
    syns += o.syns;
    rx += o.rx;
    encapsulated += o.encapsulated;
    sampled += o.sampled;
    matched += o.matched;
    mismatched += o.mismatched;
    undecodable += o.undecodable;
    unknownFlow += o.unknownFlow;
    txRefused += o.txRefused;
    return *this;
  }
};

// Return times: 25 ns buckets up to 1 ms, then 10 us buckets up to 100 ms
// (a preempted process on a shared machine can hold frames that long).
struct Histogram {
  static constexpr double kCoarseNs = 10'000.0;
  static constexpr std::size_t kCoarseBuckets = 10'000;
  std::vector<std::uint64_t> fine = std::vector<std::uint64_t>(kHistBuckets, 0);
  std::vector<std::uint64_t> coarse = std::vector<std::uint64_t>(kCoarseBuckets + 1, 0);
  std::uint64_t count = 0;
  void add(double ns) {
    if (ns < kHistNs * kHistBuckets) {
      ++fine[ns < 0 ? 0 : static_cast<std::size_t>(ns / kHistNs)];
    } else {
      const double b = ns / kCoarseNs;
      ++coarse[b >= kCoarseBuckets ? kCoarseBuckets : static_cast<std::size_t>(b)];
    }
    ++count;
  }
  void merge(const Histogram& o) {
    for (std::size_t i = 0; i < fine.size(); ++i) fine[i] += o.fine[i];
    for (std::size_t i = 0; i < coarse.size(); ++i) coarse[i] += o.coarse[i];
    count += o.count;
  }
  [[nodiscard]] double percentileUs(double q) const {
    if (count == 0) return -1;
    const auto want = std::max<std::uint64_t>(
        1, static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(count))));
    std::uint64_t seen = 0;
    for (std::size_t i = 0; i < kHistBuckets; ++i) {
      seen += fine[i];
      if (seen >= want) return (static_cast<double>(i) + 0.5) * kHistNs / 1000.0;
    }
    for (std::size_t i = 0; i <= kCoarseBuckets; ++i) {
      seen += coarse[i];
      if (seen >= want) return (static_cast<double>(i) + 0.5) * kCoarseNs / 1000.0;
    }
    return kCoarseBuckets * kCoarseNs / 1000.0;
  }
};

// One queue of the port as a generator lcore drives it: its established
// flows (all of them with one queue), where it is in them, and the frames
// built but not yet taken by the link.
struct QueueState {
  std::uint16_t id = 0;
  const std::vector<std::uint32_t>* flows = nullptr;  // nullptr: every flow, in order
  std::uint64_t count = 0;                            // established flows on this queue
  std::uint64_t cursor = 0;
  std::uint64_t rx = 0;
  std::array<rte_mbuf*, kBurst> pending{};
  std::uint16_t have = 0, off = 0;
  [[nodiscard]] std::uint64_t flow(std::uint64_t i) const {
    return flows == nullptr ? i : (*flows)[i];
  }
};

class Generator {
 public:
  Generator(const Options& o, std::uint16_t port, rte_mempool* txPool, std::uint32_t dst,
            std::uint16_t dstPort, const Predictor* predictor,
            const std::vector<std::vector<std::uint32_t>>* byQueue,
            const std::vector<std::uint16_t>& queues, std::uint64_t synOffset,
            std::uint64_t synStride)
      : o_(o),
        port_(port),
        txPool_(txPool),
        writer_(o.size, dst, dstPort),
        warmWriter_(kMinFrame, dst, dstPort),
        predictor_(predictor),
        hz_(rte_get_tsc_hz()),
        synEvery_(o.synShare <= 0 ? 0
                                  : static_cast<std::uint64_t>(std::llround(1024.0 * o.synShare))),
        synNext_(synOffset),
        synStride_(synStride) {
    for (const std::uint16_t q : queues) {
      QueueState st;
      st.id = q;
      st.flows = byQueue == nullptr ? nullptr : &(*byQueue)[q];
      st.count = st.flows == nullptr ? o.flows : st.flows->size();
      queues_.push_back(st);
    }
  }

  // Every buffer of the TX pool gets the whole frame once; later frames only
  // rewrite headers and the timestamp. Once, before any lcore sends.
  static bool prefill(rte_mempool* pool, const FrameWriter& writer) {
    std::vector<rte_mbuf*> all(kTxMbufs);
    unsigned got = 0;
    while (got < kTxMbufs && rte_pktmbuf_alloc_bulk(pool, &all[got], 1) == 0) ++got;
    for (unsigned i = 0; i < got; ++i) writer.fill(rte_pktmbuf_mtod(all[i], std::uint8_t*));
    rte_pktmbuf_free_bulk(all.data(), got);
    return got > 0;
  }

  // Lossless: every flow gets one SYN then one ACK, resent until the link takes it.
  void warm() {
    const auto stallTsc = static_cast<std::uint64_t>(kStallSeconds * static_cast<double>(hz_));
    std::uint64_t progress = rte_rdtsc();
    const auto stalled = [&] {
      if (rte_rdtsc() - progress < stallTsc) return false;
      gLinkStalled.store(true);
      std::fprintf(stderr,
                   "spillway-pktgen: the link took no frame for %.0f s in the warm pass "
                   "(a stuck memif ring?)\n",
                   kStallSeconds);
      return true;
    };
    for (unsigned pass = 0; pass < o_.warmPasses && !gStop.load(); ++pass) {
      const std::uint8_t flags = pass == 0 ? kSyn : kAck;
      for (QueueState& q : queues_) {
        std::uint64_t next = 0;
        std::array<rte_mbuf*, kBurst> m;
        while (next < q.count && !gStop.load()) {
          const std::uint16_t n =
              static_cast<std::uint16_t>(std::min<std::uint64_t>(kBurst, q.count - next));
          if (rte_pktmbuf_alloc_bulk(txPool_, m.data(), n) != 0) {
            drainRx(false);
            if (stalled()) return;
            continue;
          }
          const std::uint64_t tsc = rte_rdtsc();
          for (std::uint16_t i = 0; i < n; ++i) {
            m[i]->data_len = static_cast<std::uint16_t>(kMinFrame);
            m[i]->pkt_len = static_cast<std::uint32_t>(kMinFrame);
            warmWriter_.write(rte_pktmbuf_mtod(m[i], std::uint8_t*),
                              establishedFlow(q.flow(next + i)), flags, tsc);
          }
          std::uint16_t sent = 0;
          while (sent < n && !gStop.load()) {
            const std::uint16_t now = rte_eth_tx_burst(port_, q.id, m.data() + sent,
                                                       static_cast<std::uint16_t>(n - sent));
            sent = static_cast<std::uint16_t>(sent + now);
            if (now != 0) progress = rte_rdtsc();
            drainRx(false);
            if (now == 0 && stalled()) break;
          }
          if (sent < n) rte_pktmbuf_free_bulk(m.data() + sent, n - sent);
          c_.tx += sent;
          if (gLinkStalled.load()) return;
          next += n;
        }
      }
    }
    // Let the last answers come back before the counters are reset.
    const std::uint64_t until = rte_rdtsc() + hz_ / 20;
    while (rte_rdtsc() < until) drainRx(false);
  }

  // Max rate for `seconds`; returns frames per second returned in the window.
  double throughput(double warmupSeconds, double seconds) {
    run(warmupSeconds, 0, false);
    const Counters before = c_;
    const std::uint64_t t0 = rte_rdtsc();
    run(seconds, 0, false);
    const double elapsed = static_cast<double>(rte_rdtsc() - t0) / static_cast<double>(hz_);
    windowTx_ = c_.tx - before.tx;
    windowRx_ = c_.rx - before.rx;
    windowSeconds_ = elapsed;
    return static_cast<double>(windowRx_) / elapsed;
  }

  // Paced at `pps`, recording the return time of every frame.
  void latency(double seconds, double pps) {
    run(std::min(0.2, seconds / 2), pps, false);  // settle at the new rate
    run(seconds, pps, true);
    settle(true);
  }

  // Drains the answers still on their way: until every frame sent came back,
  // or none has for 500 ms (the peer dropped some), at most 5 s. A worker
  // the kernel took off its core for a while still answers before the link
  // closes; closing it would lose whatever its queue held (up to a ring).
  void settle(bool recordLatency) {
    const std::uint64_t quiet = hz_ / 2;
    const std::uint64_t giveUp = rte_rdtsc() + 5 * hz_;
    std::uint64_t lastRx = c_.rx, lastChange = rte_rdtsc();
    for (std::uint64_t now = lastChange; c_.rx < c_.tx && now - lastChange < quiet && now < giveUp;
         now = rte_rdtsc()) {
      drainRx(recordLatency);
      if (c_.rx != lastRx) {
        lastRx = c_.rx;
        lastChange = now;
      }
    }
  }

  [[nodiscard]] const Counters& counters() const { return c_; }
  [[nodiscard]] const Histogram& histogram() const { return hist_; }
  [[nodiscard]] const std::vector<QueueState>& queues() const { return queues_; }
  std::uint64_t windowTx_ = 0, windowRx_ = 0;
  double windowSeconds_ = 0;

 private:
  inline void build(rte_mbuf* m, FlowAddr a, std::uint8_t flags, std::uint64_t tsc) {
    m->data_len = static_cast<std::uint16_t>(writer_.size());
    m->pkt_len = static_cast<std::uint32_t>(writer_.size());
    writer_.write(rte_pktmbuf_mtod(m, std::uint8_t*), a, flags, tsc);
  }

  // The next frame of the mix on queue q: mostly its next established flow
  // in turn, and synEvery_/1024 of them a SYN of a flow never seen before
  // (this lcore's share of them: synOffset + k * synStride).
  inline void nextFrame(QueueState& q, rte_mbuf* m, std::uint64_t tsc) {
    if ((synEvery_ != 0 && (mix_++ & 1023) < synEvery_) || q.count == 0) {
      build(m, synFlow(synNext_), kSyn, tsc);
      synNext_ += synStride_;
      ++c_.syns;
      return;
    }
    build(m, establishedFlow(q.flow(q.cursor)), kAck, tsc);
    if (++q.cursor == q.count) q.cursor = 0;
  }

  // Frames the link refused wait on their queue for the next try
  // (back-pressure: the peer sets the pace, and no frame is built twice);
  // the queues take turns, a new burst built for a queue only when none of
  // its frames wait, and when paced, only at their time.
  void run(double seconds, double pps, bool recordLatency) {
    const std::uint64_t end =
        rte_rdtsc() + static_cast<std::uint64_t>(seconds * static_cast<double>(hz_));
    const std::uint16_t burst = pps > 0 ? kPacedBurst : kBurst;
    const double tscPerBurst = pps > 0 ? static_cast<double>(hz_) * burst / pps : 0;
    double nextSend = static_cast<double>(rte_rdtsc());
    std::size_t turn = 0;
    for (;;) {
      const std::uint64_t now = rte_rdtsc();
      if (now >= end || gStop.load(std::memory_order_relaxed)) break;
      QueueState& q = queues_[turn];
      if (++turn == queues_.size()) turn = 0;
      if (q.off == q.have && (pps <= 0 || static_cast<double>(now) >= nextSend) &&
          rte_pktmbuf_alloc_bulk(txPool_, q.pending.data(), burst) == 0) {
        for (std::uint16_t i = 0; i < burst; ++i) nextFrame(q, q.pending[i], now);
        q.have = burst;
        q.off = 0;
        if (pps > 0) {
          nextSend += tscPerBurst;
          // Never make up for lost time with a burst of bursts.
          if (nextSend < static_cast<double>(now)) nextSend = static_cast<double>(now);
        }
      }
      if (q.off < q.have) {
        const std::uint16_t sent = rte_eth_tx_burst(port_, q.id, q.pending.data() + q.off,
                                                    static_cast<std::uint16_t>(q.have - q.off));
        q.off = static_cast<std::uint16_t>(q.off + sent);
        c_.tx += sent;
        if (q.off < q.have) ++c_.txRefused;
      }
      drainRx(recordLatency);
    }
    for (QueueState& q : queues_) {
      if (q.off < q.have) rte_pktmbuf_free_bulk(q.pending.data() + q.off, q.have - q.off);
      q.have = q.off = 0;
    }
  }

  inline void drainRx(bool recordLatency) {
    for (QueueState& q : queues_) drainQueue(q, recordLatency);
  }

  inline void drainQueue(QueueState& q, bool recordLatency) {
    std::array<rte_mbuf*, kBurst> m;
    const std::uint16_t n = rte_eth_rx_burst(port_, q.id, m.data(), kBurst);
    if (n == 0) return;
    const std::uint64_t now = rte_rdtsc();
    for (std::uint16_t i = 0; i < n; ++i) {
      const auto* p = rte_pktmbuf_mtod(m[i], const std::uint8_t*);
      const std::uint16_t len = m[i]->data_len;
      const bool encapsulated =
          len >= 14 + 20 + kHeaders - 14 && p[12] == 0x08 && p[13] == 0x00 && p[14 + 9] == 4;
      c_.encapsulated += encapsulated;
      if (recordLatency && len >= 8) {
        std::uint64_t sent;
        std::memcpy(&sent, p + len - 8, 8);
        if (sent <= now) {
          hist_.add(static_cast<double>(now - sent) * 1e9 / static_cast<double>(hz_));
        }
      }
      if (predictor_ != nullptr && (c_.rx + i) % o_.sampleEvery == 0) check(p, len, encapsulated);
    }
    c_.rx += n;
    q.rx += n;
    rte_pktmbuf_free_bulk(m.data(), n);
  }

  void check(const std::uint8_t* p, std::uint16_t len, bool encapsulated) {
    ++c_.sampled;
    if (!encapsulated || (p[14] & 0x0f) != 5 || len < 14 + 20 + 20 + 20) {
      ++c_.undecodable;
      return;
    }
    const std::uint32_t outerDst = get32(p + 14 + 16);
    const std::uint8_t* inner = p + 14 + 20;
    if ((inner[0] >> 4) != 4 || (inner[0] & 0x0f) != 5 || inner[9] != 6) {
      ++c_.undecodable;
      return;
    }
    const std::uint32_t src = get32(inner + 12), dst = get32(inner + 16);
    const std::uint16_t srcPort = get16(inner + 20), dstPort = get16(inner + 22);
    const bool ours =
        (src >= kEstablishedBase &&
         src < kEstablishedBase + (o_.flows + kFlowsPerSource - 1) / kFlowsPerSource) ||
        (src >> 23) == (kSynBase >> 23);
    if (!ours || srcPort < kFirstPort) {
      ++c_.unknownFlow;
      return;
    }
    if (predictor_->expectedBackend(src, srcPort, dst, dstPort) == outerDst) {
      ++c_.matched;
    } else {
      ++c_.mismatched;
    }
  }

  const Options& o_;
  std::uint16_t port_;
  rte_mempool* txPool_;
  FrameWriter writer_;
  FrameWriter warmWriter_;  // warm-up frames are minimum-size whatever --size says
  const Predictor* predictor_;
  std::uint64_t hz_;
  std::uint64_t synEvery_;  // SYNs per 1024 frames
  std::uint64_t mix_ = 0;
  std::uint64_t synNext_, synStride_;
  std::vector<QueueState> queues_;
  Counters c_;
  Histogram hist_;
};

// What the traffic lcores share, and what each of them leaves behind.
struct RunContext {
  const Options& o;
  std::uint16_t port;
  rte_mempool* txPool;
  std::uint32_t dst;
  std::uint16_t dstPort;
  const Predictor* predictor;
  const std::vector<std::vector<std::uint32_t>>* byQueue;  // nullptr with one queue
  unsigned lcores;                                         // traffic lcores
  Barrier barrier;
  std::vector<std::unique_ptr<Generator>> generators;  // one per traffic lcore
  std::vector<double> rates, txRates;
  std::vector<std::uint64_t> warmTx;
  std::atomic<unsigned> finished{0};
};

struct LcoreArg {
  RunContext* ctx;
  unsigned index;  // among the traffic lcores
};

// One traffic lcore: its queues through every phase, in step with the others.
int runTraffic(void* arg) {
  auto& [ctx, index] = *static_cast<LcoreArg*>(arg);
  const Options& o = ctx->o;
  Generator& gen = *ctx->generators[index];
  if (o.warm) gen.warm();
  ctx->warmTx[index] = gen.counters().tx;
  ctx->barrier.wait();
  const double rate = gen.throughput(o.warmupSeconds, o.duration);
  ctx->rates[index] = rate;
  ctx->txRates[index] = static_cast<double>(gen.windowTx_) / gen.windowSeconds_;
  ctx->barrier.wait();
  if (o.latencyDuration > 0 && rate > 0) {
    gen.latency(o.latencyDuration, rate * o.latencyShare);
  } else {
    gen.settle(false);
  }
  ctx->finished.fetch_add(1);
  return 0;
}

// Sums the traffic lcores' results and prints them.
void report(const RunContext& ctx) {
  const Options& o = ctx.o;
  Counters c;
  Histogram hist;
  std::vector<std::uint64_t> perQueue(o.queues, 0);
  double rate = 0, txRate = 0, window = 0;
  for (std::size_t i = 0; i < ctx.generators.size(); ++i) {
    const Generator& g = *ctx.generators[i];
    c += g.counters();
    hist.merge(g.histogram());
    for (const QueueState& q : g.queues()) perQueue[q.id] = q.rx;
    rate += ctx.rates[i];
    txRate += ctx.txRates[i];
    window = std::max(window, g.windowSeconds_);
  }
  const double p50 = hist.percentileUs(0.50);
  const double p99 = hist.percentileUs(0.99);
  if (o.json) {
    const nlohmann::ordered_json out = {
        {"flows", o.flows},
        {"syn_share", o.synShare},
        {"size", o.size},
        {"queues", o.queues},
        {"traffic_lcores", ctx.lcores},
        {"mpps", rate / 1e6},
        {"offered_mpps", txRate / 1e6},
        {"window_s", window},
        {"p50_us", p50},
        {"p99_us", p99},
        {"latency_rate_mpps", o.latencyDuration > 0 ? rate * o.latencyShare / 1e6 : 0.0},
        {"latency_samples", hist.count},
        {"tx", c.tx},
        {"rx", c.rx},
        {"rx_per_queue", perQueue},
        {"tx_stalls", c.txRefused},
        {"syns_built", c.syns},
        {"warm_tx", std::accumulate(ctx.warmTx.begin(), ctx.warmTx.end(), std::uint64_t{0})},
        {"encapsulated", c.encapsulated},
        {"sampled", c.sampled},
        {"matched", c.matched},
        {"mismatched", c.mismatched},
        {"undecodable", c.undecodable},
        {"unknown_flow", c.unknownFlow}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf(
        "returned %.3f Mpps (offered %.3f Mpps) over %.2f s on %u queue(s); latency at %.3f "
        "Mpps: p50 %.2f us, p99 %.2f us (%llu samples)\n"
        "tx %llu rx %llu encapsulated %llu; sampled %llu: matched %llu, mismatched %llu, "
        "undecodable %llu, unknown %llu\n",
        rate / 1e6, txRate / 1e6, window, static_cast<unsigned>(o.queues),
        rate * o.latencyShare / 1e6, p50, p99, static_cast<unsigned long long>(hist.count),
        static_cast<unsigned long long>(c.tx), static_cast<unsigned long long>(c.rx),
        static_cast<unsigned long long>(c.encapsulated), static_cast<unsigned long long>(c.sampled),
        static_cast<unsigned long long>(c.matched), static_cast<unsigned long long>(c.mismatched),
        static_cast<unsigned long long>(c.undecodable),
        static_cast<unsigned long long>(c.unknownFlow));
  }
  std::fflush(stdout);
}

int runGenerator(int argc, char** argv) {
  // EAL options before "--", ours after.
  int split = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      split = i;
      break;
    }
  }
  if (split < 0) usage("no \"--\": EAL options, then --, then generator options");
  // CLI11 takes argv[0] as the program name: the "--" stands in for it.
  const Options o = parseOptions(argc - split, argv + split);

  std::optional<Config> config;
  std::optional<Predictor> predictor;
  std::uint32_t dst = o.vipAddress.value_or(0);
  std::uint16_t dstPort = o.vipPort;
  if (!o.configPath.empty()) {
    auto loaded = loadConfig(o.configPath);
    if (!loaded) {
      std::fprintf(stderr, "%s", formatErrors(loaded.errors()).c_str());
      return 2;
    }
    config = std::move(loaded).value();
    std::optional<std::uint32_t> vipIndex;
    for (std::uint32_t i = 0; i < config->vips.size(); ++i) {
      const auto& v = config->vips[i];
      if (v.protocol == IpProto::Tcp && v.address.version == IpVersion::V4) {
        vipIndex = i;
        break;
      }
    }
    if (!vipIndex) {
      std::fprintf(stderr, "spillway-pktgen: %s has no IPv4 TCP VIP to send to\n",
                   o.configPath.c_str());
      return 2;
    }
    const auto& v = config->vips[*vipIndex];
    if (!o.vipAddress) {
      const auto& b = v.address.bytes;
      dst = (std::to_integer<std::uint32_t>(b[0]) << 24) |
            (std::to_integer<std::uint32_t>(b[1]) << 16) |
            (std::to_integer<std::uint32_t>(b[2]) << 8) | std::to_integer<std::uint32_t>(b[3]);
      dstPort = v.port != 0 ? v.port : 80;
    }
    if (o.verify == "maglev") {
      std::string error;
      predictor = makePredictor(*config, o.configPath, *vipIndex, error);
      if (!predictor) {
        std::fprintf(stderr, "spillway-pktgen: %s\n", error.c_str());
        return 2;
      }
    }
  }

  if (rte_eal_init(split, argv) < 0) {
    std::fprintf(stderr, "spillway-pktgen: EAL start failed: %s\n", rte_strerror(rte_errno));
    return 1;
  }
  std::signal(SIGINT, onSignal);
  std::signal(SIGTERM, onSignal);
  int rc = 0;
  {
    if (rte_eth_dev_count_avail() == 0) {
      std::fprintf(stderr, "spillway-pktgen: no port (give one with --vdev net_memif0,...)\n");
      rte_eal_cleanup();
      return 1;
    }
    const std::uint16_t port = 0;
    rte_mempool* txPool = rte_pktmbuf_pool_create("pktgen_tx", kTxMbufs, 256, 0,
                                                  RTE_MBUF_DEFAULT_BUF_SIZE, rte_socket_id());
    rte_mempool* rxPool = rte_pktmbuf_pool_create("pktgen_rx", kRxMbufs, 256, 0,
                                                  RTE_MBUF_DEFAULT_BUF_SIZE, rte_socket_id());
    if (txPool == nullptr || rxPool == nullptr) {
      std::fprintf(stderr, "spillway-pktgen: cannot create mbuf pools: %s\n",
                   rte_strerror(rte_errno));
      rte_eal_cleanup();
      return 1;
    }
    rte_eth_conf conf{};
    if (int e = rte_eth_dev_configure(port, o.queues, o.queues, &conf); e != 0) {
      std::fprintf(stderr, "spillway-pktgen: configure: %s\n", rte_strerror(-e));
      rte_eal_cleanup();
      return 1;
    }
    std::uint16_t rxd = 1024, txd = 1024;
    rte_eth_dev_adjust_nb_rx_tx_desc(port, &rxd, &txd);
    const int socket = rte_eth_dev_socket_id(port) < 0 ? 0 : rte_eth_dev_socket_id(port);
    bool ready = true;
    for (std::uint16_t q = 0; q < o.queues && ready; ++q) {
      ready = rte_eth_rx_queue_setup(port, q, rxd, socket, nullptr, rxPool) == 0 &&
              rte_eth_tx_queue_setup(port, q, txd, socket, nullptr) == 0;
    }
    if (!ready || rte_eth_dev_start(port) != 0) {
      std::fprintf(stderr, "spillway-pktgen: cannot set up %u queue(s) and start port 0\n",
                   static_cast<unsigned>(o.queues));
      rte_eal_cleanup();
      return 1;
    }
    (void)rte_eth_promiscuous_enable(port);

    const std::uint64_t hz = rte_get_tsc_hz();
    const std::uint64_t linkDeadline = rte_rdtsc() + static_cast<std::uint64_t>(o.linkTimeout * hz);
    // DPDK 22.11's memif server refuses a client that connects before the
    // server configured as many queues ("Invalid ring index") and its client
    // never tries again on its own: a peer that is still setting up (testpmd
    // building its mbuf pool, say) leaves the link down for good. Restarting
    // the port makes the client connect once more.
    constexpr double kReconnectAfterS = 2.0;
    std::uint64_t nextReconnect = rte_rdtsc() + static_cast<std::uint64_t>(kReconnectAfterS * hz);
    rte_eth_link link{};
    for (;;) {
      (void)rte_eth_link_get_nowait(port, &link);
      if (link.link_status == RTE_ETH_LINK_UP || gStop.load() || rte_rdtsc() > linkDeadline) break;
      if (rte_rdtsc() > nextReconnect) {
        std::fprintf(stderr, "spillway-pktgen: port 0 link still down; restarting the port\n");
        (void)rte_eth_dev_stop(port);
        if (rte_eth_dev_start(port) != 0) {
          std::fprintf(stderr, "spillway-pktgen: cannot restart port 0\n");
          break;
        }
        nextReconnect = rte_rdtsc() + static_cast<std::uint64_t>(kReconnectAfterS * hz);
      }
      rte_delay_ms(10);
    }
    // DPDK 22.11's memif is not safe against a peer that polls while the
    // connection is still being set up (or torn down): give the peer's
    // control thread a moment after the link comes up before any frame.
    if (link.link_status == RTE_ETH_LINK_UP) rte_delay_us_sleep(250'000);
    if (link.link_status != RTE_ETH_LINK_UP) {
      std::fprintf(stderr,
                   "spillway-pktgen: port 0 link not up after %.1f s (is the peer running?)\n",
                   o.linkTimeout);
      rc = 1;
    } else {
      // The traffic loops run on the worker lcores when there are any (at
      // most one per queue), so the main lcore (--main-lcore) only sleeps.
      std::vector<unsigned> lcores;
      unsigned lc;
      RTE_LCORE_FOREACH_WORKER(lc) {
        if (lcores.size() < o.queues) lcores.push_back(lc);
      }
      const unsigned n = lcores.empty() ? 1u : static_cast<unsigned>(lcores.size());
      std::optional<std::vector<std::vector<std::uint32_t>>> byQueue;
      if (o.queues > 1) byQueue = flowsByQueue(o.flows, o.queues);
      RunContext ctx{o,
                     port,
                     txPool,
                     dst,
                     dstPort,
                     predictor ? &*predictor : nullptr,
                     byQueue ? &*byQueue : nullptr,
                     n,
                     Barrier(n),
                     {},
                     std::vector<double>(n),
                     std::vector<double>(n),
                     std::vector<std::uint64_t>(n)};
      const FrameWriter writer(o.size, dst, dstPort);
      Generator::prefill(txPool, writer);
      for (unsigned i = 0; i < n; ++i) {
        std::vector<std::uint16_t> mine;
        for (std::uint16_t q = 0; q < o.queues; ++q) {
          if (q % n == i) mine.push_back(q);
        }
        ctx.generators.push_back(std::make_unique<Generator>(
            o, port, txPool, dst, dstPort, ctx.predictor, ctx.byQueue, mine, i, n));
      }
      std::vector<LcoreArg> args(n);
      for (unsigned i = 0; i < n; ++i) args[i] = {&ctx, i};
      if (lcores.empty()) {
        (void)runTraffic(&args[0]);
      } else {
        for (unsigned i = 0; i < n; ++i) rte_eal_remote_launch(runTraffic, &args[i], lcores[i]);
        while (ctx.finished.load() < n) rte_delay_us_sleep(2000);  // sleeps, never spins
        for (unsigned i = 0; i < n; ++i) rte_eal_wait_lcore(lcores[i]);
      }
      report(ctx);
      rc = gLinkStalled.load() ? kExitLinkStalled : gStop.load() ? 130 : 0;
      // The peer stops polling first (a memif disconnect under a polling
      // peer can crash it, DPDK 22.11); nothing here polls while we wait.
      if (o.hold) {
        while (!gStop.load() && std::fgetc(stdin) != EOF) {
        }
      }
    }
    (void)rte_eth_dev_stop(port);
    (void)rte_eth_dev_close(port);
  }
  rte_eal_cleanup();
  return rc;
}

}  // namespace
}  // namespace spillway

int main(int argc, char** argv) {
  return spillway::runGenerator(argc, argv);
}
