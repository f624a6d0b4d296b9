// DNS discovery: the reply parser (A, AAAA, SRV with compressed names, TTLs,
// CNAMEs skipped, NXDOMAIN, malformed replies), the DNS source on a scripted
// resolver on a fake clock (re-asked by the TTL clamped to [min_ttl,
// max_ttl]; a failure, timeout, NXDOMAIN or empty answer keeps the last good
// set; SRV lowest priority, weights and targets; duplicates and caps
// counted), the configuration's keys and bounds, and a real DNS server
// (dnsmasq on loopback, started here) whose answer grows from 2 to 4
// addresses and shrinks back: the pool follows after the TTL, and the hold
// for leaving.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "control/discovery/dns_resolver.hpp"
#include "control/discovery/dns_source.hpp"
#include "control/plane/control_plane.hpp"
#include "estate_fixture.hpp"
#include "fake_dataplane.hpp"
#include "plane_on_file.hpp"

extern char** environ;

namespace spillway {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// --- replies built by hand --------------------------------------------------

struct Reply {
  std::vector<std::uint8_t> bytes;
  void u16(unsigned v) {
    bytes.push_back(static_cast<std::uint8_t>(v >> 8));
    bytes.push_back(static_cast<std::uint8_t>(v));
  }
  void u32(std::uint32_t v) {
    u16(v >> 16);
    u16(v & 0xffff);
  }
  void name(const std::string& n) {
    std::size_t start = 0;
    while (start < n.size()) {
      const auto dot = n.find('.', start);
      const std::string label = n.substr(start, dot == std::string::npos ? dot : dot - start);
      bytes.push_back(static_cast<std::uint8_t>(label.size()));
      bytes.insert(bytes.end(), label.begin(), label.end());
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    bytes.push_back(0);
  }
  void pointer(unsigned at) { u16(0xc000 | at); }  // a compressed name
};

// A reply to `qname` (at offset 12, so answers can point at it) of rcode.
Reply header(const std::string& qname, unsigned qtype, unsigned answers, unsigned rcode = 0) {
  Reply r;
  r.u16(7);
  r.u16(0x8180 | rcode);
  r.u16(1);
  r.u16(answers);
  r.u16(0);
  r.u16(0);
  r.name(qname);
  r.u16(qtype);
  r.u16(1);
  return r;
}

void addA(Reply& r, std::uint32_t ttl, std::array<std::uint8_t, 4> a) {
  r.pointer(12);
  r.u16(1);
  r.u16(1);
  r.u32(ttl);
  r.u16(4);
  r.bytes.insert(r.bytes.end(), a.begin(), a.end());
}

IpAddress ip(const char* text) {
  return *parseIpAddress(text);
}

TEST(DnsAnswer, ParsesARecordsWithTtlsAndSkipsCnames) {
  Reply r = header("gpu.cloud.example", 1, 3);
  // gpu.cloud.example CNAME x.cloud.example (TTL 60), then two A records.
  r.pointer(12);
  r.u16(5);
  r.u16(1);
  r.u32(60);
  r.u16(4);
  r.bytes.push_back(1);
  r.bytes.push_back('x');
  r.pointer(12 + 4);  // "cloud.example" inside the question
  addA(r, 30, {10, 9, 0, 1});
  addA(r, 20, {10, 9, 0, 2});
  const DnsAnswer a = parseDnsAnswer(r.bytes.data(), r.bytes.size(), DnsRecordType::A);
  ASSERT_EQ(a.status, DnsStatus::Ok) << a.error;
  ASSERT_EQ(a.records.size(), 2u);
  EXPECT_EQ(a.records[0].address, ip("10.9.0.1"));
  EXPECT_EQ(a.records[0].ttl, 30u);
  EXPECT_EQ(a.records[1].address, ip("10.9.0.2"));
  EXPECT_EQ(a.records[1].ttl, 20u);
}

TEST(DnsAnswer, ParsesAaaaAndSrv) {
  Reply r = header("gpu.example", 28, 1);
  r.pointer(12);
  r.u16(28);
  r.u16(1);
  r.u32(0x80000000U);  // top bit set: means 0 (RFC 2181)
  r.u16(16);
  const std::array<std::uint8_t, 16> v6{0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5};
  r.bytes.insert(r.bytes.end(), v6.begin(), v6.end());
  DnsAnswer a = parseDnsAnswer(r.bytes.data(), r.bytes.size(), DnsRecordType::Aaaa);
  ASSERT_EQ(a.status, DnsStatus::Ok) << a.error;
  EXPECT_EQ(a.records.at(0).address, ip("2001:db8::5"));
  EXPECT_EQ(a.records.at(0).ttl, 0u);

  Reply s = header("_gpu._tcp.example", 33, 1);
  s.pointer(12);
  s.u16(33);
  s.u16(1);
  s.u32(15);
  const std::size_t lengthAt = s.bytes.size();
  s.u16(0);
  s.u16(10);    // priority
  s.u16(40);    // weight
  s.u16(8000);  // port
  s.bytes.push_back(4);
  for (char c : std::string("gpu1")) s.bytes.push_back(static_cast<std::uint8_t>(c));
  s.pointer(12 + 10);  // "example" of the question
  const std::size_t rdlength = s.bytes.size() - lengthAt - 2;
  s.bytes[lengthAt + 1] = static_cast<std::uint8_t>(rdlength);
  a = parseDnsAnswer(s.bytes.data(), s.bytes.size(), DnsRecordType::Srv);
  ASSERT_EQ(a.status, DnsStatus::Ok) << a.error;
  EXPECT_EQ(a.records.at(0).target, "gpu1.example");
  EXPECT_EQ(a.records.at(0).priority, 10);
  EXPECT_EQ(a.records.at(0).weight, 40);
  EXPECT_EQ(a.records.at(0).port, 8000);
  EXPECT_EQ(a.records.at(0).ttl, 15u);
}

TEST(DnsAnswer, NxdomainEmptyAndMalformedRepliesAreNotAnswers) {
  Reply nx = header("gone.example", 1, 0, 3);
  EXPECT_EQ(parseDnsAnswer(nx.bytes.data(), nx.bytes.size(), DnsRecordType::A).status,
            DnsStatus::NxDomain);
  Reply empty = header("gpu.example", 1, 0);
  EXPECT_EQ(parseDnsAnswer(empty.bytes.data(), empty.bytes.size(), DnsRecordType::A).status,
            DnsStatus::NoData);
  Reply fail = header("gpu.example", 1, 0, 2);
  EXPECT_EQ(parseDnsAnswer(fail.bytes.data(), fail.bytes.size(), DnsRecordType::A).status,
            DnsStatus::Failed);
  Reply good = header("gpu.example", 1, 1);
  addA(good, 5, {10, 9, 0, 1});
  // Every truncation of a good reply is refused, never read past its end.
  for (std::size_t n = 0; n < good.bytes.size(); ++n) {
    const std::vector<std::uint8_t> cut(good.bytes.begin(), good.bytes.begin() + n);
    const DnsAnswer a = parseDnsAnswer(cut.data(), cut.size(), DnsRecordType::A);
    EXPECT_NE(a.status, DnsStatus::Ok) << n;
  }
  // An address of the wrong length, a pointer loop.
  Reply bad = header("gpu.example", 1, 1);
  bad.pointer(12);
  bad.u16(1);
  bad.u16(1);
  bad.u32(5);
  bad.u16(3);
  bad.bytes.insert(bad.bytes.end(), {10, 9, 0});
  EXPECT_EQ(parseDnsAnswer(bad.bytes.data(), bad.bytes.size(), DnsRecordType::A).status,
            DnsStatus::Failed);
  Reply loop = header("gpu.example", 1, 1);
  const unsigned self = static_cast<unsigned>(loop.bytes.size());
  loop.pointer(self);
  loop.u16(1);
  loop.u16(1);
  loop.u32(5);
  loop.u16(4);
  loop.bytes.insert(loop.bytes.end(), {10, 9, 0, 1});
  EXPECT_EQ(parseDnsAnswer(loop.bytes.data(), loop.bytes.size(), DnsRecordType::A).status,
            DnsStatus::Failed);
}

// --- the source on a scripted resolver ----------------------------------------

// Answers what the test says, when the test says (held until answer()).
class ScriptedResolver final : public DnsResolver {
 public:
  struct Asked {
    std::string name;
    DnsRecordType type;
    Done done;
  };
  void query(const std::string& name, DnsRecordType type, Done done) override {
    asked.push_back({name, type, std::move(done)});
    ++queries;
  }
  void process() override {}
  void cancel() override {
    asked.clear();
    ++cancels;
  }
  [[nodiscard]] std::string servers() const override { return "scripted"; }
  // Answers the oldest pending query for `name`.
  bool answer(const std::string& name, DnsAnswer a) {
    for (auto it = asked.begin(); it != asked.end(); ++it) {
      if (it->name != name) continue;
      Done done = std::move(it->done);
      asked.erase(it);
      done(std::move(a));
      return true;
    }
    return false;
  }
  std::deque<Asked> asked;
  int queries = 0;
  int cancels = 0;
};

DnsAnswer aAnswer(std::initializer_list<const char*> addrs, std::uint32_t ttl) {
  DnsAnswer a;
  a.status = DnsStatus::Ok;
  for (const char* t : addrs) {
    DnsRecord r;
    r.address = ip(t);
    r.ttl = ttl;
    a.records.push_back(r);
  }
  return a;
}

DnsAnswer failure(DnsStatus status, const char* why) {
  DnsAnswer a;
  a.status = status;
  a.error = why;
  return a;
}

DiscoveryConfig dnsConfig(DnsRecordType type = DnsRecordType::A) {
  DiscoveryConfig c;
  c.kind = DiscoveryKind::Dns;
  c.dnsName = "gpu.cloud.example";
  c.dnsType = type;
  c.minTtl = 5000;
  c.maxTtl = 60'000;
  c.timeout = 2000;
  c.maxEntries = 4;
  return c;
}

std::vector<std::string> names(const DnsSource& s) {
  std::vector<std::string> out;
  for (const DiscoveredBackend& b : s.backends()) out.push_back(b.name);
  return out;
}

TEST(DnsSource, ReasksByTheTtlClampedToItsBounds) {
  auto owned = std::make_unique<ScriptedResolver>();
  ScriptedResolver& r = *owned;
  DnsSource s(dnsConfig(), std::move(owned));
  EXPECT_FALSE(s.poll(0).read);  // asks at the first poll
  ASSERT_EQ(r.asked.size(), 1u);
  EXPECT_EQ(r.asked[0].name, "gpu.cloud.example");
  EXPECT_EQ(r.asked[0].type, DnsRecordType::A);
  ASSERT_TRUE(r.answer("gpu.cloud.example", aAnswer({"10.9.0.1", "10.9.0.2"}, 30)));
  DiscoveryRefresh got = s.poll(100);
  EXPECT_TRUE(got.read);
  EXPECT_FALSE(got.error);
  EXPECT_EQ(names(s), (std::vector<std::string>{"d-10-9-0-1", "d-10-9-0-2"}));
  EXPECT_EQ(s.backends()[0].id, discoveredBackendId(ip("10.9.0.1")));
  EXPECT_EQ(s.lastTtl(), 30'000);
  EXPECT_EQ(s.nextQuery(), 30'100);
  (void)s.poll(30'099);
  EXPECT_EQ(r.queries, 1);  // not before the TTL ran out
  (void)s.poll(30'100);
  EXPECT_EQ(r.queries, 2);
  // The smallest TTL of the answer, raised to min_ttl...
  ASSERT_TRUE(r.answer("gpu.cloud.example", aAnswer({"10.9.0.1", "10.9.0.2", "10.9.0.3"}, 1)));
  EXPECT_TRUE(s.poll(30'200).read);
  EXPECT_EQ(s.backends().size(), 3u);
  EXPECT_EQ(s.lastTtl(), 5000);
  EXPECT_EQ(s.nextQuery(), 35'200);
  // ...or lowered to max_ttl.
  (void)s.poll(35'200);
  ASSERT_TRUE(r.answer("gpu.cloud.example", aAnswer({"10.9.0.1"}, 86'400)));
  EXPECT_TRUE(s.poll(35'300).read);
  EXPECT_EQ(s.lastTtl(), 60'000);
  EXPECT_EQ(s.nextQuery(), 95'300);
  EXPECT_EQ(names(s), (std::vector<std::string>{"d-10-9-0-1"}));
}

TEST(DnsSource, FailuresKeepTheLastGoodSet) {
  auto owned = std::make_unique<ScriptedResolver>();
  ScriptedResolver& r = *owned;
  DnsSource s(dnsConfig(), std::move(owned));
  (void)s.poll(0);
  ASSERT_TRUE(r.answer("gpu.cloud.example", aAnswer({"10.9.0.1", "10.9.0.2"}, 10)));
  ASSERT_TRUE(s.poll(0).read);
  Millis now = 10'000;
  const std::vector<std::string> good = names(s);
  // NXDOMAIN, no records, a server failure: refused, the set stays, the
  // next try after min_ttl.
  for (DnsAnswer bad : {failure(DnsStatus::NxDomain, "NXDOMAIN: the name does not exist"),
                        failure(DnsStatus::NoData, "no A record in the answer"),
                        failure(DnsStatus::Failed, "the server answered rcode 2")}) {
    const std::string why = bad.error;
    (void)s.poll(now);
    ASSERT_TRUE(r.answer("gpu.cloud.example", std::move(bad)));
    const DiscoveryRefresh got = s.poll(now);
    ASSERT_TRUE(got.read);
    ASSERT_TRUE(got.error);
    EXPECT_NE(got.error->find(why), std::string::npos) << *got.error;
    EXPECT_NE(got.error->find("the last good set stays (2 backends)"), std::string::npos)
        << *got.error;
    EXPECT_EQ(names(s), good);
    EXPECT_EQ(s.nextQuery(), now + 5000);
    now += 5000;
  }
  // No answer at all: abandoned after timeout (on the clock passed in).
  (void)s.poll(now);
  EXPECT_TRUE(s.inFlight());
  EXPECT_FALSE(s.poll(now + 1999).read);
  const DiscoveryRefresh late = s.poll(now + 2000);
  ASSERT_TRUE(late.error);
  EXPECT_NE(late.error->find("no answer within timeout = 2000 ms"), std::string::npos);
  EXPECT_GE(r.cancels, 1);
  EXPECT_EQ(names(s), good);
  // An answer to the abandoned round that comes after all is not read.
  EXPECT_FALSE(r.answer("gpu.cloud.example", aAnswer({"10.9.0.9"}, 10)));
  // The resolver answers again: the new set.
  now += 2000 + 5000;
  (void)s.poll(now);
  ASSERT_TRUE(r.answer("gpu.cloud.example", aAnswer({"10.9.0.3"}, 10)));
  const DiscoveryRefresh back = s.poll(now);
  EXPECT_FALSE(back.error);
  EXPECT_EQ(names(s), (std::vector<std::string>{"d-10-9-0-3"}));
}

TEST(DnsSource, DuplicatesAndEntriesBeyondTheCapCounted) {
  auto owned = std::make_unique<ScriptedResolver>();
  ScriptedResolver& r = *owned;
  DnsSource s(dnsConfig(), std::move(owned));  // max_entries = 4
  (void)s.poll(0);
  ASSERT_TRUE(r.answer("gpu.cloud.example", aAnswer({"10.9.0.1", "10.9.0.1", "10.9.0.2", "10.9.0.3",
                                                     "10.9.0.4", "10.9.0.5", "10.9.0.6"},
                                                    10)));
  const DiscoveryRefresh got = s.poll(0);
  EXPECT_EQ(s.backends().size(), 4u);
  ASSERT_EQ(got.invalid.size(), 2u);
  EXPECT_NE(got.invalid[0].find("10.9.0.1 is in the answer twice"), std::string::npos);
  EXPECT_NE(got.invalid[1].find("2 addresses beyond max_entries = 4"), std::string::npos);
}

DnsRecord srv(const char* target, std::uint16_t priority, std::uint16_t weight, std::uint32_t ttl) {
  DnsRecord r;
  r.target = target;
  r.priority = priority;
  r.weight = weight;
  r.port = 8000;
  r.ttl = ttl;
  return r;
}

TEST(DnsSource, SrvTargetsWeightsAndLowestPriority) {
  auto owned = std::make_unique<ScriptedResolver>();
  ScriptedResolver& r = *owned;
  DiscoveryConfig c = dnsConfig(DnsRecordType::Srv);
  c.dnsName = "_gpu._tcp.cloud.example";
  DnsSource s(c, std::move(owned));
  (void)s.poll(0);
  ASSERT_EQ(r.asked.at(0).type, DnsRecordType::Srv);
  DnsAnswer a;
  a.status = DnsStatus::Ok;
  a.records = {srv("gpu1.cloud.example", 10, 30, 40), srv("gpu2.cloud.example", 10, 70, 40),
               srv("gpu3.cloud.example", 10, 5, 40), srv("standby.cloud.example", 20, 100, 40)};
  ASSERT_TRUE(r.answer("_gpu._tcp.cloud.example", a));
  EXPECT_FALSE(s.poll(0).read);   // the targets are asked now
  ASSERT_EQ(r.asked.size(), 3u);  // not the standby of priority 20
  EXPECT_EQ(r.asked[0].type, DnsRecordType::A);
  ASSERT_TRUE(r.answer("gpu1.cloud.example", aAnswer({"10.9.1.1"}, 50)));
  ASSERT_TRUE(r.answer("gpu2.cloud.example", aAnswer({"10.9.1.2"}, 20)));
  EXPECT_FALSE(s.poll(10).read);  // gpu3 still out
  ASSERT_TRUE(r.answer("gpu3.cloud.example",
                       failure(DnsStatus::NxDomain, "NXDOMAIN: the name does not exist")));
  const DiscoveryRefresh got = s.poll(20);
  ASSERT_TRUE(got.read);
  EXPECT_FALSE(got.error);
  ASSERT_EQ(s.backends().size(), 2u);
  EXPECT_EQ(s.backends()[0].address, ip("10.9.1.1"));
  EXPECT_EQ(s.backends()[0].weight, 30u);
  EXPECT_EQ(s.backends()[1].weight, 70u);
  ASSERT_EQ(got.invalid.size(), 1u);  // the target that does not exist, reported
  EXPECT_NE(got.invalid[0].find("gpu3.cloud.example"), std::string::npos);
  EXPECT_EQ(s.lastTtl(), 20'000);  // the smallest of the SRV's and the targets' TTLs
  // A target that times out fails the round: the last good set stays.
  (void)s.poll(20'020);
  ASSERT_TRUE(r.answer("_gpu._tcp.cloud.example", a));
  (void)s.poll(20'020);
  ASSERT_TRUE(r.answer("gpu1.cloud.example", aAnswer({"10.9.1.1"}, 50)));
  ASSERT_TRUE(r.answer("gpu2.cloud.example", failure(DnsStatus::Timeout, "Timeout")));
  EXPECT_FALSE(s.poll(20'030).read);  // gpu3 still out: the round waits for every target
  ASSERT_TRUE(r.answer("gpu3.cloud.example", aAnswer({"10.9.1.3"}, 50)));
  const DiscoveryRefresh failed = s.poll(20'030);
  ASSERT_TRUE(failed.error);
  EXPECT_NE(failed.error->find("SRV target gpu2.cloud.example: Timeout"), std::string::npos);
  EXPECT_EQ(s.backends().size(), 2u);
  EXPECT_EQ(s.backends()[1].weight, 70u);
  // Every target gone (NXDOMAIN): no usable entry, the last good set stays.
  (void)s.poll(30'000);
  ASSERT_TRUE(r.answer("_gpu._tcp.cloud.example", a));
  (void)s.poll(30'000);
  for (const char* t : {"gpu1.cloud.example", "gpu2.cloud.example", "gpu3.cloud.example"}) {
    ASSERT_TRUE(r.answer(t, failure(DnsStatus::NxDomain, "NXDOMAIN")));
  }
  const DiscoveryRefresh none = s.poll(30'010);
  ASSERT_TRUE(none.error);
  EXPECT_NE(none.error->find("no usable entry"), std::string::npos) << *none.error;
  EXPECT_EQ(none.invalid.size(), 3u);
  EXPECT_EQ(s.backends().size(), 2u);
}

// --- configuration ---------------------------------------------------------------

std::string configText(const std::string& stateDir, const std::string& discovery) {
  return test::cloudDiscoveryEstate(stateDir, discovery);
}

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("dns") {}
};
using test::writeAll;

std::optional<std::string> loadError(const TempDir& dir, const std::string& discovery) {
  writeAll(dir / "c.toml", configText(dir / "state", discovery));
  auto loaded = loadConfig(dir / "c.toml");
  if (loaded.ok()) return std::nullopt;
  return formatErrors(loaded.errors());
}

TEST(DnsDiscoveryConfig, KeysAndBounds) {
  TempDir dir;
  writeAll(dir / "c.toml",
           configText(dir / "state",
                      R"(kind = "dns", name = "_gpu._tcp.cloud.example", type = "SRV", )"
                      R"(target_type = "AAAA", server = "[2001:db8::53]:5353", min_ttl = 1, )"
                      R"(max_ttl = 120, timeout = 0.5, hold = 10, max_entries = 64)"));
  auto loaded = loadConfig(dir / "c.toml");
  ASSERT_TRUE(loaded.ok()) << formatErrors(loaded.errors());
  const DiscoveryConfig& d = loaded.value().pools.at(1).discovery;
  EXPECT_EQ(d.kind, DiscoveryKind::Dns);
  EXPECT_EQ(d.dnsName, "_gpu._tcp.cloud.example");
  EXPECT_EQ(d.dnsType, DnsRecordType::Srv);
  EXPECT_EQ(d.targetType, DnsRecordType::Aaaa);
  EXPECT_EQ(d.server, ip("2001:db8::53"));
  EXPECT_EQ(d.serverPort, 5353);
  EXPECT_EQ(d.minTtl, 1000);
  EXPECT_EQ(d.maxTtl, 120'000);
  EXPECT_EQ(d.timeout, 500);
  EXPECT_EQ(d.hold, 10'000);
  EXPECT_EQ(d.maxEntries, 64u);
  // Defaults: A, the system's resolvers, port 53.
  EXPECT_FALSE(loadError(dir, R"(kind = "dns", name = "gpu.cloud.example")"));
  const std::pair<const char*, const char*> bad[] = {
      {R"(kind = "dns")", "name"},
      {R"(kind = "dns", name = "gpu..example")", "not a DNS name"},
      {R"(kind = "dns", name = "gpu example")", "not a DNS name"},
      {R"(kind = "dns", name = "gpu.example", type = "MX")", "type"},
      {R"(kind = "dns", name = "gpu.example", target_type = "AAAA")", "only SRV targets"},
      {R"(kind = "dns", name = "gpu.example", server = "ns1.example")", "server"},
      {R"(kind = "dns", name = "gpu.example", server = "10.0.0.53:0")", "server"},
      {R"(kind = "dns", name = "gpu.example", server = "10.0.0.53:99999")", "server"},
      {R"(kind = "dns", name = "gpu.example", min_ttl = 60, max_ttl = 30)", "above max_ttl"},
      {R"(kind = "dns", name = "gpu.example", min_ttl = 0)", "min_ttl"},
      {R"(kind = "dns", name = "gpu.example", timeout = 60)", "timeout"},
      {R"(kind = "dns", name = "gpu.example", max_entries = 5000)", "max_entries"},
      {R"(kind = "dns", name = "gpu.example", path = "/x.json")", "kind is \"dns\""},
      {R"(kind = "file", path = "/x.json", name = "gpu.example")", "kind is \"file\""},
      {R"(kind = "file", path = "/x.json", min_ttl = 5)", "kind is \"file\""},
  };
  for (const auto& [text, why] : bad) {
    const auto e = loadError(dir, text);
    ASSERT_TRUE(e) << text;
    EXPECT_NE(e->find(why), std::string::npos) << text << "\n" << *e;
  }
}

// --- a real DNS server -------------------------------------------------------------

std::optional<std::string> findProgram(const char* name) {
  for (const char* dir : {"/usr/sbin", "/usr/bin", "/sbin", "/bin"}) {
    const std::string p = std::string(dir) + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return std::nullopt;
}

std::uint16_t freeUdpPort() {
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  (void)::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  (void)::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// dnsmasq on 127.0.0.1:port answering from a hosts file (TTL 1 s), and the
// SRV records given; reread() makes it read the hosts file again (SIGHUP).
class Dnsmasq {
 public:
  Dnsmasq(const std::string& program, const std::string& hosts, std::uint16_t port,
          const std::vector<std::string>& extra)
      : hosts_(hosts), log_(hosts + ".dnsmasq.log") {
    std::vector<std::string> args = {program,
                                     "--keep-in-foreground",
                                     "--conf-file=/dev/null",
                                     "--no-resolv",
                                     "--no-hosts",
                                     "--addn-hosts=" + hosts,
                                     "--local=/cloud.test/",
                                     "--listen-address=127.0.0.1",
                                     "--bind-interfaces",
                                     "--port=" + std::to_string(port),
                                     "--local-ttl=1",
                                     "--pid-file=",
                                     "--log-facility=-"};
    if (::geteuid() == 0) args.emplace_back("--user=root");  // reads the test's private files
    for (const std::string& e : extra) args.push_back(e);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // Its log (stderr) in a file beside the hosts file: reread() waits for
    // the line that says the hosts file was read again.
    posix_spawn_file_actions_t actions;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawn_file_actions_addopen(&actions, 2, log_.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                       0600);
    if (::posix_spawn(&pid_, program.c_str(), &actions, nullptr, argv.data(), environ) != 0) {
      pid_ = -1;
    }
    ::posix_spawn_file_actions_destroy(&actions);
  }
  ~Dnsmasq() { stop(); }
  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  [[nodiscard]] bool running() const { return pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == 0; }
  // SIGHUP, then waits (10 s at most) until the log says the hosts file was
  // read again; false if it never does.
  bool reread() const {
    const std::size_t before = readsLogged();
    ::kill(pid_, SIGHUP);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (readsLogged() <= before) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

 private:
  // Lines "read HOSTS - N names" (dnsmasq's log of an addn-hosts read).
  [[nodiscard]] std::size_t readsLogged() const {
    std::ifstream in(log_);
    std::size_t n = 0;
    for (std::string line; std::getline(in, line);)
      n += line.find("read " + hosts_) != std::string::npos;
    return n;
  }
  std::string hosts_;
  std::string log_;
  pid_t pid_ = -1;
};

class Daemon : public test::PlaneOnFile {
 public:
  Daemon(const TempDir& dir, const std::string& text, Millis now = 1000)
      : PlaneOnFile(dir, text, now) {}
  Json source() { return std::get<Json>(cp_->discovery())["sources"].at(0); }
  // One tick at `now`, then ticks at the same `now` until the source has no
  // query out (the real server answers in real time; the plane's clock stands
  // still meanwhile, so what the test asserts depends on the clock only).
  void step(Millis now) {
    (void)cp_->tick(now);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (source()["in_flight"] == true && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      (void)cp_->tick(now);
    }
  }
  void run(Millis& now, Millis ms) {
    for (Millis t = 0; t < ms; t += 100) {
      now += 100;
      ownWall_ += 100;
      step(now);
    }
  }
  std::map<std::string, std::string> cloud() {
    std::map<std::string, std::string> out;
    const ApiResult list = cp_->backendList();
    for (const Json& b : std::get<Json>(list)) {
      if (b["pool"] == "cloud") out[b["name"].get<std::string>()] = b["state"].get<std::string>();
    }
    return out;
  }
};

std::string hostsOf(std::initializer_list<const char*> addrs) {
  std::string t;
  for (const char* a : addrs) t += std::string(a) + " gpu.cloud.test\n";
  return t;
}

TEST(DnsDiscoveryReal, PoolGrowsAndShrinksWithTheAnswer) {
  const auto program = findProgram("dnsmasq");
  if (!program) GTEST_SKIP() << "dnsmasq is not installed (scripts/bootstrap installs it)";
  TempDir dir;
  const std::string hosts = dir / "hosts";
  writeAll(hosts, hostsOf({"10.9.0.1", "10.9.0.2"}));
  const std::uint16_t port = freeUdpPort();
  Dnsmasq dns(*program, hosts, port, {});
  ASSERT_TRUE(dns.running());
  // The server answers once it listens: the daemon's start waits for the
  // first answer (at most its timeout), so retry the start until it got one.
  const std::string discovery = R"(kind = "dns", name = "gpu.cloud.test", server = "127.0.0.1:)" +
                                std::to_string(port) +
                                R"(", min_ttl = 1, max_ttl = 30, timeout = 1, hold = 3)";
  std::unique_ptr<Daemon> d;
  for (int attempt = 0; attempt < 20; ++attempt) {
    d.reset();
    d = std::make_unique<Daemon>(dir, configText(dir / "state", discovery));
    if (d->cloud().size() == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  Millis now = 1000;
  EXPECT_EQ(d->cloud().size(), 2u) << d->source().dump();
  Json s = d->source();
  EXPECT_EQ(s["kind"], "dns");
  EXPECT_EQ(s["server"], "127.0.0.1:" + std::to_string(port));
  EXPECT_EQ(s["ttl_ms"], 1000);  // dnsmasq's local TTL, 1 s
  EXPECT_EQ(s["errors"], 0);

  // Grows to 4: nothing before the TTL runs out (the plane's clock), the 4
  // after it.
  writeAll(hosts, hostsOf({"10.9.0.1", "10.9.0.2", "10.9.0.3", "10.9.0.4"}));
  ASSERT_TRUE(dns.reread()) << "dnsmasq did not read the hosts file again";
  const Millis grown = now;
  std::printf("answer grew at t=%lld ms (next query in %lld ms)\n", static_cast<long long>(now),
              static_cast<long long>(d->source()["next_query_in_ms"].get<Millis>()));
  while (d->cloud().size() < 4 && now < grown + 5000) d->run(now, 100);
  std::printf("4 backends at t=%lld ms\n", static_cast<long long>(now));
  const auto four = d->cloud();
  ASSERT_EQ(four.size(), 4u) << d->source().dump();
  EXPECT_LE(now, grown + 1000 + 100);  // the clock passed in: the TTL, one tick
  EXPECT_TRUE(four.count("d-10-9-0-3") && four.count("d-10-9-0-4"));
  EXPECT_EQ(d->source()["joined"], 4);

  // Shrinks back to 2: the 2 that went stay for the hold (3 s), then drain.
  writeAll(hosts, hostsOf({"10.9.0.1", "10.9.0.2"}));
  ASSERT_TRUE(dns.reread()) << "dnsmasq did not read the hosts file again";
  const Millis shrunk = now;
  d->run(now, 1500);  // the new answer is read; still within the hold
  s = d->source();
  std::size_t unlisted = 0;
  for (const Json& e : s["entries"]) unlisted += e["listed"] == false ? 1 : 0;
  EXPECT_EQ(unlisted, 2u) << s.dump();
  EXPECT_NE(d->cloud().at("d-10-9-0-3"), "draining");
  EXPECT_EQ(s["left"], 0);
  while (d->source()["left"] != 2 && now < shrunk + 10'000) d->run(now, 100);
  std::printf("answer shrank at t=%lld ms, 2 left at t=%lld ms\n", static_cast<long long>(shrunk),
              static_cast<long long>(now));
  EXPECT_EQ(d->source()["left"], 2);
  EXPECT_LE(now, shrunk + 1000 + 3000 + 200);  // TTL + hold, on the clock passed in
  const auto after = d->cloud();
  for (const char* gone : {"d-10-9-0-3", "d-10-9-0-4"}) {
    EXPECT_TRUE(after.count(gone) == 0 || after.at(gone) == "draining") << gone;
  }
  EXPECT_NE(after.at("d-10-9-0-1"), "draining");

  // The server goes away: rounds fail, counted and said, the 2 stay.
  const std::uint64_t errorsBefore = d->source()["errors"].get<std::uint64_t>();
  dns.stop();
  d->run(now, 4000);
  s = d->source();
  EXPECT_GT(s["errors"].get<std::uint64_t>(), errorsBefore) << s.dump();
  ASSERT_TRUE(s["last_error"].is_string());
  EXPECT_NE(s["last_error"].get<std::string>().find("the last good set stays"), std::string::npos);
  EXPECT_NE(d->cp().metricsText().find("spillway_discovery_failing{pool=\"cloud\"} 1"),
            std::string::npos);
  EXPECT_EQ(d->cloud().count("d-10-9-0-1"), 1u);
  EXPECT_NE(d->cloud().at("d-10-9-0-1"), "draining");
}

// A target that does not exist is left out every round (the source asks
// every TTL): counted each time, said once in the events, and the pool keeps
// the targets that resolve.
TEST(DnsDiscoveryReal, AnEntryLeftOutEveryRoundIsSaidOnce) {
  const auto program = findProgram("dnsmasq");
  if (!program) GTEST_SKIP() << "dnsmasq is not installed (scripts/bootstrap installs it)";
  TempDir dir;
  const std::string hosts = dir / "hosts";
  writeAll(hosts, "10.9.3.1 gpu1.cloud.test\n");
  const std::uint16_t port = freeUdpPort();
  Dnsmasq dns(*program, hosts, port,
              {"--srv-host=_gpu._tcp.cloud.test,gpu1.cloud.test,8000,0,30",
               "--srv-host=_gpu._tcp.cloud.test,gpu9.cloud.test,8000,0,70"});
  ASSERT_TRUE(dns.running());
  const std::string discovery =
      R"(kind = "dns", name = "_gpu._tcp.cloud.test", type = "SRV", server = "127.0.0.1:)" +
      std::to_string(port) + R"(", min_ttl = 1, timeout = 1, hold = 3)";
  std::unique_ptr<Daemon> d;
  for (int attempt = 0; attempt < 20; ++attempt) {
    d.reset();
    d = std::make_unique<Daemon>(dir, configText(dir / "state", discovery));
    if (d->cloud().size() == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(d->cloud().size(), 1u) << d->source().dump();
  Millis now = 1000;
  d->run(now, 5000);  // five more rounds
  const Json s = d->source();
  EXPECT_GE(s["refreshes"].get<std::uint64_t>(), 6u) << s.dump();
  EXPECT_EQ(s["invalid"], s["refreshes"]) << s.dump();  // one left out per round
  ASSERT_FALSE(s["last_invalid"].empty());
  EXPECT_NE(s["last_invalid"][0].get<std::string>().find("gpu9.cloud.test"), std::string::npos);
  EXPECT_EQ(s["errors"], 0);
  const ApiResult page = d->cp().events(0, 1000);
  int said = 0;
  for (const Json& e : std::get<Json>(page)["events"]) {
    said += e["cause"].get<std::string>().find("gpu9.cloud.test") != std::string::npos ? 1 : 0;
  }
  EXPECT_EQ(said, 1);
  EXPECT_EQ(d->cloud().count("d-10-9-3-1"), 1u);
}

TEST(DnsDiscoveryReal, SrvWeightsFromARealServer) {
  const auto program = findProgram("dnsmasq");
  if (!program) GTEST_SKIP() << "dnsmasq is not installed (scripts/bootstrap installs it)";
  TempDir dir;
  const std::string hosts = dir / "hosts";
  writeAll(hosts, "10.9.2.1 gpu1.cloud.test\n10.9.2.2 gpu2.cloud.test\n");
  const std::uint16_t port = freeUdpPort();
  Dnsmasq dns(*program, hosts, port,
              {"--srv-host=_gpu._tcp.cloud.test,gpu1.cloud.test,8000,0,30",
               "--srv-host=_gpu._tcp.cloud.test,gpu2.cloud.test,8000,0,70",
               "--srv-host=_gpu._tcp.cloud.test,gpu3.cloud.test,8000,5,100"});
  ASSERT_TRUE(dns.running());
  DiscoveryConfig c = dnsConfig(DnsRecordType::Srv);
  c.dnsName = "_gpu._tcp.cloud.test";
  c.server = ip("127.0.0.1");
  c.serverPort = port;
  c.timeout = 1000;
  std::vector<DiscoveredBackend> got;
  for (int attempt = 0; attempt < 20 && got.empty(); ++attempt) {
    DnsSource s(c);
    (void)s.prime(0);
    got = s.backends();
    if (got.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(got.size(), 2u);  // not gpu3, of a higher priority value
  std::map<std::string, std::uint32_t> weights;
  for (const DiscoveredBackend& b : got) weights[b.name] = b.weight;
  EXPECT_EQ(weights,
            (std::map<std::string, std::uint32_t>{{"d-10-9-2-1", 30}, {"d-10-9-2-2", 70}}));
}

}  // namespace
}  // namespace spillway
