// The start methods (fork, spawn, forkserver): identical batches from each, the spawn and
// forkserver handshake (configuration hash, dataset size), the errors of RELIABILITY row 5 under
// spawn and forkserver, parallel start-up (pytorch#71543), and fork after CUDA (row 22).

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/data_loader.h"
#include "ferry/error.h"
#include "ferry/init.h"
#include "ferry/registry.h"

#include "device/cuda_driver.h"
#include "loader/worker_pool.h"
#include "support/child_test.h"
#include "support/process_harness.h"
#include "support/registered.h"
#include "support/start_methods.h"
#include "support/timing.h"
#include "workers/spawn.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using Clock = std::chrono::steady_clock;

using testing::in_child;

std::vector<std::vector<torch::Tensor>> all_batches(StartMethod method, bool persistent) {
  DataLoader loader(testing::ledger(101, 96, 300, 1, 5), {.batch_size = 8,
                                                          .shuffle = true,
                                                          .num_workers = 3,
                                                          .persistent_workers = persistent,
                                                          .seed = 5,
                                                          .start_method = method});
  std::vector<std::vector<torch::Tensor>> out;
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (auto& batch : loader) {
      out.push_back({batch["payload"].clone(), batch["index"].clone(), batch["epoch"].clone(),
                     batch["noise"].clone()});
    }
  }
  return out;
}

TEST(StartMethods, BatchesAreBitwiseIdenticalUnderForkSpawnAndForkserver) {  // row 23
  for (const bool persistent : {false, true}) {
    const auto fork = all_batches(StartMethod::kFork, persistent);
    ASSERT_EQ(fork.size(), 2u * 13u);
    for (const auto method : {StartMethod::kSpawn, StartMethod::kForkserver}) {
      const auto other = all_batches(method, persistent);
      ASSERT_EQ(other.size(), fork.size()) << to_string(method);
      for (std::size_t b = 0; b < fork.size(); ++b) {
        for (std::size_t f = 0; f < fork[b].size(); ++f) {
          ASSERT_TRUE(torch::equal(fork[b][f], other[b][f]))
              << to_string(method) << " batch " << b << " field " << f;
        }
      }
    }
  }
}

TEST(StartMethods, InitRanAndTheForkserverIsAChildOfThisProcess) {
  EXPECT_TRUE(initialized());
  DataLoader loader(testing::ledger(8), {.batch_size = 4,
                                         .num_workers = 2,
                                         .persistent_workers = true,
                                         .start_method = StartMethod::kForkserver});
  for (auto& batch : loader) {
    const pid_t worker = static_cast<pid_t>(batch["pid"][0].item<std::int64_t>());
    // The worker is this process's child (clone with CLONE_PARENT), not the server's.
    std::ifstream stat("/proc/" + std::to_string(worker) + "/stat");
    std::string pid, comm, state;
    pid_t ppid = 0;
    stat >> pid >> comm >> state >> ppid;
    EXPECT_EQ(ppid, ::getpid()) << "worker " << worker;
  }
  EXPECT_GT(workers::forkserver_pid(), 0);
}

