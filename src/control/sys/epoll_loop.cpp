#include "control/sys/epoll_loop.hpp"

#include <cerrno>
#include <cstring>

#include "spillway/errno_text.hpp"

namespace spillway {

std::string watchListener(int listenFd, int& epollFd) {
  epollFd = epoll_create1(EPOLL_CLOEXEC);
  if (epollFd < 0) return "epoll_create1: " + errnoText(errno);
  if (!epollAdd(epollFd, listenFd, kListenerTag, EPOLLIN)) {
    return "epoll_ctl: " + errnoText(errno);
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
