// Host checks: what start-up will need from the host beyond a valid
// configuration (`spillwayd --check-config`). A configuration can be valid
// and still fail at start: a socket_group that does not exist, a state_dir
// under a read-only path, a kernel interface that is not there. Each check
// gives one line: checked and fine, failed with the next step to take, or
// not checked and why (needs root, depends on the EAL options, belongs to
// another network namespace).
//
// Everything the checks ask of the host goes through HostProbe, so tests
// run them against a fake host. To add a check: a method on HostProbe if it
// needs the host, and a few lines in runHostChecks().
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "control/config/config.hpp"

namespace spillway {

enum class HostCheckOutcome { Ok, Failed, NotChecked };

struct HostCheck {
  HostCheckOutcome outcome = HostCheckOutcome::Ok;
  std::string what;    // "[control] socket_group \"spillway\": group exists"
  std::string detail;  // Failed: the next step; NotChecked: why not; Ok: empty
};

// What the checks may ask of the host. The system one (systemHostProbe())
// uses getgrnam_r, getpwnam_r, if_nametoindex, stat and access.
class HostProbe {
 public:
  virtual ~HostProbe() = default;
  [[nodiscard]] virtual bool groupExists(const std::string& name) const = 0;
  [[nodiscard]] virtual bool userExists(const std::string& name) const = 0;
  [[nodiscard]] virtual bool interfaceExists(const std::string& name) const = 0;
  // The nearest existing directory at or above `path` (for a path that
  // start-up creates), or nullopt when none (a relative path's root).
  [[nodiscard]] virtual std::optional<std::string> existingAncestor(
      const std::string& path) const = 0;
  [[nodiscard]] virtual bool isDirectory(const std::string& path) const = 0;
  [[nodiscard]] virtual bool writable(const std::string& dir) const = 0;
  [[nodiscard]] virtual bool isRoot() const = 0;
  // Free 2 MiB hugepages, nullopt when unknown.
  [[nodiscard]] virtual std::optional<unsigned long> freeHugepages() const = 0;
};

[[nodiscard]] const HostProbe& systemHostProbe();

[[nodiscard]] std::vector<HostCheck> runHostChecks(const Config& config, const HostProbe& host);

// "ok", "FAILED", "not checked" lines for people; one per check.
[[nodiscard]] std::string formatHostChecks(const std::vector<HostCheck>& checks);

[[nodiscard]] bool anyFailed(const std::vector<HostCheck>& checks);

// The interface a port's devargs names ("net_af_packet0,iface=eth0" ->
// "eth0"), empty when none.
[[nodiscard]] std::string devargsInterface(const std::string& devargs);

}  // namespace spillway
