#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "device/device_stage.h"
#include "ipc/cgroup.h"
#include "ipc/channel.h"
#include "ipc/child_process.h"
#include "ipc/shared_memory.h"
#include "loader/loader_state.h"
#include "workers/forker.h"
#include "workers/worker_loop.h"
#include "workers/worker_status.h"

namespace ferry::detail {

// Segments whose batches the training loop has let go of, waiting to go back to their worker.
// Tensor deleters push from any thread; the iterator sends them.
struct RecycleQueue {
  struct Item {
    std::size_t worker = 0;
    std::uint64_t generation = 0;  // of the worker's process (a respawned one starts anew)
    std::uint64_t segment = 0;
  };
  std::mutex mutex;
  std::vector<Item> items;
};

// A worker's segment as this process maps it: the mapping, and once the segment has come back
// for reuse (with pin_memory or a CUDA device), its page-lock, undone before the unmap.
struct MappedSegment {
  MappedSegment(ipc::MappedRegion mapped, std::shared_ptr<MemoryGauge> memory)
      : region(std::move(mapped)),
        page_lock(region.data(), region.size()),
        gauge(std::move(memory)) {
    if (gauge) gauge->add(region.size());
  }
  ~MappedSegment() {
    if (gauge) gauge->sub(region.size());
  }
  MappedSegment(const MappedSegment&) = delete;
  MappedSegment& operator=(const MappedSegment&) = delete;
  ipc::MappedRegion region;
  device::LockableRange page_lock;     // declared after `region`: destroyed (unlocked) first
  std::shared_ptr<MemoryGauge> gauge;  // the loader's count of mapped segment bytes (stats)
};

struct TaskRecord {
  std::uint64_t token = 0;  // the epoch iterator that sent it (epoch numbers can repeat)
  std::uint64_t epoch = 0;
  std::uint64_t sequence = 0;
  std::vector<std::int64_t> indices;
};

// The main process's view of one worker process.
struct WorkerSlot {
  std::size_t id = 0;
  ipc::ChildProcess process;
  ipc::Channel index;                   // main -> worker
  ipc::Channel data;                    // worker -> main
  std::deque<TaskRecord> in_flight;     // a worker answers its tasks in order
  std::vector<std::uint64_t> recycled;  // segments to send back, with the next task if any
  std::unordered_map<std::uint64_t, std::shared_ptr<MappedSegment>> segments;
  bool dead = false;
  bool ready = true;  // spawn and forkserver: false until the worker's handshake arrives
  bool forked_after_cuda = false;  // fork after this process initialised CUDA
  // Which process holds this worker id: 0 for the first, one more per respawn. Segments from an
  // earlier process are never sent to a later one (their ids mean nothing there).
  std::uint64_t generation = 0;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  // The memory cgroup's OOM-kill count when it started, to tell an OOM kill from another SIGKILL.
  std::optional<std::uint64_t> oom_kills_at_start;
  // What the worker says it is doing (the samples in hand, the one that crashed it).
  workers::StatusPage status;
  // Its stderr, relayed to this process's (0: not relayed, or finished).
  std::uint64_t stderr_key = 0;
};

namespace fault {
// Tests: how long a spawn or forkserver worker may take to start (default 60 s).
void set_startup_limit(std::chrono::milliseconds limit) noexcept;
}  // namespace fault

// The worker processes of one loader (for one epoch, or for all with persistent_workers).
class WorkerPool {
 public:
  // Prepares a pool for workers started by start_worker(), one at a time, so the first can
  // start working while the next is forked; `first_epoch` seeds their LibTorch generators.
  WorkerPool(const LoaderState& state, std::uint64_t first_epoch)
      : state_(state), first_epoch_(first_epoch) {}
  // Starts the next worker. Throws std::system_error if its process or channels cannot be made.
  void start_worker();
  // Worker `w`'s last lines on stderr, once its process has ended (waiting at most until
  // `deadline` for the last of them); its pipe is closed. Empty the second time.
  static std::vector<std::string> finish_stderr(
      WorkerSlot& w, std::chrono::steady_clock::time_point deadline) noexcept;
  // on_worker_death=respawn: replaces worker `id`, whose process has exited and been reaped, by
  // a new one (the same start method and id, the next generation); its channels and pidfd are
  // closed, its segments' mappings left to the batches that hold them. Throws as start_worker.
  void restart_worker(std::size_t id);
  // When the earliest start-up among workers not yet past their handshake runs out.
  std::optional<std::chrono::steady_clock::time_point> startup_deadline() const;
  bool all_started() const noexcept { return workers_.size() == state_.options.num_workers; }
  ~WorkerPool() { shutdown(); }

