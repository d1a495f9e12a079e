// The multi-process engine: exactly-once delivery, order, identity with num_workers = 0,
// zero-copy batches that stay intact while held, persistent workers and epochs, iterable
// datasets. Fault scenarios live in fault_test.cpp.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/data_loader.h"
#include "ferry/error.h"
#include "ferry/registry.h"

#include "support/datasets.h"
#include "support/ledger.h"
#include "support/registered.h"
#include "support/start_methods.h"

namespace ferry {
namespace {

using testing::CountingStream;
using ::testing::HasSubstr;
using testing::LedgerDataset;
using testing::RangeDataset;
using ::testing::ThrowsMessage;

struct MatrixCase {
  std::size_t workers;
  bool in_order;
  bool persistent;
  StartMethod method = StartMethod::kFork;
};

std::string name_of(const ::testing::TestParamInfo<MatrixCase>& info) {
  return std::string(to_string(info.param.method)) + "_w" + std::to_string(info.param.workers) +
         (info.param.in_order ? "_ordered" : "_unordered") +
         (info.param.persistent ? "_persistent" : "_transient");
}

class ExactlyOnce : public ::testing::TestWithParam<MatrixCase> {};

TEST_P(ExactlyOnce, EveryIndexOnceEveryByteRightInSamplerOrder) {
  const auto p = GetParam();
  constexpr std::size_t kSize = 203;
  constexpr std::size_t kBatch = 8;
  // Random per-sample delays, and worker 0 ten times slower: the order check is real.
  auto dataset = testing::ledger(kSize, 100, 300, 0, 10);
  DataLoader loader(dataset, {.batch_size = kBatch,
                              .shuffle = true,
                              .num_workers = p.workers,
                              .persistent_workers = p.persistent,
                              .in_order = p.in_order,
                              .seed = 17,
                              .start_method = p.method});
  for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
    // shuffle's orders: DataLoader(shuffle=True, generator=g)'s (a base seed drawn first).
    const auto draw = p.persistent ? RandomSampler::LoaderDraw::kFirstEpoch
                                   : RandomSampler::LoaderDraw::kEveryEpoch;
    const auto expected = BatchSampler(std::make_shared<RandomSampler>(
                                           kSize, 17, RandomSampler::Options{.loader_draw = draw}),
                                       kBatch, false)
                              .batches(epoch);
    std::vector<int> seen(kSize, 0);
    std::vector<std::vector<std::int64_t>> order;
    std::set<std::int64_t> workers_used;
    for (auto& batch : loader) {
      ASSERT_EQ(batch.epoch(), epoch);
      const auto& idx = batch.indices();
      order.push_back(idx);
      const auto payload = batch["payload"];
      for (std::size_t r = 0; r < idx.size(); ++r) {
        const auto row = static_cast<std::int64_t>(r);
        ASSERT_EQ(batch["index"][row].item<std::int64_t>(), idx[r]);
        ASSERT_EQ(batch["epoch"][row].item<std::int64_t>(), static_cast<std::int64_t>(epoch));
        ASSERT_EQ(LedgerDataset::check_row(payload, row, idx[r], epoch), "");
        ASSERT_NE(batch["pid"][row].item<std::int64_t>(), ::getpid()) << "loaded in a worker";
        workers_used.insert(batch["worker"][row].item<std::int64_t>());
        ++seen[static_cast<std::size_t>(idx[r])];
      }
    }
    for (std::size_t i = 0; i < kSize; ++i) ASSERT_EQ(seen[i], 1) << "index " << i;
    EXPECT_EQ(order.size(), loader.size());
    if (p.in_order) {
      EXPECT_EQ(order, expected);
    } else {
      // Each batch is still one sampler chunk.
      std::set<std::vector<std::int64_t>> got(order.begin(), order.end());
      EXPECT_EQ(got, std::set<std::vector<std::int64_t>>(expected.begin(), expected.end()));
    }
    EXPECT_EQ(workers_used.size(), p.workers);
  }
}

std::vector<MatrixCase> matrix() {
  std::vector<MatrixCase> cases;
  for (const auto method : {StartMethod::kFork, StartMethod::kSpawn, StartMethod::kForkserver}) {
    // spawn starts a program per worker (LibTorch's start-up, about 0.4 s of CPU each): the
    // delivery logic it shares with fork is covered at every worker count there; spawn keeps the
    // two-worker column, where its workers race each other.
    const std::vector<std::size_t> counts = method == StartMethod::kSpawn
                                                ? std::vector<std::size_t>{2}
                                                : std::vector<std::size_t>{1, 2, 4};
    for (const std::size_t workers : counts) {
      for (const bool in_order : {true, false}) {
        for (const bool persistent : {false, true}) {
          cases.push_back({workers, in_order, persistent, method});
        }
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Matrix, ExactlyOnce, ::testing::ValuesIn(matrix()), name_of);

FERRY_EACH_START_METHOD(MultiProcess);

TEST_P(MultiProcess, BatchesAreBitwiseIdenticalToInProcessLoading) {
  auto dataset = testing::ledger(97, 64);
  for (std::size_t workers : {1u, 3u}) {
    DataLoader reference(dataset, {.batch_size = 5, .shuffle = true, .seed = 4});
    DataLoader multi(dataset,
                     {.batch_size = 5, .shuffle = true, .num_workers = workers, .seed = 4});
    for (int epoch = 0; epoch < 2; ++epoch) {
      auto a = reference.begin();
      auto b = multi.begin();
      std::size_t n = 0;
      for (; a != reference.end(); ++a, ++b, ++n) {
        ASSERT_FALSE(b == multi.end());
        EXPECT_EQ(a->indices(), b->indices());
        for (const char* name : {"payload", "index", "epoch", "noise"}) {
          EXPECT_TRUE((*a)[name].equal((*b)[name])) << name << " batch " << n;
        }
      }
      EXPECT_TRUE(b == multi.end());
    }
  }
}

TEST_P(MultiProcess, BatchesPointIntoSharedMemoryWithoutACopy) {
  DataLoader loader(testing::ledger(16, 4096), {.batch_size = 4, .num_workers = 1});
  auto it = loader.begin();
  const Batch& b = *it;
  // All fields of a batch live in one segment: their data pointers are close together.
  const auto base = reinterpret_cast<std::uintptr_t>(b["payload"].data_ptr());
  const auto other = reinterpret_cast<std::uintptr_t>(b["index"].data_ptr());
  EXPECT_LT(other - base, 4u * 4096 + 4096);
  EXPECT_EQ(base % 64, 0u);
}

TEST_P(MultiProcess, HeldBatchesStayIntactWhileTheLoaderGoesOnAndAfterItIsGone) {
  // RELIABILITY row 32: keep every batch, keep reading, then check every kept byte.
  std::vector<Batch> kept;
  {
    DataLoader loader(testing::ledger(300, 512),
                      {.batch_size = 3, .num_workers = 2, .persistent_workers = true});
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (auto& batch : loader) kept.push_back(batch);
    }
  }
  ASSERT_EQ(kept.size(), 200u);
  for (const Batch& batch : kept) {
    for (std::size_t r = 0; r < batch.size(); ++r) {
      ASSERT_EQ(LedgerDataset::check_row(batch["payload"], static_cast<std::int64_t>(r),
                                         batch.indices()[r], batch.epoch()),
                "");
    }
  }
}

TEST_P(MultiProcess, SegmentsAreRecycledWhenBatchesAreReleased) {
  // With batches released as they go, a worker needs at most a handful of segments: the memfds
  // this process maps stay bounded over many batches.
  DataLoader loader(testing::ledger(2000, 1024), {.batch_size = 4, .num_workers = 2});
  std::size_t n = 0;
  for (auto& batch : loader) n += batch.size();
  EXPECT_EQ(n, 2000u);
}

TEST_P(MultiProcess, PersistentWorkersKeepTheirPidsAcrossEpochs) {
  DataLoader loader(testing::ledger(40),
                    {.batch_size = 4, .num_workers = 2, .persistent_workers = true});
  std::set<std::int64_t> pids[3];
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (auto& batch : loader) {
      for (std::int64_t r = 0; r < batch["pid"].size(0); ++r)
        pids[epoch].insert(batch["pid"][r].item<std::int64_t>());
    }
  }
  EXPECT_EQ(pids[0].size(), 2u);
  EXPECT_EQ(pids[0], pids[1]);
  EXPECT_EQ(pids[1], pids[2]);
}

TEST_P(MultiProcess, TransientWorkersAreNewEachEpoch) {
  DataLoader loader(testing::ledger(8), {.batch_size = 4, .num_workers = 1});
  std::set<std::int64_t> pids;
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (auto& batch : loader) pids.insert(batch["pid"][0].item<std::int64_t>());
  }
  EXPECT_EQ(pids.size(), 2u);
}

TEST_P(MultiProcess, BreakMidEpochThenTheNextEpochIsExactlyOnceWithNoStaleBatch) {
  // RELIABILITY row 10 with persistent workers: prefetched batches of the broken-off epoch
  // never leak into the next one.
  auto dataset = testing::ledger(64, 64, 200);
  DataLoader loader(dataset, {.batch_size = 2,
                              .shuffle = true,
                              .num_workers = 3,
                              .prefetch_factor = 4,
                              .persistent_workers = true,
                              .seed = 1});
  for (int round = 0; round < 3; ++round) {
    for (auto& batch : loader) {
      (void)batch;
      break;  // prefetch is full of this epoch's batches
    }
    std::vector<int> seen(64, 0);
    const std::uint64_t epoch = loader.epoch();
    for (auto& batch : loader) {
      ASSERT_EQ(batch.epoch(), epoch);
      for (std::int64_t r = 0; r < batch["epoch"].size(0); ++r) {
        ASSERT_EQ(batch["epoch"][r].item<std::int64_t>(), static_cast<std::int64_t>(epoch));
        ++seen[static_cast<std::size_t>(batch["index"][r].item<std::int64_t>())];
      }
    }
    for (int s : seen) ASSERT_EQ(s, 1);
  }
}

TEST_P(MultiProcess, ReusingAnEpochNumberNeverDeliversTheEarlierIteratorsBatches) {
  // Regression: staleness was judged by epoch number, and set_epoch() can repeat one. A sampler
  // whose order flips on every call makes a stale batch visible.
  class Flipping : public Sampler {
   public:
    std::size_t size() const override { return 48; }
    std::vector<std::int64_t> indices(std::uint64_t) override {
      std::vector<std::int64_t> out(48);
      for (std::int64_t i = 0; i < 48; ++i)
        out[static_cast<std::size_t>(i)] = flipped_ ? 47 - i : i;
      flipped_ = !flipped_;
      return out;
    }

   private:
    bool flipped_ = false;
  };
  auto sampler = std::make_shared<Flipping>();
  DataLoader loader(
      testing::ledger(48, 64, 300),
      {.batch_size = 2, .num_workers = 2, .prefetch_factor = 4, .persistent_workers = true},
      sampler);
  loader.set_epoch(0);
  {
    auto it = loader.begin();  // order 0, 1, 2, ...; break with every prefetch slot full
    ++it;
  }
  loader.set_epoch(0);
  std::vector<std::int64_t> got;
  for (auto& batch : loader) {
    for (auto i : batch.indices()) got.push_back(i);
    for (std::int64_t r = 0; r < batch["index"].size(0); ++r) {
      EXPECT_EQ(batch["index"][r].item<std::int64_t>(),
                batch.indices()[static_cast<std::size_t>(r)]);
    }
  }
  std::vector<std::int64_t> expected(48);
  for (std::int64_t i = 0; i < 48; ++i) expected[static_cast<std::size_t>(i)] = 47 - i;
  EXPECT_EQ(got, expected);
}

TEST_P(MultiProcess, ReusingAnEpochNumberRestartsIterableStreams) {
  DataLoader loader(testing::counting(20),
                    {.batch_size = 2, .num_workers = 2, .persistent_workers = true});
  loader.set_epoch(3);
  {
    auto it = loader.begin();
    ++it;
  }
  loader.set_epoch(3);
  std::multiset<std::int64_t> values;
  for (auto& batch : loader) {
    const auto v = batch["value"];
    for (std::int64_t i = 0; i < v.size(0); ++i) values.insert(v[i].item<std::int64_t>());
  }
  std::multiset<std::int64_t> expected;
  for (std::int64_t i = 0; i < 20; ++i) expected.insert(i);
  EXPECT_EQ(values, expected);
}

TEST(MultiProcessFork, WorkerInitFnRunsOncePerWorkerInTheWorker) {
  // Each worker writes its id into a pipe from worker_init_fn.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  {
    DataLoader loader(testing::ledger(30), {.batch_size = 2,
                                            .num_workers = 3,
                                            .persistent_workers = true,
                                            .worker_init_fn = [w = fds[1]](std::size_t id) {
                                              const char c = static_cast<char>('0' + id);
                                              (void)!::write(w, &c, 1);
                                            }});
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (auto& batch : loader) (void)batch;
    }
  }  // the workers, which hold the pipe's write end too, are gone
  ::close(fds[1]);
  std::multiset<char> ids;
  char c;
  while (::read(fds[0], &c, 1) == 1) ids.insert(c);
  ::close(fds[0]);
  EXPECT_EQ(ids, (std::multiset<char>{'0', '1', '2'}));
}

