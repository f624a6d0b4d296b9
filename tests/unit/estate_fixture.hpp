// A small estate for control-plane tests (affinity, peer wire and channel):
// one port, one pool, one VIP (table size 1009), backends b1..bN; a test
// appends its own [control] and [tier] sections.
#pragma once

#include <string>

namespace spillway::test {

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
    text += "\n[[backend]]\nname = \"b" + std::to_string(i) + "\"\naddress = \"10.0.1." +
            std::to_string(i) + "\"\npool = \"onprem\"\n";
  }
  return text;
}

}  // namespace spillway::test
