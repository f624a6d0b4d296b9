/* spillway-decap: the backend half of Spillway's direct server return.
 *
 * An XDP program on the backend's NIC. A frame whose outer destination is one
 * of the backend's own tunnel addresses (map decap_addrs) and that carries
 * one of the encapsulations Spillway's writers produce (encap.hpp) loses its
 * outer headers here, and the inner IP packet goes up the kernel stack as if
 * it had arrived bare (XDP_PASS). The VIP sits on the backend's loopback, so
 * the kernel accepts the inner packet and answers the client directly.
 * This replaces the ipip / ip6tnl / fou modules, which some kernels lack.
 *
 * Formats (outer Ethernet, optionally one 802.1Q tag):
 *  - IPv4 proto 4 / 41: inner IPv4 / IPv6 (RFC 2003, RFC 4213); any IHL;
 *  - IPv6 next header 4 / 41: inner IPv4 / IPv6 (RFC 2473); no extension
 *    headers between the outer IPv6 header and the tunnel payload;
 *  - IPv4 or IPv6, UDP to the configured port (default 6080), GUE variant 0
 *    (draft-ietf-intarea-gue): first byte 0 (version 0, C 0, Hlen 0), proto
 *    4 or 41, flags 0, then the inner packet. Anything else to that port is
 *    malformed.
 * Rewrite: bpf_xdp_adjust_head() drops the outer IP (+ UDP + GUE) bytes, and
 * the saved Ethernet header (and 802.1Q tag, kept as it was) is written back
 * in front of the inner packet with the inner EtherType. MACs are unchanged,
 * so the kernel still sees a frame for this host. Inner checksums are
 * untouched (the inner packet is unchanged); the outer ones are discarded
 * unchecked, as the tunnel modules do for IPIP and as the LB's UDP checksum
 * only protects the tunnel hop.
 *
 * Every frame is counted once in decap_counters (spillway_decap_abi.h) and
 * nothing is ever dropped, except a frame already shortened when the
 * headers cannot be rewritten (kDecapError, cannot happen after a successful
 * adjust, but the verifier wants the branch).
 *
 * Thread contract: runs on every RX CPU at once; reads decap_addrs and
 * decap_config, writes only this CPU's slot of decap_counters.
 */
/* The kernel's types first, then libbpf's helpers, which use them. */
/* clang-format off */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>

#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "spillway_decap_abi.h"
/* clang-format on */

#define kEtherTypeIpv4 0x0800
#define kEtherTypeIpv6 0x86dd
#define kEtherTypeVlan 0x8100
#define kIpProtoIpv4 4 /* IPPROTO_IPIP */
#define kIpProtoIpv6 41
#define kIpProtoUdp 17
#define kIpv6NextFragment 44
#define kIpv4FragmentMask 0x3fff /* MF and offset */
#define kGueHeaderBytes 4

struct VlanTag {
  __be16 tci;
  __be16 etherType;
};

struct GueHeader {
  __u8 versionControlHlen;
  __u8 protocol;
  __be16 flags;
};

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, SPILLWAY_DECAP_MAX_ADDRS);
  __type(key, struct DecapAddressKey);
  __type(value, __u8);
} decap_addrs SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct DecapConfig);
} decap_config SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, kDecapCounterCount);
  __type(key, __u32);
  __type(value, struct DecapCounterValue);
} decap_counters SEC(".maps");

/* What the outer-header parsers found: where the inner IP packet starts
 * (from the start of the frame), its family and the counter to bump. */
struct Tunnel {
  __u32 innerOffset;
  __u16 innerEtherType; /* host byte order */
  __u32 counter;
};

static __always_inline int countAs(__u32 counter, __u64 frameBytes, int action) {
  struct DecapCounterValue* value = bpf_map_lookup_elem(&decap_counters, &counter);
  if (value) {
    value->packets += 1;
    value->bytes += frameBytes;
  }
  return action;
}

static __always_inline int isOwnAddress(__u8 family, const void* addr, __u32 len) {
  struct DecapAddressKey key;
  __builtin_memset(&key, 0, sizeof(key));
  key.family = family;
  if (len == 4)
    __builtin_memcpy(key.addr, addr, 4);
  else
    __builtin_memcpy(key.addr, addr, 16);
  return bpf_map_lookup_elem(&decap_addrs, &key) != 0;
}

