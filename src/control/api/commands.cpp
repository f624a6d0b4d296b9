#include "control/api/commands.hpp"

#include <algorithm>

namespace spillway {
namespace {

using Args = const Json&;
using Peer = const PeerCredentials&;

std::string stringArg(Args args, const char* name) {
  const auto it = args.find(name);
  return it == args.end() ? std::string() : it->get<std::string>();
}

template <typename T>
T numberArg(Args args, const char* name, T fallback) {
  const auto it = args.find(name);
  return it == args.end() ? fallback : static_cast<T>(it->get<std::uint64_t>());
}

bool flagArg(Args args, const char* name) {
  const auto it = args.find(name);
  return it != args.end() && it->get<bool>();
}

constexpr std::uint64_t kU32Max = std::numeric_limits<std::uint32_t>::max();

constexpr ArgSpec kVipName[] = {{"name", ArgType::String, true, "the VIP's name", true}};
constexpr ArgSpec kPoolName[] = {{"name", ArgType::String, true, "the pool's name", true}};
constexpr ArgSpec kBackendName[] = {{"name", ArgType::String, true, "backend name", true}};
constexpr ArgSpec kBackendAddArgs[] = {
    {"name", ArgType::String, true, "backend name", true},
    {"address", ArgType::String, true, "its IPv4 or IPv6 address"},
    {"pool", ArgType::String, true, "its pool"},
    {"weight", ArgType::Uint32, false, "base weight (default 100)", false, 0, kU32Max},
    {"id", ArgType::Uint64, false, "stable id (default: hash of the name)"},
    {"mac", ArgType::String, false, "next-hop MAC override"},
    {"port", ArgType::String, false, "egress port name"},
};
constexpr ArgSpec kBackendWeightArgs[] = {
    {"name", ArgType::String, true, "backend name", true},
    {"weight", ArgType::Uint32, true, "new base weight", true, 0, kU32Max},
    {"dry_run", ArgType::Bool, false, "predict the table move without applying it"},
};
constexpr ArgSpec kTableArgs[] = {{"vip", ArgType::String, false, "one VIP (default: all)", true}};
constexpr ArgSpec kDigestArgs[] = {
    {"vip", ArgType::String, false, "one VIP (default: all)", true},
    {"chunk", ArgType::Uint32, false, "that chunk of the VIP's table (needs VIP)", false, 0,
     kU32Max, "vip"},
};
constexpr ArgSpec kEventsArgs[] = {
    {"after", ArgType::Uint64, false, "events after this sequence number"},
    {"limit", ArgType::Uint32, false, "at most this many per request (default 100)", false, 1,
     kMaxEventsLimit},
};
constexpr ArgSpec kCheckPathArgs[] = {
    {"path", ArgType::String, false, "the file (default: the running one's)", true}};
constexpr ArgSpec kDumpArgs[] = {
    {"effective", ArgType::Bool, false,
     "the file merged with runtime overrides, and where each value comes from"}};
constexpr ArgSpec kClearArgs[] = {
    {"backend", ArgType::String, false, "only this backend's (default: every backend's)"}};

constexpr CommandSpec kCommands[] = {
    {"status",
     Access::Read,
     "",
     "uptime, generation, backend counts by state, warm-up, checkpoint, spillover and panic "
     "state per VIP",
     {},
     [](ControlApi& api, Args, Peer) { return api.status(); }},
    {"vip.list",
     Access::Read,
     "",
     "every VIP",
     {},
     [](ControlApi& api, Args, Peer) { return api.vipList(); }},
    {"vip.show", Access::Read, "", "one VIP in detail", kVipName,
     [](ControlApi& api, Args a, Peer) { return api.vipShow(stringArg(a, "name")); }},
    {"pool.list",
     Access::Read,
     "",
     "every pool",
     {},
     [](ControlApi& api, Args, Peer) { return api.poolList(); }},
    {"pool.show", Access::Read, "", "one pool in detail", kPoolName,
     [](ControlApi& api, Args a, Peer) { return api.poolShow(stringArg(a, "name")); }},
    {"backend.list",
     Access::Read,
     "",
     "every backend: state, weights, health, load, flows",
     {},
     [](ControlApi& api, Args, Peer) { return api.backendList(); }},
    {"backend.add", Access::Write, "add", "add a backend", kBackendAddArgs,
     [](ControlApi& api, Args a, Peer) {
       BackendSpec spec;
       spec.name = stringArg(a, "name");
       spec.address = stringArg(a, "address");
       spec.pool = stringArg(a, "pool");
       spec.weight = numberArg<std::uint32_t>(a, "weight", spec.weight);
       if (a.contains("id")) spec.id = numberArg<std::uint64_t>(a, "id", 0);
       if (a.contains("mac")) spec.mac = stringArg(a, "mac");
       if (a.contains("port")) spec.port = stringArg(a, "port");
       return api.backendAdd(spec);
     }},
    {"backend.remove", Access::Write, "remove", "remove a backend (after draining it)",
     kBackendName,
     [](ControlApi& api, Args a, Peer) { return api.backendRemove(stringArg(a, "name")); }},
    {"backend.drain", Access::Write, "drain", "no new flows; tracked flows continue", kBackendName,
     [](ControlApi& api, Args a, Peer) { return api.backendDrain(stringArg(a, "name")); }},
    {"backend.undrain", Access::Write, "undrain", "take new flows again", kBackendName,
     [](ControlApi& api, Args a, Peer) { return api.backendUndrain(stringArg(a, "name")); }},
    {"backend.disable", Access::Write, "disable", "take it out of service (operator)", kBackendName,
     [](ControlApi& api, Args a, Peer) { return api.backendDisable(stringArg(a, "name")); }},
    {"backend.enable", Access::Write, "enable", "return it to service", kBackendName,
     [](ControlApi& api, Args a, Peer) { return api.backendEnable(stringArg(a, "name")); }},
    {"backend.weight", Access::Write, "weight",
     "set the base weight; --dry-run shows the predicted move", kBackendWeightArgs,
     [](ControlApi& api, Args a, Peer) {
       return api.backendWeight(stringArg(a, "name"), numberArg<std::uint32_t>(a, "weight", 0),
                                flagArg(a, "dry_run"));
     },
     [](Args a) { return !flagArg(a, "dry_run"); }},
    {"table.show", Access::Read, "", "entries per backend and generation", kTableArgs,
     [](ControlApi& api, Args a, Peer) { return api.tableShow(stringArg(a, "vip")); }},
    {"table.digest", Access::Read, "",
     "the tables' fingerprints and chunk hashes (what tier status compares), or one chunk",
     kDigestArgs,
     [](ControlApi& api, Args a, Peer) {
       std::optional<std::uint32_t> chunk;
       if (a.contains("chunk")) chunk = numberArg<std::uint32_t>(a, "chunk", 0);
       return api.tableDigest(stringArg(a, "vip"), chunk);
     }},
    {"flows",
     Access::Read,
     "",
     "tracked flows per backend and per lcore",
     {},
     [](ControlApi& api, Args, Peer) { return api.flows(); }},
    {"flows.adopted",
     Access::Read,
     "",
     "flows adopted from exceptions (checkpoint, peer, backend) and the flow table's own "
     "exceptions: which layer kept each flow",
     {},
     [](ControlApi& api, Args, Peer) { return api.flowsAdopted(); }},
    {"stats",
     Access::Read,
     "",
     "data-path counters: packets, drops by reason",
     {},
     [](ControlApi& api, Args, Peer) { return api.stats(); }},
    {"health",
     Access::Read,
     "",
     "health checks per backend: state, streaks, last error, RTT",
     {},
     [](ControlApi& api, Args, Peer) { return api.health(); }},
    {"events", Access::Read, "", "state changes with their causes", kEventsArgs,
     [](ControlApi& api, Args a, Peer) {
       return api.events(numberArg<std::uint64_t>(a, "after", 0),
                         numberArg<std::uint32_t>(a, "limit", kDefaultEventsLimit));
     }},
    // With a path the daemon reads a file of the peer's choosing: a write.
    {"config.check", Access::Read, "", "validate a file (default: the running one's)",
     kCheckPathArgs,
     [](ControlApi& api, Args a, Peer peer) {
       return api.configCheck(stringArg(a, "path"), &peer);
     },
     [](Args a) { return a.contains("path"); }},
    {"config.reload", Access::Write, "", "load and apply a file (default: the running one's)",
     kCheckPathArgs,
     [](ControlApi& api, Args a, Peer peer) {
       return api.configReload(stringArg(a, "path"), &peer);
     }},
    {"config.dump", Access::Read, "", "the running configuration", kDumpArgs,
     [](ControlApi& api, Args a, Peer) { return api.configDump(flagArg(a, "effective")); }},
    {"config.clear-overrides", Access::Write, "clear-overrides",
     "forget runtime overrides (journaled): the file's values apply again", kClearArgs,
     [](ControlApi& api, Args a, Peer) {
       return api.configClearOverrides(stringArg(a, "backend"));
     }},
    {"lb.drain",
     Access::Write,
     "lb-drain",
     "withdraw every VIP from the router (journaled: kept across restarts); flows continue",
     {},
     [](ControlApi& api, Args, Peer) { return api.lbDrain(); }},
    {"lb.undrain",
     Access::Write,
     "lb-undrain",
     "announce the VIPs again",
     {},
     [](ControlApi& api, Args, Peer) { return api.lbUndrain(); }},
    {"lb.status",
     Access::Read,
     "",
     "announcement state, and per VIP announced or why not",
     {},
     [](ControlApi& api, Args, Peer) { return api.lbStatus(); }},
    {"discovery",
     Access::Read,
     "",
     "discovery sources per pool: last refresh, entries, errors, last change",
     {},
     [](ControlApi& api, Args, Peer) { return api.discovery(); }},
};

constexpr CommandGroup kGroups[] = {
    {"vip", "virtual IPs"},
    {"pool", "backend pools"},
    {"backend", "backends"},
    {"table", "Maglev tables"},
    {"config", "configuration"},
    {"lb", "this instance's BGP announcement of its VIPs"},
    {"flows", "tracked flows (also a command: per backend and per lcore)"},
};

constexpr auto kReplace = Json::error_handler_t::replace;

bool hasControlCharacter(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
}

std::uint64_t typeMax(ArgType type) {
  return type == ArgType::Uint32 ? kU32Max : std::numeric_limits<std::uint64_t>::max();
}

std::optional<std::string> checkArg(const ArgSpec& spec, const Json& value) {
  const auto wrongType = [&] {
    return "args." + std::string(spec.name) + " must be " + describeArg(spec) + ", not " +
           excerptForMessage(value);
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
    case ArgType::Uint64: {
      if (!value.is_number_unsigned()) return wrongType();
      const auto v = value.get<std::uint64_t>();
      if (v < spec.min || v > std::min(spec.max, typeMax(spec.type))) return wrongType();
      return std::nullopt;
    }
    case ArgType::Bool:
      if (!value.is_boolean()) return wrongType();
      return std::nullopt;
  }
  return wrongType();
}

}  // namespace

std::span<const CommandSpec> commandTable() noexcept {
  return kCommands;
}

std::span<const CommandGroup> commandGroups() noexcept {
  return kGroups;
}

const CommandSpec* findCommand(std::string_view name) noexcept {
  for (const CommandSpec& c : kCommands) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

bool commandWrites(const CommandSpec& command, const Json& args) {
  if (command.writesWith != nullptr) return command.writesWith(args);
  return command.access == Access::Write;
}

// A JSON value as written, cut to a sane length.
std::string excerptForMessage(const Json& value) {
  constexpr std::size_t kMax = 64;
  std::string out = value.dump(-1, ' ', false, kReplace);
  if (out.size() > kMax) {
    out.resize(kMax);
    out += "...";
  }
  return out;
}

// Quotes a client-supplied string for an error message, cut to a sane length.
std::string quoteForMessage(std::string_view text) {
  constexpr std::size_t kMax = 64;
  std::string out = Json(std::string(text.substr(0, kMax))).dump(-1, ' ', false, kReplace);
  if (text.size() > kMax) out += "...";
  return out;
}

std::string describeArg(const ArgSpec& arg) {
  switch (arg.type) {
    case ArgType::String:
      return "a non-empty string";
    case ArgType::Uint32:
    case ArgType::Uint64:
      return "an integer in " + std::to_string(arg.min) + ".." +
             std::to_string(std::min(arg.max, typeMax(arg.type)));
    case ArgType::Bool:
      return "true or false";
  }
  return "?";
}

std::optional<std::string> checkCommandArgs(const CommandSpec& command, const Json& args) {
  const std::string name(command.name);
  if (!args.is_object()) return name + ": \"args\" must be an object";
  for (const auto& item : args.items()) {
    const std::string& key = item.key();
    const auto spec = std::find_if(command.args.begin(), command.args.end(),
                                   [&](const ArgSpec& a) { return a.name == key; });
    if (spec == command.args.end()) {
      std::string expected;
      for (const ArgSpec& a : command.args) {
        if (!expected.empty()) expected += ", ";
        expected += a.name;
      }
      return name + ": unknown argument " + quoteForMessage(key) +
             (expected.empty() ? " (it takes none)" : " (expected " + expected + ")");
    }
    if (auto problem = checkArg(*spec, item.value())) return name + ": " + *problem;
  }
  for (const ArgSpec& a : command.args) {
    if (a.required && !args.contains(a.name)) {
      return name + ": missing argument " + std::string(a.name);
    }
    if (!a.needs.empty() && args.contains(a.name) && !args.contains(a.needs)) {
      return name + ": args." + std::string(a.name) + " needs args." + std::string(a.needs);
    }
  }
  return std::nullopt;
}

}  // namespace spillway
