#pragma once

#include <cstdint>
#include <vector>

#include "ferry/dataset.h"

namespace ferry {

/// A map-style dataset of generated samples, for benchmarks, tests and trying a pipeline out:
/// sample i has `data` (a tensor of `shape`, float32 uniform in [0, 1) or uint8) and `label`
/// (i % num_classes). Its content depends on (seed, i) only. Registered as `synthetic`.
class SyntheticDataset : public Dataset {
 public:
  struct Options {
    std::size_t size = 1000;
    std::vector<std::int64_t> shape{3, 32, 32};
    bool uint8 = false;  // uint8 in [0, 255] instead of float32
    std::int64_t num_classes = 10;
    std::uint64_t seed = 0;
    /// Time each get() sleeps, standing in for reading and decoding (tests and benchmarks).
    std::uint64_t load_us = 0;
  };
  explicit SyntheticDataset(Options options);
  std::size_t size() const override { return options_.size; }
  Example get(std::size_t index, SampleContext& ctx) const override;

 private:
  Options options_;
};

}  // namespace ferry
