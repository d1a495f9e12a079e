// The preprocess file: its keys and checks, the job it describes, and the job's plan.

#include "cli/preprocess_job.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include <opencv2/core/version.hpp>

#include "ferry/error.h"
#include "ferry/init.h"
#include "ferry/pipeline.h"
#include "ferry/registry.h"
#include "ferry/version.h"
#include "ferry/vision.h"

#include "config/components.h"
#include "core/hash.h"
#include "net/url.h"

namespace ferry::cli {

namespace prep {

namespace fs = std::filesystem;
using ferry::detail::str;
using nlohmann::json;

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

const TypeInfo& output_keys() {
  static const TypeInfo info{
      .name = "preprocess_output",
      .summary = "the output section of a preprocess file",
      .keys = {
          {.name = "path",
           .type = ValueType::kString,
           .required = true,
           .help = "the folder to write (created), or s3://bucket/prefix/ to upload each "
                   "finished part to",
           .is_path = true},
          {.name = "staging",
           .type = ValueType::kString,
           .default_value = "",
           .help = "for an s3:// path: the local folder the job writes before uploading, kept "
                   "for a resume; default ~/.cache/ferry/preprocess/<hash of the path>",
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
  const std::string out_path = out.get<std::string>("path");
  if (net::is_remote(out_path)) {
    if (net::parse_location(out_path).scheme != net::Scheme::kS3) {
      out.fail("path", "a remote output is an s3:// URL (https:// and pipe: are read-only)");
    }
    job.upload = out_path;
    while (!job.upload.empty() && job.upload.back() == '/') job.upload.pop_back();
    std::string staging = out.get<std::string>("staging");
    if (staging.empty()) {
      const char* cache = std::getenv("XDG_CACHE_HOME");
      const char* home = std::getenv("HOME");
      const fs::path root = cache != nullptr && *cache != '\0' ? fs::path(cache)
                            : home != nullptr                  ? fs::path(home) / ".cache"
                                                               : fs::temp_directory_path();
      staging =
          (root / "ferry" / "preprocess" / ferry::detail::hex64(ferry::detail::fnv1a(job.upload)))
              .string();
    }
    job.out = (base / staging).lexically_normal();
  } else {
    job.out = (base / out_path).lexically_normal();
  }
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
  std::uint64_t items_hash = detail::kFnvOffset;
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
  for (const std::string& name : job.names) items_hash = detail::fnv1a(name + "\n", items_hash);
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
  output_settings.erase("staging");
  // Nor how remote shards are fetched (retries, timeouts, the cache): the same bytes come.
  Config input_settings = resolved_input;
  for (const char* how :
       {"download_retry", "download_timeout", "cache_dir", "cache_limit", "prefetch"}) {
    if (input_settings.is_map()) input_settings.erase(how);
  }
  job.settings = {{"input", to_yaml(input_settings)},
                  {"transforms", to_yaml(resolved_transforms)},
                  {"output", to_yaml(output_settings)},
                  {"on_error", args.get<std::string>("on_error")},
                  {"shuffle_seed", job.shuffle_seed ? json(*job.shuffle_seed) : json(nullptr)},
                  {"inputs", n},
                  {"input_names_hash", str(std::hex, items_hash)},
                  // Another encoder may write other bytes for the same pixels.
                  {"encoder", str("ferry ", FERRY_VERSION, ", OpenCV ", CV_VERSION)}};
  job.fingerprint = detail::hex64(detail::fnv1a(job.settings.dump()));
  return job;
}

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

}  // namespace prep

using ferry::detail::str;

const TypeInfo& preprocess_output_keys() { return prep::output_keys(); }

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
           .default_value = prep::default_workers(),
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
  const prep::Job job = prep::read_job(options);
  const std::size_t n = job.names.size();
  const std::string parts =
      job.shard_bytes
          ? str("shards of at most ", *job.shard_bytes, " bytes")
          : str((n + job.part_size - 1) / job.part_size, job.shards ? " shards" : " parts", " of ",
                job.part_size, job.shards ? " samples" : " images");
  std::printf("# %s: valid preprocess job (%zu inputs -> %s, %s)\n", config.c_str(), n,
              job.out.c_str(), parts.c_str());
  std::printf("input:\n%s", prep::indent(job.settings["input"].get<std::string>()).c_str());
  std::printf("transforms:\n%s",
              prep::indent(job.settings["transforms"].get<std::string>()).c_str());
  std::printf("output:\n%s", prep::indent(job.settings["output"].get<std::string>()).c_str());
  std::printf("workers: %zu\nbatch_size: %zu\non_error: %s\n", job.workers, job.batch_size,
              job.stop_on_error ? "stop" : "skip");
  if (job.shuffle_seed)
    std::printf("shuffle_seed: %llu\n", static_cast<unsigned long long>(*job.shuffle_seed));
  return 0;
}

}  // namespace ferry::cli
