// Configuration loading: the example file, defaults, both address families,
// hex seeds and ids, and the corpus of invalid files with the message and line
// each must produce.
#include "control/config/config.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "estate_fixture.hpp"

namespace spillway {
namespace {

namespace fs = std::filesystem;

const std::string kRoot = SPILLWAY_SOURCE_ROOT;
const std::string kData = kRoot + "/tests/data/config";

Config mustLoad(const std::string& path) {
  ConfigResult r = loadConfig(path);
  EXPECT_TRUE(r.ok()) << formatErrors(r.errors());
  if (!r.ok()) return Config{};
  return std::move(r).value();
}

IpAddress ip(const char* text) {
  auto a = parseIpAddress(text);
  EXPECT_TRUE(a.has_value()) << text;
  return a.value_or(IpAddress{});
}

TEST(Config, ExampleParses) {
  const Config c = mustLoad(kRoot + "/conf/spillway.example.toml");
  EXPECT_EQ(c.dataplane.lcores, (std::vector<std::uint32_t>{1, 2, 3, 4}));
  EXPECT_EQ(c.dataplane.hashSeed, 0x9c4f1d2e7b3a5860ULL);
  ASSERT_EQ(c.ports.size(), 1u);
  EXPECT_EQ(c.ports[0].exception, ExceptionMode::Tap);
  EXPECT_EQ(c.ports[0].exceptionName, "sw-wan0");
  EXPECT_EQ(c.ports[0].kernelInterface, "sw-wan0");  // defaults to the tap
  EXPECT_EQ(c.ports[0].address, ip("198.51.100.2"));
  EXPECT_EQ(c.ports[0].address6, ip("2001:db8:100::2"));

  ASSERT_EQ(c.pools.size(), 2u);
  EXPECT_EQ(c.pools[0].site, PoolSite::OnPrem);
  EXPECT_EQ(c.pools[0].encap, PoolEncap::IpIp);
  EXPECT_EQ(c.pools[1].site, PoolSite::Cloud);
  EXPECT_EQ(c.pools[1].encap, PoolEncap::Gue);
  EXPECT_EQ(c.pools[1].priority, 1u);

  ASSERT_EQ(c.vips.size(), 3u);
  EXPECT_EQ(c.vips[0].name, "nccl");
  EXPECT_EQ(c.vips[0].port, 0);
  EXPECT_TRUE(c.vips[0].answerPing);
  EXPECT_EQ(c.vips[1].port, 50051);
  EXPECT_EQ(c.vips[2].address.version, IpVersion::V6);
  for (const VipConfig& v : c.vips) {
    EXPECT_EQ(v.protocol, IpProto::Tcp);
    EXPECT_EQ(v.poolIndices, (std::vector<std::uint32_t>{0, 1}));
  }

  ASSERT_EQ(c.backends.size(), 5u);
  std::size_t onprem = 0;
  for (const BackendConfig& b : c.backends) {
    EXPECT_EQ(b.id, backendIdFromName(b.name));
    onprem += b.poolIndex == 0 ? 1 : 0;
  }
  EXPECT_EQ(onprem, 3u);
  EXPECT_EQ(c.backends[2].weight, 50u);
  EXPECT_TRUE(c.backends[3].mac.has_value());
  EXPECT_EQ(c.backends[4].address.version, IpVersion::V6);
  EXPECT_EQ(c.backends[4].initialState, BackendState::Disabled);

  const HealthCheckConfig& h0 = c.pools[0].health;
  EXPECT_EQ(h0.kind, HealthCheckKind::Http);
  EXPECT_EQ(h0.port, 8000);
  EXPECT_EQ(h0.httpPath, "/health");
  EXPECT_EQ(h0.interval, 200u);
  EXPECT_EQ(h0.timeout, 150u);
  const HealthCheckConfig& h1 = c.pools[1].health;
  EXPECT_EQ(h1.kind, HealthCheckKind::Tcp);
  EXPECT_EQ(h1.interval, 1000u);  // the cloud defaults
  EXPECT_EQ(h1.timeout, 500u);
  EXPECT_TRUE(c.pools[0].load.enabled);
  EXPECT_EQ(c.pools[0].load.gpuMetric, "DCGM_FI_DEV_GPU_UTIL");
  EXPECT_EQ(c.pools[1].load.queueMetric, "vllm:num_requests_waiting");
  EXPECT_EQ(c.policy.drainTimeout, 300'000u);
  EXPECT_EQ(c.control.socketGroup, "spillway");
}

TEST(Config, EveryValidFixtureLoads) {
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(kData + "/valid")) {
    if (e.path().extension() != ".toml") continue;
    ConfigResult r = loadConfig(e.path().string());
    EXPECT_TRUE(r.ok()) << formatErrors(r.errors());
    ++n;
  }
  EXPECT_GE(n, 3u);
}

TEST(Config, Defaults) {
  const Config c = mustLoad(kData + "/valid/minimal.toml");
  const DataplaneConfig& d = c.dataplane;
  EXPECT_EQ(d.lcores, std::vector<std::uint32_t>{1});
  EXPECT_EQ(d.hashSeed, 42u);
  EXPECT_EQ(d.flowCapacity, std::size_t{1} << 20);
  EXPECT_EQ(d.burst, 32u);
  EXPECT_EQ(d.txDrainUs, 100u);
  EXPECT_EQ(d.idleSleepUs, 0u);
  EXPECT_EQ(d.idleSleepMaxUs, 0u);
  EXPECT_EQ(d.secondChanceHoldMs, 0u) << "second chance is off unless asked for";
  const FlowTimeouts t{};
  EXPECT_EQ(d.timeouts.embryonic, t.embryonic);
  EXPECT_EQ(d.timeouts.established, t.established);
  EXPECT_EQ(d.timeouts.closing, t.closing);
  EXPECT_EQ(d.timeouts.udp, t.udp);
  EXPECT_EQ(d.timeouts.other, t.other);

  const PortConfig& p = c.ports.at(0);
  EXPECT_EQ(p.role, PortRole::OneArmed);
  EXPECT_EQ(p.mtu, 1500);
  EXPECT_FALSE(p.vlan);
  EXPECT_FALSE(p.address6);
  EXPECT_FALSE(p.mac);
  EXPECT_EQ(p.exception, ExceptionMode::None);
  EXPECT_EQ(p.exceptionName, "");
  EXPECT_EQ(p.kernelInterface, "");  // net_null has no kernel side
  EXPECT_EQ(p.nextHopMac, parseMacAddress("02:00:00:00:00:01"));

  const PoolConfig& pool = c.pools.at(0);
  EXPECT_EQ(pool.priority, 0u);
  EXPECT_EQ(pool.encap, PoolEncap::IpIp);
  EXPECT_EQ(pool.guePort, 6080);

  const VipConfig& v = c.vips.at(0);
  EXPECT_EQ(v.port, 0);
  EXPECT_EQ(v.tableSize, 65537u);
  EXPECT_FALSE(v.answerPing);

  const BackendConfig& b = c.backends.at(0);
  EXPECT_EQ(b.id, backendIdFromName("b1"));
  EXPECT_EQ(b.weight, 100u);
  EXPECT_EQ(b.portIndex, 0u);
  EXPECT_EQ(b.port, "p0");
  EXPECT_EQ(b.initialState, BackendState::Active);
  EXPECT_FALSE(b.mac);
}

TEST(Config, ControlPlaneDefaults) {
  const Config c = mustLoad(kData + "/valid/minimal.toml");
  // No [pool.health]: never checked, with the site's timings for display.
  const HealthCheckConfig& h = c.pools.at(0).health;
  EXPECT_EQ(h.kind, HealthCheckKind::None);
  EXPECT_EQ(h.interval, 200u);
  EXPECT_EQ(h.timeout, 150u);
  EXPECT_EQ(h.rise, 2u);
  EXPECT_EQ(h.fall, 3u);
  EXPECT_EQ(h.httpPath, "/health");
  EXPECT_EQ(h.expectStatus, 200);
  // No [pool.load]: no load feedback.
  const LoadSourceConfig& l = c.pools.at(0).load;
  EXPECT_FALSE(l.enabled);
  EXPECT_EQ(l.port, 9400);
  EXPECT_EQ(l.gpuMetric, "DCGM_FI_DEV_GPU_UTIL");
  const PolicyConfig p{};
  EXPECT_EQ(c.policy.gpuHigh, p.gpuHigh);
  EXPECT_EQ(c.policy.gpuLow, p.gpuLow);
  EXPECT_EQ(c.policy.queueHigh, p.queueHigh);
  EXPECT_EQ(c.policy.queueLow, p.queueLow);
  EXPECT_EQ(c.policy.overprovisioning, 1.4);
  EXPECT_EQ(c.policy.panicThreshold, 0.5);
  EXPECT_EQ(c.policy.minLoadFactor, 0.1);
  EXPECT_EQ(c.policy.loadFactorStep, 0.04);
  EXPECT_EQ(c.policy.loadFactorHysteresis, 0.45);
  EXPECT_EQ(c.policy.churnBudget, 0.05);
  EXPECT_EQ(c.policy.churnInterval, 1000u);
  EXPECT_EQ(c.policy.drainTimeout, 300'000u);
  EXPECT_EQ(c.control.socketPath, "/run/spillway/spillway.sock");
  EXPECT_EQ(c.control.socketGroup, "");
  EXPECT_EQ(c.control.metricsListen, "127.0.0.1:9550");
  EXPECT_EQ(c.control.eventLogSize, 4096u);
}

TEST(Config, HexSeedIdsAndBothFamilies) {
  const Config c = mustLoad(kData + "/valid/dual_stack.toml");
  EXPECT_EQ(c.dataplane.hashSeed, 0xffffffffffffffffULL);
  EXPECT_EQ(c.dataplane.flowCapacity, 4096u);
  EXPECT_EQ(c.dataplane.burst, 64u);
  EXPECT_EQ(c.dataplane.txDrainUs, 0u);
  EXPECT_EQ(c.dataplane.idleSleepUs, 50u);
  EXPECT_EQ(c.dataplane.idleSleepMaxUs, 3200u);
  EXPECT_EQ(c.dataplane.secondChanceHoldMs, 2500u);
  EXPECT_EQ(c.dataplane.timeouts.embryonic, 2500u);
  EXPECT_EQ(c.dataplane.timeouts.established, 86'400'000u);
  EXPECT_EQ(c.dataplane.timeouts.udp, 30'000u);
  EXPECT_EQ(c.dataplane.timeouts.closing, FlowTimeouts{}.closing);

  const PortConfig& p = c.ports.at(0);
  EXPECT_EQ(p.kernelInterface, "veth-lb");  // from iface= of net_af_packet
  EXPECT_EQ(p.vlan, 42);
  EXPECT_EQ(p.mtu, 9000);
  EXPECT_EQ(p.address, ip("10.0.0.1"));
  EXPECT_EQ(p.address6, ip("fd00::1"));

  EXPECT_EQ(c.pools.at(1).guePort, 7777);
  EXPECT_EQ(c.vips.at(0).protocol, IpProto::Udp);
  EXPECT_EQ(c.vips.at(0).tableSize, 13u);
  EXPECT_EQ(c.vips.at(1).address, ip("2001:db8::1"));

  ASSERT_EQ(c.backends.size(), 4u);
  EXPECT_EQ(c.backends[0].id, 7u);
  EXPECT_EQ(c.backends[1].id, 0xfedcba9876543210ULL);
  EXPECT_EQ(c.backends[1].address.version, IpVersion::V6);
  EXPECT_EQ(c.backends[1].weight, 0u);
  EXPECT_EQ(c.backends[2].mac, parseMacAddress("02:aa:bb:cc:dd:ee"));
  EXPECT_EQ(c.backends[2].initialState, BackendState::Disabled);
  EXPECT_EQ(c.backends[3].weight, kMaxBackendWeight);
  EXPECT_EQ(encapKindFor(c.pools[0].encap, IpVersion::V6), EncapKind::IpInIp6);
  EXPECT_EQ(encapKindFor(c.pools[1].encap, IpVersion::V4), EncapKind::Gue4);
}

TEST(Config, TwoArmedDefaultEgressIsTheBackendArm) {
  const Config c = mustLoad(kData + "/valid/two_armed.toml");
  ASSERT_EQ(c.ports.size(), 2u);
  EXPECT_EQ(c.ports[0].role, PortRole::Client);
  EXPECT_EQ(c.ports[1].exceptionName, "sw-back");
  EXPECT_EQ(c.ports[1].kernelInterface, "sw-back");
  EXPECT_EQ(c.backends.at(0).portIndex, 1u);
}

// Every file in invalid/ with the line and a substring of the message that
// loading it must report.
struct Invalid {
  const char* file;
  std::uint32_t line;
  const char* expect;
};

const Invalid kInvalid[] = {
    {"backend_address_loopback", 24,
     "backend[0].address = \"127.0.0.1\": a loopback address; a backend is reached through a "
     "port"},
    {"backend_address_own", 24,
     "backend[0].address = \"10.0.0.1\": this gateway's own address (port p0)"},
    {"backend_address_vip", 24, "backend[0].address = \"192.0.2.1\": the address of VIP v"},
    {"backend_on_client_port", 34, "backend[0].port = \"p0\": port \"p0\" has role \"client\""},
    {"backend_unknown_pool", 25, "backend[0].pool = \"b\": no such pool; pools are a"},
    {"backend_unknown_port", 26, "backend[0].port = \"p9\": no such port"},
    {"bad_devargs", 8, "port[0].devargs = \"eth0\": neither a PCI address"},
    {"bad_mac", 10, "port[0].next_hop_mac = \"02:00:00:00:01\": not a MAC address"},
    {"bad_name", 17, "vip[0].name = \"my vip\": may hold only"},
    {"bad_protocol", 19, "vip[0].protocol = \"sctp\": must be one of \"tcp\", \"udp\""},
    {"bad_site", 14, "pool[0].site = \"edge\": must be one of \"onprem\", \"cloud\""},
    {"bad_state", 26, "backend[0].state = \"draining\": must be one of \"active\", \"disabled\""},
    {"bad_vip_address", 18, "vip[0].address = \"192.0.2.300\": not an IPv4 or IPv6 address"},
    {"control_bad_group", 29, "control.socket_group = \"gpu ops\": not a group name"},
    {"control_event_log_size_small", 29,
     "control.event_log_size = 8: out of range; must be in [16, 1048576]"},
    {"control_metrics_listen_hostname", 29,
     "control.metrics_listen = \"localhost:9550\": expected \"address:port\""},
    {"control_socket_relative", 29, "control.socket = \"spillway.sock\": must be an absolute path"},
    {"dataplane_idle_sleep_max_alone", 5,
     "dataplane.idle_sleep_max_us = 2000: needs idle_sleep_us (the first pause) above 0"},
    {"dataplane_idle_sleep_max_below_min", 6,
     "dataplane.idle_sleep_max_us = 200: below idle_sleep_us = 500"},
    {"dataplane_second_chance_hold_too_long", 5,
     "dataplane.second_chance_hold_ms = 86400001: out of range; must be in [0, 86400000]"},
    {"dataplane_idle_sleep_max_too_long", 6,
     "dataplane.idle_sleep_max_us = 20000: out of range; must be in [0, 10000]"},
    {"dataplane_idle_sleep_too_long", 5,
     "dataplane.idle_sleep_us = 20000: out of range; must be in [0, 10000]"},
    {"dataplane_missing", 1, "dataplane: missing"},
    {"duplicate_backend_address", 29,
     "backend[1].address = \"10.0.0.11\": the same address as "
     "backend[0] (line 22)"},
    {"duplicate_backend_id", 30, "backend[1].id = \"0x5\": duplicate backend id 0x5"},
    {"duplicate_backend_name", 28, "backend[1].name = \"b1\": duplicate backend name"},
    {"duplicate_devargs", 14, "port[1].devargs = \"net_null0\": the same device as port[0]"},
    {"duplicate_key", 20, "TOML: "},
    {"duplicate_pool", 17, "pool[1].name = \"a\": duplicate pool name"},
    {"duplicate_vip", 24, "the same address, protocol and port as vip[0] (line 16)"},
    {"gue_port_on_ipip", 15, "pool[0].gue_port = 6081: set, but encap is not \"gue\""},
    {"hash_seed_bad_hex", 4, "dataplane.hash_seed = \"0x5eedzz\": expected an integer or a hex"},
    {"hash_seed_missing", 2, "dataplane.hash_seed: missing; set a secret 64-bit seed"},
    {"hash_seed_negative", 4, "dataplane.hash_seed = -42: must not be negative"},
    {"health_bad_kind", 17,
     "pool[0].health.kind = \"icmp\": must be one of \"tcp\", \"http\", \"encap\", \"none\""},
    {"health_interval_below_default_timeout", 18,
     "pool[0].health.interval = 0.5: must be longer than timeout (0.5 s, the cloud default)"},
    {"health_interval_ms", 18,
     "pool[0].health.interval_ms = 200: unknown key; durations are in seconds: write "
     "interval = 0.2"},
    {"health_path_on_tcp", 19,
     "pool[0].health.path = \"/health\": set, but kind is \"tcp\", not \"http\""},
    {"health_port_missing", 16,
     "pool[0].health.port: missing; kind \"http\" needs the backend port to probe"},
    {"health_port_on_none", 18,
     "pool[0].health.port = 8080: set, but kind is \"none\" (never checked)"},
    {"health_rise_zero", 18, "pool[0].health.rise = 0: out of range; must be in [1, 100]"},
    {"health_timeout_not_below_interval", 19,
     "pool[0].health.timeout = 0.2: must be shorter than interval (0.2 s)"},
    {"lcores_empty", 3, "dataplane.lcores = []: empty"},
    {"lcores_repeated", 3, "dataplane.lcores[2] = 1: listed twice"},
    {"load_bad_metric", 17,
     "pool[0].load.gpu_metric = \"DCGM_FI_DEV_GPU_UTIL{gpu=\\\"0\\\"}\": "
     "not a Prometheus metric name"},
    {"load_no_signal", 17,
     "pool[0].load.gpu_metric = \"\": empty, and so is queue_metric: nothing to scrape"},
    {"load_smoothing_zero", 17, "pool[0].load.smoothing = 0: out of range; must be in (0, 1]"},
    {"load_stale_not_above_interval", 19,
     "pool[0].load.stale_after = 2: must be longer than interval (2 s)"},
    {"mtu_too_small_for_v6_vip", 11, "port[0].mtu = 1290: too small for IPv6 clients"},
    {"multicast_mac", 10, "must be a unicast MAC address"},
    {"multicast_vip", 18, "vip[0].address = \"239.1.1.1\": must be a unicast address"},
    {"negative_weight", 26, "backend[0].weight = -1: out of range; must be in [0, 1000000]"},
    {"no_next_hop", 21, "backend[0].mac: no way to find the next-hop MAC"},
    {"no_port", 1, "port: missing; at least one [[port]]"},
    {"port_not_array", 6, "expected an array of tables; write each entry as [[port]]"},
    {"policy_churn_budget_above_one", 29,
     "policy.churn_budget = 1.5: out of range; must be in (0, 1]"},
    {"policy_churn_budget_zero", 29, "policy.churn_budget = 0: out of range; must be in (0, 1]"},
    {"policy_drain_timeout_zero", 29,
     "policy.drain_timeout = 0: out of range; must be from 0.001 to 2147483 seconds"},
    {"policy_gpu_high_below_default_low", 29,
     "policy.gpu_high = 70: must be above gpu_low (75, the default)"},
    {"policy_gpu_high_string", 29, "policy.gpu_high = \"90%\": expected a number, got a string"},
    {"policy_gpu_low_not_below_high", 30, "policy.gpu_low = 90: must be below gpu_high (90)"},
    {"policy_load_factor_hysteresis_half", 29,
     "policy.load_factor_hysteresis = 0.5: out of range; must be in [0, 0.5)"},
    {"policy_load_factor_step_above_half", 29,
     "policy.load_factor_step = 0.6: out of range; must be in [0, 0.5]"},
    {"policy_min_load_factor_zero", 29,
     "policy.min_load_factor = 0: out of range; must be in (0, 1]"},
    {"policy_not_table", 2, "policy = \"default\": expected a table ([policy])"},
    {"policy_overprovisioning_below_one", 29,
     "policy.overprovisioning = 0.9: out of range; must be in [1, 10]"},
    {"policy_panic_threshold_one", 29,
     "policy.panic_threshold = 1.0: out of range; must be in [0, 1)"},
    {"policy_queue_low_not_below_high", 30,
     "policy.queue_low = 12.5: must be below queue_high (8)"},
    {"policy_unknown_key", 29,
     "policy.overprovision = 1.4: unknown key; policy takes gpu_high, gpu_low"},
    {"syntax_error", 19, "TOML: Error while parsing string"},
    {"table_header_without_name", 30,
     "TOML: Error while parsing key: expected bare key starting character or string delimiter"},
    {"table_size_not_prime", 20, "vip[0].table_size = 65536: not prime; use a prime such as 65537"},
    {"table_size_too_large", 20, "vip[0].table_size = 16777259: exceeds the maximum 16777216"},
    {"tap_name_too_long", 6, "port[0].exception_name: the default tap name \"sw-uplink-primary\""},
    {"timeout_negative", 7, "dataplane.timeouts.established = -1: out of range"},
    {"two_armed_without_backend_port", 6, "needs a \"client\" and a \"backend\" port"},
    {"unknown_health_table", 16,
     "pool[0].healthcheck = {...}: unknown key; pool[0] takes name, site, priority, encap, "
     "gue_port, health, load"},
    {"unknown_key", 20, "vip[0].tabel_size = 13: unknown key; vip[0] takes name, address"},
    {"unknown_pool", 20, "vip[0].pools[1] = \"gpu\": no such pool; pools are a"},
    {"unknown_top_level", 16, "vips = [{...}]: unknown key; the top level takes"},
    {"v4_backend_without_address", 24,
     "an IPv4 backend, but its egress port[0] \"p0\" has no "
     "address"},
    {"v6_backend_without_address6", 24,
     "backend[0].address = \"fd00::11\": an IPv6 backend, but "
     "its egress port[0] \"p0\" has no address6"},
    {"v6_in_address", 9, "port[0].address = \"fd00::1\": must be an IPv4 address"},
    {"vip_missing_pools", 16, "vip[0].pools: missing; this key is required"},
    {"vip_without_pools", 20, "vip[0].pools = []: empty; a VIP needs at least one pool"},
    {"weight_out_of_range", 26, "backend[0].weight = 1000001: out of range"},
    {"wrong_type", 20, "vip[0].port = \"443\": expected an integer, got a string"},
};

TEST(Config, EveryInvalidFixtureIsRejectedWithItsMessageAndLine) {
  for (const Invalid& c : kInvalid) {
    const std::string path = kData + "/invalid/" + c.file + ".toml";
    SCOPED_TRACE(path);
    ConfigResult r = loadConfig(path);
    ASSERT_FALSE(r.ok());
    ASSERT_FALSE(r.errors().empty());
    bool found = false;
    for (const ConfigError& e : r.errors()) {
      EXPECT_EQ(e.file, path);
      const std::string text = formatError(e);
      EXPECT_EQ(text.rfind(path + ":" + std::to_string(e.line) + ":", 0), 0u) << text;
      if (e.line == c.line && text.find(c.expect) != std::string::npos) found = true;
    }
    EXPECT_TRUE(found) << "want line " << c.line << " with: " << c.expect << "\ngot:\n"
                       << formatErrors(r.errors());
  }
}

// Reproducers of two toml++ 3.3 bugs that the pre-scan no longer traps,
// because the library the daemon links (Debian's shared build, NDEBUG)
// reports them as parse errors: a table header whose name starts with no
// key character ("[[#", "[[[1]]]", "[[=": parse_key()'s precondition,
// marzer/tomlplusplus#301) and an array element that starts with '}'
// ("[}]": parse_value()'s `!is_value_terminator` precondition). Only a debug
// build of toml++ asserts on them. Each is one syntax error on its line,
// from toml++, and the loader goes on working.
TEST(Config, TomlPlusPlusReportsABadHeaderNameAndABraceElementItself) {
  for (const char* header : {"[[#", "[[[1]]]", "[[=", "[ ,]", "[[\t{", "[=", "[# x"}) {
    const std::string text = std::string("[dataplane]\nlcores = [1]\n") + header + "\n";
    const ConfigResult r = loadConfigFromString(text, "t.toml");
    ASSERT_FALSE(r.ok()) << header;
    ASSERT_EQ(r.errors().size(), 1u) << header;
    EXPECT_EQ(r.errors()[0].line, 3u) << header;
    EXPECT_EQ(r.errors()[0].message.rfind("TOML: ", 0), 0u) << header;
    EXPECT_NE(r.errors()[0].message.find("expected bare key starting character"), std::string::npos)
        << header << ": " << r.errors()[0].message;
  }
  for (const char* value :
       {"[}]", "[[}]]", "[1,}]", "[1 ,}]", "[\n}]", "[1, # c\n }]", "{b = [}]}", "[{}, }]"}) {
    const std::string text = std::string("[dataplane]\nlcores = [1]\nx = ") + value + "\n";
    const ConfigResult r = loadConfigFromString(text, "t.toml");
    ASSERT_FALSE(r.ok()) << value;
    ASSERT_EQ(r.errors().size(), 1u) << value;
    EXPECT_GE(r.errors()[0].line, 3u) << value;
    EXPECT_NE(r.errors()[0].message.find("could not determine value type"), std::string::npos)
        << value << ": " << r.errors()[0].message;
  }
  // Nested arrays, strings and comments with brackets and braces in them
  // are no syntax error.
  for (const char* text : {"[dataplane]\nlcores = [\n  [ # nested\n  1 ],\n]\n",
                           "[dataplane]\nlcores = [1]\nx = \"\"\"\n[[# in a string\n\"\"\"\n",
                           "[dataplane]\nlcores = [1]\nx = [{a = 1}, {}]\n",
                           "[dataplane]\nlcores = [1]\nx = [\"}\", '}']\n"}) {
    const ConfigResult r = loadConfigFromString(text, "t.toml");
    for (const auto& e : r.errors()) {
      EXPECT_EQ(e.message.find("TOML: "), std::string::npos) << text << ": " << formatError(e);
    }
  }
}

TEST(Config, TheInvalidTableCoversEveryFixture) {
  std::set<std::string> inTable;
  for (const Invalid& c : kInvalid) inTable.insert(c.file);
  std::set<std::string> onDisk;
  for (const auto& e : fs::directory_iterator(kData + "/invalid")) {
    if (e.path().extension() == ".toml") onDisk.insert(e.path().stem().string());
  }
  EXPECT_EQ(inTable, onDisk);
}

const std::string kMinimal =
    test::estateHead(test::Head().seed("1").devargs("net_ring0")) + test::poolToml("a", "onprem");

// kMinimal with its pool at `site` and `extra` after it.
std::string withPool(const std::string& site, const std::string& extra) {
  std::string text = kMinimal;
  text.replace(text.find("site = \"onprem\""), 15, "site = \"" + site + "\"");
  return text + "\n" + extra;
}

TEST(Config, HealthDefaultsFollowTheSite) {
  ConfigResult r = loadConfigFromString(withPool("cloud", "[pool.health]\nport = 22\n"), "t.toml");
  ASSERT_TRUE(r.ok()) << formatErrors(r.errors());
  const HealthCheckConfig& cloud = r.value().pools.at(0).health;
  EXPECT_EQ(cloud.kind, HealthCheckKind::Tcp);
  EXPECT_EQ(cloud.port, 22);
  EXPECT_EQ(cloud.interval, 1000u);
  EXPECT_EQ(cloud.timeout, 500u);
  EXPECT_EQ(cloud.rise, 2u);
  EXPECT_EQ(cloud.fall, 3u);
  r = loadConfigFromString(withPool("onprem", "[pool.health]\nport = 22\n"), "t.toml");
  ASSERT_TRUE(r.ok()) << formatErrors(r.errors());
  EXPECT_EQ(r.value().pools.at(0).health.interval, 200u);
  EXPECT_EQ(r.value().pools.at(0).health.timeout, 150u);
}

TEST(Config, EveryControlPlaneKey) {
  std::string text = withPool("cloud", R"([pool.health]
kind = "encap"
port = 50051
interval = 2
timeout = 0.75
rise = 5
fall = 1

[pool.load]
enabled = false
port = 8002
path = "/metrics/gpu"
gpu_metric = ""
queue_metric = "nv_inference_pending_request_count"
interval = 0.5
timeout = 0.25
stale_after = 10
smoothing = 1
)");
  text += R"(
[policy]
gpu_high = 100
gpu_low = 0
queue_high = 1.5
queue_low = 0
overprovisioning = 1
panic_threshold = 0
min_load_factor = 1
load_factor_step = 0
load_factor_hysteresis = 0
churn_budget = 1
churn_interval = 0.01
drain_timeout = 3600

[control]
socket = "/tmp/s.sock"
socket_group = "gpu-ops"
metrics_listen = "[::1]:9000"
event_log_size = 16
)";
  ConfigResult r = loadConfigFromString(text, "t.toml");
  ASSERT_TRUE(r.ok()) << formatErrors(r.errors());
  const Config& c = r.value();
  const HealthCheckConfig& h = c.pools.at(0).health;
  EXPECT_EQ(h.kind, HealthCheckKind::Encap);
  EXPECT_EQ(h.port, 50051);
  EXPECT_EQ(h.interval, 2000u);
  EXPECT_EQ(h.timeout, 750u);
  EXPECT_EQ(h.rise, 5u);
  EXPECT_EQ(h.fall, 1u);
  const LoadSourceConfig& l = c.pools.at(0).load;
  EXPECT_FALSE(l.enabled);
  EXPECT_EQ(l.port, 8002);
  EXPECT_EQ(l.path, "/metrics/gpu");
  EXPECT_EQ(l.gpuMetric, "");
  EXPECT_EQ(l.queueMetric, "nv_inference_pending_request_count");
  EXPECT_EQ(l.interval, 500u);
  EXPECT_EQ(l.timeout, 250u);
  EXPECT_EQ(l.staleAfter, 10'000u);
  EXPECT_EQ(l.smoothing, 1.0);
  const PolicyConfig& p = c.policy;
  EXPECT_EQ(p.gpuHigh, 100.0);
  EXPECT_EQ(p.gpuLow, 0.0);
  EXPECT_EQ(p.queueHigh, 1.5);
  EXPECT_EQ(p.queueLow, 0.0);
  EXPECT_EQ(p.overprovisioning, 1.0);
  EXPECT_EQ(p.panicThreshold, 0.0);
  EXPECT_EQ(p.minLoadFactor, 1.0);
  EXPECT_EQ(p.loadFactorStep, 0.0);
  EXPECT_EQ(p.loadFactorHysteresis, 0.0);
  EXPECT_EQ(p.churnBudget, 1.0);
  EXPECT_EQ(p.churnInterval, 10u);
  EXPECT_EQ(p.drainTimeout, 3'600'000u);
  EXPECT_EQ(c.control.socketPath, "/tmp/s.sock");
  EXPECT_EQ(c.control.socketGroup, "gpu-ops");
  EXPECT_EQ(c.control.metricsListen, "[::1]:9000");
  EXPECT_EQ(c.control.eventLogSize, 16u);
}

TEST(Config, LatencyPolicyKeys) {
  // Defaults: regions among cloud pools, max(1 s, churn_interval) windows.
  ConfigResult d =
      loadConfigFromString(withPool("onprem", "[policy]\nchurn_interval = 2\n"), "t.toml");
  ASSERT_TRUE(d.ok()) << formatErrors(d.errors());
  EXPECT_EQ(d.value().policy.latencyRegions, LatencyRegions::Cloud);
  EXPECT_EQ(d.value().policy.latencyWindow, 2000u);
  EXPECT_EQ(d.value().policy.regionSwitchWindows, 10u);
  EXPECT_EQ(d.value().policy.degradedLatencyFactor, 3.0);

  ConfigResult r = loadConfigFromString(withPool("onprem", R"([policy]
churn_interval = 0.25
latency_regions = "all"
latency_window = 0.5
region_switch_margin = 0.3
region_switch_margin_ms = 15
region_switch_windows = 4
degraded_latency_ms = 250
degraded_latency_factor = 2.5
degraded_latency_min_ms = 5
degraded_windows = 3
degraded_weight = 0.5
degraded_max_fraction = 0.34
degraded_restore_step = 0.1
)"),
                                        "t.toml");
  ASSERT_TRUE(r.ok()) << formatErrors(r.errors());
  const PolicyConfig& p = r.value().policy;
  EXPECT_EQ(p.latencyRegions, LatencyRegions::All);
  EXPECT_EQ(p.latencyWindow, 500u);
  EXPECT_EQ(p.regionSwitchMargin, 0.3);
  EXPECT_EQ(p.regionSwitchMarginMs, 15.0);
  EXPECT_EQ(p.regionSwitchWindows, 4u);
  EXPECT_EQ(p.degradedLatencyMs, 250.0);
  EXPECT_EQ(p.degradedLatencyFactor, 2.5);
  EXPECT_EQ(p.degradedLatencyMinMs, 5.0);
  EXPECT_EQ(p.degradedWindows, 3u);
  EXPECT_EQ(p.degradedWeight, 0.5);
  EXPECT_EQ(p.degradedMaxFraction, 0.34);
  EXPECT_EQ(p.degradedRestoreStep, 0.1);

  const std::pair<const char*, const char*> bad[] = {
      {"latency_regions = \"east\"",
       "policy.latency_regions = \"east\": must be one of \"cloud\", \"all\", \"off\""},
      {"churn_interval = 2\nlatency_window = 1",
       "policy.latency_window = 1: must be at least churn_interval (2 s)"},
      {"region_switch_windows = 0", "policy.region_switch_windows = 0: out of range"},
      {"degraded_latency_factor = 0.8", "policy.degraded_latency_factor = 0.8: must be above 1"},
      {"degraded_weight = 0", "policy.degraded_weight = 0: out of range; must be in (0, 1]"},
      {"degraded_max_fraction = 1.5", "policy.degraded_max_fraction = 1.5: out of range"},
      {"degraded_restore_step = 0", "policy.degraded_restore_step = 0: out of range"},
      {"region_switch_margin = -0.1", "policy.region_switch_margin = -0.1: out of range"},
  };
  for (const auto& [text, want] : bad) {
    ConfigResult e =
        loadConfigFromString(withPool("onprem", std::string("[policy]\n") + text), "t.toml");
    ASSERT_FALSE(e.ok()) << text;
    EXPECT_NE(formatErrors(e.errors()).find(want), std::string::npos) << formatErrors(e.errors());
  }
}

TEST(Config, HttpCheckAndHealthNone) {
  ConfigResult r = loadConfigFromString(
      withPool("onprem",
               "[pool.health]\nkind = \"http\"\nport = 80\npath = \"/v1/ready?x=1\"\n"
               "expect_status = 204\n"),
      "t.toml");
  ASSERT_TRUE(r.ok()) << formatErrors(r.errors());
  EXPECT_EQ(r.value().pools.at(0).health.kind, HealthCheckKind::Http);
  EXPECT_EQ(r.value().pools.at(0).health.httpPath, "/v1/ready?x=1");
  EXPECT_EQ(r.value().pools.at(0).health.expectStatus, 204);
  r = loadConfigFromString(withPool("onprem", "[pool.health]\nkind = \"none\"\n"), "t.toml");
  ASSERT_TRUE(r.ok()) << formatErrors(r.errors());
  EXPECT_EQ(r.value().pools.at(0).health.kind, HealthCheckKind::None);
}

TEST(Config, MetricsListenForms) {
  for (const char* good : {"127.0.0.1:9550", "0.0.0.0:1", "[::1]:65535", "[2001:db8::1]:80", ""}) {
    ConfigResult r = loadConfigFromString(
        std::string(kMinimal) + "\n[control]\nmetrics_listen = \"" + good + "\"\n", "t.toml");
    EXPECT_TRUE(r.ok()) << good << "\n" << formatErrors(r.errors());
  }
  for (const char* bad : {"127.0.0.1", "127.0.0.1:0", "127.0.0.1:65536", "::1:9550", "[::1]9550",
                          "[127.0.0.1]:80", ":9550", "127.0.0.1:95a0"}) {
    ConfigResult r = loadConfigFromString(
        std::string(kMinimal) + "\n[control]\nmetrics_listen = \"" + bad + "\"\n", "t.toml");
    EXPECT_FALSE(r.ok()) << bad;
  }
}

TEST(Config, AnnounceSection) {
  ConfigResult off = loadConfigFromString(kMinimal, "t.toml");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off.value().announce.enabled);
  EXPECT_EQ(off.value().announce.device, "spillway0");
  EXPECT_EQ(off.value().announce.stallMs, 200u);
  ConfigResult on = loadConfigFromString(std::string(kMinimal) + R"(
[announce]
enabled = true
device = "bgp-vips"
period_ms = 10
stall_ms = 100
control_stall_ms = 800
hold_down_ms = 2000
withdraw_grace_ms = 0
freeze_ms = 250
)",
                                         "t.toml");
  ASSERT_TRUE(on.ok()) << formatErrors(on.errors());
  const AnnounceConfig& a = on.value().announce;
  EXPECT_TRUE(a.enabled);
  EXPECT_EQ(a.device, "bgp-vips");
  EXPECT_EQ(a.periodMs, 10u);
  EXPECT_EQ(a.stallMs, 100u);
  EXPECT_EQ(a.controlStallMs, 800u);
  EXPECT_EQ(a.holdDownMs, 2000u);
  EXPECT_EQ(a.withdrawGraceMs, 0u);
  EXPECT_EQ(a.freezeMs, 250u);
  EXPECT_EQ(off.value().announce.freezeMs, 1000u);
}

TEST(Config, AnnounceErrorsNameTheKey) {
  const std::pair<const char*, const char*> cases[] = {
      {"device = \"\"", "announce.device"},
      {"device = \"much-too-long-name\"", "announce.device"},
      {"device = \"a/b\"", "announce.device"},
      {"stall_ms = 5", "announce.stall_ms"},
      {"period_ms = 50\nstall_ms = 60", "announce.stall_ms"},
      {"period_ms = 1000", "announce.period_ms"},
      {"withdraw_grace_ms = -1", "announce.withdraw_grace_ms"},
      {"freeze_ms = 10", "announce.freeze_ms"},
      {"period_ms = 50\nfreeze_ms = 140", "announce.freeze_ms"},
      {"enabled = \"yes\"", "announce.enabled"},
      {"stall = 200", "announce.stall"},
  };
  for (const auto& [line, field] : cases) {
    ConfigResult r =
        loadConfigFromString(std::string(kMinimal) + "\n[announce]\n" + line + "\n", "t.toml");
    ASSERT_FALSE(r.ok()) << line;
    EXPECT_EQ(r.errors().at(0).field, field) << line << "\n" << formatErrors(r.errors());
  }
  // The announce device cannot be a port's exception tap.
  std::string text = kMinimal;
  text.insert(text.find("next_hop_mac"), "kernel_interface = \"eth9\"\n");
  ConfigResult clash = loadConfigFromString(text + "\n[announce]\ndevice = \"eth9\"\n", "t.toml");
  ASSERT_FALSE(clash.ok());
  EXPECT_NE(clash.errors().at(0).message.find("already a port's"), std::string::npos)
      << formatErrors(clash.errors());
}

TEST(Config, FormatsAsFileLineColumnFieldValueWhy) {
  const std::string text = std::string(kMinimal) + R"(
[[vip]]
name = "v"
address = "192.0.2.1"
protocol = "tcp"
table_size = 65536
pools = ["a"]
)";
  ConfigResult r = loadConfigFromString(text, "spillway.toml");
  ASSERT_EQ(r.errors().size(), 1u) << formatErrors(r.errors());
  const ConfigError& e = r.errors()[0];
  EXPECT_EQ(e.line, 19u);
  EXPECT_EQ(e.column, 14u);
  EXPECT_EQ(e.field, "vip[0].table_size");
  EXPECT_EQ(e.value, "65536");
  EXPECT_EQ(formatErrors(r.errors()),
            "spillway.toml:19:14: vip[0].table_size = 65536: not prime; use a prime such as "
            "65537\n");
}

TEST(Config, UnknownKeysAreRejectedEverywhere) {
  const std::string text = std::string(kMinimal) + "colour = \"blue\"\n" + R"(
[dataplane.timeouts]
establshed = 60
)";
  ConfigResult r = loadConfigFromString(text, "t.toml");
  ASSERT_FALSE(r.ok());
  const std::string all = formatErrors(r.errors());
  EXPECT_NE(all.find("pool[0].colour = \"blue\": unknown key; pool[0] takes name, site"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("dataplane.timeouts.establshed = 60: unknown key; dataplane.timeouts takes "
                     "embryonic, established, closing, udp, other"),
            std::string::npos)
      << all;
}

TEST(Config, CollectsEveryErrorInLineOrder) {
  const std::string text = R"([dataplane]
lcores = []
hash_seed = "nope"

[[port]]
name = "p0"
devargs = "net_ring0"
address = "10.0.0.300"

[[vip]]
name = "v"
address = "192.0.2.1"
protocol = "tcp"
pools = ["missing"]
)";
  ConfigResult r = loadConfigFromString(text, "t.toml");
  ASSERT_EQ(r.errors().size(), 4u) << formatErrors(r.errors());
  EXPECT_EQ(r.errors()[0].field, "dataplane.lcores");
  EXPECT_EQ(r.errors()[1].field, "dataplane.hash_seed");
  EXPECT_EQ(r.errors()[2].field, "port[0].address");
  EXPECT_EQ(r.errors()[3].field, "vip[0].pools[0]");
  EXPECT_EQ(r.errors()[3].line, 14u);
}

