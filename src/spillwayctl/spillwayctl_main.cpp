// spillwayctl: the operator's client for spillwayd's CLI socket.
//
// Every command is one request (protocol.hpp) on a fresh connection; `stats
// --watch` and `events --follow` repeat requests (events by polling
// `events {after}` with the sequence number the last reply gave). With
// --json the result is printed as JSON (one compact document per line when
// repeating); otherwise as aligned tables: an array of objects becomes a
// table, an object's scalar fields become aligned "key  value" lines and its
// nested lists become titled tables, so new fields in a reply show up
// without a change here.
//
// With --tier FILE (or SPILLWAY_TIER) a one-shot command goes to every
// instance of the tier file at once (tier_client.hpp) and the outcome is
// printed per instance; `tier status` compares the instances' tables.
//
// Exit codes: 0 ok, 1 an error reply (code and message on stderr) or a
// failed exchange (with --tier: on any instance), 2 usage, 3 cannot connect
// (which socket, and why), 4 `tier status`: every instance answered but
// some table differs from the reference, or their operator intent differs.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "control/api/cli_client.hpp"
#include "control/api/commands.hpp"
#include "control/api/protocol.hpp"
#include "control/config/config.hpp"
#include "control/tier/tier_client.hpp"
#include "spillwayctl/spillwayctl_top.hpp"

namespace spillway {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitConnect = 3;
constexpr int kExitTierDiffers = 4;

struct GlobalOptions {
  std::string socketPath = ControlConfig{}.socketPath;
  std::string tierPath;  // --tier: every instance of this tier file
  bool json = false;
  double timeoutSeconds = 10.0;
};

// --- output ------------------------------------------------------------------

// Aligned columns, two spaces apart; columns whose cells are all numbers are
// right-aligned.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> headers) : headers_(std::move(headers)) {}

  void addRow(std::vector<std::string> cells) {
    cells.resize(headers_.size());
    rows_.push_back(std::move(cells));
  }

  void print(std::ostream& out, std::string_view indent = {}) const {
    const std::size_t columns = headers_.size();
    std::vector<std::size_t> width(columns, 0);
    std::vector<bool> numeric(columns, true);
    for (std::size_t c = 0; c < columns; ++c) {
      width[c] = headers_[c].size();
      bool any = false;
      for (const auto& row : rows_) {
        width[c] = std::max(width[c], row[c].size());
        if (row[c].empty() || row[c] == "-") continue;
        any = true;
        numeric[c] = numeric[c] && isNumber(row[c]);
      }
      numeric[c] = numeric[c] && any;
    }
    const auto line = [&](const std::vector<std::string>& cells) {
      std::string text(indent);
      for (std::size_t c = 0; c < columns; ++c) {
        const std::size_t pad = width[c] - cells[c].size();
        const bool last = c + 1 == columns;
        if (numeric[c]) text.append(pad, ' ');
        text += cells[c];
        if (!numeric[c] && !last) text.append(pad, ' ');
        if (!last) text += "  ";
      }
      while (!text.empty() && text.back() == ' ') text.pop_back();
      out << text << '\n';
    };
    line(headers_);
    for (const auto& row : rows_) line(row);
  }

  // A decimal number, optionally with a trailing '%' (addresses such as
  // 10.0.0.1 are not numbers).
  static bool isNumber(std::string_view s) {
    if (!s.empty() && s.back() == '%') s.remove_suffix(1);
    if (!s.empty() && s.front() == '+') s.remove_prefix(1);
    if (s.empty()) return false;
    double value = 0;
    const auto [end, ec] =
        std::from_chars(s.data(), s.data() + s.size(), value, std::chars_format::general);
    return ec == std::errc() && end == s.data() + s.size();
  }

 private:
  std::vector<std::string> headers_;
  std::vector<std::vector<std::string>> rows_;
};

