// Drains judged by what is true (drain_rule.hpp): the rule over this
// instance's own flow count and the backend's report, BackendStates applying
// it (grace, removal, fallback without a report, never complete while the
// backend reports connections), and ConnScraper reading the agent's text
// (sum over the backend's VIPs, refusals, zero streaks, staleness). Time is
// injected; nothing sleeps.
#include "control/backends/drain_rule.hpp"

#include <gtest/gtest.h>

#include <string>

#include "control/api/event_log.hpp"
#include "control/backends/backend_state.hpp"
#include "control/config/config.hpp"
#include "control/health/conn_scraper.hpp"
#include "estate_fixture.hpp"

namespace spillway {
namespace {

constexpr Millis kDrainTimeout = 600'000;
constexpr Millis kGrace = 2'000;
constexpr std::uint64_t kA = 1;

using J = DrainJudgement;

TEST(DrainRule, TheBackendOutvotesTheInstanceOnlyForEmptiness) {
  // Rule 1: the backend's connections keep a drain open whatever the count.
  EXPECT_EQ(judgeDrain({0, 1, std::nullopt}, 100'000, kGrace), J::Open);
  EXPECT_EQ(judgeDrain({std::nullopt, 3, std::nullopt}, 100'000, kGrace), J::Open);
  // Rule 2: both empty: done at once.
  EXPECT_EQ(judgeDrain({0, 0, 99'999}, 100'000, kGrace), J::BothEmpty);
  // Rule 3: stale entries here, the backend empty: done after the grace.
  EXPECT_EQ(judgeDrain({4, 0, 99'000}, 100'000, kGrace), J::Open);
  EXPECT_EQ(judgeDrain({4, 0, 98'000}, 100'000, kGrace), J::BackendEmpty);
  EXPECT_EQ(judgeDrain({4, 0, std::nullopt}, 100'000, kGrace), J::Open);
  EXPECT_EQ(judgeDrain({std::nullopt, 0, 1'000}, 100'000, kGrace), J::BackendEmpty);
  // A zero streak "from the future" (a clock step) never counts.
  EXPECT_EQ(judgeDrain({4, 0, 200'000}, 100'000, kGrace), J::Open);
  // Rule 4: no report: the own count, as before the agent.
  EXPECT_EQ(judgeDrain({0, std::nullopt, std::nullopt}, 100'000, kGrace), J::LocalEmpty);
  EXPECT_EQ(judgeDrain({2, std::nullopt, std::nullopt}, 100'000, kGrace), J::Open);
  EXPECT_EQ(judgeDrain({std::nullopt, std::nullopt, std::nullopt}, 100'000, kGrace), J::Open);
}

struct States : ::testing::Test {
  EventLog events{64};
  BackendStates states{events, kDrainTimeout};
  void SetUp() override { ASSERT_TRUE(states.add(kA, "onprem2", 0, "config")); }
  std::string lastCause() const { return events.since(0, 0).events.back().cause; }
};

TEST_F(States, StaleEntriesNoLongerHoldADrainOnceTheBackendSaysZeroForTheGrace) {
  ASSERT_TRUE(states.setLiveFlows(kA, 10, 1'000));
  ASSERT_TRUE(states.setBackendConnections(kA, 10, std::nullopt, kGrace, 1'000));
  ASSERT_TRUE(states.drain(kA, 2'000, "operator"));
  EXPECT_FALSE(states.drainProgress(kA)->complete);
  // The flows close on the backend; ECMP had moved 4 of them to another
  // instance, so this one still tracks 4 established entries.
  ASSERT_TRUE(states.setLiveFlows(kA, 4, 30'000));
  ASSERT_TRUE(states.setBackendConnections(kA, 0, 30'000, kGrace, 30'000));
  EXPECT_FALSE(states.drainProgress(kA)->complete);  // zero for 0 ms
  states.tick(31'999);
  EXPECT_FALSE(states.drainProgress(kA)->complete);
  states.tick(32'000);
  const auto d = states.drainProgress(kA);
  ASSERT_TRUE(d->complete);
  EXPECT_EQ(d->judgedBy, "backend");
  EXPECT_EQ(states.state(kA), BackendState::Draining);  // a plain drain stays Draining
  EXPECT_NE(lastCause().find("reported no connections for 2000 ms"), std::string::npos)
      << lastCause();
  EXPECT_NE(lastCause().find("still tracks 4 live flows"), std::string::npos) << lastCause();
}

TEST_F(States, NeverCompleteWhileTheBackendReportsConnectionsEvenAtZeroLocalFlows) {
  // This instance saw all its flows close; another instance still carries one.
  ASSERT_TRUE(states.setBackendConnections(kA, 1, std::nullopt, kGrace, 1'000));
  ASSERT_TRUE(states.drain(kA, 1'000, "operator"));
  for (Millis t = 2'000; t < 500'000; t += 1'000) {
    ASSERT_TRUE(states.setLiveFlows(kA, 0, t));
    ASSERT_TRUE(states.setBackendConnections(kA, 1, std::nullopt, kGrace, t));
    states.tick(t);
    ASSERT_FALSE(states.drainProgress(kA)->complete) << t;
  }
  ASSERT_TRUE(states.setBackendConnections(kA, 0, 500'000, kGrace, 500'000));
  const auto d = states.drainProgress(kA);
  ASSERT_TRUE(d->complete);  // both empty: at once
  EXPECT_EQ(d->judgedBy, "backend and instance");
}

TEST_F(States, WithoutAReportTheOwnCountDecidesAsBefore) {
  ASSERT_TRUE(states.setLiveFlows(kA, 3, 1'000));
  ASSERT_TRUE(states.drain(kA, 1'000, "operator"));
  states.tick(400'000);
  EXPECT_FALSE(states.drainProgress(kA)->complete);
  ASSERT_TRUE(states.setLiveFlows(kA, 0, 400'001));
  const auto d = states.drainProgress(kA);
  ASSERT_TRUE(d->complete);
  EXPECT_EQ(d->judgedBy, "instance");
  EXPECT_EQ(lastCause(), "drained: no live flows left");
}

TEST_F(States, AReportThatGoesStaleHandsTheDecisionBackToTheOwnCount) {
  ASSERT_TRUE(states.setLiveFlows(kA, 3, 1'000));
  ASSERT_TRUE(states.setBackendConnections(kA, 2, std::nullopt, kGrace, 1'000));
  ASSERT_TRUE(states.drain(kA, 1'000, "operator"));
  ASSERT_TRUE(states.setBackendConnections(kA, std::nullopt, std::nullopt, kGrace, 9'000));
  ASSERT_TRUE(states.setLiveFlows(kA, 1, 9'000));
  EXPECT_FALSE(states.drainProgress(kA)->complete);
  ASSERT_TRUE(states.setLiveFlows(kA, 0, 10'000));
  EXPECT_TRUE(states.drainProgress(kA)->complete);
}

TEST_F(States, ARemovalCompletesOnTheBackendsWord) {
  ASSERT_TRUE(states.setLiveFlows(kA, 7, 1'000));
  ASSERT_TRUE(states.setBackendConnections(kA, 5, std::nullopt, kGrace, 1'000));
  ASSERT_TRUE(states.remove(kA, 1'000, "operator"));
  EXPECT_EQ(states.state(kA), BackendState::Draining);
  ASSERT_TRUE(states.setBackendConnections(kA, 0, 20'000, kGrace, 20'000));
  states.tick(21'000);
  EXPECT_EQ(states.state(kA), BackendState::Draining);
  states.tick(22'000);
  EXPECT_EQ(states.state(kA), BackendState::Removed);
  EXPECT_NE(states.find(kA)->cause.find("the backend reports no connections"), std::string::npos)
      << states.find(kA)->cause;
}

TEST_F(States, AnIdleBackendDrainsAtOnce) {
  ASSERT_TRUE(states.setLiveFlows(kA, 2, 1'000));  // stale entries from earlier flows
  ASSERT_TRUE(states.setBackendConnections(kA, 0, 1'000, kGrace, 60'000));
  ASSERT_TRUE(states.drain(kA, 60'000, "operator"));
  EXPECT_TRUE(states.drainProgress(kA)->complete);
  EXPECT_EQ(states.drainProgress(kA)->judgedBy, "backend");
}

// ---------------------------------------------------------------- ConnScraper

struct Scraper : ::testing::Test {
  ConnScraper scraper;
  void SetUp() override {
    ConnTarget t;
    t.id = kA;
    t.name = "onprem2";
    t.address = *parseIpAddress("10.0.0.2");
    t.config.enabled = true;
    t.config.staleAfter = 3'000;
    t.vips = {*parseIpAddress("192.0.2.10"), *parseIpAddress("2001:db8::10")};
    scraper.setTargets({t});
  }
  static std::string text(int v4, int v6, int other = 0) {
    return "# TYPE spillway_backend_connections gauge\n"
           "spillway_backend_connections{vip=\"192.0.2.10\"} " +
           std::to_string(v4) + "\nspillway_backend_connections{vip=\"2001:db8:0::10\"} " +
           std::to_string(v6) + "\nspillway_backend_connections{vip=\"192.0.2.99\"} " +
           std::to_string(other) + "\nspillway_backend_agent_refused_total 3\n";
  }
};

TEST_F(Scraper, SumsTheBackendsVipsOnly) {
  ASSERT_TRUE(scraper.ingest(kA, 1'000, text(2, 3, 100)));
  const auto r = scraper.report(kA, 1'000);
  ASSERT_TRUE(r && r->connections);
  EXPECT_EQ(*r->connections, 5U);
  EXPECT_FALSE(r->zeroSince);
  EXPECT_TRUE(r->lastError.empty());
}

TEST_F(Scraper, RefusesAnswersThatAreNotCountsOfEveryVip) {
  ASSERT_TRUE(scraper.ingest(kA, 1'000, text(2, 3)));
  EXPECT_FALSE(scraper.ingest(kA, 1'500,
                              "spillway_backend_connections{vip=\"192.0.2.10\"} 0\n"));  // no v6
  EXPECT_NE(scraper.report(kA, 1'500)->lastError.find("no spillway_backend_connections for VIP "
                                                      "2001:db8::10"),
            std::string::npos)
      << scraper.report(kA, 1'500)->lastError;
  for (const char* bad : {"spillway_backend_connections{vip=\"192.0.2.10\"} 1.5\n"
                          "spillway_backend_connections{vip=\"2001:db8::10\"} 0\n",
                          "spillway_backend_connections{vip=\"192.0.2.10\"} -1\n"
                          "spillway_backend_connections{vip=\"2001:db8::10\"} 0\n",
                          "spillway_backend_connections{vip=\"192.0.2.10\"} NaN\n"
                          "spillway_backend_connections{vip=\"2001:db8::10\"} 0\n",
                          "not exposition text {{{\n"}) {
    EXPECT_FALSE(scraper.ingest(kA, 1'600, bad)) << bad;
  }
  // The last good count stands (never a refused answer taken for zero).
  const auto r = scraper.report(kA, 1'700);
  EXPECT_EQ(r->connections, std::uint64_t{5});
  EXPECT_EQ(r->failures, 5U);
}

TEST_F(Scraper, ZeroStreaksStartAtTheFirstZeroAndRestartAfterAGap) {
  ASSERT_TRUE(scraper.ingest(kA, 1'000, text(1, 0)));
  ASSERT_TRUE(scraper.ingest(kA, 2'000, text(0, 0)));
  ASSERT_TRUE(scraper.ingest(kA, 3'000, text(0, 0)));
  EXPECT_EQ(scraper.report(kA, 3'000)->zeroSince, Millis{2'000});
  ASSERT_TRUE(scraper.ingest(kA, 4'000, text(0, 1)));
  EXPECT_FALSE(scraper.report(kA, 4'000)->zeroSince);
  ASSERT_TRUE(scraper.ingest(kA, 5'000, text(0, 0)));
  EXPECT_EQ(scraper.report(kA, 5'000)->zeroSince, Millis{5'000});
  // Stale: no report at all.
  EXPECT_FALSE(scraper.report(kA, 8'001)->connections);
  EXPECT_FALSE(scraper.report(kA, 8'001)->zeroSince);
  // A zero after a gap longer than stale_after starts a new streak.
  ASSERT_TRUE(scraper.ingest(kA, 9'000, text(0, 0)));
  EXPECT_EQ(scraper.report(kA, 9'000)->zeroSince, Millis{9'000});
}

TEST_F(Scraper, NoReportForUnknownOrDisabledTargets) {
  EXPECT_FALSE(scraper.report(99, 0));
  EXPECT_FALSE(scraper.report(kA, 0)->connections);  // never scraped
  ConnTarget off;
  off.id = 7;
  scraper.setTargets({off});
  EXPECT_FALSE(scraper.report(7, 0));
  EXPECT_FALSE(scraper.report(kA, 0));
}

// ---------------------------------------------------------------- [pool.connections]

const std::string kPool =
    test::estateHead(test::Head().seed("1").devargs("net_ring0")) + test::poolToml("a", "onprem");

TEST(ConnConfig, AbsentMeansOffPresentMeansOnWithEveryKey) {
  ConfigResult r = loadConfigFromString(kPool, "t.toml");
  ASSERT_TRUE(r.ok()) << formatErrors(r.errors());
  EXPECT_FALSE(r.value().pools.at(0).connections.enabled);
  r = loadConfigFromString(std::string(kPool) + "[pool.connections]\n", "t.toml");
  ASSERT_TRUE(r.ok()) << formatErrors(r.errors());
  ConnSourceConfig c = r.value().pools.at(0).connections;
  EXPECT_TRUE(c.enabled);
  EXPECT_EQ(c.port, 9411);
  EXPECT_EQ(c.grace, 2'000U);
  r = loadConfigFromString(std::string(kPool) + R"([pool.connections]
port = 9500
path = "/agent"
interval = 0.5
timeout = 0.4
stale_after = 2
grace = 1
)",
                           "t.toml");
  ASSERT_TRUE(r.ok()) << formatErrors(r.errors());
  c = r.value().pools.at(0).connections;
  EXPECT_EQ(c.port, 9500);
  EXPECT_EQ(c.path, "/agent");
  EXPECT_EQ(c.interval, 500U);
  EXPECT_EQ(c.timeout, 400U);
  EXPECT_EQ(c.staleAfter, 2'000U);
  EXPECT_EQ(c.grace, 1'000U);
}

TEST(ConnConfig, BadValuesAreRefusedNamingTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {"timeout = 2\n", "connections.timeout"}, {"stale_after = 0.5\n", "connections.stale_after"},
      {"port = 0\n", "connections.port"},       {"path = \"no-slash\"\n", "connections.path"},
      {"grace = -1\n", "connections.grace"},    {"gpu_metric = \"x\"\n", "connections.gpu_metric"},
  };
  for (const auto& [line, field] : cases) {
    const ConfigResult r =
        loadConfigFromString(std::string(kPool) + "[pool.connections]\n" + line, "t.toml");
    ASSERT_FALSE(r.ok()) << line;
    EXPECT_NE(formatErrors(r.errors()).find(field), std::string::npos)
        << line << ": " << formatErrors(r.errors());
  }
}

}  // namespace
}  // namespace spillway
