// spillway-delayline: a WAN delay line for the failover drills (the test
// kernels have no netem).
//
//   spillway-delayline run --a IFACE_A --b IFACE_B [--delay-ms D] [--jitter-ms J]
//                          [--loss P] [--seed N] [--control PATH] [--ready PATH]
//                          [--queue-limit N]
//   spillway-delayline set  --control PATH [--delay-ms D] [--jitter-ms J] [--loss P]
//   spillway-delayline show --control PATH
//
// `run` bridges every Ethernet frame between two interfaces of the current
// network namespace through AF_PACKET raw sockets, one per interface (bound to
// its ifindex, promiscuous, blind to its own transmissions). Each direction
// (a->b, b->a) has its own queue and PRNG. A frame arriving at time t is lost
// with probability `loss`; otherwise it leaves at
//   max(t + delay + uniform(-jitter, +jitter), t, release of the previous frame)
// Each direction stays FIFO: jitter that reordered frames would make TCP see
// spurious reordering (dup-ACKs, fast retransmits) that a real WAN path with
// queueing jitter rarely shows, so a frame whose draw lands before its
// predecessor waits for it. The cost is that lowering the delay takes effect
// only once the frames queued under the old one have left.
//
// One thread: ppoll over both packet sockets, the control socket and a
// signalfd for SIGINT/SIGTERM, with the timeout set to the next release at
// nanosecond resolution (timer slack lowered to 1 us). The signalfd rather
// than ppoll's signal mask: under a steady stream ppoll always has a ready
// descriptor and would never deliver the signal. Arrival is stamped when the
// frame is read, so a stalled process only ever adds delay.
//
// Control: a Unix datagram socket answering `set key=value ...` (delay_ms,
// jitter_ms, loss; all checked before any is applied) with `ok` or
// `error: ...`, and `show` with one JSON object of the settings and counters.
// New settings apply to frames arriving after the change. Besides the drills'
// fields, `show` reports oversize_drops (frames over 9216 bytes) and rx_drops
// (frames the kernel dropped before the delay line read them). The `set` and `show`
// subcommands are its client; they bind a path in the temporary directory,
// since an abstract name would tie them to the delay line's network namespace.
//
// Frames cross as the packet socket shows them: with checksum or segmentation
// offloads on, the far side would get partial checksums or oversized frames,
// so the drills turn offloads off. This is a test tool, not the fast path:
// each queued frame is its own heap buffer.
//
// Exit codes: 0 ok, 1 error (bad value, error reply, no reply), 2 usage.
#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "spillway/errno_text.hpp"
#include "spillway/unique_fd.hpp"

namespace spillway {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

constexpr std::size_t kMaxFrameBytes = 9216;
constexpr std::size_t kVlanTagBytes = 4;
constexpr std::size_t kMacPairBytes = 12;
constexpr std::size_t kDefaultQueueLimit = 100000;
constexpr double kMaxDelayMs = 3'600'000.0;
constexpr std::int64_t kNsPerMs = 1'000'000;
constexpr std::int64_t kNsPerSecond = 1'000'000'000;
constexpr unsigned long kTimerSlackNs = 1000;
constexpr int kSocketBufferBytes = 8 << 20;
constexpr int kReadBatch = 64;
constexpr int kReplyTimeoutMs = 2000;
constexpr std::size_t kMaxDatagramBytes = 4096;
constexpr std::uint16_t kVlanTpid = 0x8100;

std::int64_t monotonicNs() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<std::int64_t>(now.tv_sec) * kNsPerSecond + now.tv_nsec;
}

// --- settings ------------------------------------------------------------------

struct Impairment {
  double delayMs = 0.0;
  double jitterMs = 0.0;
  double loss = 0.0;
};

constexpr std::string_view kDelayKey = "delay_ms";
constexpr std::string_view kJitterKey = "jitter_ms";
constexpr std::string_view kLossKey = "loss";

