// The CLI socket on a real Unix socket in a temporary directory, and the
// built spillwayctl against it: round trips, many clients at once, clients
// that send garbage, hang up mid-way or never read, the socket file's mode,
// group, stale-file and live-file handling, peer credentials, and the
// authorisation gate for a peer that is not root.
//
// Single-threaded and without sleeps: the test pumps the server (poll() on
// its fd with a short slice) until what it waits for happened or a
// deadline passed.
#include "control/api/cli_server.hpp"

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "control/api/commands.hpp"
#include "control/sys/refusal_summary.hpp"
#include "fake_control_api.hpp"

extern char** environ;

namespace spillway {
namespace {

namespace fs = std::filesystem;
using testing::FakeControlApi;
using Clock = std::chrono::steady_clock;

constexpr auto kDeadline = std::chrono::seconds(20);

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/spillway-cli-XXXXXX";
    const char* made = mkdtemp(pattern);
    path_ = made != nullptr ? made : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A bare SOCK_SEQPACKET client, so tests can misbehave on purpose.
class RawClient {
 public:
  explicit RawClient(const std::string& path) {
    fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
    connected_ = ::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~RawClient() { close(); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  [[nodiscard]] bool connected() const { return connected_; }
  [[nodiscard]] int fd() const { return fd_; }
  bool send(std::string_view message) {
    return ::send(fd_, message.data(), message.size(), MSG_NOSIGNAL | MSG_DONTWAIT) ==
           static_cast<ssize_t>(message.size());
  }
  // A whole message if one is waiting; "" on end of stream.
  std::optional<std::string> tryReceive() {
    char probe = 0;
    const ssize_t size = recv(fd_, &probe, 1, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT);
    if (size < 0) return std::nullopt;
    std::string out(static_cast<std::size_t>(size), '\0');
    const ssize_t got = recv(fd_, out.data(), out.size(), MSG_DONTWAIT);
    if (got < 0) return std::nullopt;
    out.resize(static_cast<std::size_t>(got));
    return out;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// Polls the server until `done` or the deadline; extra fds wake it early.
bool pumpUntil(CliServer& server, const std::function<bool()>& done,
               std::vector<int> extraFds = {}) {
  const auto deadline = Clock::now() + kDeadline;
  for (;;) {
    server.poll();
    if (done()) return true;
    if (Clock::now() >= deadline) return false;
    std::vector<pollfd> fds{{server.pollFd(), POLLIN, 0}};
    for (int fd : extraFds) fds.push_back({fd, POLLIN, 0});
    (void)::poll(fds.data(), fds.size(), 10);
  }
}

std::optional<std::string> awaitReply(CliServer& server, RawClient& client) {
  std::optional<std::string> reply;
  pumpUntil(server, [&] { return (reply = client.tryReceive()).has_value(); }, {client.fd()});
  return reply;
}

Reply mustParse(const std::optional<std::string>& message) {
  EXPECT_TRUE(message.has_value());
  if (!message) return Reply{};
  const std::optional<Reply> reply = parseReply(*message);
  EXPECT_TRUE(reply.has_value()) << *message;
  return reply.value_or(Reply{});
}

class CliServerTest : public ::testing::Test {
 protected:
  CliServerOptions options() {
    CliServerOptions o;
    o.socketPath = dir_.path() + "/run/spillway.sock";
    o.log = [this](std::string_view line) { log_.emplace_back(line); };
    return o;
  }

  void open(CliServer& server) {
    std::string error;
    ASSERT_TRUE(server.open(error)) << error;
  }

  TempDir dir_;
  FakeControlApi api_;
  std::vector<std::string> log_;
};

TEST_F(CliServerTest, RequestReplyRoundTrip) {
  CliServer server(api_, options());
  open(server);
  RawClient client(server.socketPath());
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.send(makeRequest("status")));
  const Reply reply = mustParse(awaitReply(server, client));
  EXPECT_TRUE(reply.ok);
  EXPECT_EQ(reply.result["generation"], 7);
  EXPECT_EQ(api_.calls, (std::vector<std::string>{"status()"}));

  // The connection stays open for the next request.
  ASSERT_TRUE(client.send(makeRequest("vip.show", Json{{"name", "nccl"}})));
  EXPECT_TRUE(mustParse(awaitReply(server, client)).ok);
  EXPECT_EQ(api_.calls.back(), "vipShow(nccl)");
}

TEST_F(CliServerTest, SocketFileIsMode0660InACreatedDirectory) {
  CliServer server(api_, options());
  open(server);
  struct stat st {};
  ASSERT_EQ(lstat(server.socketPath().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ(st.st_gid, getegid());
  server.close();
  EXPECT_FALSE(fs::exists(server.socketPath())) << "close() removes its socket file";
}

TEST_F(CliServerTest, SocketGroupIsApplied) {
  if (geteuid() != 0) GTEST_SKIP() << "chown to another group needs root";
  const group* g = getgrnam("daemon");
  if (g == nullptr) g = getgrgid(1);
  if (g == nullptr) GTEST_SKIP() << "no group 'daemon' or gid 1 on this host";
  const gid_t gid = g->gr_gid;
  const std::string name = g->gr_name;
  for (const std::string& spelling : {name, std::to_string(gid)}) {
    CliServerOptions o = options();
    o.socketGroup = spelling;
    CliServer server(api_, o);
    open(server);
    struct stat st {};
    ASSERT_EQ(lstat(server.socketPath().c_str(), &st), 0);
    EXPECT_EQ(st.st_gid, gid) << spelling;
    EXPECT_EQ(st.st_mode & 07777, 0660u);
    const auto& gids = server.policy().gids;
    EXPECT_NE(std::find(gids.begin(), gids.end(), gid), gids.end()) << "the group may write";
  }
}

TEST_F(CliServerTest, UnknownGroupIsAnError) {
  CliServerOptions o = options();
  o.socketGroup = "no-such-group-spillway";
  CliServer server(api_, o);
  std::string error;
  EXPECT_FALSE(server.open(error));
  EXPECT_NE(error.find("no-such-group-spillway"), std::string::npos) << error;
  EXPECT_FALSE(server.isOpen());
  EXPECT_FALSE(fs::exists(o.socketPath));
}

TEST_F(CliServerTest, StaleSocketIsReplacedLiveOneIsNot) {
  const CliServerOptions o = options();
  fs::create_directories(fs::path(o.socketPath).parent_path());
  {
    // A socket file nobody listens on, as a crashed daemon leaves it.
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, o.socketPath.c_str(), sizeof addr.sun_path - 1);
    ASSERT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0);
    ::close(fd);
  }
  ASSERT_TRUE(fs::exists(o.socketPath));
  CliServer first(api_, o);
  open(first);

  CliServer second(api_, o);
  std::string error;
  EXPECT_FALSE(second.open(error));
  EXPECT_NE(error.find("another process is listening"), std::string::npos) << error;
  second.close();  // must not remove the first one's file
  RawClient client(o.socketPath);
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.send(makeRequest("status")));
  EXPECT_TRUE(mustParse(awaitReply(first, client)).ok);
}

TEST_F(CliServerTest, RegularFileIsNotReplaced) {
  const CliServerOptions o = options();
  fs::create_directories(fs::path(o.socketPath).parent_path());
  {
    std::FILE* f = std::fopen(o.socketPath.c_str(), "w");
    std::fclose(f);
  }
  CliServer server(api_, o);
  std::string error;
  EXPECT_FALSE(server.open(error));
  EXPECT_NE(error.find("not a socket"), std::string::npos) << error;
  EXPECT_TRUE(fs::is_regular_file(o.socketPath));
}

TEST_F(CliServerTest, PeerCredentialsAreLoggedWithWrites) {
  CliServer server(api_, options());
  open(server);
  RawClient client(server.socketPath());
  ASSERT_TRUE(client.send(makeRequest("backend.drain", Json{{"name", "gpu-a1"}})));
  EXPECT_TRUE(mustParse(awaitReply(server, client)).ok);
  ASSERT_TRUE(client.send(makeRequest("backend.list")));
  EXPECT_TRUE(mustParse(awaitReply(server, client)).ok);
  ASSERT_EQ(log_.size(), 1u) << "reads are not logged";
  const std::string expected =
      "pid=" + std::to_string(getpid()) + " uid=" + std::to_string(geteuid()) +
      " gid=" + std::to_string(getegid()) + R"( backend.drain {"name":"gpu-a1"}: ok)";
  EXPECT_NE(log_[0].find(expected), std::string::npos) << log_[0];
}

TEST_F(CliServerTest, ConcurrentClientsEachGetTheirOwnReply) {
  CliServer server(api_, options());
  open(server);
  constexpr int kClients = 24;
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<RawClient>(server.socketPath()));
    ASSERT_TRUE(clients.back()->connected());
  }
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < kClients; ++i) {
      ASSERT_TRUE(
          clients[i]->send(makeRequest("vip.show", Json{{"name", "vip-" + std::to_string(i)}})));
    }
    std::vector<std::optional<std::string>> replies(kClients);
    ASSERT_TRUE(pumpUntil(server, [&] {
      bool all = true;
      for (int i = 0; i < kClients; ++i) {
        if (!replies[i]) replies[i] = clients[i]->tryReceive();
        all = all && replies[i].has_value();
      }
      return all;
    }));
    for (int i = 0; i < kClients; ++i) {
      const Reply r = mustParse(replies[i]);
      ASSERT_TRUE(r.ok);
      EXPECT_EQ(r.result["name"], "vip-" + std::to_string(i));
    }
  }
  EXPECT_EQ(server.clientCount(), static_cast<std::size_t>(kClients));
  EXPECT_EQ(api_.calls.size(), static_cast<std::size_t>(3 * kClients));
}

