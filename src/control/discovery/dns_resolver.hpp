// The resolver a DNS discovery source asks: an interface (the seam the
// unit tests fill with a scripted resolver) and its c-ares implementation.
//
// CaresResolver never blocks: query() sends (non-blocking sockets) and
// process() polls c-ares's sockets with a zero timeout, reads what is there
// and runs c-ares's own timeouts. Answers are delivered by the callbacks,
// from inside query() (an immediate failure) or process().
//
// parseDnsAnswer reads a DNS reply (the bytes c-ares hands over) into
// records with their TTLs; c-ares 1.18's own parsers drop the SRV TTL.
//
// Thread contract: control thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "control/config/config.hpp"

namespace spillway {

struct DnsRecord {
  IpAddress address{};  // A / AAAA
  std::string target;   // SRV: the target name (no final dot)
  std::uint16_t priority = 0;
  std::uint16_t weight = 0;
  std::uint16_t port = 0;
  std::uint32_t ttl = 0;  // seconds
  bool operator==(const DnsRecord&) const = default;
};

enum class DnsStatus : std::uint8_t {
  Ok,        // records (maybe none of the type asked: see NoData)
  NxDomain,  // the name does not exist
  NoData,    // the name exists, with no record of the type
  Timeout,   // no answer in time
  Failed,    // anything else: refused, servfail, malformed, no server
};

struct DnsAnswer {
  DnsStatus status = DnsStatus::Failed;
  std::string error;  // when not Ok: what the resolver said
  std::vector<DnsRecord> records;
};

[[nodiscard]] const char* dnsTypeName(DnsRecordType type) noexcept;

// Records of `type` in the answer section of a DNS reply (CNAMEs and other
// types skipped). A reply that does not parse is Failed with why.
[[nodiscard]] DnsAnswer parseDnsAnswer(const std::uint8_t* reply, std::size_t length,
                                       DnsRecordType type);

class DnsResolver {
 public:
  using Done = std::function<void(DnsAnswer)>;
  virtual ~DnsResolver() = default;
  // Asks for name's records of type; done is called exactly once (unless
  // cancel() or the resolver's end comes first, which drop it).
  virtual void query(const std::string& name, DnsRecordType type, Done done) = 0;
  // Non-blocking: reads what arrived, runs timeouts, calls the callbacks.
  virtual void process() = 0;
  // Drops every pending query (their callbacks are not called).
  virtual void cancel() = 0;
  // Where it asks: "192.0.2.53:53" or "system (/etc/resolv.conf)".
  [[nodiscard]] virtual std::string servers() const = 0;
};

class CaresResolver final : public DnsResolver {
 public:
  // server: the one to ask (none: the system's, from /etc/resolv.conf);
  // timeout: per query, c-ares's own (the source bounds a whole round too).
  CaresResolver(std::optional<IpAddress> server, std::uint16_t port, Millis timeout);
  ~CaresResolver() override;
  CaresResolver(const CaresResolver&) = delete;
  CaresResolver& operator=(const CaresResolver&) = delete;

  void query(const std::string& name, DnsRecordType type, Done done) override;
  void process() override;
  void cancel() override;
  [[nodiscard]] std::string servers() const override { return servers_; }

 private:
  struct Pending {
    CaresResolver* self;
    std::uint64_t id;
    DnsRecordType type;
  };
  static void answered(void* arg, int status, int timeouts, unsigned char* reply, int length);

  void* channel_ = nullptr;  // ares_channel
  std::optional<std::string> initError_;
  std::string servers_;
  std::uint64_t nextId_ = 1;
  std::map<std::uint64_t, Done> pending_;
};

}  // namespace spillway
