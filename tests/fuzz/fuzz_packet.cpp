// libFuzzer target: any byte string as an Ethernet frame. The parser must
// never read past the span (ASan), never hit UB (UBSan), and keep its
// documented invariants on what it returns.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "spillway/packet.hpp"

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace spillway;
  const std::span<const std::byte> frame(reinterpret_cast<const std::byte*>(data), size);
  const PacketView v = parsePacket(frame);
  check(v.drop < DropReason::kCount);
  if (v.l3Valid) {
    check(v.kind == PacketKind::Ip);
    check(std::size_t{v.l3Offset} + v.l3Length <= size);
  }
  if (v.ok() && v.kind == PacketKind::Ip) {
    check(v.l4Offset > v.l3Offset);
    check(v.l4Offset <= std::size_t{v.l3Offset} + v.l3Length);
    check(v.ttl > 1);
    if (isIcmpError(v)) {
      const IcmpErrorFlow e = parseIcmpError(frame, v);
      check(e.drop < DropReason::kCount);
      if (e.drop == DropReason::None) check(e.clientFlow.version == v.key.version);
    }
  }
  return 0;
}
