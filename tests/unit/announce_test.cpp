// The announcement decision (control/announce_policy.hpp): which VIPs are
// announced and why the others are withdrawn, on injected time and inputs.
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "control/announce/announce_policy.hpp"
#include "control/announce/announcer.hpp"
#include "control/announce/freeze_guard.hpp"
#include "fake_dataplane.hpp"

namespace spillway {
namespace {

IpAddress v4(const char* text) {
  return *parseIpAddress(text);
}

// A running instance: two VIPs with backends, one worker beating.
struct Scenario {
  AnnouncePolicy policy{AnnounceSettings{200, 1000, 1000}};
  AnnounceInput in;
  std::uint64_t rounds = 0;
  std::vector<bool> workerStuck{false, false};
  bool controlStuck = false;

  Scenario() {
    in.warm = true;
    in.vips = {{"web", v4("192.0.2.10"), 2}, {"api", v4("192.0.2.11"), 1}};
    in.workerRounds = {0, 0};
  }
  // Time passes with every worker and the control loop beating.
  const std::vector<VipAnnouncement>& at(Millis now, bool beat = true) {
    in.now = now;
    if (beat) {
      ++rounds;
      for (std::size_t i = 0; i < in.workerRounds.size(); ++i) {
        if (!workerStuck[i]) in.workerRounds[i] = rounds;
      }
      if (!controlStuck) in.controlRounds = rounds;
    }
    return policy.decide(in);
  }
  [[nodiscard]] std::vector<std::string> announced() const {
    std::vector<std::string> out;
    for (const auto& a : policy.current()) {
      if (a.announced) out.push_back(a.name);
    }
    return out;
  }
  [[nodiscard]] WithdrawReason reason(std::size_t i) const { return policy.current()[i].reason; }
};

using Names = std::vector<std::string>;

TEST(AnnouncePolicy, NothingBeforeWarmUpThenEverythingAtOnce) {
  Scenario s;
  s.in.warm = false;
  s.at(10);
  EXPECT_EQ(s.announced(), Names{});
  EXPECT_EQ(s.reason(0), WithdrawReason::WarmingUp);
  EXPECT_EQ(s.policy.state(), AnnounceState::Warming);
  s.in.warm = true;
  s.at(20);
  EXPECT_EQ(s.announced(), (Names{"web", "api"}));  // no hold-down for the first announcement
  EXPECT_EQ(s.policy.state(), AnnounceState::Announced);
  EXPECT_EQ(s.policy.current()[0].since, 20u);
  // Warm-up is latched: a later input that says otherwise does not withdraw.
  s.in.warm = false;
  s.at(30);
  EXPECT_EQ(s.announced(), (Names{"web", "api"}));
}

TEST(AnnouncePolicy, AVipWithoutActiveBackendIsWithdrawnAloneAndComesBackAfterHoldDown) {
  Scenario s;
  s.at(0);
  s.in.vips[1].activeBackends = 0;
  s.at(100);
  EXPECT_EQ(s.announced(), Names{"web"});
  EXPECT_EQ(s.reason(1), WithdrawReason::NoActiveBackend);
  EXPECT_EQ(s.policy.state(), AnnounceState::Partial);
  s.in.vips[1].activeBackends = 1;
  s.at(200);
  EXPECT_EQ(s.reason(1), WithdrawReason::HoldDown);
  s.at(1099);
  EXPECT_EQ(s.reason(1), WithdrawReason::HoldDown);
  s.at(1100);
  EXPECT_EQ(s.announced(), (Names{"web", "api"}));
  EXPECT_EQ(s.policy.current()[1].since, 1100u);
}

TEST(AnnouncePolicy, AFlappingConditionKeepsTheVipWithdrawn) {
  Scenario s;
  s.at(0);
  // No active backend every other 300 ms for 3 s: one withdrawal, no announce.
  int announcements = 0;
  bool was = true;
  for (Millis t = 100; t < 3000; t += 20) {
    s.in.vips[0].activeBackends = (t / 300) % 2 == 0 ? 0 : 2;
    s.at(t);
    const bool now = s.policy.current()[0].announced;
    if (now && !was) ++announcements;
    was = now;
  }
  EXPECT_EQ(announcements, 0);
  s.in.vips[0].activeBackends = 2;
  s.at(4000);
  s.at(5100);
  EXPECT_TRUE(s.policy.current()[0].announced);
}

TEST(AnnouncePolicy, AStalledWorkerWithdrawsEveryVip) {
  Scenario s;
  s.at(0);
  s.at(100);
  ASSERT_EQ(s.announced().size(), 2u);
  // Worker 1 stops at 100; worker 0 and control keep beating.
  s.workerStuck[1] = true;
  for (Millis t = 120; t < 300; t += 20) s.at(t);
  EXPECT_EQ(s.announced().size(), 2u);  // 180 ms without a round: not yet
  s.at(300);
  EXPECT_EQ(s.announced(), Names{});
  EXPECT_EQ(s.reason(0), WithdrawReason::DataplaneStalled);
  EXPECT_EQ(s.policy.state(), AnnounceState::Withdrawn);
  // A stall that has not lasted stall_ms does not withdraw.
  Scenario t;
  t.at(0);
  t.at(199, false);
  EXPECT_EQ(t.announced().size(), 2u);
  t.at(200, false);
  EXPECT_EQ(t.announced(), Names{});
}

TEST(AnnouncePolicy, AStalledControlLoopWithdrawsEvenWithWorkersBeating) {
  Scenario s;
  s.at(0);
  s.controlStuck = true;
  for (Millis t = 20; t < 1000; t += 20) s.at(t);
  EXPECT_EQ(s.announced().size(), 2u);
  s.at(1000);
  EXPECT_EQ(s.reason(0), WithdrawReason::ControlStalled);
  EXPECT_EQ(s.announced(), Names{});
}

TEST(AnnouncePolicy, DrainAndUndrainActAtOnce) {
  Scenario s;
  s.at(0);
  s.in.drained = true;
  s.at(20);
  EXPECT_EQ(s.announced(), Names{});
  EXPECT_EQ(s.reason(0), WithdrawReason::Drained);
  EXPECT_EQ(s.policy.state(), AnnounceState::Drained);
  s.in.drained = false;
  s.at(40);
  EXPECT_EQ(s.announced(), (Names{"web", "api"}));
  // Drained during warm-up: warming up is said first, drained after.
  Scenario w;
  w.in.warm = false;
  w.in.drained = true;
  w.at(0);
  EXPECT_EQ(w.reason(0), WithdrawReason::WarmingUp);
  w.in.warm = true;
  w.at(20);
  EXPECT_EQ(w.reason(0), WithdrawReason::Drained);
}

TEST(AnnouncePolicy, StoppingWinsOverEverything) {
  Scenario s;
  s.at(0);
  s.in.stopping = true;
  s.in.drained = true;
  s.at(20);
  EXPECT_EQ(s.announced(), Names{});
  EXPECT_EQ(s.reason(0), WithdrawReason::Stopping);
  EXPECT_EQ(s.reason(1), WithdrawReason::Stopping);
}

TEST(AnnouncePolicy, VipsFollowTheConfiguration) {
  Scenario s;
  s.at(0);
  s.in.vips.erase(s.in.vips.begin());
  s.in.vips.push_back({"new", v4("192.0.2.12"), 1});
  s.at(20);
  EXPECT_EQ(s.announced(), (Names{"api", "new"}));
  EXPECT_EQ(s.policy.current()[0].since, 0u);   // unchanged since the start
  EXPECT_EQ(s.policy.current()[1].since, 20u);  // appeared now
  // No VIP at all: withdrawn, never "announced".
  s.in.vips.clear();
  s.at(40);
  EXPECT_EQ(s.policy.state(), AnnounceState::Withdrawn);
}

TEST(AnnouncePolicy, AFreezeWithdrawsEveryVipThenHoldsDown) {
  Scenario s;
  s.at(10);
  EXPECT_EQ(s.announced(), (Names{"web", "api"}));
  // The process ran again after the freeze guard took the routes: this round
  // says why, whatever the beats say (they moved again).
  s.in.frozen = true;
  s.at(5000);
  s.in.frozen = false;
  EXPECT_EQ(s.announced(), Names{});
  EXPECT_EQ(s.reason(0), WithdrawReason::Frozen);
  EXPECT_EQ(toString(WithdrawReason::Frozen), "frozen");
  s.at(5500);  // beating, but within hold_down_ms of the freeze
  EXPECT_EQ(s.reason(1), WithdrawReason::HoldDown);
  s.at(6000);
  EXPECT_EQ(s.announced(), (Names{"web", "api"}));
}

// --- The freeze guard's decision ------------------------------------------------

TEST(FreezeWatch, TripsOnceWhenTheBeatStopsAndRearmsWhenItMoves) {
  FreezeWatch w(100);
  EXPECT_FALSE(w.observe(0, 1000));  // the announcer has not started
  EXPECT_FALSE(w.observe(0, 5000));  // a beat of 0 is never a freeze
  EXPECT_FALSE(w.observe(1, 5010));
  EXPECT_FALSE(w.observe(2, 5020));
  EXPECT_FALSE(w.observe(2, 5119));  // 99 ms without a beat
  EXPECT_TRUE(w.observe(2, 5120));   // 100 ms: act
  EXPECT_TRUE(w.tripped());
  EXPECT_FALSE(w.observe(2, 9000));  // once per freeze
  EXPECT_FALSE(w.observe(3, 9010));  // beating again: re-armed
  EXPECT_FALSE(w.tripped());
  EXPECT_FALSE(w.observe(3, 9109));
  EXPECT_TRUE(w.observe(3, 9110));
}

// A reload that sets [announce] enabled = false withdraws every VIP at once
// (an operator's act, no hold-down); enabled again, they come back at once.
// A reload's new hold-down applies from the next decision.
TEST(AnnouncePolicy, AReloadDisablesAtOnceAndItsTimingsApplyNext) {
  Scenario s;
  s.at(0);
  s.in.disabled = true;
  s.at(20);
  EXPECT_EQ(s.announced(), Names{});
  EXPECT_EQ(s.reason(0), WithdrawReason::Disabled);
  EXPECT_EQ(s.policy.state(), AnnounceState::Disabled);
  EXPECT_EQ(toString(s.reason(0)), "announce_disabled");
  EXPECT_EQ(toString(AnnounceState::Disabled), "disabled");
  s.in.disabled = false;
  s.at(40);
  EXPECT_EQ(s.announced(), (Names{"web", "api"}));

  s.policy.setSettings(AnnounceSettings{200, 1000, 5000});
  s.in.vips[1].activeBackends = 0;
  s.at(100);
  s.in.vips[1].activeBackends = 1;
  s.at(1100);
  EXPECT_EQ(s.reason(1), WithdrawReason::HoldDown) << "5,000 ms now, not 1,000";
  s.at(5100);
  EXPECT_EQ(s.announced(), (Names{"web", "api"}));
}

TEST(AnnouncePolicy, ReasonsHaveStableNames) {
  EXPECT_EQ(toString(WithdrawReason::NoActiveBackend), "no_active_backend");
  EXPECT_EQ(toString(WithdrawReason::DataplaneStalled), "dataplane_stalled");
  EXPECT_EQ(toString(AnnounceState::Drained), "drained");
}

// --- The announcer's round: decisions applied to the routes -------------------

// Records routes as the kernel would hold them; can refuse a change.
class FakeRoutes final : public VipRoutes {
 public:
  struct State {
    std::vector<std::string> routes;  // formatted addresses
    std::optional<std::string> failWithdraw;
    bool open = false;
    int restores = 0;
  };
  explicit FakeRoutes(State& state) : s_(state) {}
  std::optional<std::string> open(const std::string&) override {
    s_.open = true;
    return std::nullopt;
  }
  std::optional<std::string> announce(const IpAddress& vip) override {
    s_.routes.push_back(formatIpAddress(vip));
    return std::nullopt;
  }
  std::optional<std::string> withdraw(const IpAddress& vip) override {
    if (s_.failWithdraw) return s_.failWithdraw;
    std::erase(s_.routes, formatIpAddress(vip));
    return std::nullopt;
  }
  void close() noexcept override {
    s_.open = false;
    s_.routes.clear();
  }
  std::optional<std::string> restore() override {
    ++s_.restores;
    return std::nullopt;
  }

