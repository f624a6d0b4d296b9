#include "conn_agent.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "spillway/errno_text.hpp"

namespace spillway {
namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r'))
    text.remove_suffix(1);
  return text;
}

// %XX in a query value (IPv6 colons may come encoded).
std::optional<std::string> percentDecode(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    if (i + 2 >= text.size()) return std::nullopt;
    unsigned value = 0;
    for (std::size_t k = 1; k <= 2; ++k) {
      const char c = text[i + k];
      value <<= 4;
      if (c >= '0' && c <= '9') {
        value |= static_cast<unsigned>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        value |= static_cast<unsigned>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        value |= static_cast<unsigned>(c - 'A' + 10);
      } else {
        return std::nullopt;
      }
    }
    out += static_cast<char>(value);
    i += 2;
  }
  return out;
}

volatile std::sig_atomic_t gStop = 0;
void onSignal(int) {
  gStop = 1;
}

}  // namespace

std::optional<AgentRequest> parseAgentRequest(std::string_view head) {
  const std::size_t lineEnd = head.find("\r\n");
  const std::string_view line = head.substr(0, lineEnd);
  const std::size_t sp1 = line.find(' ');
  const std::size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos || sp1 == 0) {
    return std::nullopt;
  }
  if (!line.substr(sp2 + 1).starts_with("HTTP/1.")) return std::nullopt;
  AgentRequest request;
  request.method = std::string(line.substr(0, sp1));
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (target.empty() || target.front() != '/') return std::nullopt;
  const std::size_t q = target.find('?');
  request.path = std::string(target.substr(0, q));
  if (q != std::string_view::npos) {
    std::string_view query = target.substr(q + 1);
    while (!query.empty()) {
      const std::size_t amp = query.find('&');
      const std::string_view pair = query.substr(0, amp);
      if (pair.starts_with("vip=")) {
        const auto value = percentDecode(pair.substr(4));
        if (!value) return std::nullopt;
        request.vip = *value;
      }
      if (amp == std::string_view::npos) break;
      query.remove_prefix(amp + 1);
    }
  }
  std::string_view rest = lineEnd == std::string_view::npos ? "" : head.substr(lineEnd + 2);
  while (!rest.empty()) {
    const std::size_t end = rest.find("\r\n");
    const std::string_view header = rest.substr(0, end);
    rest = end == std::string_view::npos ? "" : rest.substr(end + 2);
    if (header.empty()) break;
    const std::size_t colon = header.find(':');
    if (colon == std::string_view::npos) return std::nullopt;
    if (lower(header.substr(0, colon)) != "authorization") continue;
    const std::string_view value = trim(header.substr(colon + 1));
    if (lower(value.substr(0, 7)) == "bearer ") request.bearer = std::string(trim(value.substr(7)));
  }
  return request;
}

void ConnView::add(const DiagSocket& socket) {
  for (std::size_t i = 0; i < vips.size(); ++i) {
    if (vips[i] == socket.local) {
      ++counts[i];
      sockets.emplace_back(i, socket);
      return;
    }
  }
}

std::string renderConnMetrics(const ConnView& view, const AgentCounters& counters) {
  std::ostringstream out;
  out << "# HELP spillway_backend_connections TCP connections of this host whose local address "
         "is the VIP (sock_diag: SYN_RECV to LAST_ACK; not LISTEN or TIME_WAIT).\n"
         "# TYPE spillway_backend_connections gauge\n";
  for (std::size_t i = 0; i < view.vips.size(); ++i) {
    out << "spillway_backend_connections{vip=\"" << view.vips[i].text() << "\"} " << view.counts[i]
        << '\n';
  }
  out << "# HELP spillway_backend_agent_requests_total Requests the agent answered.\n"
         "# TYPE spillway_backend_agent_requests_total counter\n"
         "spillway_backend_agent_requests_total "
      << counters.requests
      << "\n# HELP spillway_backend_agent_refused_total Connection list requests refused for "
         "a missing or wrong token.\n"
         "# TYPE spillway_backend_agent_refused_total counter\n"
         "spillway_backend_agent_refused_total "
      << counters.refused
      << "\n# HELP spillway_backend_agent_bad_requests_total Requests dropped: unparsable, "
         "too large or too slow.\n"
         "# TYPE spillway_backend_agent_bad_requests_total counter\n"
         "spillway_backend_agent_bad_requests_total "
      << counters.badRequests
      << "\n# HELP spillway_backend_agent_dump_errors_total Socket dumps that failed.\n"
         "# TYPE spillway_backend_agent_dump_errors_total counter\n"
         "spillway_backend_agent_dump_errors_total "
      << counters.dumpErrors << '\n';
  return out.str();
}

