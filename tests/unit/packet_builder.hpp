// Test-only builder of Ethernet frames with correct lengths and checksums,
// used for inputs and expected outputs (in the spirit of Katran's fixtures).
//
//   auto frame = PacketBuilder().eth().ipv4("10.0.0.1", "192.0.2.10").tcp(40000, 443, kTcpSyn)
//                    .payload(32).build();
//
// Fields can be overridden after build() to make malformed packets.
#pragma once

#include <arpa/inet.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "spillway/checksum.hpp"
#include "spillway/flow_key.hpp"
#include "spillway/wire.hpp"

namespace spillway::test {

inline std::array<std::uint8_t, 4> v4(const std::string& text) {
  std::array<std::uint8_t, 4> a{};
  if (inet_pton(AF_INET, text.c_str(), a.data()) != 1) throw std::invalid_argument(text);
  return a;
}

inline std::array<std::uint8_t, 16> v6(const std::string& text) {
  std::array<std::uint8_t, 16> a{};
  if (inet_pton(AF_INET6, text.c_str(), a.data()) != 1) throw std::invalid_argument(text);
  return a;
}

inline IpBytes ipBytes(const std::string& text) {
  IpBytes b{};
  if (text.find(':') == std::string::npos) {
    auto a = v4(text);
    for (int i = 0; i < 4; ++i) b[i] = std::byte(a[i]);
  } else {
    auto a = v6(text);
    for (int i = 0; i < 16; ++i) b[i] = std::byte(a[i]);
  }
  return b;
}

class PacketBuilder {
 public:
  PacketBuilder& eth(MacAddress dst = {2, 0, 0, 0, 0, 2}, MacAddress src = {2, 0, 0, 0, 0, 1}) {
    ethDst_ = dst;
    ethSrc_ = src;
    return *this;
  }
  PacketBuilder& vlan(std::uint16_t tci) {
    vlans_.push_back(tci);
    return *this;
  }
  PacketBuilder& ipv4(const std::string& src, const std::string& dst, std::uint8_t ttl = 64,
                      std::uint8_t tos = 0, bool df = true) {
    version_ = 4;
    src4_ = v4(src);
    dst4_ = v4(dst);
    ttl_ = ttl;
    tos_ = tos;
    df_ = df;
    return *this;
  }
  PacketBuilder& ipv4Options(std::vector<std::uint8_t> options) {
    ipv4Options_ = std::move(options);  // must be a multiple of 4 bytes
    return *this;
  }
  PacketBuilder& ipv4Fragment(std::uint16_t offsetUnits, bool moreFragments) {
    fragOffset_ = offsetUnits;
    moreFragments_ = moreFragments;
    return *this;
  }
  // Fields of the IPv6 fragment header added with ipv6Extension(44).
  PacketBuilder& ipv6Fragment(std::uint16_t offsetUnits, bool moreFragments) {
    return ipv4Fragment(offsetUnits, moreFragments);
  }
  PacketBuilder& ipv6(const std::string& src, const std::string& dst, std::uint8_t hopLimit = 64,
                      std::uint8_t trafficClass = 0, std::uint32_t flowLabel = 0) {
    version_ = 6;
    src6_ = v6(src);
    dst6_ = v6(dst);
    ttl_ = hopLimit;
    tos_ = trafficClass;
    flowLabel_ = flowLabel;
    return *this;
  }
  // Appends a raw IPv6 extension header of `type` whose body (after the
  // next-header and length bytes) is `bodyBytes` long (8n - 2).
  PacketBuilder& ipv6Extension(std::uint8_t type, std::size_t bodyBytes = 6) {
    extensions_.push_back({type, bodyBytes});
    return *this;
  }
  PacketBuilder& tcp(std::uint16_t srcPort, std::uint16_t dstPort, std::uint8_t flags = kTcpAck,
                     std::uint32_t seq = 1000) {
    l4_ = static_cast<std::uint8_t>(IpProto::Tcp);
    srcPort_ = srcPort;
    dstPort_ = dstPort;
    tcpFlags_ = flags;
    seq_ = seq;
    return *this;
  }
  PacketBuilder& udp(std::uint16_t srcPort, std::uint16_t dstPort) {
    l4_ = static_cast<std::uint8_t>(IpProto::Udp);
    srcPort_ = srcPort;
    dstPort_ = dstPort;
    return *this;
  }
  // ICMP or ICMPv6 by the IP version; `rest` is the 4 bytes after the checksum.
  PacketBuilder& icmp(std::uint8_t type, std::uint8_t code, std::uint32_t rest = 0) {
    l4_ = version_ == 6 ? static_cast<std::uint8_t>(IpProto::Icmpv6)
                        : static_cast<std::uint8_t>(IpProto::Icmp);
    icmpType_ = type;
    icmpCode_ = code;
    icmpRest_ = rest;
    return *this;
  }
  // Any other L4 protocol number with an opaque payload.
  PacketBuilder& protocol(std::uint8_t proto) {
    l4_ = proto;
    return *this;
  }
  PacketBuilder& payload(std::size_t bytes, std::uint8_t fill = 0xab) {
    payload_.assign(bytes, fill);
    return *this;
  }
  PacketBuilder& payload(std::vector<std::uint8_t> bytes) {
    payload_ = std::move(bytes);
    return *this;
  }