 private:
  State& s_;
};

struct AnnouncerRig {
  FakeRoutes::State routes;
  test::FakeDataplane dataplane;
  AnnounceExchange exchange;
  Millis now = 0;
  bool workerStuck = false;
  std::unique_ptr<Announcer> announcer;

  explicit AnnouncerRig(FreezeGuard* guard = nullptr) {
    dataplane.rounds = {1};
    AnnounceConfig c;
    c.enabled = true;
    c.holdDownMs = 500;
    announcer =
        std::make_unique<Announcer>(Announcer::Options{c, [this] { return now; }, {}, guard},
                                    exchange, dataplane, std::make_unique<FakeRoutes>(routes));
    EXPECT_FALSE(announcer->openDevice());
  }
  // The control thread's round, then the announcer's.
  void at(Millis t, bool drained = false, std::uint32_t active = 2) {
    now = t;
    if (!workerStuck) ++dataplane.rounds[0];
    exchange.beat();
    AnnounceControlInputs in;
    in.warm = true;
    in.drained = drained;
    in.vips = {{"web", v4("192.0.2.10"), active}, {"api", v4("192.0.2.11"), 1}};
    exchange.setInputs(in);
    announcer->round(now);
  }
};

TEST(Announcer, RoutesFollowTheDecisionsAndTransitionsAreTold) {
  AnnouncerRig r;
  r.at(20);
  EXPECT_EQ(r.routes.routes, (Names{"192.0.2.10", "192.0.2.11"}));
  EXPECT_EQ(r.exchange.takeTransitions().size(), 2u);
  r.at(40, true);
  EXPECT_EQ(r.routes.routes, Names{});
  const auto t = r.exchange.takeTransitions();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].reason, WithdrawReason::Drained);
  EXPECT_EQ(r.exchange.outcome().state, AnnounceState::Drained);
  EXPECT_EQ(r.exchange.outcome().stateSince, 40u);
  r.at(60);
  EXPECT_EQ(r.routes.routes, (Names{"192.0.2.10", "192.0.2.11"}));
  // Nothing changed: no transition, no route call.
  (void)r.exchange.takeTransitions();
  r.at(80);
  EXPECT_TRUE(r.exchange.takeTransitions().empty());
  EXPECT_EQ(r.routes.routes.size(), 2u);
}

