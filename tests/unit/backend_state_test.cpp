// Backend states and the event log: every transition, the odd orders (drain a
// failed backend, fail a draining one, remove while draining, disable while
// down, re-add, undrain a removal), drain completion by flow count and by
// deadline, errors for unknown ids, and the ring's sequence numbers and gaps.
// Time is injected; nothing sleeps.
#include "control/backends/backend_state.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "control/api/event_log.hpp"

namespace spillway {
namespace {

constexpr Millis kDrain = 10'000;
constexpr std::uint64_t kA = 1;
constexpr std::uint64_t kB = 2;

// ---------------------------------------------------------------- EventLog

TEST(EventLog, SequenceStartsAtOneAndPagesFollowIt) {
  EventLog log(8);
  EXPECT_EQ(log.lastSeq(), 0u);
  EXPECT_TRUE(log.since(0, 10).events.empty());
  EXPECT_EQ(log.since(0, 10).next, 0u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(log.append(100 + i, "b", kEventHealth, "c" + std::to_string(i)),
              static_cast<std::uint64_t>(i + 1));
  }
  EventPage p = log.since(0, 2);
  ASSERT_EQ(p.events.size(), 2u);
  EXPECT_EQ(p.events[0].seq, 1u);
  EXPECT_EQ(p.events[0].time, 100u);
  EXPECT_EQ(p.events[0].cause, "c0");
  EXPECT_EQ(p.events[1].seq, 2u);
  EXPECT_EQ(p.next, 2u);
  EXPECT_EQ(p.missed, 0u);
  p = log.since(p.next, 0);  // 0 = no limit
  ASSERT_EQ(p.events.size(), 3u);
  EXPECT_EQ(p.events.back().seq, 5u);
  EXPECT_EQ(p.next, 5u);
  p = log.since(p.next, 10);
  EXPECT_TRUE(p.events.empty());
  EXPECT_EQ(p.next, 5u);
}

TEST(EventLog, OverwrittenEventsAreCountedAsMissedAndDropped) {
  EventLog log(4);
  for (int i = 1; i <= 10; ++i) log.append(i, "", kEventConfig, std::to_string(i));
  EXPECT_EQ(log.size(), 4u);
  EXPECT_EQ(log.dropped(), 6u);
  // A reader that had seen 3: 4, 5 and 6 are gone.
  EventPage p = log.since(3, 100);
  EXPECT_EQ(p.missed, 3u);
  ASSERT_EQ(p.events.size(), 4u);
  EXPECT_EQ(p.events.front().seq, 7u);
  EXPECT_EQ(p.events.front().cause, "7");
  EXPECT_EQ(p.events.back().seq, 10u);
  // A reader that is current misses nothing.
  EXPECT_EQ(log.since(8, 100).missed, 0u);
  EXPECT_EQ(log.since(8, 100).events.size(), 2u);
  EXPECT_EQ(log.since(6, 100).missed, 0u);
}

TEST(EventLog, AReaderAheadOfTheLogFollowsFromNow) {
  EventLog log(4);
  log.append(1, "", kEventConfig, "x");
  EventPage p = log.since(1000, 10);
  EXPECT_TRUE(p.events.empty());
  EXPECT_EQ(p.next, 1u);
  log.append(2, "", kEventConfig, "y");
  p = log.since(p.next, 10);
  ASSERT_EQ(p.events.size(), 1u);
  EXPECT_EQ(p.events[0].cause, "y");
}

TEST(EventLog, ZeroCapacityKeepsOne) {
  EventLog log(0);
  EXPECT_EQ(log.capacity(), 1u);
  log.append(1, "", kEventConfig, "a");
  log.append(2, "", kEventConfig, "b");
  EventPage p = log.since(0, 10);
  EXPECT_EQ(p.missed, 1u);
  ASSERT_EQ(p.events.size(), 1u);
  EXPECT_EQ(p.events[0].cause, "b");
}

// ---------------------------------------------------------- BackendStates

class States : public ::testing::Test {
 protected:
  EventLog log_{1024};
  BackendStates states_{log_, kDrain};
  std::uint64_t seen_ = 0;

  void SetUp() override {
    ASSERT_TRUE(states_.add(kA, "a", 0, "config"));
    ASSERT_TRUE(states_.add(kB, "b", 0, "config"));
    seen_ = log_.lastSeq();
  }

  BackendState stateOf(std::uint64_t id) {
    return states_.state(id).value_or(BackendState::Removed);
  }

