// libFuzzer target for the configuration loader: any bytes as the TOML file
// (loadConfigFromString, which loadConfig() reads a file into). It must never
// crash, throw or hit UB; a rejection names the file and says why; and a
// Config that loads can be turned into a snapshot (config.hpp's promise),
// checked where the VIPs' tables are small enough to build per input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "control/backends/snapshot_builder.hpp"
#include "control/config/config.hpp"

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

// Tables of all VIPs together, in entries, that one input may build.
constexpr std::uint64_t kMaxEntriesBuilt = 1 << 17;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace spillway;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const ConfigResult r = loadConfigFromString(text, "fuzz.toml");
  if (!r.ok()) {
    check(!r.errors().empty());
    for (const ConfigError& e : r.errors()) {
      check(e.file == "fuzz.toml");
      check(!e.message.empty());
    }
    check(!formatErrors(r.errors()).empty());
    return 0;
  }
  check(r.errors().empty());
  const Config& c = r.value();
  std::uint64_t entries = 0;
  for (const VipConfig& v : c.vips) entries += v.tableSize;
  if (entries > kMaxEntriesBuilt) return 0;
  SnapshotBuilder builder;
  if (builder.setConfig(c)) return 0;  // more backends than indices: refused, not a crash
  check(builder.build(1) != nullptr);
  return 0;
}
