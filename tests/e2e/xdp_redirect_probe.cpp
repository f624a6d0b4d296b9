// xdp_redirect_probe: the e2e test's hands on spillway_redirect.bpf.o and
// XdpVipMap, standing in for spillwayd until it exists.
//
//   xdp_redirect_probe path
//   xdp_redirect_probe attach   --dev IF [--object PATH]
//   xdp_redirect_probe detach   --dev IF
//   xdp_redirect_probe sync     --dev IF [KEY ...]
//   xdp_redirect_probe keys     --dev IF
//   xdp_redirect_probe counters --dev IF
//
// KEY is ADDR (the address marker), ADDR/PROTO (every port) or
// ADDR/PROTO/PORT, with PROTO tcp, udp, icmp, icmp6 or a number; invalid
// combinations are passed on, so the test sees XdpVipMap reject them.
// attach loads the object the way DPDK's net_af_xdp PMD does for its
// xdp_prog devarg (bpf_object__open_file, bpf_object__load, the first
// program, bpf_xdp_attach with XDP_FLAGS_UPDATE_IF_NOEXIST and no mode), but
// puts no socket into xsks_map: VIP packets then take the no-socket path.
// sync, keys and counters go through XdpVipMap only, as spillwayd will.
// Output: one line; counters and keys as JSON. Exit 0 ok, 1 error, 2 usage.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/if_link.h>
#include <net/if.h>

#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "xdp_vip_map.hpp"

namespace spillway {
namespace {

constexpr const char* kUsage =
    "usage: xdp_redirect_probe path\n"
    "       xdp_redirect_probe attach --dev IF [--object PATH]\n"
    "       xdp_redirect_probe detach|keys|counters --dev IF\n"
    "       xdp_redirect_probe sync --dev IF [ADDR[/PROTO[/PORT]] ...]\n";

struct Options {
  std::string command;
  std::string device;
  std::string object;
  std::vector<std::string> keys;
};

std::optional<Options> parse(int argc, char** argv) {
  if (argc < 2) return std::nullopt;
  Options options;
  options.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--dev" && i + 1 < argc) {
      options.device = argv[++i];
    } else if (arg == "--object" && i + 1 < argc) {
      options.object = argv[++i];
    } else if (!arg.starts_with("--") && options.command == "sync") {
      options.keys.push_back(arg);
    } else {
      return std::nullopt;
    }
  }
  if (options.command != "path" && options.device.empty()) return std::nullopt;
  return options;
}

std::optional<XdpVipKey> parseKey(const std::string& text) {
  XdpVipKey key;
  const auto slash = text.find('/');
  const std::string address = text.substr(0, slash);
  if (inet_pton(AF_INET, address.c_str(), key.address.data()) == 1) {
    key.version = IpVersion::V4;
  } else if (inet_pton(AF_INET6, address.c_str(), key.address.data()) == 1) {
    key.version = IpVersion::V6;
  } else {
    return std::nullopt;
  }
  if (slash == std::string::npos) return key;
  const std::string rest = text.substr(slash + 1);
  const auto slash2 = rest.find('/');
  const std::string proto = rest.substr(0, slash2);
  if (proto == "tcp") {
    key.proto = 6;
  } else if (proto == "udp") {
    key.proto = 17;
  } else if (proto == "icmp") {
    key.proto = 1;
  } else if (proto == "icmp6") {
    key.proto = 58;
  } else {
    char* end = nullptr;
    const unsigned long value = std::strtoul(proto.c_str(), &end, 10);
    if (proto.empty() || *end != '\0' || value > 255) return std::nullopt;
    key.proto = static_cast<std::uint8_t>(value);
  }
  if (slash2 == std::string::npos) return key;
  const std::string port = rest.substr(slash2 + 1);
  char* end = nullptr;
  const unsigned long value = std::strtoul(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || value > 65535) return std::nullopt;
  key.port = static_cast<std::uint16_t>(value);
  return key;
}

std::string formatKey(const XdpVipKey& key) {
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(key.version == IpVersion::V4 ? AF_INET : AF_INET6, key.address.data(), text,
            sizeof(text));
  return std::string(text) + "/" + std::to_string(key.proto) + "/" + std::to_string(key.port);
}

int printWarnings(enum libbpf_print_level level, const char* format, va_list args) {
  return level == LIBBPF_WARN ? std::vfprintf(stderr, format, args) : 0;
}

int fail(const std::string& what) {
  std::cerr << "xdp_redirect_probe: error: " << what << '\n';
  return 1;
}

