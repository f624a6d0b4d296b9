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

// A single-writer 64-bit count with the arithmetic of a plain integer, for
// counter structs whose owner updates them with ++ and += (the flow table's):
// relaxed loads and stores only, so a concurrent read by the control thread
// is defined, and it copies like a number (a copy is a snapshot).
class RelaxedU64 {
 public:
  constexpr RelaxedU64(std::uint64_t v = 0) noexcept : value_(v) {}  // NOLINT: implicit by design
  RelaxedU64(const RelaxedU64& other) noexcept : value_(other.load()) {}
  RelaxedU64& operator=(const RelaxedU64& other) noexcept { return *this = other.load(); }
  RelaxedU64& operator=(std::uint64_t v) noexcept {
    value_.store(v, std::memory_order_relaxed);
    return *this;
  }
  operator std::uint64_t() const noexcept { return load(); }  // NOLINT: implicit by design
  RelaxedU64& operator+=(std::uint64_t n) noexcept { return *this = load() + n; }
  RelaxedU64& operator-=(std::uint64_t n) noexcept { return *this = load() - n; }
  RelaxedU64& operator++() noexcept { return *this += 1; }
  RelaxedU64& operator--() noexcept { return *this -= 1; }
  std::uint64_t operator++(int) noexcept {
    const std::uint64_t old = load();
    *this = old + 1;
    return old;
  }
  std::uint64_t operator--(int) noexcept {
    const std::uint64_t old = load();
    *this = old - 1;
    return old;
  }

 private:
  [[nodiscard]] std::uint64_t load() const noexcept {
    return value_.load(std::memory_order_relaxed);
  }
  std::atomic<std::uint64_t> value_;
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
