// A small rtnetlink client shared by the control plane's kernel adapters
// (neighbours.cpp reads neighbour and route tables; announce_device.cpp adds
// and deletes the announced VIP routes): one socket, requests and their
// datagrams, message walking and NLMSG_ERROR decoding.
//
// Thread contract: one object per thread; blocking I/O with a 1 s receive
// timeout.
#pragma once

#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "spillway/errno_text.hpp"

namespace spillway::rtnl {

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Walks the netlink messages of a datagram, calling f(header, payload, end);
// f returns false to stop. Returns false on a malformed datagram.
template <class F>
bool forEachMessage(std::span<const std::byte> datagram, F&& f) {
  const std::byte* p = datagram.data();
  const std::byte* end = p + datagram.size();
  while (end - p >= static_cast<std::ptrdiff_t>(sizeof(nlmsghdr))) {
    const auto h = load<nlmsghdr>(p);
    if (h.nlmsg_len < sizeof(nlmsghdr) || static_cast<std::ptrdiff_t>(h.nlmsg_len) > end - p) {
      return false;
    }
    if (!f(h, p + NLMSG_HDRLEN, p + h.nlmsg_len)) return true;
    p += NLMSG_ALIGN(h.nlmsg_len);
  }
  return true;
}

inline std::optional<std::string> netlinkError(const std::byte* payload, const std::byte* end) {
  if (end - payload < static_cast<std::ptrdiff_t>(sizeof(nlmsgerr))) return "truncated NLMSG_ERROR";
  const auto e = load<nlmsgerr>(payload);
  if (e.error == 0) return std::nullopt;  // an ACK
  return errnoText(e.error);
}

// An rtnetlink socket for one request and its replies.
class Netlink {
 public:
  Netlink() : fd_(socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE)) {}
  ~Netlink() {
    if (fd_ >= 0) close(fd_);
  }
  Netlink(const Netlink&) = delete;
  Netlink& operator=(const Netlink&) = delete;

  [[nodiscard]] std::optional<std::string> openError() const {
    if (fd_ >= 0) return std::nullopt;
    return "netlink socket: " + errnoText(errno);
  }

  std::optional<std::string> send(const void* request, std::size_t length) {
    sockaddr_nl kernel{};
    kernel.nl_family = AF_NETLINK;
    if (sendto(fd_, request, length, 0, reinterpret_cast<const sockaddr*>(&kernel), sizeof kernel) <
        0) {
      return "netlink send: " + errnoText(errno);
    }
    return std::nullopt;
  }

  // Sends a request that asked for NLM_F_ACK and waits for its answer: the
  // kernel's error, or std::nullopt for an ACK.
  std::optional<std::string> transact(const void* request, std::size_t length) {
    if (auto e = send(request, length)) return e;
    std::vector<std::byte> buffer;
    for (;;) {
      std::size_t n = 0;
      if (auto e = receive(buffer, n)) return e;
      std::optional<std::optional<std::string>> answer;
      if (!forEachMessage(std::span(buffer.data(), n),
                          [&](const nlmsghdr& h, const std::byte* payload, const std::byte* end) {
                            if (h.nlmsg_type != NLMSG_ERROR) return true;
                            answer = netlinkError(payload, end);
                            return false;
                          })) {
        return "malformed netlink reply";
      }
      if (answer) return *answer;
    }
  }

  // One datagram (blocking, with a 1 s timeout).
  std::optional<std::string> receive(std::vector<std::byte>& buffer, std::size_t& length) {
    timeval tv{1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    buffer.resize(1 << 16);
    const ssize_t n = recv(fd_, buffer.data(), buffer.size(), 0);
    if (n < 0) return "netlink receive: " + errnoText(errno);
    length = static_cast<std::size_t>(n);
    return std::nullopt;
  }

 private:
  int fd_;
};

}  // namespace spillway::rtnl
