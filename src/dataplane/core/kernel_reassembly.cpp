#include "spillway/kernel_reassembly.hpp"

#include <charconv>
#include <fstream>
#include <sstream>
#include <vector>

namespace spillway {

namespace {

std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    const std::size_t start = i;
    while (i < line.size() && line[i] != ' ') ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

}  // namespace

std::optional<KernelReassembly> parseKernelReassembly(std::string_view snmp) {
  // Two lines start with "Ip: ": the field names, then their values.
  std::vector<std::string_view> ipLines;
  while (!snmp.empty()) {
    const std::size_t end = snmp.find('\n');
    const std::string_view line = snmp.substr(0, end);
    if (line.starts_with("Ip: ")) ipLines.push_back(line);
    if (end == std::string_view::npos) break;
    snmp.remove_prefix(end + 1);
  }
  if (ipLines.size() < 2) return std::nullopt;
  const auto names = words(ipLines[0]);
  const auto values = words(ipLines[1]);
  if (names.size() != values.size()) return std::nullopt;
  KernelReassembly r;
  int found = 0;
  for (std::size_t i = 1; i < names.size(); ++i) {
    std::uint64_t* field = names[i] == "ReasmReqds"     ? &r.requests
                           : names[i] == "ReasmOKs"     ? &r.ok
                           : names[i] == "ReasmFails"   ? &r.failed
                           : names[i] == "ReasmTimeout" ? &r.timeouts
                                                        : nullptr;
    if (field == nullptr) continue;
    const std::string_view v = values[i];
    const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), *field);
    if (ec != std::errc() || p != v.data() + v.size()) return std::nullopt;
    ++found;
  }
  if (found != 4) return std::nullopt;
  return r;
}

std::optional<KernelReassembly> readKernelReassembly(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return parseKernelReassembly(text.str());
}

}  // namespace spillway
