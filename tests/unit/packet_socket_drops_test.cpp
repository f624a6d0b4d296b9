// PacketSocketDrops (spillway/packet_socket_drops.hpp): the process's own
// AF_PACKET sockets on an interface are found, and what the kernel dropped in
// front of them is read (and cleared in the kernel) into a running total.
// Needs root for the packet socket (CI runs as root).
#include "spillway/packet_socket_drops.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

namespace spillway {
namespace {

TEST(PacketSocketDrops, InterfaceOfDevargs) {
  EXPECT_EQ(afPacketInterface("net_af_packet0,iface=eth0"), "eth0");
  EXPECT_EQ(afPacketInterface("net_af_packet0,qpairs=2,iface=veth-lb,blocksz=4096"), "veth-lb");
  EXPECT_EQ(afPacketInterface("net_af_packet0"), "");
  EXPECT_EQ(afPacketInterface("net_af_packet0,ifaces=x"), "");
}

TEST(PacketSocketDrops, NoSuchInterfaceFindsNothing) {
  PacketSocketDrops d = PacketSocketDrops::find("no-such-if9");
  EXPECT_EQ(d.sockets(), 0u);
  EXPECT_EQ(d.read(), 0u);
}

TEST(PacketSocketDrops, AFullReceiveBufferIsCountedOnceAndKept) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for a packet socket (CI runs as root)";
  // A packet socket on lo that nobody reads, with the smallest buffer: the
  // kernel drops what does not fit and counts it in PACKET_STATISTICS.
  const int ps = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, htons(ETH_P_ALL));
  ASSERT_GE(ps, 0);
  int small = 256;
  ASSERT_EQ(setsockopt(ps, SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
  sockaddr_ll at{};
  at.sll_family = AF_PACKET;
  at.sll_protocol = htons(ETH_P_ALL);
  at.sll_ifindex = static_cast<int>(if_nametoindex("lo"));
  ASSERT_EQ(bind(ps, reinterpret_cast<sockaddr*>(&at), sizeof at), 0);

  PacketSocketDrops drops = PacketSocketDrops::find("lo");
  ASSERT_EQ(drops.sockets(), 1u);
  EXPECT_EQ(PacketSocketDrops::find("no-such-if9").sockets(), 0u);

  const int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(udp, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(9);  // discard: nobody listens, the frames still cross lo
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  char payload[512];
  std::memset(payload, 'x', sizeof payload);
  for (int i = 0; i < 200; ++i) {
    (void)sendto(udp, payload, sizeof payload, 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
  }
  const std::uint64_t first = drops.read();
  EXPECT_GT(first, 100u) << "the kernel dropped most of 200 frames (and their ICMP errors)";
  // Read-and-clear in the kernel, kept here: no new traffic, the same total.
  EXPECT_EQ(drops.read(), first);
  close(udp);
  close(ps);
}

}  // namespace
}  // namespace spillway