TEST(Forkserver, AForkserverThatDiesWhileOnlyForkLoadersRunIsReapedAndReplaced) {
  const pid_t server = workers::forkserver_pid();
  ASSERT_GT(server, 0) << "ferry::init starts one in this test program";
  ASSERT_EQ(::kill(server, SIGKILL), 0);
  auto state = [&] {
    std::ifstream stat("/proc/" + std::to_string(server) + "/stat");
    std::string pid, comm, s;
    stat >> pid >> comm >> s;
    return s;  // "Z" while a zombie, "" once reaped
  };
  for (int i = 0; i < 200 && state() != "Z"; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(state(), "Z");
  DataLoader fork_loader(testing::range(8),
                         {.batch_size = 4, .num_workers = 1, .start_method = StartMethod::kFork});
  for (auto& batch : fork_loader) (void)batch;
  EXPECT_EQ(state(), "") << "the dead forkserver is still a zombie";
  EXPECT_EQ(workers::forkserver_pid(), -1);
  // The next forkserver loader gets a fresh server.
  DataLoader loader(testing::range(8),
                    {.batch_size = 4, .num_workers = 1, .start_method = StartMethod::kForkserver});
  std::size_t n = 0;
  for (auto& batch : loader) n += batch.size();
  EXPECT_EQ(n, 8u);
  EXPECT_GT(workers::forkserver_pid(), 0);
}

class FreshStart : public ::testing::TestWithParam<StartMethod> {};
INSTANTIATE_TEST_SUITE_P(Methods,
                         FreshStart,
                         ::testing::Values(StartMethod::kSpawn, StartMethod::kForkserver),
                         testing::start_method_name);

TEST_P(FreshStart, ADatasetBuiltInCIsRefusedAtConstructionWithTheFix) {
  EXPECT_THAT(
      [] {
        DataLoader(std::make_shared<testing::RangeDataset>(4),
                   {.num_workers = 1, .start_method = GetParam()});
      },
      ThrowsMessage<ConfigError>(
          AllOf(HasSubstr("constructed directly in C++"), HasSubstr("make_dataset"))));
}

TEST_P(FreshStart, WorkerInitFnAndACollateClosureAreRefusedAtConstruction) {
  EXPECT_THAT(
      [] {
        DataLoader(
            testing::range(4),
            {.num_workers = 1, .worker_init_fn = [](std::size_t) {}, .start_method = GetParam()});
      },
      ThrowsMessage<ConfigError>(HasSubstr("worker_init_fn cannot travel")));
  EXPECT_THAT(
      [] {
        DataLoader(testing::range(4), {.num_workers = 1, .start_method = GetParam()},
                   [](std::vector<Example> s) { return default_collate(std::move(s)); });
      },
      ThrowsMessage<ConfigError>(HasSubstr("make_collate")));
}

TEST_P(FreshStart, AFactoryThatFailsInTheWorkerIsRaisedAtTheFirstBatchAndAllAreReaped) {  // row 5
  const StartMethod method = GetParam();
  in_child([method] {
    DataLoader warm(testing::range(2), {.num_workers = 1, .start_method = method});
    for (auto& b : warm) (void)b;
    const auto before = testing::snapshot();
    {
      auto dataset = Registry::global().make_dataset(Config::map({{"type", "test.broken"},
                                                                  {"root", "/tmp"},
                                                                  {"fail_in_worker", true},
                                                                  {"main_pid", ::getpid()}}));
      DataLoader loader(dataset, {.num_workers = 3, .start_method = method});
      bool raised = false;
      try {
        for (auto& b : loader) (void)b;
      } catch (const WorkerError& e) {
        raised = true;
        const std::string what = e.what();
        REQUIRE(
            what.find("rebuilding the dataset from its configuration failed") != std::string::npos,
            what);
        REQUIRE(what.find("dataset.root: folder '/tmp' does not exist") != std::string::npos, what);
      }
      REQUIRE(raised, "no WorkerError");
    }
    const std::string leaks = testing::wait_for_no_leaks(before, 2s);
    REQUIRE(leaks.empty(), leaks);
    return 0;
  });
}

TEST_P(FreshStart, AWorkerThatCrashesBeforeItsHandshakeIsNamedAndReaped) {  // row 5
  const StartMethod method = GetParam();
  in_child([method] {
    DataLoader warm(testing::range(2), {.num_workers = 1, .start_method = method});
    for (auto& b : warm) (void)b;
    const auto before = testing::snapshot();
    {
      auto dataset = Registry::global().make_dataset(Config::map({{"type", "test.slow_start"},
                                                                  {"n", 8},
                                                                  {"crash_in_worker", true},
                                                                  {"main_pid", ::getpid()}}));
      DataLoader loader(dataset, {.num_workers = 2, .start_method = method});
      bool raised = false;
      try {
        for (auto& b : loader) (void)b;
      } catch (const WorkerDiedError& e) {
        raised = true;
        const std::string what = e.what();
        REQUIRE(e.signal() == SIGSEGV, what);
        REQUIRE(what.find("before its handshake") != std::string::npos, what);
      }
      REQUIRE(raised, "no WorkerDiedError");
    }
    const std::string leaks = testing::wait_for_no_leaks(before, 2s);
    REQUIRE(leaks.empty(), leaks);
    return 0;
  });
}

TEST_P(FreshStart, WorkersStartInParallel) {  // pytorch#71543
  // Each process's rebuild sleeps 2 s and logs when; the four workers' must overlap in time (one
  // after another they could not), which no load on the machine can fake or spoil. Under fork
  // nothing is rebuilt: there the epoch's time guards against workers started in turn.
  const std::string log = ::testing::TempDir() + "ferry_parallel_start_" +
                          std::to_string(::getpid()) + "_" + std::to_string(static_cast<int>(GetParam()));
  std::remove(log.c_str());
  auto dataset = Registry::global().make_dataset(Config::map({{"type", "test.slow_start"},
                                                              {"n", 16},
                                                              {"delay_ms", 2000},
                                                              {"main_pid", ::getpid()},
                                                              {"interval_log", log}}));
  std::remove(log.c_str());  // the main process's own rebuild is not a worker's
  DataLoader loader(dataset, {.batch_size = 4, .num_workers = 4, .start_method = GetParam()});
  const auto start = Clock::now();
  std::size_t n = 0;
  for (auto& batch : loader) n += batch.size();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(n, 16u);
  const auto rebuilds = testing::read_intervals(log);
  std::remove(log.c_str());
  if (GetParam() == StartMethod::kFork) {
    EXPECT_TRUE(rebuilds.empty()) << "forked workers rebuilt the dataset";
    EXPECT_LT(seconds, 2.0 * testing::time_scale()) << "fork workers took " << seconds << " s";
  } else {
    ASSERT_EQ(rebuilds.size(), 4u) << "one rebuild per worker";
    EXPECT_TRUE(testing::all_overlap(rebuilds)) << "workers started one after another";
  }
}

TEST(StartMethods, ForkedWorkersStartInParallel) {  // pytorch#71543
  // Each worker_init_fn sleeps 1 s and logs when: the four must overlap in time.
  const std::string log =
      ::testing::TempDir() + "ferry_parallel_init_" + std::to_string(::getpid());
  std::remove(log.c_str());
  DataLoader loader(testing::range(16),
                    {.batch_size = 4, .num_workers = 4, .worker_init_fn = [log](std::size_t) {
                       const std::int64_t started = testing::monotonic_ns();
                       std::this_thread::sleep_for(1s);
                       testing::append_interval(log, started, testing::monotonic_ns());
                     }});
  std::size_t n = 0;
  for (auto& batch : loader) n += batch.size();
  EXPECT_EQ(n, 16u);
  const auto inits = testing::read_intervals(log);
  std::remove(log.c_str());
  ASSERT_EQ(inits.size(), 4u) << "one worker_init_fn per worker";
  EXPECT_TRUE(testing::all_overlap(inits)) << "workers started one after another";
}

TEST(StartMethods, ASpawnedWorkerWithAnotherConfigurationHashIsRefused) {
  in_child([] {
    // The spawned copy of this program registers test.drift with one more key, so it resolves
    // the same node to another configuration.
    auto dataset = Registry::global().make_dataset(Config::map({{"type", "test.drift"}, {"n", 8}}));
    ::setenv("FERRY_TEST_DRIFT", "spicy", 1);
    DataLoader loader(dataset, {.num_workers = 1, .start_method = StartMethod::kSpawn});
    bool raised = false;
    try {
      for (auto& b : loader) (void)b;
    } catch (const ConfigError& e) {
      raised = true;
      const std::string what = e.what();
      REQUIRE(what.find("configuration hash") != std::string::npos, what);
      REQUIRE(what.find(hash_string(dataset->spec()->hash)) != std::string::npos, what);
      REQUIRE(what.find("{\"type\":\"test.drift\",\"n\":\"8\"}") != std::string::npos, what);
    }
    REQUIRE(raised, "no ConfigError");
    return 0;
  });
}

// Pretends CUDA is initialised for as long as it lives.
struct PretendCuda {
  PretendCuda() { device::fault::pretend_cuda_initialized(true); }
  ~PretendCuda() { device::fault::pretend_cuda_initialized(false); }
};

// Row 22, CPU part: as in PyTorch, fork workers may start after the process initialised CUDA
// (a model moved to the GPU first), at construction and at any epoch, persistent or not.
TEST(StartMethods, ForkAfterCudaIsAllowedAtConstructionAndAtEveryEpoch) {
  for (const bool persistent : {false, true}) {
    std::optional<PretendCuda> cuda(std::in_place);
    DataLoader loader(testing::range(10), {.batch_size = 3,
                                           .num_workers = 2,
                                           .persistent_workers = persistent,
                                           .start_method = StartMethod::kFork});
    for (int epoch = 0; epoch < 2; ++epoch) {
      std::vector<std::int64_t> seen;
      for (auto& batch : loader) {
        seen.insert(seen.end(), batch.indices().begin(), batch.indices().end());
      }
      EXPECT_EQ(seen, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}))
          << "persistent=" << persistent << " epoch " << epoch;
    }
  }
  EXPECT_FALSE(device::cuda_initialized()) << "this machine's process has no CUDA context";
}

