// libFuzzer target for the CLI socket protocol: the input is one request
// message, handled once for root and once for a peer without write access.
// Whatever the bytes, handleRequest must return a well-formed reply, make at
// most one ControlApi call, make none for a rejected request, and never let
// the unprivileged peer reach a call that changes state.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "../unit/fake_control_api.hpp"
#include "control/protocol.hpp"

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

void once(std::string_view message, const spillway::PeerCredentials& peer) {
  using namespace spillway;
  const AccessPolicy policy{{1500}, {4242}};
  testing::FakeControlApi api;
  const RequestOutcome out = processRequest(message, api, peer, policy);
  const std::optional<Reply> reply = parseReply(out.reply);
  check(reply.has_value());
  check(reply->ok == out.ok);
  check(api.calls.size() <= 1);
  if (out.ok) check(api.calls.size() == 1);
  if (!api.calls.empty()) check(!out.write || policy.mayWrite(peer));
  if (out.command.empty()) check(api.calls.empty());
  if (message.size() > kMaxRequestBytes) check(reply->errorCode == "too_large");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view message(reinterpret_cast<const char*>(data), size);
  once(message, spillway::PeerCredentials{1, 0, 0, {}});
  once(message, spillway::PeerCredentials{2, 2000, 2000, {2000}});
  return 0;
}
