// The parts of the loader's stats, trace and CPU placement that need no worker: the latency
// histogram's quantiles, which fast events are timed (TimingStride), the trace's ring, the
// worker_cpus grammar and the training thread's cores, the noisy-neighbour rule, and the stats of a
// loader without workers.

#include "loader/loader_stats.h"

#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/data_loader.h"
#include "ferry/error.h"

#include "loader/cpu_placement.h"
#include "loader/trace.h"
#include "support/datasets.h"

namespace ferry::detail {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(LatencyHistogram, QuantilesAreWithinTwoPercent) {
  LatencyHistogram h;
  EXPECT_EQ(h.quantile(0.5), 0.0);
  // 1 us .. 10 ms, evenly: the q-quantile is q x 10 ms.
  for (std::uint64_t us = 1; us <= 10000; ++us) h.record(us * 1000);
  EXPECT_EQ(h.count(), 10000u);
  EXPECT_NEAR(h.quantile(0.50), 0.005, 0.005 * 0.02);
  EXPECT_NEAR(h.quantile(0.99), 0.0099, 0.0099 * 0.02);
  EXPECT_NEAR(h.quantile(1.0), 0.010, 0.010 * 0.02);
  EXPECT_EQ(h.max_ns(), 10'000'000u);
  // Tiny and huge values keep their place too.
  LatencyHistogram edges;
  edges.record(0);
  edges.record(7);
  edges.record(std::uint64_t{1} << 62);
  EXPECT_EQ(edges.quantile(0.34), 7e-9);
  EXPECT_NEAR(edges.quantile(1.0), std::ldexp(1.0, 62) / 1e9, std::ldexp(1.0, 62) / 1e9 * 0.02);
  h.merge(edges);
  EXPECT_EQ(h.count(), 10003u);
}

TEST(Tracer, TheRingKeepsTheMostRecentEventsAndCountsTheRest) {
  Tracer t(100, 2);
  for (int i = 0; i < 1000; ++i) t.instant("tick " + std::to_string(i));
  EXPECT_EQ(t.recorded(), 100u);
  const std::string json = t.json();
  EXPECT_THAT(json, HasSubstr("\"dropped\":900"));
  EXPECT_THAT(json, HasSubstr("\"tick 999\""));
  EXPECT_THAT(json, HasSubstr("\"tick 900\""));
  EXPECT_THAT(json, ::testing::Not(HasSubstr("\"tick 899\"")));
  EXPECT_THAT(json, HasSubstr("\"name\":\"worker 1\""));
}

TEST(Tracer, AWorkersImplausibleSpansAreDroppedAndTextIsEscaped) {
  Tracer t(100, 1);
  const std::uint64_t now = Tracer::now_ns();
  t.worker_sample(0, now + 10, now + 5, 0, 0, 1);                // ends before it starts
  t.worker_sample(0, 1, 2, 0, 0, 2);                             // before the trace began
  t.worker_sample(0, now, now + 3'600'000'000'000ull, 0, 0, 3);  // an hour ahead
  EXPECT_EQ(t.recorded(), 0u);
  t.worker_sample(0, now, now + 1000, 0, 0, 4);
  t.instant("error", "a \"quoted\"\nline\\");
  EXPECT_EQ(t.recorded(), 2u);
  EXPECT_THAT(t.json(), HasSubstr(R"("message":"a \"quoted\"\nline\\")"));
}

PlacementInput machine(std::vector<int> thread, int current, int online) {
  return {.thread = std::move(thread), .current = current, .online = online, .configured = online};
}

TEST(WorkerCpus, ListsRangesAndTheTrainingThreadsCores) {
  const auto free8 = machine({0, 1, 2, 3, 4, 5, 6, 7}, 0, 8);
  EXPECT_TRUE(resolve_worker_cpus("", free8).empty());
  // A training thread that may run anywhere keeps the core it is on.
  EXPECT_THAT(resolve_worker_cpus("0-3", free8), ElementsAre(1, 2, 3));
  EXPECT_THAT(resolve_worker_cpus("5,2-3,3", free8), ElementsAre(2, 3, 5));
  // ...unless it is the only core listed.
  EXPECT_THAT(resolve_worker_cpus("0", free8), ElementsAre(0));
  // A training thread bound to cores keeps all of them.
  const auto bound = machine({0, 1}, 1, 8);
  EXPECT_THAT(resolve_worker_cpus("0-5", bound), ElementsAre(2, 3, 4, 5));
  EXPECT_THAT([&] { resolve_worker_cpus("0-1", bound); },
              ThrowsMessage<ConfigError>(HasSubstr("leaves the workers no core")));
  for (const char* bad : {"", "1-", "-1", "a", "3-1", "1,,2", "1.5"}) {
    if (std::string(bad).empty()) continue;
    EXPECT_THAT([&] { resolve_worker_cpus(bad, free8); },
                ThrowsMessage<ConfigError>(HasSubstr("expected cores and ranges")))
        << bad;
  }
  EXPECT_THAT([&] { resolve_worker_cpus("0-8", free8); },
              ThrowsMessage<ConfigError>(HasSubstr("core 8 does not exist")));
  EXPECT_THAT([&] { resolve_worker_cpus("gpu:x", free8); },
              ThrowsMessage<ConfigError>(HasSubstr("expected gpu:N")));
  EXPECT_EQ(format_cpu_list({0, 1, 2, 5, 7, 8}), "0-2,5,7-8");
}

TEST(WorkerCpus, GpuCoresWithoutNvmlSayWhatIsMissing) {
  if (void* nvml = ::dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_NOLOAD | RTLD_LOCAL);
      nvml != nullptr || ::dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL) != nullptr) {
    GTEST_SKIP() << "NVML is on this machine: the GPU tests cover gpu:N";
  }
  EXPECT_THAT(
      [&] {
        resolve_worker_cpus("gpu:0", machine({0, 1}, 0, 2));
      },
      ThrowsMessage<ConfigError>(
          HasSubstr("NVIDIA's NVML (libnvidia-ml.so.1, from the NVIDIA driver) is not")));
}

