// libFuzzer target for the peer channel's decoder (control/peer_wire.hpp,
// and intent_wire.hpp for the Intent frames' records):
// the input is what a peer (or anyone who reaches the tier port) sends. It is
// cut into frames as the channel cuts them, first without a key (handshake),
// then with a fixed session key; every frame's payload goes through the
// decoder of its type. Whatever the bytes: no crash, no frame longer than the
// limit, consumption always within the input, and a frame accepted with the
// key must carry a valid tag (re-encoding it reproduces the bytes).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "control/tier/intent_wire.hpp"
#include "control/tier/peer_wire.hpp"

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

void payloads(spillway::PeerFrameType type, std::string_view p) {
  using namespace spillway;
  switch (type) {
    case PeerFrameType::Hello:
      (void)peerPayloadVersion(p);
      if (auto h = decodePeerHello(p)) check(h->version == kPeerVersion);
      break;
    case PeerFrameType::Auth:
      if (auto a = decodePeerAuth(p)) check(a->node.size() <= kPeerMaxNameBytes);
      break;
    case PeerFrameType::Accept:
      (void)decodePeerMac(p);
      break;
    case PeerFrameType::Records:
      (void)decodePeerRecords(p, 0x0123456789abcdefULL);
      break;
    case PeerFrameType::Removed:
      if (auto r = decodePeerRemoved(p)) check(r->size() <= kPeerRemovedPerFrame);
      break;
    case PeerFrameType::Intent: {
      const auto d = decodeIntentFrame(p);
      if (const auto* f = std::get_if<IntentWireFrame>(&d)) {
        // Every entry that decodes re-encodes to a decodable entry equal to it.
        for (const TierIntentEntry& e : f->entries) {
          const auto again = decodeTierIntentEntry(encodeTierIntentEntry(e));
          check(std::holds_alternative<TierIntentEntry>(again) &&
                std::get<TierIntentEntry>(again) == e);
        }
      }
      break;
    }
    default:
      break;
  }
}

void walk(std::string_view input, const spillway::PeerKey* key) {
  using namespace spillway;
  std::uint64_t seq = 0;
  std::size_t at = 0;
  while (at < input.size()) {
    const PeerDecoded d = decodePeerFrame(input.substr(at), key, seq);
    const auto* f = std::get_if<PeerFrame>(&d);
    if (f == nullptr) return;
    check(f->consumed > 0 && f->consumed <= input.size() - at && f->consumed <= kPeerMaxFrame);
    if (key != nullptr) {
      check(encodePeerFrame(f->type, f->payload, key, seq) == input.substr(at, f->consumed));
    }
    payloads(f->type, f->payload);
    at += f->consumed;
    ++seq;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  walk(input, nullptr);
  spillway::PeerKey key;
  key.bytes.fill(0x2a);
  walk(input, &key);
  // Payload decoders on the raw input as well (frames rarely reach them).
  for (auto t : {spillway::PeerFrameType::Hello, spillway::PeerFrameType::Auth,
                 spillway::PeerFrameType::Accept, spillway::PeerFrameType::Records,
                 spillway::PeerFrameType::Removed, spillway::PeerFrameType::Intent}) {
    payloads(t, input);
  }
  return 0;
}
