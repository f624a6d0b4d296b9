// XdpVipMap: spillwayd's handle on the VIP map of the AF_XDP-mode XDP program
// (bpf/spillway_redirect.bpf.c), which decides what the kernel keeps and what
// goes to spillwayd's AF_XDP sockets.
//
// DPDK's net_af_xdp PMD loads and attaches that program (devarg
// xdp_prog=redirectProgramPath()), not spillwayd, so open() finds the maps
// through the device: the XDP program attached to the interface and its maps
// named vip_map and redir_counters (queryXdp / openProgramMap, xdp_attach.hpp).
// Call it after the port has started, in the network namespace of the
// interface. Before the port starts, takeOverStaleRedirect()
// (stale_redirect.hpp) clears what a killed spillwayd left there.
//
// sync() makes the map hold exactly the given keys: it adds the missing ones
// first and deletes the stale ones after, so a key present before and after
// never disappears in between. A key set that fails validation leaves the
// map untouched; a kernel error midway leaves a mix that the next sync()
// completes. For every VIP address spillwayd also passes the address marker
// {address, proto 0, port 0}, so that ICMP, fragments and IPv6 packets with
// extension headers to the VIP reach it too.
//
// No DPDK here: libbpf only, so tests and tools link it without EAL.
// Thread contract: one control thread owns an XdpVipMap; the program reads
// the map concurrently on every RX CPU (the kernel's hash map is RCU-safe).
// Errors are returned as text, never thrown.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "spillway/flow_key.hpp"

namespace spillway {

// One vip_map entry. proto 0 (any) goes with port 0; a port needs TCP or UDP.
// An IPv4 address fills the first 4 bytes of address; the rest is ignored.
struct XdpVipKey {
  IpBytes address{};
  IpVersion version = IpVersion::V4;
  std::uint8_t proto = 0;  // IP protocol; 0: the address marker
  std::uint16_t port = 0;  // destination port, host order; 0: every port

  friend bool operator==(const XdpVipKey&, const XdpVipKey&) = default;
};

// Sums over CPUs of the program's counters (RedirectCounter).
struct XdpRedirectCounters {
  std::uint64_t redirected = 0;  // VIP packets sent to the AF_XDP sockets
  std::uint64_t redirectedBytes = 0;
  std::uint64_t passedNoSocket = 0;  // VIP packets on a queue without a socket
  std::uint64_t passedNotVip = 0;    // IP, not to a VIP
  std::uint64_t passedNonIp = 0;     // ARP, LLDP, ...
  std::uint64_t passedMalformed = 0;
  std::uint64_t passedBytes = 0;

  [[nodiscard]] std::uint64_t passed() const noexcept {
    return passedNoSocket + passedNotVip + passedNonIp + passedMalformed;
  }
};

class XdpVipMap {
 public:
  // Finds the program attached to `ifname` (any XDP mode) that owns a
  // vip_map. nullopt with `error` set when the interface does not exist, has
  // no such program, or the caller lacks CAP_BPF / CAP_SYS_ADMIN.
  static std::optional<XdpVipMap> open(const std::string& ifname, std::string& error);

  XdpVipMap(const XdpVipMap&) = delete;
  XdpVipMap& operator=(const XdpVipMap&) = delete;
  XdpVipMap(XdpVipMap&& other) noexcept;
  XdpVipMap& operator=(XdpVipMap&& other) noexcept;
  ~XdpVipMap();

  // Adds the missing keys, deletes the stale ones. Duplicates are allowed.
  bool sync(const std::vector<XdpVipKey>& vips, std::string& error);

  // What the map holds now, in the map's iteration order.
  [[nodiscard]] std::optional<std::vector<XdpVipKey>> keys(std::string& error) const;

  [[nodiscard]] std::optional<XdpRedirectCounters> counters(std::string& error) const;

  [[nodiscard]] std::uint32_t programId() const noexcept { return programId_; }
  [[nodiscard]] const std::string& ifname() const noexcept { return ifname_; }

 private:
  XdpVipMap(std::string ifname, std::uint32_t programId, int vipFd, int countersFd) noexcept;
  void closeAll() noexcept;

  std::string ifname_;
  std::uint32_t programId_ = 0;
  int vipFd_ = -1;
  int countersFd_ = -1;
};

// Path of spillway_redirect.bpf.o, for the PMD's xdp_prog devarg: the first
// that exists of $SPILLWAY_REDIRECT_BPF_OBJECT, the directory of the running
// binary, the install path and the build-tree path compiled in. Empty when
// none exists; `tried` (if given) then lists the candidates.
[[nodiscard]] std::string redirectProgramPath(std::string* tried = nullptr);

}  // namespace spillway
