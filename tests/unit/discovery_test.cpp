// Discovery: the file_sd parser (good, malformed with line and column, bad
// entries left out, caps, the encap and metrics labels), the membership's
// hold (damping), the watched file (inotify: writes, atomic renames, a
// malformed or oversized file keeps the last good set), and the control
// plane's rules on a fake clock: join with `backend add`'s checks, drain
// after the hold, operator intent wins, pool cap, reload keeps discovered
// backends, origin in config dump, an encap that is not the pool's refused,
// a metrics URL read by the load scrape.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "control/discovery/file_sd.hpp"
#include "control/discovery/file_source.hpp"
#include "control/discovery/membership.hpp"
#include "control/plane/control_plane.hpp"
#include "estate_fixture.hpp"
#include "fake_dataplane.hpp"
#include "plane_on_file.hpp"

namespace spillway {
namespace {

namespace fs = std::filesystem;

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("discovery") {}
};
using test::writeAll;

// Written aside and renamed over the file, as controllers do.
void replace(const std::string& path, const std::string& text) {
  writeAll(path + ".tmp", text);
  ASSERT_EQ(std::rename((path + ".tmp").c_str(), path.c_str()), 0);
}

std::string targets(std::initializer_list<const char*> addrs, const std::string& labels = "{}") {
  std::string t = "[{\"targets\": [";
  bool first = true;
  for (const char* a : addrs) {
    t += std::string(first ? "" : ", ") + "\"" + a + "\"";
    first = false;
  }
  return t + "], \"labels\": " + labels + "}]\n";
}

// --- file_sd parser ----------------------------------------------------------

TEST(FileSd, ParsesTargetsAndLabels) {
  const FileSdParse p = parseFileSd(R"([
  {"targets": ["10.1.0.5:8000", "10.1.0.6"], "labels": {"weight": "250", "job": "vllm"}},
  {"targets": ["[2001:db8::7]:443"], "labels": {"name": "gpu-7", "mac": "02:00:00:00:00:07"}},
  {"targets": ["2001:db8::8"]}
])",
                                    100);
  ASSERT_FALSE(p.error) << *p.error;
  EXPECT_TRUE(p.invalid.empty());
  ASSERT_EQ(p.backends.size(), 4u);
  EXPECT_EQ(p.backends[0].address, parseIpAddress("10.1.0.5").value());
  EXPECT_EQ(p.backends[0].name, "d-10-1-0-5");
  EXPECT_EQ(p.backends[0].weight, 250u);
  EXPECT_EQ(p.backends[1].weight, 250u);
  EXPECT_EQ(p.backends[2].name, "gpu-7");
  EXPECT_EQ(p.backends[2].mac, parseMacAddress("02:00:00:00:00:07"));
  EXPECT_EQ(p.backends[3].weight, kDefaultBackendWeight);
  // Ids come from the address only: the same on every instance, port or not.
  EXPECT_EQ(p.backends[0].id, discoveredBackendId(parseIpAddress("10.1.0.5").value()));
  EXPECT_EQ(parseFileSd(targets({"10.1.0.5"}), 10).backends.at(0).id, p.backends[0].id);
  EXPECT_NE(p.backends[0].id, p.backends[1].id);
}

TEST(FileSd, MalformedFileRefusedWithLineAndColumn) {
  const FileSdParse p = parseFileSd("[\n  {\"targets\": [\"10.1.0.5\"],\n  oops\n]", 100);
  ASSERT_TRUE(p.error);
  EXPECT_NE(p.error->find("line 3, column"), std::string::npos) << *p.error;
  EXPECT_TRUE(p.backends.empty());
  // A torn write: the file cut half-way.
  EXPECT_TRUE(parseFileSd("[{\"targets\": [\"10.1.0.5\", \"10.1", 100).error);
  EXPECT_TRUE(parseFileSd("", 100).error);
  const FileSdParse shape = parseFileSd(R"({"targets": ["10.1.0.5"]})", 100);
  ASSERT_TRUE(shape.error);
  EXPECT_NE(shape.error->find("array"), std::string::npos);
  EXPECT_TRUE(parseFileSd(R"([{"labels": {}}])", 100).error);
  EXPECT_TRUE(parseFileSd(R"([{"targets": [5]}])", 100).error);
  EXPECT_TRUE(parseFileSd(R"([{"targets": [], "labels": {"weight": 5}}])", 100).error);
  EXPECT_TRUE(parseFileSd(R"([{"targets": [], "extra": 1}])", 100).error);
}

