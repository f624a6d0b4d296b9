#include "control/backends/neighbours.hpp"

#include <arpa/inet.h>
#include <linux/neighbour.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "control/sys/rtnetlink.hpp"
#include "spillway/errno_text.hpp"

namespace spillway {
namespace {

using namespace std::string_literals;
using rtnl::forEachMessage;
using rtnl::load;
using rtnl::Netlink;
using rtnl::netlinkError;

int familyOf(IpVersion v) {
  return v == IpVersion::V4 ? AF_INET : AF_INET6;
}
std::size_t lengthOf(IpVersion v) {
  return v == IpVersion::V4 ? 4 : 16;
}

IpAddress addressFrom(const std::byte* p, IpVersion v) {
  IpAddress a;
  a.version = v;
  std::memcpy(a.bytes.data(), p, lengthOf(v));
  return a;
}

// Walks the rtattrs in [p, end), calling f(type, payload, length).
template <class F>
void forEachAttribute(const std::byte* p, const std::byte* end, F&& f) {
  while (end - p >= static_cast<std::ptrdiff_t>(sizeof(rtattr))) {
    const auto a = load<rtattr>(p);
    if (a.rta_len < sizeof(rtattr) || static_cast<std::ptrdiff_t>(a.rta_len) > end - p) return;
    f(a.rta_type, p + RTA_LENGTH(0), static_cast<std::size_t>(a.rta_len - RTA_LENGTH(0)));
    p += RTA_ALIGN(a.rta_len);
  }
}

}  // namespace

std::vector<NeighbourEntry> parseProcNetArp(std::string_view text, std::string_view interface) {
  // IP address  HW type  Flags  HW address  Mask  Device
  std::vector<NeighbourEntry> out;
  std::istringstream in{std::string(text)};
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream row(line);
    std::string ip, hwType, flags, hw, mask, device;
    if (!(row >> ip >> hwType >> flags >> hw >> mask >> device)) continue;
    if (device != interface) continue;
    unsigned long f = 0;
    try {
      f = std::stoul(flags, nullptr, 16);
    } catch (const std::exception&) {
      continue;
    }
    if ((f & ATF_COM) == 0) continue;
    auto a = parseIpAddress(ip);
    auto m = parseMacAddress(hw);
    if (!a || a->version != IpVersion::V4 || !m || *m == MacAddress{}) continue;
    out.push_back(NeighbourEntry{*a, *m});
  }
  return out;
}

NetlinkParse parseNeighbourDump(std::span<const std::byte> datagram, int ifindex, IpVersion family,
                                std::vector<NeighbourEntry>& out) {
  NetlinkParse result;
  constexpr std::uint16_t kUsable =
      NUD_REACHABLE | NUD_STALE | NUD_DELAY | NUD_PROBE | NUD_PERMANENT;
  const bool wellFormed = forEachMessage(
      datagram, [&](const nlmsghdr& h, const std::byte* payload, const std::byte* end) {
        if (h.nlmsg_type == NLMSG_DONE) {
          result.done = true;
          return false;
        }
        if (h.nlmsg_type == NLMSG_ERROR) {
          result.error = netlinkError(payload, end);
          result.done = true;
          return false;
        }
        if (h.nlmsg_type != RTM_NEWNEIGH ||
            end - payload < static_cast<std::ptrdiff_t>(sizeof(ndmsg))) {
          return true;
        }
        const auto n = load<ndmsg>(payload);
        if (n.ndm_family != familyOf(family) || n.ndm_ifindex != ifindex ||
            (n.ndm_state & kUsable) == 0) {
          return true;
        }
        std::optional<IpAddress> address;
        std::optional<MacAddress> mac;
        forEachAttribute(payload + NLMSG_ALIGN(sizeof(ndmsg)), end,
                         [&](std::uint16_t type, const std::byte* data, std::size_t length) {
                           if (type == NDA_DST && length == lengthOf(family)) {
                             address = addressFrom(data, family);
                           } else if (type == NDA_LLADDR && length == 6) {
                             MacAddress m;
                             std::memcpy(m.data(), data, 6);
                             mac = m;
                           }
                         });
        if (address && mac && *mac != MacAddress{}) out.push_back(NeighbourEntry{*address, *mac});
        return true;
      });
  if (!wellFormed && !result.error) result.error = "malformed netlink datagram";
  return result;
}

