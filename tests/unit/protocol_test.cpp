// The CLI socket protocol: every command's happy path reaches the right
// ControlApi call with the right arguments; malformed, oversized, ill-typed
// and unauthorised requests get an error reply and reach nothing; replies
// are always well-formed JSON.
#include "control/api/protocol.hpp"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "fake_control_api.hpp"

namespace spillway {
namespace {

using testing::FakeControlApi;

const PeerCredentials kRoot{1, 0, 0, {}};
const PeerCredentials kOperator{2, 1000, 1000, {1000, 4242}};
const PeerCredentials kStranger{3, 2000, 2000, {2000}};

AccessPolicy operatorsPolicy() {
  AccessPolicy p;
  p.gids = {4242};
  return p;
}

Json parseJson(const std::string& text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << text;
  return j;
}

// The reply must be one of the two documented shapes.
Reply mustParse(const std::string& reply) {
  std::optional<Reply> r = parseReply(reply);
  EXPECT_TRUE(r.has_value()) << reply;
  return r.value_or(Reply{});
}

struct HappyCase {
  std::string request;
  std::string call;
};

TEST(Protocol, EveryCommandReachesItsCall) {
  const std::vector<HappyCase> cases = {
      {R"({"v":1,"cmd":"status"})", "status()"},
      {R"({"v":1,"cmd":"vip.list","args":{}})", "vipList()"},
      {R"({"v":1,"cmd":"vip.show","args":{"name":"nccl"}})", "vipShow(nccl)"},
      {R"({"v":1,"cmd":"pool.list"})", "poolList()"},
      {R"({"v":1,"cmd":"pool.show","args":{"name":"onprem"}})", "poolShow(onprem)"},
      {R"({"v":1,"cmd":"backend.list"})", "backendList()"},
      {R"({"v":1,"cmd":"backend.add","args":{"name":"gpu-x","address":"10.0.0.9","pool":"onprem"}})",
       "backendAdd(gpu-x)"},
      {R"({"v":1,"cmd":"backend.remove","args":{"name":"gpu-x"}})", "backendRemove(gpu-x)"},
      {R"({"v":1,"cmd":"backend.drain","args":{"name":"gpu-a1"}})", "backendDrain(gpu-a1)"},
      {R"({"v":1,"cmd":"backend.undrain","args":{"name":"gpu-a1"}})", "backendUndrain(gpu-a1)"},
      {R"({"v":1,"cmd":"backend.disable","args":{"name":"gpu-a1"}})", "backendDisable(gpu-a1)"},
      {R"({"v":1,"cmd":"backend.enable","args":{"name":"gpu-a1"}})", "backendEnable(gpu-a1)"},
      {R"({"v":1,"cmd":"backend.weight","args":{"name":"gpu-a1","weight":250}})",
       "backendWeight(gpu-a1,250,apply)"},
      {R"({"v":1,"cmd":"backend.weight","args":{"name":"gpu-a1","weight":0,"dry_run":true}})",
       "backendWeight(gpu-a1,0,dry)"},
      {R"({"v":1,"cmd":"backend.weight","args":{"name":"gpu-a1","weight":4294967295,"dry_run":false}})",
       "backendWeight(gpu-a1,4294967295,apply)"},
      {R"({"v":1,"cmd":"table.show"})", "tableShow()"},
      {R"({"v":1,"cmd":"table.show","args":{"vip":"nccl"}})", "tableShow(nccl)"},
      {R"({"v":1,"cmd":"table.digest"})", "tableDigest()"},
      {R"({"v":1,"cmd":"table.digest","args":{"vip":"nccl","chunk":3}})", "tableDigest(nccl,3)"},
      {R"({"v":1,"cmd":"flows"})", "flows()"},
      {R"({"v":1,"cmd":"flows.adopted"})", "flowsAdopted()"},
      {R"({"v":1,"cmd":"stats"})", "stats()"},
      {R"({"v":1,"cmd":"health"})", "health()"},
      {R"({"v":1,"cmd":"events"})", "events(0,100)"},
      {R"({"v":1,"cmd":"events","args":{"after":18446744073709551615,"limit":1000}})",
       "events(18446744073709551615,1000)"},
      {R"({"v":1,"cmd":"config.check"})", "configCheck()"},
      {R"({"v":1,"cmd":"config.check","args":{"path":"/etc/spillway/new.toml"}})",
       "configCheck(/etc/spillway/new.toml)"},
      {R"({"v":1,"cmd":"config.reload"})", "configReload()"},
      {R"({"v":1,"cmd":"config.reload","args":{"path":"/etc/spillway/new.toml"}})",
       "configReload(/etc/spillway/new.toml)"},
      {R"({"v":1,"cmd":"config.dump"})", "configDump()"},
      {R"({"v":1,"cmd":"config.dump","args":{"effective":true}})", "configDump(effective)"},
      {R"({"v":1,"cmd":"config.clear-overrides"})", "configClearOverrides()"},
      {R"({"v":1,"cmd":"config.clear-overrides","args":{"backend":"gpu-a1"}})",
       "configClearOverrides(gpu-a1)"},
      {R"({"v":1,"cmd":"lb.drain"})", "lbDrain()"},
      {R"({"v":1,"cmd":"lb.undrain"})", "lbUndrain()"},
      {R"({"v":1,"cmd":"lb.status"})", "lbStatus()"},
      {R"({"v":1,"cmd":"discovery"})", "discovery()"},
      // Key order and whitespace do not matter.
      {" {\n \"args\" : { \"name\" : \"gpu-a1\" } , \"cmd\":\"backend.drain\", \"v\":1}\n",
       "backendDrain(gpu-a1)"},
  };
  std::set<std::string> covered;
  for (const HappyCase& c : cases) {
    FakeControlApi api;
    const std::string reply = handleRequest(c.request, api, kRoot, AccessPolicy{});
    const Reply r = mustParse(reply);
    EXPECT_TRUE(r.ok) << c.request << " -> " << reply;
    ASSERT_EQ(api.calls.size(), 1u) << c.request;
    EXPECT_EQ(api.calls[0], c.call);
    covered.insert(parseJson(c.request)["cmd"].get<std::string>());
  }
  for (const CommandSpec& spec : commandTable()) {
    EXPECT_TRUE(covered.contains(std::string(spec.name))) << spec.name << " has no happy case";
  }
}

TEST(Protocol, CommandListIsTheReference) {
  std::vector<std::string> names;
  for (const CommandSpec& spec : commandTable()) names.emplace_back(spec.name);
  // clang-format off
  EXPECT_EQ(names, (std::vector<std::string>{"status",
                                             "vip.list",
                                             "vip.show",
                                             "pool.list",
                                             "pool.show",
                                             "backend.list",
                                             "backend.add",
                                             "backend.remove",
                                             "backend.drain",
                                             "backend.undrain",
                                             "backend.disable",
                                             "backend.enable",
                                             "backend.weight",
                                             "table.show",
                                             "table.digest",
                                             "flows",
                                             "flows.adopted",
                                             "stats",
                                             "health",
                                             "events",
                                             "config.check",
                                             "config.reload",
                                             "config.dump",
                                             "config.clear-overrides",
                                             "lb.drain",
                                             "lb.undrain",
                                             "lb.status",
                                             "discovery"}));
  // clang-format on
  EXPECT_EQ(findCommand("lb.drain")->access, Access::Write);
  EXPECT_EQ(findCommand("lb.status")->access, Access::Read);
  EXPECT_EQ(findCommand("backend.drain")->access, Access::Write);
  EXPECT_EQ(findCommand("backend.list")->access, Access::Read);
  EXPECT_EQ(findCommand("nope"), nullptr);
}

TEST(Protocol, ResultIsTheApiJson) {
  FakeControlApi api;
  const Reply r = mustParse(handleRequest(R"({"v":1,"cmd":"status"})", api, kRoot, {}));
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.result, std::get<Json>(FakeControlApi().status()));
}

TEST(Protocol, BackendAddPassesEveryField) {
  FakeControlApi api;
  const Reply r = mustParse(handleRequest(
      R"({"v":1,"cmd":"backend.add","args":{"name":"gpu-x","address":"2001:db8::9","pool":"cloud",
          "weight":7,"id":18446744073709551615,"mac":"02:00:00:00:00:09","port":"wan1"}})",
      api, kRoot, {}));
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(api.lastSpec.name, "gpu-x");
  EXPECT_EQ(api.lastSpec.address, "2001:db8::9");
  EXPECT_EQ(api.lastSpec.pool, "cloud");
  EXPECT_EQ(api.lastSpec.weight, 7u);
  EXPECT_EQ(api.lastSpec.id, 18446744073709551615ULL);
  EXPECT_EQ(api.lastSpec.mac, "02:00:00:00:00:09");
  EXPECT_EQ(api.lastSpec.port, "wan1");

  FakeControlApi defaults;
  ASSERT_TRUE(
      mustParse(
          handleRequest(
              R"({"v":1,"cmd":"backend.add","args":{"name":"b","address":"10.0.0.2","pool":"p"}})",
              defaults, kRoot, {}))
          .ok);
  EXPECT_EQ(defaults.lastSpec.weight, BackendSpec{}.weight);
  EXPECT_FALSE(defaults.lastSpec.id.has_value());
  EXPECT_FALSE(defaults.lastSpec.mac.has_value());
  EXPECT_FALSE(defaults.lastSpec.port.has_value());
}