// Columns shown first when present, in this order; the rest follow by name.
constexpr std::string_view kLeadingColumns[] = {
    "seq",
    "time",
    "time_ms",
    "name",
    "vip",
    "pool",
    "backend",
    "lcore",
    "address",
    "port",
    "protocol",
    "site",
    "priority",
    "state",
    "reason",
    "weight",
    "effective_weight",
};

std::vector<std::string> columnOrder(const Json& rows) {
  std::vector<std::string> keys;
  for (const Json& row : rows) {
    if (!row.is_object()) continue;
    for (const auto& [key, value] : row.items()) {
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    }
  }
  const auto rank = [](const std::string& key) {
    const auto it = std::find(std::begin(kLeadingColumns), std::end(kLeadingColumns), key);
    return static_cast<std::size_t>(it - std::begin(kLeadingColumns));
  };
  std::stable_sort(keys.begin(), keys.end(), [&](const std::string& a, const std::string& b) {
    const auto ra = rank(a);
    const auto rb = rank(b);
    return ra != rb ? ra < rb : a < b;
  });
  return keys;
}

std::string header(std::string_view key) {
  std::string out(key);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

bool isScalar(const Json& v) {
  return v.is_primitive();
}

bool isScalarList(const Json& v) {
  return v.is_array() && std::all_of(v.begin(), v.end(), [](const Json& e) { return isScalar(e); });
}

bool isTable(const Json& v) {
  return v.is_array() && !v.empty() &&
         std::all_of(v.begin(), v.end(), [](const Json& e) { return e.is_object(); });
}

// An object whose every value is an object: a table keyed by name.
bool isKeyedTable(const Json& v) {
  return v.is_object() && !v.empty() && std::all_of(v.begin(), v.end(), [](const Json& e) {
           return e.is_object() && std::all_of(e.begin(), e.end(), [](const Json& f) {
                    return !f.is_object() || f.empty() || std::all_of(f.begin(), f.end(), isScalar);
                  });
         });
}

std::string cellText(const Json& v) {
  if (v.is_null()) return "-";
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%.6g", v.get<double>());
    return buffer;
  }
  if (v.is_number()) return v.dump();
  if (isScalarList(v)) {
    std::string out;
    for (const Json& e : v) out += (out.empty() ? "" : ",") + cellText(e);
    return out.empty() ? "-" : out;
  }
  if (v.is_object() && std::all_of(v.begin(), v.end(), isScalar)) {
    std::string out;
    for (const auto& [key, value] : v.items()) {
      out += (out.empty() ? "" : " ") + key + "=" + cellText(value);
    }
    return out.empty() ? "-" : out;
  }
  return v.dump(-1, ' ', false, Json::error_handler_t::replace);
}

void printTable(const Json& rows, std::ostream& out, std::string_view indent) {
  const std::vector<std::string> keys = columnOrder(rows);
  std::vector<std::string> headers;
  for (const auto& k : keys) headers.push_back(header(k));
  TextTable table(headers);
  for (const Json& row : rows) {
    std::vector<std::string> cells;
    for (const auto& k : keys) {
      const auto it = row.find(k);
      cells.push_back(it == row.end() ? "" : cellText(*it));
    }
    table.addRow(std::move(cells));
  }
  table.print(out, indent);
}

void printKeyedTable(const Json& object, std::ostream& out, std::string_view indent) {
  Json rows = Json::array();
  for (const auto& [key, value] : object.items()) {
    Json row = value;
    if (!row.contains("name")) row["name"] = key;
    rows.push_back(std::move(row));
  }
  printTable(rows, out, indent);
}

void printValue(const Json& v, std::ostream& out, int depth);

