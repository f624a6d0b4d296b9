// Make-before-break and the join gate of an LB tier (issue 24, item 4), with a
// ControlPlane on a fake dataplane and a real peer on loopback, time injected:
//  - a step that moves entries is held until the export against it reached
//    the peer; the peer holds the record when the step is published, and
//    the published snapshot is the one the workers were asked to judge by;
//  - a step whose export never finishes is published at make_before_break,
//    counted, and the workers forget the snapshot first;
//  - changes made while a step is held become one next step;
//  - without peers, or with make_before_break = 0, a step is published at once;
//  - a joining instance waits until the tier's tables have been quiet, and a
//    tier that keeps stepping lets it in at the bound, with events;
//  - exportsFlow (the worker's choice) keeps the flows the next tables move;
//  - Step payloads round-trip and a wrong size is refused.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "control/backends/snapshot_builder.hpp"
#include "control/plane/control_plane.hpp"
#include "control/tier/peer_channel.hpp"
#include "control/tier/peer_wire.hpp"
#include "estate_fixture.hpp"
#include "fake_dataplane.hpp"
#include "loopback_servers.hpp"
#include "spillway/flow_exceptions.hpp"

namespace spillway {
namespace {

constexpr std::uint64_t kSeed = 0x0123456789abcdefULL;
const std::string kSecret = "0123456789abcdef-the-tier-secret";
constexpr std::int64_t kWallStart = 1'700'000'000'000;

using test::at;
using test::freePort;

// Polls until `done` or a wall-clock deadline (the deadline only stops a
// test that would otherwise hang; no assertion is about wall time).
bool pollUntil(const std::function<void()>& step, const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    step();
    if (done()) return true;
  }
  return false;
}

std::map<std::uint64_t, std::uint64_t> byHash(const std::vector<PeerException>& v) {
  std::map<std::uint64_t, std::uint64_t> m;
  for (const PeerException& e : v) m[e.hash] = e.backendId;
  return m;
}

bool eventSays(ControlPlane& cp, const std::string& text) {
  const Json page = std::get<Json>(cp.events(0, 1000));
  return page.dump().find(text) != std::string::npos;
}

class Mbb : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/spillway-mbb-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    secret_ = dir_ + "/secret";
    std::ofstream(secret_) << kSecret;
    ::chmod(secret_.c_str(), 0600);
    pa_ = freePort();
    pb_ = freePort();
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    std::filesystem::remove_all(dir_);
  }

  Config config(const std::string& tierExtra, bool peers = true) {
    std::string text = test::onePoolEstate(3) + "\n[control]\nstate_dir = \"" + dir_ + "\"\n";
    if (peers) {
      text += "\n[tier]\nnode = \"lb-a\"\nlisten = \"" + at(pa_) +
              "\"\npeers = [{name = \"lb-b\", address = \"" + at(pb_) + "\"}]\nsecret_file = \"" +
              secret_ + "\"\n" + tierExtra;
    }
    auto r = loadConfigFromString(text, "test.toml");
    EXPECT_TRUE(r) << formatErrors(r.errors());
    return r.value();
  }

  // lb-a (a ControlPlane) and lb-b (a bare peer channel that agrees on the
  // tier's empty intent).
  void start(const std::string& tierExtra, bool peers = true) {
    const Config c = config(tierExtra, peers);
    ASSERT_FALSE(builder_.setConfig(c));
    a_ = std::make_unique<ControlPlane>(c, "test.toml", builder_, &dp_, now_,
                                        [this] { return kWallStart + now_; });
    dp_.publish(a_->takeSnapshot(now_));
    if (!peers) return;
    TierConfig t;
    t.node = "lb-b";
    t.listen = at(pb_);
    t.peers = {TierPeerConfig{"lb-a", at(pa_)}};
    t.secret = kSecret;
    b_ = std::make_unique<PeerChannel>(t, kSeed, log_);
    ASSERT_FALSE(b_->open());
    const TierIntent none;
    b_->publishIntent(none.entries(), none.digest());
  }

  void step(Millis by = 10) {
    now_ += by;
    if (b_) b_->poll(now_);
    if (a_->tick(now_)) {
      if (auto s = a_->takeSnapshot(now_)) dp_.publish(std::move(s));
    }
  }

  void joinAndSettle() {
    ASSERT_TRUE(
        pollUntil([&] { step(); }, [&] { return a_->peersReady(now_) && b_->connected("lb-a"); }));
    for (int i = 0; i < 150; ++i) step();  // first exports and rebuilds done
  }

  Json mbb() { return std::get<Json>(a_->status()).at("make_before_break"); }

  BackendState stateIn(const ForwardingSnapshot& s, const std::string& name) {
    return s.backend(builder_.indexOf(backendIdFromName(name)))->state;
  }

  std::string dir_;
  std::string secret_;
  std::uint16_t pa_ = 0;
  std::uint16_t pb_ = 0;
  Millis now_ = 0;
  EventLog log_{256};
  test::FakeDataplane dp_;
  SnapshotBuilder builder_;
  std::unique_ptr<ControlPlane> a_;
  std::unique_ptr<PeerChannel> b_;
};

