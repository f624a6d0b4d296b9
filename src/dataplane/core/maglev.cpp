#include "spillway/maglev.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <utility>

namespace spillway {
namespace {

constexpr std::uint64_t kOffsetDomain = 0;
constexpr std::uint64_t kSkipDomain = 1;

// Trial division by 6k +- 1: at most ~11k divisions below 2^32.
constexpr bool isPrime(std::uint32_t n) noexcept {
  if (n < 4) return n >= 2;
  if (n % 2 == 0 || n % 3 == 0) return false;
  for (std::uint64_t d = 5; d * d <= n; d += 6) {
    if (n % d == 0 || n % (d + 2) == 0) return false;
  }
  return true;
}

std::uint32_t primeAtOrBelow(std::uint32_t n) noexcept {
  while (n > 2 && !isPrime(n)) --n;
  return n;
}

std::uint32_t primeSuggestion(std::uint32_t n) noexcept {
  if (n < 2) return kMaglevDefaultTableSize;
  if (n >= kMaglevMaxTableSize) return primeAtOrBelow(kMaglevMaxTableSize);
  while (n < kMaglevMaxTableSize && !isPrime(n)) ++n;
  return isPrime(n) ? n : primeAtOrBelow(kMaglevMaxTableSize);
}

// x with a x = 1 (mod m); a in [1, m), m prime.
std::uint32_t inverseMod(std::uint32_t a, std::uint32_t m) noexcept {
  std::int64_t t = 0, newT = 1;
  std::int64_t r = m, newR = a;
  while (newR != 0) {
    const std::int64_t q = r / newR;
    t = std::exchange(newT, t - q * newT);
    r = std::exchange(newR, r - q * newR);
  }
  return static_cast<std::uint32_t>(t < 0 ? t + m : t);
}

// Turn order of the plain loop: iteration t = 1, 2, ..., and within it
// position order; backend i takes a turn when t w_i >= target_i. Each
// iteration's takers are listed at once, without a branch per backend.
class LoopTurns {
 public:
  LoopTurns(const std::uint32_t* weight, std::uint64_t* target, std::vector<std::uint32_t>& takers,
            std::size_t n, std::uint64_t maxWeight)
      : weight_(weight), target_(target), n_(n), maxWeight_(maxWeight) {
    takers.resize(n);
    takers_ = takers.data();
  }

  std::size_t next() noexcept {
    while (pos_ == len_) {
      // Locals: target_ may alias the members as far as the compiler knows.
      const std::uint64_t t = ++t_;
      const std::uint32_t* weight = weight_;
      std::uint64_t* target = target_;
      std::uint32_t* takers = takers_;
      const std::uint64_t maxWeight = maxWeight_;
      std::size_t len = 0;
      for (std::size_t i = 0; i < n_; ++i) {
        const std::uint64_t take = t * weight[i] >= target[i] ? 1 : 0;
        takers[len] = static_cast<std::uint32_t>(i);
        target[i] += (0 - take) & maxWeight;  // a mask, not a branch to mispredict
        len += take;
      }
      pos_ = 0;
      len_ = len;
    }
    return takers_[pos_++];
  }

  // Takes back the turns listed but not taken when the table filled.
  void settle() noexcept {
    for (; pos_ < len_; ++pos_) target_[takers_[pos_]] -= maxWeight_;
  }
  [[nodiscard]] std::uint32_t turnsTaken(std::size_t i, std::uint32_t) const noexcept {
    return static_cast<std::uint32_t>(target_[i] / maxWeight_);
  }

 private:
  const std::uint32_t* weight_;
  std::uint64_t* target_;
  std::uint32_t* takers_;
  std::size_t n_;
  std::uint64_t maxWeight_;
  std::uint64_t t_ = 0;
  std::size_t pos_ = 0;
  std::size_t len_ = 0;
};

// The loop's order when all weights are equal: every backend takes a turn in
// every iteration.
class RoundRobinTurns {
 public:
  explicit RoundRobinTurns(std::size_t n) noexcept : n_(n) {}

  std::size_t next() noexcept {
    const std::size_t i = i_;
    i_ = i + 1 == n_ ? 0 : i + 1;
    return i;
  }
  void settle() noexcept {}
  // After `placed` turns in all.
  [[nodiscard]] std::uint32_t turnsTaken(std::size_t i, std::uint32_t placed) const noexcept {
    return static_cast<std::uint32_t>(placed / n_ + (i < placed % n_ ? 1 : 0));
  }

