// Files that must survive a crash of spillwayd or of the host: written whole
// or not at all (a temporary file beside the target, fsync, rename over the
// target, fsync of the directory), read back only when they are regular files
// of bounded size, checksummed with CRC-32C; and the state directory they live
// in. Shared by the intent journal and the flow checkpoint.
//
// Thread contract: none; plain blocking file I/O for the control thread.
#pragma once

#include <cstddef>
#include <cstdint>
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

// Reads a whole regular file of at most maxBytes, opened without blocking
// (a FIFO or a device is an error, never a stall); std::nullopt with `error`
// empty when it does not exist, with `error` set when it cannot be read.
[[nodiscard]] std::optional<std::string> readStateFile(const std::string& path,
                                                       std::size_t maxBytes, std::string& error);

// Writes all of `bytes` to fd (retrying short writes and EINTR); false with
// errno set on failure.
[[nodiscard]] bool writeAllFd(int fd, std::string_view bytes) noexcept;

// fsync of a directory, so a rename or a new file in it is durable.
[[nodiscard]] std::optional<std::string> syncDirectory(const std::string& dir);

// CRC-32C (Castagnoli), as iSCSI and ext4 use it.
[[nodiscard]] std::uint32_t crc32c(std::string_view bytes) noexcept;

}  // namespace spillway
