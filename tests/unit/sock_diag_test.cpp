// The backend agent's reading of the kernel's socket diagnostics and its
// answers: parseSockDiagReply over datagrams recorded from a real kernel
// (tests/data/sock_diag/record.py says how), its refusals of truncated and
// foreign messages, and the agent's request parsing, tally, rendering and
// authorisation (conn_agent.hpp).
#include "sock_diag.hpp"

#include <gtest/gtest.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <sys/socket.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <vector>

#include "conn_agent.hpp"

namespace spillway {
namespace {

constexpr std::uint32_t kRecordedSeq = 7;
constexpr std::uint8_t kEstablished = 1;

std::vector<std::byte> recorded(const std::string& name) {
  std::ifstream in(std::string(SPILLWAY_SOURCE_ROOT) + "/tests/data/sock_diag/" + name,
                   std::ios::binary);
  EXPECT_TRUE(in) << name;
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(bytes.size());
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

std::vector<DiagSocket> parseAll(const std::vector<std::byte>& datagram, DiagParseResult& result,
                                 std::uint32_t seq = kRecordedSeq) {
  std::vector<DiagSocket> out;
  result = parseSockDiagReply(datagram, seq, [&](const DiagSocket& s) { out.push_back(s); });
  return out;
}

DiagAddress addr(const std::string& text) {
  return *DiagAddress::parse(text);
}

bool has(const std::vector<DiagSocket>& sockets, const std::string& local, std::uint16_t lport,
         const std::string& remote, std::uint16_t rport) {
  for (const DiagSocket& s : sockets) {
    if (s.local == addr(local) && s.localPort == lport && s.remote == addr(remote) &&
        s.remotePort == rport && s.state == kEstablished)
      return true;
  }
  return false;
}

TEST(SockDiag, RecordedIpv4DumpGivesBothEndsOfEachConnection) {
  DiagParseResult r;
  const auto sockets = parseAll(recorded("tcp4-0.bin"), r);
  ASSERT_EQ(r.status, DiagParse::More) << r.error;
  ASSERT_EQ(sockets.size(), 3U);
  EXPECT_EQ(r.sockets, 3U);
  EXPECT_TRUE(has(sockets, "192.0.2.10", 8080, "198.51.100.7", 40001));
  EXPECT_TRUE(has(sockets, "198.51.100.7", 40001, "192.0.2.10", 8080));
  // The client end of the connection to the dual-stack listener; its server
  // end is an AF_INET6 socket (below).
  EXPECT_TRUE(has(sockets, "198.51.100.7", 40003, "192.0.2.10", 9090));
}

TEST(SockDiag, RecordedIpv6DumpReportsV4MappedAsIpv4) {
  DiagParseResult r;
  const auto sockets = parseAll(recorded("tcp6-0.bin"), r);
  ASSERT_EQ(r.status, DiagParse::More) << r.error;
  ASSERT_EQ(sockets.size(), 3U);
  EXPECT_TRUE(has(sockets, "2001:db8:ffff::10", 8080, "2001:db8:c::7", 40002));
  EXPECT_TRUE(has(sockets, "2001:db8:c::7", 40002, "2001:db8:ffff::10", 8080));
  EXPECT_TRUE(has(sockets, "192.0.2.10", 9090, "198.51.100.7", 40003));
  for (const DiagSocket& s : sockets) {
    if (s.localPort == 9090) {
      EXPECT_TRUE(s.local.v4);
      EXPECT_EQ(s.local.text(), "192.0.2.10");
    }
  }
}

TEST(SockDiag, RecordedDoneEndsTheDump) {
  for (const char* name : {"tcp4-1.bin", "tcp6-1.bin"}) {
    DiagParseResult r;
    EXPECT_TRUE(parseAll(recorded(name), r).empty());
    EXPECT_EQ(r.status, DiagParse::Done) << name;
  }
}

TEST(SockDiag, TruncationAtEveryLengthIsAnErrorNeverACrash) {
  const auto full = recorded("tcp4-0.bin");
  for (std::size_t cut = 1; cut < full.size(); ++cut) {
    std::vector<std::byte> part(full.begin(), full.begin() + static_cast<long>(cut));
    DiagParseResult r;
    const auto sockets = parseAll(part, r);
    // A cut that ends on a message boundary is a shorter valid datagram.
    if (r.status == DiagParse::Error) {
      EXPECT_FALSE(r.error.empty());
    } else {
      EXPECT_EQ(r.status, DiagParse::More);
      EXPECT_LT(sockets.size(), 3U) << cut;
    }
  }
}

TEST(SockDiag, ForeignSequenceTypeAndLengthAreErrors) {
  auto data = recorded("tcp4-0.bin");
  DiagParseResult r;
  (void)parseAll(data, r, kRecordedSeq + 1);
  EXPECT_EQ(r.status, DiagParse::Error);
  EXPECT_NE(r.error.find("sequence"), std::string::npos) << r.error;

  auto badType = data;
  const std::uint16_t route = 16;  // RTM_NEWLINK
  std::memcpy(badType.data() + offsetof(nlmsghdr, nlmsg_type), &route, sizeof(route));
  (void)parseAll(badType, r);
  EXPECT_EQ(r.status, DiagParse::Error);
  EXPECT_NE(r.error.find("type 16"), std::string::npos) << r.error;

  auto badLength = data;
  const std::uint32_t huge = 100000;
  std::memcpy(badLength.data(), &huge, sizeof(huge));
  (void)parseAll(badLength, r);
  EXPECT_EQ(r.status, DiagParse::Error);
  EXPECT_NE(r.error.find("out of bounds"), std::string::npos) << r.error;

  auto tiny = data;
  const std::uint32_t small = 20;  // a header and 4 bytes: no inet_diag_msg
  std::memcpy(tiny.data(), &small, sizeof(small));
  (void)parseAll(tiny, r);
  EXPECT_EQ(r.status, DiagParse::Error);
  EXPECT_NE(r.error.find("truncated inet_diag_msg"), std::string::npos) << r.error;
}

TEST(SockDiag, KernelErrorIsReported) {
  struct {
    nlmsghdr header;
    nlmsgerr error;
  } message{};
  message.header.nlmsg_len = sizeof(message);
  message.header.nlmsg_type = NLMSG_ERROR;
  message.header.nlmsg_seq = kRecordedSeq;
  message.error.error = -EPERM;
  std::vector<std::byte> data(sizeof(message));
  std::memcpy(data.data(), &message, sizeof(message));
  DiagParseResult r;
  (void)parseAll(data, r);
  EXPECT_EQ(r.status, DiagParse::Error);
  EXPECT_NE(r.error.find("kernel answered"), std::string::npos) << r.error;
}

TEST(SockDiag, RequestAsksForTcpDumpOfOpenStates) {
  const auto request = buildTcpDumpRequest(AF_INET6, kOpenTcpStates, 9);
  nlmsghdr header{};
  ASSERT_GE(request.size(), sizeof(header));
  std::memcpy(&header, request.data(), sizeof(header));
  EXPECT_EQ(header.nlmsg_len, request.size());
  EXPECT_EQ(header.nlmsg_type, SOCK_DIAG_BY_FAMILY);
  EXPECT_EQ(header.nlmsg_flags, NLM_F_REQUEST | NLM_F_DUMP);
  EXPECT_EQ(header.nlmsg_seq, 9U);
  // The states the recording used (record.py): not LISTEN (10), TIME_WAIT (6), CLOSE (7).
  EXPECT_EQ(kOpenTcpStates, 0x1b3aU);
}

// ---- the agent ---------------------------------------------------------------

TEST(ConnAgent, TallyCountsOnlyVipLocalSockets) {
  ConnView view;
  view.vips = {addr("192.0.2.10"), addr("2001:db8:ffff::10"), addr("192.0.2.99")};
  view.counts.assign(3, 0);
  for (const char* name : {"tcp4-0.bin", "tcp6-0.bin"}) {
    DiagParseResult r;
    for (const DiagSocket& s : parseAll(recorded(name), r)) view.add(s);
  }
  EXPECT_EQ(view.counts, (std::vector<std::uint64_t>{2, 1, 0}));
  const std::string text = renderConnMetrics(
      view, AgentCounters{.requests = 0, .refused = 4, .badRequests = 0, .dumpErrors = 0});
  EXPECT_NE(text.find("spillway_backend_connections{vip=\"192.0.2.10\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("spillway_backend_connections{vip=\"2001:db8:ffff::10\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("spillway_backend_connections{vip=\"192.0.2.99\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("spillway_backend_agent_refused_total 4\n"), std::string::npos);

  const auto all = nlohmann::json::parse(renderConnList(view, "", 2));
  EXPECT_EQ(all["total"], 3);
  EXPECT_EQ(all["listed"], 2);
  EXPECT_EQ(all["truncated"], true);
  const auto one = nlohmann::json::parse(renderConnList(view, "192.0.2.10", 10));
  EXPECT_EQ(one["total"], 2);
  EXPECT_EQ(one["truncated"], false);
  ASSERT_EQ(one["vips"]["192.0.2.10"].size(), 2U);
  EXPECT_EQ(one["vips"]["192.0.2.10"][0]["client"], "198.51.100.7");
  EXPECT_FALSE(one["vips"].contains("2001:db8:ffff::10"));
}

TEST(ConnAgent, ParsesRequestsAndRefusesMalformedOnes) {
  auto r = parseAgentRequest(
      "GET /connections?x=1&vip=2001%3adb8%3A%3A1 HTTP/1.1\r\nHost: a\r\n"
      "authorization:  Bearer  abc123 \r\n\r\n");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->method, "GET");
  EXPECT_EQ(r->path, "/connections");
  EXPECT_EQ(r->vip, "2001:db8::1");
  EXPECT_EQ(r->bearer, "abc123");
  EXPECT_FALSE(parseAgentRequest("NONSENSE\r\n\r\n"));
  EXPECT_FALSE(parseAgentRequest("GET /x SPDY/3\r\n\r\n"));
  EXPECT_FALSE(parseAgentRequest("GET x HTTP/1.1\r\n\r\n"));
  EXPECT_FALSE(parseAgentRequest("GET /x?vip=%4 HTTP/1.1\r\n\r\n"));
  EXPECT_FALSE(parseAgentRequest("GET /x?vip=%zz HTTP/1.1\r\n\r\n"));
  EXPECT_FALSE(parseAgentRequest("GET /x HTTP/1.1\r\nno colon here\r\n\r\n"));
}

TEST(ConnAgent, TokenComparison) {
  EXPECT_TRUE(tokenMatches("secret-token-0123", "secret-token-0123"));
  EXPECT_FALSE(tokenMatches("secret-token-012", "secret-token-0123"));
  EXPECT_FALSE(tokenMatches("secret-token-01234", "secret-token-0123"));
  EXPECT_FALSE(tokenMatches("secret-token-0124", "secret-token-0123"));
  EXPECT_FALSE(tokenMatches("", ""));
  EXPECT_FALSE(tokenMatches("x", ""));
}

TEST(ConnAgent, AnswersAuthoriseTheListAndNeverTakeAFailedDumpForZero) {
  const std::vector<DiagAddress> vips{addr("192.0.2.10")};
  const std::string token = "0123456789abcdef";
  AgentCounters counters;
  int dumps = 0;
  const auto dump = [&](ConnView& view, std::string&) {
    ++dumps;
    DiagSocket s;
    s.local = addr("192.0.2.10");
    s.remote = addr("198.51.100.7");
    s.state = kEstablished;
    view.add(s);
    return true;
  };
  const auto failing = [&](ConnView&, std::string& error) {
    error = "EPERM";
    return false;
  };
  AgentRequest metrics{.method = "GET", .path = "/metrics", .vip = {}, .bearer = {}};
  auto a = answerAgentRequest(metrics, vips, token, 10, counters, dump);
  EXPECT_EQ(a.status, 200);
  EXPECT_NE(a.body.find("{vip=\"192.0.2.10\"} 1\n"), std::string::npos);

  AgentRequest list{.method = "GET", .path = "/connections", .vip = {}, .bearer = {}};
  a = answerAgentRequest(list, vips, token, 10, counters, dump);
  EXPECT_EQ(a.status, 401);
  list.bearer = "0123456789abcdeX";
  a = answerAgentRequest(list, vips, token, 10, counters, dump);
  EXPECT_EQ(a.status, 401);
  EXPECT_EQ(counters.refused, 2U);
  EXPECT_EQ(dumps, 1);  // a refused request costs no dump
  list.bearer = token;
  a = answerAgentRequest(list, vips, token, 10, counters, dump);
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.contentType, "application/json");
  a = answerAgentRequest(list, vips, "", 10, counters, dump);
  EXPECT_EQ(a.status, 403);

  a = answerAgentRequest(metrics, vips, token, 10, counters, failing);
  EXPECT_EQ(a.status, 503);
  EXPECT_EQ(counters.dumpErrors, 1U);
  AgentRequest post{.method = "POST", .path = "/metrics", .vip = {}, .bearer = {}};
  EXPECT_EQ(answerAgentRequest(post, vips, token, 10, counters, dump).status, 405);
  AgentRequest other{.method = "GET", .path = "/", .vip = {}, .bearer = {}};
  EXPECT_EQ(answerAgentRequest(other, vips, token, 10, counters, dump).status, 404);
}

}  // namespace
}  // namespace spillway
