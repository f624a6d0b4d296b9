// Flow table throughput on one core: batched lookups that hit, and inserts.
// Flow hashes are splitmix64(i), a bijection of the flow number, so a query
// picks a random present flow without a table of hashes competing for cache.
#include <benchmark/benchmark.h>

#include <array>
#include <cstdint>
#include <memory>

#include "spillway/flow_table.hpp"

namespace spillway {
namespace {

constexpr std::size_t kBatch = 32;
constexpr Millis kNow = 1'000'000;

std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9e37'79b9'7f4a'7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58'476d'1ce4'e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d0'49bb'1331'11ebULL;
  return x ^ (x >> 31);
}

std::uint64_t xorshift64(std::uint64_t& s) noexcept {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

// Filling 10M flows takes seconds; every run of a size reuses one table
// (lookups only refresh stamps, so the table does not change between runs).
FlowTable& filledTable(std::size_t flows) {
  static std::unique_ptr<FlowTable> table;
  static std::size_t filled = 0;
  if (filled != flows) {
    table.reset();
    table = std::make_unique<FlowTable>(FlowTableConfig{.capacity = flows});
    for (std::size_t i = 0; i < flows; ++i) {
      (void)table->insert(splitmix64(i), static_cast<std::uint32_t>(1 + i % 1000),
                          FlowState::Established, kNow);
    }
    filled = flows;
  }
  return *table;
}

void BM_FlowTableLookupHit(benchmark::State& state) {
  const auto flows = static_cast<std::size_t>(state.range(0));
  FlowTable& table = filledTable(flows);
  std::uint64_t rng = 0x2545'f491'4f6c'dd1dULL;
  std::array<std::uint64_t, kBatch> hashes{};
  std::array<std::uint32_t, kBatch> out{};
  for (auto _ : state) {
    for (auto& h : hashes) h = splitmix64(xorshift64(rng) % flows);
    table.lookupBatch(hashes, out, kNow);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kBatch));
  state.counters["occupancy"] = static_cast<double>(table.counters().occupancy);
  state.counters["bytes_per_flow"] = table.bytesPerFlowAtCapacity();
}

void BM_FlowTableInsert(benchmark::State& state) {
  const auto flows = static_cast<std::size_t>(state.range(0));
  FlowTable table(FlowTableConfig{.capacity = flows});
  std::uint64_t round = 0;
  for (auto _ : state) {
    state.PauseTiming();
    table.clear();
    const std::uint64_t base = round++ * flows;
    state.ResumeTiming();
    for (std::size_t i = 0; i < flows; ++i) {
      benchmark::DoNotOptimize(table.insert(splitmix64(base + i),
                                            static_cast<std::uint32_t>(1 + i % 1000),
                                            FlowState::Established, kNow));
    }
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * flows));
  state.counters["failures"] = static_cast<double>(table.counters().insertFailures);
}

}  // namespace

BENCHMARK(BM_FlowTableLookupHit)->Name("FlowTableLookupHit")->Arg(1'000'000)->Arg(10'000'000);
BENCHMARK(BM_FlowTableInsert)
    ->Name("FlowTableInsert")
    ->Arg(1'000'000)
    ->Unit(benchmark::kMillisecond);

}  // namespace spillway
