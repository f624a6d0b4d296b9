// Per-lcore connection tracking: flow hash -> backend index, with expiry by
// TCP state and idle time.
//
// Shaped like VPP's lb plugin `lbhash.h` (power-of-two array of 64-byte
// buckets, time passed in, lazy expiry, inserts that may fail and are
// counted), corrected where lbhash can mis-steer or lose flows:
//  - The fingerprint is the owner's whole 64-bit per-packet hash (Steering:
//    FlowTableHasher, the AES-round hash under a per-process key), so two
//    flows share an entry only on a 64-bit collision under a key nobody
//    outside the process knows. A hash of 0 is stored as 1 (0 marks an empty
//    slot): hashes 0 and 1 name the same flow.
//  - Beside each slot, in a separate array the lookups never touch, the
//    flow's identity: its FlowHasher hash (SipHash-1-3 under hash_seed), the
//    value the exception export classifies and sends (forEachLive), so the
//    checkpoint and the peers see exactly what they saw before the table
//    was keyed by a cheaper hash. Written by insert, moved with a
//    relocation: 8 bytes a slot (24 with the bucket's 16), read only by the
//    export walk. insert() without an identity stores the hash itself.
//  - Each flow has two candidate buckets: b1 from the low 32 bits of the
//    hash, b2 from the high 32 bits. An insert takes a free or expired slot of
//    b1, else of b2, else moves an entry of a full candidate to its own other
//    bucket (cuckoo, at most two moves deep; one for Embryonic and Closing
//    inserts, so a rejected SYN in a full table costs ~0.5 us, not ~2.5 us).
//    Lookups check b1 then b2. Capacity is sized for at most 80% slot load;
//    filled with random flows, no Established insert failed below 80% load
//    and under 1 in 10^4 below 90%. A failed Embryonic insert (~1 in 10^3
//    near 80%) is harmless while the Maglev table is unchanged: the flow's
//    next packet inserts it as Established.
//  - Nothing is ever LRU-evicted. A new Established, Udp or Other entry may
//    evict the oldest Embryonic, Closing or Ending entry of its two buckets,
//    never an Established/Udp/Other one, so a SYN flood cannot push out a
//    long-idle NCCL flow. A new Embryonic or Closing entry may evict only an
//    Ending entry idle longer than the closing timeout; otherwise, when both
//    buckets are full, it fails (counted).
//
// Bucket layout: 4 entries of 16 bytes, struct-of-arrays so the four
// fingerprints compare in one pass: fingerprint (u64), backend index (low 24
// bits, 0 = none) | state (3 bits) | VIP tag (high 5 bits: which VIP's table
// placed the flow, for the exception export; flow_exceptions.hpp), last-seen
// stamp (u32 ms).
//
// Time: every call takes `now`, milliseconds from any epoch on a monotonic
// clock; the table never reads a clock. Stamps keep the low 32 bits and age is
// uint32(now - stamp), so an entry is live while age <= its state's timeout.
// An expired entry is absent to lookups and its slot is reusable. The owner
// must sweep() every bucket at least once per (2^32 ms - longest timeout),
// about 49 days, or an entry idle that long would look fresh again; sweeping
// a few buckets per idle poll does this many times over.
//
// TCP states on a hit (lookupAndTouch):
//  - FIN or RST on an open flow (Established, Ending) -> Ending; on a
//    handshake (Embryonic, Closing) -> Closing;
//  - a packet without SYN, FIN or RST: on Embryonic -> Established; on
//    Closing or Ending -> Established when it carries data, else unchanged;
//  - SYN on a Closing entry (port reuse) -> Embryonic, keeping its backend (a
//    caller that wants to re-select for a reused port checks the SYN and
//    calls updateBackend); SYN on any other state changes nothing.
// Why Ending (issue #13): the load balancer sees only client -> backend
// packets (DSR) and keeps no sequence numbers (no room in 16 bytes), so it
// cannot tell a real FIN or RST from one forged by anybody who knows the
// 4-tuple, and a live NCCL flow may be silent for minutes after one. So a
// FIN or RST does not shorten an open flow's life: Ending keeps the
// established timeout (no SYN, FIN, RST or bare ACK an attacker sends
// shortens it either), and the flow's next data makes it Established again.
// What a real close costs instead: its entry lingers up to the established
// timeout (2 h by default) after the last packet, not 10 s, but it yields
// its slot to any new Established/Udp/Other flow at once and to a new
// handshake after the closing timeout (10 s) of silence, and a SYN reusing
// the tuple reuses it; so lingering closed flows never cost a live or new
// flow a slot. Counted flows (countByBackend: what a drain waits for, what
// placement balances) leave out an Ending flow silent past the closing
// timeout, so a drain completes as soon after its flows' FINs as before; an
// Ending flow that speaks again after its backend was drained away is
// re-steered (the one case a forged RST still costs, and only on a backend
// being drained or removed). To push out a live flow after a forged RST an attacker must
// fill both its buckets, which the keyed hash hides: in practice the whole
// table. Cost per packet: one more compare in the transition (the data bit
// comes from the parser's TCP header length).
// On a miss the caller inserts: Embryonic for a SYN or a first packet
// without SYN (mid-flow after an LB restart or an ECMP move; promoted on the
// next packet); Closing for a first FIN or RST; Udp for UDP; Other for
// anything else.
//
// Purging backend indices (beginPurge / purgeSlice): before the control plane
// gives a removed backend's index to another backend, every entry that names
// it must be gone, or a long-idle flow of the old backend would wake up on
// the new one. The owner erases them a slice of buckets at a time (entries
// live or expired). A cuckoo relocation could move such an entry from a
// bucket the cursor has not reached into one it has passed, so while a purge
// runs makeRoom() erases the purged entries of every bucket it would move
// from instead of moving them (which also frees the slot it was looking
// for). Lookups and inserts pay nothing: only the relocation path checks
// whether a purge runs.
//
// Thread contract: one owner lcore calls every member function; no locks, no
// atomics, no allocation after construction (the constructor allocates and
// pre-faults the buckets and may throw; every other member is noexcept).
// Control threads read only counters(): single-writer relaxed words
// (RelaxedU64), summed by the stats code. countByBackend() and the purge
// run on the owner lcore.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "spillway/stats.hpp"
#include "spillway/table_memory.hpp"
#include "spillway/wire.hpp"

