#include "control/tier/peer_wire.hpp"

#include <sys/stat.h>

#include <bit>
#include <cerrno>
#include <cstring>

#include "control/intent/flow_checkpoint.hpp"
#include "control/sys/durable_file.hpp"
#include "spillway/errno_text.hpp"
#include "spillway/flow_key.hpp"

namespace spillway {
namespace {

static_assert(std::endian::native == std::endian::little, "the peer wire is little-endian");

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
  void nonce(PeerNonce& out) {
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

std::uint64_t prf(const SipKey& key, std::string_view message) noexcept {
  return sipHash<2, 4>(key.k0, key.k1, std::as_bytes(std::span(message.data(), message.size())));
}

std::string_view nonceText(const PeerNonce& n) {
  return {reinterpret_cast<const char*>(n.data()), n.size()};
}

bool knownType(std::uint8_t t) {
  return (t >= 1 && t <= 4) || (t >= 16 && t <= 21);
}

}  // namespace

SipKey peerMasterKey(std::string_view secret) noexcept {
  // The first 16 bytes key a PRF over the whole secret, so every byte of a
  // longer secret counts.
  std::uint64_t k0 = 0;
  std::uint64_t k1 = 0;
  std::memcpy(&k0, secret.data(), std::min<std::size_t>(8, secret.size()));
  if (secret.size() > 8)
    std::memcpy(&k1, secret.data() + 8, std::min<std::size_t>(8, secret.size() - 8));
  const SipKey first{k0, k1};
  return SipKey{prf(first, std::string("spw-mk0") + std::string(secret)),
                prf(first, std::string("spw-mk1") + std::string(secret))};
}

SipKey peerSessionKey(const SipKey& master, std::string_view direction, const PeerNonce& server,
                      const PeerNonce& client) noexcept {
  std::string m(direction);
  m.append(nonceText(server));
  m.append(nonceText(client));
  return SipKey{prf(master, "k0" + m), prf(master, "k1" + m)};
}

std::uint64_t peerAuthMac(const SipKey& master, std::string_view role, const PeerNonce& server,
                          const PeerNonce& client, std::uint64_t seedTag,
                          std::string_view node) noexcept {
  std::string m(role);
  m.append(nonceText(server));
  m.append(nonceText(client));
  put<std::uint64_t>(m, seedTag);
  putName(m, node);
  return prf(master, m);
}

std::string encodePeerFrame(PeerFrameType type, std::string_view payload, const SipKey* key,
                            std::uint64_t seq) {
  std::string out;
  out.reserve(kPeerHeaderBytes + payload.size() + (key ? kPeerTagBytes : 0));
  put<std::uint32_t>(out, static_cast<std::uint32_t>(payload.size()));
  out.push_back(static_cast<char>(type));
  out.append(3, '\0');
  out.append(payload);
  if (key != nullptr) {
    std::string m;
    put<std::uint64_t>(m, seq);
    m.append(out);
    put<std::uint64_t>(out, prf(*key, m));
  }
  return out;
}

PeerDecoded decodePeerFrame(std::string_view buffer, const SipKey* key,
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
      std::string m;
      m.reserve(8 + kPeerHeaderBytes + length);
      put<std::uint64_t>(m, seq);
      m.append(buffer.substr(0, kPeerHeaderBytes + length));
      std::uint64_t tag = 0;
      std::memcpy(&tag, buffer.data() + kPeerHeaderBytes + length, 8);
      if (tag != prf(*key, m)) {
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

std::optional<PeerHello> decodePeerHello(std::string_view payload) {
  Reader r(payload);
  PeerHello h;
  h.version = r.get<std::uint32_t>();
  r.nonce(h.nonce);
  h.node = r.name();
  if (!r.ok()) return std::nullopt;
  return h;
}

std::string encodePeerAuth(const PeerAuth& auth) {
  std::string out;
  put<std::uint32_t>(out, auth.version);
  out.append(nonceText(auth.nonce));
  put<std::uint64_t>(out, auth.seedTag);
  putName(out, auth.node);
  put<std::uint64_t>(out, auth.mac);
  return out;
}

std::optional<PeerAuth> decodePeerAuth(std::string_view payload) {
  Reader r(payload);
  PeerAuth a;
  a.version = r.get<std::uint32_t>();
  r.nonce(a.nonce);
  a.seedTag = r.get<std::uint64_t>();
  a.node = r.name();
  a.mac = r.get<std::uint64_t>();
  if (!r.ok()) return std::nullopt;
  return a;
}

std::string encodePeerU64(std::uint64_t value) {
  std::string out;
  put<std::uint64_t>(out, value);
  return out;
}

std::optional<std::uint64_t> decodePeerU64(std::string_view payload) {
  Reader r(payload);
  const auto v = r.get<std::uint64_t>();
  if (!r.ok()) return std::nullopt;
  return v;
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

}  // namespace spillway