// Parses and range-checks one setting into `settings`. Returns the error
// (without the "error: " prefix), or nothing when the value was taken.
std::optional<std::string> applySetting(std::string_view key, std::string_view text,
                                        Impairment& settings) {
  double* target = nullptr;
  if (key == kDelayKey) {
    target = &settings.delayMs;
  } else if (key == kJitterKey) {
    target = &settings.jitterMs;
  } else if (key == kLossKey) {
    target = &settings.loss;
  } else {
    return "unknown key '" + std::string(key) + "' (expected delay_ms, jitter_ms or loss)";
  }
  double value = 0.0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc{} || ptr != end || !std::isfinite(value)) {
    return std::string(key) + ": '" + std::string(text) + "' is not a finite number";
  }
  if (value < 0.0) {
    return std::string(key) + " must not be negative, got " + std::string(text);
  }
  if (key == kLossKey && value > 1.0) {
    return "loss must be within [0, 1], got " + std::string(text);
  }
  if (key != kLossKey && value > kMaxDelayMs) {
    return std::string(key) + " must be at most " + std::to_string(kMaxDelayMs / 1000.0) +
           " s, got " + std::string(text) + " ms";
  }
  *target = value;
  return std::nullopt;
}

// Applies `key=value key=value ...` all or nothing.
std::optional<std::string> applySettings(std::string_view words, Impairment& settings) {
  Impairment candidate = settings;
  std::vector<std::string_view> seen;
  std::size_t pos = 0;
  while (true) {
    pos = words.find_first_not_of(" \t\r\n", pos);
    if (pos == std::string_view::npos) break;
    std::size_t end = words.find_first_of(" \t\r\n", pos);
    if (end == std::string_view::npos) end = words.size();
    const std::string_view word = words.substr(pos, end - pos);
    pos = end;
    const std::size_t eq = word.find('=');
    if (eq == std::string_view::npos) {
      return "expected key=value, got '" + std::string(word) + "'";
    }
    const std::string_view key = word.substr(0, eq);
    for (const std::string_view earlier : seen) {
      if (earlier == key) return "'" + std::string(key) + "' given twice";
    }
    seen.push_back(key);
    if (auto error = applySetting(key, word.substr(eq + 1), candidate)) return error;
  }
  if (seen.empty()) return "set needs at least one of delay_ms=, jitter_ms=, loss=";
  settings = candidate;
  return std::nullopt;
}

std::string formatNumber(double value) {
  std::array<char, 32> text{};
  const auto result = std::to_chars(text.data(), text.data() + text.size(), value);
  return std::string(text.data(), result.ptr);
}

// --- the delay line --------------------------------------------------------------

struct DirectionCounters {
  std::uint64_t forwarded = 0;
  std::uint64_t lost = 0;
  std::uint64_t queueDrops = 0;
  std::uint64_t sendErrors = 0;
  std::uint64_t oversizeDrops = 0;
};

struct QueuedFrame {
  std::int64_t releaseNs;
  std::vector<std::byte> bytes;
};

// One direction: frames read from one interface's socket wait here until
// their release time and then go out of the other interface's socket.
class Direction {
 public:
  Direction(std::string name, int txFd, std::uint64_t seed, std::uint64_t index,
            std::size_t queueLimit)
      : name_(std::move(name)), txFd_(txFd), queueLimit_(queueLimit) {
    std::seed_seq sequence{seed & 0xffffffffu, seed >> 32, index};
    random_.seed(sequence);
  }

  void accept(std::span<const std::byte> frame, std::int64_t arrivalNs,
              const Impairment& settings) {
    if (settings.loss > 0.0 && std::bernoulli_distribution(settings.loss)(random_)) {
      ++counters_.lost;
      return;
    }
    if (queue_.size() >= queueLimit_) {
      ++counters_.queueDrops;
      return;
    }
    double holdMs = settings.delayMs;
    if (settings.jitterMs > 0.0) {
      holdMs +=
          std::uniform_real_distribution<double>(-settings.jitterMs, settings.jitterMs)(random_);
    }
    std::int64_t releaseNs = arrivalNs;
    if (holdMs > 0.0) releaseNs += static_cast<std::int64_t>(std::llround(holdMs * kNsPerMs));
    releaseNs = std::max(releaseNs, lastReleaseNs_);
    lastReleaseNs_ = releaseNs;
    queue_.push_back(QueuedFrame{releaseNs, std::vector<std::byte>(frame.begin(), frame.end())});
  }

