// errnoText: the message of an errno value, spelled the same in every error
// line Spillway writes ("connect: Connection refused"). Takes the kernel's
// and libbpf's negative form (-ECONNREFUSED) as well. Thread-safe (the
// generic error category, not strerror's static buffer), allocation only for
// the returned text: for error paths, never the per-packet path.
#pragma once

#include <string>
#include <system_error>

namespace spillway {

[[nodiscard]] inline std::string errnoText(int err) {
  return std::generic_category().message(err < 0 ? -err : err);
}

}  // namespace spillway
