#pragma once

// What the pipeline and preprocess files share in reading a component's node.

#include <filesystem>

#include "ferry/config.h"
#include "ferry/registry.h"

namespace ferry::detail {

// `{random_resized_crop: {size: 224}}` (one key: the type, its options) becomes
// `{type: random_resized_crop, size: 224}`; other forms pass unchanged.
Config normalise_component(const Config& node);

// Keys that name files or folders resolve against the file's folder.
Config resolve_paths(Config node, ComponentKind kind, const std::filesystem::path& base_dir);

}  // namespace ferry::detail
