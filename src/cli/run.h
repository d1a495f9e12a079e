#pragma once

// `ferry run`: iterates a pipeline, with a progress display and a summary.

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace ferry::cli {

struct RunOptions {
  std::string config;
  std::size_t epochs = 1;
  std::optional<std::size_t> max_batches;  // per epoch
  std::vector<std::string> set;            // key.path=value
  std::string json;                        // the summary as JSON, to this file
  std::string dump_indices;                // one JSON line per batch, to this file
  double log_every = 5.0;                  // seconds between lines when not on a terminal
};

// Returns the process's exit code; throws ferry::Error for a failure.
int run_pipeline(const RunOptions& options);

// JSON string literal for `s` (a scalar's canonical text).
std::string json_string(const std::string& s);

}  // namespace ferry::cli
