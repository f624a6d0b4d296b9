// Active health checks of backends, run from the control thread through the
// kernel's sockets: TCP connect, HTTP GET with an expected status, and a probe
// through the encapsulation path.
//
// Damping as in HAProxy and GLB's glb-healthcheck: a backend starts up (no
// flapping while the daemon starts), goes down after `fall` consecutive
// failures and comes back after `rise` consecutive successes; each flip is a
// HealthTransition with its cause. Probes of one backend never overlap: one
// starts every `interval` from the start of the previous one, or when it ends
// if it ran longer; a probe fails when it has no result `timeout` after its
// start. With the on-prem defaults (interval 200 ms, timeout 150 ms, fall 3)
// a backend that dies just after a successful probe is down 200 + 2 * 200 +
// 150 = 750 ms later at worst, 600 ms when its port refuses. RTT is the TCP
// handshake time (the SYN-ACK's through the tunnel for Encap), measured with a
// real monotonic clock, not with `now`, filtered, then smoothed as TCP smooths
// its own (RFC 6298, section 2): SRTT and RTTVAR with alpha 1/8 and beta 1/4,
// the first sample R giving SRTT = R and RTTVAR = R/2. The samples are the
// median of the latest three probe RTTs (RttFilter), so one late probe (the
// host stalled the control thread, the first probe resolved a neighbour)
// never reaches the estimate: RTTVAR x 4 would turn one 100 ms outlier on a
// 0.3 ms LAN into a score above 20 ms for over a second, long enough to mark
// a healthy backend degraded. A real change reaches it after two probes. The
// latency score SRTT + 4 * RTTVAR (TCP's RTO without its clock granularity)
// is what the policy compares (policy.hpp, "Latency"); it is unknown until
// three probes succeeded. Only successful probes are samples: a timed-out
// probe has no RTT (Karn's rule), and failures are the rise/fall machine's
// business.
//
// The encapsulation probe proves that a backend decapsulates and answers for
// a VIP: an inner TCP SYN from our tunnel source (a random high port, a random
// sequence number) to vip:port is encapsulated for the backend with the data
// path's own encapsulateAny() and sent through a raw IP socket (IPPROTO_RAW);
// a raw TCP socket watches for the answer from vip:port to that port. A
// SYN-ACK or a RST acknowledging our sequence number is success: the backend
// took the packet out of the tunnel and its TCP stack answered for the VIP
// (our kernel resets the SYN-ACK, having no socket for it). This needs
// CAP_NET_RAW and the tunnel source must be an address of this host that the
// backend's answers reach; without the capability the probe fails and says so.
//
// Thread contract: one thread (the control thread) owns a HealthChecker and
// calls everything on it; it waits on pollFd() (an epoll fd that is readable
// when a probe has progressed) and calls poll(now) when it is readable or
// nextDeadline() has come. poll() never blocks. No threads, no exceptions
// escape; time is injected as `now`.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "control/config/config.hpp"
#include "spillway/encap.hpp"
#include "spillway/flow_table.hpp"

namespace spillway {

// What the encapsulation probe needs besides the backend's address.
struct EncapProbeTarget {
  IpAddress vip;
  std::uint16_t vipPort = 0;  // a port the VIP serves; 0: the check's config.port
  IpAddress tunnelSource;     // our tunnel endpoint (outer source), of the outer family
  // The inner packet's source: defaults to tunnelSource, which must then be
  // of the VIP's family. Answers come back to it.
  std::optional<IpAddress> innerSource;
  EncapKind kind = EncapKind::IpInIp4;
  std::uint16_t guePort = kGueDefaultPort;

  friend bool operator==(const EncapProbeTarget&, const EncapProbeTarget&) = default;
};

struct HealthTarget {
  std::uint64_t id = 0;
  std::string name;
  IpAddress address;  // what is probed: the backend's (tunnel) address
  HealthCheckConfig config;
  std::optional<EncapProbeTarget> encap;  // required when config.kind is Encap
};

// RFC 6298's smoothed round-trip time and its variation, in milliseconds.
struct RttEstimate {
  double srttMs = 0;
  double rttVarMs = 0;
  // SRTT + 4 * RTTVAR: a round trip that is long or unsteady scores high.
  [[nodiscard]] double scoreMs() const noexcept { return srttMs + 4.0 * rttVarMs; }
};
inline constexpr double kRttAlpha = 1.0 / 8.0;
inline constexpr double kRttBeta = 1.0 / 4.0;
// The estimate after one more sample R (RFC 6298 2.2 and 2.3): RTTVAR first,
// from the SRTT before this sample, then SRTT.
[[nodiscard]] RttEstimate nextRttEstimate(const std::optional<RttEstimate>& before,
                                          double sampleMs) noexcept;

// The estimate of one backend from its probe RTTs: RFC 6298 over the median
// of the latest three, nothing before the third.
class RttFilter {
 public:
  // Takes one probe's RTT; returns the estimate after it.
  const std::optional<RttEstimate>& add(double sampleMs) noexcept;
  [[nodiscard]] const std::optional<RttEstimate>& estimate() const noexcept { return rtt_; }

