#include "control/health/prometheus_text.hpp"

#include <charconv>
#include <cmath>
#include <new>
#include <system_error>
#include <unordered_map>
#include <unordered_set>

namespace spillway {
namespace {

bool isBlank(char c) noexcept {
  return c == ' ' || c == '\t';
}
bool isAlpha(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool isDigit(char c) noexcept {
  return c >= '0' && c <= '9';
}
bool isMetricNameStart(char c) noexcept {
  return isAlpha(c) || c == '_' || c == ':';
}
bool isMetricNameChar(char c) noexcept {
  return isMetricNameStart(c) || isDigit(c);
}
bool isLabelNameStart(char c) noexcept {
  return isAlpha(c) || c == '_';
}
bool isLabelNameChar(char c) noexcept {
  return isLabelNameStart(c) || isDigit(c);
}

// Length of the valid UTF-8 sequence starting at s[i], or 0 (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF).
std::size_t utf8SequenceLength(std::string_view s, std::size_t i) noexcept {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return 1;
  std::size_t n = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xbf;
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    n = 2;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    n = 3;
    if (b0 == 0xe0) lo = 0xa0;
    if (b0 == 0xed) hi = 0x9f;
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    n = 4;
    if (b0 == 0xf0) lo = 0x90;
    if (b0 == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  if (s.size() - i < n) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xbf)) return 0;
  }
  return n;
}

// A short, printable rendering of what was found, for error messages.
std::string describe(std::string_view rest) {
  if (rest.empty()) return "end of line";
  std::string out = "'";
  for (std::size_t i = 0; i < rest.size() && i < 16; ++i) {
    const auto c = static_cast<unsigned char>(rest[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  if (rest.size() > 16) out += "...";
  out += "'";
  return out;
}

std::optional<double> parseValue(std::string_view token) noexcept {
  if (token.empty()) return std::nullopt;
  if (token[0] == '+') {
    token.remove_prefix(1);
    if (token.empty() || token[0] == '-' || token[0] == '+') return std::nullopt;
  }
  double v = 0.0;
  const auto [ptr, ec] =
      std::from_chars(token.data(), token.data() + token.size(), v, std::chars_format::general);
  if (ec != std::errc{} || ptr != token.data() + token.size()) return std::nullopt;
  return v;
}

std::optional<std::int64_t> parseTimestamp(std::string_view token) noexcept {
  if (!token.empty() && token[0] == '+') {
    token.remove_prefix(1);
    if (token.empty() || token[0] == '-') return std::nullopt;
  }
  std::int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), v);
  if (ec != std::errc{} || ptr != token.data() + token.size() || token.empty()) return std::nullopt;
  return v;
}

struct ParseFailure {
  std::size_t column = 0;
  std::string message;
};

class TextParser {
 public:
  TextParser(const PrometheusParseOptions& options, PrometheusParseResult& result)
      : options_(options), result_(result) {}

  std::optional<ParseFailure> parseLine(std::string_view line) {
    line_ = line;
    pos_ = 0;
    skipBlanks();
    if (atEnd()) return std::nullopt;
    if (line_[pos_] == '#') return parseComment();
    return parseSample();
  }

 private:
  bool atEnd() const noexcept { return pos_ >= line_.size(); }
  std::string_view rest() const noexcept { return line_.substr(std::min(pos_, line_.size())); }
  void skipBlanks() noexcept {
    while (!atEnd() && isBlank(line_[pos_])) ++pos_;
  }
  ParseFailure fail(std::string message) const {
    return ParseFailure{pos_ + 1, std::move(message)};
  }
  ParseFailure failExpected(std::string_view what) const {
    return fail("expected " + std::string(what) + ", found " + describe(rest()));
  }

  std::string_view readToken() noexcept {
    const std::size_t start = pos_;
    while (!atEnd() && !isBlank(line_[pos_])) ++pos_;
    return line_.substr(start, pos_ - start);
  }

  std::string_view readMetricName() noexcept {
    const std::size_t start = pos_;
    if (atEnd() || !isMetricNameStart(line_[pos_])) return {};
    while (!atEnd() && isMetricNameChar(line_[pos_])) ++pos_;
    return line_.substr(start, pos_ - start);
  }

  std::string_view readLabelName() noexcept {
    const std::size_t start = pos_;
    if (atEnd() || !isLabelNameStart(line_[pos_])) return {};
    while (!atEnd() && isLabelNameChar(line_[pos_])) ++pos_;
    return line_.substr(start, pos_ - start);
  }

  PrometheusFamily* family(std::string_view name, std::optional<ParseFailure>& failure) {
    const auto it = familyIndex_.find(std::string(name));
    if (it != familyIndex_.end()) return &result_.families[it->second];
    if (result_.families.size() >= options_.limits.maxFamilies) {
      failure =
          fail("more than " + std::to_string(options_.limits.maxFamilies) + " metric families");
      return nullptr;
    }
    familyIndex_.emplace(std::string(name), result_.families.size());
    result_.families.push_back(PrometheusFamily{std::string(name), PrometheusType::Untyped, {}});
    return &result_.families.back();
  }

  std::optional<ParseFailure> parseComment() {
    ++pos_;  // '#'
    skipBlanks();
    const std::size_t keywordAt = pos_;
    const std::string_view keyword = readToken();
    if (keyword != "HELP" && keyword != "TYPE") return std::nullopt;  // a plain comment
    const bool isHelp = keyword == "HELP";
    if (atEnd()) {
      pos_ = keywordAt + keyword.size();
      return failExpected("a metric name after # " + std::string(keyword));
    }
    skipBlanks();
    const std::string_view name = readMetricName();
    if (name.empty()) return failExpected("a metric name after # " + std::string(keyword));
    if (!atEnd() && !isBlank(line_[pos_])) {
      return failExpected("a blank after the metric name \"" + std::string(name) + "\"");
    }
    skipBlanks();
    std::optional<ParseFailure> failure;
    if (isHelp) {
      if (helpSeen_.contains(std::string(name))) {
        return fail("second # HELP for \"" + std::string(name) + "\"");
      }
      std::string help;
      while (!atEnd()) {
        const char c = line_[pos_];
        if (c == '\\') {
          if (pos_ + 1 >= line_.size()) return fail("escape '\\' at the end of the line");
          const char e = line_[pos_ + 1];
          if (e == '\\') {
            help += '\\';
          } else if (e == 'n') {
            help += '\n';
          } else {
            return fail("invalid escape '\\" + std::string(1, e) +
                        "' in # HELP (only \\\\ and \\n)");
          }
          pos_ += 2;
        } else {
          help += c;
          ++pos_;
        }
      }
      PrometheusFamily* f = family(name, failure);
      if (f == nullptr) return failure;
      f->help = std::move(help);
      helpSeen_.emplace(name);
      return std::nullopt;
    }
    const std::size_t typeAt = pos_;
    const std::string_view typeName = readToken();
    PrometheusType type = PrometheusType::Untyped;
    if (typeName == "counter") {
      type = PrometheusType::Counter;
    } else if (typeName == "gauge") {
      type = PrometheusType::Gauge;
    } else if (typeName == "histogram") {
      type = PrometheusType::Histogram;
    } else if (typeName == "summary") {
      type = PrometheusType::Summary;
    } else if (typeName == "untyped") {
      type = PrometheusType::Untyped;
    } else {
      pos_ = typeAt;
      return failExpected("counter, gauge, histogram, summary or untyped");
    }
    skipBlanks();
    if (!atEnd()) return failExpected("end of line after the type");
    if (typeSeen_.contains(std::string(name))) {
      pos_ = typeAt;
      return fail("second # TYPE for \"" + std::string(name) + "\"");
    }
    if (sampled_.contains(std::string(name))) {
      pos_ = typeAt;
      return fail("# TYPE for \"" + std::string(name) + "\" after its first sample");
    }
    PrometheusFamily* f = family(name, failure);
    if (f == nullptr) return failure;
    f->type = type;
    typeSeen_.emplace(name);
    return std::nullopt;
  }

  // Reads a quoted label value at pos_ (on the opening quote) into `out`.
  std::optional<ParseFailure> readLabelValue(std::string* out) {
    if (atEnd() || line_[pos_] != '"') return failExpected("'\"' to open the label value");
    ++pos_;
    while (true) {
      if (atEnd()) return fail("unterminated label value (missing '\"')");
      const char c = line_[pos_];
      if (c == '"') {
        ++pos_;
        return std::nullopt;
      }
      if (c == '\\') {
        if (pos_ + 1 >= line_.size()) return fail("unterminated label value (missing '\"')");
        const char e = line_[pos_ + 1];
        char decoded = 0;
        if (e == '\\') {
          decoded = '\\';
        } else if (e == '"') {
          decoded = '"';
        } else if (e == 'n') {
          decoded = '\n';
        } else {
          return fail("invalid escape '\\" + std::string(1, e) +
                      "' in label value (only \\\\, \\\" and \\n)");
        }
        if (out != nullptr) *out += decoded;
        pos_ += 2;
        continue;
      }
      const std::size_t n = utf8SequenceLength(line_, pos_);
      if (n == 0) return fail("label value is not valid UTF-8");
      if (out != nullptr) out->append(line_.substr(pos_, n));
      pos_ += n;
    }
  }

  bool keep(std::string_view name) const noexcept {
    if (options_.keepNames.empty()) return true;
    for (const std::string_view k : options_.keepNames) {
      if (k == name) return true;
    }
    return false;
  }

  std::optional<ParseFailure> parseSample() {
    const std::string_view name = readMetricName();
    if (name.empty()) return failExpected("a metric name, '#' or a blank line");
    if (result_.sampleLines >= options_.limits.maxSamples) {
      return fail("more than " + std::to_string(options_.limits.maxSamples) + " samples");
    }
    ++result_.sampleLines;
    const bool stored = keep(name);
    PrometheusSample sample;
    if (stored) sample.name = std::string(name);
    labelNames_.clear();

    const std::size_t afterName = pos_;
    skipBlanks();
    bool blankSeen = pos_ > afterName;
    if (!atEnd() && line_[pos_] == '{') {
      ++pos_;
      while (true) {
        skipBlanks();
        if (atEnd()) return failExpected("a label name or '}'");
        if (line_[pos_] == '}') {
          ++pos_;
          break;
        }
        const std::string_view labelName = readLabelName();
        if (labelName.empty()) return failExpected("a label name or '}'");
        for (const std::string_view seen : labelNames_) {
          if (seen == labelName) {
            pos_ -= labelName.size();
            return fail("duplicate label \"" + std::string(labelName) + "\"");
          }
        }
        if (labelNames_.size() >= options_.limits.maxLabels) {
          pos_ -= labelName.size();
          return fail("more than " + std::to_string(options_.limits.maxLabels) + " labels");
        }
        labelNames_.push_back(labelName);
        skipBlanks();
        if (atEnd() || line_[pos_] != '=') {
          return failExpected("'=' after the label name \"" + std::string(labelName) + "\"");
        }
        ++pos_;
        skipBlanks();
        std::string value;
        if (auto failure = readLabelValue(stored ? &value : nullptr)) return failure;
        if (stored) sample.labels.emplace_back(std::string(labelName), std::move(value));
        skipBlanks();
        if (atEnd()) return failExpected("',' or '}'");
        if (line_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (line_[pos_] == '}') {
          ++pos_;
          break;
        }
        return failExpected("',' or '}'");
      }
      const std::size_t afterLabels = pos_;
      skipBlanks();
      blankSeen = pos_ > afterLabels;
      if (!blankSeen) return failExpected("a blank and a value after '}'");
    }
    if (!blankSeen) return failExpected("'{' or a blank and a value");
    skipBlanks();
    const std::size_t valueAt = pos_;
    const std::string_view valueToken = readToken();
    if (valueToken.empty()) return failExpected("a value");
    const std::optional<double> value = parseValue(valueToken);
    if (!value) {
      pos_ = valueAt;
      return fail("invalid value '" + std::string(valueToken.substr(0, 32)) +
                  "' (a float, +Inf, -Inf or NaN)");
    }
    skipBlanks();
    if (!atEnd()) {
      const std::size_t tsAt = pos_;
      const std::string_view tsToken = readToken();
      const std::optional<std::int64_t> ts = parseTimestamp(tsToken);
      if (!ts) {
        pos_ = tsAt;
        return fail("invalid timestamp '" + std::string(tsToken.substr(0, 32)) +
                    "' (integer milliseconds)");
      }
      skipBlanks();
      if (!atEnd()) return failExpected("end of line after the timestamp");
      sample.timestampMs = *ts;
    }
    sampled_.emplace(name);
    if (stored) {
      sample.value = *value;
      result_.samples.push_back(std::move(sample));
    }
    return std::nullopt;
  }

  const PrometheusParseOptions& options_;
  PrometheusParseResult& result_;
  std::string_view line_;
  std::size_t pos_ = 0;
  std::vector<std::string_view> labelNames_;
  std::unordered_map<std::string, std::size_t> familyIndex_;
  std::unordered_set<std::string> helpSeen_;
  std::unordered_set<std::string> typeSeen_;
  std::unordered_set<std::string> sampled_;
};

template <typename Fold>
std::optional<double> fold(std::span<const PrometheusSample> samples, std::string_view name,
                           Fold&& f) noexcept {
  double sum = 0.0;
  std::size_t n = 0;
  for (const PrometheusSample& s : samples) {
    if (s.name != name || std::isnan(s.value)) continue;
    sum += s.value;
    ++n;
  }
  if (n == 0) return std::nullopt;
  return f(sum, n);
}

}  // namespace

std::optional<std::string_view> PrometheusSample::label(std::string_view labelName) const noexcept {
  for (const auto& [k, v] : labels) {
    if (k == labelName) return std::string_view(v);
  }
  return std::nullopt;
}

std::string formatError(const PrometheusParseError& error) {
  std::string out = "line " + std::to_string(error.line);
  if (error.column != 0) out += ", column " + std::to_string(error.column);
  out += ": ";
  out += error.message;
  return out;
}

PrometheusParseResult parsePrometheusText(std::string_view text,
                                          const PrometheusParseOptions& options) noexcept {
  PrometheusParseResult result;
  try {
    TextParser parser(options, result);
    std::size_t pos = 0;
    while (pos < text.size()) {
      const std::size_t nl = text.find('\n', pos);
      const std::size_t end = nl == std::string_view::npos ? text.size() : nl;
      std::string_view line = text.substr(pos, end - pos);
      pos = nl == std::string_view::npos ? text.size() : nl + 1;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      ++result.lines;
      if (line.size() > options.limits.maxLineLength) {
        result.error = PrometheusParseError{
            result.lines, 0,
            "line longer than " + std::to_string(options.limits.maxLineLength) + " bytes"};
        break;
      }
      if (auto failure = parser.parseLine(line)) {
        result.error =
            PrometheusParseError{result.lines, failure->column, std::move(failure->message)};
        break;
      }
    }
  } catch (const std::bad_alloc&) {
    result.error = PrometheusParseError{result.lines, 0, "out of memory"};
  }
  if (result.error) {
    result.samples.clear();
    result.families.clear();
  }
  return result;
}

std::optional<double> averageOf(std::span<const PrometheusSample> samples,
                                std::string_view name) noexcept {
  return fold(samples, name,
              [](double sum, std::size_t n) { return sum / static_cast<double>(n); });
}

std::optional<double> sumOf(std::span<const PrometheusSample> samples,
                            std::string_view name) noexcept {
  return fold(samples, name, [](double sum, std::size_t) { return sum; });
}

std::string_view toString(PrometheusType type) noexcept {
  switch (type) {
    case PrometheusType::Untyped:
      return "untyped";
    case PrometheusType::Counter:
      return "counter";
    case PrometheusType::Gauge:
      return "gauge";
    case PrometheusType::Histogram:
      return "histogram";
    case PrometheusType::Summary:
      return "summary";
  }
  return "untyped";
}

bool isValidMetricName(std::string_view name) noexcept {
  if (name.empty() || !isMetricNameStart(name[0])) return false;
  for (const char c : name) {
    if (!isMetricNameChar(c)) return false;
  }
  return true;
}

}  // namespace spillway
