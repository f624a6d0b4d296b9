// The peer channel of an LB tier: the spillwayd instances behind one ECMP
// group share their flow exceptions (flow_exceptions.hpp), so an instance
// that receives a flow it never saw (an instance died, joined, or the router
// rehashed the survivors) sends it to the backend it already has.
//
// Shape (IPVS's sync daemon and conntrackd are the anchors). Both replicate
// per-connection state between directors; Spillway differs in three ways:
//   - only exceptions travel: a flow that the table still gives its backend
//     needs nothing (every instance builds the same Maglev tables from the
//     same ids, weights and seed), so the traffic is proportional to moved
//     entries, not to new connections;
//   - a record names the flow by its keyed hash and the backend by id (16
//     bytes, the checkpoint's encoding), not the 5-tuple and a real server
//     address; no per-packet or per-connection message on the data path;
//   - TCP between configured peers with a shared-secret handshake and a MAC
//     on every frame (IPVS sync is unauthenticated multicast or UDP;
//     conntrackd relies on a dedicated link), every buffer bounded.
//
// Each instance connects out to every peer and sends its own exceptions on
// that connection (a full dump, then deltas after each export); it only
// receives on the connections peers make to it. Heartbeats every second both
// ways; a connection without a frame for 3 s is dropped and reconnected (the
// receiver keeps the peer's set for hold_time, then forgets it; a reconnect
// sends a full dump that replaces it). A slow peer (more than
// max_output_bytes unsent) is disconnected and later resynced with a dump
// streamed as its socket drains; it never blocks the control thread.
//
// Tier-wide operator intent (tier_intent.hpp) travels on the same
// connections: publishIntent() hands the channel this instance's intent, sent
// as a dump of Intent frames (intent_wire.hpp) to every peer when its
// connection comes up and again whenever the intent changes; each peer's
// complete dumps come back from takeIntent() for the control plane to merge.
// intentAgreement() says whether every reachable peer's last dump had this
// instance's digest (a joining instance announces only then).
//
// Table steps (make-before-break and the join gate, control_plane_step.cpp):
// noteStep() sends a Step frame (ms since this instance's last moving step)
// on every sending connection, again when one comes up and with every
// heartbeat; lastPeerStep() is the most recent step a connected peer
// reported. pushLocal()/localDelivered() let a held step wait until this
// instance's set has left the process for every connected peer.
//
// exceptions(): the peers' sets in the order their records were received,
// for the snapshot's ExceptionTable (of two records of one flow the later
// wins there: the most recently received).
//
// Thread contract: control thread only; poll() never blocks (non-blocking
// sockets; pollFd() for the daemon's epoll). Time is injected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "control/api/control_api.hpp"
#include "control/api/event_log.hpp"
#include "control/config/config.hpp"
#include "control/intent/tier_intent.hpp"
#include "control/sys/refusal_summary.hpp"
#include "control/tier/peer_wire.hpp"
#include "spillway/flow_exceptions.hpp"
#include "spillway/unique_fd.hpp"

namespace spillway {

class MetricsWriter;

inline constexpr const char* kEventPeer = "peer";  // peer up/down, refused, slow

struct PeerException {
  std::uint64_t hash = 0;
  std::uint64_t backendId = 0;
  FlowState state = FlowState::Established;
};

// A peer's complete intent dump.
struct PeerIntentDump {
  std::string peer;
  std::vector<TierIntentEntry> entries;
};

// Where the tier's intent stands for a joining instance.
struct IntentAgreement {
  bool agreed = true;                  // every reachable peer sent a dump with our digest
  bool divergent = false;              // a peer's last dump had another digest
  std::vector<std::string> waiting;    // reachable peers whose dump has not come
  std::vector<std::string> differing;  // peers whose digest differs
};

struct PeerChannelTimers {
  Millis heartbeat = 1000;
  Millis deadAfter = 3000;
  Millis handshakeTimeout = 3000;
  Millis reconnect = 1000;
};

class PeerChannel {
 public:
  PeerChannel(TierConfig config, std::uint64_t hashSeed, EventLog& events,
              PeerChannelTimers timers = {});
  ~PeerChannel();
  PeerChannel(const PeerChannel&) = delete;
  PeerChannel& operator=(const PeerChannel&) = delete;

  // Binds the listening socket; the error says why not (the channel still
  // connects out).
  [[nodiscard]] std::optional<std::string> open();
  [[nodiscard]] int pollFd() const noexcept { return epoll_.get(); }
  [[nodiscard]] std::uint16_t listenPort() const noexcept { return port_; }

  // Accepts, handshakes, reads, writes, times out, reconnects, expires held
  // sets. Bounded work per call.
  void poll(Millis now);

