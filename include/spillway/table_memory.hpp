// Memory for the data path's large hash tables (flow table, exception table):
// zeroed, pre-faulted, and on transparent huge pages where the kernel offers
// them (2 MiB and larger), so a random slot costs a cache miss but no TLB
// walk. In a KVM guest a TLB walk is two-dimensional: without huge pages a
// lookup in a 32 MiB table cost ~230 ns (BENCHMARKS.md, #16).
//
// Thread contract: allocate and free on any thread; the memory is the
// caller's.
#pragma once

#include <cstddef>
#include <memory>

namespace spillway {

struct FreeTableMemory {
  void operator()(void* memory) const noexcept;
};

// `bytes` zeroed bytes aligned to `align` (a power of two, at most 2 MiB);
// throws std::bad_alloc.
[[nodiscard]] void* allocateTableMemory(std::size_t bytes, std::size_t align);

template <typename T>
using TableMemory = std::unique_ptr<T[], FreeTableMemory>;

template <typename T>
[[nodiscard]] TableMemory<T> makeTableMemory(std::size_t count) {
  return TableMemory<T>(static_cast<T*>(allocateTableMemory(count * sizeof(T), alignof(T))));
}

}  // namespace spillway
