#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ferry/collate.h"
#include "ferry/dataset.h"

#include "collate/buffer_pool.h"
#include "ipc/protocol.h"
#include "workers/worker_status.h"

namespace ferry::collate {
class InPlaceCollator;
}  // namespace ferry::collate

namespace ferry::workers {

// Who is loading: the same task runs in the calling thread (num_workers = 0) or in a worker.
struct WorkerIdentity {
  std::size_t worker_id = 0;
  std::size_t num_workers = 1;
  std::uint64_t base_seed = 0;
};

// A sample that on_error = skip left out of its batch (index, exception type and message).
using SkippedSample = ipc::SkippedSampleRecord;

struct FetchOptions {
  std::size_t threads = 1;   // worker_threads: > 1 loads the samples in parallel (TBB)
  bool skip_errors = false;  // on_error = skip: a sample whose get() throws is left out
  // The batch's expected memory, offered to each sample through SampleContext::output (its
  // position in the batch is its position in `indices`). Null: none.
  const ferry::detail::SampleOutputs* outputs = nullptr;
  // Sequential loading only: called around each Dataset::get (the worker's sample watchdog),
  // and between samples, true to stop early (the loader is shutting down).
  std::function<void(std::int64_t index)> before_sample{};
  std::function<void()> after_sample{};
  std::function<bool()> stop_requested{};
  // Sequential loading only: called between samples (a worker looks for tasks queued behind
  // this one, to tell the dataset what comes next: Dataset::prefetch).
  std::function<void()> between_samples{};
  // A worker's status page: each loading thread marks the sample in hand there. Null: none.
  WorkerStatusPage* status = nullptr;
};

struct FetchedBatch {
  std::vector<Example> samples;        // in the batch's index order, the skipped ones left out
  std::vector<SkippedSample> skipped;  // in index order
  bool stopped = false;                // stop_requested() said so
};

// Loads the samples of one batch of a map-style dataset, each with its own SampleContext seeded
// from (base_seed, epoch, index) and tagged with its dataset index, `options.threads` at a time.
// Under skip, a ferry::ConfigError still raises (a misconfigured pipeline is not bad data).
// Under raise, the first failing sample (in index order) sets `*failing_index` and its exception
// propagates unchanged; under skip it is recorded and left out. An index outside the dataset always
// raises ferry::DataError (a sampler bug, not bad data).
FetchedBatch fetch_batch(const Dataset& dataset,
                         std::size_t dataset_size,
                         std::span<const std::int64_t> indices,
                         std::uint64_t epoch,
                         const WorkerIdentity& who,
                         const FetchOptions& options,
                         std::int64_t* failing_index);

// True when this build can load with worker_threads > 1 (it found TBB).
bool parallel_fetch_available() noexcept;

// Reads one worker's stream over an iterable dataset in batches, tagging each sample with its
// position in the stream and giving it a SampleContext seeded from (seed, epoch, worker,
// position). Shared by the calling thread (num_workers = 0, worker 0 of 1) and worker processes.
class StreamReader {
 public:
  // Opens the stream; throws what IterableDataset::stream() throws, or ConfigError for null.
  StreamReader(const IterableDataset& dataset, std::uint64_t epoch, const WorkerIdentity& who);
  // The next batch's samples: batch_size of them, fewer at the end of the stream, none once it
  // has ended (or, with drop_last, when only a short batch was left).
  std::vector<Example> next_batch(std::size_t batch_size, bool drop_last);
  std::uint64_t epoch() const noexcept { return epoch_; }
  // Checkpoints: the stream's cursor after the samples read so far, if it gives one.
  std::optional<std::string> cursor() const { return stream_->cursor(); }
  // Resumes a stream just opened after its first `position` samples: at `cursor` when there is
  // one (ExampleStream::seek), else by reading and dropping them (their SampleContexts as
  // before, so what follows is the same). Samples keep their positions either way.
  void resume(std::size_t position, const std::optional<std::string>& cursor);

 private:
  std::uint64_t epoch_;
  WorkerIdentity who_;
  std::unique_ptr<ExampleStream> stream_;
  std::size_t position_ = 0;
  bool ended_ = false;
};

// Collates with `collate_fn`, or the default collate when it is empty (with `in_place`, which
// took the batch's buffer before its samples loaded, or into a buffer from `pool`), and stamps
// the batch's position and its samples' indices.
Batch collate_samples(std::vector<Example> samples,
                      const CollateFn& collate_fn,
                      collate::BufferPool& pool,
                      std::uint64_t epoch,
                      std::size_t sequence,
                      collate::InPlaceCollator* in_place = nullptr);

}  // namespace ferry::workers
