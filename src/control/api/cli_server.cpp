#include "control/api/cli_server.hpp"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <utility>

#include "control/sys/epoll_loop.hpp"
#include "spillway/errno_text.hpp"

namespace spillway {
namespace {

constexpr int kListenBacklog = 64;
constexpr int kMaxEventsPerPoll = 64;
constexpr int kMaxAcceptsPerPoll = 64;
// Replies up to kMaxReplyBytes must fit one message: the send buffer bounds
// the largest datagram of an AF_UNIX socket.
constexpr int kReplySendBuffer = static_cast<int>(kMaxReplyBytes + 64 * 1024);

// A gid from a group name, or from a number.
bool resolveGroup(const std::string& name, gid_t& gid, std::string& error) {
  group entry{};
  group* found = nullptr;
  std::vector<char> buffer(16384);
  for (;;) {
    const int rc = getgrnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found);
    if (rc == ERANGE && buffer.size() < (1u << 22)) {
      buffer.resize(buffer.size() * 2);
      continue;
    }
    break;
  }
  if (found != nullptr) {
    gid = found->gr_gid;
    return true;
  }
  std::uint32_t number = 0;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), number);
  if (ec == std::errc() && end == name.data() + name.size() && !name.empty()) {
    gid = static_cast<gid_t>(number);
    return true;
  }
  error =
      "unknown group '" + name + "' (control socket_group): no such group in the group database";
  return false;
}

PeerCredentials readPeer(int fd, bool& ok) {
  PeerCredentials peer;
  ucred cred{};
  socklen_t len = sizeof cred;
  ok = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0;
  if (!ok) return peer;
  peer.pid = cred.pid;
  peer.uid = cred.uid;
  peer.gid = cred.gid;
#ifdef SO_PEERGROUPS
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 4; ++attempt) {
    socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &bytes) == 0) {
      groups.resize(bytes / sizeof(gid_t));
      peer.groups.assign(groups.begin(), groups.end());
      break;
    }
    if (errno != ERANGE) break;
    groups.resize(bytes / sizeof(gid_t) + 1);
  }
#endif
  return peer;
}

std::string describePeer(const PeerCredentials& peer) {
  return "pid=" + std::to_string(peer.pid) + " uid=" + std::to_string(peer.uid) +
         " gid=" + std::to_string(peer.gid);
}

}  // namespace

CliServerOptions CliServerOptions::fromConfig(const ControlConfig& config, CliLog log) {
  CliServerOptions options;
  options.socketPath = config.socketPath;
  options.socketGroup = config.socketGroup;
  options.log = std::move(log);
  return options;
}

CliServer::CliServer(ControlApi& api, CliServerOptions options)
    : api_(api), options_(std::move(options)) {}

CliServer::~CliServer() {
  close();
}

std::chrono::steady_clock::time_point CliServer::now() const {
  return options_.clock ? options_.clock() : std::chrono::steady_clock::now();
}

std::uint64_t CliServer::nowMs() const {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now().time_since_epoch()).count());
}

void CliServer::noteRefusal(std::string_view source, std::string_view reason) noexcept {
  try {
    if (auto line = refusals_.note(nowMs(), source, reason)) log(*line);
  } catch (...) {
  }
}

void CliServer::log(const std::string& line) const noexcept {
  if (!options_.log) return;
  try {
    options_.log(line);
  } catch (...) {
    // A failing logger must not take the socket down.
  }
}

