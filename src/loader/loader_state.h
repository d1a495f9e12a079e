#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "ferry/collate.h"
#include "ferry/data_loader.h"
#include "ferry/data_loader_options.h"
#include "ferry/dataset.h"
#include "ferry/sampler.h"

#include "collate/buffer_pool.h"
#include "device/device_stage.h"
#include "ipc/unique_fd.h"
#include "loader/loader_stats.h"
#include "loader/trace.h"
#include "workers/fetch.h"

namespace ferry::detail {

class WorkerPool;

// What every epoch of one loader shares. Iterators hold it, so they may outlive the loader; the
// loader's destructor closes it, which stops every worker and ends every iterator.
struct LoaderState {
  LoaderState();
  ~LoaderState();

  std::shared_ptr<const Dataset> dataset;
  std::shared_ptr<const IterableDataset> iterable;
  DataLoaderOptions options;                    // resolved
  std::shared_ptr<BatchSampler> batch_sampler;  // map-style datasets only
  // The sampler the loader made itself (shuffle or not), which follows the dataset's length
  // from epoch to epoch; null for a sampler or batch sampler the user gave.
  std::shared_ptr<Sampler> own_sampler;
  CollateFn collate_fn;
  // A batch whose every sample on_error = skip left out is delivered empty rather than left out,
  // so that the ranks of a distributed job yield the same number of batches (a DistributedSampler).
  bool keep_empty_batches = false;
  // spawn and forkserver: what a worker rebuilds (canonical configuration text and hash) and
  // the program spawn starts. Empty collate_config: default collate.
  std::string dataset_config;
  std::uint64_t dataset_hash = 0;
  std::string collate_config;
  std::uint64_t collate_hash = 0;
  std::string worker_program;  // empty: this program (it called ferry::init)
  std::uint64_t next_epoch = 0;
  // pin_memory, a device or device transforms: the stage between the loader and the loop. Null
  // when there is nothing to do, so the default path pays nothing for it.
  std::shared_ptr<device::DeviceStage> stage;
  // num_workers = 0: batch buffers, reused once the training loop lets go of a batch.
  std::shared_ptr<collate::BufferPool> buffers = std::make_shared<collate::BufferPool>();

  // Worker processes. `use_mutex` is held by an iterator while it works, so close() (from any
  // thread) waits for it to leave; `wake` (an eventfd) interrupts its wait in poll, so close()
  // from another thread ends a next() that waits for a batch (it raises LoaderClosed).
  std::mutex use_mutex;
  std::atomic<bool> closed{false};
  ipc::UniqueFd wake;
  std::shared_ptr<WorkerPool> persistent_pool;
  std::vector<std::weak_ptr<WorkerPool>> pools;  // every pool started, to stop them on close
  std::uint64_t next_token = 1;                  // identifies the epoch that owns a pool

  // What was delivered and skipped, across epochs (DataLoader::stats()). Iterators update it
  // through their const view of the state.
  // Delivered batches and samples are counted without a lock (one count per batch, on the hot
  // path); the skip list takes the mutex.
  mutable std::atomic<std::size_t> delivered_batches{0};
  mutable std::atomic<std::size_t> delivered_samples{0};
  mutable std::mutex stats_mutex;
  mutable std::size_t skipped = 0;                   // every sample skipped so far
  mutable std::deque<SkippedSample> recent_skipped;  // the last skipped_history of them
  void record_skipped(std::uint64_t epoch,
                      const std::vector<workers::SkippedSample>& skipped) const;
  mutable std::vector<WorkerRestart> restarts;  // under stats_mutex: every respawn so far
  // Where the time goes, per epoch (always on); the trace (null: none); the workers' cores
  // (DataLoaderOptions::worker_cpus resolved; empty: any).
  std::shared_ptr<StatsRecorder> recorder;
  std::shared_ptr<Tracer> tracer;
  std::vector<int> worker_cpus;
  // on_worker_death=respawn, under use_mutex (the iterating thread): the deaths each sample's
  // loading caused (what each was), and the samples left out for it from then on, with the
  // record each of their batches reports them by.
  std::map<std::int64_t, std::vector<std::string>> worker_kills;
  std::map<std::int64_t, workers::SkippedSample> quarantined;

  // Stops every worker of this loader; iterators then throw LoaderClosed. Idempotent, noexcept,
  // bounded by the shutdown grace.
  void close() noexcept;

