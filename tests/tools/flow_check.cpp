// spillway-flowcheck: the failover drills' traffic. Long-lived TCP flows
// through a load balancer's VIP to backends (direct server return), plus a
// stream of short probe connections that show where NEW flows land.
//
// Protocol "SWFC1", between `client` and `serve`:
//   1. On accept the server writes one hello line, "SWFC1 <NAME>\n", NAME
//      being its --name (no whitespace, at most 64 bytes). The client learns
//      the flow's backend from it; a missing "SWFC1 " prefix or no newline in
//      the first 128 bytes makes the flow "corrupt".
//   2. After the hello the server echoes every byte it receives, in order.
//      The client sends one stream per flow: consecutive 64-bit big-endian
//      sequence numbers (byte k of the stream is byte k%8 of BE64(k/8)), so
//      any echoed byte can be checked against its offset with no copy kept.
//   3. Graceful close: the client shuts down its write side; the server
//      echoes what is left, then closes, and the client waits for that FIN.
//      An EOF the client did not ask for, ECONNRESET or EPIPE is a "reset";
//      an EOF during a close before every byte came back is "corrupt".
//
// Stall: a flow is waiting while it connects, awaits its hello, has sent
// bytes not yet echoed, or awaits the FIN of its close. The stall is the time
// since the later of its last received byte and the moment it began waiting
// (the pause between echo catching up and the next send is not a stall).
// Episodes longer than --stall-ms are kept as [start_unix, duration_ms].
//
// Thread contract: `serve` and `client` are each one epoll thread; signals
// arrive through a signalfd. Memory per flow is bounded: no sent data is
// kept, the unsent backlog is a counter (at most kMaxUnsent), the server's
// per-connection echo backlog stops reading at kMaxEchoBacklog, and at most
// kMaxStallEpisodes episodes are kept per flow (the rest are counted).
//
// Echo round-trip times: each flow has at most one byte offset in flight as
// a marker (the end of a send, set when none is in flight), and the time
// from that send to the echo of that byte is one sample. Samples fold into
// per-interval points (--rtt-ms, intervals aligned across flows from the
// client's start): the interval's start, the median, the sample count and
// the maximum, as the report's per-flow "rtt" [[t, median_ms, n, max_ms],
// ...]. A stall is one long sample (the marker waits through it), so the
// median of an interval shows the path's round trip, its maximum the stall.
// At most kMaxRttSamples samples per interval (a reservoir) and
// kMaxRttPoints points per flow (later ones counted as rtt_dropped).
//
// Times in the report and timeline are CLOCK_REALTIME seconds, derived from
// CLOCK_MONOTONIC offsets taken at start, so they line up with the drill's
// own clock while intervals stay immune to clock steps.
//
// Exit codes: 0 on a normal end (signal, `stop`, --duration-s), 1 on a
// runtime failure (cannot write the report, epoll), 2 on bad arguments.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace spillway {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

constexpr std::string_view kHelloPrefix = "SWFC1 ";
constexpr std::size_t kMaxNameLength = 64;
constexpr std::size_t kMaxHelloLength = 128;
constexpr std::size_t kIoBufferSize = 64 * 1024;
constexpr std::size_t kMaxEchoBacklog = 1024 * 1024;
constexpr std::uint64_t kMaxUnsent = 1024 * 1024;
constexpr std::size_t kMaxStallEpisodes = 256;
constexpr std::size_t kMaxRttSamples = 64;
constexpr std::size_t kMaxRttPoints = 3600;
constexpr std::size_t kMaxProbeRecords = 1'000'000;
constexpr std::size_t kMaxCommandLine = 4096;
constexpr std::int64_t kNsPerMs = 1'000'000;
constexpr std::int64_t kNsPerSecond = 1'000'000'000;
constexpr std::int64_t kTickNs = 10 * kNsPerMs;
constexpr std::int64_t kFinTimeoutNs = 3 * kNsPerSecond;
constexpr int kMaxEvents = 512;
constexpr int kReadsPerEvent = 16;

std::int64_t monoNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * kNsPerSecond + ts.tv_nsec;
}

// CLOCK_REALTIME for any monotonic instant, from one pair of readings.
class WallClock {
 public:
  WallClock() : monoBase_(monoNs()) {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    realBase_ = static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
  }
  double at(std::int64_t mono) const {
    const double t = realBase_ + static_cast<double>(mono - monoBase_) / 1e9;
    return std::round(t * 1e6) / 1e6;
  }

 private:
  std::int64_t monoBase_;
  double realBase_ = 0;
};

double nsToMs(std::int64_t ns) {
  return std::round(static_cast<double>(ns) / 1e3) / 1e3;
}

struct Endpoint {
  sockaddr_storage addr{};
  socklen_t length = 0;
  int family() const { return addr.ss_family; }
};

std::optional<Endpoint> makeEndpoint(const std::string& host, int port) {
  if (port < 0 || port > 65535) return std::nullopt;
  Endpoint ep;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ep.addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ep.addr);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<std::uint16_t>(port));
    ep.length = sizeof(sockaddr_in);
    return ep;
  }
  if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<std::uint16_t>(port));
    ep.length = sizeof(sockaddr_in6);
    return ep;
  }
  return std::nullopt;
}

// "10.0.0.1:80" or "[fd00::1]:80".
std::optional<Endpoint> parseHostPort(std::string_view text) {
  std::string host;
  std::string_view portText;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find("]:");
    if (close == std::string_view::npos) return std::nullopt;
    host = std::string(text.substr(1, close - 1));
    portText = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) return std::nullopt;
    host = std::string(text.substr(0, colon));
    portText = text.substr(colon + 1);
  }
  int port = 0;
  const auto [end, ec] = std::from_chars(portText.data(), portText.data() + portText.size(), port);
  if (ec != std::errc{} || end != portText.data() + portText.size() || port < 1 || port > 65535) {
    return std::nullopt;
  }
  return makeEndpoint(host, port);
}

int localPort(int fd) {
  sockaddr_storage addr{};
  socklen_t length = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) return 0;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return 0;
}

void raiseFdLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

// SIGTERM and SIGINT as a readable fd; SIGPIPE ignored (sends also use
// MSG_NOSIGNAL).
int openSignalFd() {
  signal(SIGPIPE, SIG_IGN);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  return signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
}

bool isTransient(int err) {
  return err == EAGAIN || err == EWOULDBLOCK || err == EINTR;
}

void setNoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Byte `offset` of the flow's stream: consecutive BE64 sequence numbers.
void fillStream(std::uint64_t offset, std::span<std::byte> out) {
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::uint64_t at = offset + i;
    const unsigned shift = 8 * (7 - static_cast<unsigned>(at % 8));
    out[i] = static_cast<std::byte>(((at / 8) >> shift) & 0xff);
  }
}

bool validName(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  return std::none_of(name.begin(), name.end(), [](char c) { return c <= ' ' || c == 0x7f; });
}

// Epoll user data: the kind in the top byte, an index below it.
enum class Tag : std::uint64_t { Signal = 1, Listener, Conn, Stdin, Flow, Probe };
constexpr std::uint64_t pack(Tag tag, std::uint64_t index) {
  return (static_cast<std::uint64_t>(tag) << 56) | index;
}
constexpr Tag tagOf(std::uint64_t data) {
  return static_cast<Tag>(data >> 56);
}
constexpr std::uint64_t indexOf(std::uint64_t data) {
  return data & ((1ULL << 56) - 1);
}

bool epollAdd(int ep, int fd, std::uint32_t events, std::uint64_t data) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = data;
  return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0;
}

void epollMod(int ep, int fd, std::uint32_t events, std::uint64_t data) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = data;
  epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
}

// ---------------------------------------------------------------- serve --

struct ServeOptions {
  std::string name;
  std::vector<int> ports;
  std::string bind = "0.0.0.0";
};