std::string errnoText(int err) {
  char buffer[128] = {};
  libbpf_strerror(err < 0 ? -err : err, buffer, sizeof(buffer));
  return buffer;
}

int attach(const Options& options) {
  std::string path = options.object;
  if (path.empty()) {
    std::string tried;
    path = redirectProgramPath(&tried);
    if (path.empty()) return fail("spillway_redirect.bpf.o not found (tried: " + tried + ")");
  }
  const unsigned ifindex = if_nametoindex(options.device.c_str());
  if (ifindex == 0) return fail("no interface " + options.device);
  // As rte_eth_af_xdp.c: load_program() and load_custom_xdp_prog().
  bpf_object* object = bpf_object__open_file(path.c_str(), nullptr);
  if (object == nullptr) return fail("cannot open " + path + ": " + errnoText(errno));
  if (const int err = bpf_object__load(object); err != 0) {
    bpf_object__close(object);
    return fail("cannot load " + path + ": " + errnoText(err));
  }
  bpf_program* program = bpf_object__next_program(object, nullptr);
  if (program == nullptr || bpf_object__find_map_by_name(object, "xsks_map") == nullptr) {
    bpf_object__close(object);
    return fail(path + " lacks a program or the xsks_map the PMD needs");
  }
  const int err = bpf_xdp_attach(static_cast<int>(ifindex), bpf_program__fd(program),
                                 XDP_FLAGS_UPDATE_IF_NOEXIST, nullptr);
  // The attachment holds the program and its maps after the object closes.
  bpf_object__close(object);
  if (err != 0) return fail("cannot attach to " + options.device + ": " + errnoText(err));
  std::cout << "attached " << path << " to " << options.device << '\n';
  return 0;
}

int detach(const Options& options) {
  const unsigned ifindex = if_nametoindex(options.device.c_str());
  if (ifindex == 0) return fail("no interface " + options.device);
  if (const int err = bpf_xdp_detach(static_cast<int>(ifindex), 0, nullptr); err != 0) {
    return fail("cannot detach from " + options.device + ": " + errnoText(err));
  }
  std::cout << "detached from " << options.device << '\n';
  return 0;
}

int run(const Options& options) {
  if (options.command == "path") {
    std::string tried;
    const std::string path = redirectProgramPath(&tried);
    if (path.empty()) return fail("spillway_redirect.bpf.o not found (tried: " + tried + ")");
    std::cout << path << '\n';
    return 0;
  }
  if (options.command == "attach") return attach(options);
  if (options.command == "detach") return detach(options);

  std::string error;
  auto map = XdpVipMap::open(options.device, error);
  if (!map) return fail(error);
  if (options.command == "sync") {
    std::vector<XdpVipKey> keys;
    for (const std::string& text : options.keys) {
      const auto key = parseKey(text);
      if (!key) return fail("'" + text + "' is not ADDR[/PROTO[/PORT]]");
      keys.push_back(*key);
    }
    if (!map->sync(keys, error)) return fail(error);
    std::cout << "synced " << keys.size() << " keys into program id " << map->programId() << '\n';
    return 0;
  }
  if (options.command == "keys") {
    const auto keys = map->keys(error);
    if (!keys) return fail(error);
    std::cout << '[';
    for (std::size_t i = 0; i < keys->size(); ++i) {
      std::cout << (i ? ", " : "") << '"' << formatKey((*keys)[i]) << '"';
    }
    std::cout << "]\n";
    return 0;
  }
  if (options.command == "counters") {
    const auto counters = map->counters(error);
    if (!counters) return fail(error);
    std::cout << "{\"prog_id\": " << map->programId()
              << ", \"redirected\": " << counters->redirected
              << ", \"passed\": " << counters->passed()
              << ", \"passed_no_socket\": " << counters->passedNoSocket
              << ", \"passed_not_vip\": " << counters->passedNotVip
              << ", \"passed_non_ip\": " << counters->passedNonIp
              << ", \"passed_malformed\": " << counters->passedMalformed
              << ", \"redirected_bytes\": " << counters->redirectedBytes
              << ", \"passed_bytes\": " << counters->passedBytes << "}\n";
    return 0;
  }
  std::cerr << kUsage;
  return 2;
}

}  // namespace
}  // namespace spillway

int main(int argc, char** argv) {
  const auto options = spillway::parse(argc, argv);
  if (!options) {
    std::cerr << spillway::kUsage;
    return 2;
  }
  libbpf_set_print(spillway::printWarnings);
  return spillway::run(*options);
}
