// DPDK ports for spillwayd: probing any PMD by its devargs (a PCI address or
// a virtual device string), one RX and one TX queue per worker, RSS on the
// 5-tuple where the PMD offers it, mempools on the port's NUMA socket, and
// the exception path's tap interface that stands for a port in the kernel.
//
// Thread contract: set up and torn down by the main thread before workers
// start and after they stop.
#pragma once

#include <rte_ethdev.h>
#include <rte_mempool.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "spillway/wire.hpp"

namespace spillway {

struct PortSpec {
  std::string name;     // from the configuration, for messages
  std::string devargs;  // PCI address or vdev string
  std::uint16_t mtu = 1500;
  bool exceptionTap = false;
  std::string tapName;            // kernel name of the exception tap
  std::optional<MacAddress> mac;  // set on the port instead of the NIC's own
};

struct OpenPort {
  PortSpec spec;
  std::uint16_t portId = 0;
  MacAddress mac{};
  bool hasTap = false;
  std::uint16_t tapPortId = 0;
  std::string driver;
  std::string note;  // a setting the driver could not apply, for the log
};

// The EAL arguments that make the EAL probe these ports: `-a PCI` for PCI
// devices, `--vdev=...` for virtual ones (af_packet and af_xdp get their
// queue count appended when the devargs do not set it).
[[nodiscard]] std::vector<std::string> ealArgsForPorts(const std::vector<PortSpec>& ports,
                                                       unsigned workers);

// True for a PCI address ("0000:3b:00.0" or "3b:00.0").
[[nodiscard]] bool isPciAddress(const std::string& s);

// The device name DPDK registers for a devargs string ("net_ring0" for
// "net_ring0,foo=bar"; the PCI address itself).
[[nodiscard]] std::string deviceNameOf(const std::string& devargs);

class PortSet {
 public:
  PortSet() = default;
  ~PortSet();
  PortSet(const PortSet&) = delete;
  PortSet& operator=(const PortSet&) = delete;

  // Finds the probed ports, creates the taps, configures `queues` RX/TX
  // queue pairs on each and starts them. On failure returns false with the
  // reason in `error`, having stopped what it started.
  bool open(const std::vector<PortSpec>& specs, std::uint16_t queues, std::string& error);
  void close() noexcept;

  [[nodiscard]] const std::vector<OpenPort>& ports() const noexcept { return ports_; }

 private:
  bool configure(std::uint16_t portId, std::uint16_t queues, std::uint16_t mtu,
                 const std::string& what, std::string& error);
  std::vector<OpenPort> ports_;
  std::vector<rte_mempool*> pools_;  // one per NUMA socket in use
  std::vector<std::uint16_t> started_;
  std::size_t portsPlanned_ = 0;  // DPDK ports (taps included) the pool is sized for
};

}  // namespace spillway