  // A reload's [tier] (node and listen unchanged: the caller refuses those).
  // Added peers are dialled; a removed peer is retired: its connections
  // close, it is refused like an unknown node, and the exceptions it sent
  // are held for hold_time like a down peer's (its flows may be arriving
  // here now), then forgotten; a peer whose address changed is redialled;
  // another secret closes every connection (each side redials with it);
  // the limits apply from now on.
  void reconfigure(const TierConfig& next, Millis now);

  // This instance's exceptions after an export: sent to every peer as the
  // difference from what it last got.
  void publishLocal(std::span<const FlowExceptionRecord> records);

  // Make-before-break (ControlPlane, control_plane_step.cpp): pushes the
  // local set's difference into every sending connection's socket now;
  // localDelivered() is true when every connected sending direction has
  // written all of this instance's current set to its socket (the kernel
  // holds what is left; there is no acknowledgement). sending(): how many
  // sending directions are connected.
  void pushLocal();
  [[nodiscard]] bool localDelivered() const;
  [[nodiscard]] std::size_t sending() const;

  // This instance published tables that moved Maglev entries at `now`: sent
  // to every peer at once, and again with every heartbeat (Step frames).
  void noteStep(Millis now);
  // The most recent table step a connected peer reported (its name and the
  // local time of the step); nullopt when none reported one.
  struct PeerStep {
    std::string peer;
    Millis at = 0;
  };
  [[nodiscard]] std::optional<PeerStep> lastPeerStep() const;

  // This instance's tier intent, sent to every peer (a dump per change).
  void publishIntent(std::vector<TierIntentEntry> entries, std::uint64_t digest);
  // The complete dumps received since the last call, in arrival order.
  std::vector<PeerIntentDump> takeIntent();
  [[nodiscard]] IntentAgreement intentAgreement() const;

  // True once after the union of the peers' sets changed.
  bool takeChanged() noexcept;
  // Every peer's records; a flow held from two peers appears twice, the more
  // recently received last.
  [[nodiscard]] std::vector<PeerException> exceptions() const;
  // What the caller did with exceptions(): records in the exception table,
  // and records ignored (backend unknown here, or not active/draining).
  void noteUse(std::size_t inUse, std::size_t ignored) noexcept {
    inUse_ = inUse;
    ignored_ = ignored;
  }

  [[nodiscard]] Json status(Millis now) const;
  void metrics(MetricsWriter& m, Millis now) const;

  // For tests: the named peer's directions are both connected.
  [[nodiscard]] bool connected(const std::string& peer) const;
  // Whether this instance holds what its live peers had: every peer has
  // either delivered a complete dump since this channel opened, or could not
  // be reached (an outbound attempt to it failed before its handshake ended
  // and nothing came from it). A joining instance announces only when synced
  // (ControlPlane::peersReady), or ECMP would hand it flows whose exceptions
  // it does not know yet.
  [[nodiscard]] bool synced() const;
  [[nodiscard]] std::size_t held(const std::string& peer) const;
  [[nodiscard]] std::size_t heldTotal() const;

 private:
  struct Held {
    std::uint64_t backendId = 0;
    FlowState state = FlowState::Established;
    std::uint64_t stamp = 0;  // receive order, for "most recent wins"
  };
  struct LocalRecord {
    std::uint64_t hash = 0;
    std::uint64_t backendId = 0;
    FlowState state = FlowState::Established;
    friend bool operator==(const LocalRecord&, const LocalRecord&) = default;
  };
  // Sorted by hash, one record a hash: equality, dumps and differences are
  // linear scans (no node per record).
  using LocalSet = std::vector<LocalRecord>;
  enum class Phase : std::uint8_t { Connecting, AwaitHello, AwaitAuth, AwaitAccept, Up };

