#include "control/config/config.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "control/config/peer_secret.hpp"
#include "spillway/errno_text.hpp"
#include "spillway/placement.hpp"

namespace spillway {

std::optional<IpAddress> parseIpAddress(std::string_view text) {
  if (text.empty() || text.size() > 64) return std::nullopt;
  const std::string s(text);
  IpAddress a;
  if (s.find(':') == std::string::npos) {
    std::uint8_t b[4];
    if (inet_pton(AF_INET, s.c_str(), b) != 1) return std::nullopt;
    for (int i = 0; i < 4; ++i) a.bytes[i] = std::byte{b[i]};
    a.version = IpVersion::V4;
  } else {
    std::uint8_t b[16];
    if (inet_pton(AF_INET6, s.c_str(), b) != 1) return std::nullopt;
    for (int i = 0; i < 16; ++i) a.bytes[i] = std::byte{b[i]};
    a.version = IpVersion::V6;
  }
  return a;
}

bool isDnsName(std::string_view text) {
  if (!text.empty() && text.back() == '.') text.remove_suffix(1);
  if (text.empty() || text.size() > 253) return false;
  std::size_t label = 0;
  for (const char c : text) {
    if (c == '.') {
      if (label == 0) return false;
      label = 0;
      continue;
    }
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_';
    if (!ok || ++label > 63) return false;
  }
  return label != 0;
}

std::optional<std::pair<IpAddress, std::uint16_t>> parseDnsServer(std::string_view text) {
  std::string_view host = text;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    host = text.substr(1, close - 1);
    const std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return std::nullopt;
      port = rest.substr(1);
      if (port.empty()) return std::nullopt;
    }
    if (host.find(':') == std::string_view::npos) return std::nullopt;  // [v4] is not a form
  } else if (std::count(text.begin(), text.end(), ':') == 1) {
    const auto colon = text.find(':');
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (port.empty()) return std::nullopt;
  }
  auto address = parseIpAddress(host);
  if (!address) return std::nullopt;
  std::uint32_t p = 53;
  if (!port.empty()) {
    if (port.size() > 5) return std::nullopt;
    p = 0;
    for (const char c : port) {
      if (c < '0' || c > '9') return std::nullopt;
      p = p * 10 + static_cast<std::uint32_t>(c - '0');
    }
    if (p == 0 || p > 65535) return std::nullopt;
  }
  return std::pair{*address, static_cast<std::uint16_t>(p)};
}

std::string formatIpAddress(const IpAddress& address) {
  char buf[INET6_ADDRSTRLEN] = {};
  std::uint8_t b[16];
  for (int i = 0; i < 16; ++i) b[i] = std::to_integer<std::uint8_t>(address.bytes[i]);
  const int family = address.version == IpVersion::V4 ? AF_INET : AF_INET6;
  if (inet_ntop(family, b, buf, sizeof buf) == nullptr) return "?";
  return buf;
}

std::optional<MacAddress> parseMacAddress(std::string_view text) {
  if (text.size() != 17) return std::nullopt;
  MacAddress mac{};
  for (std::size_t i = 0; i < 6; ++i) {
    const char* first = text.data() + i * 3;
    if (i < 5 && first[2] != ':') return std::nullopt;
    auto [end, ec] = std::from_chars(first, first + 2, mac[i], 16);
    if (ec != std::errc{} || end != first + 2) return std::nullopt;
  }
  return mac;
}

std::string formatMacAddress(const MacAddress& mac) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < mac.size(); ++i) {
    if (i) s += ':';
    s += kHex[mac[i] >> 4];
    s += kHex[mac[i] & 15];
  }
  return s;
}

std::string formatError(const ConfigError& e) {
  std::string s = e.file;
  if (e.line != 0) s += ':' + std::to_string(e.line) + ':' + std::to_string(e.column);
  s += ": ";
  if (!e.field.empty()) {
    s += e.field;
    if (!e.value.empty()) s += " = " + e.value;
    s += ": ";
  }
  return s + e.message;
}

std::string formatErrors(const std::vector<ConfigError>& errors) {
  std::string s;
  for (const ConfigError& e : errors) s += formatError(e) + '\n';
  return s;
}

std::string_view toString(PortRole role) noexcept {
  switch (role) {
    case PortRole::OneArmed:
      return "one-armed";
    case PortRole::Client:
      return "client";
    case PortRole::Backend:
      return "backend";
  }
  return "?";
}

std::string_view toString(ExceptionMode mode) noexcept {
  return mode == ExceptionMode::Tap ? "tap" : "none";
}

std::string_view toString(PoolSite site) noexcept {
  return site == PoolSite::Cloud ? "cloud" : "onprem";
}

std::string_view toString(LatencyRegions regions) noexcept {
  switch (regions) {
    case LatencyRegions::Cloud:
      return "cloud";
    case LatencyRegions::All:
      return "all";
    case LatencyRegions::Off:
      return "off";
  }
  return "?";
}

std::string_view toString(PoolEncap encap) noexcept {
  return encap == PoolEncap::Gue ? "gue" : "ipip";
}

std::string_view toString(HealthCheckKind kind) noexcept {
  switch (kind) {
    case HealthCheckKind::None:
      return "none";
    case HealthCheckKind::Tcp:
      return "tcp";
    case HealthCheckKind::Http:
      return "http";
    case HealthCheckKind::Encap:
      return "encap";
  }
  return "?";
}

namespace {

using namespace std::string_literals;

struct Place {
  std::uint32_t line = 0;
  std::uint32_t column = 0;
};

Place regionPlace(const toml::source_region& r) {
  return {r.begin.line, r.begin.column};
}

// The shortest text that reads back as v: 0.15, 90, 1e+06.
std::string numberText(double v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  if (ec != std::errc{}) return "?";
  return std::string(buf, end);
}

std::string secondsText(Millis ms) {
  return numberText(static_cast<double>(ms) / 1000.0);
}

// The value as written, on one line and shortened: strings in double quotes,
// tables as {...}.
std::string describe(const toml::node& n) {
  std::string s;
  if (const auto* str = n.as_string()) {
    s = '"';
    for (char c : str->get()) {
      if (c == '"' || c == '\\') s += '\\';
      s += static_cast<unsigned char>(c) < 0x20 ? '?' : c;
    }
    s += '"';
  } else if (n.is_table() ||
             (n.is_array() && !n.as_array()->empty() && n.as_array()->get(0)->is_table())) {
    s = n.is_table() ? "{...}" : "[{...}]";
  } else if (const auto* f = n.as_floating_point()) {
    s = numberText(f->get());
    if (s.find_first_of(".eni") == std::string::npos) s += ".0";  // still reads as a float
  } else {
    std::ostringstream os;
    n.visit([&](auto&& v) { os << v; });
    for (char c : os.str()) s += c == '\n' ? ' ' : c;
  }
  if (s.size() > 72) s = s.substr(0, 69) + "...";
  return s;
}

std::string_view typeName(toml::node_type t) {
  switch (t) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    case toml::node_type::date:
    case toml::node_type::time:
    case toml::node_type::date_time:
      return "a date/time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

std::string hex64(std::uint64_t v) {
  char buf[19];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, 16);
  (void)ec;
  return "0x" + std::string(buf, end);
}

bool isUnspecifiedOrMulticast(const IpAddress& a) {
  const auto b0 = std::to_integer<std::uint8_t>(a.bytes[0]);
  if (a.version == IpVersion::V4) {
    if (b0 >= 224) return true;  // multicast, reserved, broadcast
  } else if (b0 == 0xff) {
    return true;
  }
  const std::size_t len = a.version == IpVersion::V4 ? 4 : 16;
  return std::all_of(a.bytes.begin(), a.bytes.begin() + static_cast<std::ptrdiff_t>(len),
                     [](std::byte x) { return x == std::byte{0}; });
}

bool isUnicastMac(const MacAddress& m) {
  return (m[0] & 1) == 0 && m != MacAddress{};
}

// Names appear in the CLI and as metric labels: keep them plain.
std::optional<std::string> nameProblem(std::string_view name) {
  if (name.empty()) return "must not be empty";
  if (name.size() > 64) return "longer than 64 characters";
  auto ok = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.';
  };
  if (!std::all_of(name.begin(), name.end(), ok)) {
    return "may hold only letters, digits, '-', '_' and '.'";
  }
  return std::nullopt;
}

bool isHex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

bool isPciAddress(std::string_view s) {
  // [DDDD:]BB:DD.F, hex digits, function 0..7
  auto hexRun = [&](std::size_t at, std::size_t n) {
    if (at + n > s.size()) return false;
    for (std::size_t i = 0; i < n; ++i) {
      if (!isHex(s[at + i])) return false;
    }
    return true;
  };
  std::size_t at = 0;
  if (s.size() == 12) {
    if (!hexRun(0, 4) || s[4] != ':') return false;
    at = 5;
  } else if (s.size() != 7) {
    return false;
  }
  return hexRun(at, 2) && s[at + 2] == ':' && hexRun(at + 3, 2) && s[at + 5] == '.' &&
         s[at + 6] >= '0' && s[at + 6] <= '7';
}

bool isVdevDriver(std::string_view s) {
  if (s.size() <= 4 || s.substr(0, 4) != "net_") return false;
  return std::all_of(s.begin() + 4, s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// The iface= argument of an af_packet / af_xdp vdev, which is the kernel
// interface whose neighbour table serves the port.
std::string vdevInterface(std::string_view devargs) {
  if (devargs.substr(0, 13) != "net_af_packet" && devargs.substr(0, 10) != "net_af_xdp") return {};
  std::size_t pos = devargs.find(',');
  while (pos != std::string_view::npos) {
    const std::size_t next = devargs.find(',', pos + 1);
    std::string_view arg = devargs.substr(
        pos + 1, next == std::string_view::npos ? std::string_view::npos : next - pos - 1);
    if (arg.substr(0, 6) == "iface=") return std::string(arg.substr(6));
    pos = next;
  }
  return {};
}

// A Prometheus metric name: [a-zA-Z_:][a-zA-Z0-9_:]*.
bool isMetricName(std::string_view s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == ':';
  });
}

// An HTTP request target: "/" then visible ASCII, no spaces.
bool isUrlPath(std::string_view s) {
  if (s.empty() || s[0] != '/' || s.size() > 1024) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

constexpr std::string_view kUrlPathProblem =
    "must start with '/' and hold no spaces or control characters";

// A POSIX group (or user) name, as groupadd and useradd accept it.
bool isGroupName(std::string_view s) {
  if (s.empty() || s.size() > 32 || s[0] == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
  });
}

