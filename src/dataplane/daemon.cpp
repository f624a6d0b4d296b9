#include "daemon.hpp"

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_launch.h>
#include <rte_lcore.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "control/cli_server.hpp"
#include "control/control_plane.hpp"
#include "control/metrics_http.hpp"
#include "control/neighbours.hpp"
#include "control/snapshot_builder.hpp"
#include "ports.hpp"
#include "spillway/rcu.hpp"
#include "spillway/snapshot.hpp"
#include "worker.hpp"
#include "xdp_vip_map.hpp"

namespace spillway {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> gStop{false};
std::atomic<bool> gWorkersStop{false};

int workerMain(void* arg) {
  static_cast<Worker*>(arg)->run(gWorkersStop);
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

// Minimal JSON string escaping for names from the configuration.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

struct Totals {
  std::uint64_t rx = 0, forwarded = 0, replies = 0, toKernel = 0, newFlows = 0, resteered = 0,
                insertFailed = 0, icmpSteered = 0, txDropped = 0, exceptionRx = 0,
                exceptionTx = 0, flows = 0, drops = 0;
};

Totals sum(const std::vector<std::unique_ptr<Worker>>& workers) {
  Totals t;
  for (const auto& w : workers) {
    const auto& s = w->steering();
    t.rx += s.rxPackets.read() + w->counters().unsteered.read();
    t.forwarded += s.forwarded.read();
    t.replies += s.replies.read();
    t.toKernel += s.toKernel.read() - w->counters().kernelDropped.read();
    t.newFlows += s.newFlows.read();
    t.resteered += s.resteered.read();
    t.insertFailed += s.flowInsertFailed.read();
    t.icmpSteered += s.icmpErrorsSteered.read();
    t.drops += s.drops.total() + w->counters().drops.total() + w->counters().txDropped.read();
    t.txDropped += w->counters().txDropped.read();
    t.exceptionRx += w->counters().exceptionRx.read();
    t.exceptionTx += w->counters().exceptionTx.read();
  }
  return t;
}

std::string statsJson(const Config& config, const SnapshotBuilder& builder,
                      const std::vector<std::unique_ptr<Worker>>& workers,
                      std::uint64_t generation) {
  const Totals t = sum(workers);
  std::ostringstream o;
  o << "{\"generation\":" << generation << ",\"rx_packets\":" << t.rx
    << ",\"forwarded\":" << t.forwarded << ",\"replies\":" << t.replies
    << ",\"to_kernel\":" << t.toKernel << ",\"new_flows\":" << t.newFlows
    << ",\"resteered\":" << t.resteered << ",\"flow_insert_failed\":" << t.insertFailed
    << ",\"icmp_errors_steered\":" << t.icmpSteered << ",\"tx_dropped\":" << t.txDropped
    << ",\"exception_rx\":" << t.exceptionRx << ",\"exception_tx\":" << t.exceptionTx
    << ",\"dropped\":" << t.drops << ",\"drops\":{";  // tx_queue_full frames also counted by verdict
  bool first = true;
  for (std::size_t r = 1; r < static_cast<std::size_t>(DropReason::kCount); ++r) {
    std::uint64_t n = 0;
    for (const auto& w : workers) {
      n += w->steering().drops.read(static_cast<DropReason>(r)) +
           w->counters().drops.read(static_cast<DropReason>(r));
    }
    if (r == static_cast<std::size_t>(DropReason::TxQueueFull)) n += t.txDropped;
    if (n == 0) continue;
    o << (first ? "" : ",") << quoted(std::string(dropReasonName(static_cast<DropReason>(r))))
      << ":" << n;
    first = false;
  }
  o << "},\"backends\":[";
  first = true;
  for (const auto& b : config.backends) {
    const std::uint32_t index = builder.indexOf(b.id);
    std::uint64_t packets = 0, flows = 0;
    if (index != 0 && index < kBackendSlots) {
      for (const auto& w : workers) {
        packets += w->counters().backendPackets[index].read();
        flows += w->counters().backendNewFlows[index].read();
      }
    }
    const BackendRuntime* rt = builder.runtime(b.id);
    o << (first ? "" : ",") << "{\"name\":" << quoted(b.name) << ",\"pool\":" << quoted(b.pool)
      << ",\"address\":" << quoted(formatIpAddress(b.address)) << ",\"index\":" << index
      << ",\"next_hop_resolved\":" << (rt != nullptr && rt->nextHopMac ? "true" : "false")
      << ",\"packets\":" << packets << ",\"new_flows\":" << flows << "}";
    first = false;
  }
  o << "],\"workers\":[";
  first = true;
  for (const auto& w : workers) {
    const auto& s = w->steering();
    const auto& ft = w->flowTable();
    o << (first ? "" : ",") << "{\"lcore\":" << w->config().lcore
      << ",\"rx_packets\":" << s.rxPackets.read() << ",\"forwarded\":" << s.forwarded.read()
      << ",\"new_flows\":" << s.newFlows.read()
      << ",\"flow_table_occupancy\":" << ft.occupancy
      << ",\"snapshot_generation\":" << w->counters().snapshotGeneration.read() << "}";
    first = false;
  }
  o << "]}";
  return o.str();
}

void writeAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text << "\n";
  }
  std::rename(tmp.c_str(), path.c_str());
}

}  // namespace

