// `ferry preprocess`: see preprocess.h. The worker side (EncodeDataset) reads, transforms,
// encodes and measures one image; the main process writes the parts in order, one at a time,
// and records each when its files are in place.

#include "cli/preprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <span>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <opencv2/core.hpp>
#include <opencv2/core/version.hpp>

#include "ferry/error.h"
#include "ferry/ferry.h"
#include "ferry/launch.h"
#include "ferry/pipeline.h"
#include "ferry/version.h"
#include "ferry/vision.h"

#include "cli/run.h"
#include "config/components.h"
#include "datasets/tar.h"
#include "ipc/files.h"
#include "ipc/unique_fd.h"
#include "transforms/image_state.h"

namespace ferry::cli {

namespace {

namespace fs = std::filesystem;
using ferry::detail::str;
using nlohmann::json;

constexpr const char* kStateDir = ".ferry-preprocess";
constexpr std::size_t kDefaultPartSize = 1000;
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

std::int64_t default_workers() {
  const unsigned cores = std::thread::hardware_concurrency();
  return cores == 0 ? 1 : static_cast<std::int64_t>(cores);
}

// ---- fault injection (tests) ----

// FERRY_PREPROCESS_KILL_AT=POINT:N kills this process with SIGKILL the N-th time it reaches
// POINT: the tests' way of stopping the job between a file's write and its rename.
void kill_point(const char* point) {
  static const std::pair<std::string, long> target = [] {
    const char* spec = std::getenv("FERRY_PREPROCESS_KILL_AT");
    if (spec == nullptr) return std::pair<std::string, long>{};
    const std::string s(spec);
    const auto colon = s.rfind(':');
    if (colon == std::string::npos) return std::pair<std::string, long>{s, 1};
    return std::pair<std::string, long>{s.substr(0, colon), std::atol(s.c_str() + colon + 1)};
  }();
  static long hits = 0;
  if (!target.first.empty() && target.first == point && ++hits == target.second) {
    ::kill(::getpid(), SIGKILL);
  }
}

// FERRY_PREPROCESS_CRASH_INPUT=NAME (or _HANG_INPUT): the worker that loads the input whose
// name ends with NAME dies with SIGSEGV (or hangs): the tests' stand-in for a decoder that
// crashes or loops on a hostile file.
void input_fault(const std::string& name) {
  static const char* crash = std::getenv("FERRY_PREPROCESS_CRASH_INPUT");
  static const char* hang = std::getenv("FERRY_PREPROCESS_HANG_INPUT");
  const auto ends_with = [&](const char* tail) {
    const std::size_t n = std::strlen(tail);
    return n > 0 && name.size() >= n && name.compare(name.size() - n, n, tail) == 0;
  };
  if (crash != nullptr && ends_with(crash)) ::raise(SIGSEGV);
  if (hang != nullptr && ends_with(hang)) {
    while (true) ::pause();
  }
}

// ---- the configuration ----

struct Job {
  fs::path file;
  std::shared_ptr<Dataset> input;
  vision::ImageMode mode = vision::ImageMode::kRGB;
  std::int64_t max_pixels = vision::kDefaultMaxPixels;
  TransformList transforms;
  fs::path out;
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
  json settings;                         // what the output depends on (job.json)
  std::string fingerprint;
};

const TypeInfo& output_keys() {
  static const TypeInfo info{
      .name = "preprocess_output",
      .summary = "the output section of a preprocess file",
      .keys = {
          {.name = "path",
           .type = ValueType::kString,
           .required = true,
           .help = "the folder to write (created)",
           .is_path = true},
          {.name = "format",
           .type = ValueType::kString,
           .default_value = "shards",
           .help = "shards: WebDataset tar shards with an index each; tree: an image tree "
                   "mirroring the input's folders",
           .choices = {"shards", "tree"}},
          {.name = "image_format",
           .type = ValueType::kString,
           .default_value = "jpeg",
           .help = "how images are re-encoded",
           .choices = {"jpeg", "png", "webp"}},
          {.name = "quality",
           .type = ValueType::kInt,
           .default_value = 90,
           .help = "JPEG and WebP quality (WebP 100: lossless); PNG is lossless",
           .min = 1,
           .max = 100},
          {.name = "prefix",
           .type = ValueType::kString,
           .default_value = "shard",
           .help = "shards are named PREFIX-000000.tar, PREFIX-000001.tar, ..."},
          {.name = "shard_samples",
           .type = ValueType::kInt,
           .help = "samples per shard (default 1000 unless shard_bytes is given); for a tree, "
                   "images per part (the unit of resuming and of the split over ranks)",
           .min = 1},
          {.name = "shard_bytes",
           .type = ValueType::kInt,
           .help = "cut a shard before it would pass this many bytes (one process only: "
                   "the cuts depend on every image before)",
           .min = 4096},
          {.name = "stats",
           .type = ValueType::kString,
           .default_value = "stats.json",
           .help = "the statistics file, in the output folder"},
      }};
  return info;
}

std::string at(const Config& node) { return node.mark().prefix(); }

// Transforms that draw nothing at random and leave 8-bit pixels: the only ones an offline job
// can bake into its output.
void check_deterministic(const Config& node, const std::string& name, const std::string& path) {
  static const std::set<std::string> allowed{"resize", "center_crop", "decode"};
  if (allowed.count(name) != 0) return;
  std::string why;
  if (name.rfind("random_", 0) == 0 || name == "color_jitter") {
    why =
        "it draws at random per sample: written once, one draw would be frozen into the "
        "dataset for every epoch; keep it in the training pipeline";
  } else if (name == "to_tensor" || name == "pil_to_tensor" || name == "normalize") {
    why =
        "the job writes 8-bit images; convert and normalize in the training pipeline (the "
        "statistics file gives the mean and std)";
  } else {
    why = "preprocess applies only deterministic image steps (resize, center_crop)";
  }
  throw ConfigError(str(at(node), path, ": '", name, "' cannot run in preprocess: ", why));
}

// A name that stays inside the output folder: absolute names and '..' (from a list file, or a
// tar member named by whoever wrote the shard) go under "outside/", without the '..'.
std::string contained(const fs::path& name) {
  fs::path kept;
  bool outside = name.is_absolute();
  for (const fs::path& part : name.lexically_normal().relative_path()) {
    if (part == ".." || part == ".") {
      outside = true;
    } else if (!part.empty()) {
      kept /= part;
    }
  }
  if (kept.empty()) kept = "unnamed";
  return (outside ? fs::path("outside") / kept : kept).string();
}

std::string relative_name(const std::string& path, const fs::path& root) {
  const fs::path rel = fs::path(path).lexically_normal().lexically_relative(root);
  if (rel.empty() || *rel.begin() == "..") return contained(fs::absolute(path));
  return contained(rel);
}

std::uint64_t fnv1a(std::uint64_t h, std::string_view s) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

Job read_job(const PreprocessOptions& options) {
  register_builtins();
  Job job;
  job.file = options.config;
  Config root = read_yaml(options.config);
  for (const std::string& setting : options.set) apply_setting(root, setting);
  fs::path base = job.file.parent_path();
  if (base.empty()) base = ".";
  base = fs::absolute(base);
  if (root.is_null()) {
    throw ConfigError(str(options.config, ": the file is empty; it needs 'input' and 'output'"));
  }
  const Config top = check_keys(preprocess_keys(), root, "", "a preprocess file");
  const Args args(preprocess_keys(), top, "");
  job.workers = args.get<std::size_t>("workers");
  job.batch_size = args.get<std::size_t>("batch_size");
  if (args.has("shuffle_seed")) {
    job.shuffle_seed = static_cast<std::uint64_t>(args.get<std::int64_t>("shuffle_seed"));
  }
  job.stop_on_error = args.get<std::string>("on_error") == "stop";
  job.timeout = std::chrono::milliseconds(std::llround(args.get<double>("timeout") * 1000.0));

  // The output.
  const Config* output_node = root.find("output");
  const Config output = check_keys(output_keys(), *output_node, "output", "the output");
  const Args out(output_keys(), output, "output");
  job.out = (base / out.get<std::string>("path")).lexically_normal();
  job.shards = out.get<std::string>("format") == "shards";
  job.image_format = vision::parse_image_format(out.get<std::string>("image_format"));
  job.quality = static_cast<int>(out.get<std::int64_t>("quality"));
  job.prefix = out.get<std::string>("prefix");
  if (job.prefix.empty() || job.prefix.find_first_of("/ \t\n") != std::string::npos) {
    out.fail("prefix", "expected a file name prefix without '/' or spaces");
  }
  if (out.has("shard_bytes")) {
    if (out.has("shard_samples")) {
      out.fail("shard_bytes", "give shard_samples or shard_bytes, not both");
    }
    if (!job.shards) out.fail("shard_bytes", "cuts shards; a tree is cut with shard_samples");
    job.shard_bytes = static_cast<std::uint64_t>(out.get<std::int64_t>("shard_bytes"));
  } else if (out.has("shard_samples")) {
    job.part_size = out.get<std::size_t>("shard_samples");
  }
  job.stats_name = out.get<std::string>("stats");
  if (job.stats_name.empty() || job.stats_name.find('/') != std::string::npos) {
    out.fail("stats", "expected a file name (it is written in the output folder)");
  }
  if (job.image_format == vision::ImageFormat::kWebp && !vision::can_encode(job.image_format)) {
    out.fail("image_format", "this build's OpenCV cannot write WebP; choose jpeg or png");
  }

  // The transforms: deterministic image steps only.
  Config resolved_transforms = Config::list();
  const Registry& registry = Registry::global();
  if (const Config* list = root.find("transforms"); list != nullptr && !list->is_null()) {
    if (!list->is_list()) {
      throw ConfigError(str(at(*list), "transforms: expected a list (each '- NAME: {key: ",
                            "value}'), found ", list->describe()));
    }
    for (std::size_t i = 0; i < list->size(); ++i) {
      const std::string path = str("transforms.", i);
      const Config node = ferry::detail::resolve_paths(
          ferry::detail::normalise_component(list->items()[i]), ComponentKind::kTransform, base);
      const Config* type = node.is_map() ? node.find("type") : nullptr;
      const std::string name = type != nullptr && type->is_scalar() ? type->scalar()
                               : node.is_scalar()                   ? node.scalar()
                                                                    : std::string();
      check_deterministic(list->items()[i], name, path);
      auto transform = registry.make_transform(node, path);
      resolved_transforms.push_back(transform->spec()->config);
      job.transforms.push_back(std::move(transform));
    }
  }

  // The input, read as encoded files (the job decodes them itself).
  Config input = ferry::detail::normalise_component(*root.find("input"));
  if (!input.is_map()) input = Config::map({{"type", input}});
  const Config* type = input.find("type");
  const std::string type_name = type != nullptr && type->is_scalar() ? type->scalar() : "";
  if (type_name != "image_folder" && type_name != "image_list" && type_name != "webdataset") {
    throw ConfigError(str(at(type != nullptr ? *type : input), "input: expected type ",
                          "image_folder, image_list or webdataset, found '", type_name, "'"));
  }
  if (input.find("transforms") != nullptr) {
    throw ConfigError(str(at(*input.find("transforms")), "input.transforms: give the job's ",
                          "transforms at the top level of the file"));
  }
  if (const Config* decode = input.find("decode")) {
    throw ConfigError(
        str(at(*decode), "input.decode: the job decodes every image itself; ", "remove the key"));
  }
  input.set("decode", Config("false"));
  input = ferry::detail::resolve_paths(std::move(input), ComponentKind::kDataset, base);
  try {
    job.input = registry.make_dataset(input, "input");
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    throw ConfigError(str(at(input), "input: ", e.what()));
  }
  Config resolved_input = job.input->spec()->config;
  const Args input_args(*registry.find(ComponentKind::kDataset, type_name), resolved_input,
                        "input");
  job.mode = vision::parse_image_mode(input_args.get<std::string>("mode"));
  job.max_pixels = input_args.get<std::int64_t>("max_pixels");
  if (job.mode == vision::ImageMode::kUnchanged) {
    input_args.fail("mode",
                    "unchanged keeps alpha and 16 bits, which JPEG cannot hold; use rgb "
                    "or gray");
  }

  // Names (the tree's layout and each sample's .json) and labels.
  const std::size_t n = job.input->size();
  job.names.reserve(n);
  std::uint64_t items_hash = 14695981039346656037ull;
  if (const auto* folder = dynamic_cast<const vision::ImageFolder*>(job.input.get())) {
    job.classes = folder->classes();
    for (const auto& item : folder->items())
      job.names.push_back(relative_name(item.path, folder->root()));
  } else if (const auto* list = dynamic_cast<const vision::ImageList*>(job.input.get())) {
    const fs::path dir = fs::path(list->list_file()).parent_path();
    for (const auto& item : list->items()) job.names.push_back(relative_name(item.path, dir));
  } else if (const auto* wds = dynamic_cast<const vision::WebDataset*>(job.input.get())) {
    for (const auto& sample : wds->samples()) {
      std::string ext = "bin";
      for (const std::string& e : wds->options().image_extensions) {
        if (std::any_of(sample.fields.begin(), sample.fields.end(),
                        [&](const auto& f) { return f.extension == e; })) {
          ext = e;
          break;
        }
      }
      job.names.push_back(contained(sample.key + "." + ext));
    }
  }
  for (const std::string& name : job.names) items_hash = fnv1a(items_hash, name + "\n");
  if (const auto* folder = dynamic_cast<const vision::ImageFolder*>(job.input.get())) {
    const fs::path root = fs::absolute(folder->root()).lexically_normal();
    const fs::path rel = job.out.lexically_relative(root);
    if (!rel.empty() && *rel.begin() != "..") {
      throw ConfigError(str(at(*output_node), "output.path ", job.out.string(),
                            " lies inside the input folder ", root.string(),
                            ": the next run would read its own output; write it elsewhere"));
    }
  }
  if (!job.shards) {
    // Two inputs that differ only in their extension would land on one file.
    std::unordered_map<std::string, std::size_t> seen;
    for (std::size_t i = 0; i < job.names.size(); ++i) {
      fs::path p(job.names[i]);
      p.replace_extension(std::string(".") + std::string(vision::extension_of(job.image_format)));
      const auto [it, fresh] = seen.emplace(p.string(), i);
      if (!fresh) {
        throw ConfigError(str(at(*output_node), "output: inputs ", job.names[it->second], " and ",
                              job.names[i], " would both be written as ", p.string(),
                              "; use format: shards, or rename one of them"));
      }
    }
  }

  // What the output's bytes depend on: not where it is, nor how many workers make it.
  Config output_settings = output;
  output_settings.erase("path");
  job.settings = {{"input", to_yaml(resolved_input)},
                  {"transforms", to_yaml(resolved_transforms)},
                  {"output", to_yaml(output_settings)},
                  {"on_error", args.get<std::string>("on_error")},
                  {"shuffle_seed", job.shuffle_seed ? json(*job.shuffle_seed) : json(nullptr)},
                  {"inputs", n},
                  {"input_names_hash", str(std::hex, items_hash)},
                  // Another encoder may write other bytes for the same pixels.
                  {"encoder", str("ferry ", FERRY_VERSION, ", OpenCV ", CV_VERSION)}};
  char hex[17];
  std::snprintf(
      hex, sizeof hex, "%016llx",
      static_cast<unsigned long long>(fnv1a(14695981039346656037ull, job.settings.dump())));
  job.fingerprint = hex;
  return job;
}

// ---- the worker side: one image read, transformed, encoded and measured ----

// Never throws for a bad input: the error travels back as the sample's `error`, so every input
// yields one row and the main process decides (skip and list, or stop).
class EncodeDataset : public Dataset {
 public:
  explicit EncodeDataset(const Job& job)
      : names_(&job.names),
        input_(job.input),
        mode_(job.mode),
        max_pixels_(job.max_pixels),
        format_(job.image_format),
        quality_(job.quality),
        pipeline_(job.transforms.empty()
                      ? nullptr
                      : std::make_shared<const vision::Compose>(job.transforms)) {}

