// The peer channel over loopback TCP, time injected: two instances exchange
// a full dump and then deltas; a disconnected peer's set is held, then
// replaced by a new dump when it reconnects, or forgotten after hold_time;
// another secret, an unknown node, another hash_seed and an instance of the
// old protocol version (either side of the connection) are refused at the
// handshake and counted, the version with words that name the upgrade;
// garbage and truncated frames before authentication are counted drops. Then a ControlPlane (fake
// dataplane) that puts a peer's exception into its published snapshot's exception table and sends
// its own exports to the peer.
#include "control/tier/peer_channel.hpp"

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
#include <memory>
#include <string>
#include <vector>

#include "control/backends/snapshot_builder.hpp"
#include "control/intent/affinity_keeper.hpp"
#include "control/plane/control_plane.hpp"
#include "estate_fixture.hpp"
#include "fake_dataplane.hpp"
#include "loopback_servers.hpp"

namespace spillway {
namespace {

constexpr std::uint64_t kSeed = 0x0123456789abcdefULL;
const std::string kSecret = "0123456789abcdef-the-tier-secret";

// A port nothing listens on now (bound and released).
using test::at;
using test::freePort;

TierConfig tier(const std::string& node, std::uint16_t listen, std::vector<TierPeerConfig> peers,
                const std::string& secret = kSecret) {
  TierConfig t;
  t.node = node;
  t.listen = at(listen);
  t.peers = std::move(peers);
  t.secret = secret;
  return t;
}

// Polls until `done` or a wall-clock deadline (never a timing assertion: the
// deadline only stops a test that would otherwise hang).
bool pollUntil(const std::function<void()>& step, const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    step();
    if (done()) return true;
  }
  return false;
}

std::vector<FlowExceptionRecord> records(std::uint64_t first, std::uint64_t n,
                                         std::uint64_t backendId) {
  std::vector<FlowExceptionRecord> out;
  for (std::uint64_t i = first; i < first + n; ++i) {
    out.push_back(
        FlowExceptionRecord{i * 0x9e3779b97f4a7c15ULL, backendId, FlowState::Established, 0});
  }
  return out;
}

std::map<std::uint64_t, std::uint64_t> byHash(const std::vector<PeerException>& v) {
  std::map<std::uint64_t, std::uint64_t> m;
  for (const PeerException& e : v) m[e.hash] = e.backendId;
  return m;
}

std::map<std::uint64_t, std::uint64_t> byHash(const std::vector<FlowExceptionRecord>& v) {
  std::map<std::uint64_t, std::uint64_t> m;
  for (const FlowExceptionRecord& e : v) m[e.hash] = e.backendId;
  return m;
}

class PeerPair : public ::testing::Test {
 protected:
  void SetUp() override {
    pa_ = freePort();
    pb_ = freePort();
  }
  std::unique_ptr<PeerChannel> make(const std::string& node, std::uint16_t port,
                                    const std::string& peer, std::uint16_t peerPort,
                                    const std::string& secret = kSecret, std::uint64_t seed = kSeed,
                                    EventLog* log = nullptr) {
    auto c = std::make_unique<PeerChannel>(
        tier(node, port, {TierPeerConfig{peer, at(peerPort)}}, secret), seed, log ? *log : events_);
    EXPECT_FALSE(c->open());
    return c;
  }
  void step(std::initializer_list<PeerChannel*> channels) {
    for (PeerChannel* c : channels) c->poll(now_);
  }

