#include "spillway/kernel_reassembly.hpp"

#include <gtest/gtest.h>

namespace spillway {
namespace {

// /proc/net/snmp of a Debian 12 kernel (6.1), Icmp lines shortened.
constexpr std::string_view kSnmp =
    "Ip: Forwarding DefaultTTL InReceives InHdrErrors InAddrErrors ForwDatagrams "
    "InUnknownProtos InDiscards InDelivers OutRequests OutDiscards OutNoRoutes ReasmTimeout "
    "ReasmReqds ReasmOKs ReasmFails FragOKs FragFails FragCreates\n"
    "Ip: 2 64 68599 0 0 0 195 0 68404 65699 0 0 3 17 5 4 0 0 0\n"
    "Icmp: InMsgs InErrors\n"
    "Icmp: 7 0\n";

TEST(KernelReassembly, ReadsTheFourCountersByName) {
  const auto r = parseKernelReassembly(kSnmp);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->requests, 17u);
  EXPECT_EQ(r->ok, 5u);
  EXPECT_EQ(r->failed, 4u);
  EXPECT_EQ(r->timeouts, 3u);
}

TEST(KernelReassembly, FieldOrderDoesNotMatter) {
  const auto r =
      parseKernelReassembly("Ip: ReasmFails ReasmOKs X ReasmReqds ReasmTimeout\nIp: 1 2 99 3 4\n");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->failed, 1u);
  EXPECT_EQ(r->ok, 2u);
  EXPECT_EQ(r->requests, 3u);
  EXPECT_EQ(r->timeouts, 4u);
}

TEST(KernelReassembly, RefusesWhatIsNotTheTable) {
  EXPECT_FALSE(parseKernelReassembly("").has_value());
  EXPECT_FALSE(parseKernelReassembly("Ip: ReasmReqds ReasmOKs ReasmFails ReasmTimeout\n"));
  // A field missing, a count of fields that disagrees, a value not a number.
  EXPECT_FALSE(parseKernelReassembly("Ip: ReasmReqds ReasmOKs ReasmFails\nIp: 1 2 3\n"));
  EXPECT_FALSE(
      parseKernelReassembly("Ip: ReasmReqds ReasmOKs ReasmFails ReasmTimeout\nIp: 1 2 3\n"));
  EXPECT_FALSE(
      parseKernelReassembly("Ip: ReasmReqds ReasmOKs ReasmFails ReasmTimeout\nIp: 1 2 x 4\n"));
}

TEST(KernelReassembly, ReadsThisNamespacesFile) {
  // Every Linux kernel with IPv4 has the table; a missing file is nullopt.
  EXPECT_TRUE(readKernelReassembly().has_value());
  EXPECT_FALSE(readKernelReassembly("/nonexistent/snmp").has_value());
}

}  // namespace
}  // namespace spillway
