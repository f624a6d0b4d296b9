// The data path's counters as the operator sees them: the JSON document of
// `spillwayctl stats`, the --stats-file and the daemon's last line, with
// backends named from the live configuration (not the start-up one).
//
// Thread contract: a pure function of its arguments; control thread.
#pragma once

#include <cstdint>

#include "control/api/control_api.hpp"
#include "control/backends/snapshot_builder.hpp"
#include "control/config/config.hpp"
#include "spillway/dataplane.hpp"

namespace spillway {

[[nodiscard]] Json statsDocument(const DataplaneCounters& counters, const Config& config,
                                 const SnapshotBuilder& builder, std::uint64_t generation);

}  // namespace spillway
