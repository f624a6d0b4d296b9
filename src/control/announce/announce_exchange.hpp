// What the control thread and the announcer thread (announcer.hpp) tell each
// other about the BGP announcement. The control thread writes the inputs it
// owns (warm-up, the operator's lb drain, the VIPs and how many backends each
// has in its table) every loop round, and beats a heartbeat counter; the
// announcer reads them every period, decides (announce_policy.hpp), applies
// the decision to the kernel and publishes it back with the transitions since
// the last read, which the control thread turns into events, status and
// metrics (announceStatusJson, appendAnnounceMetrics).
//
// Thread contract: two threads. The heartbeat is one relaxed store by its
// single writer (the control thread); everything else is under one mutex,
// held for a copy of a few small vectors, never by the fast path.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "control/announce/announce_policy.hpp"
#include "control/api/control_api.hpp"
#include "control/config/config.hpp"

namespace spillway {

class MetricsWriter;

struct AnnounceControlInputs {
  bool warm = false;
  bool drained = false;
  bool stopping = false;
  // The running [announce] (a reload changes them): enabled = false
  // withdraws every VIP; the timings apply from the announcer's next round.
  bool disabled = false;
  std::optional<AnnounceSettings> settings;
  std::vector<AnnounceVipInput> vips;
};

// One VIP announced or withdrawn, for the event log.
struct AnnounceTransition {
  Millis at = 0;
  std::string vip;
  bool announced = false;
  WithdrawReason reason = WithdrawReason::None;
};

struct AnnounceOutcome {
  std::vector<VipAnnouncement> vips;
  AnnounceState state = AnnounceState::Warming;
  Millis stateSince = 0;
  std::string device;
  std::string error;  // the last kernel error (device or route), "" when none
  std::uint64_t decisions = 0;
  std::uint64_t freezes = 0;  // times the freeze guard set the device down
};

class AnnounceExchange {
 public:
  // Control thread.
  void setInputs(AnnounceControlInputs inputs);
  void setStopping();
  void beat() noexcept {
    beats_.store(beats_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  [[nodiscard]] AnnounceOutcome outcome() const;
  [[nodiscard]] std::vector<AnnounceTransition> takeTransitions();

  // Announcer thread.
  [[nodiscard]] AnnounceControlInputs inputs() const;
  [[nodiscard]] std::uint64_t controlBeats() const noexcept {
    return beats_.load(std::memory_order_relaxed);
  }
  void publish(AnnounceOutcome outcome, std::vector<AnnounceTransition> transitions);

 private:
  static constexpr std::size_t kMaxPendingTransitions = 1024;
  mutable std::mutex mutex_;
  AnnounceControlInputs inputs_;
  AnnounceOutcome outcome_;
  std::vector<AnnounceTransition> transitions_;
  std::atomic<std::uint64_t> beats_{0};
};

// status's "announce" object: state (announced/partial/withdrawn/warming/
// drained, or disabled when `outcome` is null), since, device, drained, and
// per VIP announced + reason + since. Times are control-clock ms; `now` gives
// their ages.
[[nodiscard]] Json announceStatusJson(const AnnounceConfig& config, const AnnounceOutcome* outcome,
                                      bool drained, Millis now);
// spillway_vip_announced{vip}, spillway_lb_drained, spillway_announce_enabled.
void appendAnnounceMetrics(MetricsWriter& m, const AnnounceOutcome* outcome, bool drained);
// config dump's "announce" object.
[[nodiscard]] Json announceConfigJson(const AnnounceConfig& config);

}  // namespace spillway