  std::uint16_t pa_ = 0;
  std::uint16_t pb_ = 0;
  Millis now_ = 1;
  EventLog events_{256};
};

TEST_F(PeerPair, FullDumpThenDeltas) {
  auto a = make("lb-a", pa_, "lb-b", pb_);
  auto b = make("lb-b", pb_, "lb-a", pa_);
  const auto first = records(1, 5000, 77);  // more than one records frame
  a->publishLocal(first);
  ASSERT_TRUE(pollUntil(
      [&] {
        step({a.get(), b.get()});
      },
      [&] { return a->connected("lb-b") && b->held("lb-a") == 5000; }));
  EXPECT_TRUE(b->takeChanged());
  EXPECT_EQ(byHash(b->exceptions()), byHash(first));
  EXPECT_EQ(a->status(now_)["peers"][0]["records_out"], 5000);

  // Deltas: 1000 gone, 10 moved to another backend, 20 new.
  std::vector<FlowExceptionRecord> next(first.begin() + 1000, first.end());
  for (std::size_t i = 0; i < 10; ++i) next[i].backendId = 78;
  for (const auto& r : records(100'000, 20, 79)) next.push_back(r);
  a->publishLocal(next);
  ASSERT_TRUE(pollUntil(
      [&] {
        step({a.get(), b.get()});
      },
      [&] { return byHash(b->exceptions()) == byHash(next); }));
  // Only the difference travelled.
  EXPECT_EQ(a->status(now_)["peers"][0]["records_out"], 5000 + 30);
  EXPECT_EQ(b->status(now_)["peers"][0]["records_in"], 5000 + 30);
  // B has nothing of its own: A holds nothing from B.
  EXPECT_EQ(a->held("lb-b"), 0u);
}

TEST_F(PeerPair, DisconnectedPeerIsHeldThenReplacedByItsNextDump) {
  auto a = make("lb-a", pa_, "lb-b", pb_);
  auto b = make("lb-b", pb_, "lb-a", pa_);
  a->publishLocal(records(1, 100, 77));
  ASSERT_TRUE(pollUntil([&] { step({a.get(), b.get()}); }, [&] { return b->held("lb-a") == 100; }));
  // A dies.
  a.reset();
  ASSERT_TRUE(pollUntil([&] { step({b.get()}); },
                        [&] { return b->status(now_)["peers"][0]["receiving"] == "down"; }));
  EXPECT_EQ(b->held("lb-a"), 100u);  // held: ECMP now sends these flows to B
  now_ += 5 * 60'000;
  step({b.get()});
  EXPECT_EQ(b->held("lb-a"), 100u);
  // A restarts with other exceptions: its dump replaces the old set.
  a = make("lb-a", pa_, "lb-b", pb_);
  const auto fresh = records(500, 3, 80);
  a->publishLocal(fresh);
  ASSERT_TRUE(pollUntil([&] { step({a.get(), b.get()}); }, [&] { return b->held("lb-a") == 3; }));
  EXPECT_EQ(byHash(b->exceptions()), byHash(fresh));
}

TEST_F(PeerPair, OfTwoPeersTheMoreRecentlyReceivedRecordWins) {
  const std::uint16_t pc = freePort();
  auto b = std::make_unique<PeerChannel>(
      tier("lb-b", pb_, {TierPeerConfig{"lb-a", at(pa_)}, TierPeerConfig{"lb-c", at(pc)}}), kSeed,
      events_);
  ASSERT_FALSE(b->open());
  auto a = make("lb-a", pa_, "lb-b", pb_);
  auto c = make("lb-c", pc, "lb-b", pb_);
  const std::uint64_t flow = 0x42;
  const auto one = [&](std::uint64_t backend) {
    return std::vector<FlowExceptionRecord>{{flow, backend, FlowState::Established, 0}};
  };
  const auto all = [&] { step({a.get(), b.get(), c.get()}); };
  a->publishLocal(one(1));
  ASSERT_TRUE(pollUntil(all, [&] { return b->held("lb-a") == 1; }));
  c->publishLocal(one(2));
  ASSERT_TRUE(pollUntil(all, [&] { return b->held("lb-c") == 1; }));
  EXPECT_EQ(byHash(b->exceptions())[flow], 2u);
  // A moves the flow again: its record is now the more recent one.
  a->publishLocal(one(3));
  ASSERT_TRUE(pollUntil(all, [&] { return byHash(b->exceptions())[flow] == 3u; }));
  EXPECT_EQ(b->held("lb-c"), 1u);
}

TEST_F(PeerPair, SilentPeerTimesOutAndIsForgottenAfterHoldTime) {
  auto a = make("lb-a", pa_, "lb-b", pb_);
  auto b = make("lb-b", pb_, "lb-a", pa_);
  a->publishLocal(records(1, 10, 77));
  ASSERT_TRUE(pollUntil([&] { step({a.get(), b.get()}); }, [&] { return b->held("lb-a") == 10; }));
  (void)b->takeChanged();
  // A stops answering (a stalled process: its socket stays open).
  now_ += 3'001;
  step({b.get()});
  EXPECT_EQ(b->status(now_)["peers"][0]["receiving"], "down");
  EXPECT_EQ(b->held("lb-a"), 10u);
  now_ += 600'000;
  step({b.get()});
  EXPECT_EQ(b->held("lb-a"), 0u);
  EXPECT_TRUE(b->takeChanged());
}

TEST_F(PeerPair, WrongSecretIsRefusedAndCounted) {
  auto a = make("lb-a", pa_, "lb-b", pb_, "another-secret-of-16-bytes");
  auto b = make("lb-b", pb_, "lb-a", pa_);
  a->publishLocal(records(1, 10, 77));
  ASSERT_TRUE(pollUntil(
      [&] {
        step({a.get(), b.get()});
      },
      [&] {
        return b->status(now_)["peers"][0]["auth_failures"] >= 1 &&
               a->status(now_)["peers"][0]["auth_failures"] >= 1;
      }));
  EXPECT_EQ(b->held("lb-a"), 0u);
  EXPECT_FALSE(a->connected("lb-b"));
}

TEST_F(PeerPair, UnknownNodeIsRefusedAndCounted) {
  auto b = make("lb-b", pb_, "lb-a", pa_);
  auto c = make("lb-c", freePort(), "lb-b", pb_);
  c->publishLocal(records(1, 10, 77));
  ASSERT_TRUE(pollUntil(
      [&] {
        step({b.get(), c.get()});
      },
      [&] { return b->status(now_)["unknown_node_refusals"] >= 1; }));
  EXPECT_EQ(b->held("lb-a"), 0u);
  EXPECT_NE(c->status(now_)["peers"][0]["last_error"].get<std::string>().find("unknown node"),
            std::string::npos);
}

TEST_F(PeerPair, AnotherHashSeedIsRefusedWithAClearError) {
  EventLog log(64);
  auto a = make("lb-a", pa_, "lb-b", pb_, kSecret, kSeed + 1);
  auto b = make("lb-b", pb_, "lb-a", pa_, kSecret, kSeed, &log);
  const auto says = [&](PeerChannel& c) {
    return c.status(now_)["peers"][0]["last_error"].get<std::string>().find("hash_seed") !=
           std::string::npos;
  };
  // B refuses A's handshake and says why; A reads the refusal.
  ASSERT_TRUE(pollUntil([&] { step({a.get(), b.get()}); }, [&] { return says(*b) && says(*a); }));
  EXPECT_FALSE(a->connected("lb-b"));
  EXPECT_EQ(b->held("lb-a"), 0u);
}

int connectTo(std::uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin), 0);
  return fd;
}

// Reads what is there now; true once the other side closed.
bool drain(int fd, std::string& into) {
  char buf[4096];
  while (true) {
    const ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      into.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
  }
}

TEST_F(PeerPair, GarbageFromAnUnauthenticatedClientIsDroppedAndTheChannelLives) {
  auto b = make("lb-b", pb_, "lb-a", pa_);
  const int fd = connectTo(pb_);
  const std::string junk(100, '\xff');
  ASSERT_EQ(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), 100);
  std::string got;
  // Closed by B (after its hello), and counted.
  ASSERT_TRUE(pollUntil([&] { step({b.get()}); }, [&] { return drain(fd, got); }));
  ::close(fd);
  EXPECT_EQ(b->status(now_)["handshake_drops"], 1);