static __always_inline __u16 guePort(void) {
  __u32 zero = 0;
  const struct DecapConfig* config = bpf_map_lookup_elem(&decap_config, &zero);
  return config ? config->guePort : 0;
}

/* Fills `tunnel` for the tunnel payload starting at `payload` (offset
 * `payloadOffset` in the frame), of IP protocol `protocol`; returns the
 * counter of a frame that is not decapsulated, or kDecapCounterCount when it
 * is to be. `gueBase` / `ipBase` select the counter family (outer v4 or v6). */
static __always_inline __u32 parseTunnelPayload(void* data, void* dataEnd, __u32 payloadOffset,
                                                __u8 protocol, __u32 ipBase, __u32 gueBase,
                                                struct Tunnel* tunnel) {
  __u8 innerProtocol = protocol;
  __u32 innerOffset = payloadOffset;
  __u32 base = ipBase;

  if (protocol == kIpProtoUdp) {
    struct udphdr* udp = data + payloadOffset;
    if ((void*)(udp + 1) > dataEnd) return kDecapMalformed;
    __u16 port = guePort();
    if (port == 0 || udp->dest != bpf_htons(port)) return kDecapPassNotTunnel;
    struct GueHeader* gue = (void*)(udp + 1);
    if ((void*)(gue + 1) > dataEnd) return kDecapMalformed;
    if (bpf_ntohs(udp->len) < sizeof(*udp) + sizeof(*gue)) return kDecapMalformed;
    /* version 0, C 0, Hlen 0: no optional fields, so the flags are 0 too */
    if (gue->versionControlHlen != 0 || gue->flags != 0) return kDecapMalformed;
    innerProtocol = gue->protocol;
    innerOffset = payloadOffset + sizeof(*udp) + kGueHeaderBytes;
    base = gueBase;
  } else if (protocol != kIpProtoIpv4 && protocol != kIpProtoIpv6) {
    return kDecapPassNotTunnel;
  }

  __u8* inner = data + innerOffset;
  if (innerProtocol == kIpProtoIpv4) {
    if ((void*)(inner + sizeof(struct iphdr)) > dataEnd) return kDecapMalformed;
    if ((inner[0] >> 4) != 4 || (inner[0] & 0x0f) < 5) return kDecapMalformed;
    tunnel->innerEtherType = kEtherTypeIpv4;
    tunnel->counter = base; /* the 4-in-x counter of the family */
  } else if (innerProtocol == kIpProtoIpv6) {
    if ((void*)(inner + sizeof(struct ipv6hdr)) > dataEnd) return kDecapMalformed;
    if ((inner[0] >> 4) != 6) return kDecapMalformed;
    tunnel->innerEtherType = kEtherTypeIpv6;
    tunnel->counter = base + 1; /* the 6-in-x counter */
  } else {
    return kDecapMalformed; /* GUE proto neither 4 nor 41 */
  }
  tunnel->innerOffset = innerOffset;
  return kDecapCounterCount;
}

static __always_inline __u32 parseOuterIpv4(void* data, void* dataEnd, __u32 l3Offset,
                                            struct Tunnel* tunnel) {
  struct iphdr* ip = data + l3Offset;
  if ((void*)(ip + 1) > dataEnd) return kDecapMalformed;
  if (!isOwnAddress(kDecapFamilyIpv4, &ip->daddr, 4)) return kDecapPassNotLocal;
  if (ip->protocol != kIpProtoIpv4 && ip->protocol != kIpProtoIpv6 && ip->protocol != kIpProtoUdp)
    return kDecapPassNotTunnel;

  __u32 headerBytes = ip->ihl * 4;
  __u32 totalLength = bpf_ntohs(ip->tot_len);
  if (ip->version != 4 || headerBytes < sizeof(*ip)) return kDecapMalformed;
  if ((void*)((__u8*)ip + headerBytes) > dataEnd) return kDecapMalformed;
  if (totalLength < headerBytes || (void*)((__u8*)ip + totalLength) > dataEnd)
    return kDecapMalformed;
  /* Without the tunnel modules nothing reassembles a fragmented tunnel
   * packet, so it is passed and counted: a sign of a fabric MTU below the
   * LB's. UDP fragments (no port in later ones) are counted here too. */
  if (ip->frag_off & bpf_htons(kIpv4FragmentMask)) return kDecapFragment;
  return parseTunnelPayload(data, dataEnd, l3Offset + headerBytes, ip->protocol, kDecapIp4In4,
                            kDecapGue4In4, tunnel);
}