  // Events since the last call.
  std::vector<Event> fresh() {
    EventPage p = log_.since(seen_, 0);
    seen_ = p.next;
    return p.events;
  }
  std::vector<Event> freshStateEvents() {
    std::vector<Event> out;
    for (Event& e : fresh()) {
      if (e.kind == kEventState) out.push_back(std::move(e));
    }
    return out;
  }
};

TEST_F(States, ANewBackendIsActiveAndHealthy) {
  const BackendStatus* s = states_.find(kA);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->name, "a");
  EXPECT_EQ(s->admin, AdminState::Enabled);
  EXPECT_EQ(s->health, HealthVerdict::Up);
  EXPECT_EQ(s->effective, BackendState::Active);
  EXPECT_FALSE(states_.drainProgress(kA));
  EXPECT_EQ(states_.ids(), (std::vector<std::uint64_t>{kA, kB}));
  // add: one admin event and one state event (no `from` for a new backend).
  EventPage p = log_.since(0, 0);
  ASSERT_EQ(p.events.size(), 4u);
  EXPECT_EQ(p.events[0].kind, kEventAdmin);
  EXPECT_EQ(p.events[0].cause, "add: config");
  EXPECT_EQ(p.events[1].kind, kEventState);
  EXPECT_FALSE(p.events[1].from);
  EXPECT_EQ(p.events[1].to, BackendState::Active);
}

TEST_F(States, InitiallyDisabled) {
  ASSERT_TRUE(states_.add(3, "c", 0, "config", AdminState::Disabled));
  EXPECT_EQ(stateOf(3), BackendState::Disabled);
  ASSERT_TRUE(states_.enable(3, 1, "op"));
  EXPECT_EQ(stateOf(3), BackendState::Active);
}

TEST_F(States, DrainCompletesWhenLiveFlowsReachZeroAndStaysDraining) {
  ASSERT_TRUE(states_.setLiveFlows(kA, 40, 5));
  const std::uint64_t gen = states_.generation();
  ASSERT_TRUE(states_.drain(kA, 100, "uid 1000"));
  EXPECT_EQ(stateOf(kA), BackendState::Draining);
  EXPECT_GT(states_.generation(), gen);
  auto d = states_.drainProgress(kA);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->started, 100u);
  EXPECT_EQ(d->deadline, 100u + kDrain);
  EXPECT_EQ(d->flowsAtStart, 40u);
  EXPECT_EQ(d->flowsNow, 40u);
  EXPECT_FALSE(d->removing);
  EXPECT_FALSE(d->complete);

  std::vector<Event> ev = fresh();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].kind, kEventAdmin);
  EXPECT_EQ(ev[0].backend, "a");
  EXPECT_EQ(ev[0].cause, "drain: uid 1000");
  EXPECT_EQ(ev[1].kind, kEventState);
  EXPECT_EQ(ev[1].from, BackendState::Active);
  EXPECT_EQ(ev[1].to, BackendState::Draining);
  EXPECT_EQ(ev[1].time, 100u);

  ASSERT_TRUE(states_.setLiveFlows(kA, 7, 200));
  EXPECT_EQ(states_.drainProgress(kA)->flowsNow, 7u);
  EXPECT_TRUE(fresh().empty());
  ASSERT_TRUE(states_.setLiveFlows(kA, 0, 300));
  EXPECT_TRUE(states_.drainProgress(kA)->complete);
  EXPECT_EQ(stateOf(kA), BackendState::Draining);
  ev = fresh();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].cause, "drained: no live flows left");
  // A completed drain does not expire.
  states_.tick(100 + kDrain);
  EXPECT_EQ(stateOf(kA), BackendState::Draining);
  EXPECT_TRUE(fresh().empty());
  // Draining again is a no-op that is still logged.
  ASSERT_TRUE(states_.drain(kA, 400, "again"));
  EXPECT_EQ(states_.drainProgress(kA)->started, 100u);
  ev = fresh();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].cause, "drain (already draining): again");
}