void printObject(const Json& object, std::ostream& out, int depth) {
  const std::string indent(static_cast<std::size_t>(depth) * 2, ' ');
  std::size_t keyWidth = 0;
  for (const auto& [key, value] : object.items()) {
    if (isScalar(value) || isScalarList(value) || value.empty()) {
      keyWidth = std::max(keyWidth, key.size() + 1);
    }
  }
  for (const auto& [key, value] : object.items()) {
    if (isScalar(value) || isScalarList(value) || value.empty()) {
      std::string label = key + ":";
      label.resize(keyWidth, ' ');
      out << indent << label << "  " << cellText(value) << '\n';
    }
  }
  for (const auto& [key, value] : object.items()) {
    if (isScalar(value) || isScalarList(value) || value.empty()) continue;
    out << '\n' << indent << key << ":\n";
    if (isTable(value)) {
      printTable(value, out, indent + "  ");
    } else if (isKeyedTable(value)) {
      printKeyedTable(value, out, indent + "  ");
    } else {
      printValue(value, out, depth + 1);
    }
  }
}

void printValue(const Json& v, std::ostream& out, int depth) {
  const std::string indent(static_cast<std::size_t>(depth) * 2, ' ');
  if (isTable(v)) {
    printTable(v, out, indent);
  } else if (v.is_object() && isKeyedTable(v) && depth == 0) {
    printKeyedTable(v, out, indent);
  } else if (v.is_object()) {
    printObject(v, out, depth);
  } else if (v.is_array()) {
    for (const Json& e : v) {
      if (isScalar(e)) {
        out << indent << cellText(e) << '\n';
      } else {
        printValue(e, out, depth + 1);
      }
    }
  } else {
    std::string text = cellText(v);
    out << indent << text;
    if (text.empty() || text.back() != '\n') out << '\n';
  }
}

void printResult(const Json& result, const GlobalOptions& options) {
  if (options.json) {
    std::cout << result.dump(2, ' ', false, Json::error_handler_t::replace) << '\n';
    return;
  }
  if (result.is_null() || (result.is_object() && result.empty())) {
    std::cout << "ok\n";
    return;
  }
  printValue(result, std::cout, 0);
}

// One line per event: its sequence number and time, then its other fields.
void printEvents(const Json& events, std::ostream& out) {
  for (const Json& event : events) {
    if (!event.is_object()) {
      out << cellText(event) << '\n';
      continue;
    }
    std::string line;
    for (const char* lead : {"seq", "time", "time_ms"}) {
      const auto it = event.find(lead);
      if (it != event.end()) line += (line.empty() ? "" : "  ") + cellText(*it);
    }
    for (const auto& [key, value] : event.items()) {
      if (key == "seq" || key == "time" || key == "time_ms") continue;
      line += (line.empty() ? "" : "  ") + key + "=" + cellText(value);
    }
    out << line << '\n';
  }
}

// --- requests ------------------------------------------------------------------

std::chrono::milliseconds timeoutOf(const GlobalOptions& options) {
  return std::chrono::milliseconds(
      static_cast<std::int64_t>(std::max(options.timeoutSeconds, 0.001) * 1000.0));
}

// The next step after a failed connect: where spillwayd's socket is set and
// how to point spillwayctl at it.
std::string connectHint(const GlobalOptions& options) {
  return "spillwayctl: spillwayd listens on its [control] socket (or its --control-socket); "
         "this was " +
         options.socketPath +
         ". Point spillwayctl at it with --socket PATH or SPILLWAY_SOCKET=PATH; permission "
         "denied means: run as root or as a member of [control] socket_group\n";
}

