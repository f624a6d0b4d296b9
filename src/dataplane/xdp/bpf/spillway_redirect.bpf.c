/* spillway_redirect: the gateway's XDP program in AF_XDP mode.
 *
 * For gateways whose NICs stay with the kernel (cloud VMs, veth): spillwayd
 * runs DPDK's net_af_xdp PMD with devargs xdp_prog=<this object>. The PMD
 * loads the object with libbpf (bpf_object__open_file + bpf_object__load),
 * takes its first program, attaches it with XDP_FLAGS_UPDATE_IF_NOEXIST (no
 * mode flag: native where the driver has it, veth does), and inserts each of
 * its queues' AF_XDP socket into xsks_map at the queue index. So this object
 * holds exactly one program, and the map is named and keyed as DPDK expects.
 *
 * Per frame (Ethernet, at most one 802.1Q tag): a packet whose destination is
 * a VIP in vip_map (filled by spillwayd's control thread; lookup order in
 * spillway_redirect_abi.h) goes to the AF_XDP socket of the queue it arrived
 * on; everything else (ARP, ND, ICMP and SSH to the host, BGP, health-check
 * replies) goes up the kernel stack untouched (XDP_PASS). spillwayd owns all
 * VIP handling, drops included, so the program redirects whatever it cannot
 * classify further once the address is a VIP:
 *  - IPv4 with options: the L4 header is found through IHL;
 *  - fragments (IPv4 MF or offset, IPv6 fragment header) never use a port,
 *    first fragment included, so all fragments of a datagram take one path:
 *    {proto, 0}, then the address marker {0, 0};
 *  - IPv6 extension headers are not walked: a packet with any of them is
 *    matched by {next header, 0}, then the address marker. spillwayd installs
 *    the marker for every VIP address, so such packets reach it;
 *  - a malformed header after a readable fixed IP header (bad IHL, version,
 *    truncated L4) is matched by address like a portless packet, and
 *    spillwayd counts it as a drop.
 * A VIP packet on a queue without a socket in xsks_map is passed to the
 * kernel (bpf_redirect_map's fallback action) and counted apart.
 *
 * Counters: redir_counters, one slot per RedirectCounter, per CPU.
 * Thread contract: runs on every RX CPU at once; reads vip_map and xsks_map,
 * writes only this CPU's slots of redir_counters.
 */
/* The kernel's types first, then libbpf's helpers, which use them. */
/* clang-format off */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>

#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "spillway_redirect_abi.h"
/* clang-format on */

#define kEtherTypeIpv4 0x0800
#define kEtherTypeIpv6 0x86dd
#define kEtherTypeVlan 0x8100
#define kIpProtoTcp 6
#define kIpProtoUdp 17
#define kIpv4FragmentMask 0x3fff /* MF and offset */
#define kL4PortBytes 4           /* source and destination port, TCP and UDP alike */

struct VlanTag {
  __be16 tci;
  __be16 etherType;
};

struct {
  __uint(type, BPF_MAP_TYPE_XSKMAP);
  __uint(max_entries, SPILLWAY_REDIRECT_MAX_QUEUES);
  __type(key, __u32);
  __type(value, __u32);
} xsks_map SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, SPILLWAY_REDIRECT_MAX_VIP_KEYS);
  __type(key, struct RedirectVipKey);
  __type(value, __u32);
} vip_map SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, kRedirectCounterCount);
  __type(key, __u32);
  __type(value, struct RedirectCounterValue);
} redir_counters SEC(".maps");

static __always_inline int countAs(__u32 counter, __u64 frameBytes, int action) {
  struct RedirectCounterValue* value = bpf_map_lookup_elem(&redir_counters, &counter);
  if (value) {
    value->packets += 1;
    value->bytes += frameBytes;
  }
  return action;
}

/* `key` holds the address, family and protocol, port 0. `port` is the
 * destination port in network byte order, 0 when there is none to use. */
static __always_inline int isVip(struct RedirectVipKey* key, __u16 port) {
  if (port != 0) {
    key->port = port;
    if (bpf_map_lookup_elem(&vip_map, key)) return 1;
    key->port = 0;
  }
  if (key->proto != 0) {
    if (bpf_map_lookup_elem(&vip_map, key)) return 1;
    key->proto = 0;
  }
  return bpf_map_lookup_elem(&vip_map, key) != 0;
}

/* The destination port of a TCP or UDP header at `l4`, if it is all there. */
static __always_inline __u16 destinationPort(__u8 proto, __u8* l4, void* dataEnd) {
  if (proto != kIpProtoTcp && proto != kIpProtoUdp) return 0;
  if ((void*)(l4 + kL4PortBytes) > dataEnd) return 0;
  return *(__u16*)(l4 + 2);
}

SEC("xdp")
int spillway_redir(struct xdp_md* ctx) {
  void* data = (void*)(long)ctx->data;
  void* dataEnd = (void*)(long)ctx->data_end;
  __u64 frameBytes = dataEnd - data;

  struct ethhdr* eth = data;
  if ((void*)(eth + 1) > dataEnd) return countAs(kRedirectPassNonIp, frameBytes, XDP_PASS);
  __u16 etherType = bpf_ntohs(eth->h_proto);
  __u8* l3 = (__u8*)(eth + 1);
  if (etherType == kEtherTypeVlan) {
    struct VlanTag* tag = (void*)(eth + 1);
    if ((void*)(tag + 1) > dataEnd) return countAs(kRedirectPassNonIp, frameBytes, XDP_PASS);
    etherType = bpf_ntohs(tag->etherType);
    l3 = (__u8*)(tag + 1);
  }

  struct RedirectVipKey key;
  __builtin_memset(&key, 0, sizeof(key));
  __u16 port = 0;
  if (etherType == kEtherTypeIpv4) {
    struct iphdr* ip = (void*)l3;
    if ((void*)(ip + 1) > dataEnd) return countAs(kRedirectPassMalformed, frameBytes, XDP_PASS);
    key.family = kRedirectFamilyIpv4;
    key.proto = ip->protocol;
    __builtin_memcpy(key.addr, &ip->daddr, 4);
    __u32 headerBytes = ip->ihl * 4;
    if (ip->version == 4 && headerBytes >= sizeof(*ip) &&
        !(ip->frag_off & bpf_htons(kIpv4FragmentMask)))
      port = destinationPort(ip->protocol, (__u8*)ip + headerBytes, dataEnd);
  } else if (etherType == kEtherTypeIpv6) {
    struct ipv6hdr* ip6 = (void*)l3;
    if ((void*)(ip6 + 1) > dataEnd) return countAs(kRedirectPassMalformed, frameBytes, XDP_PASS);
    key.family = kRedirectFamilyIpv6;
    key.proto = ip6->nexthdr;
    __builtin_memcpy(key.addr, &ip6->daddr, 16);
    if (ip6->version == 6) port = destinationPort(ip6->nexthdr, (__u8*)(ip6 + 1), dataEnd);
  } else {
    return countAs(kRedirectPassNonIp, frameBytes, XDP_PASS);
  }

  if (!isVip(&key, port)) return countAs(kRedirectPassNotVip, frameBytes, XDP_PASS);
  /* The lower bits of the flags are the action when the queue has no socket. */
  long action = bpf_redirect_map(&xsks_map, ctx->rx_queue_index, XDP_PASS);
  if (action == XDP_REDIRECT) return countAs(kRedirectVip, frameBytes, XDP_REDIRECT);
  return countAs(kRedirectPassNoSocket, frameBytes, XDP_PASS);
}

/* No GPL-only helper is used; the project is Apache-2.0. */
char kLicense[] SEC("license") = "Apache-2.0";
