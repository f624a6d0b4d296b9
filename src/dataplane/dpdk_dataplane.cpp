#include "dpdk_dataplane.hpp"

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_launch.h>
#include <rte_lcore.h>

#include <algorithm>

#include "stale_redirect.hpp"

namespace spillway {
namespace {

std::atomic<bool>* gWorkersStop = nullptr;

int workerMain(void* arg) {
  static_cast<Worker*>(arg)->run(*gWorkersStop);
  return 0;
}

// The iface= of a vdev string, or "".
std::string interfaceOf(const std::string& devargs) {
  const auto at = devargs.find("iface=");
  if (at == std::string::npos) return "";
  const auto end = devargs.find(',', at);
  return devargs.substr(at + 6, end == std::string::npos ? std::string::npos : end - at - 6);
}

bool hasLcoreOption(const std::vector<std::string>& args) {
  for (const auto& a : args) {
    if (a == "-l" || a == "-c" || a.rfind("--lcores", 0) == 0 || a.rfind("-l", 0) == 0) return true;
  }
  return false;
}

}  // namespace

DpdkDataplane::DpdkDataplane(unsigned workers) : qsbr_(workers), publisher_(qsbr_) {}

std::unique_ptr<DpdkDataplane> DpdkDataplane::open(const Options& options, std::string& error) {
  const auto log = [&](const std::string& line) {
    if (options.log) options.log(line);
  };
  const auto workers = static_cast<unsigned>(options.lcores.size());
  // EAL arguments: the operator's, the lcore list when the operator gave
  // none, and the ports' devices.
  std::vector<std::string> eal{"spillwayd"};
  eal.insert(eal.end(), options.ealArgs.begin(), options.ealArgs.end());
  if (!hasLcoreOption(options.ealArgs)) {
    unsigned main = 0;
    while (std::find(options.lcores.begin(), options.lcores.end(), main) != options.lcores.end()) {
      ++main;
    }
    std::string list = std::to_string(main);
    for (auto l : options.lcores) list += "," + std::to_string(l);
    eal.insert(eal.end(), {"-l", list, "--main-lcore", std::to_string(main)});
  }
  std::vector<PortSpec> specs = options.ports;
  std::vector<std::string> xdpInterfaces;  // by port index; empty when not af_xdp
  for (auto& spec : specs) {
    std::string xdpInterface;
    if (deviceNameOf(spec.devargs).rfind("net_af_xdp", 0) == 0) {
      // AF_XDP mode: Spillway's XDP program sends only VIP traffic to the
      // sockets and passes the rest to the kernel; no exception path needed.
      if (spec.devargs.find("xdp_prog=") == std::string::npos) {
        std::string tried;
        const std::string prog = redirectProgramPath(&tried);
        if (prog.empty()) {
          error = "port " + spec.name + ": no spillway_redirect.bpf.o (tried " + tried + ")";
          return nullptr;
        }
        spec.devargs += ",xdp_prog=" + prog;
      }
      xdpInterface = interfaceOf(spec.devargs);
      // A program a killed spillwayd left attached would make the PMD fail.
      if (auto busy = takeOverStaleRedirect(xdpInterface, log)) {
        error = "port " + spec.name + ": " + *busy;
        return nullptr;
      }
    }
    xdpInterfaces.push_back(xdpInterface);
  }
  for (auto& a : ealArgsForPorts(specs, workers)) eal.push_back(a);
  // With only virtual ports, keep the EAL off the host's PCI devices (a VM's
  // own virtio NIC, say) unless the operator chose devices explicitly.
  bool anyPci = false, operatorChosePci = false;
  for (const auto& s : specs) anyPci = anyPci || isPciAddress(deviceNameOf(s.devargs));
  for (const auto& a : options.ealArgs) {
    operatorChosePci = operatorChosePci || a == "-a" || a == "-b" || a == "--no-pci" ||
                       a.rfind("--allow", 0) == 0 || a.rfind("--block", 0) == 0;
  }
  if (!anyPci && !operatorChosePci) eal.push_back("--no-pci");
  std::vector<char*> argv;
  for (auto& a : eal) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string joined;
  for (const auto& a : eal) joined += " " + a;
  log("EAL" + joined);
  if (rte_eal_init(static_cast<int>(argv.size() - 1), argv.data()) < 0) {
    error = std::string("EAL start failed: ") + rte_strerror(rte_errno);
    return nullptr;
  }
  for (auto l : options.lcores) {
    if (!rte_lcore_is_enabled(l) || l == rte_get_main_lcore()) {
      error = "worker lcore " + std::to_string(l) +
              " is not an enabled worker lcore (EAL -l list, main lcore " +
              std::to_string(rte_get_main_lcore()) + ")";
      rte_eal_cleanup();
      return nullptr;
    }
  }
  std::unique_ptr<DpdkDataplane> dp(new DpdkDataplane(workers));
  if (!dp->ports_.open(specs, static_cast<std::uint16_t>(workers), error)) {
    dp.reset();  // the destructor cleans up the EAL
    return nullptr;
  }
  dp->portsOpen_ = true;
  for (const auto& p : dp->ports_.ports()) {
    dp->packetDrops_.push_back(p.driver == "net_af_packet"
                                   ? PacketSocketDrops::find(afPacketInterface(p.spec.devargs))
                                   : PacketSocketDrops{});
  }
  dp->xdpInterfaces_ = xdpInterfaces;
  for (const auto& p : dp->ports_.ports()) {
    log("port " + p.spec.name + " is DPDK port " + std::to_string(p.portId) + " (" + p.driver +
        ")" + (p.hasTap ? ", exception tap " + p.spec.tapName : ""));
    if (!p.note.empty()) log("port " + p.spec.name + ": " + p.note);
  }
  for (std::size_t i = 0; i < dp->packetDrops_.size(); ++i) {
    if (dp->ports_.ports()[i].driver != "net_af_packet") continue;
    log("port " + dp->ports_.ports()[i].spec.name + ": ring drops read from " +
        std::to_string(dp->packetDrops_[i].sockets()) + " packet socket(s)");
  }
  for (const auto& ifname : xdpInterfaces) {
    if (ifname.empty()) continue;
    auto map = XdpVipMap::open(ifname, error);
    if (!map) {
      error = "AF_XDP on " + ifname + ": " + error;
      dp.reset();
      return nullptr;
    }
    log("AF_XDP on " + ifname + ": XDP program " + std::to_string(map->programId()));
    dp->xdpMaps_.push_back(std::move(*map));
  }
  for (unsigned i = 0; i < workers; ++i) {
    WorkerConfig wc;
    wc.lcore = options.lcores[i];
    wc.queue = static_cast<std::uint16_t>(i);
    wc.qsbrReader = i;
    wc.burst = options.burst;
    wc.txDrainUs = options.txDrainUs;
    wc.idleSleepUs = options.idleSleepUs;
    wc.idleSleepMaxUs = options.idleSleepMaxUs;
    wc.icmpLimits = options.icmpLimits;
    wc.flowTable = options.flowTable;
    wc.hashSeed = options.hashSeed;
    try {
      dp->workers_.push_back(
          std::make_unique<Worker>(wc, dp->ports_.ports(), dp->qsbr_, dp->publisher_));
    } catch (const std::exception& e) {
      error = "worker lcore " + std::to_string(wc.lcore) + ": " + e.what() + " (flow_capacity " +
              std::to_string(wc.flowTable.capacity) + " flows needs " +
              std::to_string(FlowTable::memoryBytesFor(wc.flowTable.capacity) >> 20) +
              " MiB per lcore)";
      dp.reset();
      return nullptr;
    }
  }
  dp->exportProgress_.resize(workers);
  return dp;
}

DpdkDataplane::~DpdkDataplane() {
  stop();
  workers_.clear();
  while (publisher_.reclaim() > 0) {
  }
  if (portsOpen_) ports_.close();
  rte_eal_cleanup();
}

void DpdkDataplane::start() {
  if (running_) return;
  stop_.store(false);
  gWorkersStop = &stop_;
  for (auto& w : workers_) rte_eal_remote_launch(workerMain, w.get(), w->config().lcore);
  running_ = true;
}

void DpdkDataplane::stop() {
  if (!running_) return;
  stop_.store(true);
  rte_eal_mp_wait_lcore();
  running_ = false;
}

void DpdkDataplane::exportAllStopped(std::vector<ExportedFlow>& out) const {
  const ForwardingSnapshot* last = publisher_.current();
  if (last == nullptr || running_) return;
  for (const auto& w : workers_) w->exportAllStopped(*last, out);
}

std::vector<std::uint64_t> DpdkDataplane::workerRounds() const {
  std::vector<std::uint64_t> out;
  out.reserve(workers_.size());
  for (const auto& w : workers_) out.push_back(w->rounds());
  return out;
}

std::vector<LcoreAdoptedFlow> DpdkDataplane::adoptedFlows() const {
  std::vector<LcoreAdoptedFlow> out;
  std::vector<AdoptedFlow> flows;
  for (const auto& w : workers_) {
    flows.clear();
    w->adoptedFlows().read(flows);
    const std::uint64_t now = w->clockMs();
    for (const AdoptedFlow& f : flows) {
      out.push_back(LcoreAdoptedFlow{w->config().lcore, f, now > f.at ? now - f.at : 0});
    }
  }
  return out;
}

std::uint64_t DpdkDataplane::rxTotal() const noexcept {
  std::uint64_t rx = 0;
  for (const auto& w : workers_) {
    rx += w->steering().rxPackets.read() + w->counters().unsteered.read();
  }
  return rx;
}

void DpdkDataplane::publish(std::unique_ptr<const ForwardingSnapshot> snapshot) {
  publisher_.publish(std::move(snapshot));
}

std::size_t DpdkDataplane::reclaim() {
  return publisher_.reclaim();
}

std::uint64_t DpdkDataplane::publishedGeneration() const {
  const ForwardingSnapshot* s = publisher_.current();
  return s != nullptr ? s->generation : 0;
}

std::uint64_t DpdkDataplane::appliedGeneration() const {
  std::uint64_t oldest = UINT64_MAX;
  for (const auto& w : workers_) {
    oldest = std::min(oldest, w->counters().snapshotGeneration.read());
  }
  return workers_.empty() ? publishedGeneration() : oldest;
}

void DpdkDataplane::requestFlowCounts(std::uint64_t n) {
  for (auto& w : workers_) w->requestFlowCount(n);
}

std::optional<std::vector<LcoreFlowCounts>> DpdkDataplane::collectFlowCounts(std::uint64_t n) {
  for (const auto& w : workers_) {
    if (w->flowCountDone() < n) return std::nullopt;
  }
  std::vector<LcoreFlowCounts> out;
  for (const auto& w : workers_) {
    // Up to the highest index with flows: indices are recycled, so the
    // space in use stays small.
    std::uint32_t top = kBackendSlots;
    while (top > 0 && w->liveFlows()[top - 1].read() == 0) --top;
    LcoreFlowCounts c{w->config().lcore, std::vector<std::uint64_t>(top)};
    for (std::uint32_t i = 0; i < top; ++i) c.byBackend[i] = w->liveFlows()[i].read();
    out.push_back(std::move(c));
  }
  return out;
}

void DpdkDataplane::requestExceptionExport(std::uint64_t n, const ForwardingSnapshot* next) {
  exportFor_ = n;
  exportFlows_.clear();
  for (auto& p : exportProgress_) p.done = false;
  for (auto& w : workers_) w->requestExceptionExport(n, next);
}

void DpdkDataplane::forgetExportNext() {
  for (auto& w : workers_) w->forgetExportNext();
}

std::optional<std::vector<ExportedFlow>> DpdkDataplane::collectExceptionExport(std::uint64_t n) {
  if (n != exportFor_) return std::nullopt;
  bool all = true;
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    Worker& w = *workers_[i];
    ExportProgress& p = exportProgress_[i];
    // Chunks are handed over one at a time (worker.hpp's handshake).
    while (!p.done) {
      const std::uint64_t published = w.exportPublished();
      if (published == p.taken) break;
      if (w.exportChunkFor() == n) {  // a given-up request's chunks are dropped
        const auto chunk = w.exportChunk();
        exportFlows_.insert(exportFlows_.end(), chunk.begin(), chunk.end());
      }
      p.done = w.exportChunkLast() == n;
      p.taken = published;
      w.takeExportChunk(published);
    }
    all = all && p.done;
  }
  if (!all) return std::nullopt;
  exportFor_ = 0;  // collected: a second collect(n) is not a second, empty export
  return std::move(exportFlows_);
}

