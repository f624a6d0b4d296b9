// spillway_decap.bpf.o under BPF_PROG_TEST_RUN: the backend's second-chance
// decisions (issue #24) on frames written by the load balancer's own encap
// writer, against real sockets of a private network namespace.
//
//  - a non-SYN TCP packet with a hop and no local socket (nothing, or only a
//    listener) is sent on: XDP_TX, outer source ours, destination the hop,
//    TTL / hop limit minus one, private data marked redirected, IPv4 header
//    and UDP checksums valid;
//  - it stays (decapsulated, XDP_PASS) with an established socket, as a SYN,
//    as UDP, from an unknown outer source, or when already redirected;
//  - malformed private data is counted as malformed and passed untouched.
//
// Needs root (skips, 77, without it); a program that does not load fails. With --bench it times the
// program instead (tests/bench/README, ns per packet from the kernel's own repeat loop), asserting
// nothing.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "../unit/packet_builder.hpp"  // the unit tests' frame builder
#include "spillway/checksum.hpp"
#include "spillway/encap.hpp"
#include "spillway/packet.hpp"
#include "spillway_decap_abi.h"

namespace spillway {
namespace {

using test::ipBytes;
using test::PacketBuilder;

constexpr const char* kLb4 = "10.1.0.1";
constexpr const char* kOwn4 = "10.2.0.20";
constexpr const char* kHop4 = "10.2.0.99";
constexpr const char* kLb6 = "fd00:1::1";
constexpr const char* kOwn6 = "fd00:2::20";
constexpr const char* kHop6 = "fd00:2::99";
constexpr std::uint16_t kGuePort = 6080;
constexpr MacAddress kLbMac{2, 0, 0, 0, 1, 1};
constexpr MacAddress kOurMac{2, 0, 0, 0, 2, 2};

struct Program {
  bpf_object* object = nullptr;
  int prog = -1;
  int counters = -1;
  int scFlows = -1;
  std::string error;

  bool load() {
    object = bpf_object__open_file(SPILLWAY_DECAP_BPF_OBJECT, nullptr);
    if (object == nullptr) {
      error = "cannot open " SPILLWAY_DECAP_BPF_OBJECT;
      return false;
    }
    if (const int err = bpf_object__load(object); err != 0) {
      error = "cannot load the program: " + std::string(std::strerror(-err));
      return false;
    }
    prog = bpf_program__fd(bpf_object__find_program_by_name(object, SPILLWAY_DECAP_PROG_NAME));
    counters = bpf_object__find_map_fd_by_name(object, SPILLWAY_DECAP_MAP_COUNTERS);
    scFlows = bpf_object__find_map_fd_by_name(object, SPILLWAY_DECAP_MAP_SC_FLOWS);
    if (scFlows < 0) {
      error = "no " SPILLWAY_DECAP_MAP_SC_FLOWS " map in the object";
      return false;
    }
    const int addrs = bpf_object__find_map_fd_by_name(object, SPILLWAY_DECAP_MAP_ADDRS);
    const int lbs = bpf_object__find_map_fd_by_name(object, SPILLWAY_DECAP_MAP_LBS);
    const int config = bpf_object__find_map_fd_by_name(object, SPILLWAY_DECAP_MAP_CONFIG);
    const std::uint8_t one = 1;
    for (const char* a : {kOwn4, kOwn6}) {
      const DecapAddressKey key = keyOf(a);
      if (bpf_map_update_elem(addrs, &key, &one, BPF_ANY) != 0) {
        error = std::string("cannot fill " SPILLWAY_DECAP_MAP_ADDRS ": ") + std::strerror(errno);
        return false;
      }
    }
    for (const char* a : {kLb4, kLb6}) {
      const DecapAddressKey key = keyOf(a);
      if (bpf_map_update_elem(lbs, &key, &one, BPF_ANY) != 0) {
        error = std::string("cannot fill " SPILLWAY_DECAP_MAP_LBS ": ") + std::strerror(errno);
        return false;
      }
    }
    const std::uint32_t zero = 0;
    DecapConfig c{};
    c.guePort = kGuePort;
    if (bpf_map_update_elem(config, &zero, &c, BPF_ANY) != 0) {
      error = std::string("cannot fill " SPILLWAY_DECAP_MAP_CONFIG ": ") + std::strerror(errno);
      return false;
    }
    return true;
  }

