#pragma once

// A loader's trace: the most recent events in a ring of fixed capacity, written as Chrome
// trace-event JSON (Perfetto, chrome://tracing). Track 0 is the training loop, track w + 1
// worker w. Times are CLOCK_MONOTONIC, which the workers share with the main process.

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

namespace ferry::detail {

class Tracer {
 public:
  Tracer(std::size_t capacity, std::size_t num_workers);

  static std::uint64_t now_ns() noexcept;  // CLOCK_MONOTONIC

  // A span on the training loop's track: it waited for batch (epoch, sequence).
  void wait(std::uint64_t start_ns, std::uint64_t end_ns, std::uint64_t epoch, std::int64_t batch);
  // Spans a worker reported: a sample it loaded, a batch it collated, or a batch it loaded as a
  // whole. Spans outside the trace's life are dropped (a worker's clock is its word).
  void worker_sample(std::size_t worker,
                     std::uint64_t start_ns,
                     std::uint64_t end_ns,
                     std::uint64_t epoch,
                     std::uint64_t batch,
                     std::int64_t index);
  void worker_collate(std::size_t worker,
                      std::uint64_t start_ns,
                      std::uint64_t end_ns,
                      std::uint64_t epoch,
                      std::uint64_t batch,
                      std::size_t samples);
  void worker_load(std::size_t worker,
                   std::uint64_t start_ns,
                   std::uint64_t end_ns,
                   std::uint64_t epoch,
                   std::uint64_t batch);
  // A remote shard's transfer a worker made (one GET, or one attempt of it).
  void worker_download(std::size_t worker, std::uint64_t start_ns, std::uint64_t end_ns);
  // A batch's life: dispatched to a worker, delivered to the loop.
  void batch_dispatched(std::uint64_t epoch, std::uint64_t batch, std::size_t worker);
  void batch_delivered(std::uint64_t epoch, std::uint64_t batch);
  // Instant events: epochs beginning and ending, errors, restarts, skipped samples.
  void instant(std::string name, std::string message = {});

  // The trace as JSON text, and written to `path` atomically.
  std::string json() const;
  void write(const std::filesystem::path& path) const;
  std::size_t capacity() const noexcept { return capacity_; }
  std::size_t recorded() const;  // events in the ring now

 private:
  enum class Kind : std::uint8_t {
    kWait,
    kSample,
    kCollate,
    kLoad,
    kDownload,
    kBatchBegin,
    kBatchEnd,
    kInstant
  };
  struct Event {
    Kind kind = Kind::kInstant;
    std::uint32_t track = 0;
    std::uint64_t start_ns = 0;
    std::uint64_t end_ns = 0;
    std::uint64_t epoch = 0;
    std::int64_t batch = 0;
    std::int64_t value = 0;  // the sample's index, the collated batch's samples, the worker
    std::string name{};      // instant events
    std::string message{};
  };
  void push(Event event);
  bool plausible(std::uint64_t start_ns, std::uint64_t end_ns) const noexcept;

  std::size_t capacity_;
  std::size_t num_workers_;
  std::uint64_t origin_ns_;
  int pid_;
  mutable std::mutex mutex_;
  std::vector<Event> ring_;
  std::size_t next_ = 0;       // where the next event goes once the ring is full
  std::uint64_t dropped_ = 0;  // events overwritten
};

}  // namespace ferry::detail
