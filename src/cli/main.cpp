// The ferry command: run, validate and describe YAML pipelines; write the sample dataset;
// preprocess an image dataset into shards.
// Exit codes: 0 done, 1 a failure (a bad pipeline, a data error), 2 a usage error, 75 stopped
// by SIGTERM or SIGUSR1 after saving the state of what was consumed (ferry run --save-state).

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "ferry/error.h"
#include "ferry/ferry.h"
#include "ferry/pipeline.h"

#include "cli/run.h"
#if defined(FERRY_HAS_VISION)
#include "cli/preprocess.h"
#endif

namespace {

namespace fs = std::filesystem;

constexpr int kFailure = 1;
constexpr int kUsage = 2;

std::string describe_default(const ferry::KeySpec& key) {
  if (key.required) return "required";
  if (key.default_value.is_null()) return "default: unset";
  if (key.default_value.is_scalar()) return "default: " + key.default_value.scalar();
  std::string s = ferry::to_yaml(key.default_value);
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return "default: " + s;
}

void print_type(const std::string& kind, const ferry::TypeInfo& info) {
  std::printf("%s %s: %s\n", kind.c_str(), info.name.c_str(), info.summary.c_str());
  if (info.keys.empty()) {
    std::printf("  (no keys)\n");
    return;
  }
  std::size_t width = 0;
  for (const auto& key : info.keys) width = std::max(width, key.name.size());
  for (const auto& key : info.keys) {
    std::string type(ferry::to_string(key.type));
    if (key.min && key.max) {
      type += ferry::detail::str(" in [", *key.min, ", ", *key.max, "]");
    } else if (key.min) {
      type += ferry::detail::str(" >= ", *key.min);
    } else if (key.max) {
      type += ferry::detail::str(" <= ", *key.max);
    }
    if (!key.choices.empty()) {
      type += ": ";
      for (std::size_t i = 0; i < key.choices.size(); ++i) {
        type += (i ? " | " : "") + key.choices[i];
      }
    }
    if (key.is_path) type += " (path, relative to the file)";
    std::printf("  %-*s  %s; %s\n  %-*s  %s\n", static_cast<int>(width), key.name.c_str(),
                type.c_str(), describe_default(key).c_str(), static_cast<int>(width), "",
                key.help.c_str());
  }
}

const std::vector<std::pair<ferry::ComponentKind, const char*>> kKinds{
    {ferry::ComponentKind::kDataset, "dataset"},
    {ferry::ComponentKind::kTransform, "transform"},
    {ferry::ComponentKind::kSampler, "sampler"},
    {ferry::ComponentKind::kCollate, "collate"}};

int describe(const std::string& name) {
  const auto& registry = ferry::Registry::global();
  if (name.empty()) {
    std::printf("Sections of a pipeline file (ferry describe pipeline | loader):\n");
    for (const ferry::TypeInfo* info : {&ferry::pipeline_keys(), &ferry::loader_keys()}) {
      std::printf("  %-24s %s\n", info->name.c_str(), info->summary.c_str());
    }
#if defined(FERRY_HAS_VISION)
    std::printf(
        "\nSections of a preprocess file (ferry describe preprocess | preprocess_output):\n");
    for (const ferry::TypeInfo* info :
         {&ferry::cli::preprocess_keys(), &ferry::cli::preprocess_output_keys()}) {
      std::printf("  %-24s %s\n", info->name.c_str(), info->summary.c_str());
    }
#endif
    for (const auto& [kind, label] : kKinds) {
      std::printf("\n%ss:\n", label);
      for (const ferry::TypeInfo* info : registry.types(kind)) {
        std::printf("  %-24s %s\n", info->name.c_str(), info->summary.c_str());
      }
    }
    std::printf("\ndevice transforms:\n");
    for (const ferry::TypeInfo& info : ferry::device_transform_types()) {
      std::printf("  %-24s %s\n", info.name.c_str(), info.summary.c_str());
    }
    std::printf("\nferry describe TYPE shows a type's keys and defaults.\n");
    return 0;
  }
  bool found = false;
  if (name == "loader" || name == "pipeline") {
    print_type("section", name == "loader" ? ferry::loader_keys() : ferry::pipeline_keys());
    found = true;
  }
  std::vector<std::string> all{"loader", "pipeline"};
#if defined(FERRY_HAS_VISION)
  for (const ferry::TypeInfo* info :
       {&ferry::cli::preprocess_keys(), &ferry::cli::preprocess_output_keys()}) {
    if (name == info->name) {
      print_type("section", *info);
      found = true;
    }
    all.push_back(info->name);
  }
#endif
  for (const auto& [kind, label] : kKinds) {
    if (const ferry::TypeInfo* info = registry.find(kind, name)) {
      if (found) std::printf("\n");
      print_type(label, *info);
      found = true;
    }
    for (const ferry::TypeInfo* info : registry.types(kind)) all.push_back(info->name);
  }
  for (const ferry::TypeInfo& info : ferry::device_transform_types()) {
    if (info.name == name) {
      if (found) std::printf("\n");
      print_type("device transform", info);
      found = true;
    }
    all.push_back(info.name);
  }
  if (found) return 0;
  const auto suggestion = ferry::nearest(name, all);
  throw ferry::ConfigError(ferry::detail::str(
      "no type named '", name, "'", suggestion ? "; did you mean '" + *suggestion + "'?" : "",
      " (ferry describe lists them)"));
}

int validate(const std::string& config, const std::vector<std::string>& set) {
#if defined(FERRY_HAS_VISION)
  // A preprocess job (input and output, no dataset) is checked as one.
  const ferry::Config root = ferry::read_yaml(config);
  if (root.is_map() && root.find("dataset") == nullptr && root.find("input") != nullptr) {
    return ferry::cli::validate_preprocess(config, set);
  }
#endif
  const ferry::Pipeline pipeline = ferry::read_pipeline(config, {.set = set});
  std::string size = "a stream";
  if (const auto* map = std::get_if<std::shared_ptr<ferry::Dataset>>(&pipeline.dataset)) {
    const ferry::DataLoader loader = pipeline.make_loader();
    size = ferry::detail::str((*map)->size(), " samples, ", loader.size(), " batches per epoch");
    if (loader.size() == 0) {
      std::fprintf(stderr,
                   "ferry: warning: %s: an epoch has no batch (%zu samples, batch_size "
                   "%zu, drop_last %s)\n",
                   config.c_str(), (*map)->size(), pipeline.options.batch_size,
                   pipeline.options.drop_last ? "true" : "false");
    }
  }
  std::printf("# %s: valid (%s)\n%s", config.c_str(), size.c_str(),
              ferry::to_yaml(pipeline.config).c_str());
  return 0;
}

int sample_data(const std::string& dir,
                std::size_t classes,
                std::size_t per_class,
                const std::string& size,
                std::uint32_t seed,
                bool force) {
#if !defined(FERRY_HAS_VISION)
  (void)classes, (void)per_class, (void)size, (void)seed, (void)force;
  throw ferry::Error(ferry::detail::str(
      dir,
      ": ferry sample-data writes JPEGs with ferry::vision, which this build of ferry does "
      "not have (OpenCV, libjpeg or libpng was not found); install libopencv-dev libjpeg-dev "
      "libpng-dev and rebuild"));
#else
  int width = 0;
  int height = 0;
  char tail = 0;
  if (std::sscanf(size.c_str(), "%dx%d%c", &width, &height, &tail) != 2) {
    throw CLI::ValidationError("--size", "expected WIDTHxHEIGHT, as 500x375; got " + size);
  }
  const fs::path root(dir);
  const fs::path marker = root / ".ferry-sample-data";
  const std::string stamp = ferry::detail::str("classes=", classes, " per_class=", per_class,
                                               " size=", width, "x", height, " seed=", seed);
  std::error_code ec;
  if (fs::exists(marker, ec)) {
    std::ifstream in(marker);
    std::string existing;
    std::getline(in, existing);
    if (existing == stamp && !force) {
      std::printf("%s: the sample dataset is already there (%s)\n", dir.c_str(), stamp.c_str());
      return 0;
    }
  } else if (fs::exists(root, ec) && !fs::is_empty(root, ec) && !force) {
    throw ferry::Error(ferry::detail::str(
        dir,
        ": exists and is not a ferry sample dataset; choose another folder, or pass "
        "--force to write into it"));
  }
  fs::remove(marker, ec);
  const bool terminal = ::isatty(STDERR_FILENO) == 1;
  ferry::vision::SampleImagesOptions options{.classes = classes,
                                             .images_per_class = per_class,
                                             .width = width,
                                             .height = height,
                                             .quality = 90,
                                             .seed = seed};
  options.progress = [&](std::size_t done, std::size_t total) {
    if (terminal) {
      std::fprintf(stderr, "\r\033[Kwriting images: %zu/%zu", done, total);
      if (done == total) std::fprintf(stderr, "\n");
    } else if (done == total || done % 100 == 0) {
      std::fprintf(stderr, "writing images: %zu/%zu\n", done, total);
    }
  };
  const auto files = ferry::vision::write_sample_images(root, options);
  std::ofstream(marker) << stamp << "\n";
  std::printf("%s: %zu photo-like JPEGs (%dx%d) in %zu classes\n", dir.c_str(), files.size(), width,
              height, classes);
  return 0;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  // Spawned workers of pipelines with the spawn and forkserver start methods are copies of
  // this program: set up before anything else.
  ferry::init(argc, argv);

  CLI::App app{"ferry " FERRY_VERSION
               ": multi-process data loading for LibTorch; run and check YAML pipelines"};
  app.set_version_flag("--version", "ferry " FERRY_VERSION);
  app.require_subcommand(1);

  ferry::cli::RunOptions run;
  auto* run_cmd = app.add_subcommand("run", "iterate a pipeline, with progress and a summary");
  run_cmd->add_option("config", run.config, "the pipeline's YAML file")->required();
  run_cmd->add_option("--epochs", run.epochs, "epochs to run (default 1)");
  run_cmd->add_option("--max-batches", run.max_batches, "stop each epoch after N batches");
  run_cmd->add_option("--set", run.set, "override a key: key.path=value (repeatable)");
  run_cmd->add_option("--json", run.json, "write the summary as JSON to FILE");
  run_cmd->add_option("--dump-indices", run.dump_indices,
                      "write each batch's sample indices to FILE, one JSON line per batch");
  run_cmd->add_option("--save-state", run.save_state,
                      "write the loader's checkpoint to FILE (atomically) at the end, every "
                      "--save-every batches, and on SIGTERM or SIGUSR1 (then exit 75)");
  run_cmd->add_option("--save-every", run.save_every, "with --save-state: every N batches");
  run_cmd->add_option("--resume", run.resume,
                      "continue from a checkpoint that --save-state wrote ({rank} in any file "
                      "name becomes this process's rank)");
  run_cmd->add_option("--trace", run.trace,
                      "write a Chrome trace-event JSON file of the loader (open it in Perfetto "
                      "or chrome://tracing; {rank} becomes the rank)");
  run_cmd->add_option("--trace-events", run.trace_events,
                      "with --trace: keep the most recent N events (default 131072)");
  run_cmd->add_flag("--headspace", run.headspace,
                    "hold the first --headspace-batches batches, replay them from memory after "
                    "the run, and report the loop's rate with and without real loading");
  run_cmd
      ->add_option("--headspace-batches", run.headspace_batches,
                   "with --headspace: the batches held and replayed (default 64)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20));
  run_cmd
      ->add_option("--step-ms", run.step_ms,
                   "a synthetic training step: keep the training thread busy this long per "
                   "batch (milliseconds)")
      ->check(CLI::Range(0.0, 60000.0));
  run_cmd
      ->add_option("--log-every", run.log_every,
                   "seconds between progress lines when not on a terminal")
      ->check(CLI::Range(0.01, 86400.0));

  std::string validate_config;
  std::vector<std::string> validate_set;
  auto* validate_cmd =
      app.add_subcommand("validate", "check a pipeline file and print it resolved");
  validate_cmd->add_option("config", validate_config, "the pipeline's YAML file")->required();
  validate_cmd->add_option("--set", validate_set, "override a key: key.path=value");

  std::string type_name;
  auto* describe_cmd = app.add_subcommand(
      "describe", "list the dataset, transform, sampler and collate types, or one type's keys");
  describe_cmd->add_option("type", type_name, "a type name, or loader / pipeline");

#if defined(FERRY_HAS_VISION)
  ferry::cli::PreprocessOptions pre;
  auto* pre_cmd = app.add_subcommand(
      "preprocess",
      "transform and re-encode an image dataset into WebDataset shards or an image tree, "
      "resumably, with statistics (ferry describe preprocess lists the file's keys)");
  pre_cmd->add_option("config", pre.config, "the job's YAML file")->required();
  pre_cmd->add_option("--set", pre.set, "override a key: key.path=value (repeatable)");
  pre_cmd->add_option("--json", pre.json, "write the summary as JSON to FILE");
  pre_cmd->add_option("--rank", pre.rank,
                      "this process's rank (default: torchrun's, mpirun's or srun's, else 0)");
  pre_cmd->add_option("--world-size", pre.world_size,
                      "the ranks that split the parts (default: the launcher's, else 1)");
  pre_cmd
      ->add_option("--log-every", pre.log_every,
                   "seconds between progress lines when not on a terminal")
      ->check(CLI::Range(0.01, 86400.0));
#endif

  std::string data_dir;
  std::size_t classes = 4;
  std::size_t per_class = 32;
  std::string size = "500x375";
  std::uint32_t seed = 0;
  bool force = false;
  auto* sample_cmd =
      app.add_subcommand("sample-data", "write a small ImageFolder of generated photo-like JPEGs");
  sample_cmd->add_option("dir", data_dir, "the folder to write")->required();
  sample_cmd->add_option("--classes", classes, "class folders (default 4)");
  sample_cmd->add_option("--per-class", per_class, "images per class (default 32)");
  sample_cmd->add_option("--size", size, "WIDTHxHEIGHT of each image");
  sample_cmd->add_option("--seed", seed, "image content seed");
  sample_cmd->add_flag("--force", force, "write into a folder that holds other files");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, the version, or the error
    return code == 0 ? 0 : kUsage;
  }
  try {
    if (*run_cmd) return ferry::cli::run_pipeline(run);
    if (*validate_cmd) return validate(validate_config, validate_set);
    if (*describe_cmd) return describe(type_name);
#if defined(FERRY_HAS_VISION)
    if (*pre_cmd) return ferry::cli::run_preprocess(pre);
#endif
    if (*sample_cmd) return sample_data(data_dir, classes, per_class, size, seed, force);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "ferry: error: %s\n", e.what());
    return kUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry: error: %s\n", e.what());
    return kFailure;
  }
  return kUsage;
}
