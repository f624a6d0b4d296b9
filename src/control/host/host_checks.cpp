#include "control/host/host_checks.hpp"

#include <grp.h>
#include <net/if.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

namespace spillway {
namespace {

class SystemHostProbe final : public HostProbe {
 public:
  bool groupExists(const std::string& name) const override {
    std::vector<char> buffer(16384);
    group entry{};
    group* found = nullptr;
    return ::getgrnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found) == 0 &&
           found != nullptr;
  }
  bool userExists(const std::string& name) const override {
    std::vector<char> buffer(16384);
    passwd entry{};
    passwd* found = nullptr;
    return ::getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found) == 0 &&
           found != nullptr;
  }
  bool interfaceExists(const std::string& name) const override {
    return ::if_nametoindex(name.c_str()) != 0;
  }
  std::optional<std::string> existingAncestor(const std::string& path) const override {
    std::filesystem::path p(path);
    std::error_code ec;
    while (!p.empty()) {
      if (std::filesystem::exists(p, ec)) return p.string();
      if (p == p.parent_path()) break;
      p = p.parent_path();
    }
    return std::nullopt;
  }
  bool isDirectory(const std::string& path) const override {
    std::error_code ec;
    return std::filesystem::is_directory(path, ec);
  }
  bool writable(const std::string& dir) const override {
    return ::access(dir.c_str(), W_OK | X_OK) == 0;
  }
  bool isRoot() const override { return ::geteuid() == 0; }
  std::optional<unsigned long> freeHugepages() const override {
    std::ifstream in("/proc/meminfo");
    std::string key;
    unsigned long value = 0;
    while (in >> key >> value) {
      if (key == "HugePages_Free:") return value;
      in.ignore(1 << 10, '\n');
    }
    return std::nullopt;
  }
};

HostCheck ok(std::string what) {
  return {HostCheckOutcome::Ok, std::move(what), {}};
}
HostCheck failed(std::string what, std::string next) {
  return {HostCheckOutcome::Failed, std::move(what), std::move(next)};
}
HostCheck notChecked(std::string what, std::string why) {
  return {HostCheckOutcome::NotChecked, std::move(what), std::move(why)};
}

// A directory start-up writes to, creating it (and its parents) if missing.
void checkDirectory(std::vector<HostCheck>& out, const HostProbe& host, const std::string& key,
                    const std::string& dir, const std::string& emptyMeans) {
  if (dir.empty()) {
    out.push_back(ok(key + " = \"\": " + emptyMeans));
    return;
  }
  const std::string what = key + " \"" + dir + "\"";
  const std::optional<std::string> at = host.existingAncestor(dir);
  if (!at) {
    out.push_back(failed(what + ": no existing directory above it", "use an absolute path"));
    return;
  }
  if (!host.isDirectory(*at)) {
    out.push_back(failed(what + ": " + *at + " is not a directory",
                         "remove it or choose another path for " + key));
    return;
  }
  const std::string how = *at == dir ? "exists" : "will be created under " + *at;
  if (!host.isRoot()) {
    out.push_back(
        notChecked(what + ": " + how, "whether root may write there (run --check-config as root)"));
    return;
  }
  if (!host.writable(*at)) {
    out.push_back(failed(what + ": " + *at + " is not writable (read-only file system?)",
                         "choose a writable path for " + key));
    return;
  }
  out.push_back(ok(what + ": " + how + ", writable"));
}

}  // namespace

const HostProbe& systemHostProbe() {
  static const SystemHostProbe probe;
  return probe;
}

std::string devargsInterface(const std::string& devargs) {
  std::size_t at = 0;
  while ((at = devargs.find("iface=", at)) != std::string::npos) {
    if (at == 0 || devargs[at - 1] == ',') {
      const std::size_t begin = at + 6;
      return devargs.substr(begin, devargs.find(',', begin) - begin);
    }
    at += 6;
  }
  return {};
}

