// Loader throughput: ferry's DataLoader against PyTorch's own DataLoader (bench/pytorch_peer.py,
// run with /usr/bin/python3) and LibTorch's thread-based torch::data loader, on the same three
// workloads (bench/README.md). It reports; it never fails on a timing.
//
//   build/bench/ferry_loader_bench                                  # all workloads, 1 and 2
//   workers build/bench/ferry_loader_bench --workloads tiny --workers 1,2,4 --seconds 3 --repeat 3
//   build/bench/ferry_loader_bench --repeat 3 --markdown           # the table for the README
//   build/bench/ferry_loader_bench --startup --repeat 9            # first batch per start method

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

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <torch/data.h>
#include <torch/version.h>

#include "ferry/ferry.h"

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
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.path().extension() == ".jpg") data.files.push_back(entry.path().string());
  }
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

struct Run {
  std::size_t batches = 0;
  double seconds = 0;
  double first_batch_s = 0;
  bool epoch_ended = false;  // the dataset ran out before the budget did
  double batches_per_s() const { return seconds > 0 ? static_cast<double>(batches) / seconds : 0; }
};

// Builds a loader with `open()` (which returns a `bool()` callable that loads the next batch, or
// returns false at the end of the epoch), then times the first batch from construction, a
// warm-up, and `budget`. The loader is destroyed after the clock stops.
template <class Open>
Run measure(Open&& open, std::size_t warmup, const Budget& budget) {
  Run run;
  const auto constructed = Clock::now();
  auto next = open();
  if (!next()) throw std::runtime_error("the loader yielded no batch");
  run.first_batch_s = seconds_since(constructed);
  for (std::size_t i = 0; i < warmup; ++i) {
    if (!next()) throw std::runtime_error("the epoch ended during the warm-up");
  }
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
  run.seconds = seconds_since(start);
  return run;
}

// Opens a ferry loader over `capacity` batches of workload `w`.
auto ferry_opener(Workload w,
                  std::size_t num_workers,
                  std::size_t capacity,
                  ferry::StartMethod method = ferry::StartMethod::kFork) {
  // Built through the registry, as spawn needs, and before the clock starts (as the peer does).
  std::shared_ptr<const ferry::Dataset> dataset = make_ferry_dataset(w, capacity * batch_size(w));
  return [=] {
    const ferry::DataLoaderOptions options{
        .batch_size = batch_size(w), .num_workers = num_workers, .start_method = method};
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
    return [loader, it, started]() mutable {
      if (started) ++it;
      started = true;
      if (it == ferry::DataLoader::Sentinel{}) return false;
      (void)*it;  // rethrows an error from loading the batch
      return true;
    };
  };
}

// ferry's samplers hand out a whole epoch of indices at once, so the dataset must be sized to
// the run: exactly, given a number of batches; given seconds, from the rate a short probe run
// measured (whose small dataset also gives a first-batch time untouched by sampler setup).
Run run_ferry(Workload w, std::size_t num_workers, const Budget& budget) {
  const std::size_t warmup = warmup_batches(num_workers);
  if (budget.batches) {
    return measure(ferry_opener(w, num_workers, 1 + warmup + *budget.batches), warmup, budget);
  }
  const std::size_t probe_batches = w == Workload::kTiny ? 2000 : w == Workload::kJpeg ? 6 : 16;
  const Run probe = measure(ferry_opener(w, num_workers, 1 + warmup + probe_batches), warmup,
                            Budget{.batches = probe_batches});
  constexpr double kMaxBatches = 4e6;  // bounds the index lists ferry's sampler builds
  const double expected = std::min(kMaxBatches, probe.batches_per_s() * budget.seconds * 2);
  const std::size_t capacity = 1 + warmup + static_cast<std::size_t>(std::ceil(expected)) + 16;
  Run run = measure(ferry_opener(w, num_workers, capacity), warmup, budget);
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
  if (w == Workload::kJpeg) {
    return measure(libtorch_opener<LibTorchJpeg, torch::data::Example<>>(
                       num_workers, LibTorchJpeg(), batch_size(w)),
                   warmup, budget);
  }
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

// Batches/s for tiny, MB/s otherwise; the median over the runs.
std::optional<double> throughput(const Cell& cell, Workload w) {
  if (cell.runs.empty()) return std::nullopt;
  std::vector<double> values;
  for (const Run& r : cell.runs) {
    if (w == Workload::kJpeg) {
      values.push_back(r.batches_per_s() * static_cast<double>(kJpegBatch));  // images/s
      continue;
    }
    values.push_back(w == Workload::kTiny
                         ? r.batches_per_s()
                         : r.batches_per_s() * static_cast<double>(payload_bytes(w)) / 1e6);
  }
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
  std::string torch_version;
  std::string error;
};

PeerResults run_pytorch_peer(const std::string& python,
                             const std::string& peer,
                             const std::vector<Workload>& workloads,
                             const std::vector<std::size_t>& workers,
                             const Budget& budget,
                             int repeat,
                             const std::string& start_method = "fork") {
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
    out.runs[{json_string(line, "workload"), static_cast<std::size_t>(*workers_seen)}].push_back(
        run);
    out.torch_version = json_string(line, "torch");
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

struct Args {
  std::vector<Workload> workloads{Workload::kTiny, Workload::kTensor, Workload::kTensorView,
                                  Workload::kJpeg};
  std::vector<std::size_t> workers{1, 2};
  Budget budget;
  int repeat = 1;
  bool markdown = false;
  bool peers = true;
  bool startup = false;
  std::string peer;
  std::string python = "/usr/bin/python3";
  std::string jpeg_dir = (std::filesystem::temp_directory_path() / "ferry_bench_jpeg").string();
  std::size_t jpeg_images = 512;
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
    "                          [--no-peers] [--peer PATH] [--python PATH] [--startup]\n"
    "Loader throughput of ferry, PyTorch (pytorch_peer.py) and LibTorch's torch::data loader.\n"
    "  --workloads   comma list (default: all four)\n"
    "  --workers     comma list of num_workers (default: 1,2)\n"
    "  --seconds S   time each run for S seconds (default: 2)\n"
    "  --batches N   time each run for N batches instead\n"
    "  --repeat R    runs per configuration; the table shows the median (default: 1)\n"
    "  --markdown    print Markdown tables (for the README)\n"
    "  --no-peers    measure ferry only (no PyTorch, no LibTorch)\n"
    "  --startup     only time to first batch, for each start method (fork, forkserver,\n"
    "                spawn) against PyTorch's fork and spawn (default workers: 2)\n"
    "  --peer PATH   pytorch_peer.py (default: next to this benchmark's source)\n"
    "  --python PATH the Python with torch (default: /usr/bin/python3)\n"
    "  --jpeg-dir D  where the jpeg workload's images are generated (default: $TMPDIR/\n"
    "                ferry_bench_jpeg); --jpeg-images N of them, in 4 classes (default\n"
    "                512; rounded up to a multiple of 4)\n";

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
      for (const std::string& s : split(value())) {
        const auto w = parse_workload(s);
        if (!w) usage_error("--workloads " + s + ": expected tiny, tensor, tensor-view or jpeg");
        args.workloads.push_back(*w);
      }
      if (args.workloads.empty()) usage_error("--workloads: give at least one");
    } else if (option == "--workers") {
      args.workers.clear();
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
    } else {
      usage_error("unknown option " + option);
    }
  }
  if (args.peer.empty()) args.peer = default_peer();
  return args;
}

