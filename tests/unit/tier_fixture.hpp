// The estate of the tier tests (peer_wire_test, peer_channel_test): one port,
// one pool, one VIP, three backends b1..b3; a test appends its [control] and
// [tier] sections.
#pragma once

#include <string>

namespace spillway::test {

inline std::string tierEstate() {
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
  for (int i = 1; i <= 3; ++i) {
    text += "\n[[backend]]\nname = \"b" + std::to_string(i) + "\"\naddress = \"10.0.1." +
            std::to_string(i) + "\"\npool = \"onprem\"\n";
  }
  return text;
}

}  // namespace spillway::test
