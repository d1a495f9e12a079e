#include <charconv>
#include <cstdlib>
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
  const auto o = order(epoch);
  std::vector<std::int64_t> out(o->size());
  o->read(0, out);
  return out;
}

}  // namespace ferry
