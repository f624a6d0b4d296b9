// The backend's own view of its TCP connections: a dump of the kernel's
// socket diagnostics (NETLINK_SOCK_DIAG, inet_diag, as `ss` reads them),
// reduced to the connections whose local address is a VIP.
//
// buildTcpDumpRequest() writes one SOCK_DIAG_BY_FAMILY dump request for TCP
// sockets of a family in the states that still carry packets with the client
// (kOpenTcpStates: SYN_RECV and the request sockets of a listener, ESTABLISHED,
// FIN_WAIT1/2, CLOSE_WAIT, CLOSING, LAST_ACK; not LISTEN, TIME_WAIT or CLOSE).
// parseSockDiagReply() walks one datagram of the kernel's answer: every
// inet_diag_msg becomes a DiagSocket (IPv4-mapped IPv6 addresses, which a
// dual-stack listener's accepted IPv4 connections carry, are reported as
// IPv4), NLMSG_DONE ends the dump, NLMSG_ERROR is an error. A message that is
// truncated, too short for its type or of an unexpected type is an error
// naming its offset: the dump is then discarded, never half-believed.
// dumpTcpSockets() runs the exchange on a socket of its own.
//
// Thread contract: pure functions besides dumpTcpSockets (one netlink socket
// per call, blocking with a receive timeout); no exceptions escape the parser.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace spillway {

// An address as the agent compares and prints it.
struct DiagAddress {
  bool v4 = true;
  std::array<std::uint8_t, 16> bytes{};  // IPv4: the first 4

  [[nodiscard]] bool operator==(const DiagAddress&) const noexcept = default;
  [[nodiscard]] std::string text() const;
  // Parses a numeric IPv4 or IPv6 address; std::nullopt otherwise.
  [[nodiscard]] static std::optional<DiagAddress> parse(const std::string& text);
};

struct DiagSocket {
  std::uint8_t state = 0;  // the kernel's TCP_* state
  DiagAddress local;
  std::uint16_t localPort = 0;  // host order
  DiagAddress remote;
  std::uint16_t remotePort = 0;
};

// Bit mask over TCP states (1 << TCP_ESTABLISHED, ...).
extern const std::uint32_t kOpenTcpStates;

// One dump request for TCP sockets of `family` (AF_INET or AF_INET6) in
// `states`, with sequence number `seq`.
[[nodiscard]] std::vector<std::byte> buildTcpDumpRequest(int family, std::uint32_t states,
                                                         std::uint32_t seq);

enum class DiagParse : std::uint8_t { More, Done, Error };

struct DiagParseResult {
  DiagParse status = DiagParse::More;
  std::string error;        // with Error
  std::size_t sockets = 0;  // DiagSockets handed to the callback from this datagram
};

// Walks one datagram of the kernel's answer; calls `onSocket` for each socket.
// Messages of another sequence number than `seq` are an error.
[[nodiscard]] DiagParseResult parseSockDiagReply(
    std::span<const std::byte> datagram, std::uint32_t seq,
    const std::function<void(const DiagSocket&)>& onSocket) noexcept;

// The open TCP sockets of both families in this network namespace. Returns
// false and sets `error` when the kernel refused or the answer was malformed.
bool dumpTcpSockets(const std::function<void(const DiagSocket&)>& onSocket, std::string& error);

}  // namespace spillway
