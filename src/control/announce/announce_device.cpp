#include "control/announce/announce_device.hpp"

#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <sys/ioctl.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "spillway/errno_text.hpp"

namespace spillway {

std::optional<std::string> AnnounceDevice::open(const std::string& name) {
  if (auto e = netlink_.openError()) return e;
  if (name.empty() || name.size() >= IFNAMSIZ)
    return "device name \"" + name + "\": 1 to 15 characters";
  if (if_nametoindex(name.c_str()) != 0) {
    return "device " + name +
           " already exists (another spillwayd, or a leftover persistent "
           "device: ip link del " +
           name + ")";
  }
  UniqueFd tap(::open("/dev/net/tun", O_RDWR | O_CLOEXEC));
  if (!tap.valid()) return "/dev/net/tun: " + errnoText(errno);
  ifreq ifr{};
  ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
  std::memcpy(ifr.ifr_name, name.c_str(), name.size());
  if (::ioctl(tap.get(), TUNSETIFF, &ifr) != 0)
    return "TUNSETIFF " + name + ": " + errnoText(errno);
  // No IPv6 link-local address, so the kernel sends no ND or MLD into it.
  if (std::ofstream mode("/proc/sys/net/ipv6/conf/" + name + "/addr_gen_mode"); mode) mode << "1\n";
  if (auto e = setLinkUp(name, true)) return e;
  ifindex_ = static_cast<int>(if_nametoindex(name.c_str()));
  if (ifindex_ == 0) return "device " + name + " vanished: " + errnoText(errno);
  tap_ = std::move(tap);
  name_ = name;
  return std::nullopt;
}

std::optional<std::string> AnnounceDevice::restore() {
  if (!tap_.valid()) return "announce device is not open";
  return setLinkUp(name_, true);
}

std::optional<std::string> setLinkUp(const std::string& name, bool up) {
  if (name.empty() || name.size() >= IFNAMSIZ)
    return "device name \"" + name + "\": 1 to 15 characters";
  UniqueFd sock(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return "socket: " + errnoText(errno);
  ifreq ifr{};
  std::memcpy(ifr.ifr_name, name.c_str(), name.size());
  if (::ioctl(sock.get(), SIOCGIFFLAGS, &ifr) != 0) {
    if (!up && errno == ENODEV) return std::nullopt;  // gone: nothing to take down
    return "SIOCGIFFLAGS " + name + ": " + errnoText(errno);
  }
  const int flags = up ? ifr.ifr_flags | IFF_UP | IFF_NOARP : ifr.ifr_flags & ~IFF_UP;
  ifr.ifr_flags = static_cast<short>(flags);
  if (::ioctl(sock.get(), SIOCSIFFLAGS, &ifr) != 0)
    return "SIOCSIFFLAGS " + name + ": " + errnoText(errno);
  return std::nullopt;
}

std::optional<std::string> AnnounceDevice::announce(const IpAddress& vip) {
  return route(vip, true);
}

std::optional<std::string> AnnounceDevice::withdraw(const IpAddress& vip) {
  return route(vip, false);
}

std::optional<std::string> AnnounceDevice::route(const IpAddress& vip, bool add) {
  if (!tap_.valid()) return "announce device is not open";
  struct {
    nlmsghdr header;
    rtmsg route;
    alignas(4) unsigned char attributes[64];
  } request{};
  const bool v4 = vip.version == IpVersion::V4;
  const std::size_t addressBytes = v4 ? 4 : 16;
  request.header.nlmsg_type = add ? RTM_NEWROUTE : RTM_DELROUTE;
  request.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
  if (add) request.header.nlmsg_flags |= NLM_F_CREATE | NLM_F_REPLACE;
  request.route.rtm_family = v4 ? AF_INET : AF_INET6;
  request.route.rtm_dst_len = static_cast<unsigned char>(addressBytes * 8);
  request.route.rtm_table = RT_TABLE_MAIN;
  request.route.rtm_protocol = kAnnounceRouteProtocol;
  request.route.rtm_scope = RT_SCOPE_LINK;
  request.route.rtm_type = RTN_UNICAST;
  std::size_t used = 0;
  const auto attribute = [&](unsigned short type, const void* data, std::size_t length) {
    rtattr a{};
    a.rta_type = type;
    a.rta_len = static_cast<unsigned short>(RTA_LENGTH(length));
    std::memcpy(request.attributes + used, &a, sizeof a);
    std::memcpy(request.attributes + used + RTA_LENGTH(0), data, length);
    used += RTA_ALIGN(a.rta_len);
  };
  attribute(RTA_DST, vip.bytes.data(), addressBytes);
  const std::uint32_t oif = static_cast<std::uint32_t>(ifindex_);
  attribute(RTA_OIF, &oif, sizeof oif);
  request.header.nlmsg_len = static_cast<std::uint32_t>(NLMSG_LENGTH(sizeof(rtmsg)) + used);
  auto error = netlink_.transact(&request, request.header.nlmsg_len);
  if (error && !add && (*error == errnoText(ESRCH) || *error == errnoText(ENOENT))) {
    return std::nullopt;
  }
  if (error) {
    return std::string(add ? "adding" : "deleting") + " the route to " + formatIpAddress(vip) +
           " via " + name_ + ": " + *error;
  }
  return std::nullopt;
}

}  // namespace spillway
