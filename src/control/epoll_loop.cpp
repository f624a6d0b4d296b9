#include "control/epoll_loop.hpp"

#include <cerrno>
#include <cstring>

namespace spillway {

std::string watchListener(int listenFd, int& epollFd) {
  epollFd = epoll_create1(EPOLL_CLOEXEC);
  if (epollFd < 0) return std::string("epoll_create1: ") + std::strerror(errno);
  if (!epollAdd(epollFd, listenFd, kListenerTag, EPOLLIN)) {
    return std::string("epoll_ctl: ") + std::strerror(errno);
  }
  return {};
}

bool epollAdd(int epollFd, int fd, std::uint64_t tag, std::uint32_t events) noexcept {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = tag;
  return epoll_ctl(epollFd, EPOLL_CTL_ADD, fd, &ev) == 0;
}

}  // namespace spillway
