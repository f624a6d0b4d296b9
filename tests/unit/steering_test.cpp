// The per-lcore data path end to end on byte buffers: every verdict, the
// flow-affinity rules (tracked flows stay, failed backends re-steer only their
// own flows), ICMP handling, and that every frame is counted exactly once.
#include "spillway/steering.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "control/intent/flow_checkpoint.hpp"
#include "packet_builder.hpp"
#include "steering_frame.hpp"

namespace spillway {
namespace {

using test::PacketBuilder;

constexpr std::uint64_t kSeed = 0x5eed;
constexpr std::size_t kHeadroom = test::kFrameHeadroom;

using test::Frame;

// A snapshot with VIP 192.0.2.10 TCP (all ports) and 2001:db8::10 TCP 443
// over backends 1..n (10.0.1.<i>, IPIP; 2001:db8:1::<i>, IPv6 outer).
// The backend the flow table tracks the flow of this identity (FlowHasher
// hash) on, as the exception export sees it (forEachLive reports identities),
// or 0.
std::uint32_t trackedBackend(const Steering& steering, std::uint64_t identity, Millis now) {
  std::uint32_t found = 0;
  steering.flowTable().forEachLive(
      now, 0, steering.flowTable().bucketCount(),
      [&](std::uint64_t id, std::uint32_t backend, FlowState, std::uint32_t, std::uint8_t) {
        if (id == identity) found = backend;
      });
  return found;
}

class SteeringTest : public ::testing::Test {
 protected:
  void SetUp() override { publish(std::vector<std::uint32_t>(4, 100)); }

  void publish(const std::vector<std::uint32_t>& weights,
               const std::vector<BackendState>& states = {}) {
    auto s = std::make_unique<ForwardingSnapshot>();
    s->generation = ++generation_;
    s->backends.resize(weights.size() + 1);
    std::vector<MaglevBackend> mb;
    std::vector<MaglevBackend> mb6;
    for (std::uint32_t i = 1; i <= weights.size(); ++i) {
      auto& b = s->backends[i];
      b.id = 1000 + i;
      b.state = states.empty() ? BackendState::Active : states[i - 1];
      b.encap.kind = EncapKind::IpInIp4;
      b.encap.source = test::ipBytes("10.0.0.2");
      b.encap.backend = test::ipBytes("10.0.1." + std::to_string(i));
      b.encap.nextHopMac = {2, 0, 0, 0, 1, static_cast<std::uint8_t>(i)};
      b.encap.ourMac = {2, 0, 0, 0, 0, 2};
      const bool takesNew = b.state == BackendState::Active;
      mb.push_back({b.id, takesNew ? weights[i - 1] : 0, i});
    }
    SnapshotVip v4;
    v4.key = {test::ipBytes("192.0.2.10"), IpVersion::V4, 6, 0};
    v4.name = "nccl";
    v4.tag = vipTagOf(v4.key);
    v4.answerEcho = true;
    v4.table = builder_.build(mb, FlowHasher(kSeed), 1009).value().table;
    SnapshotVip v6;
    v6.key = {test::ipBytes("2001:db8::10"), IpVersion::V6, 6, 443};
    v6.name = "grpc6";
    v6.tag = vipTagOf(v6.key);
    v6.table = builder_.build(mb, FlowHasher(kSeed), 1009).value().table;
    s->vips = {std::move(v4), std::move(v6)};
    s->indexVips();
    snapshot_ = std::move(s);
  }

  SteerResult steer(Frame& f) {
    SteerResult r;
    steering_.steerBurst(std::span(&f.ref, 1), std::span(&r, 1), *snapshot_, now_);
    return r;
  }

  static std::vector<std::byte> syn(std::uint16_t sport, std::uint8_t flags = kTcpSyn) {
    return PacketBuilder().ipv4("10.9.0.1", "192.0.2.10").tcp(sport, 5000, flags).build();
  }

  void expectAllCounted() const {
    const auto& c = steering_.counters();
    EXPECT_EQ(c.rxPackets.read(),
              c.forwarded.read() + c.replies.read() + c.toKernel.read() + c.drops.total());
  }

