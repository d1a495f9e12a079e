#pragma once

// ferry::config: pipelines described in YAML (built when yaml-cpp is found; link ferry::config
// or ferry::ferry). See README "YAML pipelines" and configs/.
//
//   dataset: {type: image_folder, root: data/train}       # relative to this file's folder
//   transforms:
//     - random_resized_crop: {size: 224}
//     - random_horizontal_flip
//     - to_tensor
//     - normalize: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}
//   sampler: {type: random}                                # optional
//   loader: {batch_size: 64, num_workers: ${WORKERS:-4}, timeout: 30}
//   collate: {type: default}                               # optional
//
//   ferry::DataLoader loader = ferry::load_pipeline("train.yaml");

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/config.h"
#include "ferry/data_loader.h"
#include "ferry/registry.h"

namespace ferry {

/// Reads a YAML file into a Config whose every node knows its file, line and column. Scalars
/// get `${VAR}` and `${VAR:-default}` expanded from the environment. Throws ConfigError naming
/// the place for: a missing or unreadable file, an empty file, bytes that are not UTF-8, YAML
/// syntax, a duplicate key, a map key that is not a plain scalar, an unset variable without a
/// default, and a document that expands past a million nodes (an alias bomb).
Config read_yaml(const std::filesystem::path& file);
/// The same for YAML text; `file` names it in messages.
Config parse_yaml(std::string_view text, const std::string& file = "<string>");

/// Changes made to a pipeline's file before it is checked and built.
struct PipelineOverrides {
  /// `key.path=value` settings, as `ferry run --set`: `loader.batch_size=64`,
  /// `transforms.0.random_resized_crop.size=[192]`. The value is YAML; a missing map key is
  /// created; a number indexes a list.
  std::vector<std::string> set{};
  /// Applied to the loader options after the file's (and `set`'s) keys: options only code can
  /// give (worker_init_fn), or any other.
  std::function<void(DataLoaderOptions&)> options{};
};

/// A pipeline checked and built from its configuration, before any worker starts.
struct Pipeline {
  /// The whole configuration after variables, overrides and relative paths were resolved,
  /// with every default filled in: what `ferry validate` prints.
  Config config;
  AnyDataset dataset;
  std::shared_ptr<Sampler> sampler;  // null: the loader's shuffle decides
  CollateFn collate_fn;              // empty: the default collate
  DataLoaderOptions options;         // resolved (the seed in use, the prefetch factor)

  /// A new loader over this pipeline (each call gives a fresh one, epochs from 0).
  DataLoader make_loader() const;
};

/// Checks and builds a pipeline from a configuration tree (as read_yaml returns); relative
/// paths resolve against `base_dir`. Every error is a ConfigError naming the place, the key
/// path, what was expected and what was found.
Pipeline build_pipeline(Config root,
                        const std::filesystem::path& base_dir,
                        const PipelineOverrides& overrides = {});
/// read_yaml, then build_pipeline against the file's folder.
Pipeline read_pipeline(const std::filesystem::path& file, const PipelineOverrides& overrides = {});
/// The loader of a pipeline file, ready to iterate.
DataLoader load_pipeline(const std::filesystem::path& file,
                         const PipelineOverrides& overrides = {});

/// The keys of a pipeline file's `loader` section (DataLoaderOptions' names; timeouts in
/// seconds), and of the file itself: what the checks and `ferry describe loader` read.
const TypeInfo& loader_keys();
const TypeInfo& pipeline_keys();
/// The steps a pipeline's `device_transforms` list may name (to_dtype, normalize) and their keys.
const std::vector<TypeInfo>& device_transform_types();

/// Applies one `key.path=value` setting to `root` (see PipelineOverrides::set).
void apply_setting(Config& root, std::string_view setting);

/// YAML text for a configuration (block style, keys in order), as `ferry validate` prints it.
std::string to_yaml(const Config& config);

}  // namespace ferry
