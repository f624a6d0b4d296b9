#include "spillway/flow_table.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace spillway {
namespace {

constexpr std::uint32_t kBackendMask = FlowTable::kMaxBackend;
constexpr unsigned kStateShift = 24;
constexpr unsigned kNoSlot = FlowTable::kSlotsPerBucket;
// Relocation depth when both candidate buckets are full: two moves keep
// inserts failure-free to ~90% load; one move bounds what a SYN flood costs.
constexpr int kRelocateDepth = 2;
constexpr int kRelocateDepthEvictable = 1;
// SYN-flood mode: after this many embryonic (or closing) inserts in a row
// found no room even by relocation (a table full of handshakes, where a
// relocation step costs up to eight random bucket reads and cannot succeed),
// such inserts skip it; one in kFloodProbeEvery still tries. The mode ends
// after kFloodEndAfterRoom such inserts in a row found room in their own two
// buckets (a free or expired slot, or an entry that may be evicted): the
// table has room again. Not at the first one: at 99.7 % occupancy one insert
// in ~20 finds a lone free slot, and ending the mode there cost 16 full
// relocation searches to re-enter it, every few dozen SYNs (the memif bench's
// SYN rate with a full table, #16). A relocation probe that succeeds places
// its flow but ends nothing. Established flows always get the full search.
constexpr std::uint32_t kFloodAfterMisses = 16;
constexpr std::uint32_t kFloodProbeEvery = 32;
constexpr std::uint32_t kFloodEndAfterRoom = 4;

constexpr std::uint64_t fingerprintOf(std::uint64_t hash) noexcept {
  return hash | static_cast<std::uint64_t>(hash == 0);
}

constexpr std::uint32_t kStateMask = 7;
constexpr unsigned kVipShift = 27;

constexpr std::uint32_t packMeta(std::uint32_t backend, FlowState state,
                                 std::uint8_t vipTag) noexcept {
  return backend | (static_cast<std::uint32_t>(state) << kStateShift) |
         (std::uint32_t{vipTag} << kVipShift);
}

constexpr FlowState stateOf(std::uint32_t meta) noexcept {
  return static_cast<FlowState>((meta >> kStateShift) & kStateMask);
}

constexpr bool isValidState(FlowState state) noexcept {
  return state >= FlowState::Embryonic && state <= FlowState::Ending;
}

// New entries in these states may not push anything out (but an Ending entry
// idle past the closing timeout); their own entries yield to a new
// Established/Udp/Other entry.
constexpr bool isEvictable(FlowState state) noexcept {
  return state == FlowState::Embryonic || state == FlowState::Closing;
}

constexpr bool isTcp(FlowState state) noexcept {
  return state == FlowState::Embryonic || state == FlowState::Established ||
         state == FlowState::Closing || state == FlowState::Ending;
}

// The design note's transitions. FIN/RST on an open flow (Established or
// Ending) gives Ending, which keeps the established timeout; on a handshake
// (Embryonic, Closing) it gives Closing. Data brings any TCP entry back to
// Established; a bare ACK does so only for an Embryonic one.
constexpr std::uint32_t applyTcpFlags(std::uint32_t meta, FlowEvent event) noexcept {
  const FlowState state = stateOf(meta);
  if (!isTcp(state)) return meta;
  const std::uint8_t flags = event.tcpFlags;
  FlowState next = state;
  if ((flags & (kTcpFin | kTcpRst)) != 0) {
    const bool open = state == FlowState::Established || state == FlowState::Ending;
    next = open ? FlowState::Ending : FlowState::Closing;
  } else if ((flags & kTcpSyn) != 0) {
    if (state == FlowState::Closing) next = FlowState::Embryonic;
  } else if (state == FlowState::Embryonic || event.payload) {
    next = FlowState::Established;
  }
  return (meta & ~(kStateMask << kStateShift)) | (static_cast<std::uint32_t>(next) << kStateShift);
}

std::uint32_t checkedTimeout(const char* field, Millis value) {
  if (value > FlowTable::kMaxTimeout) {
    throw std::invalid_argument("flow table: timeouts." + std::string(field) + " = " +
                                std::to_string(value) + " ms exceeds the maximum " +
                                std::to_string(FlowTable::kMaxTimeout) + " ms");
  }
  return static_cast<std::uint32_t>(value);
}

}  // namespace