TEST_F(Mbb, TheExportAgainstTheNextTablesReachesThePeerBeforeThePublish) {
  start("make_before_break = 0.5\n");
  joinAndSettle();
  const std::uint64_t b2 = backendIdFromName("b2");
  const std::uint64_t flow = 0x4242424242424242ULL;
  // A live flow on b2 that only the next tables make an exception.
  dp_.aheadFlows = {ExportedFlow{flow, builder_.indexOf(b2), FlowState::Established, 0}};

  struct Seen {
    std::uint64_t generation = 0;
    bool b2Draining = false;
    bool peerHadIt = false;
    bool judgedBy = false;   // the snapshot the workers exported against
    bool forgotten = false;  // ... forgotten before the publish
  };
  std::vector<Seen> seen;
  dp_.onPublish = [&](const ForwardingSnapshot& s) {
    // What lb-b holds at the moment lb-a publishes (the bytes are in its
    // socket already, or never: a few non-blocking polls read them).
    for (int i = 0; i < 20 && byHash(b_->exceptions()).count(flow) == 0; ++i) b_->poll(now_);
    const auto held = byHash(b_->exceptions());
    seen.push_back(Seen{s.generation, stateIn(s, "b2") == BackendState::Draining,
                        held.count(flow) == 1 && held.at(flow) == b2, &s == dp_.lastExportNext,
                        dp_.exportNext == nullptr});
  };
  const std::uint64_t before = dp_.publishes;
  ASSERT_TRUE(std::holds_alternative<Json>(a_->backendDrain("b2")));
  const Millis drainedAt = now_;
  ASSERT_TRUE(pollUntil([&] { step(); }, [&] { return dp_.publishes > before; }));
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_TRUE(seen[0].b2Draining) << "the first publish after the drain is the step";
  EXPECT_TRUE(seen[0].peerHadIt) << "lb-b held the exception before the step was published";
  EXPECT_TRUE(seen[0].judgedBy);
  EXPECT_TRUE(seen[0].forgotten);
  EXPECT_EQ(dp_.exportsAhead, 1u);
  EXPECT_LT(now_ - drainedAt, 500) << "published on the export, not at the bound";
  const Json m = mbb();
  EXPECT_EQ(m.at("enabled"), true);
  EXPECT_EQ(m.at("held_steps"), 1);
  EXPECT_EQ(m.at("exports"), 1);
  EXPECT_EQ(m.at("timeouts"), 0);
  EXPECT_GT(m.at("last_delay_ms").get<Millis>(), 0);  // built in the tick after the drain
  EXPECT_LE(m.at("last_delay_ms").get<Millis>(), now_ - drainedAt);
  EXPECT_NE(a_->metricsText().find("spillway_mbb_exports_total 1"), std::string::npos);
  // lb-b was told of the step (Step frame) and reports its age.
  const Json peer = b_->status(now_).at("peers")[0];
  EXPECT_EQ(peer.at("last_step_age_ms"), 0) << peer.dump();
}

