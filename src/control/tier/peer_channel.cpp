#include "control/tier/peer_channel.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "control/api/metrics_http.hpp"
#include "control/health/http_client.hpp"
#include "control/intent/flow_checkpoint.hpp"
#include "control/sys/epoll_loop.hpp"
#include "control/tier/intent_wire.hpp"
#include "spillway/errno_text.hpp"

namespace spillway {
namespace {

// Below this much unsent output a connection is given more frames.
constexpr std::size_t kLowWater = 256 * 1024;
// Bytes read from one connection per poll (bounded control-thread work).
constexpr std::size_t kReadPerPoll = 1 << 20;
constexpr std::size_t kReadChunk = 65536;
constexpr int kListenBacklog = 128;
// Connections accepted (and most of them refused at once) per poll: a flood
// drains from the backlog faster than it fills, so a peer's SYN is not lost
// behind it.
constexpr int kAcceptsPerPoll = 1024;
// Pending handshakes (accepted, not yet authenticated). From an address that
// is no configured peer's: at most this many per address and in all, so
// strangers never take what peers need. From a peer's address: its own
// allowance (kPendingPerKnownPeer per peer at that address), which strangers
// elsewhere cannot touch.
constexpr std::size_t kPendingPerStranger = 4;
constexpr std::size_t kPendingStrangers = 32;
constexpr std::size_t kPendingPerKnownPeer = 4;

std::optional<SocketAddress> socketAddressOf(const std::string& text) {
  const auto a = parseListenAddress(text);
  if (!a) return std::nullopt;
  const auto ip = parseIpAddress(a->host);
  if (!ip) return std::nullopt;
  return SocketAddress(*ip, a->port);
}

// The address alone (no port), IPv4-mapped IPv6 written as IPv4, so it
// compares with formatIpAddress() of a configured peer's address.
std::string sourceOf(const sockaddr_storage& ss) {
  char host[64] = "?";
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, host, sizeof host);
    return host;
  }
  const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr;
  if (IN6_IS_ADDR_V4MAPPED(&a)) {
    inet_ntop(AF_INET, &a.s6_addr[12], host, sizeof host);
  } else {
    inet_ntop(AF_INET6, &a, host, sizeof host);
  }
  return host;
}

std::string peerText(const sockaddr_storage& ss) {
  char host[64] = "?";
  std::uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* sin = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &sin->sin_addr, host, sizeof host);
    port = ntohs(sin->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(&ss);
  inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof host);
  port = ntohs(sin6->sin6_port);
  return "[" + std::string(host) + "]:" + std::to_string(port);
}

}  // namespace

PeerChannel::PeerChannel(TierConfig config, std::uint64_t hashSeed, EventLog& events,
                         PeerChannelTimers timers)
    : config_(std::move(config)),
      hashSeed_(hashSeed),
      seedTag_(hashSeedTag(hashSeed)),
      master_(peerMasterKey(config_.secret)),
      events_(events),
      timers_(timers),
      epoll_(epoll_create1(EPOLL_CLOEXEC)),
      local_(std::make_shared<const LocalSet>()) {
  peers_.resize(config_.peers.size());
  for (std::size_t i = 0; i < peers_.size(); ++i) peers_[i].config = config_.peers[i];
  recountAddresses();
}

PeerChannel::~PeerChannel() = default;