 private:
  std::size_t n_;
  std::size_t i_ = 0;
};

// The same order from a min-heap of (iteration << 32 | position) keys, for
// weights so skewed that most backends sit out most iterations. A backend's
// next iteration is the first after this one with t w >= target. Every
// iteration places at least one slot (the heaviest backend takes a turn in
// each), so a turn past iteration M never happens and is dropped.
class HeapTurns {
 public:
  HeapTurns(const std::uint32_t* weight, std::uint64_t* target, std::vector<std::uint64_t>& heap,
            std::size_t n, std::uint64_t maxWeight, std::uint32_t tableSize)
      : weight_(weight),
        target_(target),
        heap_(heap),
        maxWeight_(maxWeight),
        tableSize_(tableSize) {
    heap_.resize(n);
    for (std::size_t i = 0; i < n; ++i) heap_[i] = (std::uint64_t{1} << 32) | i;  // sorted: a heap
  }

  std::size_t next() noexcept {
    const std::uint64_t top = heap_[0];
    const std::uint64_t t = top >> 32;
    const auto i = static_cast<std::uint32_t>(top);
    target_[i] += maxWeight_;
    const std::uint64_t nextTurn = std::max(t + 1, (target_[i] + weight_[i] - 1) / weight_[i]);
    if (nextTurn <= tableSize_) {
      siftDown((nextTurn << 32) | i);
    } else {
      const std::uint64_t last = heap_.back();
      heap_.pop_back();
      if (!heap_.empty()) siftDown(last);
    }
    return i;
  }
  void settle() noexcept {}
  [[nodiscard]] std::uint32_t turnsTaken(std::size_t i, std::uint32_t) const noexcept {
    return static_cast<std::uint32_t>(target_[i] / maxWeight_);
  }

 private:
  // Puts key at the root and restores the heap order.
  void siftDown(std::uint64_t key) noexcept {
    std::uint64_t* h = heap_.data();
    const std::size_t size = heap_.size();
    std::size_t hole = 0;
    for (std::size_t child = 1; child < size; child = 2 * hole + 1) {
      if (child + 1 < size && h[child + 1] < h[child]) ++child;
      if (key <= h[child]) break;
      h[hole] = h[child];
      hole = child;
    }
    h[hole] = key;
  }