  MaglevBuilder builder_;
  std::uint64_t generation_ = 0;
  std::unique_ptr<ForwardingSnapshot> snapshot_;
  Steering steering_{FlowTableConfig{.capacity = 1 << 16}, kSeed};
  Millis now_ = 1'000'000;
};

TEST_F(SteeringTest, SynIsEncapsulatedToTheMaglevBackend) {
  Frame f(syn(40000));
  const auto view = parsePacket(f.ref.buffer.subspan(kHeadroom, f.ref.length));
  const std::uint64_t hash = FlowHasher(kSeed).hash(view.key);
  const SteerResult r = steer(f);
  ASSERT_EQ(r.verdict, Verdict::Forward) << dropReasonName(r.drop);
  EXPECT_EQ(r.backend, snapshot_->vips[0].table.lookup(hash));
  const auto out = parsePacket(f.out(r));
  ASSERT_TRUE(out.l3Valid);     // the parser takes no IPIP payload: only the outer header counts
  EXPECT_EQ(out.key.proto, 4);  // IPIP
  const auto inner = loadAt<Ipv4Header>(f.out(r), 14 + 20);
  EXPECT_EQ(inner.src, test::v4("10.9.0.1"));
  EXPECT_EQ(inner.dst, test::v4("192.0.2.10"));
  EXPECT_EQ(inner.ttl, 63);
  EXPECT_EQ(out.key.dst, snapshot_->backends[r.backend].encap.backend);
  EXPECT_EQ(out.key.src, test::ipBytes("10.0.0.2"));
  EXPECT_EQ(steering_.counters().newFlows.read(), 1u);
  EXPECT_TRUE(r.newFlow);
  EXPECT_EQ(trackedBackend(steering_, hash, now_), r.backend);
  // The table itself is keyed by the per-packet hash, not the identity.
  EXPECT_EQ(steering_.flowTable().lookup(steering_.tableHash(view.key), now_), r.backend);
  EXPECT_NE(steering_.tableHash(view.key), hash);
  Frame again(syn(40000, kTcpAck));
  EXPECT_FALSE(steer(again).newFlow);
  expectAllCounted();
}

TEST_F(SteeringTest, Ipv6VipUsesItsPort) {
  Frame ok(PacketBuilder().ipv6("2001:db8:9::1", "2001:db8::10").tcp(1234, 443, kTcpSyn).build());
  EXPECT_EQ(steer(ok).verdict, Verdict::Forward);
  Frame other(PacketBuilder().ipv6("2001:db8:9::1", "2001:db8::10").tcp(1234, 80, kTcpSyn).build());
  const auto r = steer(other);
  EXPECT_EQ(r.verdict, Verdict::Drop);
  EXPECT_EQ(r.drop, DropReason::VipPortNotServed);
  expectAllCounted();
}

TEST_F(SteeringTest, TrackedFlowsKeepTheirBackendWhenTheTableChanges) {
  std::map<std::uint16_t, std::uint32_t> first;
  for (std::uint16_t p = 1000; p < 1400; ++p) {
    Frame f(syn(p));
    first[p] = steer(f).backend;
  }
  // Backend 1 drains: weight 0, tracked flows continue.
  publish({100, 100, 100, 100}, {BackendState::Draining, BackendState::Active, BackendState::Active,
                                 BackendState::Active});
  int kept = 0;
  for (auto [p, b] : first) {
    Frame f(syn(p, kTcpAck));
    const auto r = steer(f);
    ASSERT_EQ(r.verdict, Verdict::Forward);
    EXPECT_EQ(r.backend, b);
    kept += b == 1;
  }
  EXPECT_GT(kept, 0);
  // New flows avoid the draining backend.
  for (std::uint16_t p = 2000; p < 2400; ++p) {
    Frame f(syn(p));
    EXPECT_NE(steer(f).backend, 1u);
  }
  EXPECT_EQ(steering_.counters().resteered.read(), 0u);
  expectAllCounted();
}

// Issue #13: a spoofed RST or FIN on a live flow, then an idle pause and a
// table change: the flow must keep its backend (it was re-steered, and
// reset, when the RST cut its entry's timeout to 10 s).
TEST_F(SteeringTest, SpoofedRstOrFinThenIdleKeepsTheFlowOnItsBackend) {
  std::map<std::uint16_t, std::uint32_t> first;
  for (std::uint16_t p = 3000; p < 3200; ++p) {
    Frame s(syn(p));
    first[p] = steer(s).backend;
    Frame data(PacketBuilder()
                   .ipv4("10.9.0.1", "192.0.2.10")
                   .tcp(p, 5000, kTcpAck | kTcpPsh)
                   .payload(100)
                   .build());
    ASSERT_EQ(steer(data).backend, first[p]);
    // The attacker's segment: right 4-tuple, any sequence number.
    Frame spoof(syn(p, p % 2 == 0 ? kTcpRst : std::uint8_t{kTcpFin | kTcpAck}));
    ASSERT_EQ(steer(spoof).verdict, Verdict::Forward);
  }
  now_ += 600'000;                     // ten idle minutes
  publish({100, 100, 100, 100, 100});  // a backend joins: the table changes
  int moved = 0;
  for (auto [p, b] : first) {
    Frame data(PacketBuilder()
                   .ipv4("10.9.0.1", "192.0.2.10")
                   .tcp(p, 5000, kTcpAck | kTcpPsh)
                   .payload(100)
                   .build());
    const auto r = steer(data);
    ASSERT_EQ(r.verdict, Verdict::Forward);
    EXPECT_EQ(r.backend, b) << "port " << p;
    const auto bytes = PacketBuilder().ipv4("10.9.0.1", "192.0.2.10").tcp(p, 5000).build();
    const FlowKey key = parsePacket(std::span<const std::byte>(bytes)).key;
    moved += snapshot_->vips[0].table.lookup(FlowHasher(kSeed).hash(key)) != b;
  }
  EXPECT_GT(moved, 0);  // the table change would have moved some of them
  expectAllCounted();
}

TEST_F(SteeringTest, FailedBackendMovesOnlyItsOwnFlows) {
  std::map<std::uint16_t, std::uint32_t> first;
  for (std::uint16_t p = 1000; p < 1400; ++p) {
    Frame f(syn(p));
    first[p] = steer(f).backend;
  }
  publish({100, 100, 100, 100},
          {BackendState::Active, BackendState::Failed, BackendState::Active, BackendState::Active});
  std::uint64_t moved = 0;
  for (auto [p, b] : first) {
    Frame f(syn(p, kTcpAck | kTcpPsh));
    const auto r = steer(f);
    ASSERT_EQ(r.verdict, Verdict::Forward);
    if (b == 2) {
      EXPECT_NE(r.backend, 2u);
      ++moved;
    } else {
      EXPECT_EQ(r.backend, b) << "a surviving flow moved";
    }
    // And it stays where it went.
    Frame again(syn(p, kTcpAck));
    EXPECT_EQ(steer(again).backend, r.backend);
  }
  EXPECT_GT(moved, 0u);
  EXPECT_EQ(steering_.counters().resteered.read(), moved);
  expectAllCounted();
}

TEST_F(SteeringTest, MidFlowPacketsAreTrackedOnceConfirmed) {
  // After an LB restart the first packet seen of an open connection is an ACK.
  Frame f(syn(4242, kTcpAck));
  const auto r = steer(f);
  ASSERT_EQ(r.verdict, Verdict::Forward);
  EXPECT_TRUE(r.newFlow);
  // Its next packet confirms it: established, so an hour of idleness is fine.
  now_ += 1;
  Frame next(syn(4242, kTcpAck | kTcpPsh));
  EXPECT_EQ(steer(next).backend, r.backend);
  now_ += 3'600'000;
  const auto view = parsePacket(syn(4242, kTcpAck));
  EXPECT_EQ(trackedBackend(steering_, FlowHasher(kSeed).hash(view.key), now_), r.backend);
}

TEST_F(SteeringTest, UnsolicitedAckDoesNotPinTheTable) {
  Frame f(syn(4343, kTcpAck));
  ASSERT_EQ(steer(f).verdict, Verdict::Forward);
  const auto view = parsePacket(syn(4343, kTcpAck));
  const std::uint64_t hash = FlowHasher(kSeed).hash(view.key);
  now_ += FlowTimeouts{}.embryonic + 1;  // never confirmed: gone like a SYN
  EXPECT_EQ(trackedBackend(steering_, hash, now_), 0u);
}

TEST_F(SteeringTest, NewConnectionOnAReusedTupleAvoidsADrainingBackend) {
  std::map<std::uint16_t, std::uint32_t> first;
  for (std::uint16_t p = 1000; p < 1200; ++p) {
    Frame f(syn(p));
    first[p] = steer(f).backend;
    Frame ack(syn(p, kTcpAck));
    steer(ack);
  }
  publish({100, 100, 100, 100}, {BackendState::Draining, BackendState::Active, BackendState::Active,
                                 BackendState::Active});
  for (auto [p, b] : first) {
    Frame ack(syn(p, kTcpAck));
    EXPECT_EQ(steer(ack).backend, b);  // the open connection stays
    if (b != 1) continue;
    Frame reuse(syn(p));  // a new connection with the same 5-tuple
    const auto r = steer(reuse);
    EXPECT_NE(r.backend, 1u);
    Frame after(syn(p, kTcpAck));
    EXPECT_EQ(steer(after).backend, r.backend);
  }
  expectAllCounted();
}

TEST_F(SteeringTest, UnresolvedNextHopDropsWithoutMovingTheFlow) {
  auto s = std::make_unique<ForwardingSnapshot>(*snapshot_);
  for (auto& b : s->backends) b.nextHopResolved = false;
  snapshot_ = std::move(s);
  Frame f(syn(5151));
  const auto r = steer(f);
  EXPECT_EQ(r.verdict, Verdict::Drop);
  EXPECT_EQ(r.drop, DropReason::NextHopUnresolved);
  EXPECT_EQ(steering_.counters().newFlows.read(), 0u);  // not tracked elsewhere
  publish({100, 100, 100, 100});
  Frame again(syn(5151));
  EXPECT_EQ(steer(again).verdict, Verdict::Forward);
  expectAllCounted();
}

TEST_F(SteeringTest, HostTrafficGoesToTheKernel) {
  Frame arp(std::vector<std::byte>(60, std::byte{0}));
  arp.storage[kHeadroom + 12] = std::byte{0x08};
  arp.storage[kHeadroom + 13] = std::byte{0x06};
  EXPECT_EQ(steer(arp).verdict, Verdict::ToKernel);
  Frame ssh(PacketBuilder().ipv4("10.9.0.1", "10.0.0.2").tcp(5555, 22, kTcpSyn).build());
  EXPECT_EQ(steer(ssh).verdict, Verdict::ToKernel);
  // Malformed packets to the host are the kernel's business too, but a
  // fragment or malformed packet to a VIP is dropped with its reason.
  Frame frag(
      PacketBuilder().ipv4("10.9.0.1", "192.0.2.10").ipv4Fragment(10, false).tcp(1, 2).build());
  const auto r = steer(frag);
  EXPECT_EQ(r.verdict, Verdict::Drop);
  EXPECT_EQ(r.drop, DropReason::Ipv4Fragment);
  EXPECT_EQ(steering_.counters().drops.read(DropReason::Ipv4Fragment), 1u);
  Frame runt(std::vector<std::byte>(9, std::byte{1}));
  EXPECT_EQ(steer(runt).drop, DropReason::Truncated);
  Frame udp(PacketBuilder().ipv4("10.9.0.1", "192.0.2.10").udp(1, 2).build());
  EXPECT_EQ(steer(udp).drop, DropReason::VipPortNotServed);
  expectAllCounted();
}

TEST_F(SteeringTest, ImpossibleSourcesAreDropped) {
  for (const char* src : {"224.1.2.3", "255.255.255.255", "127.0.0.1", "0.0.0.0"}) {
    Frame f(PacketBuilder().ipv4(src, "192.0.2.10").tcp(1, 2, kTcpSyn).build());
    EXPECT_EQ(steer(f).drop, DropReason::InvalidSource) << src;
  }
  for (const char* src : {"ff02::1", "::1", "::"}) {
    Frame f(PacketBuilder().ipv6(src, "2001:db8::10").tcp(1, 443, kTcpSyn).build());
    EXPECT_EQ(steer(f).drop, DropReason::InvalidSource) << src;
  }
  Frame ok(PacketBuilder().ipv6("::ffff:10.0.0.1", "2001:db8::10").tcp(1, 443, kTcpSyn).build());
  EXPECT_EQ(steer(ok).verdict, Verdict::Forward);
  EXPECT_EQ(steering_.counters().newFlows.read(), 1u);
  expectAllCounted();
}

// Issue #13: sources no client can have on the far side of the gateway.
TEST_F(SteeringTest, OwnAndLandSourcesAreDroppedAndCounted) {
  // A VIP's address as the source (any VIP: here the IPv6 one too).
  Frame fromVip(PacketBuilder().ipv4("192.0.2.10", "192.0.2.10").tcp(4000, 5000, kTcpSyn).build());
  EXPECT_EQ(steer(fromVip).drop, DropReason::Land);  // "land": source = destination
  Frame landPorts(
      PacketBuilder().ipv4("192.0.2.10", "192.0.2.10").tcp(5000, 5000, kTcpSyn).build());
  EXPECT_EQ(steer(landPorts).drop, DropReason::Land);
  Frame fromVip6(PacketBuilder().ipv6("2001:db8::10", "2001:db8::10").tcp(1, 443, kTcpSyn).build());
  EXPECT_EQ(steer(fromVip6).drop, DropReason::Land);
  // Another VIP's address, and the gateway's own port addresses.
  auto s = std::make_unique<ForwardingSnapshot>(*snapshot_);
  SnapshotVip other = s->vips[0];
  other.key.address = test::ipBytes("192.0.2.11");
  s->vips.push_back(other);
  s->gatewayAddresses = {{test::ipBytes("10.0.0.2"), IpVersion::V4},
                         {test::ipBytes("2001:db8:ff::2"), IpVersion::V6}};
  s->indexVips();
  snapshot_ = std::move(s);
  for (const char* src : {"192.0.2.11", "10.0.0.2"}) {
    Frame f(PacketBuilder().ipv4(src, "192.0.2.10").tcp(4000, 5000, kTcpSyn).build());
    const auto r = steer(f);
    EXPECT_EQ(r.verdict, Verdict::Drop) << src;
    EXPECT_EQ(r.drop, DropReason::OwnSource) << src;
  }
  Frame from6(PacketBuilder().ipv6("2001:db8:ff::2", "2001:db8::10").tcp(1, 443, kTcpSyn).build());
  EXPECT_EQ(steer(from6).drop, DropReason::OwnSource);
  // The gateway's address as a destination is host traffic, as before.
  Frame toHost(PacketBuilder().ipv4("10.9.0.1", "10.0.0.2").tcp(4000, 22, kTcpSyn).build());
  EXPECT_EQ(steer(toHost).verdict, Verdict::ToKernel);
  EXPECT_FALSE(snapshot_->vipIndex.isVipAddress(test::ipBytes("10.0.0.2"), IpVersion::V4));
  EXPECT_EQ(steering_.counters().drops.read(DropReason::Land), 3u);
  EXPECT_EQ(steering_.counters().drops.read(DropReason::OwnSource), 3u);
  EXPECT_EQ(steering_.counters().newFlows.read(), 0u);
  EXPECT_EQ(steering_.flowTable().counters().occupancy, 0u);
  expectAllCounted();
}

// Issue #13: a bad IPv4 header checksum to a VIP is dropped with its reason
// (to the host it stays the kernel's business).
TEST_F(SteeringTest, BadIpv4HeaderChecksumIsDroppedAndCounted) {
  auto bytes = PacketBuilder().ipv4("10.9.0.1", "192.0.2.10").tcp(4000, 5000, kTcpSyn).build();
  bytes[14 + 10] ^= std::byte{0x5a};
  Frame bad(bytes);
  const auto r = steer(bad);
  EXPECT_EQ(r.verdict, Verdict::Drop);
  EXPECT_EQ(r.drop, DropReason::BadIpChecksum);
  EXPECT_EQ(steering_.counters().drops.read(DropReason::BadIpChecksum), 1u);
  EXPECT_EQ(steering_.flowTable().counters().occupancy, 0u);
  auto host = PacketBuilder().ipv4("10.9.0.1", "10.0.0.2").tcp(4000, 22, kTcpSyn).build();
  host[14 + 10] ^= std::byte{0x5a};
  Frame toHost(host);
  EXPECT_EQ(steer(toHost).verdict, Verdict::ToKernel);
  expectAllCounted();
}

TEST_F(SteeringTest, NoActiveBackendIsCounted) {
  publish({0, 0, 0, 0});
  Frame f(syn(1));
  const auto r = steer(f);
  EXPECT_EQ(r.verdict, Verdict::Drop);
  EXPECT_EQ(r.drop, DropReason::NoBackend);
  expectAllCounted();
}

TEST_F(SteeringTest, IcmpErrorFollowsTheFlowItQuotes) {
  Frame f(syn(40000));
  const auto first = steer(f);
  ASSERT_EQ(first.verdict, Verdict::Forward);
  // The backend's reply VIP:5000 -> client:40000 is quoted by a router.
  auto reply = PacketBuilder().ipv4("192.0.2.10", "10.9.0.1").tcp(5000, 40000).build();
  std::vector<std::uint8_t> quote;
  for (std::size_t i = 14; i < 14 + 28; ++i)
    quote.push_back(std::to_integer<std::uint8_t>(reply[i]));
  Frame err(PacketBuilder()
                .ipv4("198.51.100.1", "192.0.2.10")
                .icmp(kIcmpDestUnreachable, kIcmpCodeFragNeeded, 1400)
                .payload(quote)
                .build());
  const auto r = steer(err);
  ASSERT_EQ(r.verdict, Verdict::Forward) << dropReasonName(r.drop);
  EXPECT_EQ(r.backend, first.backend);
  EXPECT_EQ(steering_.counters().icmpErrorsSteered.read(), 1u);
  expectAllCounted();
}

TEST_F(SteeringTest, EchoToVipIsAnsweredWhereConfigured) {
  Frame ping(PacketBuilder()
                 .ipv4("10.9.0.1", "192.0.2.10")
                 .icmp(kIcmpEchoRequest, 0, 0x10001)
                 .payload(16)
                 .build());
  const auto r = steer(ping);
  ASSERT_EQ(r.verdict, Verdict::Reply);
  const auto out = parsePacket(ping.out(r));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out.icmpType, kIcmpEchoReply);
  EXPECT_EQ(out.key.src, test::ipBytes("192.0.2.10"));
  EXPECT_EQ(out.key.dst, test::ipBytes("10.9.0.1"));
  Frame ping6(
      PacketBuilder().ipv6("2001:db8:9::1", "2001:db8::10").icmp(kIcmp6EchoRequest, 0).build());
  EXPECT_EQ(steer(ping6).drop, DropReason::IcmpUnsupported);  // that VIP does not answer
  expectAllCounted();
}

// Issue #13: the replies the LB builds itself are rate-limited per source
// and per lcore in total (defaults: 10/s burst 20 per source, 1000/s burst
// 100 in total), and a refused one is dropped and counted.
TEST_F(SteeringTest, IcmpRepliesAreRateLimitedPerSourceAndInTotal) {
  const IcmpRateLimits limits{};
  auto ping = [&](const std::string& src) {
    Frame f(PacketBuilder()
                .ipv4(src, "192.0.2.10")
                .icmp(kIcmpEchoRequest, 0, 0x10001)
                .payload(16)
                .build());
    return steer(f);
  };
  // One source: its burst, then refusals; a second later, its rate's worth.
  int replied = 0;
  for (int i = 0; i < 50; ++i) replied += ping("10.9.0.1").verdict == Verdict::Reply;
  EXPECT_EQ(replied, static_cast<int>(limits.perSourceBurst));
  EXPECT_EQ(steering_.counters().drops.read(DropReason::IcmpRateLimited),
            50u - limits.perSourceBurst);
  now_ += 1'000;
  replied = 0;
  for (int i = 0; i < 50; ++i) replied += ping("10.9.0.1").verdict == Verdict::Reply;
  EXPECT_EQ(replied, static_cast<int>(limits.perSourcePerSecond));
  // Other sources are not held back by that one, but all share the total.
  now_ += 1'000;
  replied = 0;
  for (int i = 0; i < 300; ++i) {
    replied +=
        ping("10.8." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1)).verdict ==
        Verdict::Reply;
  }
  EXPECT_EQ(replied, static_cast<int>(limits.burst));
  // Too-big packets' "fragmentation needed" replies count against the same buckets.
  now_ += 10'000;
  replied = 0;
  std::uint64_t mtuDrops = 0;
  for (int i = 0; i < 40; ++i) {
    Frame big(PacketBuilder()
                  .ipv4("10.9.0.2", "192.0.2.10")
                  .tcp(7000, 5000, kTcpAck)
                  .payload(1500 - 40)
                  .build());
    const auto r = steer(big);
    replied += r.verdict == Verdict::Reply;
    mtuDrops += r.drop == DropReason::IcmpRateLimited;
  }
  EXPECT_EQ(replied, static_cast<int>(limits.perSourceBurst));
  EXPECT_EQ(mtuDrops, 40u - limits.perSourceBurst);
  EXPECT_EQ(steering_.counters().mtuReplies.read(), limits.perSourceBurst);
  expectAllCounted();
}

