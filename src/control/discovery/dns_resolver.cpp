#include "control/discovery/dns_resolver.hpp"

#include <ares.h>
#include <arpa/nameser.h>
#include <poll.h>

#include <array>
#include <mutex>

namespace spillway {

namespace {

constexpr std::uint16_t kTypeA = 1;
constexpr std::uint16_t kTypeAaaa = 28;
constexpr std::uint16_t kTypeSrv = 33;
constexpr std::uint16_t kClassIn = 1;
constexpr std::size_t kHeaderBytes = 12;

std::uint16_t wireType(DnsRecordType type) {
  switch (type) {
    case DnsRecordType::A:
      return kTypeA;
    case DnsRecordType::Aaaa:
      return kTypeAaaa;
    case DnsRecordType::Srv:
      return kTypeSrv;
  }
  return kTypeA;
}

std::uint16_t u16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>((static_cast<unsigned>(p[0]) << 8) | p[1]);
}

std::uint32_t u32(const std::uint8_t* p) {
  return (static_cast<std::uint32_t>(u16(p)) << 16) | u16(p + 2);
}

// A (possibly compressed) name at `at`: its text and the bytes it takes
// there; nullopt when malformed (c-ares bounds the pointer chains).
std::optional<std::pair<std::string, std::size_t>> readName(const std::uint8_t* reply,
                                                            std::size_t length, std::size_t at) {
  if (at >= length) return std::nullopt;
  char* name = nullptr;
  long used = 0;
  if (ares_expand_name(reply + at, reply, static_cast<int>(length), &name, &used) != ARES_SUCCESS) {
    return std::nullopt;
  }
  std::string text = name;
  ares_free_string(name);
  if (used <= 0 || static_cast<std::size_t>(used) > length - at) return std::nullopt;
  return std::pair{std::move(text), static_cast<std::size_t>(used)};
}

std::once_flag caresInit;

}  // namespace

const char* dnsTypeName(DnsRecordType type) noexcept {
  switch (type) {
    case DnsRecordType::A:
      return "A";
    case DnsRecordType::Aaaa:
      return "AAAA";
    case DnsRecordType::Srv:
      return "SRV";
  }
  return "?";
}

DnsAnswer parseDnsAnswer(const std::uint8_t* reply, std::size_t length, DnsRecordType type) {
  DnsAnswer out;
  if (reply == nullptr || length < kHeaderBytes) {
    out.error = "reply of " + std::to_string(length) + " bytes, shorter than a DNS header";
    return out;
  }
  const unsigned rcode = reply[3] & 0x0fU;
  if (rcode == 3) {
    out.status = DnsStatus::NxDomain;
    out.error = "NXDOMAIN: the name does not exist";
    return out;
  }
  if (rcode != 0) {
    out.error = "the server answered rcode " + std::to_string(rcode);
    return out;
  }
  const std::uint16_t questions = u16(reply + 4);
  const std::uint16_t answers = u16(reply + 6);
  std::size_t at = kHeaderBytes;
  for (std::uint16_t q = 0; q < questions; ++q) {
    auto name = readName(reply, length, at);
    if (!name || length - at - name->second < 4) {
      out.error = "malformed reply: question " + std::to_string(q);
      return out;
    }
    at += name->second + 4;
  }
  const std::uint16_t want = wireType(type);
  for (std::uint16_t a = 0; a < answers; ++a) {
    const std::string where = "malformed reply: answer " + std::to_string(a);
    auto owner = readName(reply, length, at);
    if (!owner || length - at - owner->second < 10) {
      out.error = where;
      return out;
    }
    at += owner->second;
    const std::uint16_t rtype = u16(reply + at);
    const std::uint16_t rclass = u16(reply + at + 2);
    const std::uint32_t ttl = u32(reply + at + 4);
    const std::uint16_t rdlength = u16(reply + at + 8);
    at += 10;
    if (length - at < rdlength) {
      out.error = where + ": its data runs past the reply";
      return out;
    }
    const std::uint8_t* rdata = reply + at;
    const std::size_t rdataAt = at;
    at += rdlength;
    if (rtype != want || rclass != kClassIn) continue;  // CNAMEs, other types
    DnsRecord r;
    r.ttl = ttl > 0x7fffffffU ? 0 : ttl;  // RFC 2181: a TTL with the top bit set means 0
    if (type == DnsRecordType::A || type == DnsRecordType::Aaaa) {
      const std::size_t size = type == DnsRecordType::A ? 4 : 16;
      if (rdlength != size) {
        out.error = where + ": " + std::to_string(rdlength) + " bytes of address";
        return out;
      }
      r.address.version = type == DnsRecordType::A ? IpVersion::V4 : IpVersion::V6;
      for (std::size_t i = 0; i < size; ++i) r.address.bytes[i] = std::byte{rdata[i]};
    } else {
      if (rdlength < 7) {
        out.error = where + ": SRV data of " + std::to_string(rdlength) + " bytes";
        return out;
      }
      r.priority = u16(rdata);
      r.weight = u16(rdata + 2);
      r.port = u16(rdata + 4);
      auto target = readName(reply, length, rdataAt + 6);
      if (!target || target->second != rdlength - 6U) {
        out.error = where + ": SRV target name malformed";
        return out;
      }
      r.target = target->first;
    }
    out.records.push_back(std::move(r));
  }
  if (out.records.empty()) {
    out.status = DnsStatus::NoData;
    out.error = std::string("no ") + dnsTypeName(type) + " record in the answer";
    return out;
  }
  out.status = DnsStatus::Ok;
  return out;
}

