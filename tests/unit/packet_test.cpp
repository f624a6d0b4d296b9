// Parser edge cases: every malformed input yields its typed drop reason and
// nothing is read past the span (the ASan build in scripts/test checks that).
#include "spillway/packet.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "packet_builder.hpp"

namespace spillway {
namespace {

using test::PacketBuilder;

// Parses a copy that ends exactly where the data ends, so an over-read is a
// heap overflow under ASan rather than a read of slack capacity.
PacketView parseExact(const std::vector<std::byte>& frame) {
  auto* copy = new std::byte[frame.size() == 0 ? 1 : frame.size()];
  std::copy(frame.begin(), frame.end(), copy);
  auto v = parsePacket(std::span<const std::byte>(copy, frame.size()));
  delete[] copy;
  return v;
}

void setByte(std::vector<std::byte>& f, std::size_t at, std::uint8_t value) {
  f.at(at) = std::byte(value);
}

// Rewrites the IPv4 header checksum of an untagged frame after an edit.
void fixIpv4Checksum(std::vector<std::byte>& f) {
  const std::size_t len = (std::to_integer<std::size_t>(f.at(14)) & 0x0f) * 4;
  f.at(24) = f.at(25) = std::byte{0};
  const std::uint16_t c = internetChecksum(std::span<const std::byte>(f).subspan(14, len));
  f.at(24) = std::byte(c >> 8);
  f.at(25) = std::byte(c & 0xff);
}

TEST(Packet, Ipv4TcpSyn) {
  auto f = PacketBuilder()
               .ipv4("10.0.0.1", "192.0.2.10", 63, 0xb9)
               .tcp(40000, 443, kTcpSyn)
               .payload(10)
               .build();
  auto v = parseExact(f);
  ASSERT_TRUE(v.ok()) << dropReasonName(v.drop);
  EXPECT_EQ(v.kind, PacketKind::Ip);
  EXPECT_TRUE(v.l3Valid);
  EXPECT_EQ(v.l3Offset, 14);
  EXPECT_EQ(v.l4Offset, 34);
  EXPECT_EQ(v.l3Length, 20 + 20 + 10);
  EXPECT_EQ(v.key.version, IpVersion::V4);
  EXPECT_EQ(v.key.src, test::ipBytes("10.0.0.1"));
  EXPECT_EQ(v.key.dst, test::ipBytes("192.0.2.10"));
  EXPECT_EQ(v.key.srcPort.host(), 40000);
  EXPECT_EQ(v.key.dstPort.host(), 443);
  EXPECT_EQ(v.key.proto, 6);
  EXPECT_EQ(v.tcpFlags, kTcpSyn);
  EXPECT_EQ(v.ttl, 63);
  EXPECT_EQ(v.tos, 0xb9);
  EXPECT_TRUE(v.dontFragment);
  EXPECT_FALSE(v.hasVlan);
}

TEST(Packet, VlanTaggedUdp) {
  auto f = PacketBuilder()
               .vlan(0x2064)
               .ipv4("10.0.0.1", "192.0.2.10", 64, 0, false)
               .udp(5000, 53)
               .payload(4)
               .build();
  auto v = parseExact(f);
  ASSERT_TRUE(v.ok()) << dropReasonName(v.drop);
  EXPECT_TRUE(v.hasVlan);
  EXPECT_EQ(v.vlanTci, 0x2064);
  EXPECT_EQ(v.l3Offset, 18);
  EXPECT_EQ(v.key.proto, 17);
  EXPECT_EQ(v.key.dstPort.host(), 53);
  EXPECT_FALSE(v.dontFragment);
}

TEST(Packet, StackedVlanDropped) {
  auto f = PacketBuilder().vlan(10).vlan(20).ipv4("10.0.0.1", "10.0.0.2").tcp(1, 2).build();
  EXPECT_EQ(parseExact(f).drop, DropReason::VlanStacked);
}

TEST(Packet, ArpIsNonIpForTheKernel) {
  std::vector<std::byte> f(42, std::byte{0});
  setByte(f, 12, 0x08);
  setByte(f, 13, 0x06);
  auto v = parseExact(f);
  EXPECT_TRUE(v.ok());
  EXPECT_EQ(v.kind, PacketKind::NonIp);
  EXPECT_EQ(v.etherType, kEtherTypeArp);
  EXPECT_FALSE(v.l3Valid);
}

TEST(Packet, Ipv4OptionsAreSkipped) {
  for (std::size_t words = 1; words <= 10; ++words) {
    std::vector<std::uint8_t> options(words * 4, 0x01);  // NOPs
    auto f = PacketBuilder().ipv4("10.0.0.1", "10.0.0.2").ipv4Options(options).tcp(7, 8).build();
    auto v = parseExact(f);
    ASSERT_TRUE(v.ok()) << words;
    EXPECT_EQ(v.l4Offset, 14 + 20 + words * 4);
    EXPECT_EQ(v.key.dstPort.host(), 8);
  }
}

TEST(Packet, Ipv4BadHeaderLength) {
  auto f = PacketBuilder().ipv4("10.0.0.1", "10.0.0.2").tcp(1, 2).build();
  for (std::uint8_t ihl = 0; ihl < 5; ++ihl) {
    setByte(f, 14, static_cast<std::uint8_t>(0x40 | ihl));
    EXPECT_EQ(parseExact(f).drop, DropReason::BadIpHeaderLength) << int(ihl);
  }
  setByte(f, 14, 0x4f);  // 60-byte header in a 40-byte packet
  auto v = parseExact(f);
  EXPECT_FALSE(v.ok());
  EXPECT_FALSE(v.l3Valid);
}

TEST(Packet, Ipv4BadTotalLength) {
  auto f = PacketBuilder().ipv4("10.0.0.1", "10.0.0.2").tcp(1, 2).build();
  setByte(f, 16, 0);
  setByte(f, 17, 19);  // shorter than the header
  EXPECT_EQ(parseExact(f).drop, DropReason::BadTotalLength);
  setByte(f, 17, 41);  // one byte past the frame
  EXPECT_EQ(parseExact(f).drop, DropReason::BadTotalLength);
  setByte(f, 16, 0xff);
  setByte(f, 17, 0xff);
  EXPECT_EQ(parseExact(f).drop, DropReason::BadTotalLength);
}

TEST(Packet, EthernetPaddingIgnored) {
  auto f = PacketBuilder().ipv4("10.0.0.1", "10.0.0.2").udp(1, 2).build();  // 42 bytes
  f.resize(60, std::byte{0xee});
  auto v = parseExact(f);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v.l3Length, 28);
}

// Issue #13: the IPv4 header checksum is verified, options included; a bad
// one keeps the addresses (host traffic still goes to the kernel).
TEST(Packet, Ipv4HeaderChecksumIsVerified) {
  for (std::size_t words : {0u, 1u, 10u}) {
    std::vector<std::uint8_t> options(words * 4, 0x01);
    auto f = PacketBuilder().ipv4("10.0.0.1", "10.0.0.2").ipv4Options(options).tcp(7, 8).build();
    EXPECT_EQ(parseExact(f).drop, DropReason::None) << words;
    for (const std::size_t at : {std::size_t{14 + 10}, std::size_t{14 + 12}, std::size_t{14 + 19},
                                 std::size_t{14 + 20} + words * 4 - 1}) {
      auto g = f;
      g[at] ^= std::byte{0x10};
      const PacketView v = parseExact(g);
      EXPECT_EQ(v.drop, DropReason::BadIpChecksum) << words << " " << at;
      EXPECT_TRUE(v.l3Valid);
    }
  }
  // A fragment with a bad checksum is a bad checksum first.
  auto frag = PacketBuilder().ipv4("10.0.0.1", "10.0.0.2").ipv4Fragment(0, true).tcp(7, 8).build();
  EXPECT_EQ(parseExact(frag).drop, DropReason::Ipv4Fragment);
  frag[14 + 11] ^= std::byte{1};
  EXPECT_EQ(parseExact(frag).drop, DropReason::BadIpChecksum);
}

TEST(Packet, Ipv4FragmentsKeepAddresses) {
  auto first = PacketBuilder().ipv4("10.0.0.1", "10.0.0.2").ipv4Fragment(0, true).tcp(1, 2).build();
  auto later =
      PacketBuilder().ipv4("10.0.0.1", "10.0.0.2").ipv4Fragment(185, false).tcp(1, 2).build();
  for (const auto& f : {first, later}) {
    auto v = parseExact(f);
    EXPECT_EQ(v.drop, DropReason::Ipv4Fragment);
    EXPECT_TRUE(v.l3Valid);  // the data path can still tell VIP from host traffic
    EXPECT_EQ(v.key.dst, test::ipBytes("10.0.0.2"));
  }
}

TEST(Packet, TtlExhausted) {
  for (std::uint8_t ttl : {0, 1}) {
    auto f4 = PacketBuilder().ipv4("10.0.0.1", "10.0.0.2", ttl).tcp(1, 2).build();
    auto v = parseExact(f4);
    EXPECT_EQ(v.drop, DropReason::TtlExhausted);
    EXPECT_TRUE(v.l3Valid);
    auto f6 = PacketBuilder().ipv6("2001:db8::1", "2001:db8::2", ttl).tcp(1, 2).build();
    EXPECT_EQ(parseExact(f6).drop, DropReason::TtlExhausted);
  }
  auto ok = PacketBuilder().ipv4("10.0.0.1", "10.0.0.2", 2).tcp(1, 2).build();
  EXPECT_TRUE(parseExact(ok).ok());
}

TEST(Packet, UnsupportedProtocolKeepsL3) {
  auto f = PacketBuilder().ipv4("10.0.0.1", "10.0.0.2").protocol(47).payload(20).build();
  auto v = parseExact(f);
  EXPECT_EQ(v.drop, DropReason::UnsupportedProtocol);
  EXPECT_TRUE(v.l3Valid);
  EXPECT_EQ(v.key.proto, 47);
}

TEST(Packet, TcpHeaderLength) {
  auto f = PacketBuilder().ipv4("10.0.0.1", "10.0.0.2").tcp(1, 2).payload(8).build();
  const std::size_t doffAt = 14 + 20 + 12;
  setByte(f, doffAt, 4 << 4);
  EXPECT_EQ(parseExact(f).drop, DropReason::BadTcpHeaderLength);
  setByte(f, doffAt, 7 << 4);  // 28 bytes: fits in 20 + 8 payload
  EXPECT_TRUE(parseExact(f).ok());
  setByte(f, doffAt, 8 << 4);  // 32 bytes: past the IP payload
  EXPECT_EQ(parseExact(f).drop, DropReason::BadTcpHeaderLength);
}

TEST(Packet, TcpHeaderCutByIpLength) {
  auto f = PacketBuilder().ipv4("10.0.0.1", "10.0.0.2").tcp(1, 2).build();
  setByte(f, 17, 20 + 19);  // IP says the TCP header is 19 bytes long
  fixIpv4Checksum(f);
  EXPECT_EQ(parseExact(f).drop, DropReason::Truncated);
}

TEST(Packet, UdpLength) {
  auto f = PacketBuilder().ipv4("10.0.0.1", "10.0.0.2").udp(1, 2).payload(4).build();
  const std::size_t lenAt = 14 + 20 + 4;
  setByte(f, lenAt + 1, 7);
  EXPECT_EQ(parseExact(f).drop, DropReason::BadUdpLength);
  setByte(f, lenAt + 1, 13);
  EXPECT_EQ(parseExact(f).drop, DropReason::BadUdpLength);
  setByte(f, lenAt + 1, 10);  // shorter than the IP payload is allowed
  EXPECT_TRUE(parseExact(f).ok());
}

TEST(Packet, VersionDisagreesWithEtherType) {
  auto f = PacketBuilder().ipv4("10.0.0.1", "10.0.0.2").tcp(1, 2).build();
  setByte(f, 14, 0x65);
  EXPECT_EQ(parseExact(f).drop, DropReason::BadIpVersion);
  auto g = PacketBuilder().ipv6("2001:db8::1", "2001:db8::2").tcp(1, 2).build();
  setByte(g, 14, 0x45);
  EXPECT_EQ(parseExact(g).drop, DropReason::BadIpVersion);
}

TEST(Packet, Ipv6Tcp) {
  auto f = PacketBuilder().ipv6("2001:db8::1", "2001:db8::10", 64, 0x2e).tcp(50000, 8443).build();
  auto v = parseExact(f);
  ASSERT_TRUE(v.ok()) << dropReasonName(v.drop);
  EXPECT_EQ(v.key.version, IpVersion::V6);
  EXPECT_EQ(v.key.src, test::ipBytes("2001:db8::1"));
  EXPECT_EQ(v.key.dst, test::ipBytes("2001:db8::10"));
  EXPECT_EQ(v.key.dstPort.host(), 8443);
  EXPECT_EQ(v.l4Offset, 14 + 40);
  EXPECT_EQ(v.l3Length, 60);
  EXPECT_EQ(v.tos, 0x2e);
}

TEST(Packet, Ipv6ExtensionHeadersWalked) {
  auto f = PacketBuilder()
               .ipv6("2001:db8::1", "2001:db8::10")
               .ipv6Extension(0, 6)    // hop-by-hop, 8 bytes
               .ipv6Extension(60, 14)  // destination options, 16 bytes
               .ipv6Extension(43, 22)  // routing, 24 bytes
               .ipv6Extension(44)      // atomic fragment, 8 bytes
               .udp(1000, 2000)
               .payload(3)
               .build();
  auto v = parseExact(f);
  ASSERT_TRUE(v.ok()) << dropReasonName(v.drop);
  EXPECT_EQ(v.l4Offset, 14 + 40 + 8 + 16 + 24 + 8);
  EXPECT_EQ(v.key.proto, 17);
  EXPECT_EQ(v.key.srcPort.host(), 1000);
}

TEST(Packet, Ipv6ExtensionHeaderBound) {
  PacketBuilder exact;
  exact.ipv6("2001:db8::1", "2001:db8::10");
  for (int i = 0; i < kMaxIpv6ExtensionHeaders; ++i) exact.ipv6Extension(60);
  EXPECT_TRUE(parseExact(exact.tcp(1, 2).build()).ok());
  PacketBuilder over;
  over.ipv6("2001:db8::1", "2001:db8::10");
  for (int i = 0; i <= kMaxIpv6ExtensionHeaders; ++i) over.ipv6Extension(60);
  auto v = parseExact(over.tcp(1, 2).build());
  EXPECT_EQ(v.drop, DropReason::ExtensionHeaderLimit);
  EXPECT_TRUE(v.l3Valid);
}

TEST(Packet, Ipv6Fragments) {
  auto first = PacketBuilder()
                   .ipv6("2001:db8::1", "2001:db8::10")
                   .ipv6Extension(44)
                   .ipv6Fragment(0, true)
                   .tcp(1, 2)
                   .build();
  auto later = PacketBuilder()
                   .ipv6("2001:db8::1", "2001:db8::10")
                   .ipv6Extension(44)
                   .ipv6Fragment(100, false)
                   .tcp(1, 2)
                   .build();
  EXPECT_EQ(parseExact(first).drop, DropReason::Ipv6Fragment);
  EXPECT_EQ(parseExact(later).drop, DropReason::Ipv6Fragment);
}

TEST(Packet, Ipv6EspAndNoNextHeaderUnsupported) {
  for (std::uint8_t nh : {50, 59}) {
    auto f = PacketBuilder().ipv6("2001:db8::1", "2001:db8::10").protocol(nh).payload(16).build();
    auto v = parseExact(f);
    EXPECT_EQ(v.drop, DropReason::UnsupportedProtocol) << int(nh);
    EXPECT_TRUE(v.l3Valid);
  }
}

TEST(Packet, Ipv6ExtensionPastEnd) {
  auto f = PacketBuilder().ipv6("2001:db8::1", "2001:db8::10").ipv6Extension(60).tcp(1, 2).build();
  setByte(f, 14 + 40 + 1, 200);  // claims 1608 bytes
  EXPECT_EQ(parseExact(f).drop, DropReason::Truncated);
}

TEST(Packet, Ipv6PayloadLength) {
  auto f = PacketBuilder().ipv6("2001:db8::1", "2001:db8::10").tcp(1, 2).build();
  setByte(f, 18, 0);
  setByte(f, 19, 0);  // jumbogram marker
  EXPECT_EQ(parseExact(f).drop, DropReason::BadTotalLength);
  setByte(f, 19, 21);
  EXPECT_EQ(parseExact(f).drop, DropReason::BadTotalLength);
}

TEST(Packet, IcmpFamiliesMustMatch) {
  auto wrong = PacketBuilder().ipv4("10.0.0.1", "10.0.0.2").protocol(58).payload(8).build();
  EXPECT_EQ(parseExact(wrong).drop, DropReason::UnsupportedProtocol);
  auto echo =
      PacketBuilder().ipv4("10.0.0.1", "10.0.0.2").icmp(kIcmpEchoRequest, 0, 0x10001).build();
  auto v = parseExact(echo);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v.icmpType, kIcmpEchoRequest);
  EXPECT_FALSE(isIcmpError(v));
}

