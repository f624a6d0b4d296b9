// Encapsulation writers: golden frames (tests/data/golden), structure and
// checksums of every variant, ECMP entropy, MTU edges, headroom.
#include "spillway/encap.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "golden_file.hpp"
#include "packet_builder.hpp"
#include "spillway/checksum.hpp"
#include "spillway/packet.hpp"
#include "spillway/snapshot.hpp"
#include "spillway/wire.hpp"

namespace spillway {
namespace {

using test::ipBytes;
using test::JsonObject;
using test::PacketBuilder;

constexpr std::size_t kHeadroom = 128;
constexpr std::size_t kTailroom = 64;
constexpr std::byte kHeadroomFill{0xee};
constexpr std::uint64_t kGoldenHash = 0x9e3779b97f4a7c15ULL;
constexpr MacAddress kOurMac{0x02, 0x00, 0x00, 0x00, 0x01, 0x01};
constexpr MacAddress kNextHopMac{0x02, 0x00, 0x00, 0x00, 0x02, 0x02};
constexpr MacAddress kRouterMac{0x02, 0x00, 0x00, 0x00, 0x00, 0x01};
constexpr std::uint8_t kInnerTos = 0xb9;  // DSCP EF (46), ECN ECT(1)
constexpr std::uint32_t kInnerFlowLabel = 0x12345;

constexpr const char* kClient4 = "198.51.100.7";
constexpr const char* kVip4 = "192.0.2.10";
constexpr const char* kClient6 = "2001:db8:c::7";
constexpr const char* kVip6 = "2001:db8:f::10";
constexpr const char* kSource4 = "10.1.0.1";
constexpr const char* kBackend4 = "10.2.0.20";
constexpr const char* kSource6 = "fd00:1::1";
constexpr const char* kBackend6 = "fd00:2::20";

constexpr std::array kKinds = {EncapKind::IpInIp4, EncapKind::IpInIp6, EncapKind::Gue4,
                               EncapKind::Gue6};
constexpr std::array kInnerVersions = {IpVersion::V4, IpVersion::V6};

// A received frame inside a buffer with headroom and tailroom.
struct Buffer {
  std::vector<std::byte> bytes;
  std::size_t dataOffset = 0;
  std::size_t frameLength = 0;

