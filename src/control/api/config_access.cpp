#include "control/api/config_access.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <memory>

namespace spillway {
namespace {

namespace fs = std::filesystem;

// The permission class of `st` that applies to `caller`, as the kernel picks
// it: owner, else group (primary or supplementary), else other.
bool allowed(const struct stat& st, const PeerCredentials& caller, mode_t user, mode_t group,
             mode_t other) {
  if (caller.uid == 0) return true;
  if (st.st_uid == caller.uid) return (st.st_mode & user) != 0;
  const bool inGroup =
      st.st_gid == caller.gid ||
      std::find(caller.groups.begin(), caller.groups.end(), st.st_gid) != caller.groups.end();
  if (inGroup) return (st.st_mode & group) != 0;
  return (st.st_mode & other) != 0;
}

// realpath(3), or "" when the path does not resolve.
std::string resolve(const std::string& path) {
  std::unique_ptr<char, decltype(&std::free)> real(::realpath(path.c_str(), nullptr), &std::free);
  return real ? std::string(real.get()) : std::string();
}

// Whether `path` is `dir` itself or below it (both lexically normal, absolute).
bool within(const fs::path& path, const fs::path& dir) {
  auto p = path.begin();
  for (auto d = dir.begin(); d != dir.end(); ++d, ++p) {
    if (d->empty()) continue;  // a trailing separator
    if (p == path.end() || *p != *d) return false;
  }
  return true;
}

}  // namespace

std::string configPathProblem(const std::string& path, const std::string& configDir,
                              const PeerCredentials& caller, std::string& resolved) {
  resolved = path;
  if (caller.uid == 0) return "";
  const fs::path given(path);
  const std::string rule = "only root may have spillwayd read a configuration outside " +
                           (configDir.empty() ? std::string("its directory") : configDir);
  if (!given.is_absolute()) return path + ": a relative path; " + rule;
  if (configDir.empty()) return path + ": " + rule;
  const fs::path dir = fs::path(configDir).lexically_normal();
  if (!within(given.lexically_normal(), dir)) return path + ": outside " + configDir + "; " + rule;
  // Symbolic links must not lead out of it either.
  const std::string realDir = resolve(dir.string());
  const std::string real = resolve(path);
  if (realDir.empty() || real.empty()) {
    // Nothing to leak: the loader reports the missing file as it would.
    return "";
  }
  if (!within(fs::path(real), fs::path(realDir))) {
    return path + ": resolves to a file outside " + configDir + "; " + rule;
  }
  resolved = real;
  return "";
}

bool callerMayRead(const std::string& path, const PeerCredentials& caller) {
  if (caller.uid == 0) return true;
  const std::string real = resolve(path);
  if (real.empty()) return false;
  struct stat st {};
  if (::stat(real.c_str(), &st) != 0) return false;
  if (!allowed(st, caller, S_IRUSR, S_IRGRP, S_IROTH)) return false;
  // Every directory above it must be searchable by the caller.
  for (fs::path dir = fs::path(real).parent_path();; dir = dir.parent_path()) {
    if (::stat(dir.c_str(), &st) != 0) return false;
    if (!allowed(st, caller, S_IXUSR, S_IXGRP, S_IXOTH)) return false;
    if (dir == dir.parent_path()) break;
  }
  return true;
}

std::string formatErrorsWithheld(const std::vector<ConfigError>& errors) {
  std::string s;
  for (const ConfigError& e : errors) {
    if (e.line == 0 && e.field.empty()) {
      s += formatError(e) + '\n';  // about the file as a whole (open, type, size)
      continue;
    }
    s += e.file;
    if (e.line != 0) s += ':' + std::to_string(e.line) + ':' + std::to_string(e.column);
    s += ": " + (e.field.empty() ? std::string("syntax") : e.field) + '\n';
  }
  return s;
}

}  // namespace spillway