  static DecapAddressKey keyOf(const char* text) {
    DecapAddressKey key{};
    const bool v6 = std::strchr(text, ':') != nullptr;
    key.family = v6 ? kDecapFamilyIpv6 : kDecapFamilyIpv4;
    inet_pton(v6 ? AF_INET6 : AF_INET, text, key.addr);
    return key;
  }

  // Sum over CPUs of one counter's packets.
  std::uint64_t counter(std::uint32_t index) const {
    const int cpus = libbpf_num_possible_cpus();
    std::vector<DecapCounterValue> values(static_cast<std::size_t>(cpus));
    if (bpf_map_lookup_elem(counters, &index, values.data()) != 0) return ~0ULL;
    std::uint64_t n = 0;
    for (const auto& v : values) n += v.packets;
    return n;
  }

  // decap_sc_flows' record of a redirected flow (inner tuple), if any.
  std::optional<DecapFlowValue> redirected(const char* src, std::uint16_t sport, const char* dst,
                                           std::uint16_t dport) const {
    DecapFlowKey key{};
    const DecapAddressKey s = keyOf(src);
    const DecapAddressKey d = keyOf(dst);
    key.family = s.family;
    std::memcpy(key.saddr, s.addr, 16);
    std::memcpy(key.daddr, d.addr, 16);
    key.sport = htons(sport);
    key.dport = htons(dport);
    DecapFlowValue v{};
    if (bpf_map_lookup_elem(scFlows, &key, &v) != 0) return std::nullopt;
    return v;
  }
  std::size_t redirectedFlows() const {
    DecapFlowKey key{}, next{};
    const void* previous = nullptr;
    std::size_t n = 0;
    while (bpf_map_get_next_key(scFlows, previous, &next) == 0) {
      key = next;
      previous = &key;
      ++n;
    }
    return n;
  }

  struct Run {
    int retval = -1;
    std::vector<std::byte> out;
    std::uint32_t durationNs = 0;
  };
  Run run(const std::vector<std::byte>& frame, int repeat = 1) const {
    Run r;
    r.out.resize(frame.size() + 256);
    LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = frame.data(), .data_out = r.out.data(),
                .data_size_in = static_cast<__u32>(frame.size()),
                .data_size_out = static_cast<__u32>(r.out.size()), .repeat = repeat);
    if (bpf_prog_test_run_opts(prog, &opts) != 0) return r;
    r.retval = static_cast<int>(opts.retval);
    r.out.resize(opts.data_size_out);
    r.durationNs = opts.duration;
    return r;
  }
};

Program* gProgram = nullptr;

// The load balancer's frame: the client packet `inner` (an Ethernet frame)
// encapsulated by encapsulateAny() for this backend, with `hop` when given.
std::vector<std::byte> encapsulated(const std::vector<std::byte>& inner, EncapKind kind,
                                    const char* hop, const char* lb = nullptr) {
  const bool v4 = outerIpVersion(kind) == IpVersion::V4;
  EncapTarget t;
  t.kind = kind;
  t.source = ipBytes(lb != nullptr ? lb : (v4 ? kLb4 : kLb6));
  t.backend = ipBytes(v4 ? kOwn4 : kOwn6);
  t.nextHopMac = kOurMac;
  t.ourMac = kLbMac;
  t.gueDstPort = kGuePort;
  std::vector<std::byte> buffer(128, std::byte{0});
  buffer.insert(buffer.end(), inner.begin(), inner.end());
  const PacketView view = parsePacket(std::span(buffer).subspan(128));
  EXPECT_TRUE(view.ok());
  const IpBytes hopBytes = hop != nullptr ? ipBytes(hop) : IpBytes{};
  const EncapResult r =
      encapsulateAny(buffer, 128, inner.size(), view, t, 0x1234, hop ? &hopBytes : nullptr);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.hopWritten, hop != nullptr && usesGue(kind));
  return {buffer.begin() + static_cast<std::ptrdiff_t>(r.dataOffset),
          buffer.begin() + static_cast<std::ptrdiff_t>(r.dataOffset + r.frameLength)};
}

