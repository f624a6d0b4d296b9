#include "spillway/encap.hpp"

#include <algorithm>
#include <cstddef>

#include "spillway/checksum.hpp"

namespace spillway {
namespace {

constexpr std::uint8_t kProtoIpv4 = static_cast<std::uint8_t>(IpProto::Ipip);
constexpr std::uint8_t kProtoIpv6 = static_cast<std::uint8_t>(IpProto::Ipv6);
constexpr std::uint8_t kProtoUdp = static_cast<std::uint8_t>(IpProto::Udp);

template <std::size_t N>
std::array<std::uint8_t, N> addressPrefix(const IpBytes& address) noexcept {
  std::array<std::uint8_t, N> out;
  for (std::size_t i = 0; i < N; ++i) out[i] = std::to_integer<std::uint8_t>(address[i]);
  return out;
}

// Decrements the inner TTL / hop limit in place and returns the inner traffic
// class (DSCP + ECN) to copy outward. Only the changed fields are written: a
// whole header stored back and then reloaded wider stalls store forwarding.
template <IpVersion Inner>
std::uint8_t forwardInner(std::span<std::byte> buffer, std::size_t l3) noexcept {
  if constexpr (Inner == IpVersion::V4) {
    const auto ttl = loadAt<std::uint8_t>(buffer, l3 + offsetof(Ipv4Header, ttl));
    const auto proto = loadAt<std::uint8_t>(buffer, l3 + offsetof(Ipv4Header, protocol));
    const auto checksum = loadAt<Be16>(buffer, l3 + offsetof(Ipv4Header, checksum));
    const auto newTtl = static_cast<std::uint8_t>(ttl - 1);
    const auto oldWord = static_cast<std::uint16_t>((ttl << 8) | proto);
    const auto newWord = static_cast<std::uint16_t>((newTtl << 8) | proto);
    storeAt(buffer, l3 + offsetof(Ipv4Header, ttl), newTtl);
    storeAt(buffer, l3 + offsetof(Ipv4Header, checksum),
            Be16::fromHost(checksumUpdate16(checksum.host(), oldWord, newWord)));
    return loadAt<std::uint8_t>(buffer, l3 + offsetof(Ipv4Header, tos));
  } else {
    const auto hopLimit = loadAt<std::uint8_t>(buffer, l3 + offsetof(Ipv6Header, hopLimit));
    storeAt(buffer, l3 + offsetof(Ipv6Header, hopLimit), static_cast<std::uint8_t>(hopLimit - 1));
    const auto vcl = loadAt<Be32>(buffer, l3 + offsetof(Ipv6Header, versionClassLabel));
    return static_cast<std::uint8_t>(vcl.host() >> 20);
  }
}

template <IpVersion Inner>
std::uint8_t innerTtl(std::span<const std::byte> buffer, std::size_t l3) noexcept {
  if constexpr (Inner == IpVersion::V4) {
    return loadAt<Ipv4Header>(buffer, l3).ttl;
  } else {
    return loadAt<Ipv6Header>(buffer, l3).hopLimit;
  }
}

}  // namespace

template <EncapKind Kind, IpVersion Inner>
EncapResult encapsulate(std::span<std::byte> buffer, std::size_t dataOffset,
                        std::size_t frameLength, const PacketView& view, const EncapTarget& target,
                        std::uint64_t flowHash) noexcept {
  constexpr IpVersion kOuter = outerIpVersion(Kind);
  constexpr bool kGue = usesGue(Kind);
  constexpr std::size_t kOverhead = encapOverhead(Kind);
  constexpr std::size_t kInnerHeader =
      Inner == IpVersion::V4 ? sizeof(Ipv4Header) : sizeof(Ipv6Header);
  constexpr std::uint8_t kInnerProto = Inner == IpVersion::V4 ? kProtoIpv4 : kProtoIpv6;

  EncapResult result;
  // Preconditions a caller can get wrong; cheap enough to check always.
  const std::size_t innerLength = view.l3Length;
  if (!view.ok()) {
    result.drop = view.drop;
    return result;
  }
  if (view.kind != PacketKind::Ip || view.key.version != Inner) {
    result.drop = DropReason::BadIpVersion;
    return result;
  }
  if (dataOffset > buffer.size() || frameLength > buffer.size() - dataOffset ||
      innerLength < kInnerHeader || view.l3Offset > frameLength ||
      innerLength > frameLength - view.l3Offset) {
    result.drop = DropReason::Truncated;
    return result;
  }
  const std::size_t l3 = dataOffset + view.l3Offset;
  if (innerTtl<Inner>(buffer, l3) <= 1) {
    result.drop = DropReason::TtlExhausted;
    return result;
  }

  if (innerLength + kOverhead > target.mtu) {
    const std::size_t room = target.mtu > kOverhead ? target.mtu - kOverhead : 0;
    if constexpr (Inner == IpVersion::V4) {
      if (!view.dontFragment) {
        result.drop = DropReason::MtuExceededNoDf;
        return result;
      }
      result.icmpMtu = static_cast<std::uint16_t>(std::max<std::size_t>(room, kIpv4MinMtu));
    } else {
      result.icmpMtu = static_cast<std::uint16_t>(std::max<std::size_t>(room, kIpv6MinMtu));
    }
    result.drop = DropReason::MtuExceeded;
    return result;
  }

  const bool tagged = target.vlanTci.has_value();
  const std::size_t headerBytes = encapHeaderBytes(Kind, tagged);
  if (l3 < headerBytes) {
    result.drop = DropReason::NoHeadroom;
    return result;
  }

  const std::uint8_t trafficClass = forwardInner<Inner>(buffer, l3);
  const std::size_t start = l3 - headerBytes;
  std::size_t at = start;

  EthernetHeader eth{};
  eth.dst = target.nextHopMac;
  eth.src = target.ourMac;
  const std::uint16_t outerEtherType = kOuter == IpVersion::V4 ? kEtherTypeIpv4 : kEtherTypeIpv6;
  eth.etherType = Be16::fromHost(tagged ? kEtherTypeVlan : outerEtherType);
  storeAt(buffer, at, eth);
  at += sizeof eth;
  if (tagged) {
    VlanTag tag{};
    tag.tci = Be16::fromHost(*target.vlanTci);
    tag.etherType = Be16::fromHost(outerEtherType);
    storeAt(buffer, at, tag);
    at += sizeof tag;
  }

  // Length of what follows the outer IP header (UDP + GUE + inner).
  const std::size_t outerPayload = kOverhead - (kOuter == IpVersion::V4 ? 20 : 40) + innerLength;
  const std::uint8_t outerProto = kGue ? kProtoUdp : kInnerProto;
  std::uint32_t pseudoSum = 0;
  if constexpr (kOuter == IpVersion::V4) {
    Ipv4Header ip{};
    ip.versionIhl = 0x45;
    ip.tos = trafficClass;
    ip.totalLength = Be16::fromHost(static_cast<std::uint16_t>(sizeof ip + outerPayload));
    ip.flagsFragment = Be16::fromHost(kIpv4FlagDf);
    ip.ttl = target.outerTtl;
    ip.protocol = outerProto;
    ip.src = addressPrefix<4>(target.source);
    ip.dst = addressPrefix<4>(target.backend);
    ip.checksum = Be16::fromHost(ipv4HeaderChecksum(ip));
    storeAt(buffer, at, ip);
    at += sizeof ip;
    if constexpr (kGue) {
      pseudoSum =
          pseudoHeaderSumV4(ip.src, ip.dst, kProtoUdp, static_cast<std::uint32_t>(outerPayload));
    }
  } else {
    Ipv6Header ip{};
    ip.versionClassLabel =
        Be32::fromHost((6u << 28) | (std::uint32_t{trafficClass} << 20) | outerFlowLabel(flowHash));
    ip.payloadLength = Be16::fromHost(static_cast<std::uint16_t>(outerPayload));
    ip.nextHeader = outerProto;
    ip.hopLimit = target.outerTtl;
    ip.src = addressPrefix<16>(target.source);
    ip.dst = addressPrefix<16>(target.backend);
    storeAt(buffer, at, ip);
    at += sizeof ip;
    if constexpr (kGue) {
      pseudoSum =
          pseudoHeaderSumV6(ip.src, ip.dst, kProtoUdp, static_cast<std::uint32_t>(outerPayload));
    }
  }

  if constexpr (kGue) {
    const std::size_t udpAt = at;
    UdpHeader udp{};
    udp.srcPort = Be16::fromHost(gueSourcePort(flowHash));
    udp.dstPort = Be16::fromHost(target.gueDstPort);
    udp.length = Be16::fromHost(static_cast<std::uint16_t>(outerPayload));
    storeAt(buffer, at, udp);
    at += sizeof udp;
    GueHeader gue{};
    gue.versionControlHlen = 0;  // version 0, C = 0, Hlen = 0
    gue.protocol = kInnerProto;
    storeAt(buffer, at, gue);
    at += sizeof gue;
    auto sum = checksumFinish(checksumPartial(buffer.subspan(udpAt, outerPayload), pseudoSum));
    if (sum == 0) sum = 0xffff;  // 0 means "no checksum" (RFC 768)
    storeAt(buffer, udpAt + offsetof(UdpHeader, checksum), Be16::fromHost(sum));
  }

  result.dataOffset = start;
  result.frameLength = headerBytes + innerLength;
  return result;
}

#define SPILLWAY_ENCAP_INSTANTIATE(K, V)                                                 \
  template EncapResult encapsulate<K, V>(std::span<std::byte>, std::size_t, std::size_t, \
                                         const PacketView&, const EncapTarget&,          \
                                         std::uint64_t) noexcept
SPILLWAY_ENCAP_INSTANTIATE(EncapKind::IpInIp4, IpVersion::V4);
SPILLWAY_ENCAP_INSTANTIATE(EncapKind::IpInIp4, IpVersion::V6);
SPILLWAY_ENCAP_INSTANTIATE(EncapKind::IpInIp6, IpVersion::V4);
SPILLWAY_ENCAP_INSTANTIATE(EncapKind::IpInIp6, IpVersion::V6);
SPILLWAY_ENCAP_INSTANTIATE(EncapKind::Gue4, IpVersion::V4);
SPILLWAY_ENCAP_INSTANTIATE(EncapKind::Gue4, IpVersion::V6);
SPILLWAY_ENCAP_INSTANTIATE(EncapKind::Gue6, IpVersion::V4);
SPILLWAY_ENCAP_INSTANTIATE(EncapKind::Gue6, IpVersion::V6);
#undef SPILLWAY_ENCAP_INSTANTIATE

EncapResult encapsulateAny(std::span<std::byte> buffer, std::size_t dataOffset,
                           std::size_t frameLength, const PacketView& view,
                           const EncapTarget& target, std::uint64_t flowHash) noexcept {
  const bool v4 = view.key.version == IpVersion::V4;
  switch (target.kind) {
    case EncapKind::IpInIp4:
      return v4 ? encapsulate<EncapKind::IpInIp4, IpVersion::V4>(buffer, dataOffset, frameLength,
                                                                 view, target, flowHash)
                : encapsulate<EncapKind::IpInIp4, IpVersion::V6>(buffer, dataOffset, frameLength,
                                                                 view, target, flowHash);
    case EncapKind::IpInIp6:
      return v4 ? encapsulate<EncapKind::IpInIp6, IpVersion::V4>(buffer, dataOffset, frameLength,
                                                                 view, target, flowHash)
                : encapsulate<EncapKind::IpInIp6, IpVersion::V6>(buffer, dataOffset, frameLength,
                                                                 view, target, flowHash);
    case EncapKind::Gue4:
      return v4 ? encapsulate<EncapKind::Gue4, IpVersion::V4>(buffer, dataOffset, frameLength, view,
                                                              target, flowHash)
                : encapsulate<EncapKind::Gue4, IpVersion::V6>(buffer, dataOffset, frameLength, view,
                                                              target, flowHash);
    case EncapKind::Gue6:
      return v4 ? encapsulate<EncapKind::Gue6, IpVersion::V4>(buffer, dataOffset, frameLength, view,
                                                              target, flowHash)
                : encapsulate<EncapKind::Gue6, IpVersion::V6>(buffer, dataOffset, frameLength, view,
                                                              target, flowHash);
  }
  EncapResult bad;
  bad.drop = DropReason::Truncated;
  return bad;
}

}  // namespace spillway
