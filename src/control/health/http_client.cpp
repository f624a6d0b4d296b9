#include "control/health/http_client.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "spillway/errno_text.hpp"

namespace spillway {
namespace {

char lower(char c) noexcept {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

bool equalsIgnoreCase(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// Printable excerpt of what a server sent, for error messages.
std::string excerpt(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < 40; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    out += c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?';
  }
  if (s.size() > 40) out += "...";
  return out;
}

constexpr std::size_t kMaxChunkSizeLine = 1024;
// The most one event makes an exchange read: a server that sends as fast as
// loopback allows cannot keep the control loop in one recv() loop for
// megabytes (epoll is level-triggered: the rest is read on the next round).
constexpr std::size_t kReadBudget = 256 * 1024;

}  // namespace

SocketAddress::SocketAddress(const IpAddress& address, std::uint16_t port) noexcept {
  if (address.version == IpVersion::V4) {
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(port);
    std::memcpy(&sin.sin_addr, address.bytes.data(), 4);
    std::memcpy(&storage_, &sin, sizeof sin);
    length_ = sizeof sin;
  } else {
    sockaddr_in6 sin6{};
    sin6.sin6_family = AF_INET6;
    sin6.sin6_port = htons(port);
    std::memcpy(&sin6.sin6_addr, address.bytes.data(), 16);
    std::memcpy(&storage_, &sin6, sizeof sin6);
    length_ = sizeof sin6;
  }
}

std::string buildHttpGet(const IpAddress& address, std::uint16_t port, std::string_view path,
                         std::string_view accept, std::string_view bearer) {
  std::string host = formatIpAddress(address);
  if (address.version == IpVersion::V6) host = "[" + host + "]";
  std::string r;
  r.reserve(160 + path.size());
  r += "GET ";
  if (path.empty() || path.front() != '/') r += '/';
  for (const char c : path) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f) {  // never let a path break the request line
      static constexpr char kHex[] = "0123456789ABCDEF";
      r += '%';
      r += kHex[u >> 4];
      r += kHex[u & 0xf];
    } else {
      r += c;
    }
  }
  r += " HTTP/1.1\r\nHost: ";
  r += host;
  r += ':';
  r += std::to_string(port);
  r += "\r\nUser-Agent: spillway\r\nAccept: ";
  r += accept;
  const bool headerSafe = std::all_of(bearer.begin(), bearer.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u > 0x20 && u < 0x7f;
  });
  if (!bearer.empty() && headerSafe) {
    r += "\r\nAuthorization: Bearer ";
    r += bearer;
  }
  r += "\r\nConnection: close\r\n\r\n";
  return r;
}

int parseHttpStatusLine(std::string_view line) noexcept {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.size() < 12 || line.substr(0, 5) != "HTTP/") return -1;
  // "HTTP/" DIGIT "." DIGIT SP 3DIGIT [SP reason]
  if (line[5] < '0' || line[5] > '9' || line[6] != '.' || line[7] < '0' || line[7] > '9' ||
      line[8] != ' ') {
    return -1;
  }
  int code = 0;
  for (std::size_t i = 9; i < 12; ++i) {
    if (line[i] < '0' || line[i] > '9') return -1;
    code = code * 10 + (line[i] - '0');
  }
  if (line.size() > 12 && line[12] != ' ') return -1;
  if (code < 100 || code > 599) return -1;
  return code;
}

HttpExchange::~HttpExchange() {
  closeSocket();
}

void HttpExchange::reset(const HttpRequest& request) noexcept {
  closeSocket();
  try {
    request_ = request;
    state_ = State::Connecting;
    connected_ = false;
    peerClosed_ = false;
    error_.clear();
    out_.clear();
    sent_ = 0;
    in_.clear();
    headerEnd_ = 0;
    scanFrom_ = 0;
    headersParsed_ = false;
    chunked_ = false;
    hasContentLength_ = false;
    contentLength_ = 0;
    chunkPos_ = 0;
    chunkRemaining_ = 0;
    chunkState_ = ChunkState::Size;
    status_ = 0;
    body_.clear();
    if (request_.mode != HttpExchangeMode::ConnectOnly) {
      out_ = buildHttpGet(request_.address, request_.port, request_.path, request_.accept,
                          request_.bearer);
    }
  } catch (...) {
    fail("out of memory");
  }
}

