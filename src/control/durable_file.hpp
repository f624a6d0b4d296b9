// Files that must survive a crash of spillwayd or of the host: written whole
// or not at all (a temporary file beside the target, fsync, rename over the
// target, fsync of the directory), and the state directory they live in.
//
// Thread contract: none; plain blocking file I/O for the control thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace spillway {

// Replaces `path` with `bytes` atomically and durably; the error says which
// step failed and why (errno text).
[[nodiscard]] std::optional<std::string> writeFileDurably(const std::string& path,
                                                          std::string_view bytes);

// Creates `dir` (and its parents) with mode 0700 when missing; an error when
// it cannot, or when it exists and is not a directory.
[[nodiscard]] std::optional<std::string> ensureStateDirectory(const std::string& dir);

// strerror(errno) as a std::string, thread-safe.
[[nodiscard]] std::string errnoText(int error);

}  // namespace spillway
