#include "control/discovery/file_source.hpp"

#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstring>

#include "spillway/errno_text.hpp"

namespace spillway {

FileSdSource::FileSdSource(DiscoveryConfig config) : config_(std::move(config)) {
  const auto slash = config_.path.rfind('/');
  dir_ = slash == 0 ? "/" : config_.path.substr(0, slash);
  base_ = config_.path.substr(slash + 1);
  inotify_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  watch();
}

FileSdSource::~FileSdSource() {
  if (inotify_ >= 0) ::close(inotify_);
}

void FileSdSource::watch() {
  if (inotify_ < 0 || watch_ >= 0) return;
  watch_ = ::inotify_add_watch(inotify_, dir_.c_str(),
                               IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE |
                                   IN_CREATE | IN_DELETE_SELF | IN_MOVE_SELF);
}

FileSdSource::Refresh FileSdSource::poll(Millis now) {
  if (inotify_ >= 0) {
    alignas(inotify_event) std::array<char, 4096> buf{};
    for (;;) {
      const ssize_t n = ::read(inotify_, buf.data(), buf.size());
      if (n <= 0) break;
      for (ssize_t off = 0; off < n;) {
        const auto* ev = reinterpret_cast<const inotify_event*>(buf.data() + off);
        off += static_cast<ssize_t>(sizeof(inotify_event) + ev->len);
        if ((ev->mask & IN_Q_OVERFLOW) != 0) {
          due_ = true;  // events were lost: read to be sure
          continue;
        }
        if ((ev->mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF)) != 0) {
          if (watch_ >= 0 && (ev->mask & IN_IGNORED) == 0) {
            (void)::inotify_rm_watch(inotify_, watch_);
          }
          watch_ = -1;  // the directory went: retry until it is back
          continue;
        }
        if (ev->len == 0 || std::strcmp(ev->name, base_.c_str()) != 0) continue;
        // IN_CREATE alone is a file being written: wait for its close.
        if ((ev->mask & (IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE)) != 0) {
          due_ = true;
        }
      }
    }
  }
  if (watch_ < 0 && now >= nextRetry_) {
    nextRetry_ = now + kRetryMs;
    watch();
    due_ = true;  // without a watch (or just rewatched) the file is read on a timer
  }
  if (!due_) return {};
  due_ = false;
  return readFile();
}

nlohmann::json FileSdSource::describe(Millis /*now*/) const {
  return nlohmann::json{{"kind", "file"}, {"path", config_.path}};
}

FileSdSource::Refresh FileSdSource::readFile() {
  Refresh r;
  r.read = true;
  const int fd = ::open(config_.path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    r.error = config_.path + ": " + errnoText(errno) + "; the last good set stays";
    return r;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    r.error = config_.path + ": not a regular file; the last good set stays";
    return r;
  }
  if (static_cast<std::uint64_t>(st.st_size) > config_.maxFileBytes) {
    ::close(fd);
    r.error = config_.path + ": " + std::to_string(st.st_size) +
              " bytes, above max_file_bytes = " + std::to_string(config_.maxFileBytes) +
              "; the last good set stays";
    return r;
  }
  std::string text;
  text.resize(static_cast<std::size_t>(config_.maxFileBytes) + 1);
  std::size_t got = 0;
  for (;;) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
    if (got == text.size()) break;
  }
  ::close(fd);
  if (got > config_.maxFileBytes) {
    r.error = config_.path +
              ": grew above max_file_bytes = " + std::to_string(config_.maxFileBytes) +
              " while read; the last good set stays";
    return r;
  }
  text.resize(got);
  FileSdParse p = parseFileSd(text, config_.maxEntries);
  if (p.error) {
    r.error = config_.path + ": " + *p.error + "; the last good set stays";
    return r;
  }
  r.invalid = std::move(p.invalid);
  good_ = std::move(p.backends);
  everGood_ = true;
  return r;
}

}  // namespace spillway
