// A control plane on a configuration file, for the tests that drive one the
// way spillwayd does (discovery, DNS discovery, operator intent): a
// temporary directory, the file written there and loaded, the plane's
// SnapshotBuilder, a fake data path (flow counts of 0 per backend until the
// test sets others) and a fake wall clock; the file helpers those tests use.
// The estates they load are in estate_fixture.hpp.
//
// Thread contract: one test thread.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "control/plane/control_plane.hpp"
#include "fake_dataplane.hpp"

namespace spillway::test {

// A directory under the system's temporary one, removed with what it holds.
class TempDir {
 public:
  // `what` names the test in the directory's name: /tmp/spillway-<what>-XXXXXX.
  explicit TempDir(const std::string& what) {
    std::string pattern =
        (std::filesystem::temp_directory_path() / ("spillway-" + what + "-XXXXXX")).string();
    const char* made = ::mkdtemp(pattern.data());
    path_ = made != nullptr ? made : "";
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  [[nodiscard]] const std::string& path() const { return path_; }
  [[nodiscard]] std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void writeAll(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

inline std::string readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class PlaneOnFile {
 public:
  // The plane on `dir`/spillway.toml holding `text`, started at `now`. Its
  // wall clock reads *wall where the test shares one between planes (a
  // restart), else one of its own that run() moves.
  PlaneOnFile(const TempDir& dir, const std::string& text, Millis now,
              const std::int64_t* wall = nullptr)
      : path_(dir / "spillway.toml"), wall_(wall != nullptr ? wall : &ownWall_) {
    writeAll(path_, text);
    auto loaded = loadConfig(path_);
    EXPECT_TRUE(loaded.ok()) << formatErrors(loaded.errors());
    Config c = std::move(loaded).value();
    EXPECT_FALSE(builder_.setConfig(c));
    setFlows(0);
    cp_ = std::make_unique<ControlPlane>(std::move(c), path_, builder_, &dp_, now,
                                         [this] { return *wall_; });
    // Published, as the daemon's loop does (a checkpoint writes its tables).
    if (auto s = cp_->takeSnapshot(now)) dp_.publish(std::move(s));
  }
  PlaneOnFile(const PlaneOnFile&) = delete;
  PlaneOnFile& operator=(const PlaneOnFile&) = delete;

  ControlPlane& cp() { return *cp_; }
  [[nodiscard]] const std::string& path() const { return path_; }
  // Live flows per backend the fake data path reports from now on.
  void setFlows(std::uint64_t n) {
    dp_.flowCounts = {LcoreFlowCounts{1u, std::vector<std::uint64_t>(4096, n)}};
  }

 protected:
  std::string path_;
  std::int64_t ownWall_ = 1'700'000'000'000;
  const std::int64_t* wall_;
  SnapshotBuilder builder_;
  FakeDataplane dp_;
  std::unique_ptr<ControlPlane> cp_;
};

}  // namespace spillway::test
