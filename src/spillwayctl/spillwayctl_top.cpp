#include "spillwayctl/spillwayctl_top.hpp"

#include <poll.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <deque>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "control/api/cli_client.hpp"
#include "control/api/protocol.hpp"

namespace spillway {
namespace {

using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t gQuit = 0;
volatile std::sig_atomic_t gResized = 0;

void onQuit(int) {
  gQuit = 1;
}
void onResize(int) {
  gResized = 1;
}

// --- formatting ----------------------------------------------------------------

std::string printf1(const char* format, double v) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, v);
  return buffer;
}

std::string percent(const Json& v) {  // a 0-1 share
  return v.is_number() ? printf1("%.1f%%", v.get<double>() * 100.0) : "-";
}

// 950, 12.3k, 4.56M, 7.89G
std::string human(double v) {
  if (v < 1000) return printf1("%.0f", v);
  if (v < 1e6) return printf1("%.1fk", v / 1e3);
  if (v < 1e9) return printf1("%.2fM", v / 1e6);
  return printf1("%.2fG", v / 1e9);
}

std::string text(const Json& v) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  if (v.is_number_float()) return printf1("%.3g", v.get<double>());
  return v.dump();
}

// A boolean field that may be missing or null.
bool flag(const Json& o, const char* key) {
  const auto it = o.find(key);
  return it != o.end() && it->is_boolean() && it->get<bool>();
}

std::string field(const Json& o, const char* key) {
  const auto it = o.find(key);
  return it == o.end() ? "-" : text(*it);
}

std::string duration(double ms) {
  const auto s = static_cast<long long>(ms / 1000);
  if (s < 60) return std::to_string(s) + "s";
  if (s < 3600) return std::to_string(s / 60) + "m" + std::to_string(s % 60) + "s";
  return std::to_string(s / 3600) + "h" + std::to_string(s % 3600 / 60) + "m";
}

// Columns: text left-aligned, numbers (right = true) right-aligned.
class Columns {
 public:
  Columns(std::vector<std::string> headers, std::vector<bool> right)
      : headers_(std::move(headers)), right_(std::move(right)) {}
  void add(std::vector<std::string> row) {
    row.resize(headers_.size());
    rows_.push_back(std::move(row));
  }
  [[nodiscard]] std::vector<std::string> lines() const {
    std::vector<std::size_t> width(headers_.size());
    for (std::size_t c = 0; c < headers_.size(); ++c) {
      width[c] = headers_[c].size();
      for (const auto& r : rows_) width[c] = std::max(width[c], r[c].size());
    }
    std::vector<std::string> out;
    const auto line = [&](const std::vector<std::string>& cells) {
      std::string s = "  ";
      for (std::size_t c = 0; c < cells.size(); ++c) {
        const std::string pad(width[c] - cells[c].size(), ' ');
        s += right_[c] ? pad + cells[c] : cells[c] + pad;
        if (c + 1 < cells.size()) s += "  ";
      }
      while (!s.empty() && s.back() == ' ') s.pop_back();
      out.push_back(std::move(s));
    };
    line(headers_);
    for (const auto& r : rows_) line(r);
    return out;
  }

 private:
  std::vector<std::string> headers_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

// --- data ------------------------------------------------------------------------

struct Sample {
  Clock::time_point at;
  Json status;
  std::vector<Json> vips;  // vip.show results
  Json backends;           // backend.list
  Json stats;              // stats (packets and bytes per backend)
};

class Session {
 public:
  explicit Session(const TopOptions& options) : options_(options) {}

  // One request on a fresh connection; false with `error` set on failure.
  bool call(std::string_view command, const Json& args, Json& result, std::string& error) const {
    CliClient client;
    const auto timeout =
        std::chrono::milliseconds(static_cast<std::int64_t>(options_.timeoutSeconds * 1000.0));
    if (!client.connect(options_.socketPath, error, timeout)) return false;
    std::string reply;
    if (!client.call(makeRequest(command, args), reply, timeout, error)) return false;
    std::optional<Reply> parsed = parseReply(reply);
    if (!parsed) {
      error = std::string(command) + ": malformed reply";
      return false;
    }
    if (!parsed->ok) {
      error = std::string(command) + ": " + parsed->errorCode + ": " + parsed->errorMessage;
      return false;
    }
    result = std::move(parsed->result);
    return true;
  }

  bool sample(Sample& s, std::string& error) {
    s.at = Clock::now();
    Json list;
    if (!call("status", Json::object(), s.status, error) ||
        !call("vip.list", Json::object(), list, error) ||
        !call("backend.list", Json::object(), s.backends, error)) {
      return false;
    }
    s.vips.clear();
    for (const Json& v : list) {
      Json shown;
      if (!call("vip.show", Json{{"name", v.value("name", "")}}, shown, error)) return false;
      s.vips.push_back(std::move(shown));
    }
    // No data path attached (stats unavailable): rates stay unknown.
    std::string ignored;
    if (!call("stats", Json::object(), s.stats, ignored)) s.stats = Json();
    return pollEvents(error);
  }

  const std::deque<Json>& events() const { return events_; }

