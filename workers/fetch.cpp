#include "workers/fetch.h"

#include "ferry/error.h"

#include "collate/batch_layout.h"
#include "workers/worker_loop.h"

#if defined(FERRY_HAS_TBB)
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#endif

#include <unistd.h>

#include <atomic>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

namespace ferry::workers {

namespace {

void check_index(std::size_t dataset_size, std::int64_t index) {
  if (index < 0 || static_cast<std::size_t>(index) >= dataset_size) {
    throw DataError(detail::str("sampler yielded index ", index, " but the dataset has ",
                                dataset_size, " samples (valid: 0..",
                                dataset_size == 0 ? 0 : dataset_size - 1,
                                "); check the sampler or the dataset's size()"));
  }
}

Example load_one(const Dataset& dataset,
                 std::int64_t index,
                 std::uint64_t epoch,
                 const WorkerIdentity& who,
                 const ferry::detail::SampleOutputs* outputs,
                 std::size_t position) {
  SampleContext ctx(who.base_seed, epoch, index, who.worker_id, who.num_workers);
  ctx.set_outputs(outputs, position);
  Example example = dataset.get(static_cast<std::size_t>(index), ctx);
  example.set_index(index);
  return example;
}

#if defined(FERRY_HAS_TBB)
// One arena per process and thread count, never destroyed while the process lives (loaders on
// several threads may use them at once). Keyed by pid: a forked worker must not use the
// parent's arena, whose threads did not survive the fork. TBB caps an arena at the machine's
// hardware threads.
tbb::task_arena& arena_for(std::size_t threads) {
  static std::mutex mutex;
  static std::map<std::pair<pid_t, std::size_t>, std::unique_ptr<tbb::task_arena>> arenas;
  const std::size_t slots =
      std::min<std::size_t>(threads, std::max(1u, std::thread::hardware_concurrency()));
  const std::lock_guard<std::mutex> lock(mutex);
  auto& arena = arenas[{::getpid(), slots}];
  if (!arena) arena = std::make_unique<tbb::task_arena>(static_cast<int>(slots));
  return *arena;
}
#endif

}  // namespace

bool parallel_fetch_available() noexcept {
#if defined(FERRY_HAS_TBB)
  return true;
#else
  return false;
#endif
}

FetchedBatch fetch_batch(const Dataset& dataset,
                         std::size_t dataset_size,
                         std::span<const std::int64_t> indices,
                         std::uint64_t epoch,
                         const WorkerIdentity& who,
                         const FetchOptions& options,
                         std::int64_t* failing_index) {
  for (const std::int64_t index : indices) {
    if (failing_index != nullptr) *failing_index = index;
    check_index(dataset_size, index);
  }
  if (failing_index != nullptr) *failing_index = -1;
  const std::size_t n = indices.size();
  FetchedBatch out;
  out.samples.reserve(n);
  // Sample i failed with `error`: under skip it is recorded; otherwise (and always for a
  // misconfigured pipeline, which is not bad data) it propagates with its index.
  const auto failed = [&](std::size_t i, const std::exception_ptr& error) {
    try {
      std::rethrow_exception(error);
    } catch (const ConfigError&) {
      if (failing_index != nullptr) *failing_index = indices[i];
      throw;
    } catch (...) {
      if (!options.skip_errors) {
        if (failing_index != nullptr) *failing_index = indices[i];
        throw;
      }
      out.skipped.push_back(
          {indices[i], current_exception_type_name(), current_exception_message()});
    }
  };
  if (options.threads > 1 && n > 1) {
#if defined(FERRY_HAS_TBB)
    std::vector<std::optional<Example>> loaded(n);
    std::vector<std::exception_ptr> errors(n);
    std::atomic<bool> stopped{false};
    arena_for(options.threads).execute([&] {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, 1),
                        [&](const tbb::blocked_range<std::size_t>& range) {
                          for (std::size_t i = range.begin(); i != range.end(); ++i) {
                            // A loader shutting down: the samples in hand finish, no more
                            // start (as one thread stops after its sample).
                            if (stopped.load(std::memory_order_relaxed) ||
                                (options.stop_requested && options.stop_requested())) {
                              stopped.store(true, std::memory_order_relaxed);
                              return;
                            }
                            try {
                              const int slot = tbb::this_task_arena::current_thread_index();
                              const LoadingMark mark(options.status,
                                                     slot < 0 ? WorkerStatusPage::kSlots
                                                              : static_cast<std::size_t>(slot),
                                                     indices[i]);
                              loaded[i] =
                                  load_one(dataset, indices[i], epoch, who, options.outputs, i);
                            } catch (...) {
                              errors[i] = std::current_exception();
                            }
                          }
                        });
    });
    if (stopped.load()) {
      out.stopped = true;
      return out;
    }
    for (std::size_t i = 0; i < n; ++i) {  // in index order: the first failure is the one raised
      if (errors[i]) {
        failed(i, errors[i]);
      } else {
        out.samples.push_back(std::move(*loaded[i]));
      }
    }
#else
    FERRY_ASSERT(false, "worker_threads > 1 in a build without TBB (resolve() refuses it)");
#endif
    return out;
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0 && options.stop_requested && options.stop_requested()) {
      out.stopped = true;
      return out;
    }
    if (i > 0 && options.between_samples) options.between_samples();
    if (options.before_sample) options.before_sample(indices[i]);
    std::exception_ptr error;
    try {
      const LoadingMark mark(options.status, 0, indices[i]);
      out.samples.push_back(load_one(dataset, indices[i], epoch, who, options.outputs, i));
    } catch (...) {
      error = std::current_exception();
    }
    if (options.after_sample) options.after_sample();
    if (error) failed(i, error);  // raises, unless skipping
  }
  return out;
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

void StreamReader::resume(std::size_t position, const std::optional<std::string>& cursor) {
  FERRY_ASSERT(position_ == 0, "StreamReader::resume on a stream already read");
  if (cursor) {
    stream_->seek(*cursor);
    position_ = position;
    return;
  }
  while (position_ < position) {
    SampleContext ctx =
        SampleContext::for_stream(who_.base_seed, epoch_, static_cast<std::int64_t>(position_),
                                  who_.worker_id, who_.num_workers);
    if (!stream_->next(ctx)) {
      ended_ = true;
      return;
    }
    ++position_;
  }
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
                      std::size_t sequence,
                      collate::InPlaceCollator* in_place) {
  std::vector<std::int64_t> indices;
  indices.reserve(samples.size());
  for (const Example& s : samples) indices.push_back(s.index());
  Batch batch;
  if (collate_fn) {
    batch = collate_fn(std::move(samples));
  } else if (in_place != nullptr) {
    batch = in_place->collate(samples);
  } else {
    batch = collate::collate_into(samples, pool);
  }
  batch.set_indices(std::move(indices));
  batch.set_position(epoch, sequence);
  return batch;
}

}  // namespace ferry::workers
