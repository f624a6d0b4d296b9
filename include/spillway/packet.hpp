// Packet views: a bounds-checked parse of one Ethernet frame held in a byte
// span, never a DPDK buffer.
//
// parsePacket() walks Ethernet (at most one 802.1Q tag), IPv4 (with options)
// or IPv6 (extension headers up to kMaxIpv6ExtensionHeaders), then TCP, UDP,
// ICMP or ICMPv6, and returns offsets, the fields the data path needs and the
// flow key. It reads nothing outside the span and trusts no length field: an
// L4 header must lie inside the IP length, the IP length inside the frame
// (trailing Ethernet padding is ignored). The IPv4 header checksum is
// verified in software (BadIpChecksum: five 32-bit adds and a fold for a
// 20-byte header; ParseAndHash went from ~27.5 to ~29.8 ns with it and the
// TCP data bit), whatever the NIC's RX offload said, so every PMD gets the
// same verdict.
//
// The result says what it could establish:
//  - kind == NonIp: not IPv4/IPv6 (ARP, LLDP, ...): the exception path's;
//  - l3Valid: the IP header is sound and key.src/key.dst are set, so the data
//    path can tell VIP traffic from host traffic even when the L4 part is
//    unusable;
//  - drop == None: the L4 header is sound too, and the whole key is set.
// Otherwise `drop` names the first problem found.
//
// ICMP errors quote the packet that caused them. parseIcmpError() reads that
// quote and returns the key of the client flow it belongs to, so the error is
// steered to the backend that owns the flow (path-MTU discovery for DSR: the
// quoted packet went from the VIP to the client, so the flow key is the quote's
// with source and destination swapped).
//
// Pure functions; any thread; no allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "spillway/drop_reason.hpp"
#include "spillway/flow_key.hpp"

namespace spillway {

inline constexpr int kMaxIpv6ExtensionHeaders = 8;

enum class PacketKind : std::uint8_t { NonIp, Ip };

struct PacketView {
  DropReason drop = DropReason::Truncated;
  PacketKind kind = PacketKind::NonIp;
  bool l3Valid = false;
  bool hasVlan = false;
  bool dontFragment = false;    // IPv4 DF; IPv6 never fragments in flight
  bool tcpData = false;         // a TCP segment with payload
  std::uint16_t etherType = 0;  // after the VLAN tag, if any
  std::uint16_t vlanTci = 0;
  std::uint16_t l3Offset = 0;
  std::uint16_t l4Offset = 0;
  std::uint16_t l3Length = 0;  // IP header + payload as the IP header declares it
  std::uint8_t ttl = 0;        // TTL or hop limit
  std::uint8_t tos = 0;        // IPv4 TOS or IPv6 traffic class (DSCP + ECN)
  std::uint8_t tcpFlags = 0;
  std::uint8_t icmpType = 0;
  std::uint8_t icmpCode = 0;
  FlowKey key{};  // proto is the L4 protocol; ports zero unless TCP/UDP

  [[nodiscard]] bool ok() const noexcept { return drop == DropReason::None; }
  [[nodiscard]] bool isIcmp() const noexcept {
    return key.proto == static_cast<std::uint8_t>(IpProto::Icmp) ||
           key.proto == static_cast<std::uint8_t>(IpProto::Icmpv6);
  }
};

// The same parse, written into `view`: a caller that keeps views in an array
// saves copying each out of a temporary.
void parsePacket(std::span<const std::byte> frame, PacketView& view) noexcept;

[[nodiscard]] inline PacketView parsePacket(std::span<const std::byte> frame) noexcept {
  PacketView view;
  parsePacket(frame, view);
  return view;
}

// True for ICMP / ICMPv6 error types that quote an offending packet
// (destination unreachable incl. fragmentation needed / packet too big, time
// exceeded, parameter problem).
[[nodiscard]] bool isIcmpError(const PacketView& view) noexcept;

struct IcmpErrorFlow {
  DropReason drop = DropReason::IcmpInnerTruncated;
  FlowKey clientFlow{};  // the flow, as the client sent it to the VIP
  std::uint16_t innerL3Offset = 0;
};

// `view` must be a parse of `frame` with ok() and isIcmpError(view).
[[nodiscard]] IcmpErrorFlow parseIcmpError(std::span<const std::byte> frame,
                                           const PacketView& view) noexcept;

}  // namespace spillway
