// The kernel's IPv4 reassembly counters of spillwayd's network namespace
// (/proc/net/snmp, "Ip:" ReasmReqds, ReasmOKs, ReasmFails, ReasmTimeout).
//
// Why: DPDK 22.11's af_packet PMD joins a PACKET_FANOUT group with
// PACKET_FANOUT_FLAG_DEFRAG (drivers/net/af_packet/rte_eth_af_packet.c), so
// on an af_packet port the kernel reassembles IPv4 fragments before the
// worker sees them: fragments that never complete vanish in the kernel, and
// only these counters tell. spillwayd exports them for af_packet ports (stats
// file "kernel_reassembly", metric spillway_kernel_reassembly_total). They
// count the whole namespace (the port's interface and any other), which on a
// gateway host is the port's traffic. DPDK-free; the control thread reads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace spillway {

struct KernelReassembly {
  std::uint64_t requests = 0;  // ReasmReqds: fragments the kernel took in
  std::uint64_t ok = 0;        // ReasmOKs: datagrams reassembled
  std::uint64_t failed = 0;    // ReasmFails: failures (timeouts among them)
  std::uint64_t timeouts = 0;  // ReasmTimeout: datagrams whose fragments never all came
};

// The counters from /proc/net/snmp's text; nullopt when its "Ip:" header
// and value lines are missing or lack one of the four fields.
[[nodiscard]] std::optional<KernelReassembly> parseKernelReassembly(std::string_view snmp);

// Reads and parses `path` (default this namespace's /proc/net/snmp).
[[nodiscard]] std::optional<KernelReassembly> readKernelReassembly(
    const std::string& path = "/proc/net/snmp");

}  // namespace spillway