  void countOversize() { ++counters_.oversizeDrops; }

  void releaseDue(std::int64_t nowNs) {
    while (!queue_.empty() && queue_.front().releaseNs <= nowNs) {
      const std::vector<std::byte>& bytes = queue_.front().bytes;
      ssize_t sent;
      do {
        sent = ::send(txFd_, bytes.data(), bytes.size(), MSG_DONTWAIT);
      } while (sent < 0 && errno == EINTR);
      if (sent == static_cast<ssize_t>(bytes.size())) {
        ++counters_.forwarded;
      } else {
        if (counters_.sendErrors == 0) {
          const std::string why = sent < 0 ? errnoText(errno) : "short send";
          std::cerr << "spillway-delayline: " << name_ << ": send failed (" << why
                    << "); such frames are counted in send_errors\n";
        }
        ++counters_.sendErrors;
      }
      queue_.pop_front();
    }
  }

  std::optional<std::int64_t> nextReleaseNs() const {
    if (queue_.empty()) return std::nullopt;
    return queue_.front().releaseNs;
  }

  std::size_t queued() const { return queue_.size(); }
  const DirectionCounters& counters() const { return counters_; }

 private:
  std::string name_;
  int txFd_;
  std::size_t queueLimit_;
  std::mt19937_64 random_;
  std::deque<QueuedFrame> queue_;
  std::int64_t lastReleaseNs_ = 0;
  DirectionCounters counters_;
};

struct RunOptions {
  std::string ifaceA;
  std::string ifaceB;
  Impairment settings;
  std::uint64_t seed = 1;
  std::string controlPath;
  std::string readyPath;
  std::size_t queueLimit = kDefaultQueueLimit;
};

class DelayLineError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Removes a file this process created when it goes away, whichever way.
class OwnedPath {
 public:
  OwnedPath() = default;
  OwnedPath(const OwnedPath&) = delete;
  OwnedPath& operator=(const OwnedPath&) = delete;
  ~OwnedPath() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }

  void own(std::string path) { path_ = std::move(path); }

 private:
  std::string path_;
};

[[noreturn]] void failStartup(const std::string& what, int error) {
  throw DelayLineError(what + ": " + errnoText(error));
}

void setSocketBuffer(int fd, int forceOption, int option) {
  if (setsockopt(fd, SOL_SOCKET, forceOption, &kSocketBufferBytes, sizeof kSocketBufferBytes) < 0) {
    setsockopt(fd, SOL_SOCKET, option, &kSocketBufferBytes, sizeof kSocketBufferBytes);
  }
}

// A raw socket on one interface. Created with protocol 0 so that nothing is
// queued on it before bind narrows it to this ifindex.
UniqueFd openPacketSocket(const std::string& iface, bool& filterOutgoing) {
  const unsigned ifindex = if_nametoindex(iface.c_str());
  if (ifindex == 0) failStartup("interface '" + iface + "'", errno);
  UniqueFd fd(::socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) failStartup("AF_PACKET socket for '" + iface + "'", errno);
  setSocketBuffer(fd.get(), SO_RCVBUFFORCE, SO_RCVBUF);
  setSocketBuffer(fd.get(), SO_SNDBUFFORCE, SO_SNDBUF);
  const int one = 1;
  if (setsockopt(fd.get(), SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one) < 0) {
    filterOutgoing = true;  // pre-4.20 kernel: drop PACKET_OUTGOING frames by hand
  }
  if (setsockopt(fd.get(), SOL_PACKET, PACKET_AUXDATA, &one, sizeof one) < 0) {
    failStartup("PACKET_AUXDATA on '" + iface + "'", errno);
  }
  sockaddr_ll address{};
  address.sll_family = AF_PACKET;
  address.sll_protocol = htons(ETH_P_ALL);
  address.sll_ifindex = static_cast<int>(ifindex);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) < 0) {
    failStartup("bind to '" + iface + "'", errno);
  }
  packet_mreq membership{};
  membership.mr_ifindex = static_cast<int>(ifindex);
  membership.mr_type = PACKET_MR_PROMISC;
  if (setsockopt(fd.get(), SOL_PACKET, PACKET_ADD_MEMBERSHIP, &membership, sizeof membership) < 0) {
    failStartup("promiscuous mode on '" + iface + "'", errno);
  }
  return fd;
}

