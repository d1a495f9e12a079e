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
  std::string save_state;                  // the loader's checkpoint, written atomically
  std::optional<std::size_t> save_every;   // ... every N batches (and at the end, and on SIGTERM)
  std::string resume;                      // continue from this checkpoint
  std::string trace;                       // the loader's trace (Chrome trace-event JSON)
  std::size_t trace_events = 0;            // ... its ring's size (0: the loader's default)
  bool headspace = false;                  // hold and replay the first batches...
  std::size_t headspace_batches = 64;      // ... this many
  double step_ms = 0;                      // a synthetic training step per batch
};

// Exit code when SIGTERM or SIGUSR1 (a scheduler's preemption notice) stopped the run after the
// state of what was consumed was written: EX_TEMPFAIL, "try again".
inline constexpr int kPreempted = 75;

// Returns the process's exit code; throws ferry::Error for a failure.
int run_pipeline(const RunOptions& options);

// Seconds as M:SS or H:MM:SS for progress lines ("?" when not a finite, non-negative number).
std::string duration(double seconds);

// `path` with "{rank}" replaced by this process's rank from its launcher (0 without one), so
// that every rank of a job started with one command line writes its own file.
std::string for_this_rank(std::string path);

}  // namespace ferry::cli
