// Steering::steerBurst, the whole DPDK-free per-packet path (parse, VIP
// match, flow hash, batched flow-table lookup, Maglev, IPIP encapsulation),
// on bursts of 32 64-byte TCP frames to one VIP with 8 IPIP backends (Maglev
// M = 65537), shaped like scripts/bench's spillwayd case: flow f comes from
// 10.0.0.1 + f / 50000, port 10000 + f % 50000, as spillway-pktgen names it.
//
// Cases: established ACK traffic cycling over 1k or 1M flows (the table
// filled first by two passes: the first packet of a flow is tracked as
// embryonic, the second makes it established), and SYNs of a new 5-tuple
// every packet into a table of capacity 1M that the warm-up has filled;
// ACKs of flows the lcore has never seen whose backend the snapshot's
// exception table names (SteerBurstExceptionHit), and ICMP "fragmentation
// needed" errors quoting the established 1k flows (SteerBurstIcmpError).
//
// Every case's timed loop calls SteerCase::measured() (never inlined), and
// its warm-up calls burst(): `valgrind --tool=callgrind --collect-atstart=no
// --toggle-collect='*measured*'` counts the steady state alone
// (scripts/bench --instructions).
//
// steerBurst rewrites its frames (encapsulation prepends into the headroom),
// so each burst first copies 64 bytes per frame from one pristine frame into
// its mbuf-like buffer and writes that frame's source address and port.
// SteerBurstFrameCopy times that refill alone, to be subtracted. The refill
// also writes the IPv4 header checksum for the new source (the parser
// verifies it), as spillway-pktgen does.
//
// Run (Time is per burst: ns per packet = Time / 32 = 1e9 / items_per_second):
//   build/tests/bench/spillway_core_bench --benchmark_filter='^SteerBurst'
//       --benchmark_repetitions=5 --benchmark_min_time=1
//       --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../unit/packet_builder.hpp"
#include "spillway/flow_exceptions.hpp"
#include "spillway/maglev.hpp"
#include "spillway/packet.hpp"
#include "spillway/steering.hpp"

namespace spillway {
namespace {

constexpr std::size_t kBurst = 32;
constexpr std::size_t kHeadroom = 128;  // RTE_PKTMBUF_HEADROOM
constexpr std::size_t kCopied = 64;     // the 60-byte frame, copied as one cache line
constexpr std::size_t kMaxFrame = 128;  // the ICMP errors (70 bytes), copied whole
constexpr std::size_t kSrcAddressAt = 14 + 12;
constexpr std::size_t kSrcPortAt = 14 + 20;
constexpr std::size_t kIpChecksumAt = 14 + 10;
constexpr std::uint32_t kFlowsPerSource = 50000;
constexpr std::uint16_t kFirstPort = 10000;
constexpr std::uint32_t kEstablishedBase = 0x0a000001;  // 10.0.0.1
constexpr std::uint32_t kSynBase = 0x0a800001;          // 10.128.0.1
constexpr std::size_t kTableCapacity = std::size_t{1} << 20;
constexpr std::uint64_t kSeed = 0x9c4f1d2e7b3a5860ULL;
constexpr Millis kNow = 1'000'000;

// Placement's published loads for the SYN cases with placement = "bytes":
// every backend equal (each SYN takes its table entry after the bound check),
// or half of them loaded past the bound (half the SYNs walk the table).
enum class Placing { No, Balanced, Skewed };

std::unique_ptr<ForwardingSnapshot> makeSnapshot(Placing placing = Placing::No) {
  auto s = std::make_unique<ForwardingSnapshot>();
  s->generation = 1;
  s->backends.resize(9);
  std::vector<MaglevBackend> mb;
  for (std::uint32_t i = 1; i <= 8; ++i) {
    auto& b = s->backends[i];
    b.id = 1000 + i;
    b.state = BackendState::Active;
    b.encap.kind = EncapKind::IpInIp4;
    b.encap.source = test::ipBytes("198.51.100.2");
    b.encap.backend = test::ipBytes("10.99.0." + std::to_string(i));
    b.encap.nextHopMac = {2, 0, 0, 0, 1, static_cast<std::uint8_t>(i)};
    b.encap.ourMac = {2, 0, 0, 0, 0, 2};
    b.encap.mtu = 9000;
    mb.push_back({b.id, 100, i});
  }
  SnapshotVip vip;
  vip.key = {test::ipBytes("192.0.2.10"), IpVersion::V4, 6, 80};
  vip.name = "bench";
  MaglevBuilder builder;
  MaglevBuild built = builder.build(mb, FlowHasher(kSeed), 65537).value();
  vip.table = built.table;
  if (placing != Placing::No) {
    auto loads = std::make_shared<BackendLoads>(kBackendSlots);
    auto total = std::make_shared<VipLoad>();
    double sum = 0;
    for (std::uint32_t i = 1; i <= 8; ++i) {
      const double flows = placing == Placing::Balanced ? 100'000 : (i % 2 == 0 ? 400'000 : 0);
      loads->set(i, static_cast<std::uint64_t>(flows * kLoadScale));
      sum += flows;
    }
    total->milliFlows = static_cast<std::uint64_t>(sum * kLoadScale);
    auto p = std::make_shared<VipPlacement>();
    p->share.assign(9, 0.0F);
    for (const MaglevShare& sh : built.shares) {
      p->share[sh.backendIndex] = static_cast<float>(sh.entries) / 65537.0F;
    }
    p->loads = loads;
    p->load = total;
    vip.placement = p;
  }
  s->vips.push_back(std::move(vip));
  s->indexVips();
  return s;
}

// Source address and port of flow after flow, as spillway-pktgen numbers them.
class FlowCursor {
 public:
  FlowCursor(std::uint32_t base, std::uint64_t flows) : base_(base), flows_(flows) {}
  void next() noexcept {
    if (++index_ == flows_) {
      index_ = 0;
      address_ = base_;
      port_ = kFirstPort;
    } else if (++port_ == kFirstPort + kFlowsPerSource) {
      port_ = kFirstPort;
      ++address_;
    }
  }
  [[nodiscard]] std::uint32_t address() const noexcept { return address_; }
  [[nodiscard]] std::uint16_t port() const noexcept { return static_cast<std::uint16_t>(port_); }