std::vector<HostCheck> runHostChecks(const Config& config, const HostProbe& host) {
  std::vector<HostCheck> out;
  const ControlConfig& c = config.control;
  if (!host.isRoot()) {
    out.push_back(notChecked("privileges: spillwayd starts as root (DPDK, the tap, raw sockets)",
                             "this check runs as another user; checks that need root say so"));
  } else {
    out.push_back(ok("privileges: running as root"));
  }

  if (c.user.empty()) {
    out.push_back(ok("[control] user unset: spillwayd stays root"));
  } else if (host.userExists(c.user)) {
    out.push_back(ok("[control] user \"" + c.user + "\": the user exists"));
  } else {
    out.push_back(failed("[control] user \"" + c.user + "\": no such user",
                         "create it (useradd --system --user-group --no-create-home --shell "
                         "/usr/sbin/nologin " +
                             c.user + ") or set [control] user = \"\""));
  }
  if (c.socketGroup.empty()) {
    out.push_back(ok("[control] socket_group unset: the socket belongs to spillwayd's group"));
  } else if (host.groupExists(c.socketGroup)) {
    out.push_back(ok("[control] socket_group \"" + c.socketGroup + "\": the group exists"));
  } else {
    out.push_back(failed("[control] socket_group \"" + c.socketGroup + "\": no such group",
                         "create it (groupadd --system " + c.socketGroup +
                             ") or remove socket_group from [control]"));
  }
  if (c.socketPath.empty() || c.socketPath[0] != '/') {
    out.push_back(failed("[control] socket \"" + c.socketPath + "\": not an absolute path",
                         "give an absolute path, e.g. /run/spillway/spillway.sock"));
  } else {
    checkDirectory(out, host, "[control] socket's directory",
                   std::filesystem::path(c.socketPath).parent_path().string(), "");
  }
  checkDirectory(out, host, "[control] state_dir", c.stateDir,
                 "no journal and no flow checkpoint (nothing survives a restart)");
  if (!c.metricsListen.empty()) {
    out.push_back(notChecked("[control] metrics_listen " + c.metricsListen + ": free to bind",
                             "bound at start; a running spillwayd holds it"));
  }

  std::set<std::string> interfaces;
  for (const PortConfig& p : config.ports) {
    for (const std::string& name : {p.kernelInterface, devargsInterface(p.devargs)}) {
      if (name.empty() || !interfaces.insert(name).second) continue;
      const std::string what = "port " + p.name + ": interface " + name;
      if (p.exception == ExceptionMode::Tap && name == p.kernelInterface) {
        out.push_back(ok(what + ": the exception tap, created at start"));
        continue;
      }
      if (host.interfaceExists(name)) {
        out.push_back(ok(what + " exists"));
      } else {
        out.push_back(failed(what + " not found in this network namespace",
                             "create it, fix the port's devargs / kernel_interface, or run "
                             "--check-config where spillwayd will run (ip netns exec NS ...)"));
      }
    }
    if (p.devargs.rfind("0000:", 0) == 0 || p.devargs.find(':') == 2) {
      out.push_back(
          notChecked("port " + p.name + ": PCI device " + p.devargs + " bound to a DPDK driver",
                     "the EAL probes it at start (dpdk-devbind.py --status)"));
    }
  }

  if (const std::optional<unsigned long> free = host.freeHugepages()) {
    if (*free == 0) {
      out.push_back(notChecked("hugepages: none free",
                               "whether the EAL options say --no-huge -m 512; without it the "
                               "start fails (reserve some: scripts/bootstrap)"));
    } else {
      out.push_back(ok("hugepages: " + std::to_string(*free) + " free"));
    }
  } else {
    out.push_back(notChecked("hugepages", "/proc/meminfo unreadable"));
  }
  return out;
}

std::string formatHostChecks(const std::vector<HostCheck>& checks) {
  std::string text;
  for (const HostCheck& c : checks) {
    switch (c.outcome) {
      case HostCheckOutcome::Ok:
        text += "  ok           " + c.what + "\n";
        break;
      case HostCheckOutcome::Failed:
        text += "  FAILED       " + c.what + "\n               next: " + c.detail + "\n";
        break;
      case HostCheckOutcome::NotChecked:
        text += "  not checked  " + c.what + "\n               because: " + c.detail + "\n";
        break;
    }
  }
  return text;
}

bool anyFailed(const std::vector<HostCheck>& checks) {
  for (const HostCheck& c : checks) {
    if (c.outcome == HostCheckOutcome::Failed) return true;
  }
  return false;
}

}  // namespace spillway