// Every prefix of a valid frame parses without reading past it, and a prefix
// that cuts the IP packet is never accepted.
TEST(Packet, EveryPrefixIsSafe) {
  std::vector<std::vector<std::byte>> frames = {
      PacketBuilder()
          .ipv4("10.0.0.1", "10.0.0.2")
          .ipv4Options({1, 1, 1, 1})
          .tcp(1, 2)
          .payload(5)
          .build(),
      PacketBuilder()
          .vlan(3)
          .ipv6("2001:db8::1", "2001:db8::10")
          .ipv6Extension(0)
          .ipv6Extension(44)
          .udp(1, 2)
          .payload(5)
          .build(),
      PacketBuilder().ipv6("2001:db8::1", "2001:db8::10").icmp(kIcmp6EchoRequest, 0).build(),
  };
  for (const auto& full : frames) {
    ASSERT_TRUE(parseExact(full).ok());
    for (std::size_t n = 0; n < full.size(); ++n) {
      std::vector<std::byte> prefix(full.begin(), full.begin() + static_cast<long>(n));
      EXPECT_FALSE(parseExact(prefix).ok()) << "prefix " << n;
    }
  }
}

// A corpus of malformed frames made by an independent tool (scapy; see
// tests/data/make_malformed_corpus.py), each with the reason it must get.
TEST(Packet, MalformedCorpus) {
  std::ifstream in(SPILLWAY_SOURCE_ROOT "/tests/data/malformed_packets.txt");
  ASSERT_TRUE(in) << "missing tests/data/malformed_packets.txt";
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name, reason, hex;
    fields >> name >> reason >> hex;
    std::vector<std::byte> frame;
    for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
      frame.push_back(std::byte(std::stoul(hex.substr(i, 2), nullptr, 16)));
    }
    auto v = parseExact(frame);
    EXPECT_EQ(dropReasonName(v.drop), reason) << name;
    ++cases;
  }
  EXPECT_GE(cases, 20);
}