  std::size_t size() const override { return input_->size(); }

  Example get(std::size_t index, SampleContext& ctx) const override {
    torch::Tensor meta = torch::zeros({kMetaSize}, torch::kInt64);
    auto* m = meta.data_ptr<std::int64_t>();
    torch::Tensor data = torch::empty({0}, torch::kUInt8);
    std::string error;
    FERRY_CHECK(index < names_->size(), "preprocess: input ", index, " is out of range");
    input_fault((*names_)[index]);
    try {
      Example in = input_->get(index, ctx);
      const torch::Tensor bytes = in["image"].tensor();
      m[kLabel] = in.contains("label") ? in["label"].to_int() : -1;
      m[kBytesIn] = bytes.numel();
      const vision::ImageInfo info = vision::probe_image(vision::bytes_of(bytes));
      m[kWidthIn] = info.width;
      m[kHeightIn] = info.height;
      torch::Tensor image;
      if (pipeline_) {
        vision::detail::ImageState state =
            vision::detail::ImageState::encoded(bytes, mode_, max_pixels_);
        Example out = pipeline_->run(Example{{"image", bytes}}, state, ctx);
        image = out["image"].tensor();
      } else {
        image = vision::decode_image(vision::bytes_of(bytes), mode_, max_pixels_);
      }
      if (image.dim() == 2) image = image.unsqueeze(2);
      image = image.contiguous();
      m[kHeightOut] = image.size(0);
      m[kWidthOut] = image.size(1);
      const std::int64_t channels = image.size(2);
      m[kChannels] = channels;
      // Exact integer sums per channel: the statistics do not depend on the order they add in.
      const std::uint8_t* p = image.data_ptr<std::uint8_t>();
      const std::int64_t pixels = image.size(0) * image.size(1);
      for (std::int64_t c = 0; c < channels && c < 3; ++c) {
        std::int64_t sum = 0;
        std::int64_t squares = 0;
        for (std::int64_t i = 0; i < pixels; ++i) {
          const std::int64_t v = p[i * channels + c];
          sum += v;
          squares += v * v;
        }
        m[kSum0 + c] = sum;
        m[kSquares0 + c] = squares;
      }
      std::vector<std::uint8_t> encoded = vision::encode_image(image, format_, quality_);
      data = torch::empty({static_cast<std::int64_t>(encoded.size())}, torch::kUInt8);
      std::memcpy(data.data_ptr<std::uint8_t>(), encoded.data(), encoded.size());
    } catch (const DataError& e) {
      // A bad input. Anything else (out of memory, a bug) is not the input's fault: it stops
      // the job as a worker error, and a run again retries it.
      error = e.what();
    } catch (const cv::Exception& e) {
      error = str("OpenCV: ", e.what());
    }
    if (error.empty() && data.numel() == 0) error = "the encoder wrote no bytes";
    return Example{{"data", data}, {"meta", meta}, {"error", error}};
  }

