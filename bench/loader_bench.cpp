// Loader throughput: ferry's DataLoader against PyTorch's own DataLoader (bench/pytorch_peer.py,
// run with /usr/bin/python3) and LibTorch's thread-based torch::data loader, on the same
// workloads (bench/README.md); with --device cuda, batches delivered to a GPU and a synthetic
// GPU step. It reports; it never fails on a timing.
//
//   build/bench/ferry_loader_bench              # all workloads, 1 and 2 workers
//   build/bench/ferry_loader_bench --workloads tiny --workers 1,2,4 --seconds 3 --repeat 3
//   build/bench/ferry_loader_bench --repeat 3 --markdown   # the table for the README
//   build/bench/ferry_loader_bench --startup --repeat 9    # first batch per start method
//   build/bench/ferry_loader_bench --device cuda --workloads tensor --workers 1,4,8,16

#include <stdio.h>  // popen, pclose, getline
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <torch/cuda.h>
#include <torch/data.h>
#include <torch/version.h>

#if defined(FERRY_HAS_VISION)  // the jpeg workload and LibTorch's OpenCV peer
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

#include "ferry/ferry.h"

#include "ipc/files.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// ---------------------------------------------------------------------------------------------
// Workloads

enum class Workload { kTiny, kTensor, kTensorView, kJpeg };

constexpr std::int64_t kChannels = 3;
constexpr std::int64_t kHeight = 224;
constexpr std::int64_t kWidth = 224;
constexpr std::size_t kTensorBatch = 64;
constexpr std::size_t kImageBytes = kChannels * kHeight * kWidth * sizeof(float);

std::string_view name(Workload w) {
  switch (w) {
    case Workload::kTiny:
      return "tiny";
    case Workload::kTensor:
      return "tensor";
    case Workload::kTensorView:
      return "tensor-view";
    case Workload::kJpeg:
      return "jpeg";
  }
  return "?";
}

std::optional<Workload> parse_workload(std::string_view s) {
  for (Workload w : {Workload::kTiny, Workload::kTensor, Workload::kTensorView, Workload::kJpeg}) {
    if (s == name(w)) return w;
  }
  return std::nullopt;
}

constexpr std::size_t kJpegBatch = 32;

std::size_t batch_size(Workload w) {
  if (w == Workload::kJpeg) return kJpegBatch;
  return w == Workload::kTiny ? 1 : kTensorBatch;
}

// Bytes of batch payload: the int64 labels (or values) and the images. MB below is 10^6 bytes,
// as in pytorch_peer.py: a tensor batch is 38.5 MB.
std::size_t payload_bytes(Workload w) {
  return w == Workload::kTiny ? sizeof(std::int64_t)
                              : kTensorBatch * (kImageBytes + sizeof(std::int64_t));
}

// Batches read after the first and before timing starts, as pytorch_peer.py does: enough for
// every worker to have delivered and the prefetch pipeline to be running.
std::size_t warmup_batches(std::size_t num_workers) {
  return std::max<std::size_t>(3, 2 * num_workers);
}

// Device mode: ferry page-locks each recycled shared-memory segment once (about 50 ms for a
// 38.5 MB one) in its first batches, and PyTorch's and LibTorch's CUDA state warms up; a longer
// warm-up keeps those one-off costs out of the timed part. pytorch_peer.py uses the same.
std::size_t device_warmup_batches(std::size_t num_workers) {
  return std::max(warmup_batches(num_workers), 12 * num_workers + 8);
}
// ferry page-locks segments on a thread of its own, about 50 ms per 38.5 MB segment and a few
// segments per worker; until a segment is locked its batches take a pinned copy. Steady state
// begins once every segment is locked: ferry's device-mode runs warm up at least this long.
double device_warmup_seconds(std::size_t num_workers) {
  return std::max(0.5, 0.25 * static_cast<double>(num_workers));
}

// ferry: sample i is {"value": i} (tiny), or {"image": a clone of one stored float32 3x224x224
// tensor (tensor) or that tensor itself (tensor-view), "label": i}.
class FerryTiny : public ferry::Dataset {
 public:
  explicit FerryTiny(std::size_t size) : size_(size) {}
  std::size_t size() const override { return size_; }
  ferry::Example get(std::size_t index, ferry::SampleContext& /*ctx*/) const override {
    return ferry::Example{{"value", static_cast<std::int64_t>(index)}};
  }

 private:
  std::size_t size_;
};

class FerryImages : public ferry::Dataset {
 public:
  FerryImages(std::size_t size, bool clone)
      : size_(size), clone_(clone), stored_(torch::rand({kChannels, kHeight, kWidth})) {}
  std::size_t size() const override { return size_; }
  ferry::Example get(std::size_t index, ferry::SampleContext& /*ctx*/) const override {
    return ferry::Example{{"image", clone_ ? stored_.clone() : stored_},
                          {"label", static_cast<std::int64_t>(index)}};
  }

 private:
  std::size_t size_;
  bool clone_;
  torch::Tensor stored_;
};

// ---- jpeg: an ImageFolder of photo-sized JPEGs ----
//
// Generated once into --jpeg-dir: 500x375, quality 90, photo-like content (smooth gradients,
// overlapping shapes with soft edges, fine texture and sensor-like noise), in 4 class folders.
// Pipeline: RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize; batch_size 32.

struct JpegData {
  std::string dir;
  std::vector<std::string> files;  // sorted as ImageFolder walks them
  double mean_bytes = 0;
};

JpegData g_jpeg;  // set in main when the jpeg workload runs

// The jpeg workload needs ferry::vision (built when OpenCV is found) for its images and ferry's
// pipeline, and OpenCV for the decode-only rate and LibTorch's peer pipeline.
#if defined(FERRY_HAS_VISION)
constexpr bool kHaveJpeg = true;

const std::vector<double> kImagenetMean{0.485, 0.456, 0.406};
const std::vector<double> kImagenetStd{0.229, 0.224, 0.225};

JpegData prepare_jpeg_data(const std::string& dir, std::size_t count) {
  namespace fs = std::filesystem;
  JpegData data{dir, {}, 0};
  const fs::path marker = fs::path(dir) / (".complete_v3_" + std::to_string(count));
  if (!fs::exists(marker)) {
    std::fprintf(stderr, "generating %zu JPEGs (500x375, quality 90) in %s ...\n", count,
                 dir.c_str());
    fs::remove_all(dir);
    ferry::vision::write_sample_images(dir, {.classes = 4,
                                             .images_per_class = (count + 3) / 4,
                                             .width = 500,
                                             .height = 375,
                                             .quality = 90});
    std::ofstream(marker) << count << "\n";
  }
  std::error_code listed;
  for (const fs::path& folder : ferry::ipc::folders_under(dir, listed)) {
    for (const ferry::ipc::DirectoryEntry& entry : ferry::ipc::list_directory(folder, listed)) {
      if (fs::path(entry.name).extension() == ".jpg") {
        data.files.push_back((folder / entry.name).string());
      }
    }
  }
  if (listed) throw std::runtime_error("cannot list " + dir + ": " + listed.message());
  std::sort(data.files.begin(), data.files.end());
  if (data.files.empty()) throw std::runtime_error("no JPEGs in " + dir);
  double total = 0;
  for (const auto& f : data.files) total += static_cast<double>(fs::file_size(f));
  data.mean_bytes = total / static_cast<double>(data.files.size());
  return data;
}

