#include "spillway/encap.hpp"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstring>

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
[[gnu::always_inline]] inline std::uint8_t forwardInner(std::span<std::byte> buffer,
                                                        std::size_t l3) noexcept {
  if constexpr (Inner == IpVersion::V4) {
    // The caller checked the TTL is at least 2 (checksumAfterTtlDecrement).
    const auto ttl = loadAt<std::uint8_t>(buffer, l3 + offsetof(Ipv4Header, ttl));
    const auto checksum = loadAt<Be16>(buffer, l3 + offsetof(Ipv4Header, checksum));
    storeAt(buffer, l3 + offsetof(Ipv4Header, ttl), static_cast<std::uint8_t>(ttl - 1));
    storeAt(buffer, l3 + offsetof(Ipv4Header, checksum),
            Be16::fromHost(checksumAfterTtlDecrement(checksum.host())));
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

// The outer Ethernet header, and the 802.1Q tag where the target has one, at
// the start of `out`; returns the bytes written.
std::size_t writeOuterL2(std::span<std::byte> out, const EncapTarget& target,
                         IpVersion outer) noexcept {
  const bool tagged = target.vlanTci.has_value();
  const std::uint16_t outerEtherType = outer == IpVersion::V4 ? kEtherTypeIpv4 : kEtherTypeIpv6;
  EthernetHeader eth{};
  eth.dst = target.nextHopMac;
  eth.src = target.ourMac;
  eth.etherType = Be16::fromHost(tagged ? kEtherTypeVlan : outerEtherType);
  storeAt(out, 0, eth);
  if (!tagged) return sizeof eth;
  VlanTag tag{};
  tag.tci = Be16::fromHost(*target.vlanTci);
  tag.etherType = Be16::fromHost(outerEtherType);
  storeAt(out, sizeof eth, tag);
  return sizeof eth + sizeof tag;
}

// Four bytes in memory order as the host reads them in one 32-bit load.
constexpr std::uint32_t memoryWord(std::uint32_t b0, std::uint32_t b1, std::uint32_t b2,
                                   std::uint32_t b3) noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    return b0 | (b1 << 8) | (b2 << 16) | (b3 << 24);
  } else {
    return (b0 << 24) | (b1 << 16) | (b2 << 8) | b3;
  }
}

