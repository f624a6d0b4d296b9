// When an idle worker pauses, and for how long (issue #15: kernel-port and
// small deployments, where a worker that spins on an empty queue burns a
// core the host needs for other work).
//
// After every polling round the worker reports how many frames it received.
// While frames come it polls without pause. Once `roundsBeforeSleep` rounds
// in a row were empty, it pauses `minUs` between rounds; every further empty
// pause doubles the next one, up to `maxUs`; the first frame returns it to
// polling and the next quiet spell starts again at `minUs`. So a worker on an
// idle port settles at one wake-up per `maxUs` (its CPU falls with maxUs),
// while a frame that arrives during a pause waits at most the pause it
// arrived in: up to `minUs` right after traffic, up to `maxUs` after a long
// quiet spell. minUs == maxUs is the fixed pause; minUs == 0 never pauses.
//
// Pure arithmetic: no clock, no sleep (the caller sleeps), so tests drive it
// round by round. Thread contract: one owner (the worker's lcore); noexcept.
#pragma once

#include <cstdint>

namespace spillway {

class IdleBackoff {
 public:
  static constexpr std::uint32_t kDefaultRoundsBeforeSleep = 256;

  // maxUs below minUs is taken as minUs (a fixed pause).
  IdleBackoff(std::uint32_t minUs, std::uint32_t maxUs,
              std::uint32_t roundsBeforeSleep = kDefaultRoundsBeforeSleep) noexcept
      : minUs_(minUs),
        maxUs_(maxUs < minUs ? minUs : maxUs),
        roundsBeforeSleep_(roundsBeforeSleep),
        nextUs_(minUs) {}

  // The pause, in microseconds, to take after a round that received
  // `received` frames; 0: poll on at once.
  [[nodiscard]] std::uint32_t afterRound(unsigned received) noexcept {
    if (received != 0) {
      emptyRounds_ = 0;
      nextUs_ = minUs_;
      return 0;
    }
    if (minUs_ == 0) return 0;
    if (emptyRounds_ < roundsBeforeSleep_) {
      ++emptyRounds_;
      if (emptyRounds_ < roundsBeforeSleep_) return 0;
    }
    const std::uint32_t pause = nextUs_;
    nextUs_ = nextUs_ > maxUs_ / 2 ? maxUs_ : nextUs_ * 2;
    return pause;
  }

  [[nodiscard]] std::uint32_t minUs() const noexcept { return minUs_; }
  [[nodiscard]] std::uint32_t maxUs() const noexcept { return maxUs_; }

 private:
  std::uint32_t minUs_;
  std::uint32_t maxUs_;
  std::uint32_t roundsBeforeSleep_;
  std::uint32_t emptyRounds_ = 0;
  std::uint32_t nextUs_;
};

}  // namespace spillway
