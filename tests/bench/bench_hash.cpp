// Flow-hash candidates, measured on the same keys: the choice and its reasons
// are in BENCHMARKS.md ("Flow hash"). Run:
//   build/tests/bench/spillway_core_bench --benchmark_filter='FlowHash'
#include <benchmark/benchmark.h>
#include <nmmintrin.h>

#include <random>
#include <vector>

#include "spillway/flow_key.hpp"

#ifdef SPILLWAY_HAVE_XXHASH
#define XXH_INLINE_ALL
#include <xxhash.h>
#endif

namespace spillway {
namespace {

constexpr std::size_t kKeys = 4096;  // fits L1 with room: measures the hash, not memory

std::vector<FlowKey> makeKeys(IpVersion version) {
  std::mt19937_64 rng(11);
  std::vector<FlowKey> keys(kKeys);
  for (auto& k : keys) {
    k.version = version;
    const std::size_t len = version == IpVersion::V4 ? 4 : 16;
    for (std::size_t i = 0; i < len; ++i) {
      k.src[i] = std::byte(rng());
      k.dst[i] = std::byte(rng());
    }
    k.srcPort = Be16::fromHost(static_cast<std::uint16_t>(rng()));
    k.dstPort = Be16::fromHost(443);
    k.proto = 6;
  }
  return keys;
}

// Canonical message length of a key (see FlowHasher::hash).
std::size_t messageLength(const FlowKey& k) {
  return k.version == IpVersion::V4 ? 16 : 40;
}

// The IPv4 canonical message laid out in a buffer; IPv6 keys are hashed over
// src, dst and the tail word, which are contiguous in FlowKey.
void canonical(const FlowKey& k, std::byte* out) {
  if (k.version == IpVersion::V4) {
    std::memcpy(out, k.src.data(), 4);
    std::memcpy(out + 4, k.dst.data(), 4);
    std::memcpy(out + 8, &k.srcPort, 2);
    std::memcpy(out + 10, &k.dstPort, 2);
    out[12] = std::byte(k.proto);
    out[13] = std::byte(4);
    out[14] = out[15] = std::byte(0);
  } else {
    std::memcpy(out, &k, 40);
    out[37] = std::byte(6);
  }
}

template <typename Hash>
void runHash(benchmark::State& state, IpVersion version, Hash hash) {
  const auto keys = makeKeys(version);
  std::vector<std::byte> messages(kKeys * 40);
  for (std::size_t i = 0; i < kKeys; ++i) canonical(keys[i], messages.data() + i * 40);
  std::size_t i = 0;
  std::uint64_t acc = 0;
  for (auto _ : state) {
    acc += hash(keys[i], messages.data() + i * 40, messageLength(keys[i]));
    i = (i + 1) & (kKeys - 1);
  }
  benchmark::DoNotOptimize(acc);
  state.SetItemsProcessed(state.iterations());
}

IpVersion versionArg(const benchmark::State& state) {
  return state.range(0) == 4 ? IpVersion::V4 : IpVersion::V6;
}

void sipHash13(benchmark::State& state) {
  const FlowHasher hasher(0x5eed);
  runHash(state, versionArg(state),
          [&](const FlowKey& k, const std::byte*, std::size_t) { return hasher.hash(k); });
}

void sipHash24(benchmark::State& state) {
  const FlowHasher hasher(0x5eed);
  runHash(state, versionArg(state), [&](const FlowKey&, const std::byte* m, std::size_t n) {
    return sipHash<2, 4>(hasher.k0(), hasher.k1(), std::span<const std::byte>(m, n));
  });
}

// Two CRC32C lanes with different seeds make 64 bits. Fast, but CRC is linear:
// crc(s, a) ^ crc(s, b) does not depend on s for equal lengths, so a seed does
// not stop anyone from making colliding 5-tuples.
void crc32cPair(benchmark::State& state) {
  runHash(state, versionArg(state), [](const FlowKey&, const std::byte* m, std::size_t n) {
    std::uint64_t a = 0x5eed, b = 0xfeed;
    for (std::size_t off = 0; off < n; off += 8) {
      const std::uint64_t w = loadLe64(m + off);
      a = _mm_crc32_u64(a, w);
      b = _mm_crc32_u64(b, w);
    }
    return (a << 32) | b;
  });
}

#ifdef SPILLWAY_HAVE_XXHASH
void xxh3Seeded(benchmark::State& state) {
  runHash(state, versionArg(state), [](const FlowKey&, const std::byte* m, std::size_t n) {
    return XXH3_64bits_withSeed(m, n, 0x5eed);
  });
}
BENCHMARK(xxh3Seeded)->Name("FlowHash/xxh3")->Arg(4)->Arg(6);
#endif

BENCHMARK(sipHash13)->Name("FlowHash/siphash13")->Arg(4)->Arg(6);
BENCHMARK(sipHash24)->Name("FlowHash/siphash24")->Arg(4)->Arg(6);
BENCHMARK(crc32cPair)->Name("FlowHash/crc32c")->Arg(4)->Arg(6);

}  // namespace
}  // namespace spillway