TEST_P(MultiProcess, DatasetErrorsArriveOncePerBatchAndIterationGoesOn) {
  // As PyTorch's test_error_workers: 41 samples that all fail, batch 2, 4 workers: 21 errors.
  auto dataset = testing::failing(41, 0, 41);
  DataLoader loader(dataset, {.batch_size = 2, .num_workers = 4});
  int errors = 0;
  auto it = loader.begin();
  for (; it != loader.end(); ++it) {
    try {
      (void)*it;
    } catch (const WorkerError& e) {
      ++errors;
      EXPECT_EQ(e.failure().type_name, "std::runtime_error");
      EXPECT_THAT(e.what(), HasSubstr("cannot load sample"));
      EXPECT_GT(e.failure().pid, 0);
    }
  }
  EXPECT_EQ(errors, 21);
}

TEST_P(MultiProcess, AWorkerErrorNamesWorkerPidIndexBatchAndType) {
  DataLoader loader(testing::failing(12, 7, 8), {.batch_size = 4, .num_workers = 2});
  auto it = loader.begin();
  ++it;  // batch 1 holds index 7
  try {
    (void)*it;
    FAIL() << "expected a WorkerError";
  } catch (const WorkerError& e) {
    EXPECT_EQ(e.failure().index, 7);
    EXPECT_EQ(e.failure().batch, 1);
    EXPECT_THAT(e.what(), HasSubstr("raised std::runtime_error loading index 7 of batch 1"));
    EXPECT_THAT(e.what(), HasSubstr("cannot load sample 7"));
    EXPECT_THAT(e.what(), HasSubstr("(pid " + std::to_string(e.failure().pid) + ")"));
  }
  ++it;
  EXPECT_EQ(it->indices(), (std::vector<std::int64_t>{8, 9, 10, 11}));
}