TEST(FileSd, BadEntriesLeftOutAndCounted) {
  const FileSdParse p = parseFileSd(R"([
  {"targets": ["10.1.0.5", "not-an-ip", "10.1.0.5:9000", "10.1.0.6:99999", "[10.1.0.9]:80"]},
  {"targets": ["10.1.0.7"], "labels": {"weight": "2000000"}},
  {"targets": ["10.1.0.8"], "labels": {"mac": "01:00:5e:00:00:01"}},
  {"targets": ["10.1.0.9", "10.1.0.10"], "labels": {"name": "one"}},
  {"targets": ["10.1.0.11"], "labels": {"name": "bad name!"}},
  {"targets": ["10.1.0.12"], "labels": {"name": "d-10-1-0-5"}}
])",
                                    100);
  ASSERT_FALSE(p.error) << *p.error;
  ASSERT_EQ(p.backends.size(), 1u);
  EXPECT_EQ(p.backends[0].address, parseIpAddress("10.1.0.5").value());
  // not-an-ip, 10.1.0.5 again (with a port), port 99999, a bracketed IPv4,
  // the weight, the MAC, two targets under one name, the bad name, the name
  // another entry has.
  EXPECT_EQ(p.invalid.size(), 10u);
  for (const std::string& why : p.invalid) EXPECT_FALSE(why.empty());
}

TEST(FileSd, EncapAndMetricsLabels) {
  const FileSdParse p = parseFileSd(R"([
  {"targets": ["10.1.0.5:8000"], "labels": {"encap": "gue", "metrics": "http://10.1.0.5:9500/gpu"}},
  {"targets": ["10.1.0.6"], "labels": {"encap": "ipip", "metrics": "http://10.1.0.6"}},
  {"targets": ["[2001:db8::7]:443"], "labels": {"metrics": "http://[2001:db8::7]:9400/metrics?x=1"}},
  {"targets": ["10.1.0.8"]}
])",
                                    100);
  ASSERT_FALSE(p.error) << *p.error;
  EXPECT_TRUE(p.invalid.empty()) << p.invalid.front();
  ASSERT_EQ(p.backends.size(), 4u);
  EXPECT_EQ(p.backends[0].encap, PoolEncap::Gue);
  EXPECT_EQ(p.backends[0].metricsPort, 9500);
  EXPECT_EQ(p.backends[0].metricsPath, "/gpu");
  EXPECT_EQ(p.backends[1].encap, PoolEncap::IpIp);
  EXPECT_EQ(p.backends[1].metricsPort, 80);  // http's port and "/" by default
  EXPECT_EQ(p.backends[1].metricsPath, "/");
  EXPECT_FALSE(p.backends[2].encap);
  EXPECT_EQ(p.backends[2].metricsPort, 9400);
  EXPECT_EQ(p.backends[2].metricsPath, "/metrics?x=1");
  EXPECT_FALSE(p.backends[3].encap);  // no label: the pool's, the pool's load source
  EXPECT_FALSE(p.backends[3].metricsPort);
  EXPECT_EQ(formatMetricsUrl(p.backends[2].address, 9400, "/m"), "http://[2001:db8::7]:9400/m");

  // Each left out with its reason; the good entry beside them stands.
  const char* bad[] = {
      R"({"encap": "vxlan"})",
      R"({"metrics": "https://10.1.0.9/metrics"})",
      R"({"metrics": "http://10.9.9.9:9400/metrics"})",  // another host
      R"({"metrics": "http://10.1.0.9:0/"})",
      R"({"metrics": "http://10.1.0.9:70000/"})",
      R"({"metrics": "http://10.1.0.9:/metrics"})",
      R"({"metrics": "http://[10.1.0.9]/"})",
      R"({"metrics": "http://exporter.example:9400/"})",
      R"({"metrics": "http://10.1.0.9/a b"})",
      R"({"metrics": "http://10.1.0.9/#frag"})",
      R"({"metrics": "http://10.1.0.9x/"})",
      R"({"metrics": ""})",
  };
  for (const char* labels : bad) {
    const std::string text = "[" + std::string(R"({"targets": ["10.1.0.9"], "labels": )") + labels +
                             R"(}, {"targets": ["10.1.0.10"]}])";
    const FileSdParse r = parseFileSd(text, 100);
    ASSERT_FALSE(r.error) << labels << ": " << *r.error;
    ASSERT_EQ(r.backends.size(), 1u) << labels;
    EXPECT_EQ(r.backends[0].address, parseIpAddress("10.1.0.10").value());
    ASSERT_EQ(r.invalid.size(), 1u) << labels;
    EXPECT_NE(r.invalid[0].find("10.1.0.9"), std::string::npos) << r.invalid[0];
  }
  std::string why;
  EXPECT_FALSE(parseMetricsUrl("http://10.1.0.9/" + std::string(kMaxMetricsPathBytes, 'a'), why));
  EXPECT_NE(why.find("longer"), std::string::npos) << why;
  // Another host parses as a URL; the entry that names it is refused above.
  EXPECT_TRUE(parseMetricsUrl("http://10.9.9.9:9400/metrics", why));
}

