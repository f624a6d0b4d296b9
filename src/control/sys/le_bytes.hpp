// Little-endian integers in the control plane's own files and frames (the
// intent journal, the tier intent file and its peer records): appended to a
// string, and read back from a span the caller has bounds-checked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace spillway {

// The low `bytes` bytes of v (1 to 8), least significant first.
inline void putLe(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// `bytes` bytes at in[at..]: the caller checked at + bytes <= in.size().
[[nodiscard]] inline std::uint64_t getLe(std::string_view in, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= std::uint64_t{static_cast<unsigned char>(in[at + static_cast<std::size_t>(i)])} << (8 * i);
  }
  return v;
}

}  // namespace spillway
