/* The contract between spillway_decap.bpf.c and its loader (decap_main.cpp):
 * map names, key and value layouts, counter indices. C, so that both clang
 * -target bpf and g++ read the same definitions; fixed-width fields with
 * explicit padding only, so the layouts are identical on both sides (checked
 * by the static asserts at the end).
 *
 * Maps (names at most 15 characters, the kernel's limit):
 *  - decap_addrs    hash, DecapAddressKey -> __u8 (1): the backend's own
 *                   tunnel addresses. Only packets whose outer destination is
 *                   one of them are decapsulated. Written by the loader,
 *                   read per packet.
 *  - decap_config   array[1] of DecapConfig. Written by the loader before
 *                   attach, read per UDP packet to an own address.
 *  - decap_counters per-CPU array[kDecapCounterCount] of DecapCounterValue;
 *                   each CPU writes its own slot, the loader sums them.
 *  - decap_lbs      hash, DecapAddressKey -> __u8 (1): the tunnel addresses
 *                   of the load balancers (attach --lb). Only a second-chance
 *                   packet whose outer source is one of them is ever sent on
 *                   (no open relay). Written by the loader.
 *  - decap_sc_flows LRU hash, DecapFlowKey -> DecapFlowValue: the flows this
 *                   backend sent on to another on a second chance (inner
 *                   tuple; packets, first and last time, the hop), for the
 *                   drills' attribution and `spillway-decap second-chance`.
 *                   Written on the redirect path only (one lookup, one
 *                   update for a flow's first packet); the least recently
 *                   redirected flow goes when it is full.
 *
 * Second chance (ARCHITECTURE.md "Second chance"): GUE private data of
 * SPILLWAY_SC_BYTES_V4 / _V6 bytes (Hlen 2 / 5): DecapSecondChance, then the
 * previous backend's tunnel address in the outer family. Same values as
 * spillway/encap.hpp's SecondChanceData.
 */
#ifndef SPILLWAY_DECAP_ABI_H
#define SPILLWAY_DECAP_ABI_H

#ifdef __cplusplus
#include <cstdint>
typedef std::uint8_t DecapU8;
typedef std::uint16_t DecapU16;
typedef std::uint32_t DecapU32;
typedef std::uint64_t DecapU64;
#else
#include <linux/types.h>
typedef __u8 DecapU8;
typedef __u16 DecapU16;
typedef __u32 DecapU32;
typedef __u64 DecapU64;
#endif

#define SPILLWAY_DECAP_PROG_NAME "spillway_decap"
#define SPILLWAY_DECAP_MAP_ADDRS "decap_addrs"
#define SPILLWAY_DECAP_MAP_CONFIG "decap_config"
#define SPILLWAY_DECAP_MAP_COUNTERS "decap_counters"
#define SPILLWAY_DECAP_MAP_LBS "decap_lbs"
#define SPILLWAY_DECAP_MAP_SC_FLOWS "decap_sc_flows"
#define SPILLWAY_DECAP_MAX_ADDRS 256
#define SPILLWAY_DECAP_MAX_LBS 256
#define SPILLWAY_DECAP_MAX_SC_FLOWS 16384

#define SPILLWAY_SC_TYPE 0x5c
#define SPILLWAY_SC_VERSION 1
#define SPILLWAY_SC_REDIRECTED 0x01 /* flags: already sent on once */
#define SPILLWAY_SC_BYTES_V4 8
#define SPILLWAY_SC_BYTES_V6 20

struct DecapSecondChance {
  DecapU8 type; /* SPILLWAY_SC_TYPE */
  DecapU8 version;
  DecapU8 flags;
  DecapU8 reserved;
};

enum DecapFamily {
  kDecapFamilyIpv4 = 4,
  kDecapFamilyIpv6 = 6,
};

/* An IPv4 address fills the first 4 bytes of addr; the rest stays zero. */
struct DecapAddressKey {
  DecapU8 family; /* DecapFamily */
  DecapU8 pad[3];
  DecapU8 addr[16];
};

/* A redirected flow: the inner packet's tuple as the client sent it (IPv4
 * addresses fill the first 4 bytes; ports in network byte order). */
struct DecapFlowKey {
  DecapU8 family; /* DecapFamily of the inner packet */
  DecapU8 pad[3];
  DecapU8 saddr[16];
  DecapU8 daddr[16];
  DecapU16 sport;
  DecapU16 dport;
};

