// The control-side snapshot builder and next-hop resolution: encapsulation per
// family, weights and states in Maglev shares, stable indices across reloads,
// order independence, unresolved next hops, and the kernel parsers on
// synthetic input (no kernel, no root).
#include "control/backends/snapshot_builder.hpp"

#include <gtest/gtest.h>
#include <linux/neighbour.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "control/backends/neighbours.hpp"
#include "control/config/config.hpp"
#include "estate_fixture.hpp"

namespace spillway {
namespace {

constexpr MacAddress kRouterMac{0x02, 0, 0, 0, 0, 0xaa};
constexpr MacAddress kPortMac{0x02, 0, 0, 0, 0, 0x01};

std::string header(const std::string& portExtra = "next_hop_mac = \"02:00:00:00:00:aa\"\n") {
  return R"([dataplane]
lcores = [1]
hash_seed = "0x0123456789abcdef"

[[port]]
name = "p0"
devargs = "net_ring0"
address = "10.0.0.1"
address6 = "fd00::1"
mtu = 1400
vlan = 7
)" + portExtra +
         R"(
[[pool]]
name = "onprem"
site = "onprem"
encap = "ipip"

[[pool]]
name = "cloud"
site = "cloud"
encap = "gue"
gue_port = 7000

[[vip]]
name = "v4"
address = "192.0.2.1"
protocol = "tcp"
pools = ["onprem", "cloud"]
answer_ping = true

[[vip]]
name = "v6"
address = "2001:db8::1"
protocol = "tcp"
port = 443
table_size = 1009
pools = ["cloud"]
)";
}

using test::backendToml;

const std::vector<std::string> kBackends = {
    backendToml("a1", "10.0.1.1", "onprem"),
    backendToml("a2", "10.0.1.2", "onprem", "weight = 200\n"),
    backendToml("a3", "fd00:1::3", "onprem"),
    backendToml("c1", "10.9.0.1", "cloud"),
    backendToml("c2", "fd09::2", "cloud", "mac = \"02:00:00:00:00:c2\"\n"),
};

Config load(const std::string& text) {
  ConfigResult r = loadConfigFromString(text, "test.toml");
  EXPECT_TRUE(r.ok()) << formatErrors(r.errors()) << text;
  if (!r.ok()) return Config{};
  return std::move(r).value();
}

Config estate(const std::vector<std::string>& backends = kBackends,
              const std::string& portExtra = "next_hop_mac = \"02:00:00:00:00:aa\"\n") {
  std::string text = header(portExtra);
  for (const std::string& b : backends) text += b;
  return load(text);
}

// The estate with a second-chance hold of 5 s.
Config secondChanceEstate() {
  Config c = estate();
  c.dataplane.secondChanceHoldMs = 5'000;
  return c;
}

std::uint64_t id(const char* name) {
  return backendIdFromName(name);
}

IpBytes ipb(const char* text) {
  return parseIpAddress(text).value().bytes;
}

SnapshotBuilder builderFor(Config config) {
  SnapshotBuilder b;
  EXPECT_FALSE(b.setConfig(std::move(config)));
  b.setPortMac(0, kPortMac);
  return b;
}

// Slots owned by each backend index in a table.
std::map<std::uint32_t, std::uint32_t> owners(const MaglevTable& table) {
  std::map<std::uint32_t, std::uint32_t> m;
  for (std::uint32_t e : table.entries()) ++m[e];
  return m;
}

const SnapshotVip& vipNamed(const ForwardingSnapshot& s, const std::string& name) {
  auto it = std::find_if(s.vips.begin(), s.vips.end(),
                         [&](const SnapshotVip& v) { return v.name == name; });
  EXPECT_NE(it, s.vips.end()) << name;
  return *it;
}

void expectSameBackend(const SnapshotBackend& a, const SnapshotBackend& b) {
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.state, b.state);
  EXPECT_EQ(a.egressPort, b.egressPort);
  EXPECT_EQ(a.encap.kind, b.encap.kind);
  EXPECT_EQ(a.encap.source, b.encap.source);
  EXPECT_EQ(a.encap.backend, b.encap.backend);
  EXPECT_EQ(a.encap.nextHopMac, b.encap.nextHopMac);
  EXPECT_EQ(a.encap.ourMac, b.encap.ourMac);
  EXPECT_EQ(a.encap.vlanTci, b.encap.vlanTci);
  EXPECT_EQ(a.encap.gueDstPort, b.encap.gueDstPort);
  EXPECT_EQ(a.encap.mtu, b.encap.mtu);
}

TEST(SnapshotBuilder, EncapKindsAndSourcesPerFamily) {
  SnapshotBuilder b = builderFor(estate());
  b.setPortId(0, 3);
  auto s = b.build(17);
  ASSERT_TRUE(s) << b.lastError();
  EXPECT_EQ(s->generation, 17u);
  ASSERT_EQ(s->backends.size(), 6u);  // "none" + 5
  EXPECT_EQ(s->backends[0].id, 0u);

  struct Want {
    const char* name;
    EncapKind kind;
    const char* source;
    const char* address;
    std::uint16_t guePort;
    MacAddress nextHop;
  };
  const Want wants[] = {
      {"a1", EncapKind::IpInIp4, "10.0.0.1", "10.0.1.1", kGueDefaultPort, kRouterMac},
      {"a2", EncapKind::IpInIp4, "10.0.0.1", "10.0.1.2", kGueDefaultPort, kRouterMac},
      {"a3", EncapKind::IpInIp6, "fd00::1", "fd00:1::3", kGueDefaultPort, kRouterMac},
      {"c1", EncapKind::Gue4, "10.0.0.1", "10.9.0.1", 7000, kRouterMac},
      {"c2", EncapKind::Gue6, "fd00::1", "fd09::2", 7000, {0x02, 0, 0, 0, 0, 0xc2}},
  };
  for (const Want& w : wants) {
    SCOPED_TRACE(w.name);
    const std::uint32_t index = b.indexOf(id(w.name));
    ASSERT_NE(index, 0u);
    const SnapshotBackend* sb = s->backend(index);
    ASSERT_NE(sb, nullptr);
    EXPECT_EQ(sb->id, id(w.name));
    EXPECT_EQ(sb->state, BackendState::Active);
    EXPECT_EQ(sb->egressPort, 3);
    EXPECT_EQ(sb->encap.kind, w.kind);
    EXPECT_EQ(sb->encap.source, ipb(w.source));
    EXPECT_EQ(sb->encap.backend, ipb(w.address));
    EXPECT_EQ(sb->encap.gueDstPort, w.guePort);
    EXPECT_EQ(sb->encap.nextHopMac, w.nextHop);
    EXPECT_EQ(sb->encap.ourMac, kPortMac);
    EXPECT_EQ(sb->encap.vlanTci, std::optional<std::uint16_t>(7));
    EXPECT_EQ(sb->encap.mtu, 1400);
    EXPECT_EQ(sb->encap.outerTtl, kDefaultOuterTtl);
  }
}