TEST(StartMethods, CudaStartedBetweenEpochsStillForksTheNextEpoch) {  // row 22, CPU part
  DataLoader loader(testing::range(4), {.batch_size = 2, .num_workers = 1});
  for (auto& batch : loader) (void)batch;  // epoch 0 forks before CUDA
  const PretendCuda cuda;                  // e.g. the model moved to the GPU, or pinned batches
  std::size_t n = 0;
  for (auto& batch : loader) n += batch.size();
  EXPECT_EQ(n, 4u);
}

// A forked worker that uses CUDA anyway fails with CUDA's own reason and, where the parent had
// initialised CUDA, the advice; the same error without CUDA in the parent gets no such advice.
TEST(StartMethods, AWorkerErrorNamingCudaAfterCudaStartedCarriesTheReasonAndTheAdvice) {
  class UsesCuda : public Dataset {
   public:
    std::size_t size() const override { return 2; }
    Example get(std::size_t, SampleContext&) const override {
      throw std::runtime_error("CUDA error: initialization error");  // what CUDA says there
    }
  };
  for (const bool cuda_started : {true, false}) {
    std::optional<PretendCuda> cuda;
    if (cuda_started) cuda.emplace();
    DataLoader loader(std::make_shared<UsesCuda>(), {.num_workers = 1});
    try {
      for (auto& b : loader) (void)b;
      FAIL() << "no error";
    } catch (const WorkerError& e) {
      EXPECT_THAT(e.what(), HasSubstr("CUDA error: initialization error"));
      if (cuda_started) {
        EXPECT_THAT(e.what(),
                    AllOf(HasSubstr("forked after this process initialised CUDA"),
                          HasSubstr("device_transforms"), HasSubstr("start_method=spawn")));
      } else {
        EXPECT_THAT(e.what(), ::testing::Not(HasSubstr("forked after")));
      }
    }
  }
}

