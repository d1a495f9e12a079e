#include "support/registered.h"

#include <unistd.h>

#include <chrono>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "ferry/collate.h"

#include "support/timing.h"

namespace ferry::testing {

namespace {

const char* fault_name(FaultyDataset::Fault f) {
  switch (f) {
    case FaultyDataset::Fault::kSegfault:
      return "segfault";
    case FaultyDataset::Fault::kExit3:
      return "exit3";
    case FaultyDataset::Fault::kAbort:
      return "abort";
    case FaultyDataset::Fault::kTerminate:
      return "terminate";
    case FaultyDataset::Fault::kQuickExit:
      return "quick_exit";
    case FaultyDataset::Fault::kHang:
      return "hang";
  }
  return "?";
}

// Adds `by` to the "x" field.
class Shift : public Transform {
 public:
  explicit Shift(double by) : by_(by) {}
  Example operator()(Example example, SampleContext&) const override {
    example.set("x", example["x"].tensor() + by_);
    return example;
  }

 private:
  double by_;
};

// LibTorch work in a worker: a convolution, and the worker's intra-op thread count.
class Convolving : public Dataset {
 public:
  std::size_t size() const override { return 16; }
  Example get(std::size_t i, SampleContext& ctx) const override {
    auto x = torch::rand({1, 3, 32, 32}, ctx.generator());
    auto w = torch::rand({8, 3, 3, 3}, ctx.generator());
    auto y = at::conv2d(x, w).relu().matmul(torch::rand({30, 30}, ctx.generator()));
    return {{"y", y.sum()}, {"threads", at::get_num_threads()}, {"i", i}};
  }
};

}  // namespace

void register_test_types(Registry& r) {
  if (!r.claim_group("ferry.tests")) return;
  const KeySpec n{.name = "n", .type = ValueType::kInt, .required = true, .min = 0};
  r.add_dataset({.name = "test.range", .keys = {n}}, [](const Args& a) {
    return std::make_shared<RangeDataset>(a.get<std::size_t>("n"));
  });
  r.add_dataset({.name = "test.affinity",
                 .keys = {n, {.name = "micros", .type = ValueType::kInt, .default_value = 0}}},
                [](const Args& a) {
                  return std::make_shared<AffinityDataset>(
                      a.get<std::size_t>("n"), static_cast<int>(a.get<std::int64_t>("micros")));
                });
  r.add_dataset({.name = "test.failing",
                 .keys = {n,
                          {.name = "bad_from", .type = ValueType::kInt, .required = true},
                          {.name = "bad_to", .type = ValueType::kInt, .required = true}}},
                [](const Args& a) {
                  return std::make_shared<FailingDataset>(a.get<std::size_t>("n"),
                                                          a.get<std::size_t>("bad_from"),
                                                          a.get<std::size_t>("bad_to"));
                });
  r.add_iterable_dataset(
      {.name = "test.counting",
       .keys = {n,
                {.name = "known_size", .type = ValueType::kBool, .default_value = true},
                {.name = "cursor", .type = ValueType::kBool, .default_value = false}}},
      [](const Args& a) {
        return std::make_shared<CountingStream>(a.get<std::size_t>("n"), a.get<bool>("known_size"),
                                                a.get<bool>("cursor"));
      });
  r.add_dataset(
      {.name = "test.ledger",
       .keys = {n,
                {.name = "payload_bytes", .type = ValueType::kInt, .default_value = 256},
                {.name = "max_delay_us", .type = ValueType::kInt, .default_value = 0},
                {.name = "straggler_worker", .type = ValueType::kInt, .default_value = -1},
                {.name = "straggler_factor", .type = ValueType::kInt, .default_value = 10}}},
      [](const Args& a) {
        return std::make_shared<LedgerDataset>(
            a.get<std::size_t>("n"), a.get<std::size_t>("payload_bytes"),
            static_cast<int>(a.get<std::int64_t>("max_delay_us")),
            static_cast<int>(a.get<std::int64_t>("straggler_worker")),
            static_cast<int>(a.get<std::int64_t>("straggler_factor")));
      });
  r.add_dataset(
      {.name = "test.faulty",
       .keys = {n,
                {.name = "bad", .type = ValueType::kInt, .required = true},
                {.name = "fault",
                 .required = true,
                 .choices = {"segfault", "exit3", "abort", "terminate", "quick_exit", "hang"}}}},
      [](const Args& a) {
        const std::string name = a.get<std::string>("fault");
        auto fault = FaultyDataset::Fault::kSegfault;
        for (const auto f : {FaultyDataset::Fault::kSegfault, FaultyDataset::Fault::kExit3,
                             FaultyDataset::Fault::kAbort, FaultyDataset::Fault::kTerminate,
                             FaultyDataset::Fault::kQuickExit, FaultyDataset::Fault::kHang}) {
          if (name == fault_name(f)) fault = f;
        }
        return std::make_shared<FaultyDataset>(a.get<std::size_t>("n"), a.get<std::size_t>("bad"),
                                               fault);
      });
  // Its factory takes `delay_ms` to build in every process, plus `worker_delay_ms` in a worker
  // (not in the process whose pid is `main_pid`); `crash_in_worker` makes it crash there.
  r.add_dataset(
      {.name = "test.slow_start",
       .keys = {n,
                {.name = "delay_ms", .type = ValueType::kInt, .default_value = 0},
                {.name = "worker_delay_ms", .type = ValueType::kInt, .default_value = 0},
                {.name = "crash_in_worker", .type = ValueType::kBool, .default_value = false},
                {.name = "main_pid", .type = ValueType::kInt, .default_value = 0},
                // A file where each process appends the interval of its delay_ms (tests check
                // that workers' rebuilds overlapped).
                {.name = "interval_log", .default_value = ""}}},
      [](const Args& a) {
        const bool in_worker = ::getpid() != a.get<std::int64_t>("main_pid");
        const std::int64_t started = testing::monotonic_ns();
        std::this_thread::sleep_for(std::chrono::milliseconds(a.get<std::int64_t>("delay_ms")));
        if (const std::string log = a.get<std::string>("interval_log"); !log.empty()) {
          testing::append_interval(log, started, testing::monotonic_ns());
        }
        if (in_worker) {
          std::this_thread::sleep_for(
              std::chrono::milliseconds(a.get<std::int64_t>("worker_delay_ms")));
        }
        if (a.get<bool>("crash_in_worker") && in_worker) std::raise(SIGSEGV);
        return std::make_shared<RangeDataset>(a.get<std::size_t>("n"));
      });
  // Opens `root`: a missing folder is the factory's error, as an image folder's would be.
  r.add_dataset(
      {.name = "test.broken",
       .keys = {{.name = "root", .required = true},
                {.name = "fail_in_worker", .type = ValueType::kBool, .default_value = false},
                {.name = "main_pid", .type = ValueType::kInt, .default_value = 0}}},
      [](const Args& a) {
        const std::string root = a.get<std::string>("root");
        const bool in_worker = ::getpid() != a.get<std::int64_t>("main_pid");
        if (::access(root.c_str(), F_OK) != 0 || (a.get<bool>("fail_in_worker") && in_worker)) {
          a.fail("root", "folder '" + root + "' does not exist");
        }
        return std::make_shared<RangeDataset>(4);
      });
  // A key that exists only when FERRY_TEST_DRIFT is set at registration: a worker program
  // registered in another environment resolves the same node to another configuration, as
  // another build of the program would (the configuration hash differs).
  TypeInfo drift{.name = "test.drift", .keys = {n}};
  if (const char* flavour = std::getenv("FERRY_TEST_DRIFT")) {
    drift.keys.push_back({.name = "flavour", .default_value = flavour});
  }
  r.add_dataset(std::move(drift), [](const Args& a) {
    return std::make_shared<RangeDataset>(a.get<std::size_t>("n"));
  });
  r.add_dataset({.name = "test.convolve"},
                [](const Args&) { return std::make_shared<Convolving>(); });
  r.add_transform({.name = "test.shift",
                   .keys = {{.name = "by", .type = ValueType::kFloat, .default_value = 1.0}}},
                  [](const Args& a) { return std::make_shared<Shift>(a.get<double>("by")); });
  r.add_collate({.name = "test.sum_x"}, [](const Args&) -> CollateFn {
    return [](std::vector<Example> samples) {
      Batch batch = default_collate(std::move(samples));
      batch.set("sum", batch["x"].sum().reshape({1}));
      return batch;
    };
  });
}

std::shared_ptr<Dataset> range(std::size_t n) {
  return Registry::global().make_dataset(Config::map({{"type", "test.range"}, {"n", n}}));
}

std::shared_ptr<Dataset> affinity(std::size_t n, int micros) {
  return Registry::global().make_dataset(
      Config::map({{"type", "test.affinity"}, {"n", n}, {"micros", micros}}));
}

std::shared_ptr<Dataset> failing(std::size_t n, std::size_t bad_from, std::size_t bad_to) {
  return Registry::global().make_dataset(Config::map(
      {{"type", "test.failing"}, {"n", n}, {"bad_from", bad_from}, {"bad_to", bad_to}}));
}

std::shared_ptr<IterableDataset> counting(std::size_t n, bool known_size, bool cursor) {
  auto any = Registry::global().make_any_dataset(Config::map(
      {{"type", "test.counting"}, {"n", n}, {"known_size", known_size}, {"cursor", cursor}}));
  return std::get<std::shared_ptr<IterableDataset>>(any);
}

std::shared_ptr<Dataset> ledger(std::size_t n,
                                std::size_t payload_bytes,
                                int max_delay_us,
                                int straggler_worker,
                                int straggler_factor) {
  return Registry::global().make_dataset(Config::map({{"type", "test.ledger"},
                                                      {"n", n},
                                                      {"payload_bytes", payload_bytes},
                                                      {"max_delay_us", max_delay_us},
                                                      {"straggler_worker", straggler_worker},
                                                      {"straggler_factor", straggler_factor}}));
}

std::shared_ptr<Dataset> faulty(std::size_t n, std::size_t bad, FaultyDataset::Fault fault) {
  return Registry::global().make_dataset(
      Config::map({{"type", "test.faulty"}, {"n", n}, {"bad", bad}, {"fault", fault_name(fault)}}));
}

}  // namespace ferry::testing
