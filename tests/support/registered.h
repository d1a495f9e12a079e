#pragma once

// The test datasets as registered types, so every engine test can run under fork, spawn and
// forkserver: a spawned worker rebuilds them from the registry. test_main.cpp registers them
// before ferry::init. The builders below go through the registry, as a user's code would.

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>

#include "ferry/dataset.h"
#include "ferry/registry.h"

#include "support/datasets.h"
#include "support/ledger.h"

namespace ferry::testing {

// A dataset that misbehaves on one index: crash, exit, abort, hang.
class FaultyDataset : public LedgerDataset {
 public:
  enum class Fault { kSegfault, kExit3, kAbort, kTerminate, kQuickExit, kHang };
  FaultyDataset(std::size_t n, std::size_t bad, Fault fault)
      : LedgerDataset(n, 64), bad_(bad), fault_(fault) {}
  Example get(std::size_t index, SampleContext& ctx) const override {
    if (index == bad_) {
      // What a decoder says before it gives up: the error reporting the death quotes it.
      std::fprintf(stderr, "test.faulty: index %zu is bad\n", index);
      switch (fault_) {
        case Fault::kSegfault:
          std::raise(SIGSEGV);
          break;
        case Fault::kExit3:
          std::exit(3);
        case Fault::kAbort:
          std::abort();
        case Fault::kTerminate:
          std::terminate();
        case Fault::kQuickExit:
          std::quick_exit(4);
        case Fault::kHang:
          for (;;) ::pause();
      }
    }
    return LedgerDataset::get(index, ctx);
  }

 private:
  std::size_t bad_;
  Fault fault_;
};

// Registers test.range, test.affinity, test.failing, test.counting, test.ledger, test.faulty,
// test.slow_start, test.broken, test.drift, the transform test.shift and the collate test.sum_x.
void register_test_types(Registry& registry);

std::shared_ptr<Dataset> range(std::size_t n);
std::shared_ptr<Dataset> affinity(std::size_t n, int micros = 0);
std::shared_ptr<Dataset> failing(std::size_t n, std::size_t bad_from, std::size_t bad_to);
std::shared_ptr<IterableDataset> counting(std::size_t n,
                                          bool known_size = true,
                                          bool cursor = false);
std::shared_ptr<Dataset> ledger(std::size_t n,
                                std::size_t payload_bytes = 256,
                                int max_delay_us = 0,
                                int straggler_worker = -1,
                                int straggler_factor = 10);
std::shared_ptr<Dataset> faulty(std::size_t n, std::size_t bad, FaultyDataset::Fault fault);

}  // namespace ferry::testing