TEST_F(CliServerTest, GarbageFromOneClientDoesNotAffectAnother) {
  CliServer server(api_, options());
  open(server);
  RawClient bad(server.socketPath());
  RawClient good(server.socketPath());

  ASSERT_TRUE(bad.send(std::string("\xff\x00\x01garbage{{{", 12)));
  EXPECT_EQ(mustParse(awaitReply(server, bad)).errorCode, "bad_json");
  // Oversized: more than the request limit in one message.
  ASSERT_TRUE(bad.send(std::string(kMaxRequestBytes + 4096, '{')));
  EXPECT_EQ(mustParse(awaitReply(server, bad)).errorCode, "too_large");
  ASSERT_TRUE(bad.send(R"({"v":1,"cmd":"backend.remove","args":{"name":7}})"));
  EXPECT_EQ(mustParse(awaitReply(server, bad)).errorCode, "bad_request");
  EXPECT_TRUE(api_.calls.empty());

  ASSERT_TRUE(good.send(makeRequest("backend.drain", Json{{"name", "gpu-a1"}})));
  EXPECT_TRUE(mustParse(awaitReply(server, good)).ok);
  EXPECT_EQ(api_.calls, (std::vector<std::string>{"backendDrain(gpu-a1)"}));

  // The bad client's connection survived its bad requests.
  ASSERT_TRUE(bad.send(makeRequest("status")));
  EXPECT_TRUE(mustParse(awaitReply(server, bad)).ok);
}