TEST(FileSd, EntriesCapped) {
  std::string text = "[{\"targets\": [";
  for (int i = 0; i < 5000; ++i) {
    text += std::string(i == 0 ? "" : ", ") + "\"10.2." + std::to_string(i / 250) + "." +
            std::to_string(i % 250 + 1) + "\"";
  }
  text += "]}]";
  const FileSdParse p = parseFileSd(text, 64);
  ASSERT_FALSE(p.error);
  EXPECT_EQ(p.backends.size(), 64u);
  ASSERT_EQ(p.invalid.size(), 1u);
  EXPECT_NE(p.invalid[0].find("4936 targets beyond max_entries = 64"), std::string::npos)
      << p.invalid[0];
}

// --- membership ---------------------------------------------------------------

std::vector<DiscoveredBackend> listed(std::initializer_list<const char*> addrs) {
  return parseFileSd(targets(addrs), 100).backends;
}

TEST(DiscoveryMembership, JoinsAtOnceLeavesAfterHold) {
  DiscoveryMembership m(5000);
  m.update(listed({"10.1.0.5", "10.1.0.6"}), 1000);
  EXPECT_EQ(m.wanted().size(), 2u);
  const std::uint64_t six = discoveredBackendId(parseIpAddress("10.1.0.6").value());
  m.update(listed({"10.1.0.5"}), 2000);
  EXPECT_EQ(m.wanted().size(), 2u);  // in hold
  EXPECT_FALSE(m.listed(six));
  EXPECT_FALSE(m.expire(6999));
  EXPECT_EQ(m.wanted().size(), 2u);
  EXPECT_TRUE(m.expire(7000));  // absent for the hold
  EXPECT_EQ(m.wanted().size(), 1u);
  EXPECT_EQ(m.wanted().count(six), 0u);
  EXPECT_EQ(m.damped(), 0u);
}

TEST(DiscoveryMembership, FlapWithinHoldMovesNothing) {
  DiscoveryMembership m(5000);
  m.update(listed({"10.1.0.5", "10.1.0.6"}), 1000);
  const std::uint64_t gen = m.generation();
  for (Millis t = 2000; t < 30000; t += 2000) {
    m.update(listed({"10.1.0.5"}), t);                     // a partial answer ...
    m.update(listed({"10.1.0.5", "10.1.0.6"}), t + 1000);  // ... and the full one again
    EXPECT_FALSE(m.expire(t + 1500));
  }
  EXPECT_EQ(m.wanted().size(), 2u);
  EXPECT_EQ(m.generation(), gen);
  EXPECT_EQ(m.damped(), 14u);
}

TEST(DiscoveryMembership, ZeroHoldLeavesAtOnce) {
  DiscoveryMembership m(0);
  m.update(listed({"10.1.0.5", "10.1.0.6"}), 1000);
  m.update(listed({"10.1.0.5"}), 1000);
  EXPECT_EQ(m.wanted().size(), 1u);
}

// --- the watched file -----------------------------------------------------------

DiscoveryConfig fileConfig(const std::string& path) {
  DiscoveryConfig c;
  c.kind = DiscoveryKind::File;
  c.path = path;
  return c;
}

TEST(FileSdSource, ReadsWritesAndAtomicReplacements) {
  TempDir dir;
  const std::string path = dir / "targets.json";
  writeAll(path, targets({"10.1.0.5"}));
  FileSdSource s(fileConfig(path));
  ASSERT_GE(s.fd(), 0);
  FileSdSource::Refresh r = s.poll(0);
  EXPECT_TRUE(r.read);
  EXPECT_FALSE(r.error);
  ASSERT_EQ(s.backends().size(), 1u);
  EXPECT_FALSE(s.poll(1).read);  // nothing changed: nothing read
  replace(path, targets({"10.1.0.5", "10.1.0.6"}));
  r = s.poll(2);
  EXPECT_TRUE(r.read);
  EXPECT_EQ(s.backends().size(), 2u);
  writeAll(path, targets({"10.1.0.7"}));  // written in place, closed
  r = s.poll(3);
  EXPECT_TRUE(r.read);
  ASSERT_EQ(s.backends().size(), 1u);
  EXPECT_EQ(s.backends()[0].address, parseIpAddress("10.1.0.7").value());
  // Other files of the directory are not read.
  writeAll(dir / "other.json", "garbage");
  EXPECT_FALSE(s.poll(4).read);
}

