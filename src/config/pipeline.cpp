// A pipeline file: checked section by section against the registry and the loader's keys, then
// built, before any worker starts.

#include "ferry/pipeline.h"

#include <charconv>
#include <cmath>

#include "ferry/error.h"
#include "ferry/init.h"

#include "config/components.h"
#include "net/url.h"

namespace ferry {

namespace {
std::string at(const Config& node) { return node.mark().prefix(); }
}  // namespace

namespace detail {

// `{random_resized_crop: {size: 224}}` (one key: the type, its options) becomes
// `{type: random_resized_crop, size: 224}`; other forms pass unchanged.
Config normalise_component(const Config& node) {
  if (!node.is_map() || node.size() != 1 || node.find("type") != nullptr) return node;
  const auto& [name, options] = node.entries().front();
  if (!options.is_map() && !options.is_null()) return node;
  Config type(name);
  type.set_mark(options.mark().known() ? options.mark() : node.mark());
  Config out = Config::map({{"type", std::move(type)}});
  out.set_mark(node.mark());
  if (options.is_map()) {
    for (const auto& [key, value] : options.entries()) {
      if (key == "type") {
        throw ConfigError(detail::str(at(value), name, ".type: the type is already '", name,
                                      "'; write either {", name, ": {...}} or {type: ", name,
                                      ", ...}"));
      }
      out.set(key, value);
    }
  }
  return out;
}

// Keys that name files or folders resolve against the pipeline file's folder.
Config resolve_paths(Config node, ComponentKind kind, const std::filesystem::path& base_dir) {
  if (!node.is_map() || base_dir.empty()) return node;
  const Config* type = node.find("type");
  if (type == nullptr || !type->is_scalar()) return node;
  const TypeInfo* info = Registry::global().find(kind, type->scalar());
  if (info == nullptr) return node;
  for (const KeySpec& key : info->keys) {
    if (!key.is_path) continue;
    const Config* value = node.find(key.name);
    if (value == nullptr || !value->is_scalar() || value->scalar().empty()) continue;
    const std::filesystem::path p(value->scalar());
    if (p.is_absolute() || net::is_remote(value->scalar())) continue;  // s3://, https://, pipe:
    Config absolute((base_dir / p).lexically_normal().string());
    absolute.set_mark(value->mark());
    node.set(key.name, std::move(absolute));
  }
  return node;
}

}  // namespace detail

using detail::normalise_component;
using detail::resolve_paths;

namespace {

Config with_setting(const Config& node,
                    const std::vector<std::string>& keys,
                    std::size_t i,
                    const Config& value,
                    const std::string& setting) {
  if (i == keys.size()) return value;
  const std::string& key = keys[i];
  std::string walked;
  for (std::size_t k = 0; k < i; ++k) walked += (k ? "." : "") + keys[k];
  if (node.is_list()) {
    std::size_t index = 0;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), index);
    if (ec != std::errc() || end != key.data() + key.size() || index >= node.size()) {
      throw ConfigError(detail::str("--set ", setting, ": ", walked, " is a list of ", node.size(),
                                    " items; '", key, "' is not an index of it (0..",
                                    node.size() == 0 ? 0 : node.size() - 1, ")"));
    }
    std::vector<Config> items = node.items();
    items[index] = with_setting(items[index], keys, i + 1, value, setting);
    Config out = Config::list(std::move(items));
    out.set_mark(node.mark());
    return out;
  }
  if (node.is_scalar()) {
    throw ConfigError(detail::str("--set ", setting, ": ", walked, " is the value ",
                                  node.describe(), ", not a map with a key '", key, "'"));
  }
  // A component written in the plain form ({image_folder: {root: ...}}) takes its options'
  // keys as the {type: image_folder, root: ...} form does, so an override reaches the same key
  // whichever form the file uses.
  Config out = i > 0 && node.is_map() && node.find(key) == nullptr ? normalise_component(node)
                                                                   : node;  // null: becomes a map
  const Config* child = out.is_map() ? out.find(key) : nullptr;
  out.set(key, with_setting(child != nullptr ? *child : Config(), keys, i + 1, value, setting));
  return out;
}

