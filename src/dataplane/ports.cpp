#include "ports.hpp"

#include <rte_bus_vdev.h>
#include <rte_dev.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>

#include <algorithm>
#include <cstdio>

namespace spillway {
namespace {

constexpr std::uint16_t kRxDescriptors = 1024;
constexpr std::uint16_t kTxDescriptors = 1024;
constexpr unsigned kMbufsPerSocket = 16383;  // 2^n - 1 is optimal for rte_mempool
constexpr unsigned kMbufCache = 256;
// DPDK 22.11's net_tap aborts at start with more queue pairs than this.
constexpr std::uint16_t kMaxTapQueues = 4;

}  // namespace

bool isPciAddress(const std::string& s) {
  // 0000:3b:00.0 or 3b:00.0
  unsigned a, b, c, d;
  char tail;
  return std::sscanf(s.c_str(), "%x:%x:%x.%x%c", &a, &b, &c, &d, &tail) == 4 ||
         std::sscanf(s.c_str(), "%x:%x.%x%c", &b, &c, &d, &tail) == 3;
}

namespace {

std::string formatMac(const MacAddress& m) {
  char text[18];
  std::snprintf(text, sizeof text, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4],
                m[5]);
  return text;
}

}  // namespace

std::string deviceNameOf(const std::string& devargs) {
  return devargs.substr(0, devargs.find(','));
}

std::vector<std::string> ealArgsForPorts(const std::vector<PortSpec>& ports, unsigned workers) {
  std::vector<std::string> args;
  for (const auto& p : ports) {
    if (isPciAddress(deviceNameOf(p.devargs))) {
      args.push_back("-a");
      args.push_back(p.devargs);
      continue;
    }
    std::string devargs = p.devargs;
    const std::string name = deviceNameOf(devargs);
    if (name.rfind("net_af_packet", 0) == 0 && devargs.find("qpairs=") == std::string::npos) {
      devargs += ",qpairs=" + std::to_string(workers);
    }
    if (name.rfind("net_af_xdp", 0) == 0 && devargs.find("queue_count=") == std::string::npos) {
      devargs += ",queue_count=" + std::to_string(workers);
    }
    args.push_back("--vdev=" + devargs);
  }
  return args;
}

PortSet::~PortSet() {
  close();
}

bool PortSet::configure(std::uint16_t portId, std::uint16_t queues, std::uint16_t mtu,
                        const std::string& what, std::string& error) {
  rte_eth_dev_info info{};
  if (int rc = rte_eth_dev_info_get(portId, &info); rc != 0) {
    error = what + ": cannot read device info: " + rte_strerror(-rc);
    return false;
  }
  if (info.max_rx_queues < queues || info.max_tx_queues < queues) {
    error = what + ": driver " + info.driver_name + " offers " +
            std::to_string(info.max_rx_queues) + " RX / " + std::to_string(info.max_tx_queues) +
            " TX queues, " + std::to_string(queues) + " needed (one per worker lcore)";
    return false;
  }
  rte_eth_conf conf{};
  const std::uint64_t rss =
      (RTE_ETH_RSS_IP | RTE_ETH_RSS_TCP | RTE_ETH_RSS_UDP) & info.flow_type_rss_offloads;
  // af_packet spreads flows over its sockets by the kernel's fanout hash and
  // af_xdp by the NIC's own RSS, so neither offers RSS here nor needs it. A
  // memif queue is chosen by the software at its other end (VPP, a
  // generator), which must keep each flow on one queue as RSS does.
  const std::string driver = info.driver_name;
  const bool spreadOutside =
      driver == "net_af_packet" || driver == "net_af_xdp" || driver == "net_memif";
  if (queues > 1 && !spreadOutside) {
    if (rss == 0) {
      error = what + ": driver " + info.driver_name +
              " has no RSS, so it cannot spread flows over " + std::to_string(queues) +
              " worker queues";
      return false;
    }
    conf.rxmode.mq_mode = RTE_ETH_MQ_RX_RSS;
    conf.rx_adv_conf.rss_conf.rss_hf = rss;
  }
  if (int rc = rte_eth_dev_configure(portId, queues, queues, &conf); rc != 0) {
    error = what + ": configure failed: " + rte_strerror(-rc);
    return false;
  }
  std::uint16_t rxd = kRxDescriptors, txd = kTxDescriptors;
  rte_eth_dev_adjust_nb_rx_tx_desc(portId, &rxd, &txd);
  const int socket = rte_eth_dev_socket_id(portId) < 0 ? 0 : rte_eth_dev_socket_id(portId);
  rte_mempool* pool = nullptr;
  const std::string poolName = "swd_mbufs_" + std::to_string(socket);
  pool = rte_mempool_lookup(poolName.c_str());
  if (pool == nullptr) {
    // Every descriptor of every ring may hold an mbuf, plus each lcore's cache
    // and bursts in flight, for all ports (and taps) that may share the pool.
    const unsigned rings = static_cast<unsigned>(portsPlanned_) * queues * (rxd + txd);
    const unsigned perLcore = (kMbufCache + 2 * 64) * (queues + 1u);
    const unsigned wanted = std::max(kMbufsPerSocket, rings + perLcore + 4096);
    const unsigned count = (1u << (32 - __builtin_clz(wanted))) - 1;  // 2^n - 1
    pool = rte_pktmbuf_pool_create(poolName.c_str(), count, kMbufCache, 0,
                                   RTE_MBUF_DEFAULT_BUF_SIZE, socket);
    if (pool == nullptr) {
      error = what + ": cannot create the mbuf pool on socket " + std::to_string(socket) + ": " +
              rte_strerror(rte_errno) + " (hugepages reserved? or run with --no-huge)";
      return false;
    }
    pools_.push_back(pool);
  }
  for (std::uint16_t q = 0; q < queues; ++q) {
    if (int rc = rte_eth_rx_queue_setup(portId, q, rxd, socket, nullptr, pool); rc != 0) {
      error = what + ": RX queue " + std::to_string(q) + ": " + rte_strerror(-rc);
      return false;
    }
    if (int rc = rte_eth_tx_queue_setup(portId, q, txd, socket, nullptr); rc != 0) {
      error = what + ": TX queue " + std::to_string(q) + ": " + rte_strerror(-rc);
      return false;
    }
  }
  // Best effort: several virtual PMDs do not implement MTU changes; the
  // configured egress MTU is enforced by the encapsulation's MTU check.
  (void)rte_eth_dev_set_mtu(portId, mtu);
  if (int rc = rte_eth_dev_start(portId); rc != 0) {
    error = what + ": start failed: " + rte_strerror(-rc);
    return false;
  }
  started_.push_back(portId);
  (void)rte_eth_promiscuous_enable(portId);
  return true;
}

