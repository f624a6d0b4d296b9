#include "control/health/conn_rebuild.hpp"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>
#include <utility>

#include "control/sys/epoll_loop.hpp"
#include "spillway/errno_text.hpp"

namespace spillway {

struct ConnRebuild::Request {
  HttpExchange exchange;
  Millis startedAt = 0;
  bool running = false;
};

namespace {

using Json = nlohmann::json;

std::optional<std::uint16_t> portOf(const Json& j) {
  if (!j.is_number_integer() && !j.is_number_unsigned()) return std::nullopt;
  const auto v = j.get<std::int64_t>();
  if (v < 1 || v > 65535) return std::nullopt;
  return static_cast<std::uint16_t>(v);
}

}  // namespace

std::variant<ConnListAnswer, std::string> parseConnList(std::string_view body,
                                                        const RebuildTarget& target,
                                                        const FlowHasher& hasher) {
  const Json doc = Json::parse(body.begin(), body.end(), nullptr, false);
  if (doc.is_discarded()) return std::string("the answer is not JSON");
  if (!doc.is_object()) return std::string("the answer is not a JSON object");
  const auto vips = doc.find("vips");
  if (vips == doc.end() || !vips->is_object()) {
    return std::string("the answer has no \"vips\" object (is this spillway-decap agent?)");
  }
  ConnListAnswer out;
  if (const auto t = doc.find("truncated"); t != doc.end()) {
    if (!t->is_boolean()) return std::string("\"truncated\" is not true or false");
    out.truncated = t->get<bool>();
  }
  for (const auto& [text, list] : vips->items()) {
    const std::optional<IpAddress> vip = parseIpAddress(text);
    if (!list.is_array()) return "the connections of \"" + text + "\" are not a list";
    for (const Json& c : list) {
      ++out.listed;
      if (!vip || !c.is_object()) {
        ++out.invalid;
        continue;
      }
      const auto client = c.find("client");
      const auto clientPort = c.find("client_port");
      const auto vipPort = c.find("vip_port");
      if (client == c.end() || clientPort == c.end() || vipPort == c.end() ||
          !client->is_string()) {
        ++out.invalid;
        continue;
      }
      const std::optional<IpAddress> from = parseIpAddress(client->get_ref<const std::string&>());
      const std::optional<std::uint16_t> sport = portOf(*clientPort);
      const std::optional<std::uint16_t> dport = portOf(*vipPort);
      if (!from || !sport || !dport || from->version != vip->version) {
        ++out.invalid;
        continue;
      }
      const auto served = std::find_if(target.vips.begin(), target.vips.end(), [&](const auto& v) {
        return v.address == *vip && (v.port == 0 || v.port == *dport);
      });
      if (served == target.vips.end()) {
        ++out.foreign;
        continue;
      }
      // The key exactly as the data path parses the client's packet
      // (packet.cpp): client -> VIP.
      FlowKey key;
      key.src = from->bytes;
      key.dst = vip->bytes;
      key.srcPort = Be16::fromHost(*sport);
      key.dstPort = Be16::fromHost(*dport);
      key.proto = static_cast<std::uint8_t>(IpProto::Tcp);
      key.version = vip->version;
      bool established = true;
      if (const auto s = c.find("state"); s != c.end() && s->is_string()) {
        established = s->get_ref<const std::string&>() == "ESTABLISHED";
      }
      out.flows.push_back(RebuiltFlow{hasher.hash(key), target.id, served->tag, established});
    }
  }
  out.total = out.listed;
  if (const auto t = doc.find("total"); t != doc.end() && t->is_number_unsigned()) {
    out.total = std::max<std::size_t>(out.listed, t->get<std::size_t>());
  }
  return out;
}

ConnRebuild::ConnRebuild(std::vector<RebuildTarget> targets, std::uint64_t hashSeed,
                         std::size_t maxFlows)
    : targets_(std::move(targets)), hasher_(hashSeed), maxFlows_(maxFlows) {
  status_.reserve(targets_.size());
  requests_.reserve(targets_.size());
  for (const RebuildTarget& t : targets_) {
    RebuildBackendStatus s;
    s.name = t.name;
    s.id = t.id;
    status_.push_back(std::move(s));
    requests_.push_back(std::make_unique<Request>());
  }
  epollFd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epollFd_ < 0) initError_ = "epoll_create1: " + errnoText(errno);
}

ConnRebuild::~ConnRebuild() {
  requests_.clear();  // the exchanges close their sockets first
  if (epollFd_ >= 0) ::close(epollFd_);
}

void ConnRebuild::start(std::size_t index, Millis now) noexcept {
  Request& r = *requests_[index];
  const RebuildTarget& t = targets_[index];
  if (epollFd_ < 0) {
    recordFailure(index, now, initError_);
    return;
  }
  try {
    HttpRequest request;
    request.mode = HttpExchangeMode::FullResponse;
    request.address = t.address;
    request.port = t.port;
    request.path = t.path;
    request.accept = "application/json";
    request.maxResponseBytes = kRebuildMaxBytes;
    request.bearer = t.token;
    r.running = true;
    r.startedAt = now;
    ++inFlight_;
    r.exchange.start(request, epollFd_, index + 1);
  } catch (...) {
    recordFailure(index, now, "out of memory");
    return;
  }
  if (r.exchange.finished()) finish(index, now);
}