bool fillUnixAddress(const std::string& path, sockaddr_un& address) {
  address = {};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof address.sun_path) return false;
  std::memcpy(address.sun_path, path.data(), path.size());
  return true;
}

UniqueFd openControlSocket(const std::string& path) {
  sockaddr_un address{};
  if (!fillUnixAddress(path, address)) {
    throw DelayLineError("control path '" + path + "' is empty or longer than " +
                         std::to_string(sizeof address.sun_path - 1) + " bytes");
  }
  struct stat existing {};
  if (::lstat(path.c_str(), &existing) == 0) {
    if (!S_ISSOCK(existing.st_mode)) {
      throw DelayLineError("control path '" + path + "' exists and is not a socket");
    }
    UniqueFd probe(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (probe.valid() &&
        ::connect(probe.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0) {
      throw DelayLineError("control socket '" + path + "' is in use by another process");
    }
    ::unlink(path.c_str());  // left behind by a run that did not exit cleanly
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) failStartup("control socket", errno);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) < 0) {
    failStartup("bind control socket '" + path + "'", errno);
  }
  return fd;
}

void writeReadyFile(const std::string& path) {
  const std::string temporary = path + ".tmp";
  FILE* file = std::fopen(temporary.c_str(), "w");
  if (file == nullptr) failStartup("ready file '" + temporary + "'", errno);
  std::fprintf(file, "%d\n", static_cast<int>(::getpid()));
  if (std::fclose(file) != 0) failStartup("ready file '" + temporary + "'", errno);
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    failStartup("ready file '" + path + "'", errno);
  }
}

class DelayLine {
 public:
  explicit DelayLine(RunOptions options)
      : options_(std::move(options)), settings_(options_.settings) {}

  int run();

 private:
  void readFrames(int rxFd, const std::string& iface, Direction& direction);
  void clearSocketError(int fd, const std::string& iface);
  void serveControl();
  void collectRxDrops();
  std::string showJson() const;

  RunOptions options_;
  Impairment settings_;
  UniqueFd socketA_;
  UniqueFd socketB_;
  UniqueFd control_;
  bool filterOutgoing_ = false;
  std::optional<Direction> ab_;
  std::optional<Direction> ba_;
  std::uint64_t rxDrops_ = 0;
  int stopSignal_ = 0;
  std::vector<std::byte> frame_ = std::vector<std::byte>(kMaxFrameBytes + kVlanTagBytes);
};

std::string DelayLine::showJson() const {
  const DirectionCounters& ab = ab_->counters();
  const DirectionCounters& ba = ba_->counters();
  const nlohmann::ordered_json json = {{"delay_ms", settings_.delayMs},
                                       {"jitter_ms", settings_.jitterMs},
                                       {"loss", settings_.loss},
                                       {"forwarded_ab", ab.forwarded},
                                       {"forwarded_ba", ba.forwarded},
                                       {"lost_ab", ab.lost},
                                       {"lost_ba", ba.lost},
                                       {"queue_drops", ab.queueDrops + ba.queueDrops},
                                       {"send_errors", ab.sendErrors + ba.sendErrors},
                                       {"queued_ab", ab_->queued()},
                                       {"queued_ba", ba_->queued()},
                                       {"oversize_drops", ab.oversizeDrops + ba.oversizeDrops},
                                       {"rx_drops", rxDrops_}};
  return json.dump();
}