  // Half an Auth frame, then the client goes: a truncated frame, counted.
  const int half = connectTo(pb_);
  const std::string frame = encodePeerFrame(PeerFrameType::Auth, std::string(90, 'a'));
  ASSERT_EQ(::send(half, frame.data(), 40, MSG_NOSIGNAL), 40);
  got.clear();
  ASSERT_TRUE(
      pollUntil([&] { step({b.get()}); }, [&] { return !got.empty() || drain(half, got); }));
  ::close(half);
  ASSERT_TRUE(
      pollUntil([&] { step({b.get()}); }, [&] { return b->status(now_)["handshake_drops"] == 2; }));
  // A real peer still gets through.
  auto a = make("lb-a", pa_, "lb-b", pb_);
  a->publishLocal(records(1, 1, 77));
  ASSERT_TRUE(pollUntil([&] { step({a.get(), b.get()}); }, [&] { return b->held("lb-a") == 1; }));
}

// A stranger holding handshakes open (connects and never speaks) from many
// addresses, far more connections than the listener keeps: the configured
// peer (another address) still gets through at once, the stranger's
// connections are refused at accept and counted, and the event log gets one
// line for the start of the refusals, not one per connection.
TEST_F(PeerPair, StrangersHoldingHandshakesDoNotKeepAPeerOut) {
  EventLog log(256);
  auto b = make("lb-b", pb_, "lb-a", pa_, kSecret, kSeed, &log);
  std::vector<int> held;
  for (int source = 2; source <= 21; ++source) {  // 127.0.0.2 .. 127.0.0.21
    for (int k = 0; k < 10; ++k) {
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      ASSERT_GE(fd, 0);
      sockaddr_in from{};
      from.sin_family = AF_INET;
      from.sin_addr.s_addr = htonl(0x7f000000u | static_cast<std::uint32_t>(source));
      ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from), 0);
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_port = htons(pb_);
      to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      const int rc = connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to);
      ASSERT_TRUE(rc == 0 || errno == EINPROGRESS);
      held.push_back(fd);
    }
    step({b.get()});
  }
  for (int i = 0; i < 10; ++i) step({b.get()});
  const Json st = b->status(now_);
  // 4 per address at most, 32 from addresses of no peer in all.
  EXPECT_EQ(st["pending_handshakes"], 32u);
  EXPECT_EQ(st["connections_refused"], 200u - 32u);
  // The peer's address (127.0.0.1) has its own allowance.
  auto a = make("lb-a", pa_, "lb-b", pb_);
  a->publishLocal(records(1, 5, 77));
  ASSERT_TRUE(pollUntil([&] { step({a.get(), b.get()}); }, [&] { return b->held("lb-a") == 5; }));
  std::size_t refusalEvents = 0;
  for (const Event& e : log.since(0, 0).events) {
    refusalEvents += e.cause.find("refused") != std::string::npos;
  }
  EXPECT_EQ(refusalEvents, 1u);
  // An interval later the rest are summarised in one line.
  now_ += 10001;
  step({b.get()});
  std::string summary;
  for (const Event& e : log.since(0, 0).events) {
    if (e.cause.find(" more ") != std::string::npos) summary = e.cause;
  }
  EXPECT_NE(summary.find("refused 167 more"), std::string::npos) << summary;
  EXPECT_NE(summary.find("from 20 source(s)"), std::string::npos) << summary;
  for (const int fd : held) ::close(fd);
}

// Handshakes as an unknown node, over and over: each is refused and counted,
// and the event log holds a first line and then summaries, so a flood of
// them cannot push the operator's events out of the ring.
TEST_F(PeerPair, AFloodOfUnknownNodesIsSummarisedNotLogged) {
  EventLog log(64);
  auto b = make("lb-b", pb_, "lb-a", pa_, kSecret, kSeed, &log);
  auto c = make("lb-x", freePort(), "lb-b", pb_);
  Millis cNow = 1;
  ASSERT_TRUE(pollUntil(
      [&] {
        cNow += 1001;  // lb-x redials once a second of its own time
        c->poll(cNow);
        step({b.get()});
      },
      [&] { return b->status(now_)["unknown_node_refusals"] >= 200; }));
  const auto refusals = b->status(now_)["unknown_node_refusals"].get<std::uint64_t>();
  EXPECT_EQ(log.dropped(), 0u);
  EXPECT_LE(log.size(), 2u);
  now_ += 10001;
  step({b.get()});
  const auto events = log.since(0, 0).events;
  ASSERT_FALSE(events.empty());
  EXPECT_NE(events.back().cause.find("refused " + std::to_string(refusals - 1) + " more"),
            std::string::npos)
      << events.back().cause;
  EXPECT_NE(events.back().cause.find("no configured peer"), std::string::npos);
}

