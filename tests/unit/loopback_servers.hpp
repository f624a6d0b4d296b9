// Test-only servers on 127.0.0.0/8 for the health checker and the load
// scraper: an HTTP server in a thread with a settable canned response (or
// one that accepts and never answers), a listener whose accept queue is full
// so that SYNs are dropped (a connect that times out), and a free port that
// refuses. Threads wake on a pipe, never on sleeps. PollDriver runs a
// HealthChecker or LoadScraper on injected time.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "spillway/flow_table.hpp"

namespace spillway::test {

// Runs a poller (pollFd(), poll(now), nextDeadline()) on injected time:
// whenever its epoll fd is readable within a short real wait, the event is
// taken at the current injected time; otherwise the injected clock jumps to
// the poller's next deadline. So results arrive in real time, but which
// probe or scrape times out, and when, is decided by the injected clock.
template <typename Poller>
class PollDriver {
 public:
  explicit PollDriver(Poller& poller, std::function<void()> afterPoll = {}, Millis start = 0)
      : poller_(poller), afterPoll_(std::move(afterPoll)), now_(start) {}

  Millis now() const { return now_; }

  // Polls until `done` holds (true), or injected time would pass `until` or
  // 20 s of real time pass (false). Injected time moves to the poller's next
  // deadline only after kQuietMs of real time without an event: a loopback
  // server thread that a loaded machine schedules late must still answer
  // before the probe's injected timeout (50 ms was seen to be too short at
  // load average 6-10).
  static constexpr int kQuietMs = 250;
  bool runUntil(const std::function<bool()>& done, Millis until) {
    const auto realDeadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    pollOnce();
    while (!done()) {
      if (std::chrono::steady_clock::now() > realDeadline) return false;
      pollfd p{poller_.pollFd(), POLLIN, 0};
      if (::poll(&p, 1, kQuietMs) <= 0) {
        const auto next = poller_.nextDeadline();
        if (!next) return false;
        const Millis to = std::max(now_, *next);
        if (to > until) return false;
        now_ = to;
      }
      pollOnce();
    }
    return true;
  }

  // Advances injected time to now() + duration, taking every event and
  // deadline on the way.
  void advance(Millis duration) {
    const Millis until = now_ + duration;
    runUntil([] { return false; }, until);
    now_ = until;
    pollOnce();
  }

 private:
  void pollOnce() {
    poller_.poll(now_);
    if (afterPoll_) afterPoll_();
  }

  Poller& poller_;
  std::function<void()> afterPoll_;
  Millis now_;
};

inline sockaddr_in loopbackAddress(std::uint16_t port, const char* address = "127.0.0.1") {
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  if (inet_pton(AF_INET, address, &sin.sin_addr) != 1) throw std::invalid_argument(address);
  return sin;
}

// A loopback TCP port free a moment ago (bound, read back, closed), and
// "127.0.0.1:PORT" for a configuration that names it.
inline std::uint16_t freePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sin = loopbackAddress(0);
  (void)bind(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin);
  socklen_t len = sizeof sin;
  (void)getsockname(fd, reinterpret_cast<sockaddr*>(&sin), &len);
  ::close(fd);
  return ntohs(sin.sin_port);
}

inline std::string at(std::uint16_t port) {
  return "127.0.0.1:" + std::to_string(port);
}

inline std::uint16_t boundPort(int fd) {
  sockaddr_in sin{};
  socklen_t len = sizeof sin;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&sin), &len) != 0)
    throw std::runtime_error("getsockname");
  return ntohs(sin.sin_port);
}

// A listening TCP socket on address:port (0: any free port).
inline int makeListener(const char* address = "127.0.0.1", std::uint16_t port = 0,
                        int backlog = 128) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("socket");
  const int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  const sockaddr_in sin = loopbackAddress(port, address);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&sin), sizeof sin) != 0 ||
      listen(fd, backlog) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    throw std::runtime_error("bind/listen " + std::string(address) + ": " + why);
  }
  return fd;
}

// A port on 127.0.0.1 that nothing listens on (connects are refused), as
// far as a bind-and-close can promise.
inline std::uint16_t refusingPort() {
  const int fd = makeListener();
  const std::uint16_t port = boundPort(fd);
  close(fd);
  return port;
}

// A listener with backlog 0 whose accept queue is filled by one connection
// that is never accepted: the kernel drops further SYNs, so connects to it
// neither succeed nor fail before their timeout.
class FullBacklogListener {
 public:
  explicit FullBacklogListener(bool fillNow = true, std::uint16_t port = 0)
      : fd_(makeListener("127.0.0.1", port, 0)), port_(boundPort(fd_)) {
    if (fillNow) fill();
  }
  ~FullBacklogListener() {
    for (int fd : fillers_) close(fd);
    close(fd_);
  }
  FullBacklogListener(const FullBacklogListener&) = delete;
  FullBacklogListener& operator=(const FullBacklogListener&) = delete;

