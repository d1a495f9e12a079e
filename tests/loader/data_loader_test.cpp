#include "ferry/data_loader.h"

#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/error.h"

#include "support/datasets.h"

namespace ferry {
namespace {

using testing::CountingStream;
using testing::FailingDataset;
using ::testing::HasSubstr;
using testing::RangeDataset;
using ::testing::ThrowsMessage;

// The index lists of every batch of one epoch, checking each batch against its own indices.
std::vector<std::vector<std::int64_t>> epoch_indices(DataLoader& loader) {
  std::vector<std::vector<std::int64_t>> out;
  for (auto& batch : loader) {
    const auto& idx = batch.indices();
    EXPECT_EQ(batch.size(), idx.size());
    EXPECT_TRUE(batch["index"].equal(torch::tensor(idx, torch::kLong)));
    EXPECT_EQ(batch.sequence(), out.size());
    out.push_back(idx);
  }
  return out;
}

TEST(DataLoader, SequentialBatchesWithAShortLastBatch) {
  DataLoader loader(std::make_shared<RangeDataset>(10), {.batch_size = 4});
  EXPECT_EQ(loader.size(), 3u);
  const auto batches = epoch_indices(loader);
  EXPECT_EQ(batches, (std::vector<std::vector<std::int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}}));
}

TEST(DataLoader, DropLastDropsTheShortBatchAndSizeAgrees) {
  for (std::size_t n : {0u, 1u, 5u, 8u, 9u, 100u}) {
    for (std::size_t b : {1u, 3u, 8u}) {
      for (bool drop_last : {false, true}) {
        DataLoader loader(std::make_shared<RangeDataset>(n),
                          {.batch_size = b, .drop_last = drop_last});
        const auto batches = epoch_indices(loader);
        EXPECT_EQ(batches.size(), loader.size()) << n << " " << b << " " << drop_last;
        EXPECT_EQ(loader.size(), drop_last ? n / b : (n + b - 1) / b);
        for (const auto& batch : batches) {
          if (drop_last) {
            EXPECT_EQ(batch.size(), b);
          }
        }
      }
    }
  }
}

TEST(DataLoader, EmptyDatasetYieldsNoBatches) {
  for (bool shuffle : {false, true}) {
    DataLoader loader(std::make_shared<RangeDataset>(0), {.batch_size = 4, .shuffle = shuffle});
    EXPECT_EQ(loader.size(), 0u);
    EXPECT_TRUE(loader.begin() == loader.end());
  }
}

TEST(DataLoader, BatchLargerThanTheDataset) {
  DataLoader keep(std::make_shared<RangeDataset>(5), {.batch_size = 8});
  EXPECT_EQ(keep.size(), 1u);
  EXPECT_EQ(epoch_indices(keep), (std::vector<std::vector<std::int64_t>>{{0, 1, 2, 3, 4}}));
  DataLoader drop(std::make_shared<RangeDataset>(5), {.batch_size = 8, .drop_last = true});
  EXPECT_EQ(drop.size(), 0u);
  EXPECT_TRUE(epoch_indices(drop).empty());
}

TEST(DataLoader, CollatesFieldsIntoTensors) {
  DataLoader loader(std::make_shared<RangeDataset>(6), {.batch_size = 3});
  auto it = loader.begin();
  const Batch& b = *it;
  EXPECT_EQ(b["x"].sizes(), (std::vector<std::int64_t>{3, 2}));
  EXPECT_TRUE(b["x"].equal(torch::tensor({{0.f, 0.5f}, {1.f, 1.5f}, {2.f, 2.5f}})));
  EXPECT_EQ(b["noise"].sizes(), (std::vector<std::int64_t>{3, 3}));
}

