// Suite dpdk: the real lcore loop (Worker, src/dataplane/worker.cpp) on a
// net_ring port without hugepages. The test process is both ends of the wire:
// the main lcore enqueues mbufs holding PacketBuilder frames into the port's
// RX ring and drains its TX ring, while the Worker runs on lcore 1 exactly as
// spillwayd runs it (PortSet configures the port, rte_eal_remote_launch
// starts the loop, the stop flag ends it).
//
// Every test checks conservation: each frame put into the RX ring ends in
// exactly one of forwarded, replies, to_kernel and drops, and the TX ring
// receives exactly the forwarded and replied ones. Waits poll with a
// deadline; nothing sleeps. Exit code 77 (skip) when the EAL cannot start
// without root or with fewer than 2 CPUs; as root an EAL failure fails.
//
// Under TSan the mbuf hand-offs through the rings and the mempool happen in
// uninstrumented DPDK code, so RX/TX callbacks on the worker and the injector
// on the main lcore annotate them (__tsan_release / __tsan_acquire); the
// snapshot publication and QSBR protocol are instrumented as they are.
#include <gtest/gtest.h>
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_pause.h>
#include <rte_ring.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "packet_builder.hpp"
#include "ports.hpp"
#include "spillway/maglev.hpp"
#include "spillway/packet.hpp"
#include "spillway/snapshot.hpp"
#include "worker.hpp"

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#define SWD_TSAN 1
#endif

namespace spillway {
namespace {

using test::PacketBuilder;
using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kSeed = 0x5eed'0dd5;
constexpr unsigned kWorkerLcore = 1;
constexpr unsigned kRxRingSize = 1024;  // power of two: holds 1023
constexpr unsigned kTxRingSize = 8192;
constexpr unsigned kPoolMbufs = 16383;
constexpr unsigned kInjectBurst = 64;
constexpr auto kDeadline = std::chrono::seconds(120);
const std::string kVip = "192.0.2.10";
constexpr std::uint16_t kVipPort = 5000;
constexpr std::size_t kBackends = 4;
const MacAddress kOurMac{2, 0, 0, 0, 0, 2};

rte_mempool* gPool = nullptr;

// ---------------------------------------------------------------------------
// TSan: the ring and mempool hand-offs, made visible.

#if SWD_TSAN
// Mbufs the worker frees return to the mempool through uninstrumented code:
// the worker releases this token at every RX poll (after the previous
// round's frees), the injector acquires it after every allocation.
int gPoolToken = 0;

std::uint16_t tsanRxCallback(std::uint16_t, std::uint16_t, rte_mbuf** pkts, std::uint16_t n,
                             std::uint16_t, void*) {
  __tsan_release(&gPoolToken);
  for (std::uint16_t i = 0; i < n; ++i) __tsan_acquire(pkts[i]);
  return n;
}

std::uint16_t tsanTxCallback(std::uint16_t, std::uint16_t, rte_mbuf** pkts, std::uint16_t n,
                             void*) {
  for (std::uint16_t i = 0; i < n; ++i) __tsan_release(pkts[i]);
  return n;
}
#endif

void annotateSent([[maybe_unused]] rte_mbuf* m) {
#if SWD_TSAN
  __tsan_release(m);
#endif
}
void annotateReceived([[maybe_unused]] rte_mbuf* m) {
#if SWD_TSAN
  __tsan_acquire(m);
#endif
}
void annotateAllocated() {
#if SWD_TSAN
  __tsan_acquire(&gPoolToken);
#endif
}

// ---------------------------------------------------------------------------
// The port: two rings behind a net_ring ethdev, opened by spillwayd's PortSet.

class RingPort {
 public:
  explicit RingPort(const std::string& tag) {
    rx_ = rte_ring_create(("swd_rx_" + tag).c_str(), kRxRingSize, static_cast<int>(rte_socket_id()),
                          RING_F_SP_ENQ | RING_F_SC_DEQ);
    tx_ = rte_ring_create(("swd_tx_" + tag).c_str(), kTxRingSize, static_cast<int>(rte_socket_id()),
                          RING_F_SP_ENQ | RING_F_SC_DEQ);
    if (rx_ == nullptr || tx_ == nullptr) {
      error_ = std::string("rte_ring_create: ") + rte_strerror(rte_errno);
      return;
    }
    // rte_eth_from_rings() names the device "net_ring_" + its argument.
    const std::string device = "net_ring_swd_" + tag;
    if (rte_eth_from_rings(("swd_" + tag).c_str(), &rx_, 1, &tx_, 1, rte_socket_id()) < 0) {
      error_ = "rte_eth_from_rings(" + device + "): " + rte_strerror(rte_errno);
      return;
    }
    PortSpec spec;
    spec.name = tag;
    spec.devargs = device;
    if (!ports_.open({spec}, 1, error_)) return;
#if SWD_TSAN
    const std::uint16_t id = ports_.ports().front().portId;
    if (rte_eth_add_rx_callback(id, 0, tsanRxCallback, nullptr) == nullptr ||
        rte_eth_add_tx_callback(id, 0, tsanTxCallback, nullptr) == nullptr) {
      error_ = "cannot add the TSan annotation callbacks";
      return;
    }
#endif
    ok_ = true;
  }
  ~RingPort() {
    ports_.close();
    rte_ring_free(rx_);
    rte_ring_free(tx_);
  }
  RingPort(const RingPort&) = delete;
  RingPort& operator=(const RingPort&) = delete;

  [[nodiscard]] bool ok() const {
    return ok_;
  }
  [[nodiscard]] const std::string& error() const {
    return error_;
  }
  [[nodiscard]] const std::vector<OpenPort>& ports() const {
    return ports_.ports();
  }
  [[nodiscard]] rte_ring* rx() const {
    return rx_;
  }
  [[nodiscard]] rte_ring* tx() const {
    return tx_;
  }