std::optional<std::string> PeerChannel::open() {
  const auto fail = [&](const std::string& why) {
    listen_.reset();
    return std::optional<std::string>("tier listen " + config_.listen + ": " + why);
  };
  if (!epoll_.valid()) return fail("epoll_create1: " + errnoText(errno));
  const auto address = socketAddressOf(config_.listen);
  if (!address) return fail("not an IP literal and port");
  listen_ = UniqueFd(socket(address->family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!listen_.valid()) return fail("socket: " + errnoText(errno));
  const int one = 1;
  (void)setsockopt(listen_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(listen_.get(), address->get(), address->length()) != 0) {
    return fail("bind: " + errnoText(errno));
  }
  if (listen(listen_.get(), kListenBacklog) != 0) return fail("listen: " + errnoText(errno));
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  if (getsockname(listen_.get(), reinterpret_cast<sockaddr*>(&bound), &length) == 0) {
    port_ =
        ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                          : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  }
  if (!epollAdd(epoll_.get(), listen_.get(), kListenerTag, EPOLLIN)) {
    return fail("epoll_ctl: " + errnoText(errno));
  }
  return std::nullopt;
}

std::size_t PeerChannel::pendingHandshakes() const {
  std::size_t n = 0;
  for (const auto& [id, c] : conns_) n += !c.outbound && c.phase != Phase::Up;
  return n;
}

void PeerChannel::recountAddresses() {
  peersAt_.clear();
  for (const Peer& p : peers_) {
    if (p.retired) continue;
    const auto a = parseListenAddress(p.config.address);
    const auto ip = a ? parseIpAddress(a->host) : std::nullopt;
    if (ip) ++peersAt_[formatIpAddress(*ip)];
  }
}

int PeerChannel::peerIndex(std::string_view name, bool retiredToo) const {
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    if (peers_[i].config.name == name && (retiredToo || !peers_[i].retired)) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

int PeerChannel::peerNamed(std::string_view name) const {
  return peerIndex(name, false);
}

void PeerChannel::reconfigure(const TierConfig& next, Millis now) {
  const bool rekey = next.secret != config_.secret;
  if (rekey) master_ = peerMasterKey(next.secret);
  const auto closeOf = [&](Peer& p, const std::string& why) {
    if (p.outConn) close(*p.outConn, why, now);
    if (p.inConn) close(*p.inConn, why, now);
  };
  for (Peer& p : peers_) {
    const auto it = std::find_if(next.peers.begin(), next.peers.end(),
                                 [&](const TierPeerConfig& c) { return c.name == p.config.name; });
    if (it == next.peers.end()) {
      if (p.retired) continue;
      closeOf(p, "removed from [tier] peers by a reload");
      p.retired = true;
      p.downSince = now;  // its exceptions are held for hold_time, then forgotten
      events_.append(now, "", kEventPeer,
                     "peer " + p.config.name + " removed by a reload; its " +
                         std::to_string(p.held.size()) + " exceptions are held for " +
                         std::to_string(next.holdTime / 1000) + " s");
      continue;
    }
    if (p.retired) {
      p.retired = false;
      p.nextAttempt = now;
      events_.append(now, "", kEventPeer, "peer " + p.config.name + " added again by a reload");
    }
    if (it->address != p.config.address) {
      if (p.outConn) close(*p.outConn, "its address changed by a reload", now);
      p.nextAttempt = now;
      events_.append(now, "", kEventPeer,
                     "peer " + p.config.name + ": address " + p.config.address + " -> " +
                         it->address + " (reload)");
    }
    p.config = *it;
  }
  for (const TierPeerConfig& c : next.peers) {
    if (peerIndex(c.name, true) >= 0) continue;
    Peer p;
    p.config = c;
    p.nextAttempt = now;
    peers_.push_back(std::move(p));
    events_.append(now, "", kEventPeer,
                   "peer " + c.name + " (" + c.address + ") added by a reload");
  }
  if (rekey) {
    std::vector<std::uint64_t> ids;
    for (const auto& [id, c] : conns_) ids.push_back(id);
    for (const std::uint64_t id : ids) close(id, "the tier secret changed (reload)", now);
    for (Peer& p : peers_) p.nextAttempt = now;  // redial with the new secret at once
    events_.append(now, "", kEventPeer,
                   "the tier secret changed (reload): every peer connection reopens with it");
  }
  config_ = next;
  recountAddresses();
  changed_ = true;
}

void PeerChannel::accept(Millis now) {
  if (!listen_.valid()) return;
  for (int i = 0; i < kAcceptsPerPoll; ++i) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    const int fd = accept4(listen_.get(), reinterpret_cast<sockaddr*>(&ss), &len,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    UniqueFd owned(fd);
    const std::string source = sourceOf(ss);
    const auto known = peersAt_.find(source);
    std::size_t fromSource = 0;
    std::size_t strangers = 0;
    for (const auto& [id, c] : conns_) {
      if (c.outbound || c.phase == Phase::Up) continue;
      if (c.source == source) ++fromSource;
      if (!c.knownSource) ++strangers;
    }
    std::string_view refusal;
    if (known != peersAt_.end()) {
      if (fromSource >= kPendingPerKnownPeer * known->second) {
        refusal = "too many pending handshakes from a peer's address";
      }
    } else if (fromSource >= kPendingPerStranger) {
      refusal = "too many pending handshakes from one address";
    } else if (strangers >= kPendingStrangers) {
      refusal = "too many pending handshakes from addresses of no peer";
    }
    if (!refusal.empty()) {
      ++connectionsRefused_;
      noteRefusal(now, source, refusal);
      continue;  // closed by UniqueFd
    }
    const int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const std::uint64_t id = nextConn_++;
    Conn c;
    c.fd = std::move(owned);
    c.outbound = false;
    c.phase = Phase::AwaitAuth;
    c.remote = peerText(ss);
    c.source = source;
    c.knownSource = known != peersAt_.end();
    c.opened = c.lastRecv = c.lastSend = now;
    c.serverNonce = peerFreshNonce();
    send(c, PeerFrameType::Hello,
         encodePeerHello(PeerHello{kPeerVersion, c.serverNonce, config_.node}));
    if (!epollAdd(epoll_.get(), fd, id, EPOLLIN)) continue;
    conns_.emplace(id, std::move(c));
  }
}

void PeerChannel::noteRefusal(Millis now, std::string_view source, std::string_view reason) {
  if (auto line = refusals_.note(now, source, reason)) events_.append(now, "", kEventPeer, *line);
}

void PeerChannel::connectOut(std::size_t index, Millis now) {
  Peer& p = peers_[index];
  p.nextAttempt = now + timers_.reconnect;
  const auto address = socketAddressOf(p.config.address);
  if (!address) {
    p.unreachable = true;
    return;
  }
  UniqueFd fd(socket(address->family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    p.lastError = "socket: " + errnoText(errno);
    p.unreachable = !p.inConn;
    return;
  }
  const int one = 1;
  (void)setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (connect(fd.get(), address->get(), address->length()) != 0 && errno != EINPROGRESS) {
    p.lastError = "connect: " + errnoText(errno);
    p.unreachable = !p.inConn;
    return;
  }
  const std::uint64_t id = nextConn_++;
  Conn c;
  c.fd = std::move(fd);
  c.outbound = true;
  c.peer = static_cast<int>(index);
  c.phase = Phase::Connecting;
  c.remote = p.config.address;
  c.opened = c.lastRecv = c.lastSend = now;
  if (!epollAdd(epoll_.get(), c.fd.get(), id, EPOLLIN | EPOLLOUT)) return;
  conns_.emplace(id, std::move(c));
  p.outConn = id;
}

void PeerChannel::poll(Millis now) {
  // The epoll fd only wakes the daemon's loop; every connection is visited.
  now_ = now;
  accept(now);
  if (auto line = refusals_.flush(now)) events_.append(now, "", kEventPeer, *line);
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    if (!peers_[i].retired && !peers_[i].outConn && now >= peers_[i].nextAttempt)
      connectOut(i, now);
  }
  std::vector<std::uint64_t> ids;
  ids.reserve(conns_.size());
  for (const auto& [id, c] : conns_) ids.push_back(id);
  for (const std::uint64_t id : ids) {
    auto it = conns_.find(id);
    if (it == conns_.end()) continue;
    Conn& c = it->second;
    if (!service(id, c, now)) continue;
    if (!flush(c)) {
      close(id, "write: " + errnoText(errno), now);
      continue;
    }
    if (c.phase != Phase::Up) {
      if (now - c.opened > timers_.handshakeTimeout) {
        close(id, "no handshake within " + std::to_string(timers_.handshakeTimeout) + " ms", now);
      }
      continue;
    }
    if (now - c.lastRecv > timers_.deadAfter) {
      close(id, "no frame for " + std::to_string(now - c.lastRecv) + " ms", now);
      continue;
    }
    if (c.outbound) {
      pumpIntent(c);
      pump(c);
    }
    if (now - c.lastSend >= timers_.heartbeat) {
      send(c, PeerFrameType::Heartbeat, {});
      if (c.outbound) sendStep(c);
    }
    if (!flush(c)) {
      close(id, "write: " + errnoText(errno), now);
      continue;
    }
    if (c.out.size() - c.outSent > config_.maxOutputBytes) {
      ++peers_[static_cast<std::size_t>(c.peer)].slowDisconnects;
      close(id,
            "slow peer: " + std::to_string(c.out.size() - c.outSent) +
                " bytes unsent (max_output_bytes); it is resynced with a full dump",
            now);
    }
  }
  for (Peer& p : peers_) {
    if (!p.inConn && p.downSince && now - *p.downSince >= config_.holdTime && !p.held.empty()) {
      events_.append(now, "", kEventPeer,
                     "peer " + p.config.name + ": forgot its " + std::to_string(p.held.size()) +
                         " exceptions after " + std::to_string(config_.holdTime / 1000) +
                         " s down (hold_time)");
      p.held.clear();
      changed_ = true;
    }
  }
}

bool PeerChannel::service(std::uint64_t id, Conn& c, Millis now) {
  if (c.phase == Phase::Connecting) {
    pollfd pfd{c.fd.get(), POLLOUT, 0};
    if (::poll(&pfd, 1, 0) <= 0) return true;
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(c.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      close(id, "connect: " + errnoText(err != 0 ? err : errno), now);
      return false;
    }
    c.phase = Phase::AwaitHello;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    (void)epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
  }
  std::size_t readNow = 0;
  bool eof = false;
  char buffer[kReadChunk];
  while (readNow < kReadPerPoll && c.in.size() < 2 * kPeerMaxFrame) {
    const ssize_t n = recv(c.fd.get(), buffer, sizeof buffer, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0) {
      close(id, "read: " + errnoText(errno), now);
      return false;
    }
    if (n == 0) {
      eof = true;
      break;
    }
    c.in.append(buffer, static_cast<std::size_t>(n));
    readNow += static_cast<std::size_t>(n);
    if (c.peer >= 0)
      peers_[static_cast<std::size_t>(c.peer)].bytesIn += static_cast<std::size_t>(n);
  }
  std::size_t at = 0;
  while (true) {
    const bool keyed = c.phase == Phase::Up;
    const PeerDecoded d =
        decodePeerFrame(std::string_view(c.in).substr(at), keyed ? &c.recvKey : nullptr, c.recvSeq);
    if (std::holds_alternative<PeerNeedMore>(d)) break;
    if (const auto* bad = std::get_if<PeerBadFrame>(&d)) {
      if (c.peer >= 0) {
        ++peers_[static_cast<std::size_t>(c.peer)].framesRefused;
      } else {
        ++handshakeDrops_;
      }
      close(id, "refused a frame: " + bad->reason, now);
      return false;
    }
    const PeerFrame& f = std::get<PeerFrame>(d);
    at += f.consumed;
    c.lastRecv = now;
    bool ok = true;
    if (keyed) {
      ++c.recvSeq;
      peers_[static_cast<std::size_t>(c.peer)].lastFrame = now;
      ok = handleData(c, f.type, f.payload, now);
      if (!ok) ++peers_[static_cast<std::size_t>(c.peer)].framesRefused;
    } else {
      ok = handleHandshake(id, c, f.type, f.payload, now);
    }
    if (!ok) {
      close(id, c.outbound || c.peer < 0 ? "handshake failed" : "protocol error", now);
      return false;
    }
  }
  c.in.erase(0, at);
  if (eof) {
    if (c.peer < 0 && !c.in.empty()) ++handshakeDrops_;  // a truncated frame before auth
    close(id, c.in.empty() ? "closed by the peer" : "closed by the peer in the middle of a frame",
          now);
    return false;
  }
  return true;
}

bool PeerChannel::handleHandshake(std::uint64_t id, Conn& c, PeerFrameType type,
                                  std::string_view payload, Millis now) {
  if (c.outbound) {
    Peer& p = peers_[static_cast<std::size_t>(c.peer)];
    if (c.phase == Phase::AwaitHello && type == PeerFrameType::Hello) {
      const auto version = peerPayloadVersion(payload);
      if (version && *version != kPeerVersion) {
        ++versionRefusals_;
        p.lastError = peerVersionMismatch(p.config.name + " (" + p.config.address + ")", *version);
        events_.append(now, "", kEventPeer, p.lastError);
        return false;
      }
      const auto hello = decodePeerHello(payload);
      if (!hello) {
        p.lastError = "peer " + p.config.address + " sent a malformed hello";
        return false;
      }
      if (hello->node != p.config.name) {
        p.lastError = "the instance at " + p.config.address + " calls itself '" + hello->node +
                      "', expected '" + p.config.name + "'";
        events_.append(now, "", kEventPeer, "peer " + p.config.name + ": " + p.lastError);
        return false;
      }
      c.serverNonce = hello->nonce;
      c.clientNonce = peerFreshNonce();
      PeerAuth auth{kPeerVersion, c.clientNonce, seedTag_, config_.node,
                    peerAuthMac(master_, "auth-c",
                                PeerTranscript{c.serverNonce, c.clientNonce, seedTag_,
                                               p.config.name, config_.node})};
      send(c, PeerFrameType::Auth, encodePeerAuth(auth));
      c.phase = Phase::AwaitAccept;
      return true;
    }
    if (c.phase == Phase::AwaitAccept && type == PeerFrameType::Accept) {
      const auto mac = decodePeerMac(payload);
      if (!mac ||
          !peerMacEqual(*mac, peerAuthMac(master_, "auth-s",
                                          PeerTranscript{c.serverNonce, c.clientNonce, seedTag_,
                                                         p.config.name, config_.node}))) {
        ++p.authFailures;
        p.lastError = "peer " + p.config.name + " failed authentication (another secret?)";
        events_.append(now, "", kEventPeer, "auth refused: " + p.lastError);
        return false;
      }
      c.sendKey = peerSessionKey(master_, "c2s", c.serverNonce, c.clientNonce);
      c.recvKey = peerSessionKey(master_, "s2c", c.serverNonce, c.clientNonce);
      up(id, c, now);
      return true;
    }
    if (type == PeerFrameType::Refuse) {
      p.lastError = "refused by " + p.config.name + ": " +
                    std::string(payload.substr(0, std::min<std::size_t>(payload.size(), 200)));
      events_.append(now, "", kEventPeer, "peer " + p.config.name + ": " + p.lastError);
      return false;
    }
    p.lastError = "unexpected handshake frame from " + p.config.name;
    return false;
  }
  if (c.phase != Phase::AwaitAuth || type != PeerFrameType::Auth) {
    ++handshakeDrops_;
    return false;
  }
  const auto version = peerPayloadVersion(payload);
  if (version && *version != kPeerVersion) {
    ++versionRefusals_;
    // Anyone can send this: summarised like the other refusals a stranger causes.
    noteRefusal(now, c.source, peerVersionMismatch("at " + c.source, *version));
    // Said to the peer from its side: which of the two to upgrade.
    refuse(c, "this instance (" + config_.node + ") speaks tier protocol v" +
                  std::to_string(kPeerVersion) + ", yours v" + std::to_string(*version) +
                  (*version < kPeerVersion ? ": upgrade yours" : ": upgrade this one"));
    return false;
  }
  const auto auth = decodePeerAuth(payload);
  if (!auth) {
    ++handshakeDrops_;
    refuse(c, "malformed auth message");
    return false;
  }
  const int index = peerNamed(auth->node);
  if (index < 0) {
    ++unknownNodes_;
    noteRefusal(now, c.source, "handshake as a node that is no configured peer");
    refuse(c, "unknown node '" + auth->node + "'");
    return false;
  }
  Peer& p = peers_[static_cast<std::size_t>(index)];
  if (!peerMacEqual(auth->mac, peerAuthMac(master_, "auth-c",
                                           PeerTranscript{c.serverNonce, auth->nonce, auth->seedTag,
                                                          config_.node, auth->node}))) {
    ++p.authFailures;
    p.lastError = "bad MAC from " + c.remote + " (another secret?)";
    noteRefusal(now, c.source,
                "bad MAC claiming to be peer " + p.config.name + " (another secret?)");
    refuse(c, "authentication failed");
    return false;
  }
  if (auth->seedTag != seedTag_) {
    p.lastError =
        "hash_seed differs: flow hashes name other flows; configure the same "
        "[dataplane] hash_seed on every instance of the tier";
    events_.append(now, "", kEventPeer, "refused peer " + p.config.name + ": " + p.lastError);
    refuse(c, "hash_seed differs from " + config_.node + "'s");
    return false;
  }
  c.clientNonce = auth->nonce;
  c.peer = index;
  send(c, PeerFrameType::Accept,
       encodePeerMac(peerAuthMac(
           master_, "auth-s",
           PeerTranscript{c.serverNonce, c.clientNonce, seedTag_, config_.node, auth->node})));
  c.sendKey = peerSessionKey(master_, "s2c", c.serverNonce, c.clientNonce);
  c.recvKey = peerSessionKey(master_, "c2s", c.serverNonce, c.clientNonce);
  if (p.inConn && *p.inConn != id) close(*p.inConn, "replaced by a new connection", now);
  up(id, c, now);
  return true;
}

void PeerChannel::up(std::uint64_t id, Conn& c, Millis now) {
  Peer& p = peers_[static_cast<std::size_t>(c.peer)];
  c.phase = Phase::Up;
  c.lastRecv = now;
  if (c.outbound) {
    p.unreachable = false;
    c.dumping = true;
    c.dumpOf = local_;
    c.cursor = 0;
    sendStep(c);
    send(c, PeerFrameType::DumpBegin, {});
  } else {
    p.inConn = id;
    p.downSince.reset();
    p.receivingDump = false;
    p.staging.clear();
    p.intentReceiving = false;
    p.intentStaging.clear();
    p.unreachable = false;
    // A peer that reaches us is up: send it our set now rather than at the
    // next redial (a joining instance waits for every live peer's dump).
    if (!p.outConn) p.nextAttempt = now;
  }
  p.lastError.clear();
  events_.append(now, "", kEventPeer,
                 "peer " + p.config.name + " up (" +
                     (c.outbound ? "sending to " : "receiving from ") + c.remote + ")");
}

bool PeerChannel::handleData(Conn& c, PeerFrameType type, std::string_view payload, Millis now) {
  (void)now;
  Peer& p = peers_[static_cast<std::size_t>(c.peer)];
  if (type == PeerFrameType::Heartbeat) return payload.empty();
  if (c.outbound) {
    p.lastError = "peer " + p.config.name + " sent data on our sending connection";
    return false;
  }
  auto& target = p.receivingDump ? p.staging : p.held;
  switch (type) {
    case PeerFrameType::DumpBegin:
      p.receivingDump = true;
      p.staging.clear();
      return payload.empty();
    case PeerFrameType::DumpEnd:
      if (!p.receivingDump) return false;
      p.held.swap(p.staging);
      p.staging.clear();
      p.receivingDump = false;
      p.dumpReceived = true;
      changed_ = true;
      return payload.empty();
    case PeerFrameType::Records: {
      auto decoded = decodePeerRecords(payload, hashSeed_);
      if (auto* e = std::get_if<std::string>(&decoded)) {
        p.lastError = *e;
        return false;
      }
      for (const FlowExceptionRecord& r : std::get<std::vector<FlowExceptionRecord>>(decoded)) {
        ++p.recordsIn;
        auto it = target.find(r.hash);
        if (it == target.end() && target.size() >= config_.maxRecordsPerPeer) {
          ++p.recordsDropped;
          continue;
        }
        target[r.hash] = Held{r.backendId, r.state, ++stamp_};
      }
      if (!p.receivingDump) changed_ = true;
      return true;
    }
    case PeerFrameType::Intent:
      receiveIntent(p, payload);
      return true;
    case PeerFrameType::Step: {
      // Malformed: counted and ignored (the connection lives on).
      const auto ago = decodePeerStep(payload);
      if (!ago) {
        ++p.stepFramesBad;
        return true;
      }
      if (*ago) {
        p.lastStepAt = now - static_cast<Millis>(std::min<std::uint64_t>(**ago, now));
      } else {
        p.lastStepAt.reset();
      }
      return true;
    }
    case PeerFrameType::Removed: {
      const auto hashes = decodePeerRemoved(payload);
      if (!hashes) {
        p.lastError = "malformed removed-flows frame";
        return false;
      }
      for (const std::uint64_t h : *hashes) target.erase(h);
      if (!p.receivingDump) changed_ = true;
      return true;
    }
    default:
      return false;
  }
}

void PeerChannel::pump(Conn& c) {
  Peer& p = peers_[static_cast<std::size_t>(c.peer)];
  std::vector<FlowExceptionRecord> chunk;
  const auto sendRecords = [&] {
    send(c, PeerFrameType::Records, encodePeerRecords(hashSeed_, chunk));
    p.recordsOut += chunk.size();
    chunk.clear();
  };
  while (c.out.size() - c.outSent < kLowWater) {
    if (c.dumping) {
      const LocalSet& dump = *c.dumpOf;
      for (; c.cursor < dump.size() && chunk.size() < kPeerRecordsPerFrame; ++c.cursor) {
        chunk.push_back(FlowExceptionRecord{dump[c.cursor].hash, dump[c.cursor].backendId,
                                            dump[c.cursor].state, 0});
      }
      if (!chunk.empty()) sendRecords();
      if (c.cursor == dump.size()) {
        send(c, PeerFrameType::DumpEnd, {});
        c.dumping = false;
        c.base = std::move(c.dumpOf);
        c.dumpOf.reset();
      }
      continue;
    }
    if (c.base == local_) return;
    // The difference between what the peer has and what is here now; a slow
    // peer gets one larger difference later instead of a queue of them.
    std::vector<std::uint64_t> removed;
    const LocalSet& was = *c.base;
    const LocalSet& now = *local_;
    const auto upsert = [&](const LocalRecord& r) {
      chunk.push_back(FlowExceptionRecord{r.hash, r.backendId, r.state, 0});
      if (chunk.size() == kPeerRecordsPerFrame) sendRecords();
    };
    const auto remove = [&](std::uint64_t hash) {
      removed.push_back(hash);
      if (removed.size() == kPeerRemovedPerFrame) {
        send(c, PeerFrameType::Removed, encodePeerRemoved(removed));
        removed.clear();
      }
    };
    std::size_t i = 0;
    std::size_t j = 0;
    while (i < was.size() || j < now.size()) {
      if (j == now.size() || (i < was.size() && was[i].hash < now[j].hash)) {
        remove(was[i++].hash);
      } else if (i == was.size() || now[j].hash < was[i].hash) {
        upsert(now[j++]);
      } else {
        if (!(was[i] == now[j])) upsert(now[j]);
        ++i;
        ++j;
      }
    }
    if (!chunk.empty()) sendRecords();
    if (!removed.empty()) send(c, PeerFrameType::Removed, encodePeerRemoved(removed));
    c.base = local_;
  }
}

void PeerChannel::pumpIntent(Conn& c) {
  if (intentVersion_ == 0 || c.intentSent == intentVersion_) return;
  // Small (a few entries per backend): the whole set each time it changes.
  for (const std::string& payload : encodeIntentDump(*intentLocal_, intentDigest_)) {
    send(c, PeerFrameType::Intent, payload);
  }
  c.intentSent = intentVersion_;
}

void PeerChannel::receiveIntent(Peer& p, std::string_view payload) {
  auto decoded = decodeIntentFrame(payload);
  if (auto* e = std::get_if<std::string>(&decoded)) {
    ++p.intentFramesBad;
    p.intentReceiving = false;
    p.intentStaging.clear();
    if (p.intentFramesBad == 1 || p.intentFramesBad % 100 == 0) {
      events_.append(now_, "", kEventPeer,
                     "peer " + p.config.name + ": intent frame ignored (" + *e + "; " +
                         std::to_string(p.intentFramesBad) + " so far)");
    }
    return;
  }
  IntentWireFrame& f = std::get<IntentWireFrame>(decoded);
  if (f.otherVersion) {
    ++p.intentOtherVersion;
    return;
  }
  p.intentRecordsUnknown += f.unknownRecords;
  if ((f.flags & kIntentFlagBegin) != 0) {
    p.intentReceiving = true;
    p.intentStaging.clear();
  }
  if (!p.intentReceiving) {
    ++p.intentFramesBad;  // a continuation without its beginning
    return;
  }
  if (p.intentStaging.size() + f.entries.size() > kTierMaxEntries) {
    ++p.intentFramesBad;
    p.intentReceiving = false;
    p.intentStaging.clear();
    return;
  }
  for (TierIntentEntry& e : f.entries) p.intentStaging.push_back(std::move(e));
  if ((f.flags & kIntentFlagEnd) == 0) return;
  p.intentReceiving = false;
  if (p.intentStaging.size() != f.total || tierIntentDigest(p.intentStaging) != f.digest) {
    // A sender that knows record kinds this one does not: its digest covers
    // them too. Kept, but counted as not matching (see intentAgreement()).
    if (f.unknownRecords == 0) {
      ++p.intentFramesBad;
      p.intentStaging.clear();
      return;
    }
  }
  p.intent = std::move(p.intentStaging);
  p.intentStaging.clear();
  p.intentDigest = f.digest;
  p.intentReceived = true;
  ++p.intentDumps;
  intentIn_.push_back(PeerIntentDump{p.config.name, p.intent});
}

void PeerChannel::publishIntent(std::vector<TierIntentEntry> entries, std::uint64_t digest) {
  if (intentVersion_ != 0 && digest == intentDigest_) return;
  intentLocal_ = std::make_shared<const std::vector<TierIntentEntry>>(std::move(entries));
  intentDigest_ = digest;
  ++intentVersion_;
}

std::vector<PeerIntentDump> PeerChannel::takeIntent() {
  return std::exchange(intentIn_, {});
}

IntentAgreement PeerChannel::intentAgreement() const {
  IntentAgreement a;
  for (const Peer& p : peers_) {
    if (p.retired || (p.unreachable && !p.inConn)) continue;
    if (!p.intentReceived) {
      a.agreed = false;
      a.waiting.push_back(p.config.name);
    } else if (intentVersion_ == 0 || p.intentDigest != intentDigest_) {
      a.agreed = false;
      a.divergent = true;
      a.differing.push_back(p.config.name);
    }
  }
  return a;
}

Json PeerChannel::intentJson(const Peer& p) const {
  char digest[24];
  std::snprintf(digest, sizeof digest, "%016llx", static_cast<unsigned long long>(p.intentDigest));
  const std::size_t differing =
      intentLocal_ ? tierIntentDiffering(p.intent, *intentLocal_) : p.intent.size();
  return Json{
      {"received", p.intentReceived},
      {"digest", p.intentReceived ? Json(std::string(digest)) : Json(nullptr)},
      {"entries", p.intent.size()},
      {"differing_entries", p.intentReceived ? Json(differing) : Json(nullptr)},
      {"agrees", p.intentReceived && intentVersion_ != 0 && p.intentDigest == intentDigest_},
      {"dumps", p.intentDumps},
      {"frames_bad", p.intentFramesBad},
      {"records_unknown", p.intentRecordsUnknown},
      {"frames_other_version", p.intentOtherVersion}};
}

void PeerChannel::send(Conn& c, PeerFrameType type, std::string_view payload) {
  const bool keyed = c.phase == Phase::Up;
  const std::string frame = encodePeerFrame(type, payload, keyed ? &c.sendKey : nullptr, c.sendSeq);
  if (keyed) ++c.sendSeq;
  if (c.outSent > 0 && c.outSent == c.out.size()) {
    c.out.clear();
    c.outSent = 0;
  }
  c.out.append(frame);
  c.lastSend = now_;
  if (c.peer >= 0) peers_[static_cast<std::size_t>(c.peer)].bytesOut += frame.size();
}

bool PeerChannel::flush(Conn& c) {
  while (c.outSent < c.out.size()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data() + c.outSent, c.out.size() - c.outSent,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0) return false;
    c.outSent += static_cast<std::size_t>(n);
  }
  if (c.outSent == c.out.size()) {
    c.out.clear();
    c.outSent = 0;
  } else if (c.outSent > kLowWater) {
    c.out.erase(0, c.outSent);
    c.outSent = 0;
  }
  return true;
}

void PeerChannel::refuse(Conn& c, const std::string& reason) {
  send(c, PeerFrameType::Refuse, reason);
  (void)flush(c);
}

void PeerChannel::close(std::uint64_t id, const std::string& why, Millis now) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Conn& c = it->second;
  if (c.peer >= 0) {
    Peer& p = peers_[static_cast<std::size_t>(c.peer)];
    const bool wasUp = c.phase == Phase::Up;
    if (c.outbound && p.outConn == id) {
      p.outConn.reset();
      p.nextAttempt = now + timers_.reconnect;
      if (!wasUp && !p.inConn) p.unreachable = true;
    }
    if (!c.outbound && p.inConn == id) {
      p.inConn.reset();
      p.downSince = now;
      p.receivingDump = false;
      p.staging.clear();
      p.intentReceiving = false;
      p.intentStaging.clear();
    }
    if (p.lastError.empty() || wasUp) p.lastError = why;
    if (wasUp) {
      events_.append(
          now, "", kEventPeer,
          "peer " + p.config.name + " down (" + (c.outbound ? "sending to " : "receiving from ") +
              c.remote + "): " + why +
              (c.outbound ? ""
                          : "; its " + std::to_string(p.held.size()) + " exceptions are held for " +
                                std::to_string(config_.holdTime / 1000) + " s"));
    }
  }
  (void)epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
  conns_.erase(it);
}