std::string renderConnList(const ConnView& view, const std::string& only, std::size_t cap) {
  nlohmann::ordered_json vips = nlohmann::ordered_json::object();
  std::size_t listed = 0;
  std::size_t total = 0;
  for (std::size_t i = 0; i < view.vips.size(); ++i) {
    const std::string name = view.vips[i].text();
    if (!only.empty() && only != name) continue;
    vips[name] = nlohmann::ordered_json::array();
  }
  for (const auto& [index, socket] : view.sockets) {
    const std::string name = view.vips[index].text();
    if (!only.empty() && only != name) continue;
    ++total;
    if (listed >= cap) continue;
    ++listed;
    vips[name].push_back({{"client", socket.remote.text()},
                          {"client_port", socket.remotePort},
                          {"vip_port", socket.localPort},
                          {"state", socket.state}});
  }
  const nlohmann::ordered_json out = {{"vips", vips},
                                      {"listed", listed},
                                      {"total", total},
                                      {"cap", cap},
                                      {"truncated", listed < total}};
  return out.dump() + "\n";
}

bool tokenMatches(std::string_view presented, std::string_view token) noexcept {
  if (presented.empty() || token.empty()) return false;
  // Hand-written rather than CRYPTO_memcmp / sodium_memcmp: neither library
  // is linked anywhere in Spillway, and this loop is all that is needed.
  // Length is not secret (the token file's size); the bytes are compared
  // without an early exit.
  unsigned char diff = presented.size() == token.size() ? 0 : 1;
  for (std::size_t i = 0; i < token.size(); ++i) {
    const unsigned char p = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff |= static_cast<unsigned char>(p ^ static_cast<unsigned char>(token[i]));
  }
  return diff == 0;
}

namespace {

struct Listener {
  int fd = -1;
  std::string error;
};

Listener openListener(const std::string& listen) {
  Listener l;
  const std::size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon + 1 == listen.size()) {
    l.error = "--listen '" + listen + "': expected ADDRESS:PORT";
    return l;
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  int port = 0;
  try {
    port = std::stoi(listen.substr(colon + 1));
  } catch (...) {
    port = 0;
  }
  if (port <= 0 || port > 65535) {
    l.error = "--listen '" + listen + "': bad port";
    return l;
  }
  sockaddr_storage storage{};
  socklen_t length = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<std::uint16_t>(port));
    length = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<std::uint16_t>(port));
    length = sizeof(sockaddr_in6);
  } else {
    l.error = "--listen '" + listen + "': '" + host + "' is not a numeric address";
    return l;
  }
  l.fd = ::socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l.fd < 0) {
    l.error = "socket: " + errnoText(errno);
    return l;
  }
  const int one = 1;
  (void)::setsockopt(l.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(l.fd, reinterpret_cast<sockaddr*>(&storage), length) != 0 || ::listen(l.fd, 64) != 0) {
    l.error = "cannot listen on " + listen + ": " + errnoText(errno);
    ::close(l.fd);
    l.fd = -1;
  }
  return l;
}

// A client whose request head is still arriving.
struct Pending {
  int fd = -1;
  std::string in;
  std::chrono::steady_clock::time_point deadline;
};

// Writes an answer within kSendBudgetMs in all (a client that does not read
// loses the rest of it).
constexpr int kSendBudgetMs = 1000;
void sendAll(int fd, std::string_view data) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kSendBudgetMs);
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) return;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return;
  }
}

std::string_view reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    default:
      return "Service Unavailable";
  }
}

}  // namespace

