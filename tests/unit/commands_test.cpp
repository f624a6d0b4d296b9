// The command table (commands.hpp): its rows are well formed, every command
// the intent journal records has its row, and README.md's spillwayctl
// reference lists exactly the table's commands (plus the client's own, top
// and tier status) with each command's arguments as spillwayctl spells them.
#include "control/api/commands.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "control/intent/intent_journal.hpp"

namespace spillway {
namespace {

// The commands spillwayctl serves itself (no row of the table).
const std::set<std::string> kClientCommands = {"top", "tier.status"};

TEST(Commands, RowsAreWellFormed) {
  std::set<std::string> names;
  std::set<std::string> groups;
  for (const CommandGroup& g : commandGroups()) groups.insert(std::string(g.name));
  for (const CommandSpec& c : commandTable()) {
    const std::string name(c.name);
    EXPECT_TRUE(names.insert(name).second) << name << " twice";
    EXPECT_NE(c.handler, nullptr) << name;
    EXPECT_FALSE(c.help.empty()) << name;
    EXPECT_EQ(findCommand(c.name), &c);
    if (const auto dot = name.find('.'); dot != std::string::npos) {
      EXPECT_TRUE(groups.contains(name.substr(0, dot))) << name << ": its group has no help";
      EXPECT_EQ(name.find('.', dot + 1), std::string::npos) << name << ": two words at most";
    }
    // What is journaled changes state.
    if (!c.journalOp.empty()) {
      EXPECT_EQ(c.access, Access::Write) << name;
    }
    std::set<std::string> args;
    bool optionalPositional = false;
    for (const ArgSpec& a : c.args) {
      EXPECT_TRUE(args.insert(std::string(a.name)).second) << name << ": " << a.name << " twice";
      EXPECT_FALSE(a.help.empty()) << name << ": " << a.name;
      EXPECT_LE(a.min, a.max) << name << ": " << a.name;
      if (!a.needs.empty()) {
        EXPECT_TRUE(std::any_of(c.args.begin(), c.args.end(),
                                [&](const ArgSpec& o) { return o.name == a.needs; }))
            << name << ": " << a.name << " needs an argument the command lacks";
      }
      if (a.positional) {
        // A required positional after an optional one could not be told apart.
        EXPECT_FALSE(optionalPositional && a.required) << name << ": " << a.name;
        optionalPositional = optionalPositional || !a.required;
      }
    }
  }
}

// Numbers as the server parses them: JSON integers without a sign are
// unsigned (a signed one, such as -1, is refused).
TEST(Commands, ArgumentsAreCheckedAgainstTheRow) {
  const CommandSpec& events = *findCommand("events");
  EXPECT_EQ(checkCommandArgs(events, Json::object()), std::nullopt);
  EXPECT_EQ(checkCommandArgs(events, Json{{"limit", 1000u}}), std::nullopt);
  EXPECT_EQ(checkCommandArgs(events, Json{{"limit", 0u}}),
            "events: args.limit must be an integer in 1..1000, not 0");
  EXPECT_EQ(checkCommandArgs(events, Json{{"limit", 1001u}}),
            "events: args.limit must be an integer in 1..1000, not 1001");
  EXPECT_EQ(checkCommandArgs(*findCommand("backend.add"), Json{{"name", "a"}, {"address", "x"}}),
            "backend.add: missing argument pool");
  EXPECT_EQ(checkCommandArgs(*findCommand("status"), Json{{"x", 1}}),
            "status: unknown argument \"x\" (it takes none)");
  EXPECT_EQ(checkCommandArgs(*findCommand("table.digest"), Json{{"chunk", 1u}}),
            "table.digest: args.chunk needs args.vip");
  EXPECT_EQ(checkCommandArgs(*findCommand("table.digest"), Json{{"chunk", 1u}, {"vip", "v"}}),
            std::nullopt);
  EXPECT_EQ(checkCommandArgs(*findCommand("backend.weight"), Json{{"name", "a"}, {"weight", -1}}),
            "backend.weight: args.weight must be an integer in 0..4294967295, not -1");
  EXPECT_TRUE(commandWrites(*findCommand("backend.weight"), Json{{"name", "a"}, {"weight", 1u}}));
  EXPECT_FALSE(commandWrites(*findCommand("backend.weight"),
                             Json{{"name", "a"}, {"weight", 1u}, {"dry_run", true}}));
  EXPECT_FALSE(commandWrites(*findCommand("config.check"), Json::object()));
  EXPECT_TRUE(commandWrites(*findCommand("config.check"), Json{{"path", "/etc/x"}}));
}

// Each operation the intent journal records is the journal op of exactly one
// row, and each row's journal op is one the journal knows.
TEST(Commands, JournaledOperationsAreRows) {
  std::map<std::string, int> rowsPerOp;
  for (const CommandSpec& c : commandTable()) {
    if (!c.journalOp.empty()) ++rowsPerOp[std::string(c.journalOp)];
  }
  std::set<std::string> ops;
  for (int op = static_cast<int>(IntentOp::Add); op <= static_cast<int>(IntentOp::LbUndrain);
       ++op) {
    const auto intentOp = static_cast<IntentOp>(op);
    if (intentOp == IntentOp::Checkpoint) continue;  // the journal's own record
    const std::string name(toString(intentOp));
    ops.insert(name);
    EXPECT_EQ(rowsPerOp[name], 1) << name;
  }
  for (const auto& [op, rows] : rowsPerOp) {
    EXPECT_TRUE(ops.contains(op)) << op << ": no such intent operation";
  }
}

// The code block under "### spillwayctl" in README.md.
std::vector<std::string> readmeReference() {
  std::ifstream in(SPILLWAY_SOURCE_ROOT "/README.md");
  std::vector<std::string> lines;
  std::string line;
  bool inSection = false;
  bool inBlock = false;
  while (std::getline(in, line)) {
    if (line == "### spillwayctl") {
      inSection = true;
      continue;
    }
    if (!inSection) continue;
    if (line.starts_with("```")) {
      if (inBlock) break;
      inBlock = true;
      continue;
    }
    if (inBlock) lines.push_back(line);
  }
  return lines;
}

std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::vector<std::string> split(const std::string& text, const std::string& by) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (std::size_t at; (at = text.find(by, start)) != std::string::npos; start = at + by.size()) {
    out.push_back(text.substr(start, at - start));
  }
  out.push_back(text.substr(start));
  return out;
}

bool isCommandWord(const std::string& w) {
  return !w.empty() && std::all_of(w.begin(), w.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || c == '-' || c == '|';
  });
}

