// spillway-decap: the loader of the backend's XDP decapsulation program
// (bpf/spillway_decap.bpf.c), for backends whose kernel lacks ipip / ip6tnl /
// fou, or that want decapsulation before the stack at all.
//
//   spillway-decap attach --dev IF --address A [--address B ...]
//                         [--gue-port 6080] [--mode native|generic]
//                         [--bpf-object PATH] [--pin-root DIR] [--force]
//   spillway-decap detach --dev IF [--pin-root DIR] [--force]
//   spillway-decap stats  --dev IF [--json] [--pin-root DIR]
//
// attach loads the object, fills decap_config and decap_addrs, and attaches
// the program through netlink (like `ip link set xdp`), so it stays attached
// after the loader exits and without any pin. An earlier spillway-decap on
// the device is replaced atomically (XDP_FLAGS_REPLACE) when in the same
// mode; a foreign XDP program is replaced only with --force. The program and
// its maps are also pinned under /sys/fs/bpf/spillway-decap/<IF>/ (bpffs is
// mounted there when it is not) for bpftool and monitoring.
// stats and detach find the program attached to the device through netlink
// and its maps by id, so they work even where the pins are not visible (for
// example under `ip netns exec`, which remounts /sys).
//
// Start-up tool, single-threaded; errors are exceptions caught in main(),
// printed as one line, exit status 1 (2 for usage errors).
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/if_link.h>
#include <linux/magic.h>
#include <net/if.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "spillway_decap_abi.h"

#ifndef SPILLWAY_DECAP_BUILD_OBJECT
#define SPILLWAY_DECAP_BUILD_OBJECT ""
#endif
#ifndef SPILLWAY_DECAP_INSTALL_OBJECT
#define SPILLWAY_DECAP_INSTALL_OBJECT ""
#endif

namespace spillway {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kObjectFileName = "spillway_decap.bpf.o";
constexpr std::string_view kObjectEnv = "SPILLWAY_DECAP_BPF_OBJECT";
constexpr std::string_view kBpffsMount = "/sys/fs/bpf";
constexpr std::string_view kDefaultPinRoot = "/sys/fs/bpf/spillway-decap";
constexpr std::string_view kPinProgram = "prog";
constexpr std::uint16_t kDefaultGuePort = 6080;

// Names of the counters, in DecapCounter order (spillway_decap_abi.h).
// clang-format off
constexpr std::array<std::string_view, kDecapCounterCount> kCounterNames = {
    "decap_ip4in4",     "decap_ip6in4",     "decap_ip4in6",     "decap_ip6in6",
    "decap_gue_ip4in4", "decap_gue_ip6in4", "decap_gue_ip4in6", "decap_gue_ip6in6",
    "pass_non_ip",      "pass_not_local",   "pass_not_tunnel",  "malformed",
    "fragment",         "error",
};
// clang-format on
constexpr std::uint32_t kFirstPassCounter = kDecapPassNonIp;

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string errnoText(int err) {
  std::array<char, 128> buffer{};
  libbpf_strerror(err, buffer.data(), buffer.size());
  return buffer.data();
}

[[noreturn]] void fail(const std::string& what, int err) {
  throw std::runtime_error(what + ": " + errnoText(err < 0 ? -err : err));
}

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~Fd() { reset(); }

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }

 private:
  void reset() noexcept {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
};

struct BpfObjectCloser {
  void operator()(bpf_object* object) const noexcept { bpf_object__close(object); }
};
using BpfObjectPtr = std::unique_ptr<bpf_object, BpfObjectCloser>;

// ---- command line ----------------------------------------------------------

enum class XdpMode { Native, Generic };

struct Options {
  std::string command;
  std::string device;
  std::vector<std::string> addresses;
  std::uint16_t guePort = kDefaultGuePort;
  XdpMode mode = XdpMode::Native;
  std::string bpfObject;
  std::string pinRoot{kDefaultPinRoot};
  bool force = false;
  bool json = false;
  bool verbose = false;
};

