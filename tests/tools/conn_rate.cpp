// spillway-connrate: new TCP connections through a load balancer, for
// scripts/estate_bench (issue #15): how many a second, and how long each
// takes, with the backend in every one.
//
// Protocol, between `client` and `serve`: the client connects and sends one
// byte; the server answers one byte; the client, once it has the answer,
// closes with a reset (SO_LINGER 0: no TIME_WAIT, so a client that opens
// tens of thousands a second does not run out of ports); the server closes
// on the reset or EOF. A connection counts when its answer arrives; its time
// runs from connect() to the answer. So every counted connection crossed the
// gateway to a backend and back, whether the gateway is a proxy (its own
// backend connection) or a DSR load balancer.
//
// `client --concurrency N`: N connections always in flight (a closed-loop
// load: the rate found is the slower of client and gateway; run it against a
// backend directly to learn the client's own ceiling). `--interval-ms M`:
// one connection every M ms, one at a time (latency at low load).
//
// Thread contract: each mode is one epoll thread. Exit codes: 0 done, 1 a
// runtime failure, 2 bad arguments.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

bool parseTarget(const std::string& text, sockaddr_in& out) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos) return false;
  out = {};
  out.sin_family = AF_INET;
  if (inet_pton(AF_INET, text.substr(0, colon).c_str(), &out.sin_addr) != 1) return false;
  const int port = std::atoi(text.c_str() + colon + 1);
  if (port <= 0 || port > 65535) return false;
  out.sin_port = htons(static_cast<std::uint16_t>(port));
  return true;
}

int serve(std::uint16_t port) {
  const int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  const int one = 1;
  (void)setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(ls, 4096) != 0) {
    std::fprintf(stderr, "connrate: cannot listen on %u: %s\n", port, std::strerror(errno));
    return 1;
  }
  const int ep = epoll_create1(0);
  epoll_event ev{EPOLLIN, {.fd = ls}};
  epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
  std::vector<epoll_event> events(256);
  for (;;) {
    const int n = epoll_wait(ep, events.data(), static_cast<int>(events.size()), -1);
    if (n < 0 && errno != EINTR) return 1;
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == ls) {
        for (int c; (c = accept4(ls, nullptr, nullptr, SOCK_NONBLOCK)) >= 0;) {
          epoll_event cev{EPOLLIN | EPOLLRDHUP, {.fd = c}};
          epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
        }
        continue;
      }
      char buf[64];
      const ssize_t r = read(fd, buf, sizeof buf);
      if (r > 0) {
        (void)write(fd, "y", 1);
      } else if (r == 0 || errno != EAGAIN) {
        close(fd);  // epoll forgets a closed fd
      }
    }
  }
}

struct Options {
  std::string target;
  double seconds = 5;
  unsigned concurrency = 64;
  unsigned intervalMs = 0;
};

int client(const Options& o) {
  sockaddr_in to{};
  if (!parseTarget(o.target, to)) {
    std::fprintf(stderr, "connrate: --target %s: expected IPv4ADDR:PORT\n", o.target.c_str());
    return 2;
  }
  const int ep = epoll_create1(0);
  std::unordered_map<int, Clock::time_point> started;
  std::vector<double> latUs;
  std::uint64_t done = 0, failed = 0;
  const auto t0 = Clock::now();
  const Clock::time_point end =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  auto open = [&]() {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) return false;
    const linger lg{1, 0};
    (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    const int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const auto now = Clock::now();
    if (connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0 &&
        errno != EINPROGRESS) {
      close(fd);
      ++failed;
      return false;
    }
    epoll_event ev{EPOLLOUT, {.fd = fd}};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    started[fd] = now;
    return true;
  };
  auto finish = [&](int fd, bool ok) {
    if (ok) {
      latUs.push_back(
          std::chrono::duration<double, std::micro>(Clock::now() - started[fd]).count());
      ++done;
    } else {
      ++failed;
    }
    started.erase(fd);
    close(fd);
  };
  const unsigned inFlight = o.intervalMs != 0 ? 1 : o.concurrency;
  auto nextOpen = t0;
  std::vector<epoll_event> events(1024);
  while (Clock::now() < end || !started.empty()) {
    const auto now = Clock::now();
    if (now >= end + std::chrono::seconds(2)) break;  // give up on stragglers
    while (now < end && started.size() < inFlight && now >= nextOpen) {
      if (!open()) break;
      if (o.intervalMs != 0) nextOpen += std::chrono::milliseconds(o.intervalMs);
    }
    const int n = epoll_wait(ep, events.data(), static_cast<int>(events.size()), 1);
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if ((events[i].events & (EPOLLERR | EPOLLHUP)) != 0) {
        finish(fd, false);
      } else if ((events[i].events & EPOLLOUT) != 0) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0 || write(fd, "x", 1) != 1) {
          finish(fd, false);
          continue;
        }
        epoll_event ev{EPOLLIN, {.fd = fd}};
        epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
      } else if ((events[i].events & EPOLLIN) != 0) {
        char b;
        finish(fd, read(fd, &b, 1) == 1);
      }
    }
  }
  for (auto& [fd, at] : started) close(fd);
  const double elapsed = std::chrono::duration<double>(std::min(Clock::now(), end) - t0).count();
  std::sort(latUs.begin(), latUs.end());
  auto pct = [&](double p) {
    if (latUs.empty()) return -1.0;
    return latUs[std::min(latUs.size() - 1, static_cast<std::size_t>(p * latUs.size()))];
  };
  nlohmann::json j{{"connections", done},
                   {"failed", failed},
                   {"seconds", elapsed},
                   {"per_second", elapsed > 0 ? static_cast<double>(done) / elapsed : 0.0},
                   {"p50_us", pct(0.50)},
                   {"p99_us", pct(0.99)},
                   {"max_us", latUs.empty() ? -1.0 : latUs.back()}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"spillway-connrate: new TCP connections a second through a load balancer"};
  app.require_subcommand(1);
  std::uint16_t port = 0;
  auto* serveCmd = app.add_subcommand("serve", "answer one byte per connection");
  serveCmd->add_option("--port", port, "port to listen on")->required();
  Options o;
  auto* clientCmd = app.add_subcommand("client", "open connections, print one JSON line");
  clientCmd->add_option("--target", o.target, "ADDR:PORT")->required();
  clientCmd->add_option("--seconds", o.seconds, "how long")->capture_default_str();
  clientCmd->add_option("--concurrency", o.concurrency, "connections in flight")
      ->check(CLI::Range(1u, 60000u))
      ->capture_default_str();
  clientCmd
      ->add_option("--interval-ms", o.intervalMs,
                   "one connection at a time, one every this many ms (0: closed loop)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (serveCmd->parsed()) return serve(port);
  return client(o);
}