TEST(SnapshotBuilder, VipIndexFindsEachVip) {
  SnapshotBuilder b = builderFor(estate());
  auto s = b.build(1);
  ASSERT_TRUE(s);
  ASSERT_EQ(s->vips.size(), 2u);
  EXPECT_EQ(s->vipIndex.find(ipb("192.0.2.1"), IpVersion::V4, 6, 12345), 0u);
  EXPECT_EQ(s->vipIndex.find(ipb("2001:db8::1"), IpVersion::V6, 6, 443), 1u);
  EXPECT_EQ(s->vipIndex.find(ipb("2001:db8::1"), IpVersion::V6, 6, 80), VipIndex::kNone);
  EXPECT_EQ(s->vipIndex.find(ipb("192.0.2.1"), IpVersion::V4, 17, 53), VipIndex::kNone);
  // The gateway's own port addresses reach the data path (issue #13: a VIP
  // packet from one of them is forged), and are not VIP addresses.
  EXPECT_TRUE(s->vipIndex.isOwnAddress(ipb("10.0.0.1"), IpVersion::V4));
  EXPECT_TRUE(s->vipIndex.isOwnAddress(ipb("fd00::1"), IpVersion::V6));
  EXPECT_TRUE(s->vipIndex.isOwnAddress(ipb("192.0.2.1"), IpVersion::V4));
  EXPECT_FALSE(s->vipIndex.isOwnAddress(ipb("10.0.1.1"), IpVersion::V4));  // a backend
  EXPECT_FALSE(s->vipIndex.isVipAddress(ipb("10.0.0.1"), IpVersion::V4));
  EXPECT_EQ(s->gatewayAddresses.size(), 2u);
  EXPECT_TRUE(s->vips[0].answerEcho);
  EXPECT_FALSE(s->vips[1].answerEcho);
  EXPECT_EQ(s->vips[0].table.size(), 65537u);
  EXPECT_EQ(s->vips[1].table.size(), 1009u);
  EXPECT_EQ(s->vips[1].key.port, 443);
  EXPECT_EQ(s->vips[1].key.proto, 6);
}

TEST(SnapshotBuilder, WeightsAndStatesShapeTheShares) {
  SnapshotBuilder b = builderFor(estate());
  auto s = b.build(1);
  ASSERT_TRUE(s);
  const std::uint32_t a1 = b.indexOf(id("a1"));
  const std::uint32_t a2 = b.indexOf(id("a2"));
  const std::uint32_t c1 = b.indexOf(id("c1"));
  auto own = owners(vipNamed(*s, "v4").table);
  EXPECT_EQ(own.count(0), 0u);  // every slot has a backend
  // Total weight 600 over 65537 slots: a2 (200) owns about twice a1 (100).
  EXPECT_NEAR(own[a2] / 65537.0, 200.0 / 600.0, 0.01);
  EXPECT_NEAR(own[a1] / 65537.0, 100.0 / 600.0, 0.01);
  // The v6 VIP serves only the cloud pool.
  auto own6 = owners(vipNamed(*s, "v6").table);
  EXPECT_EQ(own6.size(), 2u);
  EXPECT_GT(own6[c1], 0u);

  for (BackendState st : {BackendState::Disabled, BackendState::Draining, BackendState::Failed}) {
    ASSERT_TRUE(b.setState(id("a2"), st));
    s = b.build(2);
    ASSERT_TRUE(s);
    own = owners(vipNamed(*s, "v4").table);
    EXPECT_EQ(own.count(a2), 0u) << static_cast<int>(st);
    // Still in backends[] with its index, state and encapsulation.
    ASSERT_NE(s->backend(a2), nullptr);
    EXPECT_EQ(s->backend(a2)->id, id("a2"));
    EXPECT_EQ(s->backend(a2)->state, st);
    EXPECT_EQ(s->backend(a2)->encap.backend, ipb("10.0.1.2"));
    const auto& shares = b.lastBuild()[0].shares;
    auto share = std::find_if(shares.begin(), shares.end(),
                              [&](const MaglevShare& m) { return m.id == id("a2"); });
    ASSERT_NE(share, shares.end());
    EXPECT_EQ(share->entries, 0u);
    EXPECT_EQ(share->backendIndex, a2);
  }
  ASSERT_TRUE(b.setState(id("a2"), BackendState::Active));
  ASSERT_TRUE(b.setEffectiveWeight(id("a1"), 0));
  EXPECT_FALSE(b.setEffectiveWeight(id("a1"), kMaxBackendWeight + 1));
  EXPECT_FALSE(b.setState(12345, BackendState::Active));
  s = b.build(3);
  own = owners(vipNamed(*s, "v4").table);
  EXPECT_EQ(own.count(a1), 0u);
  EXPECT_GT(own[a2], 0u);
}

