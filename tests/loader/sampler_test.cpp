// ferry's samplers against PyTorch's: tests/golden/samplers.txt (the same from every torch
// version) and weighted-torchX.Y.txt (torch.multinomial's draws, which depend on the version) are
// written by tests/golden/make_sampler_golden.py, run with the torch that matches LibTorch.

#include "ferry/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/version.h>

#include "ferry/error.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

struct GoldenCase {
  std::string kind;
  std::map<std::string, std::string> params;
  std::vector<std::int64_t> indices;
  std::string line;

  std::int64_t num(const std::string& key) const { return std::stoll(params.at(key)); }
  std::uint64_t seed() const { return std::stoull(params.at("seed")); }
  template <class T>
  std::vector<T> list(const std::string& key) const {
    std::vector<T> out;
    std::stringstream ss(params.at(key));
    std::string item;
    while (std::getline(ss, item, ',')) out.push_back(static_cast<T>(std::stod(item)));
    return out;
  }
};

// The goldens whose draws depend on LibTorch's version, for the version this test links.
std::string versioned_golden(const std::string& stem) {
  return std::string(FERRY_GOLDEN_DIR) + "/" + stem + "-torch" +
         std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + ".txt";
}

std::vector<GoldenCase> load_golden(const std::string& kind,
                                    const std::string& file = std::string(FERRY_GOLDEN_DIR) +
                                                              "/samplers.txt") {
  std::ifstream in(file);
  EXPECT_TRUE(in.good()) << "cannot open " << file;
  std::vector<GoldenCase> cases;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto colon = line.find(" : ");
    const std::string head = line.substr(0, colon);
    std::istringstream hs(head);
    GoldenCase c;
    c.line = head;
    hs >> c.kind;
    if (c.kind != kind) continue;
    std::string kv;
    while (hs >> kv) {
      const auto eq = kv.find('=');
      c.params[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    std::istringstream is(colon == std::string::npos ? "" : line.substr(colon + 3));
    std::int64_t v;
    while (is >> v) c.indices.push_back(v);
    cases.push_back(std::move(c));
  }
  return cases;
}

TEST(RandomSampler, MatchesPyTorchGoldenOrdersAcrossEpochs) {
  const auto cases = load_golden("random");
  ASSERT_GT(cases.size(), 100u);
  for (const auto& c : cases) {
    RandomSampler::Options options{.replacement = c.num("replacement") != 0};
    if (c.num("num_samples") >= 0)
      options.num_samples = static_cast<std::size_t>(c.num("num_samples"));
    RandomSampler sampler(static_cast<std::size_t>(c.num("n")), c.seed(), options);
    EXPECT_EQ(sampler.indices(static_cast<std::uint64_t>(c.num("epoch"))), c.indices) << c.line;
    EXPECT_EQ(sampler.size(), c.indices.size()) << c.line;
  }
}

TEST(RandomSampler, GoldenOrdersHoldWhenEpochsAreWalkedInARow) {
  // One sampler per configuration, its epochs asked for in order: the draws PyTorch makes at the
  // end of an epoch (the empty final chunk) are made before the next, never skipped.
  std::map<std::string, std::vector<const GoldenCase*>> by_config;
  const auto cases = load_golden("random");
  for (const auto& c : cases) {
    by_config[c.line.substr(0, c.line.find(" epoch="))].push_back(&c);
  }
  for (const auto& [config, epochs] : by_config) {
    const GoldenCase& first = *epochs.front();
    RandomSampler::Options options{.replacement = first.num("replacement") != 0};
    if (first.num("num_samples") >= 0)
      options.num_samples = static_cast<std::size_t>(first.num("num_samples"));
    RandomSampler sampler(static_cast<std::size_t>(first.num("n")), first.seed(), options);
    for (const GoldenCase* c : epochs) {
      EXPECT_EQ(sampler.indices(static_cast<std::uint64_t>(c->num("epoch"))), c->indices)
          << c->line;
    }
  }
}

TEST(Samplers, OrdersReadByPositionEqualTheirIndices) {
  // The loader reads an epoch's order a batch at a time; every sampler's order() must say what
  // its indices() says, read in any chunks.
  using Make = std::function<std::shared_ptr<Sampler>()>;
  const std::vector<std::pair<std::string, Make>> samplers = {
      {"sequential", [] { return std::make_shared<SequentialSampler>(103); }},
      {"random", [] { return std::make_shared<RandomSampler>(103, 5); }},
      {"random, 250 of 103",
       [] {
         return std::make_shared<RandomSampler>(103, 5, RandomSampler::Options{.num_samples = 250});
       }},
      {"random with replacement",
       [] {
         return std::make_shared<RandomSampler>(
             103, 5, RandomSampler::Options{.replacement = true, .num_samples = 77});
       }},
      {"subset",
       [] {
         return std::make_shared<SubsetRandomSampler>(std::vector<std::int64_t>{9, 4, 7, 1, 30}, 2);
       }},
      {"weighted",
       [] {
         return std::make_shared<WeightedRandomSampler>(std::vector<double>{1, 2, 0, 4}, 40, 3);
       }},
      {"distributed, padded",
       [] {
         return std::make_shared<DistributedSampler>(
             103, DistributedSampler::Options{.num_replicas = 4, .rank = 3, .seed = 8});
       }},
      {"distributed, tiny and padded",
       [] {
         return std::make_shared<DistributedSampler>(
             3, DistributedSampler::Options{.num_replicas = 8, .rank = 6, .shuffle = false});
       }},
      {"distributed, drop_last",
       [] {
         return std::make_shared<DistributedSampler>(
             103, DistributedSampler::Options{.num_replicas = 4, .rank = 1, .drop_last = true});
       }},
  };
  for (const auto& [name, make] : samplers) {
    for (std::uint64_t epoch : {0u, 1u, 3u}) {
      const auto order = make()->order(epoch);
      const auto expected = make()->indices(epoch);
      ASSERT_EQ(order->size(), expected.size()) << name;
      std::vector<std::int64_t> read(order->size());
      for (std::size_t start = 0; start < read.size(); start += 7) {
        const std::size_t n = std::min<std::size_t>(7, read.size() - start);
        order->read(start, std::span<std::int64_t>(read).subspan(start, n));
      }
      EXPECT_EQ(read, expected) << name << ", epoch " << epoch;
    }
  }
}

TEST(RandomSampler, ConsecutiveEpochsEqualAFreshReplay) {
  // The cached generator (epoch 0, 1, 2 in a row) and a jump straight to epoch 2 agree.
  RandomSampler walked(50, 7);
  walked.indices(0);
  walked.indices(1);
  const auto e2 = walked.indices(2);
  RandomSampler jumped(50, 7);
  EXPECT_EQ(jumped.indices(2), e2);
  EXPECT_EQ(jumped.indices(0), RandomSampler(50, 7).indices(0));  // backwards replays too
  EXPECT_NE(RandomSampler(50, 7).indices(0), e2);
}

TEST(RandomSampler, WithoutReplacementIsAPermutation) {
  RandomSampler sampler(1000, 3);
  auto idx = sampler.indices(4);
  std::sort(idx.begin(), idx.end());
  for (std::int64_t i = 0; i < 1000; ++i) ASSERT_EQ(idx[static_cast<std::size_t>(i)], i);
}

TEST(RandomSampler, WithReplacementDrawsInRangeAndRepeats) {
  RandomSampler sampler(10, 1, {.replacement = true, .num_samples = 500});
  const auto idx = sampler.indices(0);
  ASSERT_EQ(idx.size(), 500u);
  std::map<std::int64_t, int> counts;
  for (auto i : idx) {
    ASSERT_GE(i, 0);
    ASSERT_LT(i, 10);
    ++counts[i];
  }
  EXPECT_EQ(counts.size(), 10u);  // 500 draws over 10 values: every value appears
  for (const auto& [value, count] : counts) EXPECT_GT(count, 20) << value;
}

TEST(RandomSampler, RejectsZeroNumSamples) {
  EXPECT_THAT([] { RandomSampler(10, 0, {.num_samples = 0}); },
              ThrowsMessage<ConfigError>(HasSubstr("num_samples=0")));
}

TEST(SubsetRandomSampler, MatchesPyTorchGoldenOrders) {
  const auto cases = load_golden("subset");
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) {
    SubsetRandomSampler sampler(c.list<std::int64_t>("subset"), c.seed());
    EXPECT_EQ(sampler.indices(static_cast<std::uint64_t>(c.num("epoch"))), c.indices) << c.line;
  }
}

