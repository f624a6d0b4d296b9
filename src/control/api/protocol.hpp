// The CLI socket's wire protocol: one JSON request per message, one JSON
// reply per message (the socket is SOCK_SEQPACKET, see cli_server.hpp).
//
//   request  {"v":1, "cmd":"backend.drain", "args":{"name":"gpu-a1"}}
//   reply    {"ok":true, "result":<the ControlApi call's JSON>}
//            {"ok":false, "error":{"code":"not_found", "message":"..."}}
//
// Validation is strict, because the socket is an attack surface of a root
// daemon: a request must be a JSON object of valid UTF-8, at most
// kMaxRequestBytes, nested at most kMaxRequestDepth deep, with no duplicate
// key, exactly the keys "v" (the integer 1), "cmd" (a known command) and
// optionally "args" (an object holding exactly the command's arguments as its
// row in the command table declares them, checked by checkCommandArgs():
// strings non-empty, without control characters and at most
// kMaxArgStringBytes; integers non-negative JSON integers within their range;
// booleans true or false). The row's handler makes the ControlApi call
// (commands.hpp). Anything else is an error reply and no ControlApi
// call is made. Errors found here have the codes
//   too_large, bad_json, bad_request, unsupported_version, unknown_command,
//   forbidden, busy (a read in one of the CLI server's change slots),
//   reply_too_large, internal;
// the control plane's own ApiError codes (not_found, invalid, conflict, ...)
// pass through unchanged.
//
// Authorisation is the second gate behind the socket file's mode: read-only
// commands are served to any peer that could connect; commands that change
// state (Access::Write) only to root and the uids/gids of the AccessPolicy.
// Two commands depend on their arguments (their rows' writesWith):
// backend.weight with dry_run:true changes nothing and is read-only;
// config.check with a path makes the daemon read a file of the peer's
// choosing and needs write access.
// config.check and config.reload hand the peer's credentials to the
// ControlApi, which bounds which files a peer other than root may name and
// what it is told of them (config_access.hpp).
//
// handleRequest() never throws and never crashes on any input (fuzzed by
// tests/fuzz/fuzz_protocol.cpp); nlohmann's exceptions stay inside.
//
// Thread contract: handleRequest() runs on the control thread (it calls
// ControlApi); the rest are pure functions, safe on any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "control/api/commands.hpp"
#include "control/api/control_api.hpp"

namespace spillway {

inline constexpr int kProtocolVersion = 1;
inline constexpr std::size_t kMaxRequestBytes = 64 * 1024;
// A larger reply is replaced by a reply_too_large error.
inline constexpr std::size_t kMaxReplyBytes = 4 * 1024 * 1024;
inline constexpr std::size_t kMaxRequestDepth = 8;

// Who may run commands that change state. Root always may.
struct AccessPolicy {
  std::vector<std::uint32_t> uids;
  std::vector<std::uint32_t> gids;  // matched against the primary and supplementary groups

  [[nodiscard]] bool mayWrite(const PeerCredentials& peer) const noexcept;
};

// What one request came to; the server logs writes with the peer.
struct RequestOutcome {
  std::string reply;    // the reply message
  std::string command;  // empty when the request named no known command
  std::string args;     // the validated args as compact JSON ("{}" when none)
  bool write = false;   // the command needed write access (whether or not granted)
  bool ok = false;      // the reply is {"ok":true,...}
  std::string errorCode;
};

// Which requests a connection may have served: any, or (a connection in one
// of the CLI server's change slots) only a change the peer may make; any
// other is answered "busy" without a ControlApi call.
enum class Admission : std::uint8_t { Any, ChangesOnly };

[[nodiscard]] RequestOutcome processRequest(std::string_view message, ControlApi& api,
                                            const PeerCredentials& peer, const AccessPolicy& policy,
                                            Admission admission = Admission::Any) noexcept;
// processRequest(...).reply.
[[nodiscard]] std::string handleRequest(std::string_view message, ControlApi& api,
                                        const PeerCredentials& peer,
                                        const AccessPolicy& policy) noexcept;

// Reply builders (strings invalid as UTF-8 are replaced, never thrown on).
[[nodiscard]] std::string makeOkReply(const Json& result);
[[nodiscard]] std::string makeErrorReply(std::string_view code, std::string_view message);

// The client side.
[[nodiscard]] std::string makeRequest(std::string_view command, const Json& args = Json::object());

struct Reply {
  bool ok = false;
  Json result;  // when ok
  std::string errorCode;
  std::string errorMessage;
};

// std::nullopt when `message` is not a well-formed reply.
[[nodiscard]] std::optional<Reply> parseReply(std::string_view message) noexcept;

}  // namespace spillway