// config.check and config.reload hand the peer's credentials on, so the
// control plane can bound what it reads for whom (config_access.hpp).
TEST(Protocol, ConfigCommandsPassTheCaller) {
  for (const char* request : {R"({"v":1,"cmd":"config.check","args":{"path":"/etc/x.toml"}})",
                              R"({"v":1,"cmd":"config.reload"})"}) {
    FakeControlApi api;
    ASSERT_TRUE(mustParse(handleRequest(request, api, kOperator, operatorsPolicy())).ok);
    ASSERT_TRUE(api.lastCaller.has_value()) << request;
    EXPECT_EQ(api.lastCaller->uid, kOperator.uid);
    EXPECT_EQ(api.lastCaller->groups, kOperator.groups);
  }
}

// A connection in one of the CLI server's change slots: reads are busy.
TEST(Protocol, ChangesOnlyAdmitsPermittedChanges) {
  FakeControlApi api;
  const auto run = [&](const char* request, const PeerCredentials& peer) {
    return mustParse(
        processRequest(request, api, peer, operatorsPolicy(), Admission::ChangesOnly).reply);
  };
  EXPECT_EQ(run(R"({"v":1,"cmd":"status"})", kOperator).errorCode, "busy");
  EXPECT_EQ(run(R"({"v":1,"cmd":"backend.drain","args":{"name":"g"}})", kStranger).errorCode,
            "busy");
  EXPECT_TRUE(run(R"({"v":1,"cmd":"backend.drain","args":{"name":"g"}})", kOperator).ok);
  EXPECT_EQ(api.calls, (std::vector<std::string>{"backendDrain(g)"}));
}