// Sends one request on a fresh connection. Returns an exit code; on 0,
// `result` holds the reply's result.
int request(const GlobalOptions& options, std::string_view command, const Json& args,
            Json& result) {
  CliClient client;
  std::string error;
  // --timeout bounds the whole request: the connect (a server whose backlog
  // stays full) and the reply.
  const auto timeout = timeoutOf(options);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (!client.connect(options.socketPath, error, timeout)) {
    std::cerr << "spillwayctl: " << error << '\n' << connectHint(options);
    return kExitConnect;
  }
  std::string reply;
  const auto left = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                                 deadline - std::chrono::steady_clock::now()),
                             std::chrono::milliseconds(1));
  if (!client.call(makeRequest(command, args), reply, left, error)) {
    std::cerr << "spillwayctl: " << command << " on " << options.socketPath << ": " << error
              << '\n';
    return kExitError;
  }
  std::optional<Reply> parsed = parseReply(reply);
  if (!parsed) {
    std::cerr << "spillwayctl: " << command << ": malformed reply from " << options.socketPath
              << '\n';
    return kExitError;
  }
  if (!parsed->ok) {
    std::cerr << "spillwayctl: " << command << ": " << parsed->errorCode << ": "
              << parsed->errorMessage << '\n';
    return kExitError;
  }
  result = std::move(parsed->result);
  return kExitOk;
}

int runOnce(const GlobalOptions& options, std::string_view command, const Json& args) {
  Json result;
  const int rc = request(options, command, args, result);
  if (rc == kExitOk) printResult(result, options);
  return rc;
}

std::string timestamp() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%d %H:%M:%S", &tm);
  return buffer;
}

std::chrono::milliseconds seconds(double s) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::max(s, 0.0) * 1000.0));
}

// stats --watch: the counters every `interval` seconds, `count` times (0:
// until interrupted).
int watchStats(const GlobalOptions& options, double interval, std::uint64_t count) {
  const bool clear = !options.json && isatty(STDOUT_FILENO) == 1;
  for (std::uint64_t i = 0; count == 0 || i < count; ++i) {
    if (i > 0) std::this_thread::sleep_for(seconds(interval));
    Json result;
    const int rc = request(options, "stats", Json::object(), result);
    if (rc != kExitOk) return rc;
    if (options.json) {
      std::cout << result.dump(-1, ' ', false, Json::error_handler_t::replace) << std::endl;
      continue;
    }
    if (clear) std::cout << "\033[H\033[2J";
    std::cout << "# " << timestamp() << '\n';
    printValue(result, std::cout, 0);
    std::cout << std::endl;
  }
  return kExitOk;
}

// events: once, or --follow by polling `events {after}` with the reply's
// `next` (or the highest `seq` seen when a reply has none).
int events(const GlobalOptions& options, std::uint64_t after, std::uint32_t limit, bool follow,
           double interval, std::uint64_t count) {
  for (std::uint64_t i = 0; count == 0 || i < count; ++i) {
    Json args = Json::object();
    args["after"] = after;
    args["limit"] = limit;
    Json result;
    const int rc = request(options, "events", args, result);
    if (rc != kExitOk) return rc;
    if (!follow) {
      if (options.json) {
        printResult(result, options);
      } else if (result.is_object() && result.contains("events") && result["events"].is_array()) {
        printEvents(result["events"], std::cout);
      } else {
        printResult(result, options);
      }
      return kExitOk;
    }
    const Json list =
        result.is_object() && result.contains("events") ? result["events"] : Json::array();
    std::uint64_t next = after;
    if (result.is_object() && result.contains("next") && result["next"].is_number_unsigned()) {
      next = result["next"].get<std::uint64_t>();
    }
    for (const Json& event : list) {
      if (event.is_object() && event.contains("seq") && event["seq"].is_number_unsigned()) {
        next = std::max(next, event["seq"].get<std::uint64_t>());
      }
    }
    if (result.is_object() && result.contains("missed") && result["missed"].is_number_unsigned() &&
        result["missed"].get<std::uint64_t>() > 0) {
      std::cerr << "spillwayctl: " << result["missed"].get<std::uint64_t>()
                << " events were overwritten in the daemon's log before they could be read\n";
    }
    if (options.json) {
      for (const Json& event : list) {
        std::cout << event.dump(-1, ' ', false, Json::error_handler_t::replace) << '\n';
      }
      std::cout << std::flush;
    } else {
      printEvents(list, std::cout);
      std::cout << std::flush;
    }
    // A full page means more are waiting: ask again at once.
    const bool more = list.size() >= limit && next > after;
    after = next;
    if (!more && (count == 0 || i + 1 < count)) std::this_thread::sleep_for(seconds(interval));
  }
  return kExitOk;
}