// OpenCV's full-resolution decode alone, on one thread: the decode-only rate per core.
double decode_only_rate(const JpegData& data, double seconds) {
  std::vector<std::vector<unsigned char>> bytes;
  for (const auto& f : data.files) {
    std::ifstream in(f, std::ios::binary);
    bytes.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const int previous = cv::getNumThreads();
  cv::setNumThreads(1);
  std::size_t n = 0;
  const auto start = Clock::now();
  while (seconds_since(start) < seconds) {
    const cv::Mat img = cv::imdecode(bytes[n % bytes.size()], cv::IMREAD_COLOR);
    if (img.empty()) throw std::runtime_error("OpenCV could not decode a benchmark JPEG");
    ++n;
  }
  const double rate = static_cast<double>(n) / seconds_since(start);
  cv::setNumThreads(previous);
  return rate;
}

// LibTorch's thread loader with the same steps in OpenCV: decode, RandomResizedCrop's box (the
// same ten tries and fallback, from a per-sample std::mt19937), cv::resize (INTER_AREA when
// shrinking, as an antialiased resize), flip, then to float, normalised, C x H x W.
class LibTorchJpeg : public torch::data::datasets::Dataset<LibTorchJpeg> {
 public:
  torch::data::Example<> get(std::size_t index) override {
    const std::string& path = g_jpeg.files[index % g_jpeg.files.size()];
    cv::Mat bgr = cv::imread(path, cv::IMREAD_COLOR);
    if (bgr.empty()) throw std::runtime_error("cannot decode " + path);
    cv::Mat rgb;
    cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
    std::mt19937 gen(static_cast<std::uint32_t>(index));
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    const double area = static_cast<double>(rgb.rows) * rgb.cols;
    cv::Rect box(0, 0, rgb.cols, rgb.rows);
    for (int attempt = 0; attempt < 10; ++attempt) {
      const double target = area * (0.08 + 0.92 * unit(gen));
      const double ratio = std::exp(std::log(3.0 / 4.0) + unit(gen) * std::log(16.0 / 9.0));
      const int w = static_cast<int>(std::lround(std::sqrt(target * ratio)));
      const int h = static_cast<int>(std::lround(std::sqrt(target / ratio)));
      if (w > 0 && w <= rgb.cols && h > 0 && h <= rgb.rows) {
        box = cv::Rect(static_cast<int>(unit(gen) * (rgb.cols - w + 1)),
                       static_cast<int>(unit(gen) * (rgb.rows - h + 1)), w, h);
        break;
      }
    }
    cv::Mat resized;
    const bool shrink = box.width > 224 && box.height > 224;
    cv::resize(rgb(box), resized, cv::Size(224, 224), 0, 0,
               shrink ? cv::INTER_AREA : cv::INTER_LINEAR);
    if (unit(gen) < 0.5) cv::flip(resized, resized, 1);
    cv::Mat f;
    resized.convertTo(f, CV_32FC3, 1.0 / 255.0);
    torch::Tensor t = torch::from_blob(f.data, {224, 224, 3}, torch::kFloat32).permute({2, 0, 1});
    t = (t - torch::tensor(kImagenetMean, torch::kFloat32).view({3, 1, 1})) /
        torch::tensor(kImagenetStd, torch::kFloat32).view({3, 1, 1});
    return {t.contiguous(), torch::scalar_tensor(static_cast<std::int64_t>(index % 4))};
  }
  torch::optional<std::size_t> size() const override { return 1'000'000'000; }
};
#else
constexpr bool kHaveJpeg = false;
#endif  // FERRY_HAS_VISION

// The two datasets as registered types, so spawn and forkserver workers can rebuild them.
void register_bench_types() {
  auto& r = ferry::Registry::global();
  const ferry::KeySpec size{.name = "size", .type = ferry::ValueType::kInt, .required = true};
  r.add_dataset({.name = "bench.tiny", .keys = {size}}, [](const ferry::Args& a) {
    return std::make_shared<FerryTiny>(a.get<std::size_t>("size"));
  });
  r.add_dataset(
      {.name = "bench.images",
       .keys = {size, {.name = "clone", .type = ferry::ValueType::kBool, .default_value = true}}},
      [](const ferry::Args& a) {
        return std::make_shared<FerryImages>(a.get<std::size_t>("size"), a.get<bool>("clone"));
      });
}

std::shared_ptr<ferry::Dataset> make_ferry_dataset(Workload w, std::size_t samples) {
  if (w == Workload::kJpeg) {
    using ferry::Config;
    return ferry::Registry::global().make_dataset(Config::map(
        {{"type", "image_folder"},
         {"root", g_jpeg.dir},
         {"transforms",
          Config::list({Config::map({{"type", "random_resized_crop"}, {"size", 224}}),
                        Config::map({{"type", "random_horizontal_flip"}}),
                        Config::map({{"type", "to_tensor"}}),
                        Config::map({{"type", "normalize"},
                                     {"mean", Config::list({0.485, 0.456, 0.406})},
                                     {"std", Config::list({0.229, 0.224, 0.225})}})})}}));
  }
  if (w == Workload::kTiny) {
    return ferry::Registry::global().make_dataset(
        ferry::Config::map({{"type", "bench.tiny"}, {"size", samples}}));
  }
  return ferry::Registry::global().make_dataset(ferry::Config::map(
      {{"type", "bench.images"}, {"size", samples}, {"clone", w == Workload::kTensor}}));
}

// LibTorch's torch::data: the same samples as Example<data, target> (TensorExample for tiny).
class LibTorchTiny
    : public torch::data::datasets::Dataset<LibTorchTiny, torch::data::TensorExample> {
 public:
  torch::data::TensorExample get(std::size_t index) override {
    return {torch::scalar_tensor(static_cast<std::int64_t>(index), torch::kLong)};
  }
  torch::optional<std::size_t> size() const override { return kEndless; }

  // SequentialSampler is lazy, so a size this large costs nothing.
  static constexpr std::size_t kEndless = 1'000'000'000;
};

class LibTorchImages : public torch::data::datasets::Dataset<LibTorchImages> {
 public:
  explicit LibTorchImages(bool clone)
      : clone_(clone), stored_(torch::rand({kChannels, kHeight, kWidth})) {}
  torch::data::Example<> get(std::size_t index) override {
    return {clone_ ? stored_.clone() : stored_,
            torch::scalar_tensor(static_cast<std::int64_t>(index), torch::kLong)};
  }
  torch::optional<std::size_t> size() const override { return LibTorchTiny::kEndless; }

 private:
  bool clone_;
  torch::Tensor stored_;
};

// ---------------------------------------------------------------------------------------------
// Measuring

// How long each run is timed: a number of batches, or else a number of seconds.
struct Budget {
  std::optional<std::size_t> batches;
  double seconds = 2.0;
};

// "2 s" or "100 batches": how long each run is timed, for the tables' headers.
std::string describe_budget(const Budget& budget) {
  char text[64];
  if (budget.batches) {
    std::snprintf(text, sizeof text, "%zu batches", *budget.batches);
  } else {
    std::snprintf(text, sizeof text, "%g s", budget.seconds);
  }
  return text;
}

struct Run {
  std::size_t batches = 0;
  double seconds = 0;
  double first_batch_s = 0;
  bool epoch_ended = false;  // the dataset ran out before the budget did
  double batches_per_s() const { return seconds > 0 ? static_cast<double>(batches) / seconds : 0; }
};

// Waits for everything queued on `device` (a CUDA device) to finish.
void synchronize(const torch::Device& device) {
  torch::cuda::synchronize(device.has_index() ? device.index() : -1);
}

// Builds a loader with `open()` (which returns a `bool()` callable that loads the next batch, or
// returns false at the end of the epoch), then times the first batch from construction, a
// warm-up, and `budget`. With `sync` (device mode), the clock starts and stops on a
// synchronised device, so copies and steps still in flight count. The loader is destroyed after
// the clock stops.
template <class Open>
Run measure(Open&& open,
            std::size_t warmup,
            const Budget& budget,
            const std::optional<torch::Device>& sync = std::nullopt,
            double warmup_seconds = 0) {
  Run run;
  const auto constructed = Clock::now();
  auto next = open();
  if (!next()) throw std::runtime_error("the loader yielded no batch");
  run.first_batch_s = seconds_since(constructed);
  const auto warming = Clock::now();
  for (std::size_t i = 0; i < warmup || seconds_since(warming) < warmup_seconds; ++i) {
    if (!next()) throw std::runtime_error("the epoch ended during the warm-up");
  }
  if (sync) synchronize(*sync);  // the warm-up's copies and steps are done
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(budget.seconds));
  for (;;) {
    if (budget.batches && run.batches >= *budget.batches) break;
    if (!next()) {
      run.epoch_ended = true;
      break;
    }
    ++run.batches;
    if (!budget.batches && Clock::now() >= deadline) break;
  }
  if (sync) synchronize(*sync);
  run.seconds = seconds_since(start);
  return run;
}

// How one ferry measurement runs, beyond the workload, the worker count and the budget.
struct FerrySetup {
  ferry::StartMethod start_method = ferry::StartMethod::kFork;
  std::optional<torch::Device> device{};  // DataLoaderOptions::device
  bool pin_memory = false;
  std::function<void(const ferry::Batch&)> step{};  // runs on each batch, as a training step
  std::size_t warmup = 0;                           // 0: warmup_batches(num_workers)
  double warmup_seconds = 0;                        // and at least this long
  std::optional<torch::Device> sync{};              // see measure()
  // An upper bound on the rate (device mode: the raw copy's), which sizes the dataset for a
  // --seconds run without a probe run.
  std::optional<double> max_batches_per_s{};
};

// Opens a ferry loader over `capacity` batches of workload `w`.
auto ferry_opener(Workload w,
                  std::size_t num_workers,
                  std::size_t capacity,
                  const FerrySetup& setup = {}) {
  // Built through the registry, as spawn needs, and before the clock starts (as the peer does).
  std::shared_ptr<const ferry::Dataset> dataset = make_ferry_dataset(w, capacity * batch_size(w));
  return [=] {
    const ferry::DataLoaderOptions options{
        .batch_size = batch_size(w),
        .num_workers = num_workers,
        .pin_memory = setup.pin_memory,
        .start_method = num_workers > 0 ? std::optional(setup.start_method) : std::nullopt,
        .device = setup.device};
    // jpeg: a few hundred files, drawn with replacement for as many samples as the run needs.
    auto loader = w == Workload::kJpeg
                      ? std::make_shared<ferry::DataLoader>(
                            dataset, options,
                            std::make_shared<ferry::RandomSampler>(
                                dataset->size(), 0,
                                ferry::RandomSampler::Options{
                                    .replacement = true, .num_samples = capacity * batch_size(w)}))
                      : std::make_shared<ferry::DataLoader>(dataset, options);
    ferry::DataLoader::Iterator it = loader->begin();
    bool started = false;
    return [loader, it, started, step = setup.step]() mutable {
      if (started) ++it;
      started = true;
      if (it == ferry::DataLoader::Sentinel{}) return false;
      const ferry::Batch& batch = *it;  // rethrows an error from loading the batch
      if (step) step(batch);
      return true;
    };
  };
}

// ferry's samplers hand out a whole epoch of indices at once, so the dataset must be sized to
// the run: exactly, given a number of batches; given seconds, from the rate a short probe run
// measured (whose small dataset also gives a first-batch time untouched by sampler setup), or
// from an upper bound on the rate.
Run run_ferry(Workload w,
              std::size_t num_workers,
              const Budget& budget,
              const FerrySetup& setup = {}) {
  const std::size_t warmup = setup.warmup > 0 ? setup.warmup : warmup_batches(num_workers);
  if (budget.batches) {
    return measure(ferry_opener(w, num_workers, 1 + warmup + *budget.batches, setup), warmup,
                   budget, setup.sync, setup.warmup_seconds);
  }
  constexpr double kMaxBatches = 4e6;  // bounds the index lists ferry's sampler builds
  auto capacity_for = [&](double batches_per_s, double room) {
    const double expected =
        std::min(kMaxBatches, batches_per_s * (budget.seconds * room + setup.warmup_seconds));
    return 1 + warmup + static_cast<std::size_t>(std::ceil(expected)) + 16;
  };
  if (setup.max_batches_per_s) {
    return measure(ferry_opener(w, num_workers, capacity_for(*setup.max_batches_per_s, 2), setup),
                   warmup, budget, setup.sync, setup.warmup_seconds);
  }
  const std::size_t probe_batches = w == Workload::kTiny ? 2000 : w == Workload::kJpeg ? 6 : 16;
  const Run probe = measure(ferry_opener(w, num_workers, 1 + warmup + probe_batches, setup), warmup,
                            Budget{.batches = probe_batches}, setup.sync);  // sized for no more
  Run run = measure(ferry_opener(w, num_workers, capacity_for(probe.batches_per_s(), 2), setup),
                    warmup, budget, setup.sync, setup.warmup_seconds);
  run.first_batch_s = probe.first_batch_s;
  return run;
}

template <class Dataset, class Example>
auto libtorch_opener(std::size_t num_workers, Dataset dataset, std::size_t batch) {
  return [=]() mutable {
    auto loader =
        std::shared_ptr(torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
            std::move(dataset).map(torch::data::transforms::Stack<Example>()),
            torch::data::DataLoaderOptions().batch_size(batch).workers(num_workers)));
    auto it = loader->begin();
    bool started = false;
    return [loader, it, started]() mutable {
      if (started) ++it;
      started = true;
      if (it == loader->end()) return false;
      (void)*it;
      return true;
    };
  };
}