NeighbourRoute parseRouteReply(std::span<const std::byte> datagram, const IpAddress& destination) {
  NeighbourRoute result;
  bool seen = false;
  const bool wellFormed = forEachMessage(
      datagram, [&](const nlmsghdr& h, const std::byte* payload, const std::byte* end) {
        if (h.nlmsg_type == NLMSG_ERROR) {
          result.error = netlinkError(payload, end);
          seen = result.error.has_value();
          return !seen;
        }
        if (h.nlmsg_type != RTM_NEWROUTE ||
            end - payload < static_cast<std::ptrdiff_t>(sizeof(rtmsg))) {
          return true;
        }
        seen = true;
        const auto r = load<rtmsg>(payload);
        if (r.rtm_type != RTN_UNICAST && r.rtm_type != RTN_LOCAL) {
          result.error = "no unicast route (route type " + std::to_string(r.rtm_type) + ")";
          return false;
        }
        result.neighbour = destination;
        forEachAttribute(payload + NLMSG_ALIGN(sizeof(rtmsg)), end,
                         [&](std::uint16_t type, const std::byte* data, std::size_t length) {
                           if (type == RTA_GATEWAY && length == lengthOf(destination.version)) {
                             result.neighbour = addressFrom(data, destination.version);
                           } else if (type == RTA_VIA) {
                             result.neighbour.reset();
                             result.error = "route via a gateway of the other address family";
                           }
                         });
        return false;
      });
  if (!wellFormed) result.error = "malformed netlink datagram";
  if (!seen && !result.error) result.error = "no route in the reply";
  return result;
}

NeighbourTable KernelNeighbourSource::read(const std::string& interface, IpVersion family) {
  NeighbourTable table;
  const int ifindex = static_cast<int>(if_nametoindex(interface.c_str()));
  if (ifindex == 0) {
    table.error = "interface " + interface + ": " + errnoText(errno);
    return table;
  }
  if (family == IpVersion::V4) {
    std::ifstream in("/proc/net/arp");
    if (!in) {
      table.error = "/proc/net/arp: " + errnoText(errno);
      return table;
    }
    std::ostringstream text;
    text << in.rdbuf();
    table.entries = parseProcNetArp(text.str(), interface);
    return table;
  }
  Netlink nl;
  if (auto e = nl.openError()) {
    table.error = e;
    return table;
  }
  struct {
    nlmsghdr header;
    ndmsg neighbour;
  } request{};
  request.header.nlmsg_len = NLMSG_LENGTH(sizeof(ndmsg));
  request.header.nlmsg_type = RTM_GETNEIGH;
  request.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  request.header.nlmsg_seq = 1;
  request.neighbour.ndm_family = AF_INET6;
  request.neighbour.ndm_ifindex = ifindex;  // filters only under strict checking; parse filters too
  if (auto e = nl.send(&request, request.header.nlmsg_len)) {
    table.error = e;
    return table;
  }
  std::vector<std::byte> buffer;
  for (;;) {
    std::size_t n = 0;
    if (auto e = nl.receive(buffer, n)) {
      table.error = e;
      return table;
    }
    const NetlinkParse p =
        parseNeighbourDump(std::span(buffer.data(), n), ifindex, IpVersion::V6, table.entries);
    if (p.error) {
      table.error = "RTM_GETNEIGH: " + *p.error;
      return table;
    }
    if (p.done || n == 0) return table;
  }
}

NeighbourRoute KernelNeighbourSource::route(const IpAddress& destination,
                                            const std::string& interface) {
  NeighbourRoute result;
  const int ifindex = static_cast<int>(if_nametoindex(interface.c_str()));
  if (ifindex == 0) {
    result.error = "interface " + interface + ": " + errnoText(errno);
    return result;
  }
  Netlink nl;
  if (auto e = nl.openError()) {
    result.error = e;
    return result;
  }
  struct {
    nlmsghdr header;
    rtmsg route;
    std::array<std::byte, 64> attributes;
  } request{};
  request.header.nlmsg_type = RTM_GETROUTE;
  request.header.nlmsg_flags = NLM_F_REQUEST;
  request.header.nlmsg_seq = 1;
  request.route.rtm_family = static_cast<unsigned char>(familyOf(destination.version));
  request.route.rtm_dst_len = static_cast<unsigned char>(lengthOf(destination.version) * 8);
  std::size_t length = NLMSG_LENGTH(sizeof(rtmsg));
  auto* base = reinterpret_cast<std::byte*>(&request);
  auto add = [&](std::uint16_t type, const void* data, std::size_t size) {
    rtattr a{};
    a.rta_type = type;
    a.rta_len = static_cast<unsigned short>(RTA_LENGTH(size));
    std::memcpy(base + length, &a, sizeof a);
    std::memcpy(base + length + RTA_LENGTH(0), data, size);
    length += RTA_ALIGN(a.rta_len);
  };
  add(RTA_DST, destination.bytes.data(), lengthOf(destination.version));
  add(RTA_OIF, &ifindex, sizeof ifindex);
  request.header.nlmsg_len = static_cast<std::uint32_t>(length);
  if (auto e = nl.send(&request, length)) {
    result.error = e;
    return result;
  }
  std::vector<std::byte> buffer;
  std::size_t n = 0;
  if (auto e = nl.receive(buffer, n)) {
    result.error = e;
    return result;
  }
  result = parseRouteReply(std::span(buffer.data(), n), destination);
  if (result.error)
    result.error =
        "route to " + formatIpAddress(destination) + " via " + interface + ": " + *result.error;
  return result;
}

