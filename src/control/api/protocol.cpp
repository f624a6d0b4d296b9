#include "control/api/protocol.hpp"

#include <algorithm>
#include <exception>
#include <new>
#include <utility>

namespace spillway {
namespace {

// A request rejected before any ControlApi call.
struct Rejection {
  std::string code;
  std::string message;
};

constexpr auto kReplace = Json::error_handler_t::replace;

std::string dumpCompact(const Json& value) {
  return value.dump(-1, ' ', false, kReplace);
}

// Thrown from the parser callback to stop at the first structural problem.
struct StructureError {
  std::string message;
};

// Parses with a bound on nesting and a check for duplicate keys (nlohmann
// would silently keep the last one).
Json parseStrict(std::string_view message) {
  std::vector<std::vector<std::string>> keysPerLevel;  // one entry per open container
  Json::parser_callback_t callback = [&](int /*depth*/, Json::parse_event_t event,
                                         Json& parsed) -> bool {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (keysPerLevel.size() >= kMaxRequestDepth) {
          throw StructureError{"nested deeper than " + std::to_string(kMaxRequestDepth) +
                               " levels"};
        }
        keysPerLevel.emplace_back();
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        if (!keysPerLevel.empty()) keysPerLevel.pop_back();
        break;
      case Json::parse_event_t::key: {
        if (keysPerLevel.empty() || !parsed.is_string()) break;
        auto& keys = keysPerLevel.back();
        const auto& key = parsed.get_ref<const std::string&>();
        if (std::find(keys.begin(), keys.end(), key) != keys.end()) {
          throw StructureError{"duplicate key " + quoteForMessage(key)};
        }
        keys.push_back(key);
        break;
      }
      case Json::parse_event_t::value:
        break;
    }
    return true;
  };
  return Json::parse(message.begin(), message.end(), callback);
}

struct Validated {
  const CommandSpec* command = nullptr;
  Json args = Json::object();
};

std::variant<Validated, Rejection> validate(std::string_view message) {
  if (message.size() > kMaxRequestBytes) {
    return Rejection{"too_large", "request of " + std::to_string(message.size()) +
                                      " bytes exceeds the limit of " +
                                      std::to_string(kMaxRequestBytes)};
  }
  if (message.find('\0') != std::string_view::npos) {
    // nlohmann stops at a NUL as if the input ended; whatever follows would
    // be ignored rather than refused.
    return Rejection{"bad_json", "request contains a NUL byte"};
  }
  Json request;
  try {
    request = parseStrict(message);
  } catch (const StructureError& e) {
    return Rejection{"bad_request", "request " + e.message};
  } catch (const Json::parse_error& e) {
    return Rejection{"bad_json", std::string("request is not valid JSON: ") + e.what()};
  } catch (const Json::out_of_range& e) {
    return Rejection{"bad_request", std::string("request has a number out of range: ") + e.what()};
  }
  if (!request.is_object()) {
    return Rejection{"bad_request", "request must be a JSON object"};
  }
  for (const auto& [key, value] : request.items()) {
    if (key != "v" && key != "cmd" && key != "args") {
      return Rejection{"bad_request", "unknown request field " + quoteForMessage(key) +
                                          " (expected v, cmd, args)"};
    }
  }
  const auto v = request.find("v");
  if (v == request.end()) {
    return Rejection{"bad_request", "request has no \"v\" (protocol version, 1)"};
  }
  if (!v->is_number_unsigned() || v->get<std::uint64_t>() != kProtocolVersion) {
    return Rejection{"unsupported_version",
                     "protocol version " + excerptForMessage(*v) + " is not supported (1 is)"};
  }
  const auto cmd = request.find("cmd");
  if (cmd == request.end() || !cmd->is_string()) {
    return Rejection{"bad_request", "request has no \"cmd\" string"};
  }
  Validated out;
  out.command = findCommand(cmd->get_ref<const std::string&>());
  if (out.command == nullptr) {
    std::string known;
    for (const CommandSpec& c : commandTable()) {
      if (!known.empty()) known += ", ";
      known += c.name;
    }
    return Rejection{"unknown_command", "unknown command " +
                                            quoteForMessage(cmd->get_ref<const std::string&>()) +
                                            "; known: " + known};
  }
  const auto args = request.find("args");
  if (args != request.end()) {
    if (!args->is_object()) {
      return Rejection{"bad_request", "\"args\" must be an object"};
    }
    out.args = *args;
  }
  if (auto problem = checkCommandArgs(*out.command, out.args)) {
    return Rejection{"bad_request", *problem};
  }
  return out;
}

void reject(RequestOutcome& out, std::string code, std::string_view message) {
  out.reply = makeErrorReply(code, message);
  out.errorCode = std::move(code);
  out.ok = false;
}

// The last resort when even building an error reply fails (out of memory).
constexpr std::string_view kInternalErrorReply =
    R"({"error":{"code":"internal","message":"internal error"},"ok":false})";

}  // namespace