Run run_libtorch(Workload w, std::size_t num_workers, const Budget& budget) {
  const std::size_t warmup = warmup_batches(num_workers);
#if defined(FERRY_HAS_VISION)
  if (w == Workload::kJpeg) {
    return measure(libtorch_opener<LibTorchJpeg, torch::data::Example<>>(
                       num_workers, LibTorchJpeg(), batch_size(w)),
                   warmup, budget);
  }
#endif
  if (w == Workload::kTiny) {
    return measure(libtorch_opener<LibTorchTiny, torch::data::TensorExample>(
                       num_workers, LibTorchTiny(), batch_size(w)),
                   warmup, budget);
  }
  return measure(libtorch_opener<LibTorchImages, torch::data::Example<>>(
                     num_workers, LibTorchImages(w == Workload::kTensor), batch_size(w)),
                 warmup, budget);
}

// ---------------------------------------------------------------------------------------------
// Device mode (--device cuda): only <torch/torch.h>-level API, so that the benchmark also builds
// against a LibTorch without CUDA, where device mode exits at start-up.

// The host-to-device copy alone: one batch's bytes in a pinned host tensor, copied to the device
// with non_blocking=true in a loop and synchronised at the end. The ceiling for any loader.
Run run_raw_copy(Workload w, const torch::Device& device, const Budget& budget) {
  const auto bytes = static_cast<std::int64_t>(payload_bytes(w));
  const torch::Tensor host =
      torch::ones({bytes}, torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true));
  torch::Tensor target = torch::empty({bytes}, torch::TensorOptions(torch::kUInt8).device(device));
  for (int i = 0; i < 8; ++i) target.copy_(host, /*non_blocking=*/true);  // warm-up
  synchronize(device);
  Run run;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(budget.seconds));
  while (budget.batches ? run.batches < *budget.batches : Clock::now() < deadline) {
    target.copy_(host, /*non_blocking=*/true);
    ++run.batches;
  }
  synchronize(device);
  run.seconds = seconds_since(start);
  return run;
}

// A synthetic training step: a chain of k float32 matmuls of n x n on the device, calibrated
// once to about --gpu-step-ms. It starts from the sum of every tensor of the batch, so the GPU
// cannot begin it before the batch's copy has landed. pytorch_peer.py builds the same step.
class GpuStep {
 public:
  // Halves n from 4096 until one matmul takes at most an eighth of `target_ms`, takes k to fill
  // `target_ms`, then corrects k once from the whole step measured on `sample` (on the device).
  static GpuStep calibrate(const torch::Device& device,
                           double target_ms,
                           const ferry::Batch& sample) {
    GpuStep step;
    const auto options = torch::TensorOptions(torch::kFloat32).device(device);
    double one_ms = 0;
    for (step.n_ = 4096;; step.n_ /= 2) {
      step.a_ = torch::randn({step.n_, step.n_}, options);
      step.b_ = torch::randn({step.n_, step.n_}, options) / std::sqrt(static_cast<double>(step.n_));
      one_ms = median_ms(device, [&] { (void)torch::matmul(step.a_, step.b_); });
      if (one_ms <= target_ms / 8 || step.n_ <= 256) break;
    }
    step.zero_ = torch::zeros({}, options);
    step.k_ = std::max<std::int64_t>(1, std::llround(target_ms / one_ms));
    step.ms_ = median_ms(device, [&] { step(sample); });
    step.k_ = std::max<std::int64_t>(
        1, std::llround(static_cast<double>(step.k_) * target_ms / step.ms_));
    step.ms_ = median_ms(device, [&] { step(sample); });
    return step;
  }

  // Queues the step on the device; returns without waiting for it.
  void operator()(const ferry::Batch& batch) const {
    torch::Tensor sum = zero_;
    for (const std::string& field : batch) {
      if (batch.is_tensor(field)) sum = sum + batch[field].sum();
    }
    torch::Tensor x = a_ + sum * 1e-9;
    for (std::int64_t i = 0; i < k_; ++i) x = torch::matmul(x, b_);
  }

  std::int64_t n() const { return n_; }
  std::int64_t k() const { return k_; }
  double ms() const { return ms_; }  // measured at calibration, synchronised, median of 5