TEST_P(MultiProcess, AWorkerErrorCarriesTheIndicesOfTheBatchThatFailed) {
  // error.h promises the failed batch's indices, not the worker's other queued tasks.
  DataLoader loader(testing::failing(40, 13, 14), {.batch_size = 4, .num_workers = 1});
  std::size_t errors = 0;
  for (auto it = loader.begin(); it != loader.end(); ++it) {
    try {
      (void)*it;
    } catch (const WorkerError& e) {
      ++errors;
      EXPECT_EQ(e.failure().index, 13);
      EXPECT_EQ(e.failure().indices, (std::vector<std::int64_t>{12, 13, 14, 15}));
    }
  }
  EXPECT_EQ(errors, 1u);
}

TEST(MultiProcessFork, ShuffledOrdersAreThoseOfPyTorchsDataLoaderWithTheSameGenerator) {
  // DataLoader(range(n), shuffle=True, generator=torch.Generator().manual_seed(seed)): each new
  // iterator draws its workers' base seed from the generator before the order (persistent
  // workers: only the first). tests/golden/make_sampler_golden.py writes the "dataloader" lines.
  std::ifstream in(std::string(FERRY_GOLDEN_DIR) + "/samplers.txt");
  ASSERT_TRUE(in.good());
  std::size_t cases = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("dataloader ", 0) != 0) continue;
    std::size_t n = 0, persistent = 0, epoch = 0;
    unsigned long long seed = 0;
    ASSERT_EQ(std::sscanf(line.c_str(), "dataloader n=%zu seed=%llu persistent=%zu epoch=%zu", &n,
                          &seed, &persistent, &epoch),
              4)
        << line;
    if (epoch != 0) continue;  // one loader walks epochs 0..2 below
    std::vector<std::vector<std::int64_t>> expected;
    std::ifstream again(std::string(FERRY_GOLDEN_DIR) + "/samplers.txt");
    const std::string head = line.substr(0, line.find(" epoch="));
    for (std::string other; std::getline(again, other);) {
      if (other.rfind(head + " epoch=", 0) != 0) continue;
      std::istringstream values(other.substr(other.find(" : ") + 3));
      expected.emplace_back(std::istream_iterator<std::int64_t>(values),
                            std::istream_iterator<std::int64_t>());
    }
    ASSERT_EQ(expected.size(), 3u) << head;
    DataLoader loader(testing::range(n), {.batch_size = 3,
                                          .shuffle = true,
                                          .num_workers = persistent ? 2u : 0u,
                                          .persistent_workers = persistent != 0,
                                          .seed = seed});
    for (std::size_t e = 0; e < 3; ++e) {
      std::vector<std::int64_t> order;
      for (auto& batch : loader) {
        order.insert(order.end(), batch.indices().begin(), batch.indices().end());
      }
      EXPECT_EQ(order, expected[e]) << head << " epoch=" << e;
    }
    ++cases;
  }
  EXPECT_EQ(cases, 18u);
}