TEST(DataLoader, ShuffleFollowsRandomSamplerAndChangesPerEpoch) {
  // DataLoader(shuffle=True, generator=g)'s orders: a RandomSampler on g that each iterator
  // first draws a base seed from (golden orders: multi_process_test.cpp).
  DataLoader loader(std::make_shared<RangeDataset>(20),
                    {.batch_size = 20, .shuffle = true, .seed = 42});
  EXPECT_EQ(loader.options().seed, 42u);
  RandomSampler reference(20, 42, {.loader_draw = RandomSampler::LoaderDraw::kEveryEpoch});
  const auto e0 = epoch_indices(loader);
  const auto e1 = epoch_indices(loader);
  EXPECT_EQ(e0.at(0), reference.indices(0));
  EXPECT_EQ(e1.at(0), reference.indices(1));
  EXPECT_NE(e0, e1);
}

TEST(DataLoader, SetEpochReachesTheSamplerAndTheSamples) {
  auto dataset = std::make_shared<RangeDataset>(16);
  DataLoader a(dataset, {.batch_size = 4, .shuffle = true, .seed = 3});
  DataLoader b(dataset, {.batch_size = 4, .shuffle = true, .seed = 3});
  epoch_indices(a);
  epoch_indices(a);  // a is now at epoch 2
  EXPECT_EQ(a.epoch(), 2u);
  b.set_epoch(2);
  auto ia = a.begin();
  auto ib = b.begin();
  for (; ia != a.end() && ib != b.end(); ++ia, ++ib) {
    EXPECT_EQ(ia->indices(), ib->indices());
    EXPECT_TRUE((*ia)["noise"].equal((*ib)["noise"]));
    EXPECT_EQ(ia->epoch(), 2u);
  }
  EXPECT_TRUE(ia == a.end() && ib == b.end());
}

TEST(DataLoader, SetEpochReachesADistributedSampler) {
  // pytorch#73141: LibTorch's loader never forwards the epoch. ferry's does.
  auto dataset = std::make_shared<RangeDataset>(40);
  auto sampler = std::make_shared<DistributedSampler>(
      40, DistributedSampler::Options{.num_replicas = 2, .rank = 1, .seed = 8});
  DataLoader loader(dataset, {.batch_size = 100}, sampler);
  loader.set_epoch(7);
  const auto got = epoch_indices(loader);
  DistributedSampler reference(40, {.num_replicas = 2, .rank = 1, .seed = 8});
  EXPECT_EQ(got.at(0), reference.indices(7));
  EXPECT_NE(got.at(0), reference.indices(0));
}

TEST(DataLoader, SampleRandomnessDependsOnSeedEpochIndexNotOnBatching) {
  // The same sample gets the same noise whatever the batch size or order (sequential vs shuffled).
  auto dataset = std::make_shared<RangeDataset>(12);
  std::map<std::int64_t, torch::Tensor> by_index;
  DataLoader small(dataset, {.batch_size = 1, .seed = 9});
  for (auto& batch : small) by_index[batch.indices()[0]] = batch["noise"][0].clone();
  DataLoader shuffled(dataset, {.batch_size = 5, .shuffle = true, .seed = 9});
  for (auto& batch : shuffled) {
    for (std::size_t i = 0; i < batch.size(); ++i) {
      EXPECT_TRUE(
          batch["noise"][static_cast<std::int64_t>(i)].equal(by_index.at(batch.indices()[i])));
    }
  }
  DataLoader other_seed(dataset, {.batch_size = 1, .seed = 10});
  EXPECT_FALSE((*other_seed.begin())["noise"][0].equal(by_index.at(0)));
}

TEST(DataLoader, IdenticalOutputForTheSameSeed) {
  auto dataset = std::make_shared<RangeDataset>(30);
  DataLoader a(dataset, {.batch_size = 7, .shuffle = true, .seed = 1});
  DataLoader b(dataset, {.batch_size = 7, .shuffle = true, .seed = 1});
  for (int epoch = 0; epoch < 2; ++epoch) {
    auto ia = a.begin();
    auto ib = b.begin();
    for (; ia != a.end(); ++ia, ++ib) {
      ASSERT_FALSE(ib == b.end());
      for (const std::string& name : *ia) EXPECT_TRUE((*ia)[name].equal((*ib)[name])) << name;
    }
  }
}

