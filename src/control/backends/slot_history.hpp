// Second chance's slot history (snapshot_builder.hpp) in the form that
// outlives the process (history.bin, flow_checkpoint.hpp): per VIP, the
// slots that moved within the hold, by backend id.
//
// Thread contract: plain values.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace spillway {

// One slot's history, by backend id (0: none).
struct SlotHistoryRecord {
  std::uint32_t slot = 0;
  std::uint64_t previousId = 0;  // the owner the slot names (its previous owner)
  std::uint64_t originId = 0;    // its owner before the current run of moves
  std::uint32_t ageMs = 0;       // since the slot last moved
  friend bool operator==(const SlotHistoryRecord&, const SlotHistoryRecord&) = default;
};

struct VipSlotHistory {
  std::uint32_t tableSize = 0;
  std::vector<SlotHistoryRecord> slots;
  friend bool operator==(const VipSlotHistory&, const VipSlotHistory&) = default;
};

using SlotHistory = std::map<std::string, VipSlotHistory>;  // by VIP name

}  // namespace spillway
