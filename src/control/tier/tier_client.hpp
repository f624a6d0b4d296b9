// Talking to a tier: the same request to every instance of a tier file, and
// `tier status`, the comparison of their tables (table_digest.hpp).
//
// fanOut() sends to all instances at once (one thread each) and waits for
// every outcome; an instance that fails (cannot connect, no reply within the
// timeout, an error reply) does not stop the others, so a change is applied
// wherever it can be and the outcomes say where it failed.
//
// tierStatus() asks each instance for its table digests, takes per VIP the
// most common fingerprint as the reference (ties: the first in file order),
// and for each instance that differs fetches only the chunks whose hashes
// differ, from it and from a reference instance, to count differing entries.
//
// Thread contract: TierCall may run on several threads at once (one per
// instance); the rest runs on the caller's thread.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "control/api/protocol.hpp"
#include "control/tier/tier_file.hpp"

namespace spillway {

// What one instance answered.
struct TierOutcome {
  bool ok = false;
  Json result;            // when ok
  std::string errorCode;  // when not: "connect", "timeout", "exchange", "malformed" or the reply's
  std::string errorMessage;
};

using TierCall =
    std::function<TierOutcome(const TierInstance&, std::string_view command, const Json& args)>;

// A TierCall over the instances' CLI sockets: connect() and the reply each
// bounded by `timeout`.
[[nodiscard]] TierCall socketTierCall(std::chrono::milliseconds timeout);

// One outcome per instance, in file order.
[[nodiscard]] std::vector<TierOutcome> fanOut(const TierFile& tier, std::string_view command,
                                              const Json& args, const TierCall& call);

// {NAME: {"ok":true,"result":...} | {"ok":false,"error":{"code","message"}}, ...}
[[nodiscard]] Json fanOutJson(const TierFile& tier, const std::vector<TierOutcome>& outcomes);

// The `tier status` document:
//   {"instances": {NAME: {"ok", "generation", "warmup", "error"?,
//                         "vips": {VIP: {"fingerprint", "table_size", "reference",
//                                        "differing_entries"}}}},
//    "vips": {VIP: {"reference_fingerprint", "reference_instances": [..],
//                   "agreeing", "reporting"}},
//    "intent": {"digests": {DIGEST: [NAME..]}, "reporting", "agree"}}
// and per instance with peers "intent": its tier intent's digest and entry
// count, whether it agrees with every reachable peer, and per peer
// {"received", "digest", "entries", "differing_entries", "agrees", ...}.
// differing_entries is null when it could not be counted (a chunk request
// failed; "differing_error" says why).
[[nodiscard]] Json tierStatus(const TierFile& tier, const TierCall& call);

}  // namespace spillway
