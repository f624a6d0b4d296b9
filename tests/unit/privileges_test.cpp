// spillwayd's drop from root to [control] user (control/privileges.hpp): the
// capabilities each configuration keeps, and, in a forked child started as
// root, what the kernel reports afterwards for the calling thread, a thread
// started after the early restriction and before the drop (as the EAL's
// are) and one started after it (as the announcer is); the early
// restriction refuses once a thread exists.
#include "control/host/privileges.hpp"

#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>

namespace spillway {
namespace {

PortConfig port(const std::string& devargs, ExceptionMode exception = ExceptionMode::None) {
  PortConfig p;
  p.name = "p";
  p.devargs = devargs;
  p.exception = exception;
  return p;
}

std::vector<int> caps(const std::vector<KeptCapability>& keep) {
  std::vector<int> out;
  for (const auto& k : keep) out.push_back(k.cap);
  return out;
}

TEST(Privileges, AnAfPacketGatewayKeepsOnlyNetRaw) {
  Config c;
  c.ports.push_back(port("net_af_packet0,iface=eth0"));
  EXPECT_EQ(caps(capabilitiesToKeep(c)), std::vector<int>{CAP_NET_RAW});
  c.ports[0] = port("0000:3b:00.0");  // vfio-pci
  EXPECT_EQ(caps(capabilitiesToKeep(c)), std::vector<int>{CAP_NET_RAW});
  EXPECT_EQ(capabilityNames(capabilitiesToKeep(c)), "cap_net_raw");
}

TEST(Privileges, AnnounceAfXdpAndTapsKeepNetAdminEachSayingWhy) {
  Config c;
  c.ports.push_back(port("0000:3b:00.0"));
  c.announce.enabled = true;
  auto keep = capabilitiesToKeep(c);
  ASSERT_EQ(caps(keep), (std::vector<int>{CAP_NET_ADMIN, CAP_NET_RAW}));
  EXPECT_NE(keep[0].why.find("[announce]"), std::string::npos);

  Config t;
  t.ports.push_back(port("0000:3b:00.0", ExceptionMode::Tap));
  keep = capabilitiesToKeep(t);
  ASSERT_EQ(caps(keep), (std::vector<int>{CAP_NET_ADMIN, CAP_NET_RAW}));
  EXPECT_NE(keep[0].why.find("exception tap"), std::string::npos);

  Config x;
  x.ports.push_back(port("net_af_xdp0,iface=eth0"));
  keep = capabilitiesToKeep(x);
  // cap_bpf where the kernel knows it (5.8 and later).
  const bool bpf = prctl(PR_CAPBSET_READ, CAP_BPF, 0, 0, 0) >= 0;
  EXPECT_EQ(caps(keep), bpf ? (std::vector<int>{CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF})
                            : (std::vector<int>{CAP_NET_ADMIN, CAP_NET_RAW}));
  EXPECT_NE(keep[0].why.find("af_xdp"), std::string::npos);
}

TEST(Privileges, AMissingUserNamesTheFix) {
  std::string error;
  EXPECT_FALSE(lookupRunAsUser("no-such-user-4711", error));
  EXPECT_NE(error.find("does not exist"), std::string::npos) << error;
  EXPECT_NE(error.find("useradd --system"), std::string::npos) << error;
  EXPECT_FALSE(lookupRunAsUser("root", error));
  EXPECT_NE(error.find("uid 0"), std::string::npos) << error;
}

// What a child reports back through its exit status: 0 when every check held,
// else the number of the first that failed.
int dropInChild(const RunAsUser& user, const std::vector<KeptCapability>& keep) {
  const std::uint64_t kept = capabilityMask(keep);
  if (auto e = restrictBeforeThreads(keep)) {
    std::fprintf(stderr, "restrict: %s\n", e->c_str());
    return 10;
  }
  // Still root, with root's effective set (the EAL needs it), but the
  // bounding set is narrowed and no_new_privs is set already.
  const ThreadCredentials restricted = currentCredentials();
  if (restricted.euid != 0 || restricted.bounding != kept || !restricted.noNewPrivs) return 11;
  if ((restricted.effective >> CAP_SYS_ADMIN & 1) == 0) return 12;
  std::atomic<bool> before{false};
  std::atomic<bool> release{false};
  ThreadCredentials earlier;
  std::thread old([&] {  // exists before the drop, as the EAL's threads do
    before = true;
    while (!release) std::this_thread::yield();
    earlier = currentCredentials();
  });
  while (!before) std::this_thread::yield();
  if (auto e = dropPrivileges(user, keep)) {
    std::fprintf(stderr, "drop: %s\n", e->c_str());
    release = true;
    old.join();
    return 1;
  }
  release = true;
  old.join();
  const ThreadCredentials self = currentCredentials();
  if (self.euid != user.uid || self.ruid != user.uid || self.suid != user.uid) return 2;
  if (self.egid != user.gid) return 3;
  if (self.permitted != kept || self.effective != kept || self.bounding != kept) return 4;
  if (self.ambient != 0 || self.inheritable != 0 || !self.noNewPrivs) return 5;
  // The thread from before: glibc moved it to the user too, and the kernel
  // cleared every capability it had (it did not keep them); its bounding set
  // and no_new_privs came from the restriction before it started.
  if (earlier.euid != user.uid || earlier.permitted != 0 || earlier.effective != 0) return 6;
  if (earlier.bounding != kept || !earlier.noNewPrivs) return 13;
  ThreadCredentials later;
  std::thread fresh([&] { later = currentCredentials(); });
  fresh.join();
  if (later.euid != user.uid || later.permitted != kept || later.effective != kept ||
      later.bounding != kept || !later.noNewPrivs) {
    return 7;
  }
  if (setuid(0) == 0 || seteuid(0) == 0) return 8;
  // A file only root may read is out of reach now.
  if (std::ifstream("/etc/shadow").good()) return 9;
  return 0;
}

TEST(Privileges, AfterTheDropEveryThreadIsTheUserWithOnlyTheKeptCapabilities) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (CI runs as root)";
  std::string error;
  auto user = lookupRunAsUser("nobody", error);
  ASSERT_TRUE(user) << error;
  Config c;
  c.ports.push_back(port("0000:3b:00.0"));
  c.announce.enabled = true;
  const auto keep = capabilitiesToKeep(c);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(dropInChild(*user, keep));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "check " << WEXITSTATUS(status) << " failed";
}

// The freeze guard's case: forked after spillwayd's early restriction, it
// drops to fewer capabilities (cap_net_admin only), and its bounding set
// follows.
TEST(Privileges, AProcessForkedAfterTheRestrictionDropsToLess) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (CI runs as root)";
  std::string error;
  auto user = lookupRunAsUser("nobody", error);
  ASSERT_TRUE(user) << error;
  Config c;
  c.ports.push_back(port("0000:3b:00.0"));
  c.announce.enabled = true;
  const auto daemonKeeps = capabilitiesToKeep(c);  // cap_net_admin, cap_net_raw
  const std::vector<KeptCapability> guardKeeps{{CAP_NET_ADMIN, "cap_net_admin", "guard"}};
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (restrictBeforeThreads(daemonKeeps)) _exit(30);
    const pid_t guard = fork();
    if (guard < 0) _exit(31);
    if (guard == 0) {
      if (auto e = dropPrivileges(*user, guardKeeps)) {
        std::fprintf(stderr, "guard drop: %s\n", e->c_str());
        _exit(32);
      }
      const ThreadCredentials g = currentCredentials();
      const std::uint64_t admin = std::uint64_t{1} << CAP_NET_ADMIN;
      _exit(g.euid == user->uid && g.bounding == admin && g.permitted == admin &&
                    g.effective == admin && g.noNewPrivs
                ? 0
                : 33);
    }
    int gs = 0;
    if (waitpid(guard, &gs, 0) != guard || !WIFEXITED(gs)) _exit(34);
    // The daemon side is untouched by its child's drop.
    const ThreadCredentials d = currentCredentials();
    if (d.euid != 0 || d.bounding != capabilityMask(daemonKeeps)) _exit(35);
    _exit(WEXITSTATUS(gs));
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "check " << WEXITSTATUS(status) << " failed";
}

TEST(Privileges, TheEarlyRestrictionRefusesOnceAThreadExists) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (CI runs as root)";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::atomic<bool> release{false};
    std::thread early([&] {
      while (!release) std::this_thread::yield();
    });
    auto e = restrictBeforeThreads({});
    release = true;
    early.join();
    // Refused, saying why, and nothing changed.
    if (!e || e->find("before the first thread") == std::string::npos) _exit(20);
    const ThreadCredentials c = currentCredentials();
    _exit(c.noNewPrivs || (c.bounding >> CAP_SYS_ADMIN & 1) == 0 ? 21 : 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "check " << WEXITSTATUS(status) << " failed";
}

TEST(Privileges, NotRootIsAClearError) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to become someone else first";
  std::string error;
  auto user = lookupRunAsUser("nobody", error);
  ASSERT_TRUE(user) << error;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (setresuid(user->uid, user->uid, user->uid) != 0) _exit(10);
    auto e = dropPrivileges(*user, {});
    _exit(e && e->find("started as root") != std::string::npos ? 0 : 11);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << WEXITSTATUS(status);
}

}  // namespace
}  // namespace spillway
