#include <charconv>
#include <cstdlib>
#include <numeric>
#include <string_view>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "ferry/error.h"
#include "ferry/sampler.h"

namespace ferry {

namespace {

// Reads a non-negative integer from the environment, as torchrun sets RANK and WORLD_SIZE.
std::optional<std::size_t> from_env(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr) return std::nullopt;
  std::size_t value = 0;
  const std::string_view view(text);
  const auto [end, ec] = std::from_chars(view.data(), view.data() + view.size(), value);
  FERRY_CHECK(ec == std::errc() && end == view.data() + view.size() && !view.empty(),
              "DistributedSampler: environment variable ", name, "='", view,
              "' is not a non-negative integer; fix it or pass the value in the options");
  return value;
}

}  // namespace

DistributedSampler::DistributedSampler(std::size_t data_size, Options options)
    : data_size_(data_size),
      shuffle_(options.shuffle),
      seed_(options.seed),
      drop_last_(options.drop_last) {
  const auto world = options.num_replicas ? options.num_replicas : from_env("WORLD_SIZE");
  const auto rank = options.rank ? options.rank : from_env("RANK");
  FERRY_CHECK(world.has_value(),
              "DistributedSampler: num_replicas is not set and WORLD_SIZE is "
              "not in the environment; pass num_replicas or launch with torchrun");
  FERRY_CHECK(rank.has_value(),
              "DistributedSampler: rank is not set and RANK is not in the "
              "environment; pass rank or launch with torchrun");
  FERRY_CHECK(*world > 0, "DistributedSampler: num_replicas=0; it must be at least 1");
  FERRY_CHECK(*rank < *world, "DistributedSampler: rank=", *rank,
              " is outside the world of num_replicas=", *world, "; rank must be in [0, ",
              *world - 1, "]");
  num_replicas_ = *world;
  rank_ = *rank;
  // As PyTorch: with drop_last, cut the tail so every rank gets the same count; otherwise pad.
  if (drop_last_ && data_size_ % num_replicas_ != 0) {
    num_samples_ = data_size_ >= num_replicas_
                       ? (data_size_ - num_replicas_) / num_replicas_ +
                             ((data_size_ - num_replicas_) % num_replicas_ != 0)
                       : 0;
  } else {
    num_samples_ = (data_size_ + num_replicas_ - 1) / num_replicas_;
  }
}

std::vector<std::int64_t> DistributedSampler::indices(std::uint64_t epoch) {
  std::vector<std::int64_t> order;
  if (shuffle_) {
    at::Generator gen = at::detail::createCPUGenerator(seed_ + epoch);
    const at::Tensor perm = at::randperm(static_cast<std::int64_t>(data_size_), gen, at::kLong);
    const auto* data = perm.data_ptr<std::int64_t>();
    order.assign(data, data + perm.numel());
  } else {
    order.resize(data_size_);
    std::iota(order.begin(), order.end(), std::int64_t{0});
  }
  const std::size_t total = total_size();
  if (!drop_last_) {
    // Pad by wrapping around, repeating the whole order as often as needed (tiny datasets).
    const std::size_t base = order.size();
    for (std::size_t i = 0; base > 0 && order.size() < total; ++i) order.push_back(order[i % base]);
  } else {
    order.resize(std::min(order.size(), total));
  }
  std::vector<std::int64_t> out;
  out.reserve(num_samples_);
  for (std::size_t i = rank_; i < order.size(); i += num_replicas_) out.push_back(order[i]);
  return out;
}

}  // namespace ferry