TEST(Protocol, ApiErrorBecomesErrorReply) {
  FakeControlApi api;
  api.replies["backendDrain"] = ApiError{"not_found", "no backend named gpu-zz"};
  const Reply r = mustParse(
      handleRequest(R"({"v":1,"cmd":"backend.drain","args":{"name":"gpu-zz"}})", api, kRoot, {}));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.errorCode, "not_found");
  EXPECT_EQ(r.errorMessage, "no backend named gpu-zz");
}

struct BadCase {
  std::string request;
  std::string code;
};

std::string deep(std::size_t depth) {
  return R"({"v":1,"cmd":"status","args":{"x":)" + std::string(depth, '[') +
         std::string(depth, ']') + "}}";
}

TEST(Protocol, MalformedRequestsReachNothing) {
  const std::string bigName(1 << 20, 'a');
  const std::vector<BadCase> cases = {
      {"", "bad_json"},
      {"{", "bad_json"},
      {R"({"v":1,"cmd":"status")", "bad_json"},
      {R"({"v":1,"cmd":"backend.drain","args":{"name":"gpu-a1"})", "bad_json"},
      {R"({"v":1,"cmd":"status"} {"v":1})", "bad_json"},
      {R"({"v":1,"cmd":"status",})", "bad_json"},
      {"{'v':1,'cmd':'status'}", "bad_json"},
      {std::string("{\"v\":1,\"cmd\":\"status\"}\0", 23), "bad_json"},
      {"[]", "bad_request"},
      {"null", "bad_request"},
      {"42", "bad_request"},
      {R"("status")", "bad_request"},
      {R"({"cmd":"status"})", "bad_request"},
      {R"({"v":2,"cmd":"status"})", "unsupported_version"},
      {R"({"v":"1","cmd":"status"})", "unsupported_version"},
      {R"({"v":1.0,"cmd":"status"})", "unsupported_version"},
      {R"({"v":-1,"cmd":"status"})", "unsupported_version"},
      {R"({"v":1})", "bad_request"},
      {R"({"v":1,"cmd":5})", "bad_request"},
      {R"({"v":1,"cmd":""})", "unknown_command"},
      {R"({"v":1,"cmd":"backend.explode","args":{"name":"a"}})", "unknown_command"},
      {R"({"v":1,"cmd":"STATUS"})", "unknown_command"},
      {R"({"v":1,"cmd":"status","id":7})", "bad_request"},
      {R"({"v":1,"cmd":"status","args":[]})", "bad_request"},
      {R"({"v":1,"cmd":"table.digest","args":{"chunk":1}})", "bad_request"},
      {R"({"v":1,"cmd":"table.digest","args":{"vip":"nccl","chunk":-1}})", "bad_request"},
      {R"({"v":1,"cmd":"status","args":"x"})", "bad_request"},
      {R"({"v":1,"cmd":"status","args":null})", "bad_request"},
      {R"({"v":1,"cmd":"status","args":{"verbose":true}})", "bad_request"},
      {R"({"v":1,"cmd":"vip.show"})", "bad_request"},
      {R"({"v":1,"cmd":"vip.show","args":{}})", "bad_request"},
      {R"({"v":1,"cmd":"vip.show","args":{"name":5}})", "bad_request"},
      {R"({"v":1,"cmd":"vip.show","args":{"name":""}})", "bad_request"},
      {R"({"v":1,"cmd":"vip.show","args":{"name":null}})", "bad_request"},
      {R"({"v":1,"cmd":"vip.show","args":{"name":["a"]}})", "bad_request"},
      {R"({"v":1,"cmd":"vip.show","args":{"name":"a\nb"}})", "bad_request"},
      {R"({"v":1,"cmd":"vip.show","args":{"name":"a\u0000b"}})", "bad_request"},
      {R"({"v":1,"cmd":"vip.show","args":{"name":")" + std::string(5000, 'x') + R"("}})",
       "bad_request"},
      {R"({"v":1,"cmd":"backend.drain","args":{"name":"a","force":true}})", "bad_request"},
      {R"({"v":1,"cmd":"backend.add","args":{"name":"a","address":"10.0.0.1"}})", "bad_request"},
      {R"({"v":1,"cmd":"backend.weight","args":{"name":"a"}})", "bad_request"},
      {R"({"v":1,"cmd":"backend.weight","args":{"name":"a","weight":"100"}})", "bad_request"},
      {R"({"v":1,"cmd":"backend.weight","args":{"name":"a","weight":-1}})", "bad_request"},
      {R"({"v":1,"cmd":"backend.weight","args":{"name":"a","weight":1.5}})", "bad_request"},
      {R"({"v":1,"cmd":"backend.weight","args":{"name":"a","weight":100.0}})", "bad_request"},
      {R"({"v":1,"cmd":"backend.weight","args":{"name":"a","weight":4294967296}})", "bad_request"},
      {R"({"v":1,"cmd":"backend.weight","args":{"name":"a","weight":1e400}})", "bad_request"},
      {R"({"v":1,"cmd":"backend.weight","args":{"name":"a","weight":123456789012345678901234567890}})",
       "bad_request"},
      {R"({"v":1,"cmd":"backend.weight","args":{"name":"a","weight":1,"dry_run":"yes"}})",
       "bad_request"},
      {R"({"v":1,"cmd":"backend.weight","args":{"name":"a","weight":1,"dry_run":1}})",
       "bad_request"},
      {R"({"v":1,"cmd":"backend.add","args":{"name":"a","address":"b","pool":"c","id":-5}})",
       "bad_request"},
      {R"({"v":1,"cmd":"backend.add","args":{"name":"a","address":"b","pool":"c","id":18446744073709551616}})",
       "bad_request"},
      {R"({"v":1,"cmd":"events","args":{"limit":0}})", "bad_request"},
      {R"({"v":1,"cmd":"events","args":{"limit":1001}})", "bad_request"},
      {R"({"v":1,"cmd":"events","args":{"after":-1}})", "bad_request"},
      // Duplicate keys are ambiguous: refused rather than last-one-wins.
      {R"({"v":1,"cmd":"status","cmd":"backend.remove","args":{"name":"a"}})", "bad_request"},
      {R"({"v":1,"cmd":"backend.drain","args":{"name":"a","name":"b"}})", "bad_request"},
      // Invalid UTF-8: a lone continuation byte, an overlong '/', a surrogate.
      {"{\"v\":1,\"cmd\":\"vip.show\",\"args\":{\"name\":\"\xff\"}}", "bad_json"},
      {"{\"v\":1,\"cmd\":\"vip.show\",\"args\":{\"name\":\"\xc0\xaf\"}}", "bad_json"},
      {"{\"v\":1,\"cmd\":\"vip.show\",\"args\":{\"name\":\"\xed\xa0\x80\"}}", "bad_json"},
      {"{\"v\":1,\"cmd\":\"stat\xe9s\"}", "bad_json"},
      // Nesting.
      {deep(kMaxRequestDepth), "bad_request"},
      {deep(20000), "bad_request"},
      {std::string(30000, '['), "bad_request"},
      // Size.
      {R"({"v":1,"cmd":"vip.show","args":{"name":")" + bigName + R"("}})", "too_large"},
      {std::string(kMaxRequestBytes + 1, ' '), "too_large"},
  };
  for (const BadCase& c : cases) {
    FakeControlApi api;
    const RequestOutcome out = processRequest(c.request, api, kRoot, AccessPolicy{});
    const Reply r = mustParse(out.reply);
    EXPECT_FALSE(r.ok) << c.request.substr(0, 200);
    EXPECT_EQ(r.errorCode, c.code) << c.request.substr(0, 200) << " -> " << out.reply;
    EXPECT_FALSE(r.errorMessage.empty());
    EXPECT_TRUE(api.calls.empty()) << c.request.substr(0, 200);
    EXPECT_LT(out.reply.size(), 4096u) << "error replies stay small";
  }
}