TEST(NoisyNeighbour, WorkersSaturateTheirCoresAtNinetyPercent) {
  EXPECT_TRUE(workers_saturate(1.8, 1.0, 2));
  EXPECT_FALSE(workers_saturate(1.7, 1.0, 2));
  EXPECT_FALSE(workers_saturate(1.0, 0.0, 2));
  EXPECT_FALSE(workers_saturate(1.0, 1.0, 0));
}

TEST(NoisyNeighbour, WarnsOnceWhenSaturatedEpochsAddUpToThirtySeconds) {
  NoisyNeighbourRule rule;
  // A short run (the demo's three one-second epochs) is not worth a warning.
  for (int epoch = 0; epoch < 3; ++epoch) EXPECT_FALSE(rule.observe(1.9, 1.0, 2));
  EXPECT_FALSE(rule.observe(1.0, 20.0, 2)) << "an epoch that left its cores free counts nothing";
  EXPECT_FALSE(rule.observe(19.0, 10.0, 2));  // 13 s saturated so far
  EXPECT_TRUE(rule.observe(38.0, 20.0, 2));   // 33 s
  EXPECT_FALSE(rule.observe(38.0, 20.0, 2)) << "once";
  NoisyNeighbourRule long_epoch;
  EXPECT_TRUE(long_epoch.observe(1.8 * 30, 30.0, 2));
}

class Sleepy : public Dataset {
 public:
  std::size_t size() const override { return 40; }
  Example get(std::size_t index, SampleContext&) const override {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return Example{{"index", static_cast<std::int64_t>(index)}};
  }
};

TEST(LoaderStatsInProcess, WithoutWorkersTheWaitIsTheLoading) {
  DataLoader loader(std::make_shared<Sleepy>(), {.batch_size = 4});
  const auto start = std::chrono::steady_clock::now();
  for (auto& batch : loader) (void)batch;
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const LoaderStats s = loader.stats();
  ASSERT_EQ(s.epochs.size(), 1u);
  const EpochStats& e = s.epochs[0];
  EXPECT_TRUE(e.finished);
  EXPECT_EQ(e.batches, 10u);
  EXPECT_EQ(e.samples, 40u);
  EXPECT_TRUE(e.workers.empty());
  // 10 batches of 4 x 2 ms: every batch waits at least 8 ms, and waiting is all the loop does.
  EXPECT_GE(e.wait.p50, 0.008 * 0.98);
  EXPECT_GE(e.wait.total, 0.080);
  EXPECT_NEAR(e.wait.total, e.seconds, 0.01 + 0.05 * e.seconds);
  EXPECT_NEAR(e.seconds, wall, 0.01 + 0.05 * wall);
  EXPECT_EQ(s.total.batches, 10u);
}

