#include "control/discovery/source.hpp"

#include "control/discovery/dns_source.hpp"
#include "control/discovery/file_source.hpp"

namespace spillway {

std::unique_ptr<DiscoveryFeed> makeDiscoveryFeed(const DiscoveryConfig& config) {
  if (config.kind == DiscoveryKind::Dns) return std::make_unique<DnsSource>(config);
  return std::make_unique<FileSdSource>(config);
}

}  // namespace spillway
