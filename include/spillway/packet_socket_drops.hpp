// The frames the kernel dropped in front of an af_packet port: when the
// worker falls behind, the kernel drops what does not fit the PMD's packet
// ring and counts it only in that socket's PACKET_STATISTICS (tp_drops),
// which DPDK 22.11's af_packet PMD never reads, so rte_eth_stats.imissed
// stays 0 whatever is lost. spillwayd reads them itself: it finds its own
// AF_PACKET sockets bound to the port's interface once the port is open
// (the PMD's, one per queue; the only packet sockets the process has) and
// adds each read to the port's rx_missed (`spillway_port_rx_missed_total`).
//
// PACKET_STATISTICS is read-and-clear, and nobody else reads these sockets'
// statistics, so the running total here is the count since the port opened.
//
// Thread contract: one reader at a time (the caller serialises);
// DPDK-free, Linux only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spillway {

class PacketSocketDrops {
 public:
  PacketSocketDrops() = default;

  // This process's AF_PACKET sockets bound to interface `ifname` (none when
  // it has no such interface or socket).
  [[nodiscard]] static PacketSocketDrops find(const std::string& ifname);

  // Reads (and so clears) each socket's statistics; returns the frames they
  // dropped since find().
  std::uint64_t read() noexcept;

  [[nodiscard]] std::size_t sockets() const noexcept { return fds_.size(); }

 private:
  std::vector<int> fds_;  // not owned: the PMD closes them
  std::uint64_t total_ = 0;
};

// "iface=NAME" of a net_af_packet devargs string ("" when absent).
[[nodiscard]] std::string afPacketInterface(const std::string& devargs);

}  // namespace spillway
