// ICMP and ICMPv6 messages the load balancer itself sends for a VIP.
//
//  - buildFragmentationNeeded(): ICMP destination unreachable, code 4
//    (RFC 792, RFC 1191), with the next-hop MTU in the low 16 bits of the
//    second word, quoting the original IP header and as much of its payload as
//    keeps the error within 576 bytes (RFC 1812 §4.3.2.3; at least the 8 bytes
//    RFC 792 asks for, whenever the original has them).
//  - buildPacketTooBig(): ICMPv6 packet too big (RFC 4443 §3.2) with a 32-bit
//    MTU, quoting as much of the original as keeps the error within the IPv6
//    minimum MTU of 1280 bytes (RFC 4443 §2.4 (c)).
//  - buildEchoReply(): answers an echo request to a VIP configured to answer
//    pings (RFC 792, RFC 4443 §4.2), in place.
// These are the replies the encapsulation path needs when a packet would
// exceed the egress MTU once encapsulated (see encap.hpp), so that the
// client's path-MTU discovery works through a DSR load balancer.
//
// Every reply is a complete Ethernet frame: MACs swapped, the original 802.1Q
// tag kept if there was one; source IP = the original destination (the VIP),
// destination = the client, TTL / hop limit 64; IPv4 header checksum, ICMP
// checksum, ICMPv6 checksum with the pseudo header (RFC 8200 §8.1) all set.
// Errors carry DSCP CS6 (precedence 6, RFC 1812 §4.3.2.5), an id of 0 and DF
// (an atomic datagram, RFC 6864, small enough for any IPv4 path).
//
// No error is built about an ICMP error, nor for a source that is not one
// unicast host (unspecified, loopback, multicast, limited broadcast), as
// RFC 1122 §3.2.2, RFC 1812 §4.3.2.7 and RFC 4443 §2.4 (e) require: the
// builders return 0 for those, and equally when `out` is too small for the
// reply. An echo reply is built only for an echo request (code 0).
//
// Thread contract: pure functions of their arguments; any thread; noexcept; no
// allocation. `out` must not overlap `frame`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "spillway/packet.hpp"

namespace spillway {

inline constexpr std::size_t kIcmpv4ErrorMaxLength = 576;   // IP length, RFC 1812 §4.3.2.3
inline constexpr std::size_t kIcmpv6ErrorMaxLength = 1280;  // IP length, RFC 4443 §2.4 (c)
inline constexpr std::uint8_t kIcmpReplyTtl = 64;
inline constexpr std::uint8_t kIcmpErrorTrafficClass = 0xc0;  // DSCP CS6, ECN not-ECT

// ICMP "fragmentation needed and DF set" about the IPv4 packet in `frame`
// (`view` = parsePacket(frame), l3Valid, IPv4) with next-hop MTU `mtu`.
// Returns the length of the frame written to `out`, or 0 (see above).
[[nodiscard]] std::size_t buildFragmentationNeeded(std::span<const std::byte> frame,
                                                   const PacketView& view, std::uint16_t mtu,
                                                   std::span<std::byte> out) noexcept;

// ICMPv6 "packet too big" about the IPv6 packet in `frame` (`view` =
// parsePacket(frame), l3Valid, IPv6) with MTU `mtu`. Returns the length of
// the frame written to `out`, or 0.
[[nodiscard]] std::size_t buildPacketTooBig(std::span<const std::byte> frame,
                                            const PacketView& view, std::uint32_t mtu,
                                            std::span<std::byte> out) noexcept;

// Turns the echo request in `frame` (`view` = parsePacket(frame) with ok())
// into the echo reply in place: MACs and addresses swapped, type 0 / 129, TTL
// 64, checksums updated (the ICMP one incrementally, RFC 1624, so a request
// that arrived corrupt yields a reply that is corrupt too). IPv4 options and
// IPv6 extension headers are dropped rather than reflected (a source route
// must not be echoed unreversed), and so is Ethernet padding. Returns the new
// frame length (it starts where `frame` starts), or 0 when `frame` is not an
// echo request that may be answered; the frame is then unchanged.
[[nodiscard]] std::size_t buildEchoReply(std::span<std::byte> frame,
                                         const PacketView& view) noexcept;

}  // namespace spillway
