// The Prometheus text parser: the format's edge cases, its limits, and the
// aggregates load feedback takes from DCGM and vLLM expositions.
#include "control/health/prometheus_text.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

namespace spillway {
namespace {

PrometheusParseResult parseOk(std::string_view text, const PrometheusParseOptions& options = {}) {
  PrometheusParseResult r = parsePrometheusText(text, options);
  EXPECT_TRUE(r.ok()) << (r.error ? formatError(*r.error) : "") << "\n--- input ---\n" << text;
  return r;
}

PrometheusParseError parseBad(std::string_view text, const PrometheusParseOptions& options = {}) {
  PrometheusParseResult r = parsePrometheusText(text, options);
  EXPECT_FALSE(r.ok()) << "accepted:\n" << text;
  EXPECT_TRUE(r.samples.empty());
  EXPECT_TRUE(r.families.empty());
  return r.error.value_or(PrometheusParseError{});
}

constexpr std::string_view kDcgm =
    "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
    "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
    "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-aaaa\",device=\"nvidia0\",modelName=\"NVIDIA H100 "
    "80GB HBM3\",Hostname=\"gpu-a\"} 30\n"
    "DCGM_FI_DEV_GPU_UTIL{gpu=\"1\",UUID=\"GPU-bbbb\",device=\"nvidia1\",modelName=\"NVIDIA H100 "
    "80GB HBM3\",Hostname=\"gpu-a\"} 50\n"
    "DCGM_FI_DEV_GPU_UTIL{gpu=\"2\",UUID=\"GPU-cccc\",device=\"nvidia2\",modelName=\"NVIDIA H100 "
    "80GB HBM3\",Hostname=\"gpu-a\"} 100\n"
    "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n"
    "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
    "DCGM_FI_DEV_FB_USED{gpu=\"0\",UUID=\"GPU-aaaa\"} 40123\n"
    "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
    "vllm:num_requests_waiting{model_name=\"m1\"} 3.0\n"
    "vllm:num_requests_waiting{model_name=\"m2\"} 4.5\n";

TEST(PrometheusText, DcgmAndVllmAggregates) {
  const auto r = parseOk(kDcgm);
  ASSERT_EQ(r.samples.size(), 6u);
  EXPECT_EQ(r.lines, 12u);
  EXPECT_EQ(r.sampleLines, 6u);
  EXPECT_DOUBLE_EQ(averageOf(r.samples, "DCGM_FI_DEV_GPU_UTIL").value(), 60.0);
  EXPECT_DOUBLE_EQ(sumOf(r.samples, "vllm:num_requests_waiting").value(), 7.5);
  EXPECT_DOUBLE_EQ(averageOf(r.samples, "vllm:num_requests_waiting").value(), 3.75);
  EXPECT_FALSE(averageOf(r.samples, "DCGM_FI_DEV_SM_CLOCK").has_value());
  EXPECT_FALSE(sumOf(r.samples, "vllm:num_requests").has_value());  // no prefix match

  const PrometheusSample& s = r.samples[1];
  EXPECT_EQ(s.name, "DCGM_FI_DEV_GPU_UTIL");
  ASSERT_EQ(s.labels.size(), 5u);
  EXPECT_EQ(s.labels[0].first, "gpu");
  EXPECT_EQ(s.labels[0].second, "1");
  EXPECT_EQ(s.label("modelName").value(), "NVIDIA H100 80GB HBM3");
  EXPECT_FALSE(s.label("pci_bus_id").has_value());

  ASSERT_EQ(r.families.size(), 3u);
  EXPECT_EQ(r.families[0].name, "DCGM_FI_DEV_GPU_UTIL");
  EXPECT_EQ(r.families[0].type, PrometheusType::Gauge);
  EXPECT_EQ(r.families[0].help, "GPU utilization (in %).");
  EXPECT_EQ(r.families[2].name, "vllm:num_requests_waiting");
}

TEST(PrometheusText, KeepNamesStoresOnlyThoseButValidatesAll) {
  static constexpr std::string_view kKeep[] = {"vllm:num_requests_waiting"};
  PrometheusParseOptions options;
  options.keepNames = kKeep;
  const auto r = parseOk(kDcgm, options);
  ASSERT_EQ(r.samples.size(), 2u);
  EXPECT_EQ(r.sampleLines, 6u);
  EXPECT_EQ(r.samples[0].labels[0].second, "m1");

  const std::string bad = std::string(kDcgm) + "DCGM_FI_DEV_FB_FREE{gpu=\"0\" 1\n";
  const auto e = parseBad(bad, options);
  EXPECT_EQ(e.line, 13u);
}

TEST(PrometheusText, SpecialValuesAndTimestamps) {
  const auto ok = parseOk(
      "a +Inf\nb -Inf\nc NaN\nd Inf\ne -0.5e-3 1712345678000\nf 1e10 -42\n"
      "h 7 +3\ni 12345678901234567890\nj .5\nk 5.\n");
  ASSERT_EQ(ok.samples.size(), 10u);
  EXPECT_TRUE(std::isinf(ok.samples[0].value) && ok.samples[0].value > 0);
  EXPECT_TRUE(std::isinf(ok.samples[1].value) && ok.samples[1].value < 0);
  EXPECT_TRUE(std::isnan(ok.samples[2].value));
  EXPECT_TRUE(std::isinf(ok.samples[3].value));
  EXPECT_DOUBLE_EQ(ok.samples[4].value, -0.5e-3);
  EXPECT_EQ(ok.samples[4].timestampMs.value(), 1712345678000);
  EXPECT_EQ(ok.samples[5].timestampMs.value(), -42);
  EXPECT_FALSE(ok.samples[0].timestampMs.has_value());
  EXPECT_EQ(ok.samples[6].timestampMs.value(), 3);
  EXPECT_DOUBLE_EQ(ok.samples[7].value, 12345678901234567890.0);
  EXPECT_DOUBLE_EQ(ok.samples[8].value, 0.5);
  EXPECT_DOUBLE_EQ(ok.samples[9].value, 5.0);

  EXPECT_NE(parseBad("g 0x1\n").message.find("invalid value '0x1'"), std::string::npos);
  EXPECT_NE(parseBad("g 1.2.3\n").message.find("invalid value"), std::string::npos);
  EXPECT_NE(parseBad("g +-1\n").message.find("invalid value"), std::string::npos);
  EXPECT_NE(parseBad("g ++1\n").message.find("invalid value"), std::string::npos);
  EXPECT_NE(parseBad("g 1e999\n").message.find("invalid value"), std::string::npos);
  EXPECT_NE(parseBad("g 1 1.5\n").message.find("invalid timestamp '1.5'"), std::string::npos);
  EXPECT_NE(parseBad("g 1 99999999999999999999\n").message.find("invalid timestamp"),
            std::string::npos);
  const auto extra = parseBad("g 1 2 3\n");
  EXPECT_EQ(extra.column, 7u);
  EXPECT_NE(extra.message.find("end of line after the timestamp"), std::string::npos);
}

TEST(PrometheusText, NaNIsSkippedByAggregates) {
  const auto r = parseOk("u{gpu=\"0\"} NaN\nu{gpu=\"1\"} 40\nu{gpu=\"2\"} 60\nv NaN\n");
  EXPECT_DOUBLE_EQ(averageOf(r.samples, "u").value(), 50.0);
  EXPECT_DOUBLE_EQ(sumOf(r.samples, "u").value(), 100.0);
  EXPECT_FALSE(averageOf(r.samples, "v").has_value());
}

TEST(PrometheusText, LabelEscapesAndUtf8) {
  const auto r = parseOk(
      "m{path=\"C:\\\\dir\",msg=\"say \\\"hi\\\"\\nbye\",empty=\"\",city=\"Z\xc3\xbcrich "
      "\xf0\x9f\x9a\x80\"} 1\n");
  ASSERT_EQ(r.samples.size(), 1u);
  const auto& l = r.samples[0].labels;
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[0].second, "C:\\dir");
  EXPECT_EQ(l[1].second, "say \"hi\"\nbye");
  EXPECT_EQ(l[2].second, "");
  EXPECT_EQ(l[3].second, "Z\xc3\xbcrich \xf0\x9f\x9a\x80");
  // Commas, braces and equals signs inside a value are data.
  const auto data = parseOk("m{a=\"x,y}z=w\"} 2\n");
  EXPECT_EQ(data.samples[0].labels[0].second, "x,y}z=w");

