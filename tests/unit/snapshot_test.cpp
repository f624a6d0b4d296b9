// Snapshot publication: VIP lookup, QSBR grace periods, and a stress test in
// which readers use snapshots while the writer publishes and frees thousands
// of them (run under ASan and TSan by scripts/test).
#include "spillway/snapshot.hpp"

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <thread>

#include "packet_builder.hpp"

namespace spillway {
namespace {

SnapshotVip vip(const char* addr, std::uint8_t proto, std::uint16_t port, const char* name) {
  SnapshotVip v;
  v.key.address = test::ipBytes(addr);
  v.key.version = std::string(addr).find(':') == std::string::npos ? IpVersion::V4 : IpVersion::V6;
  v.key.proto = proto;
  v.key.port = port;
  v.name = name;
  return v;
}

TEST(VipIndex, ExactPortThenAllPorts) {
  std::vector<SnapshotVip> vips = {
      vip("192.0.2.10", 6, 443, "web"),
      vip("192.0.2.10", 6, 0, "any-tcp"),
      vip("192.0.2.11", 17, 4791, "rocev2"),
      vip("2001:db8::10", 6, 8080, "v6"),
  };
  VipIndex index(vips);
  const auto a = test::ipBytes("192.0.2.10");
  EXPECT_EQ(index.find(a, IpVersion::V4, 6, 443), 0u);
  EXPECT_EQ(index.find(a, IpVersion::V4, 6, 22), 1u);
  EXPECT_EQ(index.find(a, IpVersion::V4, 17, 443), VipIndex::kNone);
  EXPECT_EQ(index.find(test::ipBytes("192.0.2.11"), IpVersion::V4, 17, 4791), 2u);
  EXPECT_EQ(index.find(test::ipBytes("192.0.2.11"), IpVersion::V4, 17, 4790), VipIndex::kNone);
  EXPECT_EQ(index.find(test::ipBytes("2001:db8::10"), IpVersion::V6, 6, 8080), 3u);
  EXPECT_EQ(index.find(test::ipBytes("2001:db8::10"), IpVersion::V4, 6, 8080), VipIndex::kNone);
  EXPECT_EQ(index.find(a, IpVersion::V4, 0, 0), VipIndex::kNone);
  EXPECT_TRUE(index.isVipAddress(test::ipBytes("192.0.2.11"), IpVersion::V4));
  EXPECT_TRUE(index.isVipAddress(test::ipBytes("2001:db8::10"), IpVersion::V6));
  EXPECT_FALSE(index.isVipAddress(test::ipBytes("192.0.2.12"), IpVersion::V4));
  EXPECT_FALSE(VipIndex().isVipAddress(a, IpVersion::V4));
  EXPECT_EQ(VipIndex().find(a, IpVersion::V4, 6, 443), VipIndex::kNone);
}

TEST(VipIndex, ManyVips) {
  std::vector<SnapshotVip> vips;
  for (int i = 0; i < 500; ++i) {
    vips.push_back(vip(("10.1." + std::to_string(i / 250) + "." + std::to_string(i % 250)).c_str(),
                       6, static_cast<std::uint16_t>(1000 + i), "v"));
  }
  VipIndex index(vips);
  for (std::uint32_t i = 0; i < 500; ++i) {
    EXPECT_EQ(index.find(vips[i].key.address, IpVersion::V4, 6, vips[i].key.port), i);
    EXPECT_EQ(index.find(vips[i].key.address, IpVersion::V4, 6, 1), VipIndex::kNone);
  }
}

// The gateway's own addresses and every VIP's are "own" (a forged source);
// nothing else is, whatever the prefilter says; gateway addresses are not
// VIP addresses; an address that is both stays a VIP's.
TEST(VipIndex, OwnAddressesOfVipsAndTheGateway) {
  std::vector<SnapshotVip> vips;
  for (int i = 0; i < 300; ++i) {
    vips.push_back(vip(("10.1." + std::to_string(i / 250) + "." + std::to_string(i % 250)).c_str(),
                       6, 80, "v"));
  }
  vips.push_back(vip("2001:db8::10", 6, 443, "v6"));
  const std::vector<OwnAddress> gateway = {{test::ipBytes("10.0.0.2"), IpVersion::V4},
                                           {test::ipBytes("fd00::2"), IpVersion::V6},
                                           {test::ipBytes("10.1.0.7"), IpVersion::V4}};
  const VipIndex index(vips, gateway);
  for (const auto& v : vips) EXPECT_TRUE(index.isOwnAddress(v.key.address, v.key.version));
  for (const auto& a : gateway) EXPECT_TRUE(index.isOwnAddress(a.address, a.version));
  EXPECT_FALSE(index.isVipAddress(test::ipBytes("10.0.0.2"), IpVersion::V4));
  EXPECT_FALSE(index.isVipAddress(test::ipBytes("fd00::2"), IpVersion::V6));
  EXPECT_TRUE(index.isVipAddress(test::ipBytes("10.1.0.7"), IpVersion::V4));
  EXPECT_EQ(index.find(test::ipBytes("10.0.0.2"), IpVersion::V4, 6, 80), VipIndex::kNone);
  EXPECT_FALSE(index.isOwnAddress(test::ipBytes("10.0.0.2"), IpVersion::V6));
  int own = 0;
  for (int i = 0; i < 20'000; ++i) {
    const std::string a = "172.16." + std::to_string(i / 250) + "." + std::to_string(i % 250);
    own += index.isOwnAddress(test::ipBytes(a), IpVersion::V4);
  }
  EXPECT_EQ(own, 0);
  EXPECT_FALSE(VipIndex().isOwnAddress(test::ipBytes("10.0.0.2"), IpVersion::V4));
}

TEST(Qsbr, GracePeriodWaitsForOnlineReaders) {
  QsbrDomain qsbr(3);
  qsbr.online(0);
  qsbr.online(1);  // reader 2 stays offline
  const auto token = qsbr.start();
  EXPECT_FALSE(qsbr.check(token));
  qsbr.quiescent(0);
  EXPECT_FALSE(qsbr.check(token));
  qsbr.quiescent(1);
  EXPECT_TRUE(qsbr.check(token));
  const auto next = qsbr.start();
  EXPECT_FALSE(qsbr.check(next));
  qsbr.offline(0);
  qsbr.offline(1);
  EXPECT_TRUE(qsbr.check(next));  // offline readers hold nothing
}

TEST(SnapshotPublisher, FreesOnlyAfterGracePeriod) {
  QsbrDomain qsbr(1);
  SnapshotPublisher pub(qsbr);
  EXPECT_EQ(pub.current(), nullptr);
  qsbr.online(0);
  auto first = std::make_unique<ForwardingSnapshot>();
  first->generation = 1;
  pub.publish(std::move(first));
  const ForwardingSnapshot* held = pub.current();
  ASSERT_NE(held, nullptr);
  auto second = std::make_unique<ForwardingSnapshot>();
  second->generation = 2;
  pub.publish(std::move(second));
  EXPECT_EQ(pub.current()->generation, 2u);
  EXPECT_EQ(pub.pending(), 1u);
  EXPECT_EQ(pub.reclaim(), 0u);  // the reader may still use `held`
  EXPECT_EQ(held->generation, 1u);
  qsbr.quiescent(0);
  EXPECT_EQ(pub.reclaim(), 1u);
  EXPECT_EQ(pub.pending(), 0u);
}

// Readers check that every snapshot they see is whole (its payload matches
// its generation) and that generations never go backwards; the writer
// publishes and reclaims as fast as it can. ASan turns a premature free into
// a use-after-free report; TSan checks the orderings.
TEST(SnapshotPublisher, StressPublishWhileReading) {
  constexpr int kReaders = 2;
  constexpr std::uint64_t kPublishes = 5000;
  QsbrDomain qsbr(kReaders);
  SnapshotPublisher pub(qsbr);
  auto make = [](std::uint64_t generation) {
    auto s = std::make_unique<ForwardingSnapshot>();
    s->generation = generation;
    s->backends.resize(8);
    for (auto& b : s->backends) b.id = generation;
    return s;
  };
  pub.publish(make(1));
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> bad{0};
  std::vector<std::thread> readers;
  std::array<std::atomic<std::uint64_t>, kReaders> seen{};
  for (int r = 0; r < kReaders; ++r) {
    readers.emplace_back([&, r] {
      qsbr.online(static_cast<std::size_t>(r));
      std::uint64_t last = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        const ForwardingSnapshot* s = pub.current();
        for (const auto& b : s->backends) {
          if (b.id != s->generation) bad.fetch_add(1);
        }
        if (s->generation < last) bad.fetch_add(1);
        last = s->generation;
        seen[static_cast<std::size_t>(r)].fetch_add(1, std::memory_order_relaxed);
        qsbr.quiescent(static_cast<std::size_t>(r));
      }
      qsbr.offline(static_cast<std::size_t>(r));
    });
  }
  // Publish at least kPublishes snapshots, and go on until every reader has
  // used a good number of them (bounded by a deadline, not a sleep).
  auto readersBusy = [&] {
    for (const auto& n : seen) {
      if (n.load(std::memory_order_relaxed) < 2000) return false;
    }
    return true;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::uint64_t g = 2;
  std::size_t freed = 0;
  while ((g <= kPublishes || !readersBusy()) && std::chrono::steady_clock::now() < deadline) {
    pub.publish(make(g++));
    freed += pub.reclaim();
  }
  stop.store(true);
  for (auto& t : readers) t.join();
  freed += pub.reclaim();  // every reader is offline: everything retired goes
  EXPECT_EQ(pub.pending(), 0u);
  EXPECT_EQ(freed, g - 2);  // all but the current one
  EXPECT_GT(g, kPublishes);
  EXPECT_TRUE(readersBusy());
  EXPECT_EQ(bad.load(), 0u);
}

}  // namespace
}  // namespace spillway