TEST(Config, IntegerBeyondTomlRangeIsASyntaxErrorWithItsLine) {
  std::string text = kMinimal;
  text.replace(text.find("hash_seed = 1"), 13, "hash_seed = 18446744073709551615");
  ConfigResult r = loadConfigFromString(text, "t.toml");
  ASSERT_EQ(r.errors().size(), 1u) << formatErrors(r.errors());
  EXPECT_EQ(r.errors()[0].line, 3u);
  EXPECT_EQ(r.errors()[0].message.rfind("TOML: ", 0), 0u);
}

// toml++ 3.3 asserts on this input when built header-only without NDEBUG;
// the shared library (what pkg-config selects) reports it.
TEST(Config, CommentWhereATableNameBelongsIsASyntaxError) {
  ConfigResult r = loadConfigFromString("[# x\n", "t.toml");
  ASSERT_EQ(r.errors().size(), 1u) << formatErrors(r.errors());
  EXPECT_EQ(formatError(r.errors()[0]).rfind("t.toml:1:2: TOML: ", 0), 0u)
      << formatError(r.errors()[0]);
}

TEST(Config, HexSeedForms) {
  for (const auto& [written, value] :
       std::vector<std::pair<std::string, std::uint64_t>>{{"0x1", 1},
                                                          {"\"0x1\"", 1},
                                                          {"\"0XaBcD\"", 0xabcd},
                                                          {"9223372036854775807", INT64_MAX},
                                                          {"\"0x8000000000000000\"", 1ULL << 63}}) {
    std::string text = kMinimal;
    text.replace(text.find("hash_seed = 1"), 13, "hash_seed = " + written);
    ConfigResult r = loadConfigFromString(text, "t.toml");
    ASSERT_TRUE(r.ok()) << written << "\n" << formatErrors(r.errors());
    EXPECT_EQ(r.value().dataplane.hashSeed, value) << written;
  }
  for (const char* bad : {"\"0x\"", "\"123\"", "\"0x10000000000000000\"", "1.5"}) {
    std::string text = kMinimal;
    text.replace(text.find("hash_seed = 1"), 13, std::string("hash_seed = ") + bad);
    EXPECT_FALSE(loadConfigFromString(text, "t.toml").ok()) << bad;
  }
}

