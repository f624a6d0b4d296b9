// Next-hop MAC resolution for backends: the destination MAC of the frames that
// carry a backend's encapsulated packets.
//
// Precedence, per backend: its own `mac`; else its egress port's
// `next_hop_mac` (a router every backend is reached through); else the
// kernel's neighbour table on the port's `kernel_interface` (the exception tap
// standing for a DPDK port, or the veth itself in af_packet / af_xdp modes).
// For the kernel case the neighbour is the backend itself when it is on-link,
// or the gateway of the kernel's route to it through that interface
// (RTM_GETROUTE with RTA_OIF), so routed (cloud) backends resolve to their
// router's MAC. IPv4 neighbours come from /proc/net/arp, IPv6 ones from an
// rtnetlink RTM_GETNEIGH dump; nothing is shelled out. When the kernel has no
// entry, solicit() makes it resolve one: a connected UDP socket bound to the
// interface (SO_BINDTODEVICE) sends one empty datagram to the backend's
// discard port (9), which makes the kernel ARP / ND for the next hop, so the
// next refresh finds it.
//
// The kernel is behind NeighbourSource, so tests inject tables. The parsers
// of /proc/net/arp and of netlink replies are exposed for their own tests.
//
// Thread contract: the control thread only; a NeighbourResolver and its
// source are used by one thread at a time. The kernel calls block briefly
// (netlink round trips): call refresh() from the control loop, never from an
// lcore.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "control/config/config.hpp"
#include "spillway/wire.hpp"

namespace spillway {

struct NeighbourEntry {
  IpAddress address;
  MacAddress mac{};
};

struct NeighbourTable {
  std::vector<NeighbourEntry> entries;  // resolved (usable) entries only
  std::optional<std::string> error;
};

// Which neighbour a packet to a destination goes to through an interface.
struct NeighbourRoute {
  std::optional<IpAddress> neighbour;  // the gateway, or the destination when on-link
  std::optional<std::string> error;    // e.g. no route through the interface
};

class NeighbourSource {
 public:
  virtual ~NeighbourSource() = default;
  // The resolved entries of `interface`'s neighbour table for one family.
  virtual NeighbourTable read(const std::string& interface, IpVersion family) = 0;
  virtual NeighbourRoute route(const IpAddress& destination, const std::string& interface) = 0;
  // Starts resolution of `destination`'s next hop; std::nullopt when sent.
  virtual std::optional<std::string> solicit(const IpAddress& destination,
                                             const std::string& interface) = 0;
};

// The running kernel (the network namespace of the calling thread). Needs no
// privilege to read; solicit() needs CAP_NET_RAW for SO_BINDTODEVICE.
class KernelNeighbourSource final : public NeighbourSource {
 public:
  NeighbourTable read(const std::string& interface, IpVersion family) override;
  NeighbourRoute route(const IpAddress& destination, const std::string& interface) override;
  std::optional<std::string> solicit(const IpAddress& destination,
                                     const std::string& interface) override;
};

// /proc/net/arp rows of `interface` whose flags say complete (ATF_COM).
[[nodiscard]] std::vector<NeighbourEntry> parseProcNetArp(std::string_view text,
                                                          std::string_view interface);

// One datagram of an RTM_GETNEIGH dump: appends the usable entries
// (REACHABLE, STALE, DELAY, PROBE or PERMANENT, with a 6-byte lladdr) of
// `family` on interface index `ifindex` to `out`.
struct NetlinkParse {
  bool done = false;  // NLMSG_DONE seen
  std::optional<std::string> error;
};
[[nodiscard]] NetlinkParse parseNeighbourDump(std::span<const std::byte> datagram, int ifindex,
                                              IpVersion family, std::vector<NeighbourEntry>& out);
// The reply to an RTM_GETROUTE request for `destination`: the gateway, or
// the destination itself when the route has none.
[[nodiscard]] NeighbourRoute parseRouteReply(std::span<const std::byte> datagram,
                                             const IpAddress& destination);

enum class NextHopSource : std::uint8_t {
  Backend,     // backend.mac
  Port,        // port.next_hop_mac
  Kernel,      // the neighbour table of port.kernel_interface
  Unresolved,  // kernel resolution pending (or failing)
};

struct NextHop {
  std::optional<MacAddress> mac;
  NextHopSource source = NextHopSource::Unresolved;
};

// backend.mac, else port.next_hop_mac; std::nullopt when the kernel decides.
[[nodiscard]] std::optional<NextHop> staticNextHop(const Config& config,
                                                   const BackendConfig& backend);

class NeighbourResolver {
 public:
  explicit NeighbourResolver(NeighbourSource& source) : source_(source) {}

  // Re-reads what the kernel knows for every backend of `config` without a
  // static next hop: one route lookup per backend, one table read per
  // (interface, family). Problems of this refresh go to problems().
  void refresh(const Config& config);
  // The same for the backends `ids` only (those held out of the tables until
  // their next hop resolves, checked every few ms); others keep what the last
  // refresh found.
  void refresh(const Config& config, const std::vector<std::uint64_t>& ids);

  // The backend's next hop by the precedence above, from the last refresh.
  [[nodiscard]] NextHop resolve(const Config& config, const BackendConfig& backend) const;

  // solicit() for every backend whose next hop resolve() cannot find;
  // returns how many datagrams were sent.
  std::size_t solicitUnresolved(const Config& config);
  // The same for the backends `ids` only.
  std::size_t solicitUnresolved(const Config& config, const std::vector<std::uint64_t>& ids);

  // What went wrong in the last refresh or solicitation, one line each.
  [[nodiscard]] const std::vector<std::string>& problems() const noexcept { return problems_; }

 private:
  struct Lookup {
    std::optional<IpAddress> neighbour;
    std::optional<MacAddress> mac;
  };
  [[nodiscard]] std::map<std::uint64_t, Lookup> lookUp(const Config& config,
                                                       const std::vector<std::uint64_t>* ids);
  std::size_t solicit(const Config& config, const std::vector<std::uint64_t>* ids);

  NeighbourSource& source_;
  std::map<std::uint64_t, Lookup> lookups_;  // by backend id, kernel-resolved backends
  std::vector<std::string> problems_;
};

}  // namespace spillway