TEST_F(States, ADrainPastItsDeadlineFailsSoItsFlowsAreResteered) {
  ASSERT_TRUE(states_.setLiveFlows(kA, 3, 0));
  ASSERT_TRUE(states_.drain(kA, 1000, "op"));
  states_.tick(1000 + kDrain - 1);
  EXPECT_EQ(stateOf(kA), BackendState::Draining);
  fresh();
  states_.tick(1000 + kDrain);  // exactly at the deadline
  EXPECT_EQ(stateOf(kA), BackendState::Failed);
  EXPECT_TRUE(states_.drainProgress(kA)->expired);
  std::vector<Event> ev = freshStateEvents();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].from, BackendState::Draining);
  EXPECT_EQ(ev[0].to, BackendState::Failed);
  EXPECT_EQ(ev[0].cause, "drain deadline passed with 3 live flows: they are re-steered");
  // Flows reaching 0 afterwards change nothing; undrain brings it back.
  ASSERT_TRUE(states_.setLiveFlows(kA, 0, 20'000));
  EXPECT_EQ(stateOf(kA), BackendState::Failed);
  ASSERT_TRUE(states_.undrain(kA, 20'001, "op"));
  EXPECT_EQ(stateOf(kA), BackendState::Active);
  EXPECT_FALSE(states_.drainProgress(kA));
}

TEST_F(States, RemoveDrainsThenRemovesAtZeroFlows) {
  ASSERT_TRUE(states_.setLiveFlows(kA, 2, 0));
  ASSERT_TRUE(states_.remove(kA, 10, "op"));
  EXPECT_EQ(stateOf(kA), BackendState::Draining);
  EXPECT_EQ(states_.find(kA)->admin, AdminState::Removing);
  EXPECT_TRUE(states_.drainProgress(kA)->removing);
  ASSERT_TRUE(states_.setLiveFlows(kA, 1, 20));
  EXPECT_EQ(stateOf(kA), BackendState::Draining);
  ASSERT_TRUE(states_.setLiveFlows(kA, 0, 30));
  EXPECT_EQ(stateOf(kA), BackendState::Removed);
  std::vector<Event> ev = freshStateEvents();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[1].from, BackendState::Draining);
  EXPECT_EQ(ev[1].to, BackendState::Removed);
  EXPECT_EQ(ev[1].cause, "removed: drained, no live flows left");
  EXPECT_EQ(ev[1].time, 30u);
  // The progress stays readable after the removal.
  EXPECT_TRUE(states_.drainProgress(kA)->complete);
}

TEST_F(States, RemoveWithNoLiveFlowsIsImmediate) {
  ASSERT_TRUE(states_.setLiveFlows(kA, 0, 0));
  ASSERT_TRUE(states_.remove(kA, 10, "op"));
  EXPECT_EQ(stateOf(kA), BackendState::Removed);
}

TEST_F(States, RemoveWithUnknownFlowsWaitsForACountOrTheDeadline) {
  ASSERT_TRUE(states_.remove(kA, 10, "op"));
  EXPECT_EQ(stateOf(kA), BackendState::Draining);
  EXPECT_FALSE(states_.drainProgress(kA)->flowsAtStart);
  states_.tick(10 + kDrain);
  EXPECT_EQ(stateOf(kA), BackendState::Removed);
  std::vector<Event> ev = freshStateEvents();
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().cause,
            "removed: drain deadline passed with an unknown number of live flows: they are "
            "re-steered");
}

TEST_F(States, RemoveImmediate) {
  ASSERT_TRUE(states_.setLiveFlows(kA, 100, 0));
  ASSERT_TRUE(states_.remove(kA, 5, "op", true));
  EXPECT_EQ(stateOf(kA), BackendState::Removed);
  std::vector<Event> ev = fresh();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].cause, "remove (immediate): op");
  EXPECT_EQ(ev[1].from, BackendState::Active);
  EXPECT_EQ(ev[1].to, BackendState::Removed);
}

TEST_F(States, DrainAFailedBackendThenItRecoversDraining) {
  ASSERT_TRUE(states_.setHealth(kA, false, 10, "3 failed connects"));
  EXPECT_EQ(stateOf(kA), BackendState::Failed);
  std::vector<Event> ev = fresh();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].kind, kEventHealth);
  EXPECT_EQ(ev[0].cause, "health down: 3 failed connects");
  EXPECT_EQ(ev[1].to, BackendState::Failed);

  ASSERT_TRUE(states_.drain(kA, 20, "op"));
  EXPECT_EQ(stateOf(kA), BackendState::Failed);  // health wins
  EXPECT_EQ(states_.drainProgress(kA)->started, 20u);
  EXPECT_TRUE(freshStateEvents().empty());
  ASSERT_TRUE(states_.setHealth(kA, true, 30, "2 good checks"));
  EXPECT_EQ(stateOf(kA), BackendState::Draining);
  ev = freshStateEvents();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].from, BackendState::Failed);
  EXPECT_EQ(ev[0].to, BackendState::Draining);
}

