// spillway-decap: the loader of the backend's XDP decapsulation program
// (bpf/spillway_decap.bpf.c), for backends whose kernel lacks ipip / ip6tnl /
// fou, or that want decapsulation before the stack at all.
//
//   spillway-decap attach --dev IF --address A [--address B ...]
//                         [--gue-port 6080] [--mode native|generic]
//                         [--bpf-object PATH] [--pin-root DIR] [--force]
//   spillway-decap detach --dev IF [--pin-root DIR] [--force]
//   spillway-decap stats  --dev IF [--json] [--pin-root DIR]
//   spillway-decap second-chance --dev IF [--json] [--pin-root DIR]
//   spillway-decap agent  --vip A [--vip B ...] [--listen ADDR:PORT]
//                         [--token-file F] [--list-cap N]   (conn_agent.hpp)
//
// attach loads the object, fills decap_config and decap_addrs, and attaches
// the program through netlink (like `ip link set xdp`), so it stays attached
// after the loader exits and without any pin. An earlier spillway-decap on
// the device is replaced atomically (XDP_FLAGS_REPLACE) when in the same
// mode; a foreign XDP program is replaced only with --force. The program and
// its maps are also pinned under /sys/fs/bpf/spillway-decap/<IF>/ (bpffs is
// mounted there when it is not) for bpftool and monitoring.
// second-chance lists the flows this backend sent on to another on a
// second chance (decap_sc_flows: inner tuple, packets, first and last time,
// the hop), for the drills' attribution of surviving flows.
// stats, second-chance and detach find the program attached to the device through netlink
// and its maps by id, so they work even where the pins are not visible (for
// example under `ip netns exec`, which remounts /sys).
//
// Arguments through CLI11, `stats --json` through nlohmann-json, the device's
// XDP programs found, attached and detached through xdp_attach.hpp (the one
// attach path of Spillway's XDP tools).
// Start-up tool, single-threaded; errors are exceptions caught in main(),
// printed as one line, exit status 1 (2 for usage errors).
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/magic.h>
#include <net/if.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
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
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "conn_agent.hpp"
#include "spillway/errno_text.hpp"
#include "spillway_decap_abi.h"
#include "xdp_attach.hpp"

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
constexpr int kUsageExit = 2;

// Names of the counters, in DecapCounter order (spillway_decap_abi.h).
// clang-format off
constexpr std::array<std::string_view, kDecapCounterCount> kCounterNames = {
    "decap_ip4in4",     "decap_ip6in4",     "decap_ip4in6",     "decap_ip6in6",
    "decap_gue_ip4in4", "decap_gue_ip6in4", "decap_gue_ip4in6", "decap_gue_ip6in6",
    "pass_non_ip",      "pass_not_local",   "pass_not_tunnel",  "malformed",
    "fragment",         "error",            "sc_redirected",    "sc_kept",
    "sc_unknown_lb",    "sc_arrived",
};
// clang-format on
constexpr std::uint32_t kFirstPassCounter = kDecapPassNonIp;

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail(const std::string& what, int err) {
  throw std::runtime_error(what + ": " + bpfErrorText(err));
}

// Unwraps a helper's result or throws its error.
template <typename T>
T orThrow(std::optional<T> value, const std::string& error) {
  if (!value) throw std::runtime_error(error);
  return std::move(*value);
}

struct BpfObjectCloser {
  void operator()(bpf_object* object) const noexcept { bpf_object__close(object); }
};
using BpfObjectPtr = std::unique_ptr<bpf_object, BpfObjectCloser>;

// ---- command line ----------------------------------------------------------

struct Options {
  std::string command;
  std::string device;
  std::vector<std::string> addresses;
  std::vector<std::string> loadBalancers;  // --lb
  std::uint16_t guePort = kDefaultGuePort;
  std::string modeName = "native";
  XdpMode mode = XdpMode::Native;  // from modeName
  std::string bpfObject;
  std::string pinRoot{kDefaultPinRoot};
  bool force = false;
  bool json = false;
  bool verbose = false;
  ConnAgentOptions agent;
};