 private:
  rte_ring* rx_ = nullptr;
  rte_ring* tx_ = nullptr;
  PortSet ports_;
  bool ok_ = false;
  std::string error_;
};

// ---------------------------------------------------------------------------
// The main lcore's end of the wire.

class Wire {
 public:
  explicit Wire(const RingPort& port) : rx_(port.rx()), tx_(port.tx()) {}

  // Puts up to one burst of frames[next...] into the RX ring; returns how many.
  std::size_t inject(const std::vector<std::vector<std::byte>>& frames, std::size_t& next) {
    const std::size_t room = rte_ring_free_count(rx_);
    const std::size_t n = std::min<std::size_t>({room, kInjectBurst, frames.size() - next});
    if (n == 0) return 0;
    std::array<rte_mbuf*, kInjectBurst> m{};
    if (rte_pktmbuf_alloc_bulk(gPool, m.data(), static_cast<unsigned>(n)) != 0) return 0;
    annotateAllocated();
    for (std::size_t i = 0; i < n; ++i) {
      const auto& f = frames[next + i];
      char* data = rte_pktmbuf_append(m[i], static_cast<std::uint16_t>(f.size()));
      if (data == nullptr) std::abort();  // frames are far below the mbuf size
      std::memcpy(data, f.data(), f.size());
      annotateSent(m[i]);
    }
    const unsigned sent = rte_ring_enqueue_burst(rx_, reinterpret_cast<void**>(m.data()),
                                                 static_cast<unsigned>(n), nullptr);
    for (std::size_t i = sent; i < n; ++i) rte_pktmbuf_free(m[i]);
    next += sent;
    injected_ += sent;
    return sent;
  }

  // Takes everything in the TX ring, hands each frame to `onFrame`, frees it.
  template <class F>
  std::size_t drain(F&& onFrame) {
    std::size_t total = 0;
    for (;;) {
      std::array<rte_mbuf*, 64> m{};
      const unsigned n =
          rte_ring_dequeue_burst(tx_, reinterpret_cast<void**>(m.data()), 64, nullptr);
      for (unsigned i = 0; i < n; ++i) {
        annotateReceived(m[i]);
        EXPECT_EQ(m[i]->nb_segs, 1);
        onFrame(
            std::span<const std::byte>(rte_pktmbuf_mtod(m[i], const std::byte*), m[i]->data_len));
        rte_pktmbuf_free(m[i]);
      }
      total += n;
      received_ += n;
      if (n == 0) return total;
    }
  }

  [[nodiscard]] std::uint64_t injected() const { return injected_; }
  [[nodiscard]] std::uint64_t received() const { return received_; }
  [[nodiscard]] unsigned txRingCount() const { return rte_ring_count(tx_); }

 private:
  rte_ring* rx_;
  rte_ring* tx_;
  std::uint64_t injected_ = 0;
  std::uint64_t received_ = 0;
};

// ---------------------------------------------------------------------------
// Snapshots: one IPv4 VIP (TCP, every port, answers echo) over 4 IPIP backends.

struct BackendPlan {
  std::uint32_t weight = 100;
  BackendState state = BackendState::Active;
};

IpBytes backendAddress(std::size_t i) {
  return test::ipBytes("10.0.1." + std::to_string(i));
}

std::unique_ptr<ForwardingSnapshot> makeSnapshot(MaglevBuilder& builder, std::uint64_t generation,
                                                 const std::array<BackendPlan, kBackends>& plan,
                                                 std::uint32_t tableSize) {
  auto s = std::make_unique<ForwardingSnapshot>();
  s->generation = generation;
  s->backends.resize(kBackends + 1);
  std::vector<MaglevBackend> mb;
  for (std::uint32_t i = 1; i <= kBackends; ++i) {
    auto& b = s->backends[i];
    b.id = 1000 + i;
    b.state = plan[i - 1].state;
    b.egressPort = 0;
    b.encap.kind = EncapKind::IpInIp4;
    b.encap.source = test::ipBytes("10.0.0.2");
    b.encap.backend = backendAddress(i);
    b.encap.nextHopMac = {2, 0, 0, 0, 1, static_cast<std::uint8_t>(i)};
    b.encap.ourMac = kOurMac;
    const bool takesNew = b.state == BackendState::Active;
    mb.push_back({b.id, takesNew ? plan[i - 1].weight : 0, i});
  }
  SnapshotVip v;
  v.key = {test::ipBytes(kVip), IpVersion::V4, static_cast<std::uint8_t>(IpProto::Tcp), 0};
  v.name = "nccl";
  v.answerEcho = true;
  auto built = builder.build(mb, FlowHasher(kSeed), tableSize);
  if (!built.ok()) std::abort();
  v.table = std::move(built).value().table;
  s->vips.push_back(std::move(v));
  s->indexVips();
  return s;
}

// ---------------------------------------------------------------------------
// Frames. A VIP flow is (10.<id>, port 40000 + id % 7) -> VIP:5000; the TCP
// sequence number (or the echo's identifier and sequence) carries the frame's
// serial so each output frame names its input.

std::string clientOf(std::uint32_t flow) {
  return "10." + std::to_string((flow >> 16) & 0xff) + "." + std::to_string((flow >> 8) & 0xff) +
         "." + std::to_string(flow & 0xff);
}
std::uint16_t clientPort(std::uint32_t flow) {
  return static_cast<std::uint16_t>(40000 + flow % 7);
}

std::vector<std::byte> vipTcp(std::uint32_t flow, std::uint8_t flags, std::uint32_t serial) {
  return PacketBuilder()
      .eth(kOurMac)
      .ipv4(clientOf(flow), kVip)
      .tcp(clientPort(flow), kVipPort, flags, serial)
      .payload(serial % 97)
      .build();
}

std::uint64_t flowHash(std::uint32_t flow) {
  const auto frame = vipTcp(flow, kTcpAck, 0);
  return FlowHasher(kSeed).hash(parsePacket(frame).key);
}

// What came out of the TX ring, decoded.
struct OutFrame {
  bool encapsulated = false;  // IPIP to a backend; otherwise an echo reply
  std::array<std::uint8_t, 4> outerDst{};
  MacAddress ethDst{};
  std::uint32_t flow = 0;
  std::uint32_t serial = 0;
  bool valid = false;
};

OutFrame decode(std::span<const std::byte> f) {
  OutFrame o;
  if (f.size() < 14 + 20 + 8) return o;
  const auto eth = loadAt<EthernetHeader>(f, 0);
  o.ethDst = eth.dst;
  if (eth.etherType.host() != kEtherTypeIpv4) return o;
  const auto outer = loadAt<Ipv4Header>(f, 14);
  const std::size_t outerLen = (outer.versionIhl & 0x0f) * 4u;
  if (outer.protocol == 4) {  // IPIP
    if (f.size() < 14 + outerLen + 20 + 20) return o;
    const auto inner = loadAt<Ipv4Header>(f, 14 + outerLen);
    const std::size_t innerLen = (inner.versionIhl & 0x0f) * 4u;
    if (inner.protocol != static_cast<std::uint8_t>(IpProto::Tcp)) return o;
    const auto tcp = loadAt<TcpHeader>(f, 14 + outerLen + innerLen);
    o.encapsulated = true;
    o.outerDst = outer.dst;
    o.flow =
        (std::uint32_t{inner.src[1]} << 16) | (std::uint32_t{inner.src[2]} << 8) | inner.src[3];
    o.serial = tcp.seq.host();
    o.valid = tcp.dstPort.host() == kVipPort && tcp.srcPort.host() == clientPort(o.flow) &&
              inner.dst == test::v4(kVip);
    return o;
  }
  if (outer.protocol == static_cast<std::uint8_t>(IpProto::Icmp)) {
    const auto icmp = loadAt<IcmpHeader>(f, 14 + outerLen);
    o.serial = icmp.rest.host();
    o.valid = icmp.type == kIcmpEchoReply && outer.src == test::v4(kVip);
    return o;
  }
  return o;
}

// ---------------------------------------------------------------------------
// The rig: a ring port, the QSBR domain, the publisher and one Worker.

class WorkerRig {
 public:
  explicit WorkerRig(const std::string& tag, WorkerConfig config = defaultConfig())
      : port_(tag), config_(config) {}
  ~WorkerRig() {
    if (launched_) stopAndJoin();
  }

