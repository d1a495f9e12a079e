#pragma once

#include <cstdint>
#include <filesystem>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/batch.h"
#include "ferry/collate.h"
#include "ferry/data_loader_options.h"
#include "ferry/dataset.h"
#include "ferry/sampler.h"

namespace ferry {

namespace detail {
class EpochIterator;  // one epoch's source of batches (in-process or worker processes)
struct LoaderState;
}  // namespace detail

/// A sample that `on_error = skip` left out.
struct SkippedSample {
  std::uint64_t epoch = 0;
  std::int64_t index = -1;  ///< the dataset index
  std::string error;        ///< the exception's type and message
};

/// A worker that died and was replaced under on_worker_death = respawn.
struct WorkerRestart {
  std::uint64_t epoch = 0;
  std::size_t worker_id = 0;
  int pid = 0;                         ///< the process that died
  int exit_code = -1;                  ///< its exit code, or -1 if a signal ended it
  int signal = 0;                      ///< the signal that ended it, or 0
  std::vector<std::uint64_t> batches;  ///< the batches of the epoch it held, loaded again
  std::int64_t index = -1;             ///< the sample it was loading when it died, if that is known
  std::string message;                 ///< what happened, as an error would say it
  std::vector<std::string> stderr_tail;  ///< its last lines on stderr
};

/// How long the training loop waited for batches (in `begin()` and `++`), in seconds. The
/// quantiles come from a logarithmic histogram: within 2%. Every wait is timed while batches come
/// slower than 100,000 a second; faster, one in up to 64 is, and stands for those since the
/// previous timed one (two clock reads would cost more than 1% of such a batch), so the figures
/// are estimates there, and the last few batches' waits may be left out of `count`.
struct WaitStats {
  std::size_t count = 0;  ///< batches (or errors) waited for (timed or stood for)
  double total = 0;       ///< every wait, the one that found the end of the epoch too
  double p50 = 0;
  double p99 = 0;
  double max = 0;
};

/// Where one worker process's time went, in seconds, from what it reports with each batch. A
/// worker that makes batches faster than 100,000 a second times one in up to 64 and reports it
/// for those since the previous timed one (estimates, as WaitStats); the counts are exact.
struct WorkerTimeStats {
  std::size_t worker_id = 0;
  std::size_t batches = 0;
  std::size_t samples = 0;
  double loading = 0;    ///< in Dataset::get (or the iterable dataset's stream)
  double collating = 0;  ///< laying batches out and writing them into shared memory
  double segment = 0;    ///< getting shared-memory segments (a fresh one: memfd, fallocate, mmap)
  double waiting = 0;    ///< waiting for a task: the training loop (or prefetch) was the limit
  double cpu = 0;        ///< CPU time the process used (user and system)
  /// Remote shards (s3://, http(s)://): bytes received over the network, requests made (of them
  /// retries), shards served from the node-local cache and shards downloaded into it.
  std::uint64_t net_bytes = 0;
  std::uint64_t net_requests = 0;
  std::uint64_t net_retries = 0;
  std::uint64_t cache_hits = 0;
  std::uint64_t cache_downloads = 0;
};

/// One epoch, or (LoaderStats::total) every epoch so far together.
struct EpochStats {
  std::uint64_t epoch = 0;
  bool finished = false;    ///< the loop reached the epoch's end
  std::size_t batches = 0;  ///< delivered to the loop
  std::size_t samples = 0;
  double seconds = 0;  ///< from begin() to the end (or to the last batch, or to now)
  double batches_per_second = 0;
  WaitStats wait;
  std::vector<WorkerTimeStats> workers;  ///< by worker id; empty with num_workers = 0
  double worker_cpu_seconds = 0;
  /// The workers' CPU time as a share of the machine: worker_cpu_seconds / (seconds x CPUs).
  double worker_cpu_share = 0;
  std::size_t shared_memory_peak = 0;  ///< bytes of batch segments mapped at once, at most
};

/// What a loader has delivered and skipped, over all its epochs so far.
struct LoaderStats {
  std::size_t batches = 0;  ///< batches handed to the training loop
  std::size_t samples = 0;  ///< samples in them
  std::size_t skipped = 0;  ///< samples left out under on_error = skip, all of them
  /// The most recent of them, oldest first: at most `skipped_history` (0: every one).
  std::vector<SkippedSample> skipped_samples;
  /// Workers replaced under on_worker_death = respawn, oldest first (at most
  /// max_worker_restarts_total of them: the budget bounds the list).
  std::vector<WorkerRestart> worker_restarts;
  /// The most recent epochs (up to 100), oldest first, the one in progress last.
  std::vector<EpochStats> epochs;
  /// Every epoch together: sums, the wait quantiles over every batch, the largest memory peak.
  EpochStats total;
  /// The cores the workers run on (DataLoaderOptions::worker_cpus, resolved); empty: any.
  std::vector<int> worker_cpus;
};

/// Makes every DataLoader worker of this process print, on stderr, the batch and the samples it
/// is loading and a stack trace, without stopping it. Async-signal-safe. ferry takes SIGUSR1 for
/// this when a loader first starts workers, unless the application has a handler for SIGUSR1
/// already: then call this from that handler.
void report_workers() noexcept;

/// Iterates batches of a dataset, as torch.utils.data.DataLoader does.
///
///   auto dataset = std::make_shared<MyDataset>();
///   ferry::DataLoader loader(dataset, {.batch_size = 64, .shuffle = true, .seed = 0});
///   for (int epoch = 0; epoch < 10; ++epoch) {
///     loader.set_epoch(epoch);          // optional: each iteration moves to the next epoch
///     for (auto& batch : loader) train(batch["image"], batch["label"]);
///   }
///
/// Each `begin()` starts an epoch: the first is epoch 0, each later one the next, unless
/// `set_epoch(e)` chose another. The epoch reaches the sampler (a new shuffle per epoch; for
/// `DistributedSampler`, PyTorch's `set_epoch` order) and each sample's random generator.
///
/// Constructors check every option against PyTorch's rules and throw `ferry::ConfigError` naming
/// the option, its value and the fix, before anything runs. A loader is not thread-safe: iterate
/// it from one thread. An iterator keeps what it needs alive, so it (and every batch) may outlive
/// the loader.
class DataLoader {
 public:
  class Iterator;
  /// The end of an epoch.
  struct Sentinel {};

