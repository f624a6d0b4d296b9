// Files made durable (durable_file.hpp: temporary file, fsync, rename, fsync
// of the directory) off the caller's thread. On a busy host one fsync can
// take seconds; the control loop that feeds health checks, the announcer's
// heartbeat and the freeze guard must not wait for it. One batch at a time:
// submit() refuses while a batch is in flight, poll() hands its result back
// once, in the caller's own time.
//
// Inline mode writes in submit() itself (same results, no thread): unit
// tests that step time by hand, and callers that must finish before they
// return (the last checkpoint at shutdown uses wait()).
//
// Thread contract: one caller thread (the control thread); the writer's own
// thread starts at the first submit in Thread mode (after start-up dropped
// privileges, so it is covered by them) and is joined by the destructor.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace spillway {

class DurableWriter {
 public:
  enum class Mode { Inline, Thread };
  struct File {
    std::string path;
    std::string bytes;
  };
  struct Result {
    std::optional<std::string> error;  // the first failure; later files not written
    std::uint64_t writeMs = 0;         // wall time of the whole batch on the writer
  };

  explicit DurableWriter(Mode mode = Mode::Inline) : mode_(mode) {}
  ~DurableWriter();
  DurableWriter(const DurableWriter&) = delete;
  DurableWriter& operator=(const DurableWriter&) = delete;

  // Switches mode; only while nothing is in flight (false otherwise).
  bool setMode(Mode mode);
  [[nodiscard]] Mode mode() const noexcept { return mode_; }

  // Queues a batch, written in order; false (nothing queued) while the
  // previous batch is in flight or its result has not been polled.
  bool submit(std::vector<File> files);
  // True from submit() until poll() or wait() returned the batch's result.
  [[nodiscard]] bool busy() const;
  // The batch's result once it finished (once); nullopt while it runs or
  // when nothing was submitted.
  std::optional<Result> poll();
  // Blocks until the batch in flight finished and returns its result;
  // nullopt when nothing was in flight.
  std::optional<Result> wait();

  // Tests: while held, the writer's thread does not start a batch (a disk
  // that stalls), so a test can show the caller goes on meanwhile.
  void holdForTest(bool held);
  // Tests: blocks until the batch in flight (if any) finished, leaving its
  // result for poll().
  void waitFinishedForTest();

 private:
  static Result writeAll(const std::vector<File>& files);
  void run();

  Mode mode_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
  bool stop_ = false;
  bool held_ = false;
  bool pending_ = false;          // a batch submitted and its result not yet taken
  std::vector<File> queued_;      // the batch the thread is to write
  bool queuedReady_ = false;      // queued_ holds a batch not yet started
  std::optional<Result> result_;  // the finished batch's result, until taken
};

}  // namespace spillway
