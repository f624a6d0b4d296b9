#include "control/api/metrics_http.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <utility>

#include "control/sys/epoll_loop.hpp"
#include "spillway/errno_text.hpp"

namespace spillway {
namespace {

constexpr int kListenBacklog = 64;
constexpr int kMaxEventsPerPoll = 64;
constexpr int kMaxAcceptsPerPoll = 64;
constexpr std::size_t kMaxDrainBytes = 64 * 1024;

bool isAlpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool isDigit(char c) {
  return c >= '0' && c <= '9';
}

// Valid UTF-8 (RFC 3629) unchanged; each invalid byte becomes U+FFFD.
std::string sanitizeUtf8(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  std::size_t i = 0;
  while (i < in.size()) {
    const auto b = static_cast<unsigned char>(in[i]);
    std::size_t len = 0;
    std::uint32_t min = 0;
    std::uint32_t cp = 0;
    if (b < 0x80) {
      out += static_cast<char>(b);
      ++i;
      continue;
    }
    if ((b & 0xe0) == 0xc0) {
      len = 2, min = 0x80, cp = b & 0x1f;
    } else if ((b & 0xf0) == 0xe0) {
      len = 3, min = 0x800, cp = b & 0x0f;
    } else if ((b & 0xf8) == 0xf0) {
      len = 4, min = 0x10000, cp = b & 0x07;
    }
    bool valid = len != 0 && i + len <= in.size();
    for (std::size_t k = 1; valid && k < len; ++k) {
      const auto c = static_cast<unsigned char>(in[i + k]);
      if ((c & 0xc0) != 0x80) valid = false;
      cp = (cp << 6) | (c & 0x3f);
    }
    if (valid && (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))) valid = false;
    if (valid) {
      out.append(in.substr(i, len));
      i += len;
    } else {
      out += "\xef\xbf\xbd";
      ++i;
    }
  }
  return out;
}

std::string_view typeName(MetricType type) {
  switch (type) {
    case MetricType::Counter:
      return "counter";
    case MetricType::Gauge:
      return "gauge";
    case MetricType::Histogram:
      return "histogram";
    case MetricType::Untyped:
      return "untyped";
  }
  return "untyped";
}

std::string_view reasonPhrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Error";
  }
}

std::string httpResponse(int status, std::string_view contentType, std::string_view body,
                         bool headOnly, std::string_view extraHeaders = {}) {
  std::string out =
      "HTTP/1.1 " + std::to_string(status) + " " + std::string(reasonPhrase(status)) + "\r\n";
  out += "Content-Type: ";
  out += contentType;
  out += "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  out += extraHeaders;
  out += "Connection: close\r\n\r\n";
  if (!headOnly) out += body;
  return out;
}

std::string textResponse(int status, std::string_view message, bool headOnly,
                         std::string_view extraHeaders = {}) {
  return httpResponse(status, "text/plain; charset=utf-8", std::string(message) + "\n", headOnly,
                      extraHeaders);
}

}  // namespace

std::optional<ListenAddress> parseListenAddress(std::string_view text) {
  ListenAddress out;
  std::string_view host;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return std::nullopt;
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
    out.ipv6 = true;
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) return std::nullopt;
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) return std::nullopt;  // v6 needs brackets
  }
  if (host.empty() || port.empty() || port.size() > 5) return std::nullopt;
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || end != port.data() + port.size() || value > 65535) return std::nullopt;
  out.host = std::string(host);
  out.port = static_cast<std::uint16_t>(value);
  std::array<unsigned char, 16> bytes{};
  if (inet_pton(out.ipv6 ? AF_INET6 : AF_INET, out.host.c_str(), bytes.data()) != 1) {
    return std::nullopt;
  }
  return out;
}

MetricsHttpOptions MetricsHttpOptions::fromConfig(const ControlConfig& config) {
  MetricsHttpOptions options;
  options.listen = config.metricsListen;
  return options;
}

MetricsHttpServer::MetricsHttpServer(ControlApi& api, MetricsHttpOptions options)
    : api_(api), options_(std::move(options)) {}

MetricsHttpServer::~MetricsHttpServer() {
  close();
}

std::chrono::steady_clock::time_point MetricsHttpServer::now() const {
  return options_.clock ? options_.clock() : std::chrono::steady_clock::now();
}

