// What flow affinity costs (BENCHMARKS.md, "Flow-affinity checkpoint"): the
// worker's exception walk over a full flow table, the checkpoint's encoding,
// its durable write, and the restore at start (decode + ExceptionTable).
// Flows are placed by one table and judged against another whose weights
// moved, so about a fifth of them are exceptions; the encode/write/restore
// cases take every flow as an exception (the worst case). The slot history
// cases: second chance's history.bin, every slot moved.
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "control/intent/flow_checkpoint.hpp"
#include "control/sys/durable_file.hpp"
#include "spillway/flow_exceptions.hpp"
#include "spillway/flow_key.hpp"
#include "spillway/flow_table.hpp"
#include "spillway/maglev.hpp"
#include "spillway/snapshot.hpp"

namespace spillway {
namespace {

constexpr Millis kNow = 1'000'000;
constexpr std::uint64_t kSeed = 0x5eed;
constexpr std::uint32_t kBackends = 8;

std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9e37'79b9'7f4a'7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58'476d'1ce4'e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d0'49bb'1331'11ebULL;
  return x ^ (x >> 31);
}

MaglevTable tableWith(std::uint32_t firstWeight) {
  std::vector<MaglevBackend> in;
  for (std::uint32_t i = 1; i <= kBackends; ++i)
    in.push_back({1000 + i, i == 1 ? firstWeight : 100, i});
  MaglevBuilder b;
  return b.build(in, FlowHasher(kSeed), kMaglevDefaultTableSize).value().table;
}

// A table of `flows` flows placed by the old table, and a snapshot whose
// table gives backend 1 four times the weight.
struct Walk {
  std::unique_ptr<FlowTable> table;
  ForwardingSnapshot snapshot;
  ForwardingSnapshot next;  // make-before-break: backend 2 also weighs 4x
};

MaglevTable tableWith2(std::uint32_t first, std::uint32_t second) {
  std::vector<MaglevBackend> in;
  for (std::uint32_t i = 1; i <= kBackends; ++i) {
    in.push_back({1000 + i, i == 1 ? first : i == 2 ? second : 100, i});
  }
  MaglevBuilder b;
  return b.build(in, FlowHasher(kSeed), kMaglevDefaultTableSize).value().table;
}

Walk& walkFor(std::size_t flows) {
  static std::unique_ptr<Walk> walk;
  static std::size_t built = 0;
  if (built != flows) {
    walk.reset();
    walk = std::make_unique<Walk>();
    walk->table = std::make_unique<FlowTable>(FlowTableConfig{.capacity = flows});
    const MaglevTable old = tableWith(100);
    constexpr std::uint8_t kTag = 7;
    for (std::size_t i = 0; i < flows; ++i) {
      const std::uint64_t h = splitmix64(i);
      (void)walk->table->insert(h, old.lookup(h), FlowState::Established, kNow, kTag);
    }
    ForwardingSnapshot& s = walk->snapshot;
    s.backends.resize(kBackends + 1);
    for (std::uint32_t i = 1; i <= kBackends; ++i) s.backends[i].state = BackendState::Active;
    SnapshotVip v;
    v.tag = kTag;
    v.table = tableWith(400);
    s.vips.push_back(std::move(v));
    s.vipsOfBackend.assign(kBackends + 1, {0});
    ForwardingSnapshot& n = walk->next;
    n.backends = s.backends;
    SnapshotVip nv;
    nv.tag = kTag;
    nv.table = tableWith2(400, 400);
    n.vips.push_back(std::move(nv));
    n.vipsOfBackend = s.vipsOfBackend;
    built = flows;
  }
  return *walk;
}

void BM_ExceptionWalk(benchmark::State& state) {
  const auto flows = static_cast<std::size_t>(state.range(0));
  Walk& w = walkFor(flows);
  std::size_t exceptions = 0;
  for (auto _ : state) {
    exceptions = 0;
    w.table->forEachLive(
        kNow + 1000, 0, w.table->bucketCount(),
        [&](std::uint64_t h, std::uint32_t b, FlowState, std::uint32_t, std::uint8_t tag) {
          exceptions += isTableException(w.snapshot, h, b, tag);
        });
    benchmark::DoNotOptimize(exceptions);
  }
  state.counters["ns_per_flow"] =
      benchmark::Counter(static_cast<double>(flows), benchmark::Counter::kIsIterationInvariantRate |
                                                         benchmark::Counter::kInvert);
  state.counters["exceptions"] = static_cast<double>(exceptions);
}
BENCHMARK(BM_ExceptionWalk)
    ->Arg(1'000'000)
    ->Arg(10'000'000)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

// The worker's walk as it runs (exportsFlow): the second argument 0 judges
// each flow against the snapshot in use only (a plain export), 1 also
// against the one about to be published when the first keeps it on its
// entry (a make-before-break export).
void BM_ExceptionWalkAhead(benchmark::State& state) {
  const auto flows = static_cast<std::size_t>(state.range(0));
  const bool ahead = state.range(1) != 0;
  Walk& w = walkFor(flows);
  std::size_t exceptions = 0;
  for (auto _ : state) {
    exceptions = 0;
    w.table->forEachLive(
        kNow + 1000, 0, w.table->bucketCount(),
        [&](std::uint64_t h, std::uint32_t b, FlowState, std::uint32_t, std::uint8_t tag) {
          exceptions += exportsFlow(w.snapshot, ahead ? &w.next : nullptr, h, b, tag);
        });
    benchmark::DoNotOptimize(exceptions);
  }
  state.counters["ns_per_flow"] =
      benchmark::Counter(static_cast<double>(flows), benchmark::Counter::kIsIterationInvariantRate |
                                                         benchmark::Counter::kInvert);
  state.counters["exceptions"] = static_cast<double>(exceptions);
}
BENCHMARK(BM_ExceptionWalkAhead)
    ->Args({1'000'000, 0})
    ->Args({1'000'000, 1})
    ->Args({10'000'000, 0})
    ->Args({10'000'000, 1})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

std::vector<FlowExceptionRecord> records(std::size_t n) {
  std::vector<FlowExceptionRecord> r(n);
  for (std::size_t i = 0; i < n; ++i) {
    r[i] = {splitmix64(i), 1000 + i % 64, FlowState::Established,
            static_cast<std::uint32_t>(i % 7'200'000)};
  }
  return r;
}

void BM_CheckpointEncode(benchmark::State& state) {
  const auto r = records(static_cast<std::size_t>(state.range(0)));
  std::size_t bytes = 0;
  for (auto _ : state) {
    const std::string s = encodeFlowCheckpoint(kSeed, 1, r);
    bytes = s.size();
    benchmark::DoNotOptimize(s.data());
  }
  state.counters["bytes"] = static_cast<double>(bytes);
  state.counters["bytes_per_exception"] =
      static_cast<double>(bytes) / static_cast<double>(r.size());
}
BENCHMARK(BM_CheckpointEncode)
    ->Arg(1'000'000)
    ->Arg(10'000'000)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

// A durable write (temporary file, fsync, rename, fsync of the directory) in
// $SPILLWAY_BENCH_DIR (default /var/tmp: a disk, not tmpfs).
void BM_CheckpointWrite(benchmark::State& state) {
  const std::string bytes =
      encodeFlowCheckpoint(kSeed, 1, records(static_cast<std::size_t>(state.range(0))));
  const char* env = std::getenv("SPILLWAY_BENCH_DIR");
  const std::string dir = std::string(env != nullptr ? env : "/var/tmp") + "/spillway-bench";
  if (auto e = ensureStateDirectory(dir)) {
    state.SkipWithError(e->c_str());
    return;
  }
  for (auto _ : state) {
    if (auto e = writeFileDurably(dir + "/flows.ckpt", bytes)) {
      state.SkipWithError(e->c_str());
      break;
    }
  }
  std::filesystem::remove_all(dir);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(bytes.size()));
}
BENCHMARK(BM_CheckpointWrite)
    ->Arg(1'000'000)
    ->Arg(10'000'000)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