namespace spillway {

// Milliseconds from an arbitrary epoch, supplied by the caller.
using Millis = std::uint64_t;

enum class FlowState : std::uint8_t {
  Embryonic = 1,    // SYN seen, handshake not completed
  Established = 2,  // any non-SYN packet seen, or first packet mid-flow
  Closing = 3,      // FIN or RST seen
  Udp = 4,
  Other = 5,   // protocols without connection state
  Ending = 6,  // FIN or RST seen on an established flow (see the design note)
};

// Idle timeouts per state; each at most FlowTable::kMaxTimeout.
struct FlowTimeouts {
  Millis embryonic = 5'000;
  Millis established = 7'200'000;  // Linux tcp_keepalive_time: idle NCCL flows
  Millis closing = 10'000;
  Millis udp = 300'000;
  Millis other = 60'000;
};

struct FlowTableConfig {
  std::size_t capacity = std::size_t{1} << 20;  // flows; sizes the buckets
  FlowTimeouts timeouts{};
};

// What a packet says about its flow: the TCP header's flag byte (kTcpFin,
// kTcpSyn, kTcpRst, kTcpAck from wire.hpp).
struct FlowEvent {
  std::uint8_t tcpFlags = 0;
  bool payload = false;  // the segment carries data
};

enum class InsertResult : std::uint8_t {
  Inserted,       // new entry (possibly in a reclaimed or evicted slot)
  Updated,        // a live entry for this hash was overwritten
  FullEmbryonic,  // both buckets full of entries it may not evict; counted
  Full,           // as above, for any other state; counted
  Invalid,        // backend 0 or > kMaxBackend, or not a FlowState; not counted
};

// Single writer (the owner lcore).
struct FlowTableCounters {
  RelaxedU64 lookups = 0;
  RelaxedU64 hits = 0;
  RelaxedU64 inserts = 0;            // Inserted results
  RelaxedU64 updates = 0;            // Updated results
  RelaxedU64 insertFailures = 0;     // FullEmbryonic + Full results
  RelaxedU64 embryonicRejected = 0;  // FullEmbryonic results
  RelaxedU64 evictions = 0;          // Embryonic/Closing entries pushed out
  RelaxedU64 relocations = 0;        // entries moved to their other bucket
  RelaxedU64 relocationsSkipped =
      0;                            // embryonic/closing inserts in SYN-flood mode (no cuckoo step)
  RelaxedU64 expiredReclaimed = 0;  // by sweep, lookup or insert
  RelaxedU64 erased = 0;
  RelaxedU64 purged = 0;     // entries erased because their backend index was purged
  RelaxedU64 occupancy = 0;  // slots in use: live plus expired not yet reclaimed
  RelaxedU64 synFlood = 0;   // 1 while in SYN-flood mode (written only when it changes)
};

class FlowTable {
 public:
  static constexpr std::uint32_t kMaxBackend = (std::uint32_t{1} << 24) - 1;
  static constexpr std::uint8_t kMaxVipTag = 31;
  static constexpr std::size_t kSlotsPerBucket = 4;
  static constexpr Millis kMaxTimeout = Millis{1} << 31;  // ~24.8 days
  static constexpr std::size_t kMaxCapacity = std::size_t{1} << 33;
  // Hashes whose buckets are in flight together in lookupBatch().
  static constexpr std::size_t kLookupBatch = 32;