class EchoServer {
 public:
  explicit EchoServer(ServeOptions options) : options_(std::move(options)) {}
  int run();

 private:
  struct Conn {
    int fd = -1;
    std::vector<char> out;
    std::size_t outOffset = 0;
    bool peerDone = false;
    std::uint32_t events = 0;
  };

  void acceptAll(int listener);
  void service(std::size_t fd);
  void drop(std::size_t fd);
  std::size_t backlog(const Conn& conn) const { return conn.out.size() - conn.outOffset; }

  ServeOptions options_;
  int epoll_ = -1;
  int reserveFd_ = -1;
  std::vector<std::unique_ptr<Conn>> conns_;  // indexed by fd
  std::array<char, kIoBufferSize> buffer_{};
};

int EchoServer::run() {
  raiseFdLimit();
  const int signals = openSignalFd();
  epoll_ = epoll_create1(EPOLL_CLOEXEC);
  if (signals < 0 || epoll_ < 0) {
    std::fprintf(stderr, "flowcheck serve: signalfd/epoll: %s\n", std::strerror(errno));
    return kExitFailure;
  }
  epollAdd(epoll_, signals, EPOLLIN, pack(Tag::Signal, 0));
  for (const int port : options_.ports) {
    const auto ep = makeEndpoint(options_.bind, port);
    const int fd = socket(ep->family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    const int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, reinterpret_cast<const sockaddr*>(&ep->addr), ep->length) != 0 ||
        listen(fd, 4096) != 0) {
      std::fprintf(stderr, "flowcheck serve: cannot listen on %s port %d: %s\n",
                   options_.bind.c_str(), port, std::strerror(errno));
      return kExitFailure;
    }
    epollAdd(epoll_, fd, EPOLLIN, pack(Tag::Listener, static_cast<std::uint64_t>(fd)));
  }
  reserveFd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  std::fprintf(stderr, "flowcheck serve: %s listening on %s, %zu port(s)\n", options_.name.c_str(),
               options_.bind.c_str(), options_.ports.size());

  std::array<epoll_event, kMaxEvents> events{};
  for (;;) {
    const int n = epoll_wait(epoll_, events.data(), kMaxEvents, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "flowcheck serve: epoll_wait: %s\n", std::strerror(errno));
      return kExitFailure;
    }
    for (int i = 0; i < n; ++i) {
      const std::uint64_t data = events[static_cast<std::size_t>(i)].data.u64;
      switch (tagOf(data)) {
        case Tag::Signal:
          std::fprintf(stderr, "flowcheck serve: %s: signal, exiting\n", options_.name.c_str());
          return kExitOk;
        case Tag::Listener:
          acceptAll(static_cast<int>(indexOf(data)));
          break;
        case Tag::Conn:
          service(indexOf(data));
          break;
        default:
          break;
      }
    }
  }
}

void EchoServer::acceptAll(int listener) {
  for (;;) {
    const int fd = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        // Out of descriptors: accept and close one so the backlog drains
        // instead of waking us forever.
        if (reserveFd_ >= 0) close(reserveFd_);
        const int victim = accept(listener, nullptr, nullptr);
        if (victim >= 0) close(victim);
        reserveFd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (victim < 0) return;  // nothing freed: wait for the next wake-up
        continue;
      }
      return;  // EAGAIN, or a connection that died in the backlog
    }
    setNoDelay(fd);
    const auto index = static_cast<std::size_t>(fd);
    if (conns_.size() <= index) conns_.resize(index + 1);
    auto conn = std::make_unique<Conn>();
    conn->fd = fd;
    const std::string hello = std::string(kHelloPrefix) + options_.name + "\n";
    conn->out.assign(hello.begin(), hello.end());
    conn->events = EPOLLIN | EPOLLRDHUP;
    conns_[index] = std::move(conn);
    if (!epollAdd(epoll_, fd, EPOLLIN | EPOLLRDHUP, pack(Tag::Conn, index))) {
      drop(index);
      continue;
    }
    service(index);
  }
}

void EchoServer::service(std::size_t index) {
  if (index >= conns_.size() || !conns_[index]) return;
  Conn& conn = *conns_[index];
  for (int reads = 0; reads < kReadsPerEvent && !conn.peerDone && backlog(conn) < kMaxEchoBacklog;
       ++reads) {
    const ssize_t got = recv(conn.fd, buffer_.data(), buffer_.size(), 0);
    if (got > 0) {
      conn.out.insert(conn.out.end(), buffer_.data(), buffer_.data() + got);
      continue;
    }
    if (got == 0) {
      conn.peerDone = true;
      break;
    }
    if (isTransient(errno)) break;
    drop(index);  // reset by the peer, or any other error: just close
    return;
  }
  while (backlog(conn) > 0) {
    const ssize_t sent =
        send(conn.fd, conn.out.data() + conn.outOffset, backlog(conn), MSG_NOSIGNAL);
    if (sent > 0) {
      conn.outOffset += static_cast<std::size_t>(sent);
      continue;
    }
    if (sent < 0 && isTransient(errno)) break;
    drop(index);
    return;
  }
  if (backlog(conn) == 0) {
    conn.out.clear();
    conn.outOffset = 0;
    if (conn.peerDone) {
      drop(index);  // everything echoed; closing sends our FIN
      return;
    }
  } else if (conn.outOffset > conn.out.size() / 2) {
    conn.out.erase(conn.out.begin(),
                   conn.out.begin() + static_cast<std::ptrdiff_t>(conn.outOffset));
    conn.outOffset = 0;
  }
  std::uint32_t want = 0;
  if (!conn.peerDone && backlog(conn) < kMaxEchoBacklog) want |= EPOLLIN | EPOLLRDHUP;
  if (backlog(conn) > 0) want |= EPOLLOUT;
  if (want != conn.events) {
    conn.events = want;
    epollMod(epoll_, conn.fd, want, pack(Tag::Conn, index));
  }
}

void EchoServer::drop(std::size_t index) {
  close(conns_[index]->fd);
  conns_[index].reset();
}

// --------------------------------------------------------------- client --

struct ClientOptions {
  std::string target;
  int flows = 0;
  std::string bind;
  int intervalMs = 50;
  int chunk = 256;
  int stallMs = 1000;
  int connectTimeoutMs = 2000;
  double openRate = 200;
  double probeRate = 0;
  std::string probeTarget;
  std::string timeline;
  int timelineMs = 100;
  int rttMs = 1000;
  std::string report;
  double durationS = 0;
  std::string ready;
};

enum class Phase { Connecting, AwaitHello, Live, Closing, Ended };
// NotOpened: the client stopped while the flow was still connecting (an
// `open N` late in a run); not a broken flow.
enum class EndState { OpenAtEnd, Closed, Reset, Corrupt, ConnectFailed, NotOpened };

constexpr std::array<const char*, 6> kEndStateNames = {
    "open_at_end", "closed", "reset", "corrupt", "connect_failed", "not_opened"};

const char* endStateName(EndState state) {
  return kEndStateNames[static_cast<std::size_t>(state)];
}

bool isBroken(EndState state) {
  return state == EndState::Reset || state == EndState::Corrupt || state == EndState::ConnectFailed;
}

// One interval of a flow's echo round trips.
struct RttPoint {
  std::int64_t interval = 0;  // index from the client's start
  float medianMs = 0;
  float maxMs = 0;
  std::uint32_t samples = 0;
};

// The median of `samples` (sorted in place; the mean of the middle two for
// an even count). Empty: 0.
float medianOf(std::vector<float>& samples) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const std::size_t mid = samples.size() / 2;
  return samples.size() % 2 == 1 ? samples[mid] : (samples[mid - 1] + samples[mid]) / 2;
}