 private:
  bool pollEvents(std::string& error) {
    for (int page = 0; page < 100; ++page) {
      Json r;
      if (!call("events", Json{{"after", next_}, {"limit", kMaxEventsLimit}}, r, error)) {
        return false;
      }
      const Json& list = r["events"];
      for (const Json& e : list) {
        events_.push_back(e);
        if (events_.size() > options_.eventLines) events_.pop_front();
      }
      next_ = r.value("next", next_);
      if (list.size() < kMaxEventsLimit) break;
    }
    return true;
  }

  const TopOptions& options_;
  std::uint64_t next_ = 0;
  std::deque<Json> events_;
};

// Per backend name: packets and bytes per second between two samples.
struct Rates {
  double pps = 0;
  double bps = 0;
};

std::map<std::string, Rates> ratesOf(const Sample& now, const Sample* prev) {
  std::map<std::string, Rates> out;
  if (prev == nullptr || !now.stats.is_object() || !prev->stats.is_object()) return out;
  const double seconds = std::chrono::duration<double>(now.at - prev->at).count();
  if (seconds <= 0) return out;
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> before;  // packets, bytes
  for (const Json& b : prev->stats.value("backends", Json::array())) {
    before[b.value("name", "")] = {b.value("packets", std::uint64_t{0}),
                                   b.value("bytes", std::uint64_t{0})};
  }
  for (const Json& b : now.stats.value("backends", Json::array())) {
    const auto it = before.find(b.value("name", ""));
    if (it == before.end()) continue;
    const auto perSecond = [&](std::uint64_t a, std::uint64_t z) {
      return z >= a ? static_cast<double>(z - a) / seconds : 0.0;
    };
    out[it->first] = Rates{perSecond(it->second.first, b.value("packets", std::uint64_t{0})),
                           perSecond(it->second.second, b.value("bytes", std::uint64_t{0}))};
  }
  return out;
}

std::vector<std::string> render(const TopOptions& options, const Sample& s, const Sample* prev,
                                const std::deque<Json>& events) {
  std::vector<std::string> out;
  const Json& st = s.status;
  std::string head = "spillway top  " + options.socketPath + "  generation " +
                     field(st, "generation") + "  up " + duration(st.value("uptime_ms", 0.0)) +
                     "  backends " + field(st, "backends");
  if (flag(st, "warmup")) head += "  WARM-UP";
  const std::time_t t = std::time(nullptr);
  char clock[16];
  std::strftime(clock, sizeof clock, "%H:%M:%S", std::localtime(&t));
  out.push_back(head + "  " + clock);
  out.emplace_back();

  out.emplace_back("POOLS (share of new flows per VIP)");
  Columns pools({"VIP", "POOL", "PRIO", "SHARE", "HEALTHY", "ACTIVE", "SATURATED", "STATE"},
                {false, false, true, true, true, true, true, false});
  for (const Json& v : s.vips) {
    std::string state;
    for (const Json& p : st.value("policy", Json::array())) {
      if (p.value("vip", "") != v.value("name", "")) continue;
      if (flag(p, "panic")) state = "PANIC";
      if (flag(p, "empty")) state = "NO BACKEND";
    }
    for (const Json& p : v.value("pools", Json::array())) {
      pools.add({v.value("name", ""), field(p, "pool"), field(p, "priority"),
                 percent(p.value("share", Json())), percent(p.value("healthy_fraction", Json())),
                 field(p, "active"), field(p, "saturated"), state});
    }
  }
  for (auto& l : pools.lines()) out.push_back(std::move(l));
  out.emplace_back();

  out.emplace_back("BACKENDS");
  const std::map<std::string, Rates> rates = ratesOf(s, prev);
  Columns backends(
      {"BACKEND", "POOL", "STATE", "HEALTH", "FLOWS", "PPS", "BYTES/S", "GPU", "QUEUE", "RTT_MS"},
      {false, false, false, false, true, true, true, true, true, true});
  for (const Json& b : s.backends) {
    const std::string name = b.value("name", "");
    const auto r = rates.find(name);
    const Json gpu = b.value("gpu_utilization", Json());
    const Json queue = b.value("queue_depth", Json());
    const Json rtt = b.value("srtt_ms", b.value("rtt_ms", Json()));
    backends.add(
        {name, field(b, "pool"), field(b, "state") + (flag(b, "saturated") ? " (saturated)" : ""),
         field(b, "health"), field(b, "live_flows"), r == rates.end() ? "-" : human(r->second.pps),
         r == rates.end() ? "-" : human(r->second.bps),
         gpu.is_number() ? printf1("%.0f%%", gpu.get<double>()) : "-",
         queue.is_number() ? printf1("%.1f", queue.get<double>()) : "-",
         rtt.is_number() ? printf1("%.2f", rtt.get<double>()) : "-"});
  }
  for (auto& l : backends.lines()) out.push_back(std::move(l));
  out.emplace_back();

  out.emplace_back("EVENTS (latest last)");
  const Json now = st.value("now_ms", Json());
  if (events.empty()) out.emplace_back("  (none yet)");
  for (const Json& e : events) {
    std::string line = "  #" + field(e, "seq");
    if (now.is_number() && e.contains("time_ms")) {
      line += "  " + duration(now.get<double>() - e["time_ms"].get<double>()) + " ago";
    }
    line += "  " + field(e, "backend") + "  " + field(e, "kind");
    if (e.contains("from") || e.contains("to")) {
      line += "  " + field(e, "from") + " -> " + field(e, "to");
    }
    line += "  " + field(e, "cause");
    out.push_back(std::move(line));
  }
  return out;
}

// --- the terminal ----------------------------------------------------------------

class Screen {
 public:
  Screen() {
    interactive_ = ::isatty(STDIN_FILENO) == 1 && ::tcgetattr(STDIN_FILENO, &saved_) == 0;
    if (interactive_) {
      termios raw = saved_;
      raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);  // keys at once, unechoed; ISIG kept
      raw.c_cc[VMIN] = 0;
      raw.c_cc[VTIME] = 0;
      ::tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    }
    write("\x1b[?1049h\x1b[?25l\x1b[2J");  // alternate screen, cursor hidden, cleared
  }
  ~Screen() {
    write("\x1b[?25h\x1b[?1049l");  // cursor shown, main screen back
    if (interactive_) ::tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  Screen(const Screen&) = delete;
  Screen& operator=(const Screen&) = delete;

  void draw(const std::vector<std::string>& lines) const {
    winsize ws{};
    std::size_t rows = 24, cols = 80;
    if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) {
      rows = ws.ws_row;
      cols = ws.ws_col;
    }
    std::string frame = "\x1b[H";
    const std::size_t shown = std::min(lines.size(), rows - 1);
    for (std::size_t i = 0; i < shown; ++i) {
      frame += lines[i].substr(0, cols);
      frame += "\x1b[K\r\n";
    }
    frame += "\x1b[J";
    frame += std::string("q: quit").substr(0, cols);
    write(frame);
  }