TEST(FileSdSource, MalformedLargeOrMissingKeepsLastGood) {
  TempDir dir;
  const std::string path = dir / "targets.json";
  DiscoveryConfig c = fileConfig(path);
  c.maxFileBytes = 4096;
  FileSdSource s(c);
  FileSdSource::Refresh r = s.poll(0);  // not there yet
  ASSERT_TRUE(r.error);
  EXPECT_FALSE(s.everGood());
  replace(path, targets({"10.1.0.5", "10.1.0.6"}));
  r = s.poll(1);
  EXPECT_FALSE(r.error);
  ASSERT_EQ(s.backends().size(), 2u);
  replace(path, "[{\"targets\": [\"10.1.0.5\", \"10.1");  // a torn write
  r = s.poll(2);
  ASSERT_TRUE(r.error);
  EXPECT_NE(r.error->find("line 1, column"), std::string::npos) << *r.error;
  EXPECT_NE(r.error->find("last good set stays"), std::string::npos);
  EXPECT_EQ(s.backends().size(), 2u);
  replace(path, std::string(5000, ' ') + targets({"10.1.0.9"}));
  r = s.poll(3);
  ASSERT_TRUE(r.error);
  EXPECT_NE(r.error->find("max_file_bytes"), std::string::npos) << *r.error;
  EXPECT_EQ(s.backends().size(), 2u);
  fs::remove(path);
  r = s.poll(4);
  ASSERT_TRUE(r.error);
  EXPECT_EQ(s.backends().size(), 2u);
  replace(path, targets({"10.1.0.9"}));
  r = s.poll(5);
  EXPECT_FALSE(r.error);
  EXPECT_EQ(s.backends().size(), 1u);
}

// --- the control plane ----------------------------------------------------------

std::string configText(const std::string& stateDir, const std::string& sdPath,
                       const std::string& discoveryExtra = "") {
  return test::cloudDiscoveryEstate(
      stateDir, "kind = \"file\", path = \"" + sdPath + "\", hold = 5" + discoveryExtra);
}

class Daemon : public test::PlaneOnFile {
 public:
  Daemon(const TempDir& dir, const std::string& text, Millis now = 1000)
      : PlaneOnFile(dir, text, now) {}
  // Ticks `ms` forward in steps of 100 ms (flow counts answered between),
  // publishing each snapshot as the daemon's loop does.
  void run(Millis& now, Millis ms) {
    for (Millis t = 0; t < ms; t += 100) {
      now += 100;
      ownWall_ += 100;
      if (!cp_->tick(now)) continue;
      if (auto s = cp_->takeSnapshot(now)) dp_.publish(std::move(s));
    }
  }
  std::optional<std::string> state(const std::string& name) {
    const ApiResult list = cp_->backendList();
    for (const Json& b : std::get<Json>(list)) {
      if (b["name"] == name) return b["state"].get<std::string>();
    }
    return std::nullopt;
  }
  std::optional<std::string> origin(const std::string& name) {
    const Json dump = std::get<Json>(cp_->configDump(true));
    for (const Json& b : dump["backends"]) {
      if (b["name"] == name) return b["origin"].get<std::string>();
    }
    return std::nullopt;
  }
  Json source() { return std::get<Json>(cp_->discovery())["sources"].at(0); }
};

TEST(ControlDiscovery, JoinsWithBackendAddChecksAndShowsOrigin) {
  TempDir dir;
  const std::string sd = dir / "cloud.json";
  writeAll(sd, R"([
  {"targets": ["10.3.0.5:8000", "10.3.0.6"], "labels": {"weight": "50"}},
  {"targets": ["192.0.2.1", "127.0.0.1", "10.0.0.1", "10.0.0.11", "2001:db8::9"]},
  {"targets": ["10.3.0.7"], "labels": {"name": "b1"}}
])");
  Daemon d(dir, configText(dir / "state", sd));
  Millis now = 1000;
  d.run(now, 200);
  EXPECT_TRUE(d.state("d-10-3-0-5"));
  EXPECT_TRUE(d.state("d-10-3-0-6"));
  EXPECT_EQ(d.origin("d-10-3-0-5"), "discovered:cloud");
  EXPECT_EQ(d.origin("b1"), "file");
  // The VIP, loopback, the port's own, b1's address, an IPv6 backend on a
  // port without an IPv6 source, b1's name: none applied, each counted.
  for (const char* n :
       {"d-192-0-2-1", "d-127-0-0-1", "d-10-0-0-1", "d-10-0-0-11", "d-2001-db8--9"}) {
    EXPECT_FALSE(d.state(n)) << n;
  }
  EXPECT_EQ(d.cp().config().backends.size(), 3u);
  const Json s = d.source();
  EXPECT_EQ(s["joined"], 2);
  EXPECT_EQ(s["invalid"], 6) << s.dump();
  EXPECT_EQ(s["errors"], 0);
  EXPECT_EQ(s["entries"].size(), 8u);
  const std::string metrics = d.cp().metricsText();
  EXPECT_NE(metrics.find("spillway_discovery_joined_total{pool=\"cloud\"} 2"), std::string::npos);
  EXPECT_NE(metrics.find("spillway_discovery_invalid_total{pool=\"cloud\"} 6"), std::string::npos);
  // The same file on another instance gives the same ids.
  for (const BackendConfig& b : d.cp().config().backends) {
    if (b.name == "d-10-3-0-5") {
      EXPECT_EQ(b.id, discoveredBackendId(b.address));
      EXPECT_EQ(b.weight, 50u);
    }
  }
}