 private:
  const std::vector<std::string>* names_;  // the job's, which outlives every loader
  std::shared_ptr<Dataset> input_;
  vision::ImageMode mode_;
  std::int64_t max_pixels_;
  vision::ImageFormat format_;
  int quality_;
  std::shared_ptr<const vision::Compose> pipeline_;
};

// Variable-length files in one batch: their bytes end to end, with the lengths.
Batch collate_encoded(std::vector<Example> samples) {
  std::vector<torch::Tensor> data;
  std::vector<torch::Tensor> meta;
  std::vector<std::string> errors;
  torch::Tensor lengths = torch::empty({static_cast<std::int64_t>(samples.size())}, torch::kInt64);
  for (std::size_t i = 0; i < samples.size(); ++i) {
    data.push_back(samples[i]["data"].tensor());
    meta.push_back(samples[i]["meta"].tensor());
    errors.push_back(samples[i]["error"].str());
    lengths[static_cast<std::int64_t>(i)] = samples[i]["data"].tensor().numel();
  }
  Batch batch(samples.size());
  batch.set("data", torch::cat(data));
  batch.set("lengths", lengths);
  batch.set("meta", torch::stack(meta));
  batch.set("error", std::move(errors));
  return batch;
}

// An order of positions given as a list (the parts of this rank that are left).
class ListSampler : public Sampler {
 public:
  explicit ListSampler(std::vector<std::int64_t> indices) : indices_(std::move(indices)) {}
  std::size_t size() const override { return indices_.size(); }
  std::vector<std::int64_t> indices(std::uint64_t) override { return indices_; }

 private:
  std::vector<std::int64_t> indices_;
};

// ---- the plan ----

// A bounded draw from mt19937_64 by rejection: the same on every platform and library (the
// standard's distributions are not).
std::uint64_t draw_below(std::mt19937_64& gen, std::uint64_t bound) {
  const std::uint64_t limit =
      std::numeric_limits<std::uint64_t>::max() - std::numeric_limits<std::uint64_t>::max() % bound;
  std::uint64_t x = gen();
  while (x >= limit) x = gen();
  return x % bound;
}

std::vector<std::int64_t> input_order(std::size_t n, std::optional<std::uint64_t> seed) {
  std::vector<std::int64_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<std::int64_t>(i);
  if (seed) {
    std::mt19937_64 gen(*seed);
    for (std::size_t i = n; i > 1; --i) std::swap(order[i - 1], order[draw_below(gen, i)]);
  }
  return order;
}

std::string part_file(std::size_t part) {
  char name[32];
  std::snprintf(name, sizeof name, "part-%06zu.json", part);
  return name;
}

std::string shard_name(const Job& job, std::size_t part) {
  char number[16];
  std::snprintf(number, sizeof number, "%06zu", part);
  return job.prefix + "-" + number + ".tar";
}

std::string key_of(std::int64_t index, std::size_t n) {
  std::string s = std::to_string(index);
  const std::size_t width = std::max<std::size_t>(6, std::to_string(n == 0 ? 0 : n - 1).size());
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

std::string tree_name(const Job& job, std::int64_t index) {
  fs::path p(job.names[static_cast<std::size_t>(index)]);
  p.replace_extension(std::string(".") + std::string(vision::extension_of(job.image_format)));
  return p.string();
}

std::string size_bin(std::int64_t shorter) {
  if (shorter < 64) return "0-63";
  std::int64_t low = 64;
  while (low * 2 <= shorter && low < 4096) low *= 2;
  if (low >= 4096) return "4096+";
  return str(low, "-", low * 2 - 1);
}

// An exclusive lock on a file of the job's folder (flock: a killed holder releases it). The file
// is removed when the lock is let go, so a finished job leaves none behind.
class FolderLock {
 public:
  // nullopt when another process holds it.
  static std::optional<FolderLock> try_take(const fs::path& path) {
    ipc::UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!fd) {
      throw Error(str(path.string(), ": cannot create a lock file: ", std::strerror(errno),
                      "; check that the output folder is writable"));
    }
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) return std::nullopt;
      throw Error(str(path.string(), ": flock failed: ", std::strerror(errno),
                      " (a file system without locks? write the output to a local disk)"));
    }
    return FolderLock(path, std::move(fd));
  }
  FolderLock(FolderLock&&) noexcept = default;
  FolderLock& operator=(FolderLock&&) noexcept = default;
  ~FolderLock() {
    if (fd_) ::unlink(path_.c_str());  // while still held: nobody else holds this inode
  }

