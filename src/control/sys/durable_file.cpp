#include "control/sys/durable_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "spillway/errno_text.hpp"

namespace spillway {

namespace {

std::string parentOf(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::array<std::uint32_t, 256> makeCrcTable() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) != 0 ? (c >> 1) ^ 0x82f63b78U : c >> 1;
    t[i] = c;
  }
  return t;
}

}  // namespace

std::uint32_t crc32c(std::string_view bytes) noexcept {
  std::uint32_t crc = ~0U;
  std::size_t i = 0;
#if defined(__SSE4_2__)
  std::uint64_t c64 = crc;
  for (; i + 8 <= bytes.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, bytes.data() + i, 8);
    c64 = __builtin_ia32_crc32di(c64, w);
  }
  crc = static_cast<std::uint32_t>(c64);
#endif
  static const std::array<std::uint32_t, 256> table = makeCrcTable();
  for (; i < bytes.size(); ++i) {
    crc = table[(crc ^ static_cast<std::uint8_t>(bytes[i])) & 0xff] ^ (crc >> 8);
  }
  return ~crc;
}

std::optional<std::string> readStateFile(const std::string& path, std::size_t maxBytes,
                                         std::string& error) {
  error.clear();
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) error = "cannot open " + path + ": " + errnoText(errno);
    return std::nullopt;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    error = path + " is not a regular file";
    return std::nullopt;
  }
  if (static_cast<std::uint64_t>(st.st_size) > maxBytes) {
    ::close(fd);
    error = path + " is larger than " + std::to_string(maxBytes) + " bytes";
    return std::nullopt;
  }
  std::string out(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

bool writeAllFd(int fd, std::string_view bytes) noexcept {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

std::optional<std::string> syncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return "cannot open " + dir + " to fsync it: " + errnoText(errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return "cannot fsync " + dir + ": " + errnoText(err);
  return std::nullopt;
}

std::optional<std::string> writeFileDurably(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return "cannot create " + tmp + ": " + errnoText(errno);
  if (!writeAllFd(fd, bytes)) {
    const std::string e = "cannot write " + tmp + ": " + errnoText(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    return e;
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
  return syncDirectory(parentOf(path));
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