TEST(Protocol, ErrorMessagesSayWhatWasWrong) {
  FakeControlApi api;
  Reply r = mustParse(handleRequest(
      R"({"v":1,"cmd":"backend.weight","args":{"name":"a","weight":"heavy"}})", api, kRoot, {}));
  EXPECT_NE(r.errorMessage.find("args.weight"), std::string::npos) << r.errorMessage;
  EXPECT_NE(r.errorMessage.find("\"heavy\""), std::string::npos) << r.errorMessage;
  r = mustParse(handleRequest(R"({"v":1,"cmd":"vip.show"})", api, kRoot, {}));
  EXPECT_NE(r.errorMessage.find("missing argument name"), std::string::npos) << r.errorMessage;
  r = mustParse(handleRequest(R"({"v":1,"cmd":"frobnicate"})", api, kRoot, {}));
  EXPECT_NE(r.errorMessage.find("backend.drain"), std::string::npos) << "lists the known ones";
}

TEST(Protocol, WritesNeedRootOrTheGroup) {
  const AccessPolicy policy = operatorsPolicy();
  const std::vector<std::string> writes = {
      R"({"v":1,"cmd":"backend.add","args":{"name":"b","address":"10.0.0.2","pool":"p"}})",
      R"({"v":1,"cmd":"backend.remove","args":{"name":"b"}})",
      R"({"v":1,"cmd":"backend.drain","args":{"name":"b"}})",
      R"({"v":1,"cmd":"backend.undrain","args":{"name":"b"}})",
      R"({"v":1,"cmd":"backend.disable","args":{"name":"b"}})",
      R"({"v":1,"cmd":"backend.enable","args":{"name":"b"}})",
      R"({"v":1,"cmd":"backend.weight","args":{"name":"b","weight":5}})",
      R"({"v":1,"cmd":"backend.weight","args":{"name":"b","weight":5,"dry_run":false}})",
      R"({"v":1,"cmd":"config.reload"})",
      R"({"v":1,"cmd":"config.check","args":{"path":"/etc/shadow"}})",
  };
  for (const std::string& request : writes) {
    FakeControlApi api;
    const RequestOutcome out = processRequest(request, api, kStranger, policy);
    EXPECT_TRUE(out.write) << request;
    EXPECT_EQ(mustParse(out.reply).errorCode, "forbidden") << request;
    EXPECT_TRUE(api.calls.empty()) << request;
    for (const PeerCredentials& peer : {kRoot, kOperator}) {
      FakeControlApi allowed;
      EXPECT_TRUE(mustParse(handleRequest(request, allowed, peer, policy)).ok) << request;
      EXPECT_EQ(allowed.calls.size(), 1u);
    }
  }
  const std::vector<std::string> reads = {
      R"({"v":1,"cmd":"status"})",
      R"({"v":1,"cmd":"backend.list"})",
      R"({"v":1,"cmd":"events","args":{"after":3}})",
      R"({"v":1,"cmd":"config.check"})",
      R"({"v":1,"cmd":"config.dump"})",
      R"({"v":1,"cmd":"backend.weight","args":{"name":"b","weight":5,"dry_run":true}})",
  };
  for (const std::string& request : reads) {
    FakeControlApi api;
    const RequestOutcome out = processRequest(request, api, kStranger, policy);
    EXPECT_FALSE(out.write) << request;
    EXPECT_TRUE(mustParse(out.reply).ok) << request;
    EXPECT_EQ(api.calls.size(), 1u);
  }
}