TEST_F(SteeringTest, TooBigAfterEncapsulationAnswersFragmentationNeeded) {
  Frame big(PacketBuilder()
                .ipv4("10.9.0.1", "192.0.2.10")
                .tcp(7000, 5000, kTcpAck)
                .payload(1500 - 40)
                .build());
  const auto r = steer(big);
  ASSERT_EQ(r.verdict, Verdict::Reply);
  const auto out = parsePacket(big.out(r));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out.icmpType, kIcmpDestUnreachable);
  EXPECT_EQ(out.icmpCode, kIcmpCodeFragNeeded);
  EXPECT_EQ(out.key.dst, test::ipBytes("10.9.0.1"));
  EXPECT_EQ(steering_.counters().mtuReplies.read(), 1u);
  // Its first packet never reached a backend: the flow is not tracked yet.
  EXPECT_EQ(steering_.counters().newFlows.read(), 0u);
  EXPECT_EQ(steering_.flowTable().counters().occupancy, 0u);
  Frame small(PacketBuilder().ipv4("10.9.0.1", "192.0.2.10").tcp(7000, 5000, kTcpAck).build());
  const auto fwd = steer(small);
  EXPECT_EQ(fwd.verdict, Verdict::Forward);
  EXPECT_TRUE(fwd.newFlow);
  EXPECT_EQ(steering_.counters().newFlows.read(), 1u);
  expectAllCounted();
}

