#include "ferry/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <typeinfo>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "ferry/error.h"

#include "loader/state_json.h"

namespace ferry {

namespace {

// 0, 1, ..., size-1, computed.
class RangeOrder final : public IndexOrder {
 public:
  explicit RangeOrder(std::size_t size) : size_(size) {}
  std::size_t size() const override { return size_; }
  void read(std::size_t start, std::span<std::int64_t> out) const override {
    FERRY_ASSERT(start + out.size() <= size_);
    std::iota(out.begin(), out.end(), static_cast<std::int64_t>(start));
  }

 private:
  std::size_t size_;
};

// The indices in a contiguous int64 tensor (a permutation or a draw), held, never copied.
class TensorOrder final : public IndexOrder {
 public:
  explicit TensorOrder(at::Tensor indices) : indices_(indices.contiguous()) {}
  std::size_t size() const override { return static_cast<std::size_t>(indices_.numel()); }
  void read(std::size_t start, std::span<std::int64_t> out) const override {
    FERRY_ASSERT(start + out.size() <= size());
    std::memcpy(out.data(), indices_.data_ptr<std::int64_t>() + start,
                out.size() * sizeof(std::int64_t));
  }

 private:
  at::Tensor indices_;
};

// A list held as is (a user sampler's indices()).
class VectorOrder final : public IndexOrder {
 public:
  explicit VectorOrder(std::vector<std::int64_t> indices) : indices_(std::move(indices)) {}
  std::size_t size() const override { return indices_.size(); }
  void read(std::size_t start, std::span<std::int64_t> out) const override {
    FERRY_ASSERT(start + out.size() <= indices_.size());
    std::copy_n(indices_.begin() + static_cast<std::ptrdiff_t>(start), out.size(), out.begin());
  }

 private:
  std::vector<std::int64_t> indices_;
};

// subset[perm[i]]: the subset shared with the sampler, the permutation held.
class SubsetOrder final : public IndexOrder {
 public:
  SubsetOrder(std::shared_ptr<const std::vector<std::int64_t>> subset, at::Tensor perm)
      : subset_(std::move(subset)), perm_(perm.contiguous()) {}
  std::size_t size() const override { return static_cast<std::size_t>(perm_.numel()); }
  void read(std::size_t start, std::span<std::int64_t> out) const override {
    FERRY_ASSERT(start + out.size() <= size());
    const std::int64_t* p = perm_.data_ptr<std::int64_t>() + start;
    for (std::size_t k = 0; k < out.size(); ++k)
      out[k] = (*subset_)[static_cast<std::size_t>(p[k])];
  }

 private:
  std::shared_ptr<const std::vector<std::int64_t>> subset_;
  at::Tensor perm_;
};

// Rank `rank`'s k-th index: position (rank + k * replicas) mod span of the epoch's positions
// [begin, begin + span) of the global order, where position g holds the permutation's entry g
// (or g itself without shuffling). Unresumed, [begin, begin + span) is the whole dataset and the
// modulo is PyTorch's padding by wrapping around; an epoch resumed at another world size splits
// its remaining positions the same way.
class DistributedOrder final : public IndexOrder {
 public:
  DistributedOrder(at::Tensor perm,
                   std::size_t begin,
                   std::size_t span,
                   std::size_t rank,
                   std::size_t replicas,
                   std::size_t count)
      : perm_(perm.defined() ? perm.contiguous() : perm),
        begin_(begin),
        span_(span),
        rank_(rank),
        replicas_(replicas),
        count_(count) {}
  std::size_t size() const override { return count_; }
  void read(std::size_t start, std::span<std::int64_t> out) const override {
    FERRY_ASSERT(start + out.size() <= count_);
    const std::int64_t* p = perm_.defined() ? perm_.data_ptr<std::int64_t>() : nullptr;
    for (std::size_t k = 0; k < out.size(); ++k) {
      const std::size_t position = begin_ + (rank_ + (start + k) * replicas_) % span_;
      out[k] = p != nullptr ? p[position] : static_cast<std::int64_t>(position);
    }
  }