void BM_CheckpointRestore(benchmark::State& state) {
  const std::string bytes =
      encodeFlowCheckpoint(kSeed, 1, records(static_cast<std::size_t>(state.range(0))));
  std::size_t tableBytes = 0;
  for (auto _ : state) {
    auto parsed = decodeFlowCheckpoint(bytes, kSeed);
    const auto& c = std::get<FlowCheckpoint>(parsed);
    std::vector<ExceptionEntry> entries;
    entries.reserve(c.records.size());
    for (const auto& r : c.records) {
      entries.push_back({r.hash, static_cast<std::uint32_t>(r.backendId - 999), r.state});
    }
    const ExceptionTable t(entries);
    tableBytes = t.memoryBytes();
    benchmark::DoNotOptimize(tableBytes);
  }
  state.counters["table_bytes_per_exception"] =
      static_cast<double>(tableBytes) / static_cast<double>(state.range(0));
}
BENCHMARK(BM_CheckpointRestore)
    ->Arg(1'000'000)
    ->Arg(10'000'000)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

// Second chance's slot history (history.bin) written with each checkpoint
// and read at start: every slot of a table moved (the worst case), eight
// backends.
SlotHistory movedHistory(std::uint32_t slots) {
  SlotHistory h;
  VipSlotHistory& v = h["v"];
  v.tableSize = slots;
  v.slots.reserve(slots);
  for (std::uint32_t s = 0; s < slots; ++s) {
    v.slots.push_back({s, 1000 + s % kBackends, 1000 + (s + 3) % kBackends, s % 60'000});
  }
  return h;
}

void BM_SlotHistoryEncode(benchmark::State& state) {
  const SlotHistory h = movedHistory(static_cast<std::uint32_t>(state.range(0)));
  std::size_t bytes = 0;
  for (auto _ : state) {
    const std::string s = encodeSlotHistory(kSeed, 1, h);
    bytes = s.size();
    benchmark::DoNotOptimize(s.data());
  }
  state.counters["bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_SlotHistoryEncode)
    ->Arg(65'537)
    ->Arg(1'048'573)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);

void BM_SlotHistoryDecode(benchmark::State& state) {
  const std::string bytes =
      encodeSlotHistory(kSeed, 1, movedHistory(static_cast<std::uint32_t>(state.range(0))));
  for (auto _ : state) {
    auto parsed = decodeSlotHistory(bytes, kSeed, 2);
    benchmark::DoNotOptimize(std::get<SlotHistory>(parsed).size());
  }
}
BENCHMARK(BM_SlotHistoryDecode)
    ->Arg(65'537)
    ->Arg(1'048'573)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);

}  // namespace
}  // namespace spillway
