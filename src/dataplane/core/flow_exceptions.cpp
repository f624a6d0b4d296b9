#include "spillway/flow_exceptions.hpp"

#include <bit>

#include "spillway/snapshot.hpp"

namespace spillway {

bool isTableException(const ForwardingSnapshot& snapshot, std::uint64_t hash,
                      std::uint32_t backend) noexcept {
  if (backend >= snapshot.vipsOfBackend.size()) return true;
  const auto& vips = snapshot.vipsOfBackend[backend];
  if (vips.empty()) return true;  // in no table: nothing would place it there again
  for (const std::uint32_t v : vips) {
    if (v >= snapshot.vips.size() || snapshot.vips[v].table.lookup(hash) != backend) return true;
  }
  return false;
}

ExceptionTable::ExceptionTable(std::span<const ExceptionEntry> entries) {
  std::size_t wanted = 0;
  for (const ExceptionEntry& e : entries) {
    wanted += e.backend != 0 && e.backend <= FlowTable::kMaxBackend;
  }
  if (wanted == 0) return;
  const std::size_t slots = std::bit_ceil(wanted * 2);
  slots_.assign(slots, Slot{});
  mask_ = slots - 1;
  for (const ExceptionEntry& e : entries) {
    if (e.backend == 0 || e.backend > FlowTable::kMaxBackend) continue;
    const std::uint64_t fp = e.hash | static_cast<std::uint64_t>(e.hash == 0);
    std::size_t i = slotOf(fp);
    while (slots_[i].fingerprint != 0 && slots_[i].fingerprint != fp) i = (i + 1) & mask_;
    size_ += slots_[i].fingerprint == 0;
    slots_[i].fingerprint = fp;
    slots_[i].meta = e.backend | (static_cast<std::uint32_t>(e.state) << 24);
  }
}

}  // namespace spillway
