#include "workers/fetch.h"

#include "ferry/error.h"

namespace ferry::workers {

std::vector<Example> fetch_samples(const Dataset& dataset,
                                   std::span<const std::int64_t> indices,
                                   std::uint64_t epoch,
                                   const WorkerIdentity& who) {
  std::vector<Example> samples;
  samples.reserve(indices.size());
  const std::size_t size = dataset.size();
  for (const std::int64_t index : indices) {
    if (index < 0 || static_cast<std::size_t>(index) >= size) {
      throw DataError(detail::str("sampler yielded index ", index, " but the dataset has ", size,
                                  " samples (valid: 0..", size == 0 ? 0 : size - 1,
                                  "); check the sampler or the dataset's size()"));
    }
    SampleContext ctx(who.base_seed, epoch, index, who.worker_id, who.num_workers);
    Example example = dataset.get(static_cast<std::size_t>(index), ctx);
    example.set_index(index);
    samples.push_back(std::move(example));
  }
  return samples;
}

Batch collate_samples(std::vector<Example> samples,
                      const CollateFn& collate_fn,
                      std::uint64_t epoch,
                      std::size_t sequence) {
  std::vector<std::int64_t> indices;
  indices.reserve(samples.size());
  for (const Example& s : samples) indices.push_back(s.index());
  Batch batch = collate_fn ? collate_fn(std::move(samples)) : default_collate(std::move(samples));
  batch.set_indices(std::move(indices));
  batch.set_position(epoch, sequence);
  return batch;
}

}  // namespace ferry::workers