bool CliServer::open(std::string& error) {
  close();
  const std::string& path = options_.socketPath;
  const auto fail = [&](std::string why) {
    error = "control socket " + path + ": " + why;
    close();
    return false;
  };
  sockaddr_un addr{};
  if (!fillUnixAddress(path, addr)) {
    return fail(path.empty()
                    ? "no path configured"
                    : "path longer than " + std::to_string(sizeof addr.sun_path - 1) + " bytes");
  }
  gid_t gid = getegid();
  if (!options_.socketGroup.empty()) {
    std::string why;
    if (!resolveGroup(options_.socketGroup, gid, why)) return fail(why);
  }

  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty() && !std::filesystem::exists(parent, ec)) {
    std::filesystem::create_directories(parent, ec);
    if (ec) return fail("cannot create directory " + parent.string() + ": " + ec.message());
  }

  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return fail("exists and is not a socket; not replacing it");
    const int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (probe < 0) return fail("socket: " + errnoText(errno));
    const int rc = ::connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
    const int err = errno;
    ::close(probe);
    if (rc == 0 || err == EAGAIN || err == EPROTOTYPE) {
      return fail("another process is listening on it (is spillwayd already running?)");
    }
    if (err != ECONNREFUSED && err != ENOENT) return fail("probing it: " + errnoText(err));
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return fail("cannot remove the stale socket: " + errnoText(errno));
    }
  }

  listenFd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listenFd_ < 0) return fail("socket: " + errnoText(errno));
  if (bind(listenFd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    return fail("bind: " + errnoText(errno));
  }
  if (stat(path.c_str(), &st) == 0) {
    socketDev_ = st.st_dev;
    socketIno_ = st.st_ino;
  }
  // Mode and group before listen(): nobody can connect before then.
  if (::chmod(path.c_str(), 0660) != 0) return fail("chmod 0660: " + errnoText(errno));
  if (!options_.socketGroup.empty() && ::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    return fail("chown to group " + options_.socketGroup + ": " + errnoText(errno));
  }
  if (listen(listenFd_, kListenBacklog) != 0) return fail("listen: " + errnoText(errno));

  if (std::string why = watchListener(listenFd_, epollFd_); !why.empty()) return fail(why);

  policy_ = options_.policy;
  policy_.uids.push_back(static_cast<std::uint32_t>(geteuid()));
  policy_.gids.push_back(static_cast<std::uint32_t>(gid));
  buffer_.assign(kMaxRequestBytes + 1, '\0');
  return true;
}

void CliServer::close() noexcept {
  while (!clients_.empty()) closeClient(clients_.begin()->first);
  if (epollFd_ >= 0) ::close(epollFd_);
  epollFd_ = -1;
  if (listenFd_ >= 0) {
    ::close(listenFd_);
    listenFd_ = -1;
    struct stat st {};
    if (socketIno_ != 0 && lstat(options_.socketPath.c_str(), &st) == 0 &&
        static_cast<std::uint64_t>(st.st_dev) == socketDev_ &&
        static_cast<std::uint64_t>(st.st_ino) == socketIno_) {
      ::unlink(options_.socketPath.c_str());
    }
  }
  socketDev_ = socketIno_ = 0;
}

void CliServer::watch(std::uint64_t id, const Client& client, bool writable) noexcept {
  epoll_event ev{};
  ev.events = writable ? EPOLLOUT : EPOLLIN;
  ev.data.u64 = id;
  epoll_ctl(epollFd_, EPOLL_CTL_MOD, client.fd, &ev);
}

void CliServer::closeClient(std::uint64_t id) noexcept {
  spillway::closeClient(epollFd_, clients_, id);
}

void CliServer::poll() noexcept {
  if (epollFd_ < 0) return;
  dispatchReady<kMaxEventsPerPoll>(
      epollFd_, clients_, [this] { acceptClients(); },
      [this](std::uint64_t id, Client& client, std::uint32_t events) {
        if (!client.pendingReply.empty()) {
          if (events & (EPOLLERR | EPOLLHUP)) {
            closeClient(id);
          } else {
            flush(id, client);
          }
          return;
        }
        serveOne(id, client);
      });
  // Idle clients go, so a stuck one cannot hold a slot for ever; one that
  // has asked nothing (or sits in a change slot) goes sooner.
  try {
    const auto t = now();
    closeExpired(
        clients_,
        [&](const Client& client) {
          const bool brief = !client.served || client.changeSlot;
          return t - client.lastActive >=
                 (brief ? options_.firstRequestTimeout : options_.idleTimeout);
        },
        [this](std::uint64_t id) { closeClient(id); });
    if (auto line = refusals_.flush(nowMs())) log(*line);
  } catch (...) {
  }
}

