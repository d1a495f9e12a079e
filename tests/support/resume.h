#pragma once

// The checkpoint tests' pattern (torchdata's _run_and_checkpoint): run a loader uninterrupted,
// run another to a stop point and take its state, resume a third from that state, and check that
// what the second consumed plus what the third delivered is the first run, batch for batch.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/data_loader.h"

namespace ferry::testing {

// One delivered batch: where it sits and what it holds (dataset indices, per-sample noise).
struct Delivered {
  std::uint64_t epoch = 0;
  std::size_t sequence = 0;
  std::vector<std::int64_t> indices;
  torch::Tensor noise;  // each sample's draw from its generator: equal only if seeded the same
};

inline Delivered record(const Batch& batch) {
  Delivered d{batch.epoch(), batch.sequence(), batch.indices(), {}};
  if (batch.contains("noise")) d.noise = batch["noise"].clone();
  return d;
}

// Every batch of epochs [loader.epoch(), last], in delivery order.
inline std::vector<Delivered> run_through(DataLoader& loader, std::uint64_t last) {
  std::vector<Delivered> out;
  while (loader.epoch() <= last) {
    for (auto& batch : loader) out.push_back(record(batch));
  }
  return out;
}

// Runs `loader` until it has delivered `stop` batches (counting from its first epoch; `stop`
// equal to an epoch's length stops inside the loop, on its last batch) and returns what it
// delivered and its state at that moment. With `after_loop`, the state is taken once the loop
// of the epoch holding the last batch has ended (between epochs) instead.
inline std::pair<std::vector<Delivered>, std::string> run_until(DataLoader& loader,
                                                                std::size_t stop,
                                                                bool after_loop = false) {
  std::vector<Delivered> out;
  if (stop == 0) return {out, loader.state()};
  for (;;) {
    for (auto it = loader.begin(); it != loader.end(); ++it) {
      out.push_back(record(*it));
      if (out.size() == stop && !after_loop) return {out, loader.state()};
    }
    if (out.size() >= stop) return {out, loader.state()};
  }
}

// Checks that `before` + `after` is `reference`: the same (epoch, batch) positions, each once,
// with the same indices and noise; in order when `in_order`.
inline void expect_continuation(const std::vector<Delivered>& reference,
                                const std::vector<Delivered>& before,
                                const std::vector<Delivered>& after,
                                bool in_order) {
  std::vector<Delivered> joined = before;
  joined.insert(joined.end(), after.begin(), after.end());
  ASSERT_EQ(joined.size(), reference.size())
      << before.size() << " batches before the checkpoint, " << after.size() << " after";
  std::map<std::pair<std::uint64_t, std::size_t>, const Delivered*> expected;
  for (const auto& d : reference) expected[{d.epoch, d.sequence}] = &d;
  std::map<std::pair<std::uint64_t, std::size_t>, int> seen;
  for (std::size_t i = 0; i < joined.size(); ++i) {
    const Delivered& got = joined[i];
    const auto key = std::make_pair(got.epoch, got.sequence);
    ASSERT_EQ(++seen[key], 1) << "epoch " << got.epoch << " batch " << got.sequence << " twice";
    ASSERT_TRUE(expected.count(key))
        << "epoch " << got.epoch << " batch " << got.sequence << " is not in the uninterrupted run";
    const Delivered& want = *expected[key];
    if (in_order) {
      EXPECT_EQ(got.epoch, reference[i].epoch) << "position " << i;
      EXPECT_EQ(got.sequence, reference[i].sequence) << "position " << i;
    }
    EXPECT_EQ(got.indices, want.indices) << "epoch " << got.epoch << " batch " << got.sequence;
    if (want.noise.defined()) {
      ASSERT_TRUE(got.noise.defined());
      EXPECT_TRUE(torch::equal(got.noise, want.noise))
          << "epoch " << got.epoch << " batch " << got.sequence << ": other random draws";
    }
  }
}

// Streams (out of order, batches' numbers depend on timing): every value of `reference`
// arrives once in `before` + `after`, with the same noise, whatever batch carried it.
inline void expect_same_values(const std::vector<Batch>& reference,
                               const std::vector<Batch>& before,
                               const std::vector<Batch>& after) {
  auto values = [](const std::vector<Batch>& batches) {
    std::map<std::int64_t, std::vector<double>> out;
    for (const Batch& b : batches) {
      const auto v = b["value"];
      const auto n = b["noise"];
      for (std::int64_t i = 0; i < v.size(0); ++i) {
        out[v[i].item<std::int64_t>()].push_back(n[i].item<double>());
      }
    }
    return out;
  };
  std::vector<Batch> joined = before;
  joined.insert(joined.end(), after.begin(), after.end());
  EXPECT_EQ(values(joined), values(reference));
}

}  // namespace ferry::testing
