// The client end of the CLI socket (cli_server.hpp): one connection, one
// request and its reply at a time. spillwayctl and the tier client use it;
// it needs nothing of the daemon (no configuration, no control plane).
//
// Thread contract: one CliClient per thread.
#pragma once

#include <sys/un.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace spillway {

// Fills a Unix socket address; false when the path is empty or too long.
[[nodiscard]] bool fillUnixAddress(const std::string& path, sockaddr_un& addr) noexcept;

// One connection to a CliServer: connect once, then call() per request.
class CliClient {
 public:
  CliClient() = default;
  ~CliClient();
  CliClient(const CliClient&) = delete;
  CliClient& operator=(const CliClient&) = delete;

  // On failure `error` says which socket and why ("cannot connect to PATH: ...").
  // With a timeout, connect() gives up when the server's backlog stays full
  // for that long (spillwayctl passes its --timeout).
  [[nodiscard]] bool connect(const std::string& socketPath, std::string& error,
                             std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  // Sends one request message and waits for its reply message. When the
  // server refused the connection (busy), its error reply is the reply.
  [[nodiscard]] bool call(std::string_view request, std::string& reply,
                          std::chrono::milliseconds timeout, std::string& error);
  void close() noexcept;
  [[nodiscard]] int fd() const noexcept { return fd_; }

 private:
  [[nodiscard]] bool receive(std::string& reply, std::chrono::milliseconds timeout,
                             std::string& error);
  int fd_ = -1;
};

}  // namespace spillway