TEST_F(States, FailADrainingBackendThenItRecoversDrainingNotActive) {
  ASSERT_TRUE(states_.drain(kA, 10, "op"));
  ASSERT_TRUE(states_.setHealth(kA, false, 20, "timeout"));
  EXPECT_EQ(stateOf(kA), BackendState::Failed);
  ASSERT_TRUE(states_.setHealth(kA, true, 30, "ok"));
  EXPECT_EQ(stateOf(kA), BackendState::Draining);
  EXPECT_EQ(states_.drainProgress(kA)->started, 10u);  // the clock kept running
  // Repeating a verdict logs nothing.
  fresh();
  ASSERT_TRUE(states_.setHealth(kA, true, 40, "ok"));
  EXPECT_TRUE(fresh().empty());
}

TEST_F(States, RemoveWhileDrainingKeepsTheDrainClock) {
  ASSERT_TRUE(states_.setLiveFlows(kA, 9, 0));
  ASSERT_TRUE(states_.drain(kA, 100, "op"));
  ASSERT_TRUE(states_.remove(kA, 5000, "op"));
  auto d = states_.drainProgress(kA);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->started, 100u);
  EXPECT_EQ(d->deadline, 100u + kDrain);
  EXPECT_TRUE(d->removing);
  states_.tick(100 + kDrain);
  EXPECT_EQ(stateOf(kA), BackendState::Removed);
}

TEST_F(States, RemoveAfterACompletedDrainIsImmediate) {
  ASSERT_TRUE(states_.drain(kA, 100, "op"));
  ASSERT_TRUE(states_.setLiveFlows(kA, 0, 200));
  ASSERT_TRUE(states_.remove(kA, 300, "op"));
  EXPECT_EQ(stateOf(kA), BackendState::Removed);
}

TEST_F(States, RemoveAfterAnExpiredDrainIsImmediate) {
  ASSERT_TRUE(states_.setLiveFlows(kA, 5, 0));
  ASSERT_TRUE(states_.drain(kA, 100, "op"));
  states_.tick(100 + kDrain);
  ASSERT_EQ(stateOf(kA), BackendState::Failed);
  ASSERT_TRUE(states_.remove(kA, 100 + kDrain + 1, "op"));
  EXPECT_EQ(stateOf(kA), BackendState::Removed);
}

TEST_F(States, RemoveAFailedBackendCompletesAtOnce) {
  ASSERT_TRUE(states_.setLiveFlows(kA, 50, 0));
  ASSERT_TRUE(states_.setHealth(kA, false, 10, "down"));
  ASSERT_TRUE(states_.remove(kA, 20, "op"));
  EXPECT_EQ(stateOf(kA), BackendState::Removed);
  std::vector<Event> ev = freshStateEvents();
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().cause, "removed: failed, its flows are re-steered already");
}

TEST_F(States, ABackendBeingRemovedThatFailsIsRemoved) {
  ASSERT_TRUE(states_.setLiveFlows(kA, 50, 0));
  ASSERT_TRUE(states_.remove(kA, 10, "op"));
  ASSERT_EQ(stateOf(kA), BackendState::Draining);
  ASSERT_TRUE(states_.setHealth(kA, false, 20, "down"));
  EXPECT_EQ(stateOf(kA), BackendState::Removed);
}

TEST_F(States, DisableWhileDownRecoversDisabled) {
  ASSERT_TRUE(states_.setHealth(kA, false, 10, "down"));
  ASSERT_TRUE(states_.disable(kA, 20, "maintenance"));
  EXPECT_EQ(stateOf(kA), BackendState::Failed);
  ASSERT_TRUE(states_.setHealth(kA, true, 30, "up"));
  EXPECT_EQ(stateOf(kA), BackendState::Disabled);
  ASSERT_TRUE(states_.enable(kA, 40, "done"));
  EXPECT_EQ(stateOf(kA), BackendState::Active);
}