TEST_F(CliServerTest, ClientsHangingUpMidWayAreDropped) {
  CliServer server(api_, options());
  open(server);
  {
    RawClient early(server.socketPath());  // connects and leaves
  }
  {
    RawClient asker(server.socketPath());  // asks and leaves before the reply
    ASSERT_TRUE(asker.send(makeRequest("status")));
  }
  ASSERT_TRUE(pumpUntil(server, [&] { return server.clientCount() == 0 && !api_.calls.empty(); }));
  RawClient good(server.socketPath());
  ASSERT_TRUE(good.send(makeRequest("health")));
  EXPECT_TRUE(mustParse(awaitReply(server, good)).ok);
}

TEST_F(CliServerTest, LargeRepliesArriveWhole) {
  CliServer server(api_, options());
  open(server);
  const std::string big(1 << 20, 'x');
  api_.replies["configDump"] = Json{{"text", big}};
  RawClient client(server.socketPath());
  ASSERT_TRUE(client.send(makeRequest("config.dump")));
  const Reply r = mustParse(awaitReply(server, client));
  ASSERT_TRUE(r.ok) << r.errorCode << ": " << r.errorMessage;
  EXPECT_EQ(r.result["text"].get<std::string>().size(), big.size());
}

TEST_F(CliServerTest, AClientThatNeverReadsDoesNotBlockOthers) {
  CliServer server(api_, options());
  open(server);
  api_.replies["configDump"] = Json{{"text", std::string(1 << 20, 'x')}};
  RawClient hog(server.socketPath());
  for (int i = 0; i < 32; ++i) {
    if (!hog.send(makeRequest("config.dump"))) break;  // its send buffer may fill first
  }
  RawClient good(server.socketPath());
  ASSERT_TRUE(good.send(makeRequest("status")));
  EXPECT_TRUE(mustParse(awaitReply(server, good)).ok);
  EXPECT_LT(api_.calls.size(), 33u);
}

TEST_F(CliServerTest, TooManyClientsAreToldBusy) {
  CliServerOptions o = options();
  o.maxClients = 2;
  CliServer server(api_, o);
  open(server);
  RawClient a(server.socketPath());
  RawClient b(server.socketPath());
  ASSERT_TRUE(pumpUntil(server, [&] { return server.clientCount() == 2; }));
  RawClient c(server.socketPath());
  const Reply busy = mustParse(awaitReply(server, c));
  EXPECT_EQ(busy.errorCode, "busy");
  EXPECT_EQ(server.clientCount(), 2u);
  ASSERT_TRUE(a.send(makeRequest("status")));
  EXPECT_TRUE(mustParse(awaitReply(server, a)).ok);
}

// Clients churning against a full server: each is told busy, and the log
// (spillwayd's stderr) gets one line when the refusals start and then one
// summary per interval, not a line per refused client.
TEST_F(CliServerTest, RefusedClientsAreSummarisedNotLoggedOneByOne) {
  CliServerOptions o = options();
  o.maxClients = 2;
  auto t = std::chrono::steady_clock::time_point{} + std::chrono::hours(1);
  o.clock = [&] { return t; };
  o.firstRequestTimeout = std::chrono::hours(10);
  o.idleTimeout = std::chrono::hours(10);
  CliServer server(api_, o);
  open(server);
  RawClient a(server.socketPath());
  RawClient b(server.socketPath());
  ASSERT_TRUE(pumpUntil(server, [&] { return server.clientCount() == 2; }));
  for (int i = 0; i < 50; ++i) {
    RawClient c(server.socketPath());
    EXPECT_EQ(mustParse(awaitReply(server, c)).errorCode, "busy");
  }
  std::size_t refusalLines = 0;
  for (const std::string& line : log_) refusalLines += line.find("refused") != std::string::npos;
  EXPECT_EQ(refusalLines, 1u);
  t += std::chrono::seconds(11);
  server.poll();
  ASSERT_FALSE(log_.empty());
  EXPECT_NE(log_.back().find("cli: refused 49 more"), std::string::npos) << log_.back();
  EXPECT_NE(log_.back().find("busy: all client slots taken: 49"), std::string::npos) << log_.back();
}

// The summary's own rules: the first refusal of a spell at once, the rest
// once an interval; a quiet interval ends the spell; memory stays bounded
// whatever the sources and reasons.
TEST(RefusalSummary, FirstAtOnceThenOneLineAnIntervalWithBoundedMemory) {
  RefusalSummary s("peer listener", 10000);
  const auto first = s.note(100, "10.0.0.1", "bad");
  ASSERT_TRUE(first.has_value());
  EXPECT_NE(first->find("peer listener: refused 10.0.0.1: bad"), std::string::npos);
  for (int i = 0; i < 1000; ++i) {
    EXPECT_FALSE(s.note(200, "10.0.1." + std::to_string(i), "reason " + std::to_string(i % 20)));
  }
  EXPECT_FALSE(s.flush(10099).has_value());  // not yet an interval
  const auto summary = s.flush(10100);
  ASSERT_TRUE(summary.has_value());
  EXPECT_NE(summary->find("refused 1000 more in the last 10 s from 64+ source(s)"),
            std::string::npos)
      << *summary;
  EXPECT_NE(summary->find("other: "), std::string::npos) << "reasons beyond 8 are pooled";
  EXPECT_LT(summary->size(), 600u);
  EXPECT_FALSE(s.flush(20100).has_value());  // a quiet interval: nothing, and the spell ends
  EXPECT_TRUE(s.note(20200, "10.0.0.1", "bad").has_value()) << "a new spell starts at once";
  EXPECT_EQ(s.total(), 1002u);
}

