// The announcement decision (control/announce_policy.hpp): which VIPs are
// announced and why the others are withdrawn, on injected time and inputs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "control/announce/announce_policy.hpp"
#include "control/announce/announcer.hpp"
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

  AnnouncerRig() {
    dataplane.rounds = {1};
    AnnounceConfig c;
    c.enabled = true;
    c.holdDownMs = 500;
    announcer =
        std::make_unique<Announcer>(Announcer::Options{c, [this] { return now; }, {}}, exchange,
                                    dataplane, std::make_unique<FakeRoutes>(routes));
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

}  // namespace
}  // namespace spillway
