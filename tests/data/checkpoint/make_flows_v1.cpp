// Wrote tests/data/checkpoint/flows-v1-6630b7c.ckpt with the code of 6630b7c (before #25 item 2):
// flows 10.9.0.1:43000+i -> 192.0.2.10:5000/TCP, i < 8, each on a backend its table slot does not
// give it (as steering_test's flowAndOtherBackend).
#include <cstdio>
#include <vector>

#include "control/intent/flow_checkpoint.hpp"
#include "spillway/maglev.hpp"
using namespace spillway;
int main() {
  constexpr std::uint64_t kSeed = 0x5eed;
  std::vector<MaglevBackend> mb;
  for (std::uint32_t i = 1; i <= 4; ++i) mb.push_back({1000 + i, 100, i});
  MaglevBuilder builder;
  const auto table = builder.build(mb, FlowHasher(kSeed), 1009).value().table;
  std::vector<FlowExceptionRecord> records;
  for (std::uint16_t i = 0; i < 8; ++i) {
    FlowKey k;
    k.version = IpVersion::V4;
    k.src = ipv4Bytes(0x0a090001);
    k.dst = ipv4Bytes(0xc000020a);
    k.srcPort = Be16::fromHost(static_cast<std::uint16_t>(43000 + i));
    k.dstPort = Be16::fromHost(5000);
    k.proto = 6;
    const std::uint64_t h = FlowHasher(kSeed).hash(k);
    const std::uint32_t other = table.lookup(h) % 4 + 1;
    records.push_back({h, 1000 + other, FlowState::Established, 0});
    std::printf("%u %016llx %u\n", 43000 + i, static_cast<unsigned long long>(h), 1000 + other);
  }
  const std::string bytes = encodeFlowCheckpoint(kSeed, 1'764'700'000'000ULL, records);
  std::FILE* f = std::fopen("flows-v1.ckpt", "wb");
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}
// tables.json's MAC helpers (config.cpp), unused by flows.ckpt.
namespace spillway {
std::string formatMacAddress(const MacAddress&) {
  return {};
}
std::optional<MacAddress> parseMacAddress(std::string_view) {
  return std::nullopt;
}
}  // namespace spillway
