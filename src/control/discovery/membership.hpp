// What a discovery source wants in its pool, damped: a backend joins as soon
// as the source lists it; one the source stops listing stays wanted for the
// hold time and leaves only when it is still absent then, so an answer that
// flaps (a torn rewrite, a resolver's partial answer) moves nothing.
//
// The plane reconciles its configuration with wanted(): adds what is wanted
// and missing, drains what it discovered and is no longer wanted.
//
// Thread contract: control thread; time is passed in.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "control/discovery/file_sd.hpp"
#include "spillway/flow_table.hpp"  // Millis

namespace spillway {

class DiscoveryMembership {
 public:
  explicit DiscoveryMembership(Millis hold) : hold_(hold) {}
  void setHold(Millis hold) noexcept { hold_ = hold; }

  // A new answer from the source (every entry already validated).
  void update(const std::vector<DiscoveredBackend>& listed, Millis now);
  // Lets go of members absent for the hold; true when wanted() changed.
  bool expire(Millis now);

  // Members, listed or absent for less than the hold, by id.
  [[nodiscard]] const std::map<std::uint64_t, DiscoveredBackend>& wanted() const noexcept {
    return wanted_;
  }
  [[nodiscard]] bool listed(std::uint64_t id) const { return absentSince_.count(id) == 0; }
  // Absences that ended within the hold (flaps damped).
  [[nodiscard]] std::uint64_t damped() const noexcept { return damped_; }
  [[nodiscard]] std::uint64_t generation() const noexcept { return generation_; }

 private:
  Millis hold_;
  std::map<std::uint64_t, DiscoveredBackend> wanted_;
  std::map<std::uint64_t, Millis> absentSince_;
  std::uint64_t damped_ = 0;
  std::uint64_t generation_ = 0;  // bumped when wanted_ changes
};

}  // namespace spillway
