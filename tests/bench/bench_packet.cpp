// Parse plus flow hash of 64-byte TCP frames, the per-packet work before the
// flow-table lookup. Run:
//   build/tests/bench/spillway_core_bench --benchmark_filter='^ParseAndHash'
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "../unit/packet_builder.hpp"
#include "spillway/packet.hpp"

namespace spillway {
namespace {

void parseAndHash(benchmark::State& state) {
  std::mt19937 rng(3);
  std::vector<std::vector<std::byte>> frames;
  for (int i = 0; i < 1024; ++i) {
    const std::string src = "10." + std::to_string(rng() % 256) + "." +
                            std::to_string(rng() % 256) + "." + std::to_string(rng() % 256);
    // 14 + 20 + 20 + 6 bytes payload + 4 FCS = a 64-byte frame on the wire.
    frames.push_back(test::PacketBuilder()
                         .ipv4(src, "192.0.2.10")
                         .tcp(static_cast<std::uint16_t>(1024 + rng() % 60000), 443)
                         .payload(6)
                         .build());
  }
  const FlowHasher hasher(0x5eed);
  std::size_t i = 0;
  std::uint64_t acc = 0;
  for (auto _ : state) {
    const PacketView v = parsePacket(frames[i]);
    if (v.ok()) [[likely]]
      acc += hasher.hash(v.key);
    i = (i + 1) & 1023;
  }
  benchmark::DoNotOptimize(acc);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(parseAndHash)->Name("ParseAndHash");

}  // namespace
}  // namespace spillway