constexpr std::string_view kDescription =
    "Decapsulates IPIP, IPv6-in-IPv4, IPv4/IPv6-in-IPv6 and GUE (variant 0, UDP port\n"
    "--gue-port, default 6080) sent to one of the --address values, and passes the\n"
    "inner packet to the kernel. The BPF object is taken from --bpf-object, then\n"
    "$SPILLWAY_DECAP_BPF_OBJECT, then next to this binary, then the install and\n"
    "build paths compiled in.";

// The parser, bound to `options`. Every command takes --dev, --pin-root and
// --verbose; attach, detach and stats add their own.
std::unique_ptr<CLI::App> makeParser(Options& options) {
  auto app = std::make_unique<CLI::App>(std::string(kDescription), "spillway-decap");
  app->require_subcommand(1, 1);
  auto common = [&](CLI::App* command) {
    command->add_option("--dev", options.device, "network interface")->required();
    command->add_option("--pin-root", options.pinRoot, "bpffs directory for the pins")
        ->capture_default_str();
    command->add_flag("-v,--verbose", options.verbose, "libbpf's messages too");
    command->callback([&options, command] { options.command = command->get_name(); });
  };
  CLI::App* attach = app->add_subcommand("attach", "load, configure and attach the program");
  common(attach);
  attach
      ->add_option("--address", options.addresses,
                   "a tunnel address of this backend (IPv4 or IPv6); repeat for more")
      ->required()
      ->allow_extra_args(false);
  attach->add_option("--lb", options.loadBalancers,
                     "a load balancer's tunnel source address: a second-chance packet from it "
                     "that no local socket wants is sent on to the backend it names; repeat for "
                     "more (none: every packet is decapsulated here)");
  attach->add_option("--gue-port", options.guePort, "GUE UDP port")
      ->capture_default_str()
      ->check(CLI::Range(1, 65535));
  attach->add_option("--mode", options.modeName, "native (also: drv) or generic (also: skb)")
      ->capture_default_str()
      ->check(CLI::IsMember({"native", "drv", "generic", "skb"}));
  attach->add_option("--bpf-object", options.bpfObject, "the BPF object to load");
  attach->add_flag("--force", options.force, "replace a foreign XDP program");
  CLI::App* detach = app->add_subcommand("detach", "detach the program and remove its pins");
  common(detach);
  detach->add_flag("--force", options.force, "detach a foreign XDP program too");
  CLI::App* stats = app->add_subcommand("stats", "the program's counters");
  common(stats);
  stats->add_flag("--json", options.json, "one JSON object");
  CLI::App* secondChance = app->add_subcommand(
      "second-chance", "the flows sent on to their previous backend (second chance)");
  common(secondChance);
  secondChance->add_flag("--json", options.json, "one JSON object");
  CLI::App* agent = app->add_subcommand(
      "agent", "serve this host's TCP connections per VIP (for spillwayd's drains)");
  agent->add_option("--vip", options.agent.vips, "a VIP address; repeat for more")->required();
  agent->add_option("--listen", options.agent.listen, "ADDRESS:PORT")->capture_default_str();
  agent->add_option("--token-file", options.agent.tokenFile,
                    "the bearer token of GET /connections (without: list disabled)");
  agent->add_option("--list-cap", options.agent.listCap, "connections in one list answer")
      ->capture_default_str()
      ->check(CLI::Range(1, 1'000'000));
  agent->callback([&options] { options.command = "agent"; });
  return app;
}

