#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ferry/collate.h"
#include "ferry/dataset.h"

#include "ipc/channel.h"
#include "workers/worker_status.h"

namespace ferry::workers {

// Everything a worker process needs; with fork it is simply inherited.
struct WorkerSpec {
  std::size_t worker_id = 0;
  std::size_t num_workers = 1;
  std::uint64_t base_seed = 0;
  // LibTorch's default generator is seeded with this before worker_init_fn, as PyTorch seeds each
  // worker's with base_seed + worker_id: code that draws without a generator differs between
  // workers and repeats from run to run (only SampleContext::generator() is also independent of
  // the number of workers).
  std::uint64_t torch_seed = 0;
  std::shared_ptr<const Dataset> dataset;           // map-style, or
  std::shared_ptr<const IterableDataset> iterable;  // iterable
  std::size_t batch_size = 1;                       // iterable datasets batch in the worker
  bool drop_last = false;
  CollateFn collate_fn;  // empty: default collate
  std::function<void(std::size_t)> worker_init_fn;
  std::size_t keep_free_segments = 2;
  bool spin = false;  // poll briefly before sleeping (when workers and main each have a core)
  std::chrono::milliseconds sample_timeout{0};  // per-sample watchdog; 0: none
  std::size_t worker_threads = 1;               // samples of a batch loaded in parallel
  bool skip_errors = false;                     // on_error = skip
  pid_t parent_pid = 0;
  bool trace = false;     // a trace is on: report a span per sample and per collation
  std::vector<int> cpus;  // the cores this worker may run on (sched_setaffinity); empty: any
  // Shared with the main process: what this worker is doing (null: none). Not serialised: a
  // fork worker inherits the mapping, a spawned one maps the descriptor it is given.
  WorkerStatusPage* status = nullptr;
};

// The process settings a worker needs before anything else: LibTorch to one intra-op thread (a
// forked child that uses more after the parent ran a parallel op hangs forever with GNU OpenMP;
// see DESIGN.md), parent-death signal, SIGINT ignored, crash and watchdog messages. A fork worker
// calls it first thing; a spawned one before it rebuilds the dataset.
void prepare_worker_process(const WorkerSpec& spec);

// The worker process's main loop, in a process prepare_worker_process() has set up:
// worker_init_fn, then tasks from `index` until Stop or EOF. Never returns: exits 0 on a
// requested stop, 1 after reporting a fatal error.
[[noreturn]] void run_worker(const WorkerSpec& spec, ipc::Channel index, ipc::Channel data);

// The exit code of a worker whose sample outran sample_timeout.
inline constexpr int kSampleTimeoutExitCode = 124;

// The C++ type of the exception being handled, demangled ("std::runtime_error").
std::string current_exception_type_name();
// The what() of the exception being handled (a placeholder for one not from std::exception).
std::string current_exception_message();

}  // namespace ferry::workers
