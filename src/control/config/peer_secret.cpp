#include "control/config/peer_secret.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>

#include "control/sys/durable_file.hpp"
#include "spillway/errno_text.hpp"

namespace spillway {

std::optional<std::string> readPeerSecret(const std::string& path, std::string& error) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    error = "cannot read the secret file " + path + ": " + errnoText(errno);
    return std::nullopt;
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    error = "the secret file " + path + " has mode " + mode +
            ": it must be readable by its owner only (chmod 600 " + path + ")";
    return std::nullopt;
  }
  auto bytes = readStateFile(path, kPeerMaxSecretBytes, error);
  if (!bytes) {
    if (error.empty()) error = "cannot read the secret file " + path;
    return std::nullopt;
  }
  while (!bytes->empty() && (bytes->back() == '\n' || bytes->back() == '\r')) bytes->pop_back();
  if (bytes->size() < kPeerMinSecretBytes) {
    error = "the secret file " + path + " holds " + std::to_string(bytes->size()) +
            " bytes, fewer than " + std::to_string(kPeerMinSecretBytes) +
            " (make one: head -c 32 /dev/urandom | base64 > " + path + ")";
    return std::nullopt;
  }
  return bytes;
}

}  // namespace spillway
