// Host checks (control/host_checks.hpp) against a fake host: each line's
// outcome and its next step or reason, for what --check-config reports.
#include "control/host/host_checks.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace spillway {
namespace {

struct FakeHost final : HostProbe {
  std::set<std::string> groups{"root"};
  std::set<std::string> users{"root"};
  std::set<std::string> interfaces{"eth0"};
  std::set<std::string> dirs{"/", "/run", "/var", "/var/lib"};
  std::set<std::string> readOnly;
  bool root = true;
  std::optional<unsigned long> hugepages = 512;

  bool groupExists(const std::string& name) const override { return groups.count(name) != 0; }
  bool userExists(const std::string& name) const override { return users.count(name) != 0; }
  bool interfaceExists(const std::string& name) const override {
    return interfaces.count(name) != 0;
  }
  std::optional<std::string> existingAncestor(const std::string& path) const override {
    for (std::string p = path; !p.empty(); p = p.substr(0, p.rfind('/'))) {
      if (dirs.count(p) != 0) return p;
      if (p == "/") break;
      if (p.rfind('/') == 0 && p != "/") {
        if (dirs.count("/") != 0) return std::string("/");
      }
    }
    return std::nullopt;
  }
  bool isDirectory(const std::string& path) const override { return dirs.count(path) != 0; }
  bool writable(const std::string& dir) const override { return readOnly.count(dir) == 0; }
  bool isRoot() const override { return root; }
  std::optional<unsigned long> freeHugepages() const override { return hugepages; }
};

Config estate(const std::string& control, const std::string& port) {
  const std::string text = R"([dataplane]
lcores = [1]
hash_seed = 42

[[port]]
name = "p0"
)" + port + R"(
address = "10.0.0.1"

[[pool]]
name = "onprem"
site = "onprem"
priority = 0

[[vip]]
name = "v"
address = "192.0.2.1"
protocol = "tcp"
pools = ["onprem"]

[[backend]]
name = "b1"
address = "10.0.0.11"
pool = "onprem"

[control]
)" + control;
  ConfigResult r = loadConfigFromString(text, "test.toml");
  EXPECT_TRUE(r.ok()) << formatErrors(r.errors());
  return r.value();
}

const HostCheck* find(const std::vector<HostCheck>& checks, const std::string& part) {
  for (const HostCheck& c : checks) {
    if (c.what.find(part) != std::string::npos) return &c;
  }
  return nullptr;
}

TEST(HostChecks, EverythingThereIsOk) {
  FakeHost host;
  const auto checks = runHostChecks(
      estate("socket_group = \"root\"\nstate_dir = \"/var/lib/spillway\"\nmetrics_listen = \"\"",
             "devargs = \"net_af_packet0,iface=eth0\"\nkernel_interface = \"eth0\""),
      host);
  EXPECT_FALSE(anyFailed(checks)) << formatHostChecks(checks);
  ASSERT_NE(find(checks, "interface eth0"), nullptr);
  EXPECT_EQ(find(checks, "interface eth0")->outcome, HostCheckOutcome::Ok);
  EXPECT_EQ(find(checks, "state_dir")->outcome, HostCheckOutcome::Ok);
  EXPECT_NE(find(checks, "state_dir")->what.find("will be created under /var/lib"),
            std::string::npos);
}

TEST(HostChecks, MissingGroupInterfaceAndReadOnlyStateDirFailWithTheNextStep) {
  FakeHost host;
  host.readOnly.insert("/var/lib");
  const auto checks = runHostChecks(
      estate("socket_group = \"spillway\"\nuser = \"spillway\"\nstate_dir = \"/var/lib/spillway\"",
             "devargs = \"net_af_packet0,iface=veth9\""),
      host);
  EXPECT_TRUE(anyFailed(checks));
  const HostCheck* group = find(checks, "socket_group");
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->outcome, HostCheckOutcome::Failed);
  EXPECT_NE(group->detail.find("groupadd --system spillway"), std::string::npos);
  const HostCheck* user = find(checks, "[control] user");
  ASSERT_NE(user, nullptr);
  EXPECT_EQ(user->outcome, HostCheckOutcome::Failed);
  EXPECT_NE(user->detail.find("useradd --system"), std::string::npos);
  const HostCheck* iface = find(checks, "interface veth9");
  ASSERT_NE(iface, nullptr);
  EXPECT_EQ(iface->outcome, HostCheckOutcome::Failed);
  EXPECT_NE(iface->detail.find("ip netns exec"), std::string::npos);
  EXPECT_EQ(find(checks, "state_dir")->outcome, HostCheckOutcome::Failed);
  const std::string text = formatHostChecks(checks);
  EXPECT_NE(text.find("FAILED       [control] socket_group \"spillway\": no such group\n"
                      "               next: create it"),
            std::string::npos)
      << text;
}

TEST(HostChecks, WhatCannotBeCheckedSaysWhy) {
  FakeHost host;
  host.root = false;
  host.hugepages = 0;
  const auto checks =
      runHostChecks(estate("metrics_listen = \"127.0.0.1:9550\"",
                           "devargs = \"0000:3b:00.0\"\nnext_hop_mac = \"02:00:00:00:00:01\""),
                    host);
  for (const char* part :
       {"privileges", "metrics_listen", "PCI device 0000:3b:00.0", "hugepages", "state_dir"}) {
    const HostCheck* c = find(checks, part);
    ASSERT_NE(c, nullptr) << part << "\n" << formatHostChecks(checks);
    EXPECT_EQ(c->outcome, HostCheckOutcome::NotChecked) << part;
    EXPECT_FALSE(c->detail.empty()) << part;
  }
}

TEST(HostChecks, DevargsInterface) {
  EXPECT_EQ(devargsInterface("net_af_packet0,iface=eth0"), "eth0");
  EXPECT_EQ(devargsInterface("net_af_xdp0,iface=veth1,start_queue=0"), "veth1");
  EXPECT_EQ(devargsInterface("net_ring0"), "");
  EXPECT_EQ(devargsInterface("net_x0,xiface=eth0"), "");
}

}  // namespace
}  // namespace spillway