// Each command of the reference ("backend.drain") and the text of its
// alternative ("backend remove|drain|... NAME"). A reference line starts in
// the first column; the global options' lines start with "spillwayctl" or
// are indented; alternatives are separated by " | ".
std::map<std::string, std::string> referenceCommands() {
  std::map<std::string, std::string> out;
  for (const std::string& line : readmeReference()) {
    if (line.empty() || line[0] == ' ' || line.starts_with("spillwayctl")) continue;
    // The description starts after a run of spaces.
    const std::string syntax = line.substr(0, line.find("   "));
    for (const std::string& alternative : split(syntax, " | ")) {
      const std::vector<std::string> w = words(alternative);
      if (w.empty()) continue;
      if (w.size() > 1 && isCommandWord(w[1])) {
        for (const std::string& sub : split(w[1], "|")) out[w[0] + "." + sub] = alternative;
      } else {
        out[w[0]] = alternative;
      }
    }
  }
  return out;
}

TEST(Commands, ReadmeReferenceIsTheTable) {
  const std::map<std::string, std::string> reference = referenceCommands();
  ASSERT_FALSE(reference.empty()) << "no command reference under ### spillwayctl in README.md";
  for (const CommandSpec& c : commandTable()) {
    const auto it = reference.find(std::string(c.name));
    if (it == reference.end()) {
      ADD_FAILURE() << c.name << " is not in README.md's spillwayctl reference";
      continue;
    }
    // Each argument as spillwayctl spells it: NAME, or --dry-run.
    for (const ArgSpec& a : c.args) {
      std::string spelled(a.name);
      if (a.positional) {
        std::transform(spelled.begin(), spelled.end(), spelled.begin(),
                       [](char ch) { return static_cast<char>(std::toupper(ch)); });
      } else {
        std::replace(spelled.begin(), spelled.end(), '_', '-');
        spelled = "--" + spelled;
      }
      EXPECT_NE(it->second.find(spelled), std::string::npos)
          << c.name << ": README.md's \"" << it->second << "\" lacks " << spelled;
    }
  }
  for (const auto& [name, text] : reference) {
    EXPECT_TRUE(findCommand(name) != nullptr || kClientCommands.contains(name))
        << "README.md's reference has " << name << " (\"" << text
        << "\"), which the command table lacks";
  }
  for (const std::string& name : kClientCommands) {
    EXPECT_TRUE(reference.contains(name)) << name << " is not in README.md's reference";
  }
}

}  // namespace
}  // namespace spillway