// Idle connections of a socket-group member fill every slot for reads: a
// read is told busy (readably, not reset), a change still gets a change
// slot, root still gets a root slot, and the connections that never asked
// anything go after firstRequestTimeout.
TEST_F(CliServerTest, IdleConnectionsLeaveSlotsForChangesAndRoot) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run clients as another user";
  Clock::time_point now = Clock::now();
  CliServerOptions o = options();
  o.maxClients = 6;
  o.rootSlots = 1;
  o.changeSlots = 1;
  o.policy.uids.push_back(65534);  // the group member stands in as uid 65534
  o.clock = [&] { return now; };
  CliServer server(api_, o);
  open(server);
  ASSERT_EQ(chmod(server.socketPath().c_str(), 0666), 0);
  ASSERT_EQ(chmod(fs::path(server.socketPath()).parent_path().c_str(), 0755), 0);
  ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);

  int toChild[2];
  int fromChild[2];
  ASSERT_EQ(pipe2(toChild, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(fromChild, O_CLOEXEC), 0);
  ASSERT_EQ(fcntl(fromChild[0], F_SETFL, O_NONBLOCK), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(toChild[1]);
    ::close(fromChild[0]);
    if (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(10);
    std::vector<std::unique_ptr<RawClient>> idle;
    for (int i = 0; i < 4; ++i) idle.push_back(std::make_unique<RawClient>(server.socketPath()));
    char go = 0;
    if (::write(fromChild[1], "r", 1) != 1 || ::read(toChild[0], &go, 1) != 1) _exit(11);
    std::string out;
    const auto ask = [&](CliClient& client, const std::string& request) {
      std::string error;
      std::string reply;
      if (!client.connect(server.socketPath(), error, std::chrono::seconds(20))) _exit(12);
      if (!client.call(request, reply, std::chrono::seconds(20), error)) reply = "ERROR " + error;
      out += reply + "\n";
    };
    CliClient reader;
    ask(reader, makeRequest("status"));  // a read in the change slot
    reader.close();
    CliClient changer;
    ask(changer, makeRequest("backend.drain", Json{{"name", "gpu-a1"}}));  // kept open
    CliClient late;
    ask(late, makeRequest("status"));  // no slot left but root's
    const bool ok =
        ::write(fromChild[1], out.data(), out.size()) == static_cast<ssize_t>(out.size());
    if (::read(toChild[0], &go, 1) != 1) _exit(14);  // hold the connections until told
    _exit(ok ? 0 : 13);
  }
  ::close(toChild[0]);
  ::close(fromChild[1]);
  std::string output;
  const auto readChild = [&] {
    char buffer[4096];
    ssize_t n = 0;
    while ((n = ::read(fromChild[0], buffer, sizeof buffer)) > 0) output.append(buffer, n);
  };
  ASSERT_TRUE(pumpUntil(server,
                        [&] {
                          readChild();
                          return output == "r" && server.clientCount() == 4;
                        },
                        {fromChild[0]}));
  output.clear();
  ASSERT_EQ(::write(toChild[1], "g", 1), 1);
  ASSERT_TRUE(pumpUntil(server,
                        [&] {
                          readChild();
                          return std::count(output.begin(), output.end(), '\n') == 3;
                        },
                        {fromChild[0]}));

  std::vector<std::string> lines;
  for (std::size_t start = 0, nl; (nl = output.find('\n', start)) != std::string::npos;
       start = nl + 1) {
    lines.push_back(output.substr(start, nl - start));
  }
  ASSERT_EQ(lines.size(), 3u) << output;
  const Reply reader = mustParse(lines[0]);
  EXPECT_EQ(reader.errorCode, "busy") << lines[0];
  EXPECT_NE(reader.errorMessage.find("try again"), std::string::npos) << lines[0];
  EXPECT_TRUE(mustParse(lines[1]).ok) << lines[1];
  const Reply late = mustParse(lines[2]);
  EXPECT_EQ(late.errorCode, "busy") << lines[2];
  EXPECT_NE(late.errorMessage.find("5 CLI connections"), std::string::npos) << lines[2];
  EXPECT_EQ(api_.calls, (std::vector<std::string>{"backendDrain(gpu-a1)"}));

  // Root takes the slot kept for it.
  RawClient root(server.socketPath());
  ASSERT_TRUE(root.send(makeRequest("status")));
  EXPECT_TRUE(mustParse(awaitReply(server, root)).ok);
  EXPECT_EQ(server.clientCount(), 6u);

  // The connections that never asked anything, and the change slot, go
  // after firstRequestTimeout; root's served connection stays.
  now += o.firstRequestTimeout;
  server.poll();
  EXPECT_EQ(server.clientCount(), 1u);

  ASSERT_EQ(::write(toChild[1], "q", 1), 1);
  int status = 0;
  ASSERT_TRUE(pumpUntil(server, [&] { return waitpid(child, &status, WNOHANG) == child; }));
  ::close(toChild[1]);
  ::close(fromChild[0]);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST_F(CliServerTest, IdleClientsAreClosed) {
  Clock::time_point now = Clock::now();
  CliServerOptions o = options();
  o.idleTimeout = std::chrono::seconds(30);
  o.clock = [&] { return now; };
  CliServer server(api_, o);
  open(server);
  // Served once, then idle: closed after idleTimeout.
  RawClient client(server.socketPath());
  ASSERT_TRUE(client.send(makeRequest("status")));
  EXPECT_TRUE(mustParse(awaitReply(server, client)).ok);
  now += std::chrono::seconds(29);
  server.poll();
  EXPECT_EQ(server.clientCount(), 1u);
  now += std::chrono::seconds(1);
  server.poll();
  EXPECT_EQ(server.clientCount(), 0u);
  // Never asked anything: closed after firstRequestTimeout.
  RawClient silent(server.socketPath());
  ASSERT_TRUE(pumpUntil(server, [&] { return server.clientCount() == 1; }));
  now += o.firstRequestTimeout - std::chrono::milliseconds(1);
  server.poll();
  EXPECT_EQ(server.clientCount(), 1u);
  now += std::chrono::milliseconds(1);
  server.poll();
  EXPECT_EQ(server.clientCount(), 0u);
}

// A peer that is neither root nor in the group: reads work, writes are
// refused and logged, nothing changes. The socket is opened to everyone
// (0666) here so that the second gate is what is tested.
TEST_F(CliServerTest, NonRootPeerMayReadButNotWrite) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another user";
  CliServer server(api_, options());
  open(server);
  ASSERT_EQ(chmod(server.socketPath().c_str(), 0666), 0);
  ASSERT_EQ(chmod(fs::path(server.socketPath()).parent_path().c_str(), 0755), 0);
  ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);

  int pipeFds[2];
  ASSERT_EQ(pipe2(pipeFds, O_CLOEXEC), 0);
  ASSERT_EQ(fcntl(pipeFds[0], F_SETFL, O_NONBLOCK), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipeFds[0]);
    if (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(10);
    CliClient client;
    std::string error;
    if (!client.connect(server.socketPath(), error)) _exit(11);
    std::string out;
    for (const std::string& request :
         {makeRequest("status"), makeRequest("backend.drain", Json{{"name", "gpu-a1"}})}) {
      std::string reply;
      if (!client.call(request, reply, std::chrono::seconds(20), error)) _exit(12);
      out += reply + "\n";
    }
    const bool ok = ::write(pipeFds[1], out.data(), out.size()) == static_cast<ssize_t>(out.size());
    _exit(ok ? 0 : 13);
  }
  ::close(pipeFds[1]);
  std::string output;
  int status = 0;
  bool exited = false;
  ASSERT_TRUE(pumpUntil(server,
                        [&] {
                          char buffer[4096];
                          ssize_t n = 0;
                          while ((n = ::read(pipeFds[0], buffer, sizeof buffer)) > 0)
                            output.append(buffer, n);
                          if (!exited) exited = waitpid(child, &status, WNOHANG) == child;
                          return exited && n == 0;
                        },
                        {pipeFds[0]}));
  ::close(pipeFds[0]);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  const auto newline = output.find('\n');
  ASSERT_NE(newline, std::string::npos) << output;
  EXPECT_TRUE(mustParse(output.substr(0, newline)).ok);
  const Reply refused = mustParse(output.substr(newline + 1, output.size() - newline - 2));
  EXPECT_EQ(refused.errorCode, "forbidden");
  EXPECT_EQ(api_.calls, (std::vector<std::string>{"status()"}));
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_NE(log_[0].find("uid=65534"), std::string::npos) << log_[0];
  EXPECT_NE(log_[0].find(": forbidden"), std::string::npos) << log_[0];
}