// A dataset whose length the test changes between epochs (a growing log, say).
class Growing : public Dataset {
 public:
  std::size_t size() const override { return n.load(); }
  Example get(std::size_t i, SampleContext&) const override {
    return {{"i", static_cast<std::int64_t>(i)}};
  }
  std::atomic<std::size_t> n{10};
};

TEST(MultiProcessFork, ADatasetThatGrowsBetweenEpochsIsLoadedWhole) {
  // PyTorch's samplers read len(dataset) at every epoch; so does the sampler a loader makes.
  // (Persistent fork workers keep the copy of the dataset they were forked with.)
  for (const bool shuffle : {false, true}) {
    for (const std::size_t workers : {0u, 2u}) {
      auto dataset = std::make_shared<Growing>();
      DataLoader loader(dataset,
                        {.batch_size = 4, .shuffle = shuffle, .num_workers = workers, .seed = 1});
      auto count = [&] {
        std::set<std::int64_t> seen;
        for (auto& batch : loader) seen.insert(batch.indices().begin(), batch.indices().end());
        return seen;
      };
      EXPECT_EQ(count().size(), 10u);
      dataset->n = 14;
      EXPECT_EQ(loader.size(), 4u);
      const auto seen = count();
      EXPECT_EQ(seen.size(), 14u) << "shuffle " << shuffle << ", " << workers << " workers";
      EXPECT_EQ(*seen.rbegin(), 13);
    }
  }
}

TEST(MultiProcessFork, ASecondBeginOnAPersistentLoaderEndsTheFirstIteratorWithAnError) {
  DataLoader loader(testing::range(40),
                    {.batch_size = 4, .num_workers = 2, .persistent_workers = true});
  auto first = loader.begin();
  EXPECT_EQ(first->size(), 4u);
  auto second = loader.begin();  // takes the workers
  ++first;
  EXPECT_THAT([&] { (void)*first; },
              ThrowsMessage<Error>(HasSubstr("was ended by a later begin() on the same loader")));
  std::size_t n = 0;
  for (; second != loader.end(); ++second) n += second->size();
  EXPECT_EQ(n, 40u);
}