constexpr std::string_view kUsage =
    "usage:\n"
    "  spillway-decap attach --dev IF --address ADDR [--address ADDR ...]\n"
    "                        [--gue-port PORT] [--mode native|generic]\n"
    "                        [--bpf-object PATH] [--pin-root DIR] [--force] [--verbose]\n"
    "  spillway-decap detach --dev IF [--pin-root DIR] [--force]\n"
    "  spillway-decap stats  --dev IF [--json] [--pin-root DIR]\n"
    "\n"
    "Decapsulates IPIP, IPv6-in-IPv4, IPv4/IPv6-in-IPv6 and GUE (variant 0, UDP port\n"
    "--gue-port, default 6080) sent to one of the --address values, and passes the\n"
    "inner packet to the kernel. The BPF object is taken from --bpf-object, then\n"
    "$SPILLWAY_DECAP_BPF_OBJECT, then next to this binary, then the install and\n"
    "build paths compiled in.\n";

std::uint16_t parsePort(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long value = std::strtoul(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value == 0 || value > 65535) {
    throw UsageError("--gue-port: '" + text + "' is not a UDP port (1..65535)");
  }
  return static_cast<std::uint16_t>(value);
}

Options parseOptions(int argc, char** argv) {
  Options options;
  if (argc < 2) throw UsageError("missing command");
  options.command = argv[1];
  if (options.command == "-h" || options.command == "--help" || options.command == "help") {
    options.command = "help";
    return options;
  }
  if (options.command != "attach" && options.command != "detach" && options.command != "stats") {
    throw UsageError("unknown command '" + options.command + "'");
  }
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    std::optional<std::string> inlineValue;
    if (const auto eq = arg.find('='); arg.starts_with("--") && eq != std::string::npos) {
      inlineValue = arg.substr(eq + 1);
      arg.resize(eq);
    }
    auto value = [&]() -> std::string {
      if (inlineValue) return *inlineValue;
      if (i + 1 >= argc) throw UsageError(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--dev") {
      options.device = value();
    } else if (arg == "--address" && options.command == "attach") {
      options.addresses.push_back(value());
    } else if (arg == "--gue-port" && options.command == "attach") {
      options.guePort = parsePort(value());
    } else if (arg == "--mode" && options.command == "attach") {
      const std::string mode = value();
      if (mode == "native" || mode == "drv") {
        options.mode = XdpMode::Native;
      } else if (mode == "generic" || mode == "skb") {
        options.mode = XdpMode::Generic;
      } else {
        throw UsageError("--mode: '" + mode + "' is neither native nor generic");
      }
    } else if (arg == "--bpf-object" && options.command == "attach") {
      options.bpfObject = value();
    } else if (arg == "--pin-root") {
      options.pinRoot = value();
    } else if (arg == "--force" && options.command != "stats" && !inlineValue) {
      options.force = true;
    } else if (arg == "--json" && options.command == "stats" && !inlineValue) {
      options.json = true;
    } else if ((arg == "--verbose" || arg == "-v") && !inlineValue) {
      options.verbose = true;
    } else if (arg == "-h" || arg == "--help") {
      options.command = "help";
      return options;
    } else {
      throw UsageError("unknown option '" + arg + "' for " + options.command);
    }
  }
  if (options.device.empty()) throw UsageError(options.command + ": --dev IF is required");
  if (options.device.size() >= IF_NAMESIZE || options.device.find('/') != std::string::npos) {
    throw UsageError("--dev: '" + options.device + "' is not an interface name");
  }
  if (options.command == "attach" && options.addresses.empty()) {
    throw UsageError("attach: at least one --address (the backend's tunnel address) is required");
  }
  return options;
}

// ---- helpers ---------------------------------------------------------------

bool gVerbose = false;

int printLibbpf(enum libbpf_print_level level, const char* format, va_list args) {
  if (level == LIBBPF_DEBUG && !gVerbose) return 0;
  if (level == LIBBPF_INFO && !gVerbose) return 0;
  return std::vfprintf(stderr, format, args);
}

void requireRoot() {
  if (geteuid() != 0) {
    throw std::runtime_error(
        "must run as root (loading XDP programs needs CAP_BPF, CAP_NET_ADMIN and "
        "CAP_SYS_ADMIN for bpffs)");
  }
}