std::size_t FlowTable::bucketCountFor(std::size_t capacity) noexcept {
  const std::size_t slots = (std::max<std::size_t>(capacity, 1) * 5 + 3) / 4;  // load <= 80%
  return std::bit_ceil((slots + kSlotsPerBucket - 1) / kSlotsPerBucket);
}

std::size_t FlowTable::memoryBytesFor(std::size_t capacity) noexcept {
  return bucketCountFor(capacity) * (sizeof(Bucket) + kSlotsPerBucket * sizeof(std::uint64_t));
}

FlowTable::FlowTable(const FlowTableConfig& config)
    : capacity_(config.capacity), timeouts_(config.timeouts) {
  if (config.capacity == 0 || config.capacity > kMaxCapacity) {
    throw std::invalid_argument("flow table: capacity = " + std::to_string(config.capacity) +
                                " must be in [1, " + std::to_string(kMaxCapacity) + "]");
  }
  timeoutByState_[static_cast<unsigned>(FlowState::Embryonic)] =
      checkedTimeout("embryonic", timeouts_.embryonic);
  timeoutByState_[static_cast<unsigned>(FlowState::Established)] =
      checkedTimeout("established", timeouts_.established);
  timeoutByState_[static_cast<unsigned>(FlowState::Closing)] =
      checkedTimeout("closing", timeouts_.closing);
  timeoutByState_[static_cast<unsigned>(FlowState::Udp)] = checkedTimeout("udp", timeouts_.udp);
  timeoutByState_[static_cast<unsigned>(FlowState::Other)] =
      checkedTimeout("other", timeouts_.other);
  // A FIN or RST may be forged: it does not shorten an open flow's life.
  timeoutByState_[static_cast<unsigned>(FlowState::Ending)] =
      timeoutByState_[static_cast<unsigned>(FlowState::Established)];

  const std::size_t count = bucketCountFor(capacity_);
  buckets_ = makeTableMemory<Bucket>(count);  // huge pages: table_memory.hpp
  identity_ = makeTableMemory<std::uint64_t>(count * kSlotsPerBucket);
  mask_ = count - 1;
}

FlowTable::~FlowTable() = default;
FlowTable::FlowTable(FlowTable&&) noexcept = default;
FlowTable& FlowTable::operator=(FlowTable&&) noexcept = default;

inline std::size_t FlowTable::otherBucket(std::uint64_t fingerprint,
                                          std::size_t index) const noexcept {
  const std::size_t first = fingerprint & mask_;
  return first == index ? (fingerprint >> 32) & mask_ : first;
}

inline bool FlowTable::expired(const Bucket& bucket, unsigned slot,
                               std::uint32_t now32) const noexcept {
  return static_cast<std::uint32_t>(now32 - bucket.stamp[slot]) >
         timeoutByState_[(bucket.meta[slot] >> kStateShift) & kStateMask];
}

inline void FlowTable::reclaim(Bucket& bucket, unsigned slot) noexcept {
  bucket.fingerprint[slot] = 0;
  bucket.meta[slot] = 0;
  --counters_.occupancy;
  ++counters_.expiredReclaimed;
}

// Branch-free over the four slots: the match position is unpredictable.
inline unsigned FlowTable::Bucket::match(std::uint64_t fp) const noexcept {
  unsigned mask = 0;
  for (unsigned i = 0; i < kSlotsPerBucket; ++i) {
    mask |= static_cast<unsigned>(fingerprint[i] == fp) << i;
  }
  return mask;
}

template <bool kTcp>
inline std::uint32_t FlowTable::touch(Bucket& bucket, unsigned mask, std::uint32_t now32,
                                      FlowEvent event) noexcept {
  const auto slot = static_cast<unsigned>(std::countr_zero(mask));
  if (expired(bucket, slot, now32)) {
    reclaim(bucket, slot);
    return 0;
  }
  bucket.stamp[slot] = now32;
  std::uint32_t meta = bucket.meta[slot];
  if constexpr (kTcp) {
    meta = applyTcpFlags(meta, event);
    bucket.meta[slot] = meta;
  }
  return meta & kBackendMask;
}

template <bool kTcp>
inline std::uint32_t FlowTable::lookupOne(std::uint64_t fingerprint, std::uint32_t now32,
                                          FlowEvent event) noexcept {
  Bucket& first = buckets_[fingerprint & mask_];
  if (const unsigned mask = first.match(fingerprint); mask != 0) {
    return touch<kTcp>(first, mask, now32, event);
  }
  Bucket& second = buckets_[(fingerprint >> 32) & mask_];
  if (const unsigned mask = second.match(fingerprint); mask != 0) {
    return touch<kTcp>(second, mask, now32, event);
  }
  return 0;
}