static __always_inline __u32 parseOuterIpv6(void* data, void* dataEnd, __u32 l3Offset,
                                            struct Tunnel* tunnel) {
  struct ipv6hdr* ip6 = data + l3Offset;
  if ((void*)(ip6 + 1) > dataEnd) return kDecapMalformed;
  if (!isOwnAddress(kDecapFamilyIpv6, &ip6->daddr, 16)) return kDecapPassNotLocal;
  if (ip6->nexthdr == kIpv6NextFragment) return kDecapFragment;
  if (ip6->nexthdr != kIpProtoIpv4 && ip6->nexthdr != kIpProtoIpv6 && ip6->nexthdr != kIpProtoUdp)
    return kDecapPassNotTunnel;

  __u32 payloadLength = bpf_ntohs(ip6->payload_len);
  if (ip6->version != 6 || payloadLength == 0) return kDecapMalformed; /* 0: jumbogram */
  if ((void*)((__u8*)(ip6 + 1) + payloadLength) > dataEnd) return kDecapMalformed;
  return parseTunnelPayload(data, dataEnd, l3Offset + sizeof(*ip6), ip6->nexthdr, kDecapIp4In6,
                            kDecapGue4In6, tunnel);
}

SEC("xdp")
int spillway_decap(struct xdp_md* ctx) {
  void* data = (void*)(long)ctx->data;
  void* dataEnd = (void*)(long)ctx->data_end;
  __u64 frameBytes = dataEnd - data;

  struct ethhdr* eth = data;
  if ((void*)(eth + 1) > dataEnd) return countAs(kDecapPassNonIp, frameBytes, XDP_PASS);

  struct ethhdr savedEth;
  struct VlanTag savedTag = {0, 0};
  __builtin_memcpy(&savedEth, eth, sizeof(savedEth));
  __u16 etherType = bpf_ntohs(eth->h_proto);
  __u32 l2Bytes = sizeof(*eth);
  int tagged = 0;
  if (etherType == kEtherTypeVlan) {
    struct VlanTag* tag = (void*)(eth + 1);
    if ((void*)(tag + 1) > dataEnd) return countAs(kDecapPassNonIp, frameBytes, XDP_PASS);
    savedTag = *tag;
    etherType = bpf_ntohs(tag->etherType);
    l2Bytes += sizeof(*tag);
    tagged = 1;
  }

  struct Tunnel tunnel = {0, 0, 0};
  __u32 verdict;
  if (etherType == kEtherTypeIpv4)
    verdict = parseOuterIpv4(data, dataEnd, l2Bytes, &tunnel);
  else if (etherType == kEtherTypeIpv6)
    verdict = parseOuterIpv6(data, dataEnd, l2Bytes, &tunnel);
  else
    verdict = kDecapPassNonIp;
  if (verdict != kDecapCounterCount) return countAs(verdict, frameBytes, XDP_PASS);

  /* Drop everything between the L2 header and the inner packet. */
  int strip = (int)(tunnel.innerOffset - l2Bytes);
  if (strip <= 0 || strip > 128) return countAs(kDecapError, frameBytes, XDP_PASS);
  if (bpf_xdp_adjust_head(ctx, strip)) return countAs(kDecapError, frameBytes, XDP_PASS);

  data = (void*)(long)ctx->data;
  dataEnd = (void*)(long)ctx->data_end;
  eth = data;
  if ((void*)(eth + 1) > dataEnd) return countAs(kDecapError, frameBytes, XDP_DROP);
  __builtin_memcpy(eth->h_dest, savedEth.h_dest, ETH_ALEN);
  __builtin_memcpy(eth->h_source, savedEth.h_source, ETH_ALEN);
  if (tagged) {
    struct VlanTag* tag = (void*)(eth + 1);
    if ((void*)(tag + 1) > dataEnd) return countAs(kDecapError, frameBytes, XDP_DROP);
    eth->h_proto = bpf_htons(kEtherTypeVlan);
    tag->tci = savedTag.tci;
    tag->etherType = bpf_htons(tunnel.innerEtherType);
  } else {
    eth->h_proto = bpf_htons(tunnel.innerEtherType);
  }
  return countAs(tunnel.counter, frameBytes, XDP_PASS);
}

/* No GPL-only helper is used; the project is Apache-2.0. */
char kLicense[] SEC("license") = "Apache-2.0";
