// spillway-pktgen: a small DPDK TCP traffic generator for one port (a
// net_memif link to spillwayd, or to dpdk-testpmd as the reference), used by
// scripts/bench and the dpdk suite's memif test.
//
//   spillway-pktgen [EAL options] -- --flows N [--syn-share F] [--size B]
//       [--config spillway.toml] [--verify maglev|none] [--warm] [--duration S]
//       [--latency-duration S] [--latency-share F] [--json]
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
// Thread contract: one lcore (the main one) sends and receives; nothing else
// runs. Results go to stdout as one JSON object (--json, nlohmann-json) or
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
#include <optional>
#include <string>
#include <vector>

#include "control/config.hpp"
#include "control/control_plane.hpp"
#include "control/snapshot_builder.hpp"
#include "spillway/flow_key.hpp"
#include "spillway/snapshot.hpp"

namespace spillway {
namespace {

std::atomic<bool> gStop{false};
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
                undecodable = 0, unknownFlow = 0, txRefused = 0;
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

class Generator {
 public:
  Generator(const Options& o, std::uint16_t port, rte_mempool* txPool, std::uint32_t dst,
            std::uint16_t dstPort, const Predictor* predictor)
      : o_(o),
        port_(port),
        txPool_(txPool),
        writer_(o.size, dst, dstPort),
        warmWriter_(kMinFrame, dst, dstPort),
        predictor_(predictor),
        hz_(rte_get_tsc_hz()),
        synEvery_(o.synShare <= 0 ? 0
                                  : static_cast<std::uint64_t>(std::llround(1024.0 * o.synShare))) {
  }

  // Every buffer of the TX pool gets the whole frame once; later frames only
  // rewrite headers and the timestamp.
  bool prefill() {
    std::vector<rte_mbuf*> all(kTxMbufs);
    unsigned got = 0;
    while (got < kTxMbufs && rte_pktmbuf_alloc_bulk(txPool_, &all[got], 1) == 0) ++got;
    for (unsigned i = 0; i < got; ++i) writer_.fill(rte_pktmbuf_mtod(all[i], std::uint8_t*));
    rte_pktmbuf_free_bulk(all.data(), got);
    return got > 0;
  }