std::optional<std::string> KernelNeighbourSource::solicit(const IpAddress& destination,
                                                          const std::string& interface) {
  const int fd =
      socket(familyOf(destination.version), SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return "socket: " + errnoText(errno);
  std::optional<std::string> error;
  constexpr std::uint16_t kDiscardPort = 9;  // RFC 863
  if (setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, interface.c_str(),
                 static_cast<socklen_t>(interface.size())) != 0) {
    error = "SO_BINDTODEVICE " + interface + ": " + errnoText(errno);
  } else {
    int rc = 0;
    if (destination.version == IpVersion::V4) {
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_port = htons(kDiscardPort);
      std::memcpy(&to.sin_addr, destination.bytes.data(), 4);
      rc = connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to);
    } else {
      sockaddr_in6 to{};
      to.sin6_family = AF_INET6;
      to.sin6_port = htons(kDiscardPort);
      std::memcpy(&to.sin6_addr, destination.bytes.data(), 16);
      rc = connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to);
    }
    // EAGAIN: the datagram waits in the neighbour queue, which is the point.
    if (rc != 0) {
      error = "connect " + formatIpAddress(destination) + ": " + errnoText(errno);
    } else if (send(fd, "", 0, MSG_DONTWAIT) < 0 && errno != EAGAIN) {
      error = "send to " + formatIpAddress(destination) + ": " + errnoText(errno);
    }
  }
  close(fd);
  return error;
}

std::optional<NextHop> staticNextHop(const Config& config, const BackendConfig& backend) {
  if (backend.mac) return NextHop{backend.mac, NextHopSource::Backend};
  if (backend.portIndex < config.ports.size()) {
    const PortConfig& port = config.ports[backend.portIndex];
    if (port.nextHopMac) return NextHop{port.nextHopMac, NextHopSource::Port};
  }
  return std::nullopt;
}

namespace {

const std::string* kernelInterfaceOf(const Config& config, const BackendConfig& backend) {
  if (staticNextHop(config, backend) || backend.portIndex >= config.ports.size()) return nullptr;
  const std::string& name = config.ports[backend.portIndex].kernelInterface;
  return name.empty() ? nullptr : &name;
}

}  // namespace

void NeighbourResolver::refresh(const Config& config) {
  problems_.clear();
  lookups_ = lookUp(config, nullptr);
}

void NeighbourResolver::refresh(const Config& config, const std::vector<std::uint64_t>& ids) {
  for (auto& [id, l] : lookUp(config, &ids)) lookups_[id] = l;
}

std::map<std::uint64_t, NeighbourResolver::Lookup> NeighbourResolver::lookUp(
    const Config& config, const std::vector<std::uint64_t>* ids) {
  std::map<std::uint64_t, Lookup> next;
  std::map<std::pair<std::string, IpVersion>, NeighbourTable> tables;
  for (const BackendConfig& b : config.backends) {
    const std::string* interface = kernelInterfaceOf(config, b);
    if (interface == nullptr) continue;
    if (ids != nullptr && std::find(ids->begin(), ids->end(), b.id) == ids->end()) continue;
    Lookup& l = next[b.id];
    NeighbourRoute r = source_.route(b.address, *interface);
    if (r.error || !r.neighbour) {
      problems_.push_back("backend " + b.name + ": " + r.error.value_or("no route"));
      continue;
    }
    l.neighbour = r.neighbour;
    auto key = std::pair{*interface, r.neighbour->version};
    auto it = tables.find(key);
    if (it == tables.end()) {
      it = tables.emplace(key, source_.read(*interface, r.neighbour->version)).first;
      if (it->second.error) {
        problems_.push_back("neighbour table of " + *interface + ": " + *it->second.error);
      }
    }
    for (const NeighbourEntry& e : it->second.entries) {
      if (e.address == *r.neighbour) l.mac = e.mac;
    }
  }
  return next;
}

NextHop NeighbourResolver::resolve(const Config& config, const BackendConfig& backend) const {
  if (auto s = staticNextHop(config, backend)) return *s;
  auto it = lookups_.find(backend.id);
  if (it != lookups_.end() && it->second.mac) return NextHop{it->second.mac, NextHopSource::Kernel};
  return NextHop{};
}

std::size_t NeighbourResolver::solicitUnresolved(const Config& config) {
  return solicit(config, nullptr);
}

std::size_t NeighbourResolver::solicitUnresolved(const Config& config,
                                                 const std::vector<std::uint64_t>& ids) {
  return solicit(config, &ids);
}

std::size_t NeighbourResolver::solicit(const Config& config,
                                       const std::vector<std::uint64_t>* ids) {
  std::size_t sent = 0;
  for (const BackendConfig& b : config.backends) {
    const std::string* interface = kernelInterfaceOf(config, b);
    if (interface == nullptr || resolve(config, b).mac) continue;
    if (ids != nullptr && std::find(ids->begin(), ids->end(), b.id) == ids->end()) continue;
    if (auto e = source_.solicit(b.address, *interface)) {
      problems_.push_back("solicit for backend " + b.name + ": " + *e);
    } else {
      ++sent;
    }
  }
  return sent;
}

}  // namespace spillway