  static WorkerConfig defaultConfig() {
    WorkerConfig c;
    c.lcore = kWorkerLcore;
    c.queue = 0;
    c.qsbrReader = 0;
    c.burst = 32;
    c.txDrainUs = 100;
    c.flowTable.capacity = std::size_t{1} << 16;
    c.hashSeed = kSeed;
    // The plan's echo requests come from one source at ring speed: no limit
    // here (the limits have unit tests of their own).
    c.icmpLimits = IcmpRateLimits{.perSecond = 4'000'000,
                                  .burst = 4'000'000,
                                  .perSourcePerSecond = 4'000'000,
                                  .perSourceBurst = 4'000'000};
    return c;
  }

  // Builds the Worker; false (with a test failure) when the port did not open.
  bool build() {
    if (!port_.ok()) {
      ADD_FAILURE() << "ring port: " << port_.error();
      return false;
    }
    worker_ = std::make_unique<Worker>(config_, port_.ports(), qsbr_, publisher_);
    return true;
  }

  // Starts run() on the worker lcore; false (with a test failure) when it cannot.
  bool launch() {
    if (const int rc = rte_eal_remote_launch(&WorkerRig::lcoreMain, this, kWorkerLcore); rc != 0) {
      ADD_FAILURE() << "rte_eal_remote_launch on lcore " << kWorkerLcore << ": "
                    << rte_strerror(-rc);
      return false;
    }
    launched_ = true;
    go_.store(true, std::memory_order_release);
    return true;
  }

  // Sets the stop flag and waits (with a deadline) until run() returned.
  void stopAndJoin() {
    stop_.store(true, std::memory_order_release);
    const auto deadline = Clock::now() + kDeadline;
    while (!done_.load(std::memory_order_acquire)) {
      if (Clock::now() > deadline) {
        std::fprintf(stderr, "worker lcore did not return from run() after the stop flag\n");
        std::abort();  // rte_eal_wait_lcore would hang the suite
      }
      rte_pause();
    }
    EXPECT_EQ(rte_eal_wait_lcore(kWorkerLcore), 0);
    launched_ = false;
  }

  Worker& worker() { return *worker_; }
  Wire& wire() { return wire_; }
  SnapshotPublisher& publisher() { return publisher_; }
  const RingPort& port() const { return port_; }

 private:
  static int lcoreMain(void* arg) {
    auto* rig = static_cast<WorkerRig*>(arg);
    while (!rig->go_.load(std::memory_order_acquire)) rte_pause();
    rig->worker_->run(rig->stop_);
    rig->done_.store(true, std::memory_order_release);
    return 0;
  }

