// The control loop's worst round while backends misbehave: a real
// ControlPlane (FakeDataplane, no EAL) with 50 backends whose health-check
// (HTTP, port 8080) and load (Prometheus, port 9400) endpoints are
// pathological, plus healthy ones, driven the way spillwayd drives it (epoll
// on its fds and a 5 ms timer, then tick() and, when due, a snapshot build
// and publish). Reports the rounds' p50, p99 and worst duration (the same
// numbers spillway_control_loop_tick_seconds records), and whether the
// healthy backends' probes and scrapes kept their cadence.
//
// The backends live on 10.77.0.0/24, made local on lo in a network namespace
// of its own (so the configuration's addresses are not loopback ones, and
// nothing outside changes): run as root.
//
//   spillway_control_loop_bench [--seconds N] [--healthy N]
//
// Misbehaviours, backend i doing number i % 9 on both ports:
//   0 slowloris: a valid status line, then one byte per second
//   1 endless body: 200 and no Content-Length, then bytes as fast as it can
//   2 huge headers: a status line and header lines that never end
//   3 garbage: 4 KiB of random bytes, then close
//   4 accepts, reads the request and never answers
//   5 reset mid-response: half a response, then RST
//   6 a 10 MB body with Content-Length
//   7 chunked with absurd chunk sizes
//   8 never accepts: a listener whose accept queue is full
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "../unit/fake_dataplane.hpp"
#include "control/backends/snapshot_builder.hpp"
#include "control/config/config.hpp"
#include "control/plane/control_plane.hpp"

namespace {

using namespace spillway;
using Clock = std::chrono::steady_clock;

constexpr int kPathological = 50;
constexpr int kKinds = 9;
constexpr const char* kKindNames[kKinds] = {"slowloris", "endless-body",  "huge-headers",
                                            "garbage",   "never-answers", "reset-midway",
                                            "10MB-body", "absurd-chunks", "never-accepts"};
constexpr std::uint16_t kHealthPort = 8080;
constexpr std::uint16_t kLoadPort = 9400;

std::string addressOf(int backend) {
  return "10.77.0." + std::to_string(10 + backend);
}

int listener(const std::string& address, std::uint16_t port, int backlog) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  ::inet_pton(AF_INET, address.c_str(), &sin.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin) != 0 ||
      ::listen(fd, backlog) != 0) {
    std::fprintf(stderr, "bench: cannot listen on %s:%u: %s\n", address.c_str(), port,
                 std::strerror(errno));
    std::exit(1);
  }
  return fd;
}

std::string dcgmText(int backend) {
  return "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} " +
         std::to_string(20 + backend % 30) + "\n";
}

// The backends' side, on its own thread: one epoll loop for every listener
// and connection.
class Misbehaving {
 public:
  Misbehaving(int pathological, int healthy) {
    epollFd_ = ::epoll_create1(EPOLL_CLOEXEC);
    for (int b = 0; b < pathological + healthy; ++b) {
      const int kind = b < pathological ? b % kKinds : -1;
      for (const std::uint16_t port : {kHealthPort, kLoadPort}) {
        if (kind == 8) {
          fullListener(addressOf(b), port);
          continue;
        }
        const int fd = listener(addressOf(b), port, 64);
        listeners_[fd] = Listen{kind, port, b};
        watch(fd, EPOLLIN);
      }
    }
    thread_ = std::thread([this] { run(); });
  }
  ~Misbehaving() {
    stop_ = true;
    thread_.join();
    for (auto& [fd, c] : conns_) ::close(fd);
    for (auto& [fd, l] : listeners_) ::close(fd);
    for (int fd : held_) ::close(fd);
    ::close(epollFd_);
  }

 private:
  struct Listen {
    int kind;
    std::uint16_t port;
    int backend;
  };
  struct Conn {
    int kind = -1;
    std::uint16_t port = 0;
    int backend = 0;
    bool answered = false;
    std::string out;       // still to send
    std::size_t sent = 0;  // of a large body
    Clock::time_point nextDrip{};
  };