TEST_F(Mbb, AStepWhoseExportDoesNotFinishIsPublishedAtTheBoundAndCounted) {
  start("make_before_break = 0.3\n");
  joinAndSettle();
  dp_.answerExports = false;  // the workers never finish
  std::vector<Millis> publishedAt;
  std::vector<bool> forgotten;
  dp_.onPublish = [&](const ForwardingSnapshot&) {
    publishedAt.push_back(now_);
    forgotten.push_back(dp_.exportNext == nullptr);
  };
  ASSERT_TRUE(std::holds_alternative<Json>(a_->backendDrain("b2")));
  const Millis drainedAt = now_;
  ASSERT_TRUE(pollUntil([&] { step(); }, [&] { return !publishedAt.empty(); }));
  EXPECT_GE(publishedAt[0] - drainedAt, 300);
  EXPECT_LE(publishedAt[0] - drainedAt, 320);
  EXPECT_TRUE(forgotten[0]);
  EXPECT_GE(dp_.forgets, 1u);
  const Json m = mbb();
  EXPECT_EQ(m.at("held_steps"), 1);
  EXPECT_EQ(m.at("exports"), 0);
  EXPECT_EQ(m.at("timeouts"), 1);
  EXPECT_GE(m.at("max_delay_ms").get<Millis>(), 300);
  EXPECT_TRUE(eventSays(*a_, "without its exceptions reaching every peer first"));
  EXPECT_NE(a_->metricsText().find("spillway_mbb_timeouts_total 1"), std::string::npos);
}

TEST_F(Mbb, ChangesWhileAStepIsHeldBecomeOneNextStep) {
  start("make_before_break = 0.3\n");
  joinAndSettle();
  dp_.answerExports = false;
  struct Seen {
    Millis at;
    bool b2Draining;
    bool b1Draining;
    bool b3Draining;
  };
  std::vector<Seen> seen;
  dp_.onPublish = [&](const ForwardingSnapshot& s) {
    seen.push_back(Seen{now_, stateIn(s, "b2") == BackendState::Draining,
                        stateIn(s, "b1") == BackendState::Draining,
                        stateIn(s, "b3") == BackendState::Draining});
  };
  ASSERT_TRUE(std::holds_alternative<Json>(a_->backendDrain("b2")));
  const Millis first = now_;
  for (int i = 0; i < 10; ++i) step();
  ASSERT_TRUE(std::holds_alternative<Json>(a_->backendDrain("b3")));
  step();
  ASSERT_TRUE(std::holds_alternative<Json>(a_->backendDrain("b1")));
  EXPECT_TRUE(seen.empty()) << "nothing is published while the first step is held";
  ASSERT_TRUE(pollUntil([&] { step(); }, [&] { return seen.size() >= 2; }));
  EXPECT_TRUE(seen[0].b2Draining);
  EXPECT_FALSE(seen[0].b3Draining);
  EXPECT_FALSE(seen[0].b1Draining);
  EXPECT_GE(seen[0].at - first, 300);
  // The two later drains: one step, held on its own.
  EXPECT_TRUE(seen[1].b3Draining);
  EXPECT_TRUE(seen[1].b1Draining);
  EXPECT_GE(seen[1].at - seen[0].at, 300);
  const Json m = mbb();
  EXPECT_EQ(m.at("held_steps"), 2);
  EXPECT_EQ(m.at("coalesced"), 1);
  EXPECT_EQ(m.at("timeouts"), 2);
}