unsigned deviceIndex(const std::string& device) {
  const unsigned index = if_nametoindex(device.c_str());
  if (index == 0) {
    throw std::runtime_error("device '" + device + "' does not exist in this network namespace (" +
                             errnoText(errno) + ")");
  }
  return index;
}

DecapAddressKey parseAddress(const std::string& text) {
  DecapAddressKey key{};
  if (inet_pton(AF_INET, text.c_str(), key.addr) == 1) {
    key.family = kDecapFamilyIpv4;
  } else if (inet_pton(AF_INET6, text.c_str(), key.addr) == 1) {
    key.family = kDecapFamilyIpv6;
  } else {
    throw UsageError("--address: '" + text + "' is neither an IPv4 nor an IPv6 address");
  }
  return key;
}

std::string formatAddress(const DecapAddressKey& key) {
  std::array<char, INET6_ADDRSTRLEN> text{};
  const int family = key.family == kDecapFamilyIpv4 ? AF_INET : AF_INET6;
  if (inet_ntop(family, key.addr, text.data(), text.size()) == nullptr) return "?";
  return text.data();
}

std::string resolveObjectPath(const Options& options) {
  if (!options.bpfObject.empty()) {
    if (!fs::is_regular_file(options.bpfObject)) {
      throw std::runtime_error("--bpf-object: no file at '" + options.bpfObject + "'");
    }
    return options.bpfObject;
  }
  if (const char* env = std::getenv(std::string(kObjectEnv).c_str()); env && *env) {
    if (!fs::is_regular_file(env)) {
      throw std::runtime_error(std::string(kObjectEnv) + ": no file at '" + env + "'");
    }
    return env;
  }
  std::vector<std::string> candidates;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back((self.parent_path() / kObjectFileName).string());
  candidates.emplace_back(SPILLWAY_DECAP_INSTALL_OBJECT);
  candidates.emplace_back(SPILLWAY_DECAP_BUILD_OBJECT);
  std::string tried;
  for (const auto& candidate : candidates) {
    if (candidate.empty()) continue;
    if (fs::is_regular_file(candidate, ec)) return candidate;
    tried += " " + candidate;
  }
  throw std::runtime_error("BPF object " + std::string(kObjectFileName) +
                           " not found (tried:" + tried + "); give it with --bpf-object PATH");
}

struct ProgramInfo {
  std::uint32_t id = 0;
  std::string name;
  std::vector<std::uint32_t> mapIds;
};

ProgramInfo programInfo(std::uint32_t id) {
  ProgramInfo info;
  info.id = id;
  Fd fd(bpf_prog_get_fd_by_id(id));
  if (!fd.valid()) fail("cannot open XDP program id " + std::to_string(id), errno);
  bpf_prog_info raw{};
  std::uint32_t length = sizeof(raw);
  if (bpf_obj_get_info_by_fd(fd.get(), &raw, &length) != 0) {
    fail("cannot read program id " + std::to_string(id), errno);
  }
  info.name = raw.name;
  info.mapIds.resize(raw.nr_map_ids);
  if (!info.mapIds.empty()) {
    bpf_prog_info withMaps{};
    withMaps.nr_map_ids = static_cast<std::uint32_t>(info.mapIds.size());
    withMaps.map_ids = reinterpret_cast<std::uintptr_t>(info.mapIds.data());
    length = sizeof(withMaps);
    if (bpf_obj_get_info_by_fd(fd.get(), &withMaps, &length) != 0) {
      fail("cannot read the maps of program id " + std::to_string(id), errno);
    }
    info.mapIds.resize(withMaps.nr_map_ids);
  }
  return info;
}

bool isOurs(const ProgramInfo& info) {
  return info.name == SPILLWAY_DECAP_PROG_NAME;
}

// What netlink reports on the device: the program of each mode, if any.
struct Attachment {
  std::uint32_t nativeId = 0;
  std::uint32_t genericId = 0;
  std::uint32_t offloadId = 0;
};

