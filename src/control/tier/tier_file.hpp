// The tier file: the instances of one load-balancer tier, for spillwayctl
// --tier. One instance per line, `NAME SOCKET_PATH`; `#` starts a comment;
// blank lines are skipped. A remote instance's socket is reached through a
// local forward (README, "Running a tier"), so every path is local.
//
//   # conf/tier.example
//   lb1  /run/spillway/spillway.sock
//   lb2  /run/spillway/lb2.sock        # ssh -L ... host2
//
// Rules: a name is 1..64 of [A-Za-z0-9._-] and unique; a socket path is
// absolute, at most 107 bytes (sun_path) and unique; a file names 1..256
// instances. Errors name the file and line.
//
// Thread contract: pure functions (loadTierFile reads the file).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace spillway {

inline constexpr std::size_t kMaxTierInstances = 256;

struct TierInstance {
  std::string name;
  std::string socketPath;
};

struct TierFile {
  std::string origin;  // the path it was read from, for messages
  std::vector<TierInstance> instances;
};

// A TierFile, or an error message ("ORIGIN:LINE: ...").
[[nodiscard]] std::variant<TierFile, std::string> parseTierFile(std::string_view text,
                                                                const std::string& origin);
[[nodiscard]] std::variant<TierFile, std::string> loadTierFile(const std::string& path);

}  // namespace spillway
