#include "control/host/privileges.hpp"

#include <cap-ng.h>
#include <dirent.h>
#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "spillway/errno_text.hpp"

namespace spillway {
namespace {

bool hasAfXdpPort(const Config& config) {
  return std::any_of(config.ports.begin(), config.ports.end(),
                     [](const PortConfig& p) { return p.devargs.starts_with("net_af_xdp"); });
}

// The highest capability this kernel knows (PR_CAPBSET_READ answers EINVAL
// above it).
int lastCapability() {
  int last = 0;
  while (last < 63 && prctl(PR_CAPBSET_READ, last + 1, 0, 0, 0) >= 0) ++last;
  return last;
}

// libcap-ng's state for the calling thread set to `keep` in the bounding set
// (CAPNG_SELECT_BOUNDS) and applied: every other capability is dropped from
// the bounding set. Needs CAP_SETPCAP in the effective set (root has it).
std::optional<std::string> narrowBoundingSet(std::uint64_t keep) {
  if (capng_get_caps_process() != 0) return "capng_get_caps_process: " + errnoText(errno);
  capng_clear(CAPNG_SELECT_BOUNDS);
  for (int cap = 0; cap <= lastCapability(); ++cap) {
    if (((keep >> cap) & 1) == 0) continue;
    if (capng_update(CAPNG_ADD, CAPNG_BOUNDING_SET, static_cast<unsigned>(cap)) != 0) {
      return "capng_update " + std::to_string(cap) + ": " + errnoText(errno);
    }
  }
  if (capng_apply(CAPNG_SELECT_BOUNDS) != 0) {
    return "capng_apply(bounding set): " + errnoText(errno);
  }
  return std::nullopt;
}

std::optional<std::string> setNoNewPrivs() {
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    return "PR_SET_NO_NEW_PRIVS: " + errnoText(errno);
  }
  return std::nullopt;
}

std::size_t threadCount() {
  std::size_t n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') ++n;
    }
    closedir(d);
  }
  return n;
}

}  // namespace

std::optional<RunAsUser> lookupRunAsUser(const std::string& name, std::string& error) {
  passwd pw{};
  passwd* found = nullptr;
  std::vector<char> buffer(16384);
  const int rc = getpwnam_r(name.c_str(), &pw, buffer.data(), buffer.size(), &found);
  if (rc != 0 || found == nullptr) {
    error = "user '" + name + "' ([control] user) " +
            (rc != 0 ? "could not be looked up: " + errnoText(rc) : std::string("does not exist")) +
            ": create it (useradd --system --no-create-home --shell /usr/sbin/nologin " + name +
            ") or set [control] user = \"\" to run as root";
    return std::nullopt;
  }
  if (pw.pw_uid == 0) {
    error = "user '" + name + "' ([control] user) is uid 0: that is root under another name";
    return std::nullopt;
  }
  RunAsUser user{name, pw.pw_uid, pw.pw_gid, {}};
  int count = 64;
  std::vector<gid_t> groups(static_cast<std::size_t>(count));
  while (getgrouplist(name.c_str(), pw.pw_gid, groups.data(), &count) < 0) {
    if (count > 65536) {
      error = "user '" + name + "' ([control] user): more than 65536 groups";
      return std::nullopt;
    }
    groups.resize(static_cast<std::size_t>(count));
  }
  groups.resize(static_cast<std::size_t>(count));
  user.groups = std::move(groups);
  return user;
}

std::vector<KeptCapability> capabilitiesToKeep(const Config& config) {
  std::vector<KeptCapability> keep;
  keep.push_back({CAP_NET_RAW, "cap_net_raw",
                  "encapsulated health probes (raw sockets) and next-hop solicitations "
                  "(SO_BINDTODEVICE)"});
  const bool afXdp = hasAfXdpPort(config);
  const bool tap = std::any_of(config.ports.begin(), config.ports.end(), [](const PortConfig& p) {
    return p.exception == ExceptionMode::Tap;
  });
  if (config.announce.enabled || afXdp || tap) {
    std::string why;
    const auto add = [&why](const char* what) {
      why += (why.empty() ? "" : ", ") + std::string(what);
    };
    if (config.announce.enabled) add("[announce]: the TAP device and its VIP routes");
    if (afXdp) add("af_xdp ports detach their XDP program when they stop");
    if (tap) add("exception taps are set down when their port closes");
    keep.push_back({CAP_NET_ADMIN, "cap_net_admin", why});
  }
  if (afXdp && lastCapability() >= CAP_BPF) {
    keep.push_back({CAP_BPF, "cap_bpf",
                    "the XDP VIP map is updated on VIP changes (kernels before 6.5 check every "
                    "bpf() call)"});
  }
  std::sort(keep.begin(), keep.end(),
            [](const KeptCapability& a, const KeptCapability& b) { return a.cap < b.cap; });
  return keep;
}

