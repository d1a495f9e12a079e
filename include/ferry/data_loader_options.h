#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

#include <torch/types.h>

#include "ferry/device_transforms.h"

namespace ferry {

/// How worker processes start (PyTorch's `multiprocessing_context`).
enum class StartMethod {
  kFork,        ///< fork the loader's process: fastest start, dataset shared copy-on-write
  kSpawn,       ///< start a fresh process and rebuild the dataset from its configuration
  kForkserver,  ///< fork from a clean server process that `ferry::init` starts early
};

std::string_view to_string(StartMethod method) noexcept;

/// The start method of loaders that leave `start_method` unset (initially fork), as
/// `torch.multiprocessing.set_start_method`. Thread-safe.
void set_default_start_method(StartMethod method) noexcept;
StartMethod default_start_method() noexcept;

/// What a sample whose loading throws does to its batch (not in PyTorch, whose users filter in
/// a collate_fn).
enum class OnError {
  kRaise,  ///< the batch fails: the loop gets the error (naming the sample), then goes on
  kSkip,   ///< the sample is left out and recorded in DataLoader::stats(); the batch is shorter
};
std::string_view to_string(OnError policy) noexcept;

/// What a worker process that dies (a signal, an exit, the OOM killer) does to the epoch (not in
/// PyTorch, whose loaders always raise).
enum class OnWorkerDeath {
  kRaise,    ///< the epoch ends with a WorkerDiedError naming the worker and what it held
  kRespawn,  ///< a new worker takes its place and its unfinished batches; nothing is lost
};
std::string_view to_string(OnWorkerDeath policy) noexcept;

inline constexpr std::size_t kDefaultPrefetchFactor = 2;

/// Options for `DataLoader`; names and defaults follow torch.utils.data.DataLoader. Objects (the
/// dataset, a sampler or batch sampler, a collate function) are constructor arguments instead.
///
///   ferry::DataLoader loader(dataset, {.batch_size = 64, .shuffle = true, .num_workers = 8});
struct DataLoaderOptions {
  std::size_t batch_size = 1;
  bool shuffle = false;
  std::size_t num_workers = 0;                   // 0: load in the calling thread
  std::optional<std::size_t> prefetch_factor{};  // batches in flight per worker; 2 with workers
  bool persistent_workers = false;
  /// Batches come in pinned memory (is_pinned()). With workers, each shared-memory segment is
  /// page-locked once, when it first comes back for reuse, and batches in it are pinned without
  /// a copy; a segment goes back to its worker only after the GPU work queued on the dropping
  /// thread's current streams (of the current device when the loader was built, and of every
  /// other device in use) before the batch was dropped. So queue non_blocking copies from a
  /// batch on the current stream, or order them before the drop (README: On the GPU). Other
  /// batches are pinned copies, as PyTorch's. With a CUDA `device` it changes nothing (ferry
  /// copies from page-locked shared memory itself). Needs a CUDA LibTorch and a GPU (a
  /// ConfigError says so otherwise).
  bool pin_memory = false;
  bool drop_last = false;
  std::chrono::milliseconds timeout{0};  // 0: wait forever; YAML gives seconds
  std::function<void(std::size_t worker_id)> worker_init_fn{};  // once in each worker process
  bool in_order = true;
  std::optional<std::uint64_t> seed{};  // PyTorch: generator; unset: drawn once per loader
  /// Unset: default_start_method(). spawn and forkserver rebuild the dataset in each worker from
  /// the registry, and need ferry::init(argc, argv) first thing in main (see ferry/init.h).
  std::optional<StartMethod> start_method{};
  /// Not in PyTorch: with a CUDA `device`, each batch is copied there on a side stream as soon as
  /// it arrives, ahead of the loop, from shared memory page-locked once per recycled segment; the
  /// loop's current stream waits for the copy. Fork workers may be started after CUDA is in use.
  std::optional<torch::Device> device{};
  /// Not in PyTorch: steps run on each whole batch once it is on `device` (on the GPU, on the copy
  /// stream; on the CPU without a device), e.g. uint8 images to float and normalised there.
  BatchTransforms device_transforms{};
  /// Not in PyTorch: a worker whose `Dataset::get` runs longer than this for one sample is
  /// killed and the loop gets a TimeoutError (0: no limit). Needs num_workers > 0.
  std::chrono::milliseconds sample_timeout{0};
  /// Not in PyTorch: threads that load the samples of one batch in parallel inside each worker
  /// (in the calling thread's process with num_workers = 0), in a TBB arena. LibTorch's own
  /// intra-op pool stays at one thread (see DESIGN.md). Needs a build with TBB; at most the
  /// machine's hardware threads run.
  std::size_t worker_threads = 1;
  /// Not in PyTorch: raise (default) or skip samples whose Dataset::get throws. Skipped samples
  /// are counted and listed in DataLoader::stats(); a batch holds the samples that loaded (a
  /// batch whose every sample was skipped is not delivered). Map-style datasets only.
  OnError on_error = OnError::kRaise;
  /// Not in PyTorch: how many of the most recent skipped samples DataLoader::stats() lists (it
  /// counts them all), so a long run's memory and stats() stay bounded; 0 lists every one.
  std::size_t skipped_history = 100;
  /// Not in PyTorch: with kRespawn, a worker that dies is replaced (same start method and worker
  /// id, its worker_init_fn run again) and the batches it held are loaded again by the new one;
  /// delivery stays exactly once and in order, and DataLoader::stats() lists each restart. Map-
  /// style datasets only. A worker killed by the `timeout` or `sample_timeout` watchdog is not
  /// respawned (the loop gets a TimeoutError, as with kRaise).
  OnWorkerDeath on_worker_death = OnWorkerDeath::kRaise;
  /// With kRespawn: restarts allowed in one epoch, and over the loader's life; one more ends the
  /// epoch with a WorkerDiedError that lists every restart.
  std::size_t max_worker_restarts = 3;
  std::size_t max_worker_restarts_total = 10;
  /// Not in PyTorch: the cores the worker processes run on (sched_setaffinity), as a list of
  /// cores and ranges ("2-7,10"), or "gpu:N" for the cores local to GPU N (NVIDIA's NVML, loaded
  /// at run time, as DALI does). The training thread's cores are left out: the cores it is bound
  /// to when the loader is built, or, when it may run anywhere, the core it is on then (bind it,
  /// e.g. with `taskset`, to make that stick). Empty (default): workers run on any core.
  std::string worker_cpus{};
  /// Not in PyTorch: when set, the loader records a trace (Chrome trace-event JSON, for Perfetto
  /// or chrome://tracing: a track per worker with a span per sample and per collation, the
  /// training loop's waits, each batch from dispatch to delivery, epochs, errors and restarts)
  /// and writes it here when it is destroyed; DataLoader::write_trace() writes one at any time.
  std::string trace_path{};
  /// The trace keeps the most recent this many events (a ring: about 100 bytes each in memory,
  /// 150 in the file), so a long run cannot fill a disk. 0: no trace unless trace_path is set,
  /// then 131072.
  std::size_t trace_events = 0;
};

/// Checks `options` against PyTorch's rules and fills in derived defaults (prefetch_factor, seed).
/// Throws `ferry::ConfigError` naming the option, the value and the fix.
DataLoaderOptions resolve(DataLoaderOptions options);

}  // namespace ferry