  RingPort port_;
  WorkerConfig config_;
  Wire wire_{port_};
  QsbrDomain qsbr_{1};
  SnapshotPublisher publisher_{qsbr_};
  std::unique_ptr<Worker> worker_;
  std::atomic<bool> go_{false};
  std::atomic<bool> stop_{false};
  std::atomic<bool> done_{false};
  bool launched_ = false;
};

// Polls `cond` until it holds or the deadline passes; returns whether it held.
template <class F>
bool pollUntil(F&& cond, std::chrono::steady_clock::duration limit = kDeadline) {
  const auto deadline = Clock::now() + limit;
  while (!cond()) {
    if (Clock::now() > deadline) return false;
    rte_pause();
  }
  return true;
}

std::uint64_t accounted(const SteeringCounters& c) {
  return c.forwarded.read() + c.replies.read() + c.toKernel.read() + c.drops.total();
}

// ---------------------------------------------------------------------------
// 1. Traffic through the real Worker.

enum class Expect : std::uint8_t { Forward, Reply, Kernel, Drop };

struct Plan {
  std::vector<std::vector<std::byte>> frames;
  std::vector<Expect> expect;
  std::map<DropReason, std::uint64_t> drops;
  std::vector<std::uint32_t> flowOfSerial;  // VIP TCP frames: their flow; else UINT32_MAX
  std::uint32_t flows = 0;
  std::uint64_t count(Expect e) const { return std::count(expect.begin(), expect.end(), e); }
};

Plan planTraffic(std::size_t total, std::uint32_t maxFlows) {
  Plan p;
  std::mt19937_64 rng(42);
  std::vector<std::uint32_t> open;
  auto add = [&](std::vector<std::byte> f, Expect e, std::uint32_t flow = UINT32_MAX) {
    p.frames.push_back(std::move(f));
    p.expect.push_back(e);
    p.flowOfSerial.push_back(flow);
  };
  auto addDrop = [&](std::vector<std::byte> f, DropReason r) {
    add(std::move(f), Expect::Drop);
    ++p.drops[r];
  };
  while (p.frames.size() < total) {
    const auto serial = static_cast<std::uint32_t>(p.frames.size());
    const auto roll = rng() % 100;
    if (roll < 65) {  // VIP TCP: a new flow's SYN, or a later packet of an open flow
      if (open.empty() || (p.flows < maxFlows && rng() % 4 == 0)) {
        // The handshake's ACK follows at once, so the entry is established
        // long before the embryonic timeout, however slow the build.
        const std::uint32_t flow = 1 + p.flows++;
        open.push_back(flow);
        add(vipTcp(flow, kTcpSyn, serial), Expect::Forward, flow);
        add(vipTcp(flow, kTcpAck, serial + 1), Expect::Forward, flow);
      } else {
        const std::uint32_t flow = open[rng() % open.size()];
        add(vipTcp(flow, kTcpAck | kTcpPsh, serial), Expect::Forward, flow);
      }
    } else if (roll < 72) {  // ICMP echo to the VIP: answered in place
      add(PacketBuilder()
              .eth(kOurMac)
              .ipv4("10.200.0.1", kVip)
              .icmp(kIcmpEchoRequest, 0, serial)
              .payload(24)
              .build(),
          Expect::Reply);
    } else if (roll < 86) {  // host traffic: the exception path's
      switch (rng() % 3) {
        case 0: {
          std::vector<std::byte> arp(60, std::byte{0});
          arp[12] = std::byte{0x08};
          arp[13] = std::byte{0x06};
          add(std::move(arp), Expect::Kernel);
          break;
        }
        case 1:
          add(PacketBuilder()
                  .eth(kOurMac)
                  .ipv4("10.9.0.1", "10.0.0.2")
                  .tcp(5555, 22, kTcpSyn)
                  .build(),
              Expect::Kernel);
          break;
        default:
          add(PacketBuilder().eth(kOurMac).ipv4("10.9.0.1", "10.0.0.2").udp(179, 53).build(),
              Expect::Kernel);
          break;
      }
    } else {  // malformed, or not servable: dropped by reason
      switch (rng() % 5) {
        case 0:
          addDrop(std::vector<std::byte>(9, std::byte{1}), DropReason::Truncated);
          break;
        case 1:
          addDrop(PacketBuilder()
                      .eth(kOurMac)
                      .ipv4("10.9.0.1", kVip)
                      .ipv4Fragment(10, false)
                      .tcp(1, 2)
                      .build(),
                  DropReason::Ipv4Fragment);
          break;
        case 2:
          addDrop(PacketBuilder()
                      .eth(kOurMac)
                      .ipv4("10.9.0.1", kVip, 1)
                      .tcp(1, kVipPort, kTcpSyn)
                      .build(),
                  DropReason::TtlExhausted);
          break;
        case 3:
          addDrop(PacketBuilder().eth(kOurMac).ipv4("10.9.0.1", kVip).udp(1, kVipPort).build(),
                  DropReason::VipPortNotServed);
          break;
        default: {  // the IP header claims more than the frame holds
          auto f = PacketBuilder()
                       .eth(kOurMac)
                       .ipv4("10.9.0.1", kVip)
                       .tcp(1, kVipPort)
                       .payload(40)
                       .build();
          f.resize(14 + 20 + 20);
          addDrop(std::move(f), DropReason::BadTotalLength);
          break;
        }
      }
    }
  }
  while (p.frames.size() > total) {  // a last handshake may overshoot by its ACK
    p.frames.pop_back();
    p.expect.pop_back();
    p.flowOfSerial.pop_back();
  }
  return p;
}

TEST(WorkerRing, SteersEveryFrameToTheMaglevBackend) {
  constexpr std::size_t kFrames = 100'000;
  WorkerRig rig("traffic");
  ASSERT_TRUE(rig.build());
  MaglevBuilder builder;
  rig.publisher().publish(makeSnapshot(builder, 1, {}, kMaglevDefaultTableSize));
  const ForwardingSnapshot& snap = *rig.publisher().current();

  const Plan plan = planTraffic(kFrames, 6000);
  // What Maglev predicts for every flow (the table never changes here).
  std::vector<std::uint32_t> predicted(plan.flows + 1, 0);
  for (std::uint32_t f = 1; f <= plan.flows; ++f) {
    predicted[f] = snap.vips[0].table.lookup(flowHash(f));
    ASSERT_NE(predicted[f], 0u);
  }

  std::vector<std::uint8_t> seen(kFrames, 0);
  std::vector<std::uint32_t> flowBackend(plan.flows + 1, 0);
  std::array<std::uint64_t, kBackends + 1> perBackend{};
  std::uint64_t forwardedOut = 0, repliesOut = 0, bad = 0;
  auto onFrame = [&](std::span<const std::byte> f) {
    const OutFrame o = decode(f);
    if (!o.valid || o.serial >= kFrames || seen[o.serial]++ != 0) {
      ++bad;
      return;
    }
    if (!o.encapsulated) {
      ++repliesOut;
      EXPECT_EQ(plan.expect[o.serial], Expect::Reply) << "serial " << o.serial;
      return;
    }
    ++forwardedOut;
    const std::uint32_t flow = plan.flowOfSerial[o.serial];
    if (plan.expect[o.serial] != Expect::Forward || flow != o.flow) {
      ++bad;
      return;
    }
    const std::uint32_t want = predicted[flow];
    const IpBytes wantAddr = backendAddress(want);
    if (std::memcmp(o.outerDst.data(), wantAddr.data(), 4) != 0 ||
        o.ethDst != snap.backends[want].encap.nextHopMac) {
      ADD_FAILURE() << "flow " << flow << " (serial " << o.serial << ") left for "
                    << int(o.outerDst[3]) << ", Maglev predicts backend " << want;
    }
    if (o.outerDst[3] == 0 || o.outerDst[3] > kBackends) {
      ++bad;
      return;
    }
    if (flowBackend[flow] == 0) flowBackend[flow] = o.outerDst[3];
    EXPECT_EQ(flowBackend[flow], o.outerDst[3]) << "flow " << flow << " changed backend";
    ++perBackend[o.outerDst[3]];
  };

  ASSERT_TRUE(rig.launch());
  std::size_t next = 0;
  while (next < plan.frames.size()) {
    rig.wire().inject(plan.frames, next);
    rig.wire().drain(onFrame);
  }
  const std::uint64_t wantOut = plan.count(Expect::Forward) + plan.count(Expect::Reply);
  const auto& c = rig.worker().steering();
  const bool settled = pollUntil([&] {
    rig.wire().drain(onFrame);
    return c.rxPackets.read() == kFrames && rig.wire().received() >= wantOut;
  });
  // The worker counts its live flows per backend when asked, a slice of its
  // table per drain period.
  rig.worker().requestFlowCount(1);
  const bool counted = pollUntil([&] { return rig.worker().flowCountDone() == 1; });
  std::array<std::uint64_t, kBackends + 1> liveBefore{}, packetsBefore{}, bytesBefore{};
  for (std::uint32_t b = 0; b <= kBackends; ++b) {
    liveBefore[b] = rig.worker().liveFlows()[b].read();
    packetsBefore[b] = rig.worker().counters().backendTraffic[b].packets.read();
    bytesBefore[b] = rig.worker().counters().backendTraffic[b].bytes.read();
    // Bytes as encapsulated: each frame at least Ethernet, outer IPv4, inner
    // IPv4 and TCP headers.
    if (b != 0) {
      EXPECT_GE(bytesBefore[b], packetsBefore[b] * (14 + 20 + 20 + 20)) << "backend " << b;
    }
  }
  // A purge of backend index 2 (as before its index is recycled): the worker
  // erases its entries and zeroes its counters; a new count finds none.
  constexpr std::uint32_t kPurged = 2;
  rig.worker().requestPurge(1, {kPurged});
  const bool purged = pollUntil([&] { return rig.worker().purgeDone() == 1; });
  rig.worker().requestFlowCount(2);
  const bool recounted = pollUntil([&] { return rig.worker().flowCountDone() == 2; });
  rig.stopAndJoin();
  ASSERT_TRUE(purged) << "the worker never finished the purge";
  ASSERT_TRUE(recounted);
  // (Entries may expire between the counts on a slow run: others' counts only fall.)
  for (std::uint32_t b = 1; b <= kBackends; ++b) {
    const bool gone = b == kPurged;
    if (gone) {
      EXPECT_EQ(rig.worker().liveFlows()[b].read(), 0u);
      EXPECT_EQ(rig.worker().counters().backendNewFlows[b].read(), 0u);
    } else {
      EXPECT_LE(rig.worker().liveFlows()[b].read(), liveBefore[b]) << "backend " << b;
    }
    EXPECT_EQ(rig.worker().counters().backendTraffic[b].packets.read(), gone ? 0 : packetsBefore[b])
        << "backend " << b;
    EXPECT_EQ(rig.worker().counters().backendTraffic[b].bytes.read(), gone ? 0 : bytesBefore[b])
        << "backend " << b;
  }
  // Every slot naming it, live or expired.
  EXPECT_GE(rig.worker().flowTable().purged, liveBefore[kPurged]);
  EXPECT_GT(liveBefore[kPurged], 0u);
  rig.wire().drain(onFrame);
  ASSERT_TRUE(settled) << "rx " << c.rxPackets.read() << " of " << kFrames << ", out "
                       << rig.wire().received() << " of " << wantOut;
  ASSERT_TRUE(counted) << "the worker never finished the flow count";

  // Conservation.
  EXPECT_EQ(rig.wire().injected(), kFrames);
  EXPECT_EQ(c.rxPackets.read(), kFrames);
  EXPECT_EQ(c.rxPackets.read(), accounted(c));
  EXPECT_EQ(rig.wire().received(), c.forwarded.read() + c.replies.read());
  EXPECT_EQ(rig.worker().counters().txDropped.read(), 0u);
  EXPECT_EQ(rig.worker().counters().unsteered.read(), 0u);
  EXPECT_EQ(bad, 0u);
  // Every verdict as planned.
  EXPECT_EQ(c.forwarded.read(), plan.count(Expect::Forward));
  EXPECT_EQ(c.replies.read(), plan.count(Expect::Reply));
  EXPECT_EQ(c.toKernel.read(), plan.count(Expect::Kernel));
  EXPECT_EQ(c.drops.total(), plan.count(Expect::Drop));
  for (const auto& [reason, n] : plan.drops) {
    EXPECT_EQ(c.drops.read(reason), n) << dropReasonName(reason);
  }
  EXPECT_EQ(forwardedOut, c.forwarded.read());
  EXPECT_EQ(repliesOut, c.replies.read());
  // Flows: one table entry each, spread over every backend, counted per backend.
  EXPECT_EQ(c.newFlows.read(), plan.flows);
  EXPECT_EQ(c.flowInsertFailed.read(), 0u);
  EXPECT_EQ(c.resteered.read(), 0u);
  std::array<std::uint64_t, kBackends + 1> flowsOn{};
  for (std::uint32_t f = 1; f <= plan.flows; ++f) ++flowsOn[flowBackend[f]];
  EXPECT_EQ(flowsOn[0], 0u) << "flows that never came out";
  for (std::uint32_t b = 1; b <= kBackends; ++b) {
    EXPECT_GT(perBackend[b], 0u) << "backend " << b;
    EXPECT_EQ(packetsBefore[b], perBackend[b]) << "backend " << b;
    EXPECT_EQ(liveBefore[b], flowsOn[b]) << "backend " << b;
  }
  EXPECT_EQ(rig.worker().counters().snapshotGeneration.read(), 1u);
}

// The worker's txPackets counter counts every frame it put on the wire,
// including those sent when a full TX buffer flushed itself.
TEST(WorkerRing, TxPacketsCountsEveryTransmittedFrame) {
  constexpr std::uint32_t kFrames = 4096;
  WorkerRig rig("txcount");
  ASSERT_TRUE(rig.build());
  MaglevBuilder builder;
  rig.publisher().publish(makeSnapshot(builder, 1, {}, 1031));
  std::vector<std::vector<std::byte>> frames;
  for (std::uint32_t i = 0; i < kFrames; ++i) frames.push_back(vipTcp(1 + i % 64, kTcpAck, i));
  ASSERT_TRUE(rig.launch());
  std::size_t next = 0;
  auto ignore = [](std::span<const std::byte>) {};
  while (next < frames.size()) {
    rig.wire().inject(frames, next);
    rig.wire().drain(ignore);
  }
  const bool settled = pollUntil([&] {
    rig.wire().drain(ignore);
    return rig.wire().received() >= kFrames;
  });
  rig.stopAndJoin();
  rig.wire().drain(ignore);
  ASSERT_TRUE(settled) << rig.wire().received() << " of " << kFrames << " came out";
  EXPECT_EQ(rig.wire().received(), kFrames);
  EXPECT_EQ(rig.worker().counters().txPackets.read(), rig.wire().received())
      << "txPackets misses the frames sent by rte_eth_tx_buffer() when the buffer filled";
}

// ---------------------------------------------------------------------------
// 2. Snapshot publication under load.

TEST(WorkerRing, ThousandsOfSnapshotsUnderLoadLoseNoPacketAndMoveNoTrackedFlow) {
  constexpr std::uint64_t kPublications = 2000;
  constexpr std::uint32_t kTableSize = 1031;
  constexpr std::uint32_t kNewFlowsPerRound = 4;
  WorkerRig rig("publish");
  ASSERT_TRUE(rig.build());
  MaglevBuilder builder;
  std::uint64_t generation = 1;
  rig.publisher().publish(makeSnapshot(builder, generation, {}, kTableSize));

  // Alternating plans: weights shift every generation; one backend at a time
  // drains or is disabled. Every state keeps tracked flows.
  auto planFor = [](std::uint64_t g) {
    std::array<BackendPlan, kBackends> p{};
    for (std::size_t i = 0; i < kBackends; ++i) {
      p[i].weight = static_cast<std::uint32_t>(20 + (g * 37 + i * 53) % 180);
    }
    const std::size_t victim = (g / 3) % kBackends;
    if (g % 3 == 1) p[victim].state = BackendState::Draining;
    if (g % 3 == 2) p[victim].state = BackendState::Disabled;
    return p;
  };

  std::mt19937_64 rng(7);
  std::uint32_t flows = 0;
  std::uint32_t serial = 0;
  std::vector<std::uint8_t> seen;
  std::vector<std::uint8_t> flowBackend(1, 0);  // by flow: the backend it first went to
  std::uint64_t moved = 0, duplicates = 0, bad = 0;
  auto onFrame = [&](std::span<const std::byte> f) {
    const OutFrame o = decode(f);
    if (!o.valid || !o.encapsulated || o.serial >= seen.size() || o.flow >= flowBackend.size()) {
      ++bad;
      return;
    }
    if (seen[o.serial]++ != 0) ++duplicates;
    std::uint8_t& b = flowBackend[o.flow];
    if (b == 0) b = o.outerDst[3];
    if (b != o.outerDst[3]) ++moved;
  };

  std::vector<std::vector<std::byte>> round;
  std::uint64_t reclaimed = 0;
  std::uint64_t tableSlotsChanged = 0;
  const MaglevTable* previousTable = &rig.publisher().current()->vips[0].table;
  ASSERT_TRUE(rig.launch());
  const std::uint64_t firstSeenGeneration = 1;
  for (std::uint64_t p = 0; p < kPublications; ++p) {
    // A round of traffic: new flows (SYN, then ACKs right after so the
    // embryonic entry becomes established), and packets of older flows.
    round.clear();
    const std::uint32_t firstNew = flows + 1;
    for (std::uint32_t k = 0; k < kNewFlowsPerRound; ++k) {
      ++flows;
      flowBackend.push_back(0);
      round.push_back(vipTcp(flows, kTcpSyn, serial++));
    }
    for (std::uint32_t f = firstNew; f <= flows; ++f) round.push_back(vipTcp(f, kTcpAck, serial++));
    for (int k = 0; k < 24 && flows > kNewFlowsPerRound; ++k) {
      const auto old = static_cast<std::uint32_t>(1 + rng() % (flows - kNewFlowsPerRound));
      round.push_back(vipTcp(old, kTcpAck | kTcpPsh, serial++));
    }
    seen.resize(serial, 0);
    std::size_t next = 0;
    while (next < round.size()) {
      rig.wire().inject(round, next);
      rig.wire().drain(onFrame);
    }
    // Publish the next generation while those frames are in flight.
    ++generation;
    auto s = makeSnapshot(builder, generation, planFor(generation), kTableSize);
    tableSlotsChanged += countChanged(*previousTable, s->vips[0].table);
    rig.publisher().publish(std::move(s));
    previousTable = &rig.publisher().current()->vips[0].table;
    reclaimed += rig.publisher().reclaim();
  }
  const auto& c = rig.worker().steering();
  const bool settled = pollUntil([&] {
    rig.wire().drain(onFrame);
    reclaimed += rig.publisher().reclaim();
    return c.rxPackets.read() == rig.wire().injected() &&
           rig.wire().received() >= rig.wire().injected() &&
           rig.worker().counters().snapshotGeneration.read() == generation;
  });
  rig.stopAndJoin();
  rig.wire().drain(onFrame);
  ASSERT_TRUE(settled) << "rx " << c.rxPackets.read() << ", in " << rig.wire().injected()
                       << ", out " << rig.wire().received() << ", generation "
                       << rig.worker().counters().snapshotGeneration.read() << " of " << generation;

  // Every frame in came out exactly once; nothing dropped.
  EXPECT_EQ(rig.wire().injected(), serial);
  EXPECT_EQ(rig.wire().received(), rig.wire().injected());
  EXPECT_EQ(duplicates, 0u);
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 0), 0) << "frames lost";
  EXPECT_EQ(c.rxPackets.read(), accounted(c));
  EXPECT_EQ(c.forwarded.read(), rig.wire().injected());
  EXPECT_EQ(c.drops.total(), 0u);
  EXPECT_EQ(rig.worker().counters().txDropped.read(), 0u);
  // Tracked flows stayed on their backend through every publication, though
  // the tables moved under them.
  EXPECT_EQ(moved, 0u);
  EXPECT_EQ(c.resteered.read(), 0u);
  EXPECT_EQ(c.flowInsertFailed.read(), 0u);
  EXPECT_EQ(c.newFlows.read(), flows);
  EXPECT_GT(tableSlotsChanged, kPublications) << "the tables hardly changed: a toothless test";
  std::uint32_t wouldMoveNow = 0;
  const auto& finalTable = rig.publisher().current()->vips[0].table;
  for (std::uint32_t f = 1; f <= flows; ++f) {
    wouldMoveNow += finalTable.lookup(flowHash(f)) != flowBackend[f];
  }
  EXPECT_GT(wouldMoveNow, 0u) << "no tracked flow sits off its current Maglev slot";
  // The worker followed the publications and every retired snapshot was freed.
  EXPECT_GT(rig.worker().counters().snapshotGeneration.read(), firstSeenGeneration);
  EXPECT_EQ(rig.worker().counters().snapshotGeneration.read(), generation);
  reclaimed += rig.publisher().reclaim();
  EXPECT_EQ(rig.publisher().pending(), 0u);
  EXPECT_EQ(reclaimed, kPublications);
}

