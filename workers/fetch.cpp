#include "workers/fetch.h"

#include "ferry/error.h"

#include "collate/batch_layout.h"

namespace ferry::workers {

Example fetch_sample(const Dataset& dataset,
                     std::size_t dataset_size,
                     std::int64_t index,
                     std::uint64_t epoch,
                     const WorkerIdentity& who) {
  if (index < 0 || static_cast<std::size_t>(index) >= dataset_size) {
    throw DataError(detail::str("sampler yielded index ", index, " but the dataset has ",
                                dataset_size, " samples (valid: 0..",
                                dataset_size == 0 ? 0 : dataset_size - 1,
                                "); check the sampler or the dataset's size()"));
  }
  SampleContext ctx(who.base_seed, epoch, index, who.worker_id, who.num_workers);
  Example example = dataset.get(static_cast<std::size_t>(index), ctx);
  example.set_index(index);
  return example;
}

std::vector<Example> fetch_samples(const Dataset& dataset,
                                   std::span<const std::int64_t> indices,
                                   std::uint64_t epoch,
                                   const WorkerIdentity& who) {
  std::vector<Example> samples;
  samples.reserve(indices.size());
  const std::size_t size = dataset.size();
  for (const std::int64_t index : indices) {
    samples.push_back(fetch_sample(dataset, size, index, epoch, who));
  }
  return samples;
}

StreamReader::StreamReader(const IterableDataset& dataset,
                           std::uint64_t epoch,
                           const WorkerIdentity& who)
    : epoch_(epoch), who_(who) {
  SampleContext ctx =
      SampleContext::for_stream(who.base_seed, epoch, -1, who.worker_id, who.num_workers);
  stream_ = dataset.stream(ctx);
  FERRY_CHECK(stream_ != nullptr,
              "IterableDataset::stream() returned null; return a stream "
              "(one that ends at once for a worker with nothing to read)");
}

std::vector<Example> StreamReader::next_batch(std::size_t batch_size, bool drop_last) {
  std::vector<Example> samples;
  samples.reserve(batch_size);
  while (!ended_ && samples.size() < batch_size) {
    SampleContext ctx =
        SampleContext::for_stream(who_.base_seed, epoch_, static_cast<std::int64_t>(position_),
                                  who_.worker_id, who_.num_workers);
    std::optional<Example> example = stream_->next(ctx);
    if (!example) {
      ended_ = true;
      break;
    }
    example->set_index(static_cast<std::int64_t>(position_++));
    samples.push_back(std::move(*example));
  }
  if (samples.size() < batch_size && drop_last) samples.clear();
  return samples;
}

Batch collate_samples(std::vector<Example> samples,
                      const CollateFn& collate_fn,
                      collate::BufferPool& pool,
                      std::uint64_t epoch,
                      std::size_t sequence) {
  std::vector<std::int64_t> indices;
  indices.reserve(samples.size());
  for (const Example& s : samples) indices.push_back(s.index());
  Batch batch;
  if (collate_fn) {
    batch = collate_fn(std::move(samples));
  } else {
    batch = collate::collate_into(samples, pool);
  }
  batch.set_indices(std::move(indices));
  batch.set_position(epoch, sequence);
  return batch;
}

}  // namespace ferry::workers
