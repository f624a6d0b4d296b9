// spillwayd's configuration: the TOML file parsed into a plain struct, with
// every error found (not just the first) named by file, line, column, field,
// the bad value and why.
//
// The file is declarative: [dataplane] (lcores, hash seed, flow table),
// [[port]], [[pool]], [[vip]] and [[backend]]. Names cross-reference (a VIP
// lists pool names, a backend names its pool and egress port); loading
// resolves them to indices and checks everything the snapshot builder needs to
// build an outer header for every backend, so a Config that loads can always
// be turned into a snapshot. Every key not in the reference is an error, so a
// typo never passes silently (the control-plane issue adds keys, it does not
// relax this). The reference of every key is in conf/spillway.example.toml.
//
// No TOML type appears here; toml++ stays inside config.cpp. Exceptions stay
// inside too: loadConfig() and loadConfigFromString() never throw (a toml++
// parse_error, an unreadable file and std::bad_alloc all come back as errors).
//
// Thread contract: pure functions; a Config is a value, owned by whoever loaded
// it (the control thread). A rejected load has no effect on anything.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "spillway/encap.hpp"
#include "spillway/flow_key.hpp"
#include "spillway/flow_table.hpp"
#include "spillway/icmp_rate_limit.hpp"
#include "spillway/maglev.hpp"
#include "spillway/snapshot.hpp"
#include "spillway/steering.hpp"
#include "spillway/wire.hpp"

namespace spillway {

// An IPv4 or IPv6 address; IPv4 fills the first 4 bytes, as in FlowKey.
struct IpAddress {
  IpBytes bytes{};
  IpVersion version = IpVersion::V4;