TEST(IcmpError, FragNeededSteersByQuotedFlow) {
  // The backend's reply VIP:443 -> client:40000 hit a small MTU; a router
  // sends "fragmentation needed" to the VIP, quoting that reply.
  auto reply = PacketBuilder().ipv4("192.0.2.10", "10.0.0.1").tcp(443, 40000).payload(100).build();
  std::vector<std::uint8_t> quote;
  for (std::size_t i = 14; i < 14 + 28; ++i)
    quote.push_back(std::to_integer<std::uint8_t>(reply[i]));
  auto err = PacketBuilder()
                 .ipv4("198.51.100.1", "192.0.2.10")
                 .icmp(kIcmpDestUnreachable, kIcmpCodeFragNeeded, 1400)
                 .payload(quote)
                 .build();
  auto v = parseExact(err);
  ASSERT_TRUE(v.ok());
  ASSERT_TRUE(isIcmpError(v));
  auto flow = parseIcmpError(err, v);
  ASSERT_EQ(flow.drop, DropReason::None);
  EXPECT_EQ(flow.clientFlow.src, test::ipBytes("10.0.0.1"));
  EXPECT_EQ(flow.clientFlow.dst, test::ipBytes("192.0.2.10"));
  EXPECT_EQ(flow.clientFlow.srcPort.host(), 40000);
  EXPECT_EQ(flow.clientFlow.dstPort.host(), 443);
  EXPECT_EQ(flow.clientFlow.proto, 6);
  // Same key as the client's own packets, so the same flow hash.
  auto client = parseExact(PacketBuilder().ipv4("10.0.0.1", "192.0.2.10").tcp(40000, 443).build());
  EXPECT_EQ(flow.clientFlow, client.key);

  // Cut the quote inside the ports.
  std::vector<std::uint8_t> shortQuote(quote.begin(), quote.begin() + 22);
  auto cut = PacketBuilder()
                 .ipv4("198.51.100.1", "192.0.2.10")
                 .icmp(kIcmpDestUnreachable, kIcmpCodeFragNeeded, 1400)
                 .payload(shortQuote)
                 .build();
  auto cv = parseExact(cut);
  ASSERT_TRUE(cv.ok());
  EXPECT_EQ(parseIcmpError(cut, cv).drop, DropReason::IcmpInnerTruncated);
}

