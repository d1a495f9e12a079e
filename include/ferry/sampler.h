#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

namespace ferry {

/// One epoch's dataset indices, read by position. ferry's samplers compute theirs on demand
/// (sequential, distributed order) or hold one permutation, never a copy of it, so an epoch of
/// 10^9 samples costs nothing (or one permutation) before its first batch.
class IndexOrder {
 public:
  virtual ~IndexOrder() = default;
  virtual std::size_t size() const = 0;
  /// Writes the indices at positions [start, start + out.size()) to `out`; the range must lie
  /// within size().
  virtual void read(std::size_t start, std::span<std::int64_t> out) const = 0;
};

/// Yields the dataset indices of one epoch. ferry's samplers follow torch.utils.data's names and
/// semantics, and given a seed they yield exactly the indices PyTorch's do (tests/golden/).
///
/// `indices(epoch)` is a function of the sampler's arguments and `epoch` alone, so an epoch can be
/// replayed or resumed. The loader passes its own epoch (`DataLoader::set_epoch`), so there is no
/// separate `set_epoch` on the sampler to forget (pytorch#73141). Not thread-safe.
class Sampler {
 public:
  virtual ~Sampler() = default;
  /// Number of indices per epoch (`len(sampler)`).
  virtual std::size_t size() const = 0;
  virtual std::vector<std::int64_t> indices(std::uint64_t epoch) = 0;
  /// The same indices as an order read by position; the loader reads one batch at a time. The
  /// default holds `indices(epoch)`; ferry's samplers override it to skip that list.
  virtual std::shared_ptr<const IndexOrder> order(std::uint64_t epoch);

  /// Checkpoints (`DataLoader::state()`): a JSON object saved with the loader's position.
  /// ferry's samplers are functions of their arguments and the epoch, so theirs records those
  /// arguments and `load_state` checks them. The default saves nothing: a sampler of your own
  /// whose `indices(epoch)` depends on more than its epoch (a curriculum) overrides both.
  virtual std::string state() const { return {}; }
  /// Restores what `state()` saved, before epoch `epoch` resumes with the first `consumed`
  /// indices of its order consumed. Returns how many indices of the order this sampler now
  /// yields for that epoch count as consumed: `consumed`, unless restoring changed the order (a
  /// `DistributedSampler` resumed at another world size splits the rest of the epoch again, and
  /// returns 0). Throws `ConfigError` naming the field when the state does not fit, and then
  /// changes nothing. The default accepts only an empty state.
  virtual std::size_t load_state(std::string_view state, std::uint64_t epoch, std::size_t consumed);
};

/// 0, 1, ..., n-1.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(std::size_t size) : size_(size) {}
  std::size_t size() const override { return size_; }
  /// The dataset's length changed: later epochs cover `size` indices (PyTorch's samplers read
  /// len(data_source) at every iteration; a DataLoader does this for the samplers it makes).
  void set_data_size(std::size_t size) noexcept { size_ = size; }
  std::vector<std::int64_t> indices(std::uint64_t epoch) override;
  std::shared_ptr<const IndexOrder> order(std::uint64_t epoch) override;  // computed, O(1)
  std::string state() const override;
  std::size_t load_state(std::string_view state,
                         std::uint64_t epoch,
                         std::size_t consumed) override;

 private:
  std::size_t size_;
};

/// A generator that continues from one epoch to the next, as a `torch.Generator` passed to a
/// PyTorch sampler does: epoch `e` sees the state after epochs 0..e-1 have drawn. The state after
/// the last epoch is kept, so consecutive epochs cost nothing extra; jumping back replays (the
/// draws are repeated, their results dropped at once).
class EpochGenerator {
 public:
  explicit EpochGenerator(std::uint64_t seed) : seed_(seed) {}
  std::uint64_t seed() const noexcept { return seed_; }
  /// Returns what `draw(generator, epoch)` draws for epoch `epoch`, after replaying every earlier
  /// epoch not yet drawn (`draw`, then `finish`). `finish(generator)` makes the draws PyTorch makes
  /// at the end of an epoch, which change none of its indices (RandomSampler's final empty
  /// chunk); they are made only when a later epoch is asked for.
  template <class Draw, class Finish>
  auto at_epoch(std::uint64_t epoch, Draw&& draw, Finish&& finish)
      -> decltype(draw(std::declval<at::Generator&>(), epoch));
  template <class Draw>
  auto at_epoch(std::uint64_t epoch, Draw&& draw)
      -> decltype(draw(std::declval<at::Generator&>(), epoch)) {
    return at_epoch(epoch, std::forward<Draw>(draw), [](at::Generator&) {});
  }

  /// Checkpoints: the generator's state at the start of the last epoch drawn (its Mersenne
  /// Twister state, 2.5 KB, as base64) and that epoch, so that a resumed sampler draws epoch e
  /// without drawing epochs 0..e-1 again; nullopt before any epoch was drawn.
  std::optional<std::pair<std::uint64_t, std::string>> snapshot() const;
  /// Continues from a snapshot of epoch `epoch`: asking for that epoch or a later one starts
  /// there (an empty `text`: from the seed, as new). Throws `ConfigError` if `text` is not a
  /// snapshot of this generator (changing nothing).
  void restore(std::uint64_t epoch, std::string_view text);

