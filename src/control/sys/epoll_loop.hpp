#pragma once
// Non-blocking epoll plumbing shared by the control thread's socket users:
// the servers (CliServer, MetricsHttpServer) that tag their listening socket
// 0 and each client by its id, and the probers (HealthChecker, LoadScraper)
// that drain whatever is ready on every poll(). Nothing here blocks.

#include <sys/epoll.h>
#include <unistd.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace spillway {

// The epoll tag of a server's listening socket; client ids start above it.
inline constexpr std::uint64_t kListenerTag = 0;

// Creates a close-on-exec epoll instance into epollFd that watches listenFd
// for EPOLLIN under kListenerTag. Returns "" or what failed
// ("epoll_create1: ...", "epoll_ctl: ..."); epollFd is left for the caller to
// close either way.
std::string watchListener(int listenFd, int& epollFd);

// Registers fd in epollFd for `events` under `tag`; false (errno set) if not.
bool epollAdd(int epollFd, int fd, std::uint64_t tag, std::uint32_t events) noexcept;

// Files a freshly accepted client (with its .fd) under id and watches it for
// EPOLLIN. False if epoll refused: the client is dropped again and its fd is
// the caller's to close. May throw std::bad_alloc.
template <class Clients, class Client>
bool adoptClient(int epollFd, Clients& clients, std::uint64_t id, Client&& client) {
  const int fd = client.fd;
  const auto it = clients.emplace(id, std::forward<Client>(client)).first;
  if (epollAdd(epollFd, fd, id, EPOLLIN)) return true;
  clients.erase(it);
  return false;
}

// Forgets client id: out of epoll (if open), fd closed, entry erased.
template <class Clients>
void closeClient(int epollFd, Clients& clients, std::uint64_t id) noexcept {
  const auto it = clients.find(id);
  if (it == clients.end()) return;
  if (epollFd >= 0) epoll_ctl(epollFd, EPOLL_CTL_DEL, it->second.fd, nullptr);
  ::close(it->second.fd);
  clients.erase(it);
}

// One non-blocking epoll_wait of up to MaxEvents: onListener() for the
// listening socket, onClient(id, client, events) for each client still in
// clients (one closed earlier in the same round is skipped).
template <int MaxEvents, class Clients, class OnListener, class OnClient>
void dispatchReady(int epollFd, Clients& clients, OnListener&& onListener, OnClient&& onClient) {
  epoll_event events[MaxEvents];
  const int n = epoll_wait(epollFd, events, MaxEvents, 0);
  for (int i = 0; i < n; ++i) {
    const std::uint64_t id = events[i].data.u64;
    if (id == kListenerTag) {
      onListener();
      continue;
    }
    const auto it = clients.find(id);
    if (it == clients.end()) continue;
    onClient(id, it->second, events[i].events);
  }
}

// Calls close(id) for every client with expired(client); the ids are taken
// first, so close may erase. May throw std::bad_alloc.
template <class Clients, class Expired, class Close>
void closeExpired(const Clients& clients, Expired&& expired, Close&& close) {
  std::vector<std::uint64_t> ids;
  for (const auto& [id, client] : clients) {
    if (expired(client)) ids.push_back(id);
  }
  for (std::uint64_t id : ids) close(id);
}

// Hands onEvent(const epoll_event&) everything ready in epollFd without
// blocking, in rounds of 64 events, at most 16 rounds a call.
template <class OnEvent>
void drainReady(int epollFd, OnEvent&& onEvent) {
  std::array<epoll_event, 64> events{};
  for (int round = 0; round < 16; ++round) {
    const int n = ::epoll_wait(epollFd, events.data(), static_cast<int>(events.size()), 0);
    if (n <= 0) break;
    for (int i = 0; i < n; ++i) onEvent(events[static_cast<std::size_t>(i)]);
    if (n < static_cast<int>(events.size())) break;
  }
}

}  // namespace spillway
