// Wire layouts of the headers Spillway reads and writes.
//
// Every struct is made of bytes, Be16 and Be32 only, so it has alignment 1,
// no padding, and the exact on-wire size (checked below). Parsers copy headers
// out of a packet with loadAt<T>() after a bounds check; writers fill a struct
// and storeAt<T>() it. Nothing here reads memory by itself.
#pragma once

#include <array>
#include <cstdint>

#include "spillway/byte_order.hpp"

namespace spillway {

inline constexpr std::uint16_t kEtherTypeIpv4 = 0x0800;
inline constexpr std::uint16_t kEtherTypeArp = 0x0806;
inline constexpr std::uint16_t kEtherTypeVlan = 0x8100;
inline constexpr std::uint16_t kEtherTypeQinQ = 0x88a8;
inline constexpr std::uint16_t kEtherTypeIpv6 = 0x86dd;

using MacAddress = std::array<std::uint8_t, 6>;

struct EthernetHeader {
  MacAddress dst;
  MacAddress src;
  Be16 etherType;
};

struct VlanTag {
  Be16 tci;
  Be16 etherType;  // of what follows the tag
};

struct Ipv4Header {
  std::uint8_t versionIhl;  // version 4 in the high nibble, IHL in 32-bit words
  std::uint8_t tos;         // DSCP (6 bits) and ECN (2 bits)
  Be16 totalLength;
  Be16 id;
  Be16 flagsFragment;  // reserved, DF, MF, then a 13-bit offset in 8-byte units
  std::uint8_t ttl;
  std::uint8_t protocol;
  Be16 checksum;
  std::array<std::uint8_t, 4> src;
  std::array<std::uint8_t, 4> dst;
};

inline constexpr std::uint16_t kIpv4FlagDf = 0x4000;
inline constexpr std::uint16_t kIpv4FlagMf = 0x2000;
inline constexpr std::uint16_t kIpv4OffsetMask = 0x1fff;

struct Ipv6Header {
  Be32 versionClassLabel;  // version 6 (4 bits), traffic class (8), flow label (20)
  Be16 payloadLength;
  std::uint8_t nextHeader;
  std::uint8_t hopLimit;
  std::array<std::uint8_t, 16> src;
  std::array<std::uint8_t, 16> dst;
};

// Generic IPv6 extension header prefix (hop-by-hop, routing, destination
// options): length in 8-octet units, not counting the first 8.
struct Ipv6ExtensionHeader {
  std::uint8_t nextHeader;
  std::uint8_t length;
};

struct Ipv6FragmentHeader {
  std::uint8_t nextHeader;
  std::uint8_t reserved;
  Be16 offsetFlags;  // 13-bit offset in 8-byte units, 2 reserved bits, M flag
  Be32 identification;
};

struct TcpHeader {
  Be16 srcPort;
  Be16 dstPort;
  Be32 seq;
  Be32 ack;
  std::uint8_t dataOffset;  // header length in 32-bit words in the high nibble
  std::uint8_t flags;
  Be16 window;
  Be16 checksum;
  Be16 urgent;
};

inline constexpr std::uint8_t kTcpFin = 0x01;
inline constexpr std::uint8_t kTcpSyn = 0x02;
inline constexpr std::uint8_t kTcpRst = 0x04;
inline constexpr std::uint8_t kTcpPsh = 0x08;
inline constexpr std::uint8_t kTcpAck = 0x10;

struct UdpHeader {
  Be16 srcPort;
  Be16 dstPort;
  Be16 length;
  Be16 checksum;
};

// ICMP and ICMPv6 share this 8-byte prefix; `rest` is the identifier and
// sequence of an echo, the next-hop MTU of "fragmentation needed" (low 16
// bits) or the MTU of "packet too big" (32 bits).
struct IcmpHeader {
  std::uint8_t type;
  std::uint8_t code;
  Be16 checksum;
  Be32 rest;
};

// Generic UDP Encapsulation, variant 0 (draft-ietf-intarea-gue): version 0,
// C=0, Hlen=0, proto = the inner IP protocol (4 or 41), no flags.
struct GueHeader {
  std::uint8_t versionControlHlen;
  std::uint8_t protocol;
  Be16 flags;
};

static_assert(sizeof(EthernetHeader) == 14 && alignof(EthernetHeader) == 1);
static_assert(sizeof(VlanTag) == 4 && alignof(VlanTag) == 1);
static_assert(sizeof(Ipv4Header) == 20 && alignof(Ipv4Header) == 1);
static_assert(sizeof(Ipv6Header) == 40 && alignof(Ipv6Header) == 1);
static_assert(sizeof(Ipv6ExtensionHeader) == 2);
static_assert(sizeof(Ipv6FragmentHeader) == 8);
static_assert(sizeof(TcpHeader) == 20 && alignof(TcpHeader) == 1);
static_assert(sizeof(UdpHeader) == 8 && alignof(UdpHeader) == 1);
static_assert(sizeof(IcmpHeader) == 8 && alignof(IcmpHeader) == 1);
static_assert(sizeof(GueHeader) == 4 && alignof(GueHeader) == 1);

// ICMP types used by the data path.
inline constexpr std::uint8_t kIcmpEchoReply = 0;
inline constexpr std::uint8_t kIcmpDestUnreachable = 3;
inline constexpr std::uint8_t kIcmpCodeFragNeeded = 4;
inline constexpr std::uint8_t kIcmpSourceQuench = 4;
inline constexpr std::uint8_t kIcmpEchoRequest = 8;
inline constexpr std::uint8_t kIcmpTimeExceeded = 11;
inline constexpr std::uint8_t kIcmpParameterProblem = 12;
inline constexpr std::uint8_t kIcmp6DestUnreachable = 1;
inline constexpr std::uint8_t kIcmp6PacketTooBig = 2;
inline constexpr std::uint8_t kIcmp6TimeExceeded = 3;
inline constexpr std::uint8_t kIcmp6ParameterProblem = 4;
inline constexpr std::uint8_t kIcmp6EchoRequest = 128;
inline constexpr std::uint8_t kIcmp6EchoReply = 129;

}  // namespace spillway
