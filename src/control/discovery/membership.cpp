#include "control/discovery/membership.hpp"

#include <set>

namespace spillway {

void DiscoveryMembership::update(const std::vector<DiscoveredBackend>& listed, Millis now) {
  std::set<std::uint64_t> present;
  for (const DiscoveredBackend& b : listed) {
    present.insert(b.id);
    auto it = wanted_.find(b.id);
    if (it == wanted_.end()) {
      wanted_.emplace(b.id, b);
      ++generation_;
    } else if (!(it->second == b)) {
      it->second = b;  // labels changed; the plane applies what it can
      ++generation_;
    }
    if (absentSince_.erase(b.id) != 0) ++damped_;
  }
  for (const auto& [id, b] : wanted_) {
    if (present.count(id) == 0) absentSince_.emplace(id, now);  // keeps the first absence
  }
  (void)expire(now);
}

bool DiscoveryMembership::expire(Millis now) {
  bool changed = false;
  for (auto it = absentSince_.begin(); it != absentSince_.end();) {
    if (now >= it->second + hold_) {
      wanted_.erase(it->first);
      it = absentSince_.erase(it);
      changed = true;
    } else {
      ++it;
    }
  }
  if (changed) ++generation_;
  return changed;
}

}  // namespace spillway