TEST(CliServerOptions, FromConfig) {
  ControlConfig config;
  EXPECT_EQ(CliServerOptions::fromConfig(config).socketPath, "/run/spillway/spillway.sock");
  config.socketPath = "/tmp/x.sock";
  config.socketGroup = "spillway";
  int logged = 0;
  const CliServerOptions o =
      CliServerOptions::fromConfig(config, [&](std::string_view) { ++logged; });
  EXPECT_EQ(o.socketPath, "/tmp/x.sock");
  EXPECT_EQ(o.socketGroup, "spillway");
  ASSERT_TRUE(static_cast<bool>(o.log));
  o.log("x");
  EXPECT_EQ(logged, 1);
}

TEST_F(CliServerTest, CliClientReportsWhichSocketCannotBeReached) {
  CliClient client;
  std::string error;
  const std::string path = dir_.path() + "/absent.sock";
  EXPECT_FALSE(client.connect(path, error));
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("No such file"), std::string::npos) << error;
}

// --- spillwayctl against the server ---------------------------------------------

std::string spillwayctlPath() {
  if (const char* env = std::getenv("SPILLWAYCTL")) return env;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return (self.parent_path().parent_path() / "src" / "control" / "spillwayctl").string();
}

struct CtlRun {
  int exitCode = -1;
  std::string out;
  std::string err;
};