TEST(WeightedRandomSampler, MatchesPyTorchGoldenDraws) {
  const std::string file = versioned_golden("weighted");
  if (!std::ifstream(file).good()) {
    GTEST_SKIP() << "no WeightedRandomSampler goldens for LibTorch " << TORCH_VERSION_MAJOR << "."
                 << TORCH_VERSION_MINOR << " (" << file
                 << "): torch.multinomial's draws differ between versions; make them with "
                    "python3 tests/golden/make_sampler_golden.py, using torch "
                 << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR;
  }
  const auto cases = load_golden("weighted", file);
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) {
    WeightedRandomSampler sampler(c.list<double>("weights"),
                                  static_cast<std::size_t>(c.num("num_samples")), c.seed(),
                                  c.num("replacement") != 0);
    EXPECT_EQ(sampler.indices(static_cast<std::uint64_t>(c.num("epoch"))), c.indices) << c.line;
  }
}

TEST(WeightedRandomSampler, FollowsTheWeights) {
  // Weight 0 is never drawn; frequencies follow the weights (1:3 here) within sampling noise.
  WeightedRandomSampler sampler({1.0, 0.0, 3.0}, 20000, 11);
  const auto idx = sampler.indices(0);
  std::map<std::int64_t, int> counts;
  for (auto i : idx) ++counts[i];
  EXPECT_EQ(counts.count(1), 0u);
  const double ratio = static_cast<double>(counts[2]) / counts[0];
  EXPECT_NEAR(ratio, 3.0, 0.25);
}