TEST(TimingStride, TimesEveryEventWhileEventsAreSlow) {
  TimingStride stride;
  std::uint64_t t = 1'000'000;
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(stride.due()) << i;
    // 15 us an event: slower than kFastNs, so each is timed and stands for itself alone.
    EXPECT_EQ(stride.timed(t, t + 15'000), 1u) << i;
    t += 15'000;
  }
  EXPECT_EQ(stride.stride(), 1u);
}

TEST(TimingStride, FastEventsAreTimedOneInAStrideThatStandsForAllOfThemUntilOneIsSlow) {
  TimingStride stride;
  std::uint64_t t = 1'000'000;
  std::uint64_t events = 0, represented = 0, timed = 0, last_timed_end = 0;
  // 1 us events back to back: the stride doubles up to its bound.
  for (int i = 0; i < 10'000; ++i) {
    const bool due = stride.due();
    ++events;
    if (due) {
      represented += stride.timed(t, t + 1'000);
      ++timed;
      last_timed_end = t + 1'000;
    }
    t += 1'000;
  }
  EXPECT_EQ(stride.stride(), TimingStride::kMaxStride);
  EXPECT_LT(timed, events / 50) << "most fast events are not timed";
  // Events of 1 us back to back fill their stretch: tiled() says the same as scaled().
  EXPECT_EQ(stride.tiled(1'000), stride.scaled(1'000));
  // What the timed events stand for is every event up to the last timed one.
  EXPECT_LE(represented, events);
  EXPECT_GT(represented + TimingStride::kMaxStride, events);

  // One slow event among the timed ones (a preempted one, the untimed before it 1 us each): back
  // to timing every event. It still stands for all 64 (counts stay exact), but its duration is
  // estimated for them as the stretch they lie in (about 113 us), not 64 x 50 us = 3.2 ms.
  while (!stride.due()) t += 1'000;
  const std::uint64_t stretch = t + 50'000 - last_timed_end;
  EXPECT_EQ(stride.timed(t, t + 50'000), TimingStride::kMaxStride);
  EXPECT_EQ(stride.scaled(50'000), stretch) << "never more than the time that passed";
  EXPECT_EQ(stride.scaled(25'000), stretch / 2) << "a part of it in proportion";
  EXPECT_EQ(stride.tiled(50'000), stretch) << "events that fill the stretch end to end";
  t += 50'000;
  EXPECT_EQ(stride.stride(), 1u);
  EXPECT_TRUE(stride.due());
}

TEST(TimingStride, AStretchOfSlowUntimedEventsGoesBackToTimingEveryOne) {
  TimingStride stride;
  std::uint64_t t = 1'000'000;
  while (stride.stride() < 16) {  // fast events until the stride is 16
    if (stride.due()) (void)stride.timed(t, t + 500);
    t += 1'000;
  }
  // The next 15 events go untimed and take 20 us each; the timed one after them is fast, but the
  // stretch since the previous timed one says the events were slow on average.
  std::uint32_t untimed = 0;
  while (!stride.due()) {
    t += 20'000;
    ++untimed;
  }
  EXPECT_EQ(untimed, 15u);
  EXPECT_EQ(stride.timed(t, t + 500), 16u);
  EXPECT_EQ(stride.stride(), 1u);
}

class Instant : public Dataset {
 public:
  std::size_t size() const override { return 50'000; }
  Example get(std::size_t index, SampleContext&) const override {
    return Example{{"index", static_cast<std::int64_t>(index)}};
  }
};

TEST(LoaderStatsInProcess, BatchesFasterThanAClockReadAreAllCountedAndTheirWaitsEstimated) {
  // Batches of one tiny sample come faster than kFastNs: the loop times one in a stride.
  DataLoader loader(std::make_shared<Instant>(), {.batch_size = 1});
  std::size_t batches = 0;
  for (auto& batch : loader) {
    ASSERT_EQ(batch["index"].item<std::int64_t>(), static_cast<std::int64_t>(batches));
    ++batches;
  }
  const EpochStats e = loader.stats().epochs.at(0);
  EXPECT_EQ(e.batches, 50'000u);
  EXPECT_EQ(e.samples, 50'000u);
  // The timed waits stand for every batch but, at most, the last stride's.
  EXPECT_LE(e.wait.count, 50'000u);
  EXPECT_GT(e.wait.count + TimingStride::kMaxStride, 50'000u);
  EXPECT_GT(e.wait.total, 0.0);
  EXPECT_LE(e.wait.total, e.seconds * 1.05 + 0.001);
  EXPECT_LE(e.wait.p50, e.wait.p99);
  EXPECT_LE(e.wait.p99, e.wait.max * 1.0001);
}

}  // namespace
}  // namespace ferry::detail