// "address:port" with an IPv4 address, or "[address]:port" with IPv6.
bool isListenAddress(std::string_view s) {
  std::string_view host;
  std::string_view port;
  if (!s.empty() && s[0] == '[') {
    const std::size_t close = s.find(']');
    if (close == std::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':') {
      return false;
    }
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
    auto a = parseIpAddress(host);
    if (!a || a->version != IpVersion::V6) return false;
  } else {
    const std::size_t colon = s.rfind(':');
    if (colon == std::string_view::npos) return false;
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
    auto a = parseIpAddress(host);
    if (!a || a->version != IpVersion::V4) return false;
  }
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  return ec == std::errc{} && end == port.data() + port.size() && value >= 1 && value <= 65535;
}

class Loader;

// One TOML table being read. Every key asked for is "known"; finish() reports
// the keys present but never asked for, with the list of known ones.
class Section {
 public:
  Section(Loader& loader, const toml::table& table, std::string path)
      : loader_(loader), table_(table), path_(std::move(path)) {}

  [[nodiscard]] std::string field(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }
  [[nodiscard]] const std::string& path() const { return path_; }
  [[nodiscard]] Place place() const { return regionPlace(table_.source()); }
  [[nodiscard]] Place placeOf(std::string_view key) const;

  // The node of `key`, or nullptr when absent (then an error if required).
  const toml::node* get(std::string_view key, bool required = false);

  void fail(std::string_view key, std::string message);
  void failMissing(std::string_view key, std::string message = "missing; this key is required");
  void failAt(const toml::node& node, std::string fieldName, std::string message);

  std::optional<std::string> string(std::string_view key, bool required = false);
  std::optional<bool> boolean(std::string_view key);
  std::optional<std::int64_t> integer(std::string_view key, std::int64_t min, std::int64_t max,
                                      bool required = false);
  // A 64-bit unsigned: a non-negative integer or a "0x..." string.
  std::optional<std::uint64_t> u64(std::string_view key, bool required = false);
  std::optional<std::string> name(std::string_view key = "name");
  std::optional<IpAddress> address(std::string_view key, bool required = false);
  std::optional<MacAddress> mac(std::string_view key);
  // A duration written in seconds (integer or decimal), kept in milliseconds,
  // within [minMs, maxMs].
  std::optional<Millis> seconds(std::string_view key, Millis minMs = 1,
                                Millis maxMs = FlowTable::kMaxTimeout / 1000 * 1000);
  // An optional duration: stores it in `out` when valid; false only when the
  // key is written but invalid (already reported), so dependent checks skip.
  bool secondsInto(std::string_view key, Millis minMs, Millis maxMs, Millis& out);
  // An integer or a float within the bounds; an open bound excludes itself.
  std::optional<double> number(std::string_view key, double min, double max, bool minOpen = false,
                               bool maxOpen = false);
  template <class E>
  std::optional<E> choice(std::string_view key, std::initializer_list<std::pair<const char*, E>>,
                          bool required = false);
  // A string that `ok` accepts, stored in `out`; else the error `problem`.
  template <class Ok>
  void stringInto(std::string_view key, Ok ok, std::string_view problem, std::string& out,
                  bool required = false) {
    if (auto v = string(key, required)) {
      if (!ok(std::string_view(*v))) {
        fail(key, std::string(problem));
      } else {
        out = std::move(*v);
      }
    }
  }
  const toml::array* array(std::string_view key, bool required = false);
  const toml::table* table(std::string_view key);

  void finish();

 private:
  // An integer or a float as a double; a clear error naming `expected` for
  // any other type.
  std::optional<double> numeric(std::string_view key, std::string_view expected);

  Loader& loader_;
  const toml::table& table_;
  std::string path_;
  std::vector<std::string> known_;
};

class Loader {
 public:
  explicit Loader(std::string file) : file_(std::move(file)) {}

  void error(Place p, std::string field, std::string value, std::string message) {
    errors_.push_back(ConfigError{file_, p.line, p.column, std::move(field), std::move(value),
                                  std::move(message)});
  }

  ConfigResult load(std::string_view text);

 private:
  struct PortExtra {
    Place mtu;
    Place place;
  };
  struct Seen {
    std::string where;  // "port[0]"
    std::uint32_t line;
  };
  static std::string already(const Seen& s) {
    return s.where + " (line " + std::to_string(s.line) + ")";
  }

  void loadDataplane(const toml::table& root, std::set<std::string>& used);
  void loadPorts(const toml::table& root, std::set<std::string>& used);
  void loadPools(const toml::table& root, std::set<std::string>& used);
  void loadVips(const toml::table& root, std::set<std::string>& used);
  void loadBackends(const toml::table& root, std::set<std::string>& used);
  void loadHealth(Section& pool, PoolConfig& p);
  void loadLoadSource(Section& pool, PoolConfig& p);
  void loadConnSource(Section& pool, PoolConfig& p);
  void loadDiscovery(Section& pool, PoolConfig& p);
  void loadPolicy(const toml::table& root, std::set<std::string>& used);
  void loadPlacement(const toml::table& root, std::set<std::string>& used);
  void loadControl(const toml::table& root, std::set<std::string>& used);
  void loadAnnounce(const toml::table& root, std::set<std::string>& used);
  void loadTier(const toml::table& root, std::set<std::string>& used);
  // The top-level table `key`, or nullptr when absent or not a table (then an
  // error).
  const toml::table* topTable(const toml::table& root, std::string_view key);
  // The tables of an array of tables [[key]]; errors for anything else.
  std::vector<std::pair<const toml::table*, std::string>> tables(const toml::table& root,
                                                                 std::string_view key);

  std::string file_;
  Config config_;
  std::vector<ConfigError> errors_;
  std::vector<PortExtra> portExtra_;
  std::vector<Place> vipPlaces_;
  std::map<std::string, std::uint32_t, std::less<>> portByName_;
  std::map<std::string, std::uint32_t, std::less<>> poolByName_;
  bool poolsValid_ = true;  // every [[pool]] loaded without error
  bool portsValid_ = true;
};

Place Section::placeOf(std::string_view key) const {
  const toml::node* n = table_.get(key);
  return n ? regionPlace(n->source()) : place();
}

const toml::node* Section::get(std::string_view key, bool required) {
  if (std::find(known_.begin(), known_.end(), key) == known_.end()) known_.emplace_back(key);
  const toml::node* n = table_.get(key);
  if (n == nullptr && required) failMissing(key);
  return n;
}

void Section::fail(std::string_view key, std::string message) {
  const toml::node* n = table_.get(key);
  loader_.error(placeOf(key), field(key), n ? describe(*n) : "", std::move(message));
}

void Section::failMissing(std::string_view key, std::string message) {
  loader_.error(place(), field(key), "", std::move(message));
}

void Section::failAt(const toml::node& node, std::string fieldName, std::string message) {
  loader_.error(regionPlace(node.source()), std::move(fieldName), describe(node),
                std::move(message));
}

std::optional<std::string> Section::string(std::string_view key, bool required) {
  const toml::node* n = get(key, required);
  if (n == nullptr) return std::nullopt;
  if (const auto* s = n->as_string()) return s->get();
  fail(key, "expected a string, got "s + std::string(typeName(n->type())));
  return std::nullopt;
}

std::optional<bool> Section::boolean(std::string_view key) {
  const toml::node* n = get(key);
  if (n == nullptr) return std::nullopt;
  if (const auto* b = n->as_boolean()) return b->get();
  fail(key, "expected true or false, got "s + std::string(typeName(n->type())));
  return std::nullopt;
}