  // Throws std::invalid_argument for capacity 0 or above kMaxCapacity or a
  // timeout above kMaxTimeout, std::bad_alloc when memory runs out.
  explicit FlowTable(const FlowTableConfig& config);
  ~FlowTable();
  FlowTable(FlowTable&&) noexcept;
  FlowTable& operator=(FlowTable&&) noexcept;
  FlowTable(const FlowTable&) = delete;
  FlowTable& operator=(const FlowTable&) = delete;

  // Backend index of the live entry for `hash`, or 0. A hit refreshes the
  // stamp; an expired match is reclaimed.
  [[nodiscard]] std::uint32_t lookup(std::uint64_t hash, Millis now) noexcept;

  // lookup() that also applies the TCP transition of the packet's flags.
  [[nodiscard]] std::uint32_t lookupAndTouch(std::uint64_t hash, Millis now,
                                             FlowEvent event) noexcept;

  // lookup() / lookupAndTouch() of every hash, in order, into out[i]
  // (out.size() and events.size() must be at least hashes.size()). Per chunk
  // of kLookupBatch hashes: prefetch every b1, compare, then prefetch the b2
  // of the b1 misses and compare those.
  void lookupBatch(std::span<const std::uint64_t> hashes, std::span<std::uint32_t> out,
                   Millis now) noexcept;
  void lookupAndTouchBatch(std::span<const std::uint64_t> hashes, std::span<const FlowEvent> events,
                           std::span<std::uint32_t> out, Millis now) noexcept;

  // Starts buckets of `hash` on their way to the cache, for a caller that
  // knows the hash a while before it looks up or inserts.
  void prefetch(std::uint64_t hash) const noexcept;

  // Sets backend, state, VIP tag and stamp of the entry for `hash`, creating
  // it if absent. See the design note for which entries a full pair may
  // evict. vipTag (0 = unknown, else the flow's SnapshotVip::tag) lets the
  // exception export tell which VIP's table placed the flow.
  InsertResult insert(std::uint64_t hash, std::uint32_t backend, FlowState state, Millis now,
                      std::uint8_t vipTag = 0) noexcept;
  // As above, with the flow's identity (its FlowHasher hash) kept beside the
  // entry for forEachLive.
  InsertResult insert(std::uint64_t hash, std::uint32_t backend, FlowState state, Millis now,
                      std::uint8_t vipTag, std::uint64_t identity) noexcept;