// --- a tier ------------------------------------------------------------------

std::optional<TierFile> readTier(const GlobalOptions& options) {
  auto tier = loadTierFile(options.tierPath);
  if (auto* error = std::get_if<std::string>(&tier)) {
    std::cerr << "spillwayctl: " << *error << '\n';
    return std::nullopt;
  }
  return std::get<TierFile>(std::move(tier));
}

// The command on every instance: per instance its name, ok or the error, and
// the reply; which instances failed on stderr.
int runOnTier(const GlobalOptions& options, std::string_view command, const Json& args) {
  const std::optional<TierFile> tier = readTier(options);
  if (!tier) return kExitUsage;
  const std::vector<TierOutcome> outcomes =
      fanOut(*tier, command, args, socketTierCall(timeoutOf(options)));
  std::string failed;
  std::string succeeded;
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    std::string& list = outcomes[i].ok ? succeeded : failed;
    list += (list.empty() ? "" : ", ") + tier->instances[i].name;
  }
  if (options.json) {
    std::cout << fanOutJson(*tier, outcomes).dump(2, ' ', false, Json::error_handler_t::replace)
              << '\n';
  } else {
    for (std::size_t i = 0; i < outcomes.size(); ++i) {
      const TierOutcome& o = outcomes[i];
      std::cout << (i > 0 ? "\n" : "") << tier->instances[i].name << ": ";
      if (!o.ok) {
        std::cout << "error: " << o.errorCode << ": " << o.errorMessage << '\n';
      } else if (o.result.is_null() || (o.result.is_object() && o.result.empty())) {
        std::cout << "ok\n";
      } else {
        std::cout << "ok\n";
        printValue(o.result, std::cout, 1);
      }
    }
  }
  if (failed.empty()) return kExitOk;
  const CommandSpec* spec = findCommand(command);
  const bool write = spec != nullptr && commandWrites(*spec, args);
  std::cerr << "spillwayctl: " << command << " failed on " << failed
            << (succeeded.empty() ? "" : (write ? "; applied on " : "; answered by ") + succeeded)
            << '\n';
  return kExitError;
}