std::uint32_t FlowTable::lookup(std::uint64_t hash, Millis now) noexcept {
  const std::uint64_t fp = fingerprintOf(hash);
  const std::uint32_t backend = lookupOne<false>(fp, static_cast<std::uint32_t>(now), {});
  ++counters_.lookups;
  counters_.hits += backend != 0;
  return backend;
}

std::uint32_t FlowTable::lookupAndTouch(std::uint64_t hash, Millis now, FlowEvent event) noexcept {
  const std::uint64_t fp = fingerprintOf(hash);
  const std::uint32_t backend = lookupOne<true>(fp, static_cast<std::uint32_t>(now), event);
  ++counters_.lookups;
  counters_.hits += backend != 0;
  return backend;
}

// Most flows sit in their first bucket (inserts prefer it), so a chunk
// prefetches every first bucket, compares, and only then prefetches the
// second buckets of the misses and compares those. A hash's entry is in
// exactly one of its buckets and lookups never move entries, so repeats of a
// hash within a chunk still see each other's effects in order.
template <bool kTcp>
void FlowTable::lookupChunks(std::span<const std::uint64_t> hashes, const FlowEvent* events,
                             std::span<std::uint32_t> out, Millis now) noexcept {
  const std::size_t n = std::min(hashes.size(), out.size());
  const auto now32 = static_cast<std::uint32_t>(now);
  std::array<std::uint64_t, kLookupBatch> fps;
  std::array<Bucket*, kLookupBatch> buckets;
  std::array<std::uint8_t, kLookupBatch> pending;
  std::uint64_t hits = 0;
  const auto eventAt = [&](std::size_t i) noexcept { return kTcp ? events[i] : FlowEvent{}; };
  for (std::size_t base = 0; base < n; base += kLookupBatch) {
    const std::size_t count = std::min(kLookupBatch, n - base);
    for (std::size_t i = 0; i < count; ++i) {
      const std::uint64_t fp = fingerprintOf(hashes[base + i]);
      fps[i] = fp;
      buckets[i] = &buckets_[fp & mask_];
      __builtin_prefetch(buckets[i], 1, 3);
    }
    std::size_t misses = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const unsigned mask = buckets[i]->match(fps[i]);
      if (mask == 0) {
        buckets[i] = &buckets_[(fps[i] >> 32) & mask_];
        __builtin_prefetch(buckets[i], 1, 3);
        pending[misses++] = static_cast<std::uint8_t>(i);
        continue;
      }
      const std::uint32_t backend = touch<kTcp>(*buckets[i], mask, now32, eventAt(base + i));
      out[base + i] = backend;
      hits += backend != 0;
    }
    for (std::size_t p = 0; p < misses; ++p) {
      const std::size_t i = pending[p];
      const unsigned mask = buckets[i]->match(fps[i]);
      const std::uint32_t backend =
          mask == 0 ? 0 : touch<kTcp>(*buckets[i], mask, now32, eventAt(base + i));
      out[base + i] = backend;
      hits += backend != 0;
    }
  }
  counters_.lookups += n;
  counters_.hits += hits;
}

void FlowTable::lookupBatch(std::span<const std::uint64_t> hashes, std::span<std::uint32_t> out,
                            Millis now) noexcept {
  lookupChunks<false>(hashes, nullptr, out, now);
}

void FlowTable::lookupAndTouchBatch(std::span<const std::uint64_t> hashes,
                                    std::span<const FlowEvent> events, std::span<std::uint32_t> out,
                                    Millis now) noexcept {
  lookupChunks<true>(hashes.first(std::min(hashes.size(), events.size())), events.data(), out, now);
}

void FlowTable::prefetch(std::uint64_t hash) const noexcept {
  const std::uint64_t fp = fingerprintOf(hash);
  __builtin_prefetch(&buckets_[fp & mask_], 1, 3);
  __builtin_prefetch(&buckets_[(fp >> 32) & mask_], 1, 3);
}

// First empty or expired slot of `bucket`, made empty (an expired entry is
// reclaimed), or kNoSlot.
unsigned FlowTable::takeFreeSlot(Bucket& bucket, std::uint32_t now32) noexcept {
  for (unsigned i = 0; i < kSlotsPerBucket; ++i) {
    if (bucket.fingerprint[i] == 0) return i;
  }
  for (unsigned i = 0; i < kSlotsPerBucket; ++i) {
    if (expired(bucket, i, now32)) {
      reclaim(bucket, i);
      return i;
    }
  }
  return kNoSlot;
}