TEST(MultiProcessFork, WorkersSeedLibTorchsDefaultGeneratorFromTheLoadersSeed) {
  // Code that draws without a generator (a transform ported from Python, dropout) gets other
  // numbers in each worker, and the same ones from run to run, even after the main process
  // seeded its own generator (which fork workers inherit).
  class DrawsFromTheDefaultGenerator : public Dataset {
   public:
    std::size_t size() const override { return 40; }
    Example get(std::size_t, SampleContext&) const override {
      return {{"r", torch::rand({1}).item<double>()}};
    }
  };
  auto run = [](std::uint64_t seed) {
    torch::manual_seed(0);
    DataLoader loader(std::make_shared<DrawsFromTheDefaultGenerator>(),
                      {.batch_size = 1, .num_workers = 4, .seed = seed});
    std::multiset<double> values;
    for (auto& batch : loader) values.insert(batch["r"].item<double>());
    return values;
  };
  const auto a = run(7);
  EXPECT_EQ(std::set<double>(a.begin(), a.end()).size(), 40u) << "workers drew the same numbers";
  EXPECT_EQ(run(7), a);
  EXPECT_NE(run(8), a);
}

TEST(MultiProcessFork, OutOfOrderAnIterableDatasetsSlowWorkerDoesNotHoldTheOthersBack) {
  // Worker 0's stream takes 200 ms an item, worker 1's none: out of order, the loop gets worker
  // 1's items as they come instead of waiting for worker 0's turn.
  class SlowFirstStream : public IterableDataset {
   public:
    std::unique_ptr<ExampleStream> stream(SampleContext& ctx) const override {
      struct Stream : ExampleStream {
        std::size_t worker = 0, next_value = 0;
        std::optional<Example> next(SampleContext&) override {
          if (next_value >= 6) return std::nullopt;
          if (worker == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
          return Example{{"worker", static_cast<std::int64_t>(worker)},
                         {"value", static_cast<std::int64_t>(next_value++)}};
        }
      };
      auto s = std::make_unique<Stream>();
      s->worker = ctx.worker_id();
      return s;
    }
  };
  DataLoader loader(std::make_shared<SlowFirstStream>(),
                    {.batch_size = 1, .num_workers = 2, .in_order = false});
  std::vector<std::int64_t> first_six;
  std::size_t n = 0;
  for (auto& batch : loader) {
    if (first_six.size() < 6) first_six.push_back(batch["worker"].item<std::int64_t>());
    ++n;
  }
  EXPECT_EQ(n, 12u);
  EXPECT_GE(std::count(first_six.begin(), first_six.end(), 1), 5) << "strict round robin";
}

TEST(MultiProcessFork, CollateMismatchInAWorkerIsABatchError) {
  class Ragged : public Dataset {
   public:
    std::size_t size() const override { return 4; }
    Example get(std::size_t i, SampleContext&) const override {
      return {{"x", torch::zeros({static_cast<std::int64_t>(i % 2 + 1)})}};
    }
  };
  DataLoader loader(std::make_shared<Ragged>(), {.batch_size = 2, .num_workers = 1});
  auto it = loader.begin();
  EXPECT_THAT([&] { (void)*it; },
              ThrowsMessage<WorkerError>(HasSubstr("ferry::CollateError collating batch 0")));
}

TEST(MultiProcessFork, UserCollateRunsInTheWorker) {
  CollateFn collate = [](std::vector<Example> samples) {
    Batch b(samples.size());
    std::vector<std::string> tags;
    torch::Tensor sum = torch::zeros({1}, torch::kLong);
    for (const auto& s : samples) {
      sum += s["index"].to_int();
      tags.push_back("pid" + std::to_string(::getpid()));
    }
    b.set("sum", sum);
    b.set("tag", tags);
    return b;
  };
  DataLoader loader(testing::range(10), {.batch_size = 5, .num_workers = 2}, collate);
  std::vector<std::int64_t> sums;
  for (auto& batch : loader) {
    sums.push_back(batch["sum"].item<std::int64_t>());
    EXPECT_NE(batch.strings("tag")[0], "pid" + std::to_string(::getpid()));
  }
  EXPECT_EQ(sums, (std::vector<std::int64_t>{10, 35}));
}

TEST_P(MultiProcess, ARegisteredCollateTravelsToTheWorkers) {
  DataLoader loader(testing::range(10), {.batch_size = 5, .num_workers = 2},
                    Registry::global().make_collate(Config::map({{"type", "test.sum_x"}})));
  std::vector<float> sums;
  for (auto& batch : loader) sums.push_back(batch["sum"].item<float>());
  // x of sample i is {i, i + 0.5}: the sums of batches {0..4} and {5..9}.
  EXPECT_EQ(sums, (std::vector<float>{22.5f, 72.5f}));
}

TEST_P(MultiProcess, RegisteredTransformsRunInTheWorkers) {
  auto dataset = Registry::global().make_dataset(Config::map(
      {{"type", "test.range"},
       {"n", 6},
       {"transforms", Config::list({Config::map({{"type", "test.shift"}, {"by", 100}})})}}));
  DataLoader loader(dataset, {.batch_size = 6, .num_workers = 2});
  for (auto& batch : loader) {
    EXPECT_EQ(batch["x"][5][0].item<float>(), 105.0f);
    EXPECT_EQ(batch["x"][0][1].item<float>(), 100.5f);
  }
}

TEST(MultiProcessFork, StringFieldsTravel) {
  class Named : public Dataset {
   public:
    std::size_t size() const override { return 6; }
    Example get(std::size_t i, SampleContext&) const override {
      return {{"path", "img" + std::to_string(i) + ".jpg"}, {"label", i}};
    }
  };
  DataLoader loader(std::make_shared<Named>(), {.batch_size = 3, .num_workers = 2});
  std::vector<std::string> paths;
  for (auto& batch : loader) {
    for (const auto& p : batch.strings("path")) paths.push_back(p);
  }
  EXPECT_EQ(paths, (std::vector<std::string>{"img0.jpg", "img1.jpg", "img2.jpg", "img3.jpg",
                                             "img4.jpg", "img5.jpg"}));
}

// True when `address` lies in one of this process's ferry shared-memory segments.
bool in_ferry_segment(const void* address) {
  std::ifstream maps("/proc/self/maps");
  const auto a = reinterpret_cast<std::uintptr_t>(address);
  std::string line;
  while (std::getline(maps, line)) {
    std::uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR, &lo, &hi) != 2) continue;
    if (a >= lo && a < hi) return line.find("memfd:ferry-w") != std::string::npos;
  }
  return false;
}

