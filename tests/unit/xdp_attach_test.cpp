// The XDP tools' helpers where they need no privilege and no program: the
// errno text every error line shares, interface-name checks, and
// takeOverStaleRedirect() on an interface without XDP and on one that does
// not exist. The attach, detach, takeover and refusal paths against real
// programs run in the e2e suite (af_xdp_redirect, e2e-af-xdp-crash).
#include "xdp_attach.hpp"

#include <gtest/gtest.h>

#include <cerrno>
#include <string>

#include "spillway/errno_text.hpp"
#include "stale_redirect.hpp"

namespace spillway {
namespace {

TEST(ErrnoText, NegativeAndPositiveSpellTheSame) {
  EXPECT_EQ(errnoText(ECONNREFUSED), "Connection refused");
  EXPECT_EQ(errnoText(-ECONNREFUSED), errnoText(ECONNREFUSED));
}

TEST(BpfErrorText, NamesTheCapabilitiesOnEperm) {
  EXPECT_NE(bpfErrorText(-EPERM).find("CAP_BPF"), std::string::npos);
  EXPECT_EQ(bpfErrorText(-ENOENT), bpfErrorText(ENOENT));
}

TEST(InterfaceIndex, RejectsWhatCannotBeAnInterfaceName) {
  std::string error;
  EXPECT_FALSE(interfaceIndex("", error));
  EXPECT_NE(error.find("not an interface name"), std::string::npos);
  EXPECT_FALSE(interfaceIndex("a/b", error));
  EXPECT_FALSE(interfaceIndex(std::string(32, 'x'), error));
  EXPECT_FALSE(interfaceIndex("swnosuch0", error));
  EXPECT_NE(error.find("does not exist"), std::string::npos);
  const auto lo = interfaceIndex("lo", error);
  ASSERT_TRUE(lo) << error;
  EXPECT_GT(*lo, 0);
}

TEST(TakeOverStaleRedirect, NoInterfaceNameIsNotAnAfXdpPort) {
  EXPECT_FALSE(takeOverStaleRedirect(""));
}

TEST(TakeOverStaleRedirect, MissingInterfaceIsRefusedByName) {
  const auto busy = takeOverStaleRedirect("swnosuch0");
  ASSERT_TRUE(busy);
  EXPECT_NE(busy->find("swnosuch0"), std::string::npos) << *busy;
}

TEST(TakeOverStaleRedirect, InterfaceWithoutXdpIsFreeAndLogsNothing) {
  // Loopback never carries an XDP program in a test environment.
  int logged = 0;
  const auto busy = takeOverStaleRedirect("lo", [&](const std::string&) { ++logged; });
  EXPECT_FALSE(busy) << *busy;
  EXPECT_EQ(logged, 0);
}

}  // namespace
}  // namespace spillway
