#include "spillway/flow_exceptions.hpp"

#include <algorithm>
#include <bit>

#include "spillway/snapshot.hpp"

namespace spillway {

bool isTableException(const ForwardingSnapshot& snapshot, std::uint64_t hash, std::uint32_t backend,
                      std::uint8_t vipTag) noexcept {
  if (backend >= snapshot.vipsOfBackend.size()) return true;
  bool any = false;  // a table that could have placed it
  for (const std::uint32_t v : snapshot.vipsOfBackend[backend]) {
    if (v >= snapshot.vips.size()) return true;
    if (vipTag != 0 && snapshot.vips[v].tag != vipTag) continue;
    if (snapshot.vips[v].table.lookup(hash) != backend) return true;
    any = true;
  }
  return !any;  // in no such table: nothing would place it there again
}

bool exportsFlow(const ForwardingSnapshot& current, const ForwardingSnapshot* next,
                 std::uint64_t hash, std::uint32_t backend, std::uint8_t vipTag) noexcept {
  const auto kept = [&](const ForwardingSnapshot& s) {
    const SnapshotBackend* b = s.backend(backend);
    return b != nullptr && keepsTrackedFlows(b->state) &&
           isTableException(s, hash, backend, vipTag);
  };
  return kept(current) || (next != nullptr && kept(*next));
}

ExceptionTable::ExceptionTable(std::span<const ExceptionEntry> entries) {
  std::size_t wanted = 0;
  for (const ExceptionEntry& e : entries) {
    wanted += e.backend != 0 && e.backend <= FlowTable::kMaxBackend;
  }
  if (wanted == 0) return;
  const std::size_t slots = std::bit_ceil(wanted * 2);
  slots_ = makeTableMemory<Slot>(slots);  // zeroed: every slot empty
  mask_ = slots - 1;
  const std::size_t words = std::max<std::size_t>(slots / 16, 1);
  filter_ = makeTableMemory<std::uint64_t>(words);
  filterMask_ = words - 1;
  for (const ExceptionEntry& e : entries) {
    if (e.backend == 0 || e.backend > FlowTable::kMaxBackend) continue;
    const std::uint64_t fp = e.hash | static_cast<std::uint64_t>(e.hash == 0);
    std::size_t i = slotOf(fp);
    while (slots_[i].fingerprint != 0 && slots_[i].fingerprint != fp) i = (i + 1) & mask_;
    size_ += slots_[i].fingerprint == 0;
    slots_[i].fingerprint = fp;
    slots_[i].meta = e.backend | (static_cast<std::uint32_t>(e.state) << 24);
    slots_[i].origin = static_cast<std::uint32_t>(e.origin);
    const std::uint64_t mixed = filterMix(fp);
    filter_[(mixed >> 12) & filterMask_] |= filterBits(mixed);
  }
}

}  // namespace spillway
