// Encapsulation of a client packet for direct server return (DSR): the inner
// IP packet travels unchanged (but for its TTL) to the backend inside an outer
// header, and the backend answers the client directly.
//
// Formats, chosen per backend by EncapKind; the inner family comes from the
// packet, so each kind carries IPv4 and IPv6 inner packets:
//  - IpInIp4: outer IPv4, protocol 4 (IPv4-in-IPv4, RFC 2003) or 41 (IPv6-in-
//    IPv4, RFC 4213);
//  - IpInIp6: outer IPv6, next header 4 (IPv4-in-IPv6) or 41 (IPv6-in-IPv6),
//    RFC 2473;
//  - Gue4 / Gue6: GUE variant 0 (draft-ietf-intarea-gue) in UDP over IPv4 /
//    IPv6: a 4-byte GUE header whose proto is 4 or 41, then the inner packet.
// The writers are templates on (kind, inner family) so the per-packet code has
// no branch on either (VPP lb's compile-time node variants); encapsulateAny()
// dispatches once at run time for control code and tests.
//
// Buffer model: `buffer` covers headroom + frame; the received frame (Ethernet,
// at most one 802.1Q tag) starts at `dataOffset` and is `frameLength` long. The
// writer drops the old L2 header and any Ethernet padding, prepends the new
// Ethernet header (our MAC -> next hop, optional egress tag), the outer IP
// header and, for GUE, UDP + GUE, in the bytes before the inner IP header, and
// returns where the new frame starts and how long it is. Nothing is moved: the
// inner packet stays where it was received.
//
// Fields of the outer header:
//  - ECMP entropy from the flow hash (never its low bits, which index the flow
//    table): UDP source port 0xc000 | hash[63:50] (49152..65535, the dynamic
//    range RFC 8086 asks of UDP tunnels); IPv6 flow label hash[49:30], never 0
//    (RFC 6438). So one flow keeps one path, and many flows spread.
//  - DSCP and ECN copied from the inner header (RFC 2983 uniform model, RFC
//    6040 normal mode); TTL / hop limit from the target; IPv4 DF set, id 0
//    (an atomic datagram, RFC 6864).
//  - Checksums: outer IPv4 header; UDP over IPv6 (mandatory, RFC 8200 §8.1)
//    and over IPv4 too, so the backend can verify the whole tunnel packet.
//    The UDP checksum costs one pass over the packet; plain IP-in-IP does not.
//  - The inner TTL / hop limit is decremented, as by any router (RFC 2003
//    §3.1); the inner IPv4 header checksum is updated incrementally (RFC 1624).
//
// Second chance (issue #24 item 3; ARCHITECTURE.md "Second chance"). A GUE
// packet may name the flow's previous backend, so the backend that receives
// it can pass a packet it has no socket for on to that one (spillway-decap).
// It travels as GUE private data (Hlen > 0, flags 0, draft-ietf-intarea-gue
// §3.3): SecondChanceData, then the hop's tunnel address in the outer family
// (4 or 16 bytes): 8 bytes over IPv4 (Hlen 2), 20 over IPv6 (Hlen 5). The
// bytes count against the MTU only on the packets that carry them: a packet
// that fits without them but not with them is sent without (the caller
// counts it), so the MTU a client learns never changes. IPIP and IP6IP6 have
// no room for it.
//
// Path MTU. Checked before anything is written: when the inner IP length plus
// encapOverhead(kind) exceeds the target's egress L3 MTU,
//  - inner IPv4 with DF, or inner IPv6: MtuExceeded, with `icmpMtu` the value
//    for the ICMP "fragmentation needed" / ICMPv6 "packet too big" that the
//    caller builds with icmp.hpp (the frame is untouched, so it can be quoted);
//  - inner IPv4 without DF: MtuExceededNoDf, dropped. Spillway never fragments:
//    fragments of one flow would carry no ports for the backend's steering,
//    and DSR clients nearly all use path-MTU discovery anyway.
// The ICMPv6 MTU is clamped to 1280, the IPv6 minimum link MTU (RFC 8200 §5):
// hosts ignore smaller values (RFC 8201 §4, RFC 8021), so advertising one
// would only stall the client. The fabric to the backends must therefore carry
// 1280 + overhead; with a 1500 egress MTU it does. The IPv4 value is clamped to
// 68 (RFC 791) likewise.
//
// Thread contract: pure functions of their arguments; any thread; noexcept; no
// allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "spillway/drop_reason.hpp"
#include "spillway/flow_key.hpp"
#include "spillway/packet.hpp"
#include "spillway/wire.hpp"