bool MetricsHttpServer::open(std::string& error) {
  close();
  if (options_.listen.empty()) return true;
  const auto fail = [&](std::string why) {
    error = "metrics endpoint " + options_.listen + ": " + why;
    close();
    return false;
  };
  const auto address = parseListenAddress(options_.listen);
  if (!address) {
    return fail("not an IP literal and port (\"127.0.0.1:9550\", \"[::1]:9550\")");
  }
  sockaddr_storage storage{};
  socklen_t length = 0;
  if (address->ipv6) {
    auto* sa = reinterpret_cast<sockaddr_in6*>(&storage);
    sa->sin6_family = AF_INET6;
    sa->sin6_port = htons(address->port);
    inet_pton(AF_INET6, address->host.c_str(), &sa->sin6_addr);
    length = sizeof *sa;
  } else {
    auto* sa = reinterpret_cast<sockaddr_in*>(&storage);
    sa->sin_family = AF_INET;
    sa->sin_port = htons(address->port);
    inet_pton(AF_INET, address->host.c_str(), &sa->sin_addr);
    length = sizeof *sa;
  }
  listenFd_ =
      socket(address->ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listenFd_ < 0) return fail("socket: " + errnoText(errno));
  const int one = 1;
  (void)setsockopt(listenFd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(listenFd_, reinterpret_cast<const sockaddr*>(&storage), length) != 0) {
    return fail("bind: " + errnoText(errno));
  }
  if (listen(listenFd_, kListenBacklog) != 0) return fail("listen: " + errnoText(errno));
  sockaddr_storage bound{};
  socklen_t boundLength = sizeof bound;
  if (getsockname(listenFd_, reinterpret_cast<sockaddr*>(&bound), &boundLength) == 0) {
    port_ = ntohs(address->ipv6 ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  }
  if (std::string why = watchListener(listenFd_, epollFd_); !why.empty()) return fail(why);
  return true;
}

void MetricsHttpServer::close() noexcept {
  while (!clients_.empty()) closeClient(clients_.begin()->first);
  if (epollFd_ >= 0) ::close(epollFd_);
  if (listenFd_ >= 0) ::close(listenFd_);
  epollFd_ = listenFd_ = -1;
  port_ = 0;
}

void MetricsHttpServer::closeClient(std::uint64_t id) noexcept {
  spillway::closeClient(epollFd_, clients_, id);
}

void MetricsHttpServer::poll() noexcept {
  if (epollFd_ < 0) return;
  dispatchReady<kMaxEventsPerPoll>(
      epollFd_, clients_, [this] { acceptClients(); },
      [this](std::uint64_t id, Client& client, std::uint32_t) {
        switch (client.phase) {
          case Phase::Reading:
            readRequest(id, client);
            break;
          case Phase::Writing:
            writeResponse(id, client);
            break;
          case Phase::Draining:
            drain(id, client);
            break;
        }
      });
  try {
    const auto t = now();
    closeExpired(
        clients_,
        [&](const Client& client) {
          return t >= client.deadline ||
                 (client.phase == Phase::Reading && t >= client.requestDeadline);
        },
        [this](std::uint64_t id) { closeClient(id); });
  } catch (...) {
  }
}

void MetricsHttpServer::acceptClients() noexcept {
  for (int i = 0; i < kMaxAcceptsPerPoll; ++i) {
    const int fd = accept4(listenFd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    bool adopted = false;
    try {
      // Full: the oldest connection that is not mid-response makes room (an
      // idle one, or one waiting for its peer to close); a scraper sends its
      // request at once, so idle connections cannot keep it out.
      if (clients_.size() >= options_.maxClients && options_.maxClients > 0) {
        const auto victim = std::find_if(clients_.begin(), clients_.end(), [](const auto& entry) {
          return entry.second.phase != Phase::Writing;
        });
        if (victim != clients_.end()) closeClient(victim->first);
      }
      if (clients_.size() < options_.maxClients) {
        const std::uint64_t id = nextId_++;
        Client client;
        client.fd = fd;
        const auto t = now();
        client.deadline = t + options_.timeout;
        client.requestDeadline = t + options_.requestTimeout;
        adopted = adoptClient(epollFd_, clients_, id, std::move(client));
      } else {
        // Every connection is mid-response: a readable refusal, not a reset.
        const std::string busy =
            textResponse(503,
                         "busy: " + std::to_string(clients_.size()) +
                             " metrics connections are sending responses; try again",
                         false);
        (void)::send(fd, busy.data(), busy.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        (void)::shutdown(fd, SHUT_WR);
        // Unread input would turn the close into a reset that may cut the reply.
        char sink[4096];
        for (int j = 0; j < 4 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; ++j) {
        }
      }
    } catch (...) {
    }
    if (!adopted) ::close(fd);
  }
}

void MetricsHttpServer::readRequest(std::uint64_t id, Client& client) noexcept {
  try {
    char buffer[4096];
    for (;;) {
      const ssize_t n = recv(client.fd, buffer, sizeof buffer, MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        if (errno == EINTR) continue;
        closeClient(id);
        return;
      }
      if (n == 0) {  // closed before a complete request: nobody to answer
        closeClient(id);
        return;
      }
      client.in.append(buffer, static_cast<std::size_t>(n));
      if (client.in.size() > options_.maxRequestBytes) break;
    }
    const bool complete = client.in.find("\r\n\r\n") != std::string::npos ||
                          client.in.find("\n\n") != std::string::npos;
    if (!complete && client.in.size() <= options_.maxRequestBytes) return;
    respond(client);
    client.in.clear();
    client.in.shrink_to_fit();
    client.phase = Phase::Writing;
    epoll_event ev{};
    ev.events = EPOLLOUT;
    ev.data.u64 = id;
    epoll_ctl(epollFd_, EPOLL_CTL_MOD, client.fd, &ev);
    writeResponse(id, client);
  } catch (...) {
    closeClient(id);
  }
}

void MetricsHttpServer::respond(Client& client) noexcept {
  try {
    const std::string& in = client.in;
    const std::size_t headEnd = std::min(in.find("\r\n\r\n"), in.find("\n\n"));
    if (headEnd == std::string::npos || headEnd > options_.maxRequestBytes) {
      client.out = textResponse(431, "request head too large", false);
      return;
    }
    const std::size_t lineEnd = in.find('\n');
    std::string_view line(in.data(), lineEnd);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const std::size_t sp1 = line.find(' ');
    const std::size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp1 == std::string_view::npos || sp2 == std::string_view::npos ||
        line.find(' ', sp2 + 1) != std::string_view::npos) {
      client.out = textResponse(400, "malformed request line", false);
      return;
    }
    const std::string_view method = line.substr(0, sp1);
    const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    const std::string_view version = line.substr(sp2 + 1);
    bool methodOk = !method.empty();
    for (char c : method) methodOk = methodOk && c >= 'A' && c <= 'Z';
    if (!methodOk || target.empty() || target.front() != '/') {
      client.out = textResponse(400, "malformed request line", false);
      return;
    }
    if (version != "HTTP/1.1" && version != "HTTP/1.0") {
      client.out = textResponse(505, "only HTTP/1.0 and HTTP/1.1", false);
      return;
    }
    const bool head = method == "HEAD";
    const std::string_view path = target.substr(0, target.find('?'));
    if (path != "/metrics") {
      client.out = textResponse(404, "not found; metrics are at /metrics", head);
      return;
    }
    if (method != "GET" && !head) {
      client.out = textResponse(405, "only GET and HEAD", false, "Allow: GET, HEAD\r\n");
      return;
    }
    client.out = httpResponse(200, "text/plain; version=0.0.4", api_.metricsText(), head);
  } catch (...) {
    try {
      client.out = textResponse(500, "internal error", false);
    } catch (...) {
      client.out.clear();
    }
  }
}

void MetricsHttpServer::writeResponse(std::uint64_t id, Client& client) noexcept {
  while (client.sent < client.out.size()) {
    const ssize_t n = ::send(client.fd, client.out.data() + client.sent,
                             client.out.size() - client.sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR) continue;
      closeClient(id);
      return;
    }
    client.sent += static_cast<std::size_t>(n);
  }
  // All written: shut our side and wait for the peer to close, so unread
  // input does not turn the close into a reset that could cut the response.
  ::shutdown(client.fd, SHUT_WR);
  client.out.clear();
  client.out.shrink_to_fit();
  client.phase = Phase::Draining;
  client.sent = 0;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.u64 = id;
  epoll_ctl(epollFd_, EPOLL_CTL_MOD, client.fd, &ev);
  drain(id, client);
}

void MetricsHttpServer::drain(std::uint64_t id, Client& client) noexcept {
  char buffer[4096];
  for (;;) {
    const ssize_t n = recv(client.fd, buffer, sizeof buffer, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    client.sent += static_cast<std::size_t>(n);  // bytes discarded
    if (client.sent > kMaxDrainBytes) break;
  }
  closeClient(id);
}

// --- MetricsWriter ---------------------------------------------------------

std::string MetricsWriter::metricName(std::string_view name) {
  std::string out;
  out.reserve(name.size() + 1);
  for (char c : name) {
    if (isDigit(c) && out.empty()) out += '_';
    out += isAlpha(c) || isDigit(c) || c == '_' || c == ':' ? c : '_';
  }
  if (out.empty()) out = "_";
  return out;
}

std::string MetricsWriter::labelName(std::string_view name) {
  std::string out;
  out.reserve(name.size() + 1);
  for (char c : name) {
    if (isDigit(c) && out.empty()) out += '_';
    out += isAlpha(c) || isDigit(c) || c == '_' ? c : '_';
  }
  if (out.empty()) out = "_";
  return out;
}

std::string MetricsWriter::escapeLabelValue(std::string_view value) {
  const std::string clean = sanitizeUtf8(value);
  std::string out;
  out.reserve(clean.size());
  for (char c : clean) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string MetricsWriter::escapeHelp(std::string_view help) {
  const std::string clean = sanitizeUtf8(help);
  std::string out;
  out.reserve(clean.size());
  for (char c : clean) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string MetricsWriter::formatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::trunc(value) && std::fabs(value) < 1e15) {
    return std::to_string(static_cast<std::int64_t>(value));
  }
  char buffer[64];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  if (ec != std::errc()) return "NaN";
  return std::string(buffer, end);
}

MetricsWriter::Family* MetricsWriter::family(std::string_view name, MetricType type,
                                             std::string_view help) {
  std::string full = metricName(name);
  if (type == MetricType::Counter && !full.ends_with("_total")) full += "_total";
  const auto it = index_.find(full);
  if (it != index_.end()) {
    Family& f = families_[it->second];
    return f.type == type ? &f : nullptr;
  }
  index_.emplace(full, families_.size());
  families_.push_back(Family{full, type, escapeHelp(help), {}, {}});
  return &families_.back();
}

namespace {

// "{a="x",b="y"}" (empty when no labels); a repeated or reserved name is
// skipped.
std::string renderLabels(std::span<const MetricLabel> labels, std::string_view reserved) {
  std::string out;
  std::vector<std::string> names;
  for (const MetricLabel& label : labels) {
    std::string name = MetricsWriter::labelName(label.name);
    if (name == reserved || std::find(names.begin(), names.end(), name) != names.end()) continue;
    out += out.empty() ? "{" : ",";
    out += name + "=\"" + MetricsWriter::escapeLabelValue(label.value) + "\"";
    names.push_back(std::move(name));
  }
  if (!out.empty()) out += "}";
  return out;
}

// Adds `extra` (already rendered, "le=\"1\"") to a rendered label set.
std::string withLabel(const std::string& labels, const std::string& extra) {
  if (labels.empty()) return "{" + extra + "}";
  return labels.substr(0, labels.size() - 1) + "," + extra + "}";
}

}  // namespace

void MetricsWriter::sample(std::string_view name, MetricType type, std::string_view help,
                           std::span<const MetricLabel> labels, double value) {
  Family* f = family(name, type, help);
  std::string rendered = renderLabels(labels, {});
  if (f == nullptr || f->series.contains(rendered)) {
    ++dropped_;
    return;
  }
  f->samples += f->name + rendered + " " + formatValue(value) + "\n";
  f->series.insert(std::move(rendered));
}

void MetricsWriter::counter(std::string_view name, std::string_view help,
                            std::span<const MetricLabel> labels, double value) {
  sample(name, MetricType::Counter, help, labels, value);
}

void MetricsWriter::gauge(std::string_view name, std::string_view help,
                          std::span<const MetricLabel> labels, double value) {
  sample(name, MetricType::Gauge, help, labels, value);
}

void MetricsWriter::histogram(std::string_view name, std::string_view help,
                              std::span<const MetricLabel> labels,
                              std::span<const HistogramBucket> buckets, double sum,
                              std::uint64_t count) {
  Family* f = family(name, MetricType::Histogram, help);
  std::string rendered = renderLabels(labels, "le");
  if (f == nullptr || f->series.contains(rendered)) {
    ++dropped_;
    return;
  }
  bool hasInf = false;
  for (const HistogramBucket& b : buckets) {
    if (std::isnan(b.upperBound)) continue;
    hasInf = hasInf || (std::isinf(b.upperBound) && b.upperBound > 0);
    f->samples += f->name + "_bucket" +
                  withLabel(rendered, "le=\"" + formatValue(b.upperBound) + "\"") + " " +
                  formatValue(static_cast<double>(b.count)) + "\n";
  }
  if (!hasInf) {
    f->samples += f->name + "_bucket" + withLabel(rendered, "le=\"+Inf\"") + " " +
                  formatValue(static_cast<double>(count)) + "\n";
  }
  f->samples += f->name + "_sum" + rendered + " " + formatValue(sum) + "\n";
  f->samples +=
      f->name + "_count" + rendered + " " + formatValue(static_cast<double>(count)) + "\n";
  f->series.insert(std::move(rendered));
}

std::string MetricsWriter::text() const {
  std::string out;
  for (const Family& f : families_) {
    out += "# HELP " + f.name + " " + f.help + "\n";
    out += "# TYPE " + f.name + " " + std::string(typeName(f.type)) + "\n";
    out += f.samples;
  }
  return out;
}

}  // namespace spillway
