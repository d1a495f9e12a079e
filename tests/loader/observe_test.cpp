// Seeing where the time goes, with worker processes: the stats add up (the loop's waits and its
// own work make the epoch's wall time; the workers' samples make the epoch), the trace is valid
// trace-event JSON with spans from every worker and stays within its bound, and worker_cpus
// puts the workers on the cores asked for.

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/data_loader.h"
#include "ferry/error.h"

#include "support/command.h"
#include "support/registered.h"
#include "support/start_methods.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

void spin_for(std::chrono::microseconds d) {
  const auto until = Clock::now() + d;
  while (Clock::now() < until) {
  }
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

TEST(LoaderStats, TheLoopsWaitsAndItsOwnWorkMakeTheWallTimeAndWorkersMakeTheEpoch) {
  constexpr std::size_t kSize = 240;
  constexpr std::size_t kBatch = 4;
  // Loading (4 x 1 ms a batch over 2 workers) and the loop's own work (1.5 ms a batch) are of
  // the same order, so both the waits and the work are real.
  DataLoader loader(testing::affinity(kSize, 1000),
                    {.batch_size = kBatch, .num_workers = 2, .persistent_workers = true});
  for (int epoch = 0; epoch < 2; ++epoch) {
    double own = 0;
    const auto start = Clock::now();
    std::size_t batches = 0;
    for (auto it = loader.begin(); it != loader.end(); ++it) {
      const auto t0 = Clock::now();
      ASSERT_EQ((*it)["index"].numel(), static_cast<std::int64_t>(kBatch));
      spin_for(std::chrono::microseconds(1500));
      own += seconds_between(t0, Clock::now());
      ++batches;
    }
    const double wall = seconds_between(start, Clock::now());
    const LoaderStats stats = loader.stats();
    ASSERT_EQ(stats.epochs.size(), static_cast<std::size_t>(epoch + 1));
    const EpochStats& e = stats.epochs.back();
    EXPECT_EQ(e.epoch, static_cast<std::uint64_t>(epoch));
    EXPECT_TRUE(e.finished);
    EXPECT_EQ(e.batches, batches);
    EXPECT_EQ(e.samples, kSize);
    EXPECT_EQ(e.wait.count, batches);
    // The epoch runs from begin() to the end; the loop either waits or works.
    EXPECT_NEAR(e.seconds, wall, 0.02 + 0.05 * wall);
    EXPECT_NEAR(e.wait.total + own, e.seconds, 0.02 + 0.05 * e.seconds)
        << "waits " << e.wait.total << " s + own work " << own << " s";
    EXPECT_GT(e.wait.total, 0.0);
    EXPECT_LE(e.wait.p50, e.wait.p99);
    EXPECT_LE(e.wait.p99, e.wait.max * 1.0001);
    EXPECT_LE(e.wait.max, e.wait.total);
    EXPECT_NEAR(e.batches_per_second, static_cast<double>(batches) / e.seconds,
                0.01 * e.batches_per_second);
    // Every sample was loaded by one of the workers, and each worker's split is real.
    ASSERT_EQ(e.workers.size(), 2u);
    std::size_t samples = 0, worker_batches = 0;
    for (const WorkerTimeStats& w : e.workers) {
      samples += w.samples;
      worker_batches += w.batches;
      EXPECT_GT(w.batches, 0u) << "worker " << w.worker_id;
      // Each sample sleeps 1 ms: a worker's loading is at least its samples' sleeps.
      EXPECT_GE(w.loading, 0.001 * static_cast<double>(w.samples) * 0.95) << w.worker_id;
      EXPECT_LT(w.loading, e.seconds) << w.worker_id;
      EXPECT_GT(w.collating, 0.0) << w.worker_id;
      EXPECT_GE(w.waiting, 0.0) << w.worker_id;
      EXPECT_GT(w.cpu, 0.0) << w.worker_id;
      EXPECT_LE(w.loading + w.collating + w.segment + w.waiting, e.seconds + 0.5) << w.worker_id;
    }
    EXPECT_EQ(samples, kSize);
    EXPECT_EQ(worker_batches, batches);
    EXPECT_GT(e.worker_cpu_seconds, 0.0);
    EXPECT_GT(e.worker_cpu_share, 0.0);
    EXPECT_LE(e.worker_cpu_share, 1.0);
    EXPECT_GT(e.shared_memory_peak, 0u) << "batches lie in shared memory";
  }
  const LoaderStats stats = loader.stats();
  EXPECT_EQ(stats.total.batches, stats.epochs[0].batches + stats.epochs[1].batches);
  EXPECT_EQ(stats.total.samples, 2 * kSize);
  EXPECT_NEAR(stats.total.seconds, stats.epochs[0].seconds + stats.epochs[1].seconds, 1e-9);
  EXPECT_NEAR(stats.total.wait.total, stats.epochs[0].wait.total + stats.epochs[1].wait.total,
              1e-9);
  ASSERT_EQ(stats.total.workers.size(), 2u);
  EXPECT_EQ(stats.total.workers[0].samples + stats.total.workers[1].samples, 2 * kSize);
}

TEST(LoaderStats, AnEpochLeftEarlyStopsItsClockAtItsLastBatch) {
  DataLoader loader(testing::affinity(64), {.batch_size = 4, .num_workers = 1});
  const auto start = Clock::now();
  {
    auto it = loader.begin();
    ++it;
  }  // a break after two batches
  const double until_break = seconds_between(start, Clock::now());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const LoaderStats stats = loader.stats();
  ASSERT_EQ(stats.epochs.size(), 1u);
  EXPECT_FALSE(stats.epochs[0].finished);
  EXPECT_EQ(stats.epochs[0].batches, 2u);
  EXPECT_LE(stats.epochs[0].seconds, until_break)
      << "the time after the break is not the epoch's";
}

TEST(LoaderStats, BatchesTooFastToTimeEachAreAllCountedAndTheWorkersSplitStillAddsUp) {
  // Batches of one tiny sample: a worker makes one in a few microseconds, faster than
  // TimingStride::kFastNs, so the worker and the loop time one in a stride and scale it.
  constexpr std::size_t kSize = 20'000;
  DataLoader loader(testing::range(kSize), {.batch_size = 1, .num_workers = 1});
  std::size_t batches = 0;
  for (auto& batch : loader) {
    ASSERT_EQ(batch.size(), 1u);
    ++batches;
  }
  ASSERT_EQ(batches, kSize);
  const EpochStats e = loader.stats().epochs.at(0);
  EXPECT_EQ(e.batches, kSize);
  EXPECT_EQ(e.samples, kSize);
  ASSERT_EQ(e.workers.size(), 1u);
  const WorkerTimeStats& w = e.workers[0];
  EXPECT_EQ(w.batches, kSize) << "every batch is counted, timed or not";
  EXPECT_EQ(w.samples, kSize);
  // The worker was loading, collating, getting a segment or waiting for work from its start to
  // its last batch: the estimates cover most of the epoch, and no more than all of it.
  const double busy = w.loading + w.collating + w.segment + w.waiting;
  EXPECT_GT(w.loading, 0.0);
  EXPECT_GT(w.collating, 0.0);
  EXPECT_LE(busy, e.seconds * 1.1 + 0.01);
  EXPECT_GE(busy, e.seconds * 0.5) << "loading " << w.loading << " collating " << w.collating
                                   << " segment " << w.segment << " waiting " << w.waiting;
  EXPECT_LE(e.wait.count, kSize);
  EXPECT_GT(e.wait.count + 64, kSize);
}

std::string python() { return ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : ""; }

std::string check_trace(const fs::path& trace, const std::string& args) {
  return python() + " " + FERRY_SOURCE_DIR + "/tests/tools/check_trace.py " + trace.string() + " " +
         args;
}

class Trace : public ::testing::TestWithParam<StartMethod> {
 protected:
  void SetUp() override {
    if (python().empty()) GTEST_SKIP() << "no /usr/bin/python3 to check the trace with";
    dir_ = fs::temp_directory_path() / ("ferry_trace_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_P(Trace, IsValidTraceEventJsonWithSpansFromEveryWorkerAndTheLoop) {
  const fs::path path = dir_ / "trace.json";
  {
    DataLoader loader(testing::range(96), {.batch_size = 4,
                                           .num_workers = 3,
                                           .start_method = GetParam(),
                                           .trace_path = path.string()});
    std::size_t batches = 0;
    for (auto& batch : loader) batches += batch.size() > 0;
    EXPECT_EQ(batches, 24u);
    loader.write_trace(dir_ / "now.json");  // also at any time
  }                                         // written as the loader goes
  ASSERT_TRUE(fs::exists(path));
  const test::CommandResult r = test::run_command(check_trace(path, "--expect-tids 0,1,2,3"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  // 96 samples, 24 collations, 24 waits and 24 batches begun and ended at least.
  EXPECT_THAT(r.out, HasSubstr("\"sample\": 96"));
  EXPECT_THAT(r.out, HasSubstr("\"collate\": 24"));
  EXPECT_THAT(r.out, HasSubstr("\"epoch 0 begins\": 1"));
  EXPECT_THAT(r.out, HasSubstr("\"epoch 0 ends\": 1"));
  EXPECT_EQ(test::run_command(check_trace(dir_ / "now.json", "--expect-tids 0,1,2,3")).code, 0);
}

INSTANTIATE_TEST_SUITE_P(StartMethods,
                         Trace,
                         testing::all_start_methods(),
                         testing::start_method_name);

TEST(TraceBound, ALongRunKeepsOnlyTheMostRecentEvents) {
  if (python().empty()) GTEST_SKIP() << "no /usr/bin/python3 to check the trace with";
  const fs::path path =
      fs::temp_directory_path() / ("ferry_trace_bound_" + std::to_string(::getpid()) + ".json");
  constexpr std::size_t kEvents = 500;
  {
    DataLoader loader(
        testing::affinity(4000),
        {.batch_size = 2, .num_workers = 2, .trace_path = path.string(), .trace_events = kEvents});
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (auto& batch : loader) (void)batch;
    }
  }
  const test::CommandResult r = test::run_command(
      check_trace(path, "--max-events " + std::to_string(kEvents) + " --expect-tids 0,1,2"));
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  // 4000 batches of 2 make over 20,000 events; the file holds the last 500 (about 200 bytes
  // each at most).
  EXPECT_LT(fs::file_size(path), kEvents * 250 + 4096);
  EXPECT_THAT(test::slurp(path), HasSubstr("\"dropped\":"));
  fs::remove(path);
}

TEST(TraceBound, WriteTraceWithoutATraceSaysHowToTurnItOn) {
  DataLoader loader(testing::affinity(8), {.batch_size = 4});
  EXPECT_THAT([&] { loader.write_trace("/tmp/never.json"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("set DataLoaderOptions::trace_path")));
}

class WorkerCpus : public ::testing::TestWithParam<StartMethod> {};

TEST_P(WorkerCpus, WorkersRunOnTheCoresAsked) {
  DataLoader loader(
      testing::affinity(16),
      {.batch_size = 4, .num_workers = 2, .start_method = GetParam(), .worker_cpus = "0"});
  EXPECT_EQ(loader.stats().worker_cpus, std::vector<int>{0});
  std::size_t samples = 0;
  for (auto& batch : loader) {
    const auto cpus = batch["cpus"];
    for (std::int64_t i = 0; i < cpus.numel(); ++i) {
      EXPECT_EQ(cpus[i].item<std::int64_t>(), 1) << "sample " << samples << ": only core 0";
      ++samples;
    }
  }
  EXPECT_EQ(samples, 16u);
}

INSTANTIATE_TEST_SUITE_P(StartMethods,
                         WorkerCpus,
                         testing::all_start_methods(),
                         testing::start_method_name);

TEST(WorkerCpusOption, BadListsAndNoWorkersAreConfigErrors) {
  const auto dataset = testing::affinity(8);
  EXPECT_THAT([&] { DataLoader(dataset, {.num_workers = 1, .worker_cpus = "0-x"}); },
              ::testing::ThrowsMessage<ConfigError>(HasSubstr("worker_cpus \"0-x\"")));
  EXPECT_THAT([&] { DataLoader(dataset, {.num_workers = 1, .worker_cpus = "100000"}); },
              ::testing::ThrowsMessage<ConfigError>(HasSubstr("does not exist")));
  EXPECT_THAT([&] { DataLoader(dataset, {.num_workers = 0, .worker_cpus = "0"}); },
              ::testing::ThrowsMessage<ConfigError>(HasSubstr("num_workers=0")));
}

}  // namespace
}  // namespace ferry
