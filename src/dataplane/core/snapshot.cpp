#include "spillway/snapshot.hpp"

#include <bit>

namespace spillway {

VipIndex::VipIndex(const std::vector<SnapshotVip>& vips,
                   const std::vector<OwnAddress>& gatewayAddresses) {
  // Each VIP takes a slot, each distinct address one more as a marker, and
  // each gateway address one.
  const std::size_t wanted =
      std::bit_ceil(std::max<std::size_t>(4, vips.size() * 4 + gatewayAddresses.size() * 2));
  slots_.assign(wanted, Slot{});
  mask_ = static_cast<std::uint32_t>(wanted - 1);
  auto place = [&](const PackedKey& key, std::uint32_t vip) {
    std::uint32_t i = slotHash(key) & mask_;
    while (slots_[i].vip != kNone) {
      if (slots_[i].key == key) return;  // first VIP with this key wins
      i = (i + 1) & mask_;
    }
    slots_[i] = Slot{key, vip};
  };
  auto placeMarker = [&](const PackedKey& key, std::uint32_t kind) {
    place(key, kind);
    const std::uint32_t bit = filterBit(key);
    ownFilter_[bit / 64] |= std::uint64_t{1} << (bit % 64);
  };
  for (std::uint32_t v = 0; v < vips.size(); ++v) {
    const VipKey& key = vips[v].key;
    place(packKey(key.address, key.version, key.proto, key.port), v);
    placeMarker(packKey(key.address, key.version, 0, 0), kAddressOnly);
  }
  // After the VIPs: an address that is both stays a VIP's.
  for (const OwnAddress& a : gatewayAddresses) {
    placeMarker(packKey(a.address, a.version, 0, 0), kGatewayAddress);
  }
}

SnapshotPublisher::~SnapshotPublisher() {
  // Readers must be stopped (or offline) before the publisher goes away.
  current_.store(nullptr, std::memory_order_release);
}

void SnapshotPublisher::publish(std::unique_ptr<const ForwardingSnapshot> next) {
  // The one step that can throw (the retire list growing) comes before the
  // store, so a failure leaves the published snapshot as it was.
  if (owned_) retired_.push_back(Retired{0, nullptr});
  current_.store(next.get(), std::memory_order_seq_cst);
  const std::uint64_t token = qsbr_.start();
  if (owned_) retired_.back() = Retired{token, std::move(owned_)};
  owned_ = std::move(next);
}

std::size_t SnapshotPublisher::reclaim() noexcept {
  std::size_t freed = 0;
  // Tokens grow monotonically: stop at the first one still in its grace period.
  while (!retired_.empty() && qsbr_.check(retired_.front().token)) {
    retired_.pop_front();
    ++freed;
  }
  return freed;
}

}  // namespace spillway