TEST(WeightedRandomSampler, WithoutReplacementNeverRepeats) {
  WeightedRandomSampler sampler({1, 2, 3, 4, 5, 6}, 6, 5, /*replacement=*/false);
  auto idx = sampler.indices(0);
  std::sort(idx.begin(), idx.end());
  EXPECT_EQ(idx, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5}));
}

TEST(WeightedRandomSampler, RejectsBadWeights) {
  EXPECT_THAT(
      [] {
        WeightedRandomSampler({1.0, -0.5, 2.0}, 3, 0);
      },
      ThrowsMessage<ConfigError>(HasSubstr("weights[1]=-0.5")));
  EXPECT_THAT(
      [] {
        WeightedRandomSampler({1.0, std::nan(""), 2.0}, 3, 0);
      },
      ThrowsMessage<ConfigError>(HasSubstr("weights[1]=nan")));
  EXPECT_THAT(
      [] {
        WeightedRandomSampler({1.0, INFINITY}, 3, 0);
      },
      ThrowsMessage<ConfigError>(HasSubstr("must be finite")));
  EXPECT_THAT(
      [] {
        WeightedRandomSampler({0.0, 0.0}, 3, 0);
      },
      ThrowsMessage<ConfigError>(HasSubstr("all 2 weights are zero")));
  EXPECT_THAT([] { WeightedRandomSampler({}, 3, 0); },
              ThrowsMessage<ConfigError>(HasSubstr("weight vector is empty")));
  EXPECT_THAT([] { WeightedRandomSampler({1.0}, 0, 0); },
              ThrowsMessage<ConfigError>(HasSubstr("num_samples=0")));
  EXPECT_THAT(
      [] {
        WeightedRandomSampler({1.0, 0.0, 1.0}, 3, 0, false);
      },
      ThrowsMessage<ConfigError>(HasSubstr("only 2 weights are positive")));
}

TEST(DistributedSampler, MatchesPyTorchGoldenOrdersForEveryRank) {
  const auto cases = load_golden("distributed");
  ASSERT_GT(cases.size(), 1000u);
  for (const auto& c : cases) {
    DistributedSampler sampler(static_cast<std::size_t>(c.num("n")),
                               {.num_replicas = static_cast<std::size_t>(c.num("world")),
                                .rank = static_cast<std::size_t>(c.num("rank")),
                                .shuffle = c.num("shuffle") != 0,
                                .seed = c.seed(),
                                .drop_last = c.num("drop_last") != 0});
    EXPECT_EQ(sampler.indices(static_cast<std::uint64_t>(c.num("epoch"))), c.indices) << c.line;
    EXPECT_EQ(sampler.size(), c.indices.size()) << c.line;
  }
}

TEST(DistributedSampler, RanksAreDisjointAndCoverTheDatasetWithDropLast) {
  for (std::size_t n : {10u, 11u, 103u}) {
    for (std::size_t world : {1u, 2u, 3u, 4u, 8u}) {
      std::multiset<std::int64_t> all;
      std::size_t per_rank = 0;
      for (std::size_t rank = 0; rank < world; ++rank) {
        DistributedSampler s(n,
                             {.num_replicas = world, .rank = rank, .seed = 5, .drop_last = true});
        const auto idx = s.indices(3);
        if (rank == 0) per_rank = idx.size();
        EXPECT_EQ(idx.size(), per_rank) << "every rank gets the same count";
        all.insert(idx.begin(), idx.end());
      }
      // drop_last: disjoint (no index twice), and only the tail of fewer than `world` is dropped.
      EXPECT_EQ(std::set<std::int64_t>(all.begin(), all.end()).size(), all.size());
      EXPECT_EQ(all.size(), n / world * world) << "n=" << n << " world=" << world;
    }
  }
}