TEST(ControlDiscovery, EncapMustBeThePoolsAndMetricsUrlIsWhereLoadIsRead) {
  TempDir dir;
  const std::string sd = dir / "cloud.json";
  Daemon probe(dir, configText(dir / "state0", dir / "none.json"));
  PoolEncap encap = PoolEncap::IpIp;
  for (const PoolConfig& p : probe.cp().config().pools) {
    if (p.name == "cloud") encap = p.encap;
  }
  const std::string same(toString(encap));
  const std::string other(toString(encap == PoolEncap::Gue ? PoolEncap::IpIp : PoolEncap::Gue));
  writeAll(sd, "[{\"targets\": [\"10.3.0.5\"], \"labels\": {\"encap\": \"" + same +
                   "\", \"metrics\": \"http://10.3.0.5:9500/gpu\"}},\n"
                   " {\"targets\": [\"10.3.0.6\"], \"labels\": {\"encap\": \"" +
                   other + "\"}},\n {\"targets\": [\"10.3.0.7\"]}]\n");
  Daemon d(dir, configText(dir / "state", sd));
  Millis now = 1000;
  d.run(now, 200);
  EXPECT_TRUE(d.state("d-10-3-0-5"));
  EXPECT_TRUE(d.state("d-10-3-0-7"));
  EXPECT_FALSE(d.state("d-10-3-0-6"));  // decapsulates what its pool does not send
  const Json s = d.source();
  EXPECT_EQ(s["joined"], 2);
  EXPECT_EQ(s["invalid"], 1);
  ASSERT_EQ(s["last_invalid"].size(), 1u);
  const std::string why = s["last_invalid"][0].get<std::string>();
  EXPECT_NE(why.find("encap " + other + " is not pool cloud's " + same), std::string::npos) << why;
  // The metrics URL: shown in the dump, and where the pool's load scrape
  // reads that backend; the others keep the pool's port and path.
  const Json dump = std::get<Json>(d.cp().configDump(true));
  LoadSourceConfig pool;
  pool.enabled = true;
  pool.port = 9400;
  pool.path = "/metrics";
  int seen = 0;
  for (const Json& b : dump["backends"]) {
    if (b["name"] == "d-10-3-0-5") {
      EXPECT_EQ(b["metrics"], "http://10.3.0.5:9500/gpu");
      ++seen;
    } else {
      EXPECT_FALSE(b.contains("metrics")) << b.dump();
    }
  }
  EXPECT_EQ(seen, 1);
  for (const BackendConfig& b : d.cp().config().backends) {
    const LoadSourceConfig l = loadSourceFor(pool, b);
    EXPECT_TRUE(l.enabled);
    EXPECT_EQ(l.port, b.name == "d-10-3-0-5" ? 9500 : 9400) << b.name;
    EXPECT_EQ(l.path, b.name == "d-10-3-0-5" ? "/gpu" : "/metrics") << b.name;
  }
}

TEST(ControlDiscovery, AbsentForHoldDrainsThenRemoved) {
  TempDir dir;
  const std::string sd = dir / "cloud.json";
  writeAll(sd, targets({"10.3.0.5", "10.3.0.6"}));
  Daemon d(dir, configText(dir / "state", sd));
  Millis now = 1000;
  d.run(now, 200);
  ASSERT_TRUE(d.state("d-10-3-0-6"));
  d.setFlows(3);  // live flows: the drain waits for them
  replace(sd, targets({"10.3.0.5"}));
  d.run(now, 4800);  // within the hold: nothing moves
  EXPECT_NE(d.state("d-10-3-0-6"), "draining");
  EXPECT_EQ(d.source()["left"], 0);
  d.run(now, 500);  // past it: drains like `backend remove`, flows continue
  EXPECT_EQ(d.state("d-10-3-0-6"), "draining");
  EXPECT_EQ(d.source()["left"], 1);
  EXPECT_EQ(d.state("d-10-3-0-5") == std::nullopt, false);
  d.setFlows(0);  // its flows ended: removed
  d.run(now, 3000);
  EXPECT_FALSE(d.state("d-10-3-0-6"));
  EXPECT_EQ(d.source()["entries"].size(), 1u);
  // Listed again: it joins again.
  replace(sd, targets({"10.3.0.5", "10.3.0.6"}));
  d.run(now, 200);
  EXPECT_TRUE(d.state("d-10-3-0-6"));
}

