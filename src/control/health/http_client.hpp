// One non-blocking TCP exchange on the control thread: a connect, optionally
// followed by an HTTP/1.1 GET (Connection: close) and its response. The
// health checker (TCP and HTTP probes) and the load scraper are built on it.
//
// The exchange never blocks and has no clock: its owner registers nothing
// itself but passes an epoll fd and a tag, feeds it the epoll events for that
// tag, and applies its own deadline with abort(). Responses are bounded
// (maxResponseBytes counts headers and body as received); a body is delimited
// by Content-Length, chunked transfer coding or the server's close, and a
// chunked body is decoded. Closing sends a RST (SO_LINGER 0) unless the server
// closed first, so probes at 5 Hz leave no TIME_WAIT sockets behind.
//
// Thread contract: one thread (the control thread) owns an exchange and its
// epoll fd. No exceptions escape.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "control/config/config.hpp"

namespace spillway {

// A socket address (sockaddr_in or sockaddr_in6) for an address and port.
class SocketAddress {
 public:
  SocketAddress(const IpAddress& address, std::uint16_t port) noexcept;
  [[nodiscard]] const sockaddr* get() const noexcept {
    return reinterpret_cast<const sockaddr*>(&storage_);
  }
  [[nodiscard]] socklen_t length() const noexcept { return length_; }
  [[nodiscard]] int family() const noexcept { return storage_.ss_family; }

 private:
  sockaddr_storage storage_{};
  socklen_t length_ = 0;
};

enum class HttpExchangeMode : std::uint8_t {
  ConnectOnly,   // done once the TCP handshake completes
  StatusLine,    // send the request, done once the status line is read
  FullResponse,  // send the request, done once the whole response is read
};

struct HttpRequest {
  HttpExchangeMode mode = HttpExchangeMode::FullResponse;
  IpAddress address{};
  std::uint16_t port = 0;
  std::string path = "/";  // see buildHttpGet()
  std::string accept = "*/*";
  std::size_t maxResponseBytes = 1 << 20;  // headers + body, as received
  // Sent as `Authorization: Bearer ...` when not empty; visible ASCII only
  // (the configuration checks it), anything else is not sent.
  std::string bearer;
};

// "GET /path HTTP/1.1\r\nHost: 10.0.0.1:9400\r\n...Connection: close\r\n\r\n";
// an IPv6 host is bracketed; a path gets a leading '/' if it lacks one, and
// its blanks, control and non-ASCII bytes are percent-encoded.
[[nodiscard]] std::string buildHttpGet(const IpAddress& address, std::uint16_t port,
                                       std::string_view path, std::string_view accept,
                                       std::string_view bearer = {});

// The status code of "HTTP/1.x NNN [reason]" (100..599), or -1 when malformed.
[[nodiscard]] int parseHttpStatusLine(std::string_view line) noexcept;

class HttpExchange {
 public:
  enum class State : std::uint8_t { Idle, Connecting, Sending, Receiving, Done, Failed };

  HttpExchange() = default;
  ~HttpExchange();
  HttpExchange(const HttpExchange&) = delete;
  HttpExchange& operator=(const HttpExchange&) = delete;

  // Opens the socket, starts the connect and registers it with `epollFd`
  // under `tag`. The state is Connecting, or Failed at once (error() says
  // why: no route, no file descriptors, ...). Any earlier exchange is aborted.
  void start(const HttpRequest& request, int epollFd, std::uint64_t tag) noexcept;

  // Advances on the epoll events reported for this exchange's tag.
  void onEvent(std::uint32_t events) noexcept;

  // Without a socket, for replays and fuzzing: the exchange waits for the
  // response to `request` (StatusLine or FullResponse) as if it had been
  // sent; feed() hands it bytes as recv() would (in pieces of at most
  // `piece` bytes, the room left under maxResponseBytes bounding each as it
  // bounds a recv()), feedEnd() the server's close. ConnectOnly is Done.
  void startDetached(const HttpRequest& request) noexcept;
  void feed(std::string_view bytes, std::size_t piece = 16 * 1024) noexcept;
  void feedEnd() noexcept;

  // Closes the socket (with RST) and fails with `reason` unless already
  // finished; finished exchanges just release their socket.
  void abort(std::string_view reason) noexcept;

  [[nodiscard]] State state() const noexcept { return state_; }
  [[nodiscard]] bool finished() const noexcept {
    return state_ == State::Done || state_ == State::Failed;
  }
  [[nodiscard]] bool connected() const noexcept { return connected_; }
  [[nodiscard]] const std::string& error() const noexcept { return error_; }
  // With Done in an HTTP mode: the status code, and for FullResponse the body.
  [[nodiscard]] int status() const noexcept { return status_; }
  [[nodiscard]] std::string_view body() const noexcept { return body_; }

 private:
  void fail(std::string message) noexcept;
  void finish() noexcept;
  void closeSocket() noexcept;
  void onConnected() noexcept;
  void sendSome() noexcept;
  void receiveSome() noexcept;
  // How many bytes the next read may take: one past maxResponseBytes at most.
  [[nodiscard]] std::size_t receiveRoom() const noexcept;
  void received(const char* data, std::size_t size) noexcept;
  void receivedEnd() noexcept;
  void reset(const HttpRequest& request) noexcept;
  // Parses what has arrived; finishes or fails when it can tell.
  void parseResponse(bool eof) noexcept;
  bool parseHeaders(std::string_view head) noexcept;
  bool decodeChunks() noexcept;  // true when the last chunk and trailers are in
  void setInterest(std::uint32_t events) noexcept;

  HttpRequest request_{};
  int epollFd_ = -1;
  std::uint64_t tag_ = 0;
  int fd_ = -1;
  bool registered_ = false;
  State state_ = State::Idle;
  bool connected_ = false;
  bool peerClosed_ = false;
  std::string error_;
  std::string out_;
  std::size_t sent_ = 0;
  std::string in_;
  std::size_t headerEnd_ = 0;  // offset of the body in in_, once headers are parsed
  std::size_t scanFrom_ = 0;   // where the search for the status line / head's end resumes
  bool headersParsed_ = false;
  bool chunked_ = false;
  bool hasContentLength_ = false;
  std::size_t contentLength_ = 0;
  std::size_t chunkPos_ = 0;        // next undecoded byte of a chunked body in in_
  std::size_t chunkRemaining_ = 0;  // data bytes left in the current chunk
  enum class ChunkState : std::uint8_t {
    Size,
    Data,
    DataEnd,
    Trailer
  } chunkState_ = ChunkState::Size;
  int status_ = 0;
  std::string body_;
};

[[nodiscard]] std::string_view toString(HttpExchange::State state) noexcept;

}  // namespace spillway