struct Flow {
  std::uint64_t id = 0;
  int fd = -1;
  Phase phase = Phase::Connecting;
  EndState endState = EndState::OpenAtEnd;
  EndState closeAs = EndState::Closed;  // what a completed close becomes
  int localPort = 0;
  int backend = -1;
  std::string hello;
  std::int64_t openedNs = 0;
  std::int64_t liveNs = 0;  // when the hello arrived (0: never)
  std::int64_t endedNs = 0;
  std::int64_t nextSendNs = 0;
  std::int64_t closeDeadlineNs = 0;
  std::uint64_t queued = 0;
  std::uint64_t sent = 0;
  std::uint64_t echoed = 0;
  bool waiting = false;
  std::int64_t waitSinceNs = 0;
  std::int64_t maxStallNs = 0;
  std::vector<std::pair<double, double>> stalls;
  std::uint64_t stallsDropped = 0;
  std::uint32_t events = 0;
  std::string error;
  // Echo round trips (see the header): the marker in flight (0: none), and
  // the samples of the interval rttInterval.
  std::uint64_t rttMark = 0;
  std::int64_t rttMarkNs = 0;
  std::int64_t rttInterval = -1;
  std::uint32_t rttSeen = 0;  // samples this interval, kept or not
  float rttMaxMs = 0;         // ... the largest of them
  std::vector<float> rttSamples;
  std::vector<RttPoint> rtt;
  std::uint64_t rttDropped = 0;
};

struct Probe {
  int fd = -1;
  std::int64_t startNs = 0;
  bool connected = false;
  std::uint32_t events = 0;
  std::string hello;
};

struct ProbeRecord {
  double t = 0;
  int backend = -1;
  double ms = 0;
  std::string error;
  int localPort = 0;  // 0: the connect never got a port
};

class FlowClient {
 public:
  FlowClient(ClientOptions options, Endpoint target, Endpoint probeTarget,
             std::optional<Endpoint> bind)
      : options_(std::move(options)),
        target_(target),
        probeTarget_(probeTarget),
        bind_(bind),
        intervalNs_(std::int64_t{options_.intervalMs} * kNsPerMs),
        stallNs_(std::int64_t{options_.stallMs} * kNsPerMs),
        connectTimeoutNs_(std::int64_t{options_.connectTimeoutMs} * kNsPerMs),
        rttIntervalNs_(std::int64_t{options_.rttMs} * kNsPerMs),
        probeRate_(options_.probeRate) {}
  int run();

 private:
  int openSocket(const Endpoint& to, int& err);
  void startFlow(std::int64_t now);
  void onFlowEvent(Flow& flow, std::uint32_t events, std::int64_t now);
  void onConnected(Flow& flow, std::int64_t now);
  void readFlow(Flow& flow, std::int64_t now);
  bool consumeHello(Flow& flow, std::string_view data, std::int64_t now, std::size_t& used);
  bool verifyEcho(Flow& flow, std::span<const std::byte> data);
  void sendFlow(Flow& flow, std::int64_t now);
  void beginClose(Flow& flow, EndState as, std::int64_t now);
  void endFlow(Flow& flow, EndState state, std::int64_t now, std::string error = {});
  // Our close got no FIN within the wait: unechoed data makes it corrupt.
  void endCloseTimedOut(Flow& flow, std::int64_t now);
  void setFlowInterest(Flow& flow, bool wantOut);
  void updateWaiting(Flow& flow, std::int64_t now);
  void noteReceived(Flow& flow, std::int64_t now);
  void closeStallEpisode(Flow& flow, std::int64_t now);
  void noteRtt(Flow& flow, std::int64_t now);
  void closeRttInterval(Flow& flow);

  void startProbe(std::int64_t now);
  void onProbeEvent(std::size_t index, std::uint32_t events, std::int64_t now);
  void endProbe(std::size_t index, std::int64_t now, int backend, std::string error);

  void readCommands(std::int64_t now);
  void runCommand(std::string_view line, std::int64_t now);
  void beginStop(std::int64_t now, const char* why);
  void tick(std::int64_t now);
  void writeTimeline(std::int64_t now);
  void checkReady();
  int writeReport(std::int64_t now);
  int backendIndex(std::string_view name);

  ClientOptions options_;
  Endpoint target_;
  Endpoint probeTarget_;
  std::optional<Endpoint> bind_;
  std::int64_t intervalNs_;
  std::int64_t stallNs_;
  std::int64_t connectTimeoutNs_;
  std::int64_t rttIntervalNs_;
  double probeRate_;
  std::uint64_t rttRandom_ = 0x9e3779b97f4a7c15ULL;  // the reservoir's xorshift state
  WallClock clock_;

  int epoll_ = -1;
  bool stdinOpen_ = false;
  std::string commandBuffer_;
  bool discardingLine_ = false;

  std::vector<std::unique_ptr<Flow>> flows_;
  std::vector<std::size_t> active_;  // indices of flows not yet ended
  std::uint64_t pendingOpens_ = 0;
  std::uint64_t notOpened_ = 0;
  double openTokens_ = 1;
  double probeTokens_ = 0;
  std::int64_t lastTickNs_ = 0;
  std::uint64_t broken_ = 0;

  std::vector<std::unique_ptr<Probe>> probes_;  // slots, reused
  std::vector<std::size_t> freeProbeSlots_;
  std::vector<ProbeRecord> probeRecords_;
  std::uint64_t probeRecordsDropped_ = 0;
  std::uint64_t probesOk_ = 0;
  std::uint64_t probesFailed_ = 0;

  std::vector<std::string> backends_;
  std::map<std::string, int, std::less<>> backendIds_;
  std::vector<std::uint64_t> periodProbes_;
  std::uint64_t periodProbeFailures_ = 0;

  std::FILE* timeline_ = nullptr;
  std::int64_t nextTimelineNs_ = 0;
  bool readyWritten_ = false;
  std::int64_t startedNs_ = 0;
  std::int64_t durationEndNs_ = 0;
  bool stopping_ = false;
  std::int64_t stopDeadlineNs_ = 0;

  std::array<std::byte, kIoBufferSize> ioBuffer_{};
  std::array<std::byte, kIoBufferSize> expectBuffer_{};
};

int FlowClient::backendIndex(std::string_view name) {
  if (const auto it = backendIds_.find(name); it != backendIds_.end()) return it->second;
  const int id = static_cast<int>(backends_.size());
  backends_.emplace_back(name);
  backendIds_.emplace(std::string(name), id);
  periodProbes_.push_back(0);
  return id;
}

int FlowClient::openSocket(const Endpoint& to, int& err) {
  const int fd = socket(to.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    err = errno;
    return -1;
  }
  setNoDelay(fd);
  if (bind_) {
    const int one = 1;
    setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
    if (bind(fd, reinterpret_cast<const sockaddr*>(&bind_->addr), bind_->length) != 0) {
      err = errno;
      close(fd);
      return -1;
    }
  }
  if (connect(fd, reinterpret_cast<const sockaddr*>(&to.addr), to.length) != 0 &&
      errno != EINPROGRESS) {
    err = errno;
    close(fd);
    return -1;
  }
  err = 0;
  return fd;
}

void FlowClient::startFlow(std::int64_t now) {
  auto flow = std::make_unique<Flow>();
  flow->id = flows_.size();
  flow->openedNs = now;
  const std::size_t index = flows_.size();
  flows_.push_back(std::move(flow));
  active_.push_back(index);
  Flow& f = *flows_.back();
  int err = 0;
  f.fd = openSocket(target_, err);
  if (f.fd < 0) {
    endFlow(f, EndState::ConnectFailed, now, std::string("connect: ") + std::strerror(err));
    return;
  }
  f.localPort = localPort(f.fd);
  f.events = EPOLLOUT;
  if (!epollAdd(epoll_, f.fd, f.events, pack(Tag::Flow, index))) {
    endFlow(f, EndState::ConnectFailed, now, std::string("epoll: ") + std::strerror(errno));
    return;
  }
  updateWaiting(f, now);
}