 private:
  std::uint32_t base_;
  std::uint64_t flows_;  // 0: never wraps
  std::uint64_t index_ = 0;
  std::uint32_t address_ = base_;
  std::uint32_t port_ = kFirstPort;
};

// A burst of mbuf-like buffers (headroom, then the frame) refilled per burst.
class BurstSource {
 public:
  BurstSource(std::uint8_t tcpFlags, std::uint32_t base, std::uint64_t flows)
      : cursor_(base, flows) {
    const auto frame = test::PacketBuilder()
                           .ipv4("10.0.0.1", "192.0.2.10")
                           .tcp(kFirstPort, 80, tcpFlags)
                           .payload(6)
                           .build();
    pristine_.fill(std::byte{0});
    std::memcpy(pristine_.data(), frame.data(), frame.size());
    // The header's sum over every 16-bit word but the source and the checksum.
    for (std::size_t w = 0; w < 10; ++w) {
      if (w == 5 || w == 6 || w == 7) continue;
      baseSum_ += (std::to_integer<std::uint32_t>(frame[14 + 2 * w]) << 8) |
                  std::to_integer<std::uint32_t>(frame[14 + 2 * w + 1]);
    }
    for (std::size_t i = 0; i < kBurst; ++i) {
      frames_[i] = FrameRef{buffers_[i].bytes, kHeadroom, frame.size()};
    }
  }

  // Frame after frame of `ring` (each at most kMaxFrame bytes), as they are.
  explicit BurstSource(std::vector<std::vector<std::byte>> ring)
      : cursor_(0, 0), ring_(std::move(ring)) {
    for (std::size_t i = 0; i < kBurst; ++i) {
      frames_[i] = FrameRef{buffers_[i].bytes, kHeadroom, 0};
    }
  }