TEST_F(Mbb, WithoutPeersAStepIsPublishedAtOnce) {
  start("", false);
  ASSERT_TRUE(std::holds_alternative<Json>(a_->backendDrain("b2")));
  ASSERT_TRUE(a_->tick(now_ + 1));
  auto s = a_->takeSnapshot(now_ + 1);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(stateIn(*s, "b2"), BackendState::Draining);
  EXPECT_EQ(dp_.exportsAhead, 0u);
  const Json m = mbb();
  EXPECT_EQ(m.at("enabled"), false);
  EXPECT_EQ(m.at("held_steps"), 0);
  EXPECT_EQ(a_->metricsText().find("spillway_mbb_"), std::string::npos);
}

// A drill or an operator compares when each instance of a tier last moved
// its tables: status gives the step by the control loop's clock and by the
// wall clock, and a round that publishes the same weights moves neither.
TEST_F(Mbb, StatusSaysWhenTheTablesLastChangedByBothClocks) {
  start("", false);
  ASSERT_TRUE(std::holds_alternative<Json>(a_->backendDrain("b2")));
  now_ += 7;
  const Millis stepAt = now_;
  ASSERT_TRUE(a_->tick(stepAt));
  ASSERT_NE(a_->takeSnapshot(stepAt), nullptr);
  Json st = std::get<Json>(a_->status());
  EXPECT_EQ(st.at("tables_changed_ms"), stepAt);
  EXPECT_EQ(st.at("tables_changed_unix_ms"), kWallStart + stepAt);
  now_ = stepAt + 500;
  for (int i = 0; i < 20; ++i) step();
  st = std::get<Json>(a_->status());
  EXPECT_EQ(st.at("tables_changed_ms"), stepAt);
  EXPECT_EQ(st.at("tables_changed_unix_ms"), kWallStart + stepAt);
}

TEST_F(Mbb, WithMakeBeforeBreakOffAStepIsPublishedAtOnce) {
  start("make_before_break = 0\n");
  joinAndSettle();
  ASSERT_TRUE(std::holds_alternative<Json>(a_->backendDrain("b2")));
  now_ += 10;
  ASSERT_TRUE(a_->tick(now_));
  auto s = a_->takeSnapshot(now_);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(stateIn(*s, "b2"), BackendState::Draining);
  EXPECT_EQ(dp_.exportsAhead, 0u);
  const Json m = mbb();
  EXPECT_EQ(m.at("enabled"), false);
  EXPECT_EQ(m.at("held_steps"), 0);
  EXPECT_EQ(m.at("unheld_steps"), 1);
}

