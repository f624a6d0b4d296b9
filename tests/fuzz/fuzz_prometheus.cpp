// libFuzzer target: any byte string as a Prometheus text exposition, as a
// backend's load endpoint might serve it. The parser must never crash, read
// out of bounds or hit UB, must stay within its limits, and must keep its
// documented invariants: an error rejects everything; a success stores only
// the names asked for, each valid.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "control/health/prometheus_text.hpp"

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace spillway;
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  PrometheusParseOptions small;
  small.limits.maxLineLength = 256;
  small.limits.maxSamples = 64;
  small.limits.maxLabels = 8;
  small.limits.maxFamilies = 16;

  const PrometheusParseOptions defaults;
  for (const PrometheusParseOptions& opts : {small, defaults}) {
    const PrometheusParseResult r = parsePrometheusText(text, opts);
    check(r.sampleLines <= opts.limits.maxSamples);
    check(r.samples.size() <= r.sampleLines);
    if (!r.ok()) {
      check(r.samples.empty() && r.families.empty());
      check(r.error->line >= 1 && !r.error->message.empty());
      check(r.error->column <= opts.limits.maxLineLength + 1);
      continue;
    }
    check(r.families.size() <= opts.limits.maxFamilies);
    for (const PrometheusSample& s : r.samples) {
      check(isValidMetricName(s.name));
      check(s.labels.size() <= opts.limits.maxLabels);
      (void)averageOf(r.samples, s.name);
      (void)sumOf(r.samples, s.name);
    }
  }

  static constexpr std::string_view kKeep[] = {"DCGM_FI_DEV_GPU_UTIL", "vllm:num_requests_waiting"};
  PrometheusParseOptions filtered;
  filtered.keepNames = kKeep;
  const PrometheusParseResult f = parsePrometheusText(text, filtered);
  const PrometheusParseResult all = parsePrometheusText(text);
  check(f.ok() == all.ok());
  for (const PrometheusSample& s : f.samples) check(s.name == kKeep[0] || s.name == kKeep[1]);
  return 0;
}
