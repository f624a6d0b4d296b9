// The operator's CLI socket: a Unix SOCK_SEQPACKET socket on which every
// message is one request and the answer one reply (protocol.hpp), and the
// client that spillwayctl and the tests use to talk to it.
//
// Gates, in order: the socket file's mode 0660 and group (ControlConfig's
// socket_group, or the daemon's group), so only its owner and group can
// connect; then the AccessPolicy (root, the daemon's user and the socket
// group's members may change state, any other peer only read); the peer's
// credentials (SO_PEERCRED, SO_PEERGROUPS) are read once at accept and logged
// with every request that changes state, granted or not.
//
// open() creates the parent directory when it is missing and replaces a
// socket file only when nothing listens on it (a second daemon on the same
// path fails instead of stealing it); the file is removed by close() when it
// is still the one this server created.
//
// Robustness: every socket is non-blocking and poll() never waits. A client
// gets at most one request served per poll() (fairness), its next request is
// not read while its last reply is still unsent, and a client that sends
// garbage, an oversized message or disconnects mid-way only ends its own
// connection.
//
// Slots: at most maxClients connections. The last rootSlots of them only
// root (uid 0) may take; the changeSlots below those only a connection whose
// first request changes state and is allowed to (a read there is answered
// "busy" and the connection closed). A client that has sent nothing is closed
// after firstRequestTimeout, one that has been served after idleTimeout (and
// after firstRequestTimeout in a change slot), so idle connections cannot
// hold the socket against root or an operator's change. A refused
// connection gets one readable error reply ("busy": how many are connected,
// try again) before the close; what it had sent is read and discarded first,
// so the kernel does not turn the close into a reset that hides the reply.
//
// Thread contract: the control thread only. Register pollFd() (an epoll fd,
// readable when any socket of the server is) with the control loop, call
// poll() when it is readable, and now and then (say once a second) so idle
// clients are closed. A CliClient is used by one thread at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "control/api/cli_client.hpp"
#include "control/api/control_api.hpp"
#include "control/api/protocol.hpp"
#include "control/config/config.hpp"
#include "control/sys/refusal_summary.hpp"

namespace spillway {

using CliClock = std::function<std::chrono::steady_clock::time_point()>;
using CliLog = std::function<void(std::string_view line)>;

struct CliServerOptions {
  std::string socketPath = ControlConfig{}.socketPath;
  std::string socketGroup;  // a group name or a numeric gid; empty: the daemon's group
  std::size_t maxClients = 64;
  std::size_t rootSlots = 4;    // of maxClients: root only
  std::size_t changeSlots = 4;  // of maxClients: a permitted change as the first request
  std::chrono::milliseconds idleTimeout{std::chrono::seconds(30)};
  std::chrono::milliseconds firstRequestTimeout{std::chrono::seconds(2)};
  // Writers besides root, the daemon's effective uid and the socket's group,
  // which open() adds.
  AccessPolicy policy;
  // One line per request that changes state; refused clients (busy, a
  // request too large) as RefusalSummary lines: the first at once, then one
  // summary every 10 s while they go on.
  CliLog log;
  CliClock clock;  // default: std::chrono::steady_clock::now

  [[nodiscard]] static CliServerOptions fromConfig(const ControlConfig& config, CliLog log = {});
};

class CliServer {
 public:
  CliServer(ControlApi& api, CliServerOptions options);
  ~CliServer();
  CliServer(const CliServer&) = delete;
  CliServer& operator=(const CliServer&) = delete;

  // Binds and listens. On failure `error` names the socket path and the
  // reason, and the server stays closed.
  [[nodiscard]] bool open(std::string& error);
  void close() noexcept;

  [[nodiscard]] int pollFd() const noexcept { return epollFd_; }
  // Accepts, reads, dispatches and replies to whatever is ready; never blocks.
  void poll() noexcept;

  [[nodiscard]] bool isOpen() const noexcept { return listenFd_ >= 0; }
  [[nodiscard]] std::size_t clientCount() const noexcept { return clients_.size(); }
  [[nodiscard]] const std::string& socketPath() const noexcept { return options_.socketPath; }
  // The policy in force (after open(): with the daemon's uid and the group).
  [[nodiscard]] const AccessPolicy& policy() const noexcept { return policy_; }

 private:
  struct Client {
    int fd = -1;
    PeerCredentials peer;
    std::string pendingReply;  // a reply the socket could not take yet
    std::chrono::steady_clock::time_point lastActive;
    bool served = false;      // it has sent a request
    bool changeSlot = false;  // admitted into a change slot
    bool closeAfterReply = false;
  };

  void acceptClients() noexcept;
  void refuse(int fd, const PeerCredentials& peer, std::string_view why) noexcept;
  void serveOne(std::uint64_t id, Client& client) noexcept;
  void flush(std::uint64_t id, Client& client) noexcept;
  void send(std::uint64_t id, Client& client, std::string reply) noexcept;
  void closeClient(std::uint64_t id) noexcept;
  void watch(std::uint64_t id, const Client& client, bool writable) noexcept;
  void log(const std::string& line) const noexcept;
  void noteRefusal(std::string_view source, std::string_view reason) noexcept;
  [[nodiscard]] std::uint64_t nowMs() const;
  [[nodiscard]] std::chrono::steady_clock::time_point now() const;

  ControlApi& api_;
  CliServerOptions options_;
  AccessPolicy policy_;
  int listenFd_ = -1;
  int epollFd_ = -1;
  std::uint64_t socketDev_ = 0;  // the bound file, so close() unlinks only our own
  std::uint64_t socketIno_ = 0;
  std::uint64_t nextId_ = 1;  // 0 is the listening socket
  std::map<std::uint64_t, Client> clients_;
  std::vector<char> buffer_;
  RefusalSummary refusals_{"cli"};
};

}  // namespace spillway