TEST(ControlDiscovery, FlappingAnswerDamped) {
  TempDir dir;
  const std::string sd = dir / "cloud.json";
  writeAll(sd, targets({"10.3.0.5", "10.3.0.6"}));
  Daemon d(dir, configText(dir / "state", sd));
  Millis now = 1000;
  d.run(now, 200);
  for (int i = 0; i < 5; ++i) {
    replace(sd, targets({"10.3.0.5"}));
    d.run(now, 2000);
    replace(sd, targets({"10.3.0.5", "10.3.0.6"}));
    d.run(now, 2000);
  }
  EXPECT_TRUE(d.state("d-10-3-0-6"));
  EXPECT_NE(d.state("d-10-3-0-6"), "draining");
  EXPECT_EQ(d.source()["left"], 0);
  EXPECT_EQ(d.source()["damped"], 5);
}

TEST(ControlDiscovery, MalformedFileKeepsLastGoodSet) {
  TempDir dir;
  const std::string sd = dir / "cloud.json";
  writeAll(sd, targets({"10.3.0.5", "10.3.0.6"}));
  Daemon d(dir, configText(dir / "state", sd));
  Millis now = 1000;
  d.run(now, 200);
  replace(sd, "[{\"targets\": [\"10.3.0.5\"");  // torn
  d.run(now, 10'000);                           // well past the hold
  EXPECT_TRUE(d.state("d-10-3-0-6"));
  EXPECT_NE(d.state("d-10-3-0-6"), "draining");
  const Json s = d.source();
  EXPECT_EQ(s["errors"], 1);
  ASSERT_TRUE(s["last_error"].is_string());
  EXPECT_NE(s["last_error"].get<std::string>().find("line 1"), std::string::npos);
  EXPECT_NE(d.cp().metricsText().find("spillway_discovery_failing{pool=\"cloud\"} 1"),
            std::string::npos);
  fs::remove(sd);  // gone: also keeps the set
  d.run(now, 10'000);
  EXPECT_NE(d.state("d-10-3-0-6"), "draining");
}

TEST(ControlDiscovery, OperatorIntentWins) {
  TempDir dir;
  const std::string sd = dir / "cloud.json";
  writeAll(sd, targets({"10.3.0.5", "10.3.0.6", "10.3.0.7"}));
  Daemon d(dir, configText(dir / "state", sd));
  Millis now = 1000;
  d.run(now, 200);
  d.setFlows(2);
  ASSERT_FALSE(std::holds_alternative<ApiError>(d.cp().backendDrain("d-10-3-0-5")));
  ASSERT_FALSE(std::holds_alternative<ApiError>(d.cp().backendDisable("d-10-3-0-6")));
  ASSERT_FALSE(std::holds_alternative<ApiError>(d.cp().backendRemove("d-10-3-0-7")));
  d.setFlows(0);
  // Refreshes that keep listing them undo nothing.
  for (int i = 0; i < 3; ++i) {
    replace(sd, targets({"10.3.0.5", "10.3.0.6", "10.3.0.7"},
                        "{\"job\": \"" + std::to_string(i) + "\"}"));
    d.run(now, 3000);
  }
  EXPECT_EQ(d.state("d-10-3-0-5"), "draining");
  EXPECT_EQ(d.state("d-10-3-0-6"), "disabled");
  EXPECT_FALSE(d.state("d-10-3-0-7"));  // removed, not added back
  EXPECT_EQ(d.source()["joined"], 3);
  // A reload keeps discovered backends and the operator's states.
  ASSERT_FALSE(std::holds_alternative<ApiError>(d.cp().configReload(d.path())));
  d.run(now, 1000);
  EXPECT_EQ(d.state("d-10-3-0-5"), "draining");
  EXPECT_EQ(d.state("d-10-3-0-6"), "disabled");
  EXPECT_FALSE(d.state("d-10-3-0-7"));
  EXPECT_EQ(d.origin("d-10-3-0-5"), "discovered:cloud");
  // Once the source stops listing the removed one, listing it again adds it.
  replace(sd, targets({"10.3.0.5", "10.3.0.6"}));
  d.run(now, 6000);
  replace(sd, targets({"10.3.0.5", "10.3.0.6", "10.3.0.7"}));
  d.run(now, 200);
  EXPECT_TRUE(d.state("d-10-3-0-7"));
}

TEST(ControlDiscovery, OperatorIntentSurvivesRestartsAndReloads) {
  TempDir dir;
  const std::string sd = dir / "cloud.json";
  writeAll(sd, targets({"10.3.0.5", "10.3.0.6", "10.3.0.7", "10.3.0.8"}));
  const std::string text = configText(dir / "state", sd);
  {
    Daemon d(dir, text);
    Millis now = 1000;
    d.run(now, 200);
    d.setFlows(2);
    ASSERT_FALSE(std::holds_alternative<ApiError>(d.cp().backendDrain("d-10-3-0-5")));
    ASSERT_FALSE(std::holds_alternative<ApiError>(d.cp().backendDisable("d-10-3-0-6")));
    ASSERT_FALSE(std::holds_alternative<ApiError>(d.cp().backendRemove("d-10-3-0-7")));
    d.setFlows(0);
    d.run(now, 3000);
    EXPECT_FALSE(d.state("d-10-3-0-7"));
    // A reload after the removal completed keeps it in the journal.
    ASSERT_FALSE(std::holds_alternative<ApiError>(d.cp().configReload(d.path())));
    d.run(now, 1000);
    EXPECT_FALSE(d.state("d-10-3-0-7"));
  }
  for (int restart = 0; restart < 2; ++restart) {
    Daemon d(dir, text);
    Millis now = 1000;
    EXPECT_EQ(d.state("d-10-3-0-5"), "draining") << restart;
    EXPECT_EQ(d.state("d-10-3-0-6"), "disabled") << restart;
    EXPECT_EQ(d.origin("d-10-3-0-5"), "discovered:cloud");
    EXPECT_TRUE(d.state("d-10-3-0-8"));
    d.setFlows(2);
    d.run(now, 3000);
    EXPECT_FALSE(d.state("d-10-3-0-7")) << restart;  // not added back
    EXPECT_EQ(d.state("d-10-3-0-5"), "draining");
    ASSERT_FALSE(std::holds_alternative<ApiError>(d.cp().configReload(d.path())));
    d.run(now, 1000);
    EXPECT_EQ(d.state("d-10-3-0-6"), "disabled");
    EXPECT_FALSE(d.state("d-10-3-0-7"));
  }
  // Clearing the operator's overrides gives the source its say again.
  Daemon d(dir, text);
  Millis now = 1000;
  ASSERT_FALSE(std::holds_alternative<ApiError>(d.cp().configClearOverrides("")));
  d.run(now, 500);
  EXPECT_TRUE(d.state("d-10-3-0-7"));
  EXPECT_NE(d.state("d-10-3-0-6"), "disabled");
}

// The state directory's tables.json names the discovered backends.
Json savedTables(const TempDir& dir) {
  std::ifstream in(dir / "state/tables.json");
  std::stringstream text;
  text << in.rdbuf();
  return Json::parse(text.str(), nullptr, false);
}

// A state directory and a file listing two cloud backends, for plane restarts.
struct RestartEstate {
  TempDir dir;
  std::string sd = dir / "cloud.json";
  std::string text = configText(dir / "state", sd);
  RestartEstate() { writeAll(sd, targets({"10.3.0.5", "10.3.0.6"})); }
};

TEST(ControlDiscovery, LeavingBackendDrainsOnThroughARestart) {
  const RestartEstate e;
  const TempDir& dir = e.dir;
  const std::string& sd = e.sd;
  const std::string& text = e.text;
  {
    Daemon d(dir, text);
    Millis now = 1000;
    d.run(now, 200);
    d.setFlows(3);
    replace(sd, targets({"10.3.0.5"}));
    d.run(now, 5500);
    ASSERT_EQ(d.state("d-10-3-0-6"), "draining");
    d.run(now, 2000);  // the tables after the drain began are checkpointed
    bool leaving = false;
    const Json saved = savedTables(dir);
    for (const Json& b : saved["discovered"]) {
      if (b["name"] == "d-10-3-0-6") leaving = b.contains("leaving_since_unix_ms");
    }
    ASSERT_TRUE(leaving) << savedTables(dir).dump();
  }
  // The source no longer lists it; the restarted plane has it back in its
  // drain (its flows keep their backend) rather than forgetting it.
  {
    Daemon d(dir, text);
    Millis now = 1000;
    EXPECT_EQ(d.state("d-10-3-0-6"), "draining");
    EXPECT_EQ(d.origin("d-10-3-0-6"), "discovered:cloud");
    EXPECT_NE(d.state("d-10-3-0-5"), "draining");
    d.setFlows(3);
    d.run(now, 3000);
    EXPECT_EQ(d.state("d-10-3-0-6"), "draining");
    d.setFlows(0);  // its flows ended: removed, and no longer saved
    d.run(now, 3000);
    EXPECT_FALSE(d.state("d-10-3-0-6"));
    d.setFlows(1);
    d.run(now, 2000);
    const Json saved = savedTables(dir);
    ASSERT_EQ(saved["discovered"].size(), 1u) << saved.dump();
    EXPECT_EQ(saved["discovered"][0]["name"], "d-10-3-0-5");
  }
  Daemon d(dir, text);
  EXPECT_FALSE(d.state("d-10-3-0-6"));  // not added back by a later restart
  EXPECT_TRUE(d.state("d-10-3-0-5"));
}

TEST(ControlDiscovery, RestartStartsFromTheLastSetWhenTheSourceFailsOrDropsOne) {
  const RestartEstate e;
  const TempDir& dir = e.dir;
  const std::string& sd = e.sd;
  const std::string& text = e.text;
  {
    Daemon d(dir, text);
    Millis now = 1000;
    d.run(now, 2200);
  }
  // The file is torn at the restart: the backends the tables had stay,
  // active, until the source answers.
  writeAll(sd, "[{\"targets\": [\"10.3.0.5\"");
  {
    Daemon d(dir, text);
    Millis now = 1000;
    EXPECT_TRUE(d.source()["last_error"].is_string());
    d.setFlows(2);
    d.run(now, 6000);
    EXPECT_EQ(d.state("d-10-3-0-5"), "active");
    EXPECT_EQ(d.state("d-10-3-0-6"), "active");
    // The source answers without one: it leaves after the hold, as at run time.
    replace(sd, targets({"10.3.0.5"}));
    d.run(now, 4000);
    EXPECT_EQ(d.state("d-10-3-0-6"), "active");
    d.run(now, 1500);
    EXPECT_EQ(d.state("d-10-3-0-6"), "draining");
  }
  // Listed before the restart, missing from the first answer after it: in
  // the tables for the hold (a flapping answer moves nothing), then drains.
  writeAll(sd, targets({"10.3.0.5", "10.3.0.6", "10.3.0.7"}));
  {
    Daemon d(dir, text);
    Millis now = 1000;
    d.setFlows(0);
    d.run(now, 6000);  // the drain above completes; 10.3.0.7 joins
    EXPECT_FALSE(d.state("d-10-3-0-6") == std::optional<std::string>("draining"));
    d.run(now, 2000);
  }
  writeAll(sd, targets({"10.3.0.5", "10.3.0.6"}));
  Daemon d(dir, text);
  Millis now = 1000;
  EXPECT_EQ(d.state("d-10-3-0-7"), "active");
  d.setFlows(2);
  d.run(now, 4000);
  EXPECT_EQ(d.state("d-10-3-0-7"), "active");
  d.run(now, 1500);
  EXPECT_EQ(d.state("d-10-3-0-7"), "draining");
}

TEST(ControlDiscovery, PoolCapBoundsJoins) {
  TempDir dir;
  const std::string sd = dir / "cloud.json";
  std::string text = "[{\"targets\": [";
  for (int i = 1; i <= 40; ++i) {
    text += std::string(i == 1 ? "" : ", ") + "\"10.4.0." + std::to_string(i) + "\"";
  }
  writeAll(sd, text + "]}]");
  Daemon d(dir, configText(dir / "state", sd, ", max_entries = 30, max_pool_backends = 20"));
  Millis now = 1000;
  d.run(now, 200);
  EXPECT_EQ(d.cp().config().backends.size(), 21u);  // b1 + 20
  const Json s = d.source();
  EXPECT_EQ(s["joined"], 20);
  EXPECT_EQ(s["invalid"], 2) << s.dump();  // 10 beyond max_entries, 10 beyond the pool cap
  EXPECT_EQ(s["entries"].size(), 30u);
}

TEST(ControlDiscovery, ConfigRefusesBadDiscovery) {
  TempDir dir;
  writeAll(dir / "c.toml", configText(dir / "state", "relative.json"));
  EXPECT_FALSE(loadConfig(dir / "c.toml").ok());
  std::string t = configText(dir / "state", "/x/y.json");
  t.replace(t.find("kind = \"file\""), 13, "kind = \"dns\"");
  writeAll(dir / "c.toml", t);
  EXPECT_FALSE(loadConfig(dir / "c.toml").ok());
  writeAll(dir / "c.toml", configText(dir / "state", "/x/y.json", ", max_entries = 100000"));
  EXPECT_FALSE(loadConfig(dir / "c.toml").ok());
  writeAll(dir / "c.toml", configText(dir / "state", "/x/y.json", ", bogus = 1"));
  EXPECT_FALSE(loadConfig(dir / "c.toml").ok());
  writeAll(dir / "c.toml", configText(dir / "state", "/x/y.json"));
  EXPECT_TRUE(loadConfig(dir / "c.toml").ok());
}

}  // namespace
}  // namespace spillway