TEST_F(Mbb, ANewcomerJoinsOnceThePeersTablesAreQuiet) {
  start("");
  // lb-b steps every 100 ms until t = 500, then its tables stay.
  Millis lastStep = 0;
  ASSERT_TRUE(pollUntil(
      [&] {
        if (now_ <= 500 && now_ % 100 == 0) {
          b_->noteStep(now_);
          lastStep = now_;
        }
        step();
      },
      [&] { return a_->peersReady(now_); }));
  EXPECT_GE(now_, lastStep + 1000) << "joined while lb-b's tables stepped";
  EXPECT_LT(now_, 10'000);  // by quiet, not by a bound
  EXPECT_TRUE(eventSays(*a_, "join held: peer lb-b stepped its tables"));
  EXPECT_TRUE(eventSays(*a_, "have been quiet for 1000 ms"));
  EXPECT_FALSE(mbb().at("join_quiet_waited_ms").is_null());
}

TEST_F(Mbb, ATierThatKeepsSteppingLetsTheNewcomerInAtTheBound) {
  start("");
  std::optional<Millis> heldFrom;
  ASSERT_TRUE(pollUntil(
      [&] {
        if (now_ % 200 == 0) b_->noteStep(now_);
        step();
        if (!heldFrom && eventSays(*a_, "join held")) heldFrom = now_;
      },
      [&] { return a_->peersReady(now_); }));
  ASSERT_TRUE(heldFrom.has_value());
  EXPECT_GE(now_ - *heldFrom, 10'000 - 20);
  EXPECT_TRUE(eventSays(*a_, "kept stepping"));
}

TEST(MbbExportsFlow, KeepsTheFlowsTheNextTablesMove) {
  auto r = loadConfigFromString(test::onePoolEstate(3), "test.toml");
  ASSERT_TRUE(r) << formatErrors(r.errors());
  SnapshotBuilder builder;
  ASSERT_FALSE(builder.setConfig(r.value()));
  auto current = builder.build(1);
  ASSERT_NE(current, nullptr);
  const std::uint32_t b1 = builder.indexOf(backendIdFromName("b1"));
  const std::uint32_t b2 = builder.indexOf(backendIdFromName("b2"));
  ASSERT_TRUE(builder.setState(backendIdFromName("b2"), BackendState::Draining));
  auto next = builder.build(2);
  ASSERT_NE(next, nullptr);
  const std::uint8_t tag = current->vips[0].tag;
  std::size_t onB2 = 0;
  std::size_t onB1 = 0;
  for (std::uint64_t i = 1; i < 5000; ++i) {
    const std::uint64_t h = i * 0x9e3779b97f4a7c15ULL;
    const std::uint32_t placed = current->vips[0].table.lookup(h);
    if (placed == b2) {
      ++onB2;
      // On its entry now; the drain moves every b2 entry: kept only ahead.
      EXPECT_FALSE(exportsFlow(*current, nullptr, h, b2, tag));
      EXPECT_TRUE(exportsFlow(*current, next.get(), h, b2, tag));
    } else if (placed == b1 && next->vips[0].table.lookup(h) == b1) {
      ++onB1;
      // Its entry stays: no exception either way.
      EXPECT_FALSE(exportsFlow(*current, next.get(), h, b1, tag));
    }
    // A flow already off its entry is kept with or without the next tables.
    if (placed != b1) {
      EXPECT_TRUE(exportsFlow(*current, nullptr, h, b1, tag));
      EXPECT_TRUE(exportsFlow(*current, next.get(), h, b1, tag));
    }
  }
  EXPECT_GT(onB2, 100u);
  EXPECT_GT(onB1, 100u);
  // A backend that fails in the next tables keeps no tracked flows there.
  ASSERT_TRUE(builder.setState(backendIdFromName("b2"), BackendState::Failed));
  auto disabled = builder.build(3);
  for (std::uint64_t i = 1; i < 200; ++i) {
    const std::uint64_t h = i * 0x9e3779b97f4a7c15ULL;
    if (current->vips[0].table.lookup(h) == b2) {
      EXPECT_FALSE(exportsFlow(*current, disabled.get(), h, b2, tag));
    }
  }
}

TEST(MbbStepFrame, RoundTripsAndRefusesAWrongSize) {
  const auto some = decodePeerStep(encodePeerStep(1234));
  ASSERT_TRUE(some.has_value());
  ASSERT_TRUE(some->has_value());
  EXPECT_EQ(**some, 1234u);
  const auto none = decodePeerStep(encodePeerStep(std::nullopt));
  ASSERT_TRUE(none.has_value());
  EXPECT_FALSE(none->has_value());
  EXPECT_FALSE(decodePeerStep("").has_value());
  EXPECT_FALSE(decodePeerStep("1234567").has_value());
  EXPECT_FALSE(decodePeerStep("123456789").has_value());
  // A whole frame of the new type decodes (an older build refuses the type).
  const std::string frame = encodePeerFrame(PeerFrameType::Step, encodePeerStep(7));
  const PeerDecoded d = decodePeerFrame(frame, nullptr, 0);
  // Without a key only handshake frames are taken: the type is known, the key missing.
  ASSERT_TRUE(std::holds_alternative<PeerBadFrame>(d));
  EXPECT_EQ(std::get<PeerBadFrame>(d).reason.find("unknown frame type"), std::string::npos);
}

}  // namespace
}  // namespace spillway