  /// A map-style dataset with the default order (`shuffle` chooses sequential or random).
  DataLoader(std::shared_ptr<const Dataset> dataset,
             DataLoaderOptions options = {},
             CollateFn collate_fn = {});
  /// A map-style dataset with a sampler (`shuffle` must then be false).
  DataLoader(std::shared_ptr<const Dataset> dataset,
             DataLoaderOptions options,
             std::shared_ptr<Sampler> sampler,
             CollateFn collate_fn = {});
  /// A map-style dataset with a batch sampler (then batch_size must stay 1, and shuffle and
  /// drop_last false, as in PyTorch).
  DataLoader(std::shared_ptr<const Dataset> dataset,
             DataLoaderOptions options,
             std::shared_ptr<BatchSampler> batch_sampler,
             CollateFn collate_fn = {});
  /// An iterable dataset: no sampler, no shuffle; each worker runs its own stream.
  DataLoader(std::shared_ptr<const IterableDataset> dataset,
             DataLoaderOptions options = {},
             CollateFn collate_fn = {});
  /// Iterable datasets take no sampler; these throw `ConfigError` saying so (they exist so that
  /// configuration-driven code gets the same clear error as PyTorch's).
  DataLoader(std::shared_ptr<const IterableDataset> dataset,
             DataLoaderOptions options,
             std::shared_ptr<Sampler> sampler,
             CollateFn collate_fn = {});
  DataLoader(std::shared_ptr<const IterableDataset> dataset,
             DataLoaderOptions options,
             std::shared_ptr<BatchSampler> batch_sampler,
             CollateFn collate_fn = {});