void HttpExchange::start(const HttpRequest& request, int epollFd, std::uint64_t tag) noexcept {
  closeSocket();  // from the epoll fd it was registered with
  epollFd_ = epollFd;
  tag_ = tag;
  reset(request);
  if (state_ == State::Failed) return;

  const SocketAddress addr(request_.address, request_.port);
  fd_ = ::socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) {
    fail("socket: " + errnoText(errno));
    return;
  }
  // Connect before registering: an unconnected socket polls as writable.
  const bool connectedNow = ::connect(fd_, addr.get(), addr.length()) == 0;
  if (!connectedNow && errno != EINPROGRESS) {
    fail("connect: " + errnoText(errno));
    return;
  }
  epoll_event ev{};
  ev.events = EPOLLOUT;
  ev.data.u64 = tag_;
  if (::epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd_, &ev) != 0) {
    fail("epoll_ctl: " + errnoText(errno));
    return;
  }
  registered_ = true;
  if (connectedNow) onConnected();
}

void HttpExchange::onEvent(std::uint32_t events) noexcept {
  switch (state_) {
    case State::Connecting: {
      if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) == 0) return;
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err != 0) {
        fail("connect: " + errnoText(err));
        return;
      }
      sockaddr_storage peer{};
      socklen_t peerLen = sizeof peer;
      if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&peer), &peerLen) != 0) {
        if (errno == ENOTCONN) return;  // not yet: a spurious wake-up
        fail("connect: " + errnoText(errno));
        return;
      }
      onConnected();
      return;
    }
    case State::Sending:
      if ((events & EPOLLERR) != 0) {
        int err = 0;
        socklen_t len = sizeof err;
        (void)::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
        fail("send: " + errnoText(err != 0 ? err : EPIPE));
        return;
      }
      if ((events & (EPOLLOUT | EPOLLHUP)) != 0) sendSome();
      return;
    case State::Receiving:
      if ((events & (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP)) != 0) receiveSome();
      return;
    case State::Idle:
    case State::Done:
    case State::Failed:
      return;
  }
}

void HttpExchange::abort(std::string_view reason) noexcept {
  if (!finished() && state_ != State::Idle) {
    try {
      fail(std::string(reason));
    } catch (...) {
      fail({});
    }
    return;
  }
  closeSocket();
}

void HttpExchange::fail(std::string message) noexcept {
  state_ = State::Failed;
  error_ = std::move(message);
  closeSocket();
}

void HttpExchange::finish() noexcept {
  state_ = State::Done;
  closeSocket();
}

void HttpExchange::closeSocket() noexcept {
  if (fd_ < 0) return;
  if (registered_) ::epoll_ctl(epollFd_, EPOLL_CTL_DEL, fd_, nullptr);
  registered_ = false;
  if (!peerClosed_) {
    // RST instead of FIN: no TIME_WAIT on our side for every probe.
    const linger l{1, 0};
    (void)::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  }
  ::close(fd_);
  fd_ = -1;
}

void HttpExchange::setInterest(std::uint32_t events) noexcept {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = tag_;
  if (::epoll_ctl(epollFd_, EPOLL_CTL_MOD, fd_, &ev) != 0) fail("epoll_ctl: " + errnoText(errno));
}

void HttpExchange::onConnected() noexcept {
  connected_ = true;
  if (request_.mode == HttpExchangeMode::ConnectOnly) {
    finish();
    return;
  }
  state_ = State::Sending;
  sendSome();
}

void HttpExchange::sendSome() noexcept {
  while (sent_ < out_.size()) {
    const ssize_t n = ::send(fd_, out_.data() + sent_, out_.size() - sent_, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        setInterest(EPOLLOUT);
        return;
      }
      fail("send: " + errnoText(errno));
      return;
    }
    sent_ += static_cast<std::size_t>(n);
  }
  state_ = State::Receiving;
  setInterest(EPOLLIN | EPOLLRDHUP);
}

void HttpExchange::startDetached(const HttpRequest& request) noexcept {
  closeSocket();
  epollFd_ = -1;
  tag_ = 0;
  reset(request);
  if (state_ == State::Failed) return;
  connected_ = true;
  if (request_.mode == HttpExchangeMode::ConnectOnly) {
    state_ = State::Done;
    return;
  }
  sent_ = out_.size();
  state_ = State::Receiving;
}

void HttpExchange::feed(std::string_view bytes, std::size_t piece) noexcept {
  piece = std::max<std::size_t>(piece, 1);
  while (state_ == State::Receiving && !bytes.empty()) {
    const std::size_t n = std::min({bytes.size(), piece, receiveRoom()});
    received(bytes.data(), n);
    bytes.remove_prefix(n);
  }
}

void HttpExchange::feedEnd() noexcept {
  if (state_ == State::Receiving) receivedEnd();
}