void set_mark_everywhere(Config& node, const ConfigMark& mark) {
  node.set_mark(mark);
  if (node.is_list()) {
    std::vector<Config> items = node.items();
    for (Config& item : items) set_mark_everywhere(item, mark);
    node = Config::list(std::move(items));
    node.set_mark(mark);
  } else if (node.is_map()) {
    for (const auto& [key, value] : std::vector<Config::Entry>(node.entries())) {
      Config v = value;
      set_mark_everywhere(v, mark);
      node.set(key, std::move(v));
    }
  }
}

}  // namespace

const TypeInfo& loader_keys() {
  static const TypeInfo info{
      .name = "loader",
      .summary =
          "the DataLoader's options (torch.utils.data.DataLoader's names; timeouts in "
          "seconds)",
      .keys = {
          {.name = "batch_size",
           .type = ValueType::kInt,
           .default_value = 1,
           .help = "samples per batch",
           .min = 1},
          {.name = "shuffle",
           .type = ValueType::kBool,
           .default_value = false,
           .help = "a new random order each epoch (without a sampler)"},
          {.name = "num_workers",
           .type = ValueType::kInt,
           .default_value = 0,
           .help = "worker processes; 0 loads in the calling thread",
           .min = 0},
          {.name = "prefetch_factor",
           .type = ValueType::kInt,
           .help = "batches in flight per worker (2 when unset, with workers)",
           .min = 1},
          {.name = "persistent_workers",
           .type = ValueType::kBool,
           .default_value = false,
           .help = "keep the workers between epochs"},
          {.name = "pin_memory",
           .type = ValueType::kBool,
           .default_value = false,
           .help = "page-lock batches for fast copies to the GPU (needs CUDA)"},
          {.name = "drop_last",
           .type = ValueType::kBool,
           .default_value = false,
           .help = "leave out a last, shorter batch"},
          {.name = "timeout",
           .type = ValueType::kFloat,
           .default_value = 0,
           .help = "seconds to wait for a batch from the workers; 0: forever",
           .min = 0},
          {.name = "in_order",
           .type = ValueType::kBool,
           .default_value = true,
           .help = "deliver batches in sampler order (false: as they are ready)"},
          {.name = "seed",
           .type = ValueType::kInt,
           .help = "the seed of shuffling and of every sample's generator (unset: drawn once)",
           .min = 0},
          {.name = "start_method",
           .type = ValueType::kString,
           .help = "how workers start (unset: fork)",
           .choices = {"fork", "spawn", "forkserver"}},
          {.name = "device",
           .type = ValueType::kString,
           .help = "copy each batch to this device (cuda, cuda:1)"},
          {.name = "sample_timeout",
           .type = ValueType::kFloat,
           .default_value = 0,
           .help = "seconds one sample may take in a worker; 0: no limit",
           .min = 0},
          {.name = "worker_threads",
           .type = ValueType::kInt,
           .default_value = 1,
           .help = "threads loading the samples of a batch inside each worker (needs TBB)",
           .min = 1},
          {.name = "on_error",
           .type = ValueType::kString,
           .default_value = "raise",
           .help = "a sample whose loading throws: raise, or skip it (recorded)",
           .choices = {"raise", "skip"}},
          {.name = "skipped_history",
           .type = ValueType::kInt,
           .default_value = 100,
           .help = "most recent skipped samples listed in the stats (all are counted); 0: all",
           .min = 0},
          {.name = "on_worker_death",
           .type = ValueType::kString,
           .default_value = "raise",
           .help = "a worker process that dies: raise, or respawn it and load its batches again",
           .choices = {"raise", "respawn"}},
          {.name = "max_worker_restarts",
           .type = ValueType::kInt,
           .default_value = 3,
           .help = "with respawn: restarts allowed in one epoch",
           .min = 0},
          {.name = "max_worker_restarts_total",
           .type = ValueType::kInt,
           .default_value = 10,
           .help = "with respawn: restarts allowed over the loader's life",
           .min = 0},
          {.name = "worker_cpus",
           .type = ValueType::kString,
           .help = "the cores workers run on: \"2-7,10\", or \"gpu:N\" for the cores local to "
                   "GPU N (the training thread's are left out); unset: any"},
          {.name = "trace_path",
           .type = ValueType::kString,
           .help = "write a Chrome trace-event JSON file (Perfetto) of the loader here"},
          {.name = "trace_events",
           .type = ValueType::kInt,
           .default_value = 0,
           .help = "the trace keeps the most recent this many events (0: 131072 with trace_path)",
           .min = 0},
      }};
  return info;
}