  void watch(int fd, std::uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    ::epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &ev);
  }
  void interest(int fd, std::uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    ::epoll_ctl(epollFd_, EPOLL_CTL_MOD, fd, &ev);
  }
  void drop(int fd, bool reset) {
    if (reset) {
      const linger l{1, 0};
      (void)::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    }
    ::epoll_ctl(epollFd_, EPOLL_CTL_DEL, fd, nullptr);
    ::close(fd);
    conns_.erase(fd);
  }
  // Backlog 0 and its queue filled by connections never accepted: further
  // SYNs are dropped, connects hang until the client's timeout.
  void fullListener(const std::string& address, std::uint16_t port) {
    held_.push_back(listener(address, port, 0));
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(port);
    ::inet_pton(AF_INET, address.c_str(), &sin.sin_addr);
    for (int i = 0; i < 3; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      (void)::connect(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin);
      held_.push_back(fd);
    }
  }

  std::string response(const Conn& c) {
    const bool health = c.port == kHealthPort;
    switch (c.kind) {
      case -1: {
        const std::string body = health ? "ok\n" : dcgmText(c.backend);
        return "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) +
               "\r\nConnection: close\r\n\r\n" + body;
      }
      case 0:
        return "HTTP/1.1 200 OK\r\n";  // then a byte per second
      case 1:
      case 6:
        return c.kind == 1 ? "HTTP/1.1 200 OK\r\n\r\n"
                           : "HTTP/1.1 200 OK\r\nContent-Length: 10485760\r\n\r\n";
      case 2:
        return "HTTP/1.1 200 OK\r\n";  // then header lines forever
      case 3: {
        std::string junk(4096, '\0');
        for (char& ch : junk) ch = static_cast<char>(rng_());
        return junk;
      }
      case 5:
        return "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + std::string(500, '#');
      case 7:
        return "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffff\r\n" +
               std::string(1000, 'x');
      default:
        return {};
    }
  }

  void onReadable(int fd, Conn& c) {
    char buffer[4096];
    for (;;) {
      const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        drop(fd, false);
        return;
      }
      if (n < 0) break;
    }
    if (c.answered || c.kind == 4) return;
    c.answered = true;
    c.out = response(c);
    c.nextDrip = Clock::now() + std::chrono::seconds(1);
    onWritable(fd, c);
  }

  void onWritable(int fd, Conn& c) {
    while (!c.out.empty()) {
      const ssize_t n = ::send(fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN) {
          interest(fd, EPOLLIN | EPOLLOUT);
          return;
        }
        drop(fd, false);
        return;
      }
      c.out.erase(0, static_cast<std::size_t>(n));
    }
    switch (c.kind) {
      case -1:
      case 3:
        drop(fd, false);
        return;
      case 5:
        drop(fd, true);
        return;
      case 1:
      case 2:
      case 6:
      case 7: {
        // Keep the socket full: more body, more header lines, more chunk data.
        if (c.kind == 6 && c.sent >= (10u << 20)) {
          drop(fd, false);
          return;
        }
        const std::string more = c.kind == 2 ? "X-Padding: " + std::string(1000, 'a') + "\r\n"
                                             : std::string(64 * 1024, 'x');
        c.sent += more.size();
        c.out = more;
        interest(fd, EPOLLIN | EPOLLOUT);
        return;
      }
      default:
        interest(fd, EPOLLIN);
        return;
    }
  }

  void run() {
    epoll_event events[64];
    while (!stop_) {
      const int n = ::epoll_wait(epollFd_, events, 64, 100);
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (auto l = listeners_.find(fd); l != listeners_.end()) {
          for (;;) {
            const int c = ::accept4(fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (c < 0) break;
            Conn conn;
            conn.kind = l->second.kind;
            conn.port = l->second.port;
            conn.backend = l->second.backend;
            conns_[c] = std::move(conn);
            watch(c, EPOLLIN | EPOLLRDHUP);
          }
          continue;
        }
        auto it = conns_.find(fd);
        if (it == conns_.end()) continue;
        if ((events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) {
          onReadable(fd, it->second);
          it = conns_.find(fd);
          if (it == conns_.end()) continue;
        }
        if ((events[i].events & EPOLLOUT) != 0) onWritable(fd, it->second);
      }
      // Slowloris: one more byte of a header line per second.
      const auto now = Clock::now();
      std::vector<int> drip;
      for (auto& [fd, c] : conns_) {
        if (c.kind == 0 && c.answered && now >= c.nextDrip) drip.push_back(fd);
      }
      for (int fd : drip) {
        Conn& c = conns_[fd];
        c.nextDrip = now + std::chrono::seconds(1);
        if (::send(fd, "X", 1, MSG_NOSIGNAL) < 0 && errno != EAGAIN) drop(fd, false);
      }
    }
  }

  int epollFd_ = -1;
  std::map<int, Listen> listeners_;
  std::map<int, Conn> conns_;
  std::vector<int> held_;
  std::mt19937 rng_{7};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::string estate(int pathological, int healthy) {
  std::string t = R"([dataplane]
lcores = [1]
hash_seed = 42

[[port]]
name = "p0"
devargs = "net_null0"
address = "10.77.0.1"
next_hop_mac = "02:00:00:00:00:01"
)";
  for (const char* pool : {"good", "bad"}) {
    t += std::string("\n[[pool]]\nname = \"") + pool + "\"\nsite = \"onprem\"\npriority = 0\n";
    t += "\n[pool.health]\nkind = \"http\"\nport = " + std::to_string(kHealthPort) +
         "\ninterval = 0.2\ntimeout = 0.15\n";
    t += "\n[pool.load]\nport = " + std::to_string(kLoadPort) +
         "\ninterval = 1\ntimeout = 0.5\nstale_after = 5\n";
  }
  t += R"(
[[vip]]
name = "v"
address = "192.0.2.1"
protocol = "tcp"
pools = ["good", "bad"]

[control]
state_dir = ""
)";
  for (int b = 0; b < pathological + healthy; ++b) {
    const bool bad = b < pathological;
    t += "\n[[backend]]\nname = \"" +
         (bad ? std::string(kKindNames[b % kKinds]) + "-" + std::to_string(b)
              : "healthy-" + std::to_string(b)) +
         "\"\naddress = \"" + addressOf(b) + "\"\npool = \"" + (bad ? "bad" : "good") + "\"\n";
  }
  return t;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  int seconds = 30;
  int healthy = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--seconds") seconds = std::atoi(argv[i + 1]);
    if (a == "--healthy") healthy = std::atoi(argv[i + 1]);
  }
  if (::unshare(CLONE_NEWNET) != 0) {
    std::fprintf(stderr, "bench: unshare(CLONE_NEWNET): %s (run as root)\n", std::strerror(errno));
    return 1;
  }
  if (std::system("ip link set lo up && ip route add local 10.77.0.0/24 dev lo") != 0) {
    std::fprintf(stderr, "bench: cannot make 10.77.0.0/24 local on lo\n");
    return 1;
  }

  ConfigResult r = loadConfigFromString(estate(kPathological, healthy), "bench.toml");
  if (!r.ok()) {
    std::fprintf(stderr, "bench: %s\n", formatErrors(r.errors()).c_str());
    return 1;
  }
  Misbehaving servers(kPathological, healthy);
  SnapshotBuilder builder;
  if (auto e = builder.setConfig(r.value())) {
    std::fprintf(stderr, "bench: %s\n", e->c_str());
    return 1;
  }
  test::FakeDataplane dataplane;
  const auto start = Clock::now();
  const auto millis = [&] {
    return static_cast<Millis>(
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
  };
  ControlPlane control(r.value(), "bench.toml", builder, &dataplane, millis());

  // The daemon's wait: the control plane's fds and a 5 ms timer.
  const int epollFd = ::epoll_create1(EPOLL_CLOEXEC);
  const int timerFd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  itimerspec period{};
  period.it_interval.tv_nsec = 5'000'000;
  period.it_value = period.it_interval;
  ::timerfd_settime(timerFd, 0, &period, nullptr);
  for (int fd : control.pollFds()) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    ::epoll_ctl(epollFd, EPOLL_CTL_ADD, fd, &ev);
  }
  epoll_event tev{};
  tev.events = EPOLLIN;
  tev.data.fd = timerFd;
  ::epoll_ctl(epollFd, EPOLL_CTL_ADD, timerFd, &tev);

  std::vector<double> rounds;
  std::vector<double> withBuild;  // rounds that built and published a snapshot
  std::vector<double> withoutBuild;
  rounds.reserve(static_cast<std::size_t>(seconds) * 400);
  const auto end = start + std::chrono::seconds(seconds);
  while (Clock::now() < end) {
    epoll_event events[16];
    const int n = ::epoll_wait(epollFd, events, 16, 10);
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == timerFd) {
        std::uint64_t expirations = 0;
        (void)::read(timerFd, &expirations, sizeof expirations);
      }
    }
    const auto t0 = Clock::now();
    const Millis now = millis();
    bool built = false;
    if (control.tick(now)) {
      built = true;
      if (auto next = control.takeSnapshot(now)) dataplane.publish(std::move(next));
    }
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    control.recordLoopDuration(took);
    rounds.push_back(took);
    (built ? withBuild : withoutBuild).push_back(took);
  }

  std::printf(
      "control loop, %d s, %d pathological + %d healthy backends (HTTP health 0.2 s, "
      "scrape 1 s):\n",
      seconds, kPathological, healthy);
  std::printf("  rounds %zu  p50 %.3f ms  p99 %.3f ms  p99.9 %.3f ms  worst %.3f ms\n",
              rounds.size(), percentile(rounds, 0.50) * 1e3, percentile(rounds, 0.99) * 1e3,
              percentile(rounds, 0.999) * 1e3, control.loopDurations().max() * 1e3);
  std::printf(
      "  without a snapshot build: rounds %zu  p99 %.3f ms  worst %.3f ms; with one "
      "(Maglev 65537): rounds %zu  p50 %.3f ms  worst %.3f ms\n",
      withoutBuild.size(), percentile(withoutBuild, 0.99) * 1e3,
      percentile(withoutBuild, 1.0) * 1e3, withBuild.size(), percentile(withBuild, 0.5) * 1e3,
      percentile(withBuild, 1.0) * 1e3);

  // Cadence of the healthy backends, and what the pathological ones came to.
  const Json health = std::get<Json>(control.health());
  const double expectedProbes = seconds / 0.2;
  const double expectedScrapes = seconds / 1.0;
  double minProbes = 1e18;
  double minScrapes = 1e18;
  int healthyUp = 0;
  std::map<std::string, std::pair<int, int>> downByKind;  // kind -> (down, total)
  std::map<std::string, std::string> exampleError;
  for (const Json& b : health) {
    const std::string name = b["backend"].get<std::string>();
    const bool up = b.value("up", false);
    if (name.rfind("healthy-", 0) == 0) {
      healthyUp += up ? 1 : 0;
      minProbes = std::min(minProbes, b.value("probes", 0.0));
      if (b.contains("scrape")) {
        const Json& s = b["scrape"];
        minScrapes = std::min(minScrapes, s["scrapes"].get<double>() - s["failures"].get<double>());
      } else {
        minScrapes = 0;
      }
    } else {
      const std::string kind = name.substr(0, name.rfind('-'));
      auto& [down, total] = downByKind[kind];
      down += up ? 0 : 1;
      ++total;
      if (b.contains("scrape")) exampleError[kind] = b["scrape"]["last_error"].get<std::string>();
    }
  }
  std::printf(
      "  healthy backends: %d of %d up; fewest probes %.0f of %.0f expected, fewest "
      "successful scrapes %.0f of %.0f\n",
      healthyUp, healthy, minProbes, expectedProbes, minScrapes, expectedScrapes);
  for (const auto& [kind, counts] : downByKind) {
    std::printf("  %-14s %d of %d down; scrape: %s\n", kind.c_str(), counts.first, counts.second,
                exampleError[kind].c_str());
  }
  ::close(timerFd);
  ::close(epollFd);
  return 0;
}
