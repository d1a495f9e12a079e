// The engine at sizes beyond the small datasets of the other tests: batches whose index lists
// are far larger than a socket buffer, with every queue full (RELIABILITY row 14).

#include <signal.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/data_loader.h"
#include "ferry/error.h"
#include "ferry/sampler.h"

#include "support/child_test.h"
#include "support/process_harness.h"
#include "support/timing.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;

// Sample i is the int64 scalar i: the cheapest sample there is, so index lists dominate.
class Scalars : public Dataset {
 public:
  explicit Scalars(std::size_t n) : n_(n) {}
  std::size_t size() const override { return n_; }
  Example get(std::size_t i, SampleContext&) const override {
    return {{"i", static_cast<std::int64_t>(i)}};
  }

 private:
  std::size_t n_;
};

constexpr std::size_t kBatch = 65'536;  // 512 KiB of indices a task, and again a reply
constexpr std::size_t kBatches = 24;

struct Case {
  bool in_order;
  std::chrono::milliseconds timeout;
};

class HugeBatches : public ::testing::TestWithParam<Case> {};

TEST_P(HugeBatches, EveryQueueFullEveryBatchDeliveredExactlyOnce) {
  // 4 workers x prefetch_factor 8: 32 tasks of 65,536 indices queued at once, and as many
  // replies; neither side may block in a send while the other does.
  const Case c = GetParam();
  testing::in_child(
      [c] {
        DataLoader loader(std::make_shared<Scalars>(kBatch * kBatches), {.batch_size = kBatch,
                                                                         .shuffle = true,
                                                                         .num_workers = 4,
                                                                         .prefetch_factor = 8,
                                                                         .timeout = c.timeout,
                                                                         .in_order = c.in_order,
                                                                         .seed = 3});
        for (int epoch = 0; epoch < 2; ++epoch) {
          std::vector<char> seen(kBatch * kBatches, 0);
          std::size_t batches = 0;
          for (auto& batch : loader) {
            const auto values = batch["i"];
            REQUIRE(values.numel() == static_cast<std::int64_t>(kBatch), values.numel());
            const auto* v = values.data_ptr<std::int64_t>();
            for (std::size_t r = 0; r < kBatch; ++r) {
              REQUIRE(v[r] == batch.indices()[r], "row ", r);
              REQUIRE(seen[static_cast<std::size_t>(v[r])]++ == 0, "index ", v[r], " twice");
            }
            ++batches;
          }
          REQUIRE(batches == kBatches, batches);
        }
        return 0;
      },
      60s);
}

