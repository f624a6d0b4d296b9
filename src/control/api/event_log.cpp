#include "control/api/event_log.hpp"

#include <algorithm>
#include <utility>

namespace spillway {

EventLog::EventLog(std::size_t capacity) : ring_(std::max<std::size_t>(capacity, 1)) {}

std::uint64_t EventLog::append(Millis time, std::string backend, std::string kind,
                               std::string cause, std::optional<BackendState> from,
                               std::optional<BackendState> to) {
  Event& e = ring_[head_];
  if (size_ == ring_.size()) {
    ++dropped_;
  } else {
    ++size_;
  }
  e.seq = nextSeq_++;
  e.time = time;
  e.backend = std::move(backend);
  e.kind = std::move(kind);
  e.from = from;
  e.to = to;
  e.cause = std::move(cause);
  head_ = (head_ + 1) % ring_.size();
  return e.seq;
}

EventPage EventLog::since(std::uint64_t after, std::size_t limit) const {
  EventPage page;
  const std::uint64_t last = lastSeq();
  after = std::min(after, last);
  page.next = after;
  if (size_ == 0 || after == last) return page;
  const std::uint64_t oldest = last - size_ + 1;
  std::uint64_t first = after + 1;
  if (first < oldest) {
    page.missed = oldest - first;
    first = oldest;
  }
  std::uint64_t count = last - first + 1;
  if (limit != 0) count = std::min<std::uint64_t>(count, limit);
  page.events.reserve(count);
  // The oldest kept event sits at head_ when the ring is full, else at 0.
  const std::size_t oldestAt = size_ == ring_.size() ? head_ : 0;
  for (std::uint64_t s = first; s < first + count; ++s) {
    page.events.push_back(ring_[(oldestAt + (s - oldest)) % ring_.size()]);
  }
  page.next = first + count - 1;
  return page;
}

}  // namespace spillway
