#include "control/intent/intent_merge.hpp"

#include <algorithm>

namespace spillway {

std::variant<BackendConfig, std::string> backendFromRecord(const IntentRecord& add,
                                                           const Config& config) {
  BackendConfig b;
  b.name = add.backend;
  b.id = add.id;
  b.address = add.address;
  b.weight = add.weight;
  b.mac = add.mac;
  bool pool = false, port = false;
  for (std::uint32_t p = 0; p < config.pools.size(); ++p) {
    if (config.pools[p].name == add.pool) {
      b.pool = add.pool;
      b.poolIndex = p;
      pool = true;
    }
  }
  if (!pool) return "its pool '" + add.pool + "' is not in the file";
  for (std::uint32_t p = 0; p < config.ports.size(); ++p) {
    if (config.ports[p].name == add.port) {
      b.port = add.port;
      b.portIndex = p;
      port = true;
    }
  }
  if (!port) return "its port '" + add.port + "' is not in the file";
  const PortConfig& pc = config.ports[b.portIndex];
  if ((b.address.version == IpVersion::V4 ? pc.address : pc.address6) == std::nullopt) {
    return "port " + pc.name + " has no tunnel source address for its address family";
  }
  if (b.weight > kMaxBackendWeight) return "weight above " + std::to_string(kMaxBackendWeight);
  for (const BackendConfig& o : config.backends) {
    if (o.id == b.id) return "its id " + std::to_string(b.id) + " belongs to " + o.name;
    if (o.address == b.address) {
      return "its address " + formatIpAddress(b.address) + " belongs to " + o.name;
    }
  }
  return b;
}

IntentMerge mergeIntent(const Config& file, const IntentOverlay& overlay, std::int64_t wallNowMs,
                        Millis drainTimeout) {
  IntentMerge m;
  m.config = file;
  m.overlay = overlay;
  auto fileBackend = [&](const std::string& name) -> BackendConfig* {
    for (BackendConfig& b : m.config.backends) {
      if (b.name == name) return &b;
    }
    return nullptr;
  };
  std::vector<std::string> removedNames;
  // Added backends join in journal order, after the file's.
  std::vector<const BackendOverride*> order;
  for (const auto& [name, o] : overlay.backends()) order.push_back(&o);
  std::sort(order.begin(), order.end(), [](const BackendOverride* a, const BackendOverride* b) {
    const std::uint64_t sa = a->added ? a->added->seq : 0, sb = b->added ? b->added->seq : 0;
    return sa < sb;
  });
  const std::size_t fileCount = m.config.backends.size();
  for (const BackendOverride* op : order) {
    const BackendOverride& o = *op;
    BackendOverride kept = o;
    bool erase = false;
    const bool inFile = std::any_of(file.backends.begin(), file.backends.end(),
                                    [&](const BackendConfig& b) { return b.name == o.name; });
    if (o.added && inFile) {
      m.dropped.push_back("backend " + o.name +
                          ": the file defines it now, its runtime definition (journal seq " +
                          std::to_string(o.added->seq) + ") is dropped");
      kept.added.reset();
    } else if (o.added) {
      const bool removalOver =
          o.removed && wallNowMs - o.removed->wallMs >= static_cast<std::int64_t>(drainTimeout);
      if (removalOver) {
        erase = true;  // its removal has finished: nothing left to keep
      } else {
        // Checked against the file's backends only (other added ones were
        // checked when they were accepted, in this order).
        Config fileOnly = m.config;
        fileOnly.backends.resize(fileCount);
        auto b = backendFromRecord(*o.added, fileOnly);
        if (auto* why = std::get_if<std::string>(&b)) {
          m.conflicts.push_back("backend " + o.name + " (added at run time, journal seq " +
                                std::to_string(o.added->seq) + "): " + *why);
          erase = true;
        } else {
          BackendConfig bc = std::get<BackendConfig>(b);
          if (o.weight) bc.weight = *o.weight;
          m.config.backends.push_back(bc);
        }
      }
    }
    if (!erase && !kept.added) {
      BackendConfig* fb = fileBackend(o.name);
      if (fb == nullptr) {
        m.dropped.push_back("backend " + o.name +
                            ": no longer in the file, its runtime overrides are dropped");
        erase = true;
      } else {
        if (kept.weight && kept.weightReplaced != fb->weight) {
          m.dropped.push_back("backend " + o.name + ": the file changed its weight (" +
                              std::to_string(kept.weightReplaced) + " -> " +
                              std::to_string(fb->weight) +
                              "), the file wins over the runtime "
                              "weight " +
                              std::to_string(*kept.weight));
          kept.weight.reset();
          kept.weightReplaced = 0;
          kept.weightStamp = {};
        }
        if (kept.weight) fb->weight = *kept.weight;
        if (kept.removed) removedNames.push_back(o.name);
        kept.id = fb->id;
        if (!kept.removed && !kept.admin && !kept.weight) erase = true;
      }
    }
    if (erase) {
      m.overlay.erase(o.name);
    } else {
      m.overlay.put(std::move(kept));
    }
  }
  std::erase_if(m.config.backends, [&](const BackendConfig& b) {
    return std::find(removedNames.begin(), removedNames.end(), b.name) != removedNames.end();
  });
  return m;
}

}  // namespace spillway
