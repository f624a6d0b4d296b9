// Takes over an AF_XDP port from a dead spillwayd. See stale_redirect.hpp.
#include "stale_redirect.hpp"

#include "bpf/spillway_redirect_abi.h"
#include "xdp_attach.hpp"

namespace spillway {
namespace {

bool isSpillwayRedirect(const XdpProgram& program) {
  return program.name == SPILLWAY_REDIRECT_PROG_NAME &&
         program.hasMap(SPILLWAY_REDIRECT_MAP_XSKS) && program.hasMap(SPILLWAY_REDIRECT_MAP_VIPS);
}

std::string removalHint(const std::string& ifname, const XdpProgram& program) {
  const char* off = program.mode == XdpMode::Generic   ? "xdpgeneric off"
                    : program.mode == XdpMode::Offload ? "xdpoffload off"
                                                       : "xdpdrv off";
  std::string hint = "remove it with `ip link set dev " + ifname + " " + off + "`";
  if (program.name == "spillway_decap") {
    hint += " or `spillway-decap detach --dev " + ifname + "`";
  }
  return hint;
}

}  // namespace

std::optional<std::string> takeOverStaleRedirect(
    const std::string& ifname, const std::function<void(const std::string&)>& log) {
  if (ifname.empty()) return std::nullopt;
  std::string error;
  const auto attachment = queryXdp(ifname, error);
  if (!attachment) return "AF_XDP interface: " + error;

  // Decide on every program first, so a refusal leaves the interface as it is.
  for (const XdpProgram& program : attachment->programs) {
    if (!isSpillwayRedirect(program) || program.mode == XdpMode::Offload) {
      return ifname + " already runs XDP program " + program.describe() +
             ", which is not Spillway's AF_XDP redirect program (" SPILLWAY_REDIRECT_PROG_NAME
             "); spillwayd does not replace someone else's program: " +
             removalHint(ifname, program) + ", then start spillwayd again";
    }
    const auto holders = processesHolding(program);
    if (!holders.empty()) {
      std::string who;
      for (const BpfHolder& holder : holders) {
        who += (who.empty() ? "" : ", ") + std::string("pid ") + std::to_string(holder.pid) + " (" +
               holder.command + ")";
      }
      return ifname + " runs Spillway's AF_XDP redirect program " + program.describe() +
             " for a live process: " + who +
             "; another spillwayd (or DPDK application) uses this interface; stop it first";
    }
  }
  for (const XdpProgram& program : attachment->programs) {
    if (!detachXdp(*attachment, program, error)) return error;
    if (log) {
      log("AF_XDP on " + ifname + ": detached the stale redirect program " + program.describe() +
          " that a spillwayd no longer running left attached");
    }
  }
  return std::nullopt;
}

}  // namespace spillway