struct DecapFlowValue {
  DecapU64 packets; /* sent on */
  DecapU64 firstNs; /* bpf_ktime_get_ns (CLOCK_MONOTONIC) of the first */
  DecapU64 lastNs;  /* ... and of the last */
  DecapU8 hopFamily; /* DecapFamily of the outer header */
  DecapU8 pad[3];
  DecapU8 hop[16]; /* the backend it was sent to */
  DecapU32 reserved;
};

struct DecapConfig {
  DecapU16 guePort; /* UDP destination port of GUE, host byte order */
  DecapU16 pad;
  DecapU32 reserved;
};

struct DecapCounterValue {
  DecapU64 packets;
  DecapU64 bytes; /* frame bytes as received, outer headers included */
};

/* Decapsulated kinds are named inner-in-outer. Everything not decapsulated
 * is passed to the kernel untouched and counted under one reason. */
enum DecapCounter {
  kDecapIp4In4 = 0,         /* outer IPv4 proto 4 (IPIP, RFC 2003) */
  kDecapIp6In4 = 1,         /* outer IPv4 proto 41 (RFC 4213) */
  kDecapIp4In6 = 2,         /* outer IPv6 next header 4 (RFC 2473) */
  kDecapIp6In6 = 3,         /* outer IPv6 next header 41 (RFC 2473) */
  kDecapGue4In4 = 4,        /* IPv4 / UDP / GUE v0 proto 4 */
  kDecapGue6In4 = 5,        /* IPv4 / UDP / GUE v0 proto 41 */
  kDecapGue4In6 = 6,        /* IPv6 / UDP / GUE v0 proto 4 */
  kDecapGue6In6 = 7,        /* IPv6 / UDP / GUE v0 proto 41 */
  kDecapPassNonIp = 8,      /* neither IPv4 nor IPv6 (ARP, LLDP, QinQ, ...) */
  kDecapPassNotLocal = 9,   /* outer destination not in decap_addrs */
  kDecapPassNotTunnel = 10, /* to an own address, but no tunnel (TCP, ICMP,
                               other UDP ports, IPv6 extension headers) */
  kDecapMalformed = 11,     /* truncated outer IP header; or to an own
                               address, tunnel-shaped but invalid: truncated,
                               bad IP version or lengths, GUE version/C/Hlen/flags
                               not zero, GUE proto not 4/41, inner version
                               not matching the protocol */
  kDecapFragment = 12,      /* to an own address, an outer fragment of a
                               tunnel or UDP packet */
  kDecapError = 13,         /* bpf_xdp_adjust_head failed */
  /* Second chance. A redirected frame is counted here only (sent back out,
   * XDP_TX); the other three count a GUE frame with a hop that stays here,
   * in addition to its decap_gue_* counter above. */
  kDecapScRedirected = 14,  /* no local socket: sent on to the named backend */
  kDecapScKept = 15,        /* a local socket (not a listener), a SYN, not TCP,
                               or outer TTL / hop limit exhausted: stays */
  kDecapScUnknownLb = 16,   /* outer source not in decap_lbs: stays */
  kDecapScArrived = 17,     /* already redirected once (flag set): stays */
  kDecapCounterCount = 18,
};

#ifdef __cplusplus
static_assert(sizeof(DecapAddressKey) == 20);
static_assert(sizeof(DecapConfig) == 8);
static_assert(sizeof(DecapCounterValue) == 16);
static_assert(sizeof(DecapSecondChance) == 4);
static_assert(sizeof(DecapFlowKey) == 40);
static_assert(sizeof(DecapFlowValue) == 48);
#else
_Static_assert(sizeof(struct DecapAddressKey) == 20, "DecapAddressKey layout");
_Static_assert(sizeof(struct DecapConfig) == 8, "DecapConfig layout");
_Static_assert(sizeof(struct DecapCounterValue) == 16, "DecapCounterValue layout");
_Static_assert(sizeof(struct DecapSecondChance) == 4, "DecapSecondChance layout");
_Static_assert(sizeof(struct DecapFlowKey) == 40, "DecapFlowKey layout");
_Static_assert(sizeof(struct DecapFlowValue) == 48, "DecapFlowValue layout");
#endif

#endif /* SPILLWAY_DECAP_ABI_H */