void ConnRebuild::finish(std::size_t index, Millis now) noexcept {
  Request& r = *requests_[index];
  if (r.exchange.state() == HttpExchange::State::Failed) {
    std::string error = r.exchange.error();
    r.exchange.abort("done");
    recordFailure(index, now, std::move(error));
    return;
  }
  record(index, now, r.exchange.status(), r.exchange.body());
  r.exchange.abort("done");
}

void ConnRebuild::recordFailure(std::size_t index, Millis now, std::string error) noexcept {
  if (index >= status_.size()) return;
  RebuildBackendStatus& s = status_[index];
  if (s.outcome != RebuildBackendStatus::Outcome::Pending) return;
  Request& r = *requests_[index];
  if (r.running) {
    r.running = false;
    --inFlight_;
  }
  s.outcome = RebuildBackendStatus::Outcome::Failed;
  s.error = std::move(error);
  s.tookMs = started_ && now >= *started_ ? now - *started_ : 0;
  ++totals_.failed;
}

void ConnRebuild::record(std::size_t index, Millis now, int status,
                         std::string_view body) noexcept {
  if (index >= status_.size() || status_[index].outcome != RebuildBackendStatus::Outcome::Pending) {
    return;
  }
  if (status != 200) {
    std::string why = "HTTP status " + std::to_string(status) + ", expected 200";
    if (status == 401) why += " (the agent refused the pool's token_file)";
    if (status == 403) why += " (the agent has no --token-file: its list is off)";
    recordFailure(index, now, std::move(why));
    return;
  }
  try {
    auto parsed = parseConnList(body, targets_[index], hasher_);
    if (auto* error = std::get_if<std::string>(&parsed)) {
      recordFailure(index, now, "bad answer: " + *error);
      return;
    }
    ConnListAnswer& a = std::get<ConnListAnswer>(parsed);
    RebuildBackendStatus& s = status_[index];
    Request& r = *requests_[index];
    if (r.running) {
      r.running = false;
      --inFlight_;
    }
    s.outcome = RebuildBackendStatus::Outcome::Answered;
    s.listed = a.listed;
    s.total = a.total;
    s.truncated = a.truncated;
    s.invalid = a.invalid;
    s.foreign = a.foreign;
    s.tookMs = started_ && now >= *started_ ? now - *started_ : 0;
    ++totals_.answered;
    totals_.truncated += a.truncated ? 1 : 0;
    totals_.invalid += a.invalid + a.foreign;
    for (const RebuiltFlow& f : a.flows) {
      const auto it = byHash_.find(f.hash);
      if (it != byHash_.end()) {
        RebuiltFlow& kept = flows_[it->second];
        if (kept.backendId == f.backendId) continue;  // listed twice by one backend
        ++totals_.conflicts;
        if (!kept.established && f.established) kept = f;
        continue;
      }
      if (flows_.size() >= maxFlows_) {
        ++totals_.overCap;
        continue;
      }
      byHash_.emplace(f.hash, flows_.size());
      flows_.push_back(f);
      ++s.flows;
    }
    totals_.flows = flows_.size();
  } catch (...) {
    recordFailure(index, now, "out of memory");
  }
}

std::optional<Millis> ConnRebuild::nextDeadline() const noexcept {
  if (done_) return std::nullopt;
  if (!started_) return Millis{0};
  std::optional<Millis> next = *started_ + kConnRebuildLimit;
  for (std::size_t i = 0; i < requests_.size(); ++i) {
    if (!requests_[i]->running) continue;
    const Millis at = requests_[i]->startedAt + std::max<Millis>(targets_[i].timeout, 1);
    next = std::min(*next, at);
  }
  return next;
}

void ConnRebuild::poll(Millis now) noexcept {
  if (done_) return;
  if (!started_) started_ = now;
  try {
    if (epollFd_ >= 0) {
      drainReady(epollFd_, [&](const epoll_event& ev) {
        const std::uint64_t tag = ev.data.u64;
        if (tag == 0 || tag > requests_.size()) return;
        Request& r = *requests_[tag - 1];
        if (!r.running) return;
        r.exchange.onEvent(ev.events);
        if (r.exchange.finished()) finish(tag - 1, now);
      });
    }
  } catch (...) {
    // Allocation failure: the requests time out.
  }
  for (std::size_t i = 0; i < requests_.size(); ++i) {
    Request& r = *requests_[i];
    const Millis timeout = std::max<Millis>(targets_[i].timeout, 1);
    if (r.running && now >= r.startedAt + timeout) {
      const std::string what = r.exchange.connected() ? "no complete answer" : "connect timeout";
      r.exchange.abort("timeout");
      recordFailure(i, now, what + " within " + std::to_string(timeout) + " ms");
    }
  }
  const bool overdue = now >= *started_ + kConnRebuildLimit;
  while (!overdue && nextToStart_ < requests_.size() && inFlight_ < kRebuildParallel) {
    start(nextToStart_++, now);
  }
  if (overdue) {
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      if (status_[i].outcome != RebuildBackendStatus::Outcome::Pending) continue;
      requests_[i]->exchange.abort("limit");
      recordFailure(i, now,
                    requests_[i]->running
                        ? "no answer within the rebuild's limit"
                        : "not asked: the rebuild's limit (" + std::to_string(kConnRebuildLimit) +
                              " ms) passed first");
    }
  }
  checkDone(now);
}

void ConnRebuild::checkDone(Millis now) noexcept {
  if (done_) return;
  const bool all = std::all_of(status_.begin(), status_.end(), [](const auto& s) {
    return s.outcome != RebuildBackendStatus::Outcome::Pending;
  });
  if (!all) return;
  done_ = true;
  finished_ = now;
}

}  // namespace spillway
