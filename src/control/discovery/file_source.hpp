// A file_sd file watched for changes: inotify on its directory (so an atomic
// replacement, a rename over the file, is seen, and so is a file that
// appears later), read in the control loop without blocking it: poll()
// drains the non-blocking inotify descriptor and reads the file (bounded by
// max_file_bytes) only after a write was closed or a file renamed in. A
// half-written file is not read while it is being written; a file that does
// not parse, is too large or disappears is refused and the last good set
// stays (said in lastError()). Without a watch (the directory missing) the
// file is retried every kRetryMs.
//
// Thread contract: control thread; time is passed in.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "control/config/config.hpp"
#include "control/discovery/file_sd.hpp"
#include "control/discovery/source.hpp"

namespace spillway {

class FileSdSource final : public DiscoveryFeed {
 public:
  static constexpr Millis kRetryMs = 1000;

  explicit FileSdSource(DiscoveryConfig config);
  ~FileSdSource();
  FileSdSource(const FileSdSource&) = delete;
  FileSdSource& operator=(const FileSdSource&) = delete;

  // What poll() found (read: the file was read).
  using Refresh = DiscoveryRefresh;
  Refresh poll(Millis now) override;

  [[nodiscard]] int fd() const noexcept { return inotify_; }
  [[nodiscard]] const DiscoveryConfig& config() const noexcept override { return config_; }
  // The last good set (empty before the first good read).
  [[nodiscard]] const std::vector<DiscoveredBackend>& backends() const noexcept override {
    return good_;
  }
  [[nodiscard]] nlohmann::json describe(Millis now) const override;
  [[nodiscard]] std::string origin() const override { return "file " + config_.path; }
  [[nodiscard]] bool everGood() const noexcept { return everGood_; }

 private:
  Refresh readFile();
  void watch();

  DiscoveryConfig config_;
  std::string dir_;
  std::string base_;
  int inotify_ = -1;
  int watch_ = -1;
  bool due_ = true;  // read at the first poll
  Millis nextRetry_ = 0;
  std::vector<DiscoveredBackend> good_;
  bool everGood_ = false;
};

}  // namespace spillway