// Empties a slot of the full bucket `index` by moving one of its entries to
// that entry's other candidate bucket, looking `depth` moves deep. Returns
// the emptied slot or kNoSlot. Moves keep stamps and states: nothing is lost.
unsigned FlowTable::makeRoom(std::size_t index, int depth, std::uint32_t now32) noexcept {
  Bucket& bucket = buckets_[index];
  if (!purgeSet_.empty()) {
    // Never move an entry that the running purge must erase (it could land
    // behind the cursor): erase them here, which may be the room we need.
    if (const unsigned freed = purgeBucket(bucket); freed != kNoSlot) return freed;
  }
  std::array<std::size_t, kSlotsPerBucket> others;
  for (unsigned i = 0; i < kSlotsPerBucket; ++i) {
    others[i] = otherBucket(bucket.fingerprint[i], index);
    __builtin_prefetch(&buckets_[others[i]], 1, 3);
  }
  for (int level = 1; level <= depth; ++level) {
    for (unsigned i = 0; i < kSlotsPerBucket; ++i) {
      if (others[i] == index) continue;  // both candidates are this bucket
      const unsigned to = level == 1 ? takeFreeSlot(buckets_[others[i]], now32)
                                     : makeRoom(others[i], level - 1, now32);
      if (to == kNoSlot) continue;
      Bucket& target = buckets_[others[i]];
      identity_[others[i] * kSlotsPerBucket + to] = identity_[index * kSlotsPerBucket + i];
      target.fingerprint[to] = bucket.fingerprint[i];
      target.meta[to] = bucket.meta[i];
      target.stamp[to] = bucket.stamp[i];
      bucket.fingerprint[i] = 0;
      bucket.meta[i] = 0;
      ++counters_.relocations;
      return i;
    }
  }
  return kNoSlot;
}

InsertResult FlowTable::insert(std::uint64_t hash, std::uint32_t backend, FlowState state,
                               Millis now, std::uint8_t vipTag) noexcept {
  return insert(hash, backend, state, now, vipTag, fingerprintOf(hash));
}