TEST(Announcer, AFailedWithdrawalIsRetriedAndReported) {
  AnnouncerRig r;
  r.at(20);
  r.routes.failWithdraw = "Operation not permitted";
  r.at(40, false, 0);  // web has no active backend
  EXPECT_EQ(r.routes.routes.size(), 2u);
  EXPECT_NE(r.exchange.outcome().error.find("not permitted"), std::string::npos);
  r.routes.failWithdraw.reset();
  r.at(60, false, 0);
  EXPECT_EQ(r.routes.routes, Names{"192.0.2.11"});
  EXPECT_EQ(r.exchange.outcome().error, "");
}

TEST(Announcer, AStoppedWorkerOrStoppingWithdrawsEverything) {
  AnnouncerRig r;
  r.at(20);
  // The worker's counter stops moving at 20; the control loop keeps beating.
  r.workerStuck = true;
  for (Millis t = 40; t < 220; t += 20) r.at(t);
  EXPECT_EQ(r.routes.routes.size(), 2u);
  r.at(220);
  EXPECT_EQ(r.routes.routes, Names{});
  EXPECT_EQ(r.exchange.outcome().vips[0].reason, WithdrawReason::DataplaneStalled);
  AnnouncerRig s;
  s.at(20);
  s.exchange.setStopping();
  s.at(40);  // the control thread's inputs do not undo stopping
  EXPECT_EQ(s.routes.routes, Names{});
  EXPECT_EQ(s.exchange.outcome().vips[1].reason, WithdrawReason::Stopping);
  s.announcer->stop();
  EXPECT_FALSE(s.routes.open);
}

