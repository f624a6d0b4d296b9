// Memory for the data path's large hash tables (flow table, exception table):
// zeroed, pre-faulted, and on transparent huge pages where the kernel offers
// them, so a random slot costs a cache miss but no guest TLB walk.
//
// Tables of 2 MiB and more get a mapping of their own (mmap, aligned to 2 MiB,
// MADV_HUGEPAGE before the first touch): memory malloc hands back after a
// free may already be faulted in 4 KiB pages, which madvise does not turn
// into huge ones.
//
// Thread contract: allocate and free on any thread; the memory is the
// caller's.
#pragma once

#include <cstddef>
#include <memory>

namespace spillway {

struct FreeTableMemory {
  std::size_t mappedBytes = 0;  // 0: from aligned_alloc
  void operator()(void* memory) const noexcept;
};

template <typename T>
using TableMemory = std::unique_ptr<T[], FreeTableMemory>;

// `bytes` zeroed bytes aligned to `align` (a power of two); throws
// std::bad_alloc.
[[nodiscard]] TableMemory<std::byte> allocateTableMemory(std::size_t bytes, std::size_t align);

template <typename T>
[[nodiscard]] TableMemory<T> makeTableMemory(std::size_t count) {
  TableMemory<std::byte> raw = allocateTableMemory(count * sizeof(T), alignof(T));
  const FreeTableMemory free = raw.get_deleter();
  return TableMemory<T>(reinterpret_cast<T*>(raw.release()), free);
}

}  // namespace spillway
