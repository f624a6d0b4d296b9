// Per-lcore counters: one writer (the owning lcore), read by the control
// thread at any time.
//
// A Counter is a relaxed atomic that is only ever loaded and stored, never
// read-modified-written: on x86 an add() compiles to a plain load, add and
// store (no lock prefix), yet a concurrent read by the control thread is
// well defined (and TSan-clean). Counts may be read a few packets stale.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "spillway/drop_reason.hpp"

namespace spillway {

class Counter {
 public:
  void add(std::uint64_t n = 1) noexcept {
    value_.store(value_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  void set(std::uint64_t v) noexcept { value_.store(v, std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t read() const noexcept {
    return value_.load(std::memory_order_relaxed);
  }

 private:
  std::atomic<std::uint64_t> value_{0};
};

struct DropCounters {
  std::array<Counter, static_cast<std::size_t>(DropReason::kCount)> byReason{};

  void add(DropReason r, std::uint64_t n = 1) noexcept {
    byReason[static_cast<std::size_t>(r)].add(n);
  }
  [[nodiscard]] std::uint64_t read(DropReason r) const noexcept {
    return byReason[static_cast<std::size_t>(r)].read();
  }
  [[nodiscard]] std::uint64_t total() const noexcept {
    std::uint64_t t = 0;
    for (const auto& c : byReason) t += c.read();
    return t;
  }
};

}  // namespace spillway