void FlowClient::setFlowInterest(Flow& flow, bool wantOut) {
  const std::uint32_t want = EPOLLIN | EPOLLRDHUP | (wantOut ? EPOLLOUT : 0U);
  if (want != flow.events) {
    flow.events = want;
    epollMod(epoll_, flow.fd, want, pack(Tag::Flow, flow.id));
  }
}

// Keeps `waiting` in step with the flow's phase and counters; a flow that
// starts waiting starts its stall clock now.
void FlowClient::updateWaiting(Flow& flow, std::int64_t now) {
  bool waiting = false;
  switch (flow.phase) {
    case Phase::Connecting:
    case Phase::AwaitHello:
    case Phase::Closing:
      waiting = true;
      break;
    case Phase::Live:
      waiting = flow.sent > flow.echoed;
      break;
    case Phase::Ended:
      waiting = false;
      break;
  }
  if (waiting && !flow.waiting) flow.waitSinceNs = now;
  flow.waiting = waiting;
}

void FlowClient::closeStallEpisode(Flow& flow, std::int64_t now) {
  if (!flow.waiting) return;
  const std::int64_t stall = now - flow.waitSinceNs;
  flow.maxStallNs = std::max(flow.maxStallNs, stall);
  if (stall > stallNs_) {
    if (flow.stalls.size() < kMaxStallEpisodes) {
      flow.stalls.emplace_back(clock_.at(flow.waitSinceNs), nsToMs(stall));
    } else {
      ++flow.stallsDropped;
    }
  }
}

void FlowClient::noteReceived(Flow& flow, std::int64_t now) {
  closeStallEpisode(flow, now);
  flow.waitSinceNs = now;
}

// The marker's echo arrived (or not yet): one sample into its interval.
void FlowClient::noteRtt(Flow& flow, std::int64_t now) {
  if (flow.rttMark == 0 || flow.echoed < flow.rttMark) return;
  const auto ms = static_cast<float>(static_cast<double>(now - flow.rttMarkNs) / 1e6);
  flow.rttMark = 0;
  const std::int64_t interval = (now - startedNs_) / rttIntervalNs_;
  if (interval != flow.rttInterval) {
    closeRttInterval(flow);
    flow.rttInterval = interval;
  }
  ++flow.rttSeen;
  flow.rttMaxMs = std::max(flow.rttMaxMs, ms);
  if (flow.rttSamples.size() < kMaxRttSamples) {
    flow.rttSamples.push_back(ms);
    return;
  }
  // Reservoir: the k-th sample replaces a kept one with probability
  // kMaxRttSamples / k, so the kept ones are a uniform draw of the interval's.
  rttRandom_ ^= rttRandom_ << 13;
  rttRandom_ ^= rttRandom_ >> 7;
  rttRandom_ ^= rttRandom_ << 17;
  const std::uint64_t slot = rttRandom_ % flow.rttSeen;
  if (slot < kMaxRttSamples) flow.rttSamples[static_cast<std::size_t>(slot)] = ms;
}

void FlowClient::closeRttInterval(Flow& flow) {
  if (flow.rttSamples.empty()) return;
  if (flow.rtt.size() < kMaxRttPoints) {
    RttPoint point;
    point.interval = flow.rttInterval;
    point.samples = flow.rttSeen;
    point.maxMs = flow.rttMaxMs;  // of every sample, not only the reservoir's
    point.medianMs = medianOf(flow.rttSamples);
    flow.rtt.push_back(point);
  } else {
    ++flow.rttDropped;
  }
  flow.rttSamples.clear();
  flow.rttSeen = 0;
  flow.rttMaxMs = 0;
}

void FlowClient::endCloseTimedOut(Flow& flow, std::int64_t now) {
  if (flow.echoed != flow.sent) {
    endFlow(flow, EndState::Corrupt, now,
            "no FIN within 3 s of our close, " + std::to_string(flow.sent - flow.echoed) +
                " bytes never echoed");
  } else {
    endFlow(flow, flow.closeAs, now, "no FIN from the server within 3 s of our close");
  }
}

void FlowClient::endFlow(Flow& flow, EndState state, std::int64_t now, std::string error) {
  if (flow.phase == Phase::Ended) return;
  closeStallEpisode(flow, now);
  if (flow.fd >= 0) close(flow.fd);
  flow.fd = -1;
  flow.phase = Phase::Ended;
  flow.waiting = false;
  flow.endState = state;
  flow.endedNs = now;
  flow.error = std::move(error);
  flow.hello.clear();
  flow.hello.shrink_to_fit();
  if (isBroken(state)) ++broken_;
}

void FlowClient::beginClose(Flow& flow, EndState as, std::int64_t now) {
  if (flow.phase != Phase::Live) return;
  flow.queued = flow.sent;  // an unsent backlog is dropped, not half-sent
  if (shutdown(flow.fd, SHUT_WR) != 0) {
    endFlow(flow, EndState::Reset, now, std::string("shutdown: ") + std::strerror(errno));
    return;
  }
  flow.phase = Phase::Closing;
  flow.closeAs = as;
  flow.closeDeadlineNs = now + kFinTimeoutNs;
  setFlowInterest(flow, false);
  updateWaiting(flow, now);
}

void FlowClient::onFlowEvent(Flow& flow, std::uint32_t events, std::int64_t now) {
  if (flow.phase == Phase::Ended) return;
  if (flow.phase == Phase::Connecting) {
    if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) == 0) return;
    int err = 0;
    socklen_t length = sizeof(err);
    getsockopt(flow.fd, SOL_SOCKET, SO_ERROR, &err, &length);
    if (err != 0) {
      endFlow(flow, EndState::ConnectFailed, now, std::string("connect: ") + std::strerror(err));
      return;
    }
    onConnected(flow, now);
    return;
  }
  if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLERR | EPOLLHUP)) != 0) readFlow(flow, now);
  if (flow.phase == Phase::Live && (events & EPOLLOUT) != 0) sendFlow(flow, now);
}

void FlowClient::onConnected(Flow& flow, std::int64_t now) {
  flow.phase = Phase::AwaitHello;
  setFlowInterest(flow, false);
  updateWaiting(flow, now);
  readFlow(flow, now);
}

bool FlowClient::consumeHello(Flow& flow, std::string_view data, std::int64_t now,
                              std::size_t& used) {
  const auto newline = data.find('\n');
  const std::size_t take = newline == std::string_view::npos ? data.size() : newline + 1;
  if (flow.hello.size() + take > kMaxHelloLength) {
    endFlow(flow, EndState::Corrupt, now, "no hello line in the first 128 bytes");
    return false;
  }
  flow.hello.append(data.substr(0, take));
  used = take;
  if (newline == std::string_view::npos) return true;
  std::string_view line(flow.hello);
  line.remove_suffix(1);
  if (!line.starts_with(kHelloPrefix) || !validName(line.substr(kHelloPrefix.size()))) {
    std::string shown;
    for (const char c : line.substr(0, 64)) shown += (c >= ' ' && c < 0x7f) ? c : '?';
    endFlow(flow, EndState::Corrupt, now, "bad hello: \"" + shown + "\"");
    return false;
  }
  flow.backend = backendIndex(line.substr(kHelloPrefix.size()));
  flow.hello.clear();
  flow.hello.shrink_to_fit();
  flow.phase = Phase::Live;
  flow.liveNs = now;
  flow.nextSendNs = now;
  updateWaiting(flow, now);
  checkReady();
  return true;
}

bool FlowClient::verifyEcho(Flow& flow, std::span<const std::byte> data) {
  if (flow.echoed + data.size() > flow.sent) {
    flow.error = "echo beyond the bytes sent (offset " + std::to_string(flow.sent) + ")";
    return false;
  }
  const auto expect = std::span(expectBuffer_).first(data.size());
  fillStream(flow.echoed, expect);
  if (std::memcmp(expect.data(), data.data(), data.size()) != 0) {
    std::size_t at = 0;
    while (expect[at] == data[at]) ++at;
    flow.error = "echo differs at stream offset " + std::to_string(flow.echoed + at);
    return false;
  }
  flow.echoed += data.size();
  return true;
}