// A reload's [tier] on a running channel: a removed peer is retired (its
// connections closed, refused like an unknown node) while the exceptions it
// sent stay held for hold_time; an added peer is dialled and synced; the
// same peer added again comes back; another secret on both ends reconnects.
TEST_F(PeerPair, ReconfigureRetiresAddsAndRekeys) {
  const std::uint16_t pc = freePort();
  auto b = make("lb-b", pb_, "lb-a", pa_);
  auto a = make("lb-a", pa_, "lb-b", pb_);
  a->publishLocal(records(1, 10, 77));
  ASSERT_TRUE(pollUntil([&] { step({a.get(), b.get()}); }, [&] { return b->held("lb-a") == 10; }));

  // lb-a leaves B's [tier]; lb-c joins it.
  TierConfig next = tier("lb-b", pb_, {TierPeerConfig{"lb-c", at(pc)}});
  next.holdTime = 5000;
  b->reconfigure(next, now_);
  auto c = make("lb-c", pc, "lb-b", pb_);
  c->publishLocal(records(100, 3, 78));
  ASSERT_TRUE(pollUntil(
      [&] {
        step({a.get(), b.get(), c.get()});
      },
      [&] { return b->held("lb-c") == 3 && b->connected("lb-c"); }));
  now_ += 1001;  // lb-a redials B, which no longer knows it
  ASSERT_TRUE(pollUntil(
      [&] {
        step({a.get(), b.get(), c.get()});
      },
      [&] { return b->status(now_)["unknown_node_refusals"] >= 1; }));
  EXPECT_EQ(b->held("lb-a"), 10u) << "held for hold_time after its removal";
  EXPECT_FALSE(b->connected("lb-a"));
  const Json st = b->status(now_);
  EXPECT_EQ(st["peers"][0]["name"], "lb-a");
  EXPECT_EQ(st["peers"][0]["state"], "retired");
  EXPECT_TRUE(b->synced()) << "a retired peer is not waited for";
  now_ += 5001;
  step({b.get()});
  EXPECT_EQ(b->held("lb-a"), 0u) << "forgotten after hold_time";

  // lb-a back in; then another secret on every end.
  next.peers.push_back(TierPeerConfig{"lb-a", at(pa_)});
  b->reconfigure(next, now_);
  ASSERT_TRUE(pollUntil(
      [&] {
        step({a.get(), b.get(), c.get()});
      },
      [&] { return b->held("lb-a") == 10 && b->connected("lb-a"); }));
  const std::string other = "another-secret-for-the-whole-tier";
  TierConfig na = tier("lb-a", pa_, {TierPeerConfig{"lb-b", at(pb_)}}, other);
  TierConfig nb = next;
  nb.secret = other;
  b->reconfigure(nb, now_);
  EXPECT_FALSE(b->connected("lb-a"));
  a->reconfigure(na, now_);
  a->publishLocal(records(1, 12, 77));
  now_ += 1001;  // B's own redial, refused while A still had the old secret, comes round
  ASSERT_TRUE(pollUntil(
      [&] {
        step({a.get(), b.get(), c.get()});
      },
      [&] { return b->held("lb-a") == 12 && b->connected("lb-a"); }));
}

// What a version-1 instance sent: its hello (u32 1, a 16-byte nonce, the
// name) and its auth (u32 1, nonce, u64 seed tag, name, u64 MAC), framed as
// both versions frame handshake messages.
std::string v1Message(PeerFrameType type, std::string_view node) {
  std::string p;
  const std::uint32_t v = 1;
  p.append(reinterpret_cast<const char*>(&v), 4);
  p.append(16, '\x11');
  if (type == PeerFrameType::Auth) p.append(8, '\x22');
  p.push_back(static_cast<char>(node.size()));
  p.append(node);
  if (type == PeerFrameType::Auth) p.append(8, '\x33');
  return encodePeerFrame(type, p);
}

TEST_F(PeerPair, AnOldVersionServerIsRefusedWithWordsThatNameTheUpgrade) {
  EventLog log(64);
  // lb-b is an instance of version 1: it listens and says its hello.
  const int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(pb_);
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(lfd, reinterpret_cast<sockaddr*>(&sin), sizeof sin), 0);
  ASSERT_EQ(listen(lfd, 4), 0);
  auto a = make("lb-a", pa_, "lb-b", pb_, kSecret, kSeed, &log);
  std::vector<int> accepted;
  const std::string hello = v1Message(PeerFrameType::Hello, "lb-b");
  const std::string expected =
      "peer lb-b (" + at(pb_) + ") speaks tier protocol v1; this instance speaks v2: upgrade it";
  ASSERT_TRUE(pollUntil(
      [&] {
        const int fd = accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK);
        if (fd >= 0) {
          accepted.push_back(fd);
          EXPECT_EQ(::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL),
                    static_cast<ssize_t>(hello.size()));
        }
        step({a.get()});
      },
      [&] { return a->status(now_)["version_refusals"] >= 1; }));
  EXPECT_EQ(a->status(now_)["peers"][0]["last_error"], expected);
  bool logged = false;
  for (const Event& e : log.since(0, 0).events) logged = logged || e.cause == expected;
  EXPECT_TRUE(logged);
  EXPECT_FALSE(a->connected("lb-b"));
  // The connection was closed without a word from A (no auth for an old hello).
  for (const int fd : accepted) {
    std::string got;
    ASSERT_TRUE(pollUntil([&] { step({a.get()}); }, [&] { return drain(fd, got); }));
    EXPECT_EQ(got, "");
    ::close(fd);
  }
  ::close(lfd);
}

