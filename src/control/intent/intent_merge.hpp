// The configuration file plus the operator's runtime overlay (intent_journal
// .hpp's IntentOverlay) = the configuration spillwayd runs. A pure function:
// the control plane calls it at start (after replaying the journal), at every
// `config reload` and at `config clear-overrides`.
//
// Per backend name, what the overlay changes and what the file wins on:
//   added    (backend add) the backend joins with the journaled spec, pool and
//            port resolved by name in the file. When the file itself now
//            defines a backend of that name, the file's definition wins and
//            the runtime definition is dropped (its drain/disable and, if it
//            still matches, its weight stay). When it cannot join (its pool or
//            port is gone, its id or address is taken by a file backend) it is
//            a conflict: a reload is rejected, a start drops it (reported).
//            An added backend that was removed stays while its removal's
//            drain can still be running (now - removal < drain_timeout), so a
//            restart resumes the removal; after that it is pruned.
//   removed  (backend remove) a backend the file defines stays out.
//   admin    (drain / disable / enable / undrain) applied to the backend's
//            state by the control plane (not part of Config); a drain keeps
//            its start time, so its deadline survives restarts.
//   weight   (backend weight) replaces the base weight, as long as the file
//            still has the weight the override replaced: when the file's
//            weight changed, the file wins and the override is dropped
//            (HAProxy does the same with a server-state-file weight).
//   Any override of a name that neither the file nor the overlay defines is
//   dropped (reported).
//
// Thread contract: pure; no I/O, no clock (the wall time is passed in).
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "control/config/config.hpp"
#include "control/intent/intent_journal.hpp"

namespace spillway {

struct IntentMerge {
  Config config;                       // file + overlay
  IntentOverlay overlay;               // the overrides that still apply
  std::vector<std::string> dropped;    // overrides that no longer apply, and why
  std::vector<std::string> conflicts;  // added backends that cannot join, and why
};

// wallNowMs: the Unix time now; drainTimeout: the file's policy.drainTimeout.
[[nodiscard]] IntentMerge mergeIntent(const Config& file, const IntentOverlay& overlay,
                                      std::int64_t wallNowMs, Millis drainTimeout);

// The backend an Add record defines, resolved against `config` (pool and
// port by name); an error text when it cannot be.
[[nodiscard]] std::variant<BackendConfig, std::string> backendFromRecord(const IntentRecord& add,
                                                                         const Config& config);

}  // namespace spillway
