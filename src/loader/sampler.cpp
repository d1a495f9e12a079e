#include "ferry/sampler.h"

#include <cmath>
#include <numeric>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "ferry/error.h"

namespace ferry {

namespace {

std::vector<std::int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const auto* data = c.data_ptr<std::int64_t>();
  return std::vector<std::int64_t>(data, data + c.numel());
}

std::vector<std::int64_t> randperm(std::size_t n, at::Generator& generator) {
  return to_vector(at::randperm(static_cast<std::int64_t>(n), generator, at::kLong));
}

}  // namespace

at::Generator& EpochGenerator::rewind_to(std::uint64_t epoch) {
  if (!generator_ || next_epoch_ > epoch) {
    generator_ = at::detail::createCPUGenerator(seed_);
    next_epoch_ = 0;
  }
  return *generator_;
}

std::vector<std::int64_t> SequentialSampler::indices(std::uint64_t /*epoch*/) {
  std::vector<std::int64_t> out(size_);
  std::iota(out.begin(), out.end(), std::int64_t{0});
  return out;
}

RandomSampler::RandomSampler(std::size_t data_size, std::uint64_t seed, Options options)
    : data_size_(data_size),
      num_samples_(options.num_samples.value_or(data_size)),
      replacement_(options.replacement),
      generator_(seed) {
  FERRY_CHECK(!options.num_samples || *options.num_samples > 0,
              "RandomSampler: num_samples=0; it must be a positive integer (or unset for the "
              "dataset size)");
  FERRY_CHECK(data_size_ > 0 || num_samples_ == 0, "RandomSampler: num_samples=", num_samples_,
              " draws from an empty dataset; give the sampler a non-empty dataset");
}

std::vector<std::int64_t> RandomSampler::indices(std::uint64_t epoch) {
  if (data_size_ == 0) return {};
  const auto n = static_cast<std::int64_t>(data_size_);
  return generator_.at_epoch(epoch, [&](at::Generator& gen) {
    std::vector<std::int64_t> out;
    out.reserve(num_samples_);
    // The same draws, in the same chunks, as torch.utils.data.RandomSampler.__iter__ (1.13+),
    // including its final (possibly empty) chunk, so the generator advances identically.
    if (replacement_) {
      for (std::size_t i = 0; i < num_samples_ / 32; ++i) {
        const auto chunk = to_vector(at::randint(n, {32}, gen, at::kLong));
        out.insert(out.end(), chunk.begin(), chunk.end());
      }
      const auto rest = static_cast<std::int64_t>(num_samples_ % 32);
      const auto chunk = to_vector(at::randint(n, {rest}, gen, at::kLong));
      out.insert(out.end(), chunk.begin(), chunk.end());
    } else {
      for (std::size_t i = 0; i < num_samples_ / data_size_; ++i) {
        const auto perm = randperm(data_size_, gen);
        out.insert(out.end(), perm.begin(), perm.end());
      }
      const auto perm = randperm(data_size_, gen);
      out.insert(out.end(), perm.begin(),
                 perm.begin() + static_cast<std::ptrdiff_t>(num_samples_ % data_size_));
    }
    return out;
  });
}

SubsetRandomSampler::SubsetRandomSampler(std::vector<std::int64_t> subset, std::uint64_t seed)
    : subset_(std::move(subset)), generator_(seed) {
  for (std::size_t i = 0; i < subset_.size(); ++i) {
    FERRY_CHECK(subset_[i] >= 0, "SubsetRandomSampler: index ", subset_[i], " at position ", i,
                " is negative; dataset indices start at 0");
  }
}

std::vector<std::int64_t> SubsetRandomSampler::indices(std::uint64_t epoch) {
  return generator_.at_epoch(epoch, [&](at::Generator& gen) {
    const auto perm = randperm(subset_.size(), gen);
    std::vector<std::int64_t> out(perm.size());
    for (std::size_t i = 0; i < perm.size(); ++i)
      out[i] = subset_[static_cast<std::size_t>(perm[i])];
    return out;
  });
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
  return generator_.at_epoch(epoch, [&](at::Generator& gen) {
    return to_vector(
        at::multinomial(weights_, static_cast<std::int64_t>(num_samples_), replacement_, gen));
  });
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
