// libFuzzer target for ICMP error steering: the input is the quoted packet
// inside an ICMP (first byte even) or ICMPv6 (odd) error; the frame around it
// is well formed, so the fuzzer spends its effort on the inner-header path.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "spillway/checksum.hpp"
#include "spillway/packet.hpp"
#include "spillway/wire.hpp"

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace spillway;
  if (size < 1 || size > 1400) return 0;
  const bool v6 = (data[0] & 1) != 0;
  const std::uint8_t icmpType = v6 ? kIcmp6PacketTooBig : kIcmpDestUnreachable;
  const std::span<const std::uint8_t> quote(data + 1, size - 1);

  const std::size_t ipLen =
      (v6 ? sizeof(Ipv6Header) : sizeof(Ipv4Header)) + sizeof(IcmpHeader) + quote.size();
  std::vector<std::byte> frame(sizeof(EthernetHeader) + ipLen);
  EthernetHeader eth{};
  eth.etherType = Be16::fromHost(v6 ? kEtherTypeIpv6 : kEtherTypeIpv4);
  storeAt(std::span(frame), 0, eth);
  std::size_t off = sizeof(EthernetHeader);
  if (v6) {
    Ipv6Header ip{};
    ip.versionClassLabel = Be32::fromHost(6u << 28);
    ip.payloadLength = Be16::fromHost(static_cast<std::uint16_t>(ipLen - sizeof(Ipv6Header)));
    ip.nextHeader = static_cast<std::uint8_t>(IpProto::Icmpv6);
    ip.hopLimit = 64;
    storeAt(std::span(frame), off, ip);
    off += sizeof(Ipv6Header);
  } else {
    Ipv4Header ip{};
    ip.versionIhl = 0x45;
    ip.totalLength = Be16::fromHost(static_cast<std::uint16_t>(ipLen));
    ip.ttl = 64;
    ip.protocol = static_cast<std::uint8_t>(IpProto::Icmp);
    ip.checksum = Be16::fromHost(ipv4HeaderChecksum(ip));  // the parser verifies it
    storeAt(std::span(frame), off, ip);
    off += sizeof(Ipv4Header);
  }
  IcmpHeader icmp{};
  icmp.type = icmpType;
  icmp.code = v6 ? 0 : kIcmpCodeFragNeeded;
  storeAt(std::span(frame), off, icmp);
  off += sizeof(IcmpHeader);
  if (!quote.empty()) std::memcpy(frame.data() + off, quote.data(), quote.size());

  const PacketView v = parsePacket(frame);
  check(v.ok());
  check(isIcmpError(v));
  const IcmpErrorFlow e = parseIcmpError(frame, v);
  check(e.drop < DropReason::kCount);
  if (e.drop == DropReason::None) {
    check(e.clientFlow.version == v.key.version);
    check(e.clientFlow.proto == 6 || e.clientFlow.proto == 17);
  }
  return 0;
}