  // Stop messages, then EOF, then up to `grace` for the workers to exit, then SIGKILL; every
  // process is reaped. Idempotent.
  void shutdown() noexcept;
  bool stopped() const noexcept { return stopped_; }
  // shutdown() in two halves, so several pools share one grace period: ask every worker to
  // stop, then wait for all of them until `deadline`, then SIGKILL and reap.
  void request_stop() noexcept;
  void finish_stop(std::chrono::steady_clock::time_point deadline) noexcept;

  // Moves the segments the training loop released to their workers' `recycled` lists.
  void collect_recycles();
  // Sends what is left in `recycled` lists on its own (for workers that got no task now).
  void send_recycles();

  // The workers, by id. Their processes and channels are the pool's: an epoch reads and
  // writes through the slots, and marks what it learns with mark_ready() and mark_broken().
  std::vector<WorkerSlot>& workers() noexcept { return workers_; }
  const std::vector<WorkerSlot>& workers() const noexcept { return workers_; }
  // The epoch iterator using the pool now (epoch numbers can repeat: set_epoch).
  std::uint64_t owner() const noexcept { return owner_; }
  void claim(std::uint64_t token) noexcept { owner_ = token; }
  // A worker died or was killed, or an epoch failed: the pool is never reused.
  bool broken() const noexcept { return broken_; }
  void mark_broken() noexcept { broken_ = true; }
  // Workers past their handshake (fork: every one, from the start).
  std::size_t ready_workers() const noexcept { return ready_; }
  void mark_ready(WorkerSlot& w) noexcept {
    if (!w.ready) ++ready_;
    w.ready = true;
  }

  std::shared_ptr<RecycleQueue> recycle = std::make_shared<RecycleQueue>();
  // The memory cgroup the workers run in (this process's), if one can be read.
  const std::optional<ipc::MemoryCgroup>& memory_cgroup() const noexcept { return cgroup_; }

  static constexpr std::chrono::milliseconds kShutdownGrace{1000};
  // How long a spawn or forkserver worker may take to start (start a program, rebuild the
  // dataset) before a loader with a `timeout` gives up on it.
  static std::chrono::milliseconds startup_limit() noexcept;  // 60 s
  const std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

 private:
  // Starts worker `id`'s process and returns its slot (counted in ready_ if ready).
  WorkerSlot launch(std::size_t id);
  // spawn and forkserver: starts the process with the worker's ends of `channels` and the
  // status page's descriptor, then closes them here; returns its pid.
  pid_t start_fresh_worker(workers::WorkerChannels& channels, workers::StatusPage& status);
  std::vector<WorkerSlot> workers_;
  std::optional<ipc::MemoryCgroup> cgroup_ = ipc::MemoryCgroup::of_self();
  std::uint64_t owner_ = 0;
  bool broken_ = false;
  std::size_t ready_ = 0;
  const LoaderState& state_;   // outlives the pool: the state owns or outlives every pool
  std::uint64_t first_epoch_;  // the epoch that started the pool
  bool stop_requested_ = false;
  bool stopped_ = false;
};

}  // namespace ferry::detail