// Reads up to a batch of frames, restoring an 802.1Q tag the kernel moved
// into the metadata so that the far side sees the frame as it was sent.
void DelayLine::readFrames(int rxFd, const std::string& iface, Direction& direction) {
  for (int i = 0; i < kReadBatch; ++i) {
    sockaddr_ll from{};
    alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(tpacket_auxdata))> control{};
    iovec vector{frame_.data() + kVlanTagBytes, kMaxFrameBytes};
    msghdr message{};
    message.msg_name = &from;
    message.msg_namelen = sizeof from;
    message.msg_iov = &vector;
    message.msg_iovlen = 1;
    message.msg_control = control.data();
    message.msg_controllen = control.size();
    const ssize_t got = ::recvmsg(rxFd, &message, MSG_TRUNC | MSG_DONTWAIT);
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        std::cerr << "spillway-delayline: receive on " << iface << ": " << errnoText(errno) << "\n";
      }
      return;
    }
    const std::int64_t arrivalNs = monotonicNs();
    if (filterOutgoing_ && from.sll_pkttype == PACKET_OUTGOING) continue;
    auto length = static_cast<std::size_t>(got);
    if (length > kMaxFrameBytes || (message.msg_flags & MSG_TRUNC) != 0) {
      direction.countOversize();
      continue;
    }
    std::byte* start = frame_.data() + kVlanTagBytes;
    for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr;
         header = CMSG_NXTHDR(&message, header)) {
      if (header->cmsg_level != SOL_PACKET || header->cmsg_type != PACKET_AUXDATA) continue;
      tpacket_auxdata aux{};
      std::memcpy(&aux, CMSG_DATA(header), sizeof aux);
      if ((aux.tp_status & TP_STATUS_VLAN_VALID) == 0 || length < kMacPairBytes) continue;
      const std::uint16_t tpid =
          (aux.tp_status & TP_STATUS_VLAN_TPID_VALID) != 0 ? aux.tp_vlan_tpid : kVlanTpid;
      const std::array<std::uint16_t, 2> tag{htons(tpid), htons(aux.tp_vlan_tci)};
      std::memmove(start - kVlanTagBytes, start, kMacPairBytes);
      start -= kVlanTagBytes;
      std::memcpy(start + kMacPairBytes, tag.data(), kVlanTagBytes);
      length += kVlanTagBytes;
    }
    direction.accept(std::span<const std::byte>(start, length), arrivalNs, settings_);
  }
}

void DelayLine::clearSocketError(int fd, const std::string& iface) {
  int error = 0;
  socklen_t size = sizeof error;
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size);
  if (error != 0) {
    std::cerr << "spillway-delayline: socket error on " << iface << ": " << errnoText(error)
              << "\n";
  }
}

// The kernel's count resets on each read, so it is added up here.
void DelayLine::collectRxDrops() {
  for (const int fd : {socketA_.get(), socketB_.get()}) {
    tpacket_stats stats{};
    socklen_t size = sizeof stats;
    if (getsockopt(fd, SOL_PACKET, PACKET_STATISTICS, &stats, &size) == 0) {
      rxDrops_ += stats.tp_drops;
    }
  }
}

void DelayLine::serveControl() {
  std::array<char, kMaxDatagramBytes> buffer{};
  while (true) {
    sockaddr_un peer{};
    socklen_t peerSize = sizeof peer;
    const ssize_t got = ::recvfrom(control_.get(), buffer.data(), buffer.size(), MSG_DONTWAIT,
                                   reinterpret_cast<sockaddr*>(&peer), &peerSize);
    if (got < 0) {
      if (errno == EINTR) continue;
      return;
    }
    std::string_view request(buffer.data(), static_cast<std::size_t>(got));
    while (!request.empty() && (request.back() == '\n' || request.back() == '\r')) {
      request.remove_suffix(1);
    }
    std::string reply;
    const std::string_view verb = request.substr(0, request.find(' '));
    if (request == "show") {
      collectRxDrops();
      reply = showJson();
    } else if (verb == "set") {
      const auto error = applySettings(request.substr(verb.size()), settings_);
      reply = error ? "error: " + *error : "ok";
      if (!error) {
        std::cerr << "spillway-delayline: now delay_ms=" << formatNumber(settings_.delayMs)
                  << " jitter_ms=" << formatNumber(settings_.jitterMs)
                  << " loss=" << formatNumber(settings_.loss) << "\n";
      }
    } else {
      reply = "error: unknown command '" + std::string(verb) + "' (expected set or show)";
    }
    if (peerSize > sizeof(sa_family_t)) {
      ::sendto(control_.get(), reply.data(), reply.size(), MSG_DONTWAIT,
               reinterpret_cast<const sockaddr*>(&peer), peerSize);
    }
  }
}

