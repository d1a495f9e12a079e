#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ferry/collate.h"
#include "ferry/dataset.h"

#include "collate/buffer_pool.h"

namespace ferry::workers {

// Who is loading: the same task runs in the calling thread (num_workers = 0) or in a worker.
struct WorkerIdentity {
  std::size_t worker_id = 0;
  std::size_t num_workers = 1;
  std::uint64_t base_seed = 0;
};

// Loads sample `index` (checked against `dataset_size`) with its own SampleContext and tags it
// with its index.
Example fetch_sample(const Dataset& dataset,
                     std::size_t dataset_size,
                     std::int64_t index,
                     std::uint64_t epoch,
                     const WorkerIdentity& who);

// Loads the samples of one batch of a map-style dataset, each with its own SampleContext seeded
// from (base_seed, epoch, index), and tags each with its dataset index. Throws ferry::DataError
// for an index outside the dataset; the dataset's own exceptions pass through unchanged.
std::vector<Example> fetch_samples(const Dataset& dataset,
                                   std::span<const std::int64_t> indices,
                                   std::uint64_t epoch,
                                   const WorkerIdentity& who);

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

 private:
  std::uint64_t epoch_;
  WorkerIdentity who_;
  std::unique_ptr<ExampleStream> stream_;
  std::size_t position_ = 0;
  bool ended_ = false;
};

// Collates with `collate_fn`, or the default collate into a buffer from `pool` when it is
// empty, and stamps the batch's position and its samples' indices.
Batch collate_samples(std::vector<Example> samples,
                      const CollateFn& collate_fn,
                      collate::BufferPool& pool,
                      std::uint64_t epoch,
                      std::size_t sequence);

}  // namespace ferry::workers