std::vector<std::byte> tcp4(std::uint16_t sport, std::uint16_t dport, std::uint8_t flags) {
  return PacketBuilder()
      .eth()
      .ipv4("127.0.0.1", "127.0.0.1")
      .tcp(sport, dport, flags)
      .payload(16)
      .build();
}
std::vector<std::byte> tcp6(std::uint16_t sport, std::uint16_t dport, std::uint8_t flags) {
  return PacketBuilder().eth().ipv6("::1", "::1").tcp(sport, dport, flags).payload(16).build();
}

unsigned byteAt(const std::vector<std::byte>& f, std::size_t i) {
  return std::to_integer<unsigned>(f[i]);
}

// A listener and one established connection on 127.0.0.1 and ::1 of the
// test's own network namespace.
struct Sockets {
  int listen4 = -1, client4 = -1, server4 = -1;
  int listen6 = -1, client6 = -1, server6 = -1;
  std::uint16_t port4 = 0, clientPort4 = 0, port6 = 0, clientPort6 = 0;

  static std::uint16_t localPort(int fd) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    return ntohs(ss.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                         : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  }
  bool open() {
    listen4 = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listen4, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return false;
    if (listen(listen4, 8) != 0) return false;
    port4 = localPort(listen4);
    a.sin_port = htons(port4);
    client4 = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(client4, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return false;
    server4 = accept(listen4, nullptr, nullptr);
    clientPort4 = localPort(client4);

    listen6 = socket(AF_INET6, SOCK_STREAM, 0);
    sockaddr_in6 b{};
    b.sin6_family = AF_INET6;
    b.sin6_addr = in6addr_loopback;
    if (bind(listen6, reinterpret_cast<sockaddr*>(&b), sizeof b) != 0) return false;
    if (listen(listen6, 8) != 0) return false;
    port6 = localPort(listen6);
    b.sin6_port = htons(port6);
    client6 = socket(AF_INET6, SOCK_STREAM, 0);
    if (connect(client6, reinterpret_cast<sockaddr*>(&b), sizeof b) != 0) return false;
    server6 = accept(listen6, nullptr, nullptr);
    clientPort6 = localPort(client6);
    return server4 >= 0 && server6 >= 0;
  }
};

Sockets gSockets;

class DecapSecondChance : public ::testing::Test {
 protected:
  Program& p = *gProgram;
  Sockets& s = gSockets;

