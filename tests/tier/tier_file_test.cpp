// The tier file: good files, and every bad one gets an error naming the line.
#include "control/tier/tier_file.hpp"

#include <gtest/gtest.h>

#include <string>

namespace spillway {
namespace {

TierFile mustParse(const std::string& text) {
  auto parsed = parseTierFile(text, "tier.conf");
  if (auto* error = std::get_if<std::string>(&parsed)) {
    ADD_FAILURE() << *error;
    return {};
  }
  return std::get<TierFile>(parsed);
}

std::string mustFail(const std::string& text) {
  auto parsed = parseTierFile(text, "tier.conf");
  if (std::holds_alternative<TierFile>(parsed)) {
    ADD_FAILURE() << "accepted: " << text;
    return {};
  }
  return std::get<std::string>(parsed);
}

TEST(TierFile, InstancesInOrderWithCommentsAndBlankLines) {
  const TierFile t = mustParse(
      "# the tier\n"
      "lb1 /run/spillway/spillway.sock\n"
      "\n"
      "   lb2\t/run/spillway/lb2.sock   # ssh -L forward to host2\n"
      "lb-3.a_b /tmp/x.sock");  // no final newline
  ASSERT_EQ(t.instances.size(), 3u);
  EXPECT_EQ(t.instances[0].name, "lb1");
  EXPECT_EQ(t.instances[0].socketPath, "/run/spillway/spillway.sock");
  EXPECT_EQ(t.instances[1].name, "lb2");
  EXPECT_EQ(t.instances[1].socketPath, "/run/spillway/lb2.sock");
  EXPECT_EQ(t.instances[2].name, "lb-3.a_b");
  EXPECT_EQ(t.origin, "tier.conf");
}

TEST(TierFile, ErrorsNameTheFileLineAndProblem) {
  EXPECT_EQ(mustFail("lb1 /a.sock\nlb2\n"),
            "tier.conf:2: instance lb2 has no socket path (expected NAME SOCKET_PATH)");
  EXPECT_EQ(mustFail("lb1 /a.sock\n# x\nlb1 /b.sock\n"),
            "tier.conf:3: duplicate instance name lb1 (first on line 1)");
  EXPECT_EQ(mustFail("lb1 /a.sock\nlb2 /a.sock\n"),
            "tier.conf:2: socket /a.sock of lb2 is already instance line 1's");
  EXPECT_EQ(mustFail("lb1 run/a.sock\n"),
            "tier.conf:1: socket path \"run/a.sock\" of lb1 must be absolute");
  EXPECT_EQ(mustFail("lb1 /a.sock extra\n"),
            "tier.conf:1: expected NAME SOCKET_PATH, found 3 fields (a path with spaces is not "
            "supported)");
  EXPECT_EQ(mustFail("lb/1 /a.sock\n"),
            "tier.conf:1: instance name \"lb/1\" must be 1..64 of A-Z a-z 0-9 . _ -");
  EXPECT_EQ(mustFail("lb1 /" + std::string(120, 'x') + "\n"),
            "tier.conf:1: socket path of lb1 is longer than a Unix socket path may be (107)");
  EXPECT_EQ(mustFail("# nothing\n\n"),
            "tier.conf: names no instance (expected NAME SOCKET_PATH lines)");
  EXPECT_EQ(mustFail(""), "tier.conf: names no instance (expected NAME SOCKET_PATH lines)");
}

TEST(TierFile, TooManyInstances) {
  std::string text;
  for (std::size_t i = 0; i <= kMaxTierInstances; ++i) {
    text += "lb" + std::to_string(i) + " /run/lb" + std::to_string(i) + ".sock\n";
  }
  EXPECT_EQ(mustFail(text), "tier.conf:257: more than 256 instances");
}

TEST(TierFile, MissingFileSaysWhich) {
  auto r = loadTierFile("/nonexistent/tier.conf");
  ASSERT_TRUE(std::holds_alternative<std::string>(r));
  EXPECT_EQ(std::get<std::string>(r),
            "cannot read tier file /nonexistent/tier.conf: No such file or directory");
}

}  // namespace
}  // namespace spillway