TEST_F(States, DisableEndsADrainAndHasNoDeadline) {
  ASSERT_TRUE(states_.setLiveFlows(kA, 5, 0));
  ASSERT_TRUE(states_.drain(kA, 10, "op"));
  ASSERT_TRUE(states_.disable(kA, 20, "op"));
  EXPECT_EQ(stateOf(kA), BackendState::Disabled);
  EXPECT_FALSE(states_.drainProgress(kA));
  states_.tick(1'000'000);
  EXPECT_EQ(stateOf(kA), BackendState::Disabled);
  // Drain from Disabled starts a fresh drain with a deadline.
  ASSERT_TRUE(states_.drain(kA, 2'000'000, "op"));
  EXPECT_EQ(stateOf(kA), BackendState::Draining);
  EXPECT_EQ(states_.drainProgress(kA)->deadline, 2'000'000u + kDrain);
}

TEST_F(States, ReAddARemovedBackendStartsFresh) {
  ASSERT_TRUE(states_.setHealth(kA, false, 5, "down"));
  ASSERT_TRUE(states_.remove(kA, 10, "op", true));
  ASSERT_EQ(stateOf(kA), BackendState::Removed);
  fresh();
  ASSERT_TRUE(states_.add(kA, "a2", 20, "op"));
  EXPECT_EQ(stateOf(kA), BackendState::Active);
  const BackendStatus* s = states_.find(kA);
  EXPECT_EQ(s->name, "a2");
  EXPECT_EQ(s->health, HealthVerdict::Up);
  EXPECT_EQ(s->admin, AdminState::Enabled);
  EXPECT_FALSE(states_.drainProgress(kA));
  std::vector<Event> ev = fresh();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].cause, "add (again): op");
  EXPECT_EQ(ev[1].from, BackendState::Removed);
  EXPECT_EQ(ev[1].to, BackendState::Active);
  // Adding an id that exists is a conflict and changes nothing.
  StateResult r = states_.add(kA, "other", 30, "op");
  EXPECT_FALSE(r);
  EXPECT_EQ(r.codeName(), "conflict");
  EXPECT_EQ(r.message(), "backend id 1 (\"a2\") exists and is active");
  EXPECT_EQ(states_.find(kA)->name, "a2");
  EXPECT_TRUE(fresh().empty());
}

TEST_F(States, UndrainARemovalCancelsIt) {
  ASSERT_TRUE(states_.setLiveFlows(kA, 5, 0));
  ASSERT_TRUE(states_.remove(kA, 10, "op"));
  fresh();
  ASSERT_TRUE(states_.undrain(kA, 20, "changed my mind"));
  EXPECT_EQ(stateOf(kA), BackendState::Active);
  EXPECT_EQ(states_.find(kA)->admin, AdminState::Enabled);
  std::vector<Event> ev = fresh();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].cause, "undrain (cancels the removal): changed my mind");
  // Neither flows reaching 0 nor the old deadline remove it now.
  ASSERT_TRUE(states_.setLiveFlows(kA, 0, 30));
  states_.tick(10 + kDrain);
  EXPECT_EQ(stateOf(kA), BackendState::Active);
}

TEST_F(States, RejectedOperationsSayWhyAndChangeNothing) {
  ASSERT_TRUE(states_.disable(kB, 1, "op"));
  StateResult r = states_.undrain(kB, 2, "op");
  EXPECT_EQ(r.code(), StateResult::Code::Conflict);
  EXPECT_EQ(r.message(), "\"b\" is disabled, not draining; use enable");
  EXPECT_EQ(stateOf(kB), BackendState::Disabled);

  ASSERT_TRUE(states_.setLiveFlows(kA, 5, 0));
  ASSERT_TRUE(states_.remove(kA, 3, "op"));
  r = states_.drain(kA, 4, "op");
  EXPECT_EQ(r.codeName(), "conflict");
  EXPECT_NE(r.message().find("undrain cancels the removal"), std::string::npos) << r.message();
  EXPECT_TRUE(states_.drainProgress(kA)->removing);

  ASSERT_TRUE(states_.remove(kA, 5, "op", true));
  fresh();
  for (StateResult x :
       {states_.drain(kA, 6, ""), states_.undrain(kA, 6, ""), states_.disable(kA, 6, ""),
        states_.enable(kA, 6, ""), states_.remove(kA, 6, "")}) {
    EXPECT_EQ(x.codeName(), "conflict");
    EXPECT_NE(x.message().find("\"a\" is removed"), std::string::npos) << x.message();
  }
  EXPECT_EQ(stateOf(kA), BackendState::Removed);
  // Health and flow reports for a removed backend are accepted, without effect.
  EXPECT_TRUE(states_.setHealth(kA, false, 7, "down"));
  EXPECT_TRUE(states_.setLiveFlows(kA, 3, 7));
  EXPECT_EQ(stateOf(kA), BackendState::Removed);
  EXPECT_TRUE(fresh().empty());
}