void validate(Options& options) {
  options.mode = options.modeName == "generic" || options.modeName == "skb" ? XdpMode::Generic
                                                                            : XdpMode::Native;
  if (options.device.size() >= IF_NAMESIZE || options.device.find('/') != std::string::npos) {
    throw UsageError("--dev: '" + options.device + "' is not an interface name");
  }
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

XdpAttachment queryDevice(const std::string& device) {
  std::string error;
  return orThrow(queryXdp(device, error), error);
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

bool isOurs(const XdpProgram& program) {
  return program.name == SPILLWAY_DECAP_PROG_NAME;
}

const XdpProgram* inMode(const XdpAttachment& attachment, XdpMode mode) {
  for (const XdpProgram& program : attachment.programs) {
    if (program.mode == mode) return &program;
  }
  return nullptr;
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
              << " failed: " << bpfErrorText(err) << "; stats still work through the device\n";
    removePins(directory);
  }
}

// ---- commands --------------------------------------------------------------

int attach(const Options& options) {
  requireRoot();
  std::vector<DecapAddressKey> keys;
  for (const auto& address : options.addresses) keys.push_back(parseAddress(address));
  if (keys.size() > SPILLWAY_DECAP_MAX_ADDRS) {
    throw UsageError("at most " + std::to_string(SPILLWAY_DECAP_MAX_ADDRS) + " addresses");
  }
  std::vector<DecapAddressKey> lbKeys;
  for (const auto& address : options.loadBalancers) {
    try {
      lbKeys.push_back(parseAddress(address));
    } catch (const UsageError&) {
      throw UsageError("--lb: '" + address + "' is neither an IPv4 nor an IPv6 address");
    }
  }
  if (lbKeys.size() > SPILLWAY_DECAP_MAX_LBS) {
    throw UsageError("at most " + std::to_string(SPILLWAY_DECAP_MAX_LBS) + " --lb addresses");
  }
  const XdpAttachment before = queryDevice(options.device);

  // What runs there now: ours is replaced, a foreign program only with --force.
  if (const XdpProgram* offloaded = inMode(before, XdpMode::Offload)) {
    throw std::runtime_error(options.device + " has an offloaded XDP program " +
                             offloaded->describe() + "; remove it first");
  }
  const XdpMode otherMode = options.mode == XdpMode::Native ? XdpMode::Generic : XdpMode::Native;
  const XdpProgram* sameMode = inMode(before, options.mode);
  const XdpProgram* otherModeProgram = inMode(before, otherMode);
  for (const XdpProgram* program : {sameMode, otherModeProgram}) {
    if (program != nullptr && !isOurs(*program) && !options.force) {
      throw std::runtime_error(options.device + " already runs XDP program '" + program->name +
                               "' (id " + std::to_string(program->id) +
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
  for (const auto& key : lbKeys) {
    if (bpf_map_update_elem(mapFd(SPILLWAY_DECAP_MAP_LBS), &key, &present, BPF_ANY) != 0) {
      fail("cannot add " + formatAddress(key) + " to " SPILLWAY_DECAP_MAP_LBS, errno);
    }
  }

  // A program in the other mode would keep running beside ours: remove it.
  std::string error;
  if (otherModeProgram != nullptr && !detachXdp(before, *otherModeProgram, error)) {
    throw std::runtime_error(error);
  }
  const int progFd = bpf_program__fd(program);
  if (!attachXdp(before, progFd, options.mode, sameMode, error)) {
    throw std::runtime_error(error);
  }

  pinObject(object.get(), program, options);

  bpf_prog_info info{};
  std::uint32_t length = sizeof(info);
  bpf_obj_get_info_by_fd(progFd, &info, &length);
  std::cout << "spillway-decap: attached to " << options.device << " (" << xdpModeName(options.mode)
            << ", prog id " << info.id << (sameMode != nullptr ? ", replaced an earlier one" : "")
            << "), GUE port " << options.guePort << ", addresses:";
  for (const auto& key : keys) std::cout << ' ' << formatAddress(key);
  if (!lbKeys.empty()) {
    std::cout << "; second chance for load balancers:";
    for (const auto& key : lbKeys) std::cout << ' ' << formatAddress(key);
  }
  std::cout << '\n';
  return 0;
}

int detach(const Options& options) {
  requireRoot();
  const XdpAttachment now = queryDevice(options.device);
  int detached = 0;
  for (const XdpProgram& program : now.programs) {
    if (program.mode == XdpMode::Offload) continue;
    if (!isOurs(program) && !options.force) {
      throw std::runtime_error(options.device + " runs XDP program '" + program.name + "' (id " +
                               std::to_string(program.id) +
                               "), not spillway-decap; use --force to detach it anyway");
    }
    std::string error;
    if (!detachXdp(now, program, error)) throw std::runtime_error(error);
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
  const XdpAttachment now = queryDevice(options.device);
  Snapshot snapshot;
  UniqueFd counters;
  UniqueFd addrs;
  UniqueFd config;
  for (const XdpProgram& program : now.programs) {
    if (program.mode == XdpMode::Offload || !isOurs(program)) continue;
    snapshot.progId = program.id;
    snapshot.mode = xdpModeName(program.mode);
    counters = openProgramMap(program, SPILLWAY_DECAP_MAP_COUNTERS);
    addrs = openProgramMap(program, SPILLWAY_DECAP_MAP_ADDRS);
    config = openProgramMap(program, SPILLWAY_DECAP_MAP_CONFIG);
    break;
  }
  if (snapshot.progId == 0) {
    // Not attached (any more): the pins, if left, still hold the last counters.
    const fs::path directory = pinDirectory(options);
    counters = UniqueFd(bpf_obj_get((directory / SPILLWAY_DECAP_MAP_COUNTERS).c_str()));
    addrs = UniqueFd(bpf_obj_get((directory / SPILLWAY_DECAP_MAP_ADDRS).c_str()));
    config = UniqueFd(bpf_obj_get((directory / SPILLWAY_DECAP_MAP_CONFIG).c_str()));
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
      // A program attached by a build before second chance has no such
      // counters: they read as 0 until it is attached again.
      if (errno == ENOENT && index >= kDecapScRedirected) continue;
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

int stats(const Options& options) {
  requireRoot();
  const Snapshot snapshot = readSnapshot(options);
  std::uint64_t decapsulated = 0;
  std::uint64_t passed = 0;
  // Second-chance counters other than redirected count frames that are in
  // decapsulated already.
  for (std::uint32_t index = 0; index < kDecapScRedirected; ++index) {
    (index < kFirstPassCounter ? decapsulated : passed) += snapshot.counters[index].packets;
  }
  const std::uint64_t redirected = snapshot.counters[kDecapScRedirected].packets;
  if (options.json) {
    nlohmann::ordered_json counters = nlohmann::ordered_json::object();
    for (std::uint32_t index = 0; index < kDecapCounterCount; ++index) {
      counters[std::string(kCounterNames[index])] = {{"packets", snapshot.counters[index].packets},
                                                     {"bytes", snapshot.counters[index].bytes}};
    }
    const nlohmann::ordered_json out = {
        {"device", options.device},        {"prog_id", snapshot.progId},
        {"mode", snapshot.mode},           {"gue_port", snapshot.guePort},
        {"addresses", snapshot.addresses}, {"counters", counters},
        {"decapsulated", decapsulated},    {"passed", passed},
        {"redirected", redirected}};
    std::cout << out.dump() << '\n';
    return 0;
  }
  std::ostringstream out;
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
  out << "decapsulated " << decapsulated << ", passed " << passed << ", redirected (second chance) "
      << redirected << '\n';
  std::cout << out.str();
  return 0;
}

std::string formatBytes(DecapU8 family, const DecapU8* bytes) {
  DecapAddressKey key{};
  key.family = family;
  std::memcpy(key.addr, bytes, sizeof(key.addr));
  return formatAddress(key);
}

// The map of redirected flows: the attached program's, else the pin's.
UniqueFd openScFlows(const Options& options) {
  const XdpAttachment now = queryDevice(options.device);
  for (const XdpProgram& program : now.programs) {
    if (program.mode == XdpMode::Offload || !isOurs(program)) continue;
    UniqueFd fd = openProgramMap(program, SPILLWAY_DECAP_MAP_SC_FLOWS);
    if (!fd.valid()) {
      throw std::runtime_error("the program attached to " + options.device +
                               " has no " SPILLWAY_DECAP_MAP_SC_FLOWS
                               " map (attached by an older build: attach it again)");
    }
    return fd;
  }
  const fs::path pinned = fs::path(pinDirectory(options)) / SPILLWAY_DECAP_MAP_SC_FLOWS;
  UniqueFd fd(bpf_obj_get(pinned.c_str()));
  if (!fd.valid()) {
    throw std::runtime_error("spillway-decap is not attached to " + options.device +
                             " and nothing is pinned at " + pinned.string());
  }
  return fd;
}

int secondChanceFlows(const Options& options) {
  requireRoot();
  const UniqueFd map = openScFlows(options);
  timespec mono{};
  clock_gettime(CLOCK_MONOTONIC, &mono);
  const std::uint64_t nowNs =
      static_cast<std::uint64_t>(mono.tv_sec) * 1'000'000'000ULL + mono.tv_nsec;
  const auto msAgo = [nowNs](std::uint64_t ns) {
    return nowNs > ns ? (nowNs - ns) / 1'000'000 : 0;
  };
  nlohmann::ordered_json flows = nlohmann::ordered_json::array();
  DecapFlowKey key{};
  DecapFlowKey next{};
  const void* previous = nullptr;
  std::uint64_t packets = 0;
  while (bpf_map_get_next_key(map.get(), previous, &next) == 0) {
    key = next;
    previous = &key;
    DecapFlowValue value{};
    if (bpf_map_lookup_elem(map.get(), &key, &value) != 0) continue;  // evicted meanwhile
    packets += value.packets;
    flows.push_back({{"src", formatBytes(key.family, key.saddr)},
                     {"sport", ntohs(key.sport)},
                     {"dst", formatBytes(key.family, key.daddr)},
                     {"dport", ntohs(key.dport)},
                     {"packets", value.packets},
                     {"hop", formatBytes(value.hopFamily, value.hop)},
                     {"first_ms_ago", msAgo(value.firstNs)},
                     {"last_ms_ago", msAgo(value.lastNs)}});
  }
  if (options.json) {
    const nlohmann::ordered_json out = {{"device", options.device},
                                        {"capacity", SPILLWAY_DECAP_MAX_SC_FLOWS},
                                        {"flows", flows.size()},
                                        {"packets", packets},
                                        {"redirected", flows}};
    std::cout << out.dump() << '\n';
    return 0;
  }
  std::cout << "spillway-decap on " << options.device << ": " << flows.size()
            << " flows sent on (second chance), " << packets << " packets\n";
  for (const auto& f : flows) {
    std::cout << "  " << f["src"].get<std::string>() << ':' << f["sport"].get<int>() << " -> "
              << f["dst"].get<std::string>() << ':' << f["dport"].get<int>() << "  to "
              << f["hop"].get<std::string>() << ", " << f["packets"].get<std::uint64_t>()
              << " packets, first " << f["first_ms_ago"].get<std::uint64_t>() << " ms ago, last "
              << f["last_ms_ago"].get<std::uint64_t>() << " ms ago\n";
  }
  return 0;
}

}  // namespace
}  // namespace spillway

int main(int argc, char** argv) {
  using namespace spillway;
  Options options;
  const auto parser = makeParser(options);
  try {
    if (argc >= 2 && std::string_view(argv[1]) == "help") {
      std::cout << parser->help();
      return 0;
    }
    parser->parse(argc, argv);
    if (options.command == "agent") return runConnAgent(options.agent);
    validate(options);
    gVerbose = options.verbose;
    libbpf_set_print(printLibbpf);
    if (options.command == "attach") return attach(options);
    if (options.command == "detach") return detach(options);
    if (options.command == "second-chance") return secondChanceFlows(options);
    return stats(options);
  } catch (const CLI::CallForHelp& help) {
    return parser->exit(help);
  } catch (const CLI::ParseError& error) {
    std::cerr << "spillway-decap: " << error.what() << "\n\n" << parser->help();
    return kUsageExit;
  } catch (const UsageError& error) {
    std::cerr << "spillway-decap: " << error.what() << "\n\n" << parser->help();
    return kUsageExit;
  } catch (const std::exception& error) {
    std::cerr << "spillway-decap: error: " << error.what() << '\n';
    return 1;
  }
}
