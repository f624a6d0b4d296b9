// The start-up rebuild of flow exceptions from the backends' agents
// (control/health/conn_rebuild.hpp, the keeper's rebuilt set and the plane's
// merge): the hash of a listed connection is the data path's hash of the
// client's packet; bad answers (malformed, wrong token, huge, silent, a
// refused connect) are counted per backend and never stop the others; the
// rebuild ends within its bounds; a snapshot gets a rebuilt flow only where
// its own table sends the flow elsewhere or another layer names another
// backend; the announcement waits for it.
#include "control/health/conn_rebuild.hpp"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "control/backends/snapshot_builder.hpp"
#include "control/config/config.hpp"
#include "control/intent/affinity_keeper.hpp"
#include "control/intent/flow_checkpoint.hpp"
#include "control/plane/control_plane.hpp"
#include "estate_fixture.hpp"
#include "fake_dataplane.hpp"
#include "loopback_servers.hpp"
#include "packet_builder.hpp"
#include "spillway/packet.hpp"

namespace spillway {
namespace {

constexpr std::uint64_t kSeed = 0x0123456789abcdefULL;
constexpr const char* kToken = "s3cret-token-0123456789";

IpAddress ip(const char* text) {
  return *parseIpAddress(text);
}

RebuildTarget target(std::uint64_t id, const char* address, std::uint16_t port) {
  RebuildTarget t;
  t.id = id;
  t.name = "b" + std::to_string(id);
  t.address = ip(address);
  t.port = port;
  t.token = kToken;
  t.timeout = 500;
  t.vips = {RebuildVip{ip("192.0.2.1"), 80, 7}, RebuildVip{ip("2001:db8::1"), 0, 9}};
  return t;
}

std::string entry(const std::string& client, int clientPort, int vipPort,
                  const char* state = "ESTABLISHED") {
  return R"({"client":")" + client + R"(","client_port":)" + std::to_string(clientPort) +
         R"(,"vip_port":)" + std::to_string(vipPort) + R"(,"state":")" + state + R"("})";
}

std::string listBody(const std::string& v4, const std::string& v6 = "", bool truncated = false,
                     int total = -1) {
  std::string body = R"({"vips":{"192.0.2.1":[)" + v4 + R"(],"2001:db8::1":[)" + v6 + "]}";
  body += std::string(R"(,"truncated":)") + (truncated ? "true" : "false");
  if (total >= 0) body += R"(,"total":)" + std::to_string(total);
  return body + "}";
}

std::uint64_t packetHash(const char* client, std::uint16_t clientPort, const char* vip,
                         std::uint16_t vipPort, bool v6) {
  test::PacketBuilder b;
  b.eth();
  if (v6) {
    b.ipv6(client, vip);
  } else {
    b.ipv4(client, vip);
  }
  const auto frame = b.tcp(clientPort, vipPort).payload(10).build();
  const PacketView view = parsePacket(frame);
  return FlowHasher(kSeed).hash(view.key);
}

TEST(ConnList, TheHashIsTheDataPathsHashOfTheClientsPacket) {
  const FlowHasher hasher(kSeed);
  const auto parsed = parseConnList(listBody(entry("198.51.100.7", 40001, 80) + "," +
                                                 entry("198.51.100.8", 40002, 80, "FIN_WAIT1"),
                                             entry("2001:db8:5::7", 50000, 443)),
                                    target(3, "10.0.1.3", 9411), hasher);
  ASSERT_TRUE(std::holds_alternative<ConnListAnswer>(parsed)) << std::get<std::string>(parsed);
  const auto& a = std::get<ConnListAnswer>(parsed);
  ASSERT_EQ(a.flows.size(), 3u);
  EXPECT_EQ(a.flows[0].hash, packetHash("198.51.100.7", 40001, "192.0.2.1", 80, false));
  EXPECT_EQ(a.flows[1].hash, packetHash("198.51.100.8", 40002, "192.0.2.1", 80, false));
  EXPECT_EQ(a.flows[2].hash, packetHash("2001:db8:5::7", 50000, "2001:db8::1", 443, true));
  EXPECT_EQ(a.flows[0].backendId, 3u);
  EXPECT_EQ(a.flows[0].vipTag, 7);
  EXPECT_EQ(a.flows[2].vipTag, 9);
  EXPECT_TRUE(a.flows[0].established);
  EXPECT_FALSE(a.flows[1].established);
  EXPECT_EQ(a.listed, 3u);
  EXPECT_EQ(a.total, 3u);
  EXPECT_FALSE(a.truncated);
  // The server's port is not the client's: swapping them is another flow.
  EXPECT_NE(a.flows[0].hash, packetHash("198.51.100.7", 80, "192.0.2.1", 40001, false));
}

TEST(ConnList, MalformedAnswersAreRefusedWholeAndBadEntriesCounted) {
  const FlowHasher hasher(kSeed);
  const RebuildTarget t = target(1, "10.0.1.1", 9411);
  for (const char* bad :
       {"", "not json", "[]", "{}", R"({"vips":[]})", R"({"vips":{"192.0.2.1":3}})",
        R"({"vips":{},"truncated":"yes"})", "{\"vips\":{\"192.0.2.1\":[{"}) {
    EXPECT_TRUE(std::holds_alternative<std::string>(parseConnList(bad, t, hasher))) << bad;
  }
  // Entries that name no client, a port out of range, another family, a
  // VIP this backend does not serve or another port of a served VIP.
  const std::string body =
      R"({"vips":{"192.0.2.1":[7,{"client":"x","client_port":1,"vip_port":80},)"
      R"({"client":"198.51.100.1","client_port":0,"vip_port":80},)"
      R"({"client":"198.51.100.1","client_port":70000,"vip_port":80},)"
      R"({"client":"2001:db8::9","client_port":5,"vip_port":80},)"
      R"({"client":"198.51.100.1","client_port":"5","vip_port":80},)"
      R"({"client":"198.51.100.1","client_port":5,"vip_port":81},)"
      R"({"client":"198.51.100.1","client_port":6,"vip_port":80}],)"
      R"("203.0.113.9":[{"client":"198.51.100.1","client_port":5,"vip_port":80}],)"
      R"("garbage":[{"client":"198.51.100.1","client_port":5,"vip_port":80}]},)"
      R"("truncated":true,"total":5000})";
  const auto parsed = parseConnList(body, t, hasher);
  ASSERT_TRUE(std::holds_alternative<ConnListAnswer>(parsed)) << std::get<std::string>(parsed);
  const auto& a = std::get<ConnListAnswer>(parsed);
  EXPECT_EQ(a.flows.size(), 1u);
  EXPECT_EQ(a.listed, 10u);
  EXPECT_EQ(a.invalid, 7u);  // 7, "x", port 0, 70000, v6 client, "5", the "garbage" VIP
  EXPECT_EQ(a.foreign, 2u);  // port 81, 203.0.113.9
  EXPECT_TRUE(a.truncated);
  EXPECT_EQ(a.total, 5000u);
}

TEST(ConnRebuildInjected, ConflictsCapsAndStatusesAreCounted) {
  ConnRebuild r({target(1, "10.0.1.1", 9411), target(2, "10.0.1.2", 9411),
                 target(3, "10.0.1.3", 9411), target(4, "10.0.1.4", 9411)},
                kSeed, 3);
  // b1 lists a flow in FIN_WAIT1 that b2 holds ESTABLISHED: b2 wins.
  r.record(0, 5, 200,
           listBody(entry("198.51.100.1", 1000, 80, "FIN_WAIT1") + "," +
                    entry("198.51.100.1", 1001, 80)));
  r.record(1, 6, 200,
           listBody(entry("198.51.100.1", 1000, 80) + "," + entry("198.51.100.1", 1002, 80) + "," +
                        entry("198.51.100.1", 1003, 80),
                    "", true, 99));
  r.record(2, 7, 401, "");
  r.record(3, 8, 200, "{\"vips\":");
  EXPECT_FALSE(r.done());  // poll() decides that
  r.poll(9);
  EXPECT_TRUE(r.done());
  const RebuildTotals& t = r.totals();
  EXPECT_EQ(t.flows, 3u);  // the cap
  EXPECT_EQ(t.overCap, 1u);
  EXPECT_EQ(t.conflicts, 1u);
  EXPECT_EQ(t.answered, 2u);
  EXPECT_EQ(t.failed, 2u);
  EXPECT_EQ(t.truncated, 1u);
  const std::uint64_t contested = packetHash("198.51.100.1", 1000, "192.0.2.1", 80, false);
  for (const RebuiltFlow& f : r.flows()) {
    if (f.hash == contested) {
      EXPECT_EQ(f.backendId, 2u);
    }
  }
  EXPECT_NE(r.backends()[2].error.find("401"), std::string::npos) << r.backends()[2].error;
  EXPECT_NE(r.backends()[3].error.find("bad answer"), std::string::npos) << r.backends()[3].error;
  EXPECT_TRUE(r.backends()[1].truncated);
  EXPECT_EQ(r.backends()[1].total, 99u);
}

TEST(ConnRebuildServers, AsksWithTheTokenAndBoundsEveryBadBackend) {
  test::LoopbackHttpServer good(
      test::httpOk(listBody(entry("198.51.100.1", 2000, 80)), "application/json"), "127.0.0.1");
  test::LoopbackHttpServer refusing(test::httpStatus(401, "Unauthorized"), "127.0.0.1");
  test::LoopbackHttpServer silent(test::httpOk("x"), "127.0.0.1");
  silent.setSilent(true);
  // Larger than an answer may be: refused, not parsed.
  test::LoopbackHttpServer huge(
      test::httpOk(std::string(kRebuildMaxBytes + 1024, ' '), "application/json"), "127.0.0.1");
  const std::uint16_t closed = test::refusingPort();
  std::vector<RebuildTarget> targets = {
      target(1, "127.0.0.1", good.port()), target(2, "127.0.0.1", refusing.port()),
      target(3, "127.0.0.1", silent.port()), target(4, "127.0.0.1", huge.port()),
      target(5, "127.0.0.1", closed)};
  targets[0].path = "/connections";
  ConnRebuild r(std::move(targets), kSeed, 1000);
  test::PollDriver<ConnRebuild> driver(r);
  ASSERT_TRUE(driver.runUntil([&] { return r.done(); }, kConnRebuildLimit));
  // Ended by the slowest backend's timeout (500 ms), far below the limit.
  ASSERT_TRUE(r.finishedAt());
  EXPECT_LE(*r.finishedAt(), 500);
  EXPECT_NE(good.lastRequest().find("GET /connections HTTP/1.1"), std::string::npos);
  EXPECT_NE(good.lastRequest().find(std::string("Authorization: Bearer ") + kToken),
            std::string::npos)
      << good.lastRequest();
  const auto& b = r.backends();
  EXPECT_EQ(b[0].outcome, RebuildBackendStatus::Outcome::Answered);
  EXPECT_EQ(b[0].flows, 1u);
  for (std::size_t i = 1; i < b.size(); ++i) {
    EXPECT_EQ(b[i].outcome, RebuildBackendStatus::Outcome::Failed) << i;
  }
  EXPECT_NE(b[1].error.find("401"), std::string::npos) << b[1].error;
  EXPECT_NE(b[2].error.find("within 500 ms"), std::string::npos) << b[2].error;
  EXPECT_FALSE(b[3].error.empty());
  EXPECT_FALSE(b[4].error.empty());
  EXPECT_EQ(r.totals().flows, 1u);
  EXPECT_EQ(r.totals().failed, 4u);
}

TEST(ConnRebuildServers, TheWholeRebuildEndsAtItsLimit) {
  test::LoopbackHttpServer silent(test::httpOk("x"), "127.0.0.1");
  silent.setSilent(true);
  std::vector<RebuildTarget> targets;
  for (std::uint64_t i = 1; i <= 2; ++i) {
    targets.push_back(target(i, "127.0.0.1", silent.port()));
    targets.back().timeout = kConnRebuildLimit;  // each would wait the whole limit
  }
  ConnRebuild r(std::move(targets), kSeed, 1000);
  test::PollDriver<ConnRebuild> driver(r);
  ASSERT_TRUE(driver.runUntil([&] { return r.done(); }, 2 * kConnRebuildLimit));
  EXPECT_LE(*r.finishedAt(), kConnRebuildLimit);
  EXPECT_EQ(r.totals().failed, 2u);
}

// --- The plane: the rebuild before the announcement ------------------------

class PlaneRebuild : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/spillway-rebuild-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::ofstream(dir_ + "/agent.token") << kToken << "\n";
    ::chmod((dir_ + "/agent.token").c_str(), 0600);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Three backends on 127.0.1.1..3, whose agents listen on `port`.
  Config config(std::uint16_t port, bool rebuild = true) {
    std::string text = test::onePoolEstate(0);
    text += "\n[pool.connections]\nport = " + std::to_string(port) + "\ntoken_file = \"" + dir_ +
            "/agent.token\"\nrebuild_timeout = 0.3\n";
    if (!rebuild) text += "rebuild = false\n";
    text += "\n[control]\nstate_dir = \"" + dir_ + "/state" + std::to_string(++planes_) + "\"\n";
    for (int i = 1; i <= 3; ++i) {
      text += test::backendToml("b" + std::to_string(i), "10.0.1." + std::to_string(i), "onprem");
    }
    // [pool.connections] must follow its [[pool]]: move it there.
    const auto at = text.find("\n[[vip]]");
    const auto conn = text.find("\n[pool.connections]");
    const auto connEnd = text.find("\n[[backend]]", conn);
    const std::string section = text.substr(conn, connEnd - conn);
    text.erase(conn, connEnd - conn);
    text.insert(at, section);
    auto r = loadConfigFromString(text, "test.toml");
    EXPECT_TRUE(r) << formatErrors(r.errors()) << text;
    // The file may not name loopback backends; the fake agents live there.
    Config c = r.value();
    for (BackendConfig& b : c.backends) b.address.bytes[0] = std::byte{127};
    return c;
  }