 private:
  FolderLock(fs::path path, ipc::UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}
  fs::path path_;
  ipc::UniqueFd fd_;
};

// The lock of one part, held while it is written.
FolderLock take_part(const Job& job, std::size_t part) {
  char name[32];
  std::snprintf(name, sizeof name, "part-%06zu.lock", part);
  std::optional<FolderLock> lock = FolderLock::try_take(job.out / kStateDir / name);
  if (!lock) {
    throw Error(str(job.out.string(), ": part ", part, " is being written by another process ",
                    "right now (a rank started twice, or ranks started with different ",
                    "--world-size); let it finish or stop it, then run again"));
  }
  return std::move(*lock);
}

// ---- a part: its files, written under temporary names, then renamed; then its record ----

// Pixel sums of a whole dataset can pass 2^64 (squares of a billion large images).
__extension__ typedef unsigned __int128 Wide;

struct Totals {
  std::uint64_t images = 0;
  std::uint64_t bytes_in = 0;
  std::uint64_t bytes_out = 0;
  std::uint64_t pixels = 0;
  std::int64_t channels = 0;
  std::array<Wide, 3> sum{};
  std::array<Wide, 3> squares{};
  std::map<std::int64_t, std::uint64_t> classes;
  std::map<std::string, std::uint64_t> sizes_in;
  std::map<std::string, std::uint64_t> sizes_out;
  json skipped = json::array();
};

std::string u128(Wide v) {
  if (v == 0) return "0";
  std::string s;
  while (v > 0) {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  }
  return s;
}

Wide parse_u128(const std::string& s) {
  Wide v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') throw Error(str("not a number: '", s, "'"));
    v = v * 10 + static_cast<unsigned>(c - '0');
  }
  return v;
}

json totals_json(const Totals& t) {
  json sums = json::array();
  json squares = json::array();
  for (int c = 0; c < 3; ++c) {
    sums.push_back(u128(t.sum[c]));
    squares.push_back(u128(t.squares[c]));
  }
  json classes = json::object();
  for (const auto& [label, count] : t.classes) classes[std::to_string(label)] = count;
  return {{"images", t.images},       {"bytes_in", t.bytes_in}, {"bytes_out", t.bytes_out},
          {"pixels", t.pixels},       {"channels", t.channels}, {"sum", sums},
          {"squares", squares},       {"classes", classes},     {"sizes_in", t.sizes_in},
          {"sizes_out", t.sizes_out}, {"skipped", t.skipped}};
}

void add_totals(Totals& into, const json& j) {
  into.images += j.at("images").get<std::uint64_t>();
  into.bytes_in += j.at("bytes_in").get<std::uint64_t>();
  into.bytes_out += j.at("bytes_out").get<std::uint64_t>();
  into.pixels += j.at("pixels").get<std::uint64_t>();
  into.channels = std::max(into.channels, j.at("channels").get<std::int64_t>());
  for (int c = 0; c < 3; ++c) {
    into.sum[c] += parse_u128(j.at("sum").at(c).get<std::string>());
    into.squares[c] += parse_u128(j.at("squares").at(c).get<std::string>());
  }
  for (const auto& [label, count] : j.at("classes").items()) {
    into.classes[std::stoll(label)] += count.get<std::uint64_t>();
  }
  for (const auto& [bin, count] : j.at("sizes_in").items()) {
    into.sizes_in[bin] += count.get<std::uint64_t>();
  }
  for (const auto& [bin, count] : j.at("sizes_out").items()) {
    into.sizes_out[bin] += count.get<std::uint64_t>();
  }
  for (const auto& s : j.at("skipped")) into.skipped.push_back(s);
}

// A file being written: removed when the writer is dropped before it was renamed into place.
class Partial {
 public:
  explicit Partial(fs::path path) : path_(std::move(path)) {}
  Partial(const Partial&) = delete;
  Partial& operator=(const Partial&) = delete;
  ~Partial() {
    if (!path_.empty()) {
      std::error_code ec;
      fs::remove(path_, ec);
    }
  }
  const fs::path& path() const noexcept { return path_; }
  void keep() noexcept { path_.clear(); }  // renamed by the caller
  void commit(const fs::path& to, std::string_view what) {
    ipc::rename_durably(path_, to, what);
    path_.clear();
  }

 private:
  fs::path path_;
};

struct Row {
  std::int64_t index = 0;  // the input's
  std::span<const std::uint8_t> data;
  const std::int64_t* meta = nullptr;
  const std::string* error = nullptr;
};

class PartWriter {
 public:
  // `inputs` (a tree's): the part's inputs, whose temporaries a killed run may have left.
  PartWriter(const Job& job,
             std::size_t part,
             std::size_t first,
             std::span<const std::int64_t> inputs = {})
      : job_(job), part_(part), first_(first), lock_(take_part(job, part)) {
    // Nobody else writes this part now: what its temporaries hold is a killed run's.
    std::error_code ec;
    fs::remove(job_.out / kStateDir / (part_file(part_) + ".partial"), ec);
    fs::remove(job_.out / (shard_name(job_, part_) + ".idx.partial"), ec);
    for (std::int64_t index : inputs) {
      fs::remove(job_.out / (tree_name(job_, index) + ".partial"), ec);
    }
    if (job_.shards) {
      shard_ = std::make_unique<Partial>(job_.out / (shard_name(job_, part_) + ".partial"));
      tar_.emplace(shard_->path());
    }
  }

  // Bytes a sample adds to the shard (headers and padding included).
  std::uint64_t cost(const Row& row) const {
    const auto padded = [](std::uint64_t n) { return 512 + (n + 511) / 512 * 512; };
    return padded(row.data.size()) + padded(32) + padded(sample_json(row).size());
  }
  std::uint64_t size() const { return tar_ ? tar_->size() : 0; }
  std::size_t inputs() const { return inputs_; }
  std::size_t part() const { return part_; }

