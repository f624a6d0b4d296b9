// Which VIPs this instance announces to the router, and why each other one is
// withdrawn: the decision half of the BGP announcement (the kernel half is
// announce_device.hpp, the thread that applies it is announcer.hpp). A pure
// class: time and every input are passed in, so the rules are unit tested
// without a kernel, a clock or a speaker.
//
// Rules (issue 11, item 1), in the order a reason wins:
//   stopping            SIGTERM: everything withdrawn first, forwarding goes on
//                       for withdraw_grace_ms so the router moves the flows.
//   frozen              the whole process stopped running (SIGSTOP, a hung
//                       host) long enough for the freeze guard
//                       (freeze_guard.hpp) to set the device down: this
//                       round, then hold_down like the stalls.
//   control_stalled     the control loop's heartbeat did not advance for
//                       control_stall_ms (its inputs are stale).
//   dataplane_stalled   a worker's round counter did not advance for stall_ms
//                       (an lcore stuck or gone: packets sent here are lost).
//   warming_up          until the control plane knows health and load once
//                       (latched: warm-up happens once per process).
//   drained             the operator's `spillwayctl lb drain`.
//   no_active_backend   the VIP's table is empty (new flows would be dropped).
//   hold_down           an automatic reason cleared less than hold_down_ms ago:
//                       a flapping condition does not flap BGP. Operator
//                       actions (drain/undrain) and the first announcement
//                       after warm-up take effect at once.
//
// Thread contract: one owner (the announcer thread); not thread safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "control/config/config.hpp"

namespace spillway {

enum class WithdrawReason : std::uint8_t {
  None,  // announced
  Stopping,
  Frozen,
  ControlStalled,
  DataplaneStalled,
  WarmingUp,
  Drained,
  Disabled,  // [announce] enabled = false by a reload (announce_disabled)
  NoActiveBackend,
  HoldDown,
};
[[nodiscard]] std::string_view toString(WithdrawReason reason) noexcept;

// The instance as a whole, for status: announced (every VIP), partial (some),
// withdrawn, warming, drained, disabled (a reload set [announce] enabled =
// false; an instance started without it has no policy and says "disabled" too).
enum class AnnounceState : std::uint8_t {
  Announced,
  Partial,
  Withdrawn,
  Warming,
  Drained,
  Disabled
};
[[nodiscard]] std::string_view toString(AnnounceState state) noexcept;

struct AnnounceSettings {
  Millis stallMs = 200;
  Millis controlStallMs = 1000;
  Millis holdDownMs = 1000;
};

struct AnnounceVipInput {
  std::string name;
  IpAddress address;
  std::uint32_t activeBackends = 0;  // backends with table entries
};

struct AnnounceInput {
  Millis now = 0;
  bool warm = false;                        // health and load known (ControlPlane::announceReady)
  bool drained = false;                     // lb drain
  bool stopping = false;                    // SIGTERM seen
  bool disabled = false;                    // [announce] enabled = false (a reload)
  bool frozen = false;                      // the freeze guard acted since the last round
  std::vector<std::uint64_t> workerRounds;  // one per worker, any values
  std::uint64_t controlRounds = 0;
  std::vector<AnnounceVipInput> vips;
};

struct VipAnnouncement {
  std::string name;
  IpAddress address;
  bool announced = false;
  WithdrawReason reason = WithdrawReason::WarmingUp;
  Millis since = 0;  // when `announced` last changed (or the VIP appeared)

  friend bool operator==(const VipAnnouncement&, const VipAnnouncement&) = default;
};

class AnnouncePolicy {
 public:
  explicit AnnouncePolicy(AnnounceSettings settings) : settings_(settings) {}

  // The decision for `in`; VIPs in the input's order. A VIP that left the
  // input is forgotten (its route goes with it).
  const std::vector<VipAnnouncement>& decide(const AnnounceInput& in);
  [[nodiscard]] const std::vector<VipAnnouncement>& current() const noexcept { return vips_; }
  [[nodiscard]] AnnounceState state() const noexcept;
  [[nodiscard]] const AnnounceSettings& settings() const noexcept { return settings_; }
  // A reload's new timings; they apply from the next decide().
  void setSettings(const AnnounceSettings& settings) noexcept { settings_ = settings; }

 private:
  // A counter that must keep moving: when it last changed.
  struct Beat {
    std::uint64_t value = 0;
    Millis changedAt = 0;
    bool seen = false;
  };
  static bool stalled(Beat& beat, std::uint64_t value, Millis now, Millis limit);

  AnnounceSettings settings_;
  std::vector<Beat> workers_;
  Beat control_;
  bool warm_ = false;
  WithdrawReason global_ = WithdrawReason::WarmingUp;  // what withdraws every VIP
  std::vector<VipAnnouncement> vips_;
  // Per VIP (same order as vips_): when an automatic reason last withdrew it.
  std::vector<std::optional<Millis>> lastAutomatic_;
};

}  // namespace spillway