  void expectStays(const std::vector<std::byte>& frame, std::uint32_t scCounter,
                   std::uint16_t innerEtherType) {
    const std::uint64_t before = p.counter(scCounter);
    const auto r = p.run(frame);
    EXPECT_EQ(r.retval, XDP_PASS);
    ASSERT_GE(r.out.size(), 14u);
    EXPECT_EQ((byteAt(r.out, 12) << 8) | byteAt(r.out, 13), innerEtherType)
        << "decapsulated: the inner packet follows the Ethernet header";
    EXPECT_EQ(p.counter(scCounter), before + 1);
  }
};

TEST_F(DecapSecondChance, EstablishedSocketKeepsThePacket) {
  const std::uint64_t gue = p.counter(kDecapGue4In4);
  expectStays(encapsulated(tcp4(s.clientPort4, s.port4, kTcpAck), EncapKind::Gue4, kHop4),
              kDecapScKept, 0x0800);
  EXPECT_EQ(p.counter(kDecapGue4In4), gue + 1) << "counted as decapsulated too";
  expectStays(encapsulated(tcp6(s.clientPort6, s.port6, kTcpAck), EncapKind::Gue6, kHop6),
              kDecapScKept, 0x86dd);
  // IPv6 inner in IPv4 outer.
  expectStays(encapsulated(tcp6(s.clientPort6, s.port6, kTcpAck), EncapKind::Gue4, kHop4),
              kDecapScKept, 0x86dd);
}

TEST_F(DecapSecondChance, SynUdpUnknownSourceAndRedirectedStay) {
  // A SYN to a port nobody serves here still stays: new connections are the
  // table's backend's.
  expectStays(encapsulated(tcp4(40000, 9, kTcpSyn), EncapKind::Gue4, kHop4), kDecapScKept, 0x0800);
  const auto udp =
      PacketBuilder().eth().ipv4("127.0.0.1", "127.0.0.1").udp(5000, 9).payload(8).build();
  expectStays(encapsulated(udp, EncapKind::Gue4, kHop4), kDecapScKept, 0x0800);
  // Not from a known load balancer: no relay for strangers.
  expectStays(encapsulated(tcp4(40001, 9, kTcpAck), EncapKind::Gue4, kHop4, "10.1.0.77"),
              kDecapScUnknownLb, 0x0800);
  expectStays(encapsulated(tcp6(40001, 9, kTcpAck), EncapKind::Gue6, kHop6, "fd00:1::77"),
              kDecapScUnknownLb, 0x86dd);
  // Already sent on once: never again (no loop).
  auto once = encapsulated(tcp4(40002, 9, kTcpAck), EncapKind::Gue4, kHop4);
  once[14 + 20 + 8 + 4 + 2] = std::byte{kSecondChanceRedirected};
  expectStays(once, kDecapScArrived, 0x0800);
}

// One redirected IPv4 frame: what must have changed, and nothing else.
void checkRedirected4(const std::vector<std::byte>& in, const std::vector<std::byte>& out) {
  ASSERT_EQ(out.size(), in.size());
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(out[i], std::byte{kLbMac[i]}) << "back to the MAC it came from";
    EXPECT_EQ(out[6 + i], std::byte{kOurMac[i]});
  }
  const auto ip = std::span(out).subspan(14, 20);
  EXPECT_EQ(internetChecksum(ip), 0) << "outer IPv4 header checksum";
  EXPECT_EQ(byteAt(out, 14 + 8), byteAt(in, 14 + 8) - 1) << "TTL";
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(ip[12 + i], ipBytes(kOwn4)[i]) << "source: this backend";
    EXPECT_EQ(ip[16 + i], ipBytes(kHop4)[i]) << "destination: the hop";
  }
  const std::size_t udpAt = 34;
  const std::size_t udpLength = (byteAt(out, udpAt + 4) << 8) | byteAt(out, udpAt + 5);
  EXPECT_EQ(byteAt(out, udpAt + 8 + 4 + 2), kSecondChanceRedirected) << "marked";
  std::array<std::uint8_t, 4> src{}, dst{};
  for (int i = 0; i < 4; ++i) {
    src[i] = static_cast<std::uint8_t>(byteAt(out, 26 + i));
    dst[i] = static_cast<std::uint8_t>(byteAt(out, 30 + i));
  }
  EXPECT_EQ(checksumFinish(checksumPartial(std::span(out).subspan(udpAt, udpLength),
                                           pseudoHeaderSumV4(src, dst, 17, udpLength))),
            0)
      << "UDP checksum";
  EXPECT_TRUE(std::equal(in.begin() + 14 + 20 + 8 + 12, in.end(), out.begin() + 14 + 20 + 8 + 12))
      << "inner packet untouched";
}

