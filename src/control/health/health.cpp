#include "control/health/health.hpp"

#include <arpa/inet.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <system_error>

#include "control/health/http_client.hpp"
#include "control/sys/epoll_loop.hpp"
#include "spillway/checksum.hpp"
#include "spillway/errno_text.hpp"
#include "spillway/packet.hpp"
#include "spillway/wire.hpp"

namespace spillway {
namespace {

// Epoll tags of the raw receive sockets; probes' tags start above them.
constexpr std::uint64_t kTagRaw4 = 1;
constexpr std::uint64_t kTagRaw6 = 2;
constexpr std::uint64_t kFirstProbeTag = 16;

// Encap probes' source ports: the upper half of Linux's ephemeral range.
constexpr std::uint16_t kProbePortLow = 40000;
constexpr std::uint16_t kProbePortSpan = 20000;
// Raw packets read per poll(), so a TCP-heavy host cannot stall the loop.
constexpr int kMaxRawPerPoll = 512;

std::string formatMs(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", ms);
  return buf;
}

bool sameCheck(const HealthCheckConfig& a, const HealthCheckConfig& b) noexcept {
  return a.kind == b.kind && a.port == b.port && a.httpPath == b.httpPath &&
         a.expectStatus == b.expectStatus && a.interval == b.interval && a.timeout == b.timeout &&
         a.rise == b.rise && a.fall == b.fall;
}

Millis staggerOffset(std::uint64_t id, Millis interval) noexcept {
  if (interval <= 1) return 0;
  const std::uint64_t mixed = (id ^ (id >> 31)) * 0x9e3779b97f4a7c15ULL;
  return (mixed >> 32) % interval;
}

int familyOf(IpVersion v) noexcept {
  return v == IpVersion::V4 ? AF_INET : AF_INET6;
}

std::string endpoint(const IpAddress& a, std::uint16_t port) {
  const std::string host = formatIpAddress(a);
  return a.version == IpVersion::V6 ? "[" + host + "]:" + std::to_string(port)
                                    : host + ":" + std::to_string(port);
}

void closeFd(int& fd) noexcept {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

// ---------------------------------------------------------------------------
// HealthState

RttEstimate nextRttEstimate(const std::optional<RttEstimate>& before, double sampleMs) noexcept {
  if (!before) return RttEstimate{sampleMs, sampleMs / 2.0};
  RttEstimate next;
  next.rttVarMs =
      (1.0 - kRttBeta) * before->rttVarMs + kRttBeta * std::abs(before->srttMs - sampleMs);
  next.srttMs = (1.0 - kRttAlpha) * before->srttMs + kRttAlpha * sampleMs;
  return next;
}

const std::optional<RttEstimate>& RttFilter::add(double sampleMs) noexcept {
  latest_[next_] = sampleMs;
  next_ = (next_ + 1) % latest_.size();
  count_ = std::min(count_ + 1, latest_.size());
  if (count_ < latest_.size()) return rtt_;
  std::array<double, 3> sorted = latest_;
  std::sort(sorted.begin(), sorted.end());
  rtt_ = nextRttEstimate(rtt_, sorted[1]);
  return rtt_;
}

HealthState::HealthState(std::uint32_t rise, std::uint32_t fall) noexcept
    : rise_(std::max<std::uint32_t>(rise, 1)), fall_(std::max<std::uint32_t>(fall, 1)) {}

void HealthState::setDamping(std::uint32_t rise, std::uint32_t fall) noexcept {
  rise_ = std::max<std::uint32_t>(rise, 1);
  fall_ = std::max<std::uint32_t>(fall, 1);
}

std::optional<std::string> HealthState::onSuccess(Millis now, double rttMs) {
  ++status_.probes;
  status_.lastProbe = now;
  ++status_.consecutiveOk;
  status_.consecutiveFail = 0;
  status_.lastRttMs = rttMs;
  status_.rtt = rtt_.add(rttMs);
  if (status_.rtt) status_.rttMs = status_.rtt->srttMs;
  if (status_.up || status_.consecutiveOk < rise_) return std::nullopt;
  status_.up = true;
  status_.lastChange = now;
  return std::to_string(status_.consecutiveOk) +
         (status_.consecutiveOk == 1 ? " success" : " consecutive successes") + " (rtt " +
         formatMs(rttMs) + " ms)";
}

std::optional<std::string> HealthState::onFailure(Millis now, std::string_view error) {
  ++status_.probes;
  ++status_.failures;
  status_.lastProbe = now;
  ++status_.consecutiveFail;
  status_.consecutiveOk = 0;
  status_.lastError = std::string(error);
  if (!status_.up || status_.consecutiveFail < fall_) return std::nullopt;
  status_.up = false;
  status_.lastChange = now;
  return std::to_string(status_.consecutiveFail) +
         (status_.consecutiveFail == 1 ? " failure: " : " consecutive failures: ") +
         std::string(error);
}

std::optional<std::string> HealthState::forceUp(Millis now, std::string_view why) {
  status_.consecutiveFail = 0;
  if (status_.up) return std::nullopt;
  status_.up = true;
  status_.lastChange = now;
  return std::string(why);
}

// ---------------------------------------------------------------------------
// HealthChecker

struct HealthChecker::Entry {
  explicit Entry(HealthTarget t)
      : target(std::move(t)), state(target.config.rise, target.config.fall) {}

  HealthTarget target;
  HealthState state;
  std::optional<Millis> due;  // next probe start; unset: at the next poll
  bool probing = false;
  Millis probeStart = 0;
  double probeStartFine = 0.0;
  std::optional<double> connectRtt;
  std::uint64_t tag = 0;  // of the in-flight exchange; 0 when none
  HttpExchange exchange;
  std::uint16_t encapPort = 0;  // of the in-flight encap probe; 0 when none
  std::uint16_t encapVipPort = 0;
  std::uint32_t encapSeq = 0;
};

struct HealthChecker::RawSockets {
  int send4 = -1;
  int send6 = -1;
  int recv4 = -1;
  int recv6 = -1;
  ~RawSockets() {
    closeFd(send4);
    closeFd(send6);
    closeFd(recv4);
    closeFd(recv6);
  }
};

HealthChecker::HealthChecker(HealthCheckerOptions options)
    : options_(std::move(options)), nextTag_(kFirstProbeTag) {
  epollFd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epollFd_ < 0) initError_ = "epoll_create1: " + errnoText(errno);
  std::uint64_t seed = options_.randomSeed;
  if (seed == 0) {
    std::random_device rd;
    seed = (std::uint64_t{rd()} << 32) ^ rd();
  }
  rng_.seed(seed);
}

HealthChecker::~HealthChecker() {
  entries_.clear();  // closes the exchanges' sockets before the epoll fd
  raw_.reset();
  if (epollFd_ >= 0) ::close(epollFd_);
}

double HealthChecker::fineNow() const {
  if (options_.rttClock) return options_.rttClock();
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

void HealthChecker::abortProbe(Entry& e) noexcept {
  if (e.tag != 0) byTag_.erase(e.tag);
  e.tag = 0;
  e.exchange.abort("aborted");
  if (e.encapPort != 0) {
    const auto it = encapByPort_.find(e.encapPort);
    if (it != encapByPort_.end() && it->second == &e) encapByPort_.erase(it);
  }
  e.encapPort = 0;
  e.probing = false;
}

void HealthChecker::setTargets(std::vector<HealthTarget> targets) {
  std::unordered_map<std::uint64_t, std::unique_ptr<Entry>> old;
  for (auto& e : entries_) old.emplace(e->target.id, std::move(e));
  entries_.clear();
  byId_.clear();

  bool anyEncap = false;
  for (HealthTarget& t : targets) {
    if (byId_.contains(t.id)) continue;  // first one wins
    anyEncap = anyEncap || t.config.kind == HealthCheckKind::Encap;
    std::unique_ptr<Entry> entry;
    const auto it = old.find(t.id);
    if (it != old.end()) {
      Entry& prev = *it->second;
      if (prev.target.address == t.address && sameCheck(prev.target.config, t.config) &&
          prev.target.encap == t.encap) {
        entry = std::move(it->second);
        entry->target.name = t.name;
      } else if (prev.target.address == t.address) {
        abortProbe(prev);
        entry = std::make_unique<Entry>(std::move(t));
        entry->state = prev.state;
        entry->state.setDamping(entry->target.config.rise, entry->target.config.fall);
      }
      old.erase(it);
    }
    if (!entry) entry = std::make_unique<Entry>(std::move(t));
    byId_.emplace(entry->target.id, entry.get());
    entries_.push_back(std::move(entry));
  }
  for (auto& [id, e] : old) abortProbe(*e);
  old.clear();
  if (!anyEncap) raw_.reset();
}

std::optional<Millis> HealthChecker::nextDeadline() const noexcept {
  std::optional<Millis> next;
  const auto consider = [&next](Millis t) {
    if (!next || t < *next) next = t;
  };
  for (const auto& e : entries_) {
    if (e->target.config.kind == HealthCheckKind::None) {
      if (!e->state.status().up) consider(0);
      continue;
    }
    if (e->probing) {
      consider(e->probeStart + std::max<Millis>(e->target.config.timeout, 1));
    } else if (e->due) {
      consider(*e->due);
    } else {
      consider(0);
    }
  }
  return next;
}

std::size_t HealthChecker::probesInFlight() const noexcept {
  std::size_t n = 0;
  for (const auto& e : entries_) n += e->probing ? 1 : 0;
  return n;
}

std::vector<HealthTransition> HealthChecker::takeTransitions() {
  std::vector<HealthTransition> out;
  out.swap(transitions_);
  return out;
}

std::optional<HealthStatus> HealthChecker::status(std::uint64_t id) const {
  const auto it = byId_.find(id);
  if (it == byId_.end()) return std::nullopt;
  return it->second->state.status();
}

void HealthChecker::poll(Millis now) noexcept {
  try {
    if (epollFd_ >= 0) {
      drainReady(epollFd_, [&](const epoll_event& ev) {
        const std::uint64_t tag = ev.data.u64;
        if (tag == kTagRaw4) {
          drainRaw(AF_INET, now);
        } else if (tag == kTagRaw6) {
          drainRaw(AF_INET6, now);
        } else if (const auto it = byTag_.find(tag); it != byTag_.end()) {
          onExchangeEvent(*it->second, ev.events, now);
        }
      });
    }

    for (auto& ep : entries_) {
      Entry& e = *ep;
      const HealthCheckConfig& c = e.target.config;
      if (c.kind == HealthCheckKind::None) {
        if (auto cause = e.state.forceUp(now, "health check off (kind none)")) {
          transitions_.push_back(HealthTransition{e.target.id, e.target.name, true, *cause, now});
        }
        continue;
      }
      const Millis timeout = std::max<Millis>(c.timeout, 1);
      if (e.probing && now >= e.probeStart + timeout) {
        std::string error;
        if (c.kind == HealthCheckKind::Encap) {
          error = "no SYN-ACK or RST from " +
                  (e.target.encap ? endpoint(e.target.encap->vip, e.encapVipPort)
                                  : std::string("the VIP")) +
                  " through the tunnel within " + std::to_string(timeout) + " ms";
        } else if (!e.exchange.connected()) {
          error = "connect timeout after " + std::to_string(timeout) + " ms";
        } else {
          error = "no HTTP status line within " + std::to_string(timeout) + " ms";
        }
        finishProbe(e, now, false, 0.0, error);
      }
      if (!e.due) {
        e.due = now + (options_.staggerStart ? staggerOffset(e.target.id, c.interval) : 0);
      }
      if (!e.probing && *e.due <= now) startProbe(e, now);
    }
  } catch (...) {
    // Allocation failure: the probes concerned stay in flight and time out.
  }
}

void HealthChecker::startProbe(Entry& e, Millis now) noexcept {
  const HealthCheckConfig& c = e.target.config;
  e.probing = true;
  e.probeStart = now;
  e.due = now + std::max<Millis>(c.interval, 1);
  e.connectRtt.reset();
  e.probeStartFine = fineNow();

  if (c.kind == HealthCheckKind::Encap) {
    std::string error;
    try {
      error = startEncapProbe(e);
    } catch (...) {
      error = "out of memory";
    }
    if (!error.empty()) finishProbe(e, now, false, 0.0, error);
    return;
  }
  if (epollFd_ < 0) {
    finishProbe(e, now, false, 0.0, initError_);
    return;
  }
  HttpRequest request;
  request.mode = c.kind == HealthCheckKind::Http ? HttpExchangeMode::StatusLine
                                                 : HttpExchangeMode::ConnectOnly;
  request.address = e.target.address;
  request.port = c.port;
  request.path = c.httpPath.empty() ? "/" : c.httpPath;
  request.maxResponseBytes = std::size_t{16} * 1024;
  e.tag = nextTag_++;
  byTag_[e.tag] = &e;
  e.exchange.start(request, epollFd_, e.tag);
  if (e.exchange.connected()) e.connectRtt = fineNow() - e.probeStartFine;
  if (e.exchange.finished()) onExchangeFinished(e, now);
}

void HealthChecker::onExchangeEvent(Entry& e, std::uint32_t events, Millis now) noexcept {
  const bool wasConnected = e.exchange.connected();
  e.exchange.onEvent(events);
  if (!wasConnected && e.exchange.connected()) e.connectRtt = fineNow() - e.probeStartFine;
  if (e.exchange.finished()) onExchangeFinished(e, now);
}

void HealthChecker::onExchangeFinished(Entry& e, Millis now) noexcept {
  const double rtt = e.connectRtt.value_or(fineNow() - e.probeStartFine);
  if (e.exchange.state() == HttpExchange::State::Failed) {
    std::string error = e.exchange.error();
    finishProbe(e, now, false, 0.0, error);
    return;
  }
  if (e.target.config.kind == HealthCheckKind::Http &&
      e.exchange.status() != e.target.config.expectStatus) {
    finishProbe(e, now, false, 0.0,
                "HTTP status " + std::to_string(e.exchange.status()) + ", expected " +
                    std::to_string(e.target.config.expectStatus));
    return;
  }
  finishProbe(e, now, true, rtt, {});
}

void HealthChecker::finishProbe(Entry& e, Millis now, bool ok, double rttMs,
                                std::string_view error) noexcept {
  abortProbe(e);
  try {
    auto cause = ok ? e.state.onSuccess(now, rttMs) : e.state.onFailure(now, error);
    if (cause) {
      transitions_.push_back(HealthTransition{e.target.id, e.target.name, e.state.status().up,
                                              std::move(*cause), now});
    }
  } catch (...) {
  }
}

// ---------------------------------------------------------------------------
// The encapsulation probe

bool HealthChecker::ensureRaw(int family, std::string& error) noexcept {
  if (!raw_) raw_ = std::make_unique<RawSockets>();
  int& send = family == AF_INET ? raw_->send4 : raw_->send6;
  int& recv = family == AF_INET ? raw_->recv4 : raw_->recv6;
  if (send >= 0 && recv >= 0) return true;
  if (send < 0) {
    send = ::socket(family, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);
    if (send < 0) {
      const int err = errno;
      error = "raw socket: " + errnoText(err) +
              (err == EPERM ? " (encap probes need CAP_NET_RAW)" : "");
      return false;
    }
  }
  if (recv < 0) {
    recv = ::socket(family, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP);
    if (recv < 0) {
      const int err = errno;
      error = "raw TCP socket: " + errnoText(err) +
              (err == EPERM ? " (encap probes need CAP_NET_RAW)" : "");
      return false;
    }
    if (family == AF_INET) {
      // Only TCP segments with SYN or RST reach the socket: the answers we
      // wait for, not the host's bulk TCP traffic.
      static sock_filter code[] = {
          BPF_STMT(BPF_LDX | BPF_B | BPF_MSH, 0),  // X = IPv4 header length
          BPF_STMT(BPF_LD | BPF_B | BPF_IND, 13),  // A = TCP flags
          BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, kTcpSyn | kTcpRst, 0, 1),
          BPF_STMT(BPF_RET | BPF_K, 0xffff),
          BPF_STMT(BPF_RET | BPF_K, 0),
      };
      sock_fprog prog{static_cast<unsigned short>(std::size(code)), code};
      (void)::setsockopt(recv, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog);
    } else {
      const int on = 1;
      (void)::setsockopt(recv, IPPROTO_IPV6, IPV6_RECVPKTINFO, &on, sizeof on);
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = family == AF_INET ? kTagRaw4 : kTagRaw6;
    if (epollFd_ < 0 || ::epoll_ctl(epollFd_, EPOLL_CTL_ADD, recv, &ev) != 0) {
      error = "epoll_ctl: " + errnoText(errno);
      closeFd(recv);
      return false;
    }
  }
  return true;
}

std::string HealthChecker::startEncapProbe(Entry& e) {
  if (!e.target.encap) return "encap probe without a VIP and tunnel source";
  const EncapProbeTarget& p = *e.target.encap;
  const IpAddress inner = p.innerSource.value_or(p.tunnelSource);
  const IpVersion outer = outerIpVersion(p.kind);
  if (inner.version != p.vip.version) {
    return "encap probe: inner source " + formatIpAddress(inner) + " and VIP " +
           formatIpAddress(p.vip) + " differ in family";
  }
  if (p.tunnelSource.version != outer || e.target.address.version != outer) {
    return "encap probe: " + std::string(toString(p.kind)) + " needs IPv" +
           (outer == IpVersion::V4 ? "4" : "6") + " tunnel source and backend addresses";
  }
  const std::uint16_t vipPort = p.vipPort != 0 ? p.vipPort : e.target.config.port;
  if (vipPort == 0) return "encap probe: no VIP port (vipPort or the check's port)";
  std::string error;
  if (!ensureRaw(familyOf(outer), error) || !ensureRaw(familyOf(inner.version), error)) {
    return error;
  }

  std::uint16_t port = 0;
  for (int tries = 0; tries < 16 && port == 0; ++tries) {
    const auto candidate = static_cast<std::uint16_t>(kProbePortLow + rng_() % kProbePortSpan);
    if (!encapByPort_.contains(candidate)) port = candidate;
  }
  if (port == 0) return "encap probe: no free source port";
  const auto seq = static_cast<std::uint32_t>(rng_());

  // The inner frame: Ethernet (ignored by the writer), IP, TCP SYN.
  constexpr std::size_t kHeadroom = kEncapMaxHeadroom;
  std::array<std::byte, kHeadroom + sizeof(EthernetHeader) + sizeof(Ipv6Header) + sizeof(TcpHeader)>
      buffer{};
  const std::span<std::byte> buf(buffer);
  const bool v4 = inner.version == IpVersion::V4;
  const std::size_t ipLen = v4 ? sizeof(Ipv4Header) : sizeof(Ipv6Header);
  const std::size_t frameLength = sizeof(EthernetHeader) + ipLen + sizeof(TcpHeader);
  std::size_t at = kHeadroom;
  EthernetHeader eth{};
  eth.etherType = Be16::fromHost(v4 ? kEtherTypeIpv4 : kEtherTypeIpv6);
  storeAt(buf, at, eth);
  at += sizeof eth;

  TcpHeader tcp{};
  tcp.srcPort = Be16::fromHost(port);
  tcp.dstPort = Be16::fromHost(vipPort);
  tcp.seq = Be32::fromHost(seq);
  tcp.dataOffset = 5 << 4;
  tcp.flags = kTcpSyn;
  tcp.window = Be16::fromHost(64240);
  std::uint32_t sum = 0;
  if (v4) {
    Ipv4Header ip{};
    ip.versionIhl = 0x45;
    ip.totalLength = Be16::fromHost(static_cast<std::uint16_t>(ipLen + sizeof tcp));
    ip.flagsFragment = Be16::fromHost(kIpv4FlagDf);
    ip.ttl = 64;
    ip.protocol = static_cast<std::uint8_t>(IpProto::Tcp);
    std::memcpy(ip.src.data(), inner.bytes.data(), 4);
    std::memcpy(ip.dst.data(), p.vip.bytes.data(), 4);
    ip.checksum = Be16::fromHost(internetChecksum(std::as_bytes(std::span(&ip, 1))));
    storeAt(buf, at, ip);
    sum = pseudoHeaderSumV4(ip.src, ip.dst, ip.protocol, sizeof tcp);
  } else {
    Ipv6Header ip{};
    ip.versionClassLabel = Be32::fromHost(6u << 28);
    ip.payloadLength = Be16::fromHost(sizeof tcp);
    ip.nextHeader = static_cast<std::uint8_t>(IpProto::Tcp);
    ip.hopLimit = 64;
    std::memcpy(ip.src.data(), inner.bytes.data(), 16);
    std::memcpy(ip.dst.data(), p.vip.bytes.data(), 16);
    storeAt(buf, at, ip);
    sum = pseudoHeaderSumV6(ip.src, ip.dst, ip.nextHeader, sizeof tcp);
  }
  at += ipLen;
  tcp.checksum =
      Be16::fromHost(checksumFinish(checksumPartial(std::as_bytes(std::span(&tcp, 1)), sum)));
  storeAt(buf, at, tcp);

  const std::span<const std::byte> frame(buffer.data() + kHeadroom, frameLength);
  const PacketView view = parsePacket(frame);
  EncapTarget target{};
  target.kind = p.kind;
  target.source = p.tunnelSource.bytes;
  target.backend = e.target.address.bytes;
  target.gueDstPort = p.guePort;
  const std::uint64_t flowHash = rng_();
  const EncapResult r = encapsulateAny(buf, kHeadroom, frameLength, view, target, flowHash);
  if (!r.ok())
    return "encap probe: encapsulation failed (" + std::to_string(static_cast<int>(r.drop)) + ")";

  const std::byte* outerIp = buffer.data() + r.dataOffset + sizeof(EthernetHeader);
  const std::size_t outerLen = r.frameLength - sizeof(EthernetHeader);
  const SocketAddress dst(e.target.address, 0);
  const int fd = outer == IpVersion::V4 ? raw_->send4 : raw_->send6;
  if (::sendto(fd, outerIp, outerLen, MSG_DONTWAIT, dst.get(), dst.length()) < 0) {
    return "encap probe: sendto " + formatIpAddress(e.target.address) + ": " + errnoText(errno);
  }
  e.encapPort = port;
  e.encapVipPort = vipPort;
  e.encapSeq = seq;
  encapByPort_[port] = &e;
  return {};
}

void HealthChecker::drainRaw(int family, Millis now) noexcept {
  if (!raw_) return;
  const int fd = family == AF_INET ? raw_->recv4 : raw_->recv6;
  if (fd < 0) return;
  std::array<std::byte, 2048> buf{};
  for (int i = 0; i < kMaxRawPerPoll; ++i) {
    IpBytes src{};
    IpBytes dst{};
    std::size_t l4 = 0;
    ssize_t n = 0;
    if (family == AF_INET) {
      n = ::recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
      if (n < 0) return;
      const auto len = static_cast<std::size_t>(n);
      if (len < sizeof(Ipv4Header)) continue;
      const auto ip = loadAt<Ipv4Header>(buf, 0);
      l4 = std::size_t{ip.versionIhl & 0x0fu} * 4;
      if ((ip.versionIhl >> 4) != 4 || l4 < sizeof(Ipv4Header) ||
          ip.protocol != static_cast<std::uint8_t>(IpProto::Tcp)) {
        continue;
      }
      std::memcpy(src.data(), ip.src.data(), 4);
      std::memcpy(dst.data(), ip.dst.data(), 4);
    } else {
      sockaddr_in6 from{};
      alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(in6_pktinfo))> control{};
      iovec iov{buf.data(), buf.size()};
      msghdr msg{};
      msg.msg_name = &from;
      msg.msg_namelen = sizeof from;
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
      n = ::recvmsg(fd, &msg, MSG_DONTWAIT);
      if (n < 0) return;
      std::memcpy(src.data(), &from.sin6_addr, 16);
      bool haveDst = false;
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
          in6_pktinfo info{};
          std::memcpy(&info, CMSG_DATA(c), sizeof info);
          std::memcpy(dst.data(), &info.ipi6_addr, 16);
          haveDst = true;
        }
      }
      if (!haveDst) continue;
    }
    const auto len = static_cast<std::size_t>(n);
    if (len < l4 + sizeof(TcpHeader)) continue;
    const auto tcp = loadAt<TcpHeader>(buf, l4);
    onTcpReply(family, src, dst, tcp.srcPort.host(), tcp.dstPort.host(), tcp.ack.host(), tcp.flags,
               now);
  }
}

void HealthChecker::onTcpReply(int family, const IpBytes& src, const IpBytes& dst,
                               std::uint16_t srcPort, std::uint16_t dstPort, std::uint32_t ack,
                               std::uint8_t flags, Millis now) noexcept {
  const auto it = encapByPort_.find(dstPort);
  if (it == encapByPort_.end()) return;
  Entry& e = *it->second;
  if (!e.target.encap) return;
  const EncapProbeTarget& p = *e.target.encap;
  const IpAddress inner = p.innerSource.value_or(p.tunnelSource);
  if (familyOf(p.vip.version) != family || src != p.vip.bytes || dst != inner.bytes ||
      srcPort != e.encapVipPort) {
    return;
  }
  const bool synAck = (flags & (kTcpSyn | kTcpAck)) == (kTcpSyn | kTcpAck);
  const bool rst = (flags & kTcpRst) != 0;
  if (!(synAck || rst) || (flags & kTcpAck) == 0 || ack != e.encapSeq + 1) return;
  finishProbe(e, now, true, fineNow() - e.probeStartFine, {});
}

void HealthChecker::closeRaw() noexcept {
  raw_.reset();
}

}  // namespace spillway