TEST(Protocol, PolicyMatchesUidPrimaryAndSupplementaryGroups) {
  AccessPolicy policy;
  policy.uids = {1500};
  policy.gids = {4242};
  EXPECT_TRUE(policy.mayWrite(kRoot));
  EXPECT_TRUE(policy.mayWrite({0, 1500, 1500, {}}));
  EXPECT_TRUE(policy.mayWrite({0, 1600, 4242, {}}));
  EXPECT_TRUE(policy.mayWrite({0, 1600, 1600, {1600, 4242}}));
  EXPECT_FALSE(policy.mayWrite({0, 1600, 1600, {1600, 4243}}));
  EXPECT_FALSE(policy.mayWrite(PeerCredentials{}));
}

TEST(Protocol, OutcomeDescribesTheRequestForTheLog) {
  FakeControlApi api;
  const RequestOutcome out =
      processRequest(R"({"v":1,"cmd":"backend.drain","args":{"name":"gpu-a1"}})", api, kRoot, {});
  EXPECT_TRUE(out.ok);
  EXPECT_TRUE(out.write);
  EXPECT_EQ(out.command, "backend.drain");
  EXPECT_EQ(out.args, R"({"name":"gpu-a1"})");
  EXPECT_TRUE(out.errorCode.empty());
}

