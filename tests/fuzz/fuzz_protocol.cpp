// libFuzzer target for the CLI socket protocol, in two modes picked by the
// first byte:
//  - '{' or JSON white space: the input is one raw request message;
//  - anything else: the bytes choose a command (every row of the command
//    table, commands.hpp) and, per argument, whether it is left out, well
//    typed (names, addresses, MACs, numbers at the edges of the row's range
//    and of their type) or ill typed, plus an unknown argument now and then,
//    so every command's arguments reach validation and, past it, the handler.
// Each request is handled once for root and once for a peer without write
// access, by a FakeControlApi: whatever the bytes, handleRequest must return
// a well-formed reply, make at most one ControlApi call, make none for a
// rejected request, and never let the unprivileged peer reach a call that
// changes state. A structured request then goes to a real ControlPlane (no
// data path, no state directory), whose own checks of the arguments must
// answer with a well-formed reply and leave it answering.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>

#include "../unit/estate_fixture.hpp"
#include "../unit/fake_control_api.hpp"
#include "control/api/protocol.hpp"
#include "control/backends/snapshot_builder.hpp"
#include "control/config/config.hpp"
#include "control/plane/control_plane.hpp"

namespace {

using namespace spillway;

void check(bool condition, int line = __builtin_LINE()) {
  if (!condition) {
    std::fprintf(stderr, "fuzz_protocol: check at line %d failed\n", line);
    std::abort();
  }
}

const AccessPolicy kPolicy{{1500}, {4242}};
const PeerCredentials kRoot{1, 0, 0, {}};
const PeerCredentials kNobody{2, 2000, 2000, {2000}};

void once(std::string_view message, const PeerCredentials& peer) {
  testing::FakeControlApi api;
  const RequestOutcome out = processRequest(message, api, peer, kPolicy);
  const std::optional<Reply> reply = parseReply(out.reply);
  check(reply.has_value());
  check(reply->ok == out.ok);
  check(api.calls.size() <= 1);
  if (out.ok) check(api.calls.size() == 1);
  if (!api.calls.empty()) check(!out.write || kPolicy.mayWrite(peer));
  if (out.command.empty()) check(api.calls.empty());
  if (message.size() > kMaxRequestBytes) check(reply->errorCode == "too_large");
}

// Reads the fuzzer's bytes as choices; zeros once they run out.
class Choices {
 public:
  Choices(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::uint64_t number() {
    std::uint64_t v = 0;
    const int n = 1 + byte() % 8;
    for (int i = 0; i < n; ++i) v = v << 8 | byte();
    return v;
  }
  std::string text() {
    const std::size_t n = byte() % 48;
    std::string s;
    for (std::size_t i = 0; i < n && pos_ < size_; ++i) s += static_cast<char>(byte());
    return s;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

template <std::size_t N>
std::string pick(Choices& c, const std::array<const char*, N>& words) {
  return words[c.byte() % N];
}

Json stringValue(std::string_view arg, Choices& c) {
  static constexpr std::array<const char*, 10> kNames{
      "b1", "b2", "gpu-a1", "onprem", "cloud", "v", "p0", "nope", "b1 ", "\xc3\xa9t\xc3\xa9"};
  static constexpr std::array<const char*, 9> kAddresses{
      "10.0.0.11",       "10.0.0.99", "fe80::1", "2001:db8::5", "0.0.0.0",
      "255.255.255.255", "10.0.0",    "::",      "10.0.0.11/24"};
  static constexpr std::array<const char*, 6> kMacs{"02:00:00:00:00:09", "ff:ff:ff:ff:ff:ff",
                                                    "00:00:00:00:00:00", "02:00:00:00:00",
                                                    "02-00-00-00-00-09", "zz:00:00:00:00:01"};
  // Never a path the fuzzer can make up: it must not read arbitrary files.
  static constexpr std::array<const char*, 5> kPaths{"/nonexistent/spillway.toml", "/dev/zero", "/",
                                                     "relative.toml", "/proc/self/status"};
  switch (c.byte() % 4) {
    case 0:
      return c.text();  // made-up bytes (invalid UTF-8, control characters, ...)
    case 1:
      return std::string(c.byte() % 2 ? 300 : 256, 'x');  // at and past the limit
    default:
      break;
  }
  if (arg == "path") return pick(c, kPaths);
  if (arg == "address") return pick(c, kAddresses);
  if (arg == "mac") return pick(c, kMacs);
  return pick(c, kNames);
}

// Numbers at the edges of the row's range (and one past them) and of the
// JSON integer types, or any.
Json numberValue(const ArgSpec& a, Choices& c) {
  switch (c.byte() % 8) {
    case 0:
      return 0;
    case 1:
      return std::numeric_limits<std::uint32_t>::max();
    case 2:
      return std::uint64_t{std::numeric_limits<std::uint32_t>::max()} + 1;
    case 3:
      return std::numeric_limits<std::uint64_t>::max();
    case 4:
      return c.byte();
    case 5:
      return c.byte() % 2 == 0 ? a.min : a.min - 1;
    case 6:
      return c.byte() % 2 == 0 ? a.max : a.max + 1;
    default:
      return a.type == ArgType::Uint32 ? Json(c.number() & 0xffffffff) : Json(c.number());
  }
}

Json illTyped(Choices& c) {
  switch (c.byte() % 7) {
    case 0:
      return nullptr;
    case 1:
      return -1;
    case 2:
      return 1.5;
    case 3:
      return "7";
    case 4:
      return Json::array({1});
    case 5:
      return Json::object();
    default:
      return true;
  }
}

std::string structuredRequest(Choices& c, const CommandSpec*& command) {
  const std::span<const CommandSpec> commands = commandTable();
  command = &commands[c.byte() % commands.size()];
  Json args = Json::object();
  for (const ArgSpec& a : command->args) {
    const std::uint8_t how = c.byte() % 8;
    if (how == 0 || (how == 1 && !a.required)) continue;  // left out
    if (how == 7) {
      args[std::string(a.name)] = illTyped(c);
      continue;
    }
    switch (a.type) {
      case ArgType::String:
        args[std::string(a.name)] = stringValue(a.name, c);
        break;
      case ArgType::Uint32:
      case ArgType::Uint64:
        args[std::string(a.name)] = numberValue(a, c);
        break;
      case ArgType::Bool:
        args[std::string(a.name)] = c.byte() % 2 == 1;
        break;
    }
  }
  if (c.byte() % 16 == 0) args["extra"] = 1;  // an argument the command does not take
  return makeRequest(command->name, args);
}

const std::string kEstate = test::estateHead() + test::poolToml("onprem", "onprem", 0) +
                            test::poolToml("cloud", "cloud", 1) +
                            test::vipToml({"onprem", "cloud"}) + "\n[control]\nstate_dir = \"\"\n" +
                            test::backendToml("b1", "10.0.0.11", "onprem") +
                            test::backendToml("b2", "10.0.0.21", "cloud");

void againstControlPlane(std::string_view message) {
  static const Config config = [] {
    ConfigResult r = loadConfigFromString(kEstate, "fuzz.toml");
    check(r.ok());
    return std::move(r).value();
  }();
  SnapshotBuilder builder;
  check(!builder.setConfig(config));
  Millis now = 1000;
  ControlPlane control(config, "/nonexistent/spillway.toml", builder, nullptr, now,
                       [&] { return static_cast<std::int64_t>(1'700'000'000'000 + now); });
  (void)control.tick(now += 5);
  for (const PeerCredentials& peer : {kNobody, kRoot}) {
    const RequestOutcome out = processRequest(message, control, peer, kPolicy);
    const std::optional<Reply> reply = parseReply(out.reply);
    check(reply.has_value() && reply->ok == out.ok);
    if (!out.ok) check(!reply->errorCode.empty());
    if (control.tick(now += 5)) (void)control.takeSnapshot(now);
  }
  const RequestOutcome status = processRequest(makeRequest("status"), control, kNobody, kPolicy);
  check(status.ok);
  const RequestOutcome list =
      processRequest(makeRequest("backend.list"), control, kNobody, kPolicy);
  check(list.ok);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view raw(reinterpret_cast<const char*>(data), size);
  const bool json = size > 0 && (data[0] == '{' || data[0] == ' ' || data[0] == '\t' ||
                                 data[0] == '\n' || data[0] == '\r');
  if (size == 0 || json) {
    once(raw, kRoot);
    once(raw, kNobody);
    return 0;
  }
  Choices choices(data + 1, size - 1);
  const CommandSpec* command = nullptr;
  const std::string message = structuredRequest(choices, command);
  once(message, kRoot);
  once(message, kNobody);
  if (data[0] % 4 == 0 || command->access == Access::Write) againstControlPlane(message);
  return 0;
}