std::uint64_t capabilityMask(const std::vector<KeptCapability>& keep) {
  std::uint64_t mask = 0;
  for (const KeptCapability& k : keep) mask |= std::uint64_t{1} << k.cap;
  return mask;
}

std::string capabilityNames(const std::vector<KeptCapability>& keep) {
  std::string names;
  for (const KeptCapability& k : keep) names += (names.empty() ? "" : ",") + k.name;
  return names.empty() ? "none" : names;
}

std::optional<std::string> restrictBeforeThreads(const std::vector<KeptCapability>& keep) {
  if (geteuid() != 0) return std::nullopt;  // dropPrivileges says why it cannot go on
  if (const std::size_t n = threadCount(); n != 1) {
    return "the process already has " + std::to_string(n) +
           " threads: the bounding set and no_new_privs must be set before the first thread "
           "starts, or the earlier ones keep root's";
  }
  if (auto e = narrowBoundingSet(capabilityMask(keep))) return e;
  return setNoNewPrivs();
}

std::optional<std::string> dropPrivileges(const RunAsUser& user,
                                          const std::vector<KeptCapability>& keep) {
  if (geteuid() != 0) {
    return "[control] user = \"" + user.name +
           "\" needs spillwayd started as root (it runs as uid " + std::to_string(geteuid()) + ")";
  }
  const std::uint64_t kept = capabilityMask(keep);
  // Idempotent after restrictBeforeThreads; narrows further in a process
  // that keeps less (the freeze guard).
  if (auto e = narrowBoundingSet(kept)) return e;
  if (setgroups(user.groups.size(), user.groups.data()) != 0) {
    return "setgroups: " + errnoText(errno);
  }
  // The capabilities to end with; capng_change_id keeps them across the uid
  // change (PR_SET_KEEPCAPS, setresgid, setresuid, which glibc applies to
  // every thread of the process: the kernel clears every capability of the
  // threads that did not keep them), then applies them and clears
  // keepcaps and the ambient set.
  capng_clear(CAPNG_SELECT_CAPS);
  for (const KeptCapability& k : keep) {
    if (capng_update(CAPNG_ADD, static_cast<capng_type_t>(CAPNG_EFFECTIVE | CAPNG_PERMITTED),
                     static_cast<unsigned>(k.cap)) != 0) {
      return "capng_update " + k.name + ": " + errnoText(errno);
    }
  }
  if (const int rc = capng_change_id(static_cast<int>(user.uid), static_cast<int>(user.gid),
                                     CAPNG_CLEAR_AMBIENT);
      rc != 0) {
    return "capng_change_id: error " + std::to_string(rc) + " (" + errnoText(errno) + ")";
  }
  if (auto e = setNoNewPrivs()) return e;

  // Believe the kernel, not the calls: the result must be exactly this.
  const ThreadCredentials now = currentCredentials();
  if (now.ruid != user.uid || now.euid != user.uid || now.suid != user.uid ||
      now.rgid != user.gid || now.egid != user.gid || now.sgid != user.gid) {
    return "the uids or gids did not all change";
  }
  if (now.permitted != kept || now.effective != kept || now.inheritable != 0 ||
      now.bounding != kept || now.ambient != 0 || !now.noNewPrivs) {
    return "the capability sets are not the kept ones";
  }
  if (setuid(0) == 0) return "setuid(0) still succeeds";
  return std::nullopt;
}

ThreadCredentials currentCredentials() {
  ThreadCredentials c;
  (void)getresuid(&c.ruid, &c.euid, &c.suid);
  (void)getresgid(&c.rgid, &c.egid, &c.sgid);
  // libcap-ng reads the calling thread's sets (capget) and its bounding set.
  if (capng_get_caps_process() == 0) {
    const int last = lastCapability();
    for (int cap = 0; cap <= last; ++cap) {
      const auto bit = std::uint64_t{1} << cap;
      const auto u = static_cast<unsigned>(cap);
      if (capng_have_capability(CAPNG_PERMITTED, u) == 1) c.permitted |= bit;
      if (capng_have_capability(CAPNG_EFFECTIVE, u) == 1) c.effective |= bit;
      if (capng_have_capability(CAPNG_INHERITABLE, u) == 1) c.inheritable |= bit;
      if (capng_have_capability(CAPNG_BOUNDING_SET, u) == 1) c.bounding |= bit;
      if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, cap, 0, 0) == 1) c.ambient |= bit;
    }
  }
  c.noNewPrivs = prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1;
  return c;
}

}  // namespace spillway
