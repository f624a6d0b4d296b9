#include "spillway/table_memory.hpp"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

namespace spillway {
namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;
}  // namespace

TableMemory<std::byte> allocateTableMemory(std::size_t bytes, std::size_t align) {
  if (bytes < kHugePage) {
    const std::size_t size = bytes == 0 ? align : (bytes + align - 1) / align * align;
    void* memory = std::aligned_alloc(align, size);
    if (memory == nullptr) throw std::bad_alloc();
    std::memset(memory, 0, size);
    return TableMemory<std::byte>(static_cast<std::byte*>(memory), FreeTableMemory{});
  }
  const std::size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  // One huge page more than needed, then the unaligned head and the tail cut off.
  void* mapped =
      ::mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) throw std::bad_alloc();
  const auto base = reinterpret_cast<std::uintptr_t>(mapped);
  const std::uintptr_t aligned = (base + kHugePage - 1) & ~(std::uintptr_t{kHugePage} - 1);
  if (aligned != base) ::munmap(mapped, aligned - base);
  if (const std::size_t tail = base + size + kHugePage - (aligned + size); tail != 0) {
    ::munmap(reinterpret_cast<void*>(aligned + size), tail);
  }
  auto* memory = reinterpret_cast<std::byte*>(aligned);
  (void)::madvise(memory, size, MADV_HUGEPAGE);  // where THP is "madvise"; harmless elsewhere
  std::memset(memory, 0, size);  // pre-faults every page: no faults on the fast path
  return TableMemory<std::byte>(memory, FreeTableMemory{size});
}

void FreeTableMemory::operator()(void* memory) const noexcept {
  if (memory == nullptr) return;
  if (mappedBytes != 0) {
    ::munmap(memory, mappedBytes);
  } else {
    std::free(memory);
  }
}

}  // namespace spillway