TEST(SnapshotBuilder, ChangedCountsAndUnchangedVipsAreReused) {
  SnapshotBuilder b = builderFor(estate());
  auto first = b.build(1);
  ASSERT_TRUE(first);
  ASSERT_EQ(b.lastBuild().size(), 2u);
  EXPECT_TRUE(b.lastBuild()[0].rebuilt);
  EXPECT_EQ(b.lastBuild()[0].changed, 65537u);  // new: every slot counts

  auto second = b.build(2);
  ASSERT_TRUE(second);
  EXPECT_FALSE(b.lastBuild()[0].rebuilt);
  EXPECT_EQ(b.lastBuild()[0].changed, 0u);
  EXPECT_EQ(first->vips[0].table, second->vips[0].table);
  EXPECT_EQ(b.lastBuild()[0].shares.size(), 5u);

  // Disabling c1 moves about its share of v4's slots and leaves v6 to c2.
  const std::uint32_t c1 = b.indexOf(id("c1"));
  const std::uint32_t owned = owners(first->vips[0].table)[c1];
  ASSERT_TRUE(b.setState(id("c1"), BackendState::Disabled));
  auto third = b.build(3);
  ASSERT_TRUE(third);
  EXPECT_TRUE(b.lastBuild()[0].rebuilt);
  EXPECT_EQ(b.lastBuild()[0].changed, countChanged(second->vips[0].table, third->vips[0].table));
  EXPECT_GE(b.lastBuild()[0].changed, owned);
  EXPECT_LT(b.lastBuild()[0].changed, owned + owned / 2);
  EXPECT_EQ(owners(third->vips[1].table).size(), 1u);
}

TEST(SnapshotBuilder, StableIndicesAcrossReloadsWithRemovalAndAddition) {
  SnapshotBuilder b = builderFor(estate());
  ASSERT_TRUE(b.build(1));
  std::map<std::string, std::uint32_t> before;
  for (const char* n : {"a1", "a2", "a3", "c1", "c2"}) before[n] = b.indexOf(id(n));
  std::vector<std::uint32_t> all;
  for (auto& [n, i] : before) all.push_back(i);
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<std::uint32_t>{1, 2, 3, 4, 5}));

  // Remove a2, add a4.
  std::vector<std::string> next = kBackends;
  next.erase(next.begin() + 1);
  next.push_back(backendToml("a4", "10.0.1.4", "onprem"));
  ASSERT_FALSE(b.setConfig(estate(next)));
  auto s = b.build(2);
  ASSERT_TRUE(s);
  for (const char* n : {"a1", "a3", "c1", "c2"}) EXPECT_EQ(b.indexOf(id(n)), before[n]) << n;
  EXPECT_EQ(b.indexOf(id("a4")), 6u);  // not a2's index: it retires, unpurged
  ASSERT_EQ(s->backends.size(), 7u);
  EXPECT_EQ(s->backend(before["a2"])->id, id("a2"));
  EXPECT_EQ(s->backend(before["a2"])->state, BackendState::Removed);
  EXPECT_EQ(owners(vipNamed(*s, "v4").table).count(before["a2"]), 0u);
  EXPECT_FALSE(b.setState(id("a2"), BackendState::Active));  // not configured now

  // a2 comes back before its index was purged: same index, its initial state again.
  next.push_back(kBackends[1]);
  ASSERT_FALSE(b.setConfig(estate(next)));
  s = b.build(3);
  ASSERT_TRUE(s);
  EXPECT_EQ(b.indexOf(id("a2")), before["a2"]);
  EXPECT_EQ(s->backend(before["a2"])->state, BackendState::Active);
  EXPECT_EQ(s->backends.size(), 7u);
  EXPECT_GT(owners(vipNamed(*s, "v4").table)[before["a2"]], 0u);
}

TEST(SnapshotBuilder, ReloadKeepsRuntimeStateButAppliesConfigChanges) {
  SnapshotBuilder b = builderFor(estate());
  ASSERT_TRUE(b.setState(id("a1"), BackendState::Draining));
  ASSERT_TRUE(b.setEffectiveWeight(id("a1"), 7));
  ASSERT_TRUE(b.setEffectiveWeight(id("a3"), 9));
  std::vector<std::string> next = kBackends;
  next[2] = backendToml("a3", "fd00:1::3", "onprem", "weight = 150\n");
  ASSERT_FALSE(b.setConfig(estate(next)));
  EXPECT_EQ(b.runtime(id("a1"))->state, BackendState::Draining);
  EXPECT_EQ(b.runtime(id("a1"))->effectiveWeight, 7u);
  EXPECT_EQ(b.runtime(id("a3"))->effectiveWeight, 150u);  // the configured weight changed

  next[3] = backendToml("c1", "10.9.0.1", "cloud", "state = \"disabled\"\n");
  ASSERT_FALSE(b.setConfig(estate(next)));
  EXPECT_EQ(b.runtime(id("c1"))->state, BackendState::Disabled);
}

TEST(SnapshotBuilder, TablesDoNotDependOnTheOrderOfBackendsInTheFile) {
  std::vector<std::string> reversed(kBackends.rbegin(), kBackends.rend());
  SnapshotBuilder x = builderFor(estate());
  SnapshotBuilder y = builderFor(estate(reversed));
  ASSERT_TRUE(x.setState(id("a3"), BackendState::Disabled));
  ASSERT_TRUE(y.setState(id("a3"), BackendState::Disabled));
  auto sx = x.build(1);
  auto sy = y.build(1);
  ASSERT_TRUE(sx);
  ASSERT_TRUE(sy);
  ASSERT_EQ(sx->vips.size(), sy->vips.size());
  for (std::size_t v = 0; v < sx->vips.size(); ++v) {
    EXPECT_EQ(sx->vips[v].table, sy->vips[v].table) << sx->vips[v].name;
  }
  ASSERT_EQ(sx->backends.size(), sy->backends.size());
  for (std::size_t i = 0; i < sx->backends.size(); ++i) {
    SCOPED_TRACE(i);
    expectSameBackend(sx->backends[i], sy->backends[i]);
  }
}

