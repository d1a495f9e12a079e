#include "ferry/sample_context.h"

#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include "ferry/error.h"

namespace ferry {

namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

std::uint64_t SampleContext::mix_seed(std::uint64_t base_seed,
                                      std::uint64_t epoch,
                                      std::int64_t index) {
  std::uint64_t h = splitmix64(base_seed);
  h = splitmix64(h ^ epoch);
  return splitmix64(h ^ static_cast<std::uint64_t>(index));
}

SampleContext::SampleContext(std::uint64_t base_seed,
                             std::uint64_t epoch,
                             std::int64_t index,
                             std::size_t worker_id,
                             std::size_t num_workers)
    : base_seed_(base_seed),
      epoch_(epoch),
      index_(index),
      worker_id_(worker_id),
      num_workers_(num_workers),
      seed_(mix_seed(base_seed, epoch, index)) {}

SampleContext::SampleContext(std::uint64_t base_seed,
                             std::uint64_t epoch,
                             std::int64_t index,
                             std::size_t worker_id,
                             std::size_t num_workers,
                             std::uint64_t seed)
    : base_seed_(base_seed),
      epoch_(epoch),
      index_(index),
      worker_id_(worker_id),
      num_workers_(num_workers),
      seed_(seed) {}

SampleContext SampleContext::for_stream(std::uint64_t base_seed,
                                        std::uint64_t epoch,
                                        std::int64_t position,
                                        std::size_t worker_id,
                                        std::size_t num_workers) {
  // A stream's seeds live apart from map-style indices: mix the worker id in first.
  const std::uint64_t stream_seed = splitmix64(~base_seed ^ splitmix64(worker_id));
  return SampleContext(base_seed, epoch, position, worker_id, num_workers,
                       mix_seed(stream_seed, epoch, position));
}

at::Generator& SampleContext::generator() {
  if (!generator_) generator_ = at::detail::createCPUGenerator(seed_);
  return *generator_;
}

std::uint64_t SampleContext::random64() {
  at::Generator& gen = generator();
  auto* impl = at::check_generator<at::CPUGeneratorImpl>(gen);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return impl->random64();
}

double SampleContext::uniform(double low, double high) {
  // 53 random bits, as at::uniform_real_distribution does for doubles.
  const double u = static_cast<double>(random64() >> 11) * (1.0 / 9007199254740992.0);
  return low + u * (high - low);
}

std::int64_t SampleContext::randint(std::int64_t low, std::int64_t high) {
  FERRY_CHECK(low < high, "randint(", low, ", ", high, "): the range is empty; pass low < high");
  const auto range = static_cast<std::uint64_t>(high - low);
  return low + static_cast<std::int64_t>(random64() % range);
}

bool SampleContext::bernoulli(double p) { return uniform() < p; }

at::Tensor SampleContext::output(std::string_view field,
                                 c10::IntArrayRef sizes,
                                 c10::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype);
  if (outputs_ != nullptr) {
    if (void* memory = outputs_->find(position_, field, sizes, dtype)) {
      return at::from_blob(memory, sizes, options);
    }
  }
  return at::empty(sizes, options);
}

}  // namespace ferry