INSTANTIATE_TEST_SUITE_P(Row14,
                         HugeBatches,
                         ::testing::Values(Case{true, 0ms},
                                           Case{false, 0ms},
                                           Case{true, 30'000ms},
                                           Case{false, 30'000ms}),
                         [](const auto& info) {
                           return std::string(info.param.in_order ? "InOrder" : "OutOfOrder") +
                                  (info.param.timeout.count() > 0 ? "WithTimeout" : "NoTimeout");
                         });

TEST(HugeBatches, TheLoaderDestroyedOnAnotherThreadWhileEveryQueueIsFullStopsWithinItsBound) {
  testing::in_child(
      [] {
        auto loader = std::make_unique<DataLoader>(
            std::make_shared<Scalars>(kBatch * kBatches),
            DataLoaderOptions{.batch_size = kBatch, .num_workers = 4, .prefetch_factor = 8});
        auto it = loader->begin();  // 32 tasks posted; the loop takes none of their batches
        std::this_thread::sleep_for(300ms);  // workers fill their replies and block
        const auto started = std::chrono::steady_clock::now();
        std::thread([&] { loader.reset(); }).join();
        const auto took = std::chrono::steady_clock::now() - started;
        REQUIRE(took < testing::scaled(5.0), "destroying took ",
                std::chrono::duration_cast<std::chrono::milliseconds>(took).count(), " ms");
        try {
          ++it;  // an iterator keeps its error for the dereference
          (void)it->size();
          REQUIRE(false, "next() after the loader was destroyed returned");
        } catch (const LoaderClosed&) {
        }
        return 0;
      },
      30s);
}

TEST(HugeBatches, AWorkerKilledInTheMiddleOfAMultiPacketReplyIsReportedAsADeadWorker) {
  // A reply of 65,536 indices spans many packets. The loop takes batch 0 and then nothing, so
  // the worker blocks part-way through sending batch 1; killed there, it must be reported as a
  // WorkerDiedError with its signal, not as a channel error.
  testing::in_child(
      [] {
        DataLoader loader(std::make_shared<Scalars>(kBatch * 4),
                          {.batch_size = kBatch, .num_workers = 1});
        auto it = loader.begin();
        std::this_thread::sleep_for(500ms);
        const auto workers = testing::children_of(::getpid());
        REQUIRE(workers.size() == 1, workers.size());
        ::kill(workers[0], SIGKILL);
        try {
          ++it;  // an iterator keeps its error for the dereference
          (void)it->size();
          REQUIRE(false, "the next batch came from a killed worker");
        } catch (const WorkerDiedError& e) {
          REQUIRE(e.signal() == SIGKILL, e.what());
        }
        return 0;
      },
      60s, /*workers_may_be_killed=*/true);
}

TEST(HugeBatches, AWorkerStoppedInTheMiddleOfAReplyIsWaitedForWithoutATimeout) {
  // timeout = 0 waits forever, as PyTorch does: a worker stopped (SIGSTOP) part-way through a
  // multi-packet reply is not an error after some fixed time; continued, its batch arrives.
  testing::in_child(
      [] {
        DataLoader loader(std::make_shared<Scalars>(kBatch * 4),
                          {.batch_size = kBatch, .num_workers = 1});
        auto it = loader.begin();
        std::this_thread::sleep_for(500ms);  // the worker is blocked part-way through batch 1
        const auto workers = testing::children_of(::getpid());
        REQUIRE(workers.size() == 1, workers.size());
        ::kill(workers[0], SIGSTOP);
        std::thread resume([pid = workers[0]] {
          std::this_thread::sleep_for(3s);  // past the 2 s after which a stall was an error
          ::kill(pid, SIGCONT);
        });
        ++it;  // reads what is there, then waits for the rest
        const bool ok = it->size() == kBatch && (*it)["i"][0].item<std::int64_t>() == kBatch;
        resume.join();
        REQUIRE(ok, "batch 1 is wrong");
        return 0;
      },
      60s);
}

// This process's peak resident memory (VmHWM), in bytes.
std::size_t peak_rss() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

TEST(HugeDatasets, ASequentialEpochOfABillionSamplesCostsNothingBeforeItsFirstBatch) {
  // The epoch's order is computed by position, never listed: 10^9 indices would be 8 GB.
  for (const std::size_t workers : {0u, 2u}) {
    testing::in_child(
        [workers] {
          const std::size_t before = peak_rss();
          DataLoader loader(std::make_shared<Scalars>(1'000'000'000),
                            {.batch_size = 256, .num_workers = workers});
          auto it = loader.begin();
          REQUIRE((*it)["i"][255].item<std::int64_t>() == 255);
          ++it;
          REQUIRE((*it)["i"][0].item<std::int64_t>() == 256);
          const std::size_t grew = peak_rss() - before;
          REQUIRE(grew < (256u << 20), "peak memory grew by ", grew, " bytes");
          return 0;
        },
        60s);
  }
}

TEST(HugeDatasets, ADistributedEpochOfABillionSamplesIsComputedByPosition) {
  testing::in_child(
      [] {
        const std::size_t before = peak_rss();
        auto sampler = std::make_shared<DistributedSampler>(
            1'000'000'000,
            DistributedSampler::Options{.num_replicas = 8, .rank = 3, .shuffle = false});
        DataLoader loader(std::make_shared<Scalars>(1'000'000'000),
                          {.batch_size = 4, .num_workers = 2}, sampler);
        auto it = loader.begin();
        REQUIRE((*it)["i"][1].item<std::int64_t>() == 11);  // rank 3 of 8: 3, 11, 19, ...
        const std::size_t grew = peak_rss() - before;
        REQUIRE(grew < (256u << 20), "peak memory grew by ", grew, " bytes");
        return 0;
      },
      60s);
}

}  // namespace
}  // namespace ferry