namespace spillway {

enum class EncapKind : std::uint8_t {
  IpInIp4,  // outer IPv4, protocol 4 or 41
  IpInIp6,  // outer IPv6, next header 4 or 41
  Gue4,     // outer IPv4 + UDP + GUE variant 0
  Gue6,     // outer IPv6 + UDP + GUE variant 0
};

// The kind's name in logs, probe errors and test names: "ipip4", "gue6".
[[nodiscard]] constexpr std::string_view toString(EncapKind kind) noexcept {
  switch (kind) {
    case EncapKind::IpInIp4:
      return "ipip4";
    case EncapKind::IpInIp6:
      return "ipip6";
    case EncapKind::Gue4:
      return "gue4";
    case EncapKind::Gue6:
      return "gue6";
  }
  return "?";
}

inline constexpr std::uint16_t kGueDefaultPort = 6080;
inline constexpr std::uint8_t kDefaultOuterTtl = 64;
inline constexpr std::uint16_t kDefaultEgressMtu = 1500;
inline constexpr std::uint16_t kIpv4MinMtu = 68;    // RFC 791
inline constexpr std::uint16_t kIpv6MinMtu = 1280;  // RFC 8200 §5
inline constexpr std::uint16_t kGueSourcePortBase = 0xc000;

// The first four bytes of the GUE private data of a second-chance packet
// (shared with spillway_decap_abi.h, which defines the same values).
inline constexpr std::uint8_t kSecondChanceType = 0x5c;  // "spillway second chance"
inline constexpr std::uint8_t kSecondChanceVersion = 1;
inline constexpr std::uint8_t kSecondChanceRedirected = 0x01;  // flags: already sent on once
struct SecondChanceData {
  std::uint8_t type = kSecondChanceType;
  std::uint8_t version = kSecondChanceVersion;
  std::uint8_t flags = 0;
  std::uint8_t reserved = 0;
};
static_assert(sizeof(SecondChanceData) == 4 && alignof(SecondChanceData) == 1);

// GUE private-data bytes of a second-chance hop for an outer family.
[[nodiscard]] constexpr std::size_t secondChanceBytes(IpVersion outer) noexcept {
  return sizeof(SecondChanceData) + (outer == IpVersion::V4 ? 4 : 16);
}

// Where a backend's tunnel goes. Addresses are of the outer family: an IPv4
// address fills the first four bytes of its IpBytes, as in FlowKey.
struct EncapTarget {
  EncapKind kind = EncapKind::IpInIp4;
  IpBytes source{};   // our tunnel endpoint
  IpBytes backend{};  // the backend's tunnel endpoint
  MacAddress nextHopMac{};
  MacAddress ourMac{};
  std::optional<std::uint16_t> vlanTci;  // egress 802.1Q tag, if the port is tagged
  std::uint16_t gueDstPort = kGueDefaultPort;
  std::uint8_t outerTtl = kDefaultOuterTtl;  // TTL or hop limit of the outer header
  std::uint16_t mtu = kDefaultEgressMtu;     // egress L3 MTU (outer IP packet)
};

struct EncapResult {
  DropReason drop = DropReason::None;
  // With None and a hop asked for: whether it was written (false: IPIP /
  // IP6IP6, or no room under the MTU for its bytes).
  bool hopWritten = false;
  // With MtuExceeded: the MTU to put into the ICMP error for the client
  // (egress MTU - encapOverhead, clamped to 68 for IPv4 / 1280 for IPv6).
  std::uint16_t icmpMtu = 0;
  // With None: the encapsulated frame is buffer[dataOffset, dataOffset + frameLength).
  std::size_t dataOffset = 0;
  std::size_t frameLength = 0;