TEST(Protocol, HugeReplyBecomesAnError) {
  FakeControlApi api;
  api.replies["configDump"] = Json(std::string(kMaxReplyBytes + 1, 'x'));
  const Reply r = mustParse(handleRequest(R"({"v":1,"cmd":"config.dump"})", api, kRoot, {}));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.errorCode, "reply_too_large");
}

TEST(Protocol, InvalidUtf8FromTheApiIsReplaced) {
  FakeControlApi api;
  api.replies["vipShow"] = Json{{"name", "bad\xff"}};
  const Reply r =
      mustParse(handleRequest(R"({"v":1,"cmd":"vip.show","args":{"name":"x"}})", api, kRoot, {}));
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.result["name"], "bad\xef\xbf\xbd");
}

class ThrowingApi final : public testing::FakeControlApi {
 public:
  ApiResult status() override { throw std::runtime_error("boom"); }
};

TEST(Protocol, AnExceptionInTheApiIsAnInternalError) {
  ThrowingApi api;
  const Reply r = mustParse(handleRequest(R"({"v":1,"cmd":"status"})", api, kRoot, {}));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.errorCode, "internal");
}

TEST(Protocol, ClientHelpersRoundTrip) {
  EXPECT_EQ(parseJson(makeRequest("status")), (Json{{"v", 1}, {"cmd", "status"}}));
  EXPECT_EQ(parseJson(makeRequest("vip.show", Json{{"name", "nccl"}})),
            (Json{{"v", 1}, {"cmd", "vip.show"}, {"args", {{"name", "nccl"}}}}));

  const auto ok = parseReply(makeOkReply(Json{{"a", 1}}));
  ASSERT_TRUE(ok.has_value());
  EXPECT_TRUE(ok->ok);
  EXPECT_EQ(ok->result, (Json{{"a", 1}}));
  const auto error = parseReply(makeErrorReply("forbidden", "no"));
  ASSERT_TRUE(error.has_value());
  EXPECT_FALSE(error->ok);
  EXPECT_EQ(error->errorCode, "forbidden");
  EXPECT_EQ(error->errorMessage, "no");

  for (const char* bad : {"", "{", "[]", R"({"ok":1})", R"({"ok":true})", R"({"ok":false})",
                          R"({"ok":false,"error":{"message":"x"}})", R"({"ok":false,"error":3})"}) {
    EXPECT_FALSE(parseReply(bad).has_value()) << bad;
  }
}

