#include "ferry/synthetic_dataset.h"

#include <chrono>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "ferry/error.h"
#include "ferry/sample_context.h"

namespace ferry {

SyntheticDataset::SyntheticDataset(Options options) : options_(std::move(options)) {
  FERRY_CHECK(options_.num_classes > 0, "SyntheticDataset: num_classes=", options_.num_classes,
              " must be positive");
  for (const auto d : options_.shape) {
    FERRY_CHECK(d >= 0, "SyntheticDataset: shape has a negative size ", d);
  }
}

Example SyntheticDataset::get(std::size_t index, SampleContext& /*ctx*/) const {
  FERRY_CHECK(index < options_.size, "SyntheticDataset: index ", index, " out of range for size ",
              options_.size);
  if (options_.load_us > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(options_.load_us));
  }
  // Seeded from (seed, index) only: the same sample every epoch, as a file on disk would be.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
      SampleContext::mix_seed(options_.seed, 0, static_cast<std::int64_t>(index)));
  at::Tensor data = options_.uint8
                        ? at::randint(0, 256, options_.shape, gen, at::TensorOptions(at::kByte))
                        : at::rand(options_.shape, gen);
  return Example{{"data", std::move(data)},
                 {"label", static_cast<std::int64_t>(index) % options_.num_classes}};
}

}  // namespace ferry