// ---------------------------------------------------------------------------
// 3. Graceful stop.

TEST(WorkerRing, StopFlushesTheTxBuffer) {
  constexpr std::uint32_t kFrames = 10;  // fewer than a burst: they stay buffered
  WorkerConfig config = WorkerRig::defaultConfig();
  config.txDrainUs = 3'600'000'000u;  // the drain deadline never comes
  config.flushWhenIdle = false;       // nor an idle round's flush
  WorkerRig rig("stop", config);
  ASSERT_TRUE(rig.build());
  MaglevBuilder builder;
  rig.publisher().publish(makeSnapshot(builder, 1, {}, 1031));
  std::vector<std::vector<std::byte>> frames;
  for (std::uint32_t i = 0; i < kFrames; ++i) frames.push_back(vipTcp(1 + i, kTcpSyn, i));
  ASSERT_TRUE(rig.launch());
  std::size_t next = 0;
  ASSERT_TRUE(pollUntil([&] {
    rig.wire().inject(frames, next);
    return next == frames.size();
  }));
  const auto& c = rig.worker().steering();
  ASSERT_TRUE(pollUntil([&] { return c.forwarded.read() == kFrames; }))
      << "forwarded " << c.forwarded.read();
  EXPECT_EQ(rig.wire().txRingCount(), 0u) << "sent before the stop: not buffered";
  rig.stopAndJoin();
  EXPECT_EQ(rig.wire().txRingCount(), kFrames) << "run() returned without flushing its TX buffer";
  std::vector<std::uint32_t> serials;
  rig.wire().drain([&](std::span<const std::byte> f) { serials.push_back(decode(f).serial); });
  std::vector<std::uint32_t> want(kFrames);
  for (std::uint32_t i = 0; i < kFrames; ++i) want[i] = i;
  EXPECT_EQ(serials, want);
  EXPECT_EQ(rig.worker().counters().txPackets.read(), kFrames);
}