  std::vector<std::byte> build() const;

 private:
  struct Extension {
    std::uint8_t type;
    std::size_t body;
  };
  MacAddress ethDst_{2, 0, 0, 0, 0, 2};
  MacAddress ethSrc_{2, 0, 0, 0, 0, 1};
  std::vector<std::uint16_t> vlans_;
  int version_ = 4;
  std::array<std::uint8_t, 4> src4_{}, dst4_{};
  std::array<std::uint8_t, 16> src6_{}, dst6_{};
  std::vector<std::uint8_t> ipv4Options_;
  std::vector<Extension> extensions_;
  std::uint16_t fragOffset_ = 0;
  bool moreFragments_ = false;
  std::uint8_t ttl_ = 64, tos_ = 0;
  bool df_ = true;
  std::uint32_t flowLabel_ = 0;
  std::uint8_t l4_ = static_cast<std::uint8_t>(IpProto::Tcp);
  std::uint16_t srcPort_ = 0, dstPort_ = 0;
  std::uint8_t tcpFlags_ = kTcpAck;
  std::uint32_t seq_ = 0;
  std::uint8_t icmpType_ = 0, icmpCode_ = 0;
  std::uint32_t icmpRest_ = 0;
  std::vector<std::uint8_t> payload_;
};

inline std::vector<std::byte> PacketBuilder::build() const {
  // L4 segment first, checksum filled once the pseudo header is known.
  std::vector<std::byte> l4;
  auto append = [](std::vector<std::byte>& out, const auto& header) {
    const auto* p = reinterpret_cast<const std::byte*>(&header);
    out.insert(out.end(), p, p + sizeof(header));
  };
  std::size_t checksumAt = SIZE_MAX;
  if (l4_ == static_cast<std::uint8_t>(IpProto::Tcp)) {
    TcpHeader t{};
    t.srcPort = Be16::fromHost(srcPort_);
    t.dstPort = Be16::fromHost(dstPort_);
    t.seq = Be32::fromHost(seq_);
    t.ack = Be32::fromHost((tcpFlags_ & kTcpAck) ? 1 : 0);
    t.dataOffset = 5 << 4;
    t.flags = tcpFlags_;
    t.window = Be16::fromHost(65535);
    append(l4, t);
    checksumAt = offsetof(TcpHeader, checksum);
  } else if (l4_ == static_cast<std::uint8_t>(IpProto::Udp)) {
    UdpHeader u{};
    u.srcPort = Be16::fromHost(srcPort_);
    u.dstPort = Be16::fromHost(dstPort_);
    u.length = Be16::fromHost(static_cast<std::uint16_t>(8 + payload_.size()));
    append(l4, u);
    checksumAt = offsetof(UdpHeader, checksum);
  } else if (l4_ == static_cast<std::uint8_t>(IpProto::Icmp) ||
             l4_ == static_cast<std::uint8_t>(IpProto::Icmpv6)) {
    IcmpHeader h{};
    h.type = icmpType_;
    h.code = icmpCode_;
    h.rest = Be32::fromHost(icmpRest_);
    append(l4, h);
    checksumAt = offsetof(IcmpHeader, checksum);
  }
  for (auto b : payload_) l4.push_back(std::byte(b));

  const auto l4Len = static_cast<std::uint32_t>(l4.size());
  if (checksumAt != SIZE_MAX) {
    std::uint32_t sum = 0;
    if (l4_ == static_cast<std::uint8_t>(IpProto::Icmp)) {
      sum = 0;  // ICMPv4 has no pseudo header
    } else if (version_ == 4) {
      sum = pseudoHeaderSumV4(src4_, dst4_, l4_, l4Len);
    } else {
      sum = pseudoHeaderSumV6(src6_, dst6_, l4_, l4Len);
    }
    auto c = checksumFinish(checksumPartial(l4, sum));
    if (l4_ == static_cast<std::uint8_t>(IpProto::Udp) && c == 0) c = 0xffff;
    l4[checksumAt] = std::byte(c >> 8);
    l4[checksumAt + 1] = std::byte(c & 0xff);
  }

  std::vector<std::byte> frame;
  EthernetHeader e{};
  e.dst = ethDst_;
  e.src = ethSrc_;
  const std::uint16_t ipType = version_ == 4 ? kEtherTypeIpv4 : kEtherTypeIpv6;
  e.etherType = Be16::fromHost(vlans_.empty() ? ipType : kEtherTypeVlan);
  append(frame, e);
  for (std::size_t i = 0; i < vlans_.size(); ++i) {
    VlanTag tag{};
    tag.tci = Be16::fromHost(vlans_[i]);
    tag.etherType = Be16::fromHost(i + 1 < vlans_.size() ? kEtherTypeVlan : ipType);
    append(frame, tag);
  }
  if (version_ == 4) {
    Ipv4Header ip{};
    const auto ihl = static_cast<std::uint8_t>(5 + ipv4Options_.size() / 4);
    ip.versionIhl = static_cast<std::uint8_t>(0x40 | ihl);
    ip.tos = tos_;
    ip.totalLength = Be16::fromHost(static_cast<std::uint16_t>(ihl * 4 + l4.size()));
    ip.id = Be16::fromHost(0x1234);
    ip.flagsFragment = Be16::fromHost(static_cast<std::uint16_t>(
        (df_ ? kIpv4FlagDf : 0) | (moreFragments_ ? kIpv4FlagMf : 0) | fragOffset_));
    ip.ttl = ttl_;
    ip.protocol = l4_;
    ip.src = src4_;
    ip.dst = dst4_;
    std::vector<std::byte> hdr;
    append(hdr, ip);
    for (auto b : ipv4Options_) hdr.push_back(std::byte(b));
    const auto c = internetChecksum(hdr);
    hdr[10] = std::byte(c >> 8);
    hdr[11] = std::byte(c & 0xff);
    frame.insert(frame.end(), hdr.begin(), hdr.end());
  } else {
    std::vector<std::byte> ext;
    for (std::size_t i = 0; i < extensions_.size(); ++i) {
      const std::uint8_t next = i + 1 < extensions_.size() ? extensions_[i + 1].type : l4_;
      ext.push_back(std::byte(next));
      if (extensions_[i].type == 44) {  // fragment header: fixed 8 bytes
        ext.push_back(std::byte(0));
        const std::uint16_t of =
            static_cast<std::uint16_t>((fragOffset_ << 3) | (moreFragments_ ? 1 : 0));
        ext.push_back(std::byte(of >> 8));
        ext.push_back(std::byte(of & 0xff));
        for (int k = 0; k < 4; ++k) ext.push_back(std::byte(0x42));
      } else {
        ext.push_back(std::byte((extensions_[i].body + 2) / 8 - 1));
        for (std::size_t k = 0; k < extensions_[i].body; ++k) ext.push_back(std::byte(0));
      }
    }
    Ipv6Header ip{};
    ip.versionClassLabel =
        Be32::fromHost((6u << 28) | (std::uint32_t{tos_} << 20) | (flowLabel_ & 0xfffff));
    ip.payloadLength = Be16::fromHost(static_cast<std::uint16_t>(ext.size() + l4.size()));
    ip.nextHeader = extensions_.empty() ? l4_ : extensions_[0].type;
    ip.hopLimit = ttl_;
    ip.src = src6_;
    ip.dst = dst6_;
    append(frame, ip);
    frame.insert(frame.end(), ext.begin(), ext.end());
  }
  frame.insert(frame.end(), l4.begin(), l4.end());
  return frame;
}

}  // namespace spillway::test