  // Connects until a connect does not complete within 200 ms.
  void fill() {
    for (int i = 0; i < 8; ++i) {
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      const sockaddr_in sin = loopbackAddress(port_);
      (void)connect(fd, reinterpret_cast<const sockaddr*>(&sin), sizeof sin);
      fillers_.push_back(fd);
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, 200) == 0) return;  // this SYN was dropped: full
    }
    throw std::runtime_error("accept queue never filled");
  }
  std::uint16_t port() const { return port_; }

 private:
  int fd_;
  std::uint16_t port_;
  std::vector<int> fillers_;
};

// Canned responses.
inline std::string httpOk(const std::string& body, const std::string& contentType = "text/plain") {
  return "HTTP/1.1 200 OK\r\nContent-Type: " + contentType +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
         body;
}
inline std::string httpStatus(int code, const std::string& reason) {
  return "HTTP/1.1 " + std::to_string(code) + " " + reason +
         "\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
}
// A body in chunks of `chunk` bytes (Transfer-Encoding: chunked).
inline std::string httpChunked(const std::string& body, std::size_t chunk) {
  std::string r =
      "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (std::size_t i = 0; i < body.size(); i += chunk) {
    const std::string part = body.substr(i, chunk);
    char size[32];
    std::snprintf(size, sizeof size, "%zx;ext=1\r\n", part.size());
    r += size + part + "\r\n";
  }
  return r + "0\r\nX-Trailer: t\r\n\r\n";
}
// No Content-Length: the body ends when the server closes.
inline std::string httpUntilClose(const std::string& body) {
  return "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + body;
}

// An HTTP server on 127.0.0.1 in its own thread. Each connection: read the
// request head, write the current response, close. In silent mode it accepts
// and reads but never answers (until destroyed).
class LoopbackHttpServer {
 public:
  explicit LoopbackHttpServer(std::string response = httpOk("hello"),
                              const char* address = "127.0.0.1", std::uint16_t port = 0)
      : listenFd_(makeListener(address, port)),
        port_(boundPort(listenFd_)),
        response_(std::move(response)) {
    if (pipe2(stopPipe_, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
    thread_ = std::thread([this] { run(); });
  }
  ~LoopbackHttpServer() { stop(); }
  LoopbackHttpServer(const LoopbackHttpServer&) = delete;
  LoopbackHttpServer& operator=(const LoopbackHttpServer&) = delete;

  std::uint16_t port() const { return port_; }
  void setResponse(std::string response) {
    std::lock_guard lock(mutex_);
    response_ = std::move(response);
  }
  void setSilent(bool silent) { silent_ = silent; }
  std::size_t requests() const { return requests_; }
  std::string lastRequest() const {
    std::lock_guard lock(mutex_);
    return lastRequest_;
  }
  // Stops serving and closes the listener: the port refuses from then on.
  void stop() {
    if (!thread_.joinable()) return;
    const char c = 0;
    (void)!write(stopPipe_[1], &c, 1);
    thread_.join();
    close(listenFd_);
    close(stopPipe_[0]);
    close(stopPipe_[1]);
  }

 private:
  void run() {
    std::vector<int> held;
    while (true) {
      pollfd fds[2] = {{listenFd_, POLLIN, 0}, {stopPipe_[0], POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0 && errno != EINTR) break;
      if ((fds[1].revents & POLLIN) != 0) break;
      if ((fds[0].revents & POLLIN) == 0) continue;
      const int fd = accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      std::string request = readHead(fd);
      {
        std::lock_guard lock(mutex_);
        lastRequest_ = request;
      }
      ++requests_;
      if (silent_) {
        held.push_back(fd);
        continue;
      }
      std::string response;
      {
        std::lock_guard lock(mutex_);
        response = response_;
      }
      std::size_t sent = 0;
      while (sent < response.size()) {
        const ssize_t n = send(fd, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += static_cast<std::size_t>(n);
      }
      shutdown(fd, SHUT_WR);
      // Wait for the client to close so it sees the whole response first.
      pollfd p{fd, POLLIN, 0};
      char sink[512];
      while (::poll(&p, 1, 1000) > 0 && read(fd, sink, sizeof sink) > 0) {
      }
      close(fd);
    }
    for (int fd : held) close(fd);
  }

  static std::string readHead(int fd) {
    std::string head;
    char buf[1024];
    pollfd p{fd, POLLIN, 0};
    while (head.find("\r\n\r\n") == std::string::npos && head.size() < 64 * 1024) {
      if (::poll(&p, 1, 2000) <= 0) break;
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) break;
      head.append(buf, static_cast<std::size_t>(n));
    }
    return head;
  }

  int listenFd_;
  std::uint16_t port_;
  int stopPipe_[2] = {-1, -1};
  mutable std::mutex mutex_;
  std::string response_;
  std::string lastRequest_;
  std::atomic<bool> silent_{false};
  std::atomic<std::size_t> requests_{0};
  std::thread thread_;
};

}  // namespace spillway::test