// ---------------------------------------------------------------------------
// 4. An idle-sleeping worker (WorkerConfig::idleSleepUs): it pauses once its
// queues stay empty, and a frame that arrives during a pause is still
// forwarded, as are the frames of a burst that follows.

TEST(WorkerRing, IdleWorkerSleepsAndWakesForTraffic) {
  WorkerConfig config = WorkerRig::defaultConfig();
  config.idleSleepUs = 200;
  WorkerRig rig("idle", config);
  ASSERT_TRUE(rig.build());
  MaglevBuilder builder;
  rig.publisher().publish(makeSnapshot(builder, 1, {}, 1031));
  ASSERT_TRUE(rig.launch());
  const Counter& sleeps = rig.worker().counters().idleSleeps;
  ASSERT_TRUE(pollUntil([&] { return sleeps.read() > 10; })) << "never paused while idle";
  const auto& c = rig.worker().steering();
  std::uint32_t sent = 0;
  for (std::uint32_t round = 0; round < 20; ++round) {
    // One frame into an idle worker, then a burst after it: every one out.
    std::vector<std::vector<std::byte>> frames;
    const std::uint32_t n = round % 2 == 0 ? 1 : 64;
    for (std::uint32_t i = 0; i < n; ++i) frames.push_back(vipTcp(1 + sent + i, kTcpSyn, i));
    std::size_t next = 0;
    ASSERT_TRUE(pollUntil([&] {
      rig.wire().inject(frames, next);
      return next == frames.size();
    }));
    sent += n;
    ASSERT_TRUE(pollUntil([&] { return c.forwarded.read() == sent; }))
        << "forwarded " << c.forwarded.read() << " of " << sent;
  }
  const std::uint64_t before = sleeps.read();
  ASSERT_TRUE(pollUntil([&] { return sleeps.read() > before; })) << "no pause after the traffic";
  rig.stopAndJoin();
  EXPECT_EQ(rig.worker().counters().txPackets.read(), sent);
}