TEST_F(PeerPair, AnOldVersionClientIsRefusedAndToldToUpgrade) {
  auto b = make("lb-b", pb_, "lb-a", pa_);
  const int fd = connectTo(pb_);
  std::string got;
  // B's hello first (version 2), then the old client's auth.
  ASSERT_TRUE(pollUntil([&] { step({b.get()}); },
                        [&] {
                          (void)drain(fd, got);
                          return !got.empty();
                        }));
  const auto hello = decodePeerFrame(got, nullptr, 0);
  ASSERT_TRUE(std::holds_alternative<PeerFrame>(hello));
  EXPECT_EQ(peerPayloadVersion(std::get<PeerFrame>(hello).payload), kPeerVersion);
  got.erase(0, std::get<PeerFrame>(hello).consumed);
  const std::string auth = v1Message(PeerFrameType::Auth, "lb-a");
  ASSERT_EQ(::send(fd, auth.data(), auth.size(), MSG_NOSIGNAL), static_cast<ssize_t>(auth.size()));
  ASSERT_TRUE(pollUntil([&] { step({b.get()}); }, [&] { return drain(fd, got); }));
  ::close(fd);
  const auto refuse = decodePeerFrame(got, nullptr, 0);
  ASSERT_TRUE(std::holds_alternative<PeerFrame>(refuse));
  EXPECT_EQ(std::get<PeerFrame>(refuse).type, PeerFrameType::Refuse);
  EXPECT_EQ(std::get<PeerFrame>(refuse).payload,
            "this instance (lb-b) speaks tier protocol v2, yours v1: upgrade yours");
  EXPECT_EQ(b->status(now_)["version_refusals"], 1);
  EXPECT_EQ(b->held("lb-a"), 0u);
}

// --- The keeper's exports for the peers --------------------------------------

TEST(KeeperSync, ExportsEverySyncIntervalAndWritesCheckpointsOnlyWhenTheyAreDue) {
  char tmpl[] = "/tmp/spillway-keeper-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  EventLog events(64);
  std::vector<std::vector<FlowExceptionRecord>> exported;
  AffinityKeeper keeper(AffinityKeeper::Options{.stateDir = dir,
                                                .hashSeed = kSeed,
                                                .exportInterval = 1000,
                                                .onExport =
                                                    [&](std::span<const FlowExceptionRecord> r) {
                                                      exported.emplace_back(r.begin(), r.end());
                                                    }},
                        events);
  std::uint64_t asked = 0;
  const std::vector<ExportedFlow> flows{{0x10, 1, FlowState::Established, 0}};
  const ExceptionExportHooks hooks{
      [&](std::uint64_t n) { asked = n; },
      [&](std::uint64_t n) -> std::optional<std::vector<ExportedFlow>> {
        if (n != asked) return std::nullopt;
        return flows;
      }};
  const auto tick = [&](Millis t) {
    keeper.tick(
        t, 1'000'000 + static_cast<std::uint64_t>(t), 1, 1, [] { return TablesState{}; },
        [](std::uint32_t i) -> std::uint64_t { return i == 1 ? 77 : 0; }, hooks);
  };
  tick(0);
  tick(1);  // the first export writes the first checkpoint
  ASSERT_EQ(exported.size(), 1u);
  EXPECT_EQ(exported[0], (std::vector<FlowExceptionRecord>{{0x10, 77, FlowState::Established, 0}}));
  EXPECT_EQ(keeper.stats().checkpoints, 1u);
  tick(500);
  tick(501);
  EXPECT_EQ(exported.size(), 1u);  // not due
  tick(1000);
  tick(1001);
  EXPECT_EQ(exported.size(), 2u);             // for the peers
  EXPECT_EQ(keeper.stats().checkpoints, 1u);  // and no write
  tick(60'000);
  tick(60'001);
  EXPECT_EQ(exported.size(), 3u);
  EXPECT_EQ(keeper.stats().checkpoints, 2u);  // the periodic checkpoint
  std::filesystem::remove_all(dir);
}

TEST(KeeperSync, WithoutAStateDirATableChangeStillExportsForThePeers) {
  EventLog events(64);
  std::size_t exports = 0;
  AffinityKeeper keeper(
      AffinityKeeper::Options{.stateDir = "",
                              .hashSeed = kSeed,
                              .exportInterval = 1000,
                              .onExport = [&](std::span<const FlowExceptionRecord>) { ++exports; }},
      events);
  std::uint64_t asked = 0;
  const ExceptionExportHooks hooks{
      [&](std::uint64_t n) { asked = n; },
      [&](std::uint64_t n) -> std::optional<std::vector<ExportedFlow>> {
        if (n != asked) return std::nullopt;
        return std::vector<ExportedFlow>{};
      }};
  const auto tick = [&](Millis t, std::uint64_t generation) {
    keeper.tick(
        t, 1'000'000, generation, generation, [] { return TablesState{}; },
        [](std::uint32_t) -> std::uint64_t { return 0; }, hooks);
  };
  tick(0, 1);
  tick(1, 1);
  EXPECT_EQ(exports, 1u);
  tick(100, 2);  // a new table: due after minInterval, not after a sync interval
  tick(101, 2);
  EXPECT_EQ(exports, 1u);
  tick(300, 2);
  tick(301, 2);
  EXPECT_EQ(exports, 2u);
  tick(700, 2);  // nothing new until the sync interval
  tick(701, 2);
  EXPECT_EQ(exports, 2u);
  EXPECT_EQ(keeper.stats().checkpoints, 0u);
}

// --- A ControlPlane with a peer ---------------------------------------------

class TierControl : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/spillway-tier-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    secret_ = dir_ + "/secret";
    std::ofstream(secret_) << kSecret;
    ::chmod(secret_.c_str(), 0600);
    pa_ = freePort();
    pb_ = freePort();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  Config config() {
    const std::string text = test::onePoolEstate(3) + R"(
[control]
state_dir = ")" + dir_ + R"("

[tier]
node = "lb-a"
listen = ")" + at(pa_) + R"("
peers = [{name = "lb-b", address = ")" +
                             at(pb_) + R"("}]
secret_file = ")" + secret_ + R"("
)";
    auto r = loadConfigFromString(text, "test.toml");
    EXPECT_TRUE(r) << formatErrors(r.errors());
    return r.value();
  }

  std::string dir_;
  std::string secret_;
  std::uint16_t pa_ = 0;
  std::uint16_t pb_ = 0;
  test::FakeDataplane dp_;
};