  void add(const Row& row) {
    ++inputs_;
    const std::string& name = job_.names[static_cast<std::size_t>(row.index)];
    if (!row.error->empty()) {
      if (job_.stop_on_error) {
        throw DataError(str("input ", row.index, " (", name, "): ", *row.error,
                            " (on_error: stop; set on_error: skip to skip such files and list "
                            "them in the statistics)"));
      }
      totals_.skipped.push_back({{"index", row.index}, {"path", name}, {"error", *row.error}});
      return;
    }
    const std::int64_t* m = row.meta;
    ++totals_.images;
    totals_.bytes_in += static_cast<std::uint64_t>(m[kBytesIn]);
    totals_.bytes_out += row.data.size();
    totals_.pixels += static_cast<std::uint64_t>(m[kWidthOut] * m[kHeightOut]);
    totals_.channels = std::max(totals_.channels, m[kChannels]);
    for (int c = 0; c < 3; ++c) {
      totals_.sum[c] += static_cast<std::uint64_t>(m[kSum0 + c]);
      totals_.squares[c] += static_cast<std::uint64_t>(m[kSquares0 + c]);
    }
    ++totals_.classes[m[kLabel]];
    ++totals_.sizes_in[size_bin(std::min(m[kWidthIn], m[kHeightIn]))];
    ++totals_.sizes_out[size_bin(std::min(m[kWidthOut], m[kHeightOut]))];
    if (tar_) {
      const std::string key = key_of(row.index, job_.names.size());
      const std::string label = std::to_string(m[kLabel]);
      const std::string meta = sample_json(row);
      const auto as_bytes = [](const std::string& s) {
        return std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(s.data()),
                                             s.size());
      };
      members_.push_back(tar_->add(key + ".cls", as_bytes(label)));
      members_.push_back(
          tar_->add(key + "." + std::string(vision::extension_of(job_.image_format)), row.data));
      members_.push_back(tar_->add(key + ".json", as_bytes(meta)));
    } else {
      const fs::path final_path = job_.out / tree_name(job_, row.index);
      std::error_code ec;
      fs::create_directories(final_path.parent_path(), ec);
      if (ec) {
        throw Error(
            str(final_path.parent_path().string(), ": cannot create the folder: ", ec.message()));
      }
      Partial file(final_path.string() + ".partial");
      write_bytes(file.path(), row.data);
      kill_point("image-written");
      if (::rename(file.path().c_str(), final_path.c_str()) != 0) {
        throw Error(
            str(final_path.string(), ": renaming into place failed: ", std::strerror(errno)));
      }
      file.keep();
      files_.push_back(tree_name(job_, row.index));
    }
  }

  // Puts the part's files in place, then its record: the part is done when the record exists.
  void finish(const fs::path& state_dir) {
    json files = json::array();
    if (tar_) {
      const std::uint64_t bytes = tar_->finish();
      tar_.reset();
      kill_point("shard-written");
      const fs::path shard = job_.out / shard_name(job_, part_);
      shard_->commit(shard, "shard");
      const std::string index = vision::detail::webdataset_index(members_);
      ipc::write_file_durably(shard.string() + ".idx.partial", index, "shard index");
      kill_point("index-written");
      ipc::rename_durably(shard.string() + ".idx.partial", shard.string() + ".idx", "shard index");
      files.push_back({{"name", shard_name(job_, part_)}, {"bytes", bytes}});
    } else {
      // The images were renamed one by one; one syncfs puts them on disk before the record.
      ipc::UniqueFd dir(::open(job_.out.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (!dir || ::syncfs(dir.get()) != 0) {
        throw Error(str(job_.out.string(), ": flushing part ", part_, "'s images to disk failed: ",
                        std::strerror(errno), "; check the disk, then run again"));
      }
      files = files_;
    }
    const json record = {{"format", "ferry.preprocess.part"},
                         {"fingerprint", job_.fingerprint},
                         {"part", part_},
                         {"first", first_},
                         {"inputs", inputs_},
                         {"files", files},
                         {"totals", totals_json(totals_)}};
    const fs::path path = state_dir / part_file(part_);
    const fs::path temporary = path.string() + ".partial";
    ipc::write_file_durably(temporary, record.dump(1), "part record");
    kill_point("record-written");
    ipc::rename_durably(temporary, path, "part record");
    kill_point("part-done");
  }

  const Totals& totals() const { return totals_; }

 private:
  std::string sample_json(const Row& row) const {
    const std::int64_t* m = row.meta;
    json j = {{"path", job_.names[static_cast<std::size_t>(row.index)]},
              {"label", m[kLabel]},
              {"width", m[kWidthOut]},
              {"height", m[kHeightOut]},
              {"original_width", m[kWidthIn]},
              {"original_height", m[kHeightIn]},
              {"original_bytes", m[kBytesIn]}};
    if (m[kLabel] >= 0 && static_cast<std::size_t>(m[kLabel]) < job_.classes.size()) {
      j["class"] = job_.classes[static_cast<std::size_t>(m[kLabel])];
    }
    return j.dump();
  }

  static void write_bytes(const fs::path& path, std::span<const std::uint8_t> bytes) {
    ipc::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd) throw Error(str(path.string(), ": cannot create: ", std::strerror(errno)));
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        throw Error(str(path.string(), ": write failed: ", std::strerror(errno),
                        "; check that the disk has room"));
      }
      done += static_cast<std::size_t>(n);
    }
  }

  const Job& job_;
  std::size_t part_;
  std::size_t first_;  // its first position in the job's order
  FolderLock lock_;
  std::size_t inputs_ = 0;
  std::unique_ptr<Partial> shard_;
  std::optional<vision::detail::TarWriter> tar_;
  std::vector<vision::detail::TarMember> members_;
  json files_ = json::array();
  Totals totals_;
};

// ---- the job's folder: job.json, the records, locks, leftovers ----

// Writes job.json, or checks that the one there is this job's. Ranks started together race
// here: the file is published with link(), which fails if another rank published first, and
// then theirs is compared.
void claim_folder(const Job& job, std::size_t rank) {
  std::error_code ec;
  const fs::path path = job.out / kStateDir / "job.json";
  if (!fs::exists(path, ec) && fs::exists(job.out, ec)) {
    for (const auto& entry : fs::directory_iterator(job.out, ec)) {
      if (entry.path().filename() != kStateDir) {
        throw ConfigError(str(job.out.string(), " holds files (", entry.path().filename().string(),
                              ", ...) but no ", kStateDir, "/job.json, so it is not the output of ",
                              "a preprocess job; write to an empty or new output.path"));
      }
    }
  }
  fs::create_directories(job.out / kStateDir, ec);
  if (ec) {
    throw Error(str(job.out.string(), ": cannot create the output folder: ", ec.message()));
  }
  const json mine = {{"format", "ferry.preprocess"},
                     {"version", 1},
                     {"fingerprint", job.fingerprint},
                     {"settings", job.settings}};
  if (!fs::exists(path, ec)) {
    const fs::path temporary = str(path.string(), ".partial-rank", rank, "-", ::getpid());
    ipc::write_file_durably(temporary, mine.dump(1), "job file");
    const int linked = ::link(temporary.c_str(), path.c_str());
    const int error = errno;
    ::unlink(temporary.c_str());
    if (linked == 0) return;
    if (error != EEXIST) {
      throw Error(str(path.string(), ": cannot publish the job file: ", std::strerror(error)));
    }
  }
  json theirs;
  try {
    theirs = json::parse(ipc::read_file(path, "job file"));
  } catch (const json::exception& e) {
    throw Error(str(path.string(), ": unreadable (", e.what(), "); it is not from ferry, or ",
                    "was edited: delete ", job.out.string(), " to start the job over"));
  }
  if (theirs.value("fingerprint", "") == job.fingerprint) return;
  std::string differs;
  const json their_settings = theirs.value("settings", json::object());
  for (const auto& [key, value] : job.settings.items()) {
    if (!their_settings.contains(key) || their_settings[key] != value) {
      differs += (differs.empty() ? "" : ", ") + key;
    }
  }
  if (differs.empty()) differs = "its format";
  throw ConfigError(str(job.out.string(), " holds the output of another preprocess job (",
                        "they differ in: ", differs, "); the outputs cannot be mixed: write to ",
                        "another output.path, or delete ", job.out.string(),
                        " to start this job over"));
}

struct Record {
  std::size_t first = 0;
  std::size_t inputs = 0;
  json files;
  json totals;
};

// Checks a record against the plan and the files it names; throws Error saying what is off.
Record check_record(const Job& job, std::size_t part, const json& j) {
  if (j.at("fingerprint").get<std::string>() != job.fingerprint) {
    throw Error("written by another job");
  }
  if (j.at("part").get<std::size_t>() != part) throw Error("its part number is another");
  Record r{j.at("first").get<std::size_t>(), j.at("inputs").get<std::size_t>(), j.at("files"),
           j.at("totals")};
  const std::size_t n = job.names.size();
  if (r.first > n || r.inputs > n - r.first) throw Error("it covers inputs past the last");
  if (!job.shard_bytes &&
      (r.first != part * job.part_size || r.inputs != std::min(job.part_size, n - r.first))) {
    throw Error(str("it covers inputs ", r.first, "+", r.inputs, ", not this part's"));
  }
  Totals scratch;
  add_totals(scratch, r.totals);  // well-formed numbers
  if (scratch.images + scratch.skipped.size() != r.inputs) throw Error("its counts do not add up");
  std::error_code ec;
  for (const auto& f : r.files) {
    const std::string name = job.shards ? f.at("name").get<std::string>() : f.get<std::string>();
    if (name.empty() || name.find("..") != std::string::npos || name.front() == '/') {
      throw Error(str("it names the file '", name, "'"));
    }
    const fs::path file = job.out / name;
    if (job.shards) {
      if (fs::file_size(file, ec) != f.at("bytes").get<std::uint64_t>() || ec) {
        throw Error(str(file.string(), " is missing or not the size recorded"));
      }
      if (!fs::exists(file.string() + ".idx", ec))
        throw Error(str(file.string(), ".idx is missing"));
    } else if (!fs::is_regular_file(file, ec)) {
      throw Error(str(file.string(), " is missing"));
    }
  }
  return r;
}