Attachment queryAttachment(unsigned ifindex, const std::string& device) {
  bpf_xdp_query_opts query{};
  query.sz = sizeof(query);
  if (const int err = bpf_xdp_query(static_cast<int>(ifindex), 0, &query); err != 0) {
    fail("cannot query XDP on " + device, err);
  }
  return Attachment{query.drv_prog_id, query.skb_prog_id, query.hw_prog_id};
}

std::uint32_t modeFlag(XdpMode mode) {
  return mode == XdpMode::Native ? XDP_FLAGS_DRV_MODE : XDP_FLAGS_SKB_MODE;
}

const char* modeName(XdpMode mode) {
  return mode == XdpMode::Native ? "native" : "generic";
}

std::string pinDirectory(const Options& options) {
  return (fs::path(options.pinRoot) / options.device).string();
}

bool onBpffs(const std::string& path) {
  struct statfs info {};
  return statfs(path.c_str(), &info) == 0 &&
         static_cast<unsigned long>(info.f_type) == static_cast<unsigned long>(BPF_FS_MAGIC);
}

// Mounts bpffs on /sys/fs/bpf when the pin root lies under it and it is not
// mounted yet (as bpftool does). Returns false when pinning is impossible.
bool ensureBpffs(const std::string& pinRoot) {
  const std::string mountPoint(kBpffsMount);
  if (pinRoot.starts_with(mountPoint) && !onBpffs(mountPoint)) {
    std::error_code ec;
    fs::create_directories(mountPoint, ec);
    if (mount("bpf", mountPoint.c_str(), "bpf", 0, "mode=0700") != 0) {
      std::cerr << "spillway-decap: warning: cannot mount bpffs on " << mountPoint << ": "
                << errnoText(errno) << "; not pinning\n";
      return false;
    }
  }
  std::error_code ec;
  fs::create_directories(pinRoot, ec);
  if (ec || !onBpffs(pinRoot)) {
    std::cerr << "spillway-decap: warning: " << pinRoot << " is not on a bpffs; not pinning\n";
    return false;
  }
  return true;
}

void removePins(const std::string& directory) {
  std::error_code ec;
  if (!fs::is_directory(directory, ec)) return;
  for (const auto& entry : fs::directory_iterator(directory, ec)) {
    fs::remove(entry.path(), ec);
  }
  fs::remove(directory, ec);
}

void pinObject(bpf_object* object, bpf_program* program, const Options& options) {
  if (!ensureBpffs(options.pinRoot)) return;
  const std::string directory = pinDirectory(options);
  removePins(directory);
  std::error_code ec;
  fs::create_directories(directory, ec);
  int err = bpf_program__pin(program, (fs::path(directory) / kPinProgram).c_str());
  bpf_map* map = nullptr;
  bpf_object__for_each_map(map, object) {
    if (err != 0) break;
    err = bpf_map__pin(map, (fs::path(directory) / bpf_map__name(map)).c_str());
  }
  if (err != 0) {
    std::cerr << "spillway-decap: warning: pinning under " << directory
              << " failed: " << errnoText(-err) << "; stats still work through the device\n";
    removePins(directory);
  }
}

Fd mapByName(const ProgramInfo& program, std::string_view name) {
  for (const std::uint32_t id : program.mapIds) {
    Fd fd(bpf_map_get_fd_by_id(id));
    if (!fd.valid()) continue;
    bpf_map_info info{};
    std::uint32_t length = sizeof(info);
    if (bpf_obj_get_info_by_fd(fd.get(), &info, &length) == 0 && name == info.name) return fd;
  }
  return Fd();
}

// ---- commands --------------------------------------------------------------