class SpillwayctlTest : public CliServerTest {
 protected:
  void SetUp() override {
    binary_ = spillwayctlPath();
    if (!fs::exists(binary_)) GTEST_SKIP() << "spillwayctl not built at " << binary_;
    server_ = std::make_unique<CliServer>(api_, options());
    open(*server_);
  }

  // Runs spillwayctl with `args` against the server, pumping it meanwhile.
  CtlRun ctl(std::vector<std::string> args, bool withSocket = true) {
    std::vector<std::string> argv{binary_};
    if (withSocket) {
      argv.push_back("--socket");
      argv.push_back(server_->socketPath());
    }
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);

    int outPipe[2];
    int errPipe[2];
    EXPECT_EQ(pipe2(outPipe, O_CLOEXEC | O_NONBLOCK), 0);
    EXPECT_EQ(pipe2(errPipe, O_CLOEXEC | O_NONBLOCK), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, outPipe[1], 1);
    posix_spawn_file_actions_adddup2(&actions, errPipe[1], 2);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, binary_.c_str(), &actions, nullptr, cargv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(outPipe[1]);
    ::close(errPipe[1]);
    CtlRun run;
    EXPECT_EQ(rc, 0);
    int status = 0;
    bool exited = rc != 0;
    const auto drain = [](int fd, std::string& into) {
      char buffer[4096];
      ssize_t n = 0;
      while ((n = ::read(fd, buffer, sizeof buffer)) > 0) into.append(buffer, n);
      return n == 0;  // end of file
    };
    bool outDone = false;
    bool errDone = false;
    const bool finished = pumpUntil(*server_,
                                    [&] {
                                      outDone = outDone || drain(outPipe[0], run.out);
                                      errDone = errDone || drain(errPipe[0], run.err);
                                      if (!exited) exited = waitpid(pid, &status, WNOHANG) == pid;
                                      return exited && outDone && errDone;
                                    },
                                    {outPipe[0], errPipe[0]});
    EXPECT_TRUE(finished) << "spillwayctl did not finish";
    if (!finished && pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
    ::close(outPipe[0]);
    ::close(errPipe[0]);
    run.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return run;
  }

  std::string binary_;
  std::unique_ptr<CliServer> server_;
};

TEST_F(SpillwayctlTest, JsonOutputIsTheResult) {
  const CtlRun run = ctl({"--json", "backend", "list"});
  ASSERT_EQ(run.exitCode, 0) << run.err;
  const Json printed = Json::parse(run.out);
  EXPECT_EQ(printed, std::get<Json>(FakeControlApi().backendList()));
  // --json after the subcommand works too.
  const CtlRun late = ctl({"status", "--json"});
  ASSERT_EQ(late.exitCode, 0) << late.err;
  EXPECT_EQ(Json::parse(late.out)["generation"], 7);
}