 private:
  // Median over 5 synchronised runs of `f`, after 2 unmeasured ones.
  template <class F>
  static double median_ms(const torch::Device& device, F&& f) {
    std::vector<double> ms;
    for (int i = 0; i < 7; ++i) {
      const auto start = Clock::now();
      f();
      synchronize(device);
      if (i >= 2) ms.push_back(seconds_since(start) * 1e3);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }

  std::int64_t n_ = 0;
  std::int64_t k_ = 1;
  double ms_ = 0;
  torch::Tensor a_, b_, zero_;
};

// One batch of workload `w` (tensor or tensor-view) already on `device`.
ferry::Batch device_batch(Workload w, const torch::Device& device) {
  const auto n = static_cast<std::int64_t>(batch_size(w));
  ferry::Batch batch(batch_size(w));
  batch.set("image", torch::rand({n, kChannels, kHeight, kWidth},
                                 torch::TensorOptions(torch::kFloat32).device(device)));
  batch.set("label", torch::arange(n, torch::TensorOptions(torch::kLong).device(device)));
  return batch;
}

// The step alone, on a batch already on the device: a loop of steps, synchronised at the end.
// Runs --batches steps, or as many as --seconds holds at the calibrated time.
Run run_step_alone(Workload w,
                   const GpuStep& step,
                   const torch::Device& device,
                   const Budget& budget) {
  const ferry::Batch batch = device_batch(w, device);
  const std::size_t steps =
      budget.batches
          ? *budget.batches
          : std::max<std::size_t>(10, static_cast<std::size_t>(budget.seconds * 1e3 / step.ms()));
  for (int i = 0; i < 3; ++i) step(batch);
  synchronize(device);
  const auto start = Clock::now();
  for (std::size_t i = 0; i < steps; ++i) step(batch);
  synchronize(device);
  return Run{.batches = steps, .seconds = seconds_since(start)};
}

// ---------------------------------------------------------------------------------------------
// Results

// The runs of one loader on one configuration, or why there are none.
struct Cell {
  std::vector<Run> runs;
  std::string error;
  bool skipped = false;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The unit of workload `w`'s throughput.
const char* throughput_unit(Workload w) {
  if (w == Workload::kJpeg) return "images/s";
  return w == Workload::kTiny ? "batches/s" : "MB/s";
}

// One run's throughput: batches/s for tiny, images/s for jpeg, MB/s otherwise.
double run_throughput(const Run& r, Workload w) {
  if (w == Workload::kJpeg) return r.batches_per_s() * static_cast<double>(kJpegBatch);
  return w == Workload::kTiny ? r.batches_per_s()
                              : r.batches_per_s() * static_cast<double>(payload_bytes(w)) / 1e6;
}

// The median of the runs' throughputs (run_throughput).
std::optional<double> throughput(const Cell& cell, Workload w) {
  if (cell.runs.empty()) return std::nullopt;
  std::vector<double> values;
  for (const Run& r : cell.runs) values.push_back(run_throughput(r, w));
  return median(values);
}

std::optional<double> first_batch(const Cell& cell) {
  if (cell.runs.empty()) return std::nullopt;
  std::vector<double> values;
  for (const Run& r : cell.runs) values.push_back(r.first_batch_s);
  return median(values);
}

struct Config {
  Workload workload;
  std::size_t num_workers;
};

struct Row {
  Config config;
  Cell ferry, pytorch, libtorch;
};

// ---------------------------------------------------------------------------------------------
// The PyTorch peer

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The number after `"key": ` in a JSON line, or nullopt.
std::optional<double> json_number(const std::string& line, const std::string& key) {
  const std::string pattern = "\"" + key + "\":";
  const std::size_t at = line.find(pattern);
  if (at == std::string::npos) return std::nullopt;
  const char* begin = line.c_str() + at + pattern.size();
  char* end = nullptr;
  const double value = std::strtod(begin, &end);
  if (end == begin) return std::nullopt;
  return value;
}

// The string after `"key": "`, or "".
std::string json_string(const std::string& line, const std::string& key) {
  const std::string pattern = "\"" + key + "\": \"";
  const std::size_t at = line.find(pattern);
  if (at == std::string::npos) return "";
  const std::size_t begin = at + pattern.size();
  const std::size_t end = line.find('"', begin);
  return end == std::string::npos ? "" : line.substr(begin, end - begin);
}

struct PeerResults {
  std::map<std::pair<std::string, std::size_t>, std::vector<Run>> runs;  // (workload, workers)
  // --gpu-step-ms: the step alone, as steps in seconds, per (workload, workers).
  std::map<std::pair<std::string, std::size_t>, std::vector<Run>> step_alone;
  std::string torch_version;
  std::string device_name;  // --device: torch.cuda.get_device_name()
  std::string step;         // --gpu-step-ms: the peer's calibrated step, in words
  std::string error;
};

PeerResults run_pytorch_peer(const std::string& python,
                             const std::string& peer,
                             const std::vector<Workload>& workloads,
                             const std::vector<std::size_t>& workers,
                             const Budget& budget,
                             int repeat,
                             const std::string& start_method = "fork",
                             const std::string& extra_args = "") {
  PeerResults out;
  std::string command = shell_quote(python) + " " + shell_quote(peer) + " --start-method " +
                        start_method + " --workload ";
  for (std::size_t i = 0; i < workloads.size(); ++i) {
    command += (i ? "," : "") + std::string(name(workloads[i]));
  }
  if (!g_jpeg.dir.empty()) command += " --image-root " + shell_quote(g_jpeg.dir);
  command += " --num-workers ";
  for (std::size_t i = 0; i < workers.size(); ++i) {
    command += (i ? "," : "") + std::to_string(workers[i]);
  }
  command += " --repeat " + std::to_string(repeat);
  command += budget.batches ? " --batches " + std::to_string(*budget.batches)
                            : " --seconds " + std::to_string(budget.seconds);
  command += extra_args;
  std::fprintf(stderr, "running: %s\n", command.c_str());
  std::fflush(nullptr);

  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    out.error = "popen failed: " + std::string(std::strerror(errno));
    return out;
  }
  char* buffer = nullptr;
  std::size_t capacity = 0;
  ssize_t length;
  while ((length = ::getline(&buffer, &capacity, pipe)) >= 0) {
    const std::string line(buffer, static_cast<std::size_t>(length));
    if (line.empty() || line[0] != '{') continue;
    const auto workers_seen = json_number(line, "num_workers");
    const auto batches = json_number(line, "batches");
    const auto seconds = json_number(line, "seconds");
    const auto first = json_number(line, "first_batch_s");
    if (!workers_seen || !batches || !seconds || !first) continue;
    Run run;
    run.batches = static_cast<std::size_t>(*batches);
    run.seconds = *seconds;
    run.first_batch_s = *first;
    const std::pair<std::string, std::size_t> key{json_string(line, "workload"),
                                                  static_cast<std::size_t>(*workers_seen)};
    out.runs[key].push_back(run);
    out.torch_version = json_string(line, "torch");
    if (std::string device = json_string(line, "device_name"); !device.empty()) {
      out.device_name = std::move(device);
    }
    const auto steps = json_number(line, "step_alone_steps");
    const auto step_seconds = json_number(line, "step_alone_seconds");
    if (steps && step_seconds) {
      out.step_alone[key].push_back(
          Run{.batches = static_cast<std::size_t>(*steps), .seconds = *step_seconds});
    }
    const auto step_n = json_number(line, "step_n");
    const auto step_k = json_number(line, "step_k");
    const auto step_ms = json_number(line, "step_ms");
    if (step_n && step_k && step_ms) {
      char text[128];
      std::snprintf(text, sizeof text, "%.0f x matmul %.0fx%.0f, %.2f ms", *step_k, *step_n,
                    *step_n, *step_ms);
      out.step = text;
    }
  }
  std::free(buffer);
  const int status = ::pclose(pipe);
  if (status != 0) {
    out.error = "`" + command + "` exited with status " +
                std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                " (its stderr is above)";
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Output

std::string format_value(const Cell& cell, std::optional<double> value, int decimals) {
  if (cell.skipped) return "-";
  if (!value) return cell.error.empty() ? "n/a" : "error";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, *value);
  return buf;
}

std::string format_ratio(std::optional<double> a, std::optional<double> b) {
  if (!a || !b || *b <= 0) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2fx", *a / *b);
  return buf;
}

// The first `text_columns` columns are names (left-aligned), the rest numbers (right-aligned).
void print_table(const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows,
                 std::size_t text_columns,
                 bool markdown) {
  if (markdown) {
    auto line = [](const std::vector<std::string>& cells) {
      std::string s = "|";
      for (const auto& c : cells) s += " " + c + " |";
      std::printf("%s\n", s.c_str());
    };
    line(header);
    std::string rule = "|";
    for (std::size_t i = 0; i < header.size(); ++i) rule += i < text_columns ? " --- |" : " ---: |";
    std::printf("%s\n", rule.c_str());
    for (const auto& r : rows) line(r);
    return;
  }
  std::vector<std::size_t> width(header.size());
  for (std::size_t i = 0; i < header.size(); ++i) width[i] = header[i].size();
  for (const auto& r : rows) {
    for (std::size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s;
    for (std::size_t i = 0; i < cells.size(); ++i) {
      const std::string pad(width[i] - cells[i].size(), ' ');
      s += i < text_columns ? cells[i] + pad : pad + cells[i];
      if (i + 1 < cells.size()) s += "  ";
    }
    std::printf("%s\n", s.c_str());
  };
  line(header);
  std::size_t total = 0;
  for (std::size_t w : width) total += w + 2;
  std::printf("%s\n", std::string(total - 2, '-').c_str());
  for (const auto& r : rows) line(r);
}

// ---------------------------------------------------------------------------------------------
// Command line

// All workloads this build has: jpeg only with ferry::vision (OpenCV).
std::vector<Workload> all_workloads() {
  std::vector<Workload> out{Workload::kTiny, Workload::kTensor, Workload::kTensorView};
  if (kHaveJpeg) out.push_back(Workload::kJpeg);
  return out;
}

struct Args {
  std::vector<Workload> workloads = all_workloads();
  bool workloads_given = false;
  std::vector<std::size_t> workers{1, 2};
  Budget budget;
  int repeat = 1;
  bool markdown = false;
  std::string json;     // --json FILE: every result, as a JSON document
  std::string command;  // argv, joined with spaces (for --json)
  bool peers = true;
  bool startup = false;
  std::string peer;
  std::string python = "/usr/bin/python3";
  std::string jpeg_dir = (std::filesystem::temp_directory_path() / "ferry_bench_jpeg").string();
  std::size_t jpeg_images = 512;
  std::optional<torch::Device> device{};  // device mode
  double gpu_step_ms = 4;                 // device mode's GPU step; 0: none
  bool gpu_step_given = false;
  bool huge = false;    // --huge: time to first batch and peak memory of huge epochs
  bool resume = false;  // --resume: time from load_state() to the first batch
  bool workers_given = false;
};

std::string default_peer() {
#ifdef FERRY_BENCH_DIR
  return std::string(FERRY_BENCH_DIR) + "/pytorch_peer.py";
#else
  // This source file's folder, as the compiler saw it.
  const std::string file = __FILE__;
  const std::size_t slash = file.rfind('/');
  return (slash == std::string::npos ? std::string(".") : file.substr(0, slash)) +
         "/pytorch_peer.py";
#endif
}

constexpr const char* kUsage =
    "usage: ferry_loader_bench [--workloads tiny,tensor,tensor-view,jpeg] [--workers 1,2]\n"
    "                          [--seconds S | --batches N] [--repeat R] [--markdown]\n"
    "                          [--json FILE]\n"
    "                          [--no-peers] [--peer PATH] [--python PATH]\n"
    "                          [--startup | --huge | --resume]\n"
    "                          [--device cuda[:N] [--gpu-step-ms X]]\n"
    "Loader throughput of ferry, PyTorch (pytorch_peer.py) and LibTorch's torch::data loader.\n"
    "  --workloads   comma list (default: all; jpeg needs a build with OpenCV)\n"
    "  --workers     comma list of num_workers (default: 1,2)\n"
    "  --seconds S   time each run for S seconds (default: 2)\n"
    "  --batches N   time each run for N batches instead\n"
    "  --repeat R    runs per configuration; the table shows the median (default: 1)\n"
    "  --markdown    print Markdown tables (for the README)\n"
    "  --json FILE   also write every result (the medians, and each run's value) to FILE as\n"
    "                JSON, for bench/plot_workers.py (not with --startup, --huge, --resume,\n"
    "                --device)\n"
    "  --no-peers    measure ferry only (no PyTorch, no LibTorch)\n"
    "  --huge        only time to first batch and peak memory of one epoch of 10^6 to 10^9\n"
    "                samples (sequential; 10^8 shuffled, beside a bare randperm), each run in\n"
    "                a fresh process, against PyTorch's DataLoader (default workers: 2)\n"
    "  --resume      only the cost of resuming mid-epoch: time from load_state() to the\n"
    "                first batch at 10%, 50% and 90% of an epoch of 10^6 and 10^8 samples,\n"
    "                against the same loader starting the epoch, the state's size, and\n"
    "                loading half the epoch (how to get there without a checkpoint); each\n"
    "                run in a fresh process (default workers: 2)\n"
    "  --startup     only time to first batch, for each start method (fork, forkserver,\n"
    "                spawn) against PyTorch's fork and spawn (default workers: 2)\n"
    "  --peer PATH   pytorch_peer.py (default: next to this benchmark's source)\n"
    "  --python PATH the Python with torch (default: /usr/bin/python3)\n"
    "  --jpeg-dir D  where the jpeg workload's images are generated (default: $TMPDIR/\n"
    "                ferry_bench_jpeg); --jpeg-images N of them, in 4 classes (default\n"
    "                512; rounded up to a multiple of 4)\n"
    "  --device D    device mode (cuda or cuda:N): MB/s of tensor and tensor-view batches\n"
    "                delivered to the GPU by ferry without and with a device, with\n"
    "                pin_memory, the raw pinned copy, and PyTorch with pin_memory and\n"
    "                .to(non_blocking=True); then the GPU step table (default workloads:\n"
    "                tensor,tensor-view; ferry's workers fork after CUDA started)\n"
    "  --gpu-step-ms X  device mode: a synthetic GPU step (matmuls on the batch) calibrated\n"
    "                to X ms, the loop with it against the step alone (default: 4; 0: off)\n";

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  while (begin <= s.size()) {
    const std::size_t end = std::min(s.find(',', begin), s.size());
    if (end > begin) out.push_back(s.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "ferry_loader_bench: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

std::size_t parse_count(const std::string& option, const std::string& value, std::size_t min) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || value[0] == '-' || n < min) {
    usage_error(option + " " + value + ": expected an integer >= " + std::to_string(min));
  }
  return static_cast<std::size_t>(n);
}

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 0; i < argc; ++i) args.command += (i ? " " : "") + std::string(argv[i]);
  for (int i = 1; i < argc; ++i) {
    std::string option = argv[i];
    std::optional<std::string> inline_value;
    if (const std::size_t eq = option.find('='); option.rfind("--", 0) == 0 && eq != option.npos) {
      inline_value = option.substr(eq + 1);
      option.resize(eq);
    }
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) usage_error(option + " needs a value");
      return argv[++i];
    };
    if (option == "--help" || option == "-h") {
      std::printf("%s", kUsage);
      std::exit(0);
    } else if (option == "--workloads") {
      args.workloads.clear();
      args.workloads_given = true;
      for (const std::string& s : split(value())) {
        const auto w = parse_workload(s);
        if (!w) usage_error("--workloads " + s + ": expected tiny, tensor, tensor-view or jpeg");
        if (*w == Workload::kJpeg && !kHaveJpeg) {
          usage_error(
              "--workloads jpeg: this build has no OpenCV, so it has no jpeg workload (ferry's "
              "vision library was not built); install OpenCV (Debian: libopencv-dev) and "
              "reconfigure, or choose tiny, tensor or tensor-view");
        }
        args.workloads.push_back(*w);
      }
      if (args.workloads.empty()) usage_error("--workloads: give at least one");
    } else if (option == "--workers") {
      args.workers.clear();
      args.workers_given = true;
      for (const std::string& s : split(value())) args.workers.push_back(parse_count(option, s, 0));
      if (args.workers.empty()) usage_error("--workers: give at least one count");
    } else if (option == "--seconds") {
      const std::string v = value();
      char* end = nullptr;
      args.budget.seconds = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(args.budget.seconds > 0)) {
        usage_error("--seconds " + v + ": expected a positive number");
      }
      args.budget.batches.reset();
    } else if (option == "--batches") {
      args.budget.batches = parse_count(option, value(), 1);
    } else if (option == "--repeat") {
      args.repeat = static_cast<int>(parse_count(option, value(), 1));
    } else if (option == "--markdown") {
      args.markdown = true;
    } else if (option == "--json") {
      args.json = value();
      if (args.json.empty()) usage_error("--json needs a file name");
    } else if (option == "--huge") {
      args.huge = true;
    } else if (option == "--resume") {
      args.resume = true;
    } else if (option == "--startup") {
      args.startup = true;
    } else if (option == "--no-peers") {
      args.peers = false;
    } else if (option == "--peer") {
      args.peer = value();
    } else if (option == "--python") {
      args.python = value();
    } else if (option == "--jpeg-dir") {
      args.jpeg_dir = value();
    } else if (option == "--jpeg-images") {
      args.jpeg_images = parse_count(option, value(), 8);
    } else if (option == "--device") {
      const std::string v = value();
      std::optional<torch::Device> device;
      try {
        device = torch::Device(v);
      } catch (const std::exception&) {
      }
      if (!device || !device->is_cuda()) {
        usage_error("--device " + v + ": expected cuda or cuda:N");
      }
      args.device = device;
    } else if (option == "--gpu-step-ms") {
      const std::string v = value();
      char* end = nullptr;
      args.gpu_step_ms = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(args.gpu_step_ms >= 0)) {
        usage_error("--gpu-step-ms " + v + ": expected a number of milliseconds >= 0");
      }
      args.gpu_step_given = true;
    } else {
      usage_error("unknown option " + option);
    }
  }
  if (args.device && args.startup) usage_error("--device and --startup: choose one");
  if (args.gpu_step_given && !args.device) usage_error("--gpu-step-ms needs --device");
  if (!args.json.empty() && (args.startup || args.huge || args.resume || args.device)) {
    usage_error(
        "--json writes the throughput tables only: leave it out with --startup, --huge, "
        "--resume and --device");
  }
  if (args.peer.empty()) args.peer = default_peer();
  return args;
}