TEST_F(TierControl, PeerExceptionReachesThePublishedExceptionTableAndLocalOnesReachThePeer) {
  SnapshotBuilder builder;
  ASSERT_FALSE(builder.setConfig(config()));
  ControlPlane a(config(), "test.toml", builder, &dp_, 0);
  dp_.publish(a.takeSnapshot(0));
  EventLog log(64);
  PeerChannel b(tier("lb-b", pb_, {TierPeerConfig{"lb-a", at(pa_)}}), kSeed, log);
  ASSERT_FALSE(b.open());

  const std::uint64_t b2 = backendIdFromName("b2");
  const std::uint64_t flow = 0xabcdef0123456789ULL;
  const std::uint64_t stray = 0x1111111111111111ULL;
  // One exception on b2, one on a backend this instance does not know.
  b.publishLocal(std::vector<FlowExceptionRecord>{{flow, b2, FlowState::Established, 0},
                                                  {stray, 0xdeadbeef, FlowState::Established, 0}});
  // A's own tracked exception, exported by its (fake) workers.
  const std::uint32_t b3Index = builder.indexOf(backendIdFromName("b3"));
  dp_.exportFlows.push_back(ExportedFlow{0x4242, b3Index, FlowState::Udp, 0});

  Millis now = 0;
  const auto step = [&] {
    now += 10;
    b.poll(now);
    if (a.tick(now)) {
      if (auto s = a.takeSnapshot(now)) dp_.publish(std::move(s));
    }
  };
  ASSERT_TRUE(pollUntil(step, [&] {
    return dp_.latest->exceptions && dp_.latest->exceptions->find(flow).backend != 0 &&
           b.held("lb-a") == 1;
  }));
  EXPECT_EQ(dp_.latest->exceptions->find(flow).backend, builder.indexOf(b2));
  // A worker that adopts it records the peer as the layer that kept it.
  EXPECT_EQ(dp_.latest->exceptions->find(flow).origin, ExceptionOrigin::Peer);
  EXPECT_EQ(dp_.latest->exceptions->find(stray).backend, 0u);
  EXPECT_EQ(byHash(b.exceptions()),
            (std::map<std::uint64_t, std::uint64_t>{{0x4242, backendIdFromName("b3")}}));

  const Json status = std::get<Json>(a.status());
  const Json& t = status.at("tier");
  EXPECT_EQ(t.at("node"), "lb-a");
  EXPECT_EQ(t.at("peers")[0].at("name"), "lb-b");
  EXPECT_EQ(t.at("peers")[0].at("state"), "connected");
  EXPECT_EQ(t.at("peers")[0].at("held_exceptions"), 2);
  EXPECT_EQ(t.at("peer_exceptions_in_table"), 1);
  EXPECT_EQ(t.at("peer_exceptions_ignored"), 1);
  const std::string metrics = a.metricsText();
  EXPECT_NE(metrics.find("spillway_peer_up{peer=\"lb-b\",direction=\"in\"} 1"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("spillway_peer_exceptions_ignored 1"), std::string::npos);

  // b2 fails: its peer exception leaves the table (its flows re-steer).
  ASSERT_TRUE(std::holds_alternative<Json>(a.backendDisable("b2")));
  ASSERT_TRUE(pollUntil(step, [&] {
    return dp_.latest->exceptions == nullptr || dp_.latest->exceptions->find(flow).backend == 0;
  }));
}

// config reload with a changed [tier]: the running instance takes the new
// peer list (a removed peer's exceptions stay held); a new node name or
// listen address, and [announce] on an instance started without it, are
// refused with the running configuration unchanged.
TEST_F(TierControl, ReloadAppliesTheTierPeersAndRefusesWhatNeedsARestart) {
  EventLog log(256);
  const std::string path = dir_ + "/spillway.toml";
  const auto write = [&](const std::string& peers, const std::string& node,
                         const std::string& extra) {
    std::ofstream(path) << test::onePoolEstate(3) << "\n[control]\nstate_dir = \"" << dir_
                        << "\"\n\n[tier]\nnode = \"" << node << "\"\nlisten = \"" << at(pa_)
                        << "\"\npeers = [" << peers << "]\nsecret_file = \"" << secret_ << "\"\n"
                        << extra;
  };
  const std::string peerB = "{name = \"lb-b\", address = \"" + at(pb_) + "\"}";
  write(peerB, "lb-a", "");
  SnapshotBuilder builder;
  ASSERT_FALSE(builder.setConfig(config()));
  ControlPlane a(config(), path, builder, &dp_, 0);
  dp_.publish(a.takeSnapshot(0));
  PeerChannel b(tier("lb-b", pb_, {TierPeerConfig{"lb-a", at(pa_)}}), kSeed, log);
  ASSERT_FALSE(b.open());
  b.publishLocal(records(1, 4, backendIdFromName("b2")));
  Millis now = 0;
  const auto step = [&](std::initializer_list<PeerChannel*> others) {
    now += 10;
    for (PeerChannel* o : others) o->poll(now);
    if (a.tick(now)) {
      if (auto s = a.takeSnapshot(now)) dp_.publish(std::move(s));
    }
  };
  const auto peerState = [&](const std::string& name) -> std::string {
    const Json status = std::get<Json>(a.status());
    for (const Json& p : status.at("tier").at("peers")) {
      if (p.at("name") == name) return p.at("state").get<std::string>();
    }
    return "absent";
  };
  ASSERT_TRUE(pollUntil([&] { step({&b}); }, [&] { return peerState("lb-b") == "connected"; }));

  const std::uint16_t pc = freePort();
  PeerChannel c(tier("lb-c", pc, {TierPeerConfig{"lb-a", at(pa_)}}), kSeed, log);
  ASSERT_FALSE(c.open());
  write("{name = \"lb-c\", address = \"" + at(pc) + "\"}", "lb-a", "");
  const ApiResult r = a.configReload("");
  ASSERT_TRUE(std::holds_alternative<Json>(r)) << std::get<ApiError>(r).message;
  EXPECT_EQ(std::get<Json>(r).at("changes").at("tier").at("peers")[0], "lb-c@" + at(pc));
  ASSERT_TRUE(pollUntil([&] { step({&b, &c}); }, [&] { return peerState("lb-c") == "connected"; }));
  EXPECT_EQ(peerState("lb-b"), "retired");
  const Json after = std::get<Json>(a.status());
  for (const Json& p : after.at("tier").at("peers")) {
    if (p.at("name") == "lb-b") {
      EXPECT_EQ(p.at("held_exceptions"), 4);
    }
  }

  write(peerB, "lb-z", "");
  const ApiResult renamed = a.configReload("");
  ASSERT_TRUE(std::holds_alternative<ApiError>(renamed));
  EXPECT_EQ(std::get<ApiError>(renamed).code, "conflict");
  EXPECT_NE(std::get<ApiError>(renamed).message.find("restart"), std::string::npos);
  EXPECT_EQ(std::get<Json>(a.status()).at("tier").at("node"), "lb-a");

  write(peerB, "lb-a", "\n[announce]\nenabled = true\n");
  const ApiResult announce = a.configReload("");
  ASSERT_TRUE(std::holds_alternative<ApiError>(announce));
  EXPECT_NE(std::get<ApiError>(announce).message.find("[announce]"), std::string::npos);
  EXPECT_EQ(peerState("lb-c"), "connected") << "a refused reload changes nothing";
}

// --- Tier-wide operator intent through a ControlPlane -------------------------

TierIntentEntry peerEntry(IntentOp op, const std::string& backend, std::uint64_t clock,
                          std::uint32_t weight = 0) {
  TierIntentEntry e;
  e.field = *tierFieldOf(op);
  e.stamp = TierStamp{clock, "lb-b"};
  e.record.op = op;
  e.record.backend = backend;
  e.record.id = backendIdFromName(backend);
  e.record.weight = weight;
  e.record.wallMs = static_cast<std::int64_t>(clock);
  return e;
}

TEST_F(TierControl, ANewcomerTakesThePeersIntentBeforeItIsSyncedAndKeepsItAfterARestart) {
  EventLog log(256);
  PeerChannel b(tier("lb-b", pb_, {TierPeerConfig{"lb-a", at(pa_)}}), kSeed, log);
  ASSERT_FALSE(b.open());
  // What the operator told the tier while lb-a was away: drain b2, weight 7 on b3.
  // And a backend added at run time, b9.
  TierIntentEntry add = peerEntry(IntentOp::Add, "b9", 999, 40);
  add.record.address = *parseIpAddress("10.0.1.9");
  add.record.pool = "onprem";
  add.record.port = "p0";
  TierIntent bIntent;
  (void)bIntent.merge(std::vector{peerEntry(IntentOp::Drain, "b2", 1000),
                                  peerEntry(IntentOp::Weight, "b3", 1001, 7), add});
  b.publishIntent(bIntent.entries(), bIntent.digest());

  SnapshotBuilder builder;
  ASSERT_FALSE(builder.setConfig(config()));
  auto a = std::make_unique<ControlPlane>(config(), "test.toml", builder, &dp_, 0);
  dp_.publish(a->takeSnapshot(0));
  // Before anything came from lb-b, lb-a is not synced (it waits for lb-b's
  // intent; the bound is kPeerSyncLimit, 10 s of injected time, not reached).
  EXPECT_FALSE(a->peersReady(10));

  Millis now = 0;
  const auto step = [&] {
    now += 10;
    b.poll(now);
    for (const PeerIntentDump& d : b.takeIntent()) {
      EXPECT_EQ(d.peer, "lb-a");
      (void)bIntent.merge(d.entries);
      b.publishIntent(bIntent.entries(), bIntent.digest());
    }
    if (a->tick(now)) {
      if (auto s = a->takeSnapshot(now)) dp_.publish(std::move(s));
    }
  };
  ASSERT_TRUE(pollUntil(step, [&] { return a->peersReady(now); }));
  EXPECT_LT(now, 10'000);  // by agreement, not by the time limit
  // The drain and the weight are in force, and were in the tables before
  // lb-a counted itself synced.
  const Json list = std::get<Json>(a->backendList());
  std::map<std::string, Json> byName;
  for (const Json& row : list) byName[row.at("name").get<std::string>()] = row;
  EXPECT_EQ(byName.at("b2").at("state"), "draining") << byName.at("b2").dump();
  EXPECT_EQ(byName.at("b3").at("base_weight"), 7) << byName.at("b3").dump();
  ASSERT_EQ(byName.count("b9"), 1u);
  EXPECT_EQ(byName.at("b9").at("base_weight"), 40);
  EXPECT_EQ(byName.at("b9").at("id"), backendIdFromName("b9"));
  // The operator's `--tier backend add` of the same b9 reaching lb-a after
  // the tier's copy: done already, not a conflict; another spec still is.
  BackendSpec sameAdd{"b9", "10.0.1.9", "onprem", 40, std::nullopt, std::nullopt, std::nullopt};
  const ApiResult same = a->backendAdd(sameAdd);
  ASSERT_TRUE(std::holds_alternative<Json>(same));
  EXPECT_TRUE(std::get<Json>(same).contains("already"));
  sameAdd.weight = 41;
  const ApiResult other = a->backendAdd(sameAdd);
  ASSERT_TRUE(std::holds_alternative<ApiError>(other));
  EXPECT_EQ(std::get<ApiError>(other).code, "conflict");
  const Json t = std::get<Json>(a->status()).at("tier");
  EXPECT_EQ(t.at("intent").at("entries"), 3);
  EXPECT_EQ(t.at("intent").at("agreed"), true);
  EXPECT_EQ(t.at("peers")[0].at("intent").at("differing_entries"), 0);

  // An operator change on lb-a reaches lb-b with lb-a's stamp, ordered after
  // everything lb-a had seen.
  ASSERT_TRUE(std::holds_alternative<Json>(a->backendDrain("b1")));
  ASSERT_TRUE(pollUntil(step, [&] { return bIntent.find("b1", TierField::Admin) != nullptr; }));
  const TierIntentEntry* drained = bIntent.find("b1", TierField::Admin);
  EXPECT_EQ(drained->stamp.origin, "lb-a");
  EXPECT_GT(drained->stamp.clock, 1001u);
  EXPECT_EQ(drained->record.op, IntentOp::Drain);

  // A restart (same state_dir) keeps the tier's intent before anything
  // comes from a peer (no tick yet): tier.intent and the journal.
  a.reset();
  SnapshotBuilder builder2;
  ASSERT_FALSE(builder2.setConfig(config()));
  ControlPlane again(config(), "test.toml", builder2, &dp_, now);
  const Json t2 = std::get<Json>(again.status()).at("tier");
  EXPECT_EQ(t2.at("intent").at("entries"), 4);
  char digest[24];
  std::snprintf(digest, sizeof digest, "%016llx",
                static_cast<unsigned long long>(bIntent.digest()));
  EXPECT_EQ(t2.at("intent").at("digest"), std::string(digest));  // the tier's, as lb-b holds it
  const Json list2 = std::get<Json>(again.backendList());
  for (const Json& row : list2) byName[row.at("name").get<std::string>()] = row;
  EXPECT_EQ(byName.at("b1").at("state"), "draining");
  EXPECT_EQ(byName.at("b2").at("state"), "draining");
  EXPECT_EQ(byName.at("b3").at("base_weight"), 7);
  EXPECT_EQ(byName.at("b9").at("base_weight"), 40);  // the runtime add, journaled
}

TEST_F(TierControl, AKnownDivergenceHoldsTheSyncAndStatusCountsTheDifferingEntries) {
  EventLog log(256);
  PeerChannel b(tier("lb-b", pb_, {TierPeerConfig{"lb-a", at(pa_)}}), kSeed, log);
  ASSERT_FALSE(b.open());
  // lb-b sends its intent but never merges lb-a's: a divergence that lasts.
  TierIntent bIntent;
  (void)bIntent.merge(std::vector{peerEntry(IntentOp::Drain, "b2", 1000)});
  b.publishIntent(bIntent.entries(), bIntent.digest());

  SnapshotBuilder builder;
  ASSERT_FALSE(builder.setConfig(config()));
  ControlPlane a(config(), "test.toml", builder, &dp_, 0);
  dp_.publish(a.takeSnapshot(0));
  ASSERT_TRUE(std::holds_alternative<Json>(a.backendWeight("b1", 3, false)));
  Millis now = 0;
  std::vector<TierIntentEntry> fromA;  // what lb-b got and did not merge
  const auto step = [&] {
    now += 50;
    b.poll(now);
    for (const PeerIntentDump& d : b.takeIntent()) fromA = d.entries;
    if (a.tick(now)) {
      if (auto s = a.takeSnapshot(now)) dp_.publish(std::move(s));
    }
  };
  ASSERT_TRUE(pollUntil(step, [&] {
    const Json t = std::get<Json>(a.status()).at("tier");
    return t.at("peers")[0].at("intent").at("received") == true && now > 12'000;
  })) << std::get<Json>(a.status()).at("tier").dump();
  // Past the 10 s bound for silent peers, and still not synced: lb-b is not
  // silent, it disagrees.
  EXPECT_FALSE(a.peersReady(now));
  EXPECT_FALSE(a.announceReady(now));
  const Json t = std::get<Json>(a.status()).at("tier");
  EXPECT_EQ(t.at("intent").at("divergent"), true);
  EXPECT_EQ(t.at("intent").at("differing_peers"), Json::array({"lb-b"}));
  EXPECT_EQ(t.at("peers")[0].at("intent").at("differing_entries"), 1);  // b1's weight
  EXPECT_EQ(t.at("peers")[0].at("intent").at("agrees"), false);
  // lb-b merges: agreement, and the sync completes.
  const auto mergeAndPublish = [&] {
    (void)bIntent.merge(fromA);
    for (const PeerIntentDump& d : b.takeIntent()) (void)bIntent.merge(d.entries);
    b.publishIntent(bIntent.entries(), bIntent.digest());
  };
  ASSERT_TRUE(pollUntil(
      [&] {
        now += 50;
        b.poll(now);
        mergeAndPublish();
        if (a.tick(now)) {
          if (auto s = a.takeSnapshot(now)) dp_.publish(std::move(s));
        }
      },
      [&] { return a.peersReady(now); }));
}

}  // namespace
}  // namespace spillway