void DpdkDataplane::requestPurge(std::uint64_t n, const std::vector<std::uint32_t>& indices) {
  for (auto& w : workers_) w->requestPurge(n, indices);
}

bool DpdkDataplane::purgeDone(std::uint64_t n) const {
  return std::all_of(workers_.begin(), workers_.end(),
                     [&](const auto& w) { return w->purgeDone() >= n; });
}

std::optional<std::string> DpdkDataplane::syncVips(std::span<const VipKey> vips) {
  // Each VIP, and a marker per VIP address so ICMP and fragments to it reach
  // spillwayd too.
  std::vector<XdpVipKey> keys;
  for (const VipKey& v : vips) {
    keys.push_back(XdpVipKey{v.address, v.version, v.proto, v.port});
    keys.push_back(XdpVipKey{v.address, v.version, 0, 0});
  }
  for (auto& map : xdpMaps_) {
    std::string error;
    if (!map.sync(keys, error)) return "AF_XDP VIP map: " + error;
  }
  return std::nullopt;
}

DataplaneCounters DpdkDataplane::counters() const {
  DataplaneCounters c;
  c.backendPackets.assign(kBackendSlots, 0);
  c.backendNewFlows.assign(kBackendSlots, 0);
  c.backendBytes.assign(kBackendSlots, 0);
  for (const auto& w : workers_) {
    const auto& s = w->steering();
    const auto& wc = w->counters();
    c.rxPackets += s.rxPackets.read() + wc.unsteered.read();
    c.forwarded += s.forwarded.read();
    c.replies += s.replies.read();
    c.toKernel += s.toKernel.read() - wc.kernelDropped.read();
    c.newFlows += s.newFlows.read();
    c.resteered += s.resteered.read();
    c.flowInsertFailed += s.flowInsertFailed.read();
    c.icmpErrorsSteered += s.icmpErrorsSteered.read();
    c.exceptionHits += s.exceptionHits.read();
    for (std::size_t o = 0; o < kExceptionOriginCount; ++o) {
      c.exceptionHitsByOrigin[o] += s.exceptionHitsByOrigin[o].read();
    }
    c.placedOffTable += s.placedOffTable.read();
    c.secondChanceSent += s.secondChanceSent.read();
    c.secondChanceUnsent += s.secondChanceUnsent.read();
    c.txDropped += wc.txDropped.read();
    c.exceptionRx += wc.exceptionRx.read();
    c.exceptionTx += wc.exceptionTx.read();
    c.dropped += s.drops.total() + wc.drops.total() + wc.txDropped.read();
    for (std::size_t r = 1; r < c.drops.size(); ++r) {
      c.drops[r] +=
          s.drops.read(static_cast<DropReason>(r)) + wc.drops.read(static_cast<DropReason>(r));
    }
    // TX ring full frames are drops of their own reason too.
    c.drops[static_cast<std::size_t>(DropReason::TxQueueFull)] += wc.txDropped.read();
    for (std::uint32_t i = 0; i < kBackendSlots; ++i) {
      c.backendPackets[i] += wc.backendTraffic[i].packets.read();
      c.backendNewFlows[i] += wc.backendNewFlows[i].read();
      c.backendBytes[i] += wc.backendTraffic[i].bytes.read();
    }
    c.lcores.push_back(DataplaneCounters::Lcore{
        w->config().lcore, s.rxPackets.read(), s.forwarded.read(), s.newFlows.read(),
        w->flowTable().occupancy, w->flowTable().synFlood != 0, wc.snapshotGeneration.read(),
        wc.idleSleeps.read(), w->flowTable().embryonicRejected, w->flowTable().relocationsSkipped,
        w->flowTable().evictions, wc.rounds.read(), wc.housekeepingRounds.read()});
  }
  bool afPacket = false;
  const std::lock_guard lock(packetDropsMutex_);
  for (std::size_t i = 0; i < ports_.ports().size(); ++i) {
    const OpenPort& p = ports_.ports()[i];
    DataplaneCounters::Port port{p.spec.name, p.driver};
    rte_eth_stats st{};
    if (rte_eth_stats_get(p.portId, &st) == 0) {
      port.rxPackets = st.ipackets;
      port.rxMissed = st.imissed;
      port.rxErrors = st.ierrors;
      port.rxNoMbuf = st.rx_nombuf;
    }
    // The af_packet ring's drops, which the PMD does not read.
    if (i < packetDrops_.size()) port.rxMissed += packetDrops_[i].read();
    c.ports.push_back(std::move(port));
    afPacket = afPacket || p.driver == "net_af_packet";
  }
  if (afPacket) c.kernelReassembly = readKernelReassembly();
  return c;
}

std::uint64_t DpdkDataplane::placedOffTable() const {
  std::uint64_t n = 0;
  for (const auto& w : workers_) n += w->steering().placedOffTable.read();
  return n;
}

void DpdkDataplane::backendBytes(std::span<std::uint64_t> out) const {
  std::fill(out.begin(), out.end(), 0);
  const std::size_t n = std::min<std::size_t>(out.size(), kBackendSlots);
  for (const auto& w : workers_) {
    const auto& wc = w->counters();
    for (std::size_t i = 0; i < n; ++i) out[i] += wc.backendTraffic[i].bytes.read();
  }
}

}  // namespace spillway