 private:
  at::Tensor perm_;
  std::size_t begin_, span_, rank_, replicas_, count_;
};

std::vector<std::int64_t> materialise(const IndexOrder& order) {
  std::vector<std::int64_t> out(order.size());
  order.read(0, out);
  return out;
}

at::Tensor randperm(std::size_t n, at::Generator& generator) {
  return at::randperm(static_cast<std::int64_t>(n), generator, at::kLong);
}

}  // namespace

std::shared_ptr<const IndexOrder> Sampler::order(std::uint64_t epoch) {
  return std::make_shared<VectorOrder>(indices(epoch));
}

at::Generator& EpochGenerator::rewind_to(std::uint64_t epoch) {
  if (!generator_ || next_epoch_ > epoch) {
    if (start_ && start_epoch_ <= epoch) {  // from the last epoch's start, not from the seed
      generator_ = start_->clone();
      next_epoch_ = start_epoch_;
    } else {
      generator_ = at::detail::createCPUGenerator(seed_);
      next_epoch_ = 0;
    }
    finish_pending_ = false;
  }
  return *generator_;
}

void EpochGenerator::keep_start(at::Generator& generator, std::uint64_t epoch) {
  start_ = generator.clone();
  start_epoch_ = epoch;
}

std::vector<std::int64_t> SequentialSampler::indices(std::uint64_t epoch) {
  return materialise(*order(epoch));
}

std::shared_ptr<const IndexOrder> SequentialSampler::order(std::uint64_t /*epoch*/) {
  return std::make_shared<RangeOrder>(size_);
}

RandomSampler::RandomSampler(std::size_t data_size, std::uint64_t seed, Options options)
    : data_size_(data_size),
      num_samples_(options.num_samples.value_or(data_size)),
      num_samples_given_(options.num_samples.has_value()),
      replacement_(options.replacement),
      loader_draw_(options.loader_draw),
      generator_(seed) {
  FERRY_CHECK(!options.num_samples || *options.num_samples > 0,
              "RandomSampler: num_samples=0; it must be a positive integer (or unset for the "
              "dataset size)");
  FERRY_CHECK(data_size_ > 0 || num_samples_ == 0, "RandomSampler: num_samples=", num_samples_,
              " draws from an empty dataset; give the sampler a non-empty dataset");
}

void RandomSampler::set_data_size(std::size_t size) noexcept {
  data_size_ = size;
  if (!num_samples_given_) num_samples_ = size;
}

std::vector<std::int64_t> RandomSampler::indices(std::uint64_t epoch) {
  return materialise(*order(epoch));
}

std::shared_ptr<const IndexOrder> RandomSampler::order(std::uint64_t epoch) {
  if (data_size_ == 0) return std::make_shared<VectorOrder>(std::vector<std::int64_t>{});
  const auto n = static_cast<std::int64_t>(data_size_);
  const std::size_t full = num_samples_ / data_size_;
  const std::size_t rest = num_samples_ % data_size_;
  // The same draws, in the same chunks, as torch.utils.data.RandomSampler.__iter__ (1.13+),
  // including its final (possibly empty) chunk, so the generator advances identically.
  auto draw = [&](at::Generator& gen, std::uint64_t e) {
    if (loader_draw_ == LoaderDraw::kEveryEpoch ||
        (loader_draw_ == LoaderDraw::kFirstEpoch && e == 0)) {
      // DataLoader's new iterator: torch.empty((), dtype=torch.int64).random_(generator=g)
      (void)at::empty({}, at::kLong).random_(gen);
    }
    if (replacement_) {
      at::Tensor out = at::empty({static_cast<std::int64_t>(num_samples_)}, at::kLong);
      const std::size_t chunks = num_samples_ / 32;
      for (std::size_t i = 0; i <= chunks; ++i) {
        const auto length = static_cast<std::int64_t>(i < chunks ? 32 : num_samples_ % 32);
        at::Tensor part = at::randint(n, {length}, gen, at::kLong);
        if (length > 0) out.narrow(0, static_cast<std::int64_t>(i * 32), length).copy_(part);
      }
      return out;
    }
    // Without replacement: `full` whole permutations, then the first `rest` of one more. When
    // `rest` is 0 that last one changes no index of this epoch: it is drawn by finish, later.
    if (full == 1 && rest == 0) return randperm(data_size_, gen);  // the usual case: no copy
    std::vector<at::Tensor> parts;
    for (std::size_t i = 0; i < full; ++i) parts.push_back(randperm(data_size_, gen));
    if (rest > 0)
      parts.push_back(randperm(data_size_, gen).narrow(0, 0, static_cast<std::int64_t>(rest)));
    return parts.size() == 1 ? parts.front() : at::cat(parts);
  };
  auto finish = [&](at::Generator& gen) {
    if (!replacement_ && rest == 0) (void)randperm(data_size_, gen);
  };
  return std::make_shared<TensorOrder>(generator_.at_epoch(epoch, draw, finish));
}

SubsetRandomSampler::SubsetRandomSampler(std::vector<std::int64_t> subset, std::uint64_t seed)
    : subset_(std::make_shared<const std::vector<std::int64_t>>(std::move(subset))),
      generator_(seed) {
  for (std::size_t i = 0; i < subset_->size(); ++i) {
    FERRY_CHECK((*subset_)[i] >= 0, "SubsetRandomSampler: index ", (*subset_)[i], " at position ",
                i, " is negative; dataset indices start at 0");
  }
}

std::vector<std::int64_t> SubsetRandomSampler::indices(std::uint64_t epoch) {
  return materialise(*order(epoch));
}

std::shared_ptr<const IndexOrder> SubsetRandomSampler::order(std::uint64_t epoch) {
  at::Tensor perm = generator_.at_epoch(
      epoch, [&](at::Generator& gen, std::uint64_t) { return randperm(subset_->size(), gen); });
  return std::make_shared<SubsetOrder>(subset_, std::move(perm));
}

WeightedRandomSampler::WeightedRandomSampler(std::vector<double> weights,
                                             std::size_t num_samples,
                                             std::uint64_t seed,
                                             bool replacement)
    : num_samples_(num_samples), replacement_(replacement), generator_(seed) {
  FERRY_CHECK(num_samples > 0,
              "WeightedRandomSampler: num_samples=0; it must be a positive integer");
  FERRY_CHECK(!weights.empty(),
              "WeightedRandomSampler: the weight vector is empty; give one "
              "non-negative weight per dataset index");
  std::size_t non_zero = 0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const double w = weights[i];
    FERRY_CHECK(std::isfinite(w) && w >= 0.0, "WeightedRandomSampler: weights[", i, "]=", w,
                " is invalid; every weight must be finite and >= 0");
    non_zero += w > 0.0 ? 1 : 0;
  }
  FERRY_CHECK(non_zero > 0, "WeightedRandomSampler: all ", weights.size(),
              " weights are zero; at least one must be positive");
  FERRY_CHECK(replacement || num_samples <= non_zero,
              "WeightedRandomSampler: num_samples=", num_samples,
              " draws without replacement but only ", non_zero,
              " weights are positive; lower num_samples or set replacement=true");
  weights_ = at::tensor(weights, at::kDouble);
}