int DelayLine::run() {
  if (options_.ifaceA == options_.ifaceB) {
    throw DelayLineError("--a and --b must be different interfaces");
  }
  sigset_t stopSignals;
  sigemptyset(&stopSignals);
  sigaddset(&stopSignals, SIGINT);
  sigaddset(&stopSignals, SIGTERM);
  sigprocmask(SIG_BLOCK, &stopSignals, nullptr);
  const UniqueFd signals(::signalfd(-1, &stopSignals, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!signals.valid()) failStartup("signalfd", errno);
  prctl(PR_SET_TIMERSLACK, kTimerSlackNs, 0, 0, 0);

  socketA_ = openPacketSocket(options_.ifaceA, filterOutgoing_);
  socketB_ = openPacketSocket(options_.ifaceB, filterOutgoing_);
  ab_.emplace(options_.ifaceA + "->" + options_.ifaceB, socketB_.get(), options_.seed, 0,
              options_.queueLimit);
  ba_.emplace(options_.ifaceB + "->" + options_.ifaceA, socketA_.get(), options_.seed, 1,
              options_.queueLimit);
  OwnedPath controlFile;
  OwnedPath readyFile;
  if (!options_.controlPath.empty()) {
    control_ = openControlSocket(options_.controlPath);
    controlFile.own(options_.controlPath);
  }
  if (!options_.readyPath.empty()) {
    writeReadyFile(options_.readyPath);
    readyFile.own(options_.readyPath);
  }
  std::cerr << "spillway-delayline: bridging " << options_.ifaceA << " <-> " << options_.ifaceB
            << " delay_ms=" << formatNumber(settings_.delayMs)
            << " jitter_ms=" << formatNumber(settings_.jitterMs)
            << " loss=" << formatNumber(settings_.loss) << " seed=" << options_.seed << "\n";

  std::array<pollfd, 4> fds{};
  fds[0] = {socketA_.get(), POLLIN, 0};
  fds[1] = {socketB_.get(), POLLIN, 0};
  fds[2] = {control_.valid() ? control_.get() : -1, POLLIN, 0};
  fds[3] = {signals.get(), POLLIN, 0};
  while (stopSignal_ == 0) {
    const std::int64_t nowNs = monotonicNs();
    ab_->releaseDue(nowNs);
    ba_->releaseDue(nowNs);
    std::optional<std::int64_t> nextNs = ab_->nextReleaseNs();
    if (const auto other = ba_->nextReleaseNs(); other && (!nextNs || *other < *nextNs)) {
      nextNs = other;
    }
    timespec timeout{};
    if (nextNs) {
      const std::int64_t waitNs = std::max<std::int64_t>(0, *nextNs - monotonicNs());
      timeout.tv_sec = static_cast<time_t>(waitNs / kNsPerSecond);
      timeout.tv_nsec = static_cast<long>(waitNs % kNsPerSecond);
    }
    const int ready = ::ppoll(fds.data(), fds.size(), nextNs ? &timeout : nullptr, nullptr);
    if (ready < 0) {
      if (errno == EINTR) continue;
      throw DelayLineError("ppoll: " + errnoText(errno));
    }
    if (ready == 0) continue;
    if ((fds[0].revents & POLLERR) != 0) clearSocketError(socketA_.get(), options_.ifaceA);
    if ((fds[1].revents & POLLERR) != 0) clearSocketError(socketB_.get(), options_.ifaceB);
    if ((fds[0].revents & POLLIN) != 0) readFrames(socketA_.get(), options_.ifaceA, *ab_);
    if ((fds[1].revents & POLLIN) != 0) readFrames(socketB_.get(), options_.ifaceB, *ba_);
    if ((fds[2].revents & POLLIN) != 0) serveControl();
    if ((fds[3].revents & POLLIN) != 0) {
      signalfd_siginfo info{};
      if (::read(signals.get(), &info, sizeof info) == sizeof info) {
        stopSignal_ = static_cast<int>(info.ssi_signo);
      }
    }
  }

  collectRxDrops();
  std::cerr << "spillway-delayline: stopping on " << strsignal(stopSignal_) << "\n";
  std::cout << showJson() << std::endl;
  return kExitOk;
}

// --- the client --------------------------------------------------------------------

// The client's reply address. A path in the temporary directory rather than
// an abstract name: abstract names belong to a network namespace, and the
// client often runs outside the namespace of the delay line it talks to.
class ClientAddress {
 public:
  explicit ClientAddress(int fd) {
    std::error_code error;
    const std::filesystem::path directory = std::filesystem::temp_directory_path(error);
    const std::string name = "spillway-delayline." + std::to_string(::getpid()) + "." +
                             std::to_string(monotonicNs()) + ".sock";
    sockaddr_un address{};
    if (!error && fillUnixAddress((directory / name).string(), address) &&
        ::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0) {
      path_ = (directory / name).string();
      bound_ = true;
      return;
    }
    address = {};
    address.sun_family = AF_UNIX;  // autobind: an abstract name in this namespace
    bound_ = ::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(sa_family_t)) == 0;
  }
  ClientAddress(const ClientAddress&) = delete;
  ClientAddress& operator=(const ClientAddress&) = delete;
  ~ClientAddress() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }

  bool bound() const { return bound_; }

 private:
  std::string path_;
  bool bound_ = false;
};