InsertResult FlowTable::insert(std::uint64_t hash, std::uint32_t backend, FlowState state,
                               Millis now, std::uint8_t vipTag, std::uint64_t identity) noexcept {
  if (backend == 0 || backend > kMaxBackend || !isValidState(state) || vipTag > kMaxVipTag) {
    return InsertResult::Invalid;
  }
  const std::uint64_t fp = fingerprintOf(hash);
  const auto now32 = static_cast<std::uint32_t>(now);
  const std::uint32_t meta = packMeta(backend, state, vipTag);
  const std::size_t firstIndex = fp & mask_;
  const std::size_t secondIndex = (fp >> 32) & mask_;
  Bucket& first = buckets_[firstIndex];
  Bucket& second = buckets_[secondIndex];

  const auto store = [&](Bucket& bucket, unsigned slot) noexcept {
    identity_[bucketIndex(bucket) * kSlotsPerBucket + slot] = identity;
    bucket.fingerprint[slot] = fp;
    bucket.meta[slot] = meta;
    bucket.stamp[slot] = now32;
  };

  // The flow's own slot, live or expired: a hash never has two slots.
  for (Bucket* bucket : {&first, &second}) {
    const unsigned mask = bucket->match(fp);
    if (mask == 0) continue;
    const auto slot = static_cast<unsigned>(std::countr_zero(mask));
    const bool live = !expired(*bucket, slot, now32);
    store(*bucket, slot);
    if (live) {
      ++counters_.updates;
      return InsertResult::Updated;
    }
    ++counters_.expiredReclaimed;
    ++counters_.inserts;
    return InsertResult::Inserted;
  }

  const bool evictable = isEvictable(state);
  const bool flooded = evictable && embryonicRoomMisses_ >= kFloodAfterMisses;
  // An evictable insert that found room: out of the mode, the miss streak
  // starts over; in it, `direct` room (in the flow's own buckets) counts
  // toward the end of the mode and a relocation's does not.
  const auto foundRoom = [&](bool direct) noexcept {
    if (!evictable) return;
    if (!flooded) {
      embryonicRoomMisses_ = 0;
    } else if (!direct) {
      floodRoomStreak_ = 0;
    } else if (++floodRoomStreak_ == kFloodEndAfterRoom) {
      embryonicRoomMisses_ = 0;
      floodRoomStreak_ = 0;
      counters_.synFlood = 0;
    }
  };
  const auto place = [&](Bucket& bucket, unsigned slot, bool direct) noexcept {
    store(bucket, slot);
    ++counters_.occupancy;
    ++counters_.inserts;
    foundRoom(direct);
    return InsertResult::Inserted;
  };
  if (const unsigned slot = takeFreeSlot(first, now32); slot != kNoSlot) {
    return place(first, slot, true);
  }
  if (const unsigned slot = takeFreeSlot(second, now32); slot != kNoSlot) {
    return place(second, slot, true);
  }
  if (flooded) floodRoomStreak_ = 0;
  bool relocate = true;
  if (flooded) {
    relocate = ++floodInserts_ % kFloodProbeEvery == 0;
    if (!relocate) ++counters_.relocationsSkipped;
  }
  if (relocate) {
    const int depth = evictable ? kRelocateDepthEvictable : kRelocateDepth;
    unsigned slot = makeRoom(firstIndex, depth, now32);
    Bucket* into = &first;
    if (slot == kNoSlot && secondIndex != firstIndex) {
      slot = makeRoom(secondIndex, depth, now32);
      into = &second;
    }
    if (slot != kNoSlot) return place(*into, slot, false);
    if (evictable && embryonicRoomMisses_ < kFloodAfterMisses) {
      if (++embryonicRoomMisses_ == kFloodAfterMisses) counters_.synFlood = 1;
    }
  }

  {
    // The oldest entry this one may push out: for a new Established, Udp or
    // Other entry any Embryonic, Closing or Ending one; for a new Embryonic
    // or Closing entry only an Ending one idle past the closing timeout (a
    // SYN flood cannot push out a flow that just saw a FIN or RST, which may
    // have been forged, nor anything else).
    const std::uint32_t closing = timeoutByState_[static_cast<unsigned>(FlowState::Closing)];
    Bucket* victim = nullptr;
    unsigned victimSlot = kNoSlot;
    std::uint32_t oldestAge = 0;
    for (Bucket* bucket : {&first, &second}) {
      for (unsigned i = 0; i < kSlotsPerBucket; ++i) {
        const FlowState held = stateOf(bucket->meta[i]);
        const auto age = static_cast<std::uint32_t>(now32 - bucket->stamp[i]);
        const bool yields = evictable ? held == FlowState::Ending && age > closing
                                      : isEvictable(held) || held == FlowState::Ending;
        if (!yields) continue;
        if (victim == nullptr || age > oldestAge) {
          victim = bucket;
          victimSlot = i;
          oldestAge = age;
        }
      }
    }
    if (victim != nullptr) {
      store(*victim, victimSlot);
      ++counters_.evictions;
      ++counters_.inserts;
      foundRoom(true);
      return InsertResult::Inserted;
    }
  }
  ++counters_.insertFailures;
  if (state == FlowState::Embryonic) {
    ++counters_.embryonicRejected;
    return InsertResult::FullEmbryonic;
  }
  return InsertResult::Full;
}

bool FlowTable::updateBackend(std::uint64_t hash, std::uint32_t backend, Millis now) noexcept {
  if (backend == 0 || backend > kMaxBackend) return false;
  const std::uint64_t fp = fingerprintOf(hash);
  const auto now32 = static_cast<std::uint32_t>(now);
  for (Bucket* bucket : {&buckets_[fp & mask_], &buckets_[(fp >> 32) & mask_]}) {
    const unsigned mask = bucket->match(fp);
    if (mask == 0) continue;
    const auto slot = static_cast<unsigned>(std::countr_zero(mask));
    if (expired(*bucket, slot, now32)) {
      reclaim(*bucket, slot);
      return false;
    }
    bucket->meta[slot] = (bucket->meta[slot] & ~kBackendMask) | backend;
    return true;
  }
  return false;
}

bool FlowTable::erase(std::uint64_t hash) noexcept {
  const std::uint64_t fp = fingerprintOf(hash);
  for (Bucket* bucket : {&buckets_[fp & mask_], &buckets_[(fp >> 32) & mask_]}) {
    const unsigned mask = bucket->match(fp);
    if (mask == 0) continue;
    const auto slot = static_cast<unsigned>(std::countr_zero(mask));
    bucket->fingerprint[slot] = 0;
    bucket->meta[slot] = 0;
    --counters_.occupancy;
    ++counters_.erased;
    return true;
  }
  return false;
}