const TypeInfo& pipeline_keys() {
  static const TypeInfo info{
      .name = "pipeline",
      .summary = "a pipeline file: the dataset, its transforms, the order and the loader",
      .keys = {
          {.name = "dataset",
           .type = ValueType::kAny,
           .required = true,
           .help = "{type: NAME, key: value, ...} or {NAME: {key: value, ...}}"},
          {.name = "transforms",
           .type = ValueType::kAny,
           .help = "a list of transforms, each {NAME: {key: value}}, {type: NAME, ...} or NAME"},
          {.name = "sampler",
           .type = ValueType::kAny,
           .help = "the order of the samples (unset: loader.shuffle decides)"},
          {.name = "loader", .type = ValueType::kAny, .help = "the loader's options"},
          {.name = "collate", .type = ValueType::kAny, .help = "how samples become a batch"},
          {.name = "device_transforms",
           .type = ValueType::kAny,
           .help = "steps on whole batches once on loader.device (the GPU): to_dtype, normalize"},
      }};
  return info;
}

const std::vector<TypeInfo>& device_transform_types() {
  static const std::vector<TypeInfo> types{
      {.name = "normalize",
       .summary = "(x - mean[c]) / std[c] over dimension 1 of each field ([B, C, ...]), as "
                  "torchvision's Normalize, on the batch's device",
       .keys = {{.name = "mean",
                 .type = ValueType::kFloatList,
                 .required = true,
                 .help = "one value per channel"},
                {.name = "std",
                 .type = ValueType::kFloatList,
                 .required = true,
                 .help = "one value per channel"},
                {.name = "fields",
                 .type = ValueType::kStringList,
                 .default_value = Config::list({Config("image")}),
                 .help = "the batch fields"}},
       .builtin = true},
      {.name = "to_dtype",
       .summary = "converts fields to a dtype on the batch's device, as torchvision's v2 "
                  "ToDtype; with scale, uint8 images become floats in [0, 1] (x / 255)",
       .keys = {{.name = "dtype",
                 .type = ValueType::kString,
                 .default_value = "float32",
                 .help = "the new dtype",
                 .choices = {"float32", "float16", "bfloat16", "float64"}},
                {.name = "scale",
                 .type = ValueType::kBool,
                 .default_value = true,
                 .help = "divide integers by their type's maximum"},
                {.name = "fields",
                 .type = ValueType::kStringList,
                 .default_value = Config::list({Config("image")}),
                 .help = "the batch fields"}},
       .builtin = true},
  };
  return types;
}

