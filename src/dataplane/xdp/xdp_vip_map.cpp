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
#include "xdp_attach.hpp"

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
    error = std::string("cannot iterate " SPILLWAY_REDIRECT_MAP_VIPS ": ") + bpfErrorText(errno);
    return false;
  }
  return true;
}

// The layout of `fd` (a map of XDP program `id` named vip_map) against the
// ABI header.
bool vipMapLayoutOk(int fd, const XdpProgram& program, std::string& error) {
  bpf_map_info info{};
  std::uint32_t length = sizeof(info);
  if (bpf_obj_get_info_by_fd(fd, &info, &length) != 0) {
    error = std::string("cannot read " SPILLWAY_REDIRECT_MAP_VIPS ": ") + bpfErrorText(errno);
    return false;
  }
  if (info.type != BPF_MAP_TYPE_HASH || info.key_size != sizeof(RedirectVipKey) ||
      info.value_size != sizeof(std::uint32_t)) {
    error = "XDP program id " + std::to_string(program.id) +
            " has a " SPILLWAY_REDIRECT_MAP_VIPS " of another layout (key " +
            std::to_string(info.key_size) + " bytes, value " + std::to_string(info.value_size) +
            " bytes): not this build's spillway_redirect.bpf.o";
    return false;
  }
  return true;
}

// The counters map, when its layout is this build's; invalid otherwise.
UniqueFd countersMap(const XdpProgram& program) {
  UniqueFd fd = openProgramMap(program, SPILLWAY_REDIRECT_MAP_COUNTERS);
  bpf_map_info info{};
  std::uint32_t length = sizeof(info);
  if (!fd.valid() || bpf_obj_get_info_by_fd(fd.get(), &info, &length) != 0 ||
      info.type != BPF_MAP_TYPE_PERCPU_ARRAY || info.value_size != sizeof(RedirectCounterValue) ||
      info.max_entries < kRedirectCounterCount) {
    return UniqueFd();
  }
  return fd;
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
  const auto attachment = queryXdp(ifname, error);
  if (!attachment) return std::nullopt;
  if (attachment->programs.empty()) {
    error = "no XDP program is attached to " + ifname +
            " (is the net_af_xdp port started with xdp_prog=" + std::string(kObjectFileName) + "?)";
    return std::nullopt;
  }
  for (const XdpProgram& program : attachment->programs) {
    UniqueFd vip = openProgramMap(program, SPILLWAY_REDIRECT_MAP_VIPS);
    if (!vip.valid()) continue;
    if (!vipMapLayoutOk(vip.get(), program, error)) return std::nullopt;
    UniqueFd counters = countersMap(program);
    return XdpVipMap(ifname, program.id, vip.release(), counters.release());
  }
  error = "the XDP program on " + ifname + " " + attachment->programs.front().describe() +
          " has no map named " SPILLWAY_REDIRECT_MAP_VIPS
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
    error = std::string("cannot read " SPILLWAY_REDIRECT_MAP_VIPS ": ") + bpfErrorText(errno);
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
                bpfErrorText(errno);
        return false;
      }
    }
    return true;
  };
  auto remove = [&]() {
    for (const RedirectVipKey& key : stale) {
      if (bpf_map_delete_elem(vipFd_, &key) != 0 && errno != ENOENT) {
        error = "cannot delete " + formatKey(fromWire(key)) +
                " from " SPILLWAY_REDIRECT_MAP_VIPS ": " + bpfErrorText(errno);
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
    error = "cannot count the CPUs: " + bpfErrorText(cpus);
    return std::nullopt;
  }
  std::array<RedirectCounterValue, kRedirectCounterCount> sums{};
  std::vector<RedirectCounterValue> perCpu(static_cast<std::size_t>(cpus));
  for (std::uint32_t index = 0; index < kRedirectCounterCount; ++index) {
    if (bpf_map_lookup_elem(countersFd_, &index, perCpu.data()) != 0) {
      error = "cannot read counter " + std::to_string(index) + " of " +
              SPILLWAY_REDIRECT_MAP_COUNTERS + ": " + bpfErrorText(errno);
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
