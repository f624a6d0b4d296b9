/* The contract between spillway_redirect.bpf.c (the gateway's XDP program in
 * AF_XDP mode) and spillwayd's XdpVipMap (xdp_vip_map.cpp): map names, key
 * and value layouts, counter indices. C, so that both clang -target bpf and
 * g++ read the same definitions; fixed-width fields only, layouts pinned by
 * the static asserts at the end.
 *
 * Maps (names at most 15 characters, the kernel's limit):
 *  - xsks_map        XSKMAP, rx queue index -> AF_XDP socket. The name and
 *                    the key are DPDK's: the net_af_xdp PMD, given
 *                    xdp_prog=<this object>, looks the map up by this name and
 *                    inserts each of its queues' socket at the queue index.
 *  - vip_map         hash, RedirectVipKey -> __u32 flags (RedirectVipFlags).
 *                    Written by spillwayd's control thread, read per packet.
 *  - redir_counters  per-CPU array[kRedirectCounterCount] of
 *                    RedirectCounterValue; each CPU writes its own slot,
 *                    spillwayd sums them.
 */
#ifndef SPILLWAY_REDIRECT_ABI_H
#define SPILLWAY_REDIRECT_ABI_H

#ifdef __cplusplus
#include <cstdint>
typedef std::uint8_t RedirectU8;
typedef std::uint16_t RedirectU16;
typedef std::uint32_t RedirectU32;
typedef std::uint64_t RedirectU64;
#else
#include <linux/types.h>
typedef __u8 RedirectU8;
typedef __u16 RedirectU16;
typedef __u32 RedirectU32;
typedef __u64 RedirectU64;
#endif

/* The kernel keeps 15 characters of a program name. */
#define SPILLWAY_REDIRECT_PROG_NAME "spillway_redir"
#define SPILLWAY_REDIRECT_MAP_XSKS "xsks_map"
#define SPILLWAY_REDIRECT_MAP_VIPS "vip_map"
#define SPILLWAY_REDIRECT_MAP_COUNTERS "redir_counters"
#define SPILLWAY_REDIRECT_MAX_QUEUES 256
#define SPILLWAY_REDIRECT_MAX_VIP_KEYS 16384

enum RedirectFamily {
  kRedirectFamilyIpv4 = 4,
  kRedirectFamilyIpv6 = 6,
};

/* One entry of vip_map. The program looks up, in this order:
 *   1. {addr, family, proto, dst port}  TCP/UDP, not a fragment, ports read
 *   2. {addr, family, proto, 0}         every port of that protocol, and a
 *                                       packet of that protocol without a port
 *   3. {addr, family, 0, 0}             "this address is a VIP": everything
 *                                       else to it (ICMP, fragments, IPv6
 *                                       extension headers, malformed L4)
 * An IPv4 address fills the first 4 bytes of addr; the rest stays zero.
 * port is in network byte order (as on the wire, so the program compares
 * without a swap); a port is only meaningful with proto TCP (6) or UDP (17),
 * and proto 0 always goes with port 0. */
struct RedirectVipKey {
  RedirectU8 addr[16];
  RedirectU8 family; /* RedirectFamily */
  RedirectU8 proto;  /* IP protocol / IPv6 next header; 0: any */
  RedirectU16 port;  /* destination port, network byte order; 0: any */
};

/* vip_map's value. No flag changes the verdict yet; unknown bits must be 0. */
enum RedirectVipFlags {
  kRedirectVipNone = 0,
};

struct RedirectCounterValue {
  RedirectU64 packets;
  RedirectU64 bytes; /* frame bytes as received */
};

/* Every frame is counted once. */
enum RedirectCounter {
  kRedirectVip = 0,           /* to a VIP, redirected into the queue's AF_XDP socket */
  kRedirectPassNoSocket = 1,  /* to a VIP, but no socket on this rx queue: passed
                                 (spillwayd not started yet, or a queue outside the
                                 PMD's start_queue..start_queue+queue_count) */
  kRedirectPassNotVip = 2,    /* IPv4/IPv6, destination not in vip_map */
  kRedirectPassNonIp = 3,     /* neither IPv4 nor IPv6 (ARP, LLDP, QinQ, ...) */
  kRedirectPassMalformed = 4, /* IPv4/IPv6 EtherType, fixed IP header truncated */
  kRedirectCounterCount = 5,
};

#ifdef __cplusplus
static_assert(sizeof(RedirectVipKey) == 20);
static_assert(sizeof(RedirectCounterValue) == 16);
#else
_Static_assert(sizeof(struct RedirectVipKey) == 20, "RedirectVipKey layout");
_Static_assert(sizeof(struct RedirectCounterValue) == 16, "RedirectCounterValue layout");
#endif

#endif /* SPILLWAY_REDIRECT_ABI_H */