TEST_F(SpillwayctlTest, TablesAreAligned) {
  const CtlRun run = ctl({"backend", "list"});
  ASSERT_EQ(run.exitCode, 0) << run.err;
  std::vector<std::string> lines;
  std::size_t start = 0;
  for (std::size_t nl; (nl = run.out.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines.push_back(run.out.substr(start, nl - start));
  }
  ASSERT_EQ(lines.size(), 3u) << run.out;
  EXPECT_EQ(lines[0].rfind("NAME", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("EFFECTIVE_WEIGHT"), std::string::npos);
  EXPECT_EQ(lines[1].rfind("gpu-a1", 0), 0u);
  EXPECT_EQ(lines[2].rfind("gpu-c1", 0), 0u);
  // Columns line up: each header starts where its cells start (text) or
  // ends where they end (numbers).
  const auto poolColumn = lines[0].find("POOL");
  EXPECT_EQ(lines[1].find("onprem"), poolColumn);
  EXPECT_EQ(lines[2].find("cloud"), poolColumn);
  const auto flowsEnd = lines[0].find("FLOWS") + 5;
  EXPECT_EQ(lines[1].substr(flowsEnd - 2, 2), "12");
  EXPECT_EQ(lines[2].substr(flowsEnd - 1, 1), "3");

  const CtlRun status = ctl({"status"});
  ASSERT_EQ(status.exitCode, 0) << status.err;
  EXPECT_NE(status.out.find("generation:"), std::string::npos) << status.out;
}

TEST_F(SpillwayctlTest, CommandsReachTheirCalls) {
  struct Case {
    std::vector<std::string> args;
    std::string call;
  };
  const std::vector<Case> cases = {
      {{"status"}, "status()"},
      {{"vip", "list"}, "vipList()"},
      {{"vip", "show", "nccl"}, "vipShow(nccl)"},
      {{"pool", "list"}, "poolList()"},
      {{"pool", "show", "cloud"}, "poolShow(cloud)"},
      {{"backend", "list"}, "backendList()"},
      {{"backend", "add", "gpu-x", "--address", "10.0.0.9", "--pool", "onprem"},
       "backendAdd(gpu-x)"},
      {{"backend", "remove", "gpu-x"}, "backendRemove(gpu-x)"},
      {{"backend", "drain", "gpu-a1"}, "backendDrain(gpu-a1)"},
      {{"backend", "undrain", "gpu-a1"}, "backendUndrain(gpu-a1)"},
      {{"backend", "disable", "gpu-a1"}, "backendDisable(gpu-a1)"},
      {{"backend", "enable", "gpu-a1"}, "backendEnable(gpu-a1)"},
      {{"backend", "weight", "gpu-a1", "300"}, "backendWeight(gpu-a1,300,apply)"},
      {{"backend", "weight", "gpu-a1", "0", "--dry-run"}, "backendWeight(gpu-a1,0,dry)"},
      {{"table", "show"}, "tableShow()"},
      {{"table", "show", "nccl"}, "tableShow(nccl)"},
      {{"flows"}, "flows()"},
      {{"stats"}, "stats()"},
      {{"health"}, "health()"},
      {{"events"}, "events(0,100)"},
      {{"events", "--after", "3", "--limit", "2"}, "events(3,2)"},
      {{"config", "check"}, "configCheck()"},
      {{"config", "check", "/etc/spillway/next.toml"}, "configCheck(/etc/spillway/next.toml)"},
      {{"config", "reload"}, "configReload()"},
      {{"config", "dump"}, "configDump()"},
      {{"config", "dump", "--effective"}, "configDump(effective)"},
      {{"config", "clear-overrides"}, "configClearOverrides()"},
      {{"config", "clear-overrides", "--backend", "gpu-a1"}, "configClearOverrides(gpu-a1)"},
      {{"lb", "drain"}, "lbDrain()"},
      {{"lb", "undrain"}, "lbUndrain()"},
      {{"lb", "status"}, "lbStatus()"},
  };
  for (const Case& c : cases) {
    api_.calls.clear();
    const CtlRun run = ctl(c.args);
    EXPECT_EQ(run.exitCode, 0) << c.call << ": " << run.err;
    EXPECT_EQ(api_.calls, (std::vector<std::string>{c.call}));
    EXPECT_FALSE(run.out.empty()) << c.call;
    // Every command's --json output parses.
    api_.calls.clear();
    std::vector<std::string> json{"--json"};
    json.insert(json.end(), c.args.begin(), c.args.end());
    const CtlRun jsonRun = ctl(json);
    EXPECT_EQ(jsonRun.exitCode, 0) << c.call << ": " << jsonRun.err;
    EXPECT_FALSE(Json::parse(jsonRun.out, nullptr, false).is_discarded()) << jsonRun.out;
  }
}

TEST_F(SpillwayctlTest, BackendAddSendsEveryOption) {
  const CtlRun run =
      ctl({"backend", "add", "gpu-x", "--address", "2001:db8::9", "--pool", "cloud", "--weight",
           "7", "--id", "77", "--mac", "02:00:00:00:00:09", "--port", "wan1"});
  ASSERT_EQ(run.exitCode, 0) << run.err;
  EXPECT_EQ(api_.lastSpec.name, "gpu-x");
  EXPECT_EQ(api_.lastSpec.address, "2001:db8::9");
  EXPECT_EQ(api_.lastSpec.pool, "cloud");
  EXPECT_EQ(api_.lastSpec.weight, 7u);
  EXPECT_EQ(api_.lastSpec.id, 77u);
  EXPECT_EQ(api_.lastSpec.mac, "02:00:00:00:00:09");
  EXPECT_EQ(api_.lastSpec.port, "wan1");
}

TEST_F(SpillwayctlTest, RelativeConfigPathsAreMadeAbsolute) {
  const CtlRun run = ctl({"config", "check", "conf/x.toml"});
  ASSERT_EQ(run.exitCode, 0) << run.err;
  EXPECT_EQ(api_.calls.back(),
            "configCheck(" + (fs::current_path() / "conf/x.toml").string() + ")");
}

TEST_F(SpillwayctlTest, ErrorReplyExitsOneWithTheMessage) {
  api_.replies["backendDrain"] = ApiError{"not_found", "no backend named gpu-zz"};
  const CtlRun run = ctl({"backend", "drain", "gpu-zz"});
  EXPECT_EQ(run.exitCode, 1);
  EXPECT_NE(run.err.find("not_found: no backend named gpu-zz"), std::string::npos) << run.err;
  EXPECT_TRUE(run.out.empty());
}

TEST_F(SpillwayctlTest, UsageErrorsExitTwo) {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"frobnicate"},
                                               {"backend"},
                                               {"backend", "drain"},
                                               {"backend", "weight", "gpu-a1", "heavy"},
                                               {"backend", "add", "x", "--pool", "p"},
                                               {"events", "--limit", "0"}}) {
    const CtlRun run = ctl(args);
    EXPECT_EQ(run.exitCode, 2) << args[0] << ": " << run.err;
  }
  EXPECT_TRUE(api_.calls.empty());
  EXPECT_EQ(ctl({"--help"}).exitCode, 0);
}

// spillwayctl's subcommands come from the command table: each row's help is
// in its group's help (or the top level's), and each argument's help in the
// command's own.
TEST_F(SpillwayctlTest, HelpIsTheCommandTable) {
  for (const CommandSpec& c : commandTable()) {
    const std::string name(c.name);
    std::vector<std::string> path;
    for (std::size_t start = 0, dot = 0; dot != std::string::npos; start = dot + 1) {
      dot = name.find('.', start);
      path.push_back(name.substr(start, dot == std::string::npos ? dot : dot - start));
    }
    std::vector<std::string> parent(path.begin(), path.end() - 1);
    parent.push_back("--help");
    const CtlRun listing = ctl(parent, /*withSocket=*/false);
    EXPECT_EQ(listing.exitCode, 0) << name;
    EXPECT_NE(listing.out.find(std::string(c.help)), std::string::npos)
        << name << ": " << listing.out;
    path.push_back("--help");
    const CtlRun own = ctl(path, /*withSocket=*/false);
    EXPECT_EQ(own.exitCode, 0) << name;
    for (const ArgSpec& a : c.args) {
      EXPECT_NE(own.out.find(std::string(a.help)), std::string::npos)
          << name << " " << a.name << ": " << own.out;
    }
  }
  EXPECT_TRUE(api_.calls.empty());
}