// The records of finished parts, by part number; a record that does not check out is reported
// and its part written again.
std::map<std::size_t, Record> read_records(const Job& job) {
  std::map<std::size_t, Record> records;
  const fs::path dir = job.out / kStateDir;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    std::size_t part = 0;
    char tail = 0;
    if (std::sscanf(name.c_str(), "part-%zu.json%c", &part, &tail) != 1 ||
        name != part_file(part)) {
      continue;
    }
    try {
      records[part] = check_record(job, part, json::parse(ipc::read_file(entry.path(), "record")));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ferry: warning: %s: %s; part %zu is written again\n",
                   entry.path().c_str(), e.what(), part);
    }
  }
  return records;
}

// Temporaries a killed run left in the folder: those of recorded parts and of dead writers
// (ones whose lock nobody holds). Run when every part is recorded, under the finish lock.
std::size_t sweep_folder(const Job& job) {
  std::size_t removed = 0;
  std::error_code ec;
  for (const fs::path& dir : {job.out, job.out / kStateDir}) {
    std::vector<fs::path> found;
    for (const auto& entry : fs::directory_iterator(dir, ec)) found.push_back(entry.path());
    for (const fs::path& path : found) {
      const std::string name = path.filename().string();
      const bool temporary = name.find(".partial") != std::string::npos;
      const bool lock = dir != job.out && name.size() > 5 &&
                        name.compare(name.size() - 5, 5, ".lock") == 0 && name != "finish.lock";
      if (lock) {
        // Free: its holder is gone (FolderLock's destructor removes the file when done).
        if (FolderLock::try_take(path)) ++removed;
      } else if (temporary && fs::remove(path, ec)) {
        ++removed;
      }
    }
  }
  return removed;
}

// ---- progress ----

struct Progress {
  std::size_t total = 0;  // inputs this run will read
  std::size_t done = 0;
  std::uint64_t bytes_in = 0;
  double log_every = 5.0;
  bool terminal = ::isatty(STDERR_FILENO) == 1;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double last = -1e9;

  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  void show(bool final) {
    const double now = elapsed();
    if (!final && now - last < (terminal ? 0.1 : log_every)) return;
    last = now;
    const double rate = now > 0 ? static_cast<double>(done) / now : 0.0;
    const double mbps = now > 0 ? static_cast<double>(bytes_in) / now / 1e6 : 0.0;
    const std::string eta =
        rate > 0 ? duration(static_cast<double>(total - std::min(total, done)) / rate) : "?";
    char line[256];
    std::snprintf(line, sizeof line, "%zu/%zu images  %.0f images/s  %.1f MB/s  elapsed %s  ETA %s",
                  done, total, rate, mbps, duration(now).c_str(), eta.c_str());
    if (terminal) {
      const int width = 24;
      const int filled =
          total == 0 ? width : static_cast<int>(width * static_cast<double>(done) / total);
      std::string bar = "[" + std::string(filled, '#') + std::string(width - filled, '.') + "] ";
      std::fprintf(stderr, "\r\033[K%s%s%s", bar.c_str(), line, final ? "\n" : "");
    } else {
      std::fprintf(stderr, "preprocess: %s\n", line);
    }
    std::fflush(stderr);
  }
};

// ---- the statistics file ----

json statistics(const Job& job, const std::map<std::size_t, Record>& records) {
  Totals t;
  json files = json::array();
  for (const auto& [part, record] : records) {
    add_totals(t, record.totals);
    for (const auto& f : record.files) files.push_back(f);
  }
  json mean = json::array();
  json stddev = json::array();
  for (std::int64_t c = 0; c < std::min<std::int64_t>(t.channels, 3); ++c) {
    const long double n = static_cast<long double>(t.pixels);
    const long double m = n > 0 ? static_cast<long double>(t.sum[c]) / n : 0.0L;
    const long double v = n > 0 ? static_cast<long double>(t.squares[c]) / n - m * m : 0.0L;
    mean.push_back(static_cast<double>(m / 255.0L));
    stddev.push_back(static_cast<double>(std::sqrt(std::max(v, 0.0L)) / 255.0L));
  }
  json classes = json::object();
  for (const auto& [label, count] : t.classes) {
    const std::string name = label >= 0 && static_cast<std::size_t>(label) < job.classes.size()
                                 ? job.classes[static_cast<std::size_t>(label)]
                                 : std::to_string(label);
    classes[name] = count;
  }
  return {{"format", "ferry.preprocess.stats"},
          {"inputs", job.names.size()},
          {"images", t.images},
          {"skipped", t.skipped.size()},
          {"skipped_inputs", t.skipped},
          {"mean", mean},
          {"std", stddev},
          {"scale", "pixel values / 255, per channel (RGB or gray), over every output pixel"},
          {"pixels", t.pixels},
          {"classes", classes},
          {"input_shorter_side", t.sizes_in},
          {"output_shorter_side", t.sizes_out},
          {"bytes_in", t.bytes_in},
          {"bytes_out", t.bytes_out},
          {"files", job.shards ? files : json(files.size())}};
}

std::string indent(const std::string& yaml) {
  std::string out;
  std::size_t start = 0;
  while (start < yaml.size()) {
    std::size_t end = yaml.find('\n', start);
    if (end == std::string::npos) end = yaml.size();
    out += "  " + yaml.substr(start, end - start) + "\n";
    start = end + 1;
  }
  return out;
}

}  // namespace

const TypeInfo& preprocess_output_keys() { return output_keys(); }

const TypeInfo& preprocess_keys() {
  static const TypeInfo info{
      .name = "preprocess",
      .summary = "a preprocess file: the input dataset, deterministic transforms, the output",
      .keys = {
          {.name = "input",
           .type = ValueType::kAny,
           .required = true,
           .help = "the dataset read: image_folder, image_list or webdataset "
                   "({NAME: {key: value}})"},
          {.name = "transforms",
           .type = ValueType::kAny,
           .help = "deterministic steps run on every image: resize, center_crop"},
          {.name = "output",
           .type = ValueType::kAny,
           .required = true,
           .help = "where and how to write (ferry describe preprocess_output)"},
          {.name = "workers",
           .type = ValueType::kInt,
           .default_value = default_workers(),
           .help = "worker processes that read, transform and encode (0: in this process); "
                   "default: this machine's cores",
           .min = 0},
          {.name = "batch_size",
           .type = ValueType::kInt,
           .default_value = 8,
           .help = "images per task sent to a worker",
           .min = 1,
           .max = 4096},
          {.name = "shuffle_seed",
           .type = ValueType::kInt,
           .help = "unset: samples in the input's order; a number: a seeded shuffle of it, the "
                   "same on every machine",
           .min = 0},
          {.name = "timeout",
           .type = ValueType::kFloat,
           .default_value = 600.0,
           .help = "seconds a batch may take in a worker before the worker counts as hung and is "
                   "stopped (then as a worker that died: see on_error); 0: no limit",
           .min = 0.0},
          {.name = "on_error",
           .type = ValueType::kString,
           .default_value = "skip",
           .help = "a corrupt, truncated, empty or unsupported input, or one whose worker dies "
                   "or hangs: skip it (listed in the statistics) or stop the job",
           .choices = {"skip", "stop"}},
      }};
  return info;
}

