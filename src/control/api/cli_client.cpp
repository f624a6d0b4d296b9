#include "control/api/cli_client.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "spillway/errno_text.hpp"

namespace spillway {

bool fillUnixAddress(const std::string& path, sockaddr_un& addr) noexcept {
  std::memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) return false;
  std::memcpy(addr.sun_path, path.data(), path.size());
  return true;
}

CliClient::~CliClient() {
  close();
}

void CliClient::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool CliClient::connect(const std::string& socketPath, std::string& error,
                        std::optional<std::chrono::milliseconds> timeout) {
  close();
  sockaddr_un addr{};
  if (!fillUnixAddress(socketPath, addr)) {
    error = "cannot connect to " + socketPath + ": " +
            (socketPath.empty() ? "no socket path" : "path too long for a Unix socket");
    return false;
  }
  fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd_ < 0) {
    error = "cannot connect to " + socketPath + ": socket: " + errnoText(errno);
    return false;
  }
  // A full backlog makes a blocking connect() wait; with a timeout the socket
  // is non-blocking (EAGAIN: try again until the deadline) until connected.
  if (timeout) fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
  const auto deadline =
      std::chrono::steady_clock::now() + timeout.value_or(std::chrono::milliseconds(0));
  int rc = 0;
  while ((rc = ::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr)) != 0 &&
         timeout && (errno == EAGAIN || errno == EINTR) &&
         std::chrono::steady_clock::now() < deadline) {
    ::poll(nullptr, 0, 5);
  }
  if (rc != 0 && timeout && errno == EAGAIN) {
    error = "cannot connect to " + socketPath + ": the server's backlog stayed full for " +
            std::to_string(timeout->count()) + " ms";
    close();
    return false;
  }
  if (rc != 0) {
    const int err = errno;
    error = "cannot connect to " + socketPath + ": " + errnoText(err);
    if (err == ENOENT || err == ECONNREFUSED) error += " (is spillwayd running?)";
    if (err == EACCES) error += " (root or the socket's group is needed)";
    close();
    return false;
  }
  if (timeout) fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
  return true;
}

bool CliClient::call(std::string_view request, std::string& reply,
                     std::chrono::milliseconds timeout, std::string& error) {
  if (fd_ < 0) {
    error = "not connected";
    return false;
  }
  if (::send(fd_, request.data(), request.size(), MSG_NOSIGNAL) < 0) {
    const int err = errno;
    // The server may have refused the connection with a reply ("busy"); it
    // is queued before the close, whether the send saw EPIPE or a reset.
    if (receive(reply, std::chrono::milliseconds(0), error)) return true;
    error = "sending the request: " + errnoText(err);
    return false;
  }
  return receive(reply, timeout, error);
}

bool CliClient::receive(std::string& reply, std::chrono::milliseconds timeout, std::string& error) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const int rc = ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(left.count(), 0)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) {
      error = "waiting for the reply: " + errnoText(errno);
      return false;
    }
    if (rc == 0) {
      error = "no reply within " + std::to_string(timeout.count()) + " ms";
      return false;
    }
    char probe = 0;
    const ssize_t size = recv(fd_, &probe, 1, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT);
    if (size < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (size < 0) {
      error = "reading the reply: " + errnoText(errno);
      return false;
    }
    if (size == 0) {
      error = "the server closed the connection without a reply";
      return false;
    }
    reply.assign(static_cast<std::size_t>(size), '\0');
    const ssize_t got = recv(fd_, reply.data(), reply.size(), MSG_DONTWAIT);
    if (got < 0) {
      error = "reading the reply: " + errnoText(errno);
      return false;
    }
    reply.resize(static_cast<std::size_t>(got));
    return true;
  }
}

}  // namespace spillway