// An argument out of the row's range is refused before anything is sent.
TEST_F(SpillwayctlTest, TableChecksBeforeSending) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"table", "digest", "--chunk", "1"},
        {"events", "--limit", "1001"},
        {"backend", "weight", "gpu-a1", "4294967296"}}) {
    const CtlRun run = ctl(args);
    EXPECT_EQ(run.exitCode, 2) << args[0] << " " << args[1] << ": " << run.err;
  }
  EXPECT_TRUE(api_.calls.empty());
  const CtlRun digest = ctl({"table", "digest", "web", "--chunk", "2"});
  EXPECT_EQ(digest.exitCode, 0) << digest.err;
}

TEST_F(SpillwayctlTest, UnreachableSocketExitsThreeNamingIt) {
  const std::string path = dir_.path() + "/nobody-here.sock";
  const CtlRun run = ctl({"--socket", path, "status"}, /*withSocket=*/false);
  EXPECT_EQ(run.exitCode, 3);
  EXPECT_NE(run.err.find(path), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("No such file or directory"), std::string::npos) << run.err;
}

// A full server's refusal reaches the operator as its message, not as
// "Connection reset by peer".
TEST_F(SpillwayctlTest, BusyServerIsReportedReadably) {
  CliServerOptions o = options();
  o.maxClients = 2;
  o.rootSlots = 0;
  o.changeSlots = 0;
  server_ = std::make_unique<CliServer>(api_, o);
  open(*server_);
  RawClient a(server_->socketPath());
  RawClient b(server_->socketPath());
  ASSERT_TRUE(pumpUntil(*server_, [&] { return server_->clientCount() == 2; }));
  const CtlRun run = ctl({"status"});
  EXPECT_EQ(run.exitCode, 1) << run.err;
  EXPECT_NE(run.err.find("busy: 2 CLI connections"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("try again"), std::string::npos) << run.err;
  EXPECT_TRUE(api_.calls.empty());
}

// --timeout bounds connect(): a socket that listens but never accepts, its
// backlog full, is given up on with exit code 3 and the reason.
TEST_F(SpillwayctlTest, TimeoutCoversConnect) {
  const std::string path = dir_.path() + "/stuck.sock";
  const int listener = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
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
  const CtlRun run = ctl({"--socket", path, "--timeout", "1", "status"}, /*withSocket=*/false);
  EXPECT_EQ(run.exitCode, 3) << run.err;
  EXPECT_NE(run.err.find("cannot connect to " + path), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("backlog stayed full for 1000 ms"), std::string::npos) << run.err;
  for (const int fd : fillers) ::close(fd);
  ::close(listener);
}

TEST_F(SpillwayctlTest, DefaultSocketIsTheConfigDefault) {
  const CtlRun run = ctl({"--help"}, /*withSocket=*/false);
  EXPECT_NE(run.out.find(ControlConfig{}.socketPath), std::string::npos) << run.out;
}

TEST_F(SpillwayctlTest, EventsFollowPollsWithAfter) {
  api_.eventCount = 3;
  const CtlRun run =
      ctl({"--json", "events", "--follow", "--after", "1", "--count", "2", "--interval", "0.01"});
  ASSERT_EQ(run.exitCode, 0) << run.err;
  ASSERT_GE(api_.calls.size(), 2u);
  EXPECT_EQ(api_.calls[0], "events(1,100)");
  EXPECT_EQ(api_.calls[1], "events(3,100)");
  // One JSON event per line: seq 2 and 3.
  std::vector<std::uint64_t> seqs;
  std::size_t start = 0;
  for (std::size_t nl; (nl = run.out.find('\n', start)) != std::string::npos; start = nl + 1) {
    seqs.push_back(Json::parse(run.out.substr(start, nl - start))["seq"].get<std::uint64_t>());
  }
  EXPECT_EQ(seqs, (std::vector<std::uint64_t>{2, 3}));
}

TEST_F(SpillwayctlTest, StatsWatchRepeats) {
  const CtlRun run = ctl({"--json", "stats", "--watch", "0.01", "--count", "3"});
  ASSERT_EQ(run.exitCode, 0) << run.err;
  EXPECT_EQ(api_.calls, (std::vector<std::string>{"stats()", "stats()", "stats()"}));
  std::size_t lines = 0;
  std::size_t start = 0;
  for (std::size_t nl; (nl = run.out.find('\n', start)) != std::string::npos; start = nl + 1) {
    EXPECT_EQ(Json::parse(run.out.substr(start, nl - start))["rx_packets"], 1000);
    ++lines;
  }
  EXPECT_EQ(lines, 3u);
  // --watch without a value uses the default interval.
  api_.calls.clear();
  const CtlRun once = ctl({"stats", "--watch", "--count", "1"});
  EXPECT_EQ(once.exitCode, 0) << once.err;
  EXPECT_EQ(api_.calls.size(), 1u);
}

}  // namespace
}  // namespace spillway
