#include "spillway/placement.hpp"

#include <algorithm>

namespace spillway {

PlacementLedger::PlacementLedger(std::size_t slots) : slots_(slots) {
  for (auto& epoch : byBackend_) epoch = std::make_unique<std::uint32_t[]>(slots);
}

void PlacementLedger::beginEpoch(std::uint64_t n) noexcept {
  if (n <= epoch_) return;
  // Epochs skipped (counts this lcore never saw) start empty too.
  for (std::uint64_t e = std::max(epoch_ + 1, n + 1 > kEpochs ? n + 1 - kEpochs : 0); e <= n; ++e) {
    std::fill_n(byBackend_[e % kEpochs].get(), slots_, 0U);
    byVip_[e % kEpochs].fill(0);
  }
  epoch_ = n;
}

void PlacementLedger::add(std::uint32_t index, std::uint8_t tag) noexcept {
  if (index < slots_) ++byBackend_[epoch_ % kEpochs][index];
  ++byVip_[epoch_ % kEpochs][tag & FlowTable::kMaxVipTag];
}

std::uint32_t PlacementLedger::backend(std::uint32_t index, std::uint64_t since) const noexcept {
  if (index >= slots_) return 0;
  return sum(since, [&](std::size_t e) { return byBackend_[e][index]; });
}

std::uint32_t PlacementLedger::vip(std::uint8_t tag, std::uint64_t since) const noexcept {
  return sum(since, [&](std::size_t e) { return byVip_[e][tag & FlowTable::kMaxVipTag]; });
}

Placement placeNewFlow(const MaglevTable& table, const VipPlacement& placement,
                       const PlacementLedger& ledger, std::uint64_t hash,
                       std::uint8_t vipTag) noexcept {
  Placement out;
  const std::span<const std::uint32_t> entries = table.entries();
  const std::uint32_t size = table.size();
  const std::uint32_t first = MaglevTable::slotOf(hash, size);
  out.tableBackend = entries[first];
  out.backend = out.tableBackend;
  if (out.tableBackend == 0 || placement.loads == nullptr || placement.load == nullptr) {
    return out;
  }
  const std::uint64_t since = placement.loads->epoch();
  const double total =
      static_cast<double>(static_cast<std::uint64_t>(placement.load->milliFlows)) / kLoadScale;
  const double budget = placement.balanceFactor * (total + ledger.vip(vipTag, since) + 1.0);
  const std::uint32_t wanted =
      std::clamp<std::uint32_t>(placement.candidates, 1, kMaxPlacementCandidates);
  const std::uint32_t walk = std::min(size, kMaxPlacementWalk);

  std::array<std::uint32_t, kMaxPlacementCandidates> seen{};
  std::uint32_t seenCount = 0;
  double bestScore = 0;
  std::uint32_t slot = first;
  for (std::uint32_t step = 0; step < walk && seenCount < wanted; ++step) {
    const std::uint32_t b = entries[slot];
    slot = slot + 1 == size ? 0 : slot + 1;
    if (b == 0 ||
        std::find(seen.begin(), seen.begin() + seenCount, b) != seen.begin() + seenCount) {
      continue;
    }
    seen[seenCount++] = b;
    const double share =
        b < placement.share.size() && placement.share[b] > 0 ? placement.share[b] : 1e-9;
    const double after = placement.loads->flows(b) + ledger.backend(b, since) + 1.0;
    if (after <= std::max(budget * share, 1.0)) {
      out.backend = b;
      out.candidates = seenCount;
      return out;
    }
    const double score = after / share;
    if (seenCount == 1 || score < bestScore) {
      bestScore = score;
      out.backend = b;
    }
  }
  out.candidates = seenCount;
  return out;
}

}  // namespace spillway