// Builds "x" through SampleContext::output, so that a worker can build it in its batch's memory:
// sample i holds i * 1000 + k at flat position k, and "in_segment" says whether its memory was a
// worker's shared-memory segment. The modes are the cases where that memory must not be written:
// shapes that change from batch to batch, failing samples (skipped), a tensor returned as a
// strided view of its memory, one tensor in two fields.
class InPlaceDataset : public Dataset {
 public:
  enum class Mode { kPlain, kVaryingShapes, kFailures, kStridedView, kSharedField };
  InPlaceDataset(std::size_t n, Mode mode) : n_(n), mode_(mode) {}
  std::size_t size() const override { return n_; }
  Example get(std::size_t index, SampleContext& ctx) const override {
    if (mode_ == Mode::kFailures && index % 7 == 3) {
      throw DataError("sample " + std::to_string(index) + " is bad");
    }
    const std::int64_t cols =
        mode_ == Mode::kVaryingShapes ? 4 + static_cast<std::int64_t>(index / 8) : 4;
    const torch::Tensor memory = ctx.output("x", {4, cols}, torch::kFloat32);
    const bool in_segment = in_ferry_segment(memory.data_ptr());
    // Column-major over the same memory: same shape and place, not contiguous.
    const torch::Tensor x =
        mode_ == Mode::kStridedView ? memory.as_strided({4, cols}, {1, 4}) : memory;
    x.copy_(torch::arange(4 * cols, torch::kFloat32).view({4, cols}) +
            1000.0f * static_cast<float>(index));
    Example example{
        {"x", x},
        {"in_segment", static_cast<std::int64_t>(in_segment)},
        {"address", static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(memory.data_ptr()))},
        {"pid", static_cast<std::int64_t>(::getpid())}};
    if (mode_ == Mode::kSharedField) example.set("y", x);
    return example;
  }

 private:
  std::size_t n_;
  Mode mode_;
};