// Tables are a pure function of ids, weights, states and seed: a next hop
// being resolved changes no slot (another instance, or this one after a
// restart, must pick the same backends). The data path drops packets to an
// unresolved backend (next_hop_unresolved) until its MAC is known.
TEST(SnapshotBuilder, UnresolvedNextHopsStayInTheTables) {
  // No static next hop: the kernel interface decides, and nothing is known yet.
  SnapshotBuilder b = builderFor(estate(kBackends, "kernel_interface = \"sw-p0\"\n"));
  auto s = b.build(1);
  ASSERT_TRUE(s);
  const std::uint32_t a1 = b.indexOf(id("a1"));
  const std::uint32_t c2 = b.indexOf(id("c2"));
  EXPECT_EQ(s->backend(a1)->state, BackendState::Active);
  EXPECT_FALSE(s->backend(a1)->nextHopResolved);
  EXPECT_TRUE(s->backend(c2)->nextHopResolved);  // its own mac
  EXPECT_EQ(s->backend(a1)->encap.nextHopMac, MacAddress{});
  EXPECT_FALSE(b.runtime(id("a1"))->nextHopMac);
  const auto before = owners(vipNamed(*s, "v4").table);
  EXPECT_GT(before.at(a1), 0u);

  ASSERT_TRUE(b.setNextHopMac(id("a1"), MacAddress{2, 0, 0, 0, 1, 1}));
  s = b.build(2);
  EXPECT_EQ(owners(vipNamed(*s, "v4").table), before);
  EXPECT_EQ(b.lastBuild()[0].changed, 0u);
  EXPECT_TRUE(s->backend(a1)->nextHopResolved);
  EXPECT_EQ(s->backend(a1)->encap.nextHopMac, (MacAddress{2, 0, 0, 0, 1, 1}));

  // Without our port's MAC no frame can be built: the same tables, nothing
  // resolved.
  SnapshotBuilder noPortMac;
  ASSERT_FALSE(noPortMac.setConfig(estate()));
  s = noPortMac.build(1);
  ASSERT_TRUE(s);
  EXPECT_FALSE(noPortMac.lastBuild()[0].allNone);
  for (std::size_t i = 1; i < s->backends.size(); ++i) {
    EXPECT_FALSE(s->backends[i].nextHopResolved) << i;
  }
}

TEST(SnapshotBuilder, ConfiguredPortMacIsUsedUntilTheDataplaneSaysOtherwise) {
  SnapshotBuilder b;
  ASSERT_FALSE(b.setConfig(estate(kBackends,
                                  "next_hop_mac = \"02:00:00:00:00:aa\"\n"
                                  "mac = \"02:00:00:00:00:77\"\n")));
  auto s = b.build(1);
  EXPECT_EQ(s->backend(1)->encap.ourMac, (MacAddress{2, 0, 0, 0, 0, 0x77}));
  EXPECT_EQ(s->backend(1)->egressPort, 0);
  b.setPortMac(0, kPortMac);
  b.setPortMac(5, kRouterMac);  // no such port: ignored
  s = b.build(2);
  EXPECT_EQ(s->backend(1)->encap.ourMac, kPortMac);
}

// A kernel made of maps.
class FakeNeighbours final : public NeighbourSource {
 public:
  std::map<std::pair<std::string, IpVersion>, std::vector<NeighbourEntry>> tables;
  std::map<std::string, std::string> gateways;  // destination text -> gateway text
  std::vector<std::string> solicited;

  NeighbourTable read(const std::string& interface, IpVersion family) override {
    ++reads;
    NeighbourTable t;
    auto it = tables.find({interface, family});
    if (it != tables.end()) t.entries = it->second;
    return t;
  }
  NeighbourRoute route(const IpAddress& destination, const std::string&) override {
    NeighbourRoute r;
    auto it = gateways.find(formatIpAddress(destination));
    r.neighbour = it == gateways.end() ? destination : parseIpAddress(it->second).value();
    return r;
  }
  std::optional<std::string> solicit(const IpAddress& destination,
                                     const std::string& interface) override {
    solicited.push_back(formatIpAddress(destination) + "@" + interface);
    return std::nullopt;
  }
  int reads = 0;
};

TEST(Neighbours, PrecedenceRoutedBackendsAndStickyMacs) {
  const Config config = estate(kBackends, "kernel_interface = \"sw-p0\"\n");
  FakeNeighbours kernel;
  const MacAddress a1Mac{2, 0, 0, 0, 1, 1};
  const MacAddress gwMac{2, 0, 0, 0, 9, 9};
  kernel.tables[{"sw-p0", IpVersion::V4}] = {{parseIpAddress("10.0.1.1").value(), a1Mac},
                                             {parseIpAddress("10.0.0.254").value(), gwMac}};
  kernel.gateways["10.9.0.1"] = "10.0.0.254";  // c1 is routed

  NeighbourResolver resolver(kernel);
  resolver.refresh(config);
  EXPECT_EQ(kernel.reads, 2);  // one per (interface, family) in use
  EXPECT_TRUE(resolver.problems().empty());
  auto backendNamed = [&](const char* n) -> const BackendConfig& {
    return *std::find_if(config.backends.begin(), config.backends.end(),
                         [&](const BackendConfig& b) { return b.name == n; });
  };
  EXPECT_EQ(resolver.resolve(config, backendNamed("a1")).mac, a1Mac);
  EXPECT_EQ(resolver.resolve(config, backendNamed("a1")).source, NextHopSource::Kernel);
  EXPECT_EQ(resolver.resolve(config, backendNamed("c1")).mac, gwMac);
  EXPECT_EQ(resolver.resolve(config, backendNamed("c2")).source, NextHopSource::Backend);
  EXPECT_EQ(resolver.resolve(config, backendNamed("a2")).source, NextHopSource::Unresolved);
  EXPECT_FALSE(resolver.resolve(config, backendNamed("a3")).mac);

  // The unresolved ones are solicited; the static and resolved ones are not.
  EXPECT_EQ(resolver.solicitUnresolved(config), 2u);
  EXPECT_EQ(kernel.solicited, (std::vector<std::string>{"10.0.1.2@sw-p0", "fd00:1::3@sw-p0"}));

  SnapshotBuilder b;
  ASSERT_FALSE(b.setConfig(config));
  b.setPortMac(0, kPortMac);
  EXPECT_EQ(b.refreshNextHops(resolver), 2u);  // a1 and c1; c2 was static
  EXPECT_EQ(b.runtime(id("c1"))->nextHopMac, gwMac);

  // The entry ages out of the kernel: the builder keeps the MAC it had.
  kernel.tables.clear();
  resolver.refresh(config);
  EXPECT_EQ(b.refreshNextHops(resolver), 0u);
  EXPECT_EQ(b.runtime(id("a1"))->nextHopMac, a1Mac);

  // A port-wide next hop wins over the kernel.
  const Config routed = estate(kBackends, "next_hop_mac = \"02:00:00:00:00:aa\"\n");
  EXPECT_EQ(resolver.resolve(routed, routed.backends[0]).source, NextHopSource::Port);
  EXPECT_EQ(resolver.resolve(routed, routed.backends[0]).mac, kRouterMac);
}