int validate_preprocess(const std::string& config, const std::vector<std::string>& set) {
  PreprocessOptions options;
  options.config = config;
  options.set = set;
  const Job job = read_job(options);
  const std::size_t n = job.names.size();
  const std::string parts =
      job.shard_bytes
          ? str("shards of at most ", *job.shard_bytes, " bytes")
          : str((n + job.part_size - 1) / job.part_size, job.shards ? " shards" : " parts", " of ",
                job.part_size, job.shards ? " samples" : " images");
  std::printf("# %s: valid preprocess job (%zu inputs -> %s, %s)\n", config.c_str(), n,
              job.out.c_str(), parts.c_str());
  std::printf("input:\n%s", indent(job.settings["input"].get<std::string>()).c_str());
  std::printf("transforms:\n%s", indent(job.settings["transforms"].get<std::string>()).c_str());
  std::printf("output:\n%s", indent(job.settings["output"].get<std::string>()).c_str());
  std::printf("workers: %zu\nbatch_size: %zu\non_error: %s\n", job.workers, job.batch_size,
              job.stop_on_error ? "stop" : "skip");
  if (job.shuffle_seed)
    std::printf("shuffle_seed: %llu\n", static_cast<unsigned long long>(*job.shuffle_seed));
  return 0;
}

// A worker died or hung. Loading one at a time: the input in hand caused it, and is skipped.
// Otherwise the inputs it may have held (`window` from the cursor) are loaded again one at a
// time to find that one.
template <class Take>
void handle_lost_worker(const std::string& what,
                        bool isolating,
                        std::size_t& cursor,
                        std::size_t& isolate_until,
                        const std::vector<std::int64_t>& positions,
                        Take& take,
                        std::size_t window) {
  const std::string first_line = what.substr(0, what.find('\n'));
  if (isolating) {
    const std::int64_t meta[kMetaSize] = {};
    const std::string error = str("its worker died or hung while loading it: ", first_line);
    take(Row{positions[cursor], {}, meta, &error});
    ++cursor;
    return;
  }
  isolate_until = std::min(positions.size(), cursor + window);
  std::fprintf(stderr,
               "ferry: warning: %s\npreprocess: loading the next %zu inputs one at a time, to "
               "find and skip the one that caused it\n",
               first_line.c_str(), isolate_until - cursor);
}

// ---- the job ----