TEST(Config, UnreadableFileIsAnErrorNotAnException) {
  ConfigResult r = loadConfig("/nonexistent/spillway.toml");
  ASSERT_EQ(r.errors().size(), 1u);
  EXPECT_EQ(r.errors()[0].line, 0u);
  EXPECT_EQ(formatError(r.errors()[0]).rfind("/nonexistent/spillway.toml: cannot open", 0), 0u);
  EXPECT_FALSE(loadConfigFromString("", "empty.toml").ok());
  EXPECT_FALSE(loadConfigFromString(std::string("\0\xff", 2), "binary.toml").ok());
}

TEST(Config, AddressAndMacText) {
  EXPECT_EQ(formatIpAddress(ip("192.0.2.1")), "192.0.2.1");
  EXPECT_EQ(formatIpAddress(ip("2001:DB8::1")), "2001:db8::1");
  EXPECT_EQ(ip("10.1.2.3").bytes[3], std::byte{3});
  EXPECT_EQ(ip("10.1.2.3").bytes[4], std::byte{0});
  EXPECT_FALSE(parseIpAddress("10.1.2"));
  EXPECT_FALSE(parseIpAddress("fe80::1%eth0"));
  EXPECT_FALSE(parseIpAddress(""));
  EXPECT_EQ(parseMacAddress("02:AB:cd:00:00:ff"), (MacAddress{2, 0xab, 0xcd, 0, 0, 0xff}));
  EXPECT_EQ(formatMacAddress(MacAddress{2, 0xab, 0xcd, 0, 0, 0xff}), "02:ab:cd:00:00:ff");
  EXPECT_FALSE(parseMacAddress("02-ab-cd-00-00-ff"));
  EXPECT_FALSE(parseMacAddress("02:ab:cd:00:00:f"));
  EXPECT_FALSE(parseMacAddress("02:ab:cd:00:00:fg"));
}

