// Why a packet was dropped. Every drop in Spillway has exactly one reason and
// one counter; the names are the label values of the drops metric, so they
// are stable identifiers (lower_snake_case), never reworded.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace spillway {

enum class DropReason : std::uint8_t {
  None = 0,
  // Parser: the frame is malformed or carries something a VIP cannot take.
  Truncated,             // the frame ends inside a header
  VlanStacked,           // more than one 802.1Q / 802.1ad tag
  BadIpVersion,          // IP version nibble disagrees with the EtherType
  BadIpHeaderLength,     // IPv4 IHL below 5
  BadTotalLength,        // IP length field shorter than the header or past the frame
  BadIpChecksum,         // IPv4 header checksum wrong
  Ipv4Fragment,          // MF set or non-zero offset: no ports to steer by; on an af_packet
                         // port also a datagram the kernel reassembled past the port's MTU
  Ipv6Fragment,          // fragment header with M set or non-zero offset
  TtlExhausted,          // TTL or hop limit of 0 or 1: forwarding would expire it
  ExtensionHeaderLimit,  // more IPv6 extension headers than the parser walks
  UnsupportedProtocol,   // L4 other than TCP, UDP, ICMP, ICMPv6 (ESP, no-next-header, ...)
  BadTcpHeaderLength,    // TCP data offset below 5 or past the IP payload
  BadUdpLength,          // UDP length below 8 or past the IP payload
  // ICMP error steering: the quoted inner packet is unusable.
  IcmpInnerTruncated,  // the quoted header is cut before the ports
  IcmpInnerMalformed,  // the quoted header is not an IP header of the outer family
  IcmpUnsupported,     // an ICMP type a VIP does not take
  // Encapsulation.
  MtuExceeded,      // too big after encapsulation; an ICMP error was sent back
  MtuExceededNoDf,  // too big after encapsulation, DF clear: dropped, not fragmented
  IcmpRateLimited,  // an echo request or too-big packet whose ICMP reply the rate limits refused
  NoHeadroom,       // the buffer cannot take the outer headers
  // Steering.
  VipPortNotServed,   // to a VIP address, but no VIP serves that protocol and port
  NoBackend,          // the VIP's table has no backend (none active)
  InvalidSource,      // to a VIP from a multicast, broadcast, loopback or unspecified source
  Land,               // to a VIP with source = destination ("land")
  OwnSource,          // to a VIP from a VIP's or the gateway's own port address
  NextHopUnresolved,  // the backend's next-hop MAC is not known yet (ARP / ND pending)
  MultiSegment,       // a chained mbuf: spillwayd steers single-segment frames
  // DPDK adapter.
  NoExceptionPath,  // host traffic on a port without a kernel path
  TxQueueFull,      // the TX ring stayed full
  kCount,
};

inline constexpr std::array<std::string_view, static_cast<std::size_t>(DropReason::kCount)>
    kDropReasonNames = {
        "none",
        "truncated",
        "vlan_stacked",
        "bad_ip_version",
        "bad_ip_header_length",
        "bad_total_length",
        "bad_ip_checksum",
        "ipv4_fragment",
        "ipv6_fragment",
        "ttl_exhausted",
        "extension_header_limit",
        "unsupported_protocol",
        "bad_tcp_header_length",
        "bad_udp_length",
        "icmp_inner_truncated",
        "icmp_inner_malformed",
        "icmp_unsupported",
        "mtu_exceeded",
        "mtu_exceeded_no_df",
        "icmp_rate_limited",
        "no_headroom",
        "vip_port_not_served",
        "no_backend",
        "invalid_source",
        "land",
        "own_source",
        "next_hop_unresolved",
        "multi_segment",
        "no_exception_path",
        "tx_queue_full",
};

// Every reason has a name: a missing one would be an empty label.
consteval bool allDropReasonsNamed() {
  for (auto n : kDropReasonNames) {
    if (n.empty()) return false;
  }
  return true;
}
static_assert(allDropReasonsNamed(), "add the name of every DropReason to kDropReasonNames");

[[nodiscard]] constexpr std::string_view dropReasonName(DropReason r) noexcept {
  const auto i = static_cast<std::size_t>(r);
  return i < kDropReasonNames.size() ? kDropReasonNames[i] : std::string_view("unknown");
}

}  // namespace spillway