  struct Conn {
    UniqueFd fd;
    bool outbound = false;
    int peer = -1;  // index into config_.peers; -1 until authenticated (inbound)
    Phase phase = Phase::Connecting;
    std::string remote;
    std::string source;        // inbound: the remote address without the port
    bool knownSource = false;  // inbound: a configured peer's address
    std::string in;
    std::string out;
    std::size_t outSent = 0;
    PeerNonce serverNonce{};
    PeerNonce clientNonce{};
    PeerKey sendKey;
    PeerKey recvKey;
    std::uint64_t sendSeq = 0;
    std::uint64_t recvSeq = 0;
    Millis opened = 0;
    Millis lastRecv = 0;
    Millis lastSend = 0;
    // Outbound, once up: what the peer has (base), and a dump in progress.
    std::shared_ptr<const LocalSet> base;
    std::shared_ptr<const LocalSet> dumpOf;
    std::size_t cursor = 0;
    bool dumping = false;
    std::uint64_t intentSent = 0;  // outbound: the intent version last sent
  };
  struct Peer {
    TierPeerConfig config;
    std::optional<std::uint64_t> outConn;
    std::optional<std::uint64_t> inConn;
    Millis nextAttempt = 0;
    std::unordered_map<std::uint64_t, Held> held;
    std::unordered_map<std::uint64_t, Held> staging;  // a dump being received
    bool receivingDump = false;
    bool dumpReceived = false;  // a complete dump arrived since open()
    bool unreachable = false;   // the last outbound attempt ended before its handshake did
    bool retired = false;       // removed from [tier] peers by a reload
    std::optional<Millis> downSince;
    std::optional<Millis> lastFrame;
    std::string lastError;
    std::uint64_t recordsIn = 0;
    std::uint64_t recordsOut = 0;
    std::uint64_t bytesIn = 0;
    std::uint64_t bytesOut = 0;
    std::uint64_t authFailures = 0;
    std::uint64_t framesRefused = 0;
    std::uint64_t recordsDropped = 0;
    std::uint64_t slowDisconnects = 0;
    // Tier intent from this peer: a dump being received, and the last whole one.
    std::vector<TierIntentEntry> intentStaging;
    bool intentReceiving = false;
    bool intentReceived = false;  // a whole dump arrived since open()
    std::vector<TierIntentEntry> intent;
    std::uint64_t intentDigest = 0;  // as the peer computed it
    std::uint64_t intentDumps = 0;
    std::uint64_t intentFramesBad = 0;       // malformed Intent frames (counted, ignored)
    std::uint64_t intentRecordsUnknown = 0;  // records of a kind this version does not know
    std::uint64_t intentOtherVersion = 0;    // frames of another version, ignored
    // Its last table step as it reported it (Step frames), in local time.
    std::optional<Millis> lastStepAt;
    std::uint64_t stepFramesBad = 0;  // malformed Step frames (counted, ignored)
  };

  void accept(Millis now);
  void connectOut(std::size_t peer, Millis now);
  // Reads and handles frames; false when the connection was closed.
  bool service(std::uint64_t id, Conn& c, Millis now);
  bool handleHandshake(std::uint64_t id, Conn& c, PeerFrameType type, std::string_view payload,
                       Millis now);
  bool handleData(Conn& c, PeerFrameType type, std::string_view payload, Millis now);
  void up(std::uint64_t id, Conn& c, Millis now);
  void pump(Conn& c);
  void pumpIntent(Conn& c);
  void sendStep(Conn& c);
  void receiveIntent(Peer& p, std::string_view payload);
  [[nodiscard]] Json intentJson(const Peer& p) const;
  void send(Conn& c, PeerFrameType type, std::string_view payload);
  bool flush(Conn& c);
  void refuse(Conn& c, const std::string& reason);
  void close(std::uint64_t id, const std::string& why, Millis now);
  [[nodiscard]] std::string directionState(const std::optional<std::uint64_t>& conn) const;
  // A configured (not retired) peer's index; -1 when none.
  [[nodiscard]] int peerNamed(std::string_view name) const;
  [[nodiscard]] int peerIndex(std::string_view name, bool retiredToo) const;
  void recountAddresses();
  void noteRefusal(Millis now, std::string_view source, std::string_view reason);
  [[nodiscard]] std::size_t pendingHandshakes() const;

  TierConfig config_;
  std::uint64_t hashSeed_;
  std::uint64_t seedTag_;
  PeerKey master_;
  EventLog& events_;
  PeerChannelTimers timers_;
  UniqueFd listen_;
  UniqueFd epoll_;
  std::uint16_t port_ = 0;
  std::vector<Peer> peers_;
  std::map<std::uint64_t, Conn> conns_;
  std::uint64_t nextConn_ = 1;
  Millis now_ = 0;
  std::shared_ptr<const LocalSet> local_;
  std::uint64_t stamp_ = 0;
  bool changed_ = false;
  std::size_t inUse_ = 0;
  std::size_t ignored_ = 0;
  std::uint64_t unknownNodes_ = 0;
  std::uint64_t versionRefusals_ = 0;
  std::uint64_t handshakeDrops_ = 0;
  std::uint64_t connectionsRefused_ = 0;
  // Configured peers per address, for the listener's pending allowances.
  std::map<std::string, std::size_t, std::less<>> peersAt_;
  // Refusals a stranger can cause (accept limits, unknown node, bad MAC):
  // summarised into the event log, never one event each.
  RefusalSummary refusals_{"peer listener"};
  // Tier intent: this instance's (version 0: none published yet), and the
  // whole dumps received and not yet taken.
  std::shared_ptr<const std::vector<TierIntentEntry>> intentLocal_;
  std::uint64_t intentDigest_ = 0;
  std::uint64_t intentVersion_ = 0;
  std::vector<PeerIntentDump> intentIn_;
  std::optional<Millis> lastStep_;  // this instance's last table step (noteStep)
};

}  // namespace spillway