TEST(Config, BackendIdIsFnv1a64) {
  // Reference vectors of FNV-1a 64 (Fowler, Noll, Vo).
  EXPECT_EQ(backendIdFromName(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(backendIdFromName("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(backendIdFromName("foobar"), 0x85944171f73967e8ULL);
}

}  // namespace
}  // namespace spillway

namespace spillway {
namespace {

TEST(Config, IcmpLimitsDefaultAndParse) {
  ConfigResult d = loadConfigFromString(kMinimal, "t.toml");
  ASSERT_TRUE(d.ok()) << formatErrors(d.errors());
  const IcmpRateLimits defaults{};
  EXPECT_EQ(d.value().dataplane.icmpLimits.perSecond, defaults.perSecond);
  EXPECT_EQ(d.value().dataplane.icmpLimits.perSourceBurst, defaults.perSourceBurst);

  ConfigResult r = loadConfigFromString(std::string(kMinimal) + R"(
[dataplane.icmp_limits]
per_second = 5000
burst = 500
per_source_per_second = 2
per_source_burst = 4
)",
                                        "t.toml");
  ASSERT_TRUE(r.ok()) << formatErrors(r.errors());
  const IcmpRateLimits& l = r.value().dataplane.icmpLimits;
  EXPECT_EQ(l.perSecond, 5000u);
  EXPECT_EQ(l.burst, 500u);
  EXPECT_EQ(l.perSourcePerSecond, 2u);
  EXPECT_EQ(l.perSourceBurst, 4u);
}

TEST(Config, IcmpLimitsOutOfRangeAreErrors) {
  for (const char* line : {"per_second = 0", "burst = 0", "per_source_per_second = 2000000",
                           "per_source_burst = 5000000", "per_second = \"fast\"", "rate = 5"}) {
    ConfigResult r = loadConfigFromString(
        std::string(kMinimal) + "\n[dataplane.icmp_limits]\n" + line + "\n", "t.toml");
    ASSERT_FALSE(r.ok()) << line;
    EXPECT_NE(formatErrors(r.errors()).find("dataplane.icmp_limits."), std::string::npos)
        << formatErrors(r.errors());
  }
}

TEST(Config, ControlUserIsANameOrEmpty) {
  ConfigResult r =
      loadConfigFromString(std::string(kMinimal) + "\n[control]\nuser = \"spillway\"\n", "t.toml");
  ASSERT_TRUE(r.ok()) << formatErrors(r.errors());
  EXPECT_EQ(r.value().control.user, "spillway");
  ConfigResult d = loadConfigFromString(kMinimal, "t.toml");
  EXPECT_EQ(d.value().control.user, "");
  for (const char* bad : {"\"-x\"", "\"a b\"", "\"root;rm\"", "3"}) {
    ConfigResult b =
        loadConfigFromString(std::string(kMinimal) + "\n[control]\nuser = " + bad + "\n", "t.toml");
    EXPECT_FALSE(b.ok()) << bad;
  }
}

}  // namespace
}  // namespace spillway

namespace spillway {
namespace {

// The pre-scan's one trap. toml++ 3.3 reaches TOML_UNREACHABLE in
// is_non_ascii_horizontal_whitespace() on non-ASCII characters outside
// strings whose slot of its lookup table has no case (U+01E9, found by
// fuzz_config; U+FCFF; marzer/tomlplusplus#190 and #295, fixed after 3.3 by
// #305): undefined behaviour. These are the reproducers; each is refused
// before toml++ sees it. Built header-only with -fsanitize=undefined,
// toml::parse of any of them reports "execution reached an unreachable
// program point" at impl/unicode_autogenerated.h:44.
TEST(Config, NonAsciiOutsideStringsIsASyntaxErrorInsideStringsAllowed) {
  ConfigResult bare = loadConfigFromString("\xC7\xA9", "t.toml");
  ASSERT_FALSE(bare.ok());
  EXPECT_NE(formatErrors(bare.errors()).find("t.toml:1:1: TOML: a non-ASCII character"),
            std::string::npos)
      << formatErrors(bare.errors());
  ConfigResult after = loadConfigFromString(std::string(kMinimal) + "\nx = 1 \xC7\xA9\n", "t.toml");
  ASSERT_FALSE(after.ok());
  EXPECT_NE(formatErrors(after.errors()).find("non-ASCII"), std::string::npos);
  // A quote where no string may start opens none: toml++ would scan what
  // follows it as a value's token (U+FCFF reached its TOML_UNREACHABLE).
  for (const char* text :
       {"x =-\"ab\xEF\xB3\xBF\"\n", "x = 1\"\xC7\xA9\"\n", "x = tr'\xC7\xA9'\n"}) {
    ConfigResult r = loadConfigFromString(text, "t.toml");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(formatErrors(r.errors()).find("non-ASCII"), std::string::npos)
        << formatErrors(r.errors());
  }
  // In a comment, in a string and after a BOM it is fine.
  ConfigResult ok = loadConfigFromString(
      "\xEF\xBB\xBF# caf\xC3\xA9\n" + std::string(kMinimal) + "\n[control]\nsocket_group = \"\"\n",
      "t.toml");
  EXPECT_TRUE(ok.ok()) << formatErrors(ok.errors());
  // Strings in every place TOML lets one start: values, array elements,
  // inline tables, quoted and dotted keys, a quoted table name.
  for (const char* text :
       {"x = \"caf\xC3\xA9\"\n", "x = [\"\xC3\xA9\", '\xC3\xA9']\n", "x = [\n  \"\xC3\xA9\"\n]\n",
        "x = { \"k\xC3\xA9\" = '\xC3\xA9' }\n", "\"k\xC3\xA9\" = 1\n", "a.\"\xC3\xA9\" = 1\n",
        "[\"t\xC3\xA9\"]\nx = 1\n", "[ \"t\xC3\xA9\" ]\nx = 1\n",
        "x = \"\"\"\n\xC3\xA9\n\"\"\"\n"}) {
    ConfigResult r = loadConfigFromString(text, "t.toml");
    EXPECT_EQ(formatErrors(r.errors()).find("non-ASCII"), std::string::npos)
        << text << ": " << formatErrors(r.errors());
  }
}

}  // namespace
}  // namespace spillway
