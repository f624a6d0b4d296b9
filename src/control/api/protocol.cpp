#include "control/api/protocol.hpp"

#include <algorithm>
#include <exception>
#include <limits>
#include <new>
#include <utility>

namespace spillway {
namespace {

constexpr ArgSpec kNameArgs[] = {{"name", ArgType::String, true}};
constexpr ArgSpec kBackendAddArgs[] = {
    {"name", ArgType::String, true},  {"address", ArgType::String, true},
    {"pool", ArgType::String, true},  {"weight", ArgType::Uint32, false},
    {"id", ArgType::Uint64, false},   {"mac", ArgType::String, false},
    {"port", ArgType::String, false},
};
constexpr ArgSpec kBackendWeightArgs[] = {
    {"name", ArgType::String, true},
    {"weight", ArgType::Uint32, true},
    {"dry_run", ArgType::Bool, false},
};
constexpr ArgSpec kTableArgs[] = {{"vip", ArgType::String, false}};
constexpr ArgSpec kDigestArgs[] = {{"vip", ArgType::String, false},
                                   {"chunk", ArgType::Uint32, false}};
constexpr ArgSpec kEventsArgs[] = {{"after", ArgType::Uint64, false},
                                   {"limit", ArgType::Uint32, false}};
constexpr ArgSpec kPathArgs[] = {{"path", ArgType::String, false}};
constexpr ArgSpec kDumpArgs[] = {{"effective", ArgType::Bool, false}};
constexpr ArgSpec kClearArgs[] = {{"backend", ArgType::String, false}};

constexpr CommandSpec kCommands[] = {
    {"status", Access::Read, {}},
    {"vip.list", Access::Read, {}},
    {"vip.show", Access::Read, kNameArgs},
    {"pool.list", Access::Read, {}},
    {"pool.show", Access::Read, kNameArgs},
    {"backend.list", Access::Read, {}},
    {"backend.add", Access::Write, kBackendAddArgs},
    {"backend.remove", Access::Write, kNameArgs},
    {"backend.drain", Access::Write, kNameArgs},
    {"backend.undrain", Access::Write, kNameArgs},
    {"backend.disable", Access::Write, kNameArgs},
    {"backend.enable", Access::Write, kNameArgs},
    {"backend.weight", Access::Write, kBackendWeightArgs},
    {"table.show", Access::Read, kTableArgs},
    {"table.digest", Access::Read, kDigestArgs},
    {"flows", Access::Read, {}},
    {"stats", Access::Read, {}},
    {"health", Access::Read, {}},
    {"events", Access::Read, kEventsArgs},
    {"config.check", Access::Read, kPathArgs},
    {"config.reload", Access::Write, kPathArgs},
    {"config.dump", Access::Read, kDumpArgs},
    {"config.clear-overrides", Access::Write, kClearArgs},
    {"lb.drain", Access::Write, {}},
    {"lb.undrain", Access::Write, {}},
    {"lb.status", Access::Read, {}},
};

// A request rejected before any ControlApi call.
struct Rejection {
  std::string code;
  std::string message;
};

constexpr auto kReplace = Json::error_handler_t::replace;

std::string dumpCompact(const Json& value) {
  return value.dump(-1, ' ', false, kReplace);
}

// Quotes a client-supplied string for an error message, cut to a sane length.
std::string quoteText(std::string_view text) {
  constexpr std::size_t kMax = 64;
  std::string out = dumpCompact(Json(std::string(text.substr(0, kMax))));
  if (text.size() > kMax) out += "...";
  return out;
}

// A JSON value as written, cut to a sane length.
std::string excerpt(const Json& value) {
  constexpr std::size_t kMax = 64;
  std::string out = dumpCompact(value);
  if (out.size() > kMax) {
    out.resize(kMax);
    out += "...";
  }
  return out;
}

std::string_view typeName(ArgType type) {
  switch (type) {
    case ArgType::String:
      return "a non-empty string";
    case ArgType::Uint32:
      return "an integer in 0..4294967295";
    case ArgType::Uint64:
      return "an integer in 0..18446744073709551615";
    case ArgType::Bool:
      return "true or false";
  }
  return "?";
}

bool hasControlCharacter(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
}

std::optional<std::string> checkArg(const ArgSpec& spec, const Json& value) {
  const auto wrongType = [&] {
    return "args." + std::string(spec.name) + " must be " + std::string(typeName(spec.type)) +
           ", not " + excerpt(value);
  };
  switch (spec.type) {
    case ArgType::String: {
      if (!value.is_string()) return wrongType();
      const auto& s = value.get_ref<const std::string&>();
      if (s.empty()) return wrongType();
      if (s.size() > kMaxArgStringBytes) {
        return "args." + std::string(spec.name) + " is longer than " +
               std::to_string(kMaxArgStringBytes) + " bytes";
      }
      if (hasControlCharacter(s)) {
        return "args." + std::string(spec.name) + " contains a control character";
      }
      return std::nullopt;
    }
    case ArgType::Uint32:
      if (!value.is_number_unsigned() ||
          value.get<std::uint64_t>() > std::numeric_limits<std::uint32_t>::max()) {
        return wrongType();
      }
      return std::nullopt;
    case ArgType::Uint64:
      if (!value.is_number_unsigned()) return wrongType();
      return std::nullopt;
    case ArgType::Bool:
      if (!value.is_boolean()) return wrongType();
      return std::nullopt;
  }
  return wrongType();
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
          throw StructureError{"duplicate key " + quoteText(key)};
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
      return Rejection{"bad_request",
                       "unknown request field " + quoteText(key) + " (expected v, cmd, args)"};
    }
  }
  const auto v = request.find("v");
  if (v == request.end()) {
    return Rejection{"bad_request", "request has no \"v\" (protocol version, 1)"};
  }
  if (!v->is_number_unsigned() || v->get<std::uint64_t>() != kProtocolVersion) {
    return Rejection{"unsupported_version",
                     "protocol version " + excerpt(*v) + " is not supported (1 is)"};
  }
  const auto cmd = request.find("cmd");
  if (cmd == request.end() || !cmd->is_string()) {
    return Rejection{"bad_request", "request has no \"cmd\" string"};
  }
  Validated out;
  out.command = findCommand(cmd->get_ref<const std::string&>());
  if (out.command == nullptr) {
    std::string known;
    for (const CommandSpec& c : kCommands) {
      if (!known.empty()) known += ", ";
      known += c.name;
    }
    return Rejection{
        "unknown_command",
        "unknown command " + quoteText(cmd->get_ref<const std::string&>()) + "; known: " + known};
  }
  const auto args = request.find("args");
  if (args != request.end()) {
    if (!args->is_object()) {
      return Rejection{"bad_request", "\"args\" must be an object"};
    }
    out.args = *args;
  }
  const std::string name(out.command->name);
  for (const auto& item : out.args.items()) {
    const std::string& key = item.key();
    const Json& value = item.value();
    const auto spec = std::find_if(out.command->args.begin(), out.command->args.end(),
                                   [&](const ArgSpec& a) { return a.name == key; });
    if (spec == out.command->args.end()) {
      std::string expected;
      for (const ArgSpec& a : out.command->args) {
        if (!expected.empty()) expected += ", ";
        expected += a.name;
      }
      return Rejection{"bad_request", name + ": unknown argument " + quoteText(key) +
                                          (expected.empty() ? " (it takes none)"
                                                            : " (expected " + expected + ")")};
    }
    if (auto problem = checkArg(*spec, value)) {
      return Rejection{"bad_request", name + ": " + *problem};
    }
  }
  for (const ArgSpec& a : out.command->args) {
    if (a.required && !out.args.contains(a.name)) {
      return Rejection{"bad_request", name + ": missing argument " + std::string(a.name)};
    }
  }
  if (name == "events" && out.args.contains("limit")) {
    const auto limit = out.args["limit"].get<std::uint64_t>();
    if (limit == 0 || limit > kMaxEventsLimit) {
      return Rejection{"bad_request",
                       "events: args.limit must be in 1.." + std::to_string(kMaxEventsLimit)};
    }
  }
  if (name == "table.digest" && out.args.contains("chunk") && !out.args.contains("vip")) {
    return Rejection{"bad_request", "table.digest: args.chunk needs args.vip"};
  }
  return out;
}