  [[nodiscard]] bool ok() const noexcept { return drop == DropReason::None; }
};

[[nodiscard]] constexpr IpVersion outerIpVersion(EncapKind kind) noexcept {
  return kind == EncapKind::IpInIp4 || kind == EncapKind::Gue4 ? IpVersion::V4 : IpVersion::V6;
}

[[nodiscard]] constexpr bool usesGue(EncapKind kind) noexcept {
  return kind == EncapKind::Gue4 || kind == EncapKind::Gue6;
}

// Bytes the outer headers add to the inner IP packet at L3 (what counts
// against the egress MTU): outer IP, plus UDP and GUE for the GUE kinds.
[[nodiscard]] constexpr std::size_t encapOverhead(EncapKind kind) noexcept {
  return (outerIpVersion(kind) == IpVersion::V4 ? sizeof(Ipv4Header) : sizeof(Ipv6Header)) +
         (usesGue(kind) ? sizeof(UdpHeader) + sizeof(GueHeader) : 0);
}

// Bytes written in front of the inner IP header: overhead plus the new L2.
[[nodiscard]] constexpr std::size_t encapHeaderBytes(EncapKind kind, bool egressVlan) noexcept {
  return sizeof(EthernetHeader) + (egressVlan ? sizeof(VlanTag) : 0) + encapOverhead(kind);
}

// The most headroom any kind needs in front of the frame (GUE over IPv6 with
// an egress tag, from an untagged frame): 18 + 40 + 8 + 4 - 14, plus a
// second-chance hop's 20.
inline constexpr std::size_t kEncapMaxHeadroom = encapHeaderBytes(EncapKind::Gue6, true) -
                                                 sizeof(EthernetHeader) +
                                                 secondChanceBytes(IpVersion::V6);
static_assert(kEncapMaxHeadroom == 76);

[[nodiscard]] constexpr std::uint16_t gueSourcePort(std::uint64_t flowHash) noexcept {
  return static_cast<std::uint16_t>(kGueSourcePortBase | (flowHash >> 50));
}

[[nodiscard]] constexpr std::uint32_t outerFlowLabel(std::uint64_t flowHash) noexcept {
  const auto label = static_cast<std::uint32_t>((flowHash >> 30) & 0xfffff);
  return label == 0 ? 1 : label;
}

// Encapsulates the frame at buffer[dataOffset, dataOffset + frameLength) for
// `target`. `view` is parsePacket() of that frame with ok(), and its
// key.version must be `Inner` (else BadIpVersion; a view that does not lie
// within the frame gives Truncated). `Kind` decides the format; target.kind is
// read only by encapsulateAny(). On success the result names the new frame; on
// any drop the buffer is unchanged. `secondChance`, when not null, is the
// previous backend's tunnel address (outer family, as EncapTarget::backend):
// GUE kinds write it as a second-chance hop when it fits under the MTU.
template <EncapKind Kind, IpVersion Inner>
[[nodiscard]] EncapResult encapsulate(std::span<std::byte> buffer, std::size_t dataOffset,
                                      std::size_t frameLength, const PacketView& view,
                                      const EncapTarget& target, std::uint64_t flowHash,
                                      const IpBytes* secondChance = nullptr) noexcept;

#define SPILLWAY_ENCAP_EXTERN(K, V)                                                             \
  extern template EncapResult encapsulate<K, V>(std::span<std::byte>, std::size_t, std::size_t, \
                                                const PacketView&, const EncapTarget&,          \
                                                std::uint64_t, const IpBytes*) noexcept
SPILLWAY_ENCAP_EXTERN(EncapKind::IpInIp4, IpVersion::V4);
SPILLWAY_ENCAP_EXTERN(EncapKind::IpInIp4, IpVersion::V6);
SPILLWAY_ENCAP_EXTERN(EncapKind::IpInIp6, IpVersion::V4);
SPILLWAY_ENCAP_EXTERN(EncapKind::IpInIp6, IpVersion::V6);
SPILLWAY_ENCAP_EXTERN(EncapKind::Gue4, IpVersion::V4);
SPILLWAY_ENCAP_EXTERN(EncapKind::Gue4, IpVersion::V6);
SPILLWAY_ENCAP_EXTERN(EncapKind::Gue6, IpVersion::V4);
SPILLWAY_ENCAP_EXTERN(EncapKind::Gue6, IpVersion::V6);
#undef SPILLWAY_ENCAP_EXTERN

// Run-time dispatch on target.kind and view.key.version to the template above.
[[nodiscard]] EncapResult encapsulateAny(std::span<std::byte> buffer, std::size_t dataOffset,
                                         std::size_t frameLength, const PacketView& view,
                                         const EncapTarget& target, std::uint64_t flowHash,
                                         const IpBytes* secondChance = nullptr) noexcept;

// The encapsulation as a template (issue #25; Katran's and VPP lb's design):
// built once per backend and snapshot from its EncapTarget, it holds the
// outer headers (Ethernet, the egress tag, the outer IP header and, for GUE,
// UDP + GUE) with every field that does not depend on the packet filled in,
// the partial checksums of those fields, the MTU limits, and the writer for
// the target's kind and tagging. Per packet the writer copies the headers
// (a fixed size per writer), then sets only the lengths, the traffic class,
// the inner family's protocol, the IPv6 flow label, the UDP source port, and
// the checksums from the partial sums; the identification stays 0 (DF, RFC
// 6864). The one choice left per packet is the inner family (which of two
// writers); the kind and the tag were decided when the template was built.
//
// Its output is byte for byte encapsulate<Kind, Inner>()'s for the same
// target, view, hash and hop, drops and icmpMtu included (the reference
// builder above stays for control code and as the tests' oracle:
// encap_test EncapTemplate*).
struct EncapTemplate;
using EncapWriter = EncapResult (*)(const EncapTemplate&, std::span<std::byte> buffer,
                                    std::size_t dataOffset, std::size_t frameLength,
                                    const PacketView& view, std::uint64_t flowHash,
                                    const IpBytes* secondChance) noexcept;

struct EncapTemplate {
  // Ethernet (14) + tag (4) + IPv6 (40) + UDP (8) + GUE (4) at most.
  static constexpr std::size_t kMaxHeader = encapHeaderBytes(EncapKind::Gue6, true);