int tierStatusCommand(const GlobalOptions& options) {
  const std::optional<TierFile> tier = readTier(options);
  if (!tier) return kExitUsage;
  const Json status = tierStatus(*tier, socketTierCall(timeoutOf(options)));
  bool anyFailed = false;
  bool anyDiffers = false;
  for (const auto& [name, instance] : status["instances"].items()) {
    anyFailed = anyFailed || !instance.value("ok", false);
  }
  for (const auto& [vip, v] : status["vips"].items()) {
    anyDiffers = anyDiffers || v.value("agreeing", 0) != v.value("reporting", 0);
  }
  const bool intentDiffers = !status["intent"].value("agree", true);
  if (options.json) {
    std::cout << status.dump(2, ' ', false, Json::error_handler_t::replace) << '\n';
  } else {
    TextTable table(
        {"VIP", "INSTANCE", "GENERATION", "WARMUP", "FINGERPRINT", "DIFFERING", "REFERENCE"});
    for (const auto& [vip, v] : status["vips"].items()) {
      for (const TierInstance& t : tier->instances) {
        const Json& instance = status["instances"][t.name];
        if (!instance.contains("vips") || !instance["vips"].contains(vip)) continue;
        const Json& row = instance["vips"][vip];
        table.addRow({vip, t.name, cellText(instance["generation"]), cellText(instance["warmup"]),
                      cellText(row["fingerprint"]),
                      row["differing_entries"].is_null() ? "?" : cellText(row["differing_entries"]),
                      row["reference"].get<bool>() ? "yes" : "no"});
      }
    }
    if (!status["vips"].empty()) table.print(std::cout);
    for (const auto& [vip, v] : status["vips"].items()) {
      std::cout << "\n"
                << vip << ": reference " << cellText(v["reference_fingerprint"])
                << " (the most common table), held by " << cellText(v["reference_instances"])
                << ": " << cellText(v["agreeing"]) << " of " << cellText(v["reporting"])
                << " instances agree\n";
    }
    for (const TierInstance& t : tier->instances) {
      const Json& instance = status["instances"][t.name];
      if (!instance.value("ok", false)) {
        std::cout << t.name << ": error: " << cellText(instance["error"]) << '\n';
      }
      if (!instance.contains("vips")) continue;
      for (const auto& [vip, row] : instance["vips"].items()) {
        for (const char* note : {"differing_note", "differing_error"}) {
          if (row.contains(note))
            std::cout << t.name << " " << vip << ": " << cellText(row[note]) << '\n';
        }
      }
    }
  }
  if (!options.json && status["intent"].value("reporting", 0) > 0) {
    // Operator intent: per instance its digest, and per peer what it saw.
    std::cout << "\noperator intent: " << status["intent"]["digests"].size()
              << (intentDiffers ? " different digests (diverged)\n" : " digest (agreed)\n");
    TextTable intents({"INSTANCE", "DIGEST", "ENTRIES", "PEER", "PEER_DIGEST", "DIFFERING"});
    for (const TierInstance& t : tier->instances) {
      const Json& instance = status["instances"][t.name];
      if (!instance.contains("intent")) continue;
      const Json& in = instance["intent"];
      if (!in.contains("peers") || in["peers"].empty()) {
        intents.addRow({t.name, cellText(in["digest"]), cellText(in["entries"]), "-", "-", "-"});
        continue;
      }
      const Json& peers = in["peers"];
      for (const auto& [peer, p] : peers.items()) {
        intents.addRow({t.name, cellText(in["digest"]), cellText(in["entries"]), peer,
                        p.value("received", false) ? cellText(p["digest"]) : "not received",
                        p["differing_entries"].is_null() ? "?" : cellText(p["differing_entries"])});
      }
    }
    intents.print(std::cout);
  }
  if (anyFailed) return kExitError;
  return anyDiffers || intentDiffers ? kExitTierDiffers : kExitOk;
}

std::string absolutePath(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  const auto absolute = std::filesystem::absolute(path, ec);
  return ec ? path : absolute.lexically_normal().string();
}

// One argument of a command-table row as a CLI11 positional or option, and
// the value it parsed into.
struct ArgSlot {
  const CommandSpec* command = nullptr;
  const ArgSpec* arg = nullptr;
  std::string text;
  std::uint64_t number = 0;
  bool flag = false;
  CLI::Option* option = nullptr;
};

std::string positionalName(std::string_view name) {
  return header(name);  // NAME, VIP, PATH, WEIGHT
}