int attach(const Options& options) {
  requireRoot();
  const unsigned ifindex = deviceIndex(options.device);
  std::vector<DecapAddressKey> keys;
  for (const auto& address : options.addresses) keys.push_back(parseAddress(address));
  if (keys.size() > SPILLWAY_DECAP_MAX_ADDRS) {
    throw UsageError("at most " + std::to_string(SPILLWAY_DECAP_MAX_ADDRS) + " addresses");
  }

  // What runs there now: ours is replaced, a foreign program only with --force.
  const Attachment before = queryAttachment(ifindex, options.device);
  if (before.offloadId != 0) {
    throw std::runtime_error(options.device + " has an offloaded XDP program (id " +
                             std::to_string(before.offloadId) + "); remove it first");
  }
  std::uint32_t sameModeId = options.mode == XdpMode::Native ? before.nativeId : before.genericId;
  std::uint32_t otherModeId = options.mode == XdpMode::Native ? before.genericId : before.nativeId;
  for (const std::uint32_t id : {sameModeId, otherModeId}) {
    if (id == 0) continue;
    const ProgramInfo info = programInfo(id);
    if (!isOurs(info) && !options.force) {
      throw std::runtime_error(options.device + " already runs XDP program '" + info.name +
                               "' (id " + std::to_string(id) +
                               "); detach it first or use --force to replace it");
    }
  }

  const std::string objectPath = resolveObjectPath(options);
  BpfObjectPtr object(bpf_object__open_file(objectPath.c_str(), nullptr));
  if (!object) fail("cannot open BPF object " + objectPath, errno);
  bpf_program* program = bpf_object__find_program_by_name(object.get(), SPILLWAY_DECAP_PROG_NAME);
  if (program == nullptr) {
    throw std::runtime_error(objectPath + " has no program '" SPILLWAY_DECAP_PROG_NAME "'");
  }
  if (const int err = bpf_object__load(object.get()); err != 0) {
    fail("loading " + objectPath +
             " into the kernel failed (the verifier log, if any, is printed above)",
         err);
  }

  auto mapFd = [&](const char* name) {
    const int fd = bpf_object__find_map_fd_by_name(object.get(), name);
    if (fd < 0) throw std::runtime_error(objectPath + " has no map '" + name + "'");
    return fd;
  };
  const std::uint32_t zero = 0;
  DecapConfig config{};
  config.guePort = options.guePort;
  if (bpf_map_update_elem(mapFd(SPILLWAY_DECAP_MAP_CONFIG), &zero, &config, BPF_ANY) != 0) {
    fail("cannot write " SPILLWAY_DECAP_MAP_CONFIG, errno);
  }
  const std::uint8_t present = 1;
  for (const auto& key : keys) {
    if (bpf_map_update_elem(mapFd(SPILLWAY_DECAP_MAP_ADDRS), &key, &present, BPF_ANY) != 0) {
      fail("cannot add " + formatAddress(key) + " to " SPILLWAY_DECAP_MAP_ADDRS, errno);
    }
  }

  // A program in the other mode would keep running beside ours: remove it.
  if (otherModeId != 0) {
    Fd old(bpf_prog_get_fd_by_id(otherModeId));
    bpf_xdp_attach_opts detachOpts{};
    detachOpts.sz = sizeof(detachOpts);
    detachOpts.old_prog_fd = old.get();
    const XdpMode otherMode = options.mode == XdpMode::Native ? XdpMode::Generic : XdpMode::Native;
    if (const int err = bpf_xdp_detach(static_cast<int>(ifindex), modeFlag(otherMode), &detachOpts);
        err != 0) {
      fail("cannot detach the " + std::string(modeName(otherMode)) + " XDP program from " +
               options.device,
           err);
    }
  }

  const int progFd = bpf_program__fd(program);
  bpf_xdp_attach_opts attachOpts{};
  attachOpts.sz = sizeof(attachOpts);
  Fd old;
  std::uint32_t flags = modeFlag(options.mode);
  if (sameModeId != 0) {
    old = Fd(bpf_prog_get_fd_by_id(sameModeId));
    attachOpts.old_prog_fd = old.get();  // libbpf adds XDP_FLAGS_REPLACE
  } else {
    flags |= XDP_FLAGS_UPDATE_IF_NOEXIST;
  }
  if (const int err = bpf_xdp_attach(static_cast<int>(ifindex), progFd, flags, &attachOpts);
      err != 0) {
    std::string hint;
    if (err == -EOPNOTSUPP || err == -EINVAL) {
      hint = " (does the driver of " + options.device + " support native XDP? try --mode generic)";
    } else if (err == -EBUSY || err == -EEXIST) {
      hint = " (another XDP program was attached meanwhile)";
    } else if (err == -ERANGE) {
      hint = " (MTU too large for native XDP on this device)";
    }
    fail("cannot attach to " + options.device + " in " + modeName(options.mode) + " mode" + hint,
         err);
  }

  pinObject(object.get(), program, options);

  bpf_prog_info info{};
  std::uint32_t length = sizeof(info);
  bpf_obj_get_info_by_fd(progFd, &info, &length);
  std::cout << "spillway-decap: attached to " << options.device << " (" << modeName(options.mode)
            << ", prog id " << info.id << (sameModeId != 0 ? ", replaced an earlier one" : "")
            << "), GUE port " << options.guePort << ", addresses:";
  for (const auto& key : keys) std::cout << ' ' << formatAddress(key);
  std::cout << '\n';
  return 0;
}

