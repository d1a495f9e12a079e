#pragma once

// Where a loader's time goes (DataLoader::stats()): the training loop's waits, each worker's
// time split as it reports it with each batch, and the shared memory mapped at peak. Cheap
// enough to be always on: two clock reads and a few plain adds per batch, no lock, and fewer
// clock reads when batches come faster than 100,000 a second (core/timing_stride.h).

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "ferry/data_loader.h"

#include "core/timing_stride.h"
#include "ipc/protocol.h"

namespace ferry::detail {

// A count that one thread writes and any thread reads: a relaxed load and store, no locked
// instruction (the hot path pays a plain add).
class Tally {
 public:
  void add(std::uint64_t d) noexcept {
    value_.store(value_.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
  }
  void set(std::uint64_t v) noexcept { value_.store(v, std::memory_order_relaxed); }
  std::uint64_t get() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> value_{0};
};

// Durations in a logarithmic histogram: 32 buckets per power of two (quantiles within 2%), from
// 1 ns to centuries, in fixed memory. One thread records; any thread reads.
class LatencyHistogram {
 public:
  // `ns`, for `weight` durations (a timed one that stands for untimed ones: TimingStride).
  void record(std::uint64_t ns, std::uint64_t weight = 1) noexcept;
  void merge(const LatencyHistogram& other) noexcept;
  // The q-quantile (0 < q <= 1) in seconds; 0 when empty.
  double quantile(double q) const noexcept;
  std::uint64_t count() const noexcept { return count_.get(); }
  std::uint64_t max_ns() const noexcept { return max_.get(); }

 private:
  static constexpr int kSub = 32;
  static constexpr int kBuckets = 64 * kSub;
  static std::size_t bucket(std::uint64_t ns) noexcept;
  static double midpoint(std::size_t bucket) noexcept;
  std::array<Tally, kBuckets> counts_{};
  Tally count_;
  Tally max_;
};

// Bytes of batch segments the main process has mapped, and their peak since it was last reset.
// Shared by the loader and every mapping (which may outlive it).
class MemoryGauge {
 public:
  void add(std::size_t bytes) noexcept;
  void sub(std::size_t bytes) noexcept;
  std::size_t peak() const noexcept { return peak_.load(std::memory_order_relaxed); }
  void reset_peak() noexcept { peak_.store(now_.load(std::memory_order_relaxed)); }

 private:
  std::atomic<std::size_t> now_{0};
  std::atomic<std::size_t> peak_{0};
};

// Whether workers that used `cpu_seconds` in `seconds` on `worker_cores` cores kept them busy
// enough (90%) to starve a training thread that shares them (SPDL's "noisy neighbour").
bool workers_saturate(double cpu_seconds, double seconds, std::size_t worker_cores) noexcept;

// When to warn of the noisy neighbour: once, when epochs whose workers saturated their cores add
// up to kSeconds. A short run (a demo, a smoke test) loses nothing worth a warning to it.
class NoisyNeighbourRule {
 public:
  static constexpr double kSeconds = 30.0;
  // One finished epoch; true the first time the saturated epochs reach kSeconds.
  bool observe(double cpu_seconds, double seconds, std::size_t worker_cores) noexcept {
    if (warned_ || !workers_saturate(cpu_seconds, seconds, worker_cores)) return false;
    saturated_ += seconds;
    warned_ = saturated_ >= kSeconds;
    return warned_;
  }

 private:
  double saturated_ = 0;
  bool warned_ = false;
};

// The figures of every epoch of one loader. The iterating thread records (a loader is iterated
// from one thread), without a lock on the per-batch path; stats() reads from any thread.
class StatsRecorder {
 public:
  struct Epoch;  // one epoch's running figures

  // `worker_cores`: the cores the workers may run on (for the noisy-neighbour warning).
  StatsRecorder(std::size_t num_workers, std::vector<int> worker_cores, std::size_t history = 100);

  // begin() starts an epoch (its clock runs from now); forget() drops one that never started.
  std::shared_ptr<Epoch> open(std::uint64_t epoch);
  void forget(const std::shared_ptr<Epoch>& epoch);
  // The loop waited from `start_ns` to `now_ns` (CLOCK_MONOTONIC) in begin() or ++ and got a
  // batch of `samples` (or an error). The wait stands for `weight` batches' (TimingStride): this
  // one and those since the previous timed one, which counted() counted; their waits add up to
  // `total_ns` (TimingStride::scaled; this wait alone when weight is 1).
  static void delivered(Epoch& epoch,
                        std::uint64_t start_ns,
                        std::uint64_t now_ns,
                        std::size_t samples,
                        std::uint32_t weight = 1,
                        std::optional<std::uint64_t> total_ns = std::nullopt) noexcept;
  // The loop got a batch of `samples` (or an error) whose wait was not timed.
  static void counted(Epoch& epoch, std::size_t samples) noexcept;
  // The loop waited and found the end of the epoch. Warns once (stderr) when the workers kept
  // their cores busy and the calling (training) thread may run on them too.
  void reached_end(Epoch& epoch, std::uint64_t start_ns, std::uint64_t now_ns);
  // The iterator went (at the end or not): the epoch's clock stops at its last batch.
  void close(Epoch& epoch);
  // A worker's report with one batch. Each figure is clamped: a worker's word is not trusted.
  static void worker_batch(Epoch& epoch,
                           std::size_t worker,
                           const ipc::WorkerTiming& timing,
                           std::size_t samples) noexcept;

  const std::shared_ptr<MemoryGauge>& memory() const noexcept { return memory_; }
  // The figures now: each recent epoch, the one in progress included, and all of them together.
  void fill(LoaderStats& out) const;
  // The figures of one epoch now.
  EpochStats epoch_stats(const Epoch& epoch) const;

 private:
  EpochStats snapshot(const Epoch& epoch) const;  // under mutex_

  std::size_t num_workers_;
  std::vector<int> worker_cores_;  // sorted
  std::size_t history_;
  NoisyNeighbourRule noisy_neighbour_;
  std::shared_ptr<MemoryGauge> memory_ = std::make_shared<MemoryGauge>();
  mutable std::mutex mutex_;
  std::deque<std::shared_ptr<Epoch>> epochs_;  // the most recent `history_`
  // The epochs that left the history: their sums, and their waits.
  EpochStats past_;
  std::unique_ptr<LatencyHistogram> past_waits_ = std::make_unique<LatencyHistogram>();
};

// An epoch iterator's figures: opened by begin(), closed when the iterator goes.
class EpochTally {
 public:
  EpochTally(std::shared_ptr<StatsRecorder> recorder, std::shared_ptr<StatsRecorder::Epoch> epoch)
      : recorder_(std::move(recorder)), epoch_(std::move(epoch)) {}
  ~EpochTally() { recorder_->close(*epoch_); }
  EpochTally(const EpochTally&) = delete;
  EpochTally& operator=(const EpochTally&) = delete;
  StatsRecorder& recorder() const noexcept { return *recorder_; }
  StatsRecorder::Epoch& epoch() const noexcept { return *epoch_; }
  // Which of the loop's waits to time.
  TimingStride& stride() noexcept { return stride_; }

 private:
  std::shared_ptr<StatsRecorder> recorder_;
  std::shared_ptr<StatsRecorder::Epoch> epoch_;
  TimingStride stride_;
};

}  // namespace ferry::detail
