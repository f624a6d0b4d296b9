#include "spillway/packet_socket_drops.hpp"

#include <linux/if_packet.h>
#include <net/if.h>
#include <sys/resource.h>
#include <sys/socket.h>

namespace spillway {

PacketSocketDrops PacketSocketDrops::find(const std::string& ifname) {
  PacketSocketDrops found;
  const unsigned ifindex = if_nametoindex(ifname.c_str());
  if (ifindex == 0) return found;
  rlimit limit{};
  int top = 1024;
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    top = static_cast<int>(limit.rlim_cur < 1'048'576 ? limit.rlim_cur : 1'048'576);
  }
  for (int fd = 0; fd < top; ++fd) {
    int domain = 0;
    socklen_t len = sizeof domain;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 || domain != AF_PACKET) {
      continue;
    }
    sockaddr_ll address{};
    socklen_t addressLen = sizeof address;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &addressLen) == 0 &&
        address.sll_ifindex == static_cast<int>(ifindex)) {
      found.fds_.push_back(fd);
    }
  }
  found.read();  // what the kernel counted before the port was ours
  found.total_ = 0;
  return found;
}

std::uint64_t PacketSocketDrops::read() noexcept {
  for (int fd : fds_) {
    tpacket_stats stats{};
    socklen_t len = sizeof stats;
    if (getsockopt(fd, SOL_PACKET, PACKET_STATISTICS, &stats, &len) == 0) {
      total_ += stats.tp_drops;
    }
  }
  return total_;
}

std::string afPacketInterface(const std::string& devargs) {
  std::size_t at = 0;
  while (at < devargs.size()) {
    const std::size_t end = devargs.find(',', at);
    const std::string part =
        devargs.substr(at, end == std::string::npos ? std::string::npos : end - at);
    if (part.rfind("iface=", 0) == 0) return part.substr(6);
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return "";
}

}  // namespace spillway