// Runs `body` `repeat` times into `cell`; an exception ends the cell with its message.
template <class Body>
void collect(Cell& cell, int repeat, const char* loader, const Config& c, Body&& body) {
  for (int r = 0; r < repeat; ++r) {
    std::fprintf(stderr, "%-8s %-12s workers=%zu run %d/%d ... ", loader,
                 std::string(name(c.workload)).c_str(), c.num_workers, r + 1, repeat);
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
      collect(row.ferry[m], args.repeat, label.c_str(), row.config, [&] {
        const Config c = row.config;
        const std::size_t warmup = warmup_batches(c.num_workers);
        return measure(ferry_opener(c.workload, c.num_workers, 2 + warmup, methods[m]), warmup,
                       one);
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

int main(int argc, char** argv) {
  register_bench_types();
  ferry::init(argc, argv);  // spawned workers are copies of this program
  const Args args = parse_args(argc, argv);
  const bool jpeg = std::find(args.workloads.begin(), args.workloads.end(), Workload::kJpeg) !=
                    args.workloads.end();
  double decode_only = 0;
  if (jpeg) {
    g_jpeg = prepare_jpeg_data(args.jpeg_dir, args.jpeg_images);
    decode_only = decode_only_rate(g_jpeg, 2.0);
  }
  if (args.startup) return run_startup(args);

  std::vector<Row> rows;
  for (Workload w : args.workloads) {
    for (std::size_t n : args.workers) rows.push_back(Row{Config{w, n}, {}, {}, {}});
  }

  for (Row& row : rows) {
    const Config c = row.config;
    collect(row.ferry, args.repeat, "ferry", c,
            [&] { return run_ferry(c.workload, c.num_workers, args.budget); });
    if (args.peers) {
      collect(row.libtorch, args.repeat, "libtorch", c,
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
  char measure_text[64];
  if (args.budget.batches) {
    std::snprintf(measure_text, sizeof measure_text, "%zu batches", *args.budget.batches);
  } else {
    std::snprintf(measure_text, sizeof measure_text, "%g s", args.budget.seconds);
  }
  std::printf(
      "%sferry %s, LibTorch %d.%d.%d, PyTorch %s; %u hardware threads; %s per run after "
      "warm-up, median of %d\n\n",
      args.markdown ? "" : "# ", FERRY_VERSION, TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR,
      TORCH_VERSION_PATCH, peer.torch_version.empty() ? "-" : peer.torch_version.c_str(),
      std::thread::hardware_concurrency(), measure_text, args.repeat);

  std::vector<std::vector<std::string>> table;
  for (const Row& row : rows) {
    const Workload w = row.config.workload;
    const auto f = throughput(row.ferry, w);
    const auto p = throughput(row.pytorch, w);
    const auto l = throughput(row.libtorch, w);
    const int decimals = 0;
    table.push_back({std::string(name(w)), std::to_string(row.config.num_workers),
                     w == Workload::kTiny   ? "batches/s"
                     : w == Workload::kJpeg ? "images/s"
                                            : "MB/s",
                     format_value(row.ferry, f, decimals), format_value(row.pytorch, p, decimals),
                     format_value(row.libtorch, l, decimals), format_ratio(f, p),
                     format_ratio(f, l)});
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
  return 0;
}
