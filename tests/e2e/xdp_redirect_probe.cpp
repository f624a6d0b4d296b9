// xdp_redirect_probe: the e2e test's hands on spillway_redirect.bpf.o and
// XdpVipMap, standing in for spillwayd until it exists.
//
//   xdp_redirect_probe path
//   xdp_redirect_probe attach   --dev IF [--object PATH]
//   xdp_redirect_probe detach   --dev IF
//   xdp_redirect_probe sync     --dev IF [KEY ...]
//   xdp_redirect_probe keys     --dev IF
//   xdp_redirect_probe counters --dev IF
//   xdp_redirect_probe takeover --dev IF
//
// KEY is ADDR (the address marker), ADDR/PROTO (every port) or
// ADDR/PROTO/PORT, with PROTO tcp, udp, icmp, icmp6 or a number; invalid
// combinations are passed on, so the test sees XdpVipMap reject them.
// attach loads the object the way DPDK's net_af_xdp PMD does for its
// xdp_prog devarg (bpf_object__open_file, bpf_object__load, the first
// program, attached with XDP_FLAGS_UPDATE_IF_NOEXIST and no mode), but puts
// no socket into xsks_map: VIP packets then take the no-socket path.
// sync, keys and counters go through XdpVipMap only, as spillwayd does;
// takeover runs spillwayd's start-up check, takeOverStaleRedirect().
// Attach and detach go through xdp_attach.hpp, the XDP tools' one attach path.
// Output: one line; counters and keys as JSON. Exit 0 ok, 1 error, 2 usage.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "stale_redirect.hpp"
#include "xdp_attach.hpp"
#include "xdp_vip_map.hpp"

namespace spillway {
namespace {

struct Options {
  std::string command;
  std::string device;
  std::string object;
  std::vector<std::string> keys;
};

std::unique_ptr<CLI::App> makeParser(Options& options) {
  auto app = std::make_unique<CLI::App>("the e2e test's hands on spillway_redirect.bpf.o",
                                        "xdp_redirect_probe");
  app->require_subcommand(1, 1);
  auto command = [&](const char* name, const char* what) {
    CLI::App* sub = app->add_subcommand(name, what);
    sub->callback([&options, sub] { options.command = sub->get_name(); });
    if (std::string_view(name) != "path") {
      sub->add_option("--dev", options.device, "network interface")->required();
    }
    return sub;
  };
  command("path", "where redirectProgramPath() finds the object");
  command("attach", "attach the object as DPDK's PMD does")
      ->add_option("--object", options.object, "the object (default: path)");
  command("detach", "detach whatever XDP program runs on the interface");
  command("sync", "make vip_map hold exactly KEY...")
      ->add_option("keys", options.keys, "ADDR[/PROTO[/PORT]]");
  command("keys", "vip_map's keys, as JSON");
  command("counters", "the program's counters, as JSON");
  command("takeover", "spillwayd's start-up check: detach a stale redirect program");
  return app;
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

int attach(const Options& options) {
  std::string path = options.object;
  if (path.empty()) {
    std::string tried;
    path = redirectProgramPath(&tried);
    if (path.empty()) return fail("spillway_redirect.bpf.o not found (tried: " + tried + ")");
  }
  std::string error;
  const auto where = queryXdp(options.device, error);
  if (!where) return fail(error);
  // As rte_eth_af_xdp.c: load_program() and load_custom_xdp_prog().
  bpf_object* object = bpf_object__open_file(path.c_str(), nullptr);
  if (object == nullptr) return fail("cannot open " + path + ": " + bpfErrorText(errno));
  if (const int err = bpf_object__load(object); err != 0) {
    bpf_object__close(object);
    return fail("cannot load " + path + ": " + bpfErrorText(err));
  }
  bpf_program* program = bpf_object__next_program(object, nullptr);
  if (program == nullptr || bpf_object__find_map_by_name(object, "xsks_map") == nullptr) {
    bpf_object__close(object);
    return fail(path + " lacks a program or the xsks_map the PMD needs");
  }
  const bool attached = attachXdp(*where, bpf_program__fd(program), XdpMode::Auto, nullptr, error);
  // The attachment holds the program and its maps after the object closes.
  bpf_object__close(object);
  if (!attached) return fail(error);
  std::cout << "attached " << path << " to " << options.device << '\n';
  return 0;
}

int detach(const Options& options) {
  std::string error;
  const auto where = queryXdp(options.device, error);
  if (!where) return fail(error);
  for (const XdpProgram& program : where->programs) {
    if (!detachXdp(*where, program, error)) return fail(error);
  }
  std::cout << "detached from " << options.device << '\n';
  return 0;
}

int takeover(const Options& options) {
  if (auto busy = takeOverStaleRedirect(
          options.device, [](const std::string& line) { std::cout << line << '\n'; })) {
    return fail(*busy);
  }
  std::cout << options.device << " is free for the AF_XDP PMD\n";
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
  if (options.command == "takeover") return takeover(options);

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
    nlohmann::json out = nlohmann::json::array();
    for (const XdpVipKey& key : *keys) out.push_back(formatKey(key));
    std::cout << out.dump() << '\n';
    return 0;
  }
  if (options.command == "counters") {
    const auto counters = map->counters(error);
    if (!counters) return fail(error);
    const nlohmann::ordered_json out = {{"prog_id", map->programId()},
                                        {"redirected", counters->redirected},
                                        {"passed", counters->passed()},
                                        {"passed_no_socket", counters->passedNoSocket},
                                        {"passed_not_vip", counters->passedNotVip},
                                        {"passed_non_ip", counters->passedNonIp},
                                        {"passed_malformed", counters->passedMalformed},
                                        {"redirected_bytes", counters->redirectedBytes},
                                        {"passed_bytes", counters->passedBytes}};
    std::cout << out.dump() << '\n';
    return 0;
  }
  return fail("unknown command " + options.command);
}

}  // namespace
}  // namespace spillway

int main(int argc, char** argv) {
  spillway::Options options;
  const auto parser = spillway::makeParser(options);
  try {
    parser->parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int status = parser->exit(error);
    return status == 0 ? 0 : 2;
  }
  libbpf_set_print(spillway::printWarnings);
  return spillway::run(options);
}
