// IdleBackoff: the pause sequence of an idle worker, round by round (no
// clock: the worker sleeps what it is told).
#include "spillway/idle_backoff.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace spillway {
namespace {

// The pauses of `rounds` empty rounds in a row.
std::vector<std::uint32_t> emptyPauses(IdleBackoff& b, int rounds) {
  std::vector<std::uint32_t> out;
  for (int i = 0; i < rounds; ++i) out.push_back(b.afterRound(0));
  return out;
}

TEST(IdleBackoff, ZeroNeverPauses) {
  IdleBackoff b(0, 5000, 4);
  for (std::uint32_t p : emptyPauses(b, 1000)) EXPECT_EQ(p, 0u);
}

TEST(IdleBackoff, PollsThroughTheFirstEmptyRounds) {
  IdleBackoff b(50, 50, 4);
  EXPECT_EQ(emptyPauses(b, 5), (std::vector<std::uint32_t>{0, 0, 0, 50, 50}));
}

TEST(IdleBackoff, FixedPauseWhenMaxIsMin) {
  IdleBackoff b(100, 100, 1);
  for (std::uint32_t p : emptyPauses(b, 20)) EXPECT_EQ(p, 100u);
}

TEST(IdleBackoff, MaxBelowMinIsAFixedPause) {
  IdleBackoff b(100, 0, 1);
  EXPECT_EQ(b.maxUs(), 100u);
  for (std::uint32_t p : emptyPauses(b, 5)) EXPECT_EQ(p, 100u);
}

TEST(IdleBackoff, DoublesUpToTheMax) {
  IdleBackoff b(50, 1000, 1);
  EXPECT_EQ(emptyPauses(b, 8),
            (std::vector<std::uint32_t>{50, 100, 200, 400, 800, 1000, 1000, 1000}));
}

TEST(IdleBackoff, MaxNotAPowerOfTwoOfMin) {
  IdleBackoff b(30, 100, 1);
  EXPECT_EQ(emptyPauses(b, 4), (std::vector<std::uint32_t>{30, 60, 100, 100}));
}

TEST(IdleBackoff, AFrameReturnsToPollingAndRestartsAtMin) {
  IdleBackoff b(50, 800, 3);
  (void)emptyPauses(b, 10);  // deep in the back-off
  EXPECT_EQ(b.afterRound(1), 0u);
  // polling again: the next quiet spell waits its rounds, then starts at min
  EXPECT_EQ(emptyPauses(b, 4), (std::vector<std::uint32_t>{0, 0, 50, 100}));
}

TEST(IdleBackoff, BusyRoundsNeverPause) {
  IdleBackoff b(50, 800, 1);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(b.afterRound(32), 0u);
}

TEST(IdleBackoff, LargestPausesDoNotOverflow) {
  IdleBackoff b(3'000'000'000u, 4'000'000'000u, 1);
  EXPECT_EQ(emptyPauses(b, 3),
            (std::vector<std::uint32_t>{3'000'000'000u, 4'000'000'000u, 4'000'000'000u}));
}

}  // namespace
}  // namespace spillway