void PeerChannel::publishLocal(std::span<const FlowExceptionRecord> records) {
  auto next = std::make_shared<LocalSet>();
  next->reserve(records.size());
  for (const FlowExceptionRecord& r : records) {
    next->push_back(LocalRecord{r.hash, r.backendId, r.state});
  }
  std::stable_sort(next->begin(), next->end(),
                   [](const LocalRecord& a, const LocalRecord& b) { return a.hash < b.hash; });
  next->erase(
      std::unique(next->begin(), next->end(),
                  [](const LocalRecord& a, const LocalRecord& b) { return a.hash == b.hash; }),
      next->end());
  if (*next == *local_) return;
  local_ = std::move(next);
}

void PeerChannel::sendStep(Conn& c) {
  send(c, PeerFrameType::Step,
       encodePeerStep(lastStep_ ? std::optional<std::uint64_t>(
                                      static_cast<std::uint64_t>(now_ - std::min(now_, *lastStep_)))
                                : std::nullopt));
}

void PeerChannel::noteStep(Millis now) {
  now_ = std::max(now_, now);
  lastStep_ = now;
  for (auto& [id, c] : conns_) {
    if (c.outbound && c.phase == Phase::Up) sendStep(c);
  }
  pushLocal();
}

std::optional<PeerChannel::PeerStep> PeerChannel::lastPeerStep() const {
  std::optional<PeerStep> last;
  for (const Peer& p : peers_) {
    if (p.retired || !p.inConn || !p.lastStepAt) continue;
    if (!last || *p.lastStepAt > last->at) last = PeerStep{p.config.name, *p.lastStepAt};
  }
  return last;
}