void FlowClient::readFlow(Flow& flow, std::int64_t now) {
  for (int reads = 0; reads < kReadsPerEvent; ++reads) {
    const ssize_t got = recv(flow.fd, ioBuffer_.data(), ioBuffer_.size(), 0);
    if (got > 0) {
      noteReceived(flow, now);
      auto data = std::span<const std::byte>(ioBuffer_.data(), static_cast<std::size_t>(got));
      if (flow.phase == Phase::AwaitHello) {
        std::size_t used = 0;
        const std::string_view text(reinterpret_cast<const char*>(data.data()), data.size());
        if (!consumeHello(flow, text, now, used)) return;
        data = data.subspan(used);
      }
      if (!data.empty() && !verifyEcho(flow, data)) {
        endFlow(flow, EndState::Corrupt, now, flow.error);
        return;
      }
      noteRtt(flow, now);
      updateWaiting(flow, now);
      continue;
    }
    if (got == 0) {
      if (flow.phase != Phase::Closing) {
        endFlow(flow, EndState::Reset, now, "EOF from the server");
      } else if (flow.echoed != flow.sent) {
        endFlow(flow, EndState::Corrupt, now,
                "EOF after " + std::to_string(flow.echoed) + " of " + std::to_string(flow.sent) +
                    " bytes echoed");
      } else {
        endFlow(flow, flow.closeAs, now);
      }
      return;
    }
    if (isTransient(errno)) return;
    const int err = errno;
    endFlow(flow, flow.phase == Phase::AwaitHello ? EndState::ConnectFailed : EndState::Reset, now,
            std::string("recv: ") + std::strerror(err));
    return;
  }
}

void FlowClient::sendFlow(Flow& flow, std::int64_t now) {
  bool blocked = false;
  const std::uint64_t before = flow.sent;
  while (flow.sent < flow.queued) {
    const std::size_t length =
        static_cast<std::size_t>(std::min<std::uint64_t>(flow.queued - flow.sent, kIoBufferSize));
    const auto chunk = std::span(ioBuffer_).first(length);
    fillStream(flow.sent, chunk);
    const ssize_t sent = send(flow.fd, chunk.data(), chunk.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      flow.sent += static_cast<std::uint64_t>(sent);
      continue;
    }
    if (sent < 0 && isTransient(errno)) {
      blocked = true;
      break;
    }
    const int err = sent < 0 ? errno : EPIPE;
    endFlow(flow, EndState::Reset, now, std::string("send: ") + std::strerror(err));
    return;
  }
  if (flow.rttMark == 0 && flow.sent > before) {
    flow.rttMark = flow.sent;
    flow.rttMarkNs = now;
  }
  setFlowInterest(flow, blocked);
  updateWaiting(flow, now);
}

void FlowClient::startProbe(std::int64_t now) {
  int err = 0;
  const int fd = openSocket(probeTarget_, err);
  if (fd < 0) {
    ++probesFailed_;
    ++periodProbeFailures_;
    if (probeRecords_.size() < kMaxProbeRecords) {
      probeRecords_.push_back(
          {clock_.at(now), -1, 0, std::string("connect: ") + std::strerror(err)});
    } else {
      ++probeRecordsDropped_;
    }
    return;
  }
  std::size_t index = 0;
  if (!freeProbeSlots_.empty()) {
    index = freeProbeSlots_.back();
    freeProbeSlots_.pop_back();
  } else {
    index = probes_.size();
    probes_.emplace_back();
  }
  probes_[index] = std::make_unique<Probe>();
  Probe& probe = *probes_[index];
  probe.fd = fd;
  probe.startNs = now;
  probe.events = EPOLLOUT;
  if (!epollAdd(epoll_, fd, EPOLLOUT, pack(Tag::Probe, index))) {
    endProbe(index, now, -1, std::string("epoll: ") + std::strerror(errno));
  }
}

void FlowClient::endProbe(std::size_t index, std::int64_t now, int backend, std::string error) {
  Probe& probe = *probes_[index];
  const int port = localPort(probe.fd);
  close(probe.fd);
  if (backend >= 0) {
    ++probesOk_;
    ++periodProbes_[static_cast<std::size_t>(backend)];
  } else {
    ++probesFailed_;
    ++periodProbeFailures_;
  }
  if (probeRecords_.size() < kMaxProbeRecords) {
    probeRecords_.push_back(
        {clock_.at(probe.startNs), backend, nsToMs(now - probe.startNs), std::move(error), port});
  } else {
    ++probeRecordsDropped_;
  }
  probes_[index].reset();
  freeProbeSlots_.push_back(index);
}

void FlowClient::onProbeEvent(std::size_t index, std::uint32_t events, std::int64_t now) {
  if (index >= probes_.size() || !probes_[index]) return;
  Probe& probe = *probes_[index];
  if (!probe.connected) {
    int err = 0;
    socklen_t length = sizeof(err);
    getsockopt(probe.fd, SOL_SOCKET, SO_ERROR, &err, &length);
    if (err != 0) {
      endProbe(index, now, -1, std::string("connect: ") + std::strerror(err));
      return;
    }
    probe.connected = true;
    probe.events = EPOLLIN | EPOLLRDHUP;
    epollMod(epoll_, probe.fd, probe.events, pack(Tag::Probe, index));
    events |= EPOLLIN;
  }
  if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLERR | EPOLLHUP)) == 0) return;
  std::array<char, kMaxHelloLength> buffer{};
  const ssize_t got = recv(probe.fd, buffer.data(), kMaxHelloLength - probe.hello.size(), 0);
  if (got < 0 && isTransient(errno)) return;
  if (got <= 0) {
    endProbe(index, now, -1,
             got == 0 ? std::string("EOF before the hello")
                      : std::string("recv: ") + std::strerror(errno));
    return;
  }
  probe.hello.append(buffer.data(), static_cast<std::size_t>(got));
  const auto newline = probe.hello.find('\n');
  if (newline == std::string::npos) {
    if (probe.hello.size() >= kMaxHelloLength) endProbe(index, now, -1, "no hello line");
    return;
  }
  const std::string_view line = std::string_view(probe.hello).substr(0, newline);
  if (!line.starts_with(kHelloPrefix) || !validName(line.substr(kHelloPrefix.size()))) {
    endProbe(index, now, -1, "bad hello");
    return;
  }
  endProbe(index, now, backendIndex(line.substr(kHelloPrefix.size())), {});
}

void FlowClient::readCommands(std::int64_t now) {
  std::array<char, 4096> buffer{};
  const ssize_t got = read(STDIN_FILENO, buffer.data(), buffer.size());
  if (got < 0 && isTransient(errno)) return;
  if (got <= 0) {
    epoll_ctl(epoll_, EPOLL_CTL_DEL, STDIN_FILENO, nullptr);
    stdinOpen_ = false;
    return;
  }
  for (const char c : std::string_view(buffer.data(), static_cast<std::size_t>(got))) {
    if (c == '\n') {
      if (discardingLine_) {
        std::fprintf(stderr, "flowcheck: command line too long, ignored\n");
      } else {
        runCommand(commandBuffer_, now);
      }
      commandBuffer_.clear();
      discardingLine_ = false;
    } else if (commandBuffer_.size() < kMaxCommandLine) {
      commandBuffer_ += c;
    } else {
      discardingLine_ = true;
    }
  }
}

