#include "spillway/table_memory.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace spillway {
namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;
}  // namespace

void* allocateTableMemory(std::size_t bytes, std::size_t align) {
  if (bytes >= kHugePage) align = kHugePage;
  bytes = (bytes + align - 1) / align * align;  // aligned_alloc wants a multiple
  if (bytes == 0) bytes = align;
  void* memory = std::aligned_alloc(align, bytes);
  if (memory == nullptr) throw std::bad_alloc();
#ifdef __linux__
  if (align == kHugePage) ::madvise(memory, bytes, MADV_HUGEPAGE);
#endif
  std::memset(memory, 0, bytes);  // pre-faults every page: no faults on the fast path
  return memory;
}

void FreeTableMemory::operator()(void* memory) const noexcept {
  std::free(memory);
}

}  // namespace spillway
