// The peer channel's wire without sockets: frames round-trip; a tampered,
// replayed, reordered, reflected, oversized or malformed frame is refused and
// a truncated one waits for more; handshake messages and record payloads
// round-trip and refuse damage; the secret file and the [tier] section refuse
// what they must, with a message that says why. The handshake between two
// sides with the same secret verifies, with another secret it does not; a
// hello of protocol version 1 (the SipHash one) is told apart from a
// malformed one and refused with words that name the upgrade. (The
// primitives are libsodium's; their vectors are libsodium's tests.)
#include "control/tier/peer_wire.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "control/config/config.hpp"
#include "estate_fixture.hpp"

namespace spillway {
namespace {

constexpr std::uint64_t kSeed = 0x0123456789abcdefULL;

PeerKey key(std::uint64_t n) {
  PeerKey k;
  for (std::size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<unsigned char>(n + i);
  return k;
}

const PeerFrame* frameOf(const PeerDecoded& d) {
  return std::get_if<PeerFrame>(&d);
}
bool bad(const PeerDecoded& d) {
  return std::holds_alternative<PeerBadFrame>(d);
}
bool needMore(const PeerDecoded& d) {
  return std::holds_alternative<PeerNeedMore>(d);
}

TEST(PeerFrame, RoundTripWithAndWithoutKey) {
  const PeerKey k = key(1);
  const std::string payload = "some exception bytes";
  const std::string f = encodePeerFrame(PeerFrameType::Records, payload, &k, 7);
  EXPECT_EQ(f.size(), kPeerHeaderBytes + payload.size() + kPeerTagBytes);
  const std::string buffer = f + "next";
  const PeerDecoded d = decodePeerFrame(buffer, &k, 7);
  ASSERT_NE(frameOf(d), nullptr) << std::get<PeerBadFrame>(d).reason;
  EXPECT_EQ(frameOf(d)->type, PeerFrameType::Records);
  EXPECT_EQ(frameOf(d)->payload, payload);
  EXPECT_EQ(frameOf(d)->consumed, f.size());

  const std::string h = encodePeerFrame(PeerFrameType::Hello, "hi");
  const PeerDecoded dh = decodePeerFrame(h, nullptr, 0);
  ASSERT_NE(frameOf(dh), nullptr);
  EXPECT_EQ(frameOf(dh)->payload, "hi");
  EXPECT_EQ(frameOf(dh)->consumed, h.size());
}

TEST(PeerFrame, TamperedFrameIsRefused) {
  const PeerKey k = key(1);
  const std::string f = encodePeerFrame(PeerFrameType::Records, "abcdefgh", &k, 3);
  for (std::size_t i = 0; i < f.size(); ++i) {
    std::string t = f;
    t[i] = static_cast<char>(t[i] ^ 0x01);
    const PeerDecoded d = decodePeerFrame(t, &k, 3);
    // A flipped length bit may make the frame look longer: then it waits for
    // bytes that will never verify. Anything else is refused.
    EXPECT_TRUE(bad(d) || (i < 4 && needMore(d))) << "byte " << i;
    EXPECT_EQ(frameOf(d), nullptr) << "byte " << i;
  }
}

TEST(PeerFrame, ReplayedReorderedAndReflectedFramesAreRefused) {
  const PeerKey c2s = key(1);
  const PeerKey s2c = key(2);
  const std::string f0 = encodePeerFrame(PeerFrameType::Heartbeat, "", &c2s, 0);
  const std::string f1 = encodePeerFrame(PeerFrameType::Heartbeat, "", &c2s, 1);
  ASSERT_NE(frameOf(decodePeerFrame(f0, &c2s, 0)), nullptr);
  // Replayed: frame 0 again where frame 1 is expected.
  EXPECT_TRUE(bad(decodePeerFrame(f0, &c2s, 1)));
  // Reordered: frame 1 first.
  EXPECT_TRUE(bad(decodePeerFrame(f1, &c2s, 0)));
  // Reflected: a frame of one direction sent back on the other.
  EXPECT_TRUE(bad(decodePeerFrame(f0, &s2c, 0)));
}

TEST(PeerFrame, OversizedMalformedAndTruncatedFrames) {
  const PeerKey k = key(1);
  std::string over(kPeerHeaderBytes, '\0');
  const std::uint32_t length = kPeerMaxPayload + 1;
  std::memcpy(over.data(), &length, 4);
  over[4] = static_cast<char>(PeerFrameType::Records);
  // Refused from its header alone: nothing waits for 64 KiB of garbage.
  ASSERT_TRUE(bad(decodePeerFrame(over, &k, 0)));
  EXPECT_NE(std::get<PeerBadFrame>(decodePeerFrame(over, &k, 0)).reason.find("more than"),
            std::string::npos);

  std::string pad = encodePeerFrame(PeerFrameType::Heartbeat, "", &k, 0);
  pad[6] = 1;
  EXPECT_TRUE(bad(decodePeerFrame(pad, &k, 0)));
  std::string type = encodePeerFrame(PeerFrameType::Heartbeat, "", &k, 0);
  type[4] = 99;
  EXPECT_TRUE(bad(decodePeerFrame(type, &k, 0)));
  // A data frame before the handshake, a handshake frame after it.
  EXPECT_TRUE(bad(decodePeerFrame(encodePeerFrame(PeerFrameType::Records, "x"), nullptr, 0)));
  EXPECT_TRUE(bad(decodePeerFrame(encodePeerFrame(PeerFrameType::Hello, "x", &k, 0), &k, 0)));

  const std::string f = encodePeerFrame(PeerFrameType::Records, "0123456789", &k, 0);
  for (std::size_t n = 0; n < f.size(); ++n) {
    EXPECT_TRUE(needMore(decodePeerFrame(f.substr(0, n), &k, 0))) << n;
  }
}

TEST(PeerHandshake, MessagesRoundTripAndRefuseDamage) {
  PeerHello h;
  h.nonce[0] = std::byte{9};
  h.nonce[31] = std::byte{7};
  h.node = "lb-1";
  const auto hb = encodePeerHello(h);
  auto hd = decodePeerHello(hb);
  ASSERT_TRUE(hd);
  EXPECT_EQ(hd->node, "lb-1");
  EXPECT_EQ(hd->nonce, h.nonce);
  EXPECT_EQ(peerPayloadVersion(hb), kPeerVersion);
  EXPECT_FALSE(decodePeerHello(hb.substr(0, hb.size() - 1)));
  EXPECT_FALSE(decodePeerHello(hb + "x"));

  PeerAuth a;
  a.nonce[31] = std::byte{3};
  a.seedTag = 42;
  a.node = "lb-2";
  a.mac[0] = std::byte{0xfe};
  a.mac[31] = std::byte{0xed};
  const auto ab = encodePeerAuth(a);
  auto ad = decodePeerAuth(ab);
  ASSERT_TRUE(ad);
  EXPECT_EQ(ad->node, "lb-2");
  EXPECT_EQ(ad->seedTag, 42u);
  EXPECT_EQ(ad->nonce, a.nonce);
  EXPECT_EQ(ad->mac, a.mac);
  for (std::size_t n = 0; n < ab.size(); ++n) EXPECT_FALSE(decodePeerAuth(ab.substr(0, n))) << n;
  EXPECT_FALSE(decodePeerAuth(ab + "x"));
  EXPECT_FALSE(decodePeerMac(std::string(kPeerTagBytes - 1, 'm')));
  EXPECT_FALSE(decodePeerMac(std::string(kPeerTagBytes + 1, 'm')));
  EXPECT_EQ(decodePeerMac(encodePeerMac(a.mac)), a.mac);
  EXPECT_FALSE(peerPayloadVersion("abc"));
}

// Version 1's hello exactly as its encoder wrote it: u32 1, a 16-byte nonce,
// the name (length byte first). Its version is read, its body never is.
std::string helloV1(std::string_view node) {
  std::string p;
  const std::uint32_t v = 1;
  p.append(reinterpret_cast<const char*>(&v), 4);
  p.append(16, '\x5a');
  p.push_back(static_cast<char>(node.size()));
  p.append(node);
  return p;
}

TEST(PeerHandshake, AnOldVersionsHelloIsRefusedWithWordsThatNameTheUpgrade) {
  const std::string v1 = helloV1("lb-old");
  // A whole version-1 frame still parses as a frame (the header did not change).
  const std::string frame = encodePeerFrame(PeerFrameType::Hello, v1);
  const PeerDecoded d = decodePeerFrame(frame, nullptr, 0);
  ASSERT_NE(frameOf(d), nullptr);
  EXPECT_EQ(peerPayloadVersion(frameOf(d)->payload), 1u);
  EXPECT_FALSE(decodePeerHello(frameOf(d)->payload));
  EXPECT_EQ(peerVersionMismatch("lb-old", 1),
            "peer lb-old speaks tier protocol v1; this instance speaks v2: upgrade it");
  EXPECT_EQ(peerVersionMismatch("lb-new", 3),
            "peer lb-new speaks tier protocol v3; this instance speaks v2: upgrade this instance");
  // A version-2 body under another version number is not taken either.
  PeerHello h;
  h.node = "lb-1";
  std::string other = encodePeerHello(h);
  other[0] = 3;
  EXPECT_EQ(peerPayloadVersion(other), 3u);
  EXPECT_FALSE(decodePeerHello(other));
}

// Both sides of a handshake, computed as the channel computes them.
struct Sides {
  PeerMac clientProof;   // C's Auth MAC, as C computes it
  PeerMac clientExpect;  // what S expects of it
  PeerMac serverProof;   // S's Accept MAC
  PeerMac serverExpect;  // what C expects of it
  PeerKey c2sAtC, c2sAtS, s2cAtC, s2cAtS;
};
Sides handshake(std::string_view secretC, std::string_view secretS) {
  const PeerKey mc = peerMasterKey(secretC);
  const PeerKey ms = peerMasterKey(secretS);
  const PeerNonce ns = peerFreshNonce();
  const PeerNonce nc = peerFreshNonce();
  const PeerTranscript t{ns, nc, 77, "lb-s", "lb-c"};
  return Sides{peerAuthMac(mc, "auth-c", t),      peerAuthMac(ms, "auth-c", t),
               peerAuthMac(ms, "auth-s", t),      peerAuthMac(mc, "auth-s", t),
               peerSessionKey(mc, "c2s", ns, nc), peerSessionKey(ms, "c2s", ns, nc),
               peerSessionKey(mc, "s2c", ns, nc), peerSessionKey(ms, "s2c", ns, nc)};
}

TEST(PeerHandshake, SameSecretVerifiesBothWaysAndAgreesOnSessionKeys) {
  const Sides s = handshake("0123456789abcdef-tier-secret", "0123456789abcdef-tier-secret");
  EXPECT_TRUE(peerMacEqual(s.clientProof, s.clientExpect));
  EXPECT_TRUE(peerMacEqual(s.serverProof, s.serverExpect));
  EXPECT_EQ(s.c2sAtC, s.c2sAtS);
  EXPECT_EQ(s.s2cAtC, s.s2cAtS);
  EXPECT_NE(s.c2sAtC, s.s2cAtC);
  // A frame sealed by C under its session key opens at S.
  const std::string f = encodePeerFrame(PeerFrameType::Heartbeat, "", &s.c2sAtC, 0);
  EXPECT_NE(frameOf(decodePeerFrame(f, &s.c2sAtS, 0)), nullptr);
}

TEST(PeerHandshake, AnotherSecretFailsBothProofsAndTheSessionKeysDiffer) {
  const Sides s = handshake("0123456789abcdef-tier-secret", "0123456789abcdef-tier-secreT");
  EXPECT_FALSE(peerMacEqual(s.clientProof, s.clientExpect));
  EXPECT_FALSE(peerMacEqual(s.serverProof, s.serverExpect));
  EXPECT_NE(s.c2sAtC, s.c2sAtS);
  const std::string f = encodePeerFrame(PeerFrameType::Heartbeat, "", &s.c2sAtC, 0);
  EXPECT_TRUE(bad(decodePeerFrame(f, &s.c2sAtS, 0)));
}

TEST(PeerHandshake, MacDependsOnSecretRoleNoncesSeedAndBothNames) {
  const PeerKey m = peerMasterKey("0123456789abcdef-tier-secret");
  const PeerKey other = peerMasterKey("0123456789abcdef-tier-secreT");
  EXPECT_NE(m, other);
  PeerNonce s{}, c{};
  s[0] = std::byte{1};
  c[0] = std::byte{2};
  const PeerTranscript t{s, c, 5, "lb-1", "lb-2"};
  const PeerMac mac = peerAuthMac(m, "auth-c", t);
  const auto differs = [&](const PeerKey& k, std::string_view role, const PeerTranscript& u) {
    return !peerMacEqual(mac, peerAuthMac(k, role, u));
  };
  EXPECT_FALSE(differs(m, "auth-c", t));
  EXPECT_TRUE(differs(other, "auth-c", t));
  EXPECT_TRUE(differs(m, "auth-s", t));
  EXPECT_TRUE(differs(m, "auth-c", PeerTranscript{c, s, 5, "lb-1", "lb-2"}));
  EXPECT_TRUE(differs(m, "auth-c", PeerTranscript{s, c, 6, "lb-1", "lb-2"}));
  EXPECT_TRUE(differs(m, "auth-c", PeerTranscript{s, c, 5, "lb-2", "lb-1"}));
  EXPECT_TRUE(differs(m, "auth-c", PeerTranscript{s, c, 5, "lb-1", "lb-3"}));
  EXPECT_NE(peerSessionKey(m, "c2s", s, c), peerSessionKey(m, "s2c", s, c));
  PeerNonce c2 = c;
  c2[31] = std::byte{1};
  EXPECT_NE(peerSessionKey(m, "c2s", s, c), peerSessionKey(m, "c2s", s, c2));
  // Nonces are fresh: two draws differ.
  EXPECT_NE(peerFreshNonce(), peerFreshNonce());
}

TEST(PeerPayload, RecordsAndRemovedRoundTrip) {
  std::vector<FlowExceptionRecord> records;
  for (std::uint64_t i = 1; i <= 100; ++i) {
    records.push_back(FlowExceptionRecord{i * 0x9e3779b97f4a7c15ULL, 1000 + i % 3,
                                          i % 2 ? FlowState::Established : FlowState::Udp, 0});
  }
  const std::string bytes = encodePeerRecords(kSeed, records);
  auto decoded = decodePeerRecords(bytes, kSeed);
  ASSERT_TRUE(std::holds_alternative<std::vector<FlowExceptionRecord>>(decoded));
  EXPECT_EQ(std::get<std::vector<FlowExceptionRecord>>(decoded), records);
  // Another seed's hashes name other flows.
  EXPECT_TRUE(std::holds_alternative<std::string>(decodePeerRecords(bytes, kSeed + 1)));
  std::string damaged = bytes;
  damaged[50] ^= 1;
  EXPECT_TRUE(std::holds_alternative<std::string>(decodePeerRecords(damaged, kSeed)));
  // The largest records frame fits the frame limit.
  std::vector<FlowExceptionRecord> many(kPeerRecordsPerFrame);
  for (std::size_t i = 0; i < many.size(); ++i) many[i] = FlowExceptionRecord{i + 1, i + 1};
  EXPECT_LE(encodePeerRecords(kSeed, many).size(), kPeerMaxPayload);
  many.push_back(FlowExceptionRecord{1u << 30, 5});
  EXPECT_TRUE(std::holds_alternative<std::string>(
      decodePeerRecords(encodePeerRecords(kSeed, many), kSeed)));

  const std::vector<std::uint64_t> hashes{1, 2, 0xffffffffffffffffULL};
  EXPECT_EQ(decodePeerRemoved(encodePeerRemoved(hashes)), hashes);
  std::string r = encodePeerRemoved(hashes);
  EXPECT_FALSE(decodePeerRemoved(r.substr(0, r.size() - 1)));
  r[0] = 4;  // claims four hashes, carries three
  EXPECT_FALSE(decodePeerRemoved(r));
}

class TierFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/spillway-peer-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string secret(const std::string& bytes, mode_t mode) {
    const std::string path = dir_ + "/secret";
    std::ofstream(path, std::ios::trunc) << bytes;
    ::chmod(path.c_str(), mode);
    return path;
  }
  std::string dir_;
};

TEST_F(TierFiles, SecretFileMustBePrivateAndLongEnough) {
  std::string error;
  EXPECT_FALSE(readPeerSecret(secret("0123456789abcdef0123", 0644), error));
  EXPECT_NE(error.find("mode 0644"), std::string::npos) << error;
  EXPECT_FALSE(readPeerSecret(secret("short\n", 0600), error));
  EXPECT_NE(error.find("fewer than 16"), std::string::npos) << error;
  EXPECT_FALSE(readPeerSecret(dir_ + "/none", error));
  EXPECT_NE(error.find("cannot read"), std::string::npos) << error;
  auto ok = readPeerSecret(secret("0123456789abcdef0123\n", 0600), error);
  ASSERT_TRUE(ok) << error;
  EXPECT_EQ(*ok, "0123456789abcdef0123");
}

std::string baseConfig() {
  return test::onePoolEstate(3);
}

TEST_F(TierFiles, TierSectionIsValidatedWithClearErrors) {
  const std::string path = secret("0123456789abcdef0123", 0600);
  auto good = loadConfigFromString(baseConfig() + R"(
[tier]
node = "lb-1"
listen = "127.0.0.1:9560"
peers = [{name = "lb-2", address = "127.0.0.2:9560"}, {name = "lb-3", address = "[::1]:9560"}]
secret_file = ")" + path + R"("
sync_interval = 0.5
hold_time = 300
)",
                                   "t.toml");
  ASSERT_TRUE(good) << formatErrors(good.errors());
  const TierConfig& t = good.value().tier;
  EXPECT_EQ(t.node, "lb-1");
  ASSERT_EQ(t.peers.size(), 2u);
  EXPECT_EQ(t.peers[1].address, "[::1]:9560");
  EXPECT_EQ(t.secret, "0123456789abcdef0123");
  EXPECT_EQ(t.syncInterval, 500);
  EXPECT_EQ(t.holdTime, 300'000);
  EXPECT_EQ(t.maxRecordsPerPeer, 1'000'000u);

  const auto errorsOf = [&](const std::string& tier) {
    auto r = loadConfigFromString(baseConfig() + tier, "t.toml");
    EXPECT_FALSE(r);
    return r ? std::string() : formatErrors(r.errors());
  };
  std::string e = errorsOf(R"(
[tier]
node = "lb-1"
listen = "127.0.0.1:9560"
peers = [{name = "lb-2", address = "127.0.0.2:9560"}]
)");
  EXPECT_NE(e.find("tier.secret_file"), std::string::npos) << e;
  e = errorsOf(R"(
[tier]
node = "lb-1"
listen = "127.0.0.1"
peers = [{name = "lb-1", address = "nowhere:1"}, {name = "lb-2", address = "127.0.0.2:1"}, {name = "lb-2", address = "127.0.0.3:1"}]
secret_file = ")" +
               path + R"("
)");
  EXPECT_NE(e.find("tier.listen"), std::string::npos) << e;
  EXPECT_NE(e.find("tier.peers[0].address"), std::string::npos) << e;
  EXPECT_NE(e.find("own node name"), std::string::npos) << e;
  EXPECT_NE(e.find("listed twice"), std::string::npos) << e;
  ::chmod(path.c_str(), 0640);
  e = errorsOf(R"(
[tier]
node = "lb-1"
listen = "127.0.0.1:9560"
peers = [{name = "lb-2", address = "127.0.0.2:9560"}]
secret_file = ")" +
               path + R"("
)");
  EXPECT_NE(e.find("mode 0640"), std::string::npos) << e;
  e = errorsOf("\n[tier]\nnode = \"lb-1\"\nsync_interval_ms = 100\n");
  EXPECT_NE(e.find("tier.sync_interval_ms"), std::string::npos) << e;
}

}  // namespace
}  // namespace spillway
