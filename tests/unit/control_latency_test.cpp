// The latency views of a real ControlPlane (no data path, no health check,
// injected time): `backend list` carries SRTT, RTTVAR, the score and the
// latency mark for every backend (null / "normal" while nothing was
// measured), `vip show` marks a level of two cloud pools as regions, and the
// metrics carry the latency-mark gauges. What the marks do is policy's
// (policy_latency_test) and the drills'.
#include <gtest/gtest.h>

#include <string>
#include <variant>

#include "control/backends/snapshot_builder.hpp"
#include "control/config/config.hpp"
#include "control/plane/control_plane.hpp"

namespace spillway {
namespace {

constexpr const char* kEstate = R"([dataplane]
lcores = [1]
hash_seed = 42

[[port]]
name = "p0"
devargs = "net_null0"
address = "10.0.0.1"
next_hop_mac = "02:00:00:00:00:01"

[[pool]]
name = "onprem"
site = "onprem"
priority = 0

[[pool]]
name = "east"
site = "cloud"
priority = 1

[[pool]]
name = "west"
site = "cloud"
priority = 1

[[vip]]
name = "v"
address = "192.0.2.1"
protocol = "tcp"
table_size = 251
pools = ["onprem", "east", "west"]

[control]
state_dir = ""

[[backend]]
name = "op1"
address = "10.0.0.11"
pool = "onprem"

[[backend]]
name = "e1"
address = "10.0.0.21"
pool = "east"

[[backend]]
name = "w1"
address = "10.0.0.31"
pool = "west"
)";

const Json& ok(const ApiResult& r) {
  static const Json kNull;
  if (const auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << e->code << ": " << e->message;
    return kNull;
  }
  return std::get<Json>(r);
}

TEST(ControlLatency, ViewsAndMetricsCarryTheLatencySignal) {
  ConfigResult r = loadConfigFromString(kEstate, "test.toml");
  ASSERT_TRUE(r.ok()) << formatErrors(r.errors());
  SnapshotBuilder builder;
  ASSERT_FALSE(builder.setConfig(r.value()));
  Millis now = 1'000;
  ControlPlane control(r.value(), "test.toml", builder, nullptr, now,
                       [&] { return static_cast<std::int64_t>(1'700'000'000'000 + now); });
  for (int i = 0; i < 30; ++i) (void)control.tick(now += 100);

  const Json list = ok(control.backendList());
  ASSERT_EQ(list.size(), 3u);
  for (const Json& b : list) {
    for (const char* key : {"srtt_ms", "rttvar_ms", "latency_ms"}) {
      ASSERT_TRUE(b.contains(key)) << key;
      EXPECT_TRUE(b[key].is_null()) << key;  // no health check: never measured
    }
    EXPECT_EQ(b["latency"], "normal");
    EXPECT_EQ(b["latency_factor"], 1.0);
  }

  const Json vip = ok(control.vipShow("v"));
  for (const Json& p : vip["pools"]) {
    EXPECT_EQ(p["region"], p["pool"] != "onprem") << p.dump();
    // No latency known: no preferred region yet; the cloud level shares by capacity.
    EXPECT_EQ(p["preferred"], false) << p.dump();
    EXPECT_TRUE(p["latency_ms"].is_null());
  }
  for (const Json& b : vip["backends"]) {
    EXPECT_EQ(b["latency"], "normal");
    EXPECT_TRUE(b.contains("latency_bound_ms"));
  }

  const std::string metrics = control.metricsText();
  EXPECT_NE(metrics.find("spillway_backend_latency_degraded{backend=\"e1\"} 0"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("spillway_backend_latency_weight_factor{backend=\"w1\"} 1"),
            std::string::npos);
  EXPECT_NE(metrics.find("spillway_pool_preferred_region{vip=\"v\",pool=\"east\"} 0"),
            std::string::npos);

  const Json dump = ok(control.configDump(false));
  EXPECT_EQ(dump["policy"]["latency_regions"], "cloud");
  EXPECT_EQ(dump["policy"]["region_switch_windows"], 10);
}

}  // namespace
}  // namespace spillway
