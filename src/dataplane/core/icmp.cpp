#include "spillway/icmp.hpp"

#include <algorithm>
#include <cstring>

#include "spillway/checksum.hpp"
#include "spillway/wire.hpp"

namespace spillway {
namespace {

constexpr std::uint8_t kProtoIcmp = static_cast<std::uint8_t>(IpProto::Icmp);
constexpr std::uint8_t kProtoIcmpv6 = static_cast<std::uint8_t>(IpProto::Icmpv6);

bool isIcmpv4ErrorType(std::uint8_t type) noexcept {
  // Destination unreachable, source quench, redirect, time exceeded,
  // parameter problem: the error messages of RFC 792 still in use.
  return type == kIcmpDestUnreachable || type == kIcmpSourceQuench || type == 5 ||
         type == kIcmpTimeExceeded || type == kIcmpParameterProblem;
}

// RFC 1812 §4.3.2.7: not about a packet whose source is not one host.
bool isUnicastHostV4(const IpBytes& a) noexcept {
  const auto first = std::to_integer<std::uint8_t>(a[0]);
  if (first == 0 || first == 127 || first >= 224) return false;  // this net, loopback, D and E
  return true;
}

// RFC 4443 §2.4 (e) and the unspecified / loopback sources.
bool isUnicastHostV6(const IpBytes& a) noexcept {
  if (std::to_integer<std::uint8_t>(a[0]) == 0xff) return false;  // multicast
  for (std::size_t i = 0; i < 15; ++i) {
    if (a[i] != std::byte{0}) return true;
  }
  const auto last = std::to_integer<std::uint8_t>(a[15]);
  return last > 1;  // :: and ::1 are not
}

// An error must never answer an ICMP error. When the L4 part did not parse,
// the type is unknown: stay silent then too.
bool quotesIcmpError(const PacketView& view, IpVersion version) noexcept {
  if (version == IpVersion::V4) {
    if (view.key.proto != kProtoIcmp) return false;
    return !view.ok() || isIcmpv4ErrorType(view.icmpType);
  }
  if (view.key.proto != kProtoIcmpv6) return false;
  return !view.ok() || view.icmpType < 128;
}

// Copies the L2 header of `frame` (Ethernet and the tag, if any) to `out` with
// the MACs swapped. `out` holds at least view.l3Offset bytes.
void writeReplyL2(std::span<const std::byte> frame, const PacketView& view,
                  std::span<std::byte> out) noexcept {
  auto eth = loadAt<EthernetHeader>(frame, 0);
  std::swap(eth.src, eth.dst);
  std::memcpy(out.data(), frame.data(), view.l3Offset);
  storeAt(out, 0, eth);
}

// Checks shared by the error builders; returns the number of bytes of the
// original IP packet to quote, or 0 when no error may be sent.
std::size_t errorQuoteLength(std::span<const std::byte> frame, const PacketView& view,
                             IpVersion version, std::size_t headerBytes,
                             std::size_t maxLength) noexcept {
  if (!view.l3Valid || view.kind != PacketKind::Ip || view.key.version != version) return 0;
  const std::size_t minL2 = sizeof(EthernetHeader) + (view.hasVlan ? sizeof(VlanTag) : 0);
  if (view.l3Offset < minL2 || view.l3Offset > frame.size() ||
      view.l3Length > frame.size() - view.l3Offset) {
    return 0;
  }
  if (quotesIcmpError(view, version)) return 0;
  const bool unicast =
      version == IpVersion::V4 ? isUnicastHostV4(view.key.src) : isUnicastHostV6(view.key.src);
  if (!unicast) return 0;
  return std::min<std::size_t>(view.l3Length, maxLength - headerBytes);
}

}  // namespace

std::size_t buildFragmentationNeeded(std::span<const std::byte> frame, const PacketView& view,
                                     std::uint16_t mtu, std::span<std::byte> out) noexcept {
  constexpr std::size_t kHeaders = sizeof(Ipv4Header) + sizeof(IcmpHeader);
  const std::size_t quote =
      errorQuoteLength(frame, view, IpVersion::V4, kHeaders, kIcmpv4ErrorMaxLength);
  if (quote == 0) return 0;
  const std::size_t l2 = view.l3Offset;
  const std::size_t length = l2 + kHeaders + quote;
  if (out.size() < length) return 0;

  const auto original = loadAt<Ipv4Header>(frame, l2);
  writeReplyL2(frame, view, out);

  Ipv4Header ip{};
  ip.versionIhl = 0x45;
  ip.tos = kIcmpErrorTrafficClass;
  ip.totalLength = Be16::fromHost(static_cast<std::uint16_t>(kHeaders + quote));
  ip.flagsFragment = Be16::fromHost(kIpv4FlagDf);
  ip.ttl = kIcmpReplyTtl;
  ip.protocol = kProtoIcmp;
  ip.src = original.dst;
  ip.dst = original.src;
  ip.checksum = Be16::fromHost(internetChecksum(std::as_bytes(std::span(&ip, 1))));
  storeAt(out, l2, ip);

  const std::size_t icmpAt = l2 + sizeof ip;
  IcmpHeader icmp{};
  icmp.type = kIcmpDestUnreachable;
  icmp.code = kIcmpCodeFragNeeded;
  icmp.rest = Be32::fromHost(mtu);  // unused high 16 bits zero (RFC 1191 §4)
  storeAt(out, icmpAt, icmp);
  std::memcpy(out.data() + icmpAt + sizeof icmp, frame.data() + l2, quote);
  const auto sum = internetChecksum(out.subspan(icmpAt, sizeof icmp + quote));
  storeAt(out, icmpAt + offsetof(IcmpHeader, checksum), Be16::fromHost(sum));
  return length;
}

std::size_t buildPacketTooBig(std::span<const std::byte> frame, const PacketView& view,
                              std::uint32_t mtu, std::span<std::byte> out) noexcept {
  constexpr std::size_t kHeaders = sizeof(Ipv6Header) + sizeof(IcmpHeader);
  const std::size_t quote =
      errorQuoteLength(frame, view, IpVersion::V6, kHeaders, kIcmpv6ErrorMaxLength);
  if (quote == 0) return 0;
  const std::size_t l2 = view.l3Offset;
  const std::size_t length = l2 + kHeaders + quote;
  if (out.size() < length) return 0;

  const auto original = loadAt<Ipv6Header>(frame, l2);
  writeReplyL2(frame, view, out);

  const auto icmpLength = static_cast<std::uint32_t>(sizeof(IcmpHeader) + quote);
  Ipv6Header ip{};
  ip.versionClassLabel = Be32::fromHost((6u << 28) | (std::uint32_t{kIcmpErrorTrafficClass} << 20));
  ip.payloadLength = Be16::fromHost(static_cast<std::uint16_t>(icmpLength));
  ip.nextHeader = kProtoIcmpv6;
  ip.hopLimit = kIcmpReplyTtl;
  ip.src = original.dst;
  ip.dst = original.src;
  storeAt(out, l2, ip);

  const std::size_t icmpAt = l2 + sizeof ip;
  IcmpHeader icmp{};
  icmp.type = kIcmp6PacketTooBig;
  icmp.code = 0;
  icmp.rest = Be32::fromHost(mtu);
  storeAt(out, icmpAt, icmp);
  std::memcpy(out.data() + icmpAt + sizeof icmp, frame.data() + l2, quote);
  const auto pseudo = pseudoHeaderSumV6(ip.src, ip.dst, kProtoIcmpv6, icmpLength);
  const auto sum = checksumFinish(checksumPartial(out.subspan(icmpAt, icmpLength), pseudo));
  storeAt(out, icmpAt + offsetof(IcmpHeader, checksum), Be16::fromHost(sum));
  return length;
}

std::size_t buildEchoReply(std::span<std::byte> frame, const PacketView& view) noexcept {
  if (!view.ok() || view.kind != PacketKind::Ip || view.icmpCode != 0) return 0;
  const bool v4 = view.key.version == IpVersion::V4;
  if (v4 ? (view.key.proto != kProtoIcmp || view.icmpType != kIcmpEchoRequest)
         : (view.key.proto != kProtoIcmpv6 || view.icmpType != kIcmp6EchoRequest)) {
    return 0;
  }
  if (!(v4 ? isUnicastHostV4(view.key.src) : isUnicastHostV6(view.key.src))) return 0;
  const std::size_t l3 = view.l3Offset;
  const std::size_t l4 = view.l4Offset;
  const std::size_t headerBytes = v4 ? sizeof(Ipv4Header) : sizeof(Ipv6Header);
  if (l4 < l3 + headerBytes || l3 > frame.size() || view.l3Length > frame.size() - l3 ||
      l4 - l3 > view.l3Length || view.l3Length - (l4 - l3) < sizeof(IcmpHeader)) {
    return 0;
  }
  const std::size_t icmpLength = view.l3Length - (l4 - l3);

  auto eth = loadAt<EthernetHeader>(frame, 0);
  std::swap(eth.src, eth.dst);
  storeAt(frame, 0, eth);

  // ICMP message first: it moves down over dropped options / extension headers.
  const std::size_t icmpAt = l3 + headerBytes;
  auto icmp = loadAt<IcmpHeader>(frame, l4);
  const auto oldWord = static_cast<std::uint16_t>((icmp.type << 8) | icmp.code);
  icmp.type = v4 ? kIcmpEchoReply : kIcmp6EchoReply;
  const auto newWord = static_cast<std::uint16_t>((icmp.type << 8) | icmp.code);
  // ICMPv6: the pseudo header only sees the addresses swapped and the same
  // upper-layer length, so its sum is unchanged.
  icmp.checksum = Be16::fromHost(checksumUpdate16(icmp.checksum.host(), oldWord, newWord));
  storeAt(frame, l4, icmp);
  if (icmpAt != l4) std::memmove(frame.data() + icmpAt, frame.data() + l4, icmpLength);

  if (v4) {
    auto ip = loadAt<Ipv4Header>(frame, l3);
    ip.versionIhl = 0x45;
    ip.totalLength = Be16::fromHost(static_cast<std::uint16_t>(sizeof ip + icmpLength));
    ip.flagsFragment =
        Be16::fromHost(static_cast<std::uint16_t>(ip.flagsFragment.host() & kIpv4FlagDf));
    ip.ttl = kIcmpReplyTtl;
    std::swap(ip.src, ip.dst);
    ip.checksum = Be16{};
    ip.checksum = Be16::fromHost(internetChecksum(std::as_bytes(std::span(&ip, 1))));
    storeAt(frame, l3, ip);
  } else {
    auto ip = loadAt<Ipv6Header>(frame, l3);
    ip.payloadLength = Be16::fromHost(static_cast<std::uint16_t>(icmpLength));
    ip.nextHeader = kProtoIcmpv6;
    ip.hopLimit = kIcmpReplyTtl;
    std::swap(ip.src, ip.dst);
    storeAt(frame, l3, ip);
  }
  return icmpAt + icmpLength;
}

}  // namespace spillway
