// The tier's shared secret, as the configuration names it ([tier]
// secret_file): read and checked when the configuration loads, so a bad file
// is a configuration error with the file's path in it, and used by the peer
// channel (control/tier/peer_wire.hpp) to authenticate instances.
//
// Thread contract: none (a pure function of the file).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace spillway {

inline constexpr std::size_t kPeerMinSecretBytes = 16;
inline constexpr std::size_t kPeerMaxSecretBytes = 4096;

// The tier's secret: a regular file of kPeerMinSecretBytes..kPeerMaxSecretBytes
// bytes, readable by its owner only. The error says what is wrong.
[[nodiscard]] std::optional<std::string> readPeerSecret(const std::string& path,
                                                        std::string& error);

}  // namespace spillway
