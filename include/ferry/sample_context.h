#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

namespace ferry {

namespace detail {
/// Where the loader would like the tensor fields of the samples it is loading: memory in the
/// batch being assembled, laid out as it expects the batch to be. Set by the loader.
class SampleOutputs {
 public:
  virtual ~SampleOutputs() = default;
  /// The memory of field `field` of the batch's sample `position`, when the expected batch holds
  /// that field with these sizes (one sample's) and dtype; null otherwise.
  virtual void* find(std::size_t position,
                     std::string_view field,
                     c10::IntArrayRef sizes,
                     c10::ScalarType dtype) const noexcept = 0;
};
}  // namespace detail

/// What a dataset knows about the sample it is asked for: which worker loads it, the epoch, and a
/// random generator seeded from `(seed, epoch, index)` alone. Augmentations drawn from it are
/// therefore identical whatever the number of workers or the worker that loads the sample.
///
/// With `num_workers = 0` the calling thread acts as worker 0 of 1. Not thread-safe: one context
/// per sample.
class SampleContext {
 public:
  SampleContext(std::uint64_t base_seed,
                std::uint64_t epoch,
                std::int64_t index,
                std::size_t worker_id = 0,
                std::size_t num_workers = 1);

  /// The context of item `position` of worker `worker_id`'s stream over an iterable dataset: its
  /// generator is seeded from (base_seed, epoch, worker_id, position), since an iterable
  /// dataset's items have no index of their own.
  static SampleContext for_stream(std::uint64_t base_seed,
                                  std::uint64_t epoch,
                                  std::int64_t position,
                                  std::size_t worker_id,
                                  std::size_t num_workers);

  std::size_t worker_id() const noexcept { return worker_id_; }
  std::size_t num_workers() const noexcept { return num_workers_; }
  std::uint64_t epoch() const noexcept { return epoch_; }
  /// The dataset index being loaded; for an iterable dataset, the position in this worker's stream.
  std::int64_t index() const noexcept { return index_; }
  /// The loader's seed (DataLoaderOptions::seed, or one drawn at construction).
  std::uint64_t base_seed() const noexcept { return base_seed_; }
  /// The seed of this sample's generator: a hash of (base_seed, epoch, index).
  std::uint64_t seed() const noexcept { return seed_; }

  /// A CPU generator seeded with `seed()`, created on first use; pass it to torch ops
  /// (`torch::rand({3}, ctx.generator())`).
  at::Generator& generator();
  /// A uniform draw in [low, high), from `generator()`.
  double uniform(double low = 0.0, double high = 1.0);
  /// A uniform integer in [low, high), from `generator()`. Requires low < high.
  std::int64_t randint(std::int64_t low, std::int64_t high);
  /// True with probability `p`, from `generator()`.
  bool bernoulli(double p = 0.5);

  /// Memory for a contiguous tensor that this sample will return as field `field`, with these
  /// sizes and dtype; its contents are undefined. Where the loader expects the batch to hold
  /// that field in that shape, the tensor already lies in the batch's (shared) memory, and
  /// collating it copies nothing; otherwise it is a fresh tensor. Either way the sample is
  /// collated correctly, whatever it returns. The tensor must not be kept past `Dataset::get`.
  at::Tensor output(std::string_view field, c10::IntArrayRef sizes, c10::ScalarType dtype);

  /// Called by the loader: the sample is item `position` of a batch whose memory `outputs`
  /// describes (null: none). `outputs` must outlive this context.
  void set_outputs(const detail::SampleOutputs* outputs, std::size_t position) noexcept {
    outputs_ = outputs;
    position_ = position;
  }

  /// The per-sample seed the loader uses: a SplitMix64-style hash, stable across releases.
  static std::uint64_t mix_seed(std::uint64_t base_seed, std::uint64_t epoch, std::int64_t index);

 private:
  std::uint64_t base_seed_;
  std::uint64_t epoch_;
  std::int64_t index_;
  std::size_t worker_id_;
  std::size_t num_workers_;
  std::uint64_t seed_;
  std::optional<at::Generator> generator_;
  const detail::SampleOutputs* outputs_ = nullptr;
  std::size_t position_ = 0;

  std::uint64_t random64();
  SampleContext(std::uint64_t base_seed,
                std::uint64_t epoch,
                std::int64_t index,
                std::size_t worker_id,
                std::size_t num_workers,
                std::uint64_t seed);
};

}  // namespace ferry
