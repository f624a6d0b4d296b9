// spillwayd's data path on DPDK: the EAL, the ports (any PMD), the AF_XDP
// VIP maps, the worker lcores and the snapshot publisher with its QSBR
// domain, behind the Dataplane interface (spillway/dataplane.hpp) that the
// control plane talks to.
//
// Lifecycle: open() starts the EAL and opens everything, or cleans up and
// says why; start() launches the workers; stop() stops them (they flush
// their TX buffers) and waits; the destructor stops, frees the snapshots,
// closes the ports and cleans up the EAL. After stop() the flow tables
// belong to the caller's thread again: exportAllStopped() reads them for the
// last checkpoint.
//
// Thread contract: one DpdkDataplane per process (the EAL is global), used
// from the main lcore; the workers share only the publisher, the QSBR domain
// and the stop flag.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ports.hpp"
#include "spillway/dataplane.hpp"
#include "spillway/packet_socket_drops.hpp"
#include "spillway/rcu.hpp"
#include "worker.hpp"
#include "xdp_vip_map.hpp"

namespace spillway {

class DpdkDataplane final : public Dataplane {
 public:
  struct Options {
    std::vector<std::string> ealArgs;  // the operator's, before "--"
    std::vector<unsigned> lcores;      // one worker per lcore
    std::vector<PortSpec> ports;       // AF_XDP ports get Spillway's redirect program
    std::uint16_t burst = 32;
    std::uint32_t txDrainUs = 100;
    std::uint32_t idleSleepUs = 0;     // WorkerConfig::idleSleepUs
    std::uint32_t idleSleepMaxUs = 0;  // WorkerConfig::idleSleepMaxUs
    IcmpRateLimits icmpLimits{};       // WorkerConfig::icmpLimits
    FlowTableConfig flowTable{};
    std::uint64_t hashSeed = 0;
    std::function<void(const std::string&)> log;  // progress lines
  };

  // Null with `error` set when anything fails (the EAL is cleaned up again).
  [[nodiscard]] static std::unique_ptr<DpdkDataplane> open(const Options& options,
                                                           std::string& error);
  ~DpdkDataplane() override;
  DpdkDataplane(const DpdkDataplane&) = delete;
  DpdkDataplane& operator=(const DpdkDataplane&) = delete;

  [[nodiscard]] const std::vector<OpenPort>& ports() const noexcept { return ports_.ports(); }
  void start();
  void stop();
  // After stop(): every exception of every worker's flow table against the
  // current snapshot.
  void exportAllStopped(std::vector<ExportedFlow>& out) const;
  // Frames received so far (every worker, steered or not).
  [[nodiscard]] std::uint64_t rxTotal() const noexcept;

  // Dataplane.
  void publish(std::unique_ptr<const ForwardingSnapshot> snapshot) override;
  std::size_t reclaim() override;
  [[nodiscard]] std::uint64_t publishedGeneration() const override;
  [[nodiscard]] std::uint64_t appliedGeneration() const override;
  void requestFlowCounts(std::uint64_t n) override;
  [[nodiscard]] std::optional<std::vector<LcoreFlowCounts>> collectFlowCounts(
      std::uint64_t n) override;
  void requestExceptionExport(std::uint64_t n, const ForwardingSnapshot* next) override;
  void forgetExportNext() override;
  [[nodiscard]] std::optional<std::vector<ExportedFlow>> collectExceptionExport(
      std::uint64_t n) override;
  void requestPurge(std::uint64_t n, const std::vector<std::uint32_t>& indices) override;
  [[nodiscard]] bool purgeDone(std::uint64_t n) const override;
  [[nodiscard]] std::optional<std::string> syncVips(std::span<const VipKey> vips) override;
  [[nodiscard]] DataplaneCounters counters() const override;
  void backendBytes(std::span<std::uint64_t> out) const override;
  [[nodiscard]] std::uint64_t placedOffTable() const override;
  [[nodiscard]] std::vector<std::uint64_t> workerRounds() const override;
  [[nodiscard]] std::vector<LcoreAdoptedFlow> adoptedFlows() const override;

 private:
  explicit DpdkDataplane(unsigned workers);

  struct ExportProgress {
    std::uint64_t taken = 0;  // the worker's last chunk taken
    bool done = false;
  };

  PortSet ports_;
  std::vector<std::string> xdpInterfaces_;  // by port; "" when not AF_XDP
  std::vector<XdpVipMap> xdpMaps_;
  QsbrDomain qsbr_;
  SnapshotPublisher publisher_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<bool> stop_{false};
  bool running_ = false;
  bool portsOpen_ = false;
  // By port: the af_packet PMD's sockets, whose ring drops rx_missed adds
  // (packet_socket_drops.hpp); counters() may run on any control thread.
  mutable std::mutex packetDropsMutex_;
  mutable std::vector<PacketSocketDrops> packetDrops_;

  std::vector<ExportProgress> exportProgress_;
  std::vector<ExportedFlow> exportFlows_;
  std::uint64_t exportFor_ = 0;
};

}  // namespace spillway