// The outer IPv4 header (no options, DF, id 0) as five 32-bit words in
// memory order, its checksum summed from the words while they are built: the
// one's complement sum does not depend on byte order (RFC 1071 §2(B)), so the
// words are summed as the host reads them and the folded sum stored the same
// way. No header is built field by field and read back (which stalls store
// forwarding), and no byte is shifted into place: 38 instructions a frame fewer
// than the field-by-field sum (BENCHMARKS.md, #16).
[[gnu::always_inline]] inline std::array<std::uint32_t, 5> outerIpv4Header(
    std::uint8_t tos, std::uint16_t totalLength, std::uint8_t ttl, std::uint8_t protocol,
    const IpBytes& source, const IpBytes& backend) noexcept {
  std::array<std::uint32_t, 5> w;
  w[0] = memoryWord(0x45, tos, totalLength >> 8, totalLength & 0xffu);
  w[1] = memoryWord(0, 0, kIpv4FlagDf >> 8, kIpv4FlagDf & 0xffu);  // id 0; DF
  std::memcpy(&w[3], source.data(), 4);
  std::memcpy(&w[4], backend.data(), 4);
  const std::uint32_t ttlProto = memoryWord(ttl, protocol, 0, 0);  // checksum 0 while summing
  std::uint64_t sum = std::uint64_t{w[0]} + w[1] + ttlProto + w[3] + w[4];
  sum = (sum & 0xffff'ffffULL) + (sum >> 32);
  sum = (sum & 0xffff'ffffULL) + (sum >> 32);
  sum = (sum & 0xffff) + (sum >> 16);
  sum = (sum & 0xffff) + (sum >> 16);
  // The complemented sum, as read from memory order: stored back the same way.
  const std::uint32_t checksum = ~static_cast<std::uint32_t>(sum) & 0xffffu;
  if constexpr (std::endian::native == std::endian::little) {
    w[2] = ttlProto | (checksum << 16);
  } else {
    w[2] = ttlProto | checksum;
  }
  return w;
}

// The checks on a packet before it is encapsulated, in order (a caller can
// get each wrong; cheap enough to make always): the parser's verdict, the
// inner IP version, the frame's bounds and the inner TTL. True, with the
// reason in result.drop, when the packet may not go.
// innerLength is view.l3Length.
template <IpVersion Inner>
[[gnu::always_inline]] inline bool refused(EncapResult& result, std::span<const std::byte> buffer,
                                           std::size_t dataOffset, std::size_t frameLength,
                                           const PacketView& view,
                                           std::size_t innerLength) noexcept {
  constexpr std::size_t kInnerHeader =
      Inner == IpVersion::V4 ? sizeof(Ipv4Header) : sizeof(Ipv6Header);
  if (!view.ok()) {
    result.drop = view.drop;
    return true;
  }
  if (view.kind != PacketKind::Ip || view.key.version != Inner) {
    result.drop = DropReason::BadIpVersion;
    return true;
  }
  if (dataOffset > buffer.size() || frameLength > buffer.size() - dataOffset ||
      innerLength < kInnerHeader || view.l3Offset > frameLength ||
      innerLength > frameLength - view.l3Offset) {
    result.drop = DropReason::Truncated;
    return true;
  }
  if (innerTtl<Inner>(buffer, dataOffset + view.l3Offset) <= 1) {
    result.drop = DropReason::TtlExhausted;
    return true;
  }
  return false;
}

}  // namespace

template <EncapKind Kind, IpVersion Inner>
EncapResult encapsulate(std::span<std::byte> buffer, std::size_t dataOffset,
                        std::size_t frameLength, const PacketView& view, const EncapTarget& target,
                        std::uint64_t flowHash, const IpBytes* secondChance) noexcept {
  constexpr IpVersion kOuter = outerIpVersion(Kind);
  constexpr bool kGue = usesGue(Kind);
  constexpr std::size_t kBaseOverhead = encapOverhead(Kind);
  constexpr std::size_t kHopBytes = kGue ? secondChanceBytes(kOuter) : 0;
  constexpr std::uint8_t kInnerProto = Inner == IpVersion::V4 ? kProtoIpv4 : kProtoIpv6;

  EncapResult result;
  // Preconditions a caller can get wrong; cheap enough to check always.
  const std::size_t innerLength = view.l3Length;
  if (refused<Inner>(result, buffer, dataOffset, frameLength, view, innerLength)) return result;
  const std::size_t l3 = dataOffset + view.l3Offset;

  // A hop is written only where its bytes fit both the MTU and the headroom;
  // otherwise the packet goes without it, as any packet would.
  const bool tagged = target.vlanTci.has_value();
  const bool hop = kGue && secondChance != nullptr &&
                   innerLength + kBaseOverhead + kHopBytes <= target.mtu &&
                   l3 >= encapHeaderBytes(Kind, tagged) + kHopBytes;
  const std::size_t hopBytes = hop ? kHopBytes : 0;
  constexpr std::size_t kOverhead = kBaseOverhead;
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

  const std::size_t headerBytes = encapHeaderBytes(Kind, tagged) + hopBytes;
  if (l3 < headerBytes) {
    result.drop = DropReason::NoHeadroom;
    return result;
  }

  const std::uint8_t trafficClass = forwardInner<Inner>(buffer, l3);
  const std::size_t start = l3 - headerBytes;
  std::size_t at = start;

  at += writeOuterL2(buffer.subspan(at), target, kOuter);

  // Length of what follows the outer IP header (UDP + GUE + inner).
  const std::size_t outerPayload =
      kOverhead - (kOuter == IpVersion::V4 ? 20 : 40) + hopBytes + innerLength;
  const std::uint8_t outerProto = kGue ? kProtoUdp : kInnerProto;
  std::uint32_t pseudoSum = 0;
  if constexpr (kOuter == IpVersion::V4) {
    const auto totalLength = static_cast<std::uint16_t>(sizeof(Ipv4Header) + outerPayload);
    storeAt(buffer, at,
            outerIpv4Header(trafficClass, totalLength, target.outerTtl, outerProto, target.source,
                            target.backend));
    at += sizeof(Ipv4Header);
    if constexpr (kGue) {
      pseudoSum =
          pseudoHeaderSumV4(addressPrefix<4>(target.source), addressPrefix<4>(target.backend),
                            kProtoUdp, static_cast<std::uint32_t>(outerPayload));
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
    // version 0, C = 0, Hlen = 32-bit words of private data (0 without a hop)
    gue.versionControlHlen = static_cast<std::uint8_t>(hopBytes / 4);
    gue.protocol = kInnerProto;
    storeAt(buffer, at, gue);
    at += sizeof gue;
    if (hop) {
      storeAt(buffer, at, SecondChanceData{});
      at += sizeof(SecondChanceData);
      std::memcpy(buffer.data() + at, secondChance->data(), kHopBytes - sizeof(SecondChanceData));
      at += kHopBytes - sizeof(SecondChanceData);
      result.hopWritten = true;
    }
    auto sum = checksumFinish(checksumPartial(buffer.subspan(udpAt, outerPayload), pseudoSum));
    if (sum == 0) sum = 0xffff;  // 0 means "no checksum" (RFC 768)
    storeAt(buffer, udpAt + offsetof(UdpHeader, checksum), Be16::fromHost(sum));
  }

  result.dataOffset = start;
  result.frameLength = headerBytes + innerLength;
  return result;
}

#define SPILLWAY_ENCAP_INSTANTIATE(K, V)                                                       \
  template EncapResult encapsulate<K, V>(std::span<std::byte>, std::size_t, std::size_t,       \
                                         const PacketView&, const EncapTarget&, std::uint64_t, \
                                         const IpBytes*) noexcept
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
                           const EncapTarget& target, std::uint64_t flowHash,
                           const IpBytes* secondChance) noexcept {
  const bool v4 = view.key.version == IpVersion::V4;
  switch (target.kind) {
    case EncapKind::IpInIp4:
      return v4 ? encapsulate<EncapKind::IpInIp4, IpVersion::V4>(
                      buffer, dataOffset, frameLength, view, target, flowHash, secondChance)
                : encapsulate<EncapKind::IpInIp4, IpVersion::V6>(
                      buffer, dataOffset, frameLength, view, target, flowHash, secondChance);
    case EncapKind::IpInIp6:
      return v4 ? encapsulate<EncapKind::IpInIp6, IpVersion::V4>(
                      buffer, dataOffset, frameLength, view, target, flowHash, secondChance)
                : encapsulate<EncapKind::IpInIp6, IpVersion::V6>(
                      buffer, dataOffset, frameLength, view, target, flowHash, secondChance);
    case EncapKind::Gue4:
      return v4 ? encapsulate<EncapKind::Gue4, IpVersion::V4>(buffer, dataOffset, frameLength, view,
                                                              target, flowHash, secondChance)
                : encapsulate<EncapKind::Gue4, IpVersion::V6>(buffer, dataOffset, frameLength, view,
                                                              target, flowHash, secondChance);
    case EncapKind::Gue6:
      return v4 ? encapsulate<EncapKind::Gue6, IpVersion::V4>(buffer, dataOffset, frameLength, view,
                                                              target, flowHash, secondChance)
                : encapsulate<EncapKind::Gue6, IpVersion::V6>(buffer, dataOffset, frameLength, view,
                                                              target, flowHash, secondChance);
  }
  EncapResult bad;
  bad.drop = DropReason::Truncated;
  return bad;
}

// ---- the template (issue #25) ----------------------------------------------

namespace {

EncapResult unbuiltWriter(const EncapTemplate&, std::span<std::byte>, std::size_t, std::size_t,
                          const PacketView&, std::uint64_t, const IpBytes*) noexcept {
  EncapResult bad;
  bad.drop = DropReason::Truncated;
  return bad;
}

// Copies N (>= 16) bytes as 16-byte blocks, the last one overlapping its
// neighbour: a few vector moves for every header length, never a byte loop.
template <std::size_t N>
[[gnu::always_inline]] inline void copyHeader(std::byte* to, const std::byte* from) noexcept {
  static_assert(N >= 16);
  for (std::size_t i = 0; i + 16 <= N; i += 16) std::memcpy(to + i, from + i, 16);
  if constexpr (N % 16 != 0) std::memcpy(to + N - 16, from + N - 16, 16);
}

// One's complement fold of a 32-bit sum to 16 bits.
[[gnu::always_inline]] inline std::uint32_t fold16(std::uint32_t sum) noexcept {
  sum = (sum & 0xffff) + (sum >> 16);
  return (sum & 0xffff) + (sum >> 16);
}

// The checks of encapsulate<Kind, Inner>() in its order (so the drops and
// icmpMtu are its own), then the headers copied and patched.
template <EncapKind Kind, IpVersion Inner, bool Tagged>
EncapResult writeFromTemplate(const EncapTemplate& t, std::span<std::byte> buffer,
                              std::size_t dataOffset, std::size_t frameLength,
                              const PacketView& view, std::uint64_t flowHash,
                              const IpBytes* secondChance) noexcept {
  constexpr IpVersion kOuter = outerIpVersion(Kind);
  constexpr bool kGue = usesGue(Kind);
  constexpr std::size_t kHeader = encapHeaderBytes(Kind, Tagged);
  constexpr std::size_t kIpAt = sizeof(EthernetHeader) + (Tagged ? sizeof(VlanTag) : 0);
  constexpr std::size_t kOuterIp =
      kOuter == IpVersion::V4 ? sizeof(Ipv4Header) : sizeof(Ipv6Header);
  constexpr std::size_t kUdpAt = kIpAt + kOuterIp;
  constexpr std::size_t kGueAt = kUdpAt + sizeof(UdpHeader);
  constexpr std::size_t kHopBytes = kGue ? secondChanceBytes(kOuter) : 0;
  constexpr std::uint8_t kInnerProto = Inner == IpVersion::V4 ? kProtoIpv4 : kProtoIpv6;
  static_assert(kHeader <= EncapTemplate::kMaxHeader);

  EncapResult result;
  const std::size_t innerLength = view.l3Length;
  if (refused<Inner>(result, buffer, dataOffset, frameLength, view, innerLength)) return result;
  const std::size_t l3 = dataOffset + view.l3Offset;
  // innerLength <= buffer.size(): no overflow in the signed comparisons.
  const auto inner = static_cast<std::int64_t>(innerLength);
  if (inner > t.maxInner) {
    if constexpr (Inner == IpVersion::V4) {
      if (!view.dontFragment) {
        result.drop = DropReason::MtuExceededNoDf;
        return result;
      }
      result.icmpMtu = t.icmpMtuV4;
    } else {
      result.icmpMtu = t.icmpMtuV6;
    }
    result.drop = DropReason::MtuExceeded;
    return result;
  }
  // A hop is written only where its bytes fit both the MTU and the headroom.
  const bool hop = kGue && secondChance != nullptr &&
                   inner + static_cast<std::int64_t>(kHopBytes) <= t.maxInner &&
                   l3 >= kHeader + kHopBytes;
  const std::size_t hopBytes = hop ? kHopBytes : 0;
  if (l3 < kHeader + hopBytes) {
    result.drop = DropReason::NoHeadroom;
    return result;
  }

  const std::uint8_t trafficClass = forwardInner<Inner>(buffer, l3);
  const std::size_t start = l3 - kHeader - hopBytes;
  copyHeader<kHeader>(buffer.data() + start, t.header.data());
  const std::size_t ip = start + kIpAt;
  // Length of what follows the outer IP header (UDP + GUE + hop + inner).
  const auto outerPayload = static_cast<std::uint32_t>(
      (kGue ? sizeof(UdpHeader) + sizeof(GueHeader) : 0) + hopBytes + innerLength);
  if constexpr (kOuter == IpVersion::V4) {
    const auto totalLength = static_cast<std::uint32_t>(sizeof(Ipv4Header) + outerPayload);
    // The template's sum has tos, length, checksum and an IPIP protocol 0:
    // add them (tos and the protocol are the low bytes of their words).
    const std::uint8_t proto = kGue ? 0 : kInnerProto;
    const std::uint32_t sum = fold16(t.ipSum + trafficClass + totalLength + proto);
    storeAt(buffer, ip + offsetof(Ipv4Header, tos), trafficClass);
    storeAt(buffer, ip + offsetof(Ipv4Header, totalLength),
            Be16::fromHost(static_cast<std::uint16_t>(totalLength)));
    if constexpr (!kGue) storeAt(buffer, ip + offsetof(Ipv4Header, protocol), kInnerProto);
    storeAt(buffer, ip + offsetof(Ipv4Header, checksum),
            Be16::fromHost(static_cast<std::uint16_t>(~sum & 0xffffu)));
  } else {
    storeAt(buffer, ip + offsetof(Ipv6Header, versionClassLabel),
            Be32::fromHost((6u << 28) | (std::uint32_t{trafficClass} << 20) |
                           outerFlowLabel(flowHash)));
    storeAt(buffer, ip + offsetof(Ipv6Header, payloadLength),
            Be16::fromHost(static_cast<std::uint16_t>(outerPayload)));
    if constexpr (!kGue) storeAt(buffer, ip + offsetof(Ipv6Header, nextHeader), kInnerProto);
  }
  if constexpr (kGue) {
    const std::size_t udp = start + kUdpAt;
    const std::uint16_t sourcePort = gueSourcePort(flowHash);
    const auto hlen = static_cast<std::uint8_t>(hopBytes / 4);
    storeAt(buffer, udp + offsetof(UdpHeader, srcPort), Be16::fromHost(sourcePort));
    storeAt(buffer, udp + offsetof(UdpHeader, length),
            Be16::fromHost(static_cast<std::uint16_t>(outerPayload)));
    storeAt(buffer, start + kGueAt + offsetof(GueHeader, versionControlHlen), hlen);
    storeAt(buffer, start + kGueAt + offsetof(GueHeader, protocol), kInnerProto);
    // Pseudo-header length and UDP length (the same value), source port and
    // the GUE word; the rest of the header's words are in the template's sum.
    std::uint32_t sum =
        t.udpSum + 2 * outerPayload + sourcePort + ((std::uint32_t{hlen} << 8) | kInnerProto);
    if (hop) {
      const std::size_t at = start + kGueAt + sizeof(GueHeader);
      storeAt(buffer, at, SecondChanceData{});
      std::memcpy(buffer.data() + at + sizeof(SecondChanceData), secondChance->data(),
                  kHopBytes - sizeof(SecondChanceData));
      sum = checksumPartial(buffer.subspan(at, kHopBytes), sum);
      result.hopWritten = true;
    }
    // Everything before the inner packet is a multiple of 4 bytes long, so
    // the inner words line up as in one pass over the UDP payload.
    auto checksum = checksumFinish(checksumPartial(buffer.subspan(l3, innerLength), sum));
    if (checksum == 0) checksum = 0xffff;  // 0 means "no checksum" (RFC 768)
    storeAt(buffer, udp + offsetof(UdpHeader, checksum), Be16::fromHost(checksum));
  }
  result.dataOffset = start;
  result.frameLength = kHeader + hopBytes + innerLength;
  return result;
}

template <EncapKind Kind, bool Tagged>
constexpr std::array<EncapWriter, 2> writersFor() noexcept {
  return {&writeFromTemplate<Kind, IpVersion::V4, Tagged>,
          &writeFromTemplate<Kind, IpVersion::V6, Tagged>};
}

template <bool Tagged>
std::array<EncapWriter, 2> writersFor(EncapKind kind) noexcept {
  switch (kind) {
    case EncapKind::IpInIp4:
      return writersFor<EncapKind::IpInIp4, Tagged>();
    case EncapKind::IpInIp6:
      return writersFor<EncapKind::IpInIp6, Tagged>();
    case EncapKind::Gue4:
      return writersFor<EncapKind::Gue4, Tagged>();
    case EncapKind::Gue6:
      return writersFor<EncapKind::Gue6, Tagged>();
  }
  return {&unbuiltWriter, &unbuiltWriter};
}

}  // namespace

EncapTemplate::EncapTemplate() noexcept : writers{&unbuiltWriter, &unbuiltWriter} {}

EncapTemplate EncapTemplate::build(const EncapTarget& target) noexcept {
  EncapTemplate t;
  const EncapKind kind = target.kind;
  if (kind != EncapKind::IpInIp4 && kind != EncapKind::IpInIp6 && kind != EncapKind::Gue4 &&
      kind != EncapKind::Gue6) {
    return t;  // not a kind: every packet dropped, as encapsulateAny() does
  }
  const IpVersion outer = outerIpVersion(kind);
  const bool gue = usesGue(kind);
  const bool tagged = target.vlanTci.has_value();
  const std::span<std::byte> out(t.header);
  std::size_t at = 0;

  at += writeOuterL2(out.subspan(at), target, outer);
  // An IPIP header's protocol is the inner family's, set per packet (0 here).
  const std::uint8_t outerProto = gue ? kProtoUdp : 0;
  if (outer == IpVersion::V4) {
    Ipv4Header ip{};
    ip.versionIhl = 0x45;
    ip.flagsFragment = Be16::fromHost(kIpv4FlagDf);  // id 0
    ip.ttl = target.outerTtl;
    ip.protocol = outerProto;
    ip.src = addressPrefix<4>(target.source);
    ip.dst = addressPrefix<4>(target.backend);
    storeAt(out, at, ip);
    t.ipSum = checksumPartial(out.subspan(at, sizeof ip));
    if (gue) {
      t.udpSum = pseudoHeaderSumV4(ip.src, ip.dst, kProtoUdp, 0);
    }
    at += sizeof ip;
  } else {
    Ipv6Header ip{};
    ip.nextHeader = outerProto;
    ip.hopLimit = target.outerTtl;
    ip.src = addressPrefix<16>(target.source);
    ip.dst = addressPrefix<16>(target.backend);
    storeAt(out, at, ip);
    if (gue) {
      t.udpSum = pseudoHeaderSumV6(ip.src, ip.dst, kProtoUdp, 0);
    }
    at += sizeof ip;
  }
  if (gue) {
    UdpHeader udp{};
    udp.dstPort = Be16::fromHost(target.gueDstPort);
    storeAt(out, at, udp);
    at += sizeof udp;
    storeAt(out, at, GueHeader{});
    at += sizeof(GueHeader);
    t.udpSum += target.gueDstPort;
  }
  const std::size_t overhead = encapOverhead(kind);
  t.maxInner = static_cast<std::int32_t>(target.mtu) - static_cast<std::int32_t>(overhead);
  const std::size_t room = target.mtu > overhead ? target.mtu - overhead : 0;
  t.icmpMtuV4 = static_cast<std::uint16_t>(std::max<std::size_t>(room, kIpv4MinMtu));
  t.icmpMtuV6 = static_cast<std::uint16_t>(std::max<std::size_t>(room, kIpv6MinMtu));
  t.writers = tagged ? writersFor<true>(kind) : writersFor<false>(kind);
  return t;
}

}  // namespace spillway