  const std::uint32_t* weight_;
  std::uint64_t* target_;
  std::vector<std::uint64_t>& heap_;
  std::uint64_t maxWeight_;
  std::uint64_t tableSize_;
};

struct FillState {
  std::uint32_t tableSize;
  std::size_t takers;
  std::uint32_t* entries;
  std::uint32_t* next;
  const std::uint32_t* skip;
  const std::uint32_t* value;
  std::uint32_t* count;
  std::uint32_t* inverse;              // 0 until needed
  std::vector<std::uint64_t>* filled;  // one bit per slot
  std::vector<std::uint32_t>* empty;
};

// Two phases find a turn's slot. While many slots are empty, the backend walks
// its permutation, probing a bitmap of filled slots (M bits stay in L1/L2).
// Once only E <= sqrt(M/2) are empty, a walk would cost ~M/E probes, so the
// backend instead takes, of the E empty slots, the one it reaches in the fewest
// steps, (s - next) * skip^-1 mod M. Both find the same slot: the first
// unfilled one in its permutation.
// `turns` is taken by value: a local whose address never escapes, so stores
// through the table pointers cannot alias its counters.
template <typename Turns>
void fillTable(Turns turns, const FillState& f) noexcept {
  const std::uint32_t m = f.tableSize;
  std::uint32_t* entries = f.entries;
  std::uint32_t* next = f.next;
  const std::uint32_t* skip = f.skip;
  const std::uint32_t* value = f.value;
  std::uint64_t* filled = f.filled->data();

  std::uint32_t endgame = 0;
  while (std::uint64_t{endgame + 1} * (endgame + 1) * 2 <= m) ++endgame;

  // Gives slot c to turn taker i, whose walk goes on after c.
  const auto place = [&](std::size_t i, std::uint32_t c) {
    filled[c >> 6] |= std::uint64_t{1} << (c & 63);
    entries[c] = value[i];
    c += skip[i];
    next[i] = c >= m ? c - m : c;
  };
  const auto isFilled = [filled](std::uint32_t x) {
    return static_cast<std::uint32_t>(filled[x >> 6] >> (x & 63)) & 1;
  };
  const auto step = [m](std::uint32_t x, std::uint32_t d) {
    return x + d >= m ? x + d - m : x + d;
  };

  // A walk's strides of one to four skips (modulo m), for the unrolled loops.
  const auto strides = [&](std::uint32_t s) {
    const std::uint32_t s2 = step(s, s);
    const std::uint32_t s3 = step(s2, s);
    return std::array<std::uint32_t, 4>{s, s2, s3, step(s3, s)};
  };

  // Sparse table: the first probe mostly finds an empty slot.
  std::uint32_t remaining = m;
  const std::uint32_t dense = m - m / 3;
  for (; remaining > dense; --remaining) {
    const std::size_t i = turns.next();
    const std::uint32_t s = skip[i];
    std::uint32_t c = next[i];
    while (isFilled(c)) c = step(c, s);
    place(i, c);
  }
  // Denser table: probe four slots at once and pick the first empty one without
  // branches, so the loop branch is taken with probability f^4 rather than a
  // branch per probe mispredicting near f = 1/2.
  const std::uint32_t packed = m / 6;
  for (; remaining > packed && remaining > endgame; --remaining) {
    const std::size_t i = turns.next();
    const auto [s, s2, s3, s4] = strides(skip[i]);
    std::uint32_t c = next[i];
    for (;;) {
      const std::uint32_t c1 = step(c, s), c2 = step(c, s2), c3 = step(c, s3);
      const std::uint32_t f0 = isFilled(c), f1 = isFilled(c1), f2 = isFilled(c2), f3 = isFilled(c3);
      if ((f0 & f1 & f2 & f3) == 0) {
        std::uint32_t pick = c3;
        pick ^= (pick ^ c2) & (f2 - 1);  // f - 1 is all ones where empty
        pick ^= (pick ^ c1) & (f1 - 1);
        pick ^= (pick ^ c) & (f0 - 1);
        c = pick;
        break;
      }
      c = step(c, s4);
    }
    place(i, c);
  }
  // Nearly full: walks are long and their branches predictable; unrolled by
  // four so the modular steps of a walk do not form one serial chain.
  for (; remaining > endgame; --remaining) {
    const std::size_t i = turns.next();
    const auto [s, s2, s3, s4] = strides(skip[i]);
    std::uint32_t c = next[i];
    for (;;) {
      const std::uint32_t c1 = step(c, s), c2 = step(c, s2), c3 = step(c, s3);
      if (!isFilled(c)) break;
      if (!isFilled(c1)) {
        c = c1;
        break;
      }
      if (!isFilled(c2)) {
        c = c2;
        break;
      }
      if (!isFilled(c3)) {
        c = c3;
        break;
      }
      c = step(c, s4);
    }
    place(i, c);
  }

  std::vector<std::uint32_t>& empty = *f.empty;
  empty.clear();
  for (std::uint32_t w = 0; w < f.filled->size(); ++w) {
    for (std::uint64_t free = ~filled[w]; free != 0; free &= free - 1) {
      empty.push_back(w * 64 + static_cast<std::uint32_t>(std::countr_zero(free)));
    }
  }
  const double reciprocal = 1.0 / m;
  while (!empty.empty()) {
    const std::size_t i = turns.next();
    const std::uint32_t s = skip[i];
    const std::uint32_t c = next[i];
    if (f.inverse[i] == 0) f.inverse[i] = inverseMod(s, m);
    const std::uint64_t inv = f.inverse[i];
    std::size_t best = 0;
    std::int64_t bestSteps = m;
    for (std::size_t k = 0; k < empty.size(); ++k) {
      const std::uint32_t e = empty[k];
      const std::uint64_t x = std::uint64_t{e >= c ? e - c : e + m - c} * inv;  // < 2^48, exact
      auto steps = static_cast<std::int64_t>(
          x - static_cast<std::uint64_t>(static_cast<double>(x) * reciprocal) * m);
      if (steps < 0) steps += m;
      if (steps >= m) steps -= m;
      if (steps < bestSteps) {
        bestSteps = steps;
        best = k;
      }
    }
    const std::uint32_t slot = empty[best];
    empty[best] = empty.back();
    empty.pop_back();
    place(i, slot);
  }
  turns.settle();
  for (std::size_t i = 0; i < f.takers; ++i) f.count[i] = turns.turnsTaken(i, m);
}

// A value that occurs twice in `values` (which it may reorder). Indices are
// usually dense, so a bitmap of seen values does; a sort does otherwise.
std::optional<std::uint32_t> findDuplicate(std::vector<std::uint32_t>& values,
                                           std::vector<std::uint64_t>& seen) {
  const std::uint64_t limit = 64 * values.size() + 4096;
  if (std::all_of(values.begin(), values.end(), [&](std::uint32_t v) { return v < limit; })) {
    seen.assign(limit / 64 + 1, 0);
    for (std::uint32_t v : values) {
      const std::uint64_t bit = std::uint64_t{1} << (v & 63);
      if (seen[v >> 6] & bit) return v;
      seen[v >> 6] |= bit;
    }
    return std::nullopt;
  }
  std::sort(values.begin(), values.end());
  const auto dup = std::adjacent_find(values.begin(), values.end());
  if (dup == values.end()) return std::nullopt;
  return *dup;
}

MaglevError error(std::string message) {
  return MaglevError{std::move(message)};
}

}  // namespace

std::optional<std::string> validateMaglevTableSize(std::uint32_t tableSize) {
  if (tableSize > kMaglevMaxTableSize) {
    return "table size " + std::to_string(tableSize) + " exceeds the maximum " +
           std::to_string(kMaglevMaxTableSize) + "; use a prime such as " +
           std::to_string(primeSuggestion(tableSize));
  }
  if (!isPrime(tableSize)) {
    return "table size " + std::to_string(tableSize) + " is not prime; use a prime such as " +
           std::to_string(primeSuggestion(tableSize));
  }
  return std::nullopt;
}

MaglevPermutation maglevPermutation(const FlowHasher& hasher, std::uint64_t id,
                                    std::uint32_t tableSize) noexcept {
  MaglevPermutation p;
  if (tableSize < 2) return p;
  p.offset = static_cast<std::uint32_t>(hasher.hashId(id, kOffsetDomain) % tableSize);
  p.skip = static_cast<std::uint32_t>(hasher.hashId(id, kSkipDomain) % (tableSize - 1) + 1);
  return p;
}

std::uint32_t countChanged(const MaglevTable& before, const MaglevTable& after) noexcept {
  if (before.size() != after.size()) return after.size();
  const std::uint32_t* a = before.entries().data();
  const std::uint32_t* b = after.entries().data();
  std::uint32_t changed = 0;
  for (std::uint32_t i = 0; i < after.size(); ++i) changed += a[i] != b[i] ? 1 : 0;
  return changed;
}

void MaglevBuilder::clearScratch(std::size_t capacity) {
  for (auto* v : {&next_, &skip_, &weight_, &value_, &count_}) {
    v->clear();
    v->reserve(capacity);
  }
  target_.clear();
  target_.reserve(capacity);
  shares_.clear();
  shares_.reserve(capacity);
}

void MaglevBuilder::addTurnTaker(std::uint32_t offset, std::uint32_t skip, std::uint32_t weight,
                                 std::uint32_t backendIndex) {
  next_.push_back(offset);
  skip_.push_back(skip);
  weight_.push_back(weight);
  value_.push_back(backendIndex);
  count_.push_back(0);
  target_.push_back(0);
}

// Precondition: at least one turn taker, all skips in [1, M), offsets in [0, M).
void MaglevBuilder::fill(std::uint32_t tableSize, std::uint32_t* entries) noexcept {
  const std::uint32_t m = tableSize;
  const std::size_t n = next_.size();
  filled_.assign((m + 63) / 64, 0);
  if (m % 64 != 0) filled_.back() = ~std::uint64_t{0} << (m % 64);  // past the last slot
  inverse_.assign(n, 0);
  const FillState state{.tableSize = m,
                        .takers = n,
                        .entries = entries,
                        .next = next_.data(),
                        .skip = skip_.data(),
                        .value = value_.data(),
                        .count = count_.data(),
                        .inverse = inverse_.data(),
                        .filled = &filled_,
                        .empty = &empty_};

  std::uint64_t weightSum = 0;
  for (std::uint32_t w : weight_) weightSum += w;
  const std::uint64_t maxWeight = *std::max_element(weight_.begin(), weight_.end());
  // The loop checks all n backends in each of ~M w_max / W iterations, ~2.4
  // cycles a check; the heap costs ~9 cycles per level, log2(n) levels, per
  // slot (measured on this EPYC with MaglevBuildMixed and MaglevBuildSkewed).
  const std::uint64_t loopChecks = (std::uint64_t{m} * maxWeight / weightSum + 1) * n;
  const std::uint64_t heapLevels = std::uint64_t{m} * std::bit_width(n);
  if (maxWeight * n == weightSum) {
    RoundRobinTurns turns(n);
    fillTable(turns, state);
  } else if (loopChecks * 24 <= heapLevels * 90) {
    LoopTurns turns(weight_.data(), target_.data(), takers_, n, maxWeight);
    fillTable(turns, state);
  } else {
    HeapTurns turns(weight_.data(), target_.data(), heap_, n, maxWeight, m);
    fillTable(turns, state);
  }
}

MaglevBuildResult MaglevBuilder::finish(std::uint32_t tableSize, const MaglevTable* previous) {
  MaglevBuild build;
  build.table.entries_.assign(tableSize, 0);
  build.table.size_ = tableSize;
  build.allNone = next_.empty();
  if (!build.allNone) fill(tableSize, build.table.entries_.data());
  std::size_t taker = 0;
  for (MaglevShare& share : shares_) {
    if (share.weight > 0) share.entries = count_[taker++];
  }
  build.shares = shares_;
  build.changed = previous != nullptr ? countChanged(*previous, build.table) : tableSize;
  return build;
}

MaglevBuildResult MaglevBuilder::build(std::span<const MaglevBackend> backends,
                                       const FlowHasher& hasher, std::uint32_t tableSize,
                                       const MaglevTable* previous) {
  if (auto bad = validateMaglevTableSize(tableSize)) return error(*std::move(bad));

  sorted_.assign(backends.begin(), backends.end());
  std::sort(sorted_.begin(), sorted_.end(),
            [](const MaglevBackend& a, const MaglevBackend& b) { return a.id < b.id; });
  for (std::size_t k = 0; k < sorted_.size(); ++k) {
    const MaglevBackend& b = sorted_[k];
    if (k > 0 && sorted_[k - 1].id == b.id) {
      return error("duplicate backend id " + std::to_string(b.id));
    }
    if (b.backendIndex == 0) {
      return error("backend id " + std::to_string(b.id) +
                   " has backendIndex 0, which means \"none\"; indices start at 1");
    }
  }
  indices_.clear();
  for (const MaglevBackend& b : sorted_) indices_.push_back(b.backendIndex);
  if (auto dup = findDuplicate(indices_, seen_)) {
    return error("backendIndex " + std::to_string(*dup) + " is used by two backends");
  }

  clearScratch(sorted_.size());
  for (const MaglevBackend& b : sorted_) {
    shares_.push_back(MaglevShare{b.id, b.backendIndex, b.weight, 0});
    if (b.weight == 0) continue;
    const MaglevPermutation p = maglevPermutation(hasher, b.id, tableSize);
    addTurnTaker(p.offset, p.skip, b.weight, b.backendIndex);
  }
  return finish(tableSize, previous);
}

MaglevBuildResult MaglevBuilder::buildFromPermutations(
    std::span<const MaglevPermutation> permutations, std::uint32_t tableSize,
    const MaglevTable* previous) {
  if (auto bad = validateMaglevTableSize(tableSize)) return error(*std::move(bad));

  indices_.clear();
  clearScratch(permutations.size());
  for (std::size_t i = 0; i < permutations.size(); ++i) {
    const MaglevPermutation& p = permutations[i];
    const std::string which = "permutation " + std::to_string(i);
    if (p.offset >= tableSize) {
      return error(which + " has offset " + std::to_string(p.offset) + "; offset must be in [0, " +
                   std::to_string(tableSize) + ")");
    }
    if (p.skip == 0 || p.skip >= tableSize) {
      return error(which + " has skip " + std::to_string(p.skip) + "; skip must be in [1, " +
                   std::to_string(tableSize) + ")");
    }
    if (p.backendIndex == 0) {
      return error(which + " has backendIndex 0, which means \"none\"; indices start at 1");
    }
    indices_.push_back(p.backendIndex);
    shares_.push_back(MaglevShare{i, p.backendIndex, p.weight, 0});
    if (p.weight > 0) addTurnTaker(p.offset, p.skip, p.weight, p.backendIndex);
  }
  if (auto dup = findDuplicate(indices_, seen_)) {
    return error("backendIndex " + std::to_string(*dup) + " is used by two backends");
  }
  return finish(tableSize, previous);
}

}  // namespace spillway