  // Re-steers the live entry for `hash` (its backend FAILED), keeping state
  // and stamp. False when there is no live entry or the backend is invalid.
  bool updateBackend(std::uint64_t hash, std::uint32_t backend, Millis now) noexcept;

  // Frees the slot of `hash`, live or expired. False when there was none.
  bool erase(std::uint64_t hash) noexcept;

  // Reclaims the expired entries of the next maxBuckets buckets (round robin
  // over the table); returns how many. sweep(now, bucketCount()) is a full
  // pass, after which counters().occupancy is the number of live flows.
  std::size_t sweep(Millis now, std::size_t maxBuckets) noexcept;

  // Adds, for every live entry, 1 to counts[backend] (indices beyond the
  // span are skipped); returns the number of live entries. An Ending entry
  // idle past the closing timeout does not count (the design note). Walks
  // the whole table: ~memoryBytes() of reads.
  std::size_t countByBackend(std::span<std::uint32_t> counts, Millis now) const noexcept;
  // The same over buckets [firstBucket, firstBucket + bucketLimit), so the
  // owner lcore can count a large table a slice per loop iteration.
  std::size_t countByBackend(std::span<std::uint32_t> counts, Millis now, std::size_t firstBucket,
                             std::size_t bucketLimit) const noexcept;

  // Calls fn(identity, backend, state, idleMs, vipTag) for every live entry
  // of buckets [firstBucket, firstBucket + bucketLimit) (the identity given
  // to insert, else the hash as stored: 0 reads as 1); returns how many. The
  // owner lcore walks a large table a slice at a time.
  template <class Fn>
  std::size_t forEachLive(Millis now, std::size_t firstBucket, std::size_t bucketLimit,
                          Fn&& fn) const noexcept {
    const auto now32 = static_cast<std::uint32_t>(now);
    const std::size_t end =
        firstBucket + bucketLimit < bucketCount() ? firstBucket + bucketLimit : bucketCount();
    std::size_t live = 0;
    for (std::size_t b = firstBucket; b < end; ++b) {
      const Bucket& bucket = buckets_[b];
      for (unsigned i = 0; i < kSlotsPerBucket; ++i) {
        if (bucket.fingerprint[i] == 0) continue;
        const std::uint32_t idle = now32 - bucket.stamp[i];
        const std::uint32_t meta = bucket.meta[i];
        const auto state = static_cast<FlowState>((meta >> 24) & 7);
        if (idle > timeoutByState_[static_cast<std::size_t>(state)]) continue;
        ++live;
        fn(identity_[b * kSlotsPerBucket + i], meta & kMaxBackend, state, idle,
           static_cast<std::uint8_t>(meta >> 27));
      }
    }
    return live;
  }

  // Starts erasing every entry, live or expired, whose backend index is in
  // `backends`: a bitmap, index i is in it when bit i % 64 of word i / 64 is
  // set. The bitmap must stay valid and unchanged until the pass completes.
  // The caller inserts no entry naming those indices meanwhile. A purge
  // already running restarts with the new set. An empty span purges nothing.
  void beginPurge(std::span<const std::uint64_t> backends) noexcept;
  // Purges the next maxBuckets buckets; true when the pass is complete (the
  // purge then ends: no entry names a purged index), also when none runs.
  bool purgeSlice(std::size_t maxBuckets) noexcept;
  [[nodiscard]] bool purging() const noexcept { return !purgeSet_.empty(); }
  // The whole pass at once; returns the entries it erased.
  std::size_t purgeBackends(std::span<const std::uint64_t> backends) noexcept;

  // Empties the table; counters other than occupancy keep counting. Ends a purge.
  void clear() noexcept;

