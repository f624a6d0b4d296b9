// A parser of the Prometheus text exposition format, version 0.0.4: what the
// DCGM exporter, vLLM and Triton serve, and what load feedback scrapes.
//
// Accepted, as the format's reference (prometheus/common expfmt) accepts it:
//  - `# HELP name text` (escapes \\ and \n in the text) and `# TYPE name
//    counter|gauge|histogram|summary|untyped`, at most one TYPE per name and
//    before that name's first sample; any other `#` line is a comment;
//  - samples `name{label="value",...} value [timestamp]`: names
//    [a-zA-Z_:][a-zA-Z0-9_:]* (so vllm:num_requests_waiting), label names
//    [a-zA-Z_][a-zA-Z0-9_]*, label values UTF-8 with the escapes \\ \" \n, an
//    optional trailing comma, blanks and tabs between tokens; values as floats
//    including +Inf, -Inf, Inf and NaN; an optional integer timestamp in ms;
//  - blank lines, and CRLF as well as LF line ends.
// Anything else is an error naming the line and column and what was expected;
// one error rejects the whole text, as a Prometheus scrape would.
//
// Bounded: a line longer than limits.maxLineLength or more samples than
// limits.maxSamples is an error, so a hostile or broken endpoint costs at most
// input-size work and limits-bounded memory. The caller bounds the input size.
// keepNames restricts which samples are stored (all are still validated), so a
// scrape of a large exposition keeps only the metrics it uses.
//
// Thread contract: pure functions; any thread; noexcept (allocation failure
// comes back as an error). Fuzzed by tests/fuzz/fuzz_prometheus.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace spillway {

enum class PrometheusType : std::uint8_t { Untyped, Counter, Gauge, Histogram, Summary };

struct PrometheusSample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;  // in the order written, unescaped
  double value = 0.0;
  std::optional<std::int64_t> timestampMs;

  // The value of label `name`, if the sample has it.
  [[nodiscard]] std::optional<std::string_view> label(std::string_view labelName) const noexcept;
};

// A metric family named by # TYPE and / or # HELP.
struct PrometheusFamily {
  std::string name;
  PrometheusType type = PrometheusType::Untyped;
  std::string help;  // unescaped; empty without # HELP
};

struct PrometheusParseError {
  std::size_t line = 0;    // 1-based
  std::size_t column = 0;  // 1-based byte column; 0 when the error has no place
  std::string message;
};

// "line 3, column 17: ..." (or "line 3: ..." without a column).
[[nodiscard]] std::string formatError(const PrometheusParseError& error);

struct PrometheusParseLimits {
  std::size_t maxLineLength = 64 * 1024;  // bytes, without the line end
  std::size_t maxSamples = 100'000;       // sample lines, stored or not
  std::size_t maxLabels = 64;             // per sample
  std::size_t maxFamilies = 10'000;       // # TYPE / # HELP names remembered
};

struct PrometheusParseOptions {
  PrometheusParseLimits limits{};
  // Store only samples with one of these names; empty: store all.
  std::span<const std::string_view> keepNames{};
};

struct PrometheusParseResult {
  std::vector<PrometheusSample> samples;   // empty when !ok()
  std::vector<PrometheusFamily> families;  // in order of first mention; empty when !ok()
  std::optional<PrometheusParseError> error;
  std::size_t lines = 0;        // lines read (all of them when ok())
  std::size_t sampleLines = 0;  // sample lines seen, stored or not

  [[nodiscard]] bool ok() const noexcept { return !error.has_value(); }
};

[[nodiscard]] PrometheusParseResult parsePrometheusText(
    std::string_view text, const PrometheusParseOptions& options = {}) noexcept;

// Aggregates over every label set of `name` (DCGM reports one sample per GPU).
// NaN samples are skipped; std::nullopt when no sample is left.
[[nodiscard]] std::optional<double> averageOf(std::span<const PrometheusSample> samples,
                                              std::string_view name) noexcept;
[[nodiscard]] std::optional<double> sumOf(std::span<const PrometheusSample> samples,
                                          std::string_view name) noexcept;

[[nodiscard]] std::string_view toString(PrometheusType type) noexcept;

// True when `name` matches [a-zA-Z_:][a-zA-Z0-9_:]*.
[[nodiscard]] bool isValidMetricName(std::string_view name) noexcept;

}  // namespace spillway