 private:
  std::array<double, 3> latest_{};
  std::size_t count_ = 0;  // samples in latest_, at most 3
  std::size_t next_ = 0;   // where the next sample goes
  std::optional<RttEstimate> rtt_;
};

struct HealthStatus {
  bool up = true;
  std::uint32_t consecutiveOk = 0;
  std::uint32_t consecutiveFail = 0;
  std::string lastError;             // of the latest failure; kept after recovery
  std::optional<RttEstimate> rtt;    // of the successful probes (RttFilter)
  std::optional<double> rttMs;       // rtt->srttMs, for the views that show one RTT
  std::optional<double> lastRttMs;   // of the latest successful probe
  std::optional<Millis> lastProbe;   // when the latest probe ended
  std::optional<Millis> lastChange;  // when up last flipped
  std::uint64_t probes = 0;          // ended probes
  std::uint64_t failures = 0;
};

struct HealthTransition {
  std::uint64_t id = 0;
  std::string name;
  bool up = false;
  std::string cause;  // "3 consecutive failures: connect: Connection refused"
  Millis at = 0;
};

// The rise/fall state machine and RTT smoothing of one backend; no I/O.
class HealthState {
 public:
  HealthState(std::uint32_t rise, std::uint32_t fall) noexcept;

  // Each returns the transition's cause when the result flips up/down.
  std::optional<std::string> onSuccess(Millis now, double rttMs);
  std::optional<std::string> onFailure(Millis now, std::string_view error);

  void setDamping(std::uint32_t rise, std::uint32_t fall) noexcept;
  // Up at once, whatever the counters say (the check was turned off).
  std::optional<std::string> forceUp(Millis now, std::string_view why);
  [[nodiscard]] const HealthStatus& status() const noexcept { return status_; }

 private:
  std::uint32_t rise_;
  std::uint32_t fall_;
  RttFilter rtt_;
  HealthStatus status_{};
};

struct HealthCheckerOptions {
  // Spread the first probes of new targets over one interval (by id), so a
  // thousand backends are not probed in the same millisecond.
  bool staggerStart = true;
  std::uint64_t randomSeed = 0;      // encap probe ports and sequence numbers; 0: random
  std::function<double()> rttClock;  // monotonic ms; empty: std::chrono::steady_clock
};

class HealthChecker {
 public:
  explicit HealthChecker(HealthCheckerOptions options = {});
  ~HealthChecker();
  HealthChecker(const HealthChecker&) = delete;
  HealthChecker& operator=(const HealthChecker&) = delete;

  // Empty when the checker works; otherwise why its epoll fd could not be made.
  [[nodiscard]] const std::string& initError() const noexcept { return initError_; }

  // Replaces the set of targets. A target whose id, address, check and encap
  // probe are unchanged keeps its state and schedule; one whose id and
  // address are unchanged keeps its up/down state and counters; any other is
  // new and starts up. Removed targets' probes are aborted. New targets are
  // first probed at the next poll() (staggered, see the options).
  void setTargets(std::vector<HealthTarget> targets);

  [[nodiscard]] int pollFd() const noexcept { return epollFd_; }
  // Takes what the sockets report, fails probes past their timeout, starts
  // the probes that are due. Never blocks.
  void poll(Millis now) noexcept;
  // When poll() next has something to do without any socket event (a probe's
  // timeout or start); std::nullopt when nothing is scheduled. It may be in
  // the past (new targets, a late loop): poll at once then.
  [[nodiscard]] std::optional<Millis> nextDeadline() const noexcept;

  [[nodiscard]] std::vector<HealthTransition> takeTransitions();
  [[nodiscard]] std::optional<HealthStatus> status(std::uint64_t id) const;
  [[nodiscard]] std::size_t targetCount() const noexcept { return entries_.size(); }
  [[nodiscard]] std::size_t probesInFlight() const noexcept;

 private:
  struct Entry;
  struct RawSockets;

  void startProbe(Entry& e, Millis now) noexcept;
  // Returns an error when the probe could not be sent.
  std::string startEncapProbe(Entry& e);
  void finishProbe(Entry& e, Millis now, bool ok, double rttMs, std::string_view error) noexcept;
  void onExchangeFinished(Entry& e, Millis now) noexcept;
  void abortProbe(Entry& e) noexcept;
  void onExchangeEvent(Entry& e, std::uint32_t events, Millis now) noexcept;
  void drainRaw(int family, Millis now) noexcept;
  void onTcpReply(int family, const IpBytes& src, const IpBytes& dst, std::uint16_t srcPort,
                  std::uint16_t dstPort, std::uint32_t ack, std::uint8_t flags,
                  Millis now) noexcept;
  bool ensureRaw(int family, std::string& error) noexcept;
  void closeRaw() noexcept;
  double fineNow() const;

  HealthCheckerOptions options_;
  std::string initError_;
  int epollFd_ = -1;
  std::vector<std::unique_ptr<Entry>> entries_;
  std::unordered_map<std::uint64_t, Entry*> byId_;
  std::unordered_map<std::uint64_t, Entry*> byTag_;
  std::unordered_map<std::uint16_t, Entry*> encapByPort_;  // in-flight encap probes by source port
  std::uint64_t nextTag_;
  std::unique_ptr<RawSockets> raw_;
  std::mt19937_64 rng_;
  std::vector<HealthTransition> transitions_;
};

}  // namespace spillway