TEST_P(FreshStart, AWorkerThatNeverFinishesStartingTimesOutEvenWithoutATimeout) {
  const StartMethod method = GetParam();
  in_child(
      [method] {
        detail::fault::set_startup_limit(1s);  // 60 s in real use
        // The factory blocks for 30 s in the workers only (a lock or a rendezvous before init).
        auto dataset = Registry::global().make_dataset(Config::map({{"type", "test.slow_start"},
                                                                    {"n", 4},
                                                                    {"worker_delay_ms", 30000},
                                                                    {"main_pid", ::getpid()}}));
        DataLoader loader(dataset, {.num_workers = 2, .start_method = method});
        const auto start = Clock::now();
        bool raised = false;
        try {
          for (auto& b : loader) (void)b;
        } catch (const TimeoutError& e) {
          raised = true;
          const std::string what = e.what();
          REQUIRE(what.find("did not finish starting within 1 s") != std::string::npos, what);
        }
        REQUIRE(raised, "no TimeoutError");
        const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
        REQUIRE(seconds < 10 * testing::time_scale(), "took ", seconds, " s");
        return 0;
      },
      std::chrono::seconds(60), /*workers_may_be_killed=*/true);
}

TEST(StartMethods, CudaUsedInAForkedWorkerIsAWorkerErrorWithTheReason) {  // row 22
  if (at::hasCUDA()) GTEST_SKIP() << "checks a CPU-only build's message";
  class UsesCuda : public Dataset {
   public:
    std::size_t size() const override { return 2; }
    Example get(std::size_t, SampleContext&) const override {
      return {{"x", torch::zeros({1}, torch::kCUDA)}};
    }
  };
  DataLoader loader(std::make_shared<UsesCuda>(), {.num_workers = 1});
  try {
    for (auto& b : loader) (void)b;
    FAIL() << "no error";
  } catch (const WorkerError& e) {
    EXPECT_THAT(e.what(), HasSubstr("CUDA"));
  }
}

}  // namespace
}  // namespace ferry
