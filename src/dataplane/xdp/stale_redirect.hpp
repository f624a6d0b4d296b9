// takeOverStaleRedirect: clears what a killed spillwayd leaves on an AF_XDP
// port, before DPDK's net_af_xdp PMD attaches spillway_redirect.bpf.o again.
//
// The PMD attaches the program with XDP_FLAGS_UPDATE_IF_NOEXIST and detaches
// it when the port closes; after `kill -9` nothing closes the port, so the
// program stays on the interface and the next start fails. Called before the
// EAL starts, once per AF_XDP interface:
//  - nothing attached: nothing to do;
//  - Spillway's redirect program (program name spillway_redir with maps
//    xsks_map and vip_map) held by no live process (no descriptor of it or of
//    its maps in any /proc/PID/fdinfo): left by a dead spillwayd; detached
//    (exactly that program), and `log` says so;
//  - the same program held by a live process: another spillwayd or DPDK
//    application runs this port; refused, naming the process;
//  - any other program (spillway-decap, someone's XDP firewall): refused,
//    naming it and how to remove it; nothing is touched.
// The rest of a killed spillwayd needs no help: its AF_XDP sockets and UMEMs
// go with its descriptors, DPDK reclaims a dead primary's runtime files under
// /var/run/dpdk/<prefix> (their locks died with it), and the CLI socket's
// stale file is removed by CliServer after a refused connect.
//
// Liveness is judged from this PID namespace's /proc: run spillwayd where it
// sees every process that could own the interface (the host's, or the
// container's that owns the network namespace).
// Start-up code, single-threaded, no DPDK. nullopt: the interface is free
// for the PMD; otherwise the reason it is not, one line.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace spillway {

[[nodiscard]] std::optional<std::string> takeOverStaleRedirect(
    const std::string& ifname, const std::function<void(const std::string&)>& log = {});

}  // namespace spillway