TEST_F(States, UnknownIdsAreNotFound) {
  constexpr std::uint64_t kNone = 99;
  const std::uint64_t before = log_.lastSeq();
  for (StateResult r :
       {states_.drain(kNone, 1, ""), states_.undrain(kNone, 1, ""), states_.disable(kNone, 1, ""),
        states_.enable(kNone, 1, ""), states_.remove(kNone, 1, ""),
        states_.remove(kNone, 1, "", true), states_.setHealth(kNone, false, 1, ""),
        states_.setLiveFlows(kNone, 0, 1), states_.erase(kNone)}) {
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.codeName(), "not_found");
    EXPECT_EQ(r.message(), "no backend with id 99");
  }
  EXPECT_FALSE(states_.state(kNone));
  EXPECT_EQ(states_.find(kNone), nullptr);
  EXPECT_FALSE(states_.drainProgress(kNone));
  EXPECT_EQ(log_.lastSeq(), before);
}

TEST_F(States, EraseOnlyARemovedBackend) {
  EXPECT_EQ(states_.erase(kA).codeName(), "conflict");
  ASSERT_TRUE(states_.remove(kA, 1, "op", true));
  EXPECT_TRUE(states_.erase(kA));
  EXPECT_FALSE(states_.state(kA));
  EXPECT_EQ(states_.ids(), std::vector<std::uint64_t>{kB});
}

TEST_F(States, EveryEffectiveChangeIsOneStateEventAndOneGeneration) {
  const std::uint64_t gen = states_.generation();
  ASSERT_TRUE(states_.setLiveFlows(kA, 1, 0));
  ASSERT_TRUE(states_.drain(kA, 1, "op"));            // Active -> Draining
  ASSERT_TRUE(states_.setHealth(kA, false, 2, "x"));  // -> Failed
  ASSERT_TRUE(states_.disable(kA, 3, "op"));          // stays Failed
  ASSERT_TRUE(states_.setHealth(kA, true, 4, "x"));   // -> Disabled
  ASSERT_TRUE(states_.enable(kA, 5, "op"));           // -> Active
  ASSERT_TRUE(states_.enable(kA, 6, "op"));           // no-op
  ASSERT_TRUE(states_.remove(kA, 7, "op"));           // -> Draining
  ASSERT_TRUE(states_.setLiveFlows(kA, 0, 8));        // -> Removed
  std::vector<Event> ev = freshStateEvents();
  std::vector<std::pair<BackendState, BackendState>> got;
  for (const Event& e : ev) got.emplace_back(*e.from, *e.to);
  using S = BackendState;
  EXPECT_EQ(got, (std::vector<std::pair<S, S>>{{S::Active, S::Draining},
                                               {S::Draining, S::Failed},
                                               {S::Failed, S::Disabled},
                                               {S::Disabled, S::Active},
                                               {S::Active, S::Draining},
                                               {S::Draining, S::Removed}}));
  EXPECT_EQ(states_.generation(), gen + 6);
  for (const Event& e : ev) EXPECT_FALSE(e.cause.empty());
  const BackendStatus* s = states_.find(kA);
  EXPECT_EQ(s->since, 8u);
  EXPECT_EQ(s->cause, "removed: drained, no live flows left");
}

TEST_F(States, DrainTimeoutAppliesToDrainsStartedAfterIt) {
  ASSERT_TRUE(states_.drain(kA, 0, "op"));
  states_.setDrainTimeout(500);
  ASSERT_TRUE(states_.drain(kB, 0, "op"));
  EXPECT_EQ(states_.drainProgress(kA)->deadline, kDrain);
  EXPECT_EQ(states_.drainProgress(kB)->deadline, 500u);
}

TEST(StateNames, AreLowerCaseWords) {
  EXPECT_EQ(toString(BackendState::Active), "active");
  EXPECT_EQ(toString(BackendState::Failed), "failed");
  EXPECT_EQ(toString(AdminState::Removing), "removing");
  EXPECT_EQ(toString(HealthVerdict::Down), "down");
  EXPECT_EQ(StateResult::success().codeName(), "ok");
}

}  // namespace
}  // namespace spillway