void PeerChannel::pushLocal() {
  std::vector<std::pair<std::uint64_t, std::string>> failed;
  for (auto& [id, c] : conns_) {
    if (!c.outbound || c.phase != Phase::Up) continue;
    pump(c);
    if (!flush(c)) failed.emplace_back(id, "write: " + errnoText(errno));
  }
  for (const auto& [id, why] : failed) close(id, why, now_);
}

bool PeerChannel::localDelivered() const {
  for (const auto& [id, c] : conns_) {
    if (!c.outbound || c.phase != Phase::Up) continue;
    if (c.dumping || c.base != local_ || c.outSent != c.out.size()) return false;
  }
  return true;
}

std::size_t PeerChannel::sending() const {
  std::size_t n = 0;
  for (const auto& [id, c] : conns_) n += c.outbound && c.phase == Phase::Up;
  return n;
}

bool PeerChannel::takeChanged() noexcept {
  return std::exchange(changed_, false);
}

std::vector<PeerException> PeerChannel::exceptions() const {
  // In receive order, so that of two records of one flow (two peers) the
  // later one comes last and wins in the ExceptionTable built from them.
  std::vector<std::pair<std::uint64_t, PeerException>> all;
  std::size_t sources = 0;
  for (const Peer& p : peers_) {
    sources += !p.held.empty();
    for (const auto& [hash, h] : p.held) {
      all.emplace_back(h.stamp, PeerException{hash, h.backendId, h.state});
    }
  }
  if (sources > 1) {
    std::sort(all.begin(), all.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
  }
  std::vector<PeerException> out;
  out.reserve(all.size());
  for (const auto& [stamp, e] : all) out.push_back(e);
  return out;
}

std::string PeerChannel::directionState(const std::optional<std::uint64_t>& conn) const {
  if (!conn) return "down";
  auto it = conns_.find(*conn);
  if (it == conns_.end()) return "down";
  return it->second.phase == Phase::Up ? "connected" : "handshaking";
}

std::size_t PeerChannel::heldTotal() const {
  std::size_t n = 0;
  for (const Peer& p : peers_) n += p.held.size();
  return n;
}

bool PeerChannel::synced() const {
  return std::all_of(peers_.begin(), peers_.end(), [](const Peer& p) {
    return p.retired || p.dumpReceived || (p.unreachable && !p.inConn);
  });
}

bool PeerChannel::connected(const std::string& peer) const {
  const int i = peerNamed(peer);
  if (i < 0) return false;
  const Peer& p = peers_[static_cast<std::size_t>(i)];
  return directionState(p.outConn) == "connected" && directionState(p.inConn) == "connected";
}

std::size_t PeerChannel::held(const std::string& peer) const {
  const int i = peerIndex(peer, true);
  return i < 0 ? 0 : peers_[static_cast<std::size_t>(i)].held.size();
}

Json PeerChannel::status(Millis now) const {
  Json peers = Json::array();
  for (const Peer& p : peers_) {
    const std::string out = directionState(p.outConn);
    const std::string in = directionState(p.inConn);
    const std::string state = out == "connected" && in == "connected" ? "connected"
                              : out == "down" && in == "down"         ? "down"
                                                                      : "handshaking";
    peers.push_back(
        Json{{"name", p.config.name},
             {"address", p.config.address},
             {"state", p.retired ? std::string("retired") : state},
             {"sending", out},
             {"receiving", in},
             {"records_in", p.recordsIn},
             {"records_out", p.recordsOut},
             {"bytes_in", p.bytesIn},
             {"bytes_out", p.bytesOut},
             {"auth_failures", p.authFailures},
             {"frames_refused", p.framesRefused},
             {"records_dropped", p.recordsDropped},
             {"slow_disconnects", p.slowDisconnects},
             {"last_frame_age_ms", p.lastFrame ? Json(now - *p.lastFrame) : Json(nullptr)},
             {"held_exceptions", p.held.size()},
             {"down_for_ms", p.downSince && !p.inConn ? Json(now - *p.downSince) : Json(nullptr)},
             {"intent", intentJson(p)},
             {"last_step_age_ms",
              p.lastStepAt && p.inConn ? Json(now - std::min(now, *p.lastStepAt)) : Json(nullptr)},
             {"step_frames_bad", p.stepFramesBad},
             {"last_error", p.lastError}});
  }
  char digest[24];
  std::snprintf(digest, sizeof digest, "%016llx", static_cast<unsigned long long>(intentDigest_));
  const IntentAgreement agreement = intentAgreement();
  return Json{{"enabled", true},
              {"node", config_.node},
              {"synced", synced()},
              {"listen", config_.listen},
              {"listening", listen_.valid()},
              {"local_exceptions", local_->size()},
              {"peer_exceptions_in_table", inUse_},
              {"peer_exceptions_ignored", ignored_},
              {"unknown_node_refusals", unknownNodes_},
              {"version_refusals", versionRefusals_},
              {"handshake_drops", handshakeDrops_},
              {"connections_refused", connectionsRefused_},
              {"pending_handshakes", pendingHandshakes()},
              {"intent", Json{{"digest", std::string(digest)},
                              {"entries", intentLocal_ ? intentLocal_->size() : 0},
                              {"agreed", agreement.agreed},
                              {"divergent", agreement.divergent},
                              {"waiting_for", agreement.waiting},
                              {"differing_peers", agreement.differing}}},
              {"peers", peers}};
}

void PeerChannel::metrics(MetricsWriter& m, Millis now) const {
  for (const Peer& p : peers_) {
    const std::string_view n = p.config.name;
    m.gauge("spillway_peer_up", "1 when this direction of the peer channel is connected.",
            {{"peer", n}, {"direction", "out"}}, directionState(p.outConn) == "connected" ? 1 : 0);
    m.gauge("spillway_peer_up", "1 when this direction of the peer channel is connected.",
            {{"peer", n}, {"direction", "in"}}, directionState(p.inConn) == "connected" ? 1 : 0);
    m.counter("spillway_peer_records_received_total", "Exception records received from a peer.",
              {{"peer", n}}, static_cast<double>(p.recordsIn));
    m.counter("spillway_peer_records_sent_total", "Exception records sent to a peer.",
              {{"peer", n}}, static_cast<double>(p.recordsOut));
    m.counter("spillway_peer_bytes_received_total", "Bytes received from a peer.", {{"peer", n}},
              static_cast<double>(p.bytesIn));
    m.counter("spillway_peer_bytes_sent_total", "Bytes sent to a peer.", {{"peer", n}},
              static_cast<double>(p.bytesOut));
    m.counter("spillway_peer_auth_failures_total", "Handshakes with a bad MAC, per peer.",
              {{"peer", n}}, static_cast<double>(p.authFailures));
    m.counter("spillway_peer_frames_refused_total",
              "Frames refused (bad MAC, replay, malformed); each dropped the connection.",
              {{"peer", n}}, static_cast<double>(p.framesRefused));
    m.counter("spillway_peer_records_dropped_total",
              "Records not kept because the peer's set was full (max_records_per_peer).",
              {{"peer", n}}, static_cast<double>(p.recordsDropped));
    m.counter("spillway_peer_slow_disconnects_total",
              "Connections dropped because the peer read too slowly (max_output_bytes).",
              {{"peer", n}}, static_cast<double>(p.slowDisconnects));
    m.gauge("spillway_peer_held_exceptions", "Exceptions held from a peer.", {{"peer", n}},
            static_cast<double>(p.held.size()));
    m.counter("spillway_peer_intent_frames_bad_total",
              "Intent frames from a peer that were malformed and ignored.", {{"peer", n}},
              static_cast<double>(p.intentFramesBad));
    m.counter("spillway_peer_intent_records_unknown_total",
              "Intent records of a kind this version does not know, skipped.", {{"peer", n}},
              static_cast<double>(p.intentRecordsUnknown + p.intentOtherVersion));
    m.gauge("spillway_peer_intent_differing_entries",
            "Intent entries whose stamps differ between this instance and the peer's last dump.",
            {{"peer", n}},
            static_cast<double>(intentLocal_ ? tierIntentDiffering(p.intent, *intentLocal_)
                                             : p.intent.size()));
    if (p.lastFrame) {
      m.gauge("spillway_peer_last_frame_age_seconds", "Time since the peer's last frame.",
              {{"peer", n}}, static_cast<double>(now - *p.lastFrame) / 1000.0);
    }
  }
  m.counter("spillway_peer_unknown_node_refusals_total",
            "Handshakes refused because the node is not a configured peer.", {},
            static_cast<double>(unknownNodes_));
  m.counter("spillway_peer_connections_refused_total",
            "Connections to the peer port closed at accept: too many pending handshakes from "
            "their address, or from addresses of no peer.",
            {}, static_cast<double>(connectionsRefused_));
  m.counter("spillway_peer_version_refusals_total",
            "Handshakes refused because the peer speaks another tier protocol version.", {},
            static_cast<double>(versionRefusals_));
  m.counter("spillway_peer_handshake_drops_total",
            "Connections dropped before authentication: malformed, unexpected or truncated "
            "handshake input from an unauthenticated client.",
            {}, static_cast<double>(handshakeDrops_));
  m.gauge("spillway_peer_exceptions_in_table", "Peers' exceptions in the exception table.", {},
          static_cast<double>(inUse_));
  m.gauge("spillway_peer_exceptions_ignored",
          "Peers' exceptions ignored (backend unknown here, or not active or draining).", {},
          static_cast<double>(ignored_));
}

}  // namespace spillway
