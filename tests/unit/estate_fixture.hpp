// Test estates' TOML for the C++ tests, each table kind spelled in one
// place: estateHead() writes [dataplane] and the port p0, poolToml() a
// [[pool]], vipToml() the VIP "v", backendToml() a [[backend]]; a test puts
// its estate together from them and appends what it is about. Whole estates:
// onePoolEstate() a small one for control-plane tests (affinity, peer wire
// and channel): one pool, one VIP (table size 1009), backends b1..bN; a test
// appends its own [control] and [tier] sections. fileEstateHead() starts the
// estates of the tests that run a plane on its file (plane_on_file.hpp:
// intent, discovery), and cloudDiscoveryEstate() is the discovery tests'
// whole one.
//
// Thread contract: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace spillway::test {

// What estateHead() writes, set by name: Head().seed("1").devargs("net_ring0").
// The defaults are what most tests use.
class Head {
 public:
  Head& lcores(std::string v) { return set(lcores_, std::move(v)); }
  Head& seed(std::string v) { return set(seed_, std::move(v)); }  // a number or a quoted hex string
  Head& devargs(std::string v) { return set(devargs_, std::move(v)); }
  Head& nextHopMac(std::string v) { return set(nextHopMac_, std::move(v)); }  // empty: no line
  Head& dataplaneExtra(std::string v) { return set(dataplaneExtra_, std::move(v)); }
  Head& portExtra(std::string v) { return set(portExtra_, std::move(v)); }

  // [dataplane] (lcores, hash_seed), then [[port]] p0 at 10.0.0.1.
  [[nodiscard]] std::string text() const {
    std::string t = "[dataplane]\nlcores = " + lcores_ + "\nhash_seed = " + seed_ + "\n" +
                    dataplaneExtra_ + "\n[[port]]\nname = \"p0\"\ndevargs = \"" + devargs_ +
                    "\"\naddress = \"10.0.0.1\"\n";
    if (!nextHopMac_.empty()) t += "next_hop_mac = \"" + nextHopMac_ + "\"\n";
    return t + portExtra_;
  }

 private:
  Head& set(std::string& field, std::string v) {
    field = std::move(v);
    return *this;
  }
  std::string lcores_ = "[1]";
  std::string seed_ = "42";
  std::string devargs_ = "net_null0";
  std::string nextHopMac_ = "02:00:00:00:00:01";
  std::string dataplaneExtra_;  // more [dataplane] lines
  std::string portExtra_;       // more lines of port p0
};

inline std::string estateHead(const Head& h = Head()) {
  return h.text();
}

// "\n[[pool]]" with its name and site, its priority when not negative, then
// `extra` (more lines, or sub-tables such as [pool.health]).
inline std::string poolToml(const std::string& name, const std::string& site, int priority = -1,
                            const std::string& extra = "") {
  std::string text = "\n[[pool]]\nname = \"" + name + "\"\nsite = \"" + site + "\"\n";
  if (priority >= 0) text += "priority = " + std::to_string(priority) + "\n";
  return text + extra;
}

// "\n[[vip]]" at 192.0.2.1, TCP, over `pools`.
inline std::string vipToml(const std::vector<std::string>& pools, int tableSize = 251,
                           const std::string& name = "v") {
  std::string list;
  for (std::size_t i = 0; i < pools.size(); ++i) list += (i ? ", \"" : "\"") + pools[i] + "\"";
  return "\n[[vip]]\nname = \"" + name +
         "\"\naddress = \"192.0.2.1\"\nprotocol = \"tcp\"\ntable_size = " +
         std::to_string(tableSize) + "\npools = [" + list + "]\n";
}

// "\n[[backend]]" with its name, address and pool, then `extra` (more key
// lines, each ending in a newline).
inline std::string backendToml(const std::string& name, const std::string& address,
                               const std::string& pool, const std::string& extra = "") {
  return "\n[[backend]]\nname = \"" + name + "\"\naddress = \"" + address + "\"\npool = \"" + pool +
         "\"\n" + extra;
}

inline std::string onePoolEstate(int backends) {
  std::string text = estateHead(Head()
                                    .seed("\"0x0123456789abcdef\"")
                                    .devargs("net_ring0")
                                    .nextHopMac("02:00:00:00:00:aa")) +
                     poolToml("onprem", "onprem", -1, "encap = \"ipip\"\n") +
                     vipToml({"onprem"}, 1009, "nccl");
  for (int i = 1; i <= backends; ++i) {
    text += backendToml("b" + std::to_string(i), "10.0.1." + std::to_string(i), "onprem");
  }
  return text;
}

// One lcore, hash seed 42, state kept in `stateDir`, drains of 60 s, port
// p0 on net_null0 and the on-prem pool "a"; the test appends its pools,
// VIPs and backends.
inline std::string fileEstateHead(const std::string& stateDir) {
  return estateHead() + "\n[control]\nstate_dir = \"" + stateDir +
         "\"\n\n[policy]\ndrain_timeout = 60\n" + poolToml("a", "onprem");
}

// fileEstateHead(), a pool "cloud" whose members `discovery` (the inline
// table's keys: kind = "file", path = ...) names, VIP v over both pools
// (table size 251) and one on-prem backend b1.
inline std::string cloudDiscoveryEstate(const std::string& stateDir, const std::string& discovery) {
  return fileEstateHead(stateDir) +
         poolToml("cloud", "cloud", -1, "discovery = { " + discovery + " }\n") +
         vipToml({"a", "cloud"}) + backendToml("b1", "10.0.0.11", "a");
}

}  // namespace spillway::test