// "loader workload workers=N", for the progress lines.
std::string describe(const std::string& loader, const Config& c) {
  char text[128];
  std::snprintf(text, sizeof text, "%-8s %-12s workers=%zu", loader.c_str(),
                std::string(name(c.workload)).c_str(), c.num_workers);
  return text;
}

// Runs `body` `repeat` times into `cell`; an exception ends the cell with its message.
template <class Body>
void collect(Cell& cell, int repeat, const std::string& what, Body&& body) {
  for (int r = 0; r < repeat; ++r) {
    std::fprintf(stderr, "%s run %d/%d ... ", what.c_str(), r + 1, repeat);
    std::fflush(stderr);
    try {
      const Run run = body();
      cell.runs.push_back(run);
      std::fprintf(stderr, "%zu batches in %.2f s (first batch %.3f s)%s\n", run.batches,
                   run.seconds, run.first_batch_s, run.epoch_ended ? ", epoch ended early" : "");
    } catch (const std::exception& e) {
      cell.error = e.what();
      const std::string first_line = cell.error.substr(0, cell.error.find('\n'));
      std::fprintf(stderr, "error: %s\n", first_line.c_str());
      return;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// --json

// `s` as a JSON string: quoted, with quotes, backslashes and control characters escaped.
std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x",
                    static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += escaped;
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

// `v` as a JSON number; null when there is none or it is not finite.
std::string json_value(std::optional<double> v) {
  if (!v || !std::isfinite(*v)) return "null";
  char text[32];
  std::snprintf(text, sizeof text, "%.10g", *v);
  return text;
}

// The processor's model name from /proc/cpuinfo, or "" where it has none.
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::size_t begin = line.find_first_not_of(" \t", colon + 1);
    return begin == std::string::npos ? "" : line.substr(begin);
  }
  return "";
}

// Writes every result of the throughput table to `path` as one JSON document (--json): per
// workload, loader and worker count the median the table shows and each run's value, in the
// table's unit, and the median time to first batch. Loaders not run are left out; a loader that
// failed has "error" (and "value": null when no run finished). Returns false, having said why on
// stderr, when the file cannot be written.
bool write_json(const std::string& path,
                const Args& args,
                const std::vector<Row>& rows,
                const PeerResults& peer,
                double decode_only) {
  std::string out = "{\n  \"format\": \"ferry.loader_bench\",\n  \"version\": 1,\n";
  out += "  \"command\": " + json_quote(args.command) + ",\n";
  out += "  \"machine\": {\"cpus\": " + std::to_string(std::thread::hardware_concurrency());
  if (const std::string model = cpu_model(); !model.empty()) {
    out += ", \"model\": " + json_quote(model);
  }
  if (!peer.torch_version.empty()) out += ", \"torch\": " + json_quote(peer.torch_version);
  char libtorch[48];
  std::snprintf(libtorch, sizeof libtorch, "%d.%d.%d", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR,
                TORCH_VERSION_PATCH);
  out += ", \"libtorch\": " + json_quote(libtorch) + ", \"ferry\": " + json_quote(FERRY_VERSION) +
         "},\n";
  out += "  \"repeat\": " + std::to_string(args.repeat) + ",\n";
  if (args.budget.batches) {
    out += "  \"budget\": {\"batches\": " + std::to_string(*args.budget.batches) + "},\n";
  } else {
    out += "  \"budget\": {\"seconds\": " + json_value(args.budget.seconds) + "},\n";
  }
  if (!g_jpeg.dir.empty()) {
    out += "  \"jpeg\": {\"dir\": " + json_quote(g_jpeg.dir) +
           ", \"files\": " + std::to_string(g_jpeg.files.size()) +
           ", \"mean_bytes\": " + json_value(g_jpeg.mean_bytes) +
           ", \"decode_only_images_per_s\": " + json_value(decode_only) + "},\n";
  }
  out += "  \"results\": [";
  bool first = true;
  for (const Row& row : rows) {
    const Workload w = row.config.workload;
    const std::pair<const char*, const Cell*> cells[] = {
        {"ferry", &row.ferry}, {"pytorch", &row.pytorch}, {"libtorch", &row.libtorch}};
    for (const auto& [loader, cell] : cells) {
      if (cell->skipped) continue;
      std::string runs;
      for (const Run& r : cell->runs) {
        runs += (runs.empty() ? "" : ", ") + json_value(run_throughput(r, w));
      }
      std::optional<double> first_batch_ms;
      if (const auto s = first_batch(*cell)) first_batch_ms = *s * 1e3;
      out += first ? "\n    {" : ",\n    {";
      first = false;
      out += "\"workload\": " + json_quote(name(w)) + ", \"loader\": " + json_quote(loader) +
             ", \"workers\": " + std::to_string(row.config.num_workers) +
             ", \"value\": " + json_value(throughput(*cell, w)) +
             ", \"unit\": " + json_quote(throughput_unit(w)) + ", \"runs\": [" + runs +
             "], \"first_batch_ms\": " + json_value(first_batch_ms);
      if (!cell->error.empty()) out += ", \"error\": " + json_quote(cell->error);
      out += "}";
    }
  }
  out += first ? "]\n}\n" : "\n  ]\n}\n";

  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << out;
  file.close();
  if (!file) {
    std::fprintf(stderr, "ferry_loader_bench: --json %s: could not write the file\n", path.c_str());
    return false;
  }
  std::fprintf(stderr, "wrote %s\n", path.c_str());
  return true;
}

}  // namespace

// Time to first batch (from constructing the loader) under each start method, next to
// PyTorch's fork and spawn on the same datasets, in one run.
int run_startup(Args args) {
  const bool workers_given =
      !(args.workers.size() == 2 && args.workers[0] == 1 && args.workers[1] == 2);
  if (!workers_given) args.workers = {2};
  const ferry::StartMethod methods[] = {ferry::StartMethod::kFork, ferry::StartMethod::kForkserver,
                                        ferry::StartMethod::kSpawn};
  struct StartRow {
    Config config;
    Cell ferry[3];
    Cell pytorch[2];  // fork, spawn
  };
  std::vector<StartRow> rows;
  for (Workload w : args.workloads) {
    for (std::size_t n : args.workers) rows.push_back(StartRow{Config{w, n}, {}, {}});
  }
  const Budget one{.batches = 1};
  for (StartRow& row : rows) {
    for (int m = 0; m < 3; ++m) {
      const std::string label = "ferry-" + std::string(ferry::to_string(methods[m]));
      collect(row.ferry[m], args.repeat, describe(label, row.config), [&] {
        const Config c = row.config;
        const std::size_t warmup = warmup_batches(c.num_workers);
        return measure(ferry_opener(c.workload, c.num_workers, 2 + warmup,
                                    FerrySetup{.start_method = methods[m]}),
                       warmup, one);
      });
    }
  }
  std::string torch_version;
  if (args.peers) {
    const char* peer_methods[] = {"fork", "spawn"};
    for (int m = 0; m < 2; ++m) {
      PeerResults peer = run_pytorch_peer(args.python, args.peer, args.workloads, args.workers, one,
                                          args.repeat, peer_methods[m]);
      if (!peer.torch_version.empty()) torch_version = peer.torch_version;
      for (StartRow& row : rows) {
        const auto it =
            peer.runs.find({std::string(name(row.config.workload)), row.config.num_workers});
        if (it != peer.runs.end()) {
          row.pytorch[m].runs = it->second;
        } else {
          row.pytorch[m].error = peer.error.empty() ? "no result from pytorch_peer.py" : peer.error;
        }
      }
    }
  }
  std::printf(
      "%sferry %s, PyTorch %s; %u hardware threads; time to first batch in ms (from "
      "constructing the loader), median of %d\n\n",
      args.markdown ? "" : "# ", FERRY_VERSION, torch_version.empty() ? "-" : torch_version.c_str(),
      std::thread::hardware_concurrency(), args.repeat);
  auto ms = [](std::optional<double> s) -> std::optional<double> {
    if (!s) return std::nullopt;
    return *s * 1e3;
  };
  std::vector<std::vector<std::string>> table;
  for (const StartRow& row : rows) {
    std::optional<double> f[3], p[2];
    for (int m = 0; m < 3; ++m) f[m] = ms(first_batch(row.ferry[m]));
    for (int m = 0; m < 2; ++m) p[m] = ms(first_batch(row.pytorch[m]));
    table.push_back({std::string(name(row.config.workload)), std::to_string(row.config.num_workers),
                     format_value(row.ferry[0], f[0], 1), format_value(row.ferry[1], f[1], 1),
                     format_value(row.ferry[2], f[2], 1), format_value(row.pytorch[0], p[0], 1),
                     format_value(row.pytorch[1], p[1], 1), format_ratio(f[0], p[0]),
                     format_ratio(f[1], p[0]), format_ratio(f[2], p[1])});
  }
  print_table({"workload", "workers", "ferry fork", "ferry forkserver", "ferry spawn",
               "pytorch fork", "pytorch spawn", "fork/fork", "forkserver/fork", "spawn/spawn"},
              table, 2, args.markdown);
  return 0;
}

