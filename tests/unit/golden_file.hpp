// Test-only access to the golden packet files in tests/data/golden (format in
// the README.md there): hex dumps of frames and the JSON of their expected
// decoded fields. Tests compare byte for byte against the committed files;
// with SPILLWAY_REGENERATE_GOLDEN=1 in the environment they write them instead.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "spillway/flow_key.hpp"

namespace spillway::test {

inline std::string goldenDir() {
  return std::string(SPILLWAY_SOURCE_ROOT) + "/tests/data/golden";
}

inline bool regeneratingGolden() {
  const char* v = std::getenv("SPILLWAY_REGENERATE_GOLDEN");
  return v != nullptr && std::string(v) == "1";
}

// 16 bytes a line, lowercase, separated by spaces.
inline std::string toHex(std::span<const std::byte> bytes) {
  std::string out;
  char buf[4];
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%02x", std::to_integer<unsigned>(bytes[i]));
    out += buf;
    out += (i % 16 == 15 || i + 1 == bytes.size()) ? '\n' : ' ';
  }
  return out;
}

inline std::optional<std::string> readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::optional<std::vector<std::byte>> fromHex(const std::string& text) {
  std::vector<std::byte> out;
  int high = -1;
  for (char c : text) {
    int v;
    if (c >= '0' && c <= '9') {
      v = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      v = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      v = c - 'A' + 10;
    } else if (c == ' ' || c == '\n' || c == '\r' || c == '\t') {
      if (high >= 0) return std::nullopt;
      continue;
    } else {
      return std::nullopt;
    }
    if (high < 0) {
      high = v;
    } else {
      out.push_back(std::byte(high << 4 | v));
      high = -1;
    }
  }
  if (high >= 0) return std::nullopt;
  return out;
}

// Compares `bytes` with <goldenDir>/<file> (a hex dump), or writes the file
// when regenerating.
inline ::testing::AssertionResult matchesGoldenHex(const std::string& file,
                                                   std::span<const std::byte> bytes) {
  const std::string path = goldenDir() + "/" + file;
  if (regeneratingGolden()) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << toHex(bytes);
    return ::testing::AssertionSuccess() << "wrote " << path;
  }
  const auto text = readText(path);
  if (!text) {
    return ::testing::AssertionFailure()
           << "missing golden file " << path << " (SPILLWAY_REGENERATE_GOLDEN=1 writes it)";
  }
  const auto expected = fromHex(*text);
  if (!expected) return ::testing::AssertionFailure() << "bad hex in " << path;
  const std::size_t n = std::min(expected->size(), bytes.size());
  for (std::size_t i = 0; i < n; ++i) {
    if ((*expected)[i] != bytes[i]) {
      return ::testing::AssertionFailure()
             << path << ": first difference at byte " << i << ": expected 0x" << std::hex
             << std::to_integer<unsigned>((*expected)[i]) << ", got 0x"
             << std::to_integer<unsigned>(bytes[i]);
    }
  }
  if (expected->size() != bytes.size()) {
    return ::testing::AssertionFailure()
           << path << ": length " << bytes.size() << ", golden length " << expected->size();
  }
  return ::testing::AssertionSuccess();
}

// Same for a text file (the JSON of expected fields).
inline ::testing::AssertionResult matchesGoldenText(const std::string& file,
                                                    const std::string& text) {
  const std::string path = goldenDir() + "/" + file;
  if (regeneratingGolden()) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
    return ::testing::AssertionSuccess() << "wrote " << path;
  }
  const auto golden = readText(path);
  if (!golden) {
    return ::testing::AssertionFailure()
           << "missing golden file " << path << " (SPILLWAY_REGENERATE_GOLDEN=1 writes it)";
  }
  if (*golden != text) {
    return ::testing::AssertionFailure() << path << " differs; expected now:\n" << text;
  }
  return ::testing::AssertionSuccess();
}

// Expected fields of a golden case, written as JSON: one top-level member a
// line, nested objects on one line, members in insertion order.
class JsonObject {
 public:
  JsonObject& add(const std::string& key, const std::string& text) {
    return addRaw(key, "\"" + text + "\"");
  }
  JsonObject& add(const std::string& key, const char* text) { return add(key, std::string(text)); }
  JsonObject& add(const std::string& key, long long number) {
    return addRaw(key, std::to_string(number));
  }
  JsonObject& add(const std::string& key, bool flag) {
    return addRaw(key, flag ? "true" : "false");
  }
  JsonObject& add(const std::string& key, const JsonObject& object) {
    return addRaw(key, object.render(false));
  }
  JsonObject& addNull(const std::string& key) { return addRaw(key, "null"); }

  [[nodiscard]] std::string render(bool topLevel = true) const {
    std::string out = "{";
    for (std::size_t i = 0; i < members_.size(); ++i) {
      if (i > 0) out += ",";
      out += topLevel ? "\n  " : (i > 0 ? " " : "");
      out += "\"" + members_[i].first + "\": " + members_[i].second;
    }
    out += topLevel ? "\n}\n" : "}";
    return out;
  }

 private:
  JsonObject& addRaw(const std::string& key, std::string value) {
    members_.emplace_back(key, std::move(value));
    return *this;
  }
  std::vector<std::pair<std::string, std::string>> members_;
};

inline std::string ipText(const IpBytes& address, IpVersion version) {
  char buf[INET6_ADDRSTRLEN];
  const int family = version == IpVersion::V4 ? AF_INET : AF_INET6;
  return inet_ntop(family, address.data(), buf, sizeof buf) ? buf : "?";
}

inline std::string macText(const std::array<std::uint8_t, 6>& mac) {
  char buf[18];
  std::snprintf(buf, sizeof buf, "%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3],
                mac[4], mac[5]);
  return buf;
}

}  // namespace spillway::test