TEST(DataLoader, CustomSamplerBatchSamplerAndCollate) {
  auto dataset = std::make_shared<RangeDataset>(10);
  auto subset = std::make_shared<SubsetRandomSampler>(std::vector<std::int64_t>{1, 3, 5, 7}, 0);
  DataLoader with_sampler(dataset, {.batch_size = 2}, subset);
  std::multiset<std::int64_t> seen;
  for (auto& batch : with_sampler) seen.insert(batch.indices().begin(), batch.indices().end());
  EXPECT_EQ(seen, (std::multiset<std::int64_t>{1, 3, 5, 7}));

  auto batches = std::make_shared<BatchSampler>(std::make_shared<SequentialSampler>(10), 5, true);
  DataLoader with_batches(dataset, {}, batches);
  EXPECT_EQ(with_batches.size(), 2u);
  EXPECT_EQ(epoch_indices(with_batches).size(), 2u);

  CollateFn sum_x = [](std::vector<Example> samples) {
    Batch b(samples.size());
    torch::Tensor total = torch::zeros({2});
    for (const auto& s : samples) total += s["x"].tensor();
    b.set("sum", total);
    return b;
  };
  DataLoader with_collate(dataset, {.batch_size = 10}, sum_x);
  auto it = with_collate.begin();
  EXPECT_TRUE((*it)["sum"].allclose(torch::tensor({45.f, 50.f})));
  EXPECT_EQ(it->indices().size(), 10u);  // the loader records indices for user collates too
}

TEST(DataLoader, ADatasetErrorSurfacesAndIterationContinues) {
  // As PyTorch: the failing batch raises, the next call goes on with the following batch.
  DataLoader loader(std::make_shared<FailingDataset>(9, 3, 5), {.batch_size = 3});
  auto it = loader.begin();
  EXPECT_EQ(it->indices(), (std::vector<std::int64_t>{0, 1, 2}));
  ++it;
  ASSERT_FALSE(it == loader.end());
  EXPECT_THAT([&] { (void)*it; },
              ThrowsMessage<std::runtime_error>(HasSubstr("cannot load sample 3")));
  ++it;
  EXPECT_EQ(it->indices(), (std::vector<std::int64_t>{6, 7, 8}));
  ++it;
  EXPECT_TRUE(it == loader.end());
}

TEST(DataLoader, AnErrorInTheFirstBatchKeepsTheIteratorUsable) {
  DataLoader loader(std::make_shared<FailingDataset>(4, 0, 2), {.batch_size = 2});
  auto it = loader.begin();
  EXPECT_THROW((void)*it, std::runtime_error);
  ++it;
  EXPECT_EQ(it->indices(), (std::vector<std::int64_t>{2, 3}));
}

TEST(DataLoader, AnIndexOutsideTheDatasetIsADataError) {
  class Wild : public Sampler {
   public:
    std::size_t size() const override { return 1; }
    std::vector<std::int64_t> indices(std::uint64_t) override { return {12}; }
  };
  DataLoader loader(std::make_shared<RangeDataset>(10), {}, std::make_shared<Wild>());
  EXPECT_THAT([&] { (void)*loader.begin(); },
              ThrowsMessage<DataError>(HasSubstr("index 12 but the dataset has 10 samples")));
}

TEST(DataLoader, BatchesOutliveTheLoaderAndItsIteratorsEnd) {
  Batch kept;
  DataLoader::Iterator it;
  {
    DataLoader loader(std::make_shared<RangeDataset>(6), {.batch_size = 2});
    it = loader.begin();
    kept = *it;
  }
  EXPECT_TRUE(kept["index"].equal(torch::tensor({0, 1}, torch::kLong)));
  ++it;  // the loader is gone: the iterator says so instead of reading freed state
  EXPECT_THAT([&] { (void)*it; }, ThrowsMessage<LoaderClosed>(HasSubstr("keep the loader alive")));
}