// Median batches/s (or steps/s) of a cell.
std::optional<double> rate(const Cell& cell) {
  if (cell.runs.empty()) return std::nullopt;
  std::vector<double> values;
  for (const Run& r : cell.runs) values.push_back(r.batches_per_s());
  return median(values);
}

// Milliseconds per batch (or step) of a cell.
std::optional<double> ms_per_batch(const Cell& cell) {
  const auto r = rate(cell);
  if (!r || *r <= 0) return std::nullopt;
  return 1e3 / *r;
}

// How much longer `loop` is than `alone`, as "+3.2%".
std::string format_overhead(std::optional<double> loop, std::optional<double> alone) {
  if (!loop || !alone || *alone <= 0) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%+.1f%%", (*loop / *alone - 1) * 100);
  return buf;
}

// Device mode: batch payload delivered to a GPU (MB/s) by ferry without and with a device, the
// raw pinned copy and PyTorch; then the loop with a synthetic GPU step against the step alone.
// This process initialises CUDA before its loaders fork their workers, as a training program
// does (the model is on the GPU first); fork, the default start method, allows that.
// ---------------------------------------------------------------------------------------------
// Huge epochs (--huge): time from constructing a loader to its first batch, and the process's
// peak resident memory, for N = 10^6 .. 10^9 int64 scalars; each case in a fresh process.

struct HugeCase {
  std::string order;  // sequential, shuffled; "randperm": a bare at::randperm(N), for scale
  std::size_t n;
};

// N int64 scalars: the cheapest samples, so the epoch's order is what costs.
class IndexDataset : public ferry::Dataset {
 public:
  explicit IndexDataset(std::size_t n) : n_(n) {}
  std::size_t size() const override { return n_; }
  ferry::Example get(std::size_t i, ferry::SampleContext&) const override {
    return {{"i", static_cast<std::int64_t>(i)}};
  }

 private:
  std::size_t n_;
};

std::string megabytes(double bytes) {
  if (std::isnan(bytes)) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.0f MB", bytes / 1e6);
  return text;
}

std::size_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// In the child process that --huge starts: one case, printed as a JSON line.
int run_huge_case(const std::string& order, std::size_t n, std::size_t workers) {
  const auto start = Clock::now();
  if (order == "randperm") {
    const at::Tensor perm = at::randperm(static_cast<std::int64_t>(n), at::kLong);
    (void)perm.data_ptr<std::int64_t>()[0];
  } else {
    ferry::DataLoader loader(
        std::make_shared<IndexDataset>(n),
        {.batch_size = 256, .shuffle = order == "shuffled", .num_workers = workers, .seed = 0});
    auto it = loader.begin();
    (void)it->size();
  }
  std::printf("{\"seconds\": %.6f, \"peak_rss\": %zu}\n", seconds_since(start), peak_rss_bytes());
  return 0;
}

// Runs `command` and returns the lines it printed, or nullopt if it failed.
std::optional<std::vector<std::string>> child_lines(const std::string& command) {
  std::fprintf(stderr, "running: %s\n", command.c_str());
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  std::vector<std::string> lines;
  char* line = nullptr;
  std::size_t capacity = 0;
  while (::getline(&line, &capacity, pipe) > 0) lines.emplace_back(line);
  std::free(line);
  if (::pclose(pipe) != 0) return std::nullopt;
  return lines;
}

// Runs `command` and returns (seconds, peak_rss) from its last JSON line, or nullopt.
std::optional<std::pair<double, double>> huge_run(const std::string& command) {
  std::optional<std::pair<double, double>> out;
  for (const std::string& line : child_lines(command).value_or(std::vector<std::string>{})) {
    const auto seconds = json_number(line, "seconds");
    const auto rss = json_number(line, "peak_rss");
    if (seconds && rss) out = std::make_pair(*seconds, *rss);
  }
  return out;
}

