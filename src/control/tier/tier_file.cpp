#include "control/tier/tier_file.hpp"

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <map>
#include <sstream>

#include "spillway/errno_text.hpp"

namespace spillway {

namespace {

bool validName(std::string_view name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

}  // namespace

std::variant<TierFile, std::string> parseTierFile(std::string_view text,
                                                  const std::string& origin) {
  TierFile tier;
  tier.origin = origin;
  std::map<std::string, std::size_t> nameLine;
  std::map<std::string, std::size_t> socketLine;
  std::size_t lineNo = 0;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++lineNo;
    if (const auto hash = line.find('#'); hash != std::string_view::npos) {
      line = line.substr(0, hash);
    }
    std::vector<std::string> fields;
    std::istringstream in{std::string(line)};
    for (std::string f; in >> f;) fields.push_back(f);
    if (fields.empty()) {
      if (end == text.size()) break;
      continue;
    }
    const std::string at = origin + ":" + std::to_string(lineNo) + ": ";
    if (fields.size() == 1) {
      return at + "instance " + fields[0] + " has no socket path (expected NAME SOCKET_PATH)";
    }
    if (fields.size() > 2) {
      return at + "expected NAME SOCKET_PATH, found " + std::to_string(fields.size()) +
             " fields (a path with spaces is not supported)";
    }
    const std::string& name = fields[0];
    const std::string& socket = fields[1];
    if (!validName(name)) {
      return at + "instance name \"" + name + "\" must be 1..64 of A-Z a-z 0-9 . _ -";
    }
    if (socket.front() != '/') {
      return at + "socket path \"" + socket + "\" of " + name + " must be absolute";
    }
    if (socket.size() > 107) {
      return at + "socket path of " + name + " is longer than a Unix socket path may be (107)";
    }
    if (const auto it = nameLine.find(name); it != nameLine.end()) {
      return at + "duplicate instance name " + name + " (first on line " +
             std::to_string(it->second) + ")";
    }
    if (const auto it = socketLine.find(socket); it != socketLine.end()) {
      return at + "socket " + socket + " of " + name + " is already instance line " +
             std::to_string(it->second) + "'s";
    }
    if (tier.instances.size() == kMaxTierInstances) {
      return at + "more than " + std::to_string(kMaxTierInstances) + " instances";
    }
    nameLine[name] = lineNo;
    socketLine[socket] = lineNo;
    tier.instances.push_back({name, socket});
    if (end == text.size()) break;
  }
  if (tier.instances.empty())
    return origin + ": names no instance (expected NAME SOCKET_PATH lines)";
  return tier;
}

std::variant<TierFile, std::string> loadTierFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return "cannot read tier file " + path + ": " + errnoText(errno);
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) return "cannot read tier file " + path + ": " + errnoText(errno);
  return parseTierFile(text.str(), path);
}

}  // namespace spillway