  // Ticks with injected time 10 ms a round, waiting up to 50 ms of real time
  // for the plane's descriptors between rounds, until `done`.
  bool runUntil(ControlPlane& c, const std::function<bool()>& done, Millis until) {
    for (; now_ <= until; now_ += 10) {
      if (c.tick(now_)) {
        if (auto s = c.takeSnapshot(now_)) dp_.publish(std::move(s));
      }
      if (done()) return true;
      std::vector<pollfd> fds;
      for (int fd : c.pollFds()) fds.push_back(pollfd{fd, POLLIN, 0});
      (void)::poll(fds.data(), fds.size(), 50);
    }
    return false;
  }

  std::string dir_;
  int planes_ = 0;  // each plane its own state directory
  test::FakeDataplane dp_;
  Millis now_ = 0;
};

TEST_F(PlaneRebuild, FlowsOffTheirTableEntryBecomeExceptionsBeforeTheAnnouncement) {
  // b1's agent answers; b2 refuses the token; b3's agent says nothing.
  test::LoopbackHttpServer b1(test::httpOk("{}"), "127.0.1.1");
  test::LoopbackHttpServer b2(test::httpStatus(401, "Unauthorized"), "127.0.1.2", b1.port());
  test::LoopbackHttpServer b3(test::httpOk("{}"), "127.0.1.3", b1.port());
  b3.setSilent(true);
  const Config cfg = config(b1.port());
  // Which backend the first table gives each client port: list 40 of them
  // as b1's, so some sit on b1's entries and most do not.
  // (The oracle: a plane of the same file without the rebuild.)
  SnapshotBuilder probe;
  const Config plain = config(b1.port(), false);
  ASSERT_FALSE(probe.setConfig(plain));
  test::FakeDataplane probeDp;
  ControlPlane oracle(plain, "test.toml", probe, &probeDp, 0);
  std::shared_ptr<const ForwardingSnapshot> table = oracle.takeSnapshot(0);
  ASSERT_NE(table, nullptr);
  const std::uint32_t b1Index = probe.indexOf(backendIdFromName("b1"));
  std::string entries;
  std::vector<std::uint64_t> onB1, elsewhere;
  for (int port = 30000; port < 30040; ++port) {
    if (!entries.empty()) entries += ",";
    entries += entry("198.51.100.5", port, 443);
    const std::uint64_t h =
        packetHash("198.51.100.5", static_cast<std::uint16_t>(port), "192.0.2.1", 443, false);
    (table->vips[0].table.lookup(h) == b1Index ? onB1 : elsewhere).push_back(h);
  }
  ASSERT_FALSE(onB1.empty());
  ASSERT_FALSE(elsewhere.empty());
  b1.setResponse(test::httpOk(R"({"vips":{"192.0.2.1":[)" + entries + "]}}", "application/json"));

  SnapshotBuilder builder;
  ASSERT_FALSE(builder.setConfig(cfg));
  ControlPlane c(cfg, "test.toml", builder, &dp_, 0);
  dp_.publish(c.takeSnapshot(0));
  EXPECT_FALSE(c.announceReady(0));
  EXPECT_FALSE(c.rebuildReady());
  ASSERT_TRUE(runUntil(
      c, [&] { return c.rebuildReady(); }, 5000));
  // b3's timeout (0.3 s) bounds it.
  EXPECT_LE(now_, 400);
  EXPECT_TRUE(c.announceReady(now_));
  auto s = dp_.latest;
  ASSERT_NE(s, nullptr);
  ASSERT_NE(s->exceptions, nullptr);
  const std::uint32_t b1Now = builder.indexOf(backendIdFromName("b1"));
  for (std::uint64_t h : elsewhere) EXPECT_EQ(s->exceptions->find(h).backend, b1Now);
  for (std::uint64_t h : onB1) {
    EXPECT_EQ(s->exceptions->find(h).backend, 0u);
  }
  EXPECT_EQ(s->exceptions->size(), elsewhere.size());
  EXPECT_EQ(c.affinity().stats().rebuiltAtStart, 40u);
  EXPECT_EQ(c.affinity().stats().rebuiltInTable, elsewhere.size());

  const Json status = std::get<Json>(c.status());
  const Json& r = status["rebuild"];
  EXPECT_EQ(r["flows"], 40);
  EXPECT_EQ(r["answered"], 1);
  EXPECT_EQ(r["failed"], 2);
  EXPECT_NE(r["backends"][1]["error"].get<std::string>().find("401"), std::string::npos);
  EXPECT_NE(r["backends"][2]["error"].get<std::string>().find("within 300 ms"), std::string::npos);
  bool summary = false;
  for (const Event& e : c.events().since(0, 1000).events) {
    summary |= e.kind == kEventRebuild && e.cause.find("rebuilt 40 flows from 1 of 3") == 0;
  }
  EXPECT_TRUE(summary);
  const std::string metrics = c.metricsText();
  EXPECT_NE(metrics.find("spillway_rebuilt_flows 40"), std::string::npos);
  EXPECT_NE(metrics.find("spillway_rebuild_backend_failed{backend=\"b2\"} 1"), std::string::npos);

  // b1 drains: its table entries go, so every flow it holds is an exception.
  ASSERT_TRUE(std::holds_alternative<Json>(c.backendDrain("b1")));
  ASSERT_TRUE(runUntil(
      c, [&] { return dp_.latest != s; }, now_ + 1000));
  s = dp_.latest;
  ASSERT_NE(s->exceptions, nullptr);
  for (std::uint64_t h : onB1) EXPECT_EQ(s->exceptions->find(h).backend, b1Now);
  EXPECT_EQ(s->exceptions->size(), 40u);
  // A failed backend's flows are not kept (they re-steer, as the flow table's do).
}

TEST_F(PlaneRebuild, WithoutTheRebuildNothingIsAskedNorWaitedFor) {
  test::LoopbackHttpServer b1(test::httpOk("{}"), "127.0.1.1");
  const Config cfg = config(b1.port(), false);
  EXPECT_FALSE(cfg.pools[0].connections.rebuild);
  SnapshotBuilder builder;
  ASSERT_FALSE(builder.setConfig(cfg));
  ControlPlane c(cfg, "test.toml", builder, &dp_, 0);
  dp_.publish(c.takeSnapshot(0));
  EXPECT_TRUE(c.rebuildReady());
  EXPECT_EQ(c.rebuild(), nullptr);
  EXPECT_EQ(b1.requests(), 0u);
}

TEST_F(PlaneRebuild, TheTokenFileIsCheckedWhenTheConfigurationLoads) {
  const auto load = [&](const std::string& keys) {
    std::string text = test::onePoolEstate(1);
    text.insert(text.find("\n[[vip]]"), "\n[pool.connections]\n" + keys);
    return loadConfigFromString(text, "test.toml");
  };
  const std::string token = dir_ + "/agent.token";
  auto ok = load("token_file = \"" + token + "\"\n");
  ASSERT_TRUE(ok) << formatErrors(ok.errors());
  EXPECT_EQ(ok.value().pools[0].connections.token, kToken);  // the newline dropped
  EXPECT_TRUE(ok.value().pools[0].connections.rebuild);
  EXPECT_EQ(ok.value().pools[0].connections.listPath, "/connections");
  const auto error = [&](const std::string& keys) {
    auto r = load(keys);
    return r ? std::string() : formatErrors(r.errors());
  };
  EXPECT_NE(error("rebuild = true\n").find("rebuild = true: needs token_file"), std::string::npos)
      << error("rebuild = true\n");
  EXPECT_NE(error("token_file = \"agent.token\"\n").find("absolute path"), std::string::npos);
  ::chmod(token.c_str(), 0644);
  EXPECT_NE(error("token_file = \"" + token + "\"\n").find("chmod 600"), std::string::npos)
      << error("token_file = \"" + token + "\"\n");
  std::ofstream(token) << "short\n";
  ::chmod(token.c_str(), 0600);
  EXPECT_NE(error("token_file = \"" + token + "\"\n").find("fewer than 16"), std::string::npos);
  std::ofstream(token) << "with a blank inside the token\n";
  EXPECT_NE(error("token_file = \"" + token + "\"\n").find("HTTP header"), std::string::npos);
  EXPECT_NE(error("rebuild_timeout = 11\n").find("rebuild_timeout"), std::string::npos);
}

TEST(KeeperRebuilt, TheBackendsWordBeatsARestoredRecordOfAnotherBackend) {
  char tmpl[] = "/tmp/spillway-rebuilt-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::vector<FlowExceptionRecord> records = {{0xAA, 1, FlowState::Established, 0},
                                                    {0xBB, 3, FlowState::Established, 0}};
  std::ofstream(dir + "/" + kFlowCheckpointFile, std::ios::binary)
      << encodeFlowCheckpoint(kSeed, 1'000, records);
  EventLog events(64);
  AffinityKeeper::Options options;
  options.stateDir = dir;
  options.hashSeed = kSeed;
  AffinityKeeper keeper(options, events);
  (void)keeper.restore(0, 1'000);
  ASSERT_EQ(keeper.stats().restoredAlive, 2u);
  // b2 holds 0xAA (the checkpoint said b1); b3 confirms 0xBB.
  const std::vector<RebuiltFlow> flows = {{0xAA, 2, 0, true}, {0xBB, 3, 0, true}};
  keeper.addRebuilt(flows, 10);
  EXPECT_EQ(keeper.stats().rebuiltOverrode, 1u);
  EXPECT_EQ(keeper.stats().restoredAlive, 1u);
  std::vector<ExceptionEntry> restored;
  keeper.restoredEntries([](std::uint64_t id) { return static_cast<std::uint32_t>(id); }, restored);
  ASSERT_EQ(restored.size(), 1u);
  EXPECT_EQ(restored[0].hash, 0xBBu);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace spillway