TEST_F(DecapSecondChance, NoSocketOrOnlyAListenerSendsItOnToTheHop) {
  for (const std::uint16_t dport : {std::uint16_t{9}, s.port4}) {
    SCOPED_TRACE(dport == 9 ? "no socket" : "only the listener");
    const auto in = encapsulated(tcp4(40100, dport, kTcpAck | kTcpPsh), EncapKind::Gue4, kHop4);
    const std::uint64_t before = p.counter(kDecapScRedirected);
    const auto r = p.run(in);
    ASSERT_EQ(r.retval, XDP_TX);
    checkRedirected4(in, r.out);
    EXPECT_EQ(p.counter(kDecapScRedirected), before + 1);
    // Recorded by its inner tuple, with the hop it went to.
    const auto rec = p.redirected("127.0.0.1", 40100, "127.0.0.1", dport);
    ASSERT_TRUE(rec.has_value()) << "the redirected flow is in " SPILLWAY_DECAP_MAP_SC_FLOWS;
    EXPECT_EQ(rec->packets, 1u);
    EXPECT_EQ(rec->hopFamily, kDecapFamilyIpv4);
    EXPECT_EQ(std::memcmp(rec->hop, Program::keyOf(kHop4).addr, 16), 0);
    EXPECT_NE(rec->firstNs, 0u);
    EXPECT_EQ(rec->firstNs, rec->lastNs);
    // Where it arrives (as the hop would see it, its own address aside) it
    // is marked: it stays there whatever that host has.
    EXPECT_EQ(r.out[14 + 20 + 8 + 4 + 2], std::byte{kSecondChanceRedirected});
  }
  // FIN and RST of a connection the host does not have go on too.
  const auto rst = encapsulated(tcp4(40101, 9, kTcpRst), EncapKind::Gue4, kHop4);
  EXPECT_EQ(p.run(rst).retval, XDP_TX);
  // The same flow again: one record, its count and last time move.
  const auto again = encapsulated(tcp4(40100, 9, kTcpAck), EncapKind::Gue4, kHop4);
  ASSERT_EQ(p.run(again).retval, XDP_TX);
  const auto rec = p.redirected("127.0.0.1", 40100, "127.0.0.1", 9);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->packets, 2u);
  EXPECT_GE(rec->lastNs, rec->firstNs);
}

TEST_F(DecapSecondChance, OnlyRedirectedFlowsAreRecorded) {
  const std::size_t before = p.redirectedFlows();
  // Kept by its socket, a SYN, from an unknown LB, without a hop: none is
  // recorded.
  ASSERT_EQ(
      p.run(encapsulated(tcp4(s.clientPort4, s.port4, kTcpAck), EncapKind::Gue4, kHop4)).retval,
      XDP_PASS);
  ASSERT_EQ(p.run(encapsulated(tcp4(40300, 9, kTcpSyn), EncapKind::Gue4, kHop4)).retval, XDP_PASS);
  ASSERT_EQ(
      p.run(encapsulated(tcp4(40301, 9, kTcpAck), EncapKind::Gue4, kHop4, "10.1.0.77")).retval,
      XDP_PASS);
  ASSERT_EQ(p.run(encapsulated(tcp4(40302, 9, kTcpAck), EncapKind::Gue4, nullptr)).retval,
            XDP_PASS);
  EXPECT_EQ(p.redirectedFlows(), before);
  EXPECT_FALSE(p.redirected("127.0.0.1", 40300, "127.0.0.1", 9).has_value());
  // An IPv6 flow sent on is recorded with its IPv6 tuple and hop.
  ASSERT_EQ(p.run(encapsulated(tcp6(40303, 9, kTcpAck), EncapKind::Gue6, kHop6)).retval, XDP_TX);
  const auto rec = p.redirected("::1", 40303, "::1", 9);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->hopFamily, kDecapFamilyIpv6);
  EXPECT_EQ(std::memcmp(rec->hop, Program::keyOf(kHop6).addr, 16), 0);
  EXPECT_EQ(p.redirectedFlows(), before + 1);
}