  void refill() noexcept {
    if (!ring_.empty()) {
      for (std::size_t i = 0; i < kBurst; ++i) {
        const auto& frame = ring_[next_];
        next_ = next_ + 1 == ring_.size() ? 0 : next_ + 1;
        std::memcpy(buffers_[i].bytes.data() + kHeadroom, frame.data(), frame.size());
        frames_[i].length = frame.size();
      }
      return;
    }
    for (std::size_t i = 0; i < kBurst; ++i) {
      std::byte* f = buffers_[i].bytes.data() + kHeadroom;
      std::memcpy(f, pristine_.data(), kCopied);
      const std::uint32_t host = cursor_.address();
      const std::uint32_t address = __builtin_bswap32(host);
      const std::uint16_t port = __builtin_bswap16(cursor_.port());
      std::uint32_t sum = baseSum_ + (host >> 16) + (host & 0xffff);
      sum = (sum & 0xffff) + (sum >> 16);
      sum = (sum & 0xffff) + (sum >> 16);
      const std::uint16_t checksum = __builtin_bswap16(static_cast<std::uint16_t>(~sum));
      std::memcpy(f + kSrcAddressAt, &address, sizeof address);
      std::memcpy(f + kIpChecksumAt, &checksum, sizeof checksum);
      std::memcpy(f + kSrcPortAt, &port, sizeof port);
      cursor_.next();
    }
  }

  [[nodiscard]] std::span<const FrameRef> frames() const noexcept { return frames_; }

 private:
  struct alignas(64) Buffer {
    std::array<std::byte, kHeadroom + kMaxFrame> bytes;
  };
  FlowCursor cursor_;
  std::vector<std::vector<std::byte>> ring_;
  std::size_t next_ = 0;
  std::uint32_t baseSum_ = 0;
  alignas(64) std::array<std::byte, kCopied> pristine_;
  std::array<Buffer, kBurst> buffers_{};
  std::array<FrameRef, kBurst> frames_{};
};

struct SteerCase {
  std::unique_ptr<ForwardingSnapshot> snapshot;
  Steering steering{FlowTableConfig{.capacity = kTableCapacity}, kSeed};
  BurstSource source;
  std::array<SteerResult, kBurst> results{};

  SteerCase(std::uint8_t flags, std::uint32_t base, std::uint64_t flows,
            Placing placing = Placing::No)
      : snapshot(makeSnapshot(placing)), source(flags, base, flows) {}

  // Number of frames in the burst that were not forwarded.
  std::size_t burst() noexcept {
    source.refill();
    steering.steerBurst(source.frames(), results, *snapshot, kNow);
    std::size_t notForwarded = 0;
    for (const auto& r : results) notForwarded += r.verdict != Verdict::Forward;
    return notForwarded;
  }
  // burst() in a timed loop: its own symbol, so callgrind can count the
  // timed bursts apart from the warm-up's.
  [[gnu::noinline]] std::size_t measured() noexcept { return burst(); }
  // A burst of other frames (the ICMP case) through this case's steering.
  [[gnu::noinline]] std::size_t measuredWith(BurstSource& other) noexcept {
    other.refill();
    steering.steerBurst(other.frames(), results, *snapshot, kNow);
    std::size_t notForwarded = 0;
    for (const auto& r : results) notForwarded += r.verdict != Verdict::Forward;
    return notForwarded;
  }
};

// One case at a time, kept across the runs and repetitions of that case:
// filling 1M flows takes a while, and the measured traffic leaves the table
// as it found it (established) or as full as it was (SYN).
SteerCase& steerCase(std::int64_t flows, bool syn, Placing placing = Placing::No) {
  static std::unique_ptr<SteerCase> current;
  static std::int64_t currentFlows = -1;
  static bool currentSyn = false;
  static Placing currentPlacing = Placing::No;
  if (current && currentFlows == flows && currentSyn == syn && currentPlacing == placing) {
    return *current;
  }
  current.reset();
  currentPlacing = placing;
  if (syn) {
    current = std::make_unique<SteerCase>(kTcpSyn, kSynBase, 0, placing);
    for (std::size_t i = 0; i < 2 * kTableCapacity / kBurst; ++i) (void)current->burst();
  } else {
    current =
        std::make_unique<SteerCase>(kTcpAck, kEstablishedBase, static_cast<std::uint64_t>(flows));
    const auto warm = 2 * (static_cast<std::size_t>(flows) + kBurst - 1) / kBurst;
    for (std::size_t i = 0; i < warm; ++i) (void)current->burst();
  }
  currentFlows = flows;
  currentSyn = syn;
  return *current;
}

void reportPerPacket(benchmark::State& state) {
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kBurst));
}