void FlowClient::runCommand(std::string_view line, std::int64_t now) {
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back())))
    line.remove_suffix(1);
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front())))
    line.remove_prefix(1);
  if (line.empty()) return;
  const auto space = line.find(' ');
  const std::string_view verb = line.substr(0, space);
  std::string_view arg =
      space == std::string_view::npos ? std::string_view{} : line.substr(space + 1);
  while (!arg.empty() && arg.front() == ' ') arg.remove_prefix(1);
  const std::string shown(line);
  if (stopping_) {
    std::fprintf(stderr, "flowcheck: stopping, ignored: %s\n", shown.c_str());
    return;
  }
  if (verb == "close" && !arg.empty()) {
    int closed = 0;
    for (const std::size_t index : active_) {
      Flow& flow = *flows_[index];
      if (flow.phase == Phase::Live && flow.backend >= 0 &&
          backends_[static_cast<std::size_t>(flow.backend)] == arg) {
        beginClose(flow, EndState::Closed, now);
        ++closed;
      }
    }
    std::fprintf(stderr, "flowcheck: close %s: closing %d live flow(s)\n", std::string(arg).c_str(),
                 closed);
  } else if (verb == "close-all" && arg.empty()) {
    int closed = 0;
    for (const std::size_t index : active_) {
      if (flows_[index]->phase != Phase::Live) continue;
      beginClose(*flows_[index], EndState::Closed, now);
      ++closed;
    }
    std::fprintf(stderr, "flowcheck: close-all: closing %d live flow(s)\n", closed);
  } else if (verb == "open" && !arg.empty()) {
    std::uint64_t count = 0;
    const auto [end, ec] = std::from_chars(arg.data(), arg.data() + arg.size(), count);
    if (ec != std::errc{} || end != arg.data() + arg.size() || count == 0 || count > 1'000'000) {
      std::fprintf(stderr, "flowcheck: open: want a count 1..1000000, got \"%s\"\n",
                   std::string(arg).c_str());
      return;
    }
    pendingOpens_ += count;
    std::fprintf(stderr, "flowcheck: open: %llu more flow(s) queued\n",
                 static_cast<unsigned long long>(count));
  } else if (verb == "probe-rate" && !arg.empty()) {
    const std::string text(arg);
    char* end = nullptr;
    const double rate = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size() || !(rate >= 0) || rate > 100000) {
      std::fprintf(stderr, "flowcheck: probe-rate: want 0..100000 per second, got \"%s\"\n",
                   text.c_str());
      return;
    }
    probeRate_ = rate;
    probeTokens_ = std::min(probeTokens_, 1.0);
    std::fprintf(stderr, "flowcheck: probe-rate: %g per second\n", rate);
  } else if (verb == "pause" && !arg.empty()) {
    // Every live flow sends nothing for the given seconds (a silent NCCL
    // flow): no stall, since nothing is waiting for an echo.
    const std::string text(arg);
    char* end = nullptr;
    const double seconds = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size() || !(seconds > 0) || seconds > 3600) {
      std::fprintf(stderr, "flowcheck: pause: want 0..3600 seconds, got \"%s\"\n", text.c_str());
      return;
    }
    const std::int64_t until = now + static_cast<std::int64_t>(seconds * 1e9);
    int paused = 0;
    for (const std::size_t index : active_) {
      Flow& flow = *flows_[index];
      if (flow.phase != Phase::Live) continue;
      flow.nextSendNs = std::max(flow.nextSendNs, until);
      ++paused;
    }
    std::fprintf(stderr, "flowcheck: pause: %d live flow(s) silent for %g s\n", paused, seconds);
  } else if (verb == "stop" && arg.empty()) {
    beginStop(now, "stop command");
  } else {
    std::fprintf(stderr,
                 "flowcheck: unknown command \"%s\" (want: close BACKEND, close-all, open N, "
                 "probe-rate R, pause SECONDS, stop)\n",
                 shown.c_str());
  }
}

void FlowClient::beginStop(std::int64_t now, const char* why) {
  if (stopping_) return;
  stopping_ = true;
  stopDeadlineNs_ = now + kFinTimeoutNs;
  std::fprintf(stderr, "flowcheck: %s: closing live flows\n", why);
  notOpened_ += pendingOpens_;
  pendingOpens_ = 0;
  for (const std::size_t index : active_) {
    Flow& flow = *flows_[index];
    if (flow.phase == Phase::Live) {
      beginClose(flow, EndState::OpenAtEnd, now);
    } else if (flow.phase == Phase::Connecting || flow.phase == Phase::AwaitHello) {
      endFlow(flow, EndState::NotOpened, now, "stopped before its hello");
    }
  }
  for (std::size_t index = 0; index < probes_.size(); ++index) {
    if (!probes_[index]) continue;
    close(probes_[index]->fd);  // unfinished probes are not recorded
    probes_[index].reset();
    freeProbeSlots_.push_back(index);
  }
}

void FlowClient::checkReady() {
  if (readyWritten_ || options_.ready.empty()) return;
  const auto initial = static_cast<std::size_t>(options_.flows);
  if (flows_.size() < initial) return;
  for (std::size_t i = 0; i < initial; ++i) {
    const Flow& flow = *flows_[i];
    if (flow.phase == Phase::Connecting || flow.phase == Phase::AwaitHello) return;
  }
  readyWritten_ = true;
  const int fd = open(options_.ready.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "flowcheck: cannot create %s: %s\n", options_.ready.c_str(),
                 std::strerror(errno));
    return;
  }
  static constexpr std::string_view kReady = "ready\n";
  [[maybe_unused]] const ssize_t written = write(fd, kReady.data(), kReady.size());
  close(fd);
}

void FlowClient::tick(std::int64_t now) {
  const double dt = static_cast<double>(now - lastTickNs_) / 1e9;
  lastTickNs_ = now;

  if (!stopping_) {
    openTokens_ =
        std::min(openTokens_ + options_.openRate * dt, std::max(1.0, options_.openRate / 10));
    while (pendingOpens_ > 0 && openTokens_ >= 1) {
      openTokens_ -= 1;
      --pendingOpens_;
      startFlow(now);
    }
    if (probeRate_ > 0) {
      probeTokens_ = std::min(probeTokens_ + probeRate_ * dt, std::max(1.0, probeRate_ / 10));
      while (probeTokens_ >= 1) {
        probeTokens_ -= 1;
        startProbe(now);
      }
    }
  }

  for (const std::size_t index : active_) {
    Flow& flow = *flows_[index];
    switch (flow.phase) {
      case Phase::Connecting:
      case Phase::AwaitHello:
        if (now - flow.openedNs > connectTimeoutNs_) {
          endFlow(flow, EndState::ConnectFailed, now,
                  flow.phase == Phase::Connecting ? "connect timed out" : "no hello in time");
        }
        break;
      case Phase::Live:
        if (now >= flow.nextSendNs) {
          if (flow.queued - flow.sent < kMaxUnsent) {
            flow.queued += static_cast<std::uint64_t>(options_.chunk);
          }
          flow.nextSendNs += intervalNs_;
          if (flow.nextSendNs <= now) flow.nextSendNs = now + intervalNs_;
          sendFlow(flow, now);
        }
        break;
      case Phase::Closing:
        if (now > flow.closeDeadlineNs) endCloseTimedOut(flow, now);
        break;
      case Phase::Ended:
        break;
    }
    if (flow.waiting) flow.maxStallNs = std::max(flow.maxStallNs, now - flow.waitSinceNs);
  }
  std::erase_if(active_,
                [this](std::size_t index) { return flows_[index]->phase == Phase::Ended; });

  for (std::size_t index = 0; index < probes_.size(); ++index) {
    if (probes_[index] && now - probes_[index]->startNs > connectTimeoutNs_) {
      endProbe(index, now, -1,
               probes_[index]->connected ? "no hello in time" : "connect timed out");
    }
  }

  checkReady();
  if (timeline_ != nullptr && now >= nextTimelineNs_) {
    writeTimeline(now);
    nextTimelineNs_ += std::int64_t{options_.timelineMs} * kNsPerMs;
    if (nextTimelineNs_ <= now)
      nextTimelineNs_ = now + std::int64_t{options_.timelineMs} * kNsPerMs;
  }
  if (!stopping_ && durationEndNs_ != 0 && now >= durationEndNs_)
    beginStop(now, "duration reached");
}