int askControl(const std::string& path, const std::string& request) {
  sockaddr_un server{};
  if (!fillUnixAddress(path, server)) {
    std::cerr << "spillway-delayline: error: control path '" << path << "' is empty or too long\n";
    return kExitError;
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    std::cerr << "spillway-delayline: error: client socket: " << errnoText(errno) << "\n";
    return kExitError;
  }
  const ClientAddress self(fd.get());
  if (!self.bound()) {
    std::cerr << "spillway-delayline: error: binding the client socket: " << errnoText(errno)
              << "\n";
    return kExitError;
  }
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&server), sizeof server) < 0 ||
      ::send(fd.get(), request.data(), request.size(), 0) < 0) {
    std::cerr << "spillway-delayline: error: cannot reach control socket '" << path
              << "': " << errnoText(errno) << "\n";
    return kExitError;
  }
  const std::int64_t deadlineNs = monotonicNs() + std::int64_t{kReplyTimeoutMs} * kNsPerMs;
  std::array<char, kMaxDatagramBytes> buffer{};
  while (true) {
    const std::int64_t leftNs = deadlineNs - monotonicNs();
    pollfd wait{fd.get(), POLLIN, 0};
    const int ready =
        leftNs > 0 ? ::poll(&wait, 1, static_cast<int>((leftNs + kNsPerMs - 1) / kNsPerMs)) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      std::cerr << "spillway-delayline: error: no reply from '" << path << "' within "
                << kReplyTimeoutMs / 1000 << " s\n";
      return kExitError;
    }
    const ssize_t got = ::recv(fd.get(), buffer.data(), buffer.size(), MSG_DONTWAIT);
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      std::cerr << "spillway-delayline: error: reading reply from '" << path
                << "': " << errnoText(errno) << "\n";
      return kExitError;
    }
    const std::string reply(buffer.data(), static_cast<std::size_t>(got));
    if (reply.starts_with("error")) {
      std::cerr << "spillway-delayline: " << reply << "\n";
      return kExitError;
    }
    std::cout << reply << std::endl;
    return kExitOk;
  }
}

struct SettingOptions {
  std::optional<std::string> delayMs;
  std::optional<std::string> jitterMs;
  std::optional<std::string> loss;

  void add(CLI::App& command) {
    command.add_option("--delay-ms", delayMs, "One-way delay in ms (fractions allowed)")
        ->type_name("MS");
    command
        .add_option("--jitter-ms", jitterMs,
                    "Uniform jitter in ms: each frame gets delay +/- up to this")
        ->type_name("MS");
    command.add_option("--loss", loss, "Probability in [0, 1] that a frame is dropped")
        ->type_name("P");
  }