void steerEstablished(benchmark::State& state) {
  SteerCase& c = steerCase(state.range(0), false);
  std::size_t notForwarded = 0;
  for (auto _ : state) notForwarded += c.measured();
  if (notForwarded != 0) state.SkipWithError("established frames were not forwarded");
  reportPerPacket(state);
}
BENCHMARK(steerEstablished)->Name("SteerBurstEstablished")->Arg(1000)->Arg(1'000'000);

void steerSyn(benchmark::State& state) {
  SteerCase& c = steerCase(0, true);
  std::size_t notForwarded = 0;
  for (auto _ : state) notForwarded += c.measured();
  if (notForwarded != 0) state.SkipWithError("SYNs were not forwarded");
  reportPerPacket(state);
  state.counters["insert_failed"] =
      static_cast<double>(c.steering.counters().flowInsertFailed.read());
  const FlowTableCounters& t = c.steering.flowTable().counters();
  state.counters["relocations"] = static_cast<double>(std::uint64_t{t.relocations});
  state.counters["relocations_skipped"] = static_cast<double>(std::uint64_t{t.relocationsSkipped});
  state.counters["syn_flood"] = static_cast<double>(std::uint64_t{t.synFlood});
}
BENCHMARK(steerSyn)->Name("SteerBurstSyn");

// SteerBurstSyn with an exception table in the snapshot (flow_exceptions.hpp:
// what a restart restores or a peer sends) of arg entries, none of them these
// SYNs' flows: every miss of the flow table also looks there and misses. At
// 1M entries the table is 32 MiB: the cost of the durable-intent work on the
// miss path when it is largest.
void steerSynExceptions(benchmark::State& state) {
  SteerCase& c = steerCase(0, true);
  const auto entries = static_cast<std::size_t>(state.range(0));
  std::vector<ExceptionEntry> list(entries);
  std::uint64_t x = 0x2545f4914f6cdd1dULL;
  for (ExceptionEntry& e : list) {
    x ^= x << 13;  // xorshift64: hashes spread like FlowHasher's
    x ^= x >> 7;
    x ^= x << 17;
    e = ExceptionEntry{x, 1 + static_cast<std::uint32_t>(x % 8), FlowState::Established};
  }
  c.snapshot->exceptions = std::make_shared<const ExceptionTable>(list);
  std::size_t notForwarded = 0;
  for (auto _ : state) notForwarded += c.measured();
  c.snapshot->exceptions.reset();
  if (notForwarded != 0) state.SkipWithError("SYNs were not forwarded");
  reportPerPacket(state);
}
BENCHMARK(steerSynExceptions)
    ->Name("SteerBurstSynExceptions")
    ->Arg(1000)
    ->Arg(100000)
    ->Arg(1000000);

// SYNs of a VIP with placement = "bytes" (spillway/placement.hpp), the table
// full as in SteerBurstSyn: arg 0 every backend equally loaded, arg 1 half
// of them past the bound.
void steerSynPlaced(benchmark::State& state) {
  SteerCase& c = steerCase(0, true, state.range(0) == 0 ? Placing::Balanced : Placing::Skewed);
  std::size_t notForwarded = 0;
  for (auto _ : state) notForwarded += c.measured();
  if (notForwarded != 0) state.SkipWithError("SYNs were not forwarded");
  reportPerPacket(state);
  state.counters["placed_off_table"] =
      static_cast<double>(c.steering.counters().placedOffTable.read());
}
BENCHMARK(steerSynPlaced)->Name("SteerBurstSynPlaced")->Arg(0)->Arg(1);

// ACKs of flows this lcore has never tracked, each named by the snapshot's
// exception table (a restored checkpoint's or a peer's flows): every packet
// misses the flow table, takes its backend from kExceptionFlows exceptions
// and is then tracked. Once every flow is tracked (a lap), the lcore's
// steering starts afresh, untimed.
constexpr std::uint64_t kExceptionFlows = std::uint64_t{1} << 18;
static_assert(kExceptionFlows % kBurst == 0);

struct ExceptionHitCase {
  std::unique_ptr<ForwardingSnapshot> snapshot = makeSnapshot();
  std::unique_ptr<Steering> steering;
  BurstSource source{kTcpAck, kSynBase, kExceptionFlows};
  std::array<SteerResult, kBurst> results{};
  std::uint64_t sent = 0;

