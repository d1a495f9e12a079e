#pragma once

// `ferry preprocess`: an offline job that reads an image dataset, transforms and re-encodes every
// image with worker processes, and writes an image tree or WebDataset tar shards with an index
// per shard and a statistics file. The job is cut into parts (a shard, or a group of images of
// the tree); each part is written under temporary names, renamed, and recorded, so a job killed
// at any moment and run again redoes only the parts it had in progress. Parts go to ranks round
// robin (part % world_size), so ranks of torchrun, mpirun or srun share nothing but the folder.

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "ferry/registry.h"

namespace ferry::cli {

struct PreprocessOptions {
  std::string config;
  std::vector<std::string> set;           // key.path=value
  std::string json;                       // the summary as JSON, to this file
  double log_every = 5.0;                 // seconds between lines when not on a terminal
  std::optional<std::size_t> rank;        // default: the launcher's, else 0
  std::optional<std::size_t> world_size;  // default: the launcher's, else 1
};

// Returns the exit code; throws ferry::Error (ConfigError for the file) for a failure.
int run_preprocess(const PreprocessOptions& options);

// Checks a preprocess file (its input listed, its transforms built) and prints what the job
// would write, as `ferry validate` does for pipelines.
int validate_preprocess(const std::string& config, const std::vector<std::string>& set);

// The keys of a preprocess file and of its `output` section (`ferry describe preprocess`).
const TypeInfo& preprocess_keys();
const TypeInfo& preprocess_output_keys();

}  // namespace ferry::cli
