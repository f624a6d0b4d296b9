// A tier over real CLI sockets: fan-out (a change applied where it can be,
// failures named), table fingerprints by backend id, counting differing
// entries through the table.digest command, and spillwayctl --tier itself.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "control/api/cli_server.hpp"
#include "control/backends/snapshot_builder.hpp"
#include "control/backends/table_digest.hpp"
#include "control/plane/control_plane.hpp"
#include "control/tier/tier_client.hpp"
#include "tests/unit/estate_fixture.hpp"
#include "tests/unit/fake_control_api.hpp"
#include "tests/unit/fake_dataplane.hpp"

extern char** environ;

namespace spillway {
namespace {

namespace fs = std::filesystem;

// A fake instance whose VIP "nccl" has the table `ids` (backend ids per slot).
class TableApi : public testing::FakeControlApi {
 public:
  std::vector<std::uint64_t> ids;
  std::uint64_t generation = 5;
  std::atomic<int> chunkRequests{0};

  ApiResult tableDigest(const std::string& vip, std::optional<std::uint32_t> chunk) override {
    if (!vip.empty() && vip != "nccl") return ApiError{"not_found", "no vip " + vip};
    if (!chunk) {
      return Json{{"generation", generation},
                  {"warmup", false},
                  {"tables", Json::array({tableDigestJson("nccl", ids)})}};
    }
    ++chunkRequests;
    auto c = tableChunkJson("nccl", ids, *chunk);
    if (!c) return ApiError{"invalid", "no chunk"};
    return *c;
  }
};

// A table of `size` slots over backend ids 11, 12, 13.
std::vector<std::uint64_t> table(std::size_t size) {
  std::vector<std::uint64_t> t(size);
  for (std::size_t i = 0; i < size; ++i) t[i] = 11 + (i * 7) % 3;
  return t;
}

// N servers on sockets in a temporary directory, pumped on a thread.
class Tier : public ::testing::Test {
 protected:
  void start(std::size_t n) {
    dir_ = fs::temp_directory_path() / ("tier-test-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    for (std::size_t i = 0; i < n; ++i) {
      apis_.push_back(std::make_unique<TableApi>());
      CliServerOptions o;
      o.socketPath = (dir_ / ("lb" + std::to_string(i + 1) + ".sock")).string();
      servers_.push_back(std::make_unique<CliServer>(*apis_.back(), o));
      std::string error;
      ASSERT_TRUE(servers_.back()->open(error)) << error;
      tier_.instances.push_back({"lb" + std::to_string(i + 1), o.socketPath});
    }
    tier_.origin = "test";
    pump_ = std::thread([this] {
      while (!stop_) {
        std::vector<pollfd> fds;
        for (auto& s : servers_) fds.push_back({s->pollFd(), POLLIN, 0});
        ::poll(fds.data(), fds.size(), 10);
        for (auto& s : servers_) s->poll();
      }
    });
  }
  void stop() {
    if (pump_.joinable()) {
      stop_ = true;
      pump_.join();
    }
  }
  void TearDown() override {
    stop();
    servers_.clear();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  fs::path dir_;
  std::vector<std::unique_ptr<TableApi>> apis_;
  std::vector<std::unique_ptr<CliServer>> servers_;
  TierFile tier_;
  std::thread pump_;
  std::atomic<bool> stop_{false};
};

TEST(TableDigest, FingerprintFollowsIdsNotIndices) {
  const auto a = table(65537);
  auto b = a;
  EXPECT_EQ(tableDigestJson("v", a), tableDigestJson("v", b));
  b[40000] = b[40000] == 11 ? 12 : 11;
  const Json da = tableDigestJson("v", a);
  const Json db = tableDigestJson("v", b);
  EXPECT_NE(da["fingerprint"], db["fingerprint"]);
  ASSERT_EQ(da["chunks"].size(), 17u);  // ceil(65537 / 4096)
  for (std::size_t c = 0; c < 17; ++c) {
    EXPECT_EQ(da["chunks"][c] == db["chunks"][c], c != 40000 / kDigestChunkEntries) << c;
  }
  // The same slots over a longer table is another table.
  auto longer = a;
  longer.push_back(0);
  EXPECT_NE(tableDigestJson("v", longer)["fingerprint"], da["fingerprint"]);
}

TEST(TableDigest, ChunkRoundTripAndMalformedChunks) {
  auto t = table(5000);
  t[4097] = 0;
  const auto chunk = tableChunkJson("v", t, 1);
  ASSERT_TRUE(chunk.has_value());
  const DecodedChunk d = decodeTableChunk(*chunk);
  ASSERT_TRUE(d.error.empty()) << d.error;
  EXPECT_EQ(d.ids, std::vector<std::uint64_t>(t.begin() + 4096, t.end()));
  EXPECT_FALSE(tableChunkJson("v", t, 2).has_value());
  EXPECT_EQ(countDiffering(d.ids, std::vector<std::uint64_t>(t.begin() + 4096, t.end())), 0u);

  Json bad = *chunk;
  bad["entries"] = "00z1";
  EXPECT_EQ(decodeTableChunk(bad).error, "chunk entries hold a non-hex character");
  bad["entries"] = "0009";
  EXPECT_EQ(decodeTableChunk(bad).error, "chunk slot names backend 9 of a dictionary of 3");
  bad["entries"] = "001";
  EXPECT_FALSE(decodeTableChunk(bad).error.empty());
  bad = *chunk;
  bad["backends"] = Json::array({"x"});
  EXPECT_FALSE(decodeTableChunk(bad).error.empty());
  EXPECT_FALSE(decodeTableChunk(Json(3)).error.empty());
}

TEST(TableDigest, CountDiffering) {
  const std::vector<std::uint64_t> a{1, 2, 3, 4};
  EXPECT_EQ(countDiffering(a, std::vector<std::uint64_t>{1, 2, 3, 4}), 0u);
  EXPECT_EQ(countDiffering(a, std::vector<std::uint64_t>{1, 9, 3, 0}), 2u);
  EXPECT_EQ(countDiffering(a, std::vector<std::uint64_t>{1, 2}), 2u);
}

// The real control plane: two instances whose configurations list the same
// backends in another order hold them at other indices, yet their digests
// are equal; a drain on one makes them differ.
// tests/data/config/valid/minimal.toml (one VIP "v" of 65537 entries) with
// these backends instead of its own, and no state directory (nothing is
// journaled or checkpointed).
std::string estate(const std::vector<std::string>& order) {
  std::ifstream f(std::string(SPILLWAY_SOURCE_ROOT) + "/tests/data/config/valid/minimal.toml");
  std::string text(std::istreambuf_iterator<char>(f), {});
  text = text.substr(0, text.find("[[backend]]")) + "[control]\nstate_dir = \"\"\n";
  for (const std::string& n : order) {
    text += test::backendToml(n, "10.0.0." + std::to_string(10 + (n.back() - '0')), "a");
  }
  return text;
}

struct Instance {
  explicit Instance(const std::vector<std::string>& order) {
    ConfigResult r = loadConfigFromString(estate(order), "test.toml");
    EXPECT_TRUE(r.ok()) << formatErrors(r.errors());
    Config c = std::move(r).value();
    EXPECT_FALSE(builder.setConfig(c));
    cp = std::make_unique<ControlPlane>(std::move(c), "", builder, &dp, 1000);
    (void)cp->takeSnapshot(1000);
  }
  Json digest(std::optional<std::uint32_t> chunk = std::nullopt) {
    ApiResult r = cp->tableDigest(chunk ? "v" : "", chunk);
    EXPECT_TRUE(std::holds_alternative<Json>(r));
    return std::holds_alternative<Json>(r) ? std::get<Json>(r) : Json();
  }
  SnapshotBuilder builder;
  test::FakeDataplane dp;
  std::unique_ptr<ControlPlane> cp;
};

TEST(TableDigestOfControlPlane, EqualTablesAtOtherIndicesGiveEqualDigests) {
  Instance a({"b1", "b2", "b3"});
  Instance b({"b3", "b1", "b2"});
  const Json showA = std::get<Json>(a.cp->tableShow("v"));
  const Json showB = std::get<Json>(b.cp->tableShow("v"));
  ASSERT_NE(showA["tables"][0]["backends"], showB["tables"][0]["backends"])
      << "precondition: the backends sit at other indices";
  const Json da = a.digest();
  EXPECT_EQ(da["tables"][0]["fingerprint"], b.digest()["tables"][0]["fingerprint"]);
  EXPECT_EQ(da["tables"][0]["table_size"], 65537);
  EXPECT_EQ(da["tables"][0]["chunks"].size(), 17u);
  EXPECT_EQ(decodeTableChunk(a.digest(16)).ids, decodeTableChunk(b.digest(16)).ids);
  EXPECT_EQ(decodeTableChunk(a.digest(16)).ids.size(), 65537u - 16 * 4096);
  EXPECT_TRUE(std::holds_alternative<ApiError>(a.cp->tableDigest("v", 17)));
  EXPECT_TRUE(std::holds_alternative<ApiError>(a.cp->tableDigest("nope", std::nullopt)));

  ASSERT_TRUE(std::holds_alternative<Json>(b.cp->backendDrain("b2")));
  ASSERT_TRUE(b.cp->tick(1100));
  ASSERT_NE(b.cp->takeSnapshot(1100), nullptr);
  const Json db = b.digest();
  EXPECT_NE(da["tables"][0]["fingerprint"], db["tables"][0]["fingerprint"]);
  std::uint32_t differing = 0;
  for (std::uint32_t c = 0; c < 17; ++c) {
    differing +=
        countDiffering(decodeTableChunk(a.digest(c)).ids, decodeTableChunk(b.digest(c)).ids);
  }
  // b2's third of the table moved to b1 and b3.
  EXPECT_GT(differing, 65537u / 4);
  EXPECT_LT(differing, 65537u / 2);
}

// connect() to a server whose backlog is full gives up after the timeout
// instead of blocking (no bound on how long is asserted).
TEST(TierConnect, FullBacklogIsAnErrorNotAHang) {
  const std::string path =
      (fs::temp_directory_path() / ("tier-backlog-" + std::to_string(getpid()) + ".sock")).string();
  const int listener = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  ::unlink(path.c_str());
  ASSERT_EQ(::bind(listener, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 0), 0);
  std::vector<int> fillers;
  bool full = false;
  for (int i = 0; i < 64 && !full; ++i) {
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    full = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 &&
           errno == EAGAIN;
    fillers.push_back(fd);
  }
  ASSERT_TRUE(full) << "the backlog never filled";
  CliClient client;
  std::string error;
  EXPECT_FALSE(client.connect(path, error, std::chrono::milliseconds(50)));
  EXPECT_EQ(error, "cannot connect to " + path + ": the server's backlog stayed full for 50 ms");
  for (const int fd : fillers) ::close(fd);
  ::close(listener);
  ::unlink(path.c_str());
}

TEST_F(Tier, FanOutAppliesWhereItCanAndNamesTheFailures) {
  start(2);
  apis_[1]->replies["backendDrain"] = ApiError{"not_found", "no backend gpu-a1"};
  tier_.instances.push_back({"lb3", (dir_ / "absent.sock").string()});
  const auto outcomes = fanOut(tier_, "backend.drain", Json{{"name", "gpu-a1"}},
                               socketTierCall(std::chrono::seconds(5)));
  stop();
  ASSERT_EQ(outcomes.size(), 3u);
  EXPECT_TRUE(outcomes[0].ok);
  EXPECT_FALSE(outcomes[1].ok);
  EXPECT_EQ(outcomes[1].errorCode, "not_found");
  EXPECT_FALSE(outcomes[2].ok);
  EXPECT_EQ(outcomes[2].errorCode, "connect");
  // Both reachable instances got the command; the failure on lb2 did not
  // keep it from lb1.
  EXPECT_EQ(apis_[0]->calls, std::vector<std::string>{"backendDrain(gpu-a1)"});
  EXPECT_EQ(apis_[1]->calls, std::vector<std::string>{"backendDrain(gpu-a1)"});
  const Json j = fanOutJson(tier_, outcomes);
  EXPECT_EQ(j["lb1"]["ok"], true);
  EXPECT_EQ(j["lb2"]["error"]["code"], "not_found");
  EXPECT_EQ(j["lb3"]["ok"], false);
}

TEST_F(Tier, StatusCountsDifferingEntriesFetchingOnlyDifferingChunks) {
  start(3);
  const auto base = table(65537);
  apis_[0]->ids = base;
  apis_[1]->ids = base;
  apis_[2]->ids = base;
  apis_[2]->generation = 9;
  for (std::size_t slot : {5u, 6u, 60000u}) {
    apis_[2]->ids[slot] = apis_[2]->ids[slot] == 13 ? 11 : 13;
  }
  const Json s = tierStatus(tier_, socketTierCall(std::chrono::seconds(5)));
  stop();
  const Json& v = s["vips"]["nccl"];
  EXPECT_EQ(v["reference_instances"], Json::array({"lb1", "lb2"}));
  EXPECT_EQ(v["agreeing"], 2);
  EXPECT_EQ(v["reporting"], 3);
  EXPECT_EQ(s["instances"]["lb1"]["vips"]["nccl"]["differing_entries"], 0);
  EXPECT_EQ(s["instances"]["lb3"]["vips"]["nccl"]["differing_entries"], 3);
  EXPECT_EQ(s["instances"]["lb3"]["vips"]["nccl"]["reference"], false);
  EXPECT_EQ(s["instances"]["lb3"]["generation"], 9);
  EXPECT_EQ(s["instances"]["lb1"]["vips"]["nccl"]["fingerprint"],
            s["instances"]["lb2"]["vips"]["nccl"]["fingerprint"]);
  // Two differing chunks (0 and 14), each fetched from lb3 and the reference.
  EXPECT_EQ(apis_[2]->chunkRequests, 2);
  EXPECT_EQ(apis_[0]->chunkRequests + apis_[1]->chunkRequests, 2);
}

TEST_F(Tier, StatusReportsAnUnreachableInstanceAndAMalformedReply) {
  start(2);
  apis_[0]->ids = table(13);
  apis_[1]->ids = table(13);
  apis_[1]->ids[3] = 0;
  tier_.instances.push_back({"lb3", (dir_ / "absent.sock").string()});
  Json s = tierStatus(tier_, socketTierCall(std::chrono::seconds(5)));
  EXPECT_EQ(s["instances"]["lb3"]["ok"], false);
  EXPECT_NE(s["instances"]["lb3"]["error"].get<std::string>().find("connect"), std::string::npos);
  // A tie: the first instance in file order is the reference.
  EXPECT_EQ(s["vips"]["nccl"]["reference_instances"], Json::array({"lb1"}));
  EXPECT_EQ(s["instances"]["lb2"]["vips"]["nccl"]["differing_entries"], 1);

  // A digest reply without tables, and a chunk reply that is not one.
  const TierCall broken = [](const TierInstance& i, std::string_view, const Json& args) {
    TierOutcome o;
    o.ok = true;
    if (args.contains("chunk")) {
      o.result = Json{{"entries", 5}};
    } else if (i.name == "lb1") {
      o.result = Json{{"tables", 7}};
    } else if (i.name == "lb5") {
      o.result = Json{{"tables", Json::array({tableDigestJson("nccl", table(13))})}};
      o.result["tables"][0]["table_size"] = 1u << 30;  // would be 262,144 chunks
    } else {
      o.result = Json{{"tables", Json::array({tableDigestJson("nccl", table(13))})}};
      if (i.name == "lb3") {
        o.result["tables"][0]["fingerprint"] = "0";
        o.result["tables"][0]["chunks"][0] = "0";
      }
      if (i.name == "lb4") o.result["tables"][0]["fingerprint"] = "1";  // chunks all equal
    }
    return o;
  };
  tier_.instances.push_back({"lb4", (dir_ / "lb4.sock").string()});
  tier_.instances.push_back({"lb5", (dir_ / "lb5.sock").string()});
  s = tierStatus(tier_, broken);
  stop();
  EXPECT_EQ(s["instances"]["lb4"]["vips"]["nccl"]["differing_error"],
            "the fingerprint differs from the reference's but no chunk hash does");
  EXPECT_EQ(s["instances"]["lb1"]["error"], "table.digest reply has no \"tables\" array");
  EXPECT_EQ(s["instances"]["lb5"]["error"],
            "table.digest reply for nccl: 1 chunk hashes for a table of 1073741824 entries");
  EXPECT_TRUE(s["instances"]["lb3"]["vips"]["nccl"]["differing_entries"].is_null());
  EXPECT_NE(s["instances"]["lb3"]["vips"]["nccl"]["differing_error"].get<std::string>().find(
                "chunk reply needs"),
            std::string::npos);
}

TEST(TierIntentStatus, InstancesAreGroupedByTheirIntentDigest) {
  TierFile tier;
  tier.instances = {
      {"lb1", "/nonexistent/1"}, {"lb2", "/nonexistent/2"}, {"lb3", "/nonexistent/3"}};
  const TierCall call = [](const TierInstance& i, std::string_view, const Json&) {
    TierOutcome o;
    o.ok = true;
    o.result = Json{{"tables", Json::array()}, {"generation", 1}, {"warmup", false}};
    const std::string digest = i.name == "lb3" ? "00000000000000bb" : "00000000000000aa";
    o.result["intent"] = Json{{"digest", digest},
                              {"entries", i.name == "lb3" ? 1 : 2},
                              {"agreed", i.name != "lb3"},
                              {"peers", Json::object()}};
    return o;
  };
  const Json s = tierStatus(tier, call);
  EXPECT_EQ(s["intent"]["agree"], false);
  EXPECT_EQ(s["intent"]["reporting"], 3);
  EXPECT_EQ(s["intent"]["digests"]["00000000000000aa"], Json::array({"lb1", "lb2"}));
  EXPECT_EQ(s["intent"]["digests"]["00000000000000bb"], Json::array({"lb3"}));
  EXPECT_EQ(s["instances"]["lb3"]["intent"]["entries"], 1);
  // Instances without peers report no intent: nothing to compare, agreement.
  const TierCall plain = [](const TierInstance&, std::string_view, const Json&) {
    TierOutcome o;
    o.ok = true;
    o.result = Json{{"tables", Json::array()}, {"generation", 1}, {"warmup", false}};
    return o;
  };
  const Json p = tierStatus(tier, plain);
  EXPECT_EQ(p["intent"]["agree"], true);
  EXPECT_EQ(p["intent"]["reporting"], 0);
}

// spillwayctl --tier end to end: the per-instance JSON, the exit status, and
// the failed instances on stderr.
struct CtlRun {
  int exitCode = -1;
  std::string out;
  std::string err;
};

CtlRun runCtl(const std::vector<std::string>& args) {
  const char* binary = std::getenv("SPILLWAYCTL");
  CtlRun run;
  if (binary == nullptr) return run;
  const fs::path out = fs::temp_directory_path() / ("tier-ctl-out-" + std::to_string(getpid()));
  const fs::path err = fs::temp_directory_path() / ("tier-ctl-err-" + std::to_string(getpid()));
  std::vector<std::string> argv{binary};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid = -1;
  if (posix_spawn(&pid, binary, &actions, nullptr, cargv.data(), environ) == 0) {
    int status = 0;
    waitpid(pid, &status, 0);
    run.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  posix_spawn_file_actions_destroy(&actions);
  const auto slurp = [](const fs::path& p) {
    std::ifstream f(p);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  run.out = slurp(out);
  run.err = slurp(err);
  fs::remove(out);
  fs::remove(err);
  return run;
}

TEST_F(Tier, SpillwayctlTierFanOutAndStatus) {
  if (std::getenv("SPILLWAYCTL") == nullptr) GTEST_SKIP() << "SPILLWAYCTL not set";
  start(2);
  apis_[0]->ids = table(101);
  apis_[1]->ids = table(101);
  apis_[1]->replies["backendDrain"] = ApiError{"not_found", "no backend gpu-a1"};
  const fs::path file = dir_ / "tier.conf";
  {
    std::ofstream f(file);
    for (const auto& i : tier_.instances) f << i.name << " " << i.socketPath << "\n";
  }
  CtlRun r = runCtl({"--tier", file.string(), "--json", "backend", "drain", "gpu-a1"});
  EXPECT_EQ(r.exitCode, 1) << r.err;
  const Json j = Json::parse(r.out);
  EXPECT_EQ(j["lb1"]["ok"], true);
  EXPECT_EQ(j["lb2"]["error"]["code"], "not_found");
  EXPECT_NE(r.err.find("backend.drain failed on lb2; applied on lb1"), std::string::npos) << r.err;

  r = runCtl({"--tier", file.string(), "backend", "drain", "gpu-a1"});
  EXPECT_EQ(r.exitCode, 1) << r.err;
  EXPECT_NE(r.out.find("lb1: ok\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lb2: error: not_found: no backend gpu-a1\n"), std::string::npos) << r.out;

  r = runCtl({"--tier", file.string(), "tier", "status"});
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_NE(r.out.find("2 of 2 instances agree"), std::string::npos) << r.out;

  apis_[1]->ids[7] = 0;  // read by the server thread only after this write (the next request)
  r = runCtl({"--tier", file.string(), "--json", "tier", "status"});
  EXPECT_EQ(r.exitCode, 4) << r.err;
  const Json status = Json::parse(r.out);
  EXPECT_EQ(status["vips"]["nccl"]["agreeing"], 1);
  EXPECT_EQ(status["instances"]["lb2"]["vips"]["nccl"]["differing_entries"], 1);

  r = runCtl({"tier", "status"});
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_NE(r.err.find("needs --tier"), std::string::npos) << r.err;

  const fs::path bad = dir_ / "bad.conf";
  std::ofstream(bad) << "lb1 /a.sock\nlb1 /b.sock\n";
  r = runCtl({"--tier", bad.string(), "status"});
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_NE(r.err.find("bad.conf:2: duplicate instance name lb1"), std::string::npos) << r.err;
  stop();
}

}  // namespace
}  // namespace spillway