  ExceptionHitCase() {
    // The exceptions: the flows the source sends, hashed as steering does.
    BurstSource names(kTcpAck, kSynBase, kExceptionFlows);
    const FlowHasher hasher(kSeed);
    std::vector<ExceptionEntry> list;
    list.reserve(kExceptionFlows);
    while (list.size() < kExceptionFlows) {
      names.refill();
      for (const FrameRef& f : names.frames()) {
        const PacketView v = parsePacket(f.buffer.subspan(f.dataOffset, f.length));
        const std::uint64_t h = hasher.hash(v.key);
        list.push_back(ExceptionEntry{h, 1 + static_cast<std::uint32_t>((h >> 32) % 8),
                                      FlowState::Established, ExceptionOrigin::Checkpoint});
      }
    }
    snapshot->exceptions = std::make_shared<const ExceptionTable>(list);
    restart();
  }
  void restart() {
    steering = std::make_unique<Steering>(FlowTableConfig{.capacity = 2 * kExceptionFlows}, kSeed);
    sent = 0;
  }
  [[gnu::noinline]] std::size_t measured() noexcept {
    source.refill();
    steering->steerBurst(source.frames(), results, *snapshot, kNow);
    sent += kBurst;
    std::size_t notForwarded = 0;
    for (const auto& r : results) notForwarded += r.verdict != Verdict::Forward;
    return notForwarded;
  }
};

void steerExceptionHit(benchmark::State& state) {
  static const auto c = std::make_unique<ExceptionHitCase>();
  std::size_t notForwarded = 0;
  std::uint64_t hits = 0;
  for (auto _ : state) {
    if (c->sent == kExceptionFlows) {
      state.PauseTiming();
      hits += c->steering->counters().exceptionHits.read();
      c->restart();
      state.ResumeTiming();
    }
    notForwarded += c->measured();
  }
  hits += c->steering->counters().exceptionHits.read();
  if (notForwarded != 0) state.SkipWithError("exception hits were not forwarded");
  if (hits == 0) state.SkipWithError("no packet hit an exception");
  reportPerPacket(state);
}
BENCHMARK(steerExceptionHit)->Name("SteerBurstExceptionHit");

// ICMP "fragmentation needed" from a router to the VIP, each quoting the
// reply (VIP:80 -> client) of one of SteerBurstEstablished/1000's flows:
// steered to that flow's backend (steering.hpp, ICMP errors).
void steerIcmpError(benchmark::State& state) {
  SteerCase& c = steerCase(1000, false);
  std::vector<std::vector<std::byte>> ring;
  FlowCursor cursor(kEstablishedBase, 1000);
  for (int f = 0; f < 1000; ++f, cursor.next()) {
    const std::uint32_t a = cursor.address();
    const std::string client = std::to_string(a >> 24) + "." + std::to_string((a >> 16) & 0xff) +
                               "." + std::to_string((a >> 8) & 0xff) + "." +
                               std::to_string(a & 0xff);
    const auto reply =
        test::PacketBuilder().ipv4("192.0.2.10", client).tcp(80, cursor.port()).build();
    std::vector<std::uint8_t> quote;
    for (std::size_t i = 14; i < 14 + 28; ++i)
      quote.push_back(std::to_integer<std::uint8_t>(reply[i]));
    ring.push_back(test::PacketBuilder()
                       .ipv4("198.51.100.1", "192.0.2.10")
                       .icmp(kIcmpDestUnreachable, kIcmpCodeFragNeeded, 1400)
                       .payload(quote)
                       .build());
  }
  BurstSource errors(std::move(ring));
  const std::uint64_t before = c.steering.counters().icmpErrorsSteered.read();
  std::size_t notForwarded = 0;
  for (auto _ : state) notForwarded += c.measuredWith(errors);
  if (notForwarded != 0) state.SkipWithError("ICMP errors were not steered");
  if (c.steering.counters().icmpErrorsSteered.read() == before) {
    state.SkipWithError("no ICMP error was steered");
  }
  reportPerPacket(state);
}
BENCHMARK(steerIcmpError)->Name("SteerBurstIcmpError");

void frameCopy(benchmark::State& state) {
  BurstSource source(kTcpAck, kEstablishedBase, 1'000'000);
  for (auto _ : state) {
    source.refill();
    benchmark::ClobberMemory();
  }
  reportPerPacket(state);
}
BENCHMARK(frameCopy)->Name("SteerBurstFrameCopy");

}  // namespace
}  // namespace spillway