TEST_F(DecapSecondChance, Ipv6OuterIsRewrittenWithItsChecksum) {
  const auto in = encapsulated(tcp6(40200, s.port6, kTcpAck), EncapKind::Gue6, kHop6);
  const auto r = p.run(in);
  ASSERT_EQ(r.retval, XDP_TX);
  ASSERT_EQ(r.out.size(), in.size());
  EXPECT_EQ(byteAt(r.out, 14 + 7), byteAt(in, 14 + 7) - 1) << "hop limit";
  std::array<std::uint8_t, 16> src{}, dst{};
  for (int i = 0; i < 16; ++i) {
    src[i] = static_cast<std::uint8_t>(byteAt(r.out, 22 + i));
    dst[i] = static_cast<std::uint8_t>(byteAt(r.out, 38 + i));
    EXPECT_EQ(r.out[22 + i], ipBytes(kOwn6)[i]);
    EXPECT_EQ(r.out[38 + i], ipBytes(kHop6)[i]);
  }
  const std::size_t udpAt = 54;
  const std::size_t udpLength = (byteAt(r.out, udpAt + 4) << 8) | byteAt(r.out, udpAt + 5);
  EXPECT_EQ(checksumFinish(checksumPartial(std::span(r.out).subspan(udpAt, udpLength),
                                           pseudoHeaderSumV6(src, dst, 17, udpLength))),
            0);
  EXPECT_EQ(byteAt(r.out, udpAt + 8 + 4 + 2), kSecondChanceRedirected);
}

TEST_F(DecapSecondChance, TtlExhaustedStays) {
  auto in = encapsulated(tcp4(40300, 9, kTcpAck), EncapKind::Gue4, kHop4);
  in[14 + 8] = std::byte{1};  // outer TTL (checksum no longer matters here)
  expectStays(in, kDecapScKept, 0x0800);
}

TEST_F(DecapSecondChance, MalformedPrivateDataIsCountedAndPassedUntouched) {
  const auto good = encapsulated(tcp4(40400, 9, kTcpAck), EncapKind::Gue4, kHop4);
  const std::size_t gue = 14 + 20 + 8;
  for (const auto& [offset, value] : std::vector<std::pair<std::size_t, std::uint8_t>>{
           {gue, 3},            // Hlen 3: not the IPv4 size
           {gue, 0x22},         // C bit set
           {gue + 4, 0x11},     // another private-data type
           {gue + 5, 2},        // another version
           {gue + 3, 0x80}}) {  // GUE flags
    auto bad = good;
    bad[offset] = std::byte{value};
    const std::uint64_t before = p.counter(kDecapMalformed);
    const auto r = p.run(bad);
    EXPECT_EQ(r.retval, XDP_PASS) << "offset " << offset;
    EXPECT_EQ(r.out, bad) << "untouched";
    EXPECT_EQ(p.counter(kDecapMalformed), before + 1);
  }
  // A plain GUE frame (no hop) still decapsulates as before.
  const auto plain = encapsulated(tcp4(40401, 9, kTcpAck), EncapKind::Gue4, nullptr);
  const auto r = p.run(plain);
  EXPECT_EQ(r.retval, XDP_PASS);
  EXPECT_EQ(r.out.size(), plain.size() - 32);
}