int run_huge(const Args& args) {
  const std::size_t workers = args.workers_given ? args.workers.front() : 2;
  const std::vector<HugeCase> cases = {{"sequential", 1'000'000},
                                       {"sequential", 100'000'000},
                                       {"sequential", 1'000'000'000},
                                       {"shuffled", 100'000'000}};
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  auto med = [](std::vector<double> v) { return v.empty() ? NAN : median(std::move(v)); };
  std::printf(
      "%sTime to the first batch and peak resident memory of one epoch of N int64 scalars, "
      "batch_size 256, %zu workers, each run in a fresh process; ferry %s, LibTorch %d.%d.%d; "
      "median of %d\n\n",
      args.markdown ? "" : "# ", workers, FERRY_VERSION, TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR,
      TORCH_VERSION_PATCH, args.repeat);
  std::printf(
      "| order | N | ferry s | ferry peak RSS | PyTorch s | PyTorch peak RSS | "
      "ferry / PyTorch | bare randperm s |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const HugeCase& c : cases) {
    std::vector<double> fs, fr, ps, pr, rs;
    for (int r = 0; r < args.repeat; ++r) {
      const std::string tail = " " + c.order + " " + std::to_string(c.n);
      if (auto v =
              huge_run(shell_quote(self) + " --huge-case" + tail + " " + std::to_string(workers))) {
        fs.push_back(v->first);
        fr.push_back(v->second);
      }
      if (args.peers) {
        if (auto v = huge_run(shell_quote(args.python) + " " + shell_quote(args.peer) + " --huge" +
                              tail + " --num-workers " + std::to_string(workers))) {
          ps.push_back(v->first);
          pr.push_back(v->second);
        }
      }
      if (c.order == "shuffled") {
        if (auto v = huge_run(shell_quote(self) + " --huge-case randperm " + std::to_string(c.n) +
                              " 0")) {
          rs.push_back(v->first);
        }
      }
    }
    const double f = med(fs), p = med(ps);
    std::printf("| %s | %.0e | %.3f | %s | %s | %s | %s | %s |\n", c.order.c_str(),
                static_cast<double>(c.n), f, megabytes(med(fr)).c_str(),
                ps.empty() ? "-" : std::to_string(p).substr(0, 6).c_str(),
                pr.empty() ? "-" : megabytes(med(pr)).c_str(),
                ps.empty() ? "-" : (std::to_string(f / p).substr(0, 5) + "x").c_str(),
                rs.empty() ? "-" : std::to_string(med(rs)).substr(0, 6).c_str());
  }
  return 0;
}

// Resuming (--resume): time from load_state() to the first batch, at a position in the epoch
// (percent; -1: no state, the epoch from its start), against the same loader starting the epoch;
// -50: what getting there took without checkpoints, loading the first half of the epoch.
int run_resume_case(const std::string& order, std::size_t n, int percent, std::size_t workers) {
  const ferry::DataLoaderOptions options{
      .batch_size = 256, .shuffle = order == "shuffled", .num_workers = workers, .seed = 0};
  auto data = std::make_shared<IndexDataset>(n);
  std::string state;
  if (percent >= 0) {
    // What a loader writes after consuming that share of epoch 0 (its fields, at that position).
    ferry::DataLoader probe(data, options);
    state = probe.state();
    const std::size_t position = probe.size() * static_cast<std::size_t>(percent) / 100;
    const std::string from = "\"position\": 0";
    state.replace(state.find(from), from.size(), "\"position\": " + std::to_string(position));
  }
  ferry::DataLoader loader(data, options);
  const auto start = Clock::now();
  if (!state.empty()) loader.load_state(state);
  auto it = loader.begin();
  (void)it->size();
  if (percent == -50) {  // fast-forward: load batches until half the epoch has gone by
    const std::size_t half = loader.size() / 2;
    for (std::size_t k = 0; k < half; ++k) ++it;
    (void)it->size();
  }
  std::printf("{\"seconds\": %.6f, \"state_bytes\": %zu}\n", seconds_since(start), state.size());
  return 0;
}

int run_resume(const Args& args) {
  const std::size_t workers = args.workers_given ? args.workers.front() : 2;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  auto med = [](std::vector<double> v) { return v.empty() ? NAN : median(std::move(v)); };
  std::printf(
      "%sTime from load_state() to the first batch, resuming epoch 0 at a share of its batches, "
      "against the same loader starting it (N int64 scalars, batch_size 256, %zu workers, each "
      "run in a fresh process); ferry %s, LibTorch %d.%d.%d; median of %d\n\n",
      args.markdown ? "" : "# ", workers, FERRY_VERSION, TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR,
      TORCH_VERSION_PATCH, args.repeat);
  std::printf(
      "| order | N | from the start s | at 10%% s | at 50%% s | at 90%% s | "
      "worst / start | state bytes | loading to 50%% s |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const std::string order : {"sequential", "shuffled"}) {
    for (const std::size_t n : {std::size_t{1'000'000}, std::size_t{100'000'000}}) {
      std::map<int, std::vector<double>> seconds;
      double bytes = 0;
      for (int r = 0; r < args.repeat; ++r) {
        for (const int percent : {-1, 10, 50, 90, -50}) {  // interleaved: drift hits all alike
          const std::string command = shell_quote(self) + " --resume-case " + order + " " +
                                      std::to_string(n) + " " + std::to_string(percent) + " " +
                                      std::to_string(workers);
          for (const std::string& line :
               child_lines(command).value_or(std::vector<std::string>{})) {
            if (const auto v = json_number(line, "seconds")) seconds[percent].push_back(*v);
            if (const auto v = json_number(line, "state_bytes"); v && *v > 0) bytes = *v;
          }
        }
      }
      const double start = med(seconds[-1]);
      const double worst = std::max({med(seconds[10]), med(seconds[50]), med(seconds[90])});
      std::printf("| %s | %.0e | %.3f | %.3f | %.3f | %.3f | %.2fx | %.0f | %.3f |\n",
                  order.c_str(), static_cast<double>(n), start, med(seconds[10]), med(seconds[50]),
                  med(seconds[90]), worst / start, bytes, med(seconds[-50]));
    }
  }
  return 0;
}

int run_device(const Args& args) {
  const torch::Device device = *args.device;
  std::vector<Workload> workloads;
  std::vector<std::string> notes;
  for (Workload w : args.workloads_given ? args.workloads
                                         : std::vector{Workload::kTensor, Workload::kTensorView}) {
    if (w == Workload::kTensor || w == Workload::kTensorView) {
      workloads.push_back(w);
      continue;
    }
    notes.push_back("device mode measures tensor and tensor-view; " + std::string(name(w)) +
                    " was skipped");
    std::fprintf(stderr, "%s\n", notes.back().c_str());
  }
  if (workloads.empty()) {
    std::fprintf(stderr,
                 "ferry_loader_bench: --device: nothing to measure; device mode measures the "
                 "tensor and tensor-view workloads\n");
    return 2;
  }

  struct DeviceRow {
    Config config;
    Cell cpu{}, device{}, pinned{}, pytorch{};              // MB/s
    Cell loop_copy{}, pin_loop_copy{}, pinned_copy_loop{};  // the loop copies (MB/s)
    Cell step_alone{}, ferry_step{}, pytorch_step_alone{}, pytorch_step{};  // per step or batch
    Cell pin_loop_step{};  // ferry pin_memory, the loop copying, then the step (per batch)
  };
  std::vector<DeviceRow> rows;
  for (Workload w : workloads) {
    for (std::size_t n : args.workers) rows.push_back(DeviceRow{.config = Config{w, n}});
  }

  // The ceiling, once per workload.
  std::map<Workload, Cell> raw;
  for (Workload w : workloads) {
    collect(raw[w], args.repeat, "raw-copy " + std::string(name(w)),
            [&] { return run_raw_copy(w, device, args.budget); });
  }

  std::optional<GpuStep> step;
  std::string step_error;
  if (args.gpu_step_ms > 0) {
    std::fprintf(stderr, "calibrating the GPU step to %g ms ... ", args.gpu_step_ms);
    std::fflush(stderr);
    try {
      step = GpuStep::calibrate(device, args.gpu_step_ms, device_batch(workloads.front(), device));
      std::fprintf(stderr, "%lld x matmul %lldx%lld: %.2f ms\n", static_cast<long long>(step->k()),
                   static_cast<long long>(step->n()), static_cast<long long>(step->n()),
                   step->ms());
    } catch (const std::exception& e) {
      step_error = e.what();
      std::fprintf(stderr, "error: %s\n", step_error.c_str());
    }
  }

  for (DeviceRow& row : rows) {
    const Config c = row.config;
    // One ferry cell of this row: `setup`'s runs, `args.repeat` times.
    auto measure_ferry = [&](Cell& cell, const char* label, const FerrySetup& setup) {
      collect(cell, args.repeat, describe(label, c),
              [&] { return run_ferry(c.workload, c.num_workers, args.budget, setup); });
    };
    FerrySetup cpu{.start_method = ferry::StartMethod::kFork};
    cpu.warmup = device_warmup_batches(c.num_workers);
    cpu.warmup_seconds = device_warmup_seconds(c.num_workers);
    cpu.sync = device;
    FerrySetup on_device = cpu;
    on_device.device = device;
    on_device.max_batches_per_s = rate(raw[c.workload]);
    FerrySetup pinned = on_device;
    pinned.pin_memory = true;
    measure_ferry(row.cpu, "ferry-cpu", cpu);
    measure_ferry(row.device, "ferry-device", on_device);
    measure_ferry(row.pinned, "ferry-pin+device", pinned);
    // The loop copies each host batch itself, as PyTorch's loops do: from shared memory as it
    // is, with pin_memory (pinned in place once a segment is page-locked), and as a pinned copy
    // made on the loop's thread first (what pin_memory without a device did before segments were
    // page-locked for it).
    FerrySetup loop_copy = cpu;
    loop_copy.max_batches_per_s = rate(raw[c.workload]);
    loop_copy.step = [device](const ferry::Batch& batch) {
      (void)batch.to(device, /*non_blocking=*/true);
    };
    FerrySetup pin_loop_copy = loop_copy;
    pin_loop_copy.pin_memory = true;
    FerrySetup pinned_copy_loop = loop_copy;
    pinned_copy_loop.step = [device](const ferry::Batch& batch) {
      (void)batch.pin_memory().to(device, /*non_blocking=*/true);
    };
    measure_ferry(row.loop_copy, "ferry+loop-copy", loop_copy);
    measure_ferry(row.pin_loop_copy, "ferry-pin+loop-copy", pin_loop_copy);
    measure_ferry(row.pinned_copy_loop, "ferry+pinned-copy+loop-copy", pinned_copy_loop);
    if (!step) continue;
    FerrySetup stepped = pinned;
    stepped.step = [&step = *step](const ferry::Batch& batch) { step(batch); };
    collect(row.step_alone, args.repeat, describe("step-alone", c),
            [&] { return run_step_alone(c.workload, *step, device, args.budget); });
    measure_ferry(row.ferry_step, "ferry+step", stepped);
    FerrySetup pin_loop_stepped = pin_loop_copy;
    pin_loop_stepped.step = [&step = *step, device](const ferry::Batch& batch) {
      step(batch.to(device, /*non_blocking=*/true));
    };
    measure_ferry(row.pin_loop_step, "ferry-pin+loop-copy+step", pin_loop_stepped);
  }

  PeerResults peer, peer_step;
  if (args.peers) {
    const std::string device_args = " --device " + shell_quote(device.str());
    auto find = [](const auto& runs, const Config& c) -> const std::vector<Run>* {
      const auto it = runs.find({std::string(name(c.workload)), c.num_workers});
      return it == runs.end() ? nullptr : &it->second;
    };
    auto fill = [&](Cell& cell, const PeerResults& from, const std::vector<Run>* runs) {
      if (runs != nullptr) {
        cell.runs = *runs;
      } else {
        cell.error = from.error.empty() ? "no result from pytorch_peer.py" : from.error;
      }
    };
    peer = run_pytorch_peer(args.python, args.peer, workloads, args.workers, args.budget,
                            args.repeat, "fork", device_args);
    for (DeviceRow& row : rows) fill(row.pytorch, peer, find(peer.runs, row.config));
    if (step) {
      char step_args[64];
      std::snprintf(step_args, sizeof step_args, " --gpu-step-ms %g", args.gpu_step_ms);
      peer_step = run_pytorch_peer(args.python, args.peer, workloads, args.workers, args.budget,
                                   args.repeat, "fork", device_args + step_args);
      for (DeviceRow& row : rows) {
        fill(row.pytorch_step, peer_step, find(peer_step.runs, row.config));
        fill(row.pytorch_step_alone, peer_step, find(peer_step.step_alone, row.config));
      }
    }
  } else {
    for (DeviceRow& row : rows) {
      row.pytorch.skipped = row.pytorch_step.skipped = row.pytorch_step_alone.skipped = true;
    }
  }

  const char* comment = args.markdown ? "" : "# ";
  const std::string device_name = peer.device_name.empty() ? "" : " (" + peer.device_name + ")";
  const std::string budget_text = describe_budget(args.budget);
  std::printf(
      "%sferry %s, LibTorch %d.%d.%d, PyTorch %s; device %s%s; %u hardware threads; %s per run "
      "after a warm-up of 12 x workers + 8 batches (ferry: and at least 0.25 s x workers), median "
      "of %d; ferry's workers start with "
      "fork, after CUDA started\n\n",
      comment, FERRY_VERSION, TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH,
      peer.torch_version.empty() ? "-" : peer.torch_version.c_str(), device.str().c_str(),
      device_name.c_str(), std::thread::hardware_concurrency(), budget_text.c_str(), args.repeat);

  std::printf(
      "%sBatch payload delivered to %s, MB/s. cpu: ferry without a device; device: with "
      "DataLoaderOptions::device;\n%spin+device: and pin_memory; raw pinned copy: the "
      "host-to-device copy alone (the ceiling);\n%spytorch: pin_memory=True and .to(device, "
      "non_blocking=True).\n\n",
      comment, device.str().c_str(), comment, comment);
  std::vector<std::vector<std::string>> table;
  for (const DeviceRow& row : rows) {
    const Workload w = row.config.workload;
    const auto cpu = throughput(row.cpu, w);
    const auto dev = throughput(row.device, w);
    const auto pin = throughput(row.pinned, w);
    const auto copy = throughput(raw[w], w);
    const auto py = throughput(row.pytorch, w);
    table.push_back({std::string(name(w)), std::to_string(row.config.num_workers),
                     format_value(row.cpu, cpu, 0), format_value(row.device, dev, 0),
                     format_value(row.pinned, pin, 0), format_value(raw[w], copy, 0),
                     format_value(row.pytorch, py, 0), format_ratio(dev, cpu),
                     format_ratio(dev, py), format_ratio(pin, py)});
  }
  print_table({"workload", "workers", "cpu", "device", "pin+device", "raw pinned copy", "pytorch",
               "device/cpu", "device/pytorch", "pin+device/pytorch"},
              table, 2, args.markdown);

  std::printf(
      "\n%sThe loop copies each host batch itself (.to(device, non_blocking=true)), MB/s. "
      "no pin: ferry without pin_memory;\n%spin: with pin_memory (pinned in place once a "
      "segment is page-locked); pinned copy: without it, the loop\n%smaking a pinned copy first "
      "(Batch::pin_memory()); pytorch: as above.\n\n",
      comment, comment, comment);
  std::vector<std::vector<std::string>> loop_table;
  for (const DeviceRow& row : rows) {
    const Workload w = row.config.workload;
    const auto plain = throughput(row.loop_copy, w);
    const auto pin = throughput(row.pin_loop_copy, w);
    const auto copied = throughput(row.pinned_copy_loop, w);
    const auto py = throughput(row.pytorch, w);
    loop_table.push_back(
        {std::string(name(w)), std::to_string(row.config.num_workers),
         format_value(row.loop_copy, plain, 0), format_value(row.pin_loop_copy, pin, 0),
         format_value(row.pinned_copy_loop, copied, 0), format_value(row.pytorch, py, 0),
         format_ratio(pin, plain), format_ratio(pin, copied), format_ratio(pin, py)});
  }
  print_table({"workload", "workers", "no pin", "pin", "pinned copy", "pytorch", "pin/no pin",
               "pin/pinned copy", "pin/pytorch"},
              loop_table, 2, args.markdown);

  if (args.gpu_step_ms > 0) {
    std::printf("\n%sGPU step, calibrated to %g ms: ", comment, args.gpu_step_ms);
    if (!step) {
      std::printf("error: %s\n", step_error.c_str());
    } else {
      std::printf("%lld x matmul %lldx%lld float32, %.2f ms here",
                  static_cast<long long>(step->k()), static_cast<long long>(step->n()),
                  static_cast<long long>(step->n()), step->ms());
      if (!peer_step.step.empty()) std::printf("; the peer's: %s", peer_step.step.c_str());
      std::printf(
          ".\n%sms per batch: the step alone, on a batch already on the device; the loop with the "
          "step (ferry: pin_memory and\n%sdevice; pytorch: as above), synchronised at the end; "
          "the loop's overhead over the step alone. Target: ferry\n%swithin +5%% when the step "
          "is longer than one batch's copy",
          comment, comment, comment);
      for (Workload w : workloads) {
        if (const auto copy_ms = ms_per_batch(raw[w])) {
          std::printf(" (%s: %.2f ms)", std::string(name(w)).c_str(), *copy_ms);
        }
      }
      std::printf(".\n\n");
      std::vector<std::vector<std::string>> steps;
      for (const DeviceRow& row : rows) {
        const auto alone = ms_per_batch(row.step_alone);
        const auto ferry_loop = ms_per_batch(row.ferry_step);
        const auto pin_loop = ms_per_batch(row.pin_loop_step);
        const auto py_alone = ms_per_batch(row.pytorch_step_alone);
        const auto py_loop = ms_per_batch(row.pytorch_step);
        steps.push_back(
            {std::string(name(row.config.workload)), std::to_string(row.config.num_workers),
             format_value(row.step_alone, alone, 2), format_value(row.ferry_step, ferry_loop, 2),
             format_overhead(ferry_loop, alone), format_value(row.pin_loop_step, pin_loop, 2),
             format_overhead(pin_loop, alone), format_value(row.pytorch_step_alone, py_alone, 2),
             format_value(row.pytorch_step, py_loop, 2), format_overhead(py_loop, py_alone)});
      }
      print_table({"workload", "workers", "step alone (ms)", "ferry + step (ms)", "ferry overhead",
                   "ferry pin, loop copies + step (ms)", "its overhead", "pytorch step alone (ms)",
                   "pytorch + step (ms)", "pytorch overhead"},
                  steps, 2, args.markdown);
    }
  }

  // Why cells are empty, and what was left out.
  std::vector<std::string> errors;
  for (Workload w : workloads) {
    if (!raw[w].error.empty())
      errors.push_back("raw pinned copy, " + std::string(name(w)) + ": " + raw[w].error);
  }
  for (const DeviceRow& row : rows) {
    const std::pair<const char*, const Cell*> cells[] = {
        {"ferry cpu", &row.cpu},
        {"ferry device", &row.device},
        {"ferry pin+device", &row.pinned},
        {"ferry, loop copies", &row.loop_copy},
        {"ferry pin_memory, loop copies", &row.pin_loop_copy},
        {"ferry, loop pins and copies", &row.pinned_copy_loop},
        {"pytorch", &row.pytorch},
        {"step alone", &row.step_alone},
        {"ferry + step", &row.ferry_step},
        {"ferry pin, loop copies + step", &row.pin_loop_step},
        {"pytorch step alone", &row.pytorch_step_alone},
        {"pytorch + step", &row.pytorch_step}};
    for (const auto& [loader, cell] : cells) {
      if (cell->error.empty()) continue;
      errors.push_back(std::string(loader) + ", " + std::string(name(row.config.workload)) +
                       ", num_workers=" + std::to_string(row.config.num_workers) + ": " +
                       cell->error);
    }
  }
  if (!errors.empty()) std::printf("\nErrors:\n");
  for (const std::string& e : errors) std::printf("- %s\n", e.substr(0, e.find('\n')).c_str());
  if (!notes.empty()) std::printf("\n");
  for (const std::string& n : notes) std::printf("%s%s\n", comment, n.c_str());
  return 0;
}

// Device mode needs a CUDA device this LibTorch can use; says so and exits otherwise.
void check_device(const torch::Device& device) {
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr,
                 "ferry_loader_bench: --device %s: no CUDA device is available: this LibTorch "
                 "(%d.%d.%d) was built without CUDA, or no GPU is visible. Device mode needs a "
                 "CUDA-enabled LibTorch and a GPU; leave --device out to measure on the CPU.\n",
                 device.str().c_str(), TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR,
                 TORCH_VERSION_PATCH);
    std::exit(1);
  }
  const std::size_t count = torch::cuda::device_count();
  if (device.has_index() && static_cast<std::size_t>(device.index()) >= count) {
    std::fprintf(stderr, "ferry_loader_bench: --device %s: this machine has %zu CUDA device%s\n",
                 device.str().c_str(), count, count == 1 ? "" : "s");
    std::exit(1);
  }
}