std::vector<std::int64_t> WeightedRandomSampler::indices(std::uint64_t epoch) {
  return materialise(*order(epoch));
}

std::shared_ptr<const IndexOrder> WeightedRandomSampler::order(std::uint64_t epoch) {
  return std::make_shared<TensorOrder>(generator_.at_epoch(epoch, [&](at::Generator& gen,
                                                                      std::uint64_t) {
    return at::multinomial(weights_, static_cast<std::int64_t>(num_samples_), replacement_, gen);
  }));
}

std::shared_ptr<const IndexOrder> DistributedSampler::order(std::uint64_t epoch) {
  at::Tensor perm;  // none: the dataset's own order
  if (shuffle_) {
    at::Generator gen = at::detail::createCPUGenerator(seed_ + epoch);
    perm = randperm(data_size_, gen);
  }
  const bool resumed = split_ && split_->epoch == epoch;
  const std::size_t begin = resumed ? split_->begin : 0;
  const std::size_t span = resumed ? split_->end - split_->begin : data_size_;
  return std::make_shared<DistributedOrder>(std::move(perm), begin, span, rank_, num_replicas_,
                                            size_in_epoch(epoch));
}

BatchSampler::BatchSampler(std::shared_ptr<Sampler> sampler, std::size_t batch_size, bool drop_last)
    : sampler_(std::move(sampler)), batch_size_(batch_size), drop_last_(drop_last) {
  FERRY_CHECK(sampler_ != nullptr, "BatchSampler: the sampler is null; pass a Sampler");
  FERRY_CHECK(batch_size_ > 0, "BatchSampler: batch_size=0; it must be a positive integer");
}

std::size_t BatchSampler::size() const {
  FERRY_ASSERT(sampler_ != nullptr,
               "a BatchSampler subclass without a sampler must override size()");
  const std::size_t n = sampler_->size();
  return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

std::string BatchSampler::state() const { return sampler_ ? sampler_->state() : std::string(); }

std::size_t BatchSampler::load_state(std::string_view state,
                                     std::uint64_t epoch,
                                     std::size_t consumed) {
  if (!sampler_) {
    FERRY_CHECK(state.empty(), "the state holds a batch sampler's state, but this batch sampler (",
                typeid(*this).name(), ") saves none; resume with the batch sampler it came from");
    return consumed;
  }
  const std::size_t indices = consumed * batch_size_;
  const std::size_t now = sampler_->load_state(state, epoch, indices);
  if (now == indices) return consumed;
  // (Thrown after the sampler changed: DataLoader::load_state restores it.)
  FERRY_CHECK(now % batch_size_ == 0, "BatchSampler: the sampler resumed epoch ", epoch, " with ",
              now, " indices consumed, which is not a whole number of batches of ", batch_size_);
  return now / batch_size_;
}

std::vector<std::vector<std::int64_t>> BatchSampler::batches(std::uint64_t epoch) {
  FERRY_ASSERT(sampler_ != nullptr,
               "a BatchSampler subclass without a sampler must override batches()");
  const std::vector<std::int64_t> all = sampler_->indices(epoch);
  std::vector<std::vector<std::int64_t>> out;
  out.reserve(all.size() / batch_size_ + 1);
  for (std::size_t start = 0; start < all.size(); start += batch_size_) {
    const std::size_t stop = std::min(all.size(), start + batch_size_);
    if (drop_last_ && stop - start < batch_size_) break;
    out.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(start),
                     all.begin() + static_cast<std::ptrdiff_t>(stop));
  }
  return out;
}

}  // namespace ferry