std::size_t FlowTable::sweep(Millis now, std::size_t maxBuckets) noexcept {
  const auto now32 = static_cast<std::uint32_t>(now);
  const std::size_t count = std::min(maxBuckets, bucketCount());
  std::size_t reclaimed = 0;
  for (std::size_t n = 0; n < count; ++n) {
    Bucket& bucket = buckets_[sweepCursor_];
    sweepCursor_ = (sweepCursor_ + 1) & mask_;
    for (unsigned i = 0; i < kSlotsPerBucket; ++i) {
      if (bucket.fingerprint[i] != 0 && expired(bucket, i, now32)) {
        reclaim(bucket, i);
        ++reclaimed;
      }
    }
  }
  return reclaimed;
}

std::size_t FlowTable::countByBackend(std::span<std::uint32_t> counts, Millis now) const noexcept {
  return countByBackend(counts, now, 0, bucketCount());
}

std::size_t FlowTable::countByBackend(std::span<std::uint32_t> counts, Millis now,
                                      std::size_t firstBucket,
                                      std::size_t bucketLimit) const noexcept {
  const auto now32 = static_cast<std::uint32_t>(now);
  std::size_t live = 0;
  const std::size_t end = std::min(bucketCount(), firstBucket + bucketLimit);
  for (std::size_t b = firstBucket; b < end; ++b) {
    const Bucket& bucket = buckets_[b];
    for (unsigned i = 0; i < kSlotsPerBucket; ++i) {
      if (bucket.fingerprint[i] == 0 || expired(bucket, i, now32)) continue;
      // An Ending flow silent past the closing timeout has ended as far as
      // counts go (drains complete, placement's load): see the design note.
      if (stateOf(bucket.meta[i]) == FlowState::Ending &&
          static_cast<std::uint32_t>(now32 - bucket.stamp[i]) > timeouts_.closing) {
        continue;
      }
      ++live;
      const std::uint32_t backend = bucket.meta[i] & kBackendMask;
      if (backend < counts.size()) ++counts[backend];
    }
  }
  return live;
}

inline bool FlowTable::inPurgeSet(std::uint32_t meta) const noexcept {
  const std::uint32_t backend = meta & kBackendMask;
  const std::size_t word = backend / 64;
  return word < purgeSet_.size() && ((purgeSet_[word] >> (backend % 64)) & 1U) != 0;
}

unsigned FlowTable::purgeBucket(Bucket& bucket) noexcept {
  unsigned freed = kNoSlot;
  for (unsigned i = 0; i < kSlotsPerBucket; ++i) {
    if (bucket.fingerprint[i] == 0 || !inPurgeSet(bucket.meta[i])) continue;
    bucket.fingerprint[i] = 0;
    bucket.meta[i] = 0;
    --counters_.occupancy;
    ++counters_.purged;
    if (freed == kNoSlot) freed = i;
  }
  return freed;
}

void FlowTable::beginPurge(std::span<const std::uint64_t> backends) noexcept {
  purgeSet_ = backends;
  purgeCursor_ = 0;
}

bool FlowTable::purgeSlice(std::size_t maxBuckets) noexcept {
  if (purgeSet_.empty()) return true;
  const std::size_t end = std::min(bucketCount(), purgeCursor_ + maxBuckets);
  for (; purgeCursor_ < end; ++purgeCursor_) (void)purgeBucket(buckets_[purgeCursor_]);
  if (purgeCursor_ < bucketCount()) return false;
  purgeSet_ = {};
  purgeCursor_ = 0;
  return true;
}

std::size_t FlowTable::purgeBackends(std::span<const std::uint64_t> backends) noexcept {
  const std::uint64_t before = counters_.purged;
  beginPurge(backends);
  (void)purgeSlice(bucketCount());
  return static_cast<std::size_t>(counters_.purged - before);
}

void FlowTable::clear() noexcept {
  std::memset(static_cast<void*>(buckets_.get()), 0, bucketCount() * sizeof(Bucket));
  counters_.occupancy = 0;
  sweepCursor_ = 0;
  purgeSet_ = {};
  purgeCursor_ = 0;
  embryonicRoomMisses_ = 0;
  floodInserts_ = 0;
  floodRoomStreak_ = 0;
  counters_.synFlood = 0;
}

}  // namespace spillway
