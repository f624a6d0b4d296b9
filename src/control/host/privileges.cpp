#include "control/host/privileges.hpp"

#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
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

struct CapSets {
  std::uint64_t permitted = 0, effective = 0, inheritable = 0;
};

std::optional<std::string> setCaps(const CapSets& s) {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  for (int i = 0; i < 2; ++i) {
    data[i].permitted = static_cast<std::uint32_t>(s.permitted >> (32 * i));
    data[i].effective = static_cast<std::uint32_t>(s.effective >> (32 * i));
    data[i].inheritable = static_cast<std::uint32_t>(s.inheritable >> (32 * i));
  }
  if (syscall(SYS_capset, &header, data) != 0) return "capset: " + errnoText(errno);
  return std::nullopt;
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

std::optional<std::string> dropPrivileges(const RunAsUser& user,
                                          const std::vector<KeptCapability>& keep) {
  if (geteuid() != 0) {
    return "[control] user = \"" + user.name +
           "\" needs spillwayd started as root (it runs as uid " + std::to_string(geteuid()) + ")";
  }
  const std::uint64_t kept = capabilityMask(keep);
  if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0) return "PR_SET_KEEPCAPS: " + errnoText(errno);
  if (setgroups(user.groups.size(), user.groups.data()) != 0) {
    return "setgroups: " + errnoText(errno);
  }
  if (setresgid(user.gid, user.gid, user.gid) != 0) return "setresgid: " + errnoText(errno);
  if (setresuid(user.uid, user.uid, user.uid) != 0) return "setresuid: " + errnoText(errno);
  // The permitted set survived (KEEPCAPS); the effective one did not. Take
  // back CAP_SETPCAP for as long as the bounding set is being narrowed.
  const std::uint64_t setpcap = std::uint64_t{1} << CAP_SETPCAP;
  if (auto e = setCaps({kept | setpcap, kept | setpcap, 0})) return e;
  const int last = lastCapability();
  for (int cap = 0; cap <= last; ++cap) {
    if ((kept >> cap) & 1) continue;
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) {
      return "PR_CAPBSET_DROP " + std::to_string(cap) + ": " + errnoText(errno);
    }
  }
  if (auto e = setCaps({kept, kept, 0})) return e;
  if (prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0) != 0) return "PR_SET_KEEPCAPS: " + errnoText(errno);
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL) {
    return "PR_CAP_AMBIENT_CLEAR_ALL: " + errnoText(errno);
  }
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
    return "PR_SET_NO_NEW_PRIVS: " + errnoText(errno);

  // Believe the kernel, not the calls: the result must be exactly this.
  const ThreadCredentials now = currentCredentials();
  if (now.ruid != user.uid || now.euid != user.uid || now.suid != user.uid ||
      now.rgid != user.gid || now.egid != user.gid || now.sgid != user.gid) {
    return "the uids or gids did not all change";
  }
  if (now.permitted != kept || now.effective != kept || now.inheritable != 0 ||
      (now.bounding & ~kept) != 0 || now.ambient != 0 || !now.noNewPrivs) {
    return "the capability sets are not the kept ones";
  }
  if (setuid(0) == 0) return "setuid(0) still succeeds";
  return std::nullopt;
}

ThreadCredentials currentCredentials() {
  ThreadCredentials c;
  (void)getresuid(&c.ruid, &c.euid, &c.suid);
  (void)getresgid(&c.rgid, &c.egid, &c.sgid);
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &header, data) == 0) {
    for (int i = 0; i < 2; ++i) {
      c.permitted |= std::uint64_t{data[i].permitted} << (32 * i);
      c.effective |= std::uint64_t{data[i].effective} << (32 * i);
      c.inheritable |= std::uint64_t{data[i].inheritable} << (32 * i);
    }
  }
  const int last = lastCapability();
  for (int cap = 0; cap <= last; ++cap) {
    if (prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1) c.bounding |= std::uint64_t{1} << cap;
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, cap, 0, 0) == 1) {
      c.ambient |= std::uint64_t{1} << cap;
    }
  }
  c.noNewPrivs = prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1;
  return c;
}

}  // namespace spillway
