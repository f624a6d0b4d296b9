// ICMP replies built by the load balancer: "fragmentation needed", ICMPv6
// "packet too big" and echo replies; golden frames in tests/data/golden.
#include "spillway/icmp.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "golden_file.hpp"
#include "packet_builder.hpp"
#include "spillway/checksum.hpp"
#include "spillway/encap.hpp"
#include "spillway/icmp_rate_limit.hpp"
#include "spillway/packet.hpp"
#include "spillway/wire.hpp"

namespace spillway {
namespace {

using test::ipBytes;
using test::JsonObject;
using test::PacketBuilder;

constexpr MacAddress kOurMac{0x02, 0x00, 0x00, 0x00, 0x01, 0x01};
constexpr MacAddress kRouterMac{0x02, 0x00, 0x00, 0x00, 0x00, 0x01};
constexpr const char* kClient4 = "198.51.100.7";
constexpr const char* kVip4 = "192.0.2.10";
constexpr const char* kClient6 = "2001:db8:c::7";
constexpr const char* kVip6 = "2001:db8:f::10";
constexpr std::uint8_t kClientTos = 0x2a;  // DSCP AF11 + ECT(0)

// A client's TCP segment to the VIP with an IP length of `l3Length`.
std::vector<std::byte> clientSegment(IpVersion version, std::size_t l3Length, bool vlan = false,
                                     const char* client = nullptr) {
  PacketBuilder b;
  b.eth(kOurMac, kRouterMac);
  if (vlan) b.vlan(100);
  const bool v4 = version == IpVersion::V4;
  if (v4) {
    b.ipv4(client ? client : kClient4, kVip4, 57, kClientTos);
  } else {
    b.ipv6(client ? client : kClient6, kVip6, 57, kClientTos, 0xabcde);
  }
  b.tcp(40000, 443, kTcpAck, 0x11223344);
  std::vector<std::uint8_t> payload(l3Length - (v4 ? 20 : 40) - 20);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::uint8_t>(i);
  b.payload(std::move(payload));
  return b.build();
}

std::vector<std::byte> echoRequest(IpVersion version, bool vlan, std::size_t payload = 56) {
  PacketBuilder b;
  b.eth(kOurMac, kRouterMac);
  if (vlan) b.vlan(100);
  if (version == IpVersion::V4) {
    b.ipv4(kClient4, kVip4, 50, 0);
    b.icmp(kIcmpEchoRequest, 0, 0x42420007);
  } else {
    b.ipv6(kClient6, kVip6, 50, 0, 0x54321);
    b.icmp(kIcmp6EchoRequest, 0, 0x42420007);
  }
  std::vector<std::uint8_t> bytes(payload);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>(0x10 + i);
  b.payload(std::move(bytes));
  return b.build();
}

FlowKey reversed(const FlowKey& k) {
  FlowKey r = k;
  std::swap(r.src, r.dst);
  std::swap(r.srcPort, r.dstPort);
  return r;
}

// Checks an error frame built about `original`: L2, IP, ICMP header and MTU,
// the quote, both checksums, and that the parser steers it back to the flow.
void checkError(std::span<const std::byte> out, std::span<const std::byte> original,
                const PacketView& view, std::uint32_t mtu, bool steerable = true) {
  const bool v4 = view.key.version == IpVersion::V4;
  const std::size_t l2 = view.l3Offset;
  const std::size_t ipHeader = v4 ? 20 : 40;
  const std::size_t limit = v4 ? kIcmpv4ErrorMaxLength : kIcmpv6ErrorMaxLength;
  const std::size_t quote = std::min<std::size_t>(view.l3Length, limit - ipHeader - 8);
  ASSERT_EQ(out.size(), l2 + ipHeader + 8 + quote);
  ASSERT_LE(out.size() - l2, limit);

  const auto eth = loadAt<EthernetHeader>(out, 0);
  const auto origEth = loadAt<EthernetHeader>(original, 0);
  EXPECT_EQ(eth.dst, origEth.src);
  EXPECT_EQ(eth.src, origEth.dst);
  EXPECT_TRUE(std::equal(out.begin() + 12, out.begin() + static_cast<std::ptrdiff_t>(l2),
                         original.begin() + 12))
      << "EtherType and VLAN tag kept";

  const std::size_t icmpAt = l2 + ipHeader;
  const auto icmpBytes = out.subspan(icmpAt);
  const auto icmp = loadAt<IcmpHeader>(out, icmpAt);
  if (v4) {
    const auto ip = loadAt<Ipv4Header>(out, l2);
    const auto o = loadAt<Ipv4Header>(original, l2);
    EXPECT_EQ(ip.versionIhl, 0x45);
    EXPECT_EQ(internetChecksum(out.subspan(l2, 20)), 0) << "IPv4 header checksum";
    EXPECT_EQ(ip.totalLength.host(), out.size() - l2);
    EXPECT_EQ(ip.ttl, 64);
    EXPECT_EQ(ip.tos, 0xc0);
    EXPECT_EQ(ip.protocol, 1);
    EXPECT_EQ(ip.src, o.dst);
    EXPECT_EQ(ip.dst, o.src);
    EXPECT_EQ(icmp.type, 3);
    EXPECT_EQ(icmp.code, 4);
    EXPECT_EQ(icmp.rest.host(), mtu & 0xffff) << "next-hop MTU in the low 16 bits, high 16 zero";
    EXPECT_EQ(internetChecksum(icmpBytes), 0) << "ICMP checksum";
  } else {
    const auto ip = loadAt<Ipv6Header>(out, l2);
    const auto o = loadAt<Ipv6Header>(original, l2);
    EXPECT_EQ(ip.versionClassLabel.host(), (6u << 28) | (0xc0u << 20));
    EXPECT_EQ(ip.payloadLength.host(), out.size() - l2 - 40);
    EXPECT_EQ(ip.nextHeader, 58);
    EXPECT_EQ(ip.hopLimit, 64);
    EXPECT_EQ(ip.src, o.dst);
    EXPECT_EQ(ip.dst, o.src);
    EXPECT_EQ(icmp.type, 2);
    EXPECT_EQ(icmp.code, 0);
    EXPECT_EQ(icmp.rest.host(), mtu);
    const auto pseudo =
        pseudoHeaderSumV6(ip.src, ip.dst, 58, static_cast<std::uint32_t>(icmpBytes.size()));
    EXPECT_EQ(checksumFinish(checksumPartial(icmpBytes, pseudo)), 0) << "ICMPv6 checksum";
  }
  EXPECT_TRUE(std::equal(icmpBytes.begin() + 8, icmpBytes.end(),
                         original.begin() + static_cast<std::ptrdiff_t>(l2)))
      << "the quote is the original IP packet as received";

  // The parser takes it for an ICMP error and steers it by the quote: the
  // quote went client -> VIP, so the flow comes back with ends swapped.
  const auto parsed = parsePacket(out);
  ASSERT_TRUE(parsed.ok()) << dropReasonName(parsed.drop);
  EXPECT_TRUE(parsed.isIcmp());
  ASSERT_TRUE(isIcmpError(parsed));
  if (!steerable) return;
  const auto flow = parseIcmpError(out, parsed);
  ASSERT_EQ(flow.drop, DropReason::None) << dropReasonName(flow.drop);
  EXPECT_EQ(flow.clientFlow, reversed(view.key));
  EXPECT_EQ(flow.innerL3Offset, icmpAt + 8);
}

struct Built {
  std::vector<std::byte> frame;
  std::size_t length = 0;
};

Built buildError(std::span<const std::byte> original, const PacketView& view, std::uint32_t mtu,
                 std::size_t room = 2048) {
  Built b;
  b.frame.assign(room, std::byte{0xee});
  b.length =
      view.key.version == IpVersion::V4
          ? buildFragmentationNeeded(original, view, static_cast<std::uint16_t>(mtu), b.frame)
          : buildPacketTooBig(original, view, mtu, b.frame);
  b.frame.resize(b.length);
  return b;
}

// --- golden frames ----------------------------------------------------------

struct IcmpCase {
  std::string name;
  IpVersion version;
  bool vlan;
  bool echo;
  EncapKind kind;  // errors: the encapsulation that found the packet too big
};

void PrintTo(const IcmpCase& c, std::ostream* os) {
  *os << c.name;
}

std::vector<IcmpCase> goldenCases() {
  return {
      {"frag_needed_ip4", IpVersion::V4, false, false, EncapKind::IpInIp4},
      {"frag_needed_ip4_vlan", IpVersion::V4, true, false, EncapKind::Gue4},
      {"packet_too_big_ip6", IpVersion::V6, false, false, EncapKind::Gue6},
      {"packet_too_big_ip6_vlan", IpVersion::V6, true, false, EncapKind::IpInIp6},
      {"echo_reply_ip4", IpVersion::V4, false, true, EncapKind::IpInIp4},
      {"echo_reply_ip6_vlan", IpVersion::V6, true, true, EncapKind::IpInIp4},
  };
}

std::string expectedJson(const IcmpCase& c, const PacketView& view, std::size_t outLength,
                         std::uint32_t mtu) {
  const bool v4 = c.version == IpVersion::V4;
  JsonObject eth;
  eth.add("src", test::macText(kOurMac)).add("dst", test::macText(kRouterMac));
  if (c.vlan) {
    eth.add("vlan", 100LL);
  } else {
    eth.addNull("vlan");
  }
  JsonObject ip;
  ip.add("version", v4 ? 4LL : 6LL)
      .add("src", v4 ? kVip4 : kVip6)
      .add("dst", v4 ? kClient4 : kClient6)
      .add("proto", v4 ? 1LL : 58LL)
      .add("ttl", 64LL)
      .add("tos", c.echo ? 0LL : 0xc0LL)
      .add("length", static_cast<long long>(outLength - view.l3Offset));
  JsonObject icmp;
  JsonObject j;
  j.add("case", c.name).add("type", "icmp").add("eth", eth).add("ip", ip);
  if (c.echo) {
    icmp.add("type", v4 ? 0LL : 129LL).add("code", 0LL).add("id", 0x4242LL).add("seq", 7LL);
    j.add("icmp", icmp).addNull("quote");
  } else {
    const std::size_t limit = v4 ? kIcmpv4ErrorMaxLength : kIcmpv6ErrorMaxLength;
    icmp.add("type", v4 ? 3LL : 2LL)
        .add("code", v4 ? 4LL : 0LL)
        .add("mtu", static_cast<long long>(mtu));
    JsonObject quote;
    quote
        .add("length",
             static_cast<long long>(std::min<std::size_t>(view.l3Length, limit - (v4 ? 28 : 48))))
        .add("src", v4 ? kClient4 : kClient6)
        .add("dst", v4 ? kVip4 : kVip6)
        .add("proto", 6LL)
        .add("sport", 40000LL)
        .add("dport", 443LL);
    j.add("icmp", icmp).add("quote", quote);
  }
  return j.render();
}

class IcmpGolden : public ::testing::TestWithParam<IcmpCase> {};

TEST_P(IcmpGolden, MatchesGolden) {
  const IcmpCase& c = GetParam();
  std::vector<std::byte> input =
      c.echo ? echoRequest(c.version, c.vlan) : clientSegment(c.version, 1500, c.vlan);
  EXPECT_TRUE(test::matchesGoldenHex(c.name + ".in.hex", input));
  const auto view = parsePacket(input);
  ASSERT_TRUE(view.ok()) << dropReasonName(view.drop);

  std::vector<std::byte> out;
  std::uint32_t mtu = 0;
  if (c.echo) {
    out = input;
    const auto n = buildEchoReply(out, view);
    ASSERT_GT(n, 0u);
    out.resize(n);
  } else {
    // The way the data path gets here: encapsulation refuses the packet.
    std::vector<std::byte> buffer(128);
    buffer.insert(buffer.end(), input.begin(), input.end());
    EncapTarget target;
    target.kind = c.kind;
    const bool outerV4 = outerIpVersion(c.kind) == IpVersion::V4;
    target.source = ipBytes(outerV4 ? "10.1.0.1" : "fd00:1::1");
    target.backend = ipBytes(outerV4 ? "10.2.0.20" : "fd00:2::20");
    const auto r = encapsulateAny(buffer, 128, input.size(), view, target, 99);
    ASSERT_EQ(r.drop, DropReason::MtuExceeded);
    EXPECT_EQ(r.icmpMtu, kDefaultEgressMtu - encapOverhead(c.kind));
    mtu = r.icmpMtu;
    const auto built = buildError({buffer.data() + 128, input.size()}, view, mtu);
    ASSERT_GT(built.length, 0u);
    out = built.frame;
    checkError(out, input, view, mtu);
  }
  EXPECT_TRUE(test::matchesGoldenHex(c.name + ".out.hex", out));
  EXPECT_TRUE(test::matchesGoldenText(c.name + ".json", expectedJson(c, view, out.size(), mtu)));
}

INSTANTIATE_TEST_SUITE_P(Replies, IcmpGolden, ::testing::ValuesIn(goldenCases()),
                         [](const auto& param) { return param.param.name; });

// --- fragmentation needed ------------------------------------------------------

TEST(FragmentationNeeded, QuotesAtMost576BytesOfIp) {
  for (const bool vlan : {false, true}) {
    for (const std::size_t l3Length : {40u, 100u, 547u, 548u, 549u, 576u, 1500u, 9000u}) {
      SCOPED_TRACE("l3Length " + std::to_string(l3Length) + (vlan ? " vlan" : ""));
      const auto original = clientSegment(IpVersion::V4, l3Length, vlan);
      const auto view = parsePacket(original);
      ASSERT_TRUE(view.ok());
      const auto built = buildError(original, view, 1400, 10000);
      ASSERT_GT(built.length, 0u);
      checkError(built.frame, original, view, 1400);
    }
  }
}

TEST(FragmentationNeeded, QuotesIpOptionsAndEightBytesAtLeast) {
  PacketBuilder b;
  b.eth(kOurMac, kRouterMac)
      .ipv4(kClient4, kVip4)
      .ipv4Options(std::vector<std::uint8_t>(40, 1))  // 40 bytes of NOP: IHL 15
      .udp(5000, 53)
      .payload(1200);
  const auto original = b.build();
  const auto view = parsePacket(original);
  ASSERT_TRUE(view.ok()) << dropReasonName(view.drop);
  const auto built = buildError(original, view, 1280);
  checkError(built.frame, original, view, 1280);
  EXPECT_GE(built.length - 14 - 28, 60u + 8u);
}

TEST(FragmentationNeeded, ZeroWhenOutIsTooSmall) {
  const auto original = clientSegment(IpVersion::V4, 1500);
  const auto view = parsePacket(original);
  ASSERT_TRUE(view.ok());
  const std::size_t needed = 14 + 576;
  EXPECT_EQ(buildError(original, view, 1480, needed - 1).length, 0u);
  EXPECT_EQ(buildError(original, view, 1480, needed).length, needed);
  EXPECT_EQ(buildError(original, view, 1480, 0).length, 0u);
}

TEST(FragmentationNeeded, NeverAboutAnIcmpErrorOrANonUnicastSource) {
  PacketBuilder err;
  err.eth(kOurMac, kRouterMac).ipv4(kClient4, kVip4).icmp(kIcmpDestUnreachable, 3).payload(48);
  const auto errFrame = err.build();
  const auto errView = parsePacket(errFrame);
  ASSERT_TRUE(errView.ok());
  EXPECT_EQ(buildError(errFrame, errView, 1400).length, 0u);

  // An echo request is not an error: it may be answered with one.
  const auto echo = echoRequest(IpVersion::V4, false, 1400);
  const auto echoView = parsePacket(echo);
  ASSERT_TRUE(echoView.ok());
  EXPECT_GT(buildError(echo, echoView, 1400).length, 0u);

  for (const char* source : {"0.0.0.0", "127.0.0.1", "224.0.0.5", "239.1.2.3", "255.255.255.255"}) {
    const auto original = clientSegment(IpVersion::V4, 1500, false, source);
    const auto view = parsePacket(original);
    ASSERT_TRUE(view.l3Valid);
    EXPECT_EQ(buildError(original, view, 1400).length, 0u) << source;
  }
  // Wrong family.
  const auto v6 = clientSegment(IpVersion::V6, 1500);
  const auto v6View = parsePacket(v6);
  std::vector<std::byte> out(2048);
  EXPECT_EQ(buildFragmentationNeeded(v6, v6View, 1400, out), 0u);
}

// --- packet too big ------------------------------------------------------------

TEST(PacketTooBig, QuotesAtMost1280BytesOfIpv6) {
  for (const bool vlan : {false, true}) {
    for (const std::size_t l3Length : {60u, 500u, 1231u, 1232u, 1233u, 1500u, 9000u}) {
      SCOPED_TRACE("l3Length " + std::to_string(l3Length) + (vlan ? " vlan" : ""));
      const auto original = clientSegment(IpVersion::V6, l3Length, vlan);
      const auto view = parsePacket(original);
      ASSERT_TRUE(view.ok());
      const auto built = buildError(original, view, 1280, 10000);
      ASSERT_GT(built.length, 0u);
      checkError(built.frame, original, view, 1280);
    }
  }
}

TEST(PacketTooBig, CarriesA32BitMtuAndQuotesExtensionHeaders) {
  PacketBuilder b;
  b.eth(kOurMac, kRouterMac)
      .ipv6(kClient6, kVip6)
      .ipv6Extension(60, 14)  // destination options
      .tcp(40000, 443)
      .payload(9000);
  const auto original = b.build();
  const auto view = parsePacket(original);
  ASSERT_TRUE(view.ok()) << dropReasonName(view.drop);
  const auto built = buildError(original, view, 70000, 10000);
  ASSERT_EQ(built.length, 14u + 1280u);
  // parseIcmpError does not walk quoted extension headers (packet.cpp): no
  // steering round trip here.
  checkError(built.frame, original, view, 70000, false);
}

TEST(PacketTooBig, ZeroWhenOutIsTooSmallOrNotAllowed) {
  const auto original = clientSegment(IpVersion::V6, 1500);
  const auto view = parsePacket(original);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(buildError(original, view, 1280, 14 + 1279).length, 0u);
  EXPECT_EQ(buildError(original, view, 1280, 14 + 1280).length, 14u + 1280u);

  PacketBuilder err;
  err.eth(kOurMac, kRouterMac).ipv6(kClient6, kVip6).icmp(kIcmp6TimeExceeded, 0).payload(1400);
  const auto errFrame = err.build();
  const auto errView = parsePacket(errFrame);
  ASSERT_TRUE(errView.ok());
  EXPECT_EQ(buildError(errFrame, errView, 1280).length, 0u);

  for (const char* source : {"::", "::1", "ff02::1"}) {
    const auto o = clientSegment(IpVersion::V6, 1500, false, source);
    const auto v = parsePacket(o);
    ASSERT_TRUE(v.l3Valid);
    EXPECT_EQ(buildError(o, v, 1280).length, 0u) << source;
  }
  std::vector<std::byte> out(2048);
  const auto v4 = clientSegment(IpVersion::V4, 1500);
  EXPECT_EQ(buildPacketTooBig(v4, parsePacket(v4), 1280, out), 0u);
}

// --- echo reply ----------------------------------------------------------------

void checkEchoReply(std::span<const std::byte> reply, std::span<const std::byte> request,
                    const PacketView& requestView) {
  const bool v4 = requestView.key.version == IpVersion::V4;
  const std::size_t l2 = requestView.l3Offset;
  const std::size_t ipHeader = v4 ? 20 : 40;
  const std::size_t icmpLength = requestView.l3Length - (requestView.l4Offset - l2);
  ASSERT_EQ(reply.size(), l2 + ipHeader + icmpLength);
  const auto eth = loadAt<EthernetHeader>(reply, 0);
  const auto reqEth = loadAt<EthernetHeader>(request, 0);
  EXPECT_EQ(eth.dst, reqEth.src);
  EXPECT_EQ(eth.src, reqEth.dst);
  EXPECT_TRUE(std::equal(reply.begin() + 12, reply.begin() + static_cast<std::ptrdiff_t>(l2),
                         request.begin() + 12));
  const auto icmp = reply.subspan(l2 + ipHeader);
  const auto reqIcmp = request.subspan(requestView.l4Offset, icmpLength);
  if (v4) {
    EXPECT_EQ(internetChecksum(reply.subspan(l2, 20)), 0);
    EXPECT_EQ(internetChecksum(icmp), 0) << "ICMP checksum";
    EXPECT_EQ(std::to_integer<int>(icmp[0]), 0);
  } else {
    const auto ip = loadAt<Ipv6Header>(reply, l2);
    const auto pseudo =
        pseudoHeaderSumV6(ip.src, ip.dst, 58, static_cast<std::uint32_t>(icmp.size()));
    EXPECT_EQ(checksumFinish(checksumPartial(icmp, pseudo)), 0) << "ICMPv6 checksum";
    EXPECT_EQ(std::to_integer<int>(icmp[0]), 129);
    EXPECT_EQ(ip.versionClassLabel, loadAt<Ipv6Header>(request, l2).versionClassLabel);
  }
  EXPECT_TRUE(std::equal(icmp.begin() + 4, icmp.end(), reqIcmp.begin() + 4))
      << "identifier, sequence and data echoed";

  const auto parsed = parsePacket(reply);
  ASSERT_TRUE(parsed.ok()) << dropReasonName(parsed.drop);
  EXPECT_EQ(parsed.key.src, requestView.key.dst);
  EXPECT_EQ(parsed.key.dst, requestView.key.src);
  EXPECT_EQ(parsed.ttl, 64);
  EXPECT_EQ(parsed.icmpType, v4 ? kIcmpEchoReply : kIcmp6EchoReply);
  EXPECT_FALSE(isIcmpError(parsed));
}

TEST(EchoReply, InPlaceForBothFamiliesWithAndWithoutVlan) {
  for (const auto version : {IpVersion::V4, IpVersion::V6}) {
    for (const bool vlan : {false, true}) {
      SCOPED_TRACE(std::string(version == IpVersion::V4 ? "v4" : "v6") + (vlan ? " vlan" : ""));
      const auto request = echoRequest(version, vlan);
      const auto view = parsePacket(request);
      ASSERT_TRUE(view.ok());
      auto frame = request;
      const auto n = buildEchoReply(frame, view);
      ASSERT_EQ(n, request.size());
      checkEchoReply(std::span(frame).first(n), request, view);
    }
  }
}

TEST(EchoReply, DropsOptionsExtensionHeadersAndPadding) {
  PacketBuilder b4;
  b4.eth(kOurMac, kRouterMac)
      .ipv4(kClient4, kVip4)
      .ipv4Options({7, 7, 4, 0, 0, 0, 0, 0})  // record route, then padding
      .icmp(kIcmpEchoRequest, 0, 0x00010002)
      .payload(40, 0x77);
  PacketBuilder b6;
  b6.eth(kOurMac, kRouterMac)
      .ipv6(kClient6, kVip6)
      .ipv6Extension(0, 6)  // hop-by-hop
      .ipv6Extension(60, 14)
      .icmp(kIcmp6EchoRequest, 0, 0x00010002)
      .payload(40, 0x77);
  PacketBuilder small;
  small.eth(kOurMac, kRouterMac).ipv4(kClient4, kVip4).icmp(kIcmpEchoRequest, 0, 9);
  for (auto* builder : {&b4, &b6, &small}) {
    auto request = builder->build();
    if (builder == &small) request.resize(60, std::byte{0});  // Ethernet padding
    const auto view = parsePacket(request);
    ASSERT_TRUE(view.ok()) << dropReasonName(view.drop);
    auto frame = request;
    const auto n = buildEchoReply(frame, view);
    ASSERT_GT(n, 0u);
    EXPECT_LT(n, request.size());
    checkEchoReply(std::span(frame).first(n), request, view);
  }
}

TEST(EchoReply, OnlyForEchoRequests) {
  std::vector<std::vector<std::byte>> frames;
  PacketBuilder reply;
  reply.eth(kOurMac, kRouterMac).ipv4(kClient4, kVip4).icmp(kIcmpEchoReply, 0, 1).payload(8);
  frames.push_back(reply.build());
  PacketBuilder code;
  code.eth(kOurMac, kRouterMac).ipv4(kClient4, kVip4).icmp(kIcmpEchoRequest, 1, 1).payload(8);
  frames.push_back(code.build());
  PacketBuilder v6err;
  v6err.eth(kOurMac, kRouterMac).ipv6(kClient6, kVip6).icmp(kIcmp6PacketTooBig, 0).payload(48);
  frames.push_back(v6err.build());
  frames.push_back(clientSegment(IpVersion::V4, 100));
  PacketBuilder multicast;
  multicast.eth(kOurMac, kRouterMac).ipv4("224.0.0.1", kVip4).icmp(kIcmpEchoRequest, 0).payload(8);
  frames.push_back(multicast.build());
  for (auto& frame : frames) {
    const auto view = parsePacket(frame);
    const auto before = frame;
    EXPECT_EQ(buildEchoReply(frame, view), 0u);
    EXPECT_EQ(frame, before);
  }
}

// The limiter's arithmetic: buckets start full, refill at their rate to their
// burst, a refusal takes nothing, and both buckets must have a token.
TEST(IcmpRateLimiter, TokenBucketsPerSourceAndInTotal) {
  const FlowHasher hasher(7);
  const IpBytes a = test::ipBytes("10.9.0.1");
  const IpBytes b = test::ipBytes("2001:db8::1");
  IcmpRateLimiter slow(
      IcmpRateLimits{
          .perSecond = 1'000, .burst = 100, .perSourcePerSecond = 1, .perSourceBurst = 2},
      hasher);
  const std::uint64_t t = 5'000'000;
  EXPECT_TRUE(slow.allow(a, t));
  EXPECT_TRUE(slow.allow(a, t));
  EXPECT_FALSE(slow.allow(a, t));        // burst of 2 spent
  EXPECT_FALSE(slow.allow(a, t + 999));  // 0.999 of a token
  EXPECT_TRUE(slow.allow(a, t + 1'000));
  EXPECT_FALSE(slow.allow(a, t + 1'000));
  EXPECT_TRUE(slow.allow(b, t + 1'000));   // another source: its own bucket
  EXPECT_TRUE(slow.allow(a, t + 60'000));  // refilled, but only to the burst
  EXPECT_TRUE(slow.allow(a, t + 60'000));
  EXPECT_FALSE(slow.allow(a, t + 60'000));

  IcmpRateLimiter total(
      IcmpRateLimits{.perSecond = 2, .burst = 3, .perSourcePerSecond = 100, .perSourceBurst = 100},
      hasher);
  int allowed = 0;
  for (int i = 0; i < 10; ++i) allowed += total.allow(i % 2 ? a : b, t);
  EXPECT_EQ(allowed, 3);
  EXPECT_FALSE(total.allow(a, t + 499));
  EXPECT_TRUE(total.allow(a, t + 500));  // 2 a second: one per 500 ms
}

}  // namespace
}  // namespace spillway