 private:
  std::uint64_t seed_;
  std::optional<at::Generator> generator_;  // state at the start of epoch `next_epoch_`...
  std::uint64_t next_epoch_ = 0;
  bool finish_pending_ = false;  // ...once the previous epoch's finishing draws are made
  // A copy of the state at the start of epoch `start_epoch_`, the last drawn: checkpoints save
  // it, and jumping back to it (or past it) starts from it rather than from the seed.
  std::optional<at::Generator> start_;
  std::uint64_t start_epoch_ = 0;

  at::Generator& rewind_to(std::uint64_t epoch);
  void keep_start(at::Generator& generator, std::uint64_t epoch);
};

/// Random order without replacement (or `num_samples` draws with replacement), as
/// `torch.utils.data.RandomSampler(data, replacement, num_samples,
/// generator=torch.Generator().manual_seed(seed))` iterated `epoch + 1` times.
class RandomSampler : public Sampler {
 public:
  /// Draws that torch.utils.data.DataLoader(shuffle=True, generator=g) makes from its sampler's
  /// generator: one int64 (its workers' base seed) as each iterator is created, before that
  /// epoch's order; in every epoch, or only in the first with persistent workers (whose one
  /// iterator PyTorch keeps). DataLoader's `shuffle` sets it, so its orders are DataLoader's.
  enum class LoaderDraw { kNone, kEveryEpoch, kFirstEpoch };
  struct Options {
    bool replacement = false;
    std::optional<std::size_t> num_samples{};  // default: the dataset size
    LoaderDraw loader_draw = LoaderDraw::kNone;
  };
  /// Throws `ConfigError` if num_samples is 0.
  RandomSampler(std::size_t data_size, std::uint64_t seed, Options options);
  RandomSampler(std::size_t data_size, std::uint64_t seed)
      : RandomSampler(data_size, seed, Options{}) {}
  std::size_t size() const override { return num_samples_; }
  std::vector<std::int64_t> indices(std::uint64_t epoch) override;
  std::shared_ptr<const IndexOrder> order(std::uint64_t epoch) override;  // one permutation
  /// The dataset's length changed: later epochs draw from `size` indices, the generator going
  /// on from where it is (as PyTorch's RandomSampler reads len(data_source) at every iteration;
  /// epochs replayed after a jump back are drawn with the new size). num_samples follows the
  /// size unless it was given. A DataLoader does this for the sampler its `shuffle` makes.
  void set_data_size(std::size_t size) noexcept;
  std::string state() const override;
  std::size_t load_state(std::string_view state,
                         std::uint64_t epoch,
                         std::size_t consumed) override;

 private:
  std::size_t data_size_;
  std::size_t num_samples_;
  bool num_samples_given_;
  bool replacement_;
  LoaderDraw loader_draw_;
  EpochGenerator generator_;
};

/// The given indices in random order, as `torch.utils.data.SubsetRandomSampler`.
class SubsetRandomSampler : public Sampler {
 public:
  SubsetRandomSampler(std::vector<std::int64_t> subset, std::uint64_t seed);
  std::size_t size() const override { return subset_->size(); }
  std::vector<std::int64_t> indices(std::uint64_t epoch) override;
  std::shared_ptr<const IndexOrder> order(std::uint64_t epoch) override;
  std::string state() const override;
  std::size_t load_state(std::string_view state,
                         std::uint64_t epoch,
                         std::size_t consumed) override;

 private:
  std::shared_ptr<const std::vector<std::int64_t>> subset_;
  EpochGenerator generator_;
};

/// `num_samples` indices drawn with probability proportional to `weights`, as
/// `torch.utils.data.WeightedRandomSampler`. Throws `ConfigError` for a negative, NaN or infinite
/// weight, all-zero weights, num_samples 0, or more draws without replacement than non-zero
/// weights.
class WeightedRandomSampler : public Sampler {
 public:
  WeightedRandomSampler(std::vector<double> weights,
                        std::size_t num_samples,
                        std::uint64_t seed,
                        bool replacement = true);
  std::size_t size() const override { return num_samples_; }
  std::vector<std::int64_t> indices(std::uint64_t epoch) override;
  std::shared_ptr<const IndexOrder> order(std::uint64_t epoch) override;
  std::string state() const override;
  std::size_t load_state(std::string_view state,
                         std::uint64_t epoch,
                         std::size_t consumed) override;

 private:
  at::Tensor weights_;
  std::size_t num_samples_;
  bool replacement_;
  EpochGenerator generator_;
};

