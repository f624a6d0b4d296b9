// Test estates' TOML for the C++ tests: backendToml() writes one [[backend]]
// table (the one place the tests spell it), and onePoolEstate() a small
// estate for control-plane tests (affinity, peer wire and channel): one port,
// one pool, one VIP (table size 1009), backends b1..bN; a test appends its
// own [control] and [tier] sections.
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

}  // namespace spillway::test
