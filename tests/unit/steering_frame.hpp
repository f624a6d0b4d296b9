// A received frame as the steering pipeline takes it (spillway/steering.hpp):
// kFrameHeadroom bytes of headroom, the frame, and room behind it, in a
// buffer the test owns; out() is the frame a result points at.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "spillway/steering.hpp"

namespace spillway::test {

inline constexpr std::size_t kFrameHeadroom = 128;

struct Frame {
  std::vector<std::byte> storage;
  FrameRef ref;

  explicit Frame(const std::vector<std::byte>& bytes)
      : storage(kFrameHeadroom + bytes.size() + 64) {
    std::copy(bytes.begin(), bytes.end(), storage.begin() + kFrameHeadroom);
    ref = FrameRef{storage, kFrameHeadroom, bytes.size()};
  }
  [[nodiscard]] std::span<const std::byte> out(const SteerResult& r) const {
    return std::span<const std::byte>(storage).subspan(r.dataOffset, r.length);
  }
};

}  // namespace spillway::test
