#include "spillway/steering.hpp"

#include <cstring>

#include "spillway/encap.hpp"
#include "spillway/icmp.hpp"

namespace spillway {

namespace {

FlowState firstState(const PacketView& v) noexcept {
  if (v.key.proto == static_cast<std::uint8_t>(IpProto::Udp)) return FlowState::Udp;
  if (v.key.proto != static_cast<std::uint8_t>(IpProto::Tcp)) return FlowState::Other;
  if ((v.tcpFlags & (kTcpFin | kTcpRst)) != 0) return FlowState::Closing;
  // A SYN opens a flow: embryonic. Any other first packet belongs to a
  // connection already open elsewhere in time (LB restart, ECMP move), or is
  // a spoofed ACK: it is tracked as embryonic too (short timeout, evictable),
  // and the flow table promotes it to established on its next non-SYN packet,
  // so a flood of unsolicited ACKs cannot pin the table.
  return FlowState::Embryonic;
}

bool answersEcho(const ForwardingSnapshot& s, const IpBytes& dst, IpVersion version) noexcept {
  for (const auto& vip : s.vips) {
    if (vip.answerEcho && vip.key.version == version && vip.key.address == dst) return true;
  }
  return false;
}

// Sources no client can have (RFC 1122 §3.2.1.3, RFC 4291 §2.7): a reply
// could not reach them, and a flow from them is spoofed.
bool isInvalidSource(const FlowKey& k) noexcept {
  const auto b0 = std::to_integer<std::uint8_t>(k.src[0]);
  if (k.version == IpVersion::V4) {
    const std::uint32_t a =
        (std::uint32_t{b0} << 24) | (std::to_integer<std::uint32_t>(k.src[1]) << 16) |
        (std::to_integer<std::uint32_t>(k.src[2]) << 8) | std::to_integer<std::uint32_t>(k.src[3]);
    return a == 0 || a == 0xffffffffu || (a >> 24) == 127 || (a >> 28) == 0xe;
  }
  if (b0 == 0xff) return true;  // multicast
  bool zeroPrefix = true;
  for (std::size_t i = 0; i < 15; ++i) zeroPrefix = zeroPrefix && k.src[i] == std::byte{0};
  const auto last = std::to_integer<std::uint8_t>(k.src[15]);
  return zeroPrefix && (last == 0 || last == 1);  // :: and ::1
}

bool isEchoRequest(const PacketView& v) noexcept {
  return v.key.proto == static_cast<std::uint8_t>(IpProto::Icmp) ? v.icmpType == kIcmpEchoRequest
                                                                 : v.icmpType == kIcmp6EchoRequest;
}

}  // namespace

Steering::Steering(const FlowTableConfig& flowTable, std::uint64_t hashSeed,
                   const IcmpRateLimits& icmpLimits)
    : hasher_(hashSeed),
      tableHasher_(hashSeed),
      flows_(flowTable),
      icmpLimiter_(icmpLimits, hasher_),
      ledger_(kBackendSlots) {}

inline void Steering::encapsulateTo(const FrameRef& frame, const PacketView& view,
                                    std::uint64_t hash, std::uint32_t backendIndex, SteerResult& r,
                                    const ForwardingSnapshot& snapshot,
                                    const IpBytes* secondChance) noexcept {
  const SnapshotBackend* backend = snapshot.backend(backendIndex);
  if (backend == nullptr) {
    drop(r, DropReason::NoBackend);
    return;
  }
  if (!backend->nextHopResolved) [[unlikely]] {
    drop(r, DropReason::NextHopUnresolved);
    return;
  }
  // The snapshot built the backend's headers and chose their writer.
  const EncapResult e = backend->encapTemplate.write(frame.buffer, frame.dataOffset, frame.length,
                                                     view, hash, secondChance);
  if (e.ok()) [[likely]] {
    r.secondChance = e.hopWritten;
    r.verdict = Verdict::Forward;
    r.backend = backendIndex;
    r.egressPort = backend->egressPort;
    r.dataOffset = e.dataOffset;
    r.length = e.frameLength;
    counters_.forwarded.add();
    counters_.forwardedBytes.add(e.frameLength);
    return;
  }
  if (e.drop != DropReason::MtuExceeded) {
    drop(r, e.drop);
    return;
  }
  replyMtuExceeded(frame, view, e.icmpMtu, r);
}

void Steering::placeAndForward(const FrameRef& frame, Pending& p, SteerResult& r,
                               const ForwardingSnapshot& snapshot, Millis now) noexcept {
  const SnapshotVip& vip = snapshot.vips[p.vip];
  // A second SYN of the flow in this burst (its entry is younger than the
  // batched lookup) goes where the first went.
  if (const std::uint32_t earlier = flows_.lookup(p.hash, now); earlier != 0) {
    encapsulateTo(frame, p.view, p.hash, earlier, r, snapshot);
    return;
  }
  const std::uint64_t identity = identityOf(p);
  const Placement placed = placeNewFlow(vip.table, *vip.placement, ledger_, identity, vip.tag);
  std::uint32_t backend = placed.backend;
  if (backend == 0) {
    drop(r, DropReason::NoBackend);
    return;
  }
  bool tracked = false;
  if (backend != placed.tableBackend) {
    // Off the table: only a tracked flow stays there.
    const InsertResult ins =
        flows_.insert(p.hash, backend, FlowState::Embryonic, now, vip.tag, identity);
    tracked = ins == InsertResult::Inserted || ins == InsertResult::Updated;
    if (!tracked) {
      counters_.flowInsertFailed.add();
      backend = placed.tableBackend;
    }
  }
  encapsulateTo(frame, p.view, p.hash, backend, r, snapshot);
  if (r.verdict != Verdict::Forward) {
    if (tracked) flows_.erase(p.hash);
    return;
  }
  if (!tracked) {
    const InsertResult ins =
        flows_.insert(p.hash, backend, FlowState::Embryonic, now, vip.tag, identity);
    if (ins == InsertResult::Full || ins == InsertResult::FullEmbryonic) {
      counters_.flowInsertFailed.add();
      return;
    }
    if (ins != InsertResult::Inserted) return;
  } else {
    counters_.placedOffTable.add();
  }
  counters_.newFlows.add();
  r.newFlow = true;
  ledger_.add(backend, vip.tag);
}

void Steering::drop(SteerResult& r, DropReason reason) noexcept {
  r.verdict = Verdict::Drop;
  r.drop = reason;
  counters_.drops.add(reason);
}

void Steering::replyMtuExceeded(const FrameRef& frame, const PacketView& view,
                                std::uint16_t icmpMtu, SteerResult& r) noexcept {
  // Too big once encapsulated: tell the client its path MTU, within the
  // ICMP rate limits. The reply is built aside (it quotes the frame), then
  // copied over the frame's buffer.
  if (!icmpLimiter_.allow(view.key.src, burstNow_)) {
    drop(r, DropReason::IcmpRateLimited);
    return;
  }
  const std::span<const std::byte> original = frame.buffer.subspan(frame.dataOffset, frame.length);
  std::array<std::byte, 1536> reply;
  const std::size_t n = view.key.version == IpVersion::V4
                            ? buildFragmentationNeeded(original, view, icmpMtu, reply)
                            : buildPacketTooBig(original, view, icmpMtu, reply);
  if (n == 0) {  // nothing may be sent about this packet (RFC 1812 / 4443)
    drop(r, DropReason::MtuExceeded);
    return;
  }
  if (n > frame.buffer.size()) {  // no room for the reply in this buffer
    drop(r, DropReason::MtuExceeded);
    return;
  }
  const std::size_t at = frame.dataOffset + n <= frame.buffer.size() ? frame.dataOffset : 0;
  std::memcpy(frame.buffer.data() + at, reply.data(), n);
  r.verdict = Verdict::Reply;
  r.dataOffset = at;
  r.length = n;
  counters_.replies.add();
  counters_.mtuReplies.add();
}

void Steering::finishVipFrame(const FrameRef& frame, Pending& p, SteerResult& r,
                              const ForwardingSnapshot& snapshot, Millis now) noexcept {
  const SnapshotVip& vip = snapshot.vips[p.vip];
  std::uint32_t backend = r.backend;  // the batched lookup's hit, or 0
  if (backend != 0) {
    const SnapshotBackend* b = snapshot.backend(backend);
    // A bare SYN on a tracked 5-tuple is a new connection reusing it: it goes
    // where new flows go when its old backend takes no new ones (draining).
    const bool newConnection = (p.view.tcpFlags & (kTcpSyn | kTcpAck)) == kTcpSyn &&
                               p.view.key.proto == static_cast<std::uint8_t>(IpProto::Tcp);
    if (b == nullptr || !keepsTrackedFlows(b->state) ||
        (newConnection && b->state != BackendState::Active)) {
      // Its backend failed or was removed: re-select, and only this flow moves.
      backend = vip.table.lookup(identityOf(p));
      if (backend == 0) {
        drop(r, DropReason::NoBackend);
        return;
      }
      flows_.updateBackend(p.hash, backend, now);
      counters_.resteered.add();
    }
    encapsulateTo(frame, p.view, p.hash, backend, r, snapshot);
    return;
  }
  const std::uint64_t identity = identityOf(p);
  bool byException = false;
  ExceptionOrigin origin = ExceptionOrigin::Unknown;
  FlowState state = firstState(p.view);
  if (snapshot.exceptions != nullptr) {
    // Not tracked here, but placed before these tables (a restored checkpoint,
    // a peer's flow): it keeps that backend while the backend keeps flows. A
    // bare SYN reusing the 5-tuple of a closing flow is a new connection.
    const ExceptionTable::Hit hit = snapshot.exceptions->find(identity);
    if (hit.backend != 0) {
      const SnapshotBackend* b = snapshot.backend(hit.backend);
      const bool bareSyn = (p.view.tcpFlags & (kTcpSyn | kTcpAck)) == kTcpSyn &&
                           p.view.key.proto == static_cast<std::uint8_t>(IpProto::Tcp);
      const bool newConnection = bareSyn && (hit.state == FlowState::Closing || b == nullptr ||
                                             b->state != BackendState::Active);
      if (b != nullptr && keepsTrackedFlows(b->state) && !newConnection) {
        backend = hit.backend;
        byException = true;
        origin = hit.origin;
        // A flow the checkpoint knew as established (or UDP, other) is
        // tracked as such again, not as a new embryonic entry: a sparse flow
        // (keepalives minutes apart) must not time out after 5 s.
        if (state == FlowState::Embryonic && hit.state != FlowState::Closing &&
            hit.state != FlowState::Embryonic && (p.view.tcpFlags & kTcpSyn) == 0) {
          state = hit.state;
        }
      }
    }
  }
  if (backend == 0 && vip.placement != nullptr && state == FlowState::Embryonic &&
      (p.view.tcpFlags & (kTcpSyn | kTcpAck)) == kTcpSyn) {
    placeAndForward(frame, p, r, snapshot, now);
    return;
  }
  const bool byTable = backend == 0;
  if (byTable) backend = vip.table.lookup(identity);
  if (backend == 0) {
    drop(r, DropReason::NoBackend);
    return;
  }
  // Second chance: a TCP packet in mid-flow that only the table placed, on a
  // slot that changed within the hold time, names the slot's previous owner,
  // whose socket it may belong to (a load balancer that tracked it died or
  // lost it). The backend decides (spillway-decap).
  const IpBytes* hop = nullptr;
  if (byTable && p.view.key.proto == static_cast<std::uint8_t>(IpProto::Tcp) &&
      (p.view.tcpFlags & kTcpSyn) == 0) {
    if (const std::uint32_t previous = vip.previousOwnerOf(identity);
        previous != 0 && previous != backend) {
      const SnapshotBackend* prev = snapshot.backend(previous);
      const SnapshotBackend* next = snapshot.backend(backend);
      if (prev != nullptr && next != nullptr && keepsTrackedFlows(prev->state)) {
        if (usesGue(next->encap.kind) &&
            outerIpVersion(prev->encap.kind) == outerIpVersion(next->encap.kind)) {
          hop = &prev->encap.backend;
        } else {
          counters_.secondChanceUnsent.add();
        }
      }
    }
  }
  encapsulateTo(frame, p.view, p.hash, backend, r, snapshot, hop);
  // A flow is tracked once its first packet is on its way to the backend; one
  // answered with an MTU error or dropped is not a flow yet.
  if (r.verdict != Verdict::Forward) return;
  if (hop != nullptr) {
    if (!r.secondChance) {
      counters_.secondChanceUnsent.add();
    } else {
      // Not tracked: its next packets are placed by the table too, and so
      // carry the hop while the slot's history lasts. Tracking it on the
      // table's backend would send them without.
      counters_.secondChanceSent.add();
      return;
    }
  }
  const InsertResult ins = flows_.insert(p.hash, backend, state, now, vip.tag, identity);
  if (ins == InsertResult::Inserted) {
    counters_.newFlows.add();
    // (packets of one flow in one burst all miss the batched lookup: count
    // the flow once, when its entry is made)
    if (byException) {
      counters_.exceptionHits.add();
      counters_.exceptionHitsByOrigin[static_cast<std::size_t>(origin) % kExceptionOriginCount]
          .add();
      adopted_.record(AdoptedFlow{identity, backend, origin, vip.tag, now});
    }
    r.newFlow = true;
  } else if (ins == InsertResult::Full || ins == InsertResult::FullEmbryonic) {
    counters_.flowInsertFailed.add();
  }
}

void Steering::steerBurst(std::span<const FrameRef> frames, std::span<SteerResult> results,
                          const ForwardingSnapshot& snapshot, Millis now) noexcept {
  std::size_t batch = 0;
  const std::size_t n = frames.size() < kMaxBurst ? frames.size() : kMaxBurst;
  burstNow_ = now;

  // Stage 1: parse, classify, hash.
  for (std::size_t i = 0; i < n; ++i) {
    const FrameRef& f = frames[i];
    Pending& p = pending_[i];
    SteerResult& r = results[i];
    r = SteerResult{};
    counters_.rxPackets.add();
    counters_.rxBytes.add(f.length);
    parsePacket(f.buffer.subspan(f.dataOffset, f.length), p.view);
    const PacketView& v = p.view;
    if (v.kind == PacketKind::NonIp) {
      if (v.ok()) {
        r.verdict = Verdict::ToKernel;
        counters_.toKernel.add();
      } else {
        drop(r, v.drop);
      }
      continue;
    }
    if (!v.l3Valid) {
      drop(r, v.drop);
      continue;
    }
    // Ordinary VIP traffic takes one lookup, its (address, proto, port) VIP;
    // only a miss asks whether the address is a VIP's at all.
    std::uint32_t vip = VipIndex::kNone;
    if (v.ok() && !v.isIcmp()) {
      vip = snapshot.vipIndex.find(v.key.dst, v.key.version, v.key.proto, v.key.dstPort.host());
    }
    if (vip == VipIndex::kNone && !snapshot.vipIndex.isVipAddress(v.key.dst, v.key.version)) {
      r.verdict = Verdict::ToKernel;
      counters_.toKernel.add();
      continue;
    }
    if (!v.ok()) {
      drop(r, v.drop);
      continue;
    }
    if (isInvalidSource(v.key)) {
      drop(r, DropReason::InvalidSource);
      continue;
    }
    // Forged sources (issue #13): no client has the VIP's own address
    // ("land", the reply would loop to us) or another VIP's or the gateway's.
    if (v.key.src == v.key.dst) [[unlikely]] {
      drop(r, DropReason::Land);
      continue;
    }
    if (snapshot.vipIndex.isOwnAddress(v.key.src, v.key.version)) [[unlikely]] {
      drop(r, DropReason::OwnSource);
      continue;
    }
    if (v.isIcmp()) {
      if (isIcmpError(v)) {
        // The frame view is relative to the frame, not the buffer.
        const auto bytes = f.buffer.subspan(f.dataOffset, f.length);
        const IcmpErrorFlow e = parseIcmpError(bytes, v);
        if (e.drop != DropReason::None) {
          drop(r, e.drop);
          continue;
        }
        const std::uint32_t vipIdx =
            snapshot.vipIndex.find(e.clientFlow.dst, e.clientFlow.version, e.clientFlow.proto,
                                   e.clientFlow.dstPort.host());
        if (vipIdx == VipIndex::kNone) {
          drop(r, DropReason::IcmpUnsupported);
          continue;
        }
        const std::uint64_t h = tableHasher_.hash(e.clientFlow);
        std::uint32_t backend = flows_.lookup(h, now);
        const SnapshotBackend* b = snapshot.backend(backend);
        // The identity only where the flow table does not settle it.
        const std::uint64_t identity =
            b == nullptr || !keepsTrackedFlows(b->state) ? hasher_.hash(e.clientFlow) : 0;
        if ((b == nullptr || !keepsTrackedFlows(b->state)) && snapshot.exceptions != nullptr) {
          const ExceptionTable::Hit hit = snapshot.exceptions->find(identity);
          b = snapshot.backend(hit.backend);
          backend = b != nullptr && keepsTrackedFlows(b->state) ? hit.backend : 0;
        }
        if (b == nullptr || !keepsTrackedFlows(b->state)) {
          backend = snapshot.vips[vipIdx].table.lookup(identity);
        }
        if (backend == 0) {
          drop(r, DropReason::NoBackend);
          continue;
        }
        encapsulateTo(f, v, h, backend, r, snapshot);
        if (r.verdict == Verdict::Forward) counters_.icmpErrorsSteered.add();
        continue;
      }
      if (isEchoRequest(v) && answersEcho(snapshot, v.key.dst, v.key.version)) {
        if (!icmpLimiter_.allow(v.key.src, now)) {
          drop(r, DropReason::IcmpRateLimited);
          continue;
        }
        const std::size_t len = buildEchoReply(f.buffer.subspan(f.dataOffset, f.length), v);
        if (len == 0) {
          drop(r, DropReason::IcmpUnsupported);
          continue;
        }
        r.verdict = Verdict::Reply;
        r.dataOffset = f.dataOffset;
        r.length = len;
        counters_.replies.add();
        continue;
      }
      drop(r, DropReason::IcmpUnsupported);
      continue;
    }
    if (vip == VipIndex::kNone) {
      drop(r, DropReason::VipPortNotServed);
      continue;
    }
    p.vip = vip;
    p.hash = tableHasher_.hash(v.key);
    p.identityKnown = false;
    batchHashes_[batch] = p.hash;
    batchEvents_[batch] = FlowEvent{v.tcpFlags, v.tcpData};
    batchFrames_[batch] = static_cast<std::uint8_t>(i);
    ++batch;
  }

  // Stage 2: one batched, prefetched flow-table pass.
  flows_.lookupAndTouchBatch(std::span(batchHashes_.data(), batch),
                             std::span(batchEvents_.data(), batch),
                             std::span(batchHits_.data(), batch), now);

  // Stage 3: select, track, encapsulate.
  for (std::size_t j = 0; j < batch; ++j) {
    const std::size_t i = batchFrames_[j];
    results[i].backend = batchHits_[j];
    finishVipFrame(frames[i], pending_[i], results[i], snapshot, now);
  }
}

}  // namespace spillway
