// The command table: every operator command declared once (HAProxy's cli_kw
// list, Envoy's admin handler list). A row says the command's name on the
// wire ("backend.drain"), its arguments (name, type, required or not,
// bounds, whether spillwayctl takes it as a positional word or an --option,
// help), whether it changes state and whether it is journaled, its help text,
// and the ControlApi call it reaches. Everything else reads the table:
//   - the socket server (protocol.cpp) validates a request's arguments with
//     checkCommandArgs() and dispatches through the row's handler;
//   - spillwayctl builds its subcommands, options, help text and range checks
//     from the rows ("backend.drain" is `spillwayctl backend drain NAME`) and
//     checks a request with checkCommandArgs() before it sends it;
//   - the protocol fuzz target draws commands and arguments from the rows;
//   - each operation the intent journal records is the journal op of one
//     row (commands_test holds the two together); the plane's replay merges
//     the journal into the configuration (intent_merge.hpp) rather than
//     calling the handlers again, which would journal every record twice and
//     restart the drains' clocks;
//   - README.md's spillwayctl reference is compared with the rows by a unit
//     test (commands_test).
// A new command is a row here, a ControlApi method, its implementation in the
// plane, and a line in the README's reference.
//
// Thread contract: the table is constant; every function here is pure and
// safe on any thread, except a row's handler, which calls the ControlApi and
// so runs on the control thread.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "control/api/control_api.hpp"

namespace spillway {

inline constexpr std::size_t kMaxArgStringBytes = 4096;
inline constexpr std::uint32_t kDefaultEventsLimit = 100;
inline constexpr std::uint32_t kMaxEventsLimit = 1000;

enum class ArgType : std::uint8_t { String, Uint32, Uint64, Bool };
enum class Access : std::uint8_t { Read, Write };

struct ArgSpec {
  std::string_view name;  // the JSON key; spillwayctl's --option spells '_' as '-'
  ArgType type;
  bool required;
  std::string_view help;
  // spillwayctl takes it as a positional word (NAME), not as --name.
  bool positional = false;
  // Integers: the accepted range (the type's own range when not narrowed).
  std::uint64_t min = 0;
  std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  // Given only together with this argument ("" when free).
  std::string_view needs = {};
};

struct CommandSpec {
  std::string_view name;  // "backend.drain": spillwayctl's words joined by '.'
  Access access;          // Write: needs root or the socket's group
  // The operation the intent journal records for it (toString(IntentOp):
  // "drain", "clear-overrides", ...); empty when nothing is journaled.
  std::string_view journalOp;
  std::string_view help;
  std::span<const ArgSpec> args;
  // The ControlApi call, with the validated arguments (checkCommandArgs).
  ApiResult (*handler)(ControlApi& api, const Json& args, const PeerCredentials& peer);
  // When set: whether these (validated) arguments need write access, for a
  // command whose access depends on them (backend.weight --dry-run reads).
  bool (*writesWith)(const Json& args) = nullptr;
};

// The words of a command group ("backend") and what it holds, for help.
struct CommandGroup {
  std::string_view name;
  std::string_view help;
};

// Every command, in the order of the reference.
[[nodiscard]] std::span<const CommandSpec> commandTable() noexcept;
[[nodiscard]] std::span<const CommandGroup> commandGroups() noexcept;
[[nodiscard]] const CommandSpec* findCommand(std::string_view name) noexcept;

// Whether a request with these validated arguments needs write access.
[[nodiscard]] bool commandWrites(const CommandSpec& command, const Json& args);

// Checks a request's "args" object against the row: no unknown argument,
// each of its type and range (strings non-empty, at most kMaxArgStringBytes,
// without control characters), every required one present, and the ones that
// need another given with it. The error text names the command and the
// argument ("backend.add: missing argument pool"); std::nullopt when valid.
[[nodiscard]] std::optional<std::string> checkCommandArgs(const CommandSpec& command,
                                                          const Json& args);

// For error messages: a client's text quoted as JSON, and a JSON value as
// written, each cut to 64 bytes ("..." marks the cut).
[[nodiscard]] std::string quoteForMessage(std::string_view text);
[[nodiscard]] std::string excerptForMessage(const Json& value);

// "a non-empty string", "an integer in 1..1000", ...
[[nodiscard]] std::string describeArg(const ArgSpec& arg);

}  // namespace spillway