TEST(DistributedSampler, PaddingWrapsAroundSoEveryRankGetsTheSameCount) {
  // n=5 over 4 ranks: 8 slots; the first 3 indices of the order appear twice.
  std::map<std::int64_t, int> counts;
  for (std::size_t rank = 0; rank < 4; ++rank) {
    DistributedSampler s(5, {.num_replicas = 4, .rank = rank, .shuffle = false});
    const auto idx = s.indices(0);
    EXPECT_EQ(idx.size(), 2u);
    for (auto i : idx) ++counts[i];
  }
  EXPECT_EQ(counts, (std::map<std::int64_t, int>{{0, 2}, {1, 2}, {2, 2}, {3, 1}, {4, 1}}));
  // A dataset smaller than the world repeats itself as often as needed.
  std::map<std::int64_t, int> tiny;
  for (std::size_t rank = 0; rank < 7; ++rank) {
    DistributedSampler s(2, {.num_replicas = 7, .rank = rank, .shuffle = false});
    for (auto i : s.indices(0)) ++tiny[i];
  }
  EXPECT_EQ(tiny, (std::map<std::int64_t, int>{{0, 4}, {1, 3}}));
}

TEST(DistributedSampler, EpochChangesTheShuffle) {
  DistributedSampler s(100, {.num_replicas = 2, .rank = 0, .seed = 1});
  EXPECT_NE(s.indices(0), s.indices(1));
  EXPECT_EQ(s.indices(1), s.indices(1));
}

TEST(DistributedSampler, ReadsRankAndWorldSizeFromTheEnvironment) {
  ::setenv("WORLD_SIZE", "3", 1);
  ::setenv("RANK", "2", 1);
  DistributedSampler from_env(30, {.shuffle = false});
  EXPECT_EQ(from_env.num_replicas(), 3u);
  EXPECT_EQ(from_env.rank(), 2u);
  EXPECT_EQ(from_env.indices(0).front(), 2);
  ::setenv("RANK", "3", 1);
  EXPECT_THAT([] { DistributedSampler(30, {}); },
              ThrowsMessage<ConfigError>(
                  HasSubstr("RANK=3 WORLD_SIZE=3 (torchrun): the rank must be below")));
  ::setenv("RANK", "two", 1);
  EXPECT_THAT([] { DistributedSampler(30, {}); },
              ThrowsMessage<ConfigError>(HasSubstr("RANK='two'")));
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  EXPECT_THAT([] { DistributedSampler(30, {}); },
              ThrowsMessage<ConfigError>(HasSubstr("no launcher set the world size")));
}

TEST(DistributedSampler, RejectsARankOutsideTheWorld) {
  EXPECT_THAT([] { DistributedSampler(10, {.num_replicas = 4, .rank = 4}); },
              ThrowsMessage<ConfigError>(HasSubstr("rank must be in [0, 3]")));
  EXPECT_THAT([] { DistributedSampler(10, {.num_replicas = 0, .rank = 0}); },
              ThrowsMessage<ConfigError>(HasSubstr("num_replicas=0")));
}

TEST(BatchSampler, ChunksWithAndWithoutDropLast) {
  auto seq = std::make_shared<SequentialSampler>(7);
  BatchSampler keep(seq, 3, false);
  EXPECT_EQ(keep.size(), 3u);
  EXPECT_EQ(keep.batches(0), (std::vector<std::vector<std::int64_t>>{{0, 1, 2}, {3, 4, 5}, {6}}));
  BatchSampler drop(seq, 3, true);
  EXPECT_EQ(drop.size(), 2u);
  EXPECT_EQ(drop.batches(0), (std::vector<std::vector<std::int64_t>>{{0, 1, 2}, {3, 4, 5}}));
  BatchSampler big(seq, 10, true);
  EXPECT_EQ(big.size(), 0u);
  EXPECT_TRUE(big.batches(0).empty());
  EXPECT_THAT([&] { BatchSampler(seq, 0, false); },
              ThrowsMessage<ConfigError>(HasSubstr("batch_size=0")));
  EXPECT_THAT([] { BatchSampler(nullptr, 2, false); },
              ThrowsMessage<ConfigError>(HasSubstr("sampler is null")));
}

TEST(BatchSampler, PassesTheEpochToItsSampler) {
  auto random = std::make_shared<RandomSampler>(20, 9);
  BatchSampler batches(random, 20, false);
  const auto e3 = batches.batches(3);
  ASSERT_EQ(e3.size(), 1u);
  EXPECT_EQ(e3[0], RandomSampler(20, 9).indices(3));
}

}  // namespace
}  // namespace ferry