std::size_t HttpExchange::receiveRoom() const noexcept {
  return request_.maxResponseBytes + 1 - std::min(in_.size(), request_.maxResponseBytes);
}

void HttpExchange::received(const char* data, std::size_t size) noexcept {
  try {
    in_.append(data, size);
  } catch (...) {
    fail("out of memory");
    return;
  }
  parseResponse(false);
  if (state_ == State::Receiving && in_.size() > request_.maxResponseBytes) {
    fail("response larger than " + std::to_string(request_.maxResponseBytes) + " bytes");
  }
}

void HttpExchange::receivedEnd() noexcept {
  peerClosed_ = true;
  parseResponse(true);
  if (state_ == State::Receiving) fail("connection closed early");
}

void HttpExchange::receiveSome() noexcept {
  char buffer[16 * 1024];
  std::size_t budget = kReadBudget;
  while (state_ == State::Receiving && budget > 0) {
    const ssize_t n = ::recv(fd_, buffer, std::min({sizeof buffer, receiveRoom(), budget}), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      fail("recv: " + errnoText(errno));
      return;
    }
    if (n == 0) {
      receivedEnd();
      return;
    }
    received(buffer, static_cast<std::size_t>(n));
    budget -= static_cast<std::size_t>(n);
  }
}

void HttpExchange::parseResponse(bool eof) noexcept {
  try {
    if (request_.mode == HttpExchangeMode::StatusLine) {
      const std::size_t nl = in_.find('\n', scanFrom_);
      if (nl == std::string::npos) {
        scanFrom_ = in_.size();
        if (eof)
          fail(in_.empty() ? "connection closed without a response"
                           : "connection closed inside the status line");
        return;
      }
      std::string_view line = std::string_view(in_).substr(0, nl);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      status_ = parseHttpStatusLine(line);
      if (status_ < 0) {
        fail("malformed status line '" + excerpt(line) + "'");
        return;
      }
      finish();
      return;
    }
    if (!headersParsed_) {
      // From where the last search stopped (less the 3 bytes a split
      // terminator may have left): each byte is searched once, however the
      // response is split, not once per read.
      const std::size_t end = in_.find("\r\n\r\n", scanFrom_);
      if (end == std::string::npos) {
        scanFrom_ = in_.size() < 3 ? 0 : in_.size() - 3;
        if (eof)
          fail(in_.empty() ? "connection closed without a response"
                           : "connection closed inside the response headers");
        return;
      }
      if (!parseHeaders(std::string_view(in_).substr(0, end))) return;
      headerEnd_ = end + 4;
      headersParsed_ = true;
      chunkPos_ = headerEnd_;
      if (status_ == 204 || status_ == 304 || (status_ >= 100 && status_ < 200)) {
        finish();
        return;
      }
    }
    if (chunked_) {
      if (decodeChunks()) {
        finish();
      } else if (eof && state_ == State::Receiving) {
        fail("connection closed inside a chunked body");
      }
      return;
    }
    const std::size_t have = in_.size() - headerEnd_;
    if (hasContentLength_) {
      if (have >= contentLength_) {
        body_.assign(in_, headerEnd_, contentLength_);
        finish();
      } else if (eof) {
        fail("connection closed after " + std::to_string(have) + " of " +
             std::to_string(contentLength_) + " body bytes");
      }
      return;
    }
    if (eof) {
      body_.assign(in_, headerEnd_);
      finish();
    }
  } catch (...) {
    fail("out of memory");
  }
}

