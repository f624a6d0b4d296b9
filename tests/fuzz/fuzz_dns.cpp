// libFuzzer target: any byte string as a DNS reply, as a server (or anyone
// who can answer the control plane's queries) might send it. parseDnsAnswer
// must never crash or read out of bounds, and keeps its invariants: Ok has
// records, each of the type asked (an address of that family, or an SRV
// target); any other status has none and says why.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "control/discovery/dns_resolver.hpp"

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace spillway;
  for (DnsRecordType type : {DnsRecordType::A, DnsRecordType::Aaaa, DnsRecordType::Srv}) {
    const DnsAnswer a = parseDnsAnswer(data, size, type);
    if (a.status != DnsStatus::Ok) {
      check(a.records.empty() && !a.error.empty());
      continue;
    }
    check(!a.records.empty());
    for (const DnsRecord& r : a.records) {
      check(r.ttl <= 0x7fffffffU);
      if (type == DnsRecordType::A) check(r.address.version == IpVersion::V4);
      if (type == DnsRecordType::Aaaa) check(r.address.version == IpVersion::V6);
      if (type == DnsRecordType::Srv) check(r.target.size() <= 255);
    }
  }
  return 0;
}
