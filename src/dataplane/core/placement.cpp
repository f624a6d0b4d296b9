#include "spillway/placement.hpp"

#include <algorithm>

namespace spillway {

RecentPlacements::RecentPlacements(std::size_t slots, Millis halfLife)
    : byBackend_(std::make_unique<Decayed[]>(slots)),
      slots_(slots),
      halfLife_(static_cast<std::uint32_t>(std::clamp<Millis>(halfLife, 1, 3'600'000))) {}

void RecentPlacements::bump(Decayed& d, Millis now) noexcept {
  d.count = static_cast<float>(decayed(d, now) + 1.0);
  d.stamp = static_cast<std::uint32_t>(now);
}

void RecentPlacements::add(std::uint32_t index, std::uint8_t tag, Millis now) noexcept {
  if (index < slots_) bump(byBackend_[index], now);
  bump(byVip_[tag & FlowTable::kMaxVipTag], now);
}

Placement placeNewFlow(const MaglevTable& table, const VipPlacement& placement,
                       const RecentPlacements& recent, std::uint64_t hash, std::uint8_t vipTag,
                       Millis now) noexcept {
  Placement out;
  const std::span<const std::uint32_t> entries = table.entries();
  const std::uint32_t size = table.size();
  const std::uint32_t first = MaglevTable::slotOf(hash, size);
  out.tableBackend = entries[first];
  out.backend = out.tableBackend;
  if (out.tableBackend == 0 || placement.rates == nullptr || placement.load == nullptr) {
    return out;
  }
  const double total = static_cast<double>(static_cast<std::uint64_t>(placement.load->totalRate));
  const double perFlow = std::max(1.0, static_cast<double>(static_cast<std::uint64_t>(placement.load->backendRate)));
  const double budget =
      placement.balanceFactor * (total + perFlow * (recent.vip(vipTag, now) + 1.0));
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
    if (b == 0 || std::find(seen.begin(), seen.begin() + seenCount, b) != seen.begin() + seenCount) {
      continue;
    }
    seen[seenCount++] = b;
    const double share =
        b < placement.share.size() && placement.share[b] > 0 ? placement.share[b] : 1e-9;
    const double after = static_cast<double>(placement.rates->get(b)) +
                         perFlow * (recent.backend(b, now) + 1.0);
    // (max with one flow: like the ceiling in bounded loads, an idle backend
    // may always take a flow, so the first flows keep their table entries)
    if (after <= std::max(budget * share, perFlow)) {
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