TEST(Neighbours, ReloadWithANewAddressForgetsTheResolvedMac) {
  SnapshotBuilder b;
  ASSERT_FALSE(b.setConfig(estate(kBackends, "kernel_interface = \"sw-p0\"\n")));
  ASSERT_TRUE(b.setNextHopMac(id("a1"), MacAddress{2, 0, 0, 0, 1, 1}));
  ASSERT_TRUE(b.setNextHopMac(id("c1"), MacAddress{2, 0, 0, 0, 1, 2}));
  std::vector<std::string> next = kBackends;
  next[0] = backendToml("a1", "10.0.1.100", "onprem");
  ASSERT_FALSE(b.setConfig(estate(next, "kernel_interface = \"sw-p0\"\n")));
  EXPECT_FALSE(b.runtime(id("a1"))->nextHopMac);
  EXPECT_TRUE(b.runtime(id("c1"))->nextHopMac);
}

TEST(Neighbours, ParsesProcNetArp) {
  const std::string text =
      "IP address       HW type     Flags       HW address            Mask     Device\n"
      "10.0.0.2         0x1         0x2         02:00:00:00:00:02     *        sw-p0\n"
      "10.0.0.3         0x1         0x0         00:00:00:00:00:00     *        sw-p0\n"
      "10.0.0.4         0x1         0x6         02:00:00:00:00:04     *        sw-p0\n"
      "10.0.0.5         0x1         0x2         02:00:00:00:00:05     *        eth0\n"
      "garbage\n";
  const auto entries = parseProcNetArp(text, "sw-p0");
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].address, parseIpAddress("10.0.0.2"));
  EXPECT_EQ(entries[0].mac, (MacAddress{2, 0, 0, 0, 0, 2}));
  EXPECT_EQ(entries[1].address, parseIpAddress("10.0.0.4"));
}

// Appends a netlink message of `type` with a fixed header and attributes.
template <class Fixed>
void appendMessage(std::vector<std::byte>& out, std::uint16_t type, const Fixed& fixed,
                   const std::vector<std::pair<std::uint16_t, std::vector<std::uint8_t>>>& attrs) {
  std::vector<std::byte> body(NLMSG_ALIGN(sizeof(Fixed)));
  std::memcpy(body.data(), &fixed, sizeof fixed);
  for (const auto& [t, data] : attrs) {
    rtattr a{};
    a.rta_type = t;
    a.rta_len = static_cast<unsigned short>(RTA_LENGTH(data.size()));
    const std::size_t at = body.size();
    body.resize(at + RTA_ALIGN(a.rta_len));
    std::memcpy(body.data() + at, &a, sizeof a);
    std::memcpy(body.data() + at + RTA_LENGTH(0), data.data(), data.size());
  }
  nlmsghdr h{};
  h.nlmsg_len = static_cast<std::uint32_t>(NLMSG_HDRLEN + body.size());
  h.nlmsg_type = type;
  const std::size_t at = out.size();
  out.resize(at + NLMSG_ALIGN(h.nlmsg_len));
  std::memcpy(out.data() + at, &h, sizeof h);
  std::memcpy(out.data() + at + NLMSG_HDRLEN, body.data(), body.size());
}

std::vector<std::uint8_t> v6(const char* text) {
  const IpBytes b = ipb(text);
  std::vector<std::uint8_t> out;
  for (std::byte x : b) out.push_back(std::to_integer<std::uint8_t>(x));
  return out;
}

TEST(Neighbours, ParsesAnRtmNeighDump) {
  std::vector<std::byte> dgram;
  auto neigh = [&](int ifindex, std::uint16_t state, const char* addr,
                   std::vector<std::uint8_t> mac) {
    ndmsg n{};
    n.ndm_family = AF_INET6;
    n.ndm_ifindex = ifindex;
    n.ndm_state = state;
    appendMessage(dgram, RTM_NEWNEIGH, n, {{NDA_DST, v6(addr)}, {NDA_LLADDR, std::move(mac)}});
  };
  neigh(4, NUD_REACHABLE, "fd00::2", {2, 0, 0, 0, 0, 2});
  neigh(4, NUD_STALE, "fd00::3", {2, 0, 0, 0, 0, 3});
  neigh(4, NUD_INCOMPLETE, "fd00::4", {0, 0, 0, 0, 0, 0});
  neigh(4, NUD_FAILED, "fd00::5", {2, 0, 0, 0, 0, 5});
  neigh(5, NUD_REACHABLE, "fd00::6", {2, 0, 0, 0, 0, 6});  // another interface
  std::vector<NeighbourEntry> out;
  NetlinkParse p = parseNeighbourDump(dgram, 4, IpVersion::V6, out);
  EXPECT_FALSE(p.done);
  EXPECT_FALSE(p.error);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].address, parseIpAddress("fd00::2"));
  EXPECT_EQ(out[1].mac, (MacAddress{2, 0, 0, 0, 0, 3}));

  std::vector<std::byte> done;
  appendMessage(done, NLMSG_DONE, std::int32_t{0}, {});
  p = parseNeighbourDump(done, 4, IpVersion::V6, out);
  EXPECT_TRUE(p.done);

  // Truncated: the header claims more than the datagram holds.
  std::vector<std::byte> cut(dgram.begin(), dgram.begin() + 20);
  p = parseNeighbourDump(cut, 4, IpVersion::V6, out);
  EXPECT_TRUE(p.error);
}