namespace {

// `device_transforms:` a list of {NAME: {...}}, {type: NAME, ...} or NAME, each checked against
// its keys; returns the steps and their resolved configuration.
std::pair<BatchTransforms, Config> build_device_transforms(const Config& list) {
  BatchTransforms steps;
  Config resolved = Config::list();
  if (list.is_null()) return {steps, resolved};
  if (!list.is_list()) {
    throw ConfigError(detail::str(at(list), "device_transforms: expected a list of steps (each ",
                                  "'- NAME: {key: value}'), found ", list.describe()));
  }
  std::size_t i = 0;
  for (const Config& item : list.items()) {
    const std::string path = detail::str("device_transforms[", i++, "]");
    Config node = normalise_component(item);
    if (node.is_scalar()) {  // a name alone takes the defaults
      Config name = node;
      node = Config::map({{"type", std::move(name)}});
      node.set_mark(item.mark());
    }
    const Config* type = node.is_map() ? node.find("type") : nullptr;
    if (type == nullptr || !type->is_scalar()) {
      throw ConfigError(detail::str(at(item), path, ": expected {NAME: {key: value}} or NAME, ",
                                    "found ", item.describe()));
    }
    const TypeInfo* info = nullptr;
    std::vector<std::string> names;
    for (const auto& t : device_transform_types()) {
      names.push_back(t.name);
      if (t.name == type->scalar()) info = &t;
    }
    if (info == nullptr) {
      const auto near = nearest(type->scalar(), names);
      throw ConfigError(detail::str(at(item), path, ": unknown device transform '", type->scalar(),
                                    "'", near ? "; did you mean '" + *near + "'?" : "",
                                    " (device transforms: ", detail::join(names), ")"));
    }
    Config checked =
        check_keys(*info, node, path, "device transform '" + info->name + "'", {"type"});
    const Args a(*info, checked, path);
    try {
      if (info->name == "normalize") {
        steps.push_back(std::make_shared<device_transforms::Normalize>(
            a.get<std::vector<double>>("mean"), a.get<std::vector<double>>("std"),
            a.get<std::vector<std::string>>("fields")));
      } else {
        const std::string d = a.get<std::string>("dtype");
        const torch::ScalarType dtype = d == "float16"    ? torch::kHalf
                                        : d == "bfloat16" ? torch::kBFloat16
                                        : d == "float64"  ? torch::kDouble
                                                          : torch::kFloat;
        steps.push_back(std::make_shared<device_transforms::ToDtype>(
            dtype, a.get<bool>("scale"), a.get<std::vector<std::string>>("fields")));
      }
    } catch (const Error& e) {  // the steps' own checks (a std of 0, mean and std lengths)
      throw ConfigError(detail::str(at(item), path, ": ", e.what()));
    }
    Config entry = Config::map({{"type", info->name}});
    for (const auto& [key, value] : checked.entries()) entry.set(key, value);
    resolved.push_back(std::move(entry));
  }
  return {steps, resolved};
}

}  // namespace