void FlowClient::writeTimeline(std::int64_t now) {
  std::vector<std::uint64_t> active(backends_.size(), 0);
  std::uint64_t stalled = 0;
  for (const std::size_t index : active_) {
    const Flow& flow = *flows_[index];
    if (flow.phase == Phase::Live && flow.backend >= 0)
      ++active[static_cast<std::size_t>(flow.backend)];
    if (flow.waiting && now - flow.waitSinceNs > stallNs_) ++stalled;
  }
  Json line;
  line["t"] = clock_.at(now);
  line["active"] = Json::object();
  line["probes"] = Json::object();
  for (std::size_t i = 0; i < backends_.size(); ++i) {
    line["active"][backends_[i]] = active[i];
    line["probes"][backends_[i]] = periodProbes_[i];
    periodProbes_[i] = 0;
  }
  line["probe_failures"] = periodProbeFailures_;
  periodProbeFailures_ = 0;
  line["broken"] = broken_;
  line["stalled"] = stalled;
  const std::string text = line.dump() + "\n";
  std::fwrite(text.data(), 1, text.size(), timeline_);
  std::fflush(timeline_);
}

int FlowClient::writeReport(std::int64_t now) {
  Json report;
  report["target"] = options_.target;
  report["started"] = clock_.at(startedNs_);
  report["ended"] = clock_.at(now);
  report["stall_ms"] = options_.stallMs;
  report["interval_ms"] = options_.intervalMs;
  report["rtt_ms"] = options_.rttMs;
  Json flows = Json::array();
  std::map<std::string, std::uint64_t> byState;
  std::map<std::string, std::uint64_t> byBackend;
  for (const auto& flowPtr : flows_) {
    Flow& flow = *flowPtr;
    closeRttInterval(flow);
    Json entry;
    entry["id"] = flow.id;
    entry["local_port"] = flow.localPort;
    entry["backend"] =
        flow.backend >= 0 ? Json(backends_[static_cast<std::size_t>(flow.backend)]) : Json(nullptr);
    entry["opened"] = clock_.at(flow.openedNs);
    // Connect + hello: what a new flow waited before it could talk.
    entry["connect_ms"] =
        flow.liveNs != 0 ? Json(nsToMs(flow.liveNs - flow.openedNs)) : Json(nullptr);
    entry["ended"] =
        flow.endState == EndState::OpenAtEnd ? Json(nullptr) : Json(clock_.at(flow.endedNs));
    entry["state"] = endStateName(flow.endState);
    entry["bytes_sent"] = flow.sent;
    entry["bytes_echoed"] = flow.echoed;
    entry["max_stall_ms"] = nsToMs(flow.maxStallNs);
    Json stalls = Json::array();
    for (const auto& [start, ms] : flow.stalls) stalls.push_back(Json::array({start, ms}));
    entry["stalls"] = std::move(stalls);
    if (flow.stallsDropped > 0) entry["stalls_dropped"] = flow.stallsDropped;
    entry["error"] = flow.error.empty() ? Json(nullptr) : Json(flow.error);
    Json rtt = Json::array();
    for (const RttPoint& point : flow.rtt) {
      rtt.push_back(Json::array({clock_.at(startedNs_ + point.interval * rttIntervalNs_),
                                 std::round(point.medianMs * 1e3) / 1e3, point.samples,
                                 std::round(point.maxMs * 1e3) / 1e3}));
    }
    entry["rtt"] = std::move(rtt);
    if (flow.rttDropped > 0) entry["rtt_dropped"] = flow.rttDropped;
    flows.push_back(std::move(entry));
    ++byState[endStateName(flow.endState)];
    if (flow.backend >= 0) ++byBackend[backends_[static_cast<std::size_t>(flow.backend)]];
  }
  report["flows"] = std::move(flows);
  Json probes = Json::array();
  std::map<std::string, std::uint64_t> probesByBackend;
  for (const ProbeRecord& record : probeRecords_) {
    Json entry;
    entry["t"] = record.t;
    entry["backend"] = record.backend >= 0
                           ? Json(backends_[static_cast<std::size_t>(record.backend)])
                           : Json(nullptr);
    entry["ok"] = record.backend >= 0;
    entry["ms"] = record.ms;
    entry["local_port"] = record.localPort;
    if (!record.error.empty()) entry["error"] = record.error;
    probes.push_back(std::move(entry));
    if (record.backend >= 0) ++probesByBackend[backends_[static_cast<std::size_t>(record.backend)]];
  }
  report["probes"] = std::move(probes);
  Json summary;
  summary["flows"] = flows_.size();
  summary["by_state"] = byState;
  summary["by_backend"] = byBackend;
  summary["not_opened"] = notOpened_;
  summary["probes"] = Json{{"ok", probesOk_},
                           {"failed", probesFailed_},
                           {"by_backend", probesByBackend},
                           {"records_dropped", probeRecordsDropped_}};
  report["summary"] = std::move(summary);

  const std::string temporary = options_.report + ".tmp";
  std::FILE* out = std::fopen(temporary.c_str(), "w");
  if (out == nullptr) {
    std::fprintf(stderr, "flowcheck: cannot write %s: %s\n", temporary.c_str(),
                 std::strerror(errno));
    return kExitFailure;
  }
  const std::string text = report.dump(1) + "\n";
  const bool written = std::fwrite(text.data(), 1, text.size(), out) == text.size();
  if (std::fclose(out) != 0 || !written ||
      std::rename(temporary.c_str(), options_.report.c_str()) != 0) {
    std::fprintf(stderr, "flowcheck: cannot write %s: %s\n", options_.report.c_str(),
                 std::strerror(errno));
    return kExitFailure;
  }
  return kExitOk;
}