bool PortSet::open(const std::vector<PortSpec>& specs, std::uint16_t queues, std::string& error) {
  portsPlanned_ = 0;
  for (const auto& spec : specs) portsPlanned_ += spec.exceptionTap ? 2 : 1;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto& spec = specs[i];
    OpenPort port;
    port.spec = spec;
    const std::string name = deviceNameOf(spec.devargs);
    if (rte_eth_dev_get_port_by_name(name.c_str(), &port.portId) != 0) {
      error = "port " + spec.name + ": no DPDK device " + name + " (devargs \"" + spec.devargs +
              "\"): is the NIC bound to vfio-pci, or the vdev string right?";
      close();
      return false;
    }
    rte_eth_dev_info info{};
    if (rte_eth_dev_info_get(port.portId, &info) == 0) port.driver = info.driver_name;
    if (!configure(port.portId, queues, spec.mtu, "port " + spec.name, error)) {
      close();
      return false;
    }
    rte_ether_addr mac{};
    if (spec.mac) {
      for (int b = 0; b < 6; ++b) mac.addr_bytes[b] = (*spec.mac)[b];
      if (int rc = rte_eth_dev_default_mac_addr_set(port.portId, &mac); rc != 0) {
        // Frames still carry the configured MAC as their source, and the
        // port is promiscuous, so it receives frames sent to that MAC.
        port.note = "driver " + port.driver + " cannot set MAC " + formatMac(*spec.mac) + " (" +
                    rte_strerror(-rc) + "); using it as the source MAC, port promiscuous";
      }
    }
    rte_eth_macaddr_get(port.portId, &mac);
    for (int b = 0; b < 6; ++b) port.mac[b] = mac.addr_bytes[b];
    if (spec.mac) port.mac = *spec.mac;

    if (spec.exceptionTap && queues > kMaxTapQueues) {
      error = "port " + spec.name + ": the exception tap supports at most " +
              std::to_string(kMaxTapQueues) + " worker lcores (net_tap's multi-process limit), " +
              std::to_string(queues) + " configured";
      close();
      return false;
    }
    if (spec.exceptionTap) {
      // The tap carries the port's MAC, so the kernel answers ARP and ND for
      // the host's addresses on the port as if it owned the NIC.
      const std::string tapDev = "net_tap_swd" + std::to_string(i);
      const std::string tapArgs = tapDev + ",iface=" + spec.tapName + ",mac=" + formatMac(port.mac);
      if (int rc = rte_dev_probe(tapArgs.c_str()); rc != 0) {
        error = "port " + spec.name + ": cannot create exception tap " + spec.tapName + ": " +
                rte_strerror(-rc);
        close();
        return false;
      }
      if (rte_eth_dev_get_port_by_name(tapDev.c_str(), &port.tapPortId) != 0) {
        error = "port " + spec.name + ": tap " + tapDev + " did not register";
        close();
        return false;
      }
      if (!configure(port.tapPortId, queues, spec.mtu, "exception tap " + spec.tapName, error)) {
        close();
        return false;
      }
      port.hasTap = true;
    }
    ports_.push_back(port);
  }
  return true;
}

void PortSet::close() noexcept {
  for (auto id : started_) {
    (void)rte_eth_dev_stop(id);
    (void)rte_eth_dev_close(id);
  }
  started_.clear();
  ports_.clear();
  // Mempools are freed with the EAL (rte_eal_cleanup); closing ports first
  // returns their mbufs.
}

}  // namespace spillway
