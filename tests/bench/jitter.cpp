// How often, and for how long, a busy-polling thread loses its CPU: the
// floor under any worker's latency tail on this host. A loop that does
// nothing but read the clock, pinned to one CPU, records every gap between
// two reads of 1 us or more in log2 buckets (the worker's round histogram's
// edges, include/spillway/round_histogram.hpp), for --seconds.
//
// A worker's round can be no shorter than the gaps this loop sees on the same
// CPU: timer ticks, interrupts, other threads, and in a virtual machine the
// host taking the vCPU. On a gateway, run it on the cores meant for workers
// (isolcpus / nohz_full set up): a clean core shows almost no gap above a few
// microseconds. BENCHMARKS.md (#16) has the development machine's figures.
//
//   spillway_jitter [--seconds S] [--cpu N] [--json]
#include <sched.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

// Bucket k holds gaps of [2^k, 2^(k+1)) us; the last, everything above.
constexpr std::size_t kBuckets = 15;

struct Result {
  std::array<std::uint64_t, kBuckets> gaps{};
  std::uint64_t loops = 0;
  std::uint64_t lostNs = 0;  // time inside gaps of 1 us or more
  std::uint64_t maxNs = 0;
  double seconds = 0;
};

Result measure(double seconds) {
  Result r;
  const auto start = Clock::now();
  const auto end =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  auto prev = start;
  for (;;) {
    const auto now = Clock::now();
    ++r.loops;
    const auto ns = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(now - prev).count());
    prev = now;
    r.maxNs = std::max(r.maxNs, ns);
    if (ns >= 1000) {
      const auto us = ns / 1000;
      const std::size_t k = std::min<std::size_t>(std::bit_width(us) - 1, kBuckets - 1);
      ++r.gaps[k];
      r.lostNs += ns;
    }
    if (now >= end) break;
  }
  r.seconds = std::chrono::duration<double>(prev - start).count();
  return r;
}

std::string bucketName(std::size_t k) {
  if (k == kBuckets - 1) return ">=" + std::to_string(1u << k) + "us";
  return std::to_string(1u << k) + "-" + std::to_string(2u << k) + "us";
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 5;
  int cpu = -1;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if ((a == "--seconds" || a == "--cpu") && i + 1 < argc) {
      char* endp = nullptr;
      const char* v = argv[++i];
      if (a == "--seconds") {
        seconds = std::strtod(v, &endp);
        if (*endp != '\0' || !(seconds > 0 && seconds <= 3600)) {
          std::fprintf(stderr, "spillway_jitter: --seconds wants a number in (0, 3600]\n");
          return 2;
        }
      } else {
        const long n = std::strtol(v, &endp, 10);
        if (*endp != '\0' || n < 0 || n >= CPU_SETSIZE) {
          std::fprintf(stderr, "spillway_jitter: --cpu wants a CPU number\n");
          return 2;
        }
        cpu = static_cast<int>(n);
      }
    } else {
      std::fprintf(stderr, "usage: spillway_jitter [--seconds S] [--cpu N] [--json]\n");
      return 2;
    }
  }
  if (cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (::sched_setaffinity(0, sizeof set, &set) != 0) {
      std::fprintf(stderr, "spillway_jitter: cannot run on CPU %d: %s\n", cpu,
                   std::strerror(errno));
      return 1;
    }
  }
  const Result r = measure(seconds);
  const double lostShare = r.seconds > 0 ? static_cast<double>(r.lostNs) / 1e9 / r.seconds : 0;
  if (json) {
    std::printf(
        "{\"cpu\": %d, \"seconds\": %.3f, \"loops\": %llu, \"lost_share\": %.6f, "
        "\"max_us\": %.1f, \"gaps\": {",
        cpu, r.seconds, static_cast<unsigned long long>(r.loops), lostShare,
        static_cast<double>(r.maxNs) / 1000);
    for (std::size_t k = 0; k < kBuckets; ++k) {
      std::printf("%s\"%s\": %llu", k == 0 ? "" : ", ", bucketName(k).c_str(),
                  static_cast<unsigned long long>(r.gaps[k]));
    }
    std::printf("}}\n");
    return 0;
  }
  std::printf("CPU %s, %.1f s: the loop lost its CPU for %.3f %% of the time, longest %.1f us\n",
              cpu >= 0 ? std::to_string(cpu).c_str() : "any", r.seconds, 100 * lostShare,
              static_cast<double>(r.maxNs) / 1000);
  for (std::size_t k = 0; k < kBuckets; ++k) {
    if (r.gaps[k] == 0) continue;
    std::printf("  %-10s %10llu  (%.0f per second)\n", bucketName(k).c_str(),
                static_cast<unsigned long long>(r.gaps[k]),
                static_cast<double>(r.gaps[k]) / r.seconds);
  }
  return 0;
}
