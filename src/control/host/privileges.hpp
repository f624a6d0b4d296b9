// Least privilege for spillwayd: started as root (the EAL maps hugepages and
// binds devices, ports open raw sockets and attach XDP programs, the CLI
// socket is given its group), it then runs for the rest of its life as an
// unprivileged user ([control] user) with only the capabilities its running
// work still needs (capabilitiesToKeep: which and why), no others in its
// bounding set, and no_new_privs set.
//
// Why in process rather than a separate prober: everything that parses
// untrusted input (health probes, scrapes, HTTP, peer frames, CLI requests)
// runs in the control thread next to the tables it feeds; a separate
// process would still need CAP_NET_RAW for the encapsulated probes and a
// second protocol to hand results over. Dropping root in the one process
// takes away what a compromised parser could do with root (read or write
// any file, load modules, ptrace, change the host) with no new moving part.
//
// How, in two steps, through libcap-ng (no capset syscalls of our own):
// - restrictBeforeThreads, first thing after the configuration is read and
//   before any thread or the freeze guard exists: the bounding set is
//   narrowed to the kept capabilities and no_new_privs is set. Both are
//   per thread and inherited at clone, so every thread started later (the
//   EAL's interrupt, multi-process, worker and telemetry threads, TBB's, the
//   announcer) starts with them. Root's own effective set is untouched: the
//   EAL still maps hugepages and opens devices.
// - dropPrivileges, once everything that needs root is open: the
//   supplementary groups, then capng_change_id (PR_SET_KEEPCAPS on the
//   calling thread, setresgid/setresuid, which glibc applies to every thread
//   of the process; the kernel clears every capability of the threads that
//   did not keep them, so the EAL's threads keep none) and the calling
//   thread's permitted and effective sets set to the kept ones, the ambient
//   set cleared. Threads created afterwards (the announcer) inherit them.
//
// Thread contract: restrictBeforeThreads from the main thread while it is
// the only thread (it refuses otherwise); dropPrivileges once, from the
// main thread, before starting threads that need a kept capability, and
// with no other thread changing credentials.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "control/config/config.hpp"

namespace spillway {

struct RunAsUser {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups, the primary one included
};

// The user and its groups from the user database; an error that names the
// next step when there is no such user.
[[nodiscard]] std::optional<RunAsUser> lookupRunAsUser(const std::string& name, std::string& error);

struct KeptCapability {
  int cap = 0;
  std::string name;  // "cap_net_raw"
  std::string why;
};

// What the running daemon still needs with this configuration:
// - cap_net_raw, always: health probes of encapsulated backends send their
//   SYN through the tunnel on raw sockets, opened when the first such backend
//   appears (a runtime `backend add` or a reload may bring the first one), and
//   next-hop solicitations bind to the port's kernel interface
//   (SO_BINDTODEVICE).
// - cap_net_admin, with [announce] (the TAP device and its host routes, added
//   and withdrawn while running), with an af_xdp port (the PMD detaches its
//   XDP program when the port stops) or an exception tap (its link is set
//   down when the port closes).
// - cap_bpf, with an af_xdp port, where the kernel has it: the VIP map of the
//   redirect program is updated on every VIP change, and kernels before 6.5
//   check it on every bpf() call when unprivileged BPF is off.
// Nothing else: the listening sockets are bound, the hugepages mapped and
// locked and the devices open before the drop.
[[nodiscard]] std::vector<KeptCapability> capabilitiesToKeep(const Config& config);

// Narrows the bounding set to `keep` and sets no_new_privs, while the
// process is still root and has one thread; an error when it has more
// threads already or the kernel refuses. Nothing to do when not root.
[[nodiscard]] std::optional<std::string> restrictBeforeThreads(
    const std::vector<KeptCapability>& keep);

// Becomes `user` keeping exactly `keep`; on failure an error, and the process
// must not go on (it may be half-way).
[[nodiscard]] std::optional<std::string> dropPrivileges(const RunAsUser& user,
                                                        const std::vector<KeptCapability>& keep);

// The calling thread's credentials as the kernel reports them: the three
// uids, and the permitted, effective, inheritable, bounding and ambient
// capability masks, plus no_new_privs. For the log and for tests.
struct ThreadCredentials {
  uid_t ruid = 0, euid = 0, suid = 0;
  gid_t rgid = 0, egid = 0, sgid = 0;
  std::uint64_t permitted = 0, effective = 0, inheritable = 0, bounding = 0, ambient = 0;
  bool noNewPrivs = false;
};
[[nodiscard]] ThreadCredentials currentCredentials();

// 1 << cap for each kept capability.
[[nodiscard]] std::uint64_t capabilityMask(const std::vector<KeptCapability>& keep);

// "cap_net_admin,cap_net_raw" (or "none").
[[nodiscard]] std::string capabilityNames(const std::vector<KeptCapability>& keep);

}  // namespace spillway
