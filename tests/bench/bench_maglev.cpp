// Maglev table build and lookup. Run with repetitions for medians, e.g.
//   spillway_core_bench --benchmark_filter=Maglev --benchmark_repetitions=5
//       --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "spillway/maglev.hpp"

namespace spillway {
namespace {

constexpr std::uint64_t kBenchSeed = 0x5350494C4C574159;

enum class Weights { Equal, Mixed, Skewed };

std::vector<MaglevBackend> benchBackends(std::size_t n, Weights weights) {
  std::mt19937_64 rng(n);
  std::vector<MaglevBackend> backends(n);
  for (std::size_t i = 0; i < n; ++i) {
    backends[i].id = rng();
    backends[i].backendIndex = static_cast<std::uint32_t>(i + 1);
    switch (weights) {
      case Weights::Equal:
        backends[i].weight = 100;
        break;
      case Weights::Mixed:
        backends[i].weight = 50 + static_cast<std::uint32_t>(rng() % 101);
        break;
      // One heavy backend: the turn loop runs ~M iterations instead of ~M/N.
      case Weights::Skewed:
        backends[i].weight = i == 0 ? 100000 : 1 + rng() % 100;
        break;
    }
  }
  return backends;
}

void runBuild(benchmark::State& state, Weights weights) {
  const auto tableSize = static_cast<std::uint32_t>(state.range(0));
  const std::vector<MaglevBackend> backends =
      benchBackends(static_cast<std::size_t>(state.range(1)), weights);
  const FlowHasher hasher(kBenchSeed);
  MaglevBuilder builder;
  for (auto _ : state) {
    MaglevBuildResult result = builder.build(backends, hasher, tableSize);
    benchmark::DoNotOptimize(result);
    if (!result.ok()) state.SkipWithError(result.error().c_str());
  }
}

void BM_MaglevBuild(benchmark::State& state) {
  runBuild(state, Weights::Equal);
}
void BM_MaglevBuildMixed(benchmark::State& state) {
  runBuild(state, Weights::Mixed);
}
void BM_MaglevBuildSkewed(benchmark::State& state) {
  runBuild(state, Weights::Skewed);
}

BENCHMARK(BM_MaglevBuild)
    ->Name("MaglevBuild")
    ->Args({65537, 10})
    ->Args({65537, 100})
    ->Args({65537, 1000})
    ->Args({655373, 1000})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MaglevBuildMixed)
    ->Name("MaglevBuildMixed")
    ->Args({65537, 1000})
    ->Args({655373, 1000})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MaglevBuildSkewed)
    ->Name("MaglevBuildSkewed")
    ->Args({65537, 1000})
    ->Args({655373, 1000})
    ->Unit(benchmark::kMillisecond);

void BM_MaglevLookup(benchmark::State& state) {
  MaglevBuilder builder;
  MaglevBuildResult result =
      builder.build(benchBackends(100, Weights::Equal), FlowHasher(kBenchSeed), 65537);
  const MaglevTable table = std::move(result).value().table;
  constexpr std::size_t kHashes = 1 << 16;
  std::vector<std::uint64_t> hashes(kHashes);
  std::mt19937_64 rng(1);
  for (std::uint64_t& h : hashes) h = rng();
  std::uint64_t sum = 0;
  for (auto _ : state) {
    for (std::uint64_t h : hashes) sum += table.lookup(h);
    benchmark::DoNotOptimize(sum);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kHashes));
}
BENCHMARK(BM_MaglevLookup)->Name("MaglevLookup");

}  // namespace
}  // namespace spillway