int run_preprocess(const PreprocessOptions& options) {
  Job job = read_job(options);
  std::size_t rank = 0;
  std::size_t world = 1;
  std::string launcher = "one process";
  if (const std::optional<LaunchInfo> launch = launch_info()) {
    rank = launch->rank;
    world = launch->world_size;
    launcher = launch->source;
  }
  if (options.rank) rank = *options.rank;
  if (options.world_size) world = *options.world_size;
  if (options.rank || options.world_size) launcher = "--rank/--world-size";
  if (world == 0 || rank >= world) {
    throw ConfigError(
        str("rank ", rank, " is outside world size ", world, " (--rank counts from 0)"));
  }
  if (job.shard_bytes && world > 1) {
    throw ConfigError(str(options.config, ": output.shard_bytes cuts each shard where the ",
                          "images before it end, so one process must write them all; with ", world,
                          " ranks use output.shard_samples (each rank then takes fixed ",
                          "shards)"));
  }
  const std::size_t n = job.names.size();
  claim_folder(job, rank);
  const std::vector<std::int64_t> order = input_order(n, job.shuffle_seed);
  std::map<std::size_t, Record> records = read_records(job);

  // The parts this rank writes, and where each starts in the order.
  std::vector<std::pair<std::size_t, std::size_t>> todo;  // (part, first position)
  std::size_t resumed_parts = 0;
  std::size_t total_parts = 0;  // 0: not known ahead (shards cut by bytes)
  std::size_t start = 0;        // bytes: the position after the last finished shard
  if (!job.shard_bytes) {
    total_parts = (n + job.part_size - 1) / job.part_size;
    for (std::size_t part = rank; part < total_parts; part += world) {
      if (records.count(part) != 0) {
        ++resumed_parts;
      } else {
        todo.emplace_back(part, part * job.part_size);
      }
    }
  } else {
    std::size_t part = 0;
    while (records.count(part) != 0 && records[part].first == start) {
      start += records[part].inputs;
      ++part;
    }
    // Records past a gap belong to a run that did not finish before them: never the case for
    // one writer, but a record that does not continue the chain is not trusted.
    for (auto it = records.lower_bound(part); it != records.end();) it = records.erase(it);
    resumed_parts = part;
    if (start < n || n == 0) todo.emplace_back(part, start);
  }
  std::vector<std::int64_t> positions;   // this run's inputs, in order
  std::vector<std::size_t> part_starts;  // where each part of `todo` starts in `positions`
  for (const auto& [part, first] : todo) {
    part_starts.push_back(positions.size());
    const std::size_t end = job.shard_bytes ? n : std::min(n, first + job.part_size);
    for (std::size_t pos = first; pos < end; ++pos) positions.push_back(order[pos]);
  }

  std::fprintf(stderr,
               "preprocess %s: %zu inputs -> %s (%s); rank %zu of %zu (%s): %zu parts to write, "
               "%zu done before\n",
               options.config.c_str(), n, job.out.c_str(), job.shards ? "shards" : "image tree",
               rank, world, launcher.c_str(),
               job.shard_bytes ? (start < n ? std::size_t{1} : std::size_t{0}) : todo.size(),
               resumed_parts);

  Progress progress;
  progress.total = positions.size();
  progress.log_every = options.log_every;
  std::size_t written_parts = 0;
  std::uint64_t images = 0;
  std::uint64_t skipped = 0;
  const fs::path state_dir = job.out / kStateDir;
  std::size_t next_todo = 0;
  std::size_t position = todo.empty() ? 0 : todo.front().second;  // in the job's order
  std::unique_ptr<PartWriter> writer;
  const auto finish_part = [&] {
    writer->finish(state_dir);
    images += writer->totals().images;
    skipped += writer->totals().skipped.size();
    ++written_parts;
    writer.reset();
  };
  // One input: into the part it belongs to, which is finished when full.
  const auto take = [&](const Row& row) {
    if (job.shard_bytes) {
      if (!writer)
        writer = std::make_unique<PartWriter>(job, resumed_parts + written_parts, position);
      if (writer->inputs() > 0 && row.error->empty() &&
          writer->size() + writer->cost(row) + 1024 > *job.shard_bytes) {
        finish_part();
        writer = std::make_unique<PartWriter>(job, resumed_parts + written_parts, position);
      }
    } else if (!writer) {
      const std::size_t from = part_starts[next_todo];
      const std::size_t to =
          next_todo + 1 < part_starts.size() ? part_starts[next_todo + 1] : positions.size();
      writer = std::make_unique<PartWriter>(
          job, todo[next_todo].first, todo[next_todo].second,
          job.shards ? std::span<const std::int64_t>()
                     : std::span<const std::int64_t>(positions.data() + from, to - from));
      position = todo[next_todo].second;
      ++next_todo;
    }
    writer->add(row);
    ++position;
    ++progress.done;
    progress.bytes_in += static_cast<std::uint64_t>(row.meta[kBytesIn]);
    if (!job.shard_bytes &&
        writer->inputs() == std::min(job.part_size, n - writer->part() * job.part_size)) {
      finish_part();
    }
  };

  // The loaders: normally batches from every worker; after a worker died (or hung past the
  // timeout), the inputs it may have held are loaded one at a time by one worker, so the one
  // that kills its worker is found and skipped (on_error: skip) and the rest are written.
  std::size_t cursor = 0;         // into positions: the next input to write
  std::size_t isolate_until = 0;  // [cursor, isolate_until) load one at a time
  const std::size_t prefetch = 2;
  while (cursor < positions.size()) {
    const bool isolating = cursor < isolate_until;
    const std::size_t end = isolating ? isolate_until : positions.size();
    DataLoaderOptions loader_options{
        .batch_size = isolating ? 1 : job.batch_size,
        .num_workers = isolating ? std::min<std::size_t>(job.workers, 1) : job.workers,
        .in_order = true,
        .seed = 0};
    if (loader_options.num_workers > 0) {
      // The job's dataset is built here, not from the registry: workers are forked copies.
      loader_options.start_method = StartMethod::kFork;
      loader_options.prefetch_factor = isolating ? 1 : prefetch;
      loader_options.timeout = job.timeout;
    }
    DataLoader loader(std::make_shared<EncodeDataset>(job), loader_options,
                      std::make_shared<ListSampler>(std::vector<std::int64_t>(
                          positions.begin() + static_cast<std::ptrdiff_t>(cursor),
                          positions.begin() + static_cast<std::ptrdiff_t>(end))),
                      collate_encoded);
    try {
      for (const Batch& batch : loader) {
        // Nothing a worker sends is trusted: the shapes, the lengths and the inputs it answers.
        const std::size_t b = batch.size();
        const torch::Tensor data = batch["data"];
        const torch::Tensor lengths = batch["lengths"];
        const torch::Tensor meta = batch["meta"].contiguous();
        const auto& errors = batch.strings("error");
        const auto bad = [&](const std::string& what) {
          return Error(str("preprocess: a worker's batch ", batch.sequence(), " is malformed (",
                           what, "); run again to resume"));
        };
        if (data.dim() != 1 || data.scalar_type() != torch::kUInt8 || lengths.dim() != 1 ||
            lengths.scalar_type() != torch::kInt64 ||
            lengths.size(0) != static_cast<std::int64_t>(b) || meta.dim() != 2 ||
            meta.scalar_type() != torch::kInt64 || meta.size(0) != static_cast<std::int64_t>(b) ||
            meta.size(1) != kMetaSize || errors.size() != b || batch.indices().size() != b) {
          throw bad("its fields' shapes");
        }
        const auto* length = lengths.data_ptr<std::int64_t>();
        std::uint64_t total = 0;
        for (std::size_t i = 0; i < b; ++i) {
          if (length[i] < 0 || static_cast<std::uint64_t>(length[i]) >
                                   static_cast<std::uint64_t>(data.numel()) - total) {
            throw bad("lengths past its data");
          }
          total += static_cast<std::uint64_t>(length[i]);
        }
        if (total != static_cast<std::uint64_t>(data.numel()))
          throw bad("lengths short of its data");
        const auto* bytes = data.data_ptr<std::uint8_t>();
        std::size_t offset = 0;
        for (std::size_t i = 0; i < b; ++i) {
          if (cursor >= end || batch.indices()[i] != positions[cursor]) {
            throw bad(str("input ", batch.indices()[i], " where ",
                          positions[std::min(cursor, end - 1)], " was due"));
          }
          const std::int64_t* m = meta.data_ptr<std::int64_t>() + i * kMetaSize;
          for (std::int64_t k = 0; k < kMetaSize; ++k) {
            const bool size = k >= kWidthIn && k <= kHeightOut;
            if (k != kLabel && (m[k] < 0 || (size && m[k] > (std::int64_t{1} << 31)))) {
              throw bad("a negative or huge number");
            }
          }
          if (m[kChannels] > 4) throw bad("more than 4 channels");
          Row row{batch.indices()[i],
                  {bytes + offset, static_cast<std::size_t>(length[i])},
                  m,
                  &errors[i]};
          offset += static_cast<std::size_t>(length[i]);
          take(row);
          ++cursor;
        }
        progress.show(false);
      }
    } catch (const WorkerError& e) {
      if (dynamic_cast<const WorkerDiedError*>(&e) == nullptr) throw;
      if (job.stop_on_error) throw;
      handle_lost_worker(e.what(), isolating, cursor, isolate_until, positions, take,
                         job.batch_size * (job.workers * prefetch + 1));
    } catch (const TimeoutError& e) {
      if (job.stop_on_error) throw;
      handle_lost_worker(e.what(), isolating, cursor, isolate_until, positions, take,
                         job.batch_size * (job.workers * prefetch + 1));
    }
  }
  if (writer) finish_part();
  if (positions.empty() && job.shard_bytes && n == 0 && records.empty()) {
    PartWriter(job, 0, 0).finish(state_dir);
    ++written_parts;
  }
  progress.show(true);

  // Done when every part has its record: a rank that finds them all (under the finish lock,
  // one at a time) removes what killed runs left and writes the statistics.
  const fs::path stats_path = job.out / job.stats_name;
  json stats;
  bool complete = false;
  for (int attempt = 0;; ++attempt) {
    std::optional<FolderLock> finishing = FolderLock::try_take(state_dir / "finish.lock");
    if (!finishing) {
      if (attempt >= 3000) {
        throw Error(str(state_dir.string(), "/finish.lock: held by another process for 30 s; ",
                        "run again when it is done"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    records = read_records(job);
    if (job.shard_bytes) {
      std::size_t covered = 0;
      for (const auto& [part, record] : records) covered += record.inputs;
      complete = covered == n;
    } else {
      complete = records.size() == total_parts;
      for (std::size_t part = 0; complete && part < total_parts; ++part) {
        complete = records.count(part) != 0;
      }
    }
    if (complete) {
      const std::size_t removed = sweep_folder(job);
      if (removed > 0) {
        std::fprintf(stderr, "preprocess: removed %zu temporary files that killed runs left\n",
                     removed);
      }
      stats = statistics(job, records);
      ipc::write_file_atomically(stats_path, stats.dump(1) + "\n", "statistics",
                                 stats_path.string() + ".partial");
    }
    break;
  }
  const double seconds = progress.elapsed();
  const double rate = seconds > 0 ? static_cast<double>(progress.done) / seconds : 0.0;
  std::printf(
      "preprocess: rank %zu of %zu wrote %zu parts (%llu images, %llu skipped) in %.1f s, "
      "%.0f images/s; %zu parts were done before\n",
      rank, world, written_parts, static_cast<unsigned long long>(images),
      static_cast<unsigned long long>(skipped), seconds, rate, resumed_parts);
  if (complete) {
    std::printf(
        "preprocess: complete: %s (%llu images, %llu inputs skipped; statistics in %s)\n",
        job.out.c_str(), static_cast<unsigned long long>(stats["images"].get<std::uint64_t>()),
        static_cast<unsigned long long>(stats["skipped"].get<std::uint64_t>()), stats_path.c_str());
    if (stats["skipped"].get<std::uint64_t>() > 0) {
      std::fprintf(stderr,
                   "ferry: warning: %llu inputs were skipped; %s lists them with the reason\n",
                   static_cast<unsigned long long>(stats["skipped"].get<std::uint64_t>()),
                   stats_path.c_str());
    }
  } else {
    std::printf(
        "preprocess: this rank's parts are done; other ranks' parts are not yet (%zu of "
        "%zu recorded); the last rank to finish writes %s\n",
        records.size(), total_parts, stats_path.c_str());
  }
  if (!options.json.empty()) {
    const json summary = {{"config", options.config},
                          {"output", job.out.string()},
                          {"rank", rank},
                          {"world_size", world},
                          {"launcher", launcher},
                          {"inputs", n},
                          {"parts_total", total_parts == 0 ? json(nullptr) : json(total_parts)},
                          {"parts_done_before", resumed_parts},
                          {"parts_written", written_parts},
                          {"inputs_read", progress.done},
                          {"images_written", images},
                          {"skipped", skipped},
                          {"bytes_in", progress.bytes_in},
                          {"seconds", seconds},
                          {"images_per_second", rate},
                          {"complete", complete},
                          {"statistics", complete ? json(stats_path.string()) : json(nullptr)}};
    ipc::write_file_atomically(options.json, summary.dump(1) + "\n", "--json",
                               options.json + ".partial");
  }
  return 0;
}

}  // namespace ferry::cli