  DataLoader(DataLoader&&) noexcept;
  DataLoader& operator=(DataLoader&&) noexcept;
  ~DataLoader();

  /// Starts the next epoch and returns its first position.
  Iterator begin();
  Sentinel end() const noexcept { return {}; }

  /// Number of batches an epoch yields (`len(loader)`). For an iterable dataset it needs
  /// `size_hint()`, and throws `ferry::Error` without one.
  std::size_t size() const;
  /// Chooses the epoch the next `begin()` runs; later ones follow from it.
  void set_epoch(std::uint64_t epoch) noexcept;
  /// The epoch the next `begin()` will run.
  std::uint64_t epoch() const noexcept;
  /// The options after `resolve()`: the seed in use, the prefetch factor.
  const DataLoaderOptions& options() const noexcept;
  /// Batches and samples delivered, the samples skipped (on_error = skip) with their errors,
  /// workers restarted, and where the time went: per epoch and in total, the loop's waits, each
  /// worker's time split and CPU, and the shared memory in use at peak. Always on (it costs a
  /// clock read per batch). Callable from any thread.
  LoaderStats stats() const;
  /// Writes the trace recorded so far (DataLoaderOptions::trace_path or trace_events) to `path`
  /// as Chrome trace-event JSON, atomically. Throws ferry::Error when no trace is on.
  void write_trace(const std::filesystem::path& path) const;

  /// A checkpoint of what the training loop has consumed: a small JSON text (format version,
  /// seed, epoch, the batches of the epoch received so far, including those received out of
  /// order past the first gap, the sampler's arguments, the totals in `stats()`). Batches
  /// prefetched but not yet received are not in it. Taken inside an epoch's loop, it resumes
  /// after the batch in hand; taken between epochs (after the loop, or a `break`), at the start
  /// of the epoch the next `begin()` would run. A few hundred bytes, whatever the dataset's size.
  std::string state() const;
  /// Continues from a `state()` text: the next `begin()` runs the saved epoch and yields only the
  /// batches the loop had not received, exactly as the uninterrupted run would have (with any
  /// number of workers, start method, `in_order` or persistence; a `DistributedSampler` also at
  /// another world size). Nothing is loaded to get there: the position is found in the epoch's
  /// order by arithmetic. Throws `ConfigError` naming `source` and the field when the text is
  /// not a state, is of another format version, or does not fit this loader (another dataset
  /// size, seed, batch size or sampler); the loader is then unchanged.
  void load_state(std::string_view text, std::string_view source = "the loader state");
  /// Writes `state()` to `path` atomically (a temporary file in the same folder, flushed to disk,
  /// then renamed over `path`), so a crash leaves the old file or the new one, never half of one.
  void save_state(const std::filesystem::path& path) const;
  /// Reads a file written by `save_state` and continues from it (`load_state`), errors naming it.
  void load_state_file(const std::filesystem::path& path);

 private:
  std::shared_ptr<detail::LoaderState> state_;
};

/// Walks one epoch. Copies share the epoch; advancing one advances all (an input iterator).
class DataLoader::Iterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = Batch;
  using difference_type = std::ptrdiff_t;
  using pointer = Batch*;
  using reference = Batch&;

  Iterator() = default;
  /// The current batch. If loading it failed (a dataset exception, a collate mismatch), rethrows
  /// that error instead; `++` then goes on with the next batch, as PyTorch's iterator does.
  Batch& operator*() const;
  Batch* operator->() const { return &**this; }
  /// Loads the next batch.
  Iterator& operator++();
  void operator++(int) { ++*this; }
  friend bool operator==(const Iterator& it, Sentinel) noexcept { return it.at_end(); }

 private:
  friend class DataLoader;
  explicit Iterator(std::shared_ptr<detail::EpochIterator> epoch);
  bool at_end() const noexcept;
  // Loads the next batch; the loop's wait counts from `started_ns` (CLOCK_MONOTONIC; 0: the
  // wait is not timed, only counted).
  void advance(std::uint64_t started_ns);

  std::shared_ptr<detail::EpochIterator> epoch_;
};

}  // namespace ferry