std::atomic<bool>& daemonStopRequested() noexcept { return gStop; }

int runDaemon(const Config& configIn, const DaemonOptions& options) {
  Config config = configIn;
  if (options.controlSocket) config.control.socketPath = *options.controlSocket;
  if (options.metricsListen) config.control.metricsListen = *options.metricsListen;
  if (options.stateDir) config.control.stateDir = *options.stateDir;
  const auto log = [&](const std::string& line) {
    if (!options.quiet) std::fprintf(stderr, "spillwayd: %s\n", line.c_str());
  };
  const unsigned workers = static_cast<unsigned>(config.dataplane.lcores.size());

  // EAL arguments: the operator's, the lcore list when the operator gave
  // none, and the ports' devices.
  std::vector<std::string> eal{"spillwayd"};
  eal.insert(eal.end(), options.ealArgs.begin(), options.ealArgs.end());
  if (!hasLcoreOption(options.ealArgs)) {
    unsigned main = 0;
    for (;; ++main) {
      bool used = false;
      for (auto l : config.dataplane.lcores) used = used || l == main;
      if (!used) break;
    }
    std::string list = std::to_string(main);
    for (auto l : config.dataplane.lcores) list += "," + std::to_string(l);
    eal.insert(eal.end(), {"-l", list, "--main-lcore", std::to_string(main)});
  }
  std::vector<PortSpec> specs;
  std::vector<std::string> afXdpInterfaces;  // by port index; empty when not af_xdp
  for (const auto& p : config.ports) {
    std::string devargs = p.devargs;
    std::string xdpInterface;
    if (deviceNameOf(devargs).rfind("net_af_xdp", 0) == 0) {
      // AF_XDP mode: Spillway's XDP program sends only VIP traffic to the
      // sockets and passes the rest to the kernel; no exception path needed.
      if (devargs.find("xdp_prog=") == std::string::npos) {
        std::string tried;
        const std::string prog = redirectProgramPath(&tried);
        if (prog.empty()) {
          std::fprintf(stderr, "spillwayd: port %s: no spillway_redirect.bpf.o (tried %s)\n",
                       p.name.c_str(), tried.c_str());
          return 1;
        }
        devargs += ",xdp_prog=" + prog;
      }
      xdpInterface = interfaceOf(devargs);
    }
    afXdpInterfaces.push_back(xdpInterface);
    specs.push_back(PortSpec{p.name, devargs, p.mtu, p.exception == ExceptionMode::Tap,
                             p.exceptionName, p.mac});
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
    std::fprintf(stderr, "spillwayd: EAL start failed: %s\n", rte_strerror(rte_errno));
    return 1;
  }
  int exitCode = 0;
  {
    for (auto l : config.dataplane.lcores) {
      if (!rte_lcore_is_enabled(l) || l == rte_get_main_lcore()) {
        std::fprintf(stderr,
                     "spillwayd: worker lcore %u is not an enabled worker lcore (EAL -l list, "
                     "main lcore %u)\n",
                     l, rte_get_main_lcore());
        rte_eal_cleanup();
        return 1;
      }
    }
    PortSet ports;
    std::string error;
    if (!ports.open(specs, static_cast<std::uint16_t>(workers), error)) {
      std::fprintf(stderr, "spillwayd: %s\n", error.c_str());
      rte_eal_cleanup();
      return 1;
    }
    SnapshotBuilder builder;
    if (auto e = builder.setConfig(config)) {
      std::fprintf(stderr, "spillwayd: %s\n", e->c_str());
      ports.close();
      rte_eal_cleanup();
      return 1;
    }
    for (std::uint32_t i = 0; i < ports.ports().size(); ++i) {
      builder.setPortMac(i, ports.ports()[i].mac);
      log("port " + ports.ports()[i].spec.name + " is DPDK port " +
          std::to_string(ports.ports()[i].portId) + " (" + ports.ports()[i].driver + ")" +
          (ports.ports()[i].hasTap ? ", exception tap " + ports.ports()[i].spec.tapName : ""));
      if (!ports.ports()[i].note.empty()) {
        log("port " + ports.ports()[i].spec.name + ": " + ports.ports()[i].note);
      }
    }
    // AF_XDP ports: fill the XDP program's VIP map (each VIP, and a marker per
    // VIP address so ICMP and fragments to it reach spillwayd too).
    std::vector<XdpVipKey> xdpKeys;
    for (const auto& v : config.vips) {
      xdpKeys.push_back(XdpVipKey{v.address.bytes, v.address.version,
                                  static_cast<std::uint8_t>(v.protocol), v.port});
      xdpKeys.push_back(XdpVipKey{v.address.bytes, v.address.version, 0, 0});
    }
    std::vector<XdpVipMap> xdpMaps;
    for (const auto& ifname : afXdpInterfaces) {
      if (ifname.empty()) continue;
      auto map = XdpVipMap::open(ifname, error);
      if (!map || !map->sync(xdpKeys, error)) {
        std::fprintf(stderr, "spillwayd: AF_XDP on %s: %s\n", ifname.c_str(), error.c_str());
        ports.close();
        rte_eal_cleanup();
        return 1;
      }
      log("AF_XDP on " + ifname + ": XDP program " + std::to_string(map->programId()) +
          " redirects " + std::to_string(config.vips.size()) + " VIP(s)");
      xdpMaps.push_back(std::move(*map));
    }

    KernelNeighbourSource kernel;
    NeighbourResolver resolver(kernel);
    resolver.refresh(config);
    builder.refreshNextHops(resolver);
    resolver.solicitUnresolved(config);

    QsbrDomain qsbr(workers);
    SnapshotPublisher publisher(qsbr);

    std::vector<std::unique_ptr<Worker>> pool;
    for (unsigned i = 0; i < workers; ++i) {
      WorkerConfig wc;
      wc.lcore = config.dataplane.lcores[i];
      wc.queue = static_cast<std::uint16_t>(i);
      wc.qsbrReader = i;
      wc.burst = static_cast<std::uint16_t>(config.dataplane.burst);
      wc.txDrainUs = config.dataplane.txDrainUs;
      wc.flowTable = FlowTableConfig{config.dataplane.flowCapacity, config.dataplane.timeouts};
      wc.hashSeed = config.dataplane.hashSeed;
      try {
        pool.push_back(std::make_unique<Worker>(wc, ports.ports(), qsbr, publisher));
      } catch (const std::exception& e) {
        std::fprintf(stderr,
                     "spillwayd: worker lcore %u: %s (flow_capacity %zu flows needs %zu MiB "
                     "per lcore)\n",
                     wc.lcore, e.what(), wc.flowTable.capacity,
                     FlowTable::memoryBytesFor(wc.flowTable.capacity) >> 20);
        pool.clear();
        ports.close();
        rte_eal_cleanup();
        return 1;
      }
    }

    const auto start = Clock::now();
    auto millis = [&] {
      return static_cast<Millis>(
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
    };
    DataplaneHooks hooks;
    hooks.stats = [&]() -> Json {
      return Json::parse(statsJson(config, builder, pool, publisher.current() != nullptr
                                                              ? publisher.current()->generation
                                                              : 0),
                         nullptr, false);
    };
    hooks.requestFlowCounts = [&](std::uint64_t n) {
      for (auto& w : pool) w->requestFlowCount(n);
    };
    hooks.collectFlowCounts = [&](std::uint64_t n)
        -> std::optional<std::vector<std::pair<unsigned, std::vector<std::uint64_t>>>> {
      for (auto& w : pool) {
        if (w->flowCountDone() < n) return std::nullopt;
      }
      std::vector<std::pair<unsigned, std::vector<std::uint64_t>>> out;
      const std::uint32_t limit = builder.indexStats().limit;  // indices ever used, + 1
      for (auto& w : pool) {
        std::vector<std::uint64_t> counts(limit);
        for (std::uint32_t i = 0; i < limit; ++i) counts[i] = w->liveFlows()[i].read();
        out.emplace_back(w->config().lcore, std::move(counts));
      }
      return out;
    };
    // Backend-index recycling: every worker purges its flow table of them.
    hooks.requestPurge = [&](std::uint64_t n, const std::vector<std::uint32_t>& indices) {
      for (auto& w : pool) w->requestPurge(n, indices);
    };
    hooks.purgeDone = [&](std::uint64_t n) {
      return std::all_of(pool.begin(), pool.end(),
                         [&](const auto& w) { return w->purgeDone() >= n; });
    };
    hooks.appliedGeneration = [&]() -> std::uint64_t {
      std::uint64_t oldest = UINT64_MAX;
      for (auto& w : pool) oldest = std::min(oldest, w->counters().snapshotGeneration.read());
      return oldest;
    };
    ControlPlane control(config, options.configPath, builder, std::move(hooks), millis());
    auto first = control.takeSnapshot(millis());
    if (!first) {
      std::fprintf(stderr, "spillwayd: %s\n", builder.lastError().c_str());
      pool.clear();
      ports.close();
      rte_eal_cleanup();
      return 1;
    }
    publisher.publish(std::move(first));
    log("published snapshot generation 1");

    // Peer credentials of every mutating request go to the log.
    CliServer cli(control, CliServerOptions::fromConfig(
                               config.control, [&](std::string_view line) {
                                 std::fprintf(stderr, "spillwayd: cli: %.*s\n",
                                              static_cast<int>(line.size()), line.data());
                               }));
    if (!cli.open(error)) {
      std::fprintf(stderr, "spillwayd: CLI socket: %s\n", error.c_str());
      pool.clear();
      ports.close();
      rte_eal_cleanup();
      return 1;
    }
    MetricsHttpServer metrics(control, MetricsHttpOptions::fromConfig(config.control));
    if (!metrics.open(error)) {
      std::fprintf(stderr, "spillwayd: metrics: %s\n", error.c_str());
      pool.clear();
      ports.close();
      rte_eal_cleanup();
      return 1;
    }
    log("CLI socket " + config.control.socketPath +
        (config.control.metricsListen.empty() ? std::string()
                                              : ", metrics on http://" +
                                                    config.control.metricsListen + "/metrics"));

    gWorkersStop.store(false);
    for (auto& w : pool) rte_eal_remote_launch(workerMain, w.get(), w->config().lcore);
    log("running " + std::to_string(workers) + " worker lcore(s)");

    auto lastStats = start, lastNeighbours = start, lastRx = start, lastHeld = start;
    std::uint64_t rxSeen = 0;
    std::set<std::uint64_t> solicitedHeld;
    while (!gStop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      const auto now = Clock::now();
      const Millis nowMs = millis();
      publisher.reclaim();
      if (now - lastNeighbours >= std::chrono::milliseconds(250)) {
        lastNeighbours = now;
        resolver.refresh(control.config());
        const std::size_t changed = builder.refreshNextHops(resolver);
        // Unresolved next hops: have the kernel ask (ARP / ND) for the next round.
        resolver.solicitUnresolved(control.config());
        if (changed > 0) control.markDirty();
      }
      cli.poll();
      // Backends added at run time stay out of the tables until their next
      // hop resolves: the kernel is asked at once and looked at every 5 ms.
      if (now - lastHeld >= std::chrono::milliseconds(5)) {
        lastHeld = now;
        const std::vector<std::uint64_t> held = builder.heldForNextHop();
        if (!held.empty()) {
          resolver.refresh(control.config(), held);
          if (builder.refreshNextHops(resolver) > 0) control.markDirty();
          std::vector<std::uint64_t> ask;
          for (std::uint64_t id : builder.heldForNextHop()) {
            if (solicitedHeld.insert(id).second) ask.push_back(id);
          }
          if (!ask.empty()) resolver.solicitUnresolved(control.config(), ask);
        }
        std::erase_if(solicitedHeld, [&](std::uint64_t id) {
          return std::find(held.begin(), held.end(), id) == held.end();
        });
      }
      metrics.poll();
      if (control.tick(nowMs)) {
        if (auto next = control.takeSnapshot(nowMs)) {
          publisher.publish(std::move(next));
          if (!options.quiet) {
            log("published snapshot generation " + std::to_string(control.generation()));
          }
        }
      }
      if (!options.statsFile.empty() &&
          now - lastStats >= std::chrono::milliseconds(options.statsIntervalMs)) {
        lastStats = now;
        writeAtomically(options.statsFile,
                        statsJson(control.config(), builder, pool, control.generation()));
      }
      const std::uint64_t rx = sum(pool).rx;
      if (rx != rxSeen) {
        rxSeen = rx;
        lastRx = now;
      }
      if (options.exitAfterIdleMs != 0 && rxSeen > 0 &&
          now - lastRx >= std::chrono::milliseconds(options.exitAfterIdleMs)) {
        log("idle, stopping");
        break;
      }
      if (options.runForMs != 0 && now - start >= std::chrono::milliseconds(options.runForMs)) {
        break;
      }
    }
    gWorkersStop.store(true);
    rte_eal_mp_wait_lcore();
    const std::string stats = statsJson(control.config(), builder, pool, control.generation());
    if (!options.statsFile.empty()) writeAtomically(options.statsFile, stats);
    std::printf("%s\n", stats.c_str());
    std::fflush(stdout);
    pool.clear();
    while (publisher.reclaim() > 0) {
    }
    ports.close();
  }
  rte_eal_cleanup();
  return exitCode;
}

}  // namespace spillway
