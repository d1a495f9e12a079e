// Collation and shared-memory costs in the calling thread: ferry's default_collate (one allocation,
// one copy per sample) against torch::stack, for the `tensor` workload of the loader benchmark (64
// samples of float32 3x224x224, 38.5 MB a batch) and for tiny int64 samples (per-batch overhead).
//
//   build/bench/ferry_collate_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only

#include <cstring>

#include <benchmark/benchmark.h>

#include "ferry/collate.h"

#include "ipc/shared_memory.h"

namespace {

std::vector<ferry::Example> images(std::int64_t batch) {
  std::vector<ferry::Example> samples;
  const torch::Tensor image = torch::rand({3, 224, 224});
  for (std::int64_t i = 0; i < batch; ++i) {
    ferry::Example ex{{"image", image.clone()}, {"label", i}};
    ex.set_index(i);
    samples.push_back(std::move(ex));
  }
  return samples;
}

void BM_DefaultCollateImages(benchmark::State& state) {
  const auto samples = images(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(ferry::default_collate(samples));
  state.SetBytesProcessed(state.iterations() * state.range(0) * 3 * 224 * 224 * 4);
}

void BM_TorchStackImages(benchmark::State& state) {
  const auto samples = images(state.range(0));
  for (auto _ : state) {
    std::vector<torch::Tensor> tensors, labels;
    for (const auto& s : samples) {
      tensors.push_back(s["image"].tensor());
      labels.push_back(torch::scalar_tensor(s["label"].to_int(), torch::kLong));
    }
    benchmark::DoNotOptimize(torch::stack(tensors));
    benchmark::DoNotOptimize(torch::stack(labels));
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * 3 * 224 * 224 * 4);
}

void BM_DefaultCollateScalar(benchmark::State& state) {
  std::vector<ferry::Example> samples{ferry::Example{{"x", 1}}};
  for (auto _ : state) benchmark::DoNotOptimize(ferry::default_collate(samples));
}

// What one batch of the `tensor` workload costs to write into shared memory: a fresh segment
// (memfd, fallocate, map, write: the first batches of an epoch) against a recycled one (write
// only: every batch after that, once the training loop hands segments back).
constexpr std::size_t kBatchBytes = 64ull * 3 * 224 * 224 * 4;

void BM_FreshSegmentWrite(benchmark::State& state) {
  std::vector<std::byte> source(kBatchBytes, std::byte{1});
  for (auto _ : state) {
    auto memory = ferry::ipc::SharedMemory::create(kBatchBytes, "bench");
    auto mapping = ferry::ipc::MappedRegion::map_shared(memory.fd(), kBatchBytes, false);
    std::memcpy(mapping.data(), source.data(), kBatchBytes);
    benchmark::DoNotOptimize(mapping.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBatchBytes));
}

void BM_RecycledSegmentWrite(benchmark::State& state) {
  std::vector<std::byte> source(kBatchBytes, std::byte{1});
  auto memory = ferry::ipc::SharedMemory::create(kBatchBytes, "bench");
  auto mapping = ferry::ipc::MappedRegion::map_shared(memory.fd(), kBatchBytes, false);
  for (auto _ : state) {
    std::memcpy(mapping.data(), source.data(), kBatchBytes);
    benchmark::DoNotOptimize(mapping.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBatchBytes));
}

}  // namespace

BENCHMARK(BM_FreshSegmentWrite)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_RecycledSegmentWrite)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DefaultCollateImages)->Arg(64)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TorchStackImages)->Arg(64)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DefaultCollateScalar)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