void apply_setting(Config& root, std::string_view setting) {
  const std::string text(setting);
  const std::size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError(
        detail::str("--set ", text, ": expected key.path=value, as ", "loader.batch_size=64"));
  }
  std::vector<std::string> keys;
  std::size_t start = 0;
  const std::string path = text.substr(0, eq);
  for (;;) {
    const std::size_t dot = path.find('.', start);
    keys.push_back(path.substr(start, dot - start));
    if (keys.back().empty()) {
      throw ConfigError(detail::str("--set ", text, ": '", path, "' has an empty key"));
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  Config value = parse_yaml(text.substr(eq + 1), "--set " + text);
  set_mark_everywhere(value, ConfigMark{"--set " + text, 0, 0});
  root = with_setting(root, keys, 0, value, text);
}

Pipeline build_pipeline(Config root,
                        const std::filesystem::path& base_dir,
                        const PipelineOverrides& overrides) {
  register_builtins();
  const Registry& registry = Registry::global();
  for (const std::string& setting : overrides.set) apply_setting(root, setting);
  if (root.is_null()) {
    throw ConfigError(
        detail::str(at(root), "the pipeline is empty; it needs at least a ", "'dataset' section"));
  }
  (void)check_keys(pipeline_keys(), root, "", "a pipeline file");

  // The loader's keys first: they are the quickest to get wrong.
  const Config* loader_node = root.find("loader");
  const Config loader =
      check_keys(loader_keys(), loader_node ? *loader_node : Config(), "loader", "the loader");
  const Args args(loader_keys(), loader, "loader");
  DataLoaderOptions options;
  options.batch_size = args.get<std::size_t>("batch_size");
  options.shuffle = args.get<bool>("shuffle");
  options.num_workers = args.get<std::size_t>("num_workers");
  if (args.has("prefetch_factor"))
    options.prefetch_factor = args.get<std::size_t>("prefetch_factor");
  options.persistent_workers = args.get<bool>("persistent_workers");
  options.pin_memory = args.get<bool>("pin_memory");
  options.drop_last = args.get<bool>("drop_last");
  options.timeout = std::chrono::milliseconds(std::llround(args.get<double>("timeout") * 1000.0));
  options.in_order = args.get<bool>("in_order");
  if (args.has("seed")) options.seed = static_cast<std::uint64_t>(args.get<std::int64_t>("seed"));
  if (args.has("start_method")) {
    const std::string m = args.get<std::string>("start_method");
    options.start_method = m == "spawn"        ? StartMethod::kSpawn
                           : m == "forkserver" ? StartMethod::kForkserver
                                               : StartMethod::kFork;
  }
  if (args.has("device")) {
    const Config& node = *loader.find("device");
    try {
      options.device = torch::Device(node.scalar());
    } catch (const std::exception&) {
      throw ConfigError(detail::str(at(node), "loader.device: expected a device such as cpu, ",
                                    "cuda or cuda:1, found ", node.describe()));
    }
  }
  options.sample_timeout =
      std::chrono::milliseconds(std::llround(args.get<double>("sample_timeout") * 1000.0));
  options.worker_threads = args.get<std::size_t>("worker_threads");
  options.on_error = args.get<std::string>("on_error") == "skip" ? OnError::kSkip : OnError::kRaise;
  options.skipped_history = args.get<std::size_t>("skipped_history");
  options.on_worker_death = args.get<std::string>("on_worker_death") == "respawn"
                                ? OnWorkerDeath::kRespawn
                                : OnWorkerDeath::kRaise;
  options.max_worker_restarts = args.get<std::size_t>("max_worker_restarts");
  options.max_worker_restarts_total = args.get<std::size_t>("max_worker_restarts_total");
  if (args.has("worker_cpus")) options.worker_cpus = args.get<std::string>("worker_cpus");
  if (args.has("trace_path")) options.trace_path = args.get<std::string>("trace_path");
  options.trace_events = args.get<std::size_t>("trace_events");
  const Config* device_node = root.find("device_transforms");
  auto [device_steps, resolved_device_transforms] =
      build_device_transforms(device_node ? *device_node : Config());
  options.device_transforms = std::move(device_steps);
  if (overrides.options) overrides.options(options);
  try {
    options = resolve(std::move(options));
  } catch (const ConfigError& e) {
    throw ConfigError(detail::str(at(loader_node ? *loader_node : root), "loader: ", e.what()));
  }

  // The dataset, with its transforms (the registry builds those first, before the dataset opens
  // its files). They may be a top-level list or the dataset's own `transforms`, not both.
  Config dataset_node = normalise_component(*root.find("dataset"));
  const Config* top = root.find("transforms");
  const bool top_level = top != nullptr && !top->is_null();
  const Config* own = dataset_node.is_map() ? dataset_node.find("transforms") : nullptr;
  if (top_level && own != nullptr) {
    throw ConfigError(detail::str(at(*own), "dataset.transforms: the file also has a top-level ",
                                  "'transforms' list; keep one of them"));
  }
  const std::string transforms_path = top_level ? "transforms" : "dataset.transforms";
  if (const Config* list = top_level ? top : own; list != nullptr && !list->is_null()) {
    if (!list->is_list()) {
      throw ConfigError(detail::str(at(*list), transforms_path, ": expected a list of ",
                                    "transforms (each '- NAME: {key: value}'), found ",
                                    list->describe()));
    }
    Config items = Config::list();
    for (const Config& item : list->items()) {
      items.push_back(
          resolve_paths(normalise_component(item), ComponentKind::kTransform, base_dir));
    }
    if (!dataset_node.is_map()) dataset_node = Config::map({{"type", dataset_node}});
    dataset_node.set("transforms", std::move(items));
  }
  dataset_node = resolve_paths(std::move(dataset_node), ComponentKind::kDataset, base_dir);

  Pipeline pipeline;
  try {
    pipeline.dataset = registry.make_any_dataset(dataset_node, "dataset", transforms_path);
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    // A missing folder, an unreadable list file: the configuration names them.
    throw ConfigError(detail::str(at(dataset_node), "dataset: ", e.what()));
  }
  pipeline.options = std::move(options);

  Config resolved_sampler;
  if (const Config* sampler = root.find("sampler"); sampler != nullptr && !sampler->is_null()) {
    const auto* map = std::get_if<std::shared_ptr<Dataset>>(&pipeline.dataset);
    if (map == nullptr) {
      throw ConfigError(detail::str(at(*sampler), "sampler: an iterable dataset takes no ",
                                    "sampler (each worker reads its own stream); remove it"));
    }
    if (pipeline.options.shuffle) {
      const Config* shuffle = loader.find("shuffle");
      throw ConfigError(detail::str(at(shuffle != nullptr ? *shuffle : *sampler),
                                    "loader.shuffle: true, but the file also gives a sampler; ",
                                    "they are mutually exclusive (as in PyTorch): remove ",
                                    "shuffle, or use sampler {type: random}"));
    }
    const Config node = normalise_component(*sampler);
    pipeline.sampler = registry.make_sampler(
        node, SamplerContext{(*map)->size(), *pipeline.options.seed}, "sampler");
    resolved_sampler = registry.resolve(ComponentKind::kSampler, node, "sampler");
  }
  Config resolved_collate;
  if (const Config* collate = root.find("collate"); collate != nullptr && !collate->is_null()) {
    pipeline.collate_fn = registry.make_collate(normalise_component(*collate), "collate");
    resolved_collate = collate_spec(pipeline.collate_fn)->config;
  }

  // What was built, every default filled in.
  Config dataset_config =
      std::visit([](const auto& d) { return d->spec()->config; }, pipeline.dataset);
  Config resolved_transforms = Config::list();
  if (const Config* t = dataset_config.find("transforms")) {
    resolved_transforms = *t;
    dataset_config.erase("transforms");
  }
  Config resolved_loader = loader;
  resolved_loader.set("seed", static_cast<std::int64_t>(*pipeline.options.seed));
  if (pipeline.options.prefetch_factor) {
    resolved_loader.set("prefetch_factor",
                        static_cast<std::int64_t>(*pipeline.options.prefetch_factor));
  }
  pipeline.config = Config::map(
      {{"dataset", std::move(dataset_config)}, {"transforms", std::move(resolved_transforms)}});
  if (!resolved_sampler.is_null()) pipeline.config.set("sampler", std::move(resolved_sampler));
  pipeline.config.set("loader", std::move(resolved_loader));
  if (!resolved_collate.is_null()) pipeline.config.set("collate", std::move(resolved_collate));
  if (!resolved_device_transforms.items().empty()) {
    pipeline.config.set("device_transforms", std::move(resolved_device_transforms));
  }
  return pipeline;
}

Pipeline read_pipeline(const std::filesystem::path& file, const PipelineOverrides& overrides) {
  std::filesystem::path dir = file.parent_path();
  if (dir.empty()) dir = ".";
  return build_pipeline(read_yaml(file), std::filesystem::absolute(dir), overrides);
}

DataLoader load_pipeline(const std::filesystem::path& file, const PipelineOverrides& overrides) {
  return read_pipeline(file, overrides).make_loader();
}

DataLoader Pipeline::make_loader() const {
  if (const auto* map = std::get_if<std::shared_ptr<Dataset>>(&dataset)) {
    if (sampler) return DataLoader(*map, options, sampler, collate_fn);
    return DataLoader(*map, options, collate_fn);
  }
  return DataLoader(std::get<std::shared_ptr<IterableDataset>>(dataset), options, collate_fn);
}

}  // namespace ferry
