// Network byte order carried in the type.
//
// Be16 and Be32 hold big-endian values exactly as they sit on the wire. They
// are arrays of bytes, so a wire struct made of them has alignment 1 and can be
// copied to or from any offset of a packet with memcpy, without unaligned or
// aliasing loads. Convert with host()/fromHost() at the edge of the logic.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace spillway {

struct Be16 {
  std::array<std::uint8_t, 2> raw{};

  [[nodiscard]] constexpr std::uint16_t host() const noexcept {
    return static_cast<std::uint16_t>((raw[0] << 8) | raw[1]);
  }
  [[nodiscard]] static constexpr Be16 fromHost(std::uint16_t v) noexcept {
    return Be16{{static_cast<std::uint8_t>(v >> 8), static_cast<std::uint8_t>(v)}};
  }
  friend constexpr bool operator==(const Be16&, const Be16&) = default;
};

struct Be32 {
  std::array<std::uint8_t, 4> raw{};

  [[nodiscard]] constexpr std::uint32_t host() const noexcept {
    return (std::uint32_t{raw[0]} << 24) | (std::uint32_t{raw[1]} << 16) |
           (std::uint32_t{raw[2]} << 8) | std::uint32_t{raw[3]};
  }
  [[nodiscard]] static constexpr Be32 fromHost(std::uint32_t v) noexcept {
    return Be32{{static_cast<std::uint8_t>(v >> 24), static_cast<std::uint8_t>(v >> 16),
                 static_cast<std::uint8_t>(v >> 8), static_cast<std::uint8_t>(v)}};
  }
  friend constexpr bool operator==(const Be32&, const Be32&) = default;
};

static_assert(sizeof(Be16) == 2 && alignof(Be16) == 1);
static_assert(sizeof(Be32) == 4 && alignof(Be32) == 1);

// Copies a trivially copyable wire struct out of / into a byte span at an
// offset the caller has already bounds-checked.
template <typename T>
[[nodiscard]] inline T loadAt(std::span<const std::byte> bytes, std::size_t offset) noexcept {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

template <typename T>
inline void storeAt(std::span<std::byte> bytes, std::size_t offset, const T& value) noexcept {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

// Little-endian 64-bit word load used by the hash functions.
[[nodiscard]] inline std::uint64_t loadLe64(const std::byte* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}

}  // namespace spillway