  EXPECT_NE(parseBad("m{a=\"\\t\"} 1\n").message.find("invalid escape '\\t'"), std::string::npos);
  EXPECT_NE(parseBad("m{a=\"abc} 1\n").message.find("unterminated"), std::string::npos);
  EXPECT_NE(parseBad("m{a=\"abc\\").message.find("unterminated"), std::string::npos);
  EXPECT_NE(parseBad("m{a=\"\xc3\x28\"} 1\n").message.find("UTF-8"), std::string::npos);
  EXPECT_NE(parseBad("m{a=\"\xed\xa0\x80\"} 1\n").message.find("UTF-8"),
            std::string::npos);  // surrogate
  EXPECT_NE(parseBad("m{a=\"\xc0\xaf\"} 1\n").message.find("UTF-8"),
            std::string::npos);  // overlong
  EXPECT_NE(parseBad("m{a=\"\xf4\x90\x80\x80\"} 1\n").message.find("UTF-8"), std::string::npos);
}

TEST(PrometheusText, LabelSyntax) {
  const auto r = parseOk(
      "a{} 1\n"
      "b{x=\"1\",} 2\n"
      "c { x = \"1\" ,\ty=\"2\" } 3\n"
      "d\t{x=\"1\"}\t4\n"
      "_e:f_1 5\n");
  ASSERT_EQ(r.samples.size(), 5u);
  EXPECT_TRUE(r.samples[0].labels.empty());
  EXPECT_EQ(r.samples[1].labels.size(), 1u);
  EXPECT_EQ(r.samples[2].labels[1].second, "2");
  EXPECT_DOUBLE_EQ(r.samples[3].value, 4.0);
  EXPECT_EQ(r.samples[4].name, "_e:f_1");

  EXPECT_NE(parseBad("m{a=\"1\",a=\"2\"} 1\n").message.find("duplicate label \"a\""),
            std::string::npos);
  EXPECT_NE(parseBad("m{a:b=\"1\"} 1\n").message.find("'='"), std::string::npos);
  EXPECT_NE(parseBad("m{1a=\"1\"} 1\n").message.find("label name"), std::string::npos);
  EXPECT_NE(parseBad("m{a=1} 1\n").message.find("'\"'"), std::string::npos);
  EXPECT_NE(parseBad("m{a=\"1\" b=\"2\"} 1\n").message.find("',' or '}'"), std::string::npos);
  EXPECT_NE(parseBad("m{a=\"1\"\n").message.find("',' or '}'"), std::string::npos);
  EXPECT_NE(parseBad("m{a=\"1\"}1\n").message.find("blank and a value"), std::string::npos);
  EXPECT_NE(parseBad("m{,} 1\n").message.find("label name"), std::string::npos);
  const auto e = parseBad("ok 1\nm{gpu=\"0\" x} 1\n");
  EXPECT_EQ(e.line, 2u);
  EXPECT_EQ(e.column, 11u);
  EXPECT_EQ(formatError(e), "line 2, column 11: expected ',' or '}', found 'x} 1'");
}

TEST(PrometheusText, MetricNames) {
  EXPECT_TRUE(isValidMetricName("vllm:num_requests_waiting"));
  EXPECT_TRUE(isValidMetricName(":a"));
  EXPECT_FALSE(isValidMetricName("1a"));
  EXPECT_FALSE(isValidMetricName(""));
  EXPECT_FALSE(isValidMetricName("a-b"));
  EXPECT_NE(parseBad("1abc 2\n").message.find("metric name"), std::string::npos);
  EXPECT_NE(parseBad("a-b 2\n").message.find("'{' or a blank"), std::string::npos);
  EXPECT_NE(parseBad("abc\n").message.find("'{' or a blank"), std::string::npos);
  EXPECT_NE(parseBad("abc   \n").message.find("expected a value"), std::string::npos);
  EXPECT_NE(parseBad("\"abc\" 1\n").message.find("metric name"), std::string::npos);
}

TEST(PrometheusText, CommentsHelpAndType) {
  const auto r = parseOk(
      "# a free comment, ignored: { = \" \\q\n"
      "#\n"
      "# EOF\n"
      "#HELP tight help without a blank after '#'\n"
      "# HELP esc Line one\\nline two \\\\ done\n"
      "# HELP nohelp\n"
      "# TYPE esc counter\n"
      "# TYPE h histogram\n"
      "# TYPE s summary\n"
      "# TYPE u untyped\n"
      "esc 1\n");
  ASSERT_EQ(r.families.size(), 6u);
  EXPECT_EQ(r.families[0].name, "tight");
  EXPECT_EQ(r.families[0].help, "help without a blank after '#'");
  EXPECT_EQ(r.families[1].help, "Line one\nline two \\ done");
  EXPECT_EQ(r.families[1].type, PrometheusType::Counter);
  EXPECT_EQ(r.families[2].help, "");
  EXPECT_EQ(r.families[3].type, PrometheusType::Histogram);
  EXPECT_EQ(r.families[4].type, PrometheusType::Summary);
  EXPECT_EQ(toString(r.families[5].type), "untyped");

  EXPECT_NE(parseBad("# TYPE x gauges\n").message.find("counter, gauge"), std::string::npos);
  EXPECT_NE(parseBad("# TYPE x\n").message.find("counter, gauge"), std::string::npos);
  EXPECT_NE(parseBad("# TYPE x gauge extra\n").message.find("end of line"), std::string::npos);
  EXPECT_NE(parseBad("# TYPE x gauge\n# TYPE x counter\n").message.find("second # TYPE"),
            std::string::npos);
  EXPECT_NE(parseBad("# HELP x a\n# HELP x b\n").message.find("second # HELP"), std::string::npos);
  EXPECT_NE(parseBad("x 1\n# TYPE x gauge\n").message.find("after its first sample"),
            std::string::npos);
  EXPECT_NE(parseBad("# HELP\n").message.find("metric name after # HELP"), std::string::npos);
  EXPECT_NE(parseBad("# TYPE 9x gauge\n").message.find("metric name after # TYPE"),
            std::string::npos);
  EXPECT_NE(parseBad("# HELP x bad \\t escape\n").message.find("invalid escape"),
            std::string::npos);
  EXPECT_NE(parseBad("# HELP x-y z\n").message.find("blank after the metric name"),
            std::string::npos);
}

TEST(PrometheusText, LineEndsAndBlankLines) {
  const auto r = parseOk("\r\n\n  \t \n# TYPE a gauge\r\na 1\r\n\r\nb{c=\"d\"} 2 7\r\nlast 3");
  ASSERT_EQ(r.samples.size(), 3u);
  EXPECT_EQ(r.samples[1].labels[0].second, "d");
  EXPECT_EQ(r.samples[1].timestampMs.value(), 7);
  EXPECT_DOUBLE_EQ(r.samples[2].value, 3.0);
  EXPECT_EQ(r.lines, 8u);
  EXPECT_TRUE(parseOk("").samples.empty());
  EXPECT_TRUE(parseOk("\n\n").samples.empty());
  // A lone CR is not a line end.
  EXPECT_FALSE(parsePrometheusText("a 1\rb 2\n").ok());
  // NUL bytes are data, and wrong here.
  EXPECT_FALSE(parsePrometheusText(std::string_view("a\0 1\n", 5)).ok());
}

TEST(PrometheusText, Limits) {
  PrometheusParseOptions options;
  options.limits.maxLineLength = 32;
  options.limits.maxSamples = 3;
  options.limits.maxLabels = 2;
  options.limits.maxFamilies = 2;

  EXPECT_TRUE(parsePrometheusText("a 1\nb 2\nc 3\n", options).ok());
  const auto tooMany = parseBad("a 1\nb 2\nc 3\nd 4\n", options);
  EXPECT_EQ(tooMany.line, 4u);
  EXPECT_NE(tooMany.message.find("more than 3 samples"), std::string::npos);

  const std::string line32 = "a{x=\"" + std::string(23, 'y') + "\"} 1";
  ASSERT_EQ(line32.size(), 32u);
  EXPECT_TRUE(parsePrometheusText(line32 + "\r\n", options).ok());
  const auto tooLong = parseBad("a 1\n" + line32 + "1\n", options);
  EXPECT_EQ(tooLong.line, 2u);
  EXPECT_EQ(formatError(tooLong), "line 2: line longer than 32 bytes");

  EXPECT_NE(parseBad("m{a=\"\",b=\"\",c=\"\"} 1\n", options).message.find("more than 2 labels"),
            std::string::npos);
  EXPECT_NE(parseBad("# TYPE a gauge\n# TYPE b gauge\n# TYPE c gauge\n", options)
                .message.find("more than 2 metric families"),
            std::string::npos);

  // A large input within the default limits.
  std::string big;
  for (int i = 0; i < 20'000; ++i) {
    big +=
        "DCGM_FI_DEV_GPU_UTIL{gpu=\"" + std::to_string(i) + "\"} " + std::to_string(i % 101) + "\n";
  }
  const auto r = parseOk(big);
  EXPECT_EQ(r.samples.size(), 20'000u);
  EXPECT_NEAR(averageOf(r.samples, "DCGM_FI_DEV_GPU_UTIL").value(), 50.0, 0.5);
}

TEST(PrometheusText, GarbageNeverAccepted) {
  for (std::string_view text : {"<html><body>502 Bad Gateway</body></html>\n", "{\"gpu\": 37}\n",
                                "HTTP/1.1 200 OK\r\n", "=\n", "}\n", "a{\n", "a{b\n", "a{b=\n",
                                "a{b=\"\n", "a{b=\"c\"\n", "a{b=\"c\"}\n", "a{b=\"c\"} \n"}) {
    const auto r = parsePrometheusText(text);
    EXPECT_FALSE(r.ok()) << text;
    ASSERT_TRUE(r.error.has_value());
    EXPECT_GE(r.error->line, 1u);
    EXPECT_FALSE(r.error->message.empty());
  }
}

}  // namespace
}  // namespace spillway