TEST_F(SteeringTest, BurstWithRepeatsAndMixedVerdicts) {
  std::vector<Frame> frames;
  for (int k = 0; k < 3; ++k) {
    frames.emplace_back(syn(100));  // the same new flow three times
    frames.emplace_back(syn(static_cast<std::uint16_t>(200 + k)));
    frames.emplace_back(PacketBuilder().ipv4("10.9.0.1", "10.0.0.2").udp(1, 53).build());
  }
  std::vector<FrameRef> refs;
  for (auto& f : frames) refs.push_back(f.ref);
  std::vector<SteerResult> results(refs.size());
  steering_.steerBurst(refs, results, *snapshot_, now_);
  EXPECT_EQ(results[0].backend, results[3].backend);
  EXPECT_EQ(results[0].backend, results[6].backend);
  EXPECT_EQ(steering_.counters().newFlows.read(), 4u);  // flow 100 once, 200..202
  EXPECT_EQ(steering_.counters().toKernel.read(), 3u);
  expectAllCounted();
}

// --- Flow exceptions (flow_exceptions.hpp) ------------------------------------

class SteeringExceptionTest : public SteeringTest {
 protected:
  // The hash of the flow 10.9.0.1:sport -> 192.0.2.10:5000, and a backend the
  // table does not give it.
  std::pair<std::uint64_t, std::uint32_t> flowAndOtherBackend(std::uint16_t sport) {
    Frame f(syn(sport));
    const auto view = parsePacket(f.ref.buffer.subspan(kHeadroom, f.ref.length));
    const std::uint64_t hash = FlowHasher(kSeed).hash(view.key);
    const std::uint32_t table = snapshot_->vips[0].table.lookup(hash);
    return {hash, table % 4 + 1};
  }
  void setExceptions(std::vector<ExceptionEntry> entries) {
    snapshot_->exceptions = std::make_shared<const ExceptionTable>(entries);
  }
};

TEST_F(SteeringExceptionTest, UntrackedMidFlowPacketGoesWhereTheExceptionSays) {
  const auto [hash, other] = flowAndOtherBackend(41000);
  ASSERT_NE(other, snapshot_->vips[0].table.lookup(hash));
  setExceptions({{hash, other, FlowState::Established}});
  Frame f(syn(41000, kTcpAck));
  const SteerResult r = steer(f);
  ASSERT_EQ(r.verdict, Verdict::Forward);
  EXPECT_EQ(r.backend, other);
  EXPECT_EQ(steering_.counters().exceptionHits.read(), 1u);
  // Now tracked on that backend: the next packet is a flow-table hit.
  EXPECT_EQ(trackedBackend(steering_, hash, now_), other);
  Frame g(syn(41000, kTcpAck));
  EXPECT_EQ(steer(g).backend, other);
  EXPECT_EQ(steering_.counters().exceptionHits.read(), 1u);
  expectAllCounted();
}

