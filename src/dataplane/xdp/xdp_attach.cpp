// XDP attachment by interface through libbpf netlink. See xdp_attach.hpp.
#include "xdp_attach.hpp"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/if_link.h>
#include <net/if.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <fstream>

#include "spillway/errno_text.hpp"

namespace spillway {
namespace {

std::uint32_t modeFlag(XdpMode mode) noexcept {
  switch (mode) {
    case XdpMode::Native:
      return XDP_FLAGS_DRV_MODE;
    case XdpMode::Generic:
      return XDP_FLAGS_SKB_MODE;
    case XdpMode::Offload:
      return XDP_FLAGS_HW_MODE;
    case XdpMode::Auto:
      break;
  }
  return 0;
}

// The number after `key` ("prog_id:") on its line of an fdinfo text.
std::optional<std::uint32_t> fdinfoField(const std::string& text, std::string_view key) {
  const auto at = text.find(key);
  if (at == std::string::npos) return std::nullopt;
  std::size_t begin = at + key.size();
  while (begin < text.size() && (text[begin] == ' ' || text[begin] == '\t')) ++begin;
  std::uint32_t value = 0;
  const auto [end, ec] = std::from_chars(text.data() + begin, text.data() + text.size(), value);
  if (ec != std::errc()) return std::nullopt;
  return value;
}

}  // namespace

std::string bpfErrorText(int err) {
  if (err < 0) err = -err;
  std::array<char, 128> buffer{};
  libbpf_strerror(err, buffer.data(), buffer.size());
  std::string text = buffer.data();
  if (err == EPERM) text += " (needs root: CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN)";
  return text;
}

const char* xdpModeName(XdpMode mode) noexcept {
  switch (mode) {
    case XdpMode::Auto:
      return "auto";
    case XdpMode::Native:
      return "native";
    case XdpMode::Generic:
      return "generic";
    case XdpMode::Offload:
      return "offload";
  }
  return "?";
}

bool XdpProgram::hasMap(std::string_view mapName) const {
  return std::find(mapNames.begin(), mapNames.end(), mapName) != mapNames.end();
}

std::string XdpProgram::describe() const {
  return "'" + name + "' (id " + std::to_string(id) + ", " + xdpModeName(mode) + " mode)";
}

std::optional<int> interfaceIndex(const std::string& ifname, std::string& error) {
  if (ifname.empty() || ifname.size() >= IF_NAMESIZE || ifname.find('/') != std::string::npos) {
    error = "'" + ifname + "' is not an interface name";
    return std::nullopt;
  }
  const unsigned index = if_nametoindex(ifname.c_str());
  if (index == 0) {
    error = "interface '" + ifname + "' does not exist in this network namespace (" +
            errnoText(errno) + ")";
    return std::nullopt;
  }
  return static_cast<int>(index);
}

std::optional<XdpProgram> xdpProgramInfo(std::uint32_t id, std::string& error) {
  UniqueFd prog(bpf_prog_get_fd_by_id(id));
  if (!prog.valid()) {
    error = "cannot open XDP program id " + std::to_string(id) + ": " + bpfErrorText(errno);
    return std::nullopt;
  }
  bpf_prog_info info{};
  std::uint32_t length = sizeof(info);
  if (bpf_obj_get_info_by_fd(prog.get(), &info, &length) != 0) {
    error = "cannot read XDP program id " + std::to_string(id) + ": " + bpfErrorText(errno);
    return std::nullopt;
  }
  XdpProgram program;
  program.id = id;
  program.name = info.name;
  program.mapIds.resize(info.nr_map_ids);
  if (!program.mapIds.empty()) {
    bpf_prog_info withMaps{};
    withMaps.nr_map_ids = static_cast<std::uint32_t>(program.mapIds.size());
    withMaps.map_ids = reinterpret_cast<std::uintptr_t>(program.mapIds.data());
    length = sizeof(withMaps);
    if (bpf_obj_get_info_by_fd(prog.get(), &withMaps, &length) != 0) {
      error = "cannot read the maps of XDP program id " + std::to_string(id) + ": " +
              bpfErrorText(errno);
      return std::nullopt;
    }
    program.mapIds.resize(std::min<std::size_t>(program.mapIds.size(), withMaps.nr_map_ids));
  }
  for (const std::uint32_t mapId : program.mapIds) {
    std::string mapName;
    UniqueFd map(bpf_map_get_fd_by_id(mapId));
    bpf_map_info mapInfo{};
    std::uint32_t mapLength = sizeof(mapInfo);
    if (map.valid() && bpf_obj_get_info_by_fd(map.get(), &mapInfo, &mapLength) == 0) {
      mapName = mapInfo.name;
    }
    program.mapNames.push_back(std::move(mapName));
  }
  return program;
}

std::optional<XdpAttachment> queryXdp(const std::string& ifname, std::string& error) {
  const auto ifindex = interfaceIndex(ifname, error);
  if (!ifindex) return std::nullopt;
  bpf_xdp_query_opts query{};
  query.sz = sizeof(query);
  if (const int err = bpf_xdp_query(*ifindex, 0, &query); err != 0) {
    error = "cannot query XDP on " + ifname + ": " + bpfErrorText(err);
    return std::nullopt;
  }
  XdpAttachment attachment{ifname, *ifindex, {}};
  for (const auto& [id, mode] : {std::pair{query.drv_prog_id, XdpMode::Native},
                                 std::pair{query.skb_prog_id, XdpMode::Generic},
                                 std::pair{query.hw_prog_id, XdpMode::Offload}}) {
    if (id == 0) continue;
    auto program = xdpProgramInfo(id, error);
    if (!program) return std::nullopt;
    program->mode = mode;
    attachment.programs.push_back(std::move(*program));
  }
  return attachment;
}

UniqueFd openProgramMap(const XdpProgram& program, std::string_view mapName) {
  for (std::size_t i = 0; i < program.mapIds.size(); ++i) {
    if (program.mapNames[i] != mapName) continue;
    UniqueFd fd(bpf_map_get_fd_by_id(program.mapIds[i]));
    bpf_map_info info{};
    std::uint32_t length = sizeof(info);
    // Ids are not reused while a map lives; the name check catches a map
    // that vanished and a new one that took its id.
    if (fd.valid() && bpf_obj_get_info_by_fd(fd.get(), &info, &length) == 0 &&
        mapName == info.name) {
      return fd;
    }
  }
  return UniqueFd();
}

bool attachXdp(const XdpAttachment& where, int progFd, XdpMode mode, const XdpProgram* replace,
               std::string& error) {
  bpf_xdp_attach_opts opts{};
  opts.sz = sizeof(opts);
  std::uint32_t flags = modeFlag(mode);
  UniqueFd old;
  if (replace != nullptr) {
    old = UniqueFd(bpf_prog_get_fd_by_id(replace->id));
    if (!old.valid()) {
      error = "cannot open the XDP program to replace, id " + std::to_string(replace->id) + ": " +
              bpfErrorText(errno);
      return false;
    }
    opts.old_prog_fd = old.get();  // libbpf adds XDP_FLAGS_REPLACE
  } else {
    flags |= XDP_FLAGS_UPDATE_IF_NOEXIST;
  }
  if (const int err = bpf_xdp_attach(where.ifindex, progFd, flags, &opts); err != 0) {
    std::string hint;
    if (err == -EOPNOTSUPP || (err == -EINVAL && mode == XdpMode::Native)) {
      hint = " (does the driver of " + where.ifname + " support native XDP? try generic mode)";
    } else if (err == -EBUSY || err == -EEXIST) {
      hint =
          " (another XDP program is attached; it was attached meanwhile or runs in the other "
          "mode)";
    } else if (err == -ERANGE) {
      hint = " (MTU too large for native XDP on this device)";
    }
    error = "cannot attach to " + where.ifname + " in " + xdpModeName(mode) + " mode" + hint +
            ": " + bpfErrorText(err);
    return false;
  }
  return true;
}

bool detachXdp(const XdpAttachment& where, const XdpProgram& program, std::string& error) {
  UniqueFd old(bpf_prog_get_fd_by_id(program.id));
  if (!old.valid()) {
    if (errno == ENOENT) return true;  // gone already
    error = "cannot open XDP program " + program.describe() + " on " + where.ifname + ": " +
            bpfErrorText(errno);
    return false;
  }
  bpf_xdp_attach_opts opts{};
  opts.sz = sizeof(opts);
  opts.old_prog_fd = old.get();
  if (const int err = bpf_xdp_detach(where.ifindex, modeFlag(program.mode), &opts); err != 0) {
    error = "cannot detach XDP program " + program.describe() + " from " + where.ifname + ": " +
            bpfErrorText(err);
    return false;
  }
  return true;
}

std::vector<BpfHolder> processesHolding(const XdpProgram& program) {
  namespace fs = std::filesystem;
  std::vector<BpfHolder> holders;
  const std::string self = std::to_string(getpid());
  std::error_code ec;
  for (const auto& process : fs::directory_iterator("/proc", ec)) {
    const std::string pid = process.path().filename().string();
    if (pid.empty() || pid == self ||
        !std::all_of(pid.begin(), pid.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    bool holds = false;
    std::error_code fdEc;
    for (const auto& fd : fs::directory_iterator(process.path() / "fd", fdEc)) {
      std::error_code linkEc;
      const std::string target = fs::read_symlink(fd.path(), linkEc).string();
      const bool isProg = target == "anon_inode:bpf-prog";
      const bool isMap = target == "anon_inode:bpf-map";
      if (linkEc || (!isProg && !isMap)) continue;
      std::ifstream in(process.path() / "fdinfo" / fd.path().filename());
      const std::string text((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
      const auto id = fdinfoField(text, isProg ? "prog_id:" : "map_id:");
      if (!id) continue;
      holds = isProg ? *id == program.id
                     : std::find(program.mapIds.begin(), program.mapIds.end(), *id) !=
                           program.mapIds.end();
      if (holds) break;
    }
    if (!holds) continue;
    std::ifstream comm(process.path() / "comm");
    std::string command;
    std::getline(comm, command);
    holders.push_back(BpfHolder{static_cast<pid_t>(std::stoi(pid)), command});
  }
  return holders;
}

}  // namespace spillway
