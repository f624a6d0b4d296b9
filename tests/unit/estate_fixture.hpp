// Test estates' TOML for the C++ tests: backendToml() writes one [[backend]]
// table (the one place the tests spell it), and onePoolEstate() a small
// estate for control-plane tests (affinity, peer wire and channel): one port,
// one pool, one VIP (table size 1009), backends b1..bN; a test appends its
// own [control] and [tier] sections. fileEstateHead() starts the estates of
// the tests that run a plane on its file (plane_on_file.hpp: intent,
// discovery), and cloudDiscoveryEstate() is the discovery tests' whole one.
//
// Thread contract: pure functions.
#pragma once

#include <string>

namespace spillway::test {

// "\n[[backend]]" with its name, address and pool, then `extra` (more key
// lines, each ending in a newline).
inline std::string backendToml(const std::string& name, const std::string& address,
                               const std::string& pool, const std::string& extra = "") {
  return "\n[[backend]]\nname = \"" + name + "\"\naddress = \"" + address + "\"\npool = \"" + pool +
         "\"\n" + extra;
}

inline std::string onePoolEstate(int backends) {
  std::string text = R"([dataplane]
lcores = [1]
hash_seed = "0x0123456789abcdef"

[[port]]
name = "p0"
devargs = "net_ring0"
address = "10.0.0.1"
next_hop_mac = "02:00:00:00:00:aa"

[[pool]]
name = "onprem"
site = "onprem"
encap = "ipip"

[[vip]]
name = "nccl"
address = "192.0.2.1"
protocol = "tcp"
table_size = 1009
pools = ["onprem"]
)";
  for (int i = 1; i <= backends; ++i) {
    text += backendToml("b" + std::to_string(i), "10.0.1." + std::to_string(i), "onprem");
  }
  return text;
}

// One lcore, hash seed 42, state kept in `stateDir`, drains of 60 s, port
// p0 on net_null0 and the on-prem pool "a"; the test appends its pools,
// VIPs and backends.
inline std::string fileEstateHead(const std::string& stateDir) {
  return R"([dataplane]
lcores = [1]
hash_seed = 42

[control]
state_dir = ")" +
         stateDir + R"("

[policy]
drain_timeout = 60

[[port]]
name = "p0"
devargs = "net_null0"
address = "10.0.0.1"
next_hop_mac = "02:00:00:00:00:01"

[[pool]]
name = "a"
site = "onprem"
)";
}

// fileEstateHead(), a pool "cloud" whose members `discovery` (the inline
// table's keys: kind = "file", path = ...) names, VIP v over both pools
// (table size 251) and one on-prem backend b1.
inline std::string cloudDiscoveryEstate(const std::string& stateDir, const std::string& discovery) {
  return fileEstateHead(stateDir) + R"(
[[pool]]
name = "cloud"
site = "cloud"
discovery = { )" +
         discovery + R"( }

[[vip]]
name = "v"
address = "192.0.2.1"
protocol = "tcp"
table_size = 251
pools = ["a", "cloud"]
)" + backendToml("b1", "10.0.0.11", "a");
}

}  // namespace spillway::test