  // Checkpoints (DataLoader::state()). What the training loop has consumed of the epoch in
  // progress: the batches it received (or whose error it received), by sequence number.
  // Iterable datasets: where one worker's stream stands in what the loop consumed.
  struct StreamProgress {
    std::uint64_t position = 0;         // samples of the stream in consumed batches
    std::optional<std::string> cursor;  // the stream's cursor after them, if it gives one
    bool ended = false;                 // the loop has seen the stream end
  };
  struct Progress {
    std::uint64_t owner = 0;  // the epoch iterator that reports; 0: no epoch in progress
    std::uint64_t epoch = 0;
    bool finished = false;           // the iterator reached the end of the epoch
    std::size_t batches = 0;         // in the epoch (map-style)
    std::size_t prefix = 0;          // batches 0 .. prefix-1 consumed (iterable: results taken)
    std::set<std::uint64_t> beyond;  // consumed batches past the prefix (out of order)
    std::vector<StreamProgress> streams;  // iterable: one per worker (one without workers)
    std::size_t next_worker = 0;          // iterable, in order: whose result comes next
  };
  // Where load_state() continues: the next begin(), if it runs `epoch`, skips these batches
  // (map-style), or continues each worker's stream where it stood (iterable).
  struct Resume {
    std::uint64_t epoch = 0;
    std::size_t prefix = 0;
    std::vector<std::uint64_t> beyond;  // sorted
    std::vector<StreamProgress> streams;
    std::size_t next_worker = 0;
    bool skips(std::uint64_t sequence) const noexcept;
  };
  std::optional<Resume> resume;
  mutable std::uint64_t next_progress_owner = 1;  // under progress_mutex
  mutable std::mutex progress_mutex;
  mutable Progress progress;
};

// An epoch iterator's report of what the loop consumed (LoaderState::progress): opened when the
// epoch starts, closed when the iterator goes (a `break` leaves the rest of the epoch behind, as
// the next begin() does).
class ProgressTracker {
 public:
  ProgressTracker(std::shared_ptr<const LoaderState> state,
                  std::uint64_t epoch,
                  const std::optional<LoaderState::Resume>& resume);
  ~ProgressTracker();
  ProgressTracker(const ProgressTracker&) = delete;
  ProgressTracker& operator=(const ProgressTracker&) = delete;
  // Batch `sequence` reached the loop (as a batch, its error, or nothing left after skipping).
  void consumed(std::uint64_t sequence);
  // The epoch's plan is known: `batches` in all.
  void set_batches(std::size_t batches);
  // Iterable: the loop took a result of worker `worker`'s stream: its end (`ended`), a batch
  // whose last sample was at `position - 1` (`cursor` after it), or an error (no position).
  void stream_result(std::size_t worker,
                     bool ended,
                     std::optional<std::uint64_t> position,
                     std::optional<std::string> cursor,
                     std::size_t workers);
  // The iterator reached the end of the epoch.
  void finish();

 private:
  std::shared_ptr<const LoaderState> state_;
  std::uint64_t owner_;
};

// The batches of epoch `epoch`, after the loader's own sampler has taken the dataset's length
// now (PyTorch's samplers read len(dataset) at every epoch, so a dataset that grew is loaded
// whole).
class EpochPlan;
EpochPlan plan_epoch(const LoaderState& state, std::uint64_t epoch);

// The batches of one epoch: for the stock BatchSampler, its sampler's order cut into batch_size
// chunks, read one batch at a time (an order is computed, or holds one permutation: nothing is
// copied up front, whatever the dataset's size); a custom batch sampler's own lists otherwise.
class EpochPlan {
 public:
  EpochPlan() = default;
  EpochPlan(BatchSampler& batch_sampler, std::uint64_t epoch);
  std::size_t size() const noexcept { return count_; }
  std::vector<std::int64_t> batch(std::size_t k) const;

 private:
  std::shared_ptr<const IndexOrder> order_;
  std::size_t batch_size_ = 1;
  std::vector<std::vector<std::int64_t>> lists_;
  std::size_t count_ = 0;
};

// The LoaderClosed an iterator raises once its loader was destroyed or closed; `when` says at
// which point ("while next() waited for a batch").
[[noreturn]] void throw_loader_closed(const char* when);

// Whether the main process and the workers poll briefly before sleeping (ipc::spin_poll): only
// when each of them has a core to itself.
bool spin_before_sleep(const DataLoaderOptions& options) noexcept;

// Counts a batch as delivered and hands it to the training loop through the device stage (which
// started it when it arrived: its copy may already be done).
Batch deliver(device::StagedBatch staged, const LoaderState& state);
// A batch the calling thread just loaded: started and delivered at once.
Batch deliver(Batch host, const LoaderState& state);
// Batch `sequence`, every sample of which was skipped: no samples, no fields.
Batch deliver_empty(std::uint64_t epoch, std::uint64_t sequence, const LoaderState& state);

}  // namespace ferry::detail