bool AccessPolicy::mayWrite(const PeerCredentials& peer) const noexcept {
  if (peer.uid == 0) return true;
  if (std::find(uids.begin(), uids.end(), peer.uid) != uids.end()) return true;
  if (std::find(gids.begin(), gids.end(), peer.gid) != gids.end()) return true;
  return std::any_of(peer.groups.begin(), peer.groups.end(), [&](std::uint32_t g) {
    return std::find(gids.begin(), gids.end(), g) != gids.end();
  });
}

std::string makeOkReply(const Json& result) {
  Json reply = Json::object();
  reply["ok"] = true;
  reply["result"] = result;
  return dumpCompact(reply);
}

std::string makeErrorReply(std::string_view code, std::string_view message) {
  Json reply = Json::object();
  reply["ok"] = false;
  reply["error"] = Json{{"code", std::string(code)}, {"message", std::string(message)}};
  return dumpCompact(reply);
}

RequestOutcome processRequest(std::string_view message, ControlApi& api,
                              const PeerCredentials& peer, const AccessPolicy& policy,
                              Admission admission) noexcept {
  RequestOutcome out;
  try {
    auto validated = validate(message);
    if (auto* rejection = std::get_if<Rejection>(&validated)) {
      reject(out, std::move(rejection->code), rejection->message);
      return out;
    }
    const Validated& request = std::get<Validated>(validated);
    out.command = request.command->name;
    out.args = dumpCompact(request.args);
    out.write = commandWrites(*request.command, request.args);
    if (admission == Admission::ChangesOnly && !(out.write && policy.mayWrite(peer))) {
      reject(out, "busy",
             "every CLI slot for reads is taken; the remaining ones are kept for changes and "
             "root; try again");
      return out;
    }
    if (out.write && !policy.mayWrite(peer)) {
      reject(out, "forbidden",
             out.command + " changes state and needs root or a member of the socket's group (uid " +
                 std::to_string(peer.uid) + " is neither)");
      return out;
    }
    ApiResult result = request.command->handler(api, request.args, peer);
    if (auto* error = std::get_if<ApiError>(&result)) {
      reject(out, error->code.empty() ? std::string("error") : error->code, error->message);
      return out;
    }
    out.reply = makeOkReply(std::get<Json>(result));
    if (out.reply.size() > kMaxReplyBytes) {
      reject(out, "reply_too_large",
             out.command + ": the reply of " + std::to_string(out.reply.size()) +
                 " bytes exceeds the limit of " + std::to_string(kMaxReplyBytes));
      return out;
    }
    out.ok = true;
    return out;
  } catch (const std::exception& e) {
    try {
      reject(out, "internal", std::string("internal error: ") + e.what());
    } catch (...) {
      out.reply = kInternalErrorReply;
    }
  } catch (...) {
    out.reply = kInternalErrorReply;
  }
  out.ok = false;
  if (out.errorCode.empty()) out.errorCode = "internal";
  return out;
}

std::string handleRequest(std::string_view message, ControlApi& api, const PeerCredentials& peer,
                          const AccessPolicy& policy) noexcept {
  return processRequest(message, api, peer, policy).reply;
}

std::string makeRequest(std::string_view command, const Json& args) {
  Json request = Json::object();
  request["v"] = kProtocolVersion;
  request["cmd"] = std::string(command);
  if (!args.is_null() && !args.empty()) request["args"] = args;
  return dumpCompact(request);
}

std::optional<Reply> parseReply(std::string_view message) noexcept {
  try {
    const Json j = Json::parse(message.begin(), message.end());
    if (!j.is_object()) return std::nullopt;
    const auto ok = j.find("ok");
    if (ok == j.end() || !ok->is_boolean()) return std::nullopt;
    Reply reply;
    reply.ok = ok->get<bool>();
    if (reply.ok) {
      const auto result = j.find("result");
      if (result == j.end()) return std::nullopt;
      reply.result = *result;
      return reply;
    }
    const auto error = j.find("error");
    if (error == j.end() || !error->is_object()) return std::nullopt;
    const auto code = error->find("code");
    const auto text = error->find("message");
    if (code == error->end() || !code->is_string()) return std::nullopt;
    reply.errorCode = code->get<std::string>();
    if (text != error->end() && text->is_string()) reply.errorMessage = text->get<std::string>();
    return reply;
  } catch (...) {
    return std::nullopt;
  }
}

}  // namespace spillway
