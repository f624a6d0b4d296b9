// The Prometheus file_sd format as a backend list: a JSON array of target
// groups, each {"targets": ["addr" | "addr:port" | "[v6]:port", ...],
// "labels": {"name": ..., "weight": ..., "mac": ..., "encap": ..., "metrics": ...}}.
// What any tool can
// write (a Kubernetes or Consul controller, a cloud's autoscaling hook);
// file_source.hpp watches the file, membership.hpp damps what it says.
//
// Parsing only checks what the text alone can tell (syntax, address, weight,
// MAC, name, duplicates inside the file); whether an address may be a
// backend of this gateway (not a VIP, not its own) is the plane's check, the
// one `backend add` gets. A file that is not valid JSON, or not of this
// shape, is refused whole with its line and column; an entry that is wrong
// is left out and reported, the others stand.
//
// Thread contract: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "control/config/config.hpp"

namespace spillway {

struct DiscoveredBackend {
  std::uint64_t id = 0;  // discoveredBackendId(address): the same on every instance
  std::string name;      // the "name" label, or derived from the address
  IpAddress address;
  std::uint32_t weight = kDefaultBackendWeight;
  std::optional<MacAddress> mac;
  // The "encap" label ("ipip", "gue"): what the backend decapsulates. The
  // encapsulation is its pool's; the plane refuses an entry that differs.
  std::optional<PoolEncap> encap;
  // The "metrics" label, http://ADDRESS[:PORT][/PATH] at the target's own
  // address: where the pool's load scrape reads this backend (instead of
  // [pool.load]'s port and path). A URL at another host is refused: a
  // source points scrapes at its own backends only.
  std::optional<std::uint16_t> metricsPort;
  std::string metricsPath;
  bool operator==(const DiscoveredBackend&) const = default;
};

// A discovered backend's id: FNV-1a over "discovered " + the canonical
// address (the port of "addr:port" does not take part: the tunnel goes to
// the address). Every instance reading the same source gets the same ids.
[[nodiscard]] std::uint64_t discoveredBackendId(const IpAddress& address);
// "d-10-0-0-5", "d-2001-db8--5": a name fit for the CLI and metric labels.
[[nodiscard]] std::string discoveredBackendName(const IpAddress& address);

struct FileSdParse {
  std::optional<std::string> error;  // the file refused whole: why, with line:column
  std::vector<DiscoveredBackend> backends;
  std::vector<std::string> invalid;  // entries left out, and why
};

// maxEntries: targets beyond it are left out (each reported once as a count).
[[nodiscard]] FileSdParse parseFileSd(std::string_view text, std::uint32_t maxEntries);

// A "metrics" label: http://HOST[:PORT][/PATH] (port 80 and path "/" by
// default; HOST an address, IPv6 in brackets; the path printable, at most
// kMaxMetricsPathBytes). nullopt and why in `error` when it is not one.
struct MetricsUrl {
  IpAddress host;
  std::uint16_t port = 80;
  std::string path = "/";
};
inline constexpr std::size_t kMaxMetricsPathBytes = 256;
[[nodiscard]] std::optional<MetricsUrl> parseMetricsUrl(std::string_view url, std::string& error);
[[nodiscard]] std::string formatMetricsUrl(const IpAddress& host, std::uint16_t port,
                                           std::string_view path);

}  // namespace spillway