// A flows.ckpt written by the previous version (6630b7c, before the flow
// table got its own hash; tests/data/checkpoint/README.md) keeps its flows:
// each goes to its recorded backend, not its table slot's, and what the flow
// table then exports encodes back to the file's very bytes. The identity
// hash, the record layout and the seed tag are all unchanged.
TEST_F(SteeringExceptionTest, PreviousVersionCheckpointKeepsItsFlows) {
  std::ifstream in(
      std::string(SPILLWAY_SOURCE_ROOT) + "/tests/data/checkpoint/flows-v1-6630b7c.ckpt",
      std::ios::binary);
  ASSERT_TRUE(in.good());
  const std::string fixture((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto decoded = decodeFlowCheckpoint(fixture, kSeed);
  ASSERT_TRUE(std::holds_alternative<FlowCheckpoint>(decoded)) << std::get<std::string>(decoded);
  const FlowCheckpoint& ckpt = std::get<FlowCheckpoint>(decoded);
  ASSERT_EQ(ckpt.records.size(), 8u);
  std::vector<ExceptionEntry> entries;
  for (const FlowExceptionRecord& rec : ckpt.records) {
    entries.push_back({rec.hash, static_cast<std::uint32_t>(rec.backendId - 1000), rec.state,
                       ExceptionOrigin::Checkpoint});
  }
  setExceptions(entries);
  for (std::uint16_t i = 0; i < 8; ++i) {
    const auto [hash, other] = flowAndOtherBackend(static_cast<std::uint16_t>(43000 + i));
    ASSERT_EQ(hash, ckpt.records[i].hash) << "the identity hash changed";
    ASSERT_NE(snapshot_->vips[0].table.lookup(hash), other);
    Frame f(syn(static_cast<std::uint16_t>(43000 + i), kTcpAck));
    const SteerResult r = steer(f);
    ASSERT_EQ(r.verdict, Verdict::Forward);
    EXPECT_EQ(r.backend, other) << i;
    EXPECT_EQ(snapshot_->backends[r.backend].id, ckpt.records[i].backendId);
  }
  EXPECT_EQ(steering_.counters().exceptionHits.read(), 8u);
  // What the lcore exports (by identity) is what the previous version wrote.
  std::map<std::uint64_t, FlowExceptionRecord> exported;
  steering_.flowTable().forEachLive(
      now_, 0, steering_.flowTable().bucketCount(),
      [&](std::uint64_t id, std::uint32_t backend, FlowState state, std::uint32_t idle,
          std::uint8_t vipTag) {
        if (exportsFlow(*snapshot_, nullptr, id, backend, vipTag)) {
          exported[id] = FlowExceptionRecord{id, snapshot_->backends[backend].id, state, idle};
        }
      });
  std::vector<FlowExceptionRecord> again;
  for (const FlowExceptionRecord& rec : ckpt.records) {
    ASSERT_EQ(exported.count(rec.hash), 1u) << std::hex << rec.hash;
    again.push_back(exported[rec.hash]);
  }
  EXPECT_EQ(encodeFlowCheckpoint(kSeed, ckpt.writtenUnixMs, again), fixture);
  expectAllCounted();
}

TEST_F(SteeringExceptionTest, AdoptionRecordsTheExceptionsOrigin) {
  const auto [peerHash, peerBackend] = flowAndOtherBackend(41020);
  const auto [ckptHash, ckptBackend] = flowAndOtherBackend(41021);
  const auto [rebuiltHash, rebuiltBackend] = flowAndOtherBackend(41022);
  setExceptions({{peerHash, peerBackend, FlowState::Established, ExceptionOrigin::Peer},
                 {ckptHash, ckptBackend, FlowState::Established, ExceptionOrigin::Checkpoint},
                 {rebuiltHash, rebuiltBackend, FlowState::Established, ExceptionOrigin::Backend}});
  Frame a(syn(41020, kTcpAck));
  ASSERT_EQ(steer(a).backend, peerBackend);
  now_ += 7;
  Frame b(syn(41021, kTcpAck));
  ASSERT_EQ(steer(b).backend, ckptBackend);
  now_ += 7;
  Frame c(syn(41022, kTcpAck));
  ASSERT_EQ(steer(c).backend, rebuiltBackend);
  // A flow the table places, and a second packet of an adopted flow (a
  // flow-table hit now): neither is an adoption.
  Frame d(syn(42500, kTcpAck));
  ASSERT_EQ(steer(d).verdict, Verdict::Forward);
  Frame e(syn(41020, kTcpAck));
  ASSERT_EQ(steer(e).backend, peerBackend);

  std::vector<AdoptedFlow> got;
  steering_.adoptedFlows().read(got);
  const std::uint8_t tag = snapshot_->vips[0].tag;
  const Millis t = now_ - 14;
  EXPECT_EQ(got, (std::vector<AdoptedFlow>{
                     {peerHash, peerBackend, ExceptionOrigin::Peer, tag, t},
                     {ckptHash, ckptBackend, ExceptionOrigin::Checkpoint, tag, t + 7},
                     {rebuiltHash, rebuiltBackend, ExceptionOrigin::Backend, tag, t + 14}}));
  EXPECT_EQ(steering_.adoptedFlows().recorded(), 3u);
  const auto& byOrigin = steering_.counters().exceptionHitsByOrigin;
  EXPECT_EQ(byOrigin[static_cast<std::size_t>(ExceptionOrigin::Peer)].read(), 1u);
  EXPECT_EQ(byOrigin[static_cast<std::size_t>(ExceptionOrigin::Checkpoint)].read(), 1u);
  EXPECT_EQ(byOrigin[static_cast<std::size_t>(ExceptionOrigin::Backend)].read(), 1u);
  EXPECT_EQ(byOrigin[static_cast<std::size_t>(ExceptionOrigin::Unknown)].read(), 0u);
  EXPECT_EQ(steering_.counters().exceptionHits.read(), 3u);
  expectAllCounted();
}

TEST_F(SteeringExceptionTest, AnExceptionToAFailedBackendIsNoAdoption) {
  const auto [hash, other] = flowAndOtherBackend(41023);
  std::vector<BackendState> states(4, BackendState::Active);
  states[other - 1] = BackendState::Failed;
  publish(std::vector<std::uint32_t>(4, 100), states);
  setExceptions({{hash, other, FlowState::Established, ExceptionOrigin::Peer}});
  Frame f(syn(41023, kTcpAck));
  ASSERT_EQ(steer(f).verdict, Verdict::Forward);
  std::vector<AdoptedFlow> got;
  steering_.adoptedFlows().read(got);
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(steering_.counters()
                .exceptionHitsByOrigin[static_cast<std::size_t>(ExceptionOrigin::Peer)]
                .read(),
            0u);
}

TEST_F(SteeringExceptionTest, ExceptionFlowIsTrackedWithItsRecordedStateNotAsEmbryonic) {
  const auto [hash, other] = flowAndOtherBackend(41010);
  setExceptions({{hash, other, FlowState::Established}});
  Frame f(syn(41010, kTcpAck));
  ASSERT_EQ(steer(f).backend, other);
  // A sparse flow: its next packet comes after the embryonic timeout (5 s)
  // but well within the established one.
  now_ += 60'000;
  EXPECT_EQ(trackedBackend(steering_, hash, now_), other);
  // A new flow's mid-flow first packet is still embryonic (unsolicited ACKs
  // cannot pin the table).
  Frame g(syn(41011, kTcpAck));
  const SteerResult r = steer(g);
  now_ += 60'000;
  const auto view = parsePacket(g.ref.buffer.subspan(kHeadroom, g.ref.length));
  EXPECT_NE(r.backend, 0u);
  EXPECT_EQ(trackedBackend(steering_, FlowHasher(kSeed).hash(view.key), now_), 0u);
}

TEST_F(SteeringExceptionTest, OtherFlowsFollowTheTable) {
  const auto [hash, other] = flowAndOtherBackend(41001);
  setExceptions({{hash, other, FlowState::Established}});
  for (std::uint16_t port = 42000; port < 42100; ++port) {
    if (port == 41001) continue;
    Frame f(syn(port, kTcpAck));
    const auto view = parsePacket(f.ref.buffer.subspan(kHeadroom, f.ref.length));
    const SteerResult r = steer(f);
    ASSERT_EQ(r.verdict, Verdict::Forward);
    EXPECT_EQ(r.backend, snapshot_->vips[0].table.lookup(FlowHasher(kSeed).hash(view.key)));
  }
  EXPECT_EQ(steering_.counters().exceptionHits.read(), 0u);
}

TEST_F(SteeringExceptionTest, ExceptionToABackendThatTakesNoFlowsIsIgnored) {
  const auto [hash, other] = flowAndOtherBackend(41002);
  std::vector<BackendState> states(4, BackendState::Active);
  states[other - 1] = BackendState::Failed;
  publish(std::vector<std::uint32_t>(4, 100), states);
  setExceptions({{hash, other, FlowState::Established}});
  Frame f(syn(41002, kTcpAck));
  const SteerResult r = steer(f);
  ASSERT_EQ(r.verdict, Verdict::Forward);
  EXPECT_NE(r.backend, other);
  EXPECT_EQ(r.backend, snapshot_->vips[0].table.lookup(hash));
  EXPECT_EQ(steering_.counters().exceptionHits.read(), 0u);
}

TEST_F(SteeringExceptionTest, DrainingBackendKeepsItsExceptionButNotANewConnection) {
  const auto [hash, other] = flowAndOtherBackend(41003);
  std::vector<BackendState> states(4, BackendState::Active);
  states[other - 1] = BackendState::Draining;
  publish(std::vector<std::uint32_t>(4, 100), states);
  setExceptions({{hash, other, FlowState::Established}});
  Frame syn1(syn(41003));  // a bare SYN: a new connection, goes by the table
  const SteerResult r1 = steer(syn1);
  ASSERT_EQ(r1.verdict, Verdict::Forward);
  EXPECT_EQ(r1.backend, snapshot_->vips[0].table.lookup(hash));
  // A mid-flow packet of a flow that is not tracked keeps the draining backend.
  steering_.flowTable().clear();
  Frame ack(syn(41003, kTcpAck));
  EXPECT_EQ(steer(ack).backend, other);
}

TEST_F(SteeringExceptionTest, BareSynReusingAClosingFlowFollowsTheTable) {
  const auto [hash, other] = flowAndOtherBackend(41004);
  setExceptions({{hash, other, FlowState::Closing}});
  Frame f(syn(41004));
  const SteerResult r = steer(f);
  EXPECT_EQ(r.backend, snapshot_->vips[0].table.lookup(hash));
  Frame g(syn(41005, kTcpAck | kTcpFin));
  EXPECT_EQ(steer(g).verdict, Verdict::Forward);
}

TEST_F(SteeringExceptionTest, TrackedEntryWinsOverTheException) {
  const auto [hash, other] = flowAndOtherBackend(41006);
  Frame f(syn(41006));
  const std::uint32_t tracked = steer(f).backend;
  setExceptions({{hash, other, FlowState::Established}});
  Frame g(syn(41006, kTcpAck));
  EXPECT_EQ(steer(g).backend, tracked);
}

TEST_F(SteeringExceptionTest, ClassificationAgainstTheTables) {
  snapshot_->vipsOfBackend.assign(6, {});
  for (std::uint32_t b = 1; b <= 4; ++b) snapshot_->vipsOfBackend[b] = {0, 1};
  const auto [hash, other] = flowAndOtherBackend(41007);
  const std::uint32_t table = snapshot_->vips[0].table.lookup(hash);
  ASSERT_NE(snapshot_->vips[0].tag, snapshot_->vips[1].tag);
  const std::uint8_t nccl = snapshot_->vips[0].tag;
  EXPECT_FALSE(isTableException(*snapshot_, hash, table, nccl));
  EXPECT_TRUE(isTableException(*snapshot_, hash, other, nccl));
  EXPECT_TRUE(isTableException(*snapshot_, hash, 5, nccl));   // in no table
  EXPECT_TRUE(isTableException(*snapshot_, hash, 99, nccl));  // unknown index
  // Placed by the other VIP: judged by that VIP's table alone.
  const std::uint32_t grpc = snapshot_->vips[1].table.lookup(hash);
  EXPECT_FALSE(isTableException(*snapshot_, hash, grpc, snapshot_->vips[1].tag));
  // Unknown tag: not an exception only when both tables agree.
  EXPECT_EQ(isTableException(*snapshot_, hash, table, 0), grpc != table);
}

TEST_F(SteeringExceptionTest, TrackedFlowsCarryTheirVipTag) {
  Frame f(syn(41008));
  const SteerResult r = steer(f);
  ASSERT_EQ(r.verdict, Verdict::Forward);
  std::size_t seen = 0;
  steering_.flowTable().forEachLive(
      now_, 0, steering_.flowTable().bucketCount(),
      [&](std::uint64_t, std::uint32_t backend, FlowState, std::uint32_t, std::uint8_t tag) {
        EXPECT_EQ(backend, r.backend);
        EXPECT_EQ(tag, snapshot_->vips[0].tag);
        ++seen;
      });
  EXPECT_EQ(seen, 1u);
}

// ---- second chance (issue #24) --------------------------------------------

// The IPv4 VIP's backends speak GUE, and every slot of its table names a
// previous owner: the backend after the table's (index % 4 + 1).
class SteeringSecondChanceTest : public SteeringExceptionTest {
 protected:
  void SetUp() override {
    SteeringTest::SetUp();
    useGue(EncapKind::Gue4);
  }
  void useGue(EncapKind kind) {
    for (std::size_t i = 1; i < snapshot_->backends.size(); ++i) {
      snapshot_->backends[i].encap.kind = kind;
    }
    const auto entries = snapshot_->vips[0].table.entries();
    auto owners = std::make_shared<std::vector<std::uint32_t>>(entries.size());
    for (std::size_t slot = 0; slot < entries.size(); ++slot) {
      (*owners)[slot] = entries[slot] % 4 + 1;
    }
    snapshot_->vips[0].previousOwner = std::move(owners);
    snapshot_->indexVips();  // the backends changed: their encapsulation templates too
  }
  // The hop address in a GUE frame, if it carries one.
  static std::optional<IpBytes> hopOf(std::span<const std::byte> out) {
    const std::size_t gueAt = 14 + 20 + 8;
    const auto hlen = std::to_integer<unsigned>(out[gueAt]) & 0x1f;
    if (hlen == 0) return std::nullopt;
    EXPECT_EQ(hlen, 2u);
    EXPECT_EQ(std::to_integer<unsigned>(out[gueAt + 4]), kSecondChanceType);
    IpBytes hop{};
    std::copy_n(out.begin() + gueAt + 8, 4, hop.begin());
    return hop;
  }
  std::uint32_t previousOf(std::uint64_t hash) const {
    return snapshot_->vips[0].previousOwnerOf(hash);
  }
};

TEST_F(SteeringSecondChanceTest, UntrackedMidFlowPacketNamesThePreviousOwnerAndStaysUntracked) {
  const auto [hash, other] = flowAndOtherBackend(42000);
  (void)other;
  const std::uint32_t table = snapshot_->vips[0].table.lookup(hash);
  const std::uint32_t previous = previousOf(hash);
  ASSERT_NE(previous, table);
  for (int i = 0; i < 3; ++i) {
    Frame f(syn(42000, kTcpAck));
    const SteerResult r = steer(f);
    ASSERT_EQ(r.verdict, Verdict::Forward) << dropReasonName(r.drop);
    EXPECT_EQ(r.backend, table) << "the table's backend decides first";
    EXPECT_TRUE(r.secondChance);
    EXPECT_FALSE(r.newFlow);
    const auto hop = hopOf(f.out(r));
    ASSERT_TRUE(hop.has_value());
    EXPECT_EQ(*hop, snapshot_->backends[previous].encap.backend);
    EXPECT_EQ(trackedBackend(steering_, hash, now_), 0u)
        << "not tracked: every packet of the flow carries the hop";
  }
  EXPECT_EQ(steering_.counters().secondChanceSent.read(), 3u);
  EXPECT_EQ(steering_.counters().secondChanceUnsent.read(), 0u);
  EXPECT_EQ(steering_.counters().newFlows.read(), 0u);
  expectAllCounted();
}

TEST_F(SteeringSecondChanceTest, SynTrackedFlowsUdpAndExceptionsCarryNoHop) {
  // A SYN: a new connection, placed by the table and tracked.
  Frame s1(syn(42100));
  const SteerResult r1 = steer(s1);
  ASSERT_EQ(r1.verdict, Verdict::Forward);
  EXPECT_FALSE(r1.secondChance);
  EXPECT_FALSE(hopOf(s1.out(r1)).has_value());
  // Its next packets hit the flow table: no hop.
  Frame s2(syn(42100, kTcpAck));
  const SteerResult r2 = steer(s2);
  EXPECT_FALSE(r2.secondChance);
  EXPECT_FALSE(hopOf(s2.out(r2)).has_value());
  // UDP keeps no socket state the backend could check.
  SnapshotVip udp = snapshot_->vips[0];
  udp.key.proto = 17;
  udp.name = "udp";
  udp.tag = vipTagOf(udp.key);
  snapshot_->vips.push_back(udp);
  snapshot_->indexVips();
  Frame u(PacketBuilder().ipv4("10.9.0.1", "192.0.2.10").udp(4000, 5000).payload(8).build());
  const SteerResult ru = steer(u);
  ASSERT_EQ(ru.verdict, Verdict::Forward) << dropReasonName(ru.drop);
  EXPECT_FALSE(ru.secondChance);
  // An exception knows the backend: no hop.
  const auto [hash, other] = flowAndOtherBackend(42200);
  setExceptions({{hash, other, FlowState::Established}});
  Frame e(syn(42200, kTcpAck));
  const SteerResult re = steer(e);
  ASSERT_EQ(re.backend, other);
  EXPECT_FALSE(re.secondChance);
  EXPECT_EQ(steering_.counters().secondChanceSent.read(), 0u);
  expectAllCounted();
}

TEST_F(SteeringSecondChanceTest, NoHopWherePreviousOwnerTakesNoFlowsOrSlotUnchanged) {
  const auto [hash, other] = flowAndOtherBackend(42300);
  (void)other;
  const std::uint32_t previous = previousOf(hash);
  snapshot_->backends[previous].state = BackendState::Failed;
  Frame f(syn(42300, kTcpAck));
  const SteerResult r = steer(f);
  ASSERT_EQ(r.verdict, Verdict::Forward);
  EXPECT_FALSE(r.secondChance);
  EXPECT_NE(trackedBackend(steering_, hash, now_), 0u) << "tracked as before";
  // A slot without history (previous 0): nothing.
  snapshot_->vips[0].previousOwner.reset();
  Frame g(syn(42301, kTcpAck));
  EXPECT_FALSE(steer(g).secondChance);
  EXPECT_EQ(steering_.counters().secondChanceSent.read(), 0u);
  EXPECT_EQ(steering_.counters().secondChanceUnsent.read(), 0u);
}

TEST_F(SteeringSecondChanceTest, IpInIpCannotCarryItAndCountsThePacket) {
  useGue(EncapKind::IpInIp4);
  const auto [hash, other] = flowAndOtherBackend(42400);
  (void)other;
  Frame f(syn(42400, kTcpAck));
  const SteerResult r = steer(f);
  ASSERT_EQ(r.verdict, Verdict::Forward);
  EXPECT_FALSE(r.secondChance);
  EXPECT_EQ(steering_.counters().secondChanceUnsent.read(), 1u);
  EXPECT_EQ(trackedBackend(steering_, hash, now_), r.backend) << "tracked as before";
}

TEST(ExceptionTable, FindsWhatItHoldsAndNothingElse) {
  std::vector<ExceptionEntry> entries;
  for (std::uint64_t i = 0; i < 5000; ++i) {
    entries.push_back({i * 0x9e3779b97f4a7c15ULL, static_cast<std::uint32_t>(i % 7 + 1),
                       i % 2 ? FlowState::Established : FlowState::Udp});
  }
  entries.push_back({0, 0, FlowState::Established});            // backend 0: skipped
  entries.push_back({entries[3].hash, 9, FlowState::Closing});  // later one wins
  const ExceptionTable t(entries);
  EXPECT_EQ(t.size(), 5000u);
  for (std::uint64_t i = 0; i < 5000; ++i) {
    const auto hit = t.find(i * 0x9e3779b97f4a7c15ULL);
    if (i == 3) {
      EXPECT_EQ(hit.backend, 9u);
      EXPECT_EQ(hit.state, FlowState::Closing);
      continue;
    }
    EXPECT_EQ(hit.backend, i % 7 + 1) << i;
    EXPECT_EQ(hit.state, i % 2 ? FlowState::Established : FlowState::Udp);
  }
  EXPECT_EQ(t.find(12345).backend, 0u);
  EXPECT_EQ(ExceptionTable().find(0).backend, 0u);
  // Every hit says where the entry came from; the default is unknown.
  EXPECT_EQ(t.find(entries[5].hash).origin, ExceptionOrigin::Unknown);
  const ExceptionTable tagged(
      std::vector<ExceptionEntry>{{11, 2, FlowState::Established, ExceptionOrigin::Peer},
                                  {12, 3, FlowState::Udp, ExceptionOrigin::Checkpoint},
                                  {13, 4, FlowState::Established, ExceptionOrigin::Backend}});
  EXPECT_EQ(tagged.find(11).origin, ExceptionOrigin::Peer);
  EXPECT_EQ(tagged.find(12).origin, ExceptionOrigin::Checkpoint);
  EXPECT_EQ(tagged.find(13).origin, ExceptionOrigin::Backend);
  EXPECT_EQ(tagged.find(13).backend, 4u);
  // Hash 0 is stored as 1, as in the flow table.
  const ExceptionTable zero(std::vector<ExceptionEntry>{{0, 4, FlowState::Established}});
  EXPECT_EQ(zero.find(0).backend, 4u);
  EXPECT_EQ(zero.find(1).backend, 4u);
}

// The filter in front of the slots (flow_exceptions.hpp): never says no to a
// flow the table holds, and stops most of the others before the slots. With
// 100,000 exceptions, a few per cent of 200,000 other flows pass it (two bits
// in a word of 64, at most 8 entries a word: ~5 % expected).
TEST(ExceptionTable, FilterPassesEveryHeldFlowAndFewOthers) {
  std::mt19937_64 rng(5);
  std::vector<ExceptionEntry> entries;
  for (int i = 0; i < 100'000; ++i) entries.push_back({rng(), 3, FlowState::Established});
  const ExceptionTable t(entries);
  for (const ExceptionEntry& e : entries) {
    ASSERT_TRUE(t.mayHold(e.hash));
    ASSERT_EQ(t.find(e.hash).backend, 3u);
  }
  std::size_t passed = 0;
  for (int i = 0; i < 200'000; ++i) {
    const std::uint64_t other = rng();
    passed += t.mayHold(other);
    ASSERT_EQ(t.find(other).backend, 0u);
  }
  EXPECT_LT(passed, 200'000u / 10);
  EXPECT_FALSE(ExceptionTable().mayHold(entries[0].hash));
}

TEST(FlowTableWalk, ForEachLiveVisitsExactlyTheLiveEntries) {
  FlowTable t(FlowTableConfig{.capacity = 4096});
  std::map<std::uint64_t, std::uint32_t> oracle;
  for (std::uint64_t i = 1; i <= 2000; ++i) {
    const std::uint64_t h = i * 0xc2b2ae3d27d4eb4fULL;
    ASSERT_EQ(t.insert(h, static_cast<std::uint32_t>(i % 50 + 1),
                       i % 3 == 0 ? FlowState::Closing : FlowState::Established, 1000,
                       h % 7 == 0 ? 0 : 5),
              InsertResult::Inserted);
    if (i % 3 != 0) oracle[h | (h == 0)] = static_cast<std::uint32_t>(i % 50 + 1);
  }
  // 20 s later the closing entries (10 s timeout) are gone.
  std::map<std::uint64_t, std::uint32_t> seen;
  std::size_t live = 0;
  for (std::size_t b = 0; b < t.bucketCount(); b += 100) {
    live += t.forEachLive(21'000, b, 100,
                          [&](std::uint64_t h, std::uint32_t backend, FlowState s,
                              std::uint32_t idle, std::uint8_t tag) {
                            EXPECT_EQ(tag, h % 7 == 0 ? 0 : 5);
                            EXPECT_EQ(s, FlowState::Established);
                            EXPECT_EQ(idle, 20'000u);
                            seen[h] = backend;
                          });
  }
  EXPECT_EQ(live, seen.size());
  EXPECT_EQ(seen, oracle);
}

TEST(FlowTableWalk, VipTagSurvivesStateChangesAndResteering) {
  FlowTable t(FlowTableConfig{.capacity = 1024});
  ASSERT_EQ(t.insert(77, 3, FlowState::Embryonic, 1000, 31), InsertResult::Inserted);
  EXPECT_EQ(t.insert(78, 3, FlowState::Embryonic, 1000, 32), InsertResult::Invalid);
  EXPECT_EQ(t.lookupAndTouch(77, 1001, FlowEvent{kTcpAck}), 3u);  // -> Established
  EXPECT_TRUE(t.updateBackend(77, 9, 1002));
  EXPECT_EQ(t.lookupAndTouch(77, 1003, FlowEvent{kTcpAck | kTcpFin}), 9u);  // -> Ending
  std::size_t seen = 0;
  t.forEachLive(
      1004, 0, t.bucketCount(),
      [&](std::uint64_t h, std::uint32_t b, FlowState s, std::uint32_t idle, std::uint8_t tag) {
        EXPECT_EQ(h, 77u);
        EXPECT_EQ(b, 9u);
        EXPECT_EQ(s, FlowState::Ending);
        EXPECT_EQ(idle, 1u);
        EXPECT_EQ(tag, 31);
        ++seen;
      });
  EXPECT_EQ(seen, 1u);
  // The established timeout applies to Ending, whatever the tag bits.
  const Millis established = t.timeouts().established;
  EXPECT_EQ(t.lookup(77, 1003 + established), 9u);
  EXPECT_EQ(t.lookup(77, 1003 + 2 * established + 1), 0u);
}

TEST(VipTag, StableKeyFunctionInRange) {
  VipKey a{test::ipBytes("192.0.2.10"), IpVersion::V4, 6, 0};
  VipKey b = a;
  b.port = 443;
  for (std::uint16_t port = 0; port < 2000; ++port) {
    b.port = port;
    const std::uint8_t t = vipTagOf(b);
    EXPECT_GE(t, 1);
    EXPECT_LE(t, FlowTable::kMaxVipTag);
  }
  EXPECT_EQ(vipTagOf(a), vipTagOf(VipKey{test::ipBytes("192.0.2.10"), IpVersion::V4, 6, 0}));
}

// --- Adopted flows (adopted_flows.hpp) --------------------------------------

AdoptedFlow adoption(std::uint64_t n) {
  return AdoptedFlow{n * 0x9e3779b97f4a7c15ULL, static_cast<std::uint32_t>(n % 1000 + 1),
                     static_cast<ExceptionOrigin>(n % kExceptionOriginCount),
                     static_cast<std::uint8_t>(n % 31 + 1), n * 3};
}

TEST(AdoptedFlowRing, KeepsTheLastCapacityRecordsOldestFirst) {
  AdoptedFlowRing ring;
  std::vector<AdoptedFlow> got;
  ring.read(got);
  EXPECT_TRUE(got.empty());
  for (std::uint64_t n = 0; n < 10; ++n) ring.record(adoption(n));
  ring.read(got);
  ASSERT_EQ(got.size(), 10u);
  for (std::uint64_t n = 0; n < 10; ++n) EXPECT_EQ(got[n], adoption(n));
  // Past its capacity it wraps: the oldest go, the order stays.
  const std::uint64_t total = AdoptedFlowRing::kCapacity * 2 + 37;
  for (std::uint64_t n = 10; n < total; ++n) ring.record(adoption(n));
  EXPECT_EQ(ring.recorded(), total);
  got.clear();
  got.push_back(adoption(999'999));  // read() appends
  ring.read(got);
  ASSERT_EQ(got.size(), AdoptedFlowRing::kCapacity + 1);
  EXPECT_EQ(got[0], adoption(999'999));
  for (std::size_t i = 1; i < got.size(); ++i) {
    EXPECT_EQ(got[i], adoption(total - AdoptedFlowRing::kCapacity + i - 1)) << i;
  }
}

// A reader beside the writer (the control thread beside the lcore) sees only
// whole records, in order, never one half overwritten. No timing: the writer
// waits for a read to finish after every kBatch records (a handshake, not a
// clock), so a read overlaps at most two batches of writes and must keep
// the rest of a full ring; whatever the interleaving, every record read must
// be one that was written.
TEST(AdoptedFlowRing, AReaderBesideTheWriterSeesOnlyWholeRecords) {
  AdoptedFlowRing ring;
  constexpr std::uint64_t kWrites = 50'000;
  constexpr std::uint64_t kBatch = 128;
  std::atomic<std::uint64_t> readsDone{0};
  std::atomic<bool> readerGone{false};
  std::thread writer([&] {
    for (std::uint64_t n = 0; n < kWrites; ++n) {
      ring.record(adoption(n));
      if ((n + 1) % kBatch != 0 || n + 1 == kWrites) continue;
      const std::uint64_t k = readsDone.load(std::memory_order_acquire);
      while (readsDone.load(std::memory_order_acquire) == k && !readerGone.load()) {
        std::this_thread::yield();
      }
    }
  });
  std::uint64_t reads = 0;
  std::uint64_t seen = 0;
  std::vector<AdoptedFlow> got;
  bool ok = true;
  while (ok && ring.recorded() < kWrites) {
    got.clear();
    const std::uint64_t before = ring.recorded();
    ring.read(got);
    ++reads;
    readsDone.store(reads, std::memory_order_release);
    ok = got.size() <= AdoptedFlowRing::kCapacity &&
         got.size() + 2 * kBatch + 1 >= std::min<std::uint64_t>(before, AdoptedFlowRing::kCapacity);
    EXPECT_TRUE(ok) << got.size() << " records of " << before << " at read " << reads;
    for (std::size_t i = 0; ok && i < got.size(); ++i) {
      const std::uint64_t n = got[i].at / 3;
      ok = got[i] == adoption(n) && (i == 0 || n == got[i - 1].at / 3 + 1);
      EXPECT_TRUE(ok) << "a torn or misplaced record at read " << reads;
    }
    seen += got.size();
  }
  readerGone.store(true);
  writer.join();
  EXPECT_GT(seen, 0u);
  got.clear();
  ring.read(got);
  ASSERT_EQ(got.size(), AdoptedFlowRing::kCapacity);
  EXPECT_EQ(got.back(), adoption(kWrites - 1));
  std::printf("%llu reads beside the writer, %llu records checked\n",
              static_cast<unsigned long long>(reads), static_cast<unsigned long long>(seen));
}

}  // namespace
}  // namespace spillway