// A polling worker (the default) never pauses.
TEST(WorkerRing, PollingWorkerNeverSleeps) {
  WorkerRig rig("poll", WorkerRig::defaultConfig());
  ASSERT_TRUE(rig.build());
  MaglevBuilder builder;
  rig.publisher().publish(makeSnapshot(builder, 1, {}, 1031));
  ASSERT_TRUE(rig.launch());
  const auto& c = rig.worker().steering();
  std::vector<std::vector<std::byte>> frames{vipTcp(1, kTcpSyn, 0)};
  std::size_t next = 0;
  ASSERT_TRUE(pollUntil([&] {
    rig.wire().inject(frames, next);
    return next == frames.size();
  }));
  ASSERT_TRUE(pollUntil([&] { return c.forwarded.read() == 1; }));
  rig.stopAndJoin();
  EXPECT_EQ(rig.worker().counters().idleSleeps.read(), 0u);
}

// ---------------------------------------------------------------------------

int skip(const std::string& why) {
  std::printf("SKIP: %s\n", why.c_str());
  std::fflush(stdout);
  return 77;
}

}  // namespace
}  // namespace spillway

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
    return spillway::skip("the worker needs lcore 1 and the injector lcore 0: fewer than 2 CPUs");
  }
  const std::string prefix = "swdtest" + std::to_string(getpid());
  // --no-shconf: no shared config or fbarray files, so a run that dies
  // under a sanitizer leaves at most an empty runtime directory behind.
  // clang-format off
  std::vector<std::string> args = {
      argv[0], "--no-huge", "-m", "512", "--no-pci", "-l", "0,1", "--main-lcore", "0",
      "--no-shconf", "--file-prefix", prefix, "--no-telemetry", "--log-level=*:warning"};
  // clang-format on
  std::vector<char*> ealArgv;
  for (auto& a : args) ealArgv.push_back(a.data());
  ealArgv.push_back(nullptr);
  if (rte_eal_init(static_cast<int>(args.size()), ealArgv.data()) < 0) {
    const int err = rte_errno;
    const std::string dir = rte_eal_get_runtime_dir();
    std::error_code ec;
    if (dir.ends_with(prefix)) std::filesystem::remove_all(dir, ec);
    const std::string why =
        std::string("the DPDK EAL cannot start (") + rte_strerror(err) +
        "): needs write access to the DPDK runtime directory (/var/run/dpdk "
        "as root, $XDG_RUNTIME_DIR otherwise), 512 MiB of memory and CPUs 0 and 1";
    // As root (CI) nothing the EAL needs here can be missing (--no-huge,
    // --no-pci, two CPUs checked above): a start-up failure is a failure.
    if (geteuid() == 0) {
      std::printf("FAIL: %s\n", why.c_str());
      return 1;
    }
    return spillway::skip(why);
  }
  const std::string runtimeDir = rte_eal_get_runtime_dir();
  spillway::gPool =
      rte_pktmbuf_pool_create("swd_test_pool", spillway::kPoolMbufs, 256, 0,
                              RTE_MBUF_DEFAULT_BUF_SIZE, static_cast<int>(rte_socket_id()));
  int rc = 1;
  if (spillway::gPool == nullptr) {
    std::fprintf(stderr, "cannot create the test mbuf pool: %s\n", rte_strerror(rte_errno));
  } else {
    rc = RUN_ALL_TESTS();
  }
  rte_eal_cleanup();
  std::error_code ec;
  std::filesystem::remove_all(runtimeDir, ec);  // this process's own /var/run/dpdk/swdtest<pid>
  return rc;
}
