#include "control/tier/peer_wire.hpp"

#include <sodium.h>
#include <sys/stat.h>

#include <bit>
#include <cerrno>
#include <cstring>

#include "control/intent/flow_checkpoint.hpp"
#include "control/sys/durable_file.hpp"
#include "control/sys/le_bytes.hpp"
#include "spillway/errno_text.hpp"

namespace spillway {
namespace {

static_assert(std::endian::native == std::endian::little, "the peer wire is little-endian");
static_assert(kPeerTagBytes == crypto_auth_hmacsha512256_BYTES);
static_assert(kPeerKeyBytes == crypto_auth_hmacsha512256_KEYBYTES);
static_assert(kPeerKeyBytes >= crypto_generichash_KEYBYTES_MIN &&
              kPeerKeyBytes <= crypto_generichash_BYTES_MAX);

// sodium_init once per process (thread-safe, idempotent): picks the fastest
// implementations and seeds randombytes.
void sodiumReady() noexcept {
  static const int ready = sodium_init();
  (void)ready;
}

const unsigned char* bytesOf(std::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

// HMAC-SHA-512-256 of seq || frame (header and payload), streamed so a
// 64 KiB frame is not copied.
PeerMac frameTag(const PeerKey& key, std::uint64_t seq, std::string_view frame) noexcept {
  crypto_auth_hmacsha512256_state state;
  crypto_auth_hmacsha512256_init(&state, key.bytes.data(), key.bytes.size());
  unsigned char s[8];
  std::memcpy(s, &seq, 8);
  crypto_auth_hmacsha512256_update(&state, s, sizeof s);
  crypto_auth_hmacsha512256_update(&state, bytesOf(frame), frame.size());
  PeerMac tag{};
  crypto_auth_hmacsha512256_final(&state, reinterpret_cast<unsigned char*>(tag.data()));
  sodium_memzero(&state, sizeof state);
  return tag;
}

template <class T>
void put(std::string& out, T value) {
  char b[sizeof(T)];
  std::memcpy(b, &value, sizeof(T));
  out.append(b, sizeof(T));
}

// Reads a payload front to back; any overrun makes it !ok().
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  template <class T>
  T get() {
    T v{};
    if (bytes_.size() - at_ < sizeof(T)) {
      bad_ = true;
      return v;
    }
    std::memcpy(&v, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  template <std::size_t N>
  void bytes(std::array<std::byte, N>& out) {
    if (bytes_.size() - at_ < out.size()) {
      bad_ = true;
      return;
    }
    std::memcpy(out.data(), bytes_.data() + at_, out.size());
    at_ += out.size();
  }
  std::string name() {
    const auto n = get<std::uint8_t>();
    if (bad_ || n == 0 || n > kPeerMaxNameBytes || bytes_.size() - at_ < n) {
      bad_ = true;
      return {};
    }
    std::string s(bytes_.substr(at_, n));
    at_ += n;
    return s;
  }
  [[nodiscard]] bool ok() const noexcept { return !bad_ && at_ == bytes_.size(); }

 private:
  std::string_view bytes_;
  std::size_t at_ = 0;
  bool bad_ = false;
};

void putName(std::string& out, std::string_view name) {
  const std::size_t n = std::min(name.size(), kPeerMaxNameBytes);
  out.push_back(static_cast<char>(n));
  out.append(name.substr(0, n));
}

std::string_view nonceText(const PeerNonce& n) {
  return {reinterpret_cast<const char*>(n.data()), n.size()};
}

bool knownType(std::uint8_t t) {
  return (t >= 1 && t <= 4) || (t >= 16 && t <= 22);
}

}  // namespace

PeerNonce peerFreshNonce() noexcept {
  sodiumReady();
  PeerNonce n{};
  randombytes_buf(n.data(), n.size());
  return n;
}

PeerKey peerMasterKey(std::string_view secret) noexcept {
  sodiumReady();
  // BLAKE2b-256 of a label naming this use and version, then the secret:
  // every byte of the secret counts, and no other use of the file's bytes
  // shares the key.
  static constexpr std::string_view kLabel{"spillway tier v2 master key", 28};  // with the NUL
  crypto_generichash_state state;
  crypto_generichash_init(&state, nullptr, 0, kPeerKeyBytes);
  crypto_generichash_update(&state, bytesOf(kLabel), kLabel.size());
  crypto_generichash_update(&state, bytesOf(secret), secret.size());
  PeerKey k;
  crypto_generichash_final(&state, k.bytes.data(), k.bytes.size());
  sodium_memzero(&state, sizeof state);
  return k;
}

PeerKey peerSessionKey(const PeerKey& master, std::string_view direction, const PeerNonce& server,
                       const PeerNonce& client) noexcept {
  crypto_generichash_state state;
  crypto_generichash_init(&state, master.bytes.data(), master.bytes.size(), kPeerKeyBytes);
  static constexpr std::string_view kLabel{"session", 8};  // with the NUL
  crypto_generichash_update(&state, bytesOf(kLabel), kLabel.size());
  const unsigned char n = static_cast<unsigned char>(direction.size());
  crypto_generichash_update(&state, &n, 1);
  crypto_generichash_update(&state, bytesOf(direction), direction.size());
  crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(server.data()),
                            server.size());
  crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(client.data()),
                            client.size());
  PeerKey k;
  crypto_generichash_final(&state, k.bytes.data(), k.bytes.size());
  sodium_memzero(&state, sizeof state);
  return k;
}

PeerMac peerAuthMac(const PeerKey& master, std::string_view role,
                    const PeerTranscript& transcript) {
  std::string m;
  putName(m, role);
  put<std::uint32_t>(m, kPeerVersion);
  m.append(nonceText(transcript.server));
  m.append(nonceText(transcript.client));
  put<std::uint64_t>(m, transcript.seedTag);
  putName(m, transcript.serverNode);
  putName(m, transcript.clientNode);
  PeerMac mac{};
  crypto_auth_hmacsha512256(reinterpret_cast<unsigned char*>(mac.data()), bytesOf(m), m.size(),
                            master.bytes.data());
  return mac;
}

bool peerMacEqual(const PeerMac& a, const PeerMac& b) noexcept {
  static_assert(kPeerTagBytes == 32);
  return crypto_verify_32(reinterpret_cast<const unsigned char*>(a.data()),
                          reinterpret_cast<const unsigned char*>(b.data())) == 0;
}

std::string peerVersionMismatch(std::string_view peer, std::uint32_t theirs) {
  const std::string head = "peer " + std::string(peer) + " speaks tier protocol v" +
                           std::to_string(theirs) + "; this instance speaks v" +
                           std::to_string(kPeerVersion);
  return theirs < kPeerVersion ? head + ": upgrade it" : head + ": upgrade this instance";
}

std::string encodePeerFrame(PeerFrameType type, std::string_view payload, const PeerKey* key,
                            std::uint64_t seq) {
  std::string out;
  out.reserve(kPeerHeaderBytes + payload.size() + (key ? kPeerTagBytes : 0));
  put<std::uint32_t>(out, static_cast<std::uint32_t>(payload.size()));
  out.push_back(static_cast<char>(type));
  out.append(3, '\0');
  out.append(payload);
  if (key != nullptr) {
    const PeerMac tag = frameTag(*key, seq, out);
    out.append(reinterpret_cast<const char*>(tag.data()), tag.size());
  }
  return out;
}

PeerDecoded decodePeerFrame(std::string_view buffer, const PeerKey* key,
                            std::uint64_t seq) noexcept {
  try {
    if (buffer.size() < kPeerHeaderBytes) return PeerNeedMore{};
    std::uint32_t length = 0;
    std::memcpy(&length, buffer.data(), 4);
    const auto type = static_cast<std::uint8_t>(buffer[4]);
    if (buffer[5] != 0 || buffer[6] != 0 || buffer[7] != 0) {
      return PeerBadFrame{"bad frame header (padding not zero)"};
    }
    if (length > kPeerMaxPayload) {
      return PeerBadFrame{"frame of " + std::to_string(length) + " bytes, more than " +
                          std::to_string(kPeerMaxPayload)};
    }
    if (!knownType(type)) return PeerBadFrame{"unknown frame type " + std::to_string(type)};
    const bool handshake = type <= static_cast<std::uint8_t>(PeerFrameType::Refuse);
    if (key == nullptr && !handshake) return PeerBadFrame{"data frame before the handshake"};
    if (key != nullptr && handshake) return PeerBadFrame{"handshake frame after the handshake"};
    const std::size_t whole = kPeerHeaderBytes + length + (key ? kPeerTagBytes : 0);
    if (buffer.size() < whole) return PeerNeedMore{};
    if (key != nullptr) {
      PeerMac tag{};
      std::memcpy(tag.data(), buffer.data() + kPeerHeaderBytes + length, tag.size());
      if (!peerMacEqual(tag, frameTag(*key, seq, buffer.substr(0, kPeerHeaderBytes + length)))) {
        return PeerBadFrame{"frame " + std::to_string(seq) +
                            " fails its MAC (tampered, replayed or out of order)"};
      }
    }
    return PeerFrame{static_cast<PeerFrameType>(type), buffer.substr(kPeerHeaderBytes, length),
                     whole};
  } catch (...) {
    return PeerBadFrame{"out of memory"};
  }
}

std::string encodePeerHello(const PeerHello& hello) {
  std::string out;
  put<std::uint32_t>(out, hello.version);
  out.append(nonceText(hello.nonce));
  putName(out, hello.node);
  return out;
}

std::optional<std::uint32_t> peerPayloadVersion(std::string_view payload) noexcept {
  if (payload.size() < 4) return std::nullopt;
  std::uint32_t v = 0;
  std::memcpy(&v, payload.data(), 4);
  return v;
}

std::optional<PeerHello> decodePeerHello(std::string_view payload) {
  Reader r(payload);
  PeerHello h;
  h.version = r.get<std::uint32_t>();
  r.bytes(h.nonce);
  h.node = r.name();
  if (!r.ok() || h.version != kPeerVersion) return std::nullopt;
  return h;
}

std::string encodePeerAuth(const PeerAuth& auth) {
  std::string out;
  put<std::uint32_t>(out, auth.version);
  out.append(nonceText(auth.nonce));
  put<std::uint64_t>(out, auth.seedTag);
  putName(out, auth.node);
  out.append(reinterpret_cast<const char*>(auth.mac.data()), auth.mac.size());
  return out;
}

std::optional<PeerAuth> decodePeerAuth(std::string_view payload) {
  Reader r(payload);
  PeerAuth a;
  a.version = r.get<std::uint32_t>();
  r.bytes(a.nonce);
  a.seedTag = r.get<std::uint64_t>();
  a.node = r.name();
  r.bytes(a.mac);
  if (!r.ok() || a.version != kPeerVersion) return std::nullopt;
  return a;
}

std::string encodePeerMac(const PeerMac& mac) {
  return std::string(reinterpret_cast<const char*>(mac.data()), mac.size());
}

std::optional<PeerMac> decodePeerMac(std::string_view payload) {
  Reader r(payload);
  PeerMac mac{};
  r.bytes(mac);
  if (!r.ok()) return std::nullopt;
  return mac;
}

std::string encodePeerRecords(std::uint64_t hashSeed,
                              std::span<const FlowExceptionRecord> records) {
  return encodeFlowCheckpoint(hashSeed, 0, records);
}

std::variant<std::vector<FlowExceptionRecord>, std::string> decodePeerRecords(
    std::string_view payload, std::uint64_t hashSeed) {
  auto decoded = decodeFlowCheckpoint(payload, hashSeed);
  if (auto* e = std::get_if<std::string>(&decoded)) return "records: " + *e;
  auto& c = std::get<FlowCheckpoint>(decoded);
  if (c.records.size() > kPeerRecordsPerFrame) {
    return "records: " + std::to_string(c.records.size()) + " in one frame, more than " +
           std::to_string(kPeerRecordsPerFrame);
  }
  return std::move(c.records);
}

std::string encodePeerRemoved(std::span<const std::uint64_t> hashes) {
  std::string out;
  out.reserve(4 + hashes.size() * 8);
  put<std::uint32_t>(out, static_cast<std::uint32_t>(hashes.size()));
  for (const std::uint64_t h : hashes) put<std::uint64_t>(out, h);
  return out;
}

std::optional<std::vector<std::uint64_t>> decodePeerRemoved(std::string_view payload) {
  Reader r(payload);
  const auto n = r.get<std::uint32_t>();
  if (n > kPeerRemovedPerFrame || payload.size() != 4 + std::size_t{n} * 8) return std::nullopt;
  std::vector<std::uint64_t> out(n);
  for (auto& h : out) h = r.get<std::uint64_t>();
  if (!r.ok()) return std::nullopt;
  return out;
}

std::string encodePeerStep(std::optional<std::uint64_t> msAgo) {
  std::string out;
  putLe(out, msAgo.value_or(kPeerNoStep), 8);
  return out;
}

std::optional<std::optional<std::uint64_t>> decodePeerStep(std::string_view payload) {
  if (payload.size() != 8) return std::nullopt;
  const std::uint64_t v = getLe(payload, 0, 8);
  return v == kPeerNoStep ? std::optional<std::uint64_t>{} : std::optional<std::uint64_t>{v};
}

}  // namespace spillway