bool HttpExchange::parseHeaders(std::string_view head) noexcept {
  std::size_t pos = head.find("\r\n");
  const std::string_view statusLine = head.substr(0, pos);
  status_ = parseHttpStatusLine(statusLine);
  if (status_ < 0) {
    fail("malformed status line '" + excerpt(statusLine) + "'");
    return false;
  }
  while (pos != std::string_view::npos) {
    const std::size_t start = pos + 2;
    pos = head.find("\r\n", start);
    const std::string_view line =
        head.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start);
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) {
      fail("malformed header line '" + excerpt(line) + "'");
      return false;
    }
    const std::string_view name = line.substr(0, colon);
    const std::string_view value = trim(line.substr(colon + 1));
    if (equalsIgnoreCase(name, "Transfer-Encoding")) {
      const std::size_t comma = value.rfind(',');
      const std::string_view last =
          trim(comma == std::string_view::npos ? value : value.substr(comma + 1));
      if (!equalsIgnoreCase(last, "chunked")) {
        fail("unsupported transfer coding '" + excerpt(value) + "'");
        return false;
      }
      if (value.size() != last.size()) {
        fail("unsupported transfer coding '" + excerpt(value) + "'");
        return false;
      }
      chunked_ = true;
    } else if (equalsIgnoreCase(name, "Content-Length")) {
      if (value.empty() || value.size() > 18 ||
          !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        fail("malformed Content-Length '" + excerpt(value) + "'");
        return false;
      }
      std::size_t n = 0;
      for (const char c : value) n = n * 10 + static_cast<std::size_t>(c - '0');
      if (hasContentLength_ && n != contentLength_) {
        fail("conflicting Content-Length headers");
        return false;
      }
      hasContentLength_ = true;
      contentLength_ = n;
    } else if (equalsIgnoreCase(name, "Content-Encoding")) {
      if (!equalsIgnoreCase(value, "identity")) {
        fail("unsupported content coding '" + excerpt(value) + "'");
        return false;
      }
    }
  }
  if (hasContentLength_ && !chunked_ && contentLength_ > request_.maxResponseBytes) {
    fail("response larger than " + std::to_string(request_.maxResponseBytes) +
         " bytes (Content-Length " + std::to_string(contentLength_) + ")");
    return false;
  }
  return true;
}

bool HttpExchange::decodeChunks() noexcept {
  while (true) {
    switch (chunkState_) {
      case ChunkState::Size: {
        const std::size_t eol = in_.find("\r\n", chunkPos_);
        if (eol == std::string::npos || eol - chunkPos_ > kMaxChunkSizeLine) {
          // A line of kMaxChunkSizeLine bytes and its CRLF, whether or not the
          // CRLF came in the same read.
          if (in_.size() - chunkPos_ > kMaxChunkSizeLine + 1) fail("chunk size line too long");
          return false;
        }
        const std::string_view line = std::string_view(in_).substr(chunkPos_, eol - chunkPos_);
        std::size_t size = 0;
        std::size_t digits = 0;
        for (const char c : line) {
          int d = -1;
          if (c >= '0' && c <= '9')
            d = c - '0';
          else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
          else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
          if (d < 0) break;
          // Past the bound the size only has to stay past it (no overflow).
          if (size <= request_.maxResponseBytes) size = size * 16 + static_cast<std::size_t>(d);
          ++digits;
        }
        const std::string_view restOfLine = trim(line.substr(digits));
        if (digits == 0 || (!restOfLine.empty() && restOfLine.front() != ';')) {
          fail("malformed chunk size '" + excerpt(line) + "'");
          return false;
        }
        if (size > request_.maxResponseBytes) {
          fail("response larger than " + std::to_string(request_.maxResponseBytes) + " bytes");
          return false;
        }
        chunkPos_ = eol + 2;
        chunkRemaining_ = size;
        chunkState_ = size == 0 ? ChunkState::Trailer : ChunkState::Data;
        break;
      }
      case ChunkState::Data: {
        const std::size_t take = std::min(chunkRemaining_, in_.size() - chunkPos_);
        body_.append(in_, chunkPos_, take);
        chunkPos_ += take;
        chunkRemaining_ -= take;
        if (chunkRemaining_ > 0) return false;
        chunkState_ = ChunkState::DataEnd;
        break;
      }
      case ChunkState::DataEnd:
        if (in_.size() - chunkPos_ < 2) return false;
        if (in_.compare(chunkPos_, 2, "\r\n") != 0) {
          fail("chunk data not followed by CRLF");
          return false;
        }
        chunkPos_ += 2;
        chunkState_ = ChunkState::Size;
        break;
      case ChunkState::Trailer: {
        const std::size_t eol = in_.find("\r\n", chunkPos_);
        if (eol == std::string::npos || eol - chunkPos_ > kMaxChunkSizeLine) {
          if (in_.size() - chunkPos_ > kMaxChunkSizeLine + 1) fail("trailer line too long");
          return false;
        }
        const bool last = eol == chunkPos_;
        chunkPos_ = eol + 2;
        if (last) return true;
        break;
      }
    }
  }
}

std::string_view toString(HttpExchange::State state) noexcept {
  switch (state) {
    case HttpExchange::State::Idle:
      return "idle";
    case HttpExchange::State::Connecting:
      return "connecting";
    case HttpExchange::State::Sending:
      return "sending";
    case HttpExchange::State::Receiving:
      return "receiving";
    case HttpExchange::State::Done:
      return "done";
    case HttpExchange::State::Failed:
      return "failed";
  }
  return "idle";
}

}  // namespace spillway
