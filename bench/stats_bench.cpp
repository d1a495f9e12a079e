// What the always-on stats cost a batch in the training thread (DataLoader::stats()): two clock
// reads and the recorder's adds when every batch is timed, against the stride that times one in up
// to 64 when batches come faster than 100,000 a second (src/core/timing_stride.h). Divide by a
// batch's time (ferry_loader_bench --workloads tiny --workers 0: about 600 ns on a 2-core machine)
// for the share.
//
//   build/bench/ferry_stats_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only

#include <benchmark/benchmark.h>

#include "core/timing_stride.h"
#include "loader/loader_stats.h"
#include "loader/trace.h"

namespace {

using ferry::detail::StatsRecorder;
using ferry::detail::TimingStride;
using ferry::detail::Tracer;

void BM_ClockRead(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(Tracer::now_ns());
}
BENCHMARK(BM_ClockRead);

// Every batch timed, as below 100,000 batches a second.
void BM_StatsEveryBatchTimed(benchmark::State& state) {
  StatsRecorder recorder(0, {});
  const auto epoch = recorder.open(0);
  for (auto _ : state) {
    const std::uint64_t start = Tracer::now_ns();
    const std::uint64_t end = Tracer::now_ns();
    StatsRecorder::delivered(*epoch, start, end, 1);
  }
}
BENCHMARK(BM_StatsEveryBatchTimed);

// Batches back to back, as the loop takes them from a loader without workers on `tiny`.
void BM_StatsFastBatchesStride(benchmark::State& state) {
  StatsRecorder recorder(0, {});
  const auto epoch = recorder.open(0);
  TimingStride stride;
  for (auto _ : state) {
    if (stride.due()) {
      const std::uint64_t start = Tracer::now_ns();
      const std::uint64_t end = Tracer::now_ns();
      StatsRecorder::delivered(*epoch, start, end, 1, stride.timed(start, end));
    } else {
      StatsRecorder::counted(*epoch, 1);
    }
  }
  state.counters["stride"] = stride.stride();
}
BENCHMARK(BM_StatsFastBatchesStride);

}  // namespace

BENCHMARK_MAIN();
