#pragma once

// The preprocess job as its file describes it (read and checked in preprocess_job.cpp), and its
// plan: the order of the inputs, the parts, and the names of the files they write. Private to
// the ferry command; preprocess.cpp runs the job.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ferry/dataset.h"
#include "ferry/transform.h"
#include "ferry/vision/image.h"

#include "cli/preprocess.h"

namespace ferry::cli::prep {

inline constexpr const char* kStateDir = ".ferry-preprocess";
inline constexpr std::size_t kDefaultPartSize = 1000;
// One sample's numbers, as the worker sends them (the "meta" field).
enum Meta : std::int64_t {
  kLabel,
  kBytesIn,
  kWidthIn,
  kHeightIn,
  kWidthOut,
  kHeightOut,
  kChannels,
  kSum0,
  kSquares0 = kSum0 + 3,
  kMetaSize = kSquares0 + 3
};

struct Job {
  std::filesystem::path file;
  std::shared_ptr<Dataset> input;
  vision::ImageMode mode = vision::ImageMode::kRGB;
  std::int64_t max_pixels = vision::kDefaultMaxPixels;
  TransformList transforms;
  std::filesystem::path out;  // the folder written (for a bucket output: its staging folder)
  // output.path in a bucket (s3://bucket/prefix, no trailing '/'); "" for a local folder. The job
  // is written into `out` as for a local one, and each finished part uploaded (preprocess.cpp).
  std::string upload;
  bool shards = true;
  vision::ImageFormat image_format = vision::ImageFormat::kJpeg;
  int quality = 90;
  std::string prefix;
  std::size_t part_size = kDefaultPartSize;  // samples per shard, or images per part of a tree
  std::optional<std::uint64_t> shard_bytes;
  std::string stats_name;
  std::size_t workers = 1;
  std::size_t batch_size = 8;
  std::optional<std::uint64_t> shuffle_seed;
  bool stop_on_error = false;
  std::chrono::milliseconds timeout{0};  // a batch stuck longer in a worker: the worker is hung
  std::vector<std::string> names;        // per input: its path relative to the input's root
  std::vector<std::string> classes;      // per label, when the input names them
  nlohmann::json settings;               // what the output depends on (job.json)
  std::string fingerprint;
};

// Reads, checks and builds the job of `options.config` (with its --set overrides). Throws
// ConfigError naming file:line:column for a bad file, and an input that cannot be listed.
Job read_job(const PreprocessOptions& options);

// A name that stays inside the output folder: absolute names and '..' go under "outside/".
std::string contained(const std::filesystem::path& name);

// The inputs in the order the job writes them: as listed, or a seeded Fisher-Yates shuffle on
// mt19937_64 (the same on every platform and library).
std::vector<std::int64_t> input_order(std::size_t n, std::optional<std::uint64_t> seed);

// Names: a part's record (.ferry-preprocess/part-NNNNNN.json), a shard (PREFIX-NNNNNN.tar), a
// sample's key (the input's index, six digits or more), an input's file in a tree.
std::string part_file(std::size_t part);
std::string shard_name(const Job& job, std::size_t part);
std::string key_of(std::int64_t index, std::size_t n);
std::string tree_name(const Job& job, std::int64_t index);

// Fault injection for the tests: FERRY_PREPROCESS_KILL_AT=POINT:N kills this process at the N-th
// pass through POINT; FERRY_PREPROCESS_CRASH_INPUT / _HANG_INPUT make the worker that loads an
// input whose name ends so crash or hang.
void kill_point(const char* point);
void input_fault(const std::string& name);

}  // namespace ferry::cli::prep
