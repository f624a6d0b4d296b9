#include "control/sys/refusal_summary.hpp"

#include <utility>

namespace spillway {

RefusalSummary::RefusalSummary(std::string what, std::uint64_t intervalMs)
    : what_(std::move(what)), interval_(intervalMs == 0 ? 1 : intervalMs) {}

std::optional<std::string> RefusalSummary::note(std::uint64_t nowMs, std::string_view source,
                                                std::string_view reason) {
  ++total_;
  if (!windowStart_) {
    windowStart_ = nowMs;
    return what_ + ": refused " + std::string(source) + ": " + std::string(reason) +
           " (further refusals are summarised every " + std::to_string(interval_ / 1000) + " s)";
  }
  ++inWindow_;
  auto it = reasons_.find(reason);
  if (it != reasons_.end()) {
    ++it->second;
  } else if (reasons_.size() < kMaxReasons) {
    reasons_.emplace(std::string(reason), 1);
  } else {
    ++reasons_["other"];
  }
  if (sources_.size() < kMaxSources) {
    sources_.emplace(source);
  } else if (!sources_.contains(source)) {
    moreSources_ = true;
  }
  lastSource_.assign(source);
  return std::nullopt;
}

std::optional<std::string> RefusalSummary::flush(std::uint64_t nowMs) {
  if (!windowStart_ || nowMs < *windowStart_ + interval_) return std::nullopt;
  if (inWindow_ == 0) {  // a quiet interval ends the spell
    windowStart_.reset();
    return std::nullopt;
  }
  std::string line = what_ + ": refused " + std::to_string(inWindow_) + " more in the last " +
                     std::to_string((nowMs - *windowStart_) / 1000) + " s from " +
                     std::to_string(sources_.size()) + (moreSources_ ? "+" : "") +
                     " source(s), last " + lastSource_ + " (";
  bool first = true;
  for (const auto& [reason, count] : reasons_) {
    line += (first ? "" : "; ") + reason + ": " + std::to_string(count);
    first = false;
  }
  line += ")";
  windowStart_ = nowMs;
  inWindow_ = 0;
  reasons_.clear();
  sources_.clear();
  moreSources_ = false;
  return line;
}

}  // namespace spillway
