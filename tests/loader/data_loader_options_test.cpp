// Every invalid option combination is refused before anything runs, naming the option, the
// value and the fix (PyTorch's rules; RELIABILITY.md row 31).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/data_loader.h"
#include "ferry/error.h"

#include "support/datasets.h"

namespace ferry {
namespace {

using ::testing::AllOf;
using testing::CountingStream;
using ::testing::HasSubstr;
using testing::RangeDataset;
using ::testing::ThrowsMessage;

auto dataset() { return std::make_shared<RangeDataset>(10); }

TEST(DataLoaderOptions, ResolveFillsPrefetchFactorAndSeed) {
  const auto o = resolve({.num_workers = 2});
  EXPECT_EQ(o.prefetch_factor, kDefaultPrefetchFactor);
  EXPECT_TRUE(o.seed.has_value());
  EXPECT_FALSE(resolve({}).prefetch_factor.has_value());
  EXPECT_EQ(resolve({.seed = 5}).seed, 5u);
  EXPECT_NE(resolve({}).seed, resolve({}).seed);  // drawn per loader, as PyTorch without generator
}

TEST(DataLoaderOptions, DefaultsFollowPyTorch) {
  const DataLoaderOptions o;
  EXPECT_EQ(o.batch_size, 1u);
  EXPECT_FALSE(o.shuffle);
  EXPECT_EQ(o.num_workers, 0u);
  EXPECT_FALSE(o.pin_memory);
  EXPECT_FALSE(o.drop_last);
  EXPECT_EQ(o.timeout.count(), 0);
  EXPECT_FALSE(o.persistent_workers);
  EXPECT_TRUE(o.in_order);
  EXPECT_FALSE(o.start_method.has_value());  // the process default, fork unless changed
  EXPECT_EQ(resolve({.num_workers = 2}).start_method, StartMethod::kFork);
  EXPECT_FALSE(resolve(o).start_method.has_value());  // no workers, no start method
  EXPECT_EQ(to_string(StartMethod::kForkserver), "forkserver");
}

TEST(DataLoaderOptions, AStartMethodWithoutWorkersIsAnError) {
  // As PyTorch's multiprocessing_context with num_workers=0: refused, not ignored.
  EXPECT_THAT([] { resolve({.start_method = StartMethod::kSpawn}); },
              ThrowsMessage<ConfigError>(HasSubstr("start_method=spawn needs worker processes")));
}

TEST(DataLoaderOptions, RejectsBatchSizeZero) {
  EXPECT_THAT([] { resolve({.batch_size = 0}); },
              ThrowsMessage<ConfigError>(HasSubstr("batch_size=0 is invalid; use a positive")));
  EXPECT_THAT([] { DataLoader(dataset(), {.batch_size = 0}); },
              ThrowsMessage<ConfigError>(HasSubstr("batch_size=0")));
}

TEST(DataLoaderOptions, RejectsPrefetchFactorWithoutWorkers) {
  EXPECT_THAT([] { resolve({.prefetch_factor = 4}); },
              ThrowsMessage<ConfigError>(
                  AllOf(HasSubstr("prefetch_factor=4"), HasSubstr("set num_workers > 0"))));
}

TEST(DataLoaderOptions, RejectsPersistentWorkersWithoutWorkers) {
  EXPECT_THAT([] { resolve({.persistent_workers = true}); },
              ThrowsMessage<ConfigError>(HasSubstr("persistent_workers=true needs worker")));
}

TEST(DataLoaderOptions, RejectsZeroPrefetchAndNegativeTimeout) {
  EXPECT_THAT([] { resolve({.num_workers = 1, .prefetch_factor = 0}); },
              ThrowsMessage<ConfigError>(HasSubstr("prefetch_factor=0")));
  EXPECT_THAT([] { resolve({.timeout = std::chrono::milliseconds(-5)}); },
              ThrowsMessage<ConfigError>(HasSubstr("timeout=-5 ms is negative")));
}

TEST(DataLoaderOptions, SampleTimeoutNeedsWorkersAndIsNotNegative) {
  using std::chrono::milliseconds;
  EXPECT_THAT(
      [] { resolve({.sample_timeout = milliseconds(500)}); },
      ThrowsMessage<ConfigError>(HasSubstr("sample_timeout=500 ms needs worker processes")));
  EXPECT_THAT([] { resolve({.num_workers = 1, .sample_timeout = milliseconds(-1)}); },
              ThrowsMessage<ConfigError>(HasSubstr("sample_timeout=-1 ms is negative")));
  EXPECT_NO_THROW(resolve({.num_workers = 1, .sample_timeout = milliseconds(500)}));
}

TEST(DataLoaderOptions, RejectsBatchSamplerWithBatchSizeShuffleSamplerOrDropLast) {
  auto bs = std::make_shared<BatchSampler>(std::make_shared<SequentialSampler>(10), 4, false);
  const auto msg =
      HasSubstr("batch_sampler is mutually exclusive with batch_size, shuffle, sampler");
  EXPECT_THAT([&] { DataLoader(dataset(), {.batch_size = 4}, bs); },
              ThrowsMessage<ConfigError>(msg));
  EXPECT_THAT([&] { DataLoader(dataset(), {.shuffle = true}, bs); },
              ThrowsMessage<ConfigError>(msg));
  EXPECT_THAT([&] { DataLoader(dataset(), {.drop_last = true}, bs); },
              ThrowsMessage<ConfigError>(msg));
  EXPECT_NO_THROW(DataLoader(dataset(), {}, bs));
  EXPECT_NO_THROW(DataLoader(dataset(), {.batch_size = 1}, bs));  // as PyTorch: 1 is the default
}

TEST(DataLoaderOptions, RejectsShuffleWithASampler) {
  auto sampler = std::make_shared<SequentialSampler>(10);
  EXPECT_THAT([&] { DataLoader(dataset(), {.shuffle = true}, sampler); },
              ThrowsMessage<ConfigError>(HasSubstr("shuffle=true together with a sampler")));
}

TEST(DataLoaderOptions, RejectsSamplersAndShuffleWithAnIterableDataset) {
  auto stream = std::make_shared<CountingStream>(10);
  EXPECT_THAT([&] { DataLoader(stream, {.shuffle = true}); },
              ThrowsMessage<ConfigError>(HasSubstr("shuffle=true with an IterableDataset")));
  EXPECT_THAT([&] { DataLoader(stream, {}, std::make_shared<SequentialSampler>(10)); },
              ThrowsMessage<ConfigError>(HasSubstr("sampler given with an IterableDataset")));
  auto bs = std::make_shared<BatchSampler>(std::make_shared<SequentialSampler>(10), 2, false);
  EXPECT_THAT([&] { DataLoader(stream, {}, bs); },
              ThrowsMessage<ConfigError>(HasSubstr("batch_sampler given with an IterableDataset")));
}

TEST(DataLoaderOptions, RejectsACudaDeviceWithoutCuda) {
  if (at::hasCUDA()) GTEST_SKIP() << "this machine has CUDA";
  EXPECT_THAT([] { DataLoader(dataset(), {.device = torch::Device(torch::kCUDA)}); },
              ThrowsMessage<ConfigError>(::testing::AllOf(HasSubstr("device=cuda"),
                                                          HasSubstr("built without CUDA"),
                                                          HasSubstr("cmake_prefix_path"))));
  EXPECT_THAT([] { DataLoader(dataset(), {.num_workers = 1, .device = torch::Device("cuda:1")}); },
              ThrowsMessage<ConfigError>(HasSubstr("device=cuda:1")));
}

TEST(DataLoaderOptions, RejectsADeviceThatIsNeitherCpuNorCuda) {
  EXPECT_THAT([] { DataLoader(dataset(), {.device = torch::Device("meta")}); },
              ThrowsMessage<ConfigError>(HasSubstr("use cuda, cuda:N or cpu")));
}

TEST(DataLoaderOptions, ACpuDeviceNeedsNoCuda) {
  DataLoader loader(dataset(), {.batch_size = 4, .device = torch::Device(torch::kCPU)});
  std::size_t tensors = 0;
  for (auto& batch : loader) {
    for (const auto& name : batch) {
      if (!batch.is_tensor(name)) continue;
      EXPECT_TRUE(batch[name].device().is_cpu()) << name;
      ++tensors;
    }
  }
  EXPECT_GT(tensors, 0u);
  EXPECT_EQ(loader.stats().batches, loader.size());
}

TEST(DataLoaderOptions, NullObjectsAreRefused) {
  EXPECT_THAT([] { DataLoader(std::shared_ptr<const Dataset>(), {}); },
              ThrowsMessage<ConfigError>(HasSubstr("dataset is null")));
  EXPECT_THAT([] { DataLoader(dataset(), {}, std::shared_ptr<BatchSampler>()); },
              ThrowsMessage<ConfigError>(HasSubstr("batch_sampler is null")));
}

}  // namespace
}  // namespace ferry