// The guard is a process of its own: it acts while this one does not beat,
// once, and counts it in the shared page.
struct GuardPipe {
  int fds[2] = {-1, -1};
  GuardPipe() { EXPECT_EQ(::pipe(fds), 0); }
  ~GuardPipe() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  // What the guard wrote, waiting up to 10 s for it.
  std::string read() const {
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, 10'000) != 1) return "";
    char buf[64];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "";
  }
};

std::unique_ptr<FreezeGuard> startGuard(const GuardPipe& pipe) {
  FreezeGuard::Options o;
  o.device = "spw-test0";
  o.freezeMs = 60;
  o.periodMs = 10;
  const int out = pipe.fds[1];
  o.act = [out](const std::string& device) -> std::optional<std::string> {
    if (::write(out, device.data(), device.size()) < 0) return "write failed";
    return std::nullopt;
  };
  std::string error;
  auto guard = FreezeGuard::start(std::move(o), error);
  EXPECT_TRUE(guard) << error;
  return guard;
}

TEST(FreezeGuard, ActsInItsOwnProcessWhenTheBeatStopsAndCountsIt) {
  GuardPipe pipe;
  auto guard = startGuard(pipe);
  ASSERT_TRUE(guard);
  EXPECT_GT(guard->pid(), 0);
  EXPECT_NE(guard->pid(), ::getpid());
  guard->beat();
  EXPECT_EQ(pipe.read(), "spw-test0");  // this process stopped beating
  // The count is published after the act; poll for it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (guard->trips() == 0 && std::chrono::steady_clock::now() < deadline) ::usleep(1000);
  EXPECT_EQ(guard->trips(), 1u);
  guard->beat();  // running again: the next freeze is a new one
  EXPECT_EQ(pipe.read(), "spw-test0");
  while (guard->trips() < 2 && std::chrono::steady_clock::now() < deadline) ::usleep(1000);
  EXPECT_EQ(guard->trips(), 2u);
  guard->stop();
  EXPECT_EQ(guard->pid(), 0);
}