TEST(IcmpError, PacketTooBigV6AndBadQuotes) {
  auto reply = PacketBuilder().ipv6("2001:db8::10", "2001:db8:1::5").udp(4791, 50000).build();
  std::vector<std::uint8_t> quote;
  for (std::size_t i = 14; i < reply.size(); ++i)
    quote.push_back(std::to_integer<std::uint8_t>(reply[i]));
  auto err = PacketBuilder()
                 .ipv6("2001:db8:ff::1", "2001:db8::10")
                 .icmp(kIcmp6PacketTooBig, 0, 1280)
                 .payload(quote)
                 .build();
  auto v = parseExact(err);
  ASSERT_TRUE(v.ok());
  ASSERT_TRUE(isIcmpError(v));
  auto flow = parseIcmpError(err, v);
  ASSERT_EQ(flow.drop, DropReason::None);
  EXPECT_EQ(flow.clientFlow.src, test::ipBytes("2001:db8:1::5"));
  EXPECT_EQ(flow.clientFlow.dstPort.host(), 4791);
  EXPECT_EQ(flow.clientFlow.version, IpVersion::V6);

  // A quote that is not IPv6 inside an ICMPv6 error.
  quote[0] = 0x45;
  auto bad = PacketBuilder()
                 .ipv6("2001:db8:ff::1", "2001:db8::10")
                 .icmp(kIcmp6PacketTooBig, 0, 1280)
                 .payload(quote)
                 .build();
  auto bv = parseExact(bad);
  EXPECT_EQ(parseIcmpError(bad, bv).drop, DropReason::IcmpInnerMalformed);

  // A quoted ICMP packet is not a flow Spillway steers.
  auto ping = PacketBuilder().ipv4("192.0.2.10", "10.0.0.1").icmp(kIcmpEchoReply, 0).build();
  std::vector<std::uint8_t> pq;
  for (std::size_t i = 14; i < ping.size(); ++i)
    pq.push_back(std::to_integer<std::uint8_t>(ping[i]));
  auto err4 = PacketBuilder()
                  .ipv4("198.51.100.1", "192.0.2.10")
                  .icmp(kIcmpTimeExceeded, 0)
                  .payload(pq)
                  .build();
  auto v4 = parseExact(err4);
  EXPECT_EQ(parseIcmpError(err4, v4).drop, DropReason::IcmpUnsupported);
}

}  // namespace
}  // namespace spillway
