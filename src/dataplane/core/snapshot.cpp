#include "spillway/snapshot.hpp"

#include <bit>

namespace spillway {
namespace {

std::uint64_t vipKeyHash(const VipKey& k) noexcept {
  // Control-plane keys: no flooding concern, any decent mix will do.
  std::uint64_t h = 0x9e3779b97f4a7c15ULL ^ (std::uint64_t{k.proto} << 16) ^ k.port ^
                    (std::uint64_t{static_cast<std::uint8_t>(k.version)} << 24);
  const std::size_t len = k.version == IpVersion::V4 ? 4 : 16;
  for (std::size_t i = 0; i < len; ++i) {
    h = (h ^ std::to_integer<std::uint64_t>(k.address[i])) * 0x100000001b3ULL;
  }
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ULL;
  return h ^ (h >> 32);
}

}  // namespace

VipIndex::VipIndex(const std::vector<SnapshotVip>& vips) {
  // Each VIP takes a slot, and each distinct address one more as a marker.
  const std::size_t wanted = std::bit_ceil(std::max<std::size_t>(4, vips.size() * 4));
  slots_.assign(wanted, Slot{});
  mask_ = static_cast<std::uint32_t>(wanted - 1);
  auto place = [&](const VipKey& key, std::uint32_t vip) {
    std::uint32_t i = static_cast<std::uint32_t>(vipKeyHash(key)) & mask_;
    while (slots_[i].vip != kNone) {
      if (slots_[i].key == key) return;  // first VIP with this key wins
      i = (i + 1) & mask_;
    }
    slots_[i] = Slot{key, vip};
  };
  for (std::uint32_t v = 0; v < vips.size(); ++v) {
    place(vips[v].key, v);
    VipKey marker{vips[v].key.address, vips[v].key.version, 0, 0};
    place(marker, kAddressOnly);
  }
}

std::uint32_t VipIndex::probe(const VipKey& key) const noexcept {
  if (slots_.empty()) return kNone;
  std::uint32_t i = static_cast<std::uint32_t>(vipKeyHash(key)) & mask_;
  while (slots_[i].vip != kNone) {
    if (slots_[i].key == key) return slots_[i].vip;
    i = (i + 1) & mask_;
  }
  return kNone;
}

std::uint32_t VipIndex::find(const IpBytes& dst, IpVersion version, std::uint8_t proto,
                             std::uint16_t port) const noexcept {
  if (proto == 0) return kNone;  // proto 0 keys are address markers
  std::uint32_t v = probe(VipKey{dst, version, proto, port});
  if (v == kNone && port != 0) v = probe(VipKey{dst, version, proto, 0});
  return v == kAddressOnly ? kNone : v;
}

bool VipIndex::isVipAddress(const IpBytes& dst, IpVersion version) const noexcept {
  return probe(VipKey{dst, version, 0, 0}) != kNone;
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