  // Waits up to `ms` for a key; true when it asks to quit (q, Q, Ctrl-C).
  bool waitKey(int ms) const {
    pollfd p{interactive_ ? STDIN_FILENO : -1, POLLIN, 0};
    const int n = ::poll(&p, 1, ms);
    if (n <= 0 || (p.revents & POLLIN) == 0) return false;
    char c = 0;
    while (::read(STDIN_FILENO, &c, 1) == 1) {
      if (c == 'q' || c == 'Q' || c == 3) return true;
    }
    return false;
  }

 private:
  static void write(const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  }
  termios saved_{};
  bool interactive_ = false;
};

void installHandlers() {
  struct sigaction quit {};
  quit.sa_handler = onQuit;  // no SA_RESTART: poll() returns at once
  ::sigaction(SIGINT, &quit, nullptr);
  ::sigaction(SIGTERM, &quit, nullptr);
  ::sigaction(SIGHUP, &quit, nullptr);
  struct sigaction resize {};
  resize.sa_handler = onResize;
  ::sigaction(SIGWINCH, &resize, nullptr);
}

constexpr int kExitOk = 0;
constexpr int kExitConnect = 3;

}  // namespace

int runTop(const TopOptions& options) {
  Session session(options);
  std::optional<Sample> prev;
  std::string error;
  const auto connectFailed = [&] {
    std::cerr << "spillwayctl: top: " << error << '\n'
              << "spillwayctl: point it at spillwayd's [control] socket (or its "
                 "--control-socket) with --socket PATH or SPILLWAY_SOCKET=PATH\n";
    return kExitConnect;
  };
  if (options.once) {
    Sample first, second;
    if (!session.sample(first, error)) return connectFailed();
    std::this_thread::sleep_for(std::chrono::duration<double>(options.intervalSeconds));
    if (!session.sample(second, error)) return connectFailed();
    for (const std::string& l : render(options, second, &first, session.events())) {
      std::cout << l << '\n';
    }
    return kExitOk;
  }

  installHandlers();
  Screen screen;
  const auto period = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(options.intervalSeconds));
  std::vector<std::string> lines;
  auto nextSample = Clock::now();
  while (gQuit == 0) {
    if (Clock::now() >= nextSample) {
      nextSample = Clock::now() + period;
      Sample s;
      if (session.sample(s, error)) {
        lines = render(options, s, prev ? &*prev : nullptr, session.events());
        prev = std::move(s);
      } else {
        // Say why, and keep trying every period.
        lines = {"spillway top  " + options.socketPath, "", "  cannot read spillwayd: " + error,
                 "  retrying every " + printf1("%g", options.intervalSeconds) +
                     " s; is spillwayd running, and on this socket (--socket, SPILLWAY_SOCKET)?"};
        prev.reset();
      }
      screen.draw(lines);
    }
    if (gResized != 0) {
      gResized = 0;
      screen.draw(lines);
    }
    const auto wait =
        std::chrono::duration_cast<std::chrono::milliseconds>(nextSample - Clock::now()).count();
    if (screen.waitKey(static_cast<int>(std::max<std::int64_t>(wait, 0)))) break;
  }
  return kExitOk;
}

}  // namespace spillway
