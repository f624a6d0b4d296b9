#include "control/sys/durable_writer.hpp"

#include <chrono>
#include <utility>

#include "control/sys/durable_file.hpp"

namespace spillway {

DurableWriter::~DurableWriter() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool DurableWriter::setMode(Mode mode) {
  std::lock_guard lock(mu_);
  if (pending_) return false;
  mode_ = mode;
  return true;
}

DurableWriter::Result DurableWriter::writeAll(const std::vector<File>& files) {
  const auto start = std::chrono::steady_clock::now();
  Result r;
  for (const File& f : files) {
    r.error = writeFileDurably(f.path, f.bytes);
    if (r.error) break;
  }
  r.writeMs = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                             std::chrono::steady_clock::now() - start)
                                             .count());
  return r;
}

bool DurableWriter::submit(std::vector<File> files) {
  std::unique_lock lock(mu_);
  if (pending_) return false;
  pending_ = true;
  if (mode_ == Mode::Inline) {
    lock.unlock();
    Result r = writeAll(files);
    lock.lock();
    result_ = std::move(r);
    return true;
  }
  queued_ = std::move(files);
  queuedReady_ = true;
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  lock.unlock();
  cv_.notify_all();
  return true;
}

bool DurableWriter::busy() const {
  std::lock_guard lock(mu_);
  return pending_;
}

std::optional<DurableWriter::Result> DurableWriter::poll() {
  std::lock_guard lock(mu_);
  if (!pending_ || !result_) return std::nullopt;
  pending_ = false;
  return std::exchange(result_, std::nullopt);
}

std::optional<DurableWriter::Result> DurableWriter::wait() {
  std::unique_lock lock(mu_);
  if (!pending_) return std::nullopt;
  cv_.wait(lock, [this] { return result_.has_value(); });
  pending_ = false;
  return std::exchange(result_, std::nullopt);
}

void DurableWriter::holdForTest(bool held) {
  {
    std::lock_guard lock(mu_);
    held_ = held;
  }
  cv_.notify_all();
}

void DurableWriter::waitFinishedForTest() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [this] { return !pending_ || result_.has_value(); });
}

void DurableWriter::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || (queuedReady_ && !held_); });
    if (!queuedReady_) return;  // stopping with nothing left to write
    std::vector<File> files = std::move(queued_);
    queued_.clear();
    queuedReady_ = false;
    lock.unlock();
    Result r = writeAll(files);
    lock.lock();
    result_ = std::move(r);
    cv_.notify_all();
  }
}

}  // namespace spillway
