// What sharing exceptions with peers costs the control thread
// (BENCHMARKS.md, "Peer channel"): one records frame of kPeerRecordsPerFrame
// exceptions encoded (checkpoint record encoding + frame + HMAC-SHA-512-256 tag)
// and decoded (tag verified + records parsed), reported per record; and the
// receiver's rebuild of the snapshot's ExceptionTable from a peer set.
#include <benchmark/benchmark.h>

#include <vector>

#include "control/tier/peer_channel.hpp"
#include "control/tier/peer_wire.hpp"
#include "spillway/flow_exceptions.hpp"

namespace spillway {
namespace {

constexpr std::uint64_t kSeed = 0x5eed;

std::vector<FlowExceptionRecord> sample(std::size_t n) {
  std::vector<FlowExceptionRecord> out;
  std::uint64_t x = 1;
  for (std::size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    out.push_back(FlowExceptionRecord{x, 1000 + (x >> 60), FlowState::Established, 0});
  }
  return out;
}

void BM_PeerEncodeAndMac(benchmark::State& state) {
  const auto records = sample(kPeerRecordsPerFrame);
  const PeerKey key = peerMasterKey("bench-secret-of-32-bytes-0123456");
  std::uint64_t seq = 0;
  std::size_t bytes = 0;
  for (auto _ : state) {
    const std::string frame =
        encodePeerFrame(PeerFrameType::Records, encodePeerRecords(kSeed, records), &key, seq++);
    bytes = frame.size();
    benchmark::DoNotOptimize(frame.data());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * records.size()));
  state.counters["frame_bytes"] = static_cast<double>(bytes);
  state.counters["bytes_per_record"] = static_cast<double>(bytes) / records.size();
}
BENCHMARK(BM_PeerEncodeAndMac);

void BM_PeerVerifyAndDecode(benchmark::State& state) {
  const auto records = sample(kPeerRecordsPerFrame);
  const PeerKey key = peerMasterKey("bench-secret-of-32-bytes-0123456");
  const std::string frame =
      encodePeerFrame(PeerFrameType::Records, encodePeerRecords(kSeed, records), &key, 0);
  for (auto _ : state) {
    const PeerDecoded d = decodePeerFrame(frame, &key, 0);
    auto decoded = decodePeerRecords(std::get<PeerFrame>(d).payload, kSeed);
    benchmark::DoNotOptimize(std::get_if<std::vector<FlowExceptionRecord>>(&decoded));
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * records.size()));
}
BENCHMARK(BM_PeerVerifyAndDecode);

// The sender's side once per export: this instance's exceptions become the
// new local set (compared with the last one); the difference to each peer is
// of the same order (one lookup per record).
void BM_PeerPublishLocal(benchmark::State& state) {
  auto records = sample(static_cast<std::size_t>(state.range(0)));
  EventLog events(16);
  PeerChannel channel(TierConfig{}, kSeed, events);
  std::uint64_t round = 0;
  for (auto _ : state) {
    records[round++ % records.size()].backendId ^= 1;  // one change per export
    channel.publishLocal(records);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * records.size()));
}
BENCHMARK(BM_PeerPublishLocal)->Arg(10'000)->Arg(1'000'000)->Unit(benchmark::kMillisecond);

// The receiver's side once per change batch: the exception table rebuilt from
// the peers' records (the control plane does this at most every 250 ms).
void BM_PeerExceptionTableRebuild(benchmark::State& state) {
  const auto records = sample(static_cast<std::size_t>(state.range(0)));
  std::vector<ExceptionEntry> entries;
  for (const auto& r : records) {
    entries.push_back(
        ExceptionEntry{r.hash, static_cast<std::uint32_t>(r.backendId % 64 + 1), r.state});
  }
  for (auto _ : state) {
    ExceptionTable t(entries);
    benchmark::DoNotOptimize(t.size());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * records.size()));
}
BENCHMARK(BM_PeerExceptionTableRebuild)->Arg(10'000)->Arg(1'000'000)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace spillway
