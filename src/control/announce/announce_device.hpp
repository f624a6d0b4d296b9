// The kernel half of the BGP announcement: a TAP device that lives exactly as
// long as the process, carrying one host route per announced VIP, which the
// local speaker redistributes (FRR: zebra sees the kernel route, bgpd
// `redistribute kernel` with a prefix-list of the VIP ranges). The device is
// not persistent (no TUNSETPERSIST): when the process dies for any reason
// (SIGKILL, a crash) the kernel closes the fd, destroys the device and every
// route through it, and the speaker withdraws the prefixes; no cleanup code
// has to run.
//
// The device is NOARP and up, with IPv6 address generation off, so the
// kernel sends nothing into it by itself; it never carries VIP traffic: the
// instance namespace does not forward (net.ipv4.ip_forward = 0), and the
// data path owns the VIPs on its own port. Routes are RTN_UNICAST, scope
// link, table main, protocol kAnnounceRouteProtocol, metric 0: FRR 8.4's
// zebra files a route of a protocol it does not own as "kernel" (it ignores
// only RTPROT_KERNEL and the protocols of its own daemons), so bgpd's
// `redistribute kernel` takes it.
//
// Thread contract: one owner thread (the announcer); blocking netlink calls
// of a few microseconds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "control/config/config.hpp"
#include "control/sys/rtnetlink.hpp"
#include "spillway/unique_fd.hpp"

namespace spillway {

// Not RTPROT_KERNEL (2, ignored by zebra), not one of FRR's (11, 42,
// 186..199), not below RTPROT_STATIC; iproute2 shows it as a number.
inline constexpr std::uint8_t kAnnounceRouteProtocol = 250;

// Where announced VIPs go: the kernel (AnnounceDevice) or a test's fake.
class VipRoutes {
 public:
  virtual ~VipRoutes() = default;
  // Creates the device `name`.
  [[nodiscard]] virtual std::optional<std::string> open(const std::string& name) = 0;
  // VIP/32 (or /128) through the device; replacing ours is not an error.
  [[nodiscard]] virtual std::optional<std::string> announce(const IpAddress& vip) = 0;
  // Deletes the route; one that is already gone is not an error.
  [[nodiscard]] virtual std::optional<std::string> withdraw(const IpAddress& vip) = 0;
  // Destroys the device and with it every route (what a process death does).
  virtual void close() noexcept = 0;
  // Brings the device up again after the freeze guard (freeze_guard.hpp) set
  // it down; the kernel dropped its routes, so it comes back with none.
  [[nodiscard]] virtual std::optional<std::string> restore() { return std::nullopt; }
};

class AnnounceDevice final : public VipRoutes {
 public:
  // An error when a device of that name exists: it would not be ours. Sets
  // it NOARP and up.
  [[nodiscard]] std::optional<std::string> open(const std::string& name) override;
  [[nodiscard]] std::optional<std::string> announce(const IpAddress& vip) override;
  [[nodiscard]] std::optional<std::string> withdraw(const IpAddress& vip) override;
  void close() noexcept override { tap_.reset(); }
  [[nodiscard]] std::optional<std::string> restore() override;
  [[nodiscard]] int ifindex() const noexcept { return ifindex_; }

 private:
  std::optional<std::string> route(const IpAddress& vip, bool add);

  UniqueFd tap_;
  rtnl::Netlink netlink_;
  std::string name_;
  int ifindex_ = 0;
};

// Sets the interface `name` up (and NOARP) or down (SIOCSIFFLAGS). Setting
// down a device that no longer exists is not an error.
[[nodiscard]] std::optional<std::string> setLinkUp(const std::string& name, bool up);

}  // namespace spillway
