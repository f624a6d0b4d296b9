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
 * Second chance (issue #24; ARCHITECTURE.md "Second chance"). GUE may carry
 * private data (flags 0, Hlen 2 over IPv4, 5 over IPv6) naming the flow's
 * previous backend, which the load balancer adds to a mid-flow TCP packet
 * that only its table placed, on a slot whose owner changed lately. Here the
 * backend decides: a non-SYN TCP packet for which the kernel has no socket
 * (bpf_skc_lookup_tcp on the inner tuple; a listener alone does not count:
 * a non-SYN segment is not its business) is sent on once to the named
 * backend: outer source becomes our address, destination the hop's, TTL /
 * hop limit minus one, the private data marked redirected, checksums
 * updated, MACs swapped, XDP_TX (the next hop that sent it routes it on).
 * Only when the outer source is a load balancer in decap_lbs (no open
 * relay), never a packet already marked (no loop), never a SYN (a new
 * connection belongs to the table's backend). Everything else with a hop is
 * decapsulated here as usual and counted.
 *
 * Every frame is counted once in decap_counters (spillway_decap_abi.h) and
 * nothing is ever dropped (a redirected frame counts as kDecapScRedirected
 * only; the other second-chance outcomes count in addition), except a frame already shortened when the
 * headers cannot be rewritten (kDecapError, cannot happen after a successful
 * adjust, but the verifier wants the branch).
 *
 * A redirected flow is recorded in decap_sc_flows (its inner tuple, packets,
 * first and last time, the hop): what `spillway-decap second-chance` lists
 * and the drills attribute surviving flows with.
 *
 * Thread contract: runs on every RX CPU at once; reads decap_addrs and
 * decap_config, writes only this CPU's slot of decap_counters, and on the
 * redirect path decap_sc_flows (an LRU hash; its packet count is added
 * atomically, the rest written by whichever CPU redirects last).
 */
/* The kernel's types first, then libbpf's helpers, which use them. */
/* clang-format off */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
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
#define kIpProtoTcp 6
#define kTcpStateListen 10 /* BPF_TCP_LISTEN */

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
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, SPILLWAY_DECAP_MAX_LBS);
  __type(key, struct DecapAddressKey);
  __type(value, __u8);
} decap_lbs SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, SPILLWAY_DECAP_MAX_SC_FLOWS);
  __type(key, struct DecapFlowKey);
  __type(value, struct DecapFlowValue);
} decap_sc_flows SEC(".maps");

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
  __u32 hopOffset; /* second-chance private data, from the frame's start; 0 = none */
  __u32 udpOffset; /* with a hop: the UDP header */
};

static __always_inline int countAs(__u32 counter, __u64 frameBytes, int action) {
  struct DecapCounterValue* value = bpf_map_lookup_elem(&decap_counters, &counter);
  if (value) {
    value->packets += 1;
    value->bytes += frameBytes;
  }
  return action;
}

static __always_inline int inAddressMap(void* map, __u8 family, const void* addr, __u32 len) {
  struct DecapAddressKey key;
  __builtin_memset(&key, 0, sizeof(key));
  key.family = family;
  if (len == 4)
    __builtin_memcpy(key.addr, addr, 4);
  else
    __builtin_memcpy(key.addr, addr, 16);
  return bpf_map_lookup_elem(map, &key) != 0;
}

