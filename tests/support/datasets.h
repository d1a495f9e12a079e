#pragma once

// Small datasets the loader tests share.

#include <sched.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "ferry/dataset.h"

namespace ferry::testing {

// Sample i: {"x": a [2] float tensor {i, i + 0.5}, "index": i, "noise": a draw from the
// sample's generator}. The noise makes seeding visible.
class RangeDataset : public Dataset {
 public:
  explicit RangeDataset(std::size_t n) : n_(n) {}
  std::size_t size() const override { return n_; }
  Example get(std::size_t index, SampleContext& ctx) const override {
    const auto i = static_cast<float>(index);
    return Example{{"x", torch::tensor({i, i + 0.5f})},
                   {"index", static_cast<std::int64_t>(index)},
                   {"noise", torch::rand({3}, ctx.generator())}};
  }

 private:
  std::size_t n_;
};

// Sample i: {"index": i, "cpus": the cores the loading process may run on, as a bit mask of
// the first 63}; each get() sleeps `micros` first.
class AffinityDataset : public Dataset {
 public:
  AffinityDataset(std::size_t n, int micros) : n_(n), micros_(micros) {}
  std::size_t size() const override { return n_; }
  Example get(std::size_t index, SampleContext&) const override {
    if (micros_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(micros_));
    cpu_set_t set;
    CPU_ZERO(&set);
    std::int64_t mask = 0;
    if (::sched_getaffinity(0, sizeof set, &set) == 0) {
      for (int c = 0; c < 63; ++c) mask |= CPU_ISSET(c, &set) ? (std::int64_t{1} << c) : 0;
    }
    return Example{{"index", static_cast<std::int64_t>(index)}, {"cpus", mask}};
  }

 private:
  std::size_t n_;
  int micros_;
};

// Throws for every index in [bad_from, bad_to).
class FailingDataset : public RangeDataset {
 public:
  FailingDataset(std::size_t n, std::size_t bad_from, std::size_t bad_to)
      : RangeDataset(n), bad_from_(bad_from), bad_to_(bad_to) {}
  Example get(std::size_t index, SampleContext& ctx) const override {
    if (index >= bad_from_ && index < bad_to_) {
      throw std::runtime_error("cannot load sample " + std::to_string(index));
    }
    return RangeDataset::get(index, ctx);
  }

 private:
  std::size_t bad_from_, bad_to_;
};

// Counts 0..n-1 in each worker's stream; split between workers by worker_id. With `cursor`,
// the stream says where it stands (the next value) and seeks there, for checkpoints.
class CountingStream : public IterableDataset {
 public:
  explicit CountingStream(std::size_t n, bool known_size = true, bool cursor = false)
      : n_(n), known_size_(known_size), cursor_(cursor) {}
  std::unique_ptr<ExampleStream> stream(SampleContext& ctx) const override {
    struct Stream : ExampleStream {
      std::size_t next_value, step, end;
      bool has_cursor = false;
      std::optional<Example> next(SampleContext& ctx) override {
        if (next_value >= end) return std::nullopt;
        const auto v = static_cast<std::int64_t>(next_value);
        next_value += step;
        return Example{{"value", v}, {"noise", ctx.uniform()}};
      }
      std::optional<std::string> cursor() const override {
        if (!has_cursor) return std::nullopt;
        return "next=" + std::to_string(next_value);
      }
      void seek(const std::string& cursor) override {
        if (cursor.rfind("next=", 0) != 0) throw std::runtime_error("bad cursor " + cursor);
        next_value = std::stoull(cursor.substr(5));
      }
    };
    auto s = std::make_unique<Stream>();
    s->has_cursor = cursor_;
    s->next_value = ctx.worker_id();
    s->step = ctx.num_workers();
    s->end = n_;
    return s;
  }
  std::optional<std::size_t> size_hint() const override {
    return known_size_ ? std::optional<std::size_t>(n_) : std::nullopt;
  }

 private:
  std::size_t n_;
  bool known_size_;
  bool cursor_;
};

}  // namespace ferry::testing