std::optional<std::int64_t> Section::integer(std::string_view key, std::int64_t min,
                                             std::int64_t max, bool required) {
  const toml::node* n = get(key, required);
  if (n == nullptr) return std::nullopt;
  const auto* i = n->as_integer();
  if (i == nullptr) {
    fail(key, "expected an integer, got "s + std::string(typeName(n->type())));
    return std::nullopt;
  }
  const std::int64_t v = i->get();
  if (v < min || v > max) {
    fail(key,
         "out of range; must be in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
    return std::nullopt;
  }
  return v;
}

std::optional<std::uint64_t> Section::u64(std::string_view key, bool required) {
  const toml::node* n = get(key, required);
  if (n == nullptr) return std::nullopt;
  if (const auto* i = n->as_integer()) {
    if (i->get() < 0) {
      fail(key, "must not be negative; write values above 2^63 - 1 as a hex string \"0x...\"");
      return std::nullopt;
    }
    return static_cast<std::uint64_t>(i->get());
  }
  if (const auto* s = n->as_string()) {
    std::string_view t = s->get();
    if (t.size() > 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X') && t.size() <= 18) {
      std::uint64_t v = 0;
      auto [end, ec] = std::from_chars(t.data() + 2, t.data() + t.size(), v, 16);
      if (ec == std::errc{} && end == t.data() + t.size()) return v;
    }
    fail(key, "expected an integer or a hex string of 1 to 16 digits such as \"0x5eed\"");
    return std::nullopt;
  }
  fail(key, "expected an integer or a hex string, got "s + std::string(typeName(n->type())));
  return std::nullopt;
}

std::optional<std::string> Section::name(std::string_view key) {
  auto s = string(key, true);
  if (!s) return std::nullopt;
  if (auto bad = nameProblem(*s)) {
    fail(key, *bad);
    return std::nullopt;
  }
  return s;
}

std::optional<IpAddress> Section::address(std::string_view key, bool required) {
  auto s = string(key, required);
  if (!s) return std::nullopt;
  auto a = parseIpAddress(*s);
  if (!a) {
    fail(key, "not an IPv4 or IPv6 address");
    return std::nullopt;
  }
  if (isUnspecifiedOrMulticast(*a)) {
    fail(key, "must be a unicast address (not unspecified, multicast or broadcast)");
    return std::nullopt;
  }
  return a;
}

std::optional<MacAddress> Section::mac(std::string_view key) {
  auto s = string(key);
  if (!s) return std::nullopt;
  auto m = parseMacAddress(*s);
  if (!m) {
    fail(key, "not a MAC address; write it as \"02:00:00:00:00:01\"");
    return std::nullopt;
  }
  if (!isUnicastMac(*m)) {
    fail(key, "must be a unicast MAC address (not zero, multicast or broadcast)");
    return std::nullopt;
  }
  return m;
}

bool Section::secondsInto(std::string_view key, Millis minMs, Millis maxMs, Millis& out) {
  if (auto v = seconds(key, minMs, maxMs)) {
    out = *v;
    return true;
  }
  return table_.get(key) == nullptr;
}

std::optional<double> Section::numeric(std::string_view key, std::string_view expected) {
  const toml::node* n = get(key);
  if (n == nullptr) return std::nullopt;
  if (const auto* i = n->as_integer()) return static_cast<double>(i->get());
  if (const auto* f = n->as_floating_point()) return f->get();
  fail(key, "expected "s + std::string(expected) + ", got " + std::string(typeName(n->type())));
  return std::nullopt;
}

std::optional<Millis> Section::seconds(std::string_view key, Millis minMs, Millis maxMs) {
  const std::optional<double> read = numeric(key, "a number of seconds");
  if (!read) return std::nullopt;
  const double ms = *read * 1000.0;
  if (!(ms >= static_cast<double>(minMs) - 1e-6 && ms <= static_cast<double>(maxMs) + 1e-6)) {
    fail(key, "out of range; must be from " + secondsText(minMs) + " to " + secondsText(maxMs) +
                  " seconds");
    return std::nullopt;
  }
  return static_cast<Millis>(std::llround(ms));
}

std::optional<double> Section::number(std::string_view key, double min, double max, bool minOpen,
                                      bool maxOpen) {
  const std::optional<double> read = numeric(key, "a number");
  if (!read) return std::nullopt;
  const double v = *read;
  const bool below = minOpen ? !(v > min) : !(v >= min);
  const bool above = maxOpen ? !(v < max) : !(v <= max);
  if (below || above) {
    fail(key, "out of range; must be in "s + (minOpen ? "(" : "[") + numberText(min) + ", " +
                  numberText(max) + (maxOpen ? ")" : "]"));
    return std::nullopt;
  }
  return v;
}

template <class E>
std::optional<E> Section::choice(std::string_view key,
                                 std::initializer_list<std::pair<const char*, E>> options,
                                 bool required) {
  auto s = string(key, required);
  if (!s) return std::nullopt;
  std::string list;
  for (const auto& [text, value] : options) {
    if (*s == text) return value;
    list += list.empty() ? "" : ", ";
    list += "\""s + text + "\"";
  }
  fail(key, "must be one of " + list);
  return std::nullopt;
}

const toml::array* Section::array(std::string_view key, bool required) {
  const toml::node* n = get(key, required);
  if (n == nullptr) return nullptr;
  if (const auto* a = n->as_array()) return a;
  fail(key, "expected an array, got "s + std::string(typeName(n->type())));
  return nullptr;
}

const toml::table* Section::table(std::string_view key) {
  const toml::node* n = get(key);
  if (n == nullptr) return nullptr;
  if (const auto* t = n->as_table()) return t;
  fail(key, "expected a table, got "s + std::string(typeName(n->type())));
  return nullptr;
}

void Section::finish() {
  std::string list;
  for (const std::string& k : known_) list += (list.empty() ? "" : ", ") + k;
  for (auto&& [key, node] : table_) {
    if (std::find(known_.begin(), known_.end(), key.str()) != known_.end()) continue;
    std::string why = "unknown key; ";
    // "interval_ms = 200" where "interval" (in seconds) is meant.
    const std::string_view k = key.str();
    if (k.size() > 3 && k.substr(k.size() - 3) == "_ms" &&
        std::find(known_.begin(), known_.end(), k.substr(0, k.size() - 3)) != known_.end()) {
      why += "durations are in seconds: write " + std::string(k.substr(0, k.size() - 3)) + " = ";
      if (const auto* i = node.as_integer()) {
        why += numberText(static_cast<double>(i->get()) / 1000.0) + "; ";
      } else {
        why += "<seconds>; ";
      }
    }
    loader_.error(regionPlace(key.source()), field(key.str()), describe(node),
                  why + (path_.empty() ? "the top level"s : path_) + " takes " + list);
  }
}

std::vector<std::pair<const toml::table*, std::string>> Loader::tables(const toml::table& root,
                                                                       std::string_view key) {
  std::vector<std::pair<const toml::table*, std::string>> out;
  const toml::node* n = root.get(key);
  if (n == nullptr) return out;
  const toml::array* a = n->as_array();
  if (a == nullptr) {
    error(regionPlace(n->source()), std::string(key), describe(*n),
          "expected an array of tables; write each entry as [[" + std::string(key) + "]]");
    return out;
  }
  for (std::size_t i = 0; i < a->size(); ++i) {
    std::string where = std::string(key) + "[" + std::to_string(i) + "]";
    const toml::node& e = *a->get(i);
    if (const auto* t = e.as_table()) {
      out.emplace_back(t, std::move(where));
    } else {
      error(regionPlace(e.source()), where, describe(e),
            "expected a table; write each entry as [[" + std::string(key) + "]]");
    }
  }
  return out;
}

void Loader::loadDataplane(const toml::table& root, std::set<std::string>& used) {
  used.insert("dataplane");
  const toml::node* n = root.get("dataplane");
  if (n == nullptr) {
    error({1, 1}, "dataplane", "",
          "missing; a [dataplane] table with lcores and hash_seed is "
          "required");
    return;
  }
  const toml::table* t = n->as_table();
  if (t == nullptr) {
    error(regionPlace(n->source()), "dataplane", describe(*n), "expected a table ([dataplane])");
    return;
  }
  Section s(*this, *t, "dataplane");
  DataplaneConfig& d = config_.dataplane;
  if (const toml::array* lcores = s.array("lcores", true)) {
    if (lcores->empty()) s.fail("lcores", "empty; list at least one worker lcore id");
    std::set<std::int64_t> seen;
    for (std::size_t i = 0; i < lcores->size(); ++i) {
      const toml::node& e = *lcores->get(i);
      const std::string f = "dataplane.lcores[" + std::to_string(i) + "]";
      const auto* v = e.as_integer();
      if (v == nullptr) {
        s.failAt(e, f, "expected an lcore id (integer)");
      } else if (v->get() < 0 || v->get() > kMaxLcoreId) {
        s.failAt(e, f, "out of range; lcore ids are in [0, " + std::to_string(kMaxLcoreId) + "]");
      } else if (!seen.insert(v->get()).second) {
        s.failAt(e, f, "listed twice");
      } else {
        d.lcores.push_back(static_cast<std::uint32_t>(v->get()));
      }
    }
  }
  if (auto seed = s.u64("hash_seed")) {
    d.hashSeed = *seed;
  } else if (t->get("hash_seed") == nullptr) {
    s.failMissing("hash_seed",
                  "missing; set a secret 64-bit seed, the same on every load balancer instance "
                  "(it keys the flow hash: instances must agree, attackers must not know it)");
  }
  if (auto v = s.integer("flow_capacity", 1, static_cast<std::int64_t>(FlowTable::kMaxCapacity))) {
    d.flowCapacity = static_cast<std::size_t>(*v);
  }
  if (auto v = s.integer("burst", 1, kMaxBurst)) d.burst = static_cast<std::uint32_t>(*v);
  if (auto v = s.integer("tx_drain_us", 0, kMaxTxDrainUs)) {
    d.txDrainUs = static_cast<std::uint32_t>(*v);
  }
  if (auto v = s.integer("idle_sleep_us", 0, kMaxIdleSleepUs)) {
    d.idleSleepUs = static_cast<std::uint32_t>(*v);
  }
  if (auto v = s.integer("idle_sleep_max_us", 0, kMaxIdleSleepMaxUs)) {
    d.idleSleepMaxUs = static_cast<std::uint32_t>(*v);
    if (*v != 0 && d.idleSleepUs == 0) {
      s.fail("idle_sleep_max_us", "needs idle_sleep_us (the first pause) above 0");
    } else if (*v != 0 && d.idleSleepMaxUs < d.idleSleepUs) {
      s.fail("idle_sleep_max_us",
             "below idle_sleep_us = " + std::to_string(d.idleSleepUs) +
                 "; the pauses grow from idle_sleep_us up to idle_sleep_max_us");
    }
  }
  if (auto v = s.integer("second_chance_hold_ms", 0,
                         static_cast<std::int64_t>(kMaxSecondChanceHoldMs))) {
    d.secondChanceHoldMs = static_cast<Millis>(*v);
  }
  if (const toml::table* tt = s.table("timeouts")) {
    Section ts(*this, *tt, "dataplane.timeouts");
    if (auto v = ts.seconds("embryonic")) d.timeouts.embryonic = *v;
    if (auto v = ts.seconds("established")) d.timeouts.established = *v;
    if (auto v = ts.seconds("closing")) d.timeouts.closing = *v;
    if (auto v = ts.seconds("udp")) d.timeouts.udp = *v;
    if (auto v = ts.seconds("other")) d.timeouts.other = *v;
    ts.finish();
  }
  if (const toml::table* it = s.table("icmp_limits")) {
    // The ICMP replies a worker builds itself (echo replies, frag-needed,
    // packet-too-big): a bucket for all of them and one per source.
    Section is(*this, *it, "dataplane.icmp_limits");
    IcmpRateLimits& l = d.icmpLimits;
    constexpr std::int64_t kMaxRate = 1'000'000;
    constexpr std::int64_t kMaxIcmpBurst = 4'000'000;  // the bucket's 32-bit milli-tokens
    if (auto v = is.integer("per_second", 1, kMaxRate))
      l.perSecond = static_cast<std::uint32_t>(*v);
    if (auto v = is.integer("burst", 1, kMaxIcmpBurst)) l.burst = static_cast<std::uint32_t>(*v);
    if (auto v = is.integer("per_source_per_second", 1, kMaxRate)) {
      l.perSourcePerSecond = static_cast<std::uint32_t>(*v);
    }
    if (auto v = is.integer("per_source_burst", 1, kMaxIcmpBurst)) {
      l.perSourceBurst = static_cast<std::uint32_t>(*v);
    }
    is.finish();
  }
  s.finish();
}

void Loader::loadPorts(const toml::table& root, std::set<std::string>& used) {
  used.insert("port");
  auto entries = tables(root, "port");
  if (entries.empty() && root.get("port") == nullptr) {
    error({1, 1}, "port", "", "missing; at least one [[port]] is required");
  }
  std::map<std::string, Seen> devargsSeen;
  std::map<std::string, Seen> tapSeen;
  for (auto& [t, where] : entries) {
    const std::size_t before = errors_.size();
    Section s(*this, *t, where);
    PortConfig p;
    const Place at = s.place();
    if (auto v = s.name()) {
      p.name = *v;
      auto [it, fresh] =
          portByName_.emplace(p.name, static_cast<std::uint32_t>(config_.ports.size()));
      if (!fresh) {
        s.fail("name", "duplicate port name; port[" + std::to_string(it->second) + "] has it");
      }
    }
    if (auto v = s.string("devargs", true)) {
      p.devargs = *v;
      const std::string_view d = p.devargs;
      const std::string_view head = d.substr(0, d.find(','));
      if (!isPciAddress(head) && !isVdevDriver(head)) {
        s.fail("devargs",
               "neither a PCI address (\"0000:3b:00.0\") nor a DPDK virtual device "
               "(\"net_af_packet0,iface=veth0\", net_af_xdp, net_tap, net_memif, net_ring, "
               "net_pcap, net_null)");
      } else if (auto [it, fresh] = devargsSeen.emplace(std::string(head), Seen{where, at.line});
                 !fresh) {
        s.fail("devargs", "the same device as " + already(it->second));
      }
    }
    if (auto v = s.choice<PortRole>("role", {{"one-armed", PortRole::OneArmed},
                                             {"client", PortRole::Client},
                                             {"backend", PortRole::Backend}})) {
      p.role = *v;
    }
    if (auto v = s.address("address")) {
      if (v->version != IpVersion::V4) {
        s.fail("address", "must be an IPv4 address; put the IPv6 tunnel source in address6");
      } else {
        p.address = v;
      }
    }
    if (auto v = s.address("address6")) {
      if (v->version != IpVersion::V6) {
        s.fail("address6", "must be an IPv6 address; put the IPv4 tunnel source in address");
      } else {
        p.address6 = v;
      }
    }
    if (auto v = s.integer("mtu", kIpv6MinMtu, kMaxEgressMtu)) {
      p.mtu = static_cast<std::uint16_t>(*v);
    }
    if (auto v = s.integer("vlan", 1, 4094)) p.vlan = static_cast<std::uint16_t>(*v);
    p.nextHopMac = s.mac("next_hop_mac");
    p.mac = s.mac("mac");
    if (auto v = s.choice<ExceptionMode>(
            "exception", {{"none", ExceptionMode::None}, {"tap", ExceptionMode::Tap}})) {
      p.exception = *v;
    }
    const bool hasExceptionName = t->get("exception_name") != nullptr;
    if (auto v = s.string("exception_name")) {
      if (p.exception != ExceptionMode::Tap) {
        s.fail("exception_name", "set, but exception is not \"tap\"");
      } else if (v->empty() || v->size() > kMaxInterfaceName) {
        s.fail("exception_name", "an interface name has 1 to 15 characters");
      } else {
        p.exceptionName = *v;
      }
    }
    if (p.exception == ExceptionMode::Tap && !hasExceptionName) {
      p.exceptionName = "sw-" + p.name;
      if (p.exceptionName.size() > kMaxInterfaceName && !p.name.empty()) {
        s.failMissing("exception_name", "the default tap name \"" + p.exceptionName +
                                            "\" is longer than 15 characters; set exception_name");
      }
    }
    if (!p.exceptionName.empty()) {
      if (auto [it, fresh] = tapSeen.emplace(p.exceptionName, Seen{where, at.line}); !fresh) {
        s.fail(hasExceptionName ? "exception_name" : "name",
               "tap name \"" + p.exceptionName + "\" already used by " + already(it->second));
      }
    }
    if (auto v = s.string("kernel_interface")) {
      if (v->empty() || v->size() > kMaxInterfaceName) {
        s.fail("kernel_interface", "an interface name has 1 to 15 characters");
      } else {
        p.kernelInterface = *v;
      }
    } else if (t->get("kernel_interface") == nullptr) {
      p.kernelInterface =
          p.exception == ExceptionMode::Tap ? p.exceptionName : vdevInterface(p.devargs);
    }
    s.finish();
    if (errors_.size() != before) portsValid_ = false;
    portExtra_.push_back(PortExtra{s.placeOf("mtu"), at});
    config_.ports.push_back(std::move(p));
  }
  // Two-armed layouts need both arms.
  const auto count = [&](PortRole r) {
    return std::count_if(config_.ports.begin(), config_.ports.end(),
                         [&](const PortConfig& p) { return p.role == r; });
  };
  const auto clients = count(PortRole::Client);
  const auto backends = count(PortRole::Backend);
  if ((clients == 0) != (backends == 0)) {
    const PortRole have = clients ? PortRole::Client : PortRole::Backend;
    for (std::size_t i = 0; i < config_.ports.size(); ++i) {
      if (config_.ports[i].role != have) continue;
      error(portExtra_[i].place, "port[" + std::to_string(i) + "].role",
            "\"" + std::string(toString(have)) + "\"",
            "a two-armed layout needs a \"client\" and a \"backend\" port; this file has no \"" +
                std::string(have == PortRole::Client ? "backend" : "client") + "\" port");
      portsValid_ = false;
      break;
    }
  }
}

void Loader::loadPools(const toml::table& root, std::set<std::string>& used) {
  used.insert("pool");
  for (auto& [t, where] : tables(root, "pool")) {
    const std::size_t before = errors_.size();
    Section s(*this, *t, where);
    PoolConfig p;
    if (auto v = s.name()) {
      p.name = *v;
      auto [it, fresh] =
          poolByName_.emplace(p.name, static_cast<std::uint32_t>(config_.pools.size()));
      if (!fresh) {
        s.fail("name", "duplicate pool name; pool[" + std::to_string(it->second) + "] has it");
      }
    }
    if (auto v = s.choice<PoolSite>(
            "site", {{"onprem", PoolSite::OnPrem}, {"cloud", PoolSite::Cloud}}, true)) {
      p.site = *v;
    }
    if (auto v = s.integer("priority", 0, 65535)) p.priority = static_cast<std::uint32_t>(*v);
    if (auto v =
            s.choice<PoolEncap>("encap", {{"ipip", PoolEncap::IpIp}, {"gue", PoolEncap::Gue}})) {
      p.encap = *v;
    }
    if (auto v = s.integer("gue_port", 1, 65535)) {
      if (p.encap != PoolEncap::Gue) {
        s.fail("gue_port", "set, but encap is not \"gue\"");
      } else {
        p.guePort = static_cast<std::uint16_t>(*v);
      }
    }
    loadHealth(s, p);
    loadLoadSource(s, p);
    loadConnSource(s, p);
    loadDiscovery(s, p);
    s.finish();
    if (errors_.size() != before) poolsValid_ = false;
    config_.pools.push_back(std::move(p));
  }
}

void Loader::loadVips(const toml::table& root, std::set<std::string>& used) {
  used.insert("vip");
  std::map<std::string, std::uint32_t, std::less<>> names;
  struct KeySeen {
    VipKey key;
    std::uint32_t vip;
  };
  std::vector<KeySeen> keys;
  for (auto& [t, where] : tables(root, "vip")) {
    Section s(*this, *t, where);
    VipConfig v;
    const auto index = static_cast<std::uint32_t>(config_.vips.size());
    bool keyOk = true;
    if (auto n = s.name()) {
      v.name = *n;
      auto [it, fresh] = names.emplace(v.name, index);
      if (!fresh) {
        s.fail("name", "duplicate VIP name; vip[" + std::to_string(it->second) + "] has it");
      }
    }
    if (auto a = s.address("address", true)) {
      v.address = *a;
    } else {
      keyOk = false;
    }
    if (auto p =
            s.choice<IpProto>("protocol", {{"tcp", IpProto::Tcp}, {"udp", IpProto::Udp}}, true)) {
      v.protocol = *p;
    } else {
      keyOk = false;
    }
    if (auto p = s.integer("port", 0, 65535)) {
      v.port = static_cast<std::uint16_t>(*p);
    } else if (t->get("port") != nullptr) {
      keyOk = false;
    }
    if (auto m = s.integer("table_size", 0, UINT32_MAX)) {
      if (auto bad = validateMaglevTableSize(static_cast<std::uint32_t>(*m))) {
        // "table size N is not prime; ..." -> "not prime; ..."
        std::string why = *bad;
        const std::string prefix = "table size " + std::to_string(*m) + " ";
        if (why.rfind(prefix, 0) == 0) why.erase(0, prefix.size());
        if (why.rfind("is ", 0) == 0) why.erase(0, 3);
        s.fail("table_size", why);
      } else {
        v.tableSize = static_cast<std::uint32_t>(*m);
      }
    }
    if (const toml::array* pools = s.array("pools", true)) {
      if (pools->empty()) {
        s.fail("pools", "empty; a VIP needs at least one pool to send flows to");
      }
      for (std::size_t i = 0; i < pools->size(); ++i) {
        const toml::node& e = *pools->get(i);
        const std::string f = s.field("pools") + "[" + std::to_string(i) + "]";
        const auto* name = e.as_string();
        if (name == nullptr) {
          s.failAt(e, f, "expected a pool name (string)");
          continue;
        }
        auto it = poolByName_.find(name->get());
        if (it == poolByName_.end()) {
          std::string known;
          for (const auto& [pn, pi] : poolByName_) known += (known.empty() ? "" : ", ") + pn;
          s.failAt(e, f,
                   "no such pool" +
                       (known.empty() ? "; no [[pool]] is defined"s : "; pools are " + known));
          continue;
        }
        if (std::find(v.poolIndices.begin(), v.poolIndices.end(), it->second) !=
            v.poolIndices.end()) {
          s.failAt(e, f, "listed twice");
          continue;
        }
        v.pools.push_back(name->get());
        v.poolIndices.push_back(it->second);
      }
    }
    if (auto b = s.boolean("answer_ping")) v.answerPing = *b;
    if (auto m = s.string("placement")) {
      if (*m == "table") {
        v.placement = VipPlacementMode::Table;
      } else if (*m == "bytes") {
        v.placement = VipPlacementMode::Bytes;
        if (v.protocol != IpProto::Tcp) {
          s.fail("placement", "\"bytes\" places new TCP connections; this VIP is UDP");
        }
      } else {
        s.fail("placement",
               "expected \"table\" (the Maglev table alone) or \"bytes\" "
               "(bounded byte load over the table's entries)");
      }
    }
    s.finish();
    if (keyOk) {
      VipKey key{v.address.bytes, v.address.version, static_cast<std::uint8_t>(v.protocol), v.port};
      for (const KeySeen& k : keys) {
        if (k.key == key) {
          s.fail("address", "the same address, protocol and port as vip[" + std::to_string(k.vip) +
                                "] (line " + std::to_string(vipPlaces_[k.vip].line) + ")");
          break;
        }
      }
      keys.push_back(KeySeen{key, index});
    }
    vipPlaces_.push_back(s.place());
    config_.vips.push_back(std::move(v));
  }
}

void Loader::loadBackends(const toml::table& root, std::set<std::string>& used) {
  used.insert("backend");
  std::map<std::string, Seen, std::less<>> names;
  std::map<std::uint64_t, Seen> ids;
  std::map<std::pair<IpVersion, IpBytes>, Seen> addresses;
  // The default egress port: the first one that reaches backends.
  std::optional<std::uint32_t> defaultPort;
  for (std::uint32_t i = 0; i < config_.ports.size(); ++i) {
    if (config_.ports[i].role != PortRole::Client) {
      defaultPort = i;
      break;
    }
  }
  // (port, kind) pairs whose MTU was already found too small for IPv6 VIPs.
  std::set<std::pair<std::uint32_t, EncapKind>> mtuReported;

  for (auto& [t, where] : tables(root, "backend")) {
    Section s(*this, *t, where);
    BackendConfig b;
    const Place at = s.place();
    bool nameOk = false;
    if (auto n = s.name()) {
      b.name = *n;
      nameOk = true;
      if (auto [it, fresh] = names.emplace(b.name, Seen{where, at.line}); !fresh) {
        s.fail("name", "duplicate backend name; " + already(it->second) + " has it");
      }
    }
    const bool hasId = t->get("id") != nullptr;
    bool idOk = false;
    if (auto id = s.u64("id")) {
      b.id = *id;
      idOk = true;
    } else if (!hasId && nameOk) {
      b.id = backendIdFromName(b.name);
      idOk = true;
    }
    // A repeated name already said what is wrong; its derived id repeats too.
    if (idOk && (hasId || names.at(b.name).where == where)) {
      if (auto [it, fresh] = ids.emplace(b.id, Seen{where, at.line}); !fresh) {
        if (hasId) {
          s.fail("id",
                 "duplicate backend id " + hex64(b.id) + "; " + already(it->second) + " has it");
        } else {
          s.fail("name", "the id derived from this name (FNV-1a 64: " + hex64(b.id) +
                             ") equals the id of " + already(it->second) + "; set an explicit id");
        }
      }
    }
    auto address = s.address("address", true);
    if (address) {
      if (auto bad = backendAddressProblem(config_, *address)) {
        s.fail("address", *bad);
        address.reset();
      }
    }
    if (address) {
      b.address = *address;
      if (auto [it, fresh] = addresses.emplace(std::pair{b.address.version, b.address.bytes},
                                               Seen{where, at.line});
          !fresh) {
        s.fail("address", "the same address as " + already(it->second));
      }
    }
    bool poolOk = false;
    if (auto p = s.string("pool", true)) {
      auto it = poolByName_.find(*p);
      if (it == poolByName_.end()) {
        std::string known;
        for (const auto& [pn, pi] : poolByName_) known += (known.empty() ? "" : ", ") + pn;
        s.fail("pool", "no such pool" +
                           (known.empty() ? "; no [[pool]] is defined"s : "; pools are " + known));
      } else {
        b.pool = *p;
        b.poolIndex = it->second;
        poolOk = poolsValid_;
      }
    }
    if (auto w = s.integer("weight", 0, kMaxBackendWeight)) {
      b.weight = static_cast<std::uint32_t>(*w);
    }
    b.mac = s.mac("mac");
    bool portOk = false;
    if (auto p = s.string("port")) {
      auto it = portByName_.find(*p);
      if (it == portByName_.end()) {
        std::string known;
        for (const auto& [pn, pi] : portByName_) known += (known.empty() ? "" : ", ") + pn;
        s.fail("port", "no such port" + (known.empty() ? ""s : "; ports are " + known));
      } else if (config_.ports[it->second].role == PortRole::Client) {
        s.fail("port", "port \"" + *p +
                           "\" has role \"client\"; backends are reached through a "
                           "\"backend\" or \"one-armed\" port");
      } else {
        b.port = *p;
        b.portIndex = it->second;
        portOk = portsValid_;
      }
    } else if (t->get("port") == nullptr && defaultPort) {
      b.portIndex = *defaultPort;
      b.port = config_.ports[*defaultPort].name;
      portOk = portsValid_;
    } else if (t->get("port") == nullptr && !config_.ports.empty()) {
      s.failMissing("port", "missing, and no port reaches backends (every port is \"client\")");
    }
    if (auto st = s.choice<BackendState>(
            "state", {{"active", BackendState::Active}, {"disabled", BackendState::Disabled}})) {
      b.initialState = *st;
    }
    s.finish();

    // What the outer header needs from the port.
    if (address && portOk) {
      const PortConfig& port = config_.ports[b.portIndex];
      const std::string portName =
          "port[" + std::to_string(b.portIndex) + "] \"" + port.name + "\"";
      if (b.address.version == IpVersion::V4 && !port.address) {
        s.fail("address", "an IPv4 backend, but its egress " + portName +
                              " has no address (our IPv4 tunnel source)");
      } else if (b.address.version == IpVersion::V6 && !port.address6) {
        s.fail("address", "an IPv6 backend, but its egress " + portName +
                              " has no address6 (our IPv6 tunnel source)");
      }
      if (!b.mac && !port.nextHopMac && port.kernelInterface.empty()) {
        s.failMissing("mac",
                      "no way to find the next-hop MAC: set mac here, or next_hop_mac or "
                      "kernel_interface (or exception = \"tap\") on " +
                          portName);
      }
      if (poolOk) {
        const EncapKind kind = encapKindFor(config_.pools[b.poolIndex].encap, b.address.version);
        const std::size_t need = kIpv6MinMtu + encapOverhead(kind);
        bool v6Vip = false;
        for (const VipConfig& v : config_.vips) {
          if (v.address.version == IpVersion::V6 &&
              std::find(v.poolIndices.begin(), v.poolIndices.end(), b.poolIndex) !=
                  v.poolIndices.end()) {
            v6Vip = true;
          }
        }
        if (v6Vip && port.mtu < need && mtuReported.emplace(b.portIndex, kind).second) {
          error(portExtra_[b.portIndex].mtu, "port[" + std::to_string(b.portIndex) + "].mtu",
                std::to_string(port.mtu),
                "too small for IPv6 clients of " + where + ": 1280 + " +
                    std::to_string(encapOverhead(kind)) + " bytes of " +
                    std::string(toString(config_.pools[b.poolIndex].encap)) +
                    " overhead needs at least " + std::to_string(need));
        }
      }
    }
    config_.backends.push_back(std::move(b));
  }
}

const toml::table* Loader::topTable(const toml::table& root, std::string_view key) {
  const toml::node* n = root.get(key);
  if (n == nullptr) return nullptr;
  const toml::table* t = n->as_table();
  if (t == nullptr) {
    error(regionPlace(n->source()), std::string(key), describe(*n),
          "expected a table ([" + std::string(key) + "])");
  }
  return t;
}

void Loader::loadHealth(Section& pool, PoolConfig& p) {
  HealthCheckConfig& h = p.health;
  // Site defaults (config.hpp): on-prem finds a dead backend within 1 s,
  // cloud rides out WAN RTT and jitter.
  const bool cloud = p.site == PoolSite::Cloud;
  h.interval = cloud ? 1000 : 200;
  h.timeout = cloud ? 500 : 150;
  h.rise = 2;
  h.fall = 3;
  const bool present = pool.get("health") != nullptr;
  const toml::table* t = pool.table("health");
  if (!present) {
    h.kind = HealthCheckKind::None;  // no [pool.health]: never checked
    return;
  }
  if (t == nullptr) return;
  Section s(*this, *t, pool.field("health"));
  if (auto v = s.choice<HealthCheckKind>("kind", {{"tcp", HealthCheckKind::Tcp},
                                                  {"http", HealthCheckKind::Http},
                                                  {"encap", HealthCheckKind::Encap},
                                                  {"none", HealthCheckKind::None}})) {
    h.kind = *v;
  }
  const std::string kindText = "\"" + std::string(toString(h.kind)) + "\"";
  if (auto v = s.integer("port", 1, 65535)) h.port = static_cast<std::uint16_t>(*v);
  if (h.kind != HealthCheckKind::None && t->get("port") == nullptr) {
    s.failMissing("port", "missing; kind " + kindText +
                              " needs the backend port to probe (required unless kind is "
                              "\"none\")");
  }
  s.stringInto("path", isUrlPath, kUrlPathProblem, h.httpPath);
  if (auto v = s.integer("expect_status", 100, 599)) {
    h.expectStatus = static_cast<std::uint16_t>(*v);
  }
  for (const char* key : {"path", "expect_status"}) {
    if (t->get(key) != nullptr && h.kind != HealthCheckKind::Http) {
      s.fail(key, "set, but kind is " + kindText + ", not \"http\"");
    }
  }
  const bool intervalSet = t->get("interval") != nullptr;
  const bool timeoutSet = t->get("timeout") != nullptr;
  bool timesOk = s.secondsInto("interval", 10, 3'600'000, h.interval);
  timesOk = s.secondsInto("timeout", 1, 3'600'000, h.timeout) && timesOk;
  if (timesOk && h.kind != HealthCheckKind::None && h.timeout >= h.interval) {
    const std::string site(toString(p.site));
    if (timeoutSet) {
      s.fail("timeout", "must be shorter than interval (" + secondsText(h.interval) + " s" +
                            (intervalSet ? "" : ", the " + site + " default") +
                            "): a check ends before the next one starts");
    } else {
      s.fail("interval", "must be longer than timeout (" + secondsText(h.timeout) + " s, the " +
                             site + " default); set timeout below it too");
    }
  }
  if (auto v = s.integer("rise", 1, 100)) h.rise = static_cast<std::uint32_t>(*v);
  if (auto v = s.integer("fall", 1, 100)) h.fall = static_cast<std::uint32_t>(*v);
  if (h.kind == HealthCheckKind::None) {
    for (const char* key : {"port", "interval", "timeout", "rise", "fall"}) {
      if (t->get(key) != nullptr) s.fail(key, "set, but kind is \"none\" (never checked)");
    }
  }
  s.finish();
}

void Loader::loadDiscovery(Section& pool, PoolConfig& p) {
  DiscoveryConfig& d = p.discovery;
  const toml::table* t = pool.table("discovery");
  if (t == nullptr) return;  // no discovery: backends from the file and the CLI only
  Section s(*this, *t, pool.field("discovery"));
  if (auto v = s.choice<DiscoveryKind>(
          "kind", {{"file", DiscoveryKind::File}, {"dns", DiscoveryKind::Dns}}, true)) {
    d.kind = *v;
  }
  // Keys of the other kind are refused, not ignored.
  const auto only = [&](DiscoveryKind kind, std::initializer_list<const char*> keys) {
    if (d.kind == DiscoveryKind::None || d.kind == kind) return;
    for (const char* key : keys) {
      if (t->get(key) != nullptr) {
        s.fail(key, std::string("set, but kind is \"") +
                        (d.kind == DiscoveryKind::File ? "file" : "dns") + "\"");
      }
    }
  };
  only(DiscoveryKind::File, {"path", "max_file_bytes"});
  only(DiscoveryKind::Dns,
       {"name", "type", "target_type", "server", "min_ttl", "max_ttl", "timeout"});
  if (auto v = s.string("path", d.kind == DiscoveryKind::File)) {
    if (v->empty() || v->front() != '/' || v->back() == '/') {
      s.fail("path", "must be an absolute path to a file (its directory is watched)");
    } else {
      d.path = *v;
    }
  }
  if (auto v = s.string("name", d.kind == DiscoveryKind::Dns)) {
    if (!isDnsName(*v)) {
      s.fail("name",
             "not a DNS name (labels of letters, digits, '-' and '_', 1..63 characters each, "
             "253 in all)");
    } else {
      d.dnsName = *v;
    }
  }
  const std::initializer_list<std::pair<const char*, DnsRecordType>> types = {
      {"A", DnsRecordType::A}, {"AAAA", DnsRecordType::Aaaa}, {"SRV", DnsRecordType::Srv}};
  if (auto v = s.choice<DnsRecordType>("type", types)) d.dnsType = *v;
  if (auto v = s.choice<DnsRecordType>("target_type",
                                       {{"A", DnsRecordType::A}, {"AAAA", DnsRecordType::Aaaa}})) {
    d.targetType = *v;
    if (d.dnsType != DnsRecordType::Srv) {
      s.fail("target_type", "set, but type is not \"SRV\" (only SRV targets are resolved)");
    }
  }
  if (auto v = s.string("server")) {
    if (auto server = parseDnsServer(*v)) {
      d.server = server->first;
      d.serverPort = server->second;
    } else {
      s.fail("server",
             "not an address with an optional port (\"192.0.2.53\", "
             "\"192.0.2.53:5353\", \"[2001:db8::53]:53\")");
    }
  }
  const bool ttlOk = s.secondsInto("min_ttl", 100, 86'400'000, d.minTtl) &&
                     s.secondsInto("max_ttl", 100, 86'400'000, d.maxTtl);
  if (ttlOk && d.minTtl > d.maxTtl) {
    s.fail(t->get("max_ttl") != nullptr ? "max_ttl" : "min_ttl",
           "min_ttl (" + secondsText(d.minTtl) + " s) is above max_ttl (" + secondsText(d.maxTtl) +
               " s)");
  }
  (void)s.secondsInto("timeout", 100, 30'000, d.timeout);
  (void)s.secondsInto("hold", 0, 3'600'000, d.hold);
  if (auto v = s.integer("max_entries", 1, kMaxDiscoveryEntries)) {
    d.maxEntries = static_cast<std::uint32_t>(*v);
  }
  if (auto v = s.integer("max_pool_backends", 1, 65535)) {
    d.maxPoolBackends = static_cast<std::uint32_t>(*v);
  }
  if (auto v = s.integer("max_file_bytes", 2, static_cast<std::int64_t>(kMaxDiscoveryFileBytes))) {
    d.maxFileBytes = static_cast<std::uint64_t>(*v);
  }
  s.finish();
}

void Loader::loadLoadSource(Section& pool, PoolConfig& p) {
  LoadSourceConfig& l = p.load;
  const toml::table* t = pool.table("load");
  if (t == nullptr) return;  // no [pool.load]: no load feedback
  Section s(*this, *t, pool.field("load"));
  l.enabled = true;
  if (auto v = s.boolean("enabled")) l.enabled = *v;
  if (auto v = s.integer("port", 1, 65535)) l.port = static_cast<std::uint16_t>(*v);
  s.stringInto("path", isUrlPath, kUrlPathProblem, l.path);
  bool metricsOk = true;
  for (auto [key, out] :
       {std::pair{"gpu_metric", &l.gpuMetric}, std::pair{"queue_metric", &l.queueMetric}}) {
    if (auto v = s.string(key)) {
      if (!v->empty() && !isMetricName(*v)) {
        s.fail(key,
               "not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*, no labels); \"\" for "
               "none");
        metricsOk = false;
      } else {
        *out = *v;
      }
    } else if (t->get(key) != nullptr) {
      metricsOk = false;
    }
  }
  if (metricsOk && l.enabled && l.gpuMetric.empty() && l.queueMetric.empty()) {
    s.fail("gpu_metric", "empty, and so is queue_metric: nothing to scrape; name at least one");
  }
  const bool intervalSet = t->get("interval") != nullptr;
  const bool timeoutSet = t->get("timeout") != nullptr;
  const bool staleSet = t->get("stale_after") != nullptr;
  bool timesOk = s.secondsInto("interval", 100, 3'600'000, l.interval);
  timesOk = s.secondsInto("timeout", 1, 3'600'000, l.timeout) && timesOk;
  timesOk = s.secondsInto("stale_after", 1, 86'400'000, l.staleAfter) && timesOk;
  if (timesOk && l.timeout >= l.interval) {
    if (timeoutSet) {
      s.fail("timeout", "must be shorter than interval (" + secondsText(l.interval) + " s" +
                            (intervalSet ? "" : ", the default") + ")");
    } else {
      s.fail("interval", "must be longer than timeout (" + secondsText(l.timeout) +
                             " s, the default); set timeout below it too");
    }
  }
  if (timesOk && l.staleAfter <= l.interval) {
    s.fail(staleSet ? "stale_after" : "interval",
           staleSet ? "must be longer than interval (" + secondsText(l.interval) +
                          " s), or every sample would expire before the next scrape"
                    : "must be shorter than stale_after (" + secondsText(l.staleAfter) +
                          " s, the default); set stale_after above it too");
  }
  if (auto v = s.number("smoothing", 0.0, 1.0, true, false)) l.smoothing = *v;
  s.finish();
}

void Loader::loadConnSource(Section& pool, PoolConfig& p) {
  ConnSourceConfig& c = p.connections;
  const toml::table* t = pool.table("connections");
  if (t == nullptr) return;  // no [pool.connections]: drains judged by the own count
  Section s(*this, *t, pool.field("connections"));
  c.enabled = true;
  if (auto v = s.boolean("enabled")) c.enabled = *v;
  if (auto v = s.integer("port", 1, 65535)) c.port = static_cast<std::uint16_t>(*v);
  s.stringInto("path", isUrlPath, kUrlPathProblem, c.path);
  bool timesOk = s.secondsInto("interval", 100, 3'600'000, c.interval);
  timesOk = s.secondsInto("timeout", 1, 3'600'000, c.timeout) && timesOk;
  timesOk = s.secondsInto("stale_after", 1, 86'400'000, c.staleAfter) && timesOk;
  timesOk = s.secondsInto("grace", 0, 3'600'000, c.grace) && timesOk;
  if (timesOk && c.timeout >= c.interval) {
    s.fail("timeout", "must be shorter than interval (" + secondsText(c.interval) + " s)");
  }
  if (timesOk && c.staleAfter <= c.interval) {
    s.fail("stale_after", "must be longer than interval (" + secondsText(c.interval) +
                              " s), or every report would expire before the next scrape");
  }
  if (auto v = s.string("token_file")) {
    std::string why;
    if (v->empty() || v->front() != '/') {
      s.fail("token_file", "must be an absolute path");
    } else if (auto token = readPeerSecret(*v, why)) {
      while (!token->empty() && (token->back() == ' ' || token->back() == '\t')) token->pop_back();
      const bool printable = std::all_of(token->begin(), token->end(), [](char ch) {
        const auto u = static_cast<unsigned char>(ch);
        return u > 0x20 && u < 0x7f;
      });
      if (!printable) {
        s.fail("token_file", *v +
                                 " holds a blank, control or non-ASCII byte; the agent's token "
                                 "travels in an HTTP header (make one: head -c 32 /dev/urandom | "
                                 "base64 > " +
                                 *v + ")");
      } else if (token->size() < kPeerMinSecretBytes) {
        s.fail("token_file", *v + " holds fewer than " + std::to_string(kPeerMinSecretBytes) +
                                 " bytes besides trailing blanks");
      } else {
        c.tokenFile = *v;
        c.token = std::move(*token);
        c.rebuild = true;
      }
    } else {
      for (std::size_t at = why.find("secret file"); at != std::string::npos;
           at = why.find("secret file", at)) {
        why.replace(at, 6, "token");
      }
      s.fail("token_file", why);
    }
  }
  s.stringInto("list_path", isUrlPath, kUrlPathProblem, c.listPath);
  if (auto v = s.boolean("rebuild")) {
    if (*v && c.tokenFile.empty() && t->get("token_file") == nullptr) {
      s.fail("rebuild", "needs token_file: the agent lists connections only to its token");
    } else {
      c.rebuild = *v && !c.tokenFile.empty();
    }
  }
  (void)s.secondsInto("rebuild_timeout", 1, kConnRebuildLimit, c.rebuildTimeout);
  s.finish();
}

void Loader::loadPolicy(const toml::table& root, std::set<std::string>& used) {
  used.insert("policy");
  const toml::table* t = topTable(root, "policy");
  if (t == nullptr) return;
  Section s(*this, *t, "policy");
  PolicyConfig& c = config_.policy;
  // A watermark pair must keep low < high. The error goes to the key written
  // in the file (the low one when both are), with the other's value.
  const auto pair = [&](const char* lowKey, double& low, const char* highKey, double& high,
                        double lowMin, double highMax, bool highMinOpen) {
    const bool lowSet = t->get(lowKey) != nullptr;
    const bool highSet = t->get(highKey) != nullptr;
    bool ok = true;
    if (auto v = s.number(highKey, 0.0, highMax, highMinOpen, false)) {
      high = *v;
    } else if (highSet) {
      ok = false;
    }
    if (auto v = s.number(lowKey, lowMin, highMax, false, true)) {
      low = *v;
    } else if (lowSet) {
      ok = false;
    }
    if (!ok || low < high) return;
    if (lowSet) {
      s.fail(lowKey, "must be below " + std::string(highKey) + " (" + numberText(high) +
                         (highSet ? "" : ", the default") +
                         "): the gap between them is the hysteresis");
    } else {
      s.fail(highKey, "must be above " + std::string(lowKey) + " (" + numberText(low) +
                          ", the default); set " + lowKey + " below it too");
    }
  };
  pair("gpu_low", c.gpuLow, "gpu_high", c.gpuHigh, 0.0, 100.0, true);
  pair("queue_low", c.queueLow, "queue_high", c.queueHigh, 0.0, 1e9, true);
  if (auto v = s.number("overprovisioning", 1.0, 10.0)) c.overprovisioning = *v;
  if (auto v = s.number("panic_threshold", 0.0, 1.0, false, true)) c.panicThreshold = *v;
  if (auto v = s.number("min_load_factor", 0.0, 1.0, true, false)) c.minLoadFactor = *v;
  if (auto v = s.number("load_factor_step", 0.0, 0.5)) c.loadFactorStep = *v;
  if (auto v = s.number("load_factor_hysteresis", 0.0, 0.5, false, true)) {
    c.loadFactorHysteresis = *v;
  }
  if (auto v = s.number("churn_budget", 0.0, 1.0, true, false)) c.churnBudget = *v;
  if (auto v = s.seconds("churn_interval", 10, 3'600'000)) c.churnInterval = *v;
  if (auto v = s.seconds("drain_timeout")) c.drainTimeout = *v;

  // Latency.
  if (auto v = s.choice<LatencyRegions>("latency_regions", {{"cloud", LatencyRegions::Cloud},
                                                            {"all", LatencyRegions::All},
                                                            {"off", LatencyRegions::Off}})) {
    c.latencyRegions = *v;
  }
  c.latencyWindow = std::max<Millis>(1000, c.churnInterval);
  if (t->get("latency_window") != nullptr) {
    if (auto v = s.seconds("latency_window", 10, 3'600'000)) {
      if (*v < c.churnInterval) {
        s.fail("latency_window",
               "must be at least churn_interval (" + secondsText(c.churnInterval) +
                   " s): the policy looks at latency once per step, so a shorter window "
                   "would count steps, not windows");
      } else {
        c.latencyWindow = *v;
      }
    }
  }
  if (auto v = s.number("region_switch_margin", 0.0, 10.0)) c.regionSwitchMargin = *v;
  if (auto v = s.number("region_switch_margin_ms", 0.0, 60'000.0)) c.regionSwitchMarginMs = *v;
  if (auto v = s.integer("region_switch_windows", 1, 10'000)) {
    c.regionSwitchWindows = static_cast<std::uint32_t>(*v);
  }
  if (auto v = s.number("degraded_latency_ms", 0.0, 60'000.0)) c.degradedLatencyMs = *v;
  if (auto v = s.number("degraded_latency_factor", 0.0, 1000.0)) {
    if (*v > 0.0 && *v <= 1.0) {
      s.fail("degraded_latency_factor",
             "must be above 1 (a multiple of the pool's median; 0 turns it off): at " +
                 numberText(*v) + " half a pool would be above its own median");
    } else {
      c.degradedLatencyFactor = *v;
    }
  }
  if (auto v = s.number("degraded_latency_min_ms", 0.0, 60'000.0)) c.degradedLatencyMinMs = *v;
  if (auto v = s.integer("degraded_windows", 1, 10'000)) {
    c.degradedWindows = static_cast<std::uint32_t>(*v);
  }
  if (auto v = s.number("degraded_weight", 0.0, 1.0, true, false)) c.degradedWeight = *v;
  if (auto v = s.number("degraded_max_fraction", 0.0, 1.0)) c.degradedMaxFraction = *v;
  if (auto v = s.number("degraded_restore_step", 0.0, 1.0, true, false)) {
    c.degradedRestoreStep = *v;
  }
  s.finish();
}

void Loader::loadControl(const toml::table& root, std::set<std::string>& used) {
  used.insert("control");
  const toml::table* t = topTable(root, "control");
  if (t == nullptr) return;
  Section s(*this, *t, "control");
  ControlConfig& c = config_.control;
  if (auto v = s.string("socket")) {
    // sun_path holds 108 bytes with the terminating NUL.
    if (v->empty() || (*v)[0] != '/') {
      s.fail("socket", "must be an absolute path");
    } else if (v->size() > 107) {
      s.fail("socket", "longer than 107 bytes, the limit of a Unix socket path");
    } else {
      c.socketPath = *v;
    }
  }
  s.stringInto(
      "socket_group", [](std::string_view v) { return v.empty() || isGroupName(v); },
      "not a group name (letters, digits, '_', '-', '.', at most 32, not starting with "
      "'-'); \"\" for the daemon's group",
      c.socketGroup);
  s.stringInto(
      "metrics_listen", [](std::string_view v) { return v.empty() || isListenAddress(v); },
      "expected \"address:port\" (\"127.0.0.1:9550\", \"[::1]:9550\"), or \"\" for no "
      "metrics endpoint",
      c.metricsListen);
  if (auto v = s.integer("event_log_size", 16, 1'048'576)) {
    c.eventLogSize = static_cast<std::size_t>(*v);
  }
  s.stringInto(
      "state_dir", [](std::string_view v) { return v.empty() || v[0] == '/'; },
      "must be an absolute path, or \"\" to keep no state across restarts", c.stateDir);
  s.stringInto(
      "user", [](std::string_view v) { return v.empty() || isGroupName(v); },
      "not a user name (letters, digits, '_', '-', '.', at most 32, not starting with "
      "'-'); \"\" to stay root",
      c.user);
  s.finish();
}

void Loader::loadAnnounce(const toml::table& root, std::set<std::string>& used) {
  used.insert("announce");
  const toml::table* t = topTable(root, "announce");
  if (t == nullptr) return;
  Section s(*this, *t, "announce");
  AnnounceConfig& c = config_.announce;
  if (auto v = s.boolean("enabled")) c.enabled = *v;
  if (auto v = s.string("device")) {
    const bool clash = std::any_of(config_.ports.begin(), config_.ports.end(), [&](const auto& p) {
      return p.exceptionName == *v || p.kernelInterface == *v;
    });
    if (v->empty() || v->size() > kMaxInterfaceName ||
        v->find_first_of("/: \t\n") != std::string::npos) {
      s.fail("device", "an interface name has 1 to 15 characters, none of '/', ':' or blanks");
    } else if (clash) {
      s.fail("device",
             "already a port's exception tap or kernel interface; the announce "
             "device must be its own");
    } else {
      c.device = *v;
    }
  }
  const auto ms = [&](const char* key, Millis min, Millis max, Millis& out) {
    if (auto v = s.integer(key, static_cast<std::int64_t>(min), static_cast<std::int64_t>(max))) {
      out = static_cast<Millis>(*v);
    }
  };
  ms("period_ms", 5, 100, c.periodMs);
  ms("stall_ms", 20, 10'000, c.stallMs);
  ms("control_stall_ms", 100, 60'000, c.controlStallMs);
  ms("hold_down_ms", 0, 600'000, c.holdDownMs);
  ms("withdraw_grace_ms", 0, 60'000, c.withdrawGraceMs);
  ms("freeze_ms", 50, 60'000, c.freezeMs);
  if (c.freezeMs < 3 * c.periodMs) {
    s.fail(t->get("freeze_ms") != nullptr ? "freeze_ms" : "period_ms",
           "freeze_ms (" + std::to_string(c.freezeMs) +
               ") must be at least three times period_ms (" + std::to_string(c.periodMs) +
               "): one late announcer round is not a freeze");
  }
  if (c.stallMs < 2 * c.periodMs) {
    s.fail(t->get("stall_ms") != nullptr ? "stall_ms" : "period_ms",
           "stall_ms (" + std::to_string(c.stallMs) + ") must be at least twice period_ms (" +
               std::to_string(c.periodMs) + "): a stall is judged on the announcer's timer");
  }
  s.finish();
}

void Loader::loadPlacement(const toml::table& root, std::set<std::string>& used) {
  used.insert("placement");
  const toml::table* t = topTable(root, "placement");
  if (t == nullptr) return;
  Section s(*this, *t, "placement");
  PlacementConfig& c = config_.placement;
  if (auto v = s.number("balance_factor", 1.0, 10.0, true, false)) c.balanceFactor = *v;
  if (auto v = s.integer("candidates", 1, kMaxPlacementCandidates)) {
    c.candidates = static_cast<std::uint32_t>(*v);
  }
  if (auto v = s.seconds("rate_interval", 10, 10'000)) c.rateInterval = *v;
  if (auto v = s.seconds("rate_smoothing", 10, 600'000)) c.rateSmoothing = *v;
  s.finish();
}

void Loader::loadTier(const toml::table& root, std::set<std::string>& used) {
  used.insert("tier");
  const toml::table* t = topTable(root, "tier");
  if (t == nullptr) return;
  Section s(*this, *t, "tier");
  TierConfig& c = config_.tier;
  const char* addressHelp =
      "expected \"address:port\" (\"192.0.2.1:9560\", \"[2001:db8::1]:9560\")";
  if (auto v = s.name("node")) c.node = *v;
  s.stringInto("listen", isListenAddress, addressHelp, c.listen);
  std::set<std::string> names;
  if (const toml::array* a = s.array("peers")) {
    for (std::size_t i = 0; i < a->size(); ++i) {
      const std::string where = "tier.peers[" + std::to_string(i) + "]";
      const toml::table* pt = a->get(i)->as_table();
      if (pt == nullptr) {
        error(regionPlace(a->get(i)->source()), where, describe(*a->get(i)),
              "expected a table {name = \"...\", address = \"address:port\"}");
        continue;
      }
      Section ps(*this, *pt, where);
      TierPeerConfig p;
      if (auto v = ps.name("name")) p.name = *v;
      if (auto v = ps.string("address", true)) {
        if (!isListenAddress(*v)) ps.fail("address", addressHelp);
        p.address = *v;
      }
      ps.finish();
      if (!p.name.empty() && (p.name == c.node || !names.insert(p.name).second)) {
        ps.fail("name", p.name == c.node ? "is this instance's own node name"
                                         : "listed twice; each peer once");
      }
      c.peers.push_back(std::move(p));
    }
  }
  if (auto v = s.seconds("sync_interval", 100, 60'000)) c.syncInterval = *v;
  if (auto v = s.seconds("hold_time", 1000, 86'400'000)) c.holdTime = *v;
  if (auto v = s.seconds("make_before_break", 0, 5000)) c.makeBeforeBreak = *v;
  if (auto v = s.integer("max_records_per_peer", 1, 100'000'000)) {
    c.maxRecordsPerPeer = static_cast<std::size_t>(*v);
  }
  if (auto v = s.integer("max_output_bytes", 1 << 20, std::int64_t{1} << 32)) {
    c.maxOutputBytes = static_cast<std::size_t>(*v);
  }
  s.stringInto(
      "secret_file", [](std::string_view v) { return !v.empty() && v[0] == '/'; },
      "must be an absolute path", c.secretFile);
  s.finish();
  if (c.peers.empty()) return;
  if (c.listen.empty()) s.failMissing("listen", "missing; required when peers are listed");
  if (c.secretFile.empty()) {
    s.failMissing("secret_file",
                  "missing; required when peers are listed (a file of at least 16 bytes, mode "
                  "0600, the same on every instance)");
    return;
  }
  std::string why;
  if (auto secret = readPeerSecret(c.secretFile, why)) {
    c.secret = std::move(*secret);
  } else {
    s.fail("secret_file", why);
  }
}

// The pre-scan in front of toml++ 3.3: one trap, for one bug of toml++ 3.3.
//
// toml++ 3.3's is_non_ascii_horizontal_whitespace() (impl/unicode_autogenerated.h)
// ends in TOML_UNREACHABLE (__builtin_unreachable) for code points whose
// slot of its lookup table has no case, e.g. U+01E9 and U+FCFF: undefined
// behaviour in every build, the Debian shared library included (reported
// upstream as marzer/tomlplusplus#190 and #295, fixed by #305 after 3.3;
// the reproducers are in config_test, NonAsciiOutsideStrings...). The parser
// asks that question of any non-ASCII character outside a string or comment,
// where TOML allows none, so the scan refuses the first such character with
// a syntax error before toml++ sees the document. It knows strings (basic,
// literal, multi-line), comments and a BOM, so that text inside them is
// allowed; and a quote where no string may start (a value after '=', '[',
// ',', a key at a line's start or after '.', '{', ',') opens none here,
// because toml++ scans the token that holds it as a value ("x =-\"ab\u{FCFF}")
// and meets what follows as text outside strings.
//
// The rule for this scan: no new trap without a reproducer that makes
// toml++ crash or misparse as the daemon links it (a bug filed or found
// upstream) and a test. Two earlier traps went: a table header without a
// name ("[[#", marzer/tomlplusplus#301) and an array element that starts
// with '}' ("[}]") break preconditions that only a debug build of toml++
// asserts; the shipped library reports both as parse errors (config_test
// keeps them as reproducers).
std::optional<Place> nonAsciiOutsideStrings(std::string_view text) {
  std::uint32_t line = 1;
  std::size_t lineBegin = 0;
  std::size_t depth = 0;  // '[' still open
  bool lineStart = true;
  char last = '\n';  // the last character outside strings, comments and blanks
  const std::size_t start = text.starts_with("\xEF\xBB\xBF") ? 3 : 0;  // a UTF-8 BOM
  for (std::size_t i = start; i < text.size(); ++i) {
    const char c = text[i];
    if (static_cast<unsigned char>(c) >= 0x80) {
      return Place{line, static_cast<std::uint32_t>(i - lineBegin + 1)};
    }
    if (c == '\n') {
      ++line;
      lineBegin = i + 1;
      lineStart = true;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r') continue;
    if (c == '#') {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
      continue;
    }
    const bool stringStart = (lineStart && depth == 0) || last == '=' || last == '[' ||
                             last == ',' || last == '{' || last == '.';
    if ((c == '"' || c == '\'') && stringStart) {
      const bool triple = text.substr(i, 3) == std::string(3, c);
      std::size_t j = i + (triple ? 3 : 1);
      for (; j < text.size(); ++j) {
        if (c == '"' && text[j] == '\\') {
          ++j;  // an escaped character
        } else if (triple ? text.substr(j, 3) == std::string(3, c) : text[j] == c) {
          break;
        } else if (text[j] == '\n') {
          if (!triple) return std::nullopt;  // toml++ reports the open string
          ++line;
          lineBegin = j + 1;
        }
      }
      if (j >= text.size()) return std::nullopt;
      i = j + (triple ? 2 : 0);
      lineStart = false;
      last = c;
      continue;
    }
    lineStart = false;
    last = c;
    if (c == '[') ++depth;
    if (c == ']' && depth > 0) --depth;
  }
  return std::nullopt;
}

ConfigResult Loader::load(std::string_view text) {
  if (const std::optional<Place> p = nonAsciiOutsideStrings(text)) {
    errors_.push_back(ConfigError{file_, p->line, p->column, "", "",
                                  "TOML: a non-ASCII character outside a string or comment "
                                  "(names and values are ASCII; quote text)"});
    return ConfigResult(std::move(errors_));
  }
  toml::table root;
  try {
    root = toml::parse(text, std::string_view(file_));
  } catch (const toml::parse_error& e) {
    const Place p = regionPlace(e.source());
    errors_.push_back(
        ConfigError{file_, p.line, p.column, "", "", "TOML: " + std::string(e.description())});
    return ConfigResult(std::move(errors_));
  }
  std::set<std::string> used;
  loadDataplane(root, used);
  loadPorts(root, used);
  loadPools(root, used);
  loadVips(root, used);
  loadBackends(root, used);
  loadPolicy(root, used);
  loadControl(root, used);
  loadAnnounce(root, used);
  loadTier(root, used);
  loadPlacement(root, used);
  for (auto&& [key, node] : root) {
    if (used.count(std::string(key.str())) != 0) continue;
    error(regionPlace(key.source()), std::string(key.str()), describe(node),
          "unknown key; the top level takes [dataplane], [policy], [control], [announce], "
          "[tier], [[port]], [[pool]], [[vip]] and [[backend]]");
  }
  if (!errors_.empty()) {
    std::stable_sort(errors_.begin(), errors_.end(),
                     [](const ConfigError& a, const ConfigError& b) {
                       return std::pair{a.line, a.column} < std::pair{b.line, b.column};
                     });
    return ConfigResult(std::move(errors_));
  }
  return ConfigResult(std::move(config_));
}

}  // namespace

std::optional<std::string> backendNameProblem(std::string_view name) {
  return nameProblem(name);
}

bool isUnicastMacAddress(const MacAddress& m) {
  return isUnicastMac(m);
}

std::optional<std::string> backendAddressProblem(const Config& c, const IpAddress& a) {
  if (isUnspecifiedOrMulticast(a)) {
    return "must be a unicast address (not unspecified, multicast or broadcast)";
  }
  const auto b0 = std::to_integer<std::uint8_t>(a.bytes[0]);
  const bool loopback = a.version == IpVersion::V4
                            ? b0 == 127
                            : std::all_of(a.bytes.begin(), a.bytes.begin() + 15,
                                          [](std::byte x) { return x == std::byte{0}; }) &&
                                  a.bytes[15] == std::byte{1};
  if (loopback) return "a loopback address; a backend is reached through a port";
  for (const VipConfig& v : c.vips) {
    if (v.address == a) return "the address of VIP " + v.name + "; a backend needs its own";
  }
  for (const PortConfig& p : c.ports) {
    if (p.address == a || p.address6 == a) {
      return "this gateway's own address (port " + p.name + "); a backend needs its own";
    }
  }
  return std::nullopt;
}

ConfigResult loadConfigFromString(std::string_view text, std::string_view name) noexcept {
  try {
    return Loader(std::string(name)).load(text);
  } catch (const std::exception& e) {
    std::vector<ConfigError> errors;
    try {
      errors.push_back(ConfigError{std::string(name), 0, 0, "", "",
                                   "cannot load the configuration: "s + e.what()});
    } catch (...) {
    }
    return ConfigResult(std::move(errors));
  }
}

ConfigResult loadConfig(const std::string& path) noexcept {
  auto fail = [&](std::string why) {
    return ConfigResult(std::vector<ConfigError>{ConfigError{path, 0, 0, "", "", std::move(why)}});
  };
  try {
    // A regular file of bounded size only, opened without blocking: a FIFO,
    // a device or /dev/zero is an error, never a stalled or exhausted daemon.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return fail("cannot open: " + errnoText(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return fail("cannot stat: " + errnoText(err));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return fail("not a regular file (a configuration must be a plain file)");
    }
    if (static_cast<std::uint64_t>(st.st_size) > kMaxConfigBytes) {
      ::close(fd);
      return fail("the file is " + std::to_string(st.st_size) + " bytes, more than the " +
                  std::to_string(kMaxConfigBytes) + " a configuration may have");
    }
    std::string text;
    char buffer[65536];
    for (;;) {
      const ssize_t n = ::read(fd, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        ::close(fd);
        return fail("cannot read the file: " + errnoText(err));
      }
      if (n == 0) break;
      if (text.size() + static_cast<std::size_t>(n) > kMaxConfigBytes) {
        ::close(fd);
        return fail("the file grew past " + std::to_string(kMaxConfigBytes) + " bytes while read");
      }
      text.append(buffer, static_cast<std::size_t>(n));
    }
    ::close(fd);
    return loadConfigFromString(text, path);
  } catch (const std::exception& e) {
    std::vector<ConfigError> errors;
    try {
      errors.push_back(
          ConfigError{path, 0, 0, "", "", "cannot load the configuration: "s + e.what()});
    } catch (...) {
    }
    return ConfigResult(std::move(errors));
  }
}

}  // namespace spillway
