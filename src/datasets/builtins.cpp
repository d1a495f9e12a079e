// ferry's core types in the registry: the synthetic dataset, the samplers and default collate, and
// (token_datasets.cpp) the token datasets and their collates.
// Registered by an explicit call (ferry::register_builtins), never by static initializers.

#include "ferry/collate.h"
#include "ferry/error.h"
#include "ferry/registry.h"
#include "ferry/sampler.h"
#include "ferry/synthetic_dataset.h"
#include "ferry/tokens.h"

namespace ferry {

void register_core_types(Registry& r) {
  if (!r.claim_group("ferry.core")) return;

  r.add_dataset({.name = "synthetic",
                 .summary = "generated samples: 'data' (a tensor of `shape`) and 'label' (index % "
                            "num_classes); content depends on (seed, index) only",
                 .keys = {{.name = "size",
                           .type = ValueType::kInt,
                           .default_value = 1000,
                           .help = "number of samples",
                           .min = 0},
                          {.name = "shape",
                           .type = ValueType::kIntList,
                           .default_value = Config::list({3, 32, 32}),
                           .help = "shape of 'data'",
                           .min = 0},
                          {.name = "dtype",
                           .type = ValueType::kString,
                           .default_value = "float32",
                           .help = "float32 (uniform in [0, 1)) or uint8",
                           .choices = {"float32", "uint8"}},
                          {.name = "num_classes",
                           .type = ValueType::kInt,
                           .default_value = 10,
                           .help = "labels are index % num_classes",
                           .min = 1},
                          {.name = "seed",
                           .type = ValueType::kInt,
                           .default_value = 0,
                           .help = "content seed",
                           .min = 0},
                          {.name = "load_us",
                           .type = ValueType::kInt,
                           .default_value = 0,
                           .help = "microseconds each sample sleeps, standing in for loading time",
                           .min = 0}},
                 .builtin = true},
                [](const Args& a) {
                  return std::make_shared<SyntheticDataset>(SyntheticDataset::Options{
                      .size = a.get<std::size_t>("size"),
                      .shape = a.get<std::vector<std::int64_t>>("shape"),
                      .uint8 = a.get<std::string>("dtype") == "uint8",
                      .num_classes = a.get<std::int64_t>("num_classes"),
                      .seed = static_cast<std::uint64_t>(a.get<std::int64_t>("seed")),
                      .load_us = static_cast<std::uint64_t>(a.get<std::int64_t>("load_us"))});
                });

  r.add_sampler({.name = "sequential",
                 .summary = "indices 0..N-1 in order (torch.utils.data.SequentialSampler)",
                 .builtin = true},
                [](const Args&, const SamplerContext& c) {
                  return std::make_shared<SequentialSampler>(c.dataset_size);
                });
  r.add_sampler(
      {.name = "random",
       .summary = "a new permutation each epoch (torch.utils.data.RandomSampler), seeded by the "
                  "loader's seed",
       .keys = {{.name = "replacement",
                 .type = ValueType::kBool,
                 .default_value = false,
                 .help = "draw with replacement"},
                {.name = "num_samples",
                 .type = ValueType::kInt,
                 .help = "draws per epoch (default: the dataset size)",
                 .min = 1}},
       .builtin = true},
      [](const Args& a, const SamplerContext& c) {
        RandomSampler::Options o;
        o.replacement = a.get<bool>("replacement");
        if (a.has("num_samples")) o.num_samples = a.get<std::size_t>("num_samples");
        return std::make_shared<RandomSampler>(c.dataset_size, c.seed, o);
      });
  r.add_sampler(
      {.name = "subset_random",
       .summary = "the given indices in random order (torch.utils.data.SubsetRandomSampler)",
       .keys = {{.name = "indices",
                 .type = ValueType::kIntList,
                 .required = true,
                 .help = "dataset indices to sample from",
                 .min = 0}},
       .builtin = true},
      [](const Args& a, const SamplerContext& c) {
        auto indices = a.get<std::vector<std::int64_t>>("indices");
        for (const auto i : indices) {
          if (static_cast<std::size_t>(i) >= c.dataset_size) {
            a.fail("indices",
                   detail::str("index ", i, " is outside the dataset (size ", c.dataset_size, ")"));
          }
        }
        return std::make_shared<SubsetRandomSampler>(std::move(indices), c.seed);
      });
  r.add_sampler(
      {.name = "weighted_random",
       .summary = "indices drawn in proportion to weights "
                  "(torch.utils.data.WeightedRandomSampler)",
       .keys = {{.name = "weights",
                 .type = ValueType::kFloatList,
                 .required = true,
                 .help = "one weight per dataset index",
                 .min = 0},
                {.name = "num_samples",
                 .type = ValueType::kInt,
                 .required = true,
                 .help = "draws per epoch",
                 .min = 1},
                {.name = "replacement",
                 .type = ValueType::kBool,
                 .default_value = true,
                 .help = "draw with replacement"}},
       .builtin = true},
      [](const Args& a, const SamplerContext& c) {
        auto weights = a.get<std::vector<double>>("weights");
        if (weights.size() != c.dataset_size) {
          a.fail("weights", detail::str("has ", weights.size(), " weights for a dataset of ",
                                        c.dataset_size, " samples; give one per sample"));
        }
        return std::make_shared<WeightedRandomSampler>(std::move(weights),
                                                       a.get<std::size_t>("num_samples"), c.seed,
                                                       a.get<bool>("replacement"));
      });
  r.add_sampler({.name = "distributed",
                 .summary = "this rank's share of the dataset "
                            "(torch.utils.data.distributed.DistributedSampler)",
                 .keys = {{.name = "num_replicas",
                           .type = ValueType::kInt,
                           .help = "world size (default: the launcher's: torchrun, mpirun, srun)",
                           .min = 1},
                          {.name = "rank",
                           .type = ValueType::kInt,
                           .help = "this rank (default: the launcher's)",
                           .min = 0},
                          {.name = "shuffle",
                           .type = ValueType::kBool,
                           .default_value = true,
                           .help = "shuffle with seed + epoch"},
                          {.name = "seed",
                           .type = ValueType::kInt,
                           .default_value = 0,
                           .help = "shuffle seed, the same on every rank",
                           .min = 0},
                          {.name = "drop_last",
                           .type = ValueType::kBool,
                           .default_value = false,
                           .help = "drop the tail instead of padding"}},
                 .builtin = true},
                [](const Args& a, const SamplerContext& c) {
                  DistributedSampler::Options o;
                  if (a.has("num_replicas")) o.num_replicas = a.get<std::size_t>("num_replicas");
                  if (a.has("rank")) o.rank = a.get<std::size_t>("rank");
                  o.shuffle = a.get<bool>("shuffle");
                  o.seed = static_cast<std::uint64_t>(a.get<std::int64_t>("seed"));
                  o.drop_last = a.get<bool>("drop_last");
                  return std::make_shared<DistributedSampler>(c.dataset_size, o);
                });

  r.add_collate({.name = "default",
                 .summary = "stack same-shape tensors, numbers to 1-D tensors, strings to lists "
                            "(torch.utils.data.default_collate)",
                 .builtin = true},
                [](const Args&) -> CollateFn { return default_collate; });
  register_token_types(r);  // npy, indexed, gpt, token_windows; pad and pack
}

}  // namespace ferry
