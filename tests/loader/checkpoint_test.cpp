// Checkpoints in the calling thread (num_workers = 0): the continuation matrix over samplers and
// stop points, elastic resume across world sizes, ranks in step, and bad states. The same with
// worker processes is in resume_test.cpp.

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/data_loader.h"
#include "ferry/error.h"
#include "ferry/launch.h"
#include "ferry/sampler.h"

#include "support/datasets.h"
#include "support/files.h"
#include "support/resume.h"

namespace ferry {
namespace {

using ::testing::AllOf;
using testing::Delivered;
using ::testing::HasSubstr;
using testing::RangeDataset;

constexpr std::size_t kSize = 23;  // batches of 4: six per epoch, the last one short

// A sampler of the user's own: the dataset backwards, rotated by the epoch.
class Rotating : public Sampler {
 public:
  std::size_t size() const override { return kSize; }
  std::vector<std::int64_t> indices(std::uint64_t epoch) override {
    std::vector<std::int64_t> out(kSize);
    for (std::size_t i = 0; i < kSize; ++i)
      out[i] = static_cast<std::int64_t>((kSize - 1 - i + epoch) % kSize);
    return out;
  }
};

struct SamplerCase {
  const char* name;
  std::function<DataLoader(DataLoaderOptions)> make;
};

std::vector<SamplerCase> sampler_cases() {
  auto data = std::make_shared<RangeDataset>(kSize);
  auto with = [data](std::function<std::shared_ptr<Sampler>()> sampler) {
    return [data, sampler](DataLoaderOptions o) { return DataLoader(data, o, sampler()); };
  };
  std::vector<double> weights(kSize);
  std::iota(weights.begin(), weights.end(), 1.0);
  return {
      {"Sequential", [data](DataLoaderOptions o) { return DataLoader(data, o); }},
      {"Shuffle",
       [data](DataLoaderOptions o) {
         o.shuffle = true;
         return DataLoader(data, o);
       }},
      {"RandomWithReplacement", with([] {
         return std::make_shared<RandomSampler>(
             kSize, 5, RandomSampler::Options{.replacement = true, .num_samples = 30});
       })},
      {"WeightedRandom",
       with([weights] { return std::make_shared<WeightedRandomSampler>(weights, 25, 3); })},
      {"SubsetRandom", with([] {
         return std::make_shared<SubsetRandomSampler>(
             std::vector<std::int64_t>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 2, 4, 6}, 4);
       })},
      {"Distributed", with([] {
         return std::make_shared<DistributedSampler>(
             kSize, DistributedSampler::Options{.num_replicas = 3, .rank = 1, .seed = 2});
       })},
      {"UserSampler", with([] { return std::make_shared<Rotating>(); })},
  };
}

constexpr std::size_t kOnLast = SIZE_MAX;         // the epoch's last batch
constexpr std::size_t kNextEpoch = SIZE_MAX - 1;  // the next epoch's first

struct Stop {
  const char* name;
  std::size_t batches;
  bool after_loop;
};

class Continuation : public ::testing::TestWithParam<std::tuple<std::size_t, Stop>> {};

// Every sampler, resumed after batch 0, 1, k, the last batch (inside the loop), the end of the
// epoch (after the loop) and inside the next epoch: the batches after it equal the
// uninterrupted run's, bitwise, and nothing is delivered twice.
TEST_P(Continuation, EqualsTheUninterruptedRun) {
  const auto& [which, stop] = GetParam();
  const SamplerCase c = sampler_cases()[which];
  const DataLoaderOptions options{.batch_size = 4, .seed = 11};
  DataLoader reference_loader = c.make(options);
  const std::size_t per_epoch = reference_loader.size();
  const auto reference = testing::run_through(reference_loader, 2);
  const std::size_t at = stop.batches == kOnLast      ? per_epoch
                         : stop.batches == kNextEpoch ? per_epoch + 1
                                                      : stop.batches;

  DataLoader first = c.make(options);
  auto [before, state] = testing::run_until(first, at, stop.after_loop);
  DataLoader resumed = c.make(options);
  resumed.load_state(state);
  const auto after = testing::run_through(resumed, 2);
  SCOPED_TRACE(c.name + std::string(" stopped ") + stop.name + "\n" + state);
  testing::expect_continuation(reference, before, after, /*in_order=*/true);
  EXPECT_EQ(resumed.stats().batches, reference.size());
}

std::string continuation_name(const ::testing::TestParamInfo<std::tuple<std::size_t, Stop>>& info) {
  return std::string(sampler_cases()[std::get<0>(info.param)].name) + "_" +
         std::get<1>(info.param).name;
}

INSTANTIATE_TEST_SUITE_P(SamplersAndStops,
                         Continuation,
                         ::testing::Combine(::testing::Range<std::size_t>(0, 7),
                                            ::testing::Values(Stop{"Before", 0, false},
                                                              Stop{"After0", 1, false},
                                                              Stop{"After1", 2, false},
                                                              Stop{"AfterK", 4, false},
                                                              Stop{"OnLast", kOnLast, false},
                                                              Stop{"EpochEnd", kOnLast, true},
                                                              Stop{"NextEpoch", kNextEpoch,
                                                                   false})),
                         continuation_name);

// Iterable datasets without workers: the stream continues at its cursor, or (without one) by
// reading and dropping what was delivered; either way the same batches follow.
class StreamContinuation : public ::testing::TestWithParam<std::tuple<bool, std::size_t, bool>> {};

TEST_P(StreamContinuation, EqualsTheUninterruptedRun) {
  const auto [cursor, stop, after_loop] = GetParam();
  auto data = std::make_shared<testing::CountingStream>(23, true, cursor);
  const DataLoaderOptions options{.batch_size = 4, .seed = 11};
  DataLoader reference_loader(data, options);
  const auto reference = testing::run_through(reference_loader, 1);
  DataLoader first(data, options);
  auto [before, state] = testing::run_until(first, stop, after_loop);
  SCOPED_TRACE(state);
  EXPECT_THAT(state, HasSubstr("\"kind\": \"iterable\""));
  if (stop > 0 && stop < 6) {
    EXPECT_THAT(state, HasSubstr(cursor ? "\"cursor\": \"next=" : "\"cursor\": null"));
  }
  DataLoader resumed(data, options);
  resumed.load_state(state);
  testing::expect_continuation(reference, before, testing::run_through(resumed, 1), true);
}

INSTANTIATE_TEST_SUITE_P(CursorAndStops,
                         StreamContinuation,
                         ::testing::Values(std::make_tuple(true, 1, false),
                                           std::make_tuple(true, 3, false),
                                           std::make_tuple(true, 6, false),
                                           std::make_tuple(true, 6, true),
                                           std::make_tuple(true, 8, false),
                                           std::make_tuple(false, 0, false),
                                           std::make_tuple(false, 3, false),
                                           std::make_tuple(false, 6, true)));

// A stream state holds one stream per worker: another number of workers is refused (the
// dataset is split by worker), except at the start of an epoch.
TEST(Checkpoint, StreamStatesNeedTheSameWorkers) {
  auto data = std::make_shared<testing::CountingStream>(23, true, true);
  DataLoader first(data, {.batch_size = 4, .seed = 2});
  const std::string mid = testing::run_until(first, 2).second;
  DataLoader two(data, {.batch_size = 4, .num_workers = 2, .seed = 2});  // no worker starts
  const std::string before = two.state();
  EXPECT_THAT([&] { two.load_state(mid, "s.json"); },
              ::testing::ThrowsMessage<ConfigError>(
                  AllOf(HasSubstr("s.json: 'streams'"), HasSubstr("num_workers = 0 or 1"))));
  EXPECT_EQ(two.state(), before);
  DataLoader start(data, {.batch_size = 4, .seed = 2});
  two.load_state(start.state());  // the start of epoch 0: any number of workers
  EXPECT_EQ(two.epoch(), 0u);
  std::string map_state = DataLoader(std::make_shared<RangeDataset>(5), {.seed = 2}).state();
  EXPECT_THAT([&] { two.load_state(map_state); },
              ::testing::ThrowsMessage<ConfigError>(HasSubstr("'dataset.kind'")));
}

TEST(Checkpoint, StateIsSmallAndReadable) {
  auto data = std::make_shared<RangeDataset>(1'000'000'000);
  DataLoader loader(data, {.batch_size = 256, .shuffle = true, .seed = 3});
  const std::string state = loader.state();  // before any epoch: draws no permutation
  EXPECT_LT(state.size(), 4096u) << state;
  EXPECT_THAT(state, HasSubstr("\"format\": \"ferry.loader_state\""));
  EXPECT_THAT(state, HasSubstr("\"epoch\": 0"));
  EXPECT_THAT(state, HasSubstr("\"position\": 0"));
  EXPECT_THAT(state, HasSubstr("\"size\": 1000000000"));
  // Inside a later epoch it also holds the shuffle's generator at that epoch's start (so a
  // resume draws one permutation, not one per earlier epoch), and stays under 4 KB.
  DataLoader shuffled(std::make_shared<RangeDataset>(100'000),
                      {.batch_size = 256, .shuffle = true, .seed = 3});
  shuffled.set_epoch(4);
  auto it = shuffled.begin();
  const std::string later = shuffled.state();
  EXPECT_LT(later.size(), 4096u) << later;
  EXPECT_THAT(later, HasSubstr("\"mt19937\": \""));
  EXPECT_THAT(later, HasSubstr("\"epoch\": 4"));
}

// A sampler resumed from its generator's snapshot draws what a sampler that drew every epoch
// does, for the snapshot's epoch and the ones after it, and also when asked for earlier ones.
TEST(Checkpoint, GeneratorSnapshotsContinueExactly) {
  RandomSampler drawn(1000, 7);
  for (std::uint64_t e = 0; e < 3; ++e) (void)drawn.indices(e);
  RandomSampler resumed(1000, 7);
  resumed.load_state(drawn.state(), 3, 0);
  RandomSampler reference(1000, 7);
  for (std::uint64_t e : {3, 4, 5, 1, 2, 6}) {
    EXPECT_EQ(resumed.indices(e), reference.indices(e)) << "epoch " << e;
  }
}

TEST(Checkpoint, OutOfOrderReceiptsAreNotDeliveredAgain) {
  auto data = std::make_shared<RangeDataset>(kSize);
  const DataLoaderOptions options{.batch_size = 4, .shuffle = true, .seed = 2};
  DataLoader reference_loader(data, options);
  const auto reference = testing::run_through(reference_loader, 0);
  // A state as an out-of-order loader writes it: batches 0 and 1 consumed, then 3 and 4.
  DataLoader first(data, options);
  auto [before, state] = testing::run_until(first, 2);
  const auto at = state.find("\"received_beyond\": []");
  ASSERT_NE(at, std::string::npos) << state;
  state.replace(at, 21, "\"received_beyond\": [3, 4]");
  DataLoader resumed(data, options);
  resumed.load_state(state);
  std::vector<Delivered> after;
  for (auto& batch : resumed) after.push_back(testing::record(batch));
  ASSERT_EQ(after.size(), 2u);  // batches 2 and 5
  EXPECT_EQ(after[0].sequence, 2u);
  EXPECT_EQ(after[1].sequence, 5u);
  EXPECT_EQ(after[0].indices, reference[2].indices);
  EXPECT_EQ(after[1].indices, reference[5].indices);
}

// Ranks in step: `world` loaders of one DistributedSampler each consume `consumed` batches.
std::vector<std::int64_t> consumed_by(std::size_t world,
                                      std::size_t consumed,
                                      std::size_t n,
                                      bool drop_last,
                                      std::string* state_of_rank0) {
  auto data = std::make_shared<RangeDataset>(n);
  std::vector<std::int64_t> out;
  for (std::size_t r = 0; r < world; ++r) {
    DataLoader loader(
        data, {.batch_size = 3, .seed = 1},
        std::make_shared<DistributedSampler>(
            n, DistributedSampler::Options{
                   .num_replicas = world, .rank = r, .seed = 9, .drop_last = drop_last}));
    auto [before, state] = testing::run_until(loader, consumed);
    for (const auto& d : before) out.insert(out.end(), d.indices.begin(), d.indices.end());
    if (r == 0) *state_of_rank0 = state;
  }
  return out;
}

class ElasticRanks : public ::testing::TestWithParam<std::tuple<std::size_t, bool>> {};

// 4 ranks consume 2 batches each, then the job resumes at another world size: across all
// ranks, the rest of the epoch is delivered exactly once (plus the padding a DistributedSampler
// always adds, within the remainder), every rank yields the same number of batches, and the next
// epoch is PyTorch's split for the new world.
TEST_P(ElasticRanks, TheRestOfTheEpochExactlyOnce) {
  const auto [world, drop_last] = GetParam();
  constexpr std::size_t n = 50;
  std::string state;
  std::vector<std::int64_t> all = consumed_by(4, 2, n, drop_last, &state);
  ASSERT_EQ(all.size(), 4u * 2 * 3);
  auto data = std::make_shared<RangeDataset>(n);
  std::vector<std::size_t> counts;
  std::vector<std::int64_t> rest;
  for (std::size_t r = 0; r < world; ++r) {
    auto sampler = std::make_shared<DistributedSampler>(
        n, DistributedSampler::Options{
               .num_replicas = world, .rank = r, .seed = 9, .drop_last = drop_last});
    DataLoader loader(data, {.batch_size = 3, .seed = 1}, sampler);
    loader.load_state(state);
    ASSERT_EQ(loader.epoch(), 0u);
    std::size_t batches = 0;
    for (auto& batch : loader) {
      rest.insert(rest.end(), batch.indices().begin(), batch.indices().end());
      ++batches;
    }
    counts.push_back(batches);
    // The next epoch: PyTorch's DistributedSampler for this world, untouched by the resume.
    DistributedSampler plain(n,
                             {.num_replicas = world, .rank = r, .seed = 9, .drop_last = drop_last});
    std::vector<std::int64_t> next;
    for (auto& batch : loader)
      next.insert(next.end(), batch.indices().begin(), batch.indices().end());
    EXPECT_EQ(next, plain.indices(1)) << "rank " << r;
  }
  EXPECT_EQ(std::count(counts.begin(), counts.end(), counts.front()),
            static_cast<std::ptrdiff_t>(world))
      << "ranks yield different numbers of batches";
  // What the 4-rank epoch held (drop_last cut its tail) less what was consumed.
  const std::size_t epoch_end = drop_last ? DistributedSampler::per_rank(n, 4, true) * 4 : n;
  const std::size_t remaining = epoch_end - all.size();
  const std::size_t expected_rest =
      drop_last ? remaining / world * world : (remaining + world - 1) / world * world;
  EXPECT_EQ(rest.size(), expected_rest);
  all.insert(all.end(), rest.begin(), rest.end());
  std::map<std::int64_t, int> times;
  for (const auto i : all) ++times[i];
  std::size_t missing = 0;
  std::size_t repeated = 0;
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(n); ++i) {
    missing += times[i] == 0;
    repeated += times[i] > 1 ? static_cast<std::size_t>(times[i] - 1) : 0;
  }
  if (drop_last) {
    EXPECT_EQ(repeated, 0u);
    // The tails drop_last cuts, at 4 ranks and again at the new world size, as PyTorch does.
    EXPECT_EQ(missing, (n - epoch_end) + (remaining - expected_rest));
  } else {
    EXPECT_EQ(missing, 0u);
    EXPECT_EQ(repeated, expected_rest - remaining);  // the padding, and nothing more
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes,
                         ElasticRanks,
                         ::testing::Combine(::testing::Values<std::size_t>(2, 4, 6),
                                            ::testing::Bool()));

// A state saved out of order past a gap names positions of its own world's split: refused at
// another world size, with the loader unchanged. At position 0 another world size starts the
// epoch with PyTorch's split for it (drop_last cut for the new world, not the old one).
TEST(ElasticRanks, OutOfOrderGapsNeedTheSameWorldAndPositionZeroIsAFreshSplit) {
  constexpr std::size_t n = 10;
  auto data = std::make_shared<RangeDataset>(n);
  auto loader_for = [&](std::size_t world) {
    return DataLoader(data, {.batch_size = 1, .seed = 1},
                      std::make_shared<DistributedSampler>(
                          n, DistributedSampler::Options{
                                 .num_replicas = world, .rank = 0, .seed = 9, .drop_last = true}));
  };
  DataLoader four = loader_for(4);
  std::string state = four.state();
  const auto at = state.find("\"received_beyond\": []");
  ASSERT_NE(at, std::string::npos);
  std::string gap = state;
  gap.replace(at, 21, "\"received_beyond\": [1]");
  DataLoader three = loader_for(3);
  const std::string before = three.state();
  EXPECT_THAT([&] { three.load_state(gap); },
              ::testing::ThrowsMessage<ConfigError>(HasSubstr("at world size 4")));
  EXPECT_EQ(three.state(), before);
  three.load_state(state);
  std::vector<std::int64_t> got;
  for (auto& batch : three) got.insert(got.end(), batch.indices().begin(), batch.indices().end());
  DistributedSampler plain(n, {.num_replicas = 3, .rank = 0, .seed = 9, .drop_last = true});
  EXPECT_EQ(got, plain.indices(0));
  EXPECT_EQ(got.size(), 3u);
}

// Resumed at world size 2, interrupted again inside the re-split epoch: the same world continues
// bitwise; another (3) splits what is left once more, still exactly once.
TEST(ElasticRanks, ResumesTwice) {
  constexpr std::size_t n = 61;
  std::string state;
  std::vector<std::int64_t> all = consumed_by(4, 1, n, false, &state);
  auto data = std::make_shared<RangeDataset>(n);
  auto loader_for = [&](std::size_t world, std::size_t r) {
    return DataLoader(
        data, {.batch_size = 3, .seed = 1},
        std::make_shared<DistributedSampler>(
            n, DistributedSampler::Options{.num_replicas = world, .rank = r, .seed = 9}));
  };
  std::string second;
  for (std::size_t r = 0; r < 2; ++r) {
    DataLoader loader = loader_for(2, r);
    loader.load_state(state);
    DataLoader uninterrupted = loader_for(2, r);
    uninterrupted.load_state(state);
    const auto reference = testing::run_through(uninterrupted, 0);
    auto [before, mid] = testing::run_until(loader, 2);
    for (const auto& d : before) all.insert(all.end(), d.indices.begin(), d.indices.end());
    if (r == 0) second = mid;
    DataLoader again = loader_for(2, r);
    again.load_state(mid);
    testing::expect_continuation(reference, before, testing::run_through(again, 0), true);
  }
  std::size_t batches = 0;
  for (std::size_t r = 0; r < 3; ++r) {
    DataLoader loader = loader_for(3, r);
    loader.load_state(second);
    for (auto& batch : loader) {
      all.insert(all.end(), batch.indices().begin(), batch.indices().end());
      ++batches;
    }
  }
  std::map<std::int64_t, int> times;
  for (const auto i : all) ++times[i];
  EXPECT_EQ(times.size(), n) << "a sample was lost";
  std::size_t extra = all.size() - n;
  EXPECT_LE(extra, 2u + 1u + 2u) << "more repeats than the three splits' padding";
}

// on_error = skip leaves a whole batch out on one rank: that rank still yields it (empty), so
// every rank yields the same number of batches.
TEST(Checkpoint, RanksStayInStepWhenABatchIsSkippedWhole) {
  constexpr std::size_t n = 24;
  auto sequence_of = [](std::size_t r) {
    DistributedSampler s(n, {.num_replicas = 2, .rank = r, .shuffle = false});
    return s.indices(0);
  };
  // Rank 1's second batch (batch_size 3) is indices 7, 9, 11 with shuffle off: all of them fail.
  ASSERT_EQ(sequence_of(1)[3], 7);
  ASSERT_EQ(sequence_of(1)[5], 11);
  std::vector<std::size_t> counts;
  for (std::size_t r = 0; r < 2; ++r) {
    auto data = std::make_shared<testing::FailingDataset>(n, 7, 12);
    DataLoader loader(
        data, {.batch_size = 3, .seed = 0, .on_error = OnError::kSkip},
        std::make_shared<DistributedSampler>(
            n, DistributedSampler::Options{.num_replicas = 2, .rank = r, .shuffle = false}));
    std::size_t batches = 0;
    for (auto& batch : loader) {
      if (r == 1 && batch.sequence() == 1) {
        EXPECT_EQ(batch.size(), 0u);
        EXPECT_EQ(batch.num_fields(), 0u);
      }
      ++batches;
    }
    counts.push_back(batches);
  }
  EXPECT_EQ(counts[0], counts[1]);
  EXPECT_EQ(counts[0], 4u);
}

TEST(Checkpoint, BadStatesNameTheFieldAndLeaveTheLoaderAsItWas) {
  auto data = std::make_shared<RangeDataset>(kSize);
  const DataLoaderOptions options{.batch_size = 4, .shuffle = true, .seed = 5};
  DataLoader first(data, options);
  const std::string good = testing::run_until(first, 3).second;

  DataLoader loader(data, options);
  const auto reference = testing::run_through(loader, 0);
  loader.set_epoch(0);
  const std::string before = loader.state();
  auto expect_refused = [&](const std::string& text, const std::string& says) {
    try {
      loader.load_state(text, "ckpt.json");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const ConfigError& e) {
      EXPECT_THAT(e.what(), HasSubstr("ckpt.json: "));
      EXPECT_THAT(e.what(), HasSubstr(says));
    }
    EXPECT_EQ(loader.state(), before) << "a refused state changed the loader";
  };
  auto edit = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const auto at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  expect_refused(good.substr(0, good.size() / 2), "not valid JSON");
  expect_refused("", "not valid JSON");
  expect_refused("[1, 2]", "not an object");
  expect_refused(edit("\"seed\": 5", "\"seed\": 6"), "'seed'");
  expect_refused(edit("\"version\": 1", "\"version\": 2"), "newer ferry");
  expect_refused(edit("\"format\": \"ferry.loader_state\"", "\"format\": \"x\""), "'format'");
  expect_refused(edit("\"batch_size\": 4", "\"batch_size\": 8"), "'batch_size'");
  expect_refused(edit("\"position\": 3", "\"position\": 99"), "'position'");
  expect_refused(edit("\"position\": 3", "\"position\": \"3\""), "'position'");
  expect_refused(edit("\"position\": 3", "\"place\": 3"), "'position' is missing");
  expect_refused(edit("\"received_beyond\": []", "\"received_beyond\": [2]"), "'received_beyond'");
  expect_refused(edit("\"type\": \"random\"", "\"type\": \"sequential\""), "'sampler.type'");
  expect_refused(edit("\"mt19937\": \"", "\"mt19937\": \"////"), "'sampler.generator");
  expect_refused(edit("\"mt19937\": \"", "\"mt19937\": \"%"), "'sampler.generator.mt19937'");
  {
    DataLoader other(std::make_shared<RangeDataset>(kSize + 1), options);
    EXPECT_THROW(
        {
          try {
            other.load_state(good, "ckpt.json");
          } catch (const ConfigError& e) {
            EXPECT_THAT(e.what(), HasSubstr("'dataset.size'"));
            throw;
          }
        },
        ConfigError);
  }
  // Still the loader it was: a whole epoch from the start.
  EXPECT_EQ(loader.epoch(), 0u);
  testing::expect_continuation(reference, {}, testing::run_through(loader, 0), true);
}

TEST(Checkpoint, SavesToAFileAtomicallyAndReadsItBack) {
  const std::filesystem::path folder =
      std::filesystem::temp_directory_path() / ("ferry-ckpt-" + std::to_string(::getpid()));
  std::filesystem::create_directories(folder);
  auto data = std::make_shared<RangeDataset>(kSize);
  const DataLoaderOptions options{.batch_size = 4, .shuffle = true, .seed = 5};
  DataLoader reference_loader(data, options);
  const auto reference = testing::run_through(reference_loader, 1);
  DataLoader first(data, options);
  std::vector<Delivered> before;
  for (auto it = first.begin(); it != first.end(); ++it) {
    before.push_back(testing::record(*it));
    first.save_state(folder / "loader.json");  // replaced every batch
    if (before.size() == 4) break;
  }
  // Listed as ferry lists folders: std::filesystem's directory iterators, which this test used,
  // are the likely cause of its crash against PyTorch's LibTorch 2.11 (support/files.h).
  EXPECT_EQ(testing::names_in(folder), std::vector<std::string>{"loader.json"})
      << "a temporary file was left behind";
  DataLoader resumed(data, options);
  resumed.load_state_file(folder / "loader.json");
  testing::expect_continuation(reference, before, testing::run_through(resumed, 1), true);
  try {
    resumed.load_state_file(folder / "missing.json");
    ADD_FAILURE() << "read a missing file";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("missing.json"));
  }
  EXPECT_THROW(resumed.save_state(folder / "no-such-folder" / "x.json"), Error);
  std::filesystem::remove_all(folder);
}

// The launchers' environments: each alone, nested, and contradicting.
class Launchers : public ::testing::Test {
 protected:
  void SetUp() override { clear(); }
  void TearDown() override { clear(); }
  static void clear() {
    for (const char* v :
         {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
          "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
          "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"}) {
      ::unsetenv(v);
    }
  }
  static void set(const char* name, const char* value) { ::setenv(name, value, 1); }
};

TEST_F(Launchers, NoneIsNone) { EXPECT_FALSE(launch_info().has_value()); }

TEST_F(Launchers, EachOneAlone) {
  set("RANK", "3");
  set("WORLD_SIZE", "8");
  set("LOCAL_RANK", "1");
  set("LOCAL_WORLD_SIZE", "2");
  auto info = launch_info();
  ASSERT_TRUE(info);
  EXPECT_EQ(info->source, "torchrun");
  EXPECT_EQ(info->rank, 3u);
  EXPECT_EQ(info->world_size, 8u);
  EXPECT_EQ(info->local_rank, 1u);
  EXPECT_EQ(info->local_world_size, 2u);
  clear();
  set("OMPI_COMM_WORLD_RANK", "2");
  set("OMPI_COMM_WORLD_SIZE", "4");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "2");
  info = launch_info();
  ASSERT_TRUE(info);
  EXPECT_EQ(info->source, "Open MPI");
  EXPECT_EQ(info->rank, 2u);
  EXPECT_EQ(info->local_rank, 2u);
  clear();
  set("SLURM_PROCID", "5");
  set("SLURM_NTASKS", "6");
  info = launch_info();
  ASSERT_TRUE(info);
  EXPECT_EQ(info->source, "Slurm");
  EXPECT_EQ(info->rank, 5u);
  // And a DistributedSampler takes them from there.
  DistributedSampler sampler(60);
  EXPECT_EQ(sampler.rank(), 5u);
  EXPECT_EQ(sampler.num_replicas(), 6u);
}

TEST_F(Launchers, InnermostWinsWhenNested) {
  set("SLURM_PROCID", "1");  // srun task 1 of 2, each running torchrun with 4 processes
  set("SLURM_NTASKS", "2");
  set("RANK", "6");
  set("WORLD_SIZE", "8");
  set("LOCAL_RANK", "2");
  auto info = launch_info();
  ASSERT_TRUE(info);
  EXPECT_EQ(info->source, "torchrun");
  EXPECT_EQ(info->rank, 6u);
  // torchrun straight inside an sbatch script: Slurm's variables are the batch step's.
  set("SLURM_PROCID", "0");
  set("SLURM_NTASKS", "8");
  info = launch_info();
  ASSERT_TRUE(info);
  EXPECT_EQ(info->rank, 6u);
  clear();
  set("SLURM_PROCID", "0");  // mpirun inside an sbatch script
  set("SLURM_NTASKS", "4");
  set("OMPI_COMM_WORLD_RANK", "3");
  set("OMPI_COMM_WORLD_SIZE", "4");
  info = launch_info();
  ASSERT_TRUE(info);
  EXPECT_EQ(info->source, "Open MPI");
  EXPECT_EQ(info->rank, 3u);
}

TEST_F(Launchers, ContradictionsNameBoth) {
  set("RANK", "0");  // stale, exported in the shell
  set("WORLD_SIZE", "1");
  set("OMPI_COMM_WORLD_RANK", "2");
  set("OMPI_COMM_WORLD_SIZE", "4");
  try {
    (void)launch_info();
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("RANK=0 WORLD_SIZE=1 (torchrun)"));
    EXPECT_THAT(e.what(), HasSubstr("OMPI_COMM_WORLD_RANK=2 OMPI_COMM_WORLD_SIZE=4 (Open MPI)"));
  }
  EXPECT_THROW(DistributedSampler(10), ConfigError);
  clear();
  set("RANK", "1");
  set("WORLD_SIZE", "4");
  set("SLURM_PROCID", "3");
  set("SLURM_NTASKS", "4");
  EXPECT_THROW(launch_info(), ConfigError);
  clear();
  set("RANK", "1");
  EXPECT_THROW(launch_info(), ConfigError);  // no WORLD_SIZE
  clear();
  set("WORLD_SIZE", "x");
  set("RANK", "0");
  EXPECT_THROW(launch_info(), ConfigError);
  clear();
  set("WORLD_SIZE", "2");
  set("RANK", "2");
  EXPECT_THROW(launch_info(), ConfigError);
}

}  // namespace
}  // namespace ferry