bool needsWrite(const Validated& request) {
  const std::string_view name = request.command->name;
  if (name == "backend.weight") {
    const auto dryRun = request.args.find("dry_run");
    return dryRun == request.args.end() || !dryRun->get<bool>();
  }
  if (name == "config.check") return request.args.contains("path");
  return request.command->access == Access::Write;
}

std::string stringArg(const Json& args, const char* name) {
  const auto it = args.find(name);
  return it == args.end() ? std::string() : it->get<std::string>();
}

template <typename T>
T numberArg(const Json& args, const char* name, T fallback) {
  const auto it = args.find(name);
  return it == args.end() ? fallback : static_cast<T>(it->get<std::uint64_t>());
}

ApiResult dispatch(const Validated& request, ControlApi& api, const PeerCredentials& peer) {
  const std::string_view name = request.command->name;
  const Json& a = request.args;
  if (name == "status") return api.status();
  if (name == "vip.list") return api.vipList();
  if (name == "vip.show") return api.vipShow(stringArg(a, "name"));
  if (name == "pool.list") return api.poolList();
  if (name == "pool.show") return api.poolShow(stringArg(a, "name"));
  if (name == "backend.list") return api.backendList();
  if (name == "backend.add") {
    BackendSpec spec;
    spec.name = stringArg(a, "name");
    spec.address = stringArg(a, "address");
    spec.pool = stringArg(a, "pool");
    spec.weight = numberArg<std::uint32_t>(a, "weight", spec.weight);
    if (a.contains("id")) spec.id = a["id"].get<std::uint64_t>();
    if (a.contains("mac")) spec.mac = stringArg(a, "mac");
    if (a.contains("port")) spec.port = stringArg(a, "port");
    return api.backendAdd(spec);
  }
  if (name == "backend.remove") return api.backendRemove(stringArg(a, "name"));
  if (name == "backend.drain") return api.backendDrain(stringArg(a, "name"));
  if (name == "backend.undrain") return api.backendUndrain(stringArg(a, "name"));
  if (name == "backend.disable") return api.backendDisable(stringArg(a, "name"));
  if (name == "backend.enable") return api.backendEnable(stringArg(a, "name"));
  if (name == "backend.weight") {
    const auto dryRun = a.find("dry_run");
    return api.backendWeight(stringArg(a, "name"), numberArg<std::uint32_t>(a, "weight", 0),
                             dryRun != a.end() && dryRun->get<bool>());
  }
  if (name == "table.show") return api.tableShow(stringArg(a, "vip"));
  if (name == "table.digest") {
    std::optional<std::uint32_t> chunk;
    if (a.contains("chunk")) chunk = numberArg<std::uint32_t>(a, "chunk", 0);
    return api.tableDigest(stringArg(a, "vip"), chunk);
  }
  if (name == "flows") return api.flows();
  if (name == "stats") return api.stats();
  if (name == "health") return api.health();
  if (name == "events") {
    return api.events(numberArg<std::uint64_t>(a, "after", 0),
                      numberArg<std::uint32_t>(a, "limit", kDefaultEventsLimit));
  }
  if (name == "config.check") return api.configCheck(stringArg(a, "path"), &peer);
  if (name == "config.reload") return api.configReload(stringArg(a, "path"), &peer);
  if (name == "config.dump") {
    const auto effective = a.find("effective");
    return api.configDump(effective != a.end() && effective->get<bool>());
  }
  if (name == "config.clear-overrides") return api.configClearOverrides(stringArg(a, "backend"));
  if (name == "lb.drain") return api.lbDrain();
  if (name == "lb.undrain") return api.lbUndrain();
  if (name == "lb.status") return api.lbStatus();
  return ApiError{"internal", "command " + std::string(name) + " has no handler"};
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

std::span<const CommandSpec> protocolCommands() noexcept {
  return kCommands;
}

const CommandSpec* findCommand(std::string_view name) noexcept {
  for (const CommandSpec& c : kCommands) {
    if (c.name == name) return &c;
  }
  return nullptr;
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
    out.write = needsWrite(request);
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
    ApiResult result = dispatch(request, api, peer);
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
