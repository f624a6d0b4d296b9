#include "control/durable_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace spillway {

std::string errnoText(int error) {
  char buf[256];
  // GNU strerror_r returns the message (maybe not in buf).
  return std::string(strerror_r(error, buf, sizeof buf));
}

namespace {

std::string parentOf(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

std::optional<std::string> writeFileDurably(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return "cannot create " + tmp + ": " + errnoText(errno);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string e = "cannot write " + tmp + ": " + errnoText(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      return e;
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const std::string e = "cannot fsync " + tmp + ": " + errnoText(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    return e;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string e = "cannot rename " + tmp + " to " + path + ": " + errnoText(errno);
    ::unlink(tmp.c_str());
    return e;
  }
  const std::string dir = parentOf(path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return "cannot open " + dir + " to fsync it: " + errnoText(errno);
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (rc != 0) return "cannot fsync " + dir + ": " + errnoText(err);
  return std::nullopt;
}

std::optional<std::string> ensureStateDirectory(const std::string& dir) {
  if (dir.empty()) return "no directory given";
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) return dir + " exists and is not a directory";
    return std::nullopt;
  }
  if (errno != ENOENT) return "cannot stat " + dir + ": " + errnoText(errno);
  const std::string parent = parentOf(dir);
  if (parent != dir && parent != "/" && parent != ".") {
    if (auto e = ensureStateDirectory(parent)) return e;
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return "cannot create " + dir + ": " + errnoText(errno);
  }
  return std::nullopt;
}

}  // namespace spillway