std::string optionName(std::string_view name) {
  std::string out = "--" + std::string(name);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

// The subcommands of the command table (commands.hpp): "backend.drain" is
// `backend drain NAME`, with the row's help, its arguments as positionals or
// options with their help and ranges. Returns the subcommand of each row by
// its name; `selected` is set to the row the parse chose.
std::map<std::string, CLI::App*, std::less<>> addTableCommands(
    CLI::App& app, std::vector<std::unique_ptr<ArgSlot>>& slots, std::string& selected) {
  std::map<std::string, CLI::App*, std::less<>> byName;
  std::map<std::string, CLI::App*, std::less<>> groups;
  for (const CommandSpec& row : commandTable()) {
    CLI::App* parent = &app;
    std::string word(row.name);
    if (const auto dot = row.name.find('.'); dot != std::string_view::npos) {
      const std::string group(row.name.substr(0, dot));
      word = std::string(row.name.substr(dot + 1));
      auto& g = groups[group];
      // A command that is also a group ("flows", "flows.adopted"): its
      // subcommands hang under it, and it runs alone when none is given.
      if (g == nullptr) {
        if (auto leaf = byName.find(group); leaf != byName.end()) g = leaf->second;
      }
      if (g == nullptr) {
        std::string help;
        for (const CommandGroup& cg : commandGroups()) {
          if (cg.name == group) help = std::string(cg.help);
        }
        g = app.add_subcommand(group, help)->require_subcommand(1);
      }
      parent = g;
    }
    CLI::App* sub = parent->add_subcommand(word, std::string(row.help));
    sub->callback([&selected, sub, name = std::string(row.name)] {
      if (sub->get_subcommands().empty()) selected = name;
    });
    byName[std::string(row.name)] = sub;
    for (const ArgSpec& arg : row.args) {
      auto slot = std::make_unique<ArgSlot>();
      slot->command = &row;
      slot->arg = &arg;
      const std::string name = arg.positional ? positionalName(arg.name) : optionName(arg.name);
      const std::string help(arg.help);
      switch (arg.type) {
        case ArgType::String:
          slot->option = sub->add_option(name, slot->text, help);
          break;
        case ArgType::Uint32:
        case ArgType::Uint64: {
          const std::uint64_t max =
              arg.type == ArgType::Uint32 ? std::min<std::uint64_t>(arg.max, UINT32_MAX) : arg.max;
          slot->option = sub->add_option(name, slot->number, help)->check(CLI::Range(arg.min, max));
          break;
        }
        case ArgType::Bool:
          slot->option = sub->add_flag(name, slot->flag, help);
          break;
      }
      if (arg.required) slot->option->required();
      slots.push_back(std::move(slot));
    }
  }
  return byName;
}

// The request's arguments from what the parse gave the row's slots.
Json argsOf(const CommandSpec& row, const std::vector<std::unique_ptr<ArgSlot>>& slots) {
  Json args = Json::object();
  for (const auto& slot : slots) {
    if (slot->command != &row || slot->option->count() == 0) continue;
    const std::string key(slot->arg->name);
    switch (slot->arg->type) {
      case ArgType::String:
        // The daemon's working directory is not ours.
        args[key] = key == "path" ? absolutePath(slot->text) : slot->text;
        break;
      case ArgType::Uint32:
      case ArgType::Uint64:
        args[key] = slot->number;
        break;
      case ArgType::Bool:
        if (slot->flag) args[key] = true;
        break;
    }
  }
  return args;
}

int run(int argc, char** argv) {
  CLI::App app{"spillwayctl: operate a running spillwayd through its CLI socket", "spillwayctl"};
  app.fallthrough();
  app.require_subcommand(1);
  GlobalOptions options;
  app.add_option("--socket", options.socketPath, "the daemon's CLI socket")
      ->envname("SPILLWAY_SOCKET")
      ->capture_default_str();
  app.add_flag("--json", options.json, "print the result as JSON");
  app.add_option("--tier", options.tierPath,
                 "a tier file (NAME SOCKET_PATH per line): send the command to every instance")
      ->envname("SPILLWAY_TIER");
  app.add_option("--timeout", options.timeoutSeconds,
                 "seconds a request may take: the connect and the reply")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  std::string command;  // the protocol command (or top, tier.status) the parse selected
  std::vector<std::unique_ptr<ArgSlot>> slots;
  const auto byName = addTableCommands(app, slots, command);

  // What only this client does: top, tier status, and the repeating forms of
  // stats and events.
  TopOptions top;
  auto* topCmd = app.add_subcommand("top",
                                    "live full-screen view: pools, backends (state, flows, pps, "
                                    "bytes/s, GPU, queue, RTT) and the latest events; q or Ctrl-C "
                                    "quits")
                     ->callback([&] { command = "top"; });
  topCmd->add_flag("--once", top.once,
                   "print one plain-text report (two samples --interval apart) and exit");
  topCmd->add_option("--interval", top.intervalSeconds, "seconds between refreshes (default 1)")
      ->check(CLI::Range(0.1, 3600.0));
  topCmd->add_option("--events", top.eventLines, "latest events shown (default 8)")
      ->check(CLI::Range(1u, 1000u));

  double watchSeconds = 0;
  std::uint64_t count = 0;
  CLI::App* stats = byName.at("stats");
  auto* watchOption = stats->add_option("--watch", watchSeconds, "repeat every SECONDS (default 2)")
                          ->expected(0, 1)
                          ->check(CLI::NonNegativeNumber);
  stats->add_option("--count", count, "stop after N reports (default: never)");

  bool follow = false;
  double interval = 1.0;
  CLI::App* eventsCmd = byName.at("events");
  eventsCmd->add_flag("--follow,-f", follow, "keep printing new events");
  eventsCmd->add_option("--interval", interval, "seconds between polls with --follow")
      ->check(CLI::PositiveNumber);
  eventsCmd->add_option("--count", count, "with --follow: stop after N polls");

  auto* tierCmd =
      app.add_subcommand("tier", "a tier of instances (needs --tier)")->require_subcommand(1);
  tierCmd
      ->add_subcommand("status",
                       "per instance the generation, warm-up and every VIP's table fingerprint, "
                       "and the entries that differ from the most common table")
      ->callback([&] { command = "tier.status"; });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  if (command.empty()) return kExitUsage;

  Json args = Json::object();
  if (const CommandSpec* row = findCommand(command)) {
    args = argsOf(*row, slots);
    // The server checks again; a request it would refuse is not sent.
    if (auto problem = checkCommandArgs(*row, args)) {
      std::cerr << "spillwayctl: " << *problem << '\n';
      return kExitUsage;
    }
  }
  enum class Mode { Once, Watch, Events } mode = Mode::Once;
  if (command == "stats" && watchOption->count() > 0) mode = Mode::Watch;
  if (command == "events") mode = Mode::Events;

  if (command == "top" && !options.tierPath.empty()) {
    std::cerr << "spillwayctl: top shows one instance: give its --socket, not --tier\n";
    return kExitUsage;
  }
  const std::uint64_t after = args.value("after", std::uint64_t{0});
  const std::uint32_t limit = args.value("limit", kDefaultEventsLimit);
  if (command == "tier.status" || !options.tierPath.empty()) {
    if (options.tierPath.empty()) {
      std::cerr << "spillwayctl: tier status needs --tier FILE (or SPILLWAY_TIER)\n";
      return kExitUsage;
    }
    if (command == "tier.status") return tierStatusCommand(options);
    if (mode != Mode::Once || (command == "events" && follow)) {
      std::cerr << "spillwayctl: --tier takes one-shot commands (not stats --watch or events "
                   "--follow)\n";
      return kExitUsage;
    }
    if (command == "events") args = Json{{"after", after}, {"limit", limit}};
    return runOnTier(options, command, args);
  }
  if (command == "top") {
    top.socketPath = options.socketPath;
    top.timeoutSeconds = options.timeoutSeconds;
    return runTop(top);
  }
  switch (mode) {
    case Mode::Watch:
      return watchStats(options, watchSeconds > 0 ? watchSeconds : 2.0, count);
    case Mode::Events:
      return events(options, after, limit, follow, interval, follow ? count : 1);
    case Mode::Once:
      break;
  }
  return runOnce(options, command, args);
}

}  // namespace
}  // namespace spillway

int main(int argc, char** argv) {
  try {
    return spillway::run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "spillwayctl: " << e.what() << '\n';
    return 1;
  }
}
