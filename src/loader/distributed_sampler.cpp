#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "ferry/error.h"
#include "ferry/launch.h"
#include "ferry/sampler.h"

namespace ferry {

DistributedSampler::DistributedSampler(std::size_t data_size, Options options)
    : data_size_(data_size),
      shuffle_(options.shuffle),
      seed_(options.seed),
      drop_last_(options.drop_last) {
  std::optional<LaunchInfo> launch;
  if (!options.num_replicas || !options.rank) {
    try {
      launch = launch_info();
    } catch (const ConfigError& e) {
      throw ConfigError(detail::str("DistributedSampler: ", e.what()));
    }
  }
  const auto world = options.num_replicas
                         ? options.num_replicas
                         : (launch ? std::optional<std::size_t>(launch->world_size) : std::nullopt);
  const auto rank = options.rank
                        ? options.rank
                        : (launch ? std::optional<std::size_t>(launch->rank) : std::nullopt);
  FERRY_CHECK(world.has_value(),
              "DistributedSampler: num_replicas is not set and no launcher set the world size "
              "(WORLD_SIZE from torchrun, OMPI_COMM_WORLD_SIZE from mpirun, SLURM_NTASKS from "
              "srun); pass num_replicas, or launch with one of them");
  FERRY_CHECK(rank.has_value(),
              "DistributedSampler: rank is not set and no launcher set it (RANK from torchrun, "
              "OMPI_COMM_WORLD_RANK from mpirun, SLURM_PROCID from srun); pass rank, or launch "
              "with one of them");
  FERRY_CHECK(*world > 0, "DistributedSampler: num_replicas=0; it must be at least 1");
  FERRY_CHECK(*rank < *world, "DistributedSampler: rank=", *rank,
              " is outside the world of num_replicas=", *world, "; rank must be in [0, ",
              *world - 1, "]");
  num_replicas_ = *world;
  rank_ = *rank;
  num_samples_ = per_rank(data_size_, num_replicas_, drop_last_);
}

std::size_t DistributedSampler::per_rank(std::size_t data_size,
                                         std::size_t num_replicas,
                                         bool drop_last) noexcept {
  // As PyTorch: with drop_last, cut the tail so every rank gets the same count; otherwise pad.
  if (drop_last && data_size % num_replicas != 0) {
    return data_size >= num_replicas ? (data_size - num_replicas) / num_replicas +
                                           ((data_size - num_replicas) % num_replicas != 0)
                                     : 0;
  }
  return (data_size + num_replicas - 1) / num_replicas;
}

std::vector<std::int64_t> DistributedSampler::indices(std::uint64_t epoch) {
  const auto o = order(epoch);
  std::vector<std::int64_t> out(o->size());
  o->read(0, out);
  return out;
}

}  // namespace ferry