  // The headers, from the new frame's first byte; lengths, traffic class,
  // flow label, source port, checksums and the inner protocol are 0 here.
  std::array<std::byte, kMaxHeader> header{};
  // The largest inner IP packet under the egress MTU (mtu - overhead; may be
  // negative), and what an ICMP error says when a packet is larger.
  std::int32_t maxInner = 0;
  std::uint16_t icmpMtuV4 = 0;
  std::uint16_t icmpMtuV6 = 0;
  // Outer IPv4: the 16-bit one's complement sum of the header's words as
  // built (length, traffic class, checksum and an IPIP protocol 0).
  std::uint32_t ipSum = 0;
  // GUE: the UDP checksum's fixed part: pseudo-header addresses and protocol,
  // and the destination port.
  std::uint32_t udpSum = 0;
  // By inner family: [0] IPv4, [1] IPv6. A template never built drops every
  // packet (Truncated), as encapsulateAny() does for an unknown kind.
  std::array<EncapWriter, 2> writers{};

  EncapTemplate() noexcept;
  [[nodiscard]] static EncapTemplate build(const EncapTarget& target) noexcept;

  // encapsulateAny(buffer, dataOffset, frameLength, view, target, flowHash,
  // secondChance) for the target it was built from.
  [[nodiscard]] EncapResult write(std::span<std::byte> buffer, std::size_t dataOffset,
                                  std::size_t frameLength, const PacketView& view,
                                  std::uint64_t flowHash,
                                  const IpBytes* secondChance = nullptr) const noexcept {
    return writers[view.key.version == IpVersion::V6](*this, buffer, dataOffset, frameLength, view,
                                                      flowHash, secondChance);
  }
};

}  // namespace spillway