TEST(Neighbours, ParsesRouteReplies) {
  const IpAddress dst = parseIpAddress("fd09::2").value();
  rtmsg r{};
  r.rtm_family = AF_INET6;
  r.rtm_type = RTN_UNICAST;
  std::vector<std::byte> viaGateway;
  appendMessage(viaGateway, RTM_NEWROUTE, r, {{RTA_GATEWAY, v6("fd00::fe")}});
  NeighbourRoute route = parseRouteReply(viaGateway, dst);
  EXPECT_FALSE(route.error);
  EXPECT_EQ(route.neighbour, parseIpAddress("fd00::fe"));

  std::vector<std::byte> onLink;
  appendMessage(onLink, RTM_NEWROUTE, r, {});
  EXPECT_EQ(parseRouteReply(onLink, dst).neighbour, dst);

  nlmsgerr e{};
  e.error = -101;  // ENETUNREACH
  std::vector<std::byte> unreachable;
  appendMessage(unreachable, NLMSG_ERROR, e, {});
  route = parseRouteReply(unreachable, dst);
  EXPECT_TRUE(route.error);
  EXPECT_FALSE(route.neighbour);
}

}  // namespace
}  // namespace spillway

namespace spillway {
namespace {

// Policy weights per VIP: only that VIP's table moves, a dry run predicts
// exactly the move that applying makes, and parallel (TBB) builds of several
// VIPs give the same tables as a builder that builds them one by one.
TEST(SnapshotBuilder, PerVipWeightsAndPredictedMoves) {
  SnapshotBuilder b = builderFor(estate());
  auto s1 = b.build(1);
  ASSERT_TRUE(s1);
  const MaglevTable v6Before = vipNamed(*s1, "v6").table;
  std::map<std::uint64_t, std::uint32_t> w;
  w[id("a1")] = 300;  // triple a1's share on v4 only
  const auto predicted = b.predictChanged("v4", w);
  ASSERT_TRUE(predicted.has_value());
  EXPECT_GT(*predicted, 0u);
  EXPECT_FALSE(b.predictChanged("nope", w).has_value());
  b.setVipWeights("v4", w);
  auto s2 = b.build(2);
  ASSERT_TRUE(s2);
  EXPECT_EQ(countChanged(vipNamed(*s1, "v4").table, vipNamed(*s2, "v4").table), *predicted);
  EXPECT_EQ(vipNamed(*s2, "v6").table, v6Before);
  EXPECT_GT(owners(vipNamed(*s2, "v4").table)[b.indexOf(id("a1"))],
            owners(vipNamed(*s1, "v4").table)[b.indexOf(id("a1"))]);

  // Every VIP changes at once (the parallel path) in one builder; builders
  // that each hold a single VIP build it on their own (the sequential path).
  SnapshotBuilder all = builderFor(estate());
  ASSERT_TRUE(all.build(1));
  auto reweigh = [](SnapshotBuilder& x) {
    std::uint32_t next = 17;
    for (const char* name : {"a1", "a2", "a3", "c1", "c2"}) {
      ASSERT_TRUE(x.setEffectiveWeight(id(name), next += 3));
    }
  };
  reweigh(all);
  auto sa = all.build(2);
  ASSERT_TRUE(sa);
  ASSERT_GE(all.lastBuild().size(), 2u);
  for (const auto& r : all.lastBuild()) EXPECT_TRUE(r.rebuilt) << r.name;
  for (const SnapshotVip& vip : sa->vips) {
    Config single = estate();
    std::erase_if(single.vips, [&](const VipConfig& v) { return v.name != vip.name; });
    SnapshotBuilder one = builderFor(single);
    reweigh(one);
    auto so = one.build(1);
    ASSERT_TRUE(so);
    EXPECT_EQ(vipNamed(*so, vip.name).table, vip.table) << vip.name;
  }
  b.clearVipWeights();
  auto s3 = b.build(3);
  EXPECT_EQ(vipNamed(*s3, "v4").table, vipNamed(*s1, "v4").table);
}

// Second chance (issue #24): each slot whose owner changed names its owner
// before the change, stamped with the build's `now`, until the hold time
// (here 5 s) has passed; unchanged slots keep their history until then; a
// slot that changes back names the owner it leaves (one that moves on to a
// third owner within the hold: SecondChanceKeepsTheOlderOwnerThroughAnotherMove).
TEST(SnapshotBuilder, SecondChanceHistoryOfChangedSlotsUntilTheHoldEnds) {
  Config c = secondChanceEstate();
  SnapshotBuilder b = builderFor(std::move(c));
  auto first = b.build(1, 100'000);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->vips[0].previousOwner, nullptr) << "a first table has no history";
  EXPECT_FALSE(b.secondChanceHoldEnds().has_value());

  const std::uint32_t c1 = b.indexOf(id("c1"));
  ASSERT_TRUE(b.setState(id("c1"), BackendState::Disabled));
  auto second = b.build(2, 101'000);
  ASSERT_TRUE(second);
  const SnapshotVip& v = second->vips[0];
  ASSERT_NE(v.previousOwner, nullptr);
  ASSERT_EQ(v.previousOwner->size(), v.table.size());
  const auto before = first->vips[0].table.entries();
  const auto after = v.table.entries();
  std::uint32_t named = 0;
  std::uint32_t namedC1 = 0;
  for (std::size_t slot = 0; slot < after.size(); ++slot) {
    const std::uint32_t prev = (*v.previousOwner)[slot];
    if (before[slot] != after[slot]) {
      ASSERT_EQ(prev, before[slot]) << "slot " << slot;
      ++named;
      namedC1 += prev == c1;
    } else {
      ASSERT_EQ(prev, 0u) << "slot " << slot;
    }
  }
  EXPECT_EQ(named, countChanged(first->vips[0].table, v.table));
  EXPECT_GT(namedC1, named * 9 / 10) << "mostly c1's slots moved (Maglev moves a few others)";
  EXPECT_NE(second->vips[1].previousOwner, nullptr) << "v6 (cloud only) lost c1 too";
  ASSERT_EQ(b.secondChanceHoldEnds(), std::optional<Millis>(106'000));

  // Unchanged tables keep the history (shared, not copied) within the hold.
  auto third = b.build(3, 105'999);
  ASSERT_TRUE(third);
  EXPECT_EQ(third->vips[0].previousOwner, v.previousOwner);

  // c1 back: the first table again; the slots that changed back name their
  // owner of the moment.
  ASSERT_TRUE(b.setState(id("c1"), BackendState::Active));
  auto fourth = b.build(4, 105'999);
  ASSERT_TRUE(fourth);
  const auto& p4 = *fourth->vips[0].previousOwner;
  for (std::size_t slot = 0; slot < after.size(); ++slot) {
    if (before[slot] != after[slot]) {
      ASSERT_EQ(fourth->vips[0].table.entries()[slot], before[slot]);
      ASSERT_EQ(p4[slot], after[slot]) << "the owner it had since the second build";
    }
  }
  EXPECT_EQ(b.secondChanceHoldEnds(), std::optional<Millis>(110'999))
      << "every changed slot changed again at 105'999";

  // The hold ends: the next build forgets it all.
  auto fifth = b.build(5, 110'999);
  ASSERT_TRUE(fifth);
  EXPECT_EQ(fifth->vips[0].previousOwner, nullptr);
  EXPECT_FALSE(b.secondChanceHoldEnds().has_value());
}

// A slot that moves A -> B -> C within the hold names A, not B: a
// long-lived flow on its second chance there (no instance tracks it) began
// on A; B held the slot for a while only (a churn budget's intermediate
// table, one load swing). The hold runs from the last move. Once A's hold
// has ended, the next move names B.
TEST(SnapshotBuilder, SecondChanceKeepsTheOlderOwnerThroughAnotherMove) {
  Config c = secondChanceEstate();
  for (const Millis third : {Millis{2'000}, Millis{7'000}}) {
    SCOPED_TRACE("third build at " + std::to_string(third));
    SnapshotBuilder b = builderFor(c);
    auto s1 = b.build(1, 0);
    ASSERT_TRUE(b.setState(id("a1"), BackendState::Disabled));
    auto s2 = b.build(2, 1'000);
    ASSERT_TRUE(b.setState(id("a2"), BackendState::Disabled));
    auto s3 = b.build(3, third);
    ASSERT_TRUE(s1 && s2 && s3);
    ASSERT_NE(s3->vips[0].previousOwner, nullptr);
    const auto t1 = s1->vips[0].table.entries();
    const auto t2 = s2->vips[0].table.entries();
    const auto t3 = s3->vips[0].table.entries();
    const auto& prev = *s3->vips[0].previousOwner;
    std::uint32_t twice = 0;
    for (std::size_t slot = 0; slot < t3.size(); ++slot) {
      const bool moved1 = t1[slot] != t2[slot];
      const bool moved2 = t2[slot] != t3[slot];
      if (moved1 && moved2 && t3[slot] != t1[slot]) {
        ++twice;
        ASSERT_EQ(prev[slot], third < 6'000 ? t1[slot] : t2[slot]) << "slot " << slot;
      } else if (moved1 && moved2) {
        ASSERT_EQ(prev[slot], t2[slot]) << "back to its first owner: names the one it leaves";
      } else if (moved2) {
        ASSERT_EQ(prev[slot], t2[slot]) << "slot " << slot;
      } else if (moved1) {
        ASSERT_EQ(prev[slot], third < 6'000 ? t1[slot] : 0u) << "slot " << slot;
      } else {
        ASSERT_EQ(prev[slot], 0u) << "slot " << slot;
      }
    }
    EXPECT_GT(twice, 0u) << "a1's slots that a2 took moved again";
    // The slots that moved only at 1'000 end first (at 6'000, if not
    // already forgotten).
    EXPECT_EQ(b.secondChanceHoldEnds(),
              std::optional<Millis>(third < 6'000 ? 6'000 : third + 5'000));
  }
}

// A -> B -> A -> D within the hold names A: the slot's owner before the run
// of moves, which is also the owner it leaves (not B, the owner it named
// while back on A).
TEST(SnapshotBuilder, SecondChanceNamesTheOwnerBeforeTheRunOfMoves) {
  Config c = secondChanceEstate();
  SnapshotBuilder b = builderFor(c);
  auto s1 = b.build(1, 0);
  ASSERT_TRUE(b.setState(id("a1"), BackendState::Disabled));
  auto s2 = b.build(2, 1'000);
  ASSERT_TRUE(b.setState(id("a1"), BackendState::Active));
  auto s3 = b.build(3, 2'000);
  ASSERT_TRUE(b.setState(id("a1"), BackendState::Disabled));
  ASSERT_TRUE(b.setState(id("a2"), BackendState::Disabled));
  auto s4 = b.build(4, 3'000);
  ASSERT_TRUE(s1 && s2 && s3 && s4);
  const std::uint32_t a1 = b.indexOf(id("a1"));
  const auto t1 = s1->vips[0].table.entries();
  const auto t2 = s2->vips[0].table.entries();
  const auto t3 = s3->vips[0].table.entries();
  const auto t4 = s4->vips[0].table.entries();
  const auto& p3 = *s3->vips[0].previousOwner;
  const auto& p4 = *s4->vips[0].previousOwner;
  std::uint32_t elsewhere = 0;
  for (std::size_t slot = 0; slot < t4.size(); ++slot) {
    if (t1[slot] != a1 || t2[slot] == a1) continue;
    ASSERT_EQ(t3[slot], a1) << "a1 back: its slots again";
    ASSERT_EQ(p3[slot], t2[slot]) << "back on a1: names the owner it left";
    ASSERT_EQ(p4[slot], a1) << "slot " << slot;
    elsewhere += t4[slot] != t2[slot];
  }
  EXPECT_GT(elsewhere, 0u) << "some of a1's slots went to another owner than the first time";
}

// A restarted process: the history a builder exports (by id, aged) and a new
// builder restores names the same owners in its first table, forgets what
// is past the hold, and a later move goes on with the run (the owner before
// it, not the restored table's).
TEST(SnapshotBuilder, SecondChanceHistoryRestoredAcrossAProcess) {
  Config c = secondChanceEstate();
  SnapshotBuilder a = builderFor(c);
  auto s1 = a.build(1, 10'000);
  ASSERT_TRUE(a.setState(id("a1"), BackendState::Disabled));
  auto s2 = a.build(2, 11'000);
  ASSERT_TRUE(s1 && s2);
  const SlotHistory saved = a.slotHistory(12'000);
  ASSERT_EQ(saved.count("v4"), 1u);
  for (const SlotHistoryRecord& r : saved.at("v4").slots) {
    ASSERT_EQ(r.ageMs, 1'000u);
    ASSERT_EQ(r.previousId, r.originId);
  }

  // Restored 2 s into the new process's clock: the first table (a1 still
  // disabled, as tables.json would hold it) names what the old one named.
  SnapshotBuilder b = builderFor(c);
  ASSERT_TRUE(b.setState(id("a1"), BackendState::Disabled));
  b.restoreSlotHistory(saved);
  auto r1 = b.build(1, 2'000);
  ASSERT_TRUE(r1);
  ASSERT_NE(r1->vips[0].previousOwner, nullptr);
  const auto& was = *s2->vips[0].previousOwner;
  const auto& is = *r1->vips[0].previousOwner;
  for (std::size_t slot = 0; slot < was.size(); ++slot) {
    ASSERT_EQ(a.idAt(was[slot]), b.idAt(is[slot])) << "slot " << slot;
  }
  EXPECT_EQ(b.secondChanceHoldEnds(), std::optional<Millis>(2'000 - 1'000 + 5'000));

  // a2 leaves too: a1's slots that a2 had taken move on and still name a1.
  ASSERT_TRUE(b.setState(id("a2"), BackendState::Disabled));
  auto r2 = b.build(2, 3'000);
  ASSERT_TRUE(r2);
  const auto t1 = s1->vips[0].table.entries();
  const auto t2 = r1->vips[0].table.entries();
  const auto t3 = r2->vips[0].table.entries();
  std::uint32_t twice = 0;
  for (std::size_t slot = 0; slot < t3.size(); ++slot) {
    if (a.idAt(t1[slot]) != id("a1") || t2[slot] == t3[slot]) continue;
    ASSERT_EQ(b.idAt((*r2->vips[0].previousOwner)[slot]), id("a1")) << "slot " << slot;
    ++twice;
  }
  EXPECT_GT(twice, 0u);

  // Past the hold at restore: nothing comes back.
  SnapshotBuilder late = builderFor(c);
  late.restoreSlotHistory(a.slotHistory(16'000));
  auto l1 = late.build(1, 0);
  ASSERT_TRUE(l1);
  EXPECT_EQ(l1->vips[0].previousOwner, nullptr);
}

TEST(SnapshotBuilder, SecondChanceHoldOfDifferentAgesAndOff) {
  Config c = secondChanceEstate();
  SnapshotBuilder b = builderFor(c);
  auto s0 = b.build(1, 0);
  ASSERT_TRUE(b.setState(id("c1"), BackendState::Disabled));
  auto s1 = b.build(2, 1'000);
  ASSERT_TRUE(b.setState(id("a1"), BackendState::Disabled));
  auto s2 = b.build(3, 3'000);
  ASSERT_TRUE(s0 && s1 && s2);
  const std::uint32_t c1 = b.indexOf(id("c1"));
  const std::uint32_t a1 = b.indexOf(id("a1"));
  auto count = [](const ForwardingSnapshot& s, std::uint32_t owner) {
    std::uint32_t n = 0;
    if (s.vips[0].previousOwner == nullptr) return n;
    for (std::uint32_t p : *s.vips[0].previousOwner) n += p == owner;
    return n;
  };
  EXPECT_GT(count(*s2, c1), 0u);
  EXPECT_GT(count(*s2, a1), 0u);
  EXPECT_EQ(b.secondChanceHoldEnds(), std::optional<Millis>(6'000));
  auto s3 = b.build(4, 6'000);  // c1's changes are 5 s old, a1's 3 s
  ASSERT_TRUE(s3);
  EXPECT_GT(count(*s3, a1), 0u);
  // Exactly the slots that changed at 3'000 keep their previous owner: the
  // owner before the change, or for a slot that c1 lost at 1'000 and that
  // moved on at 3'000, c1 (SecondChanceKeepsTheOlderOwnerThroughAnotherMove);
  // the slots that changed only at 1'000 forget theirs.
  const auto t0 = s0->vips[0].table.entries();
  const auto t1 = s1->vips[0].table.entries();
  const auto t2 = s2->vips[0].table.entries();
  std::uint32_t c1Kept = 0;
  for (std::size_t slot = 0; slot < t2.size(); ++slot) {
    const std::uint32_t kept = (*s3->vips[0].previousOwner)[slot];
    if (t1[slot] != t2[slot]) {
      const bool twice = t0[slot] != t1[slot] && t0[slot] != t2[slot];
      ASSERT_EQ(kept, twice ? t0[slot] : t1[slot]) << "slot " << slot;
      c1Kept += twice && t0[slot] == c1;
    } else {
      ASSERT_EQ(kept, 0u) << "slot " << slot;
    }
  }
  EXPECT_EQ(count(*s3, c1), c1Kept) << "c1 only where its slot moved again at 3'000";
  EXPECT_EQ(b.secondChanceHoldEnds(), std::optional<Millis>(8'000));

  // second_chance_hold_ms = 0: no history at all.
  c.dataplane.secondChanceHoldMs = 0;
  SnapshotBuilder off = builderFor(c);
  ASSERT_TRUE(off.build(1, 0));
  ASSERT_TRUE(off.setState(id("c1"), BackendState::Disabled));
  auto o = off.build(2, 1'000);
  ASSERT_TRUE(o);
  EXPECT_EQ(o->vips[0].previousOwner, nullptr);
  EXPECT_FALSE(off.secondChanceHoldEnds().has_value());
}

}  // namespace
}  // namespace spillway