  [[nodiscard]] std::span<std::byte> frame() { return {bytes.data() + dataOffset, frameLength}; }
};

Buffer withHeadroom(const std::vector<std::byte>& frame, std::size_t headroom = kHeadroom) {
  Buffer b;
  b.bytes.assign(headroom, kHeadroomFill);
  b.bytes.insert(b.bytes.end(), frame.begin(), frame.end());
  b.bytes.insert(b.bytes.end(), kTailroom, kHeadroomFill);
  b.dataOffset = headroom;
  b.frameLength = frame.size();
  return b;
}

EncapTarget targetFor(EncapKind kind, std::optional<std::uint16_t> vlan = std::nullopt) {
  EncapTarget t;
  t.kind = kind;
  const bool v4 = outerIpVersion(kind) == IpVersion::V4;
  t.source = ipBytes(v4 ? kSource4 : kSource6);
  t.backend = ipBytes(v4 ? kBackend4 : kBackend6);
  t.nextHopMac = kNextHopMac;
  t.ourMac = kOurMac;
  t.vlanTci = vlan;
  return t;
}

// The client packet to a VIP, as the router hands it to us.
PacketBuilder clientPacket(IpVersion inner, bool udp, std::size_t payload,
                           std::optional<std::uint16_t> vlan = std::nullopt, bool df = true,
                           std::uint8_t ttl = 64) {
  PacketBuilder b;
  b.eth(kOurMac, kRouterMac);
  if (vlan) b.vlan(*vlan);
  if (inner == IpVersion::V4) {
    b.ipv4(kClient4, kVip4, ttl, kInnerTos, df);
  } else {
    b.ipv6(kClient6, kVip6, ttl, kInnerTos, kInnerFlowLabel);
  }
  if (udp) {
    b.udp(40001, 53);
  } else {
    b.tcp(40000, 443, kTcpAck | kTcpPsh, 0x01020304);
  }
  b.payload(payload, 0x5a);
  return b;
}

struct EncapCase {
  std::string name;
  EncapKind kind;
  IpVersion inner;
  std::optional<std::uint16_t> ingressVlan;
  std::optional<std::uint16_t> egressVlan;
  bool udp = false;
  std::size_t padding = 0;  // Ethernet padding after the IP packet
};

void PrintTo(const EncapCase& c, std::ostream* os) {
  *os << c.name;
}

std::vector<EncapCase> goldenCases() {
  std::vector<EncapCase> cases;
  const auto add = [&](const char* stem, EncapKind kind, IpVersion inner, bool udp) {
    cases.push_back({stem, kind, inner, std::nullopt, std::nullopt, udp, 0});
    cases.push_back({std::string(stem) + "_vlan", kind, inner, 100, 200, udp, 0});
  };
  add("ip4in4", EncapKind::IpInIp4, IpVersion::V4, false);
  add("ip6in4", EncapKind::IpInIp4, IpVersion::V6, false);
  add("ip4in6", EncapKind::IpInIp6, IpVersion::V4, false);
  add("ip6in6", EncapKind::IpInIp6, IpVersion::V6, false);
  add("gue4_ip4", EncapKind::Gue4, IpVersion::V4, false);
  add("gue4_ip6", EncapKind::Gue4, IpVersion::V6, true);
  add("gue6_ip4", EncapKind::Gue6, IpVersion::V4, true);
  add("gue6_ip6", EncapKind::Gue6, IpVersion::V6, false);
  cases.push_back({"ip4in4_vlan_in", EncapKind::IpInIp4, IpVersion::V4, 100, std::nullopt, false});
  cases.push_back({"gue6_ip6_vlan_out", EncapKind::Gue6, IpVersion::V6, std::nullopt, 300, true});
  cases.push_back(
      {"ip4in4_padded", EncapKind::IpInIp4, IpVersion::V4, std::nullopt, std::nullopt, true, 18});
  return cases;
}

std::vector<std::byte> inputFrame(const EncapCase& c) {
  auto frame = clientPacket(c.inner, c.udp, c.padding > 0 ? 0 : 32, c.ingressVlan).build();
  frame.insert(frame.end(), c.padding, std::byte{0});
  return frame;
}

std::string hex64(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The decoded fields the output must have, from the case alone; the scapy
// test checks the golden frames against them independently.
std::string expectedJson(const EncapCase& c, const EncapTarget& t, std::uint64_t hash) {
  const IpVersion outer = outerIpVersion(c.kind);
  const bool gue = usesGue(c.kind);
  const bool innerV4 = c.inner == IpVersion::V4;
  const long long innerProto = innerV4 ? 4 : 41;
  const auto innerLength =
      static_cast<long long>((innerV4 ? 20 : 40) + (c.udp ? 8 : 20) + (c.padding > 0 ? 0 : 32));

  JsonObject eth;
  eth.add("src", test::macText(kOurMac)).add("dst", test::macText(kNextHopMac));
  if (c.egressVlan) {
    eth.add("vlan", static_cast<long long>(*c.egressVlan));
  } else {
    eth.addNull("vlan");
  }
  JsonObject ip;
  ip.add("version", static_cast<long long>(outer == IpVersion::V4 ? 4 : 6))
      .add("src", test::ipText(t.source, outer))
      .add("dst", test::ipText(t.backend, outer))
      .add("proto", gue ? 17LL : innerProto)
      .add("ttl", static_cast<long long>(t.outerTtl))
      .add("tos", static_cast<long long>(kInnerTos))
      .add("length", static_cast<long long>(encapOverhead(c.kind)) + innerLength);
  if (outer == IpVersion::V4) {
    ip.add("df", true);
  } else {
    ip.add("flow_label", static_cast<long long>(outerFlowLabel(hash)));
  }
  JsonObject in;
  in.add("version", innerV4 ? 4LL : 6LL)
      .add("src", innerV4 ? kClient4 : kClient6)
      .add("dst", innerV4 ? kVip4 : kVip6)
      .add("proto", c.udp ? 17LL : 6LL)
      .add("sport", c.udp ? 40001LL : 40000LL)
      .add("dport", c.udp ? 53LL : 443LL)
      .add("ttl", 63LL)
      .add("tos", static_cast<long long>(kInnerTos))
      .add("length", innerLength);

  JsonObject j;
  j.add("case", c.name).add("type", "encap").add("encap", std::string(toString(c.kind)));
  j.add("flow_hash", hex64(hash)).add("eth", eth).add("outer", ip);
  if (gue) {
    JsonObject udp;
    udp.add("sport", static_cast<long long>(gueSourcePort(hash)))
        .add("dport", static_cast<long long>(t.gueDstPort));
    JsonObject g;
    g.add("version", 0LL).add("proto", innerProto);
    j.add("udp", udp).add("gue", g);
  } else {
    j.addNull("udp").addNull("gue");
  }
  j.add("inner", in);
  return j.render();
}

std::array<std::uint8_t, 4> addr4(const IpBytes& b) {
  std::array<std::uint8_t, 4> a{};
  for (std::size_t i = 0; i < 4; ++i) a[i] = std::to_integer<std::uint8_t>(b[i]);
  return a;
}
std::array<std::uint8_t, 16> addr16(const IpBytes& b) {
  std::array<std::uint8_t, 16> a{};
  for (std::size_t i = 0; i < 16; ++i) a[i] = std::to_integer<std::uint8_t>(b[i]);
  return a;
}

// Decodes the encapsulated frame field by field and checks it against the
// input: L2, outer IP, UDP + GUE, checksums by recomputation, the inner packet
// unchanged but for TTL / hop limit (and the IPv4 header checksum).
void checkEncapsulated(std::span<const std::byte> out, std::span<const std::byte> input,
                       const PacketView& view, const EncapTarget& t,
                       std::optional<std::uint16_t> egressVlan, std::uint64_t hash) {
  const IpVersion innerVersion = view.key.version;
  const bool innerV4 = innerVersion == IpVersion::V4;
  const bool outerV4 = outerIpVersion(t.kind) == IpVersion::V4;
  const bool gue = usesGue(t.kind);
  const std::uint8_t innerProto = innerV4 ? 4 : 41;
  const std::size_t innerLength = view.l3Length;
  const std::size_t outerPayload = (gue ? 12 : 0) + innerLength;

  ASSERT_GE(out.size(), encapHeaderBytes(t.kind, egressVlan.has_value()));
  const auto eth = loadAt<EthernetHeader>(out, 0);
  EXPECT_EQ(eth.dst, t.nextHopMac);
  EXPECT_EQ(eth.src, t.ourMac);
  std::size_t at = sizeof eth;
  std::uint16_t etherType = eth.etherType.host();
  if (egressVlan) {
    EXPECT_EQ(etherType, kEtherTypeVlan);
    const auto tag = loadAt<VlanTag>(out, at);
    EXPECT_EQ(tag.tci.host(), *egressVlan);
    etherType = tag.etherType.host();
    at += sizeof tag;
  }
  EXPECT_EQ(etherType, outerV4 ? kEtherTypeIpv4 : kEtherTypeIpv6);

  std::uint32_t pseudo = 0;
  if (outerV4) {
    const auto ip = loadAt<Ipv4Header>(out, at);
    EXPECT_EQ(ip.versionIhl, 0x45);
    EXPECT_EQ(internetChecksum(out.subspan(at, sizeof ip)), 0) << "outer IPv4 header checksum";
    EXPECT_EQ(ip.tos, kInnerTos) << "DSCP and ECN copied outward";
    EXPECT_EQ(ip.totalLength.host(), sizeof ip + outerPayload);
    EXPECT_EQ(ip.flagsFragment.host(), kIpv4FlagDf);
    EXPECT_EQ(ip.ttl, t.outerTtl);
    EXPECT_EQ(ip.protocol, gue ? 17 : innerProto);
    EXPECT_EQ(ip.src, addr4(t.source));
    EXPECT_EQ(ip.dst, addr4(t.backend));
    pseudo = pseudoHeaderSumV4(ip.src, ip.dst, 17, static_cast<std::uint32_t>(outerPayload));
    at += sizeof ip;
  } else {
    const auto ip = loadAt<Ipv6Header>(out, at);
    const std::uint32_t vcl = ip.versionClassLabel.host();
    EXPECT_EQ(vcl >> 28, 6u);
    EXPECT_EQ((vcl >> 20) & 0xff, kInnerTos) << "DSCP and ECN copied outward";
    EXPECT_EQ(vcl & 0xfffff, outerFlowLabel(hash));
    EXPECT_NE(vcl & 0xfffff, 0u);
    EXPECT_EQ(ip.payloadLength.host(), outerPayload);
    EXPECT_EQ(ip.nextHeader, gue ? 17 : innerProto);
    EXPECT_EQ(ip.hopLimit, t.outerTtl);
    EXPECT_EQ(ip.src, addr16(t.source));
    EXPECT_EQ(ip.dst, addr16(t.backend));
    pseudo = pseudoHeaderSumV6(ip.src, ip.dst, 17, static_cast<std::uint32_t>(outerPayload));
    at += sizeof ip;
  }

  if (gue) {
    const auto udp = loadAt<UdpHeader>(out, at);
    EXPECT_EQ(udp.srcPort.host(), gueSourcePort(hash));
    EXPECT_GE(udp.srcPort.host(), 0xc000);
    EXPECT_EQ(udp.dstPort.host(), t.gueDstPort);
    EXPECT_EQ(udp.length.host(), outerPayload);
    EXPECT_NE(udp.checksum.host(), 0) << "UDP checksum present";
    ASSERT_LE(at + outerPayload, out.size());
    EXPECT_EQ(checksumFinish(checksumPartial(out.subspan(at, outerPayload), pseudo)), 0)
        << "UDP checksum verifies";
    const auto g = loadAt<GueHeader>(out, at + sizeof udp);
    EXPECT_EQ(g.versionControlHlen, 0) << "GUE version 0, C 0, Hlen 0";
    EXPECT_EQ(g.protocol, innerProto);
    EXPECT_EQ(g.flags.host(), 0);
    at += sizeof udp + sizeof g;
  }

  ASSERT_EQ(at + innerLength, out.size()) << "inner packet, no padding, nothing after";
  const auto inner = out.subspan(at);
  const auto original = input.subspan(view.l3Offset, innerLength);
  const std::size_t ttlAt = innerV4 ? offsetof(Ipv4Header, ttl) : offsetof(Ipv6Header, hopLimit);
  for (std::size_t i = 0; i < innerLength; ++i) {
    if (i == ttlAt) continue;
    if (innerV4 && (i == 10 || i == 11)) continue;  // header checksum
    ASSERT_EQ(inner[i], original[i]) << "inner byte " << i;
  }
  EXPECT_EQ(std::to_integer<int>(inner[ttlAt]), std::to_integer<int>(original[ttlAt]) - 1);
  if (innerV4) {
    const std::size_t ihl = (std::to_integer<std::size_t>(inner[0]) & 0xf) * 4;
    EXPECT_EQ(internetChecksum(inner.subspan(0, ihl)), 0) << "inner IPv4 header checksum";
  }

  // The inner packet, re-framed, parses to the client's flow.
  std::vector<std::byte> innerFrame(sizeof(EthernetHeader));
  EthernetHeader e{};
  e.etherType = Be16::fromHost(innerV4 ? kEtherTypeIpv4 : kEtherTypeIpv6);
  storeAt(std::span(innerFrame), 0, e);
  innerFrame.insert(innerFrame.end(), inner.begin(), inner.end());
  const auto innerView = parsePacket(innerFrame);
  ASSERT_TRUE(innerView.ok()) << dropReasonName(innerView.drop);
  EXPECT_EQ(innerView.key, view.key);
  EXPECT_EQ(innerView.ttl, view.ttl - 1);

  // The outer frame parses as IP from us to the backend (GUE: a UDP flow).
  const auto outerView = parsePacket(out);
  ASSERT_TRUE(outerView.l3Valid) << dropReasonName(outerView.drop);
  EXPECT_EQ(outerView.key.src, t.source);
  EXPECT_EQ(outerView.key.dst, t.backend);
  if (gue) {
    ASSERT_TRUE(outerView.ok()) << dropReasonName(outerView.drop);
    EXPECT_EQ(outerView.key.srcPort.host(), gueSourcePort(hash));
    EXPECT_EQ(outerView.key.dstPort.host(), t.gueDstPort);
  }
}

class EncapGolden : public ::testing::TestWithParam<EncapCase> {};

TEST_P(EncapGolden, MatchesGoldenAndDecodes) {
  const EncapCase& c = GetParam();
  const auto input = inputFrame(c);
  EXPECT_TRUE(test::matchesGoldenHex(c.name + ".in.hex", input));

  auto buffer = withHeadroom(input);
  const auto view = parsePacket(buffer.frame());
  ASSERT_TRUE(view.ok()) << dropReasonName(view.drop);
  ASSERT_EQ(view.key.version, c.inner);
  const auto target = targetFor(c.kind, c.egressVlan);
  const auto r = encapsulateAny(buffer.bytes, buffer.dataOffset, buffer.frameLength, view, target,
                                kGoldenHash);
  ASSERT_TRUE(r.ok()) << dropReasonName(r.drop);
  const std::span<const std::byte> out(buffer.bytes.data() + r.dataOffset, r.frameLength);
  EXPECT_EQ(r.dataOffset + encapHeaderBytes(c.kind, c.egressVlan.has_value()),
            kHeadroom + view.l3Offset)
      << "the inner packet stays where it was received";
  EXPECT_TRUE(test::matchesGoldenHex(c.name + ".out.hex", out));
  EXPECT_TRUE(test::matchesGoldenText(c.name + ".json", expectedJson(c, target, kGoldenHash)));
  checkEncapsulated(out, input, view, target, c.egressVlan, kGoldenHash);

  // Nothing outside the new frame was written.
  for (std::size_t i = 0; i < r.dataOffset; ++i) ASSERT_EQ(buffer.bytes[i], kHeadroomFill) << i;
  for (std::size_t i = kHeadroom + input.size(); i < buffer.bytes.size(); ++i) {
    ASSERT_EQ(buffer.bytes[i], kHeadroomFill) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, EncapGolden, ::testing::ValuesIn(goldenCases()),
                         [](const auto& param) { return param.param.name; });

// Every variant (kind x inner family x VLAN in/out) through the generic
// structural checks, with a non-default target.
TEST(Encap, AllVariantsWellFormed) {
  for (const auto kind : kKinds) {
    for (const auto inner : kInnerVersions) {
      for (const bool vlanIn : {false, true}) {
        for (const bool vlanOut : {false, true}) {
          SCOPED_TRACE(std::string(toString(kind)) + (inner == IpVersion::V4 ? " v4" : " v6") +
                       (vlanIn ? " vlan-in" : "") + (vlanOut ? " vlan-out" : ""));
          const auto input = clientPacket(inner, kind == EncapKind::Gue4, 100,
                                          vlanIn ? std::optional<std::uint16_t>(7) : std::nullopt)
                                 .build();
          auto buffer = withHeadroom(input);
          const auto view = parsePacket(buffer.frame());
          ASSERT_TRUE(view.ok());
          auto target =
              targetFor(kind, vlanOut ? std::optional<std::uint16_t>(0x2fff) : std::nullopt);
          target.outerTtl = 17;
          target.gueDstPort = 7777;
          const std::uint64_t hash = 0x0123456789abcdefULL;
          const auto r = encapsulateAny(buffer.bytes, buffer.dataOffset, buffer.frameLength, view,
                                        target, hash);
          ASSERT_TRUE(r.ok()) << dropReasonName(r.drop);
          checkEncapsulated({buffer.bytes.data() + r.dataOffset, r.frameLength}, input, view,
                            target, target.vlanTci, hash);
        }
      }
    }
  }
}

TEST(Encap, TemplateAndDispatcherAgree) {
  const auto input = clientPacket(IpVersion::V4, true, 40).build();
  auto a = withHeadroom(input);
  auto b = withHeadroom(input);
  const auto view = parsePacket(a.frame());
  ASSERT_TRUE(view.ok());
  const auto target = targetFor(EncapKind::Gue6);
  const auto ra = encapsulate<EncapKind::Gue6, IpVersion::V4>(a.bytes, a.dataOffset, a.frameLength,
                                                              view, target, 42);
  const auto rb = encapsulateAny(b.bytes, b.dataOffset, b.frameLength, view, target, 42);
  ASSERT_TRUE(ra.ok());
  EXPECT_EQ(ra.dataOffset, rb.dataOffset);
  EXPECT_EQ(ra.frameLength, rb.frameLength);
  EXPECT_EQ(a.bytes, b.bytes);
}

TEST(Encap, InnerChecksumUpdateMatchesRecomputation) {
  // RFC 1624's incremental update against a full recomputation, over many
  // headers so both end-around-carry edges (0x0000 / 0xffff) are crossed.
  std::mt19937_64 rng(1624);
  for (int i = 0; i < 3000; ++i) {
    char src[16];
    std::snprintf(src, sizeof src, "10.%u.%u.%u", static_cast<unsigned>(rng() % 256),
                  static_cast<unsigned>(rng() % 256), static_cast<unsigned>(rng() % 256));
    const auto ttl = static_cast<std::uint8_t>(2 + rng() % 254);
    const auto tos = static_cast<std::uint8_t>(rng());
    PacketBuilder p;
    p.eth().ipv4(src, kVip4, ttl, tos).tcp(static_cast<std::uint16_t>(rng()), 443).payload(4);
    const auto input = p.build();
    auto buffer = withHeadroom(input);
    const auto view = parsePacket(buffer.frame());
    ASSERT_TRUE(view.ok());
    const auto r = encapsulate<EncapKind::IpInIp4, IpVersion::V4>(
        buffer.bytes, buffer.dataOffset, buffer.frameLength, view, targetFor(EncapKind::IpInIp4),
        rng());
    ASSERT_TRUE(r.ok());
    const auto inner = std::span(buffer.bytes).subspan(r.dataOffset + 34, 20);
    ASSERT_EQ(internetChecksum(inner), 0) << "ttl " << int{ttl} << " src " << src;
    ASSERT_EQ(std::to_integer<int>(inner[8]), ttl - 1);
  }
}

TEST(EncapEntropy, UdpSourcePortFromHighHashBits) {
  std::mt19937_64 rng(6080);
  std::set<std::uint16_t> ports;
  std::array<int, 16> buckets{};
  constexpr int kSamples = 4096;
  for (int i = 0; i < kSamples; ++i) {
    const std::uint64_t h = rng();
    const auto port = gueSourcePort(h);
    ASSERT_GE(port, 0xc000);
    // The low 50 bits index flow tables; the port must not depend on them.
    ASSERT_EQ(port, gueSourcePort(h ^ ((1ULL << 50) - 1)));
    ASSERT_NE(port, gueSourcePort(h ^ (1ULL << 63)));
    ports.insert(port);
    ++buckets[(port - 0xc000) >> 10];
    const auto label = outerFlowLabel(h);
    ASSERT_GT(label, 0u);
    ASSERT_LE(label, 0xfffffu);
  }
  // 4096 draws from 16384 ports: about 3624 distinct expected.
  EXPECT_GT(ports.size(), 3400u);
  for (const int b : buckets) {
    EXPECT_GT(b, kSamples / 16 / 2);
    EXPECT_LT(b, kSamples / 16 * 3 / 2);
  }
  EXPECT_EQ(outerFlowLabel(0), 1u) << "a zero label means unlabelled: never sent";
}

TEST(EncapEntropy, SameFlowSamePortDifferentHashesSpread) {
  const auto input = clientPacket(IpVersion::V6, false, 16).build();
  std::set<std::uint16_t> ports;
  std::set<std::uint32_t> labels;
  for (std::uint64_t k = 0; k < 64; ++k) {
    const std::uint64_t hash = (k * 0x9e3779b97f4a7c15ULL) | 0x1;
    std::array<std::vector<std::byte>, 2> outs;
    for (auto& o : outs) {
      auto buffer = withHeadroom(input);
      const auto view = parsePacket(buffer.frame());
      ASSERT_TRUE(view.ok());
      const auto r = encapsulate<EncapKind::Gue6, IpVersion::V6>(buffer.bytes, buffer.dataOffset,
                                                                 buffer.frameLength, view,
                                                                 targetFor(EncapKind::Gue6), hash);
      ASSERT_TRUE(r.ok());
      o.assign(buffer.bytes.begin() + static_cast<std::ptrdiff_t>(r.dataOffset),
               buffer.bytes.begin() + static_cast<std::ptrdiff_t>(r.dataOffset + r.frameLength));
    }
    EXPECT_EQ(outs[0], outs[1]) << "deterministic";
    ports.insert(loadAt<UdpHeader>(outs[0], 14 + 40).srcPort.host());
    labels.insert(loadAt<Ipv6Header>(outs[0], 14).versionClassLabel.host() & 0xfffff);
  }
  EXPECT_GE(ports.size(), 60u);
  EXPECT_GE(labels.size(), 60u);
}

// An inner packet of exactly `l3Length` bytes for the MTU tests.
std::vector<std::byte> packetOfLength(IpVersion inner, std::size_t l3Length, bool df = true) {
  const std::size_t headers = (inner == IpVersion::V4 ? 20 : 40) + 20;
  return clientPacket(inner, false, l3Length - headers, std::nullopt, df).build();
}

TEST(EncapMtu, ExactlyAtMtuPassesOneByteOverFails) {
  for (const auto kind : kKinds) {
    for (const auto inner : kInnerVersions) {
      for (const bool egressVlan : {false, true}) {
        SCOPED_TRACE(std::string(toString(kind)) + (inner == IpVersion::V4 ? " v4" : " v6") +
                     (egressVlan ? " tagged" : ""));
        const auto target =
            targetFor(kind, egressVlan ? std::optional<std::uint16_t>(5) : std::nullopt);
        const std::size_t fits = kDefaultEgressMtu - encapOverhead(kind);
        {
          auto buffer = withHeadroom(packetOfLength(inner, fits));
          const auto view = parsePacket(buffer.frame());
          ASSERT_TRUE(view.ok());
          const auto r =
              encapsulateAny(buffer.bytes, buffer.dataOffset, buffer.frameLength, view, target, 1);
          ASSERT_TRUE(r.ok()) << dropReasonName(r.drop);
          EXPECT_EQ(r.frameLength - encapHeaderBytes(kind, egressVlan) + encapOverhead(kind),
                    kDefaultEgressMtu)
              << "the outer IP packet is exactly the MTU; the L2 tag does not count";
        }
        {
          auto buffer = withHeadroom(packetOfLength(inner, fits + 1));
          const auto before = buffer.bytes;
          const auto view = parsePacket(buffer.frame());
          ASSERT_TRUE(view.ok());
          const auto r =
              encapsulateAny(buffer.bytes, buffer.dataOffset, buffer.frameLength, view, target, 1);
          EXPECT_EQ(r.drop, DropReason::MtuExceeded);
          EXPECT_EQ(r.icmpMtu, fits);
          EXPECT_EQ(buffer.bytes, before) << "nothing written on a drop: the ICMP error quotes it";
        }
      }
    }
  }
}

TEST(EncapMtu, Ipv4WithoutDfIsDroppedNotFragmented) {
  const auto target = targetFor(EncapKind::Gue4);
  const std::size_t fits = kDefaultEgressMtu - encapOverhead(EncapKind::Gue4);
  auto atMtu = withHeadroom(packetOfLength(IpVersion::V4, fits, false));
  const auto viewAt = parsePacket(atMtu.frame());
  ASSERT_TRUE(viewAt.ok());
  ASSERT_FALSE(viewAt.dontFragment);
  EXPECT_TRUE(
      encapsulateAny(atMtu.bytes, atMtu.dataOffset, atMtu.frameLength, viewAt, target, 1).ok());

  auto over = withHeadroom(packetOfLength(IpVersion::V4, fits + 1, false));
  const auto before = over.bytes;
  const auto view = parsePacket(over.frame());
  ASSERT_TRUE(view.ok());
  const auto r = encapsulateAny(over.bytes, over.dataOffset, over.frameLength, view, target, 1);
  EXPECT_EQ(r.drop, DropReason::MtuExceededNoDf);
  EXPECT_EQ(over.bytes, before);
}

TEST(EncapMtu, AdvertisedMtuIsClampedToTheProtocolMinimum) {
  // IPv6: never below 1280 (RFC 8200 §5), even if the fabric is smaller.
  for (const std::uint16_t mtu : {1330, 1320, 1319, 1300}) {
    auto target = targetFor(EncapKind::IpInIp6);
    target.mtu = mtu;
    auto buffer = withHeadroom(packetOfLength(IpVersion::V6, 1400));
    const auto view = parsePacket(buffer.frame());
    ASSERT_TRUE(view.ok());
    const auto r =
        encapsulateAny(buffer.bytes, buffer.dataOffset, buffer.frameLength, view, target, 1);
    EXPECT_EQ(r.drop, DropReason::MtuExceeded);
    EXPECT_EQ(r.icmpMtu, std::max(mtu - 40, 1280)) << "egress MTU " << mtu;
  }
  // IPv4: never below 68 (RFC 791).
  auto target = targetFor(EncapKind::Gue4);
  target.mtu = 90;  // room 58
  auto buffer = withHeadroom(packetOfLength(IpVersion::V4, 200));
  const auto view = parsePacket(buffer.frame());
  ASSERT_TRUE(view.ok());
  const auto r =
      encapsulateAny(buffer.bytes, buffer.dataOffset, buffer.frameLength, view, target, 1);
  EXPECT_EQ(r.drop, DropReason::MtuExceeded);
  EXPECT_EQ(r.icmpMtu, 68);
}

TEST(EncapHeadroom, NoHeadroomWhenTheOuterHeadersDoNotFit) {
  for (const auto kind : kKinds) {
    for (const bool vlanIn : {false, true}) {
      for (const bool vlanOut : {false, true}) {
        SCOPED_TRACE(std::string(toString(kind)) + (vlanIn ? " vlan-in" : "") +
                     (vlanOut ? " vlan-out" : ""));
        const auto input = clientPacket(IpVersion::V4, false, 8,
                                        vlanIn ? std::optional<std::uint16_t>(9) : std::nullopt)
                               .build();
        const auto target =
            targetFor(kind, vlanOut ? std::optional<std::uint16_t>(10) : std::nullopt);
        const std::size_t l2In = vlanIn ? 18 : 14;
        const std::size_t needed = encapHeaderBytes(kind, vlanOut) - l2In;
        ASSERT_LE(needed, kEncapMaxHeadroom);
        auto enough = withHeadroom(input, needed);
        const auto view = parsePacket(enough.frame());
        ASSERT_TRUE(view.ok());
        const auto ok =
            encapsulateAny(enough.bytes, enough.dataOffset, enough.frameLength, view, target, 3);
        ASSERT_TRUE(ok.ok()) << dropReasonName(ok.drop);
        EXPECT_EQ(ok.dataOffset, 0u);

        auto tight = withHeadroom(input, needed - 1);
        const auto before = tight.bytes;
        const auto r =
            encapsulateAny(tight.bytes, tight.dataOffset, tight.frameLength, view, target, 3);
        EXPECT_EQ(r.drop, DropReason::NoHeadroom);
        EXPECT_EQ(tight.bytes, before);
      }
    }
  }
}

TEST(Encap, RejectsViewsThatDoNotFit) {
  const auto input = clientPacket(IpVersion::V4, false, 8).build();
  auto buffer = withHeadroom(input);
  auto view = parsePacket(buffer.frame());
  ASSERT_TRUE(view.ok());
  const auto target = targetFor(EncapKind::IpInIp4);
  const auto before = buffer.bytes;

  auto notOk = view;
  notOk.drop = DropReason::Ipv4Fragment;
  EXPECT_EQ(
      encapsulateAny(buffer.bytes, buffer.dataOffset, buffer.frameLength, notOk, target, 1).drop,
      DropReason::Ipv4Fragment);
  EXPECT_EQ((encapsulate<EncapKind::IpInIp4, IpVersion::V6>(buffer.bytes, buffer.dataOffset,
                                                            buffer.frameLength, view, target, 1)
                 .drop),
            DropReason::BadIpVersion);
  EXPECT_EQ(
      encapsulateAny(buffer.bytes, buffer.dataOffset, buffer.frameLength - 1, view, target, 1).drop,
      DropReason::Truncated);
  EXPECT_EQ(
      encapsulateAny(buffer.bytes, buffer.bytes.size(), buffer.frameLength, view, target, 1).drop,
      DropReason::Truncated);
  EXPECT_EQ(buffer.bytes, before);

  // A view whose TTL would expire (the parser drops these first).
  buffer.bytes[kHeadroom + 14 + 8] = std::byte{1};
  EXPECT_EQ(
      encapsulateAny(buffer.bytes, buffer.dataOffset, buffer.frameLength, view, target, 1).drop,
      DropReason::TtlExhausted);
}

// ---- second chance (issue #24) --------------------------------------------

// The bytes on the wire of a GUE packet that names a previous backend: UDP
// length and checksum cover the private data, the GUE Hlen counts its 32-bit
// words, the private data is type 0x5c, version 1, flags 0, reserved 0, then
// the hop's address in the outer family; the inner packet follows unchanged
// but for its TTL.
TEST(EncapSecondChance, GueCarriesThePreviousOwnerAsPrivateData) {
  for (const auto kind : {EncapKind::Gue4, EncapKind::Gue6}) {
    for (const auto inner : kInnerVersions) {
      const bool v4 = outerIpVersion(kind) == IpVersion::V4;
      SCOPED_TRACE(std::string(toString(kind)) + (inner == IpVersion::V4 ? " v4" : " v6"));
      const auto input = clientPacket(inner, false, 60).build();
      auto plain = withHeadroom(input);
      auto withHop = withHeadroom(input);
      const auto view = parsePacket(plain.frame());
      ASSERT_TRUE(view.ok());
      const auto target = targetFor(kind);
      const IpBytes hop = ipBytes(v4 ? "10.2.0.99" : "fd00:2::99");
      const auto a =
          encapsulateAny(plain.bytes, plain.dataOffset, plain.frameLength, view, target, 77);
      const auto b = encapsulateAny(withHop.bytes, withHop.dataOffset, withHop.frameLength, view,
                                    target, 77, &hop);
      ASSERT_TRUE(a.ok());
      ASSERT_TRUE(b.ok());
      EXPECT_FALSE(a.hopWritten);
      EXPECT_TRUE(b.hopWritten);
      const std::size_t hopBytes = v4 ? 8 : 20;
      ASSERT_EQ(secondChanceBytes(outerIpVersion(kind)), hopBytes);
      EXPECT_EQ(b.frameLength, a.frameLength + hopBytes);
      EXPECT_EQ(b.dataOffset + hopBytes, a.dataOffset) << "the inner packet does not move";
      const auto out =
          std::span<const std::byte>(withHop.bytes).subspan(b.dataOffset, b.frameLength);
      const std::size_t ipBytesLen = v4 ? 20 : 40;
      const std::size_t udpAt = 14 + ipBytesLen;
      auto byte = [&](std::size_t i) { return std::to_integer<unsigned>(out[i]); };
      const std::size_t udpLength = (byte(udpAt + 4) << 8) | byte(udpAt + 5);
      EXPECT_EQ(udpLength, b.frameLength - udpAt);
      const std::size_t gueAt = udpAt + 8;
      EXPECT_EQ(byte(gueAt), hopBytes / 4) << "version 0, C 0, Hlen in 32-bit words";
      EXPECT_EQ(byte(gueAt + 1), inner == IpVersion::V4 ? 4U : 41U);
      EXPECT_EQ(byte(gueAt + 2), 0U);
      EXPECT_EQ(byte(gueAt + 3), 0U) << "flags 0: all of Hlen is private data";
      EXPECT_EQ(byte(gueAt + 4), 0x5cU);
      EXPECT_EQ(byte(gueAt + 5), 1U);
      EXPECT_EQ(byte(gueAt + 6), 0U);
      EXPECT_EQ(byte(gueAt + 7), 0U);
      for (std::size_t i = 0; i < hopBytes - 4; ++i) {
        EXPECT_EQ(out[gueAt + 8 + i], hop[i]) << "hop address byte " << i;
      }
      // The inner packet is what the plain encapsulation carries.
      const auto plainOut =
          std::span<const std::byte>(plain.bytes).subspan(a.dataOffset, a.frameLength);
      const std::size_t innerAt = gueAt + 4 + hopBytes;
      ASSERT_TRUE(std::equal(plainOut.begin() + static_cast<std::ptrdiff_t>(innerAt - hopBytes),
                             plainOut.end(), out.begin() + static_cast<std::ptrdiff_t>(innerAt)));
      // The UDP checksum covers the private data: pseudo header + UDP sums to 0.
      std::uint32_t pseudo = 0;
      if (v4) {
        std::array<std::uint8_t, 4> src{}, dst{};
        for (int i = 0; i < 4; ++i) {
          src[i] = static_cast<std::uint8_t>(byte(14 + 12 + i));
          dst[i] = static_cast<std::uint8_t>(byte(14 + 16 + i));
        }
        pseudo = pseudoHeaderSumV4(src, dst, 17, static_cast<std::uint32_t>(udpLength));
      } else {
        std::array<std::uint8_t, 16> src{}, dst{};
        for (int i = 0; i < 16; ++i) {
          src[i] = static_cast<std::uint8_t>(byte(14 + 8 + i));
          dst[i] = static_cast<std::uint8_t>(byte(14 + 24 + i));
        }
        pseudo = pseudoHeaderSumV6(src, dst, 17, static_cast<std::uint32_t>(udpLength));
      }
      EXPECT_EQ(checksumFinish(checksumPartial(out.subspan(udpAt, udpLength), pseudo)), 0);
      // The outer IP length covers it too.
      const std::size_t ipLength =
          v4 ? ((byte(14 + 2) << 8) | byte(14 + 3)) : ((byte(14 + 4) << 8) | byte(14 + 5)) + 40;
      EXPECT_EQ(ipLength, b.frameLength - 14);
      if (v4) {
        EXPECT_EQ(internetChecksum(out.subspan(14, 20)), 0);
      }
    }
  }
}

TEST(EncapSecondChance, IpInIpHasNoRoomAndWritesNoHop) {
  for (const auto kind : {EncapKind::IpInIp4, EncapKind::IpInIp6}) {
    const auto input = clientPacket(IpVersion::V4, false, 60).build();
    auto plain = withHeadroom(input);
    auto withHop = withHeadroom(input);
    const auto view = parsePacket(plain.frame());
    const auto target = targetFor(kind);
    const IpBytes hop = ipBytes(outerIpVersion(kind) == IpVersion::V4 ? "10.2.0.99" : "fd00:2::99");
    const auto a =
        encapsulateAny(plain.bytes, plain.dataOffset, plain.frameLength, view, target, 5);
    const auto b = encapsulateAny(withHop.bytes, withHop.dataOffset, withHop.frameLength, view,
                                  target, 5, &hop);
    ASSERT_TRUE(b.ok());
    EXPECT_FALSE(b.hopWritten);
    EXPECT_EQ(a.dataOffset, b.dataOffset);
    EXPECT_EQ(plain.bytes, withHop.bytes);
  }
}

// A packet that fits the MTU without the hop but not with it goes without
// (the caller counts it); the MTU a client learns never includes the hop.
TEST(EncapSecondChance, HopThatDoesNotFitTheMtuIsLeftOut) {
  for (const auto kind : {EncapKind::Gue4, EncapKind::Gue6}) {
    const auto target = targetFor(kind);
    const std::size_t hopBytes = secondChanceBytes(outerIpVersion(kind));
    const IpBytes hop = ipBytes(outerIpVersion(kind) == IpVersion::V4 ? "10.2.0.99" : "fd00:2::99");
    const std::size_t fits = kDefaultEgressMtu - encapOverhead(kind);
    for (const std::size_t length : {fits - hopBytes, fits - hopBytes + 1, fits}) {
      auto buffer = withHeadroom(packetOfLength(IpVersion::V4, length));
      const auto view = parsePacket(buffer.frame());
      ASSERT_TRUE(view.ok());
      const auto r = encapsulateAny(buffer.bytes, buffer.dataOffset, buffer.frameLength, view,
                                    target, 9, &hop);
      ASSERT_TRUE(r.ok()) << dropReasonName(r.drop);
      EXPECT_EQ(r.hopWritten, length == fits - hopBytes) << "inner length " << length;
    }
    // Too big even without it: the usual MTU error, the usual MTU.
    auto buffer = withHeadroom(packetOfLength(IpVersion::V4, fits + 1));
    const auto view = parsePacket(buffer.frame());
    const auto r =
        encapsulateAny(buffer.bytes, buffer.dataOffset, buffer.frameLength, view, target, 9, &hop);
    EXPECT_EQ(r.drop, DropReason::MtuExceeded);
    EXPECT_EQ(r.icmpMtu, fits);
  }
}

TEST(EncapSecondChance, HopThatDoesNotFitTheHeadroomIsLeftOut) {
  const auto target = targetFor(EncapKind::Gue6);
  const IpBytes hop = ipBytes("fd00:2::99");
  const auto input = clientPacket(IpVersion::V4, false, 40).build();
  const std::size_t plainHeadroom = encapHeaderBytes(EncapKind::Gue6, false) - 14;
  for (const std::size_t headroom : {plainHeadroom, plainHeadroom + 19, plainHeadroom + 20}) {
    auto buffer = withHeadroom(input, headroom);
    const auto view = parsePacket(buffer.frame());
    const auto r =
        encapsulateAny(buffer.bytes, buffer.dataOffset, buffer.frameLength, view, target, 9, &hop);
    ASSERT_TRUE(r.ok()) << dropReasonName(r.drop);
    EXPECT_EQ(r.hopWritten, headroom == plainHeadroom + 20) << "headroom " << headroom;
  }
}

// ---- the encapsulation template (issue #25) ---------------------------------
// EncapTemplate::build(target).write() must give encapsulate<Kind, Inner>()'s
// result and bytes exactly: the old builder is the oracle. Each comparison
// runs both on copies of one buffer and compares the results and the whole
// buffers (headroom and tailroom included, so nothing else is written, and a
// drop leaves the buffer as it was in both).

PacketView viewOf(const Buffer& b) {
  return parsePacket(std::span<const std::byte>(b.bytes.data() + b.dataOffset, b.frameLength));
}

struct Compared {
  EncapResult reference;
  EncapResult fromTemplate;
};

void expectSameResult(const EncapResult& a, const EncapResult& b, const std::string& what) {
  EXPECT_EQ(a.drop, b.drop) << what << ": " << dropReasonName(a.drop) << " vs "
                            << dropReasonName(b.drop);
  EXPECT_EQ(a.hopWritten, b.hopWritten) << what;
  EXPECT_EQ(a.icmpMtu, b.icmpMtu) << what;
  EXPECT_EQ(a.dataOffset, b.dataOffset) << what;
  EXPECT_EQ(a.frameLength, b.frameLength) << what;
}

Compared compareWithReference(const Buffer& input, const PacketView& view,
                              const EncapTarget& target, std::uint64_t hash, const IpBytes* hop,
                              const std::string& what, std::size_t frameLength = SIZE_MAX) {
  Buffer a = input;
  Buffer b = input;
  const std::size_t length = frameLength == SIZE_MAX ? input.frameLength : frameLength;
  Compared c;
  c.reference = encapsulateAny(a.bytes, a.dataOffset, length, view, target, hash, hop);
  const EncapTemplate t = EncapTemplate::build(target);
  c.fromTemplate = t.write(b.bytes, b.dataOffset, length, view, hash, hop);
  expectSameResult(c.reference, c.fromTemplate, what);
  EXPECT_TRUE(a.bytes == b.bytes) << what << ": the buffers differ";
  if (a.bytes != b.bytes) {
    for (std::size_t i = 0; i < a.bytes.size(); ++i) {
      if (a.bytes[i] != b.bytes[i]) {
        ADD_FAILURE() << what << ": first difference at byte " << i << " (frame starts at "
                      << c.reference.dataOffset << "): " << std::to_integer<int>(a.bytes[i])
                      << " vs " << std::to_integer<int>(b.bytes[i]);
        break;
      }
    }
  }
  return c;
}

TEST(EncapTemplate, MatchesTheBuilderForEveryKindFamilyTagHopLengthAndDf) {
  const std::array<std::optional<std::uint16_t>, 2> tags = {std::nullopt, 200};
  const std::array<std::size_t, 9> payloads = {0, 1, 2, 3, 5, 31, 64, 333, 1001};
  const std::array<std::uint64_t, 4> hashes = {kGoldenHash, 0, ~std::uint64_t{0},
                                               0x0000'0000'3fff'ffffULL};  // flow label 0 -> 1
  int forwarded = 0, withHop = 0;
  for (const EncapKind kind : kKinds) {
    for (const IpVersion inner : kInnerVersions) {
      for (const auto& egress : tags) {
        for (const auto& ingress : tags) {
          for (const bool udp : {false, true}) {
            for (const bool df : {true, false}) {
              if (!df && inner == IpVersion::V6) continue;
              for (const std::size_t payload : payloads) {
                for (const std::uint64_t hash : hashes) {
                  for (const bool hop : {false, true}) {
                    EncapTarget target = targetFor(kind, egress);
                    target.gueDstPort = 6081;
                    target.outerTtl = 17;
                    const IpBytes previous =
                        ipBytes(outerIpVersion(kind) == IpVersion::V4 ? "10.2.0.33" : "fd00:2::33");
                    const auto frame = clientPacket(inner, udp, payload, ingress, df).build();
                    const Buffer input = withHeadroom(frame);
                    const PacketView view = viewOf(input);
                    const std::string what =
                        std::string(toString(kind)) + " inner v" +
                        std::to_string(static_cast<int>(inner)) + (egress ? " tagged" : "") +
                        (ingress ? " in-tag" : "") + (udp ? " udp" : " tcp") +
                        (df ? " df" : " nodf") + " payload " + std::to_string(payload) + " hash " +
                        std::to_string(hash) + (hop ? " hop" : "");
                    const Compared c = compareWithReference(input, view, target, hash,
                                                            hop ? &previous : nullptr, what);
                    forwarded += c.reference.ok();
                    withHop += c.reference.hopWritten;
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  // Every case forwards (MTU 1500); the GUE kinds write the hop when asked.
  EXPECT_EQ(forwarded, 4 * (2 * 2 * 2 * 2 + 2 * 2 * 2) * 9 * 4 * 2);
  EXPECT_EQ(withHop, 2 * (2 * 2 * 2 * 2 + 2 * 2 * 2) * 9 * 4);
}

// At and around the MTU (with and without the hop's bytes), with DF and
// without, the TTL at its edges, and the headroom at its edges: the same
// drops, icmpMtu and hop decisions.
TEST(EncapTemplate, MatchesTheBuilderAtTheEdgesOfMtuTtlAndHeadroom) {
  int drops = 0, hopsLeftOut = 0;
  for (const EncapKind kind : kKinds) {
    for (const IpVersion inner : kInnerVersions) {
      for (const bool tagged : {false, true}) {
        const std::optional<std::uint16_t> egress =
            tagged ? std::optional<std::uint16_t>(7) : std::nullopt;
        const IpBytes previous =
            ipBytes(outerIpVersion(kind) == IpVersion::V4 ? "10.2.0.34" : "fd00:2::34");
        const std::size_t innerHeader = inner == IpVersion::V4 ? 20 : 40;
        const std::size_t innerLength = innerHeader + 20 + 101;  // TCP + an odd payload
        const std::size_t overhead = encapOverhead(kind);
        const std::size_t hopBytes = usesGue(kind) ? secondChanceBytes(outerIpVersion(kind)) : 0;
        for (const std::size_t mtu :
             {innerLength + overhead - 1, innerLength + overhead, innerLength + overhead + 1,
              innerLength + overhead + hopBytes - 1, innerLength + overhead + hopBytes,
              std::size_t{60}, std::size_t{1}, std::size_t{65535}}) {
          for (const bool df : {true, false}) {
            if (!df && inner == IpVersion::V6) continue;
            for (const std::uint8_t ttl :
                 {std::uint8_t{0}, std::uint8_t{1}, std::uint8_t{2}, std::uint8_t{255}}) {
              const std::size_t needed = encapHeaderBytes(kind, tagged) - 14;
              for (const std::size_t headroom :
                   {std::size_t{0}, needed - 1, needed, needed + hopBytes - 1, needed + hopBytes,
                    std::size_t{128}}) {
                for (const bool hop : {false, true}) {
                  EncapTarget target = targetFor(kind, egress);
                  target.mtu = static_cast<std::uint16_t>(mtu);
                  const auto frame = clientPacket(inner, false, 101, std::nullopt, df, ttl).build();
                  ASSERT_EQ(frame.size(), 14 + innerLength);
                  const Buffer input = withHeadroom(frame, headroom);
                  const PacketView view = viewOf(input);
                  const std::string what = std::string(toString(kind)) + " inner v" +
                                           std::to_string(static_cast<int>(inner)) +
                                           (tagged ? " tagged" : "") + " mtu " +
                                           std::to_string(mtu) + (df ? " df" : " nodf") + " ttl " +
                                           std::to_string(ttl) + " headroom " +
                                           std::to_string(headroom) + (hop ? " hop" : "");
                  const Compared c = compareWithReference(input, view, target, 0x1234'5678'9abcULL,
                                                          hop ? &previous : nullptr, what);
                  drops += !c.reference.ok();
                  hopsLeftOut +=
                      hop && usesGue(kind) && c.reference.ok() && !c.reference.hopWritten;
                }
              }
            }
          }
        }
      }
    }
  }
  // The edges were reached: drops of every kind, and hops left out for room.
  EXPECT_GT(drops, 0);
  EXPECT_GT(hopsLeftOut, 0);
}

// Views and frames a caller can get wrong: the same drops as the builder.
TEST(EncapTemplate, MatchesTheBuilderOnBadViews) {
  for (const EncapKind kind : kKinds) {
    const EncapTarget target = targetFor(kind);
    const auto frame = clientPacket(IpVersion::V4, false, 10).build();
    const Buffer input = withHeadroom(frame);
    const PacketView view = viewOf(input);
    PacketView notOk = view;
    notOk.drop = DropReason::Truncated;
    PacketView nonIp = view;
    nonIp.kind = PacketKind::NonIp;
    PacketView v6 = view;
    v6.key.version = IpVersion::V6;
    PacketView longer = view;
    longer.l3Length = view.l3Length + 100;
    PacketView shortIp = view;
    shortIp.l3Length = 19;
    PacketView farL3 = view;
    farL3.l3Offset = frame.size() + 1;
    int n = 0;
    for (const PacketView* v : {&notOk, &nonIp, &v6, &longer, &shortIp, &farL3}) {
      const Compared c =
          compareWithReference(input, *v, target, 3, nullptr,
                               std::string(toString(kind)) + " bad view " + std::to_string(n++));
      EXPECT_FALSE(c.fromTemplate.ok());
    }
    const Compared shorter =
        compareWithReference(input, view, target, 3, nullptr,
                             std::string(toString(kind)) + " short frame", frame.size() - 1);
    EXPECT_EQ(shorter.fromTemplate.drop, DropReason::Truncated);
  }
}

// Random targets (addresses, MACs, ports, TTLs, MTUs, tags) and packets
// (family, length, TOS, TTL, DF, hash, hop): 3000 comparisons, seeded.
TEST(EncapTemplate, MatchesTheBuilderOnRandomTargetsAndPackets) {
  std::mt19937_64 rng(0x25);
  const auto pick = [&](std::uint64_t n) { return static_cast<std::uint64_t>(rng() % n); };
  int forwarded = 0;
  for (int i = 0; i < 3000; ++i) {
    const EncapKind kind = kKinds[pick(4)];
    const IpVersion inner = kInnerVersions[pick(2)];
    EncapTarget target;
    target.kind = kind;
    for (auto& b : target.source) b = std::byte(rng() & 0xff);
    for (auto& b : target.backend) b = std::byte(rng() & 0xff);
    if (outerIpVersion(kind) == IpVersion::V4) {
      std::fill(target.source.begin() + 4, target.source.end(), std::byte{0});
      std::fill(target.backend.begin() + 4, target.backend.end(), std::byte{0});
    }
    for (auto& b : target.nextHopMac) b = static_cast<std::uint8_t>(rng());
    for (auto& b : target.ourMac) b = static_cast<std::uint8_t>(rng());
    if (pick(2) == 0) target.vlanTci = static_cast<std::uint16_t>(rng());
    target.gueDstPort = static_cast<std::uint16_t>(rng());
    target.outerTtl = static_cast<std::uint8_t>(rng());
    target.mtu = static_cast<std::uint16_t>(pick(4) == 0 ? pick(1600) : 1500 + pick(8000));
    IpBytes previous{};
    for (auto& b : previous) b = std::byte(rng() & 0xff);
    const auto tos = static_cast<std::uint8_t>(rng());
    const auto ttl = static_cast<std::uint8_t>(rng());
    const bool df = pick(2) == 0;
    PacketBuilder builder;
    builder.eth(kOurMac, kRouterMac);
    if (inner == IpVersion::V4) {
      builder.ipv4(kClient4, kVip4, ttl, tos, df);
    } else {
      builder.ipv6(kClient6, kVip6, ttl, tos, static_cast<std::uint32_t>(rng() & 0xfffff));
    }
    if (pick(2) == 0) {
      builder.udp(static_cast<std::uint16_t>(rng()), 53);
    } else {
      builder.tcp(static_cast<std::uint16_t>(rng()), 443, kTcpAck,
                  static_cast<std::uint32_t>(rng()));
    }
    builder.payload(pick(1400), static_cast<std::uint8_t>(rng()));
    const auto frame = builder.build();
    const Buffer input = withHeadroom(frame, pick(4) == 0 ? pick(100) : kHeadroom);
    const PacketView view = viewOf(input);
    const Compared c =
        compareWithReference(input, view, target, rng(), pick(2) == 0 ? &previous : nullptr,
                             "random case " + std::to_string(i));
    forwarded += c.reference.ok();
    if (HasFailure()) break;
  }
  EXPECT_GT(forwarded, 1000);
}

// A UDP checksum that sums to 0 is sent as 0xffff (RFC 768) by both: found
// by trying source ports (the hash's top bits) until the builder writes one.
TEST(EncapTemplate, MatchesTheBuilderWhereTheUdpChecksumWouldBeZero) {
  for (const EncapKind kind : {EncapKind::Gue4, EncapKind::Gue6}) {
    const EncapTarget target = targetFor(kind);
    const auto frame = clientPacket(IpVersion::V4, true, 21).build();
    const Buffer input = withHeadroom(frame);
    const PacketView view = viewOf(input);
    const std::size_t udpAt = 14 + (kind == EncapKind::Gue4 ? 20 : 40);
    bool found = false;
    for (std::uint64_t port = 0; port < 0x4000 && !found; ++port) {
      Buffer a = input;
      const std::uint64_t hash = port << 50;
      const auto r = encapsulateAny(a.bytes, a.dataOffset, a.frameLength, view, target, hash);
      ASSERT_TRUE(r.ok());
      if (loadAt<Be16>(a.bytes, r.dataOffset + udpAt + 6).host() != 0xffff) continue;
      found = true;
      compareWithReference(input, view, target, hash, nullptr,
                           std::string(toString(kind)) + " checksum 0xffff");
    }
    EXPECT_TRUE(found) << toString(kind) << ": no source port gave a zero checksum";
  }
}

// A template never built drops every packet and writes nothing.
TEST(EncapTemplate, UnbuiltTemplateDropsAndWritesNothing) {
  const auto frame = clientPacket(IpVersion::V4, false, 10).build();
  Buffer b = withHeadroom(frame);
  const Buffer before = b;
  const PacketView view = viewOf(b);
  const EncapTemplate t;
  EXPECT_EQ(t.write(b.bytes, b.dataOffset, b.frameLength, view, 1).drop, DropReason::Truncated);
  EXPECT_TRUE(b.bytes == before.bytes);
}

// The snapshot builds each backend's template from its target (indexVips),
// and rebuilds it when called again after the target changed.
TEST(EncapTemplate, SnapshotIndexBuildsEveryBackendsTemplate) {
  ForwardingSnapshot s;
  s.backends.resize(3);
  s.backends[1].encap = targetFor(EncapKind::IpInIp4);
  s.backends[2].encap = targetFor(EncapKind::Gue6, 300);
  s.indexVips();
  const auto frame = clientPacket(IpVersion::V6, false, 10).build();
  const Buffer input = withHeadroom(frame);
  const PacketView view = viewOf(input);
  for (std::size_t i = 1; i <= 2; ++i) {
    Buffer a = input;
    Buffer b = input;
    const auto ra =
        encapsulateAny(a.bytes, a.dataOffset, a.frameLength, view, s.backends[i].encap, 9);
    const auto rb =
        s.backends[i].encapTemplate.write(b.bytes, b.dataOffset, b.frameLength, view, 9);
    ASSERT_TRUE(ra.ok() && rb.ok()) << i;
    expectSameResult(ra, rb, "backend " + std::to_string(i));
    EXPECT_TRUE(a.bytes == b.bytes) << i;
  }
  s.backends[1].encap.kind = EncapKind::Gue4;
  s.indexVips();
  Buffer b = input;
  const auto r = s.backends[1].encapTemplate.write(b.bytes, b.dataOffset, b.frameLength, view, 9);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.frameLength, encapHeaderBytes(EncapKind::Gue4, false) + view.l3Length);
}

}  // namespace
}  // namespace spillway