/// This rank's share of the dataset, as `torch.utils.data.distributed.DistributedSampler`: the
/// order (shuffled with seed `seed + epoch` when `shuffle`) is padded by wrapping around to a
/// multiple of `num_replicas` (or cut to one with `drop_last`), and rank r takes every
/// num_replicas-th index from r.
///
/// Elastic resume: with every rank at the same position (ranks in step), what all ranks consumed
/// is a prefix of the epoch's global order. A state saved at one world size and loaded at
/// another (`load_state`) splits the rest of that epoch again, rank r taking every
/// num_replicas-th of the remaining positions from r (padded by wrapping around the remainder,
/// or cut with `drop_last`); later epochs are PyTorch's again.
class DistributedSampler : public Sampler {
 public:
  struct Options {
    /// World size; default: the launcher's (`ferry::launch_info()`: torchrun, Open MPI, Slurm).
    std::optional<std::size_t> num_replicas{};
    /// This process's rank; default: the launcher's.
    std::optional<std::size_t> rank{};
    bool shuffle = true;
    std::uint64_t seed = 0;
    bool drop_last = false;
  };
  /// Throws `ConfigError` if the rank is outside [0, num_replicas), num_replicas is 0, or they are
  /// neither given nor set by a launcher (or the launchers disagree: see `ferry::launch_info`).
  DistributedSampler(std::size_t data_size, Options options);
  explicit DistributedSampler(std::size_t data_size) : DistributedSampler(data_size, Options{}) {}

  std::size_t size() const override { return num_samples_; }
  std::vector<std::int64_t> indices(std::uint64_t epoch) override;
  /// Computed by position; with `shuffle`, over one permutation of the dataset.
  std::shared_ptr<const IndexOrder> order(std::uint64_t epoch) override;
  std::size_t num_replicas() const noexcept { return num_replicas_; }
  std::size_t rank() const noexcept { return rank_; }
  /// Indices per rank before padding or dropping, times num_replicas.
  std::size_t total_size() const noexcept { return num_samples_ * num_replicas_; }
  /// PyTorch's `num_samples`: indices per rank for a dataset of `data_size` over `num_replicas`.
  static std::size_t per_rank(std::size_t data_size,
                              std::size_t num_replicas,
                              bool drop_last) noexcept;
  /// Indices this rank yields in epoch `epoch` (size(), or its share of a resumed remainder).
  std::size_t size_in_epoch(std::uint64_t epoch) const noexcept;
  std::string state() const override;
  /// With the saved world size: that position, unchanged. With another: the positions all
  /// ranks consumed (each `consumed` of its own, ranks in step), after which this world's split
  /// of the rest starts; returns 0.
  std::size_t load_state(std::string_view state,
                         std::uint64_t epoch,
                         std::size_t consumed) override;

 private:
  // An epoch resumed at another world size: its global positions [begin, end) split again.
  struct Split {
    std::uint64_t epoch = 0;
    std::size_t begin = 0;
    std::size_t end = 0;
  };

  std::size_t data_size_;
  std::size_t num_replicas_;
  std::size_t rank_;
  bool shuffle_;
  std::uint64_t seed_;
  bool drop_last_;
  std::size_t num_samples_;
  std::optional<Split> split_;
};

/// Groups a sampler's indices into batches, as `torch.utils.data.BatchSampler`. Subclass it and
/// override `size()` and `batches()` for custom batching (buckets by length, say).
class BatchSampler {
 public:
  /// Throws `ConfigError` if `batch_size` is 0 or `sampler` is null.
  BatchSampler(std::shared_ptr<Sampler> sampler, std::size_t batch_size, bool drop_last);
  virtual ~BatchSampler() = default;

  /// Number of batches per epoch.
  virtual std::size_t size() const;
  /// The batches of epoch `epoch`, in order.
  virtual std::vector<std::vector<std::int64_t>> batches(std::uint64_t epoch);

  const std::shared_ptr<Sampler>& sampler() const noexcept { return sampler_; }
  /// Checkpoints: as `Sampler::state` and `Sampler::load_state`, for the epoch's batches
  /// (`consumed` counts batches). The default saves and restores its sampler's, whose consumed
  /// indices are `consumed * batch_size` (fewer at the end of an epoch).
  virtual std::string state() const;
  virtual std::size_t load_state(std::string_view state, std::uint64_t epoch, std::size_t consumed);
  std::size_t batch_size() const noexcept { return batch_size_; }
  bool drop_last() const noexcept { return drop_last_; }

 protected:
  BatchSampler() = default;  // for subclasses that batch without an index sampler

 private:
  std::shared_ptr<Sampler> sampler_;
  std::size_t batch_size_ = 1;
  bool drop_last_ = false;
};

template <class Draw, class Finish>
auto EpochGenerator::at_epoch(std::uint64_t epoch, Draw&& draw, Finish&& finish)
    -> decltype(draw(std::declval<at::Generator&>(), epoch)) {
  at::Generator& generator = rewind_to(epoch);
  if (finish_pending_) {
    finish(generator);
    finish_pending_ = false;
  }
  while (next_epoch_ < epoch) {
    (void)draw(generator, next_epoch_);
    finish(generator);
    ++next_epoch_;
  }
  keep_start(generator, epoch);
  auto result = draw(generator, epoch);
  ++next_epoch_;
  finish_pending_ = true;
  return result;
}

}  // namespace ferry