// --bench: the program's cost per frame from the kernel's repeat loop.
int bench() {
  struct Case {
    const char* name;
    std::vector<std::byte> frame;
  };
  const std::vector<Case> cases = {
      {"not for us (pass_not_local)",
       PacketBuilder().eth().ipv4("10.7.0.1", "10.7.0.2").udp(1, 2).payload(60).build()},
      {"ipip, no hop", encapsulated(tcp4(gSockets.clientPort4, gSockets.port4, kTcpAck),
                                    EncapKind::IpInIp4, nullptr)},
      {"gue4, no hop",
       encapsulated(tcp4(gSockets.clientPort4, gSockets.port4, kTcpAck), EncapKind::Gue4, nullptr)},
      {"gue4 hop, unknown lb (no lookup)",
       encapsulated(tcp4(gSockets.clientPort4, gSockets.port4, kTcpAck), EncapKind::Gue4, kHop4,
                    "10.1.0.77")},
      {"gue4 hop, established (lookup, stays)",
       encapsulated(tcp4(gSockets.clientPort4, gSockets.port4, kTcpAck), EncapKind::Gue4, kHop4)},
      {"gue4 hop, no socket (lookup, redirected)",
       encapsulated(tcp4(40500, 9, kTcpAck), EncapKind::Gue4, kHop4)},
      {"gue6 hop, established (lookup, stays)",
       encapsulated(tcp6(gSockets.clientPort6, gSockets.port6, kTcpAck), EncapKind::Gue6, kHop6)},
      {"gue6 hop, no socket (lookup, redirected)",
       encapsulated(tcp6(40500, 9, kTcpAck), EncapKind::Gue6, kHop6)},
  };
  // The kernel's repeat loop runs the program again on the frame it already
  // rewrote (decapsulated, or marked redirected), so each sample is one run
  // on a fresh copy: the kernel's own timing around that one run, median of
  // kSamples. The timer's own cost is in every figure alike; the differences
  // between the rows are the program's.
  constexpr int kSamples = 20'001;
  std::printf("spillway_decap.bpf.o under BPF_PROG_TEST_RUN: median ns of %d single runs\n",
              kSamples);
  for (const Case& c : cases) {
    std::vector<std::uint32_t> samples;
    samples.reserve(kSamples);
    int retval = -1;
    for (int i = 0; i < kSamples; ++i) {
      const auto r = gProgram->run(c.frame);
      retval = r.retval;
      samples.push_back(r.durationNs);
    }
    std::nth_element(samples.begin(), samples.begin() + kSamples / 2, samples.end());
    std::printf("  %-42s %4u ns  (%3zu bytes, %s)\n", c.name, samples[kSamples / 2], c.frame.size(),
                retval == XDP_TX     ? "XDP_TX"
                : retval == XDP_PASS ? "XDP_PASS"
                                     : "?");
  }
  return 0;
}

bool loopbackUp() {
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  if (ioctl(fd, SIOCGIFFLAGS, &ifr) != 0) return false;
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
  const bool ok = ioctl(fd, SIOCSIFFLAGS, &ifr) == 0;
  close(fd);
  return ok;
}

}  // namespace
}  // namespace spillway

int main(int argc, char** argv) {
  using namespace spillway;
  constexpr int kSkip = 77;
  if (geteuid() != 0) {
    std::puts("SKIP: needs root (BPF_PROG_TEST_RUN, a private network namespace)");
    return kSkip;
  }
  if (unshare(CLONE_NEWNET) != 0 || !loopbackUp()) {
    std::puts("SKIP: no private network namespace with a loopback");
    return kSkip;
  }
  libbpf_set_print([](enum libbpf_print_level level, const char* f, va_list a) {
    return level != LIBBPF_DEBUG || std::getenv("SPILLWAY_LIBBPF_DEBUG")
               ? std::vfprintf(stderr, f, a)
               : 0;
  });
  static Program program;
  if (!program.load()) {  // root has BPF: a program that does not load is a bug
    std::printf("FAIL: %s\n", program.error.c_str());
    return 1;
  }
  gProgram = &program;
  if (!gSockets.open()) {
    std::puts("FAIL: cannot open the test's sockets");
    return 1;
  }
  if (argc > 1 && std::string(argv[1]) == "--bench") return bench();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
