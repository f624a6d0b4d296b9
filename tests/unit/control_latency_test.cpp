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
#include "estate_fixture.hpp"

namespace spillway {
namespace {

const std::string kEstate =
    test::estateHead() + test::poolToml("onprem", "onprem", 0) +
    test::poolToml("east", "cloud", 1) + test::poolToml("west", "cloud", 1) +
    test::vipToml({"onprem", "east", "west"}) + "\n[control]\nstate_dir = \"\"\n" +
    test::backendToml("op1", "10.0.0.11", "onprem") + test::backendToml("e1", "10.0.0.21", "east") +
    test::backendToml("w1", "10.0.0.31", "west");

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