  [[nodiscard]] const FlowTableCounters& counters() const noexcept { return counters_; }
  [[nodiscard]] const FlowTimeouts& timeouts() const noexcept { return timeouts_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::size_t bucketCount() const noexcept { return mask_ + 1; }
  [[nodiscard]] std::size_t slotCount() const noexcept { return bucketCount() * kSlotsPerBucket; }
  [[nodiscard]] std::size_t memoryBytes() const noexcept { return memoryBytesFor(capacity_); }
  [[nodiscard]] double bytesPerFlowAtCapacity() const noexcept {
    return static_cast<double>(memoryBytes()) / static_cast<double>(capacity_);
  }

  // Sizing, without building a table: the smallest power-of-two bucket count
  // whose slots hold `capacity` flows at <= 80% load, and its bytes.
  [[nodiscard]] static std::size_t bucketCountFor(std::size_t capacity) noexcept;
  [[nodiscard]] static std::size_t memoryBytesFor(std::size_t capacity) noexcept;

 private:
  struct alignas(64) Bucket {
    std::array<std::uint64_t, kSlotsPerBucket> fingerprint;  // 0 = empty slot
    std::array<std::uint32_t, kSlotsPerBucket> meta;         // backend | state << 24 | vipTag << 27
    std::array<std::uint32_t, kSlotsPerBucket> stamp;        // low 32 bits of now

    // Bit i set when slot i holds `fp`.
    [[nodiscard]] unsigned match(std::uint64_t fp) const noexcept;
  };
  static_assert(sizeof(Bucket) == 64 && alignof(Bucket) == 64);

  template <bool kTcp>
  std::uint32_t touch(Bucket& bucket, unsigned mask, std::uint32_t now32, FlowEvent event) noexcept;
  template <bool kTcp>
  std::uint32_t lookupOne(std::uint64_t fingerprint, std::uint32_t now32, FlowEvent event) noexcept;
  template <bool kTcp>
  void lookupChunks(std::span<const std::uint64_t> hashes, const FlowEvent* events,
                    std::span<std::uint32_t> out, Millis now) noexcept;
  [[nodiscard]] bool expired(const Bucket& bucket, unsigned slot,
                             std::uint32_t now32) const noexcept;
  void reclaim(Bucket& bucket, unsigned slot) noexcept;
  unsigned takeFreeSlot(Bucket& bucket, std::uint32_t now32) noexcept;
  unsigned makeRoom(std::size_t index, int depth, std::uint32_t now32) noexcept;
  [[nodiscard]] std::size_t bucketIndex(const Bucket& bucket) const noexcept {
    return static_cast<std::size_t>(&bucket - buckets_.get());
  }
  [[nodiscard]] bool inPurgeSet(std::uint32_t meta) const noexcept;
  // Erases the purged entries of one bucket; returns the lowest freed slot or kNoSlot.
  unsigned purgeBucket(Bucket& bucket) noexcept;
  [[nodiscard]] std::size_t otherBucket(std::uint64_t fingerprint,
                                        std::size_t index) const noexcept;

  TableMemory<Bucket> buckets_;
  TableMemory<std::uint64_t> identity_;  // slot b * kSlotsPerBucket + i of bucket b
  std::size_t mask_ = 0;
  // SYN-flood mode (flow_table.cpp): consecutive embryonic/closing inserts
  // that found no room even by relocation, a running count of inserts in
  // the mode (every kFloodProbeEvery-th still tries a relocation), and the
  // inserts in a row in the mode that found room in their own buckets.
  std::uint32_t embryonicRoomMisses_ = 0;
  std::uint32_t floodInserts_ = 0;
  std::uint32_t floodRoomStreak_ = 0;
  std::size_t capacity_ = 0;
  std::size_t sweepCursor_ = 0;
  std::span<const std::uint64_t> purgeSet_;  // empty: no purge running
  std::size_t purgeCursor_ = 0;
  std::array<std::uint32_t, 8> timeoutByState_{};  // indexed by FlowState; 0 otherwise
  FlowTimeouts timeouts_{};
  FlowTableCounters counters_{};
};

}  // namespace spillway