TEST(MultiProcessFork, SamplesBuiltInTheirBatchsMemoryArriveIntactWhateverTheyReturn) {
  using Mode = InPlaceDataset::Mode;
  constexpr std::size_t kSize = 60;  // 7 batches of 8 and one of 4
  for (const Mode mode : {Mode::kPlain, Mode::kVaryingShapes, Mode::kFailures, Mode::kStridedView,
                          Mode::kSharedField}) {
    for (const std::size_t threads : {1u, 2u}) {
      SCOPED_TRACE("mode " + std::to_string(static_cast<int>(mode)) + " threads " +
                   std::to_string(threads));
      std::optional<DataLoader> loader;
      try {
        loader.emplace(std::make_shared<InPlaceDataset>(kSize, mode),
                       DataLoaderOptions{.batch_size = 8,
                                         .num_workers = 2,
                                         .worker_threads = threads,
                                         .on_error = OnError::kSkip});
      } catch (const ConfigError&) {
        ASSERT_GT(threads, 1u) << "only worker_threads > 1 may be refused (a build without TBB)";
        continue;
      }
      for (int epoch = 0; epoch < 2; ++epoch) {
        std::vector<int> seen(kSize, 0);
        std::set<std::int64_t> pids;  // the workers that sent a batch so far
        for (auto& batch : *loader) {
          const auto& idx = batch.indices();
          const torch::Tensor x = batch["x"];
          for (std::size_t r = 0; r < idx.size(); ++r) {
            const auto row = static_cast<std::int64_t>(r);
            const std::int64_t cols = x.size(2);
            const torch::Tensor want = torch::arange(4 * cols, torch::kFloat32).view({4, cols}) +
                                       1000.0f * static_cast<float>(idx[r]);
            ASSERT_TRUE(x[row].equal(want))
                << "sample " << idx[r] << " of batch " << batch.sequence() << ":\n"
                << x[row];
            ++seen[static_cast<std::size_t>(idx[r])];
          }
          if (mode == Mode::kSharedField) {
            EXPECT_TRUE(batch["y"].equal(x));
          }
          const torch::Tensor in_segment = batch["in_segment"];
          const bool workers_second_batch =
              !pids.insert(batch["pid"][0].item<std::int64_t>()).second;
          if (mode == Mode::kPlain && workers_second_batch) {
            // Every batch after a worker's first, the short last one included, is built in place.
            EXPECT_EQ(in_segment.sum().item<std::int64_t>(), in_segment.numel())
                << "batch " << batch.sequence();
          }
          if (mode == Mode::kVaryingShapes) {
            // Every batch's shape differs from its worker's previous batch: none in place.
            EXPECT_EQ(in_segment.sum().item<std::int64_t>(), 0) << "batch " << batch.sequence();
          }
        }
        for (std::size_t i = 0; i < kSize; ++i) {
          const bool skipped = mode == Mode::kFailures && i % 7 == 3;
          ASSERT_EQ(seen[i], skipped ? 0 : 1) << "index " << i;
        }
      }
    }
  }
}

// num_workers = 0: the same, in the calling thread's pooled batch buffers. A plain dataset's
// samples lie where the batch holds them from the second batch on (nothing copied); whatever the
// samples return, every batch is intact and every sample delivered once.
TEST(InProcess, SamplesBuiltInTheirBatchsMemoryArriveIntactWhateverTheyReturn) {
  using Mode = InPlaceDataset::Mode;
  constexpr std::size_t kSize = 60;
  for (const Mode mode : {Mode::kPlain, Mode::kVaryingShapes, Mode::kFailures, Mode::kStridedView,
                          Mode::kSharedField}) {
    SCOPED_TRACE("mode " + std::to_string(static_cast<int>(mode)));
    DataLoader loader(std::make_shared<InPlaceDataset>(kSize, mode),
                      DataLoaderOptions{.batch_size = 8, .on_error = OnError::kSkip});
    std::vector<Batch> kept;  // batches held while later ones load: their memory stays theirs
    for (int epoch = 0; epoch < 2; ++epoch) {
      std::vector<int> seen(kSize, 0);
      std::size_t in_place = 0;
      std::size_t batches = 0;
      for (auto& batch : loader) {
        const auto& idx = batch.indices();
        const torch::Tensor x = batch["x"];
        const torch::Tensor address = batch["address"];
        for (std::size_t r = 0; r < idx.size(); ++r) {
          const auto row = static_cast<std::int64_t>(r);
          const std::int64_t cols = x.size(2);
          ASSERT_TRUE(x[row].equal(torch::arange(4 * cols, torch::kFloat32).view({4, cols}) +
                                   1000.0f * static_cast<float>(idx[r])))
              << "sample " << idx[r] << " of batch " << batch.sequence();
          ++seen[static_cast<std::size_t>(idx[r])];
          in_place += static_cast<std::uintptr_t>(address[row].item<std::int64_t>()) ==
                      reinterpret_cast<std::uintptr_t>(x[row].data_ptr());
        }
        if (batches++ % 3 == 0) kept.push_back(batch);
      }
      for (std::size_t i = 0; i < kSize; ++i) {
        const bool skipped = mode == Mode::kFailures && i % 7 == 3;
        ASSERT_EQ(seen[i], skipped ? 0 : 1) << "index " << i;
      }
      if (mode == Mode::kPlain) {
        // Every batch but an epoch's first is built in place (laid out as the one before it,
        // resized for the short last one).
        EXPECT_EQ(in_place, kSize - 8) << "epoch " << epoch;
      }
      if (mode == Mode::kVaryingShapes) {
        EXPECT_EQ(in_place, 0u);
      }
    }
    for (const Batch& b : kept) {  // still intact after the loader went on
      const torch::Tensor x = b["x"];
      for (std::size_t r = 0; r < b.indices().size(); ++r) {
        const std::int64_t cols = x.size(2);
        ASSERT_TRUE(x[static_cast<std::int64_t>(r)].equal(
            torch::arange(4 * cols, torch::kFloat32).view({4, cols}) +
            1000.0f * static_cast<float>(b.indices()[r])));
      }
    }
  }
}