  friend bool operator==(const IpAddress&, const IpAddress&) = default;
};

// Dotted quad or RFC 4291 text (inet_pton); std::nullopt when neither.
[[nodiscard]] std::optional<IpAddress> parseIpAddress(std::string_view text);
// A DNS name: dot-separated labels of letters, digits, '-' and '_' (1..63
// characters each, 253 in all), with or without the final dot.
[[nodiscard]] bool isDnsName(std::string_view text);
// A DNS server: "192.0.2.53", "192.0.2.53:5353", "2001:db8::53" or
// "[2001:db8::53]:5353" (port 53 when none).
[[nodiscard]] std::optional<std::pair<IpAddress, std::uint16_t>> parseDnsServer(
    std::string_view text);
[[nodiscard]] std::string formatIpAddress(const IpAddress& address);
// "aa:bb:cc:dd:ee:ff" (hex digits in either case, colons only).
[[nodiscard]] std::optional<MacAddress> parseMacAddress(std::string_view text);
[[nodiscard]] std::string formatMacAddress(const MacAddress& mac);

// The default backend id: FNV-1a 64 (offset basis 0xcbf29ce484222325, prime
// 0x100000001b3) over the name's bytes. Stable across builds, compilers and
// hosts, unlike std::hash.
[[nodiscard]] constexpr std::uint64_t backendIdFromName(std::string_view name) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : name) {
    h ^= static_cast<std::uint8_t>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

inline constexpr std::uint32_t kMaxBackendWeight = 1'000'000;
inline constexpr std::uint32_t kDefaultBackendWeight = 100;
inline constexpr std::uint32_t kDefaultBurst = 32;
// The burst is at most kMaxBurst (steering.hpp): one steering pass.
inline constexpr std::uint32_t kDefaultTxDrainUs = 100;
inline constexpr std::uint32_t kMaxTxDrainUs = 1'000'000;
inline constexpr std::uint32_t kMaxIdleSleepUs = 10'000;
// As long as the longest fixed pause: a grace period or a control request
// waits at most one pause of every worker.
inline constexpr std::uint32_t kMaxIdleSleepMaxUs = kMaxIdleSleepUs;
inline constexpr std::uint32_t kMaxLcoreId = 1023;
inline constexpr std::size_t kMaxInterfaceName = 15;  // IFNAMSIZ - 1
inline constexpr std::uint16_t kMaxEgressMtu = 9702;

inline constexpr Millis kDefaultSecondChanceHoldMs = 0;  // off: it needs spillway-decap --lb
inline constexpr Millis kMaxSecondChanceHoldMs = 86'400'000;

struct DataplaneConfig {
  std::vector<std::uint32_t> lcores;  // worker lcore ids, as written
  std::uint64_t hashSeed = 0;         // FlowHasher seed; the same on every instance
  std::size_t flowCapacity = FlowTableConfig{}.capacity;  // per lcore
  std::uint32_t burst = kDefaultBurst;
  std::uint32_t txDrainUs = kDefaultTxDrainUs;
  std::uint32_t idleSleepUs = 0;     // 0: workers poll without pause
  std::uint32_t idleSleepMaxUs = 0;  // 0: the pause stays idleSleepUs
  FlowTimeouts timeouts{};
  IcmpRateLimits icmpLimits{};  // [dataplane.icmp_limits], per worker
  // How long a Maglev slot that changed owner remembers its previous owner
  // for second chance (snapshot.hpp, ARCHITECTURE.md); 0: no second chance.
  Millis secondChanceHoldMs = kDefaultSecondChanceHoldMs;
};

enum class PortRole : std::uint8_t {
  OneArmed,  // clients arrive and backends are reached through this port
  Client,    // two-armed: clients arrive here
  Backend,   // two-armed: backends are reached through here
};

enum class ExceptionMode : std::uint8_t {
  None,  // no exception path (af_packet / af_xdp: the kernel keeps the NIC)
  Tap,   // a tap interface stands for the port in the kernel
};

struct PortConfig {
  std::string name;
  std::string devargs;  // PCI address or DPDK vdev string
  PortRole role = PortRole::OneArmed;
  std::optional<IpAddress> address;   // IPv4 tunnel source
  std::optional<IpAddress> address6;  // IPv6 tunnel source
  std::uint16_t mtu = kDefaultEgressMtu;
  std::optional<std::uint16_t> vlan;  // egress 802.1Q VLAN id (1..4094)
  std::optional<MacAddress> nextHopMac;
  // Where backends' MACs are looked up; empty when none. Defaults to the
  // exception tap's name, else the iface= of an af_packet / af_xdp vdev.
  std::string kernelInterface;
  ExceptionMode exception = ExceptionMode::None;
  std::string exceptionName;  // the tap's name when exception is Tap
  std::optional<MacAddress> mac;
};

enum class PoolSite : std::uint8_t { OnPrem, Cloud };
// Which priority levels choose a preferred region by latency ([policy]
// latency_regions): levels of two or more pools that are all cloud pools,
// every level of two or more pools, or none.
enum class LatencyRegions : std::uint8_t { Cloud, All, Off };
enum class PoolEncap : std::uint8_t { IpIp, Gue };

// How the control thread checks a backend of the pool ([pool.health]).
// Defaults depend on the site: on-prem detects a dead backend within 1 s
// (interval 200 ms, fall 3, timeout 150 ms); cloud tolerates WAN RTT and
// jitter (interval 1 s, timeout 500 ms, fall 3), so a 60 ms +- 30 ms link
// does not flap.
enum class HealthCheckKind : std::uint8_t {
  None,   // never checked: always healthy
  Tcp,    // TCP connect to address:port
  Http,   // HTTP/1.1 GET path, status must equal expectStatus
  Encap,  // a probe through the encapsulation path: the backend must decapsulate
          // and answer for the VIP (TCP SYN to vip:port inside the tunnel)
};

struct HealthCheckConfig {
  HealthCheckKind kind = HealthCheckKind::Tcp;
  std::uint16_t port = 0;  // required unless kind is None
  std::string httpPath = "/health";
  std::uint16_t expectStatus = 200;
  Millis interval = 200;
  Millis timeout = 150;
  std::uint32_t rise = 2;  // consecutive successes to become healthy
  std::uint32_t fall = 3;  // consecutive failures to become unhealthy
};

// Where a backend's load comes from ([pool.load]): its Prometheus text
// endpoint, e.g. the DCGM exporter (port 9400, DCGM_FI_DEV_GPU_UTIL, averaged
// over the host's GPUs) and a queue-depth gauge (vLLM's
// vllm:num_requests_waiting, Triton's nv_inference_pending_request_count).
struct LoadSourceConfig {
  bool enabled = false;
  std::uint16_t port = 9400;
  std::string path = "/metrics";
  std::string gpuMetric = "DCGM_FI_DEV_GPU_UTIL";
  std::string queueMetric;  // empty: no queue signal
  Millis interval = 1000;
  Millis timeout = 500;
  Millis staleAfter = 5000;  // older samples are ignored (load unknown = neutral)
  double smoothing = 0.3;    // EWMA weight of the newest sample, (0, 1]
};

// Where a backend says which connections it holds ([pool.connections]):
// spillway-decap's agent (`spillway-decap agent`), whose
// spillway_backend_connections{vip} lines judge this backend's drains
// (ARCHITECTURE.md, "Drains judged by the backend"). A drain completes once
// the backend has reported zero connections over the VIPs it serves for
// `grace` without a break (or at once when this instance's own count is zero
// too); never while it reports any. Without a fresh report the instance's own
// flow count decides, as without an agent.
struct ConnSourceConfig {
  bool enabled = false;
  std::uint16_t port = 9411;
  std::string path = "/metrics";
  Millis interval = 1000;
  Millis timeout = 500;
  Millis staleAfter = 3000;  // an older report is no report (the own count decides)
  Millis grace = 2000;       // zeros held this long outvote this instance's own count
  // Start-up rebuild of flow exceptions from the agents' connection lists
  // (control/health/conn_rebuild.hpp): with a token, every start asks each
  // backend of the pool for GET list_path with `Authorization: Bearer TOKEN`.
  std::string tokenFile;  // "" = no list, no rebuild
  std::string token;      // the file's contents (never dumped)
  std::string listPath = "/connections";
  bool rebuild = false;          // true by default once token_file is set
  Millis rebuildTimeout = 2000;  // one backend's answer, at most kConnRebuildLimit
};
// The whole start-up rebuild ends by then, answered or not: the bound on how
// long unanswering backends delay the announcement.
inline constexpr Millis kConnRebuildLimit = 10'000;
// Backends that a source publishes for a pool ([[pool]] discovery = {...};
// control/discovery/): a Prometheus file_sd JSON file watched with inotify,
// or a DNS name (A, AAAA or SRV) re-resolved by its TTL. A backend absent
// from the source for `hold` drains like a `backend remove`; the operator's
// drain, disable and remove win.
enum class DiscoveryKind : std::uint8_t { None, File, Dns };
enum class DnsRecordType : std::uint8_t { A, Aaaa, Srv };
struct DiscoveryConfig {
  DiscoveryKind kind = DiscoveryKind::None;
  std::string path;                     // file: the file_sd JSON file
  Millis hold = 5000;                   // absent this long before it drains
  std::uint32_t maxEntries = 256;       // entries read from the source, at most
  std::uint32_t maxPoolBackends = 512;  // backends of the pool (all origins) it may grow to
  std::uint64_t maxFileBytes = 1U << 20;
  // dns: the name, its record type (SRV targets are resolved with
  // targetType), the server (none: the system's resolvers), and the bounds
  // the answer's TTL is clamped to; a query unanswered for `timeout` fails.
  std::string dnsName;
  DnsRecordType dnsType = DnsRecordType::A;
  DnsRecordType targetType = DnsRecordType::A;
  std::optional<IpAddress> server;
  std::uint16_t serverPort = 53;
  Millis minTtl = 5000;
  Millis maxTtl = 300'000;
  Millis timeout = 2000;
  bool operator==(const DiscoveryConfig&) const = default;
};
inline constexpr std::uint32_t kMaxDiscoveryEntries = 4096;
inline constexpr std::uint64_t kMaxDiscoveryFileBytes = 16U << 20;

struct PoolConfig {
  std::string name;
  PoolSite site = PoolSite::OnPrem;
  std::uint32_t priority = 0;  // 0 first
  PoolEncap encap = PoolEncap::IpIp;
  std::uint16_t guePort = kGueDefaultPort;
  HealthCheckConfig health{};
  LoadSourceConfig load{};
  ConnSourceConfig connections{};
  DiscoveryConfig discovery{};
};

// Spillover and weight policy ([policy]); the formula is in the README's
// configuration reference.
struct PolicyConfig {
  double gpuHigh = 90.0;  // % GPU utilisation: saturated above
  double gpuLow = 75.0;   // ... and no longer saturated below (hysteresis)
  double queueHigh = 16.0;
  double queueLow = 4.0;
  double overprovisioning = 1.4;  // Envoy's overprovisioning factor
  double panicThreshold = 0.5;    // healthy capacity share below which panic mode spreads
  double minLoadFactor = 0.1;     // a saturated backend keeps at least this share of its weight
  // The load factor is rounded to this grid (0: off) and held at its grid
  // point until the raw factor moves past the cell's edge by
  // loadFactorHysteresis steps, so instances that read slightly different
  // load publish the same weights (policy.hpp, "Quantisation").
  double loadFactorStep = 0.04;
  double loadFactorHysteresis = 0.45;
  double churnBudget = 0.05;  // at most this share of a table's entries moves per interval
  Millis churnInterval = 1000;
  Millis drainTimeout = 300'000;  // a draining backend's flows are cut (FAILED) after this

  // Latency (policy.hpp, "Latency"): the health probes' SRTT + 4 * RTTVAR
  // per backend, judged once per window (Unix time / latencyWindow, so the
  // instances of a tier count the same windows).
  LatencyRegions latencyRegions = LatencyRegions::Cloud;
  Millis latencyWindow = 1000;  // unset: max(1 s, churn_interval)
  // A region level switches its preferred region only to one better by
  // max(regionSwitchMargin x preferred's latency, regionSwitchMarginMs) in
  // regionSwitchWindows consecutive windows.
  double regionSwitchMargin = 0.2;
  double regionSwitchMarginMs = 10.0;
  std::uint32_t regionSwitchWindows = 10;
  // Degraded: latency above a bound (absolute ms, or factor x the median of
  // its pool's other Active backends and at least degradedLatencyMinMs) for
  // degradedWindows windows; 0 turns a bound off.
  double degradedLatencyMs = 0.0;
  double degradedLatencyFactor = 3.0;
  double degradedLatencyMinMs = 20.0;
  std::uint32_t degradedWindows = 5;
  double degradedWeight = 0.25;       // weight multiplier of a degraded backend, (0, 1]
  double degradedMaxFraction = 0.5;   // at most floor(this x backends) of a pool degraded
  double degradedRestoreStep = 0.25;  // the multiplier climbs back by this per window
};

// The operator interfaces ([control]).
struct ControlConfig {
  std::string socketPath = "/run/spillway/spillway.sock";
  std::string socketGroup;                       // empty: the daemon's group; mode is 0660
  std::string metricsListen = "127.0.0.1:9550";  // empty: no metrics endpoint
  std::size_t eventLogSize = 4096;
  // Where spillwayd keeps what must outlive the process: the operator-intent
  // journal, the flow-exception checkpoint and the last published weights.
  // Absolute; "" keeps nothing (every start is a fresh start).
  std::string stateDir = "/var/lib/spillway";
  // After start-up (EAL, ports, sockets), spillwayd started as root runs as
  // this user with only the capabilities it still needs (spillwayd/privileges.hpp).
  // "" stays root. Start-up only: a reload keeps the running one.
  std::string user;
};

// BGP announcement of the VIPs ([announce]; control/announcer.hpp): a TAP
// device owned by the process carries one host route per announced VIP, which
// the local speaker (FRR's zebra + bgpd) redistributes.
struct AnnounceConfig {
  bool enabled = false;
  std::string device = "spillway0";  // created at start, gone with the process
  Millis periodMs = 20;              // the announcer thread's timer
  Millis stallMs = 200;              // a worker round counter frozen this long withdraws
  Millis controlStallMs = 1000;      // the control loop's heartbeat frozen this long withdraws
  Millis holdDownMs = 1000;          // an automatic withdrawal's cause must stay clear this long
  Millis withdrawGraceMs = 1000;     // SIGTERM: withdrawn, forwarding this long, then stop
  Millis freezeMs = 1000;  // no announcer round this long: the freeze guard sets the device down
};

// The LB tier's peer channel ([tier], peer_channel.hpp): the instances this
// one shares its flow exceptions with. No peers: no channel.
struct TierPeerConfig {
  std::string name;
  std::string address;  // "192.0.2.2:9560", "[2001:db8::2]:9560"
};

struct TierConfig {
  std::string node;    // this instance's name, as its peers list it
  std::string listen;  // "address:port" the peers connect to
  std::vector<TierPeerConfig> peers;
  std::string secretFile;
  std::string secret;          // the file's bytes, read when the configuration is loaded
  Millis syncInterval = 1000;  // exceptions are exported (and sent) at least this often
  Millis holdTime = 600'000;   // a disconnected peer's exceptions are kept this long
  // Make-before-break: a step that moves table entries waits at most this
  // long for its exceptions to reach the peers before it is published
  // anyway (0: published at once, as without peers).
  Millis makeBeforeBreak = 500;
  std::size_t maxRecordsPerPeer = 1'000'000;
  std::size_t maxOutputBytes = std::size_t{16} << 20;  // per peer; past it: disconnect, resync
};

// How a VIP places new TCP connections: by its Maglev table alone, or by
// bytes (spillway/placement.hpp: bounded loads over the table's entries).
enum class VipPlacementMode : std::uint8_t { Table, Bytes };

// Load-aware placement ([placement]; the rule is in the README's
// configuration reference and spillway/placement.hpp).
struct PlacementConfig {
  double balanceFactor = 1.25;   // f: a backend takes at most f x its share of the load
  std::uint32_t candidates = 8;  // distinct backends of the table looked at, at most
  Millis rateInterval = 100;     // per-backend byte rates are sampled this often
  Millis rateSmoothing = 1000;   // ... and smoothed with this time constant
};

struct VipConfig {
  std::string name;
  IpAddress address;
  IpProto protocol = IpProto::Tcp;
  std::uint16_t port = 0;  // 0 = all ports
  std::uint32_t tableSize = kMaglevDefaultTableSize;
  std::vector<std::string> pools;
  std::vector<std::uint32_t> poolIndices;  // into Config::pools, same order
  bool answerPing = false;
  VipPlacementMode placement = VipPlacementMode::Table;
};

struct BackendConfig {
  std::string name;
  std::uint64_t id = 0;  // `id`, or backendIdFromName(name)
  IpAddress address;
  std::string pool;
  std::uint32_t poolIndex = 0;  // into Config::pools
  std::uint32_t weight = kDefaultBackendWeight;
  std::optional<MacAddress> mac;  // next-hop override
  std::string port;
  std::uint32_t portIndex = 0;                       // into Config::ports
  BackendState initialState = BackendState::Active;  // Active or Disabled
  // Where its pool's load scrape ([pool.load]) reads it, when not at the
  // pool's port and path: a discovered backend's "metrics" label.
  std::optional<std::uint16_t> metricsPort;
  std::string metricsPath;
};

struct Config {
  DataplaneConfig dataplane;
  ControlConfig control;
  TierConfig tier;
  PolicyConfig policy;
  AnnounceConfig announce;
  PlacementConfig placement;
  std::vector<PortConfig> ports;
  std::vector<PoolConfig> pools;
  std::vector<VipConfig> vips;
  std::vector<BackendConfig> backends;
};

// The checks a [[backend]] gets, shared with backends added at run time
// (`backend add`): a name fit for the CLI and metric labels, a unicast MAC,
// and an address a backend can have in `c` (unicast, not loopback, not a
// VIP's, not one of this gateway's own port addresses). nullopt when fine,
// else what is wrong.
[[nodiscard]] std::optional<std::string> backendNameProblem(std::string_view name);
[[nodiscard]] bool isUnicastMacAddress(const MacAddress& m);
[[nodiscard]] std::optional<std::string> backendAddressProblem(const Config& c, const IpAddress& a);

// The outer header kind for a backend of `pool` at `backend`'s address family.
[[nodiscard]] constexpr EncapKind encapKindFor(PoolEncap encap, IpVersion backend) noexcept {
  if (encap == PoolEncap::Gue) return backend == IpVersion::V4 ? EncapKind::Gue4 : EncapKind::Gue6;
  return backend == IpVersion::V4 ? EncapKind::IpInIp4 : EncapKind::IpInIp6;
}

struct ConfigError {
  std::string file;
  std::uint32_t line = 0;    // 1-based; 0 when the error has no place (unreadable file)
  std::uint32_t column = 0;  // 1-based; 0 likewise
  std::string field;         // "vip[0].table_size"; empty for a syntax error
  std::string value;         // the value as written; empty when missing
  std::string message;       // why, and what to do
};

// One line per error: "file:line:column: field = value: message".
[[nodiscard]] std::string formatError(const ConfigError& error);
[[nodiscard]] std::string formatErrors(const std::vector<ConfigError>& errors);

class ConfigResult {
 public:
  explicit ConfigResult(Config config) : config_(std::move(config)) {}
  explicit ConfigResult(std::vector<ConfigError> errors) : errors_(std::move(errors)) {}

  [[nodiscard]] bool ok() const noexcept { return config_.has_value(); }
  explicit operator bool() const noexcept { return ok(); }
  // value() on a rejected load throws std::bad_optional_access.
  [[nodiscard]] const Config& value() const& { return config_.value(); }
  [[nodiscard]] Config&& value() && { return std::move(config_).value(); }
  // Empty when ok().
  [[nodiscard]] const std::vector<ConfigError>& errors() const noexcept { return errors_; }

 private:
  std::optional<Config> config_;
  std::vector<ConfigError> errors_;
};

// The largest configuration file loadConfig() reads.
inline constexpr std::size_t kMaxConfigBytes = std::size_t{4} << 20;

// Reads and validates the file; errors name it as `path` was given. Only a
// regular file of at most kMaxConfigBytes is read, opened with O_NONBLOCK, so
// a FIFO, a device or /dev/zero is a clear error, never a block or an OOM.
[[nodiscard]] ConfigResult loadConfig(const std::string& path) noexcept;
// The same from text; `name` stands for the file in errors.
[[nodiscard]] ConfigResult loadConfigFromString(std::string_view text,
                                                std::string_view name) noexcept;

[[nodiscard]] std::string_view toString(PortRole role) noexcept;
[[nodiscard]] std::string_view toString(ExceptionMode mode) noexcept;
[[nodiscard]] std::string_view toString(PoolSite site) noexcept;
[[nodiscard]] std::string_view toString(LatencyRegions regions) noexcept;
[[nodiscard]] std::string_view toString(PoolEncap encap) noexcept;
[[nodiscard]] std::string_view toString(HealthCheckKind kind) noexcept;

}  // namespace spillway