// A deterministic mutation fuzz of valid requests (the libFuzzer target goes
// further): every reply parses, and only requests that still validate may
// reach the API.
TEST(Protocol, MutatedRequestsAlwaysGetAWellFormedReply) {
  const std::vector<std::string> seeds = {
      R"({"v":1,"cmd":"backend.weight","args":{"name":"gpu-a1","weight":250,"dry_run":true}})",
      R"({"v":1,"cmd":"backend.add","args":{"name":"b","address":"10.0.0.2","pool":"p","id":5}})",
      R"({"v":1,"cmd":"events","args":{"after":3,"limit":10}})",
      R"({"v":1,"cmd":"status"})",
  };
  std::mt19937_64 rng(20240601);
  const AccessPolicy policy = operatorsPolicy();
  for (int i = 0; i < 20000; ++i) {
    std::string s = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const std::size_t at = rng() % s.size();
      switch (rng() % 4) {
        case 0:
          s[at] = static_cast<char>(rng() & 0xff);
          break;
        case 1:
          s.erase(at, 1 + rng() % 8);
          break;
        case 2:
          s.insert(at, 1, "{}[]\",:0123456789-.eE\\u"[rng() % 24]);
          break;
        case 3:
          s.insert(at, s.substr(rng() % s.size(), rng() % 16));
          break;
      }
    }
    FakeControlApi api;
    const PeerCredentials& peer = (i % 2 == 0) ? kStranger : kOperator;
    const RequestOutcome out = processRequest(s, api, peer, policy);
    ASSERT_TRUE(parseReply(out.reply).has_value()) << s;
    ASSERT_LE(api.calls.size(), 1u);
    if (!api.calls.empty()) {
      ASSERT_FALSE(out.command.empty());
      ASSERT_TRUE(!out.write || policy.mayWrite(peer)) << s;
    }
  }
}

}  // namespace
}  // namespace spillway