void CliServer::acceptClients() noexcept {
  const std::size_t cap = options_.maxClients;
  const std::size_t rootSlots = std::min(options_.rootSlots, cap);
  const std::size_t changeSlots = std::min(options_.changeSlots, cap - rootSlots);
  for (int i = 0; i < kMaxAcceptsPerPoll; ++i) {
    const int fd = accept4(listenFd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or a connection that died in the backlog
    bool adopted = false;
    try {
      bool ok = false;
      PeerCredentials peer = readPeer(fd, ok);
      const std::size_t n = clients_.size();
      const bool root = ok && peer.uid == 0;
      const bool general = n + rootSlots + changeSlots < cap;
      const bool changeSlot = !root && !general && n + rootSlots < cap;
      if (ok && (root ? n >= cap : !general && !changeSlot)) {
        refuse(fd, peer,
               std::to_string(n) + " CLI connections (" + std::to_string(cap) + " at most, " +
                   std::to_string(rootSlots) + " kept for root, " + std::to_string(changeSlots) +
                   " for changes); try again");
      } else if (ok) {
        const int size = kReplySendBuffer;
        if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size) != 0) {
          (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
        }
        const std::uint64_t id = nextId_++;
        Client client;
        client.fd = fd;
        client.peer = std::move(peer);
        client.lastActive = now();
        client.changeSlot = changeSlot;
        adopted = adoptClient(epollFd_, clients_, id, std::move(client));
      }
    } catch (...) {
      // Out of memory: drop this connection, keep the server.
    }
    if (!adopted) ::close(fd);
  }
}

// The refused client reads its reply before the close: whatever it has sent
// is read first, since closing a Unix socket with unread messages resets the
// peer's connection (and a reset hides the reply behind "Connection reset").
void CliServer::refuse(int fd, const PeerCredentials& peer, std::string_view why) noexcept {
  try {
    const std::string busy = makeErrorReply("busy", why);
    (void)::send(fd, busy.data(), busy.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    noteRefusal(describePeer(peer), "busy: all client slots taken");
  } catch (...) {
  }
  for (int i = 0; i < 16; ++i) {
    char sink[256];
    if (recv(fd, sink, sizeof sink, MSG_DONTWAIT | MSG_TRUNC) <= 0) break;
  }
  (void)::shutdown(fd, SHUT_RDWR);
}

void CliServer::serveOne(std::uint64_t id, Client& client) noexcept {
  const ssize_t n = recv(client.fd, buffer_.data(), buffer_.size(), MSG_DONTWAIT | MSG_TRUNC);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
    closeClient(id);
    return;
  }
  if (n == 0) {  // the peer hung up (or sent an empty message, which is no request)
    closeClient(id);
    return;
  }
  try {
    client.lastActive = now();
    const auto size = static_cast<std::size_t>(n);
    if (size > kMaxRequestBytes) {
      noteRefusal(describePeer(client.peer),
                  "request larger than " + std::to_string(kMaxRequestBytes) + " bytes");
      send(id, client,
           makeErrorReply("too_large", "request of " + std::to_string(size) +
                                           " bytes exceeds the limit of " +
                                           std::to_string(kMaxRequestBytes)));
      return;
    }
    client.served = true;
    RequestOutcome outcome =
        processRequest(std::string_view(buffer_.data(), size), api_, client.peer, policy_,
                       client.changeSlot ? Admission::ChangesOnly : Admission::Any);
    // A read in a change slot is told busy and the slot freed.
    if (client.changeSlot && outcome.errorCode == "busy") client.closeAfterReply = true;
    if (outcome.write) {
      log("cli: " + describePeer(client.peer) + " " + outcome.command + " " + outcome.args + ": " +
          (outcome.ok ? std::string("ok") : outcome.errorCode));
    }
    send(id, client, std::move(outcome.reply));
  } catch (...) {
    closeClient(id);
  }
}

void CliServer::send(std::uint64_t id, Client& client, std::string reply) noexcept {
  const ssize_t n = ::send(client.fd, reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n >= 0) {
    if (client.closeAfterReply) closeClient(id);
    return;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK) {
    client.pendingReply = std::move(reply);
    watch(id, client, true);
    return;
  }
  if (errno == EMSGSIZE) {
    try {
      const std::string small =
          makeErrorReply("reply_too_large", "the reply of " + std::to_string(reply.size()) +
                                                " bytes exceeds the socket's message size limit");
      if (::send(client.fd, small.data(), small.size(), MSG_DONTWAIT | MSG_NOSIGNAL) >= 0) return;
    } catch (...) {
    }
  }
  closeClient(id);
}

void CliServer::flush(std::uint64_t id, Client& client) noexcept {
  const ssize_t n = ::send(client.fd, client.pendingReply.data(), client.pendingReply.size(),
                           MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    closeClient(id);
    return;
  }
  if (client.closeAfterReply) {
    closeClient(id);
    return;
  }
  client.pendingReply.clear();
  client.pendingReply.shrink_to_fit();
  try {
    client.lastActive = now();
  } catch (...) {
  }
  watch(id, client, false);
}

}  // namespace spillway