TEST(Announcer, AfterAFreezeTheDeviceComesBackEmptyAndTheVipsAfterHoldDown) {
  GuardPipe pipe;
  auto guard = startGuard(pipe);
  ASSERT_TRUE(guard);
  AnnouncerRig r(guard.get());
  r.at(20);
  EXPECT_EQ(r.routes.routes, (Names{"192.0.2.10", "192.0.2.11"}));
  (void)r.exchange.takeTransitions();
  // No round: the guard acts; the kernel drops the down device's routes.
  EXPECT_EQ(pipe.read(), "spw-test0");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (guard->trips() == 0 && std::chrono::steady_clock::now() < deadline) ::usleep(1000);
  ASSERT_EQ(guard->trips(), 1u);
  guard->stop();  // no second freeze while this slow test machine runs the rest
  r.routes.routes.clear();
  r.at(3000);
  EXPECT_EQ(r.routes.restores, 1);
  EXPECT_EQ(r.routes.routes, Names{});
  EXPECT_EQ(r.exchange.outcome().freezes, 1u);
  const auto t = r.exchange.takeTransitions();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].reason, WithdrawReason::Frozen);
  r.at(3200);  // hold-down
  EXPECT_EQ(r.routes.routes, Names{});
  r.at(3600);  // both routes added again: the announcer forgot the ones the kernel dropped
  EXPECT_EQ(r.routes.routes, (Names{"192.0.2.10", "192.0.2.11"}));
  EXPECT_EQ(r.routes.restores, 1);
}

}  // namespace
}  // namespace spillway