  // Lossless: every flow gets one SYN then one ACK, resent until the link takes it.
  void warm() {
    for (unsigned pass = 0; pass < o_.warmPasses && !gStop.load(); ++pass) {
      const std::uint8_t flags = pass == 0 ? kSyn : kAck;
      std::uint64_t next = 0;
      std::array<rte_mbuf*, kBurst> m;
      while (next < o_.flows && !gStop.load()) {
        const std::uint16_t n =
            static_cast<std::uint16_t>(std::min<std::uint64_t>(kBurst, o_.flows - next));
        if (rte_pktmbuf_alloc_bulk(txPool_, m.data(), n) != 0) {
          drainRx(false);
          continue;
        }
        const std::uint64_t tsc = rte_rdtsc();
        for (std::uint16_t i = 0; i < n; ++i) {
          m[i]->data_len = static_cast<std::uint16_t>(kMinFrame);
          m[i]->pkt_len = static_cast<std::uint32_t>(kMinFrame);
          warmWriter_.write(rte_pktmbuf_mtod(m[i], std::uint8_t*), establishedFlow(next + i), flags,
                            tsc);
        }
        std::uint16_t sent = 0;
        while (sent < n && !gStop.load()) {
          sent = static_cast<std::uint16_t>(
              sent +
              rte_eth_tx_burst(port_, 0, m.data() + sent, static_cast<std::uint16_t>(n - sent)));
          drainRx(false);
        }
        if (sent < n) rte_pktmbuf_free_bulk(m.data() + sent, n - sent);
        c_.tx += sent;
        next += n;
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
    const std::uint64_t until = rte_rdtsc() + hz_ / 50;
    while (rte_rdtsc() < until) drainRx(true);
  }

  [[nodiscard]] const Counters& counters() const { return c_; }
  [[nodiscard]] const Histogram& histogram() const { return hist_; }
  std::uint64_t windowTx_ = 0, windowRx_ = 0;
  double windowSeconds_ = 0;

 private:
  inline void build(rte_mbuf* m, FlowAddr a, std::uint8_t flags, std::uint64_t tsc) {
    m->data_len = static_cast<std::uint16_t>(writer_.size());
    m->pkt_len = static_cast<std::uint32_t>(writer_.size());
    writer_.write(rte_pktmbuf_mtod(m, std::uint8_t*), a, flags, tsc);
  }

  // The next frame of the mix: mostly the next established flow in turn, and
  // synEvery_/1024 of them a SYN of a flow never seen before.
  inline void nextFrame(rte_mbuf* m, std::uint64_t tsc) {
    if (synEvery_ != 0 && (mix_++ & 1023) < synEvery_) {
      build(m, synFlow(synNext_++), kSyn, tsc);
      return;
    }
    build(m, establishedFlow(cursor_), kAck, tsc);
    if (++cursor_ == o_.flows) cursor_ = 0;
  }

  // Frames the link refused wait for the next try (back-pressure: the peer
  // sets the pace, and no frame is built twice); new ones are built only when
  // none wait, and when paced, only at their time.
  void run(double seconds, double pps, bool recordLatency) {
    const std::uint64_t end =
        rte_rdtsc() + static_cast<std::uint64_t>(seconds * static_cast<double>(hz_));
    const std::uint16_t burst = pps > 0 ? kPacedBurst : kBurst;
    const double tscPerBurst = pps > 0 ? static_cast<double>(hz_) * burst / pps : 0;
    double nextSend = static_cast<double>(rte_rdtsc());
    std::array<rte_mbuf*, kBurst> m;
    std::uint16_t have = 0, off = 0;
    for (;;) {
      const std::uint64_t now = rte_rdtsc();
      if (now >= end || gStop.load(std::memory_order_relaxed)) break;
      if (off == have && (pps <= 0 || static_cast<double>(now) >= nextSend) &&
          rte_pktmbuf_alloc_bulk(txPool_, m.data(), burst) == 0) {
        for (std::uint16_t i = 0; i < burst; ++i) nextFrame(m[i], now);
        have = burst;
        off = 0;
        if (pps > 0) {
          nextSend += tscPerBurst;
          // Never make up for lost time with a burst of bursts.
          if (nextSend < static_cast<double>(now)) nextSend = static_cast<double>(now);
        }
      }
      if (off < have) {
        const std::uint16_t sent =
            rte_eth_tx_burst(port_, 0, m.data() + off, static_cast<std::uint16_t>(have - off));
        off = static_cast<std::uint16_t>(off + sent);
        c_.tx += sent;
        if (off < have) ++c_.txRefused;
      }
      drainRx(recordLatency);
    }
    if (off < have) rte_pktmbuf_free_bulk(m.data() + off, have - off);
  }

  inline void drainRx(bool recordLatency) {
    std::array<rte_mbuf*, kBurst> m;
    const std::uint16_t n = rte_eth_rx_burst(port_, 0, m.data(), kBurst);
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
  std::uint64_t mix_ = 0, cursor_ = 0, synNext_ = 0;
  Counters c_;
  Histogram hist_;
};

struct RunContext {
  const Options& o;
  std::uint16_t port;
  rte_mempool* txPool;
  std::uint32_t dst;
  std::uint16_t dstPort;
  const Predictor* predictor;
  std::atomic<bool> done{false};
  int rc = 0;
};

int runTraffic(void* arg) {
  auto& ctx = *static_cast<RunContext*>(arg);
  const Options& o = ctx.o;
  int rc = 0;
  {
    Generator gen(o, ctx.port, ctx.txPool, ctx.dst, ctx.dstPort, ctx.predictor);
    gen.prefill();
    if (o.warm) gen.warm();
    const Counters warmCounters = gen.counters();
    const double rate = gen.throughput(o.warmupSeconds, o.duration);
    const double txRate = static_cast<double>(gen.windowTx_) / gen.windowSeconds_;
    if (o.latencyDuration > 0 && rate > 0) gen.latency(o.latencyDuration, rate * o.latencyShare);
    const Counters& c = gen.counters();
    const double p50 = gen.histogram().percentileUs(0.50);
    const double p99 = gen.histogram().percentileUs(0.99);
    if (o.json) {
      const nlohmann::ordered_json out = {
          {"flows", o.flows},
          {"syn_share", o.synShare},
          {"size", o.size},
          {"mpps", rate / 1e6},
          {"offered_mpps", txRate / 1e6},
          {"window_s", gen.windowSeconds_},
          {"p50_us", p50},
          {"p99_us", p99},
          {"latency_rate_mpps", o.latencyDuration > 0 ? rate * o.latencyShare / 1e6 : 0.0},
          {"latency_samples", gen.histogram().count},
          {"tx", c.tx},
          {"rx", c.rx},
          {"tx_stalls", c.txRefused},
          {"warm_tx", warmCounters.tx},
          {"encapsulated", c.encapsulated},
          {"sampled", c.sampled},
          {"matched", c.matched},
          {"mismatched", c.mismatched},
          {"undecodable", c.undecodable},
          {"unknown_flow", c.unknownFlow}};
      std::printf("%s\n", out.dump().c_str());
    } else {
      std::printf(
          "returned %.3f Mpps (offered %.3f Mpps) over %.2f s; latency at %.3f Mpps: p50 %.2f us, "
          "p99 %.2f us (%llu samples)\n"
          "tx %llu rx %llu encapsulated %llu; sampled %llu: matched %llu, mismatched %llu, "
          "undecodable %llu, unknown %llu\n",
          rate / 1e6, txRate / 1e6, gen.windowSeconds_, rate * o.latencyShare / 1e6, p50, p99,
          static_cast<unsigned long long>(gen.histogram().count),
          static_cast<unsigned long long>(c.tx), static_cast<unsigned long long>(c.rx),
          static_cast<unsigned long long>(c.encapsulated),
          static_cast<unsigned long long>(c.sampled), static_cast<unsigned long long>(c.matched),
          static_cast<unsigned long long>(c.mismatched),
          static_cast<unsigned long long>(c.undecodable),
          static_cast<unsigned long long>(c.unknownFlow));
    }
    std::fflush(stdout);
    if (gStop.load()) rc = 130;
  }
  ctx.rc = rc;
  ctx.done.store(true);
  return 0;
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
    if (int e = rte_eth_dev_configure(port, 1, 1, &conf); e != 0) {
      std::fprintf(stderr, "spillway-pktgen: configure: %s\n", rte_strerror(-e));
      rte_eal_cleanup();
      return 1;
    }
    std::uint16_t rxd = 1024, txd = 1024;
    rte_eth_dev_adjust_nb_rx_tx_desc(port, &rxd, &txd);
    const int socket = rte_eth_dev_socket_id(port) < 0 ? 0 : rte_eth_dev_socket_id(port);
    if (rte_eth_rx_queue_setup(port, 0, rxd, socket, nullptr, rxPool) != 0 ||
        rte_eth_tx_queue_setup(port, 0, txd, socket, nullptr) != 0 ||
        rte_eth_dev_start(port) != 0) {
      std::fprintf(stderr, "spillway-pktgen: cannot set up and start port 0\n");
      rte_eal_cleanup();
      return 1;
    }
    (void)rte_eth_promiscuous_enable(port);

    const std::uint64_t hz = rte_get_tsc_hz();
    const std::uint64_t linkDeadline = rte_rdtsc() + static_cast<std::uint64_t>(o.linkTimeout * hz);
    rte_eth_link link{};
    for (;;) {
      (void)rte_eth_link_get_nowait(port, &link);
      if (link.link_status == RTE_ETH_LINK_UP || gStop.load() || rte_rdtsc() > linkDeadline) break;
      rte_delay_ms(10);
    }
    if (link.link_status != RTE_ETH_LINK_UP) {
      std::fprintf(stderr,
                   "spillway-pktgen: port 0 link not up after %.1f s (is the peer running?)\n",
                   o.linkTimeout);
      rc = 1;
    } else {
      // The traffic loop runs on the first worker lcore when there is one, so
      // the main lcore (given with --main-lcore) only sleeps here.
      RunContext ctx{o, port, txPool, dst, dstPort, predictor ? &*predictor : nullptr};
      const unsigned worker = rte_get_next_lcore(-1, 1, 0);
      if (worker < RTE_MAX_LCORE && rte_eal_remote_launch(runTraffic, &ctx, worker) == 0) {
        while (!ctx.done.load()) rte_delay_us_sleep(2000);
        rte_eal_wait_lcore(worker);
      } else {
        (void)runTraffic(&ctx);
      }
      rc = ctx.rc;
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