int detach(const Options& options) {
  requireRoot();
  const unsigned ifindex = deviceIndex(options.device);
  const Attachment now = queryAttachment(ifindex, options.device);
  int detached = 0;
  for (const auto& [id, mode] :
       {std::pair{now.nativeId, XdpMode::Native}, std::pair{now.genericId, XdpMode::Generic}}) {
    if (id == 0) continue;
    const ProgramInfo info = programInfo(id);
    if (!isOurs(info) && !options.force) {
      throw std::runtime_error(options.device + " runs XDP program '" + info.name + "' (id " +
                               std::to_string(id) +
                               "), not spillway-decap; use --force to detach it anyway");
    }
    Fd old(bpf_prog_get_fd_by_id(id));
    bpf_xdp_attach_opts opts{};
    opts.sz = sizeof(opts);
    opts.old_prog_fd = old.get();
    if (const int err = bpf_xdp_detach(static_cast<int>(ifindex), modeFlag(mode), &opts);
        err != 0) {
      fail("cannot detach from " + options.device, err);
    }
    ++detached;
  }
  removePins(pinDirectory(options));
  if (detached == 0) {
    std::cout << "spillway-decap: nothing attached to " << options.device << '\n';
  } else {
    std::cout << "spillway-decap: detached from " << options.device << '\n';
  }
  return 0;
}

struct Snapshot {
  std::uint32_t progId = 0;
  std::string mode = "none";
  std::uint16_t guePort = 0;
  std::vector<std::string> addresses;
  std::array<DecapCounterValue, kDecapCounterCount> counters{};
};

Snapshot readSnapshot(const Options& options) {
  const unsigned ifindex = deviceIndex(options.device);
  const Attachment now = queryAttachment(ifindex, options.device);
  Snapshot snapshot;
  Fd counters;
  Fd addrs;
  Fd config;
  for (const auto& [id, mode] :
       {std::pair{now.nativeId, "native"}, std::pair{now.genericId, "generic"}}) {
    if (id == 0) continue;
    const ProgramInfo info = programInfo(id);
    if (!isOurs(info)) continue;
    snapshot.progId = id;
    snapshot.mode = mode;
    counters = mapByName(info, SPILLWAY_DECAP_MAP_COUNTERS);
    addrs = mapByName(info, SPILLWAY_DECAP_MAP_ADDRS);
    config = mapByName(info, SPILLWAY_DECAP_MAP_CONFIG);
    break;
  }
  if (snapshot.progId == 0) {
    // Not attached (any more): the pins, if left, still hold the last counters.
    const fs::path directory = pinDirectory(options);
    counters = Fd(bpf_obj_get((directory / SPILLWAY_DECAP_MAP_COUNTERS).c_str()));
    addrs = Fd(bpf_obj_get((directory / SPILLWAY_DECAP_MAP_ADDRS).c_str()));
    config = Fd(bpf_obj_get((directory / SPILLWAY_DECAP_MAP_CONFIG).c_str()));
    if (!counters.valid()) {
      throw std::runtime_error("spillway-decap is not attached to " + options.device +
                               " and nothing is pinned under " + directory.string());
    }
  }
  if (!counters.valid()) throw std::runtime_error("the attached program has no counters map");

  const int cpus = libbpf_num_possible_cpus();
  if (cpus <= 0) fail("cannot count the CPUs", cpus);
  std::vector<DecapCounterValue> perCpu(static_cast<std::size_t>(cpus));
  for (std::uint32_t index = 0; index < kDecapCounterCount; ++index) {
    if (bpf_map_lookup_elem(counters.get(), &index, perCpu.data()) != 0) {
      fail("cannot read counter " + std::string(kCounterNames[index]), errno);
    }
    for (const auto& value : perCpu) {
      snapshot.counters[index].packets += value.packets;
      snapshot.counters[index].bytes += value.bytes;
    }
  }
  if (config.valid()) {
    const std::uint32_t zero = 0;
    DecapConfig value{};
    if (bpf_map_lookup_elem(config.get(), &zero, &value) == 0) snapshot.guePort = value.guePort;
  }
  if (addrs.valid()) {
    DecapAddressKey key{};
    DecapAddressKey next{};
    const void* previous = nullptr;
    while (bpf_map_get_next_key(addrs.get(), previous, &next) == 0) {
      snapshot.addresses.push_back(formatAddress(next));
      key = next;
      previous = &key;
    }
  }
  return snapshot;
}

