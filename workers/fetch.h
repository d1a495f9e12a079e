#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ferry/collate.h"
#include "ferry/dataset.h"

namespace ferry::workers {

// Who is loading: the same task runs in the calling thread (num_workers = 0) or in a worker.
struct WorkerIdentity {
  std::size_t worker_id = 0;
  std::size_t num_workers = 1;
  std::uint64_t base_seed = 0;
};

// Loads the samples of one batch of a map-style dataset, each with its own SampleContext seeded
// from (base_seed, epoch, index), and tags each with its dataset index. Throws ferry::DataError
// for an index outside the dataset; the dataset's own exceptions pass through unchanged.
std::vector<Example> fetch_samples(const Dataset& dataset,
                                   std::span<const std::int64_t> indices,
                                   std::uint64_t epoch,
                                   const WorkerIdentity& who);

// Collates with `collate_fn` (default_collate when empty) and stamps the batch's position and
// its samples' indices.
Batch collate_samples(std::vector<Example> samples,
                      const CollateFn& collate_fn,
                      std::uint64_t epoch,
                      std::size_t sequence);

}  // namespace ferry::workers