CaresResolver::CaresResolver(std::optional<IpAddress> server, std::uint16_t port, Millis timeout) {
  std::call_once(caresInit, [] { (void)ares_library_init(ARES_LIB_INIT_ALL); });
  ares_options options{};
  options.timeout = static_cast<int>(timeout);
  options.tries = 1;
  options.flags = ARES_FLAG_NOSEARCH | ARES_FLAG_EDNS;
  options.ednspsz = 1232;
  ares_channel channel = nullptr;
  const int status = ares_init_options(
      &channel, &options, ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES | ARES_OPT_FLAGS | ARES_OPT_EDNSPSZ);
  if (status != ARES_SUCCESS) {
    initError_ = std::string("c-ares: ") + ares_strerror(status);
    servers_ = "none";
    return;
  }
  channel_ = channel;
  if (server) {
    const std::string host = formatIpAddress(*server);
    servers_ =
        (server->version == IpVersion::V6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
    const int set = ares_set_servers_ports_csv(channel, servers_.c_str());
    if (set != ARES_SUCCESS) initError_ = std::string("c-ares: server: ") + ares_strerror(set);
  } else {
    servers_ = "system (/etc/resolv.conf)";
  }
}

CaresResolver::~CaresResolver() {
  pending_.clear();  // the callbacks ares_destroy runs find nothing to call
  if (channel_ != nullptr) ares_destroy(static_cast<ares_channel>(channel_));
}

void CaresResolver::answered(void* arg, int status, int /*timeouts*/, unsigned char* reply,
                             int length) {
  std::unique_ptr<Pending> p(static_cast<Pending*>(arg));
  auto it = p->self->pending_.find(p->id);
  if (it == p->self->pending_.end()) return;  // cancelled
  Done done = std::move(it->second);
  p->self->pending_.erase(it);
  DnsAnswer a;
  if (status == ARES_SUCCESS) {
    a = parseDnsAnswer(reply, length < 0 ? 0 : static_cast<std::size_t>(length), p->type);
  } else {
    a.error = ares_strerror(status);
    if (status == ARES_ENOTFOUND) a.status = DnsStatus::NxDomain;
    if (status == ARES_ENODATA) a.status = DnsStatus::NoData;
    if (status == ARES_ETIMEOUT) a.status = DnsStatus::Timeout;
  }
  done(std::move(a));
}

void CaresResolver::query(const std::string& name, DnsRecordType type, Done done) {
  if (channel_ == nullptr || initError_) {
    DnsAnswer a;
    a.error = initError_.value_or("c-ares: no channel");
    done(std::move(a));
    return;
  }
  const std::uint64_t id = nextId_++;
  pending_.emplace(id, std::move(done));
  auto* p = new Pending{this, id, type};  // owned by the callback, which c-ares always calls
  ares_query(static_cast<ares_channel>(channel_), name.c_str(), kClassIn, wireType(type),
             &CaresResolver::answered, p);
}

void CaresResolver::process() {
  if (channel_ == nullptr) return;
  auto channel = static_cast<ares_channel>(channel_);
  std::array<ares_socket_t, ARES_GETSOCK_MAXNUM> socks{};
  const int bits = ares_getsock(channel, socks.data(), ARES_GETSOCK_MAXNUM);
  std::array<pollfd, ARES_GETSOCK_MAXNUM> fds{};
  nfds_t n = 0;
  for (int i = 0; i < ARES_GETSOCK_MAXNUM; ++i) {
    const bool r = ARES_GETSOCK_READABLE(bits, i);
    const bool w = ARES_GETSOCK_WRITABLE(bits, i);
    if (!r && !w) continue;
    fds[n].fd = socks[static_cast<std::size_t>(i)];
    fds[n].events = static_cast<short>((r ? POLLIN : 0) | (w ? POLLOUT : 0));
    ++n;
  }
  if (n != 0 && ::poll(fds.data(), n, 0) > 0) {  // zero timeout: never waits
    for (nfds_t i = 0; i < n; ++i) {
      const short ev = fds[i].revents;
      if (ev == 0) continue;
      const bool r = (ev & (POLLIN | POLLERR | POLLHUP)) != 0;
      const bool w = (ev & POLLOUT) != 0;
      ares_process_fd(channel, r ? fds[i].fd : ARES_SOCKET_BAD, w ? fds[i].fd : ARES_SOCKET_BAD);
    }
  }
  ares_process_fd(channel, ARES_SOCKET_BAD, ARES_SOCKET_BAD);  // c-ares's timeouts
}

void CaresResolver::cancel() {
  pending_.clear();
  if (channel_ != nullptr) ares_cancel(static_cast<ares_channel>(channel_));
}

}  // namespace spillway