int runConnAgent(const ConnAgentOptions& options) {
  try {
    std::vector<DiagAddress> vips;
    for (const std::string& text : options.vips) {
      const auto address = DiagAddress::parse(text);
      if (!address) {
        std::cerr << "spillway-decap agent: --vip '" << text << "' is not an address\n";
        return 2;
      }
      vips.push_back(*address);
    }
    std::string token;
    if (!options.tokenFile.empty()) {
      std::ifstream file(options.tokenFile, std::ios::binary);
      if (!file) {
        std::cerr << "spillway-decap agent: cannot read --token-file " << options.tokenFile << '\n';
        return 1;
      }
      std::ostringstream text;
      text << file.rdbuf();
      token = text.str();
      while (!token.empty() && (token.back() == '\n' || token.back() == '\r' ||
                                token.back() == ' ' || token.back() == '\t'))
        token.pop_back();
      if (token.size() < 16) {
        std::cerr << "spillway-decap agent: --token-file " << options.tokenFile
                  << " holds fewer than 16 bytes\n";
        return 1;
      }
    }
    const Listener listener = openListener(options.listen);
    if (listener.fd < 0) {
      std::cerr << "spillway-decap agent: " << listener.error << '\n';
      return 1;
    }
    struct sigaction action {};
    action.sa_handler = onSignal;
    sigaction(SIGTERM, &action, nullptr);
    sigaction(SIGINT, &action, nullptr);
    std::cout << "spillway-decap agent: listening on " << options.listen << ", " << vips.size()
              << " VIPs, connection list " << (token.empty() ? "disabled" : "enabled") << std::endl;
    AgentCounters counters;
    const auto dump = [](ConnView& view, std::string& error) {
      return dumpTcpSockets([&view](const DiagSocket& socket) { view.add(socket); }, error);
    };
    // Clients are read side by side (poll), so one that sends slowly or
    // not at all holds a slot until its deadline, never the others' answers.
    // Beyond kMaxPending slots, the oldest pending client is dropped.
    std::vector<Pending> pending;
    const auto answer = [&](Pending& c) {
      const auto request = parseAgentRequest(c.in);
      AgentResponse response;
      if (!request) {
        ++counters.badRequests;
        response.status = 400;
        response.body = "bad request\n";
      } else {
        response = answerAgentRequest(*request, vips, token, options.listCap, counters, dump);
      }
      const std::string out = "HTTP/1.1 " + std::to_string(response.status) + " " +
                              std::string(reason(response.status)) +
                              "\r\nContent-Type: " + response.contentType +
                              "\r\nContent-Length: " + std::to_string(response.body.size()) +
                              "\r\nConnection: close\r\n\r\n" + response.body;
      sendAll(c.fd, out);
    };
    while (gStop == 0) {
      std::vector<pollfd> fds;
      fds.push_back(pollfd{listener.fd, POLLIN, 0});
      for (const Pending& c : pending) fds.push_back(pollfd{c.fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) break;
      const auto now = std::chrono::steady_clock::now();
      for (std::size_t i = 1; i < fds.size(); ++i) {
        Pending& c = pending[i - 1];
        bool done = false;
        if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
          char buffer[2048];
          const ssize_t n = ::recv(c.fd, buffer, sizeof(buffer), MSG_DONTWAIT);
          if (n > 0) {
            c.in.append(buffer, static_cast<std::size_t>(n));
            if (c.in.find("\r\n\r\n") != std::string::npos) {
              answer(c);
              done = true;
            } else if (c.in.size() > kMaxRequestBytes) {
              ++counters.badRequests;
              done = true;
            }
          } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            ++counters.badRequests;  // closed before a whole request head
            done = true;
          }
        }
        if (!done && now >= c.deadline) {
          ++counters.badRequests;  // too slow
          done = true;
        }
        if (done) {
          ::close(c.fd);
          c.fd = -1;
        }
      }
      std::erase_if(pending, [](const Pending& c) { return c.fd < 0; });
      if ((fds[0].revents & POLLIN) != 0) {
        const int client = ::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (client >= 0) {
          if (pending.size() >= kMaxPending) {
            ++counters.badRequests;  // the oldest pending client makes room
            ::close(pending.front().fd);
            pending.erase(pending.begin());
          }
          pending.push_back(
              Pending{client, {}, now + std::chrono::milliseconds(options.readTimeoutMs)});
        }
      }
    }
    for (const Pending& c : pending) ::close(c.fd);
    ::close(listener.fd);
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "spillway-decap agent: error: " << error.what() << '\n';
    return 1;
  }
}

}  // namespace spillway
