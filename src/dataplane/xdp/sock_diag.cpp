#include "sock_diag.hpp"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "spillway/errno_text.hpp"

namespace spillway {
namespace {

// linux/tcp_states.h is not a uapi header; the numbers are ABI.
constexpr std::uint32_t kTcpEstablished = 1;
constexpr std::uint32_t kTcpSynRecv = 3;
constexpr std::uint32_t kTcpFinWait1 = 4;
constexpr std::uint32_t kTcpFinWait2 = 5;
constexpr std::uint32_t kTcpCloseWait = 8;
constexpr std::uint32_t kTcpLastAck = 9;
constexpr std::uint32_t kTcpClosing = 11;
constexpr std::uint32_t kTcpNewSynRecv = 12;

constexpr std::uint8_t kV4Mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

DiagAddress addressOf(std::uint8_t family, const __be32 (&words)[4]) noexcept {
  DiagAddress a;
  if (family == AF_INET) {
    std::memcpy(a.bytes.data(), words, 4);
    return a;
  }
  std::memcpy(a.bytes.data(), words, 16);
  if (std::memcmp(a.bytes.data(), kV4Mapped, sizeof(kV4Mapped)) == 0) {
    std::memmove(a.bytes.data(), a.bytes.data() + 12, 4);
    std::memset(a.bytes.data() + 4, 0, 12);
    return a;
  }
  a.v4 = false;
  return a;
}

}  // namespace

const std::uint32_t kOpenTcpStates =
    (1U << kTcpEstablished) | (1U << kTcpSynRecv) | (1U << kTcpFinWait1) | (1U << kTcpFinWait2) |
    (1U << kTcpCloseWait) | (1U << kTcpLastAck) | (1U << kTcpClosing) | (1U << kTcpNewSynRecv);

std::string DiagAddress::text() const {
  char out[INET6_ADDRSTRLEN] = {};
  if (inet_ntop(v4 ? AF_INET : AF_INET6, bytes.data(), out, sizeof(out)) == nullptr) return "?";
  return out;
}

std::optional<DiagAddress> DiagAddress::parse(const std::string& text) {
  DiagAddress a;
  if (inet_pton(AF_INET, text.c_str(), a.bytes.data()) == 1) return a;
  a.v4 = false;
  if (inet_pton(AF_INET6, text.c_str(), a.bytes.data()) == 1) return a;
  return std::nullopt;
}

std::vector<std::byte> buildTcpDumpRequest(int family, std::uint32_t states, std::uint32_t seq) {
  struct Request {
    nlmsghdr header;
    inet_diag_req_v2 body;
  };
  Request request{};
  request.header.nlmsg_len = sizeof(Request);
  request.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  request.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  request.header.nlmsg_seq = seq;
  request.body.sdiag_family = static_cast<std::uint8_t>(family);
  request.body.sdiag_protocol = IPPROTO_TCP;
  request.body.idiag_states = states;
  std::vector<std::byte> out(sizeof(Request));
  std::memcpy(out.data(), &request, sizeof(Request));
  return out;
}

DiagParseResult parseSockDiagReply(
    std::span<const std::byte> datagram, std::uint32_t seq,
    const std::function<void(const DiagSocket&)>& onSocket) noexcept {
  DiagParseResult result;
  std::size_t offset = 0;
  const auto error = [&](const std::string& what) {
    result.status = DiagParse::Error;
    try {
      result.error = "sock_diag reply, offset " + std::to_string(offset) + ": " + what;
    } catch (...) {
    }
    return result;
  };
  try {
    while (offset < datagram.size()) {
      if (datagram.size() - offset < sizeof(nlmsghdr)) return error("truncated message header");
      nlmsghdr header{};
      std::memcpy(&header, datagram.data() + offset, sizeof(header));
      if (header.nlmsg_len < sizeof(nlmsghdr) || header.nlmsg_len > datagram.size() - offset) {
        return error("message length " + std::to_string(header.nlmsg_len) + " out of bounds");
      }
      if (header.nlmsg_seq != seq) {
        return error("sequence " + std::to_string(header.nlmsg_seq) + ", expected " +
                     std::to_string(seq));
      }
      const std::byte* payload = datagram.data() + offset + NLMSG_HDRLEN;
      const std::size_t payloadLength =
          header.nlmsg_len > NLMSG_HDRLEN ? header.nlmsg_len - NLMSG_HDRLEN : 0;
      if (header.nlmsg_type == NLMSG_DONE) {
        result.status = DiagParse::Done;
        return result;
      }
      if (header.nlmsg_type == NLMSG_ERROR) {
        if (payloadLength < sizeof(nlmsgerr)) return error("truncated NLMSG_ERROR");
        nlmsgerr err{};
        std::memcpy(&err, payload, sizeof(err));
        return error("the kernel answered " + errnoText(-err.error));
      }
      if (header.nlmsg_type != SOCK_DIAG_BY_FAMILY) {
        return error("unexpected message type " + std::to_string(header.nlmsg_type));
      }
      if (payloadLength < sizeof(inet_diag_msg)) return error("truncated inet_diag_msg");
      inet_diag_msg message{};
      std::memcpy(&message, payload, sizeof(message));
      if (message.idiag_family != AF_INET && message.idiag_family != AF_INET6) {
        return error("address family " + std::to_string(message.idiag_family));
      }
      DiagSocket socket;
      socket.state = message.idiag_state;
      socket.local = addressOf(message.idiag_family, message.id.idiag_src);
      socket.localPort = ntohs(message.id.idiag_sport);
      socket.remote = addressOf(message.idiag_family, message.id.idiag_dst);
      socket.remotePort = ntohs(message.id.idiag_dport);
      onSocket(socket);
      ++result.sockets;
      offset += NLMSG_ALIGN(header.nlmsg_len);
    }
  } catch (...) {
    return error("out of memory");
  }
  return result;
}

bool dumpTcpSockets(const std::function<void(const DiagSocket&)>& onSocket, std::string& error) {
  const int fd = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) {
    error = "socket(NETLINK_SOCK_DIAG): " + errnoText(errno);
    return false;
  }
  const timeval timeout{.tv_sec = 2, .tv_usec = 0};
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  bool ok = true;
  std::vector<std::byte> buffer(64 * 1024);
  std::uint32_t seq = 1;
  for (const int family : {AF_INET, AF_INET6}) {
    const std::vector<std::byte> request = buildTcpDumpRequest(family, kOpenTcpStates, seq);
    sockaddr_nl kernel{};
    kernel.nl_family = AF_NETLINK;
    if (::sendto(fd, request.data(), request.size(), 0, reinterpret_cast<sockaddr*>(&kernel),
                 sizeof(kernel)) < 0) {
      error = "sendto(NETLINK_SOCK_DIAG): " + errnoText(errno);
      ok = false;
      break;
    }
    for (;;) {
      const ssize_t n = ::recv(fd, buffer.data(), buffer.size(), 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        error = "recv(NETLINK_SOCK_DIAG): " + errnoText(errno);
        ok = false;
        break;
      }
      const DiagParseResult r =
          parseSockDiagReply(std::span(buffer.data(), static_cast<std::size_t>(n)), seq, onSocket);
      if (r.status == DiagParse::Error) {
        error = r.error;
        ok = false;
        break;
      }
      if (r.status == DiagParse::Done) break;
    }
    if (!ok) break;
    ++seq;
  }
  ::close(fd);
  return ok;
}

}  // namespace spillway
