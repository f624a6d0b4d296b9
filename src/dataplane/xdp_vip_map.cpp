// XdpVipMap: finds the AF_XDP-mode program's maps through the interface and
// keeps vip_map equal to spillwayd's VIP set. See xdp_vip_map.hpp.
#include "xdp_vip_map.hpp"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <net/if.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <string_view>
#include <utility>

#include "bpf/spillway_redirect_abi.h"

#ifndef SPILLWAY_REDIRECT_BUILD_OBJECT
#define SPILLWAY_REDIRECT_BUILD_OBJECT ""
#endif
#ifndef SPILLWAY_REDIRECT_INSTALL_OBJECT
#define SPILLWAY_REDIRECT_INSTALL_OBJECT ""
#endif

namespace spillway {
namespace {

constexpr std::string_view kObjectFileName = "spillway_redirect.bpf.o";
constexpr const char* kObjectEnv = "SPILLWAY_REDIRECT_BPF_OBJECT";
constexpr std::uint8_t kProtoTcp = 6;
constexpr std::uint8_t kProtoUdp = 17;

std::string errnoText(int err) {
  if (err < 0) err = -err;
  std::array<char, 128> buffer{};
  libbpf_strerror(err, buffer.data(), buffer.size());
  std::string text = buffer.data();
  if (err == EPERM) text += " (needs root: CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN)";
  return text;
}

// Closes the descriptor it holds unless released.
class FdGuard {
 public:
  explicit FdGuard(int fd) noexcept : fd_(fd) {}
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  ~FdGuard() {
    if (fd_ >= 0) close(fd_);
  }
  [[nodiscard]] int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }
  void reset(int fd) noexcept {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// Keys compare bytewise (the layout has no padding); named, not operators,
// since RedirectVipKey lives in the global namespace of the C header.
bool keyLess(const RedirectVipKey& a, const RedirectVipKey& b) noexcept {
  return std::memcmp(&a, &b, sizeof(a)) < 0;
}
bool keyEqual(const RedirectVipKey& a, const RedirectVipKey& b) noexcept {
  return std::memcmp(&a, &b, sizeof(a)) == 0;
}

std::string formatAddress(const std::uint8_t* addr, int family) {
  std::array<char, INET6_ADDRSTRLEN> text{};
  if (inet_ntop(family, addr, text.data(), text.size()) == nullptr) return "?";
  return text.data();
}

std::string formatKey(const XdpVipKey& key) {
  const bool v4 = key.version == IpVersion::V4;
  std::string text = formatAddress(reinterpret_cast<const std::uint8_t*>(key.address.data()),
                                   v4 ? AF_INET : AF_INET6);
  if (key.proto == 0 && key.port == 0) return text + " (address marker)";
  text += key.proto == kProtoTcp   ? " tcp"
          : key.proto == kProtoUdp ? " udp"
                                   : " proto " + std::to_string(key.proto);
  return text + (key.port == 0 ? " (every port)" : " port " + std::to_string(key.port));
}

std::optional<RedirectVipKey> toWire(const XdpVipKey& key, std::string& error) {
  RedirectVipKey wire{};
  if (key.version == IpVersion::V4) {
    wire.family = kRedirectFamilyIpv4;
    std::memcpy(wire.addr, key.address.data(), 4);
  } else if (key.version == IpVersion::V6) {
    wire.family = kRedirectFamilyIpv6;
    std::memcpy(wire.addr, key.address.data(), 16);
  } else {
    error = "VIP key with IP version " + std::to_string(static_cast<int>(key.version)) +
            " (neither 4 nor 6)";
    return std::nullopt;
  }
  if (key.proto == 0 && key.port != 0) {
    error = "VIP key " + formatKey(key) + ": a port needs a protocol (proto 0 is 'any')";
    return std::nullopt;
  }
  if (key.port != 0 && key.proto != kProtoTcp && key.proto != kProtoUdp) {
    error = "VIP key " + formatKey(key) + ": ports exist only for TCP (6) and UDP (17)";
    return std::nullopt;
  }
  wire.proto = key.proto;
  wire.port = htons(key.port);
  return wire;
}

XdpVipKey fromWire(const RedirectVipKey& wire) {
  XdpVipKey key;
  key.version = wire.family == kRedirectFamilyIpv4 ? IpVersion::V4 : IpVersion::V6;
  std::memcpy(key.address.data(), wire.addr, key.version == IpVersion::V4 ? 4 : 16);
  key.proto = wire.proto;
  key.port = ntohs(wire.port);
  return key;
}

bool readKeys(int fd, std::vector<RedirectVipKey>& out, std::string& error) {
  out.clear();
  RedirectVipKey current{};
  RedirectVipKey next{};
  const void* previous = nullptr;
  while (bpf_map_get_next_key(fd, previous, &next) == 0) {
    out.push_back(next);
    current = next;
    previous = &current;
  }
  if (errno != ENOENT) {
    error = std::string("cannot iterate " SPILLWAY_REDIRECT_MAP_VIPS ": ") + errnoText(errno);
    return false;
  }
  return true;
}

// The ids of the programs attached to the device, any mode, without repeats.
std::optional<std::vector<std::uint32_t>> attachedPrograms(int ifindex, const std::string& ifname,
                                                           std::string& error) {
  bpf_xdp_query_opts query{};
  query.sz = sizeof(query);
  if (const int err = bpf_xdp_query(ifindex, 0, &query); err != 0) {
    error = "cannot query XDP on " + ifname + ": " + errnoText(err);
    return std::nullopt;
  }
  std::vector<std::uint32_t> ids;
  for (const std::uint32_t id :
       {query.prog_id, query.drv_prog_id, query.skb_prog_id, query.hw_prog_id}) {
    if (id != 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

struct FoundMaps {
  int vipFd = -1;
  int countersFd = -1;
};

// Opens the maps of program `id` named vip_map and redir_counters, checking
// their layouts against the ABI header. vipFd stays -1 when the program has
// no vip_map (someone else's program).
bool findMaps(std::uint32_t id, FoundMaps& found, std::string& error) {
  FdGuard prog(bpf_prog_get_fd_by_id(id));
  if (prog.get() < 0) {
    error = "cannot open XDP program id " + std::to_string(id) + ": " + errnoText(errno);
    return false;
  }
  bpf_prog_info info{};
  std::uint32_t length = sizeof(info);
  if (bpf_obj_get_info_by_fd(prog.get(), &info, &length) != 0) {
    error = "cannot read XDP program id " + std::to_string(id) + ": " + errnoText(errno);
    return false;
  }
  std::vector<std::uint32_t> mapIds(info.nr_map_ids);
  if (!mapIds.empty()) {
    bpf_prog_info withMaps{};
    withMaps.nr_map_ids = static_cast<std::uint32_t>(mapIds.size());
    withMaps.map_ids = reinterpret_cast<std::uintptr_t>(mapIds.data());
    length = sizeof(withMaps);
    if (bpf_obj_get_info_by_fd(prog.get(), &withMaps, &length) != 0) {
      error =
          "cannot read the maps of XDP program id " + std::to_string(id) + ": " + errnoText(errno);
      return false;
    }
    mapIds.resize(std::min<std::size_t>(mapIds.size(), withMaps.nr_map_ids));
  }
  FdGuard vip(-1);
  FdGuard counters(-1);
  for (const std::uint32_t mapId : mapIds) {
    FdGuard map(bpf_map_get_fd_by_id(mapId));
    if (map.get() < 0) continue;
    bpf_map_info mapInfo{};
    std::uint32_t mapLength = sizeof(mapInfo);
    if (bpf_obj_get_info_by_fd(map.get(), &mapInfo, &mapLength) != 0) continue;
    const std::string_view name = mapInfo.name;
    if (name == SPILLWAY_REDIRECT_MAP_VIPS) {
      if (mapInfo.type != BPF_MAP_TYPE_HASH || mapInfo.key_size != sizeof(RedirectVipKey) ||
          mapInfo.value_size != sizeof(std::uint32_t)) {
        error = "XDP program id " + std::to_string(id) +
                " has a " SPILLWAY_REDIRECT_MAP_VIPS " of another layout (key " +
                std::to_string(mapInfo.key_size) + " bytes, value " +
                std::to_string(mapInfo.value_size) +
                " bytes): not this build's spillway_redirect.bpf.o";
        return false;
      }
      vip.reset(map.release());
    } else if (name == SPILLWAY_REDIRECT_MAP_COUNTERS) {
      if (mapInfo.type == BPF_MAP_TYPE_PERCPU_ARRAY &&
          mapInfo.value_size == sizeof(RedirectCounterValue) &&
          mapInfo.max_entries >= kRedirectCounterCount) {
        counters.reset(map.release());
      }
    }
  }
  found.vipFd = vip.release();
  found.countersFd = counters.release();
  return true;
}

}  // namespace

XdpVipMap::XdpVipMap(std::string ifname, std::uint32_t programId, int vipFd,
                     int countersFd) noexcept
    : ifname_(std::move(ifname)), programId_(programId), vipFd_(vipFd), countersFd_(countersFd) {}

XdpVipMap::XdpVipMap(XdpVipMap&& other) noexcept
    : ifname_(std::move(other.ifname_)),
      programId_(std::exchange(other.programId_, 0)),
      vipFd_(std::exchange(other.vipFd_, -1)),
      countersFd_(std::exchange(other.countersFd_, -1)) {}

XdpVipMap& XdpVipMap::operator=(XdpVipMap&& other) noexcept {
  if (this != &other) {
    closeAll();
    ifname_ = std::move(other.ifname_);
    programId_ = std::exchange(other.programId_, 0);
    vipFd_ = std::exchange(other.vipFd_, -1);
    countersFd_ = std::exchange(other.countersFd_, -1);
  }
  return *this;
}

XdpVipMap::~XdpVipMap() {
  closeAll();
}

void XdpVipMap::closeAll() noexcept {
  if (vipFd_ >= 0) close(vipFd_);
  if (countersFd_ >= 0) close(countersFd_);
  vipFd_ = -1;
  countersFd_ = -1;
}

std::optional<XdpVipMap> XdpVipMap::open(const std::string& ifname, std::string& error) {
  const unsigned ifindex = if_nametoindex(ifname.c_str());
  if (ifindex == 0) {
    error = "interface '" + ifname + "' does not exist in this network namespace";
    return std::nullopt;
  }
  const auto ids = attachedPrograms(static_cast<int>(ifindex), ifname, error);
  if (!ids) return std::nullopt;
  if (ids->empty()) {
    error = "no XDP program is attached to " + ifname +
            " (is the net_af_xdp port started with xdp_prog=" + std::string(kObjectFileName) + "?)";
    return std::nullopt;
  }
  for (const std::uint32_t id : *ids) {
    FoundMaps maps;
    if (!findMaps(id, maps, error)) return std::nullopt;
    if (maps.vipFd >= 0) return XdpVipMap(ifname, id, maps.vipFd, maps.countersFd);
    if (maps.countersFd >= 0) close(maps.countersFd);
  }
  error = "the XDP program on " + ifname + " (id " + std::to_string(ids->front()) +
          ") has no map named " SPILLWAY_REDIRECT_MAP_VIPS
          ": it is not spillway_redirect.bpf.o (check the port's xdp_prog devarg)";
  return std::nullopt;
}

bool XdpVipMap::sync(const std::vector<XdpVipKey>& vips, std::string& error) {
  if (vipFd_ < 0) {
    error = "XdpVipMap is not open";
    return false;
  }
  std::vector<RedirectVipKey> wanted;
  wanted.reserve(vips.size());
  for (const XdpVipKey& key : vips) {
    const auto wire = toWire(key, error);
    if (!wire) return false;
    wanted.push_back(*wire);
  }
  std::sort(wanted.begin(), wanted.end(), keyLess);
  wanted.erase(std::unique(wanted.begin(), wanted.end(), keyEqual), wanted.end());

  bpf_map_info info{};
  std::uint32_t length = sizeof(info);
  if (bpf_obj_get_info_by_fd(vipFd_, &info, &length) != 0) {
    error = std::string("cannot read " SPILLWAY_REDIRECT_MAP_VIPS ": ") + errnoText(errno);
    return false;
  }
  if (wanted.size() > info.max_entries) {
    error = std::to_string(wanted.size()) +
            " VIP keys, but " SPILLWAY_REDIRECT_MAP_VIPS " holds at most " +
            std::to_string(info.max_entries);
    return false;
  }

  std::vector<RedirectVipKey> present;
  if (!readKeys(vipFd_, present, error)) return false;
  std::sort(present.begin(), present.end(), keyLess);
  std::vector<RedirectVipKey> missing;
  std::vector<RedirectVipKey> stale;
  std::set_difference(wanted.begin(), wanted.end(), present.begin(), present.end(),
                      std::back_inserter(missing), keyLess);
  std::set_difference(present.begin(), present.end(), wanted.begin(), wanted.end(),
                      std::back_inserter(stale), keyLess);

  auto add = [&]() {
    const std::uint32_t flags = kRedirectVipNone;
    for (const RedirectVipKey& key : missing) {
      if (bpf_map_update_elem(vipFd_, &key, &flags, BPF_ANY) != 0) {
        error = "cannot add " + formatKey(fromWire(key)) + " to " SPILLWAY_REDIRECT_MAP_VIPS ": " +
                errnoText(errno);
        return false;
      }
    }
    return true;
  };
  auto remove = [&]() {
    for (const RedirectVipKey& key : stale) {
      if (bpf_map_delete_elem(vipFd_, &key) != 0 && errno != ENOENT) {
        error = "cannot delete " + formatKey(fromWire(key)) +
                " from " SPILLWAY_REDIRECT_MAP_VIPS ": " + errnoText(errno);
        return false;
      }
    }
    return true;
  };
  // Add before delete, unless both sets together would not fit.
  if (present.size() + missing.size() <= info.max_entries) return add() && remove();
  return remove() && add();
}

std::optional<std::vector<XdpVipKey>> XdpVipMap::keys(std::string& error) const {
  if (vipFd_ < 0) {
    error = "XdpVipMap is not open";
    return std::nullopt;
  }
  std::vector<RedirectVipKey> wire;
  if (!readKeys(vipFd_, wire, error)) return std::nullopt;
  std::vector<XdpVipKey> out;
  out.reserve(wire.size());
  for (const RedirectVipKey& key : wire) out.push_back(fromWire(key));
  return out;
}

std::optional<XdpRedirectCounters> XdpVipMap::counters(std::string& error) const {
  if (countersFd_ < 0) {
    error = "the XDP program on " + ifname_ + " has no " SPILLWAY_REDIRECT_MAP_COUNTERS " map";
    return std::nullopt;
  }
  const int cpus = libbpf_num_possible_cpus();
  if (cpus <= 0) {
    error = "cannot count the CPUs: " + errnoText(cpus);
    return std::nullopt;
  }
  std::array<RedirectCounterValue, kRedirectCounterCount> sums{};
  std::vector<RedirectCounterValue> perCpu(static_cast<std::size_t>(cpus));
  for (std::uint32_t index = 0; index < kRedirectCounterCount; ++index) {
    if (bpf_map_lookup_elem(countersFd_, &index, perCpu.data()) != 0) {
      error = "cannot read counter " + std::to_string(index) + " of " +
              SPILLWAY_REDIRECT_MAP_COUNTERS + ": " + errnoText(errno);
      return std::nullopt;
    }
    for (const RedirectCounterValue& value : perCpu) {
      sums[index].packets += value.packets;
      sums[index].bytes += value.bytes;
    }
  }
  XdpRedirectCounters out;
  out.redirected = sums[kRedirectVip].packets;
  out.redirectedBytes = sums[kRedirectVip].bytes;
  out.passedNoSocket = sums[kRedirectPassNoSocket].packets;
  out.passedNotVip = sums[kRedirectPassNotVip].packets;
  out.passedNonIp = sums[kRedirectPassNonIp].packets;
  out.passedMalformed = sums[kRedirectPassMalformed].packets;
  for (const auto index :
       {kRedirectPassNoSocket, kRedirectPassNotVip, kRedirectPassNonIp, kRedirectPassMalformed}) {
    out.passedBytes += sums[index].bytes;
  }
  return out;
}

std::string redirectProgramPath(std::string* tried) {
  namespace fs = std::filesystem;
  std::vector<std::string> candidates;
  if (const char* env = std::getenv(kObjectEnv); env != nullptr && *env != '\0') {
    candidates.emplace_back(env);  // when set, only this one
  } else {
    std::error_code ec;
    const fs::path self = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) candidates.push_back((self.parent_path() / kObjectFileName).string());
    candidates.emplace_back(SPILLWAY_REDIRECT_INSTALL_OBJECT);
    candidates.emplace_back(SPILLWAY_REDIRECT_BUILD_OBJECT);
  }
  std::string list;
  for (const std::string& candidate : candidates) {
    if (candidate.empty()) continue;
    std::error_code ec;
    if (fs::is_regular_file(candidate, ec)) return candidate;
    list += (list.empty() ? "" : " ") + candidate;
  }
  if (tried != nullptr) *tried = list;
  return {};
}

}  // namespace spillway