TEST_P(MultiProcess, IterableDatasetEachWorkerRunsItsOwnStream) {
  for (std::size_t workers : {1u, 2u, 3u}) {
    for (bool in_order : {true, false}) {
      DataLoader loader(testing::counting(23),
                        {.batch_size = 4, .num_workers = workers, .in_order = in_order});
      std::multiset<std::int64_t> values;
      for (auto& batch : loader) {
        const auto v = batch["value"];
        for (std::int64_t i = 0; i < v.size(0); ++i) values.insert(v[i].item<std::int64_t>());
      }
      std::multiset<std::int64_t> expected;
      for (std::int64_t i = 0; i < 23; ++i) expected.insert(i);
      EXPECT_EQ(values, expected) << workers << " workers";
    }
  }
}

TEST_P(MultiProcess, IterableDatasetOrderIsTheSameFromRunToRun) {
  auto run = [] {
    DataLoader loader(testing::counting(30), {.batch_size = 3, .num_workers = 3, .seed = 2});
    std::vector<std::int64_t> values;
    for (auto& batch : loader) {
      const auto v = batch["value"];
      for (std::int64_t i = 0; i < v.size(0); ++i) values.push_back(v[i].item<std::int64_t>());
    }
    return values;
  };
  const auto first = run();
  EXPECT_EQ(first.size(), 30u);
  EXPECT_EQ(run(), first);
}

TEST_P(MultiProcess, IterableDatasetWithEmptyShardsAndPersistentWorkers) {
  // RELIABILITY row 16: 2 items over 4 workers leaves two streams empty.
  DataLoader loader(testing::counting(2),
                    {.batch_size = 1, .num_workers = 4, .persistent_workers = true});
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::size_t n = 0;
    for (auto& batch : loader) n += batch.size();
    EXPECT_EQ(n, 2u);
  }
}

TEST_P(MultiProcess, EmptyDatasetAndBatchLargerThanTheDataset) {
  DataLoader empty(testing::range(0), {.batch_size = 4, .num_workers = 2});
  EXPECT_TRUE(empty.begin() == empty.end());
  DataLoader big(testing::range(5), {.batch_size = 8, .num_workers = 2});
  std::size_t batches = 0;
  for (auto& batch : big) {
    EXPECT_EQ(batch.size(), 5u);
    ++batches;
  }
  EXPECT_EQ(batches, 1u);
  DataLoader dropped(testing::range(5), {.batch_size = 8, .num_workers = 2, .drop_last = true});
  EXPECT_TRUE(dropped.begin() == dropped.end());
}

TEST(MultiProcessFork, AMillionIndexBatchTravels) {
  // RELIABILITY row 14: index messages far larger than a socket buffer.
  class Empty : public Dataset {
   public:
    std::size_t size() const override { return 1'000'000; }
    Example get(std::size_t i, SampleContext&) const override { return {{"i", i}}; }
  };
  DataLoader loader(std::make_shared<Empty>(), {.batch_size = 1'000'000, .num_workers = 1});
  auto it = loader.begin();
  EXPECT_EQ(it->size(), 1'000'000u);
  EXPECT_EQ((*it)["i"][999'999].item<std::int64_t>(), 999'999);
}

TEST_P(MultiProcess, LoaderCreatedOnAShortLivedThreadKeepsItsWorkers) {
  // PR_SET_PDEATHSIG fires when the forking thread exits: ferry forks from its own thread.
  std::unique_ptr<DataLoader> loader;
  std::thread([&] {
    loader = std::make_unique<DataLoader>(
        testing::ledger(40),
        DataLoaderOptions{.batch_size = 4, .num_workers = 2, .persistent_workers = true});
    for (auto& batch : *loader) (void)batch;  // workers started on this thread
  }).join();
  std::size_t n = 0;
  for (auto& batch : *loader) n += batch.size();
  EXPECT_EQ(n, 40u);
}

TEST_P(MultiProcess, ManyLoadersInterleaved) {
  // RELIABILITY row 26: 8 loaders x 4 workers, interleaved, destroyed in a scrambled order.
  std::vector<std::unique_ptr<DataLoader>> loaders;
  std::vector<DataLoader::Iterator> its;
  for (int i = 0; i < 8; ++i) {
    loaders.push_back(std::make_unique<DataLoader>(
        testing::ledger(40, 64), DataLoaderOptions{.batch_size = 4, .num_workers = 4}));
    its.push_back(loaders.back()->begin());
  }
  std::vector<std::size_t> counts(8, 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int i = 0; i < 8; ++i) {
      if (its[i] == loaders[i]->end()) continue;
      for (std::size_t r = 0; r < its[i]->size(); ++r) {
        ASSERT_EQ(LedgerDataset::check_row((*its[i])["payload"], static_cast<std::int64_t>(r),
                                           its[i]->indices()[r], 0),
                  "");
      }
      counts[i] += its[i]->size();
      ++its[i];
      progress = true;
    }
  }
  for (auto c : counts) EXPECT_EQ(c, 40u);
  its.clear();
  for (int i : {3, 0, 7, 1, 5, 2, 6, 4}) loaders[static_cast<std::size_t>(i)].reset();
}

}  // namespace
}  // namespace ferry
