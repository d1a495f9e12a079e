#pragma once

// The ledger dataset of RELIABILITY.md (c1): every byte of every sample is derived from (index,
// epoch), so a consumer can check each delivered byte and count each index exactly once.

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "ferry/dataset.h"

namespace ferry::testing {

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Sample i of epoch e: "payload" (uint8 [payload_bytes]) filled from splitmix64(i ^ e << 40),
// "index", "epoch", "worker", "pid", and "noise" from the sample's generator. Optional random
// per-sample delays (up to max_delay_us, seeded by index) and a straggler worker that sleeps
// `straggler_factor` times longer.
class LedgerDataset : public Dataset {
 public:
  LedgerDataset(std::size_t n,
                std::size_t payload_bytes = 256,
                int max_delay_us = 0,
                int straggler_worker = -1,
                int straggler_factor = 10)
      : n_(n),
        payload_bytes_(payload_bytes),
        max_delay_us_(max_delay_us),
        straggler_worker_(straggler_worker),
        straggler_factor_(straggler_factor) {}

  std::size_t size() const override { return n_; }

  static std::uint64_t word(std::int64_t index, std::uint64_t epoch, std::size_t k) {
    return splitmix64((static_cast<std::uint64_t>(index) ^ (epoch << 40)) + k);
  }

  Example get(std::size_t index, SampleContext& ctx) const override {
    if (max_delay_us_ > 0) {
      int delay = static_cast<int>(splitmix64(index) % static_cast<std::uint64_t>(max_delay_us_));
      if (static_cast<int>(ctx.worker_id()) == straggler_worker_) delay *= straggler_factor_;
      std::this_thread::sleep_for(std::chrono::microseconds(delay));
    }
    auto payload = torch::empty({static_cast<std::int64_t>(payload_bytes_)}, torch::kUInt8);
    auto* p = payload.data_ptr<std::uint8_t>();
    for (std::size_t k = 0; k < payload_bytes_; k += 8) {
      const std::uint64_t w = word(static_cast<std::int64_t>(index), ctx.epoch(), k / 8);
      std::memcpy(p + k, &w, std::min<std::size_t>(8, payload_bytes_ - k));
    }
    return Example{{"payload", payload},
                   {"index", static_cast<std::int64_t>(index)},
                   {"epoch", static_cast<std::int64_t>(ctx.epoch())},
                   {"worker", static_cast<std::int64_t>(ctx.worker_id())},
                   {"pid", static_cast<std::int64_t>(::getpid())},
                   {"noise", torch::rand({4}, ctx.generator())}};
  }

  // Checks every byte of row `row` of a batch's payload against (index, epoch); "" when right.
  static std::string check_row(const torch::Tensor& payload,
                               std::int64_t row,
                               std::int64_t index,
                               std::uint64_t epoch) {
    const auto bytes = static_cast<std::size_t>(payload.size(1));
    const auto* p = payload[row].data_ptr<std::uint8_t>();
    for (std::size_t k = 0; k < bytes; k += 8) {
      const std::uint64_t w = word(index, epoch, k / 8);
      if (std::memcmp(p + k, &w, std::min<std::size_t>(8, bytes - k)) != 0) {
        return "payload of index " + std::to_string(index) + " epoch " + std::to_string(epoch) +
               " is torn at byte " + std::to_string(k);
      }
    }
    return "";
  }

 private:
  std::size_t n_, payload_bytes_;
  int max_delay_us_;
  int straggler_worker_, straggler_factor_;
};

}  // namespace ferry::testing
