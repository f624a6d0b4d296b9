// XDP attachment by interface: the one place where Spillway's XDP tools
// (spillway-decap, spillwayd's XdpVipMap and its stale-program takeover, the
// e2e probe) ask what runs on an interface, attach a program and detach one.
//
// Plain libbpf netlink (bpf_xdp_query / bpf_xdp_attach / bpf_xdp_detach),
// not libxdp: DPDK's net_af_xdp PMD attaches spillway_redirect.bpf.o with
// bpf_xdp_attach(XDP_FLAGS_UPDATE_IF_NOEXIST) itself, so a libxdp dispatcher
// in front would make the PMD's attach fail, `ip link` and bpftool would show
// the dispatcher instead of Spillway's program, and libxdp keeps its
// multi-program state on a bpffs that `ip netns exec` hides. One program per
// interface and mode, found again through netlink, is all Spillway needs.
//
// Every detach and replace names the program it expects (XDP_FLAGS_REPLACE
// with the old program's fd), so a program attached meanwhile by someone else
// is never removed by mistake.
//
// Start-up and tool code, single-threaded, no DPDK. Errors are returned as
// text in `error`, never thrown.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "spillway/unique_fd.hpp"

namespace spillway {

// The text of a libbpf or kernel error (errno or -errno, libbpf's own codes
// included), with the capabilities to look at when it is EPERM.
[[nodiscard]] std::string bpfErrorText(int err);

enum class XdpMode {
  Auto,     // attach: native where the driver has it, else generic
  Native,   // driver mode (XDP_FLAGS_DRV_MODE)
  Generic,  // skb mode (XDP_FLAGS_SKB_MODE)
  Offload,  // on the NIC (XDP_FLAGS_HW_MODE); reported, never attached here
};

[[nodiscard]] const char* xdpModeName(XdpMode mode) noexcept;

// One program attached to an interface, as the kernel reports it.
struct XdpProgram {
  std::uint32_t id = 0;
  std::string name;  // the kernel's 15-character program name
  XdpMode mode = XdpMode::Native;
  std::vector<std::uint32_t> mapIds;
  std::vector<std::string> mapNames;  // same order as mapIds

  [[nodiscard]] bool hasMap(std::string_view mapName) const;
  // "'spillway_redir' (id 12, native mode)"
  [[nodiscard]] std::string describe() const;
};

// What runs on an interface: at most one program per mode.
struct XdpAttachment {
  std::string ifname;
  int ifindex = 0;
  std::vector<XdpProgram> programs;
};

// The interface's index; nullopt with `error` when it does not exist in this
// network namespace.
[[nodiscard]] std::optional<int> interfaceIndex(const std::string& ifname, std::string& error);

// The programs attached to `ifname` (any mode), with their names and maps.
[[nodiscard]] std::optional<XdpAttachment> queryXdp(const std::string& ifname, std::string& error);

// The name and maps of program `id`.
[[nodiscard]] std::optional<XdpProgram> xdpProgramInfo(std::uint32_t id, std::string& error);

// A descriptor of the map of `program` named `mapName`; invalid when the
// program has none (or it vanished meanwhile).
[[nodiscard]] UniqueFd openProgramMap(const XdpProgram& program, std::string_view mapName);

// Attaches `progFd` to `ifindex` in `mode`. With `replace` (a program
// attached in that mode now) the kernel swaps it atomically and fails if it is
// no longer the one there; without, it fails if any program is attached in
// that mode (XDP_FLAGS_UPDATE_IF_NOEXIST).
bool attachXdp(const XdpAttachment& where, int progFd, XdpMode mode, const XdpProgram* replace,
               std::string& error);

// Detaches exactly `program` from the interface (in the mode it runs in).
bool detachXdp(const XdpAttachment& where, const XdpProgram& program, std::string& error);

// Live processes that hold a descriptor of the program or of one of its maps
// (from /proc/PID/fdinfo), other than this one. A program attached by a
// process that since died is held by nobody but the interface.
struct BpfHolder {
  pid_t pid = 0;
  std::string command;  // /proc/PID/comm
};
[[nodiscard]] std::vector<BpfHolder> processesHolding(const XdpProgram& program);

}  // namespace spillway
