#include "spillway/packet.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>

#include "spillway/wire.hpp"

namespace spillway {
namespace {

constexpr std::uint8_t kIpv6HopByHop = 0;
constexpr std::uint8_t kIpv6Routing = 43;
constexpr std::uint8_t kIpv6Fragment = 44;
constexpr std::uint8_t kIpv6Esp = 50;
constexpr std::uint8_t kIpv6Auth = 51;
constexpr std::uint8_t kIpv6NoNext = 59;
constexpr std::uint8_t kIpv6DestOptions = 60;
constexpr std::uint8_t kIpv6Mobility = 135;
constexpr std::uint8_t kIpv6Hip = 139;
constexpr std::uint8_t kIpv6Shim6 = 140;

constexpr std::uint8_t kProtoTcp = static_cast<std::uint8_t>(IpProto::Tcp);
constexpr std::uint8_t kProtoUdp = static_cast<std::uint8_t>(IpProto::Udp);
constexpr std::uint8_t kProtoIcmp = static_cast<std::uint8_t>(IpProto::Icmp);
constexpr std::uint8_t kProtoIcmpv6 = static_cast<std::uint8_t>(IpProto::Icmpv6);

// Written as one 16-byte value, so the word loads of the VIP lookup and the
// flow hash that follow forward from one store instead of stalling.
template <std::size_t N>
void copyAddress(IpBytes& to, const std::array<std::uint8_t, N>& from) noexcept {
  IpBytes address{};
  std::memcpy(address.data(), from.data(), N);
  to = address;
}

// Copied rather than `v = PacketView{}`, which g++ 12 builds on the stack in
// overlapping stores and reloads: a store-forwarding stall per frame.
constexpr PacketView kUnparsed{};

struct L3Result {
  DropReason drop = DropReason::Truncated;
  bool valid = false;  // addresses known
  std::uint8_t proto = 0;
  std::size_t l4Offset = 0;
  std::size_t end = 0;  // one past the IP packet as its header declares it
};

// True when the IPv4 header of `len` bytes (a multiple of 4, at least 20)
// at `p` sums to 0xffff in one's complement (RFC 1071): 32-bit native words
// summed into 64 bits, then folded; the byte order does not matter.
// The 20 bytes every header has are five fixed loads (the loop over a
// variable length cost ~28 instructions a frame); options, if any, loop.
bool ipv4HeaderChecksumOk(const std::byte* p, std::size_t len) noexcept {
  std::array<std::uint32_t, 5> base;
  std::memcpy(base.data(), p, sizeof base);
  std::uint64_t sum = std::uint64_t{base[0]} + base[1] + base[2] + base[3] + base[4];
  for (std::size_t i = sizeof base; i < len; i += 4) {
    std::uint32_t w;
    std::memcpy(&w, p + i, 4);
    sum += w;
  }
  sum = (sum & 0xffff'ffffULL) + (sum >> 32);
  sum = (sum & 0xffff'ffffULL) + (sum >> 32);
  sum = (sum & 0xffff) + (sum >> 16);
  sum = (sum & 0xffff) + (sum >> 16);
  return sum == 0xffff;
}

// IPv4 header at `off`. Fills key addresses, ttl, tos, DF.
L3Result parseIpv4(std::span<const std::byte> f, std::size_t off, PacketView& v) noexcept {
  L3Result r;
  if (f.size() < off + sizeof(Ipv4Header)) return r;
  const auto ip = loadAt<Ipv4Header>(f, off);
  if ((ip.versionIhl >> 4) != 4) {
    r.drop = DropReason::BadIpVersion;
    return r;
  }
  const std::size_t headerLen = std::size_t{ip.versionIhl & 0x0fu} * 4;
  if (headerLen < sizeof(Ipv4Header)) {
    r.drop = DropReason::BadIpHeaderLength;
    return r;
  }
  if (f.size() < off + headerLen) return r;
  const std::size_t total = ip.totalLength.host();
  if (total < headerLen || f.size() < off + total) {
    r.drop = DropReason::BadTotalLength;
    return r;
  }
  v.key.version = IpVersion::V4;
  copyAddress(v.key.src, ip.src);
  copyAddress(v.key.dst, ip.dst);
  v.key.proto = ip.protocol;
  v.ttl = ip.ttl;
  v.tos = ip.tos;
  const std::uint16_t frag = ip.flagsFragment.host();
  v.dontFragment = (frag & kIpv4FlagDf) != 0;
  r.valid = true;
  r.proto = ip.protocol;
  r.l4Offset = off + headerLen;
  r.end = off + total;
  if (!ipv4HeaderChecksumOk(f.data() + off, headerLen)) [[unlikely]] {
    r.drop = DropReason::BadIpChecksum;
    return r;
  }
  r.drop =
      (frag & (kIpv4FlagMf | kIpv4OffsetMask)) != 0 ? DropReason::Ipv4Fragment : DropReason::None;
  return r;
}

// IPv6 header at `off`, then its extension headers up to the upper layer.
L3Result parseIpv6(std::span<const std::byte> f, std::size_t off, PacketView& v) noexcept {
  L3Result r;
  if (f.size() < off + sizeof(Ipv6Header)) return r;
  const auto ip = loadAt<Ipv6Header>(f, off);
  const std::uint32_t vcl = ip.versionClassLabel.host();
  if ((vcl >> 28) != 6) {
    r.drop = DropReason::BadIpVersion;
    return r;
  }
  const std::size_t payload = ip.payloadLength.host();
  // A zero payload length means a jumbogram (RFC 2675), which Spillway does
  // not carry.
  if (payload == 0 || f.size() < off + sizeof(Ipv6Header) + payload) {
    r.drop = DropReason::BadTotalLength;
    return r;
  }
  v.key.version = IpVersion::V6;
  copyAddress(v.key.src, ip.src);
  copyAddress(v.key.dst, ip.dst);
  v.ttl = ip.hopLimit;
  v.tos = static_cast<std::uint8_t>(vcl >> 20);
  r.valid = true;
  r.end = off + sizeof(Ipv6Header) + payload;

  std::uint8_t next = ip.nextHeader;
  std::size_t cur = off + sizeof(Ipv6Header);
  for (int walked = 0;; ++walked) {
    switch (next) {
      case kIpv6HopByHop:
      case kIpv6Routing:
      case kIpv6DestOptions:
      case kIpv6Mobility:
      case kIpv6Hip:
      case kIpv6Shim6:
      case kIpv6Auth:
      case kIpv6Fragment:
        break;
      default:
        v.key.proto = next;
        r.proto = next;
        r.l4Offset = cur;
        r.drop = (next == kIpv6Esp || next == kIpv6NoNext) ? DropReason::UnsupportedProtocol
                                                           : DropReason::None;
        return r;
    }
    if (walked == kMaxIpv6ExtensionHeaders) {
      r.drop = DropReason::ExtensionHeaderLimit;
      return r;
    }
    if (r.end < cur + 8) {  // every extension header is at least 8 bytes
      r.drop = DropReason::Truncated;
      return r;
    }
    const auto ext = loadAt<Ipv6ExtensionHeader>(f, cur);
    std::size_t len;
    if (next == kIpv6Fragment) {
      const auto fh = loadAt<Ipv6FragmentHeader>(f, cur);
      const std::uint16_t of = fh.offsetFlags.host();
      // Atomic fragments (offset 0, M clear; RFC 6946) are whole packets.
      if ((of & 0xfff8) != 0 || (of & 1) != 0) {
        r.proto = fh.nextHeader;
        v.key.proto = fh.nextHeader;
        r.drop = DropReason::Ipv6Fragment;
        return r;
      }
      len = 8;
    } else if (next == kIpv6Auth) {
      len = (std::size_t{ext.length} + 2) * 4;  // RFC 4302: 4-octet units minus 2
    } else {
      len = (std::size_t{ext.length} + 1) * 8;
    }
    if (r.end < cur + len) {
      r.drop = DropReason::Truncated;
      return r;
    }
    next = ext.nextHeader;
    cur += len;
  }
}

}  // namespace

void parsePacket(std::span<const std::byte> frame, PacketView& v) noexcept {
  v = kUnparsed;
  if (frame.size() < sizeof(EthernetHeader)) return;  // Truncated
  // Only the EtherType: g++ 12 copies a whole 14-byte header through the
  // stack in overlapping 8-byte moves, a store-forwarding stall per frame.
  std::uint16_t type = loadAt<Be16>(frame, offsetof(EthernetHeader, etherType)).host();
  std::size_t off = sizeof(EthernetHeader);
  if (type == kEtherTypeVlan || type == kEtherTypeQinQ) {
    if (frame.size() < off + sizeof(VlanTag)) return;
    const auto tag = loadAt<VlanTag>(frame, off);
    v.hasVlan = true;
    v.vlanTci = tag.tci.host();
    type = tag.etherType.host();
    off += sizeof(VlanTag);
    if (type == kEtherTypeVlan || type == kEtherTypeQinQ) {
      v.etherType = type;
      v.drop = DropReason::VlanStacked;
      return;
    }
  }
  v.etherType = type;
  v.l3Offset = static_cast<std::uint16_t>(off);

  L3Result l3;
  if (type == kEtherTypeIpv4) {
    l3 = parseIpv4(frame, off, v);
  } else if (type == kEtherTypeIpv6) {
    l3 = parseIpv6(frame, off, v);
  } else {
    v.kind = PacketKind::NonIp;
    v.drop = DropReason::None;
    return;
  }
  v.kind = PacketKind::Ip;
  v.drop = l3.drop;
  v.l3Valid = l3.valid;
  if (!l3.valid) return;
  // Frames are at most a jumbo frame (DPDK mbuf segments are 16-bit); the
  // lengths fit the 16-bit fields.
  v.l3Length = static_cast<std::uint16_t>(l3.end - off);
  v.l4Offset = static_cast<std::uint16_t>(l3.l4Offset);
  if (l3.drop != DropReason::None) return;

  const std::size_t l4 = l3.l4Offset;
  const std::size_t end = l3.end;
  switch (l3.proto) {
    case kProtoTcp: {
      if (end < l4 + sizeof(TcpHeader)) {
        v.drop = DropReason::Truncated;
        return;
      }
      const auto tcp = loadAt<TcpHeader>(frame, l4);
      const std::size_t doff = (std::size_t{tcp.dataOffset} >> 4) * 4;
      if (doff < sizeof(TcpHeader) || end < l4 + doff) {
        v.drop = DropReason::BadTcpHeaderLength;
        return;
      }
      v.key.srcPort = tcp.srcPort;
      v.key.dstPort = tcp.dstPort;
      v.tcpFlags = tcp.flags;
      v.tcpData = end > l4 + doff;
      break;
    }
    case kProtoUdp: {
      if (end < l4 + sizeof(UdpHeader)) {
        v.drop = DropReason::Truncated;
        return;
      }
      const auto udp = loadAt<UdpHeader>(frame, l4);
      const std::size_t len = udp.length.host();
      if (len < sizeof(UdpHeader) || end < l4 + len) {
        v.drop = DropReason::BadUdpLength;
        return;
      }
      v.key.srcPort = udp.srcPort;
      v.key.dstPort = udp.dstPort;
      break;
    }
    case kProtoIcmp:
    case kProtoIcmpv6: {
      if ((l3.proto == kProtoIcmp) != (v.key.version == IpVersion::V4)) {
        v.drop = DropReason::UnsupportedProtocol;  // ICMPv6 over IPv4 or ICMP over IPv6
        return;
      }
      if (end < l4 + sizeof(IcmpHeader)) {
        v.drop = DropReason::Truncated;
        return;
      }
      const auto icmp = loadAt<IcmpHeader>(frame, l4);
      v.icmpType = icmp.type;
      v.icmpCode = icmp.code;
      break;
    }
    default:
      v.drop = DropReason::UnsupportedProtocol;
      return;
  }
  if (v.ttl <= 1) {
    v.drop = DropReason::TtlExhausted;
    return;
  }
  v.drop = DropReason::None;
}

bool isIcmpError(const PacketView& view) noexcept {
  if (view.key.proto == kProtoIcmp) {
    return view.icmpType == kIcmpDestUnreachable || view.icmpType == kIcmpTimeExceeded ||
           view.icmpType == kIcmpParameterProblem;
  }
  if (view.key.proto == kProtoIcmpv6) {
    return view.icmpType == kIcmp6DestUnreachable || view.icmpType == kIcmp6PacketTooBig ||
           view.icmpType == kIcmp6TimeExceeded || view.icmpType == kIcmp6ParameterProblem;
  }
  return false;
}

IcmpErrorFlow parseIcmpError(std::span<const std::byte> frame, const PacketView& view) noexcept {
  IcmpErrorFlow out;
  // The quote lies between the ICMP header and the end of the outer IP packet.
  const std::size_t quoteStart = std::size_t{view.l4Offset} + sizeof(IcmpHeader);
  const std::size_t quoteEnd =
      std::min<std::size_t>(frame.size(), std::size_t{view.l3Offset} + view.l3Length);
  if (quoteEnd <= quoteStart) return out;
  const auto quote = frame.subspan(quoteStart, quoteEnd - quoteStart);
  out.innerL3Offset = static_cast<std::uint16_t>(quoteStart);

  std::size_t l4;
  std::uint8_t proto;
  FlowKey inner{};
  if (view.key.version == IpVersion::V4) {
    if (quote.size() < sizeof(Ipv4Header)) return out;
    const auto ip = loadAt<Ipv4Header>(quote, 0);
    const std::size_t ihl = std::size_t{ip.versionIhl & 0x0fu} * 4;
    if ((ip.versionIhl >> 4) != 4 || ihl < sizeof(Ipv4Header)) {
      out.drop = DropReason::IcmpInnerMalformed;
      return out;
    }
    if ((ip.flagsFragment.host() & kIpv4OffsetMask) != 0) {
      out.drop = DropReason::Ipv4Fragment;  // a non-first fragment quotes no ports
      return out;
    }
    inner.version = IpVersion::V4;
    copyAddress(inner.src, ip.src);
    copyAddress(inner.dst, ip.dst);
    proto = ip.protocol;
    l4 = ihl;
  } else {
    if (quote.size() < sizeof(Ipv6Header)) return out;
    const auto ip = loadAt<Ipv6Header>(quote, 0);
    if ((ip.versionClassLabel.host() >> 28) != 6) {
      out.drop = DropReason::IcmpInnerMalformed;
      return out;
    }
    inner.version = IpVersion::V6;
    copyAddress(inner.src, ip.src);
    copyAddress(inner.dst, ip.dst);
    // Quoted extension headers are not walked: Spillway's own flows carry
    // none, and a quote that has them is not a flow Spillway steered.
    proto = ip.nextHeader;
    l4 = sizeof(Ipv6Header);
  }
  if (proto != kProtoTcp && proto != kProtoUdp) {
    out.drop = DropReason::IcmpUnsupported;
    return out;
  }
  // RFC 792 guarantees the first 8 bytes of the quoted L4 header: the ports.
  if (quote.size() < l4 + 4) return out;  // IcmpInnerTruncated
  const auto srcPort = loadAt<Be16>(quote, l4);
  const auto dstPort = loadAt<Be16>(quote, l4 + 2);
  // The quoted packet went VIP -> client; the client's flow is its reverse.
  out.clientFlow.version = inner.version;
  out.clientFlow.src = inner.dst;
  out.clientFlow.dst = inner.src;
  out.clientFlow.srcPort = dstPort;
  out.clientFlow.dstPort = srcPort;
  out.clientFlow.proto = proto;
  out.drop = DropReason::None;
  return out;
}

}  // namespace spillway