TEST(DataLoader, IterableDatasetBatchesItsStream) {
  DataLoader loader(std::make_shared<CountingStream>(7), {.batch_size = 3});
  EXPECT_EQ(loader.size(), 3u);
  std::vector<std::int64_t> values;
  std::size_t batches = 0;
  for (auto& batch : loader) {
    ++batches;
    const auto v = batch["value"];
    for (std::int64_t i = 0; i < v.size(0); ++i) values.push_back(v[i].item<std::int64_t>());
  }
  EXPECT_EQ(batches, 3u);
  EXPECT_EQ(values, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6}));

  DataLoader drop(std::make_shared<CountingStream>(7), {.batch_size = 3, .drop_last = true});
  EXPECT_EQ(drop.size(), 2u);
  std::size_t n = 0;
  for (auto& batch : drop) n += batch.size();
  EXPECT_EQ(n, 6u);
}

TEST(DataLoader, IterableDatasetWithoutSizeHintHasNoSize) {
  DataLoader loader(std::make_shared<CountingStream>(7, false), {.batch_size = 3});
  EXPECT_THAT([&] { (void)loader.size(); }, ThrowsMessage<Error>(HasSubstr("size_hint()")));
  std::size_t n = 0;
  for (auto& batch : loader) n += batch.size();
  EXPECT_EQ(n, 7u);
}

TEST(DataLoader, PinMemoryWithoutCudaIsAConfigErrorNamingWhatIsMissing) {
  if (at::hasCUDA()) GTEST_SKIP() << "this machine has CUDA";
  for (const std::size_t workers : {0, 2}) {
    EXPECT_THAT(
        [&] {
          DataLoader(std::make_shared<RangeDataset>(4),
                     {.batch_size = 2, .num_workers = workers, .pin_memory = true});
        },
        ThrowsMessage<ConfigError>(::testing::AllOf(HasSubstr("pin_memory=true"),
                                                    HasSubstr("built without CUDA"),
                                                    HasSubstr("set pin_memory=false"))));
  }
}

}  // namespace
}  // namespace ferry

namespace ferry {
namespace {

TEST(DataLoader, ABoolFieldCollatesToABoolMask) {
  // As PyTorch's default_collate: a mask, not int64 0/1 (which would gather rows 0 and 1).
  class Flags : public Dataset {
   public:
    std::size_t size() const override { return 6; }
    Example get(std::size_t i, SampleContext&) const override {
      return {{"keep", i % 2 == 0}, {"i", static_cast<std::int64_t>(i)}};
    }
  };
  DataLoader loader(std::make_shared<Flags>(), {.batch_size = 6});
  auto it = loader.begin();
  const Batch& batch = *it;
  ASSERT_EQ(batch["keep"].scalar_type(), torch::kBool);
  EXPECT_EQ(batch["i"].index({batch["keep"]}).sum().item<std::int64_t>(), 0 + 2 + 4);
  EXPECT_EQ(Field(true).to_int(), 1);
}

TEST(DataLoaderStats, CountEverySkippedSampleAndListTheMostRecentOnes) {
  // 300 of 400 samples fail: all are counted, the last skipped_history are listed.
  DataLoader loader(std::make_shared<testing::FailingDataset>(400, 100, 400),
                    {.batch_size = 10, .on_error = OnError::kSkip, .skipped_history = 16});
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (auto& batch : loader) (void)batch;
  }
  const LoaderStats stats = loader.stats();
  EXPECT_EQ(stats.skipped, 600u);
  ASSERT_EQ(stats.skipped_samples.size(), 16u);
  EXPECT_EQ(stats.skipped_samples.front().index, 384);
  EXPECT_EQ(stats.skipped_samples.back().index, 399);
  EXPECT_EQ(stats.skipped_samples.back().epoch, 1u);
  DataLoader all(std::make_shared<testing::FailingDataset>(400, 100, 400),
                 {.batch_size = 10, .on_error = OnError::kSkip, .skipped_history = 0});
  for (auto& batch : all) (void)batch;
  EXPECT_EQ(all.stats().skipped_samples.size(), 300u);
}

}  // namespace
}  // namespace ferry
