#include "control/discovery/file_sd.hpp"

#include <nlohmann/json.hpp>
#include <set>

namespace spillway {

namespace {

using Json = nlohmann::json;

std::string lineColumn(std::string_view text, std::size_t byte) {
  std::size_t line = 1, column = 1;
  for (std::size_t i = 0; i < byte && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

std::string clip(std::string_view s) {
  return std::string(s.substr(0, 80)) + (s.size() > 80 ? "..." : "");
}

// "10.0.0.5", "10.0.0.5:8000", "2001:db8::5", "[2001:db8::5]:8000".
std::optional<IpAddress> targetAddress(std::string_view t) {
  if (auto a = parseIpAddress(t)) return a;
  std::string_view host;
  std::string_view port;
  if (!t.empty() && t.front() == '[') {
    const auto close = t.find(']');
    if (close == std::string_view::npos || close + 1 >= t.size() || t[close + 1] != ':') {
      return std::nullopt;
    }
    host = t.substr(1, close - 1);
    port = t.substr(close + 2);
  } else {
    const auto colon = t.find(':');
    if (colon == std::string_view::npos || t.find(':', colon + 1) != std::string_view::npos) {
      return std::nullopt;
    }
    host = t.substr(0, colon);
    port = t.substr(colon + 1);
  }
  if (port.empty() || port.size() > 5) return std::nullopt;
  std::uint32_t p = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return std::nullopt;
    p = p * 10 + static_cast<std::uint32_t>(c - '0');
  }
  if (p == 0 || p > 65535) return std::nullopt;
  auto a = parseIpAddress(host);
  if (a && (t.front() == '[') != (a->version == IpVersion::V6)) return std::nullopt;
  return a;
}

}  // namespace

std::optional<MetricsUrl> parseMetricsUrl(std::string_view url, std::string& error) {
  constexpr std::string_view kScheme = "http://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    error = "not an http:// URL (the load scrape speaks plain HTTP)";
    return std::nullopt;
  }
  std::string_view rest = url.substr(kScheme.size());
  const auto slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  MetricsUrl out;
  if (slash != std::string_view::npos) out.path = std::string(rest.substr(slash));
  const bool bracketed = !authority.empty() && authority.front() == '[';
  std::string_view host = authority;
  std::optional<std::string_view> port;  // after a ':', empty or not
  if (bracketed) {
    const auto close = authority.find(']');
    if (close == std::string_view::npos) {
      error = "an IPv6 host without its closing ']'";
      return std::nullopt;
    }
    host = authority.substr(1, close - 1);
    const std::string_view after = authority.substr(close + 1);
    if (!after.empty() && after.front() != ':') {
      error = "'" + clip(after) + "' after the host";
      return std::nullopt;
    }
    if (!after.empty()) port = after.substr(1);
  } else if (const auto colon = authority.find(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  auto address = parseIpAddress(host);
  if (!address || bracketed != (address->version == IpVersion::V6)) {
    error = "the host '" + clip(host) + "' is not an address (IPv6 in brackets)";
    return std::nullopt;
  }
  out.host = *address;
  if (port) {
    std::uint32_t p = 0;
    bool ok = !port->empty() && port->size() <= 5;
    for (char c : *port) {
      ok = ok && c >= '0' && c <= '9';
      if (ok) p = p * 10 + static_cast<std::uint32_t>(c - '0');
    }
    if (!ok || p == 0 || p > 65535) {
      error = "the port '" + clip(*port) + "' is not 1..65535";
      return std::nullopt;
    }
    out.port = static_cast<std::uint16_t>(p);
  }
  if (out.path.size() > kMaxMetricsPathBytes) {
    error = "the path is longer than " + std::to_string(kMaxMetricsPathBytes) + " bytes";
    return std::nullopt;
  }
  for (char c : out.path) {
    if (c <= ' ' || c > '~' || c == '#') {
      error = "the path has a character an HTTP request line cannot carry";
      return std::nullopt;
    }
  }
  return out;
}

std::string formatMetricsUrl(const IpAddress& host, std::uint16_t port, std::string_view path) {
  const std::string h = formatIpAddress(host);
  return "http://" + (host.version == IpVersion::V6 ? "[" + h + "]" : h) + ":" +
         std::to_string(port) + std::string(path);
}

std::uint64_t discoveredBackendId(const IpAddress& address) {
  return backendIdFromName("discovered " + formatIpAddress(address));
}

std::string discoveredBackendName(const IpAddress& address) {
  std::string n = "d-" + formatIpAddress(address);
  for (char& c : n) {
    if (c == '.' || c == ':') c = '-';
  }
  return n;
}

FileSdParse parseFileSd(std::string_view text, std::uint32_t maxEntries) {
  FileSdParse out;
  Json doc;
  try {
    doc = Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    out.error =
        "not JSON at " + lineColumn(text, e.byte == 0 ? 0 : e.byte - 1) + ": " + clip(e.what());
    return out;
  }
  if (!doc.is_array()) {
    out.error = "expected a JSON array of target groups ({\"targets\": [...], \"labels\": {...}})";
    return out;
  }
  std::set<std::uint64_t> seen;
  std::set<std::string> names;
  std::size_t overCap = 0;
  for (std::size_t g = 0; g < doc.size(); ++g) {
    const Json& group = doc[g];
    const std::string where = "group " + std::to_string(g);
    if (!group.is_object() || !group.contains("targets") || !group["targets"].is_array()) {
      out.error = where + ": expected an object with a \"targets\" array";
      return out;
    }
    for (auto it = group.begin(); it != group.end(); ++it) {
      if (it.key() != "targets" && it.key() != "labels") {
        out.error = where + ": unknown key \"" + clip(it.key()) + "\" (targets, labels)";
        return out;
      }
    }
    const Json labels = group.value("labels", Json::object());
    if (!labels.is_object()) {
      out.error = where + ": \"labels\" must be an object of strings";
      return out;
    }
    std::optional<std::string> name;
    std::uint32_t weight = kDefaultBackendWeight;
    std::optional<MacAddress> mac;
    std::optional<PoolEncap> encap;
    std::optional<MetricsUrl> metrics;
    std::optional<std::string> groupProblem;
    for (auto it = labels.begin(); it != labels.end(); ++it) {
      if (!it.value().is_string()) {
        out.error = where + ": label \"" + clip(it.key()) + "\" must be a string";
        return out;
      }
      const std::string v = it.value().get<std::string>();
      if (it.key() == "name") {
        if (auto bad = backendNameProblem(v)) groupProblem = "name '" + clip(v) + "': " + *bad;
        name = v;
      } else if (it.key() == "weight") {
        std::uint64_t w = 0;
        bool ok = !v.empty() && v.size() <= 7;
        for (char c : v) ok = ok && c >= '0' && c <= '9';
        if (ok) {
          for (char c : v) w = w * 10 + static_cast<std::uint64_t>(c - '0');
        }
        if (!ok || w > kMaxBackendWeight) {
          groupProblem = "weight '" + clip(v) + "' is not an integer in 0.." +
                         std::to_string(kMaxBackendWeight);
        } else {
          weight = static_cast<std::uint32_t>(w);
        }
      } else if (it.key() == "mac") {
        auto m = parseMacAddress(v);
        if (!m || !isUnicastMacAddress(*m)) {
          groupProblem = "mac '" + clip(v) + "' is not a unicast MAC address";
        } else {
          mac = m;
        }
      } else if (it.key() == "encap") {
        if (v == "ipip") {
          encap = PoolEncap::IpIp;
        } else if (v == "gue") {
          encap = PoolEncap::Gue;
        } else {
          groupProblem = "encap '" + clip(v) + "' is not ipip or gue";
        }
      } else if (it.key() == "metrics") {
        std::string why;
        metrics = parseMetricsUrl(v, why);
        if (!metrics) groupProblem = "metrics '" + clip(v) + "': " + why;
      }  // other labels (Prometheus's own, __meta_*) are someone else's
    }
    const Json& targets = group["targets"];
    if (name && targets.size() > 1) {
      groupProblem = "a \"name\" label names one backend; the group lists " +
                     std::to_string(targets.size()) + " targets";
    }
    for (std::size_t t = 0; t < targets.size(); ++t) {
      const std::string at = where + " target " + std::to_string(t);
      if (!targets[t].is_string()) {
        out.error = at + ": expected a string (\"addr\" or \"addr:port\")";
        return out;
      }
      const std::string target = targets[t].get<std::string>();
      if (groupProblem) {
        out.invalid.push_back(at + " (" + clip(target) + "): " + *groupProblem);
        continue;
      }
      auto address = targetAddress(target);
      if (!address) {
        out.invalid.push_back(at + ": '" + clip(target) + "' is not an address or address:port");
        continue;
      }
      DiscoveredBackend b;
      b.address = *address;
      b.id = discoveredBackendId(*address);
      b.name = name.value_or(discoveredBackendName(*address));
      b.weight = weight;
      b.mac = mac;
      b.encap = encap;
      if (metrics) {
        if (metrics->host != *address) {
          out.invalid.push_back(at + ": metrics URL's host " + formatIpAddress(metrics->host) +
                                " is not the target's address " + formatIpAddress(*address) +
                                " (a source points the load scrape at its own backends only)");
          continue;
        }
        b.metricsPort = metrics->port;
        b.metricsPath = metrics->path;
      }
      if (!seen.insert(b.id).second) {
        out.invalid.push_back(at + ": " + formatIpAddress(*address) + " is listed twice");
        continue;
      }
      if (!names.insert(b.name).second) {
        out.invalid.push_back(at + ": the name " + b.name + " is listed twice");
        continue;
      }
      if (out.backends.size() >= maxEntries) {
        ++overCap;
        continue;
      }
      out.backends.push_back(std::move(b));
    }
  }
  if (overCap != 0) {
    out.invalid.push_back(std::to_string(overCap) + " targets beyond max_entries = " +
                          std::to_string(maxEntries) + " left out");
  }
  return out;
}

}  // namespace spillway