std::string jsonString(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

int stats(const Options& options) {
  requireRoot();
  const Snapshot snapshot = readSnapshot(options);
  std::uint64_t decapsulated = 0;
  std::uint64_t passed = 0;
  for (std::uint32_t index = 0; index < kDecapCounterCount; ++index) {
    (index < kFirstPassCounter ? decapsulated : passed) += snapshot.counters[index].packets;
  }
  std::ostringstream out;
  if (options.json) {
    out << "{\"device\": " << jsonString(options.device) << ", \"prog_id\": " << snapshot.progId
        << ", \"mode\": " << jsonString(snapshot.mode) << ", \"gue_port\": " << snapshot.guePort
        << ", \"addresses\": [";
    for (std::size_t i = 0; i < snapshot.addresses.size(); ++i) {
      out << (i ? ", " : "") << jsonString(snapshot.addresses[i]);
    }
    out << "], \"counters\": {";
    for (std::uint32_t index = 0; index < kDecapCounterCount; ++index) {
      out << (index ? ", " : "") << jsonString(kCounterNames[index])
          << ": {\"packets\": " << snapshot.counters[index].packets
          << ", \"bytes\": " << snapshot.counters[index].bytes << "}";
    }
    out << "}, \"decapsulated\": " << decapsulated << ", \"passed\": " << passed << "}\n";
  } else {
    out << "spillway-decap on " << options.device << ": ";
    if (snapshot.progId != 0) {
      out << snapshot.mode << ", prog id " << snapshot.progId;
    } else {
      out << "NOT ATTACHED (pinned counters)";
    }
    out << ", GUE port " << snapshot.guePort << "\naddresses:";
    for (const auto& address : snapshot.addresses) out << ' ' << address;
    out << '\n';
    char line[96];
    std::snprintf(line, sizeof(line), "%-18s %16s %20s\n", "counter", "packets", "bytes");
    out << line;
    for (std::uint32_t index = 0; index < kDecapCounterCount; ++index) {
      std::snprintf(line, sizeof(line), "%-18s %16llu %20llu\n", kCounterNames[index].data(),
                    static_cast<unsigned long long>(snapshot.counters[index].packets),
                    static_cast<unsigned long long>(snapshot.counters[index].bytes));
      out << line;
    }
    out << "decapsulated " << decapsulated << ", passed " << passed << '\n';
  }
  std::cout << out.str();
  return 0;
}

}  // namespace
}  // namespace spillway

int main(int argc, char** argv) {
  using namespace spillway;
  try {
    const Options options = parseOptions(argc, argv);
    if (options.command == "help") {
      std::cout << kUsage;
      return 0;
    }
    gVerbose = options.verbose;
    libbpf_set_print(printLibbpf);
    if (options.command == "attach") return attach(options);
    if (options.command == "detach") return detach(options);
    return stats(options);
  } catch (const UsageError& error) {
    std::cerr << "spillway-decap: " << error.what() << "\n\n" << kUsage;
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "spillway-decap: error: " << error.what() << '\n';
    return 1;
  }
}