int main(int argc, char** argv) {
  register_bench_types();
  ferry::init(argc, argv);  // spawned workers are copies of this program
  if (argc == 5 && std::string_view(argv[1]) == "--huge-case") {  // a child of --huge
    return run_huge_case(argv[2], std::stoull(argv[3]), std::stoull(argv[4]));
  }
  if (argc == 6 && std::string_view(argv[1]) == "--resume-case") {  // a child of --resume
    return run_resume_case(argv[2], std::stoull(argv[3]), std::stoi(argv[4]), std::stoull(argv[5]));
  }
  const Args args = parse_args(argc, argv);
  if (args.huge) return run_huge(args);
  if (args.resume) return run_resume(args);
  if (args.device) {
    check_device(*args.device);
    return run_device(args);
  }
  const bool jpeg = std::find(args.workloads.begin(), args.workloads.end(), Workload::kJpeg) !=
                    args.workloads.end();
  double decode_only = 0;
#if defined(FERRY_HAS_VISION)
  if (jpeg) {
    g_jpeg = prepare_jpeg_data(args.jpeg_dir, args.jpeg_images);
    decode_only = decode_only_rate(g_jpeg, 2.0);
  }
#endif
  if (args.startup) return run_startup(args);
  // A file --json cannot write fails now rather than after the runs. (It is rewritten at the end.)
  if (!args.json.empty() && !std::ofstream(args.json, std::ios::app)) {
    std::fprintf(stderr, "ferry_loader_bench: --json %s: cannot write: %s\n", args.json.c_str(),
                 std::strerror(errno));
    return 2;
  }

  std::vector<Row> rows;
  for (Workload w : args.workloads) {
    for (std::size_t n : args.workers) rows.push_back(Row{Config{w, n}, {}, {}, {}});
  }

  for (Row& row : rows) {
    const Config c = row.config;
    collect(row.ferry, args.repeat, describe("ferry", c),
            [&] { return run_ferry(c.workload, c.num_workers, args.budget); });
    if (args.peers) {
      collect(row.libtorch, args.repeat, describe("libtorch", c),
              [&] { return run_libtorch(c.workload, c.num_workers, args.budget); });
    } else {
      row.libtorch.skipped = true;
    }
  }

  PeerResults peer;
  if (args.peers) {
    peer = run_pytorch_peer(args.python, args.peer, args.workloads, args.workers, args.budget,
                            args.repeat);
    for (Row& row : rows) {
      const auto it =
          peer.runs.find({std::string(name(row.config.workload)), row.config.num_workers});
      if (it != peer.runs.end()) {
        row.pytorch.runs = it->second;
      } else {
        row.pytorch.error = peer.error.empty() ? "no result from pytorch_peer.py" : peer.error;
      }
    }
  } else {
    for (Row& row : rows) row.pytorch.skipped = true;
  }

  // Throughput.
  const std::string measure_text = describe_budget(args.budget);
  std::printf(
      "%sferry %s, LibTorch %d.%d.%d, PyTorch %s; %u hardware threads; %s per run after "
      "warm-up, median of %d\n\n",
      args.markdown ? "" : "# ", FERRY_VERSION, TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR,
      TORCH_VERSION_PATCH, peer.torch_version.empty() ? "-" : peer.torch_version.c_str(),
      std::thread::hardware_concurrency(), measure_text.c_str(), args.repeat);

  std::vector<std::vector<std::string>> table;
  for (const Row& row : rows) {
    const Workload w = row.config.workload;
    const auto f = throughput(row.ferry, w);
    const auto p = throughput(row.pytorch, w);
    const auto l = throughput(row.libtorch, w);
    const int decimals = 0;
    table.push_back(
        {std::string(name(w)), std::to_string(row.config.num_workers), throughput_unit(w),
         format_value(row.ferry, f, decimals), format_value(row.pytorch, p, decimals),
         format_value(row.libtorch, l, decimals), format_ratio(f, p), format_ratio(f, l)});
  }
  print_table({"workload", "workers", "unit", "ferry", "pytorch", "libtorch-threads",
               "ferry/pytorch", "ferry/libtorch"},
              table, 3, args.markdown);

  if (jpeg) {
    std::printf(
        "\n%sjpeg: %zu files in %s, %.0f KB on average; OpenCV's full-resolution decode "
        "alone: %.0f images/s on one core\n",
        args.markdown ? "" : "# ", g_jpeg.files.size(), g_jpeg.dir.c_str(),
        g_jpeg.mean_bytes / 1024.0, decode_only);
    for (const Row& row : rows) {
      if (row.config.workload != Workload::kJpeg || row.config.num_workers != 1) continue;
      if (const auto f = throughput(row.ferry, Workload::kJpeg)) {
        std::printf("%sferry with 1 worker: %.2fx the decode-only rate\n",
                    args.markdown ? "" : "# ", *f / decode_only);
      }
    }
  }

  // Time to first batch (construction to first batch), 2 workers; every count if 2 is absent.
  const bool have_two =
      std::find(args.workers.begin(), args.workers.end(), std::size_t{2}) != args.workers.end();
  std::vector<std::vector<std::string>> first;
  for (const Row& row : rows) {
    if (have_two && row.config.num_workers != 2) continue;
    auto ms = [](std::optional<double> s) -> std::optional<double> {
      if (!s) return std::nullopt;
      return *s * 1e3;
    };
    const auto f = ms(first_batch(row.ferry));
    const auto p = ms(first_batch(row.pytorch));
    first.push_back({std::string(name(row.config.workload)), std::to_string(row.config.num_workers),
                     format_value(row.ferry, f, 1), format_value(row.pytorch, p, 1),
                     format_ratio(f, p)});
  }
  std::printf("\n%sTime to first batch (ms, from constructing the loader):\n\n",
              args.markdown ? "" : "# ");
  print_table({"workload", "workers", "ferry", "pytorch", "ferry/pytorch"}, first, 2,
              args.markdown);

  // Why cells are empty.
  bool any_error = false;
  for (const Row& row : rows) {
    const std::pair<const char*, const Cell*> cells[] = {
        {"ferry", &row.ferry}, {"pytorch", &row.pytorch}, {"libtorch", &row.libtorch}};
    for (const auto& [loader, cell] : cells) {
      if (cell->error.empty()) continue;
      if (!any_error) std::printf("\nErrors:\n");
      any_error = true;
      const std::string first_line = cell->error.substr(0, cell->error.find('\n'));
      std::printf("- %s, %s, num_workers=%zu: %s\n", loader,
                  std::string(name(row.config.workload)).c_str(), row.config.num_workers,
                  first_line.c_str());
    }
  }
  if (!args.json.empty() && !write_json(args.json, args, rows, peer, decode_only)) return 1;
  return 0;
}