  // Validates into `settings` and returns the `key=value` words; on a bad
  // value prints the error and returns nothing.
  std::optional<std::string> collect(Impairment& settings) const {
    std::string words;
    const std::array<std::pair<std::string_view, const std::optional<std::string>*>, 3> given{
        {{kDelayKey, &delayMs}, {kJitterKey, &jitterMs}, {kLossKey, &loss}}};
    for (const auto& [key, value] : given) {
      if (!value->has_value()) continue;
      if (auto error = applySetting(key, **value, settings)) {
        std::cerr << "spillway-delayline: error: " << *error << "\n";
        return std::nullopt;
      }
      words += " " + std::string(key) + "=" + **value;
    }
    return words;
  }
};

int runMain(int argc, char** argv) {
  CLI::App app{"spillway-delayline: an L2 delay line (delay, jitter, loss) between two interfaces"};
  app.require_subcommand(1);

  RunOptions runOptions;
  SettingOptions runSettings;
  CLI::App* run = app.add_subcommand("run", "Bridge two interfaces through the delay line");
  run->add_option("--a", runOptions.ifaceA, "First interface")->required()->type_name("IFACE");
  run->add_option("--b", runOptions.ifaceB, "Second interface")->required()->type_name("IFACE");
  runSettings.add(*run);
  std::string seed = std::to_string(runOptions.seed);
  run->add_option("--seed", seed, "Seed of the loss and jitter PRNGs (0 to 2^64-1)")
      ->type_name("N")
      ->capture_default_str();
  run->add_option("--control", runOptions.controlPath, "Unix datagram control socket to create")
      ->type_name("PATH");
  run->add_option("--ready", runOptions.readyPath,
                  "File created once the sockets are bound and the control socket listens")
      ->type_name("PATH");
  std::int64_t queueLimit = kDefaultQueueLimit;
  run->add_option("--queue-limit", queueLimit,
                  "Frames held per direction; more are counted in queue_drops")
      ->capture_default_str();

  std::string setPath;
  SettingOptions setSettings;
  CLI::App* set = app.add_subcommand("set", "Change the settings of a running delay line");
  set->add_option("--control", setPath, "Control socket of the running delay line")->required();
  setSettings.add(*set);

  std::string showPath;
  CLI::App* show = app.add_subcommand("show", "Print settings and counters as one JSON object");
  show->add_option("--control", showPath, "Control socket of the running delay line")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }

  if (*show) return askControl(showPath, "show");
  if (*set) {
    Impairment scratch;
    const auto words = setSettings.collect(scratch);
    if (!words) return kExitError;
    if (words->empty()) {
      std::cerr << "spillway-delayline: error: set needs at least one of --delay-ms, "
                   "--jitter-ms, --loss\n";
      return kExitUsage;
    }
    return askControl(setPath, "set" + *words);
  }
  if (!runSettings.collect(runOptions.settings)) return kExitError;
  if (queueLimit < 1) {
    std::cerr << "spillway-delayline: error: --queue-limit must be at least 1 frame, got "
              << queueLimit << "\n";
    return kExitError;
  }
  runOptions.queueLimit = static_cast<std::size_t>(queueLimit);
  const char* seedEnd = seed.data() + seed.size();
  if (const auto [ptr, ec] = std::from_chars(seed.data(), seedEnd, runOptions.seed);
      seed.empty() || ec != std::errc{} || ptr != seedEnd) {
    std::cerr << "spillway-delayline: error: --seed must be an integer in [0, 2^64-1], got '"
              << seed << "'\n";
    return kExitError;
  }
  try {
    return DelayLine(std::move(runOptions)).run();
  } catch (const DelayLineError& e) {
    std::cerr << "spillway-delayline: error: " << e.what() << "\n";
    return kExitError;
  }
}

}  // namespace
}  // namespace spillway

int main(int argc, char** argv) {
  return spillway::runMain(argc, argv);
}