static __always_inline int isOwnAddress(__u8 family, const void* addr, __u32 len) {
  return inAddressMap(&decap_addrs, family, addr, len);
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
    /* version 0, C 0, flags 0. Hlen 0, or the second-chance private data of
     * the outer family (the only optional field Spillway writes). */
    if ((gue->versionControlHlen & 0xe0) != 0 || gue->flags != 0) return kDecapMalformed;
    __u32 hlenBytes = (gue->versionControlHlen & 0x1f) * 4;
    if (hlenBytes != 0) {
      __u32 want = ipBase == kDecapIp4In4 ? SPILLWAY_SC_BYTES_V4 : SPILLWAY_SC_BYTES_V6;
      if (hlenBytes != want) return kDecapMalformed;
      struct DecapSecondChance* sc = (void*)(gue + 1);
      if ((void*)(sc + 1) > dataEnd) return kDecapMalformed;
      if (sc->type != SPILLWAY_SC_TYPE || sc->version != SPILLWAY_SC_VERSION)
        return kDecapMalformed;
      if (bpf_ntohs(udp->len) < sizeof(*udp) + sizeof(*gue) + hlenBytes) return kDecapMalformed;
      tunnel->hopOffset = payloadOffset + sizeof(*udp) + kGueHeaderBytes;
      tunnel->udpOffset = payloadOffset;
    }
    innerProtocol = gue->protocol;
    innerOffset = payloadOffset + sizeof(*udp) + kGueHeaderBytes + hlenBytes;
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

/* ---- second chance ------------------------------------------------------ */

static __always_inline __u16 checksumFold(__u64 sum) {
  sum = (sum & 0xffffffff) + (sum >> 32);
  sum = (sum & 0xffff) + (sum >> 16);
  sum = (sum & 0xffff) + (sum >> 16);
  return (__u16)~sum;
}

/* The inner packet's say: kDecapScKept when it stays here (not TCP, a SYN, a
 * local socket that is not a listener), kDecapCounterCount when no socket of
 * this host wants it. */
static __always_inline __u32 innerWantsHere(struct xdp_md* ctx, void* data, void* dataEnd,
                                            const struct Tunnel* tunnel,
                                            struct bpf_sock_tuple* tuple) {
  __u32 tupleSize;
  struct tcphdr* tcp;
  __u32 syn;
  __builtin_memset(tuple, 0, sizeof(*tuple));
  if (tunnel->innerEtherType == kEtherTypeIpv4) {
    struct iphdr* in = data + tunnel->innerOffset;
    if ((void*)(in + 1) > dataEnd) return kDecapScKept;
    if (in->protocol != kIpProtoTcp) return kDecapScKept;
    if (in->frag_off & bpf_htons(kIpv4FragmentMask)) return kDecapScKept;
    __u32 ihl = (in->ihl & 0x0f) * 4;
    if (ihl < sizeof(*in)) return kDecapScKept;
    tcp = (void*)in + ihl;
    if ((void*)(tcp + 1) > dataEnd) return kDecapScKept;
    tuple->ipv4.saddr = in->saddr;
    tuple->ipv4.daddr = in->daddr;
    tuple->ipv4.sport = tcp->source;
    tuple->ipv4.dport = tcp->dest;
    syn = tcp->syn;
    asm volatile("" : "+r"(syn)); /* read here, where the bounds are known */
    tupleSize = sizeof(tuple->ipv4);
  } else {
    struct ipv6hdr* in6 = data + tunnel->innerOffset;
    if ((void*)(in6 + 1) > dataEnd) return kDecapScKept;
    if (in6->nexthdr != kIpProtoTcp) return kDecapScKept; /* extension headers: stays */
    tcp = (void*)(in6 + 1);
    if ((void*)(tcp + 1) > dataEnd) return kDecapScKept;
    __builtin_memcpy(tuple->ipv6.saddr, &in6->saddr, 16);
    __builtin_memcpy(tuple->ipv6.daddr, &in6->daddr, 16);
    tuple->ipv6.sport = tcp->source;
    tuple->ipv6.dport = tcp->dest;
    syn = tcp->syn;
    asm volatile("" : "+r"(syn)); /* read here, where the bounds are known */
    tupleSize = sizeof(tuple->ipv6);
  }
  if (syn) return kDecapScKept; /* a new connection is the table's backend's */
  struct bpf_sock* sk = bpf_skc_lookup_tcp(ctx, tuple, tupleSize, BPF_F_CURRENT_NETNS, 0);
  if (sk) {
    __u32 state = sk->state;
    bpf_sk_release(sk);
    /* Established, closing, time-wait or a request socket: this host's.
     * A listener only says the port is served here; a non-SYN segment
     * that finds nothing but a listener belongs to another host's
     * connection (ARCHITECTURE.md, "Second chance", on SYN cookies). */
    if (state != kTcpStateListen) return kDecapScKept;
  }
  return kDecapCounterCount;
}

/* A redirected flow in decap_sc_flows: one lookup, and an update for its
 * first packet (the redirect path only). */
static __always_inline void recordRedirect(const struct Tunnel* tunnel,
                                           const struct bpf_sock_tuple* tuple, __u8 hopFamily,
                                           const void* hop, __u32 hopLen) {
  struct DecapFlowKey key;
  __builtin_memset(&key, 0, sizeof(key));
  if (tunnel->innerEtherType == kEtherTypeIpv4) {
    key.family = kDecapFamilyIpv4;
    __builtin_memcpy(key.saddr, &tuple->ipv4.saddr, 4);
    __builtin_memcpy(key.daddr, &tuple->ipv4.daddr, 4);
    key.sport = tuple->ipv4.sport;
    key.dport = tuple->ipv4.dport;
  } else {
    key.family = kDecapFamilyIpv6;
    __builtin_memcpy(key.saddr, tuple->ipv6.saddr, 16);
    __builtin_memcpy(key.daddr, tuple->ipv6.daddr, 16);
    key.sport = tuple->ipv6.sport;
    key.dport = tuple->ipv6.dport;
  }
  __u64 now = bpf_ktime_get_ns();
  struct DecapFlowValue* seen = bpf_map_lookup_elem(&decap_sc_flows, &key);
  if (seen) {
    __sync_fetch_and_add(&seen->packets, 1);
    seen->lastNs = now;
    return;
  }
  struct DecapFlowValue fresh;
  __builtin_memset(&fresh, 0, sizeof(fresh));
  fresh.packets = 1;
  fresh.firstNs = now;
  fresh.lastNs = now;
  fresh.hopFamily = hopFamily;
  if (hopLen == 4)
    __builtin_memcpy(fresh.hop, hop, 4);
  else
    __builtin_memcpy(fresh.hop, hop, 16);
  bpf_map_update_elem(&decap_sc_flows, &key, &fresh, BPF_NOEXIST);
}

/* Outer IPv4: decides, and rewrites for the hop when the packet moves on. */
static __always_inline __u32 secondChanceV4(struct xdp_md* ctx, void* data, void* dataEnd,
                                            __u32 l3Offset, const struct Tunnel* tunnel) {
  struct iphdr* ip = data + l3Offset;
  if ((void*)(ip + 1) > dataEnd) return kDecapScKept;
  struct DecapSecondChance* sc = data + tunnel->hopOffset;
  if ((void*)((__u8*)sc + SPILLWAY_SC_BYTES_V4) > dataEnd) return kDecapScKept;
  if (sc->flags & SPILLWAY_SC_REDIRECTED) return kDecapScArrived;
  if (!inAddressMap(&decap_lbs, kDecapFamilyIpv4, &ip->saddr, 4)) return kDecapScUnknownLb;
  struct bpf_sock_tuple tuple;
  __u32 wants = innerWantsHere(ctx, data, dataEnd, tunnel, &tuple);
  if (wants != kDecapCounterCount) return wants;
  if (ip->ttl <= 1 || ip->ihl != 5) return kDecapScKept;
  struct udphdr* udp = data + tunnel->udpOffset;
  if ((void*)(udp + 1) > dataEnd) return kDecapScKept;

  __u32 before[3];
  __u32 after[3];
  before[0] = ip->saddr;
  before[1] = ip->daddr;
  __builtin_memcpy(&before[2], sc, 4);
  after[0] = ip->daddr;
  __builtin_memcpy(&after[1], (__u8*)sc + sizeof(*sc), 4);
  sc->flags |= SPILLWAY_SC_REDIRECTED;
  __builtin_memcpy(&after[2], sc, 4);

  ip->saddr = after[0];
  ip->daddr = after[1];
  ip->ttl -= 1;
  ip->check = 0;
  __u64 sum = 0;
  __u16* words = (__u16*)ip;
#pragma unroll
  for (int i = 0; i < 10; ++i) sum += words[i];
  ip->check = checksumFold(sum);
  if (udp->check != 0) { /* 0: sent without one (RFC 768) */
    __u32 old = (__u16)~udp->check;
    __s64 delta = bpf_csum_diff(before, sizeof(before), after, sizeof(after), old);
    __u16 check = checksumFold((__u32)delta);
    udp->check = check == 0 ? 0xffff : check;
  }
  recordRedirect(tunnel, &tuple, kDecapFamilyIpv4, &after[1], 4);
  return kDecapScRedirected;
}

/* Outer IPv6: the same, with the 16-byte addresses and the hop limit. */
static __always_inline __u32 secondChanceV6(struct xdp_md* ctx, void* data, void* dataEnd,
                                            __u32 l3Offset, const struct Tunnel* tunnel) {
  struct ipv6hdr* ip6 = data + l3Offset;
  if ((void*)(ip6 + 1) > dataEnd) return kDecapScKept;
  struct DecapSecondChance* sc = data + tunnel->hopOffset;
  if ((void*)((__u8*)sc + SPILLWAY_SC_BYTES_V6) > dataEnd) return kDecapScKept;
  if (sc->flags & SPILLWAY_SC_REDIRECTED) return kDecapScArrived;
  if (!inAddressMap(&decap_lbs, kDecapFamilyIpv6, &ip6->saddr, 16)) return kDecapScUnknownLb;
  struct bpf_sock_tuple tuple;
  __u32 wants = innerWantsHere(ctx, data, dataEnd, tunnel, &tuple);
  if (wants != kDecapCounterCount) return wants;
  if (ip6->hop_limit <= 1) return kDecapScKept;
  struct udphdr* udp = data + tunnel->udpOffset;
  if ((void*)(udp + 1) > dataEnd) return kDecapScKept;

  __u32 before[9];
  __u32 after[9];
  __builtin_memcpy(&before[0], &ip6->saddr, 16);
  __builtin_memcpy(&before[4], &ip6->daddr, 16);
  __builtin_memcpy(&before[8], sc, 4);
  __builtin_memcpy(&after[0], &ip6->daddr, 16);
  __builtin_memcpy(&after[4], (__u8*)sc + sizeof(*sc), 16);
  sc->flags |= SPILLWAY_SC_REDIRECTED;
  __builtin_memcpy(&after[8], sc, 4);

  __builtin_memcpy(&ip6->saddr, &after[0], 16);
  __builtin_memcpy(&ip6->daddr, &after[4], 16);
  ip6->hop_limit -= 1;
  if (udp->check != 0) {
    __u32 old = (__u16)~udp->check;
    __s64 delta = bpf_csum_diff(before, sizeof(before), after, sizeof(after), old);
    __u16 check = checksumFold((__u32)delta);
    udp->check = check == 0 ? 0xffff : check;
  }
  recordRedirect(tunnel, &tuple, kDecapFamilyIpv6, &after[4], 16);
  return kDecapScRedirected;
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

  struct Tunnel tunnel = {0};
  __u32 verdict;
  if (etherType == kEtherTypeIpv4)
    verdict = parseOuterIpv4(data, dataEnd, l2Bytes, &tunnel);
  else if (etherType == kEtherTypeIpv6)
    verdict = parseOuterIpv6(data, dataEnd, l2Bytes, &tunnel);
  else
    verdict = kDecapPassNonIp;
  if (verdict != kDecapCounterCount) return countAs(verdict, frameBytes, XDP_PASS);

  if (tunnel.hopOffset != 0) {
    __u32 decided = etherType == kEtherTypeIpv4
                        ? secondChanceV4(ctx, data, dataEnd, l2Bytes, &tunnel)
                        : secondChanceV6(ctx, data, dataEnd, l2Bytes, &tunnel);
    if (decided == kDecapScRedirected) {
      /* Back to the next hop that sent it, which routes it on. */
      eth = data;
      if ((void*)(eth + 1) > dataEnd) return countAs(kDecapError, frameBytes, XDP_PASS);
      __builtin_memcpy(eth->h_dest, savedEth.h_source, ETH_ALEN);
      __builtin_memcpy(eth->h_source, savedEth.h_dest, ETH_ALEN);
      return countAs(kDecapScRedirected, frameBytes, XDP_TX);
    }
    countAs(decided, frameBytes, XDP_PASS);
  }

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