int FlowClient::run() {
  raiseFdLimit();
  const int signals = openSignalFd();
  epoll_ = epoll_create1(EPOLL_CLOEXEC);
  if (signals < 0 || epoll_ < 0) {
    std::fprintf(stderr, "flowcheck: signalfd/epoll: %s\n", std::strerror(errno));
    return kExitFailure;
  }
  epollAdd(epoll_, signals, EPOLLIN, pack(Tag::Signal, 0));
  // A pipe or terminal on stdin carries commands; a regular file or
  // /dev/null cannot be polled and is simply not read. A terminal we do not
  // own fails the read (EIO, SIGTTIN ignored) instead of stopping us.
  signal(SIGTTIN, SIG_IGN);
  const int stdinFlags = fcntl(STDIN_FILENO, F_GETFL);
  if (stdinFlags >= 0 && epollAdd(epoll_, STDIN_FILENO, EPOLLIN, pack(Tag::Stdin, 0))) {
    fcntl(STDIN_FILENO, F_SETFL, stdinFlags | O_NONBLOCK);
    stdinOpen_ = true;
  }
  if (!options_.timeline.empty()) {
    timeline_ = std::fopen(options_.timeline.c_str(), "w");
    if (timeline_ == nullptr) {
      std::fprintf(stderr, "flowcheck: --timeline: cannot create %s: %s\n",
                   options_.timeline.c_str(), std::strerror(errno));
      return kExitUsage;
    }
  }

  startedNs_ = monoNs();
  lastTickNs_ = startedNs_;
  nextTimelineNs_ = startedNs_;
  if (options_.durationS > 0) {
    durationEndNs_ = startedNs_ + static_cast<std::int64_t>(options_.durationS * 1e9);
  }
  pendingOpens_ = static_cast<std::uint64_t>(options_.flows);
  checkReady();

  std::array<epoll_event, kMaxEvents> events{};
  std::int64_t nextTickNs = startedNs_;
  for (;;) {
    std::int64_t now = monoNs();
    if (now >= nextTickNs) {
      tick(now);
      nextTickNs = now + kTickNs;
    }
    if (stopping_ && (active_.empty() || now >= stopDeadlineNs_)) break;
    const int timeoutMs = static_cast<int>((nextTickNs - now + kNsPerMs - 1) / kNsPerMs);
    const int n = epoll_wait(epoll_, events.data(), kMaxEvents, std::max(timeoutMs, 0));
    if (n < 0 && errno != EINTR) {
      std::fprintf(stderr, "flowcheck: epoll_wait: %s\n", std::strerror(errno));
      return kExitFailure;
    }
    now = monoNs();
    for (int i = 0; i < n; ++i) {
      const epoll_event& ev = events[static_cast<std::size_t>(i)];
      switch (tagOf(ev.data.u64)) {
        case Tag::Signal: {
          signalfd_siginfo info{};
          [[maybe_unused]] const ssize_t got = read(signals, &info, sizeof(info));
          beginStop(now, info.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM");
          break;
        }
        case Tag::Stdin:
          if (stdinOpen_) readCommands(now);
          break;
        case Tag::Flow: {
          const std::size_t index = indexOf(ev.data.u64);
          if (index < flows_.size()) onFlowEvent(*flows_[index], ev.events, now);
          break;
        }
        case Tag::Probe:
          if (!stopping_) onProbeEvent(indexOf(ev.data.u64), ev.events, now);
          break;
        default:
          break;
      }
    }
    if (stopping_)
      std::erase_if(active_,
                    [this](std::size_t index) { return flows_[index]->phase == Phase::Ended; });
  }

  const std::int64_t end = monoNs();
  for (const std::size_t index : active_) endCloseTimedOut(*flows_[index], end);
  active_.clear();
  if (timeline_ != nullptr) {
    writeTimeline(end);
    std::fclose(timeline_);
  }
  std::uint64_t counts[kEndStateNames.size()] = {};
  for (const auto& flow : flows_) ++counts[static_cast<std::size_t>(flow->endState)];
  std::fprintf(stderr, "flowcheck: %zu flow(s):", flows_.size());
  for (std::size_t i = 0; i < kEndStateNames.size(); ++i) {
    if (counts[i] > 0)
      std::fprintf(stderr, " %s %llu", kEndStateNames[i],
                   static_cast<unsigned long long>(counts[i]));
  }
  std::fprintf(stderr, "; probes ok %llu failed %llu\n", static_cast<unsigned long long>(probesOk_),
               static_cast<unsigned long long>(probesFailed_));
  return options_.report.empty() ? kExitOk : writeReport(end);
}

// ------------------------------------------------------------------ main --

int usageError(const std::string& message) {
  std::fprintf(stderr, "spillway-flowcheck: %s\n", message.c_str());
  return kExitUsage;
}

bool parentDirectoryExists(const std::string& path) {
  const auto parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  return parent.empty() || std::filesystem::is_directory(parent, ec);
}

int runServe(const ServeOptions& options) {
  if (!validName(options.name)) {
    return usageError("--name must be 1..64 bytes without whitespace, got \"" + options.name +
                      "\"");
  }
  for (const int port : options.ports) {
    if (port < 1 || port > 65535)
      return usageError("--port " + std::to_string(port) + " is not 1..65535");
  }
  if (!makeEndpoint(options.bind, 1)) {
    return usageError("--bind \"" + options.bind + "\" is not an IPv4 or IPv6 address");
  }
  return EchoServer(options).run();
}

int runClient(ClientOptions options) {
  const auto target = parseHostPort(options.target);
  if (!target) return usageError("--target \"" + options.target + "\" is not ADDR:PORT");
  if (options.probeTarget.empty()) options.probeTarget = options.target;
  const auto probeTarget = parseHostPort(options.probeTarget);
  if (!probeTarget)
    return usageError("--probe-target \"" + options.probeTarget + "\" is not ADDR:PORT");
  std::optional<Endpoint> bind;
  if (!options.bind.empty()) {
    bind = makeEndpoint(options.bind, 0);
    if (!bind) return usageError("--bind \"" + options.bind + "\" is not an IPv4 or IPv6 address");
    if (bind->family() != target->family() || bind->family() != probeTarget->family()) {
      return usageError("--bind " + options.bind +
                        " and the target are not the same address family");
    }
  }
  if (options.flows < 0 || options.flows > 1'000'000)
    return usageError("--flows must be 0..1000000");
  if (options.intervalMs < 1) return usageError("--interval-ms must be at least 1");
  if (options.chunk < 1 || options.chunk > 1024 * 1024)
    return usageError("--chunk must be 1..1048576");
  if (options.stallMs < 1) return usageError("--stall-ms must be at least 1");
  if (options.connectTimeoutMs < 1) return usageError("--connect-timeout-ms must be at least 1");
  if (!(options.openRate > 0)) return usageError("--open-rate must be above 0");
  if (!(options.probeRate >= 0)) return usageError("--probe-rate must be 0 or more");
  if (options.timelineMs < 10) return usageError("--timeline-ms must be at least 10");
  if (options.rttMs < 10 || options.rttMs > 3'600'000)
    return usageError("--rtt-ms must be 10..3600000");
  if (options.durationS < 0) return usageError("--duration-s must not be negative");
  for (const std::string* path : {&options.timeline, &options.report, &options.ready}) {
    if (!path->empty() && !parentDirectoryExists(*path)) {
      return usageError("no directory for " + *path);
    }
  }
  return FlowClient(options, *target, *probeTarget, bind).run();
}

int flowCheckMain(int argc, char** argv) {
  CLI::App app{"spillway-flowcheck: long-lived TCP flows and probes for failover drills"};
  app.require_subcommand(1);

  ServeOptions serve;
  auto* serveCmd = app.add_subcommand("serve", "hello-then-echo server, one line SWFC1 <NAME>");
  serveCmd->add_option("--name", serve.name, "backend name sent in the hello")->required();
  serveCmd->add_option("--port", serve.ports, "port to listen on (repeatable)")->required();
  serveCmd->add_option("--bind", serve.bind, "address to listen on")->capture_default_str();

  ClientOptions client;
  auto* clientCmd = app.add_subcommand("client", "long-lived flows and probes to a target");
  clientCmd->add_option("--target", client.target, "ADDR:PORT (the VIP)")->required();
  clientCmd->add_option("--flows", client.flows, "long-lived flows to open")->required();
  clientCmd->add_option("--bind", client.bind, "source address");
  clientCmd->add_option("--interval-ms", client.intervalMs, "send period per flow")
      ->capture_default_str();
  clientCmd->add_option("--chunk", client.chunk, "bytes per send")->capture_default_str();
  clientCmd->add_option("--stall-ms", client.stallMs, "stall episode threshold")
      ->capture_default_str();
  clientCmd->add_option("--connect-timeout-ms", client.connectTimeoutMs, "connect + hello deadline")
      ->capture_default_str();
  clientCmd->add_option("--open-rate", client.openRate, "new flows per second")
      ->capture_default_str();
  clientCmd->add_option("--probe-rate", client.probeRate, "probe connections per second")
      ->capture_default_str();
  clientCmd->add_option("--probe-target", client.probeTarget, "ADDR:PORT (default: --target)");
  clientCmd->add_option("--timeline", client.timeline, "JSON Lines file, one object per period");
  clientCmd->add_option("--timeline-ms", client.timelineMs, "timeline period")
      ->capture_default_str();
  clientCmd
      ->add_option("--rtt-ms", client.rttMs,
                   "echo round-trip interval: one median per flow per interval in the report")
      ->capture_default_str();
  clientCmd->add_option("--report", client.report, "JSON report written at exit");
  clientCmd->add_option("--duration-s", client.durationS, "stop after this many seconds");
  clientCmd->add_option("--ready", client.ready, "file created once every flow has its hello");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  }
  if (serveCmd->parsed()) return runServe(serve);
  return runClient(client);
}

}  // namespace
}  // namespace spillway

int main(int argc, char** argv) {
  return spillway::flowCheckMain(argc, argv);
}
