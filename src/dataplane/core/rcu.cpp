#include "spillway/rcu.hpp"

namespace spillway {

QsbrDomain::QsbrDomain(std::size_t readers)
    : readers_(readers), slots_(std::make_unique<Slot[]>(readers)) {}

bool QsbrDomain::check(std::uint64_t token) const noexcept {
  for (std::size_t i = 0; i < readers_; ++i) {
    const std::uint64_t e = slots_[i].epoch.load(std::memory_order_seq_cst);
    if (e != kOffline && e < token) return false;
  }
  return true;
}

}  // namespace spillway
