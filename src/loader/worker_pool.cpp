#include "loader/worker_pool.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <system_error>
#include <thread>

#include "ferry/error.h"

#include "device/cuda_driver.h"
#include "ipc/protocol.h"
#include "loader/loader_state.h"
#include "workers/forker.h"
#include "workers/spawn.h"
#include "workers/worker_loop.h"
#include "workers/worker_output.h"

namespace ferry::detail {

LoaderState::LoaderState() {
  wake.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake) throw std::system_error(errno, std::generic_category(), "eventfd for a DataLoader");
  workers::register_parent_only_fd(wake.get());
}

LoaderState::~LoaderState() {
  close();
  workers::unregister_parent_only_fd(wake.get());
}

void LoaderState::close() noexcept {
  closed = true;
  const std::uint64_t one = 1;
  (void)!::write(wake.get(), &one, sizeof one);
  std::lock_guard<std::mutex> lock(use_mutex);  // an iterator in next() wakes and leaves
  std::vector<std::shared_ptr<WorkerPool>> live;
  for (auto& weak : pools) {
    if (auto pool = weak.lock()) live.push_back(std::move(pool));
  }
  // Every pool's workers get the same grace period, not one each.
  for (auto& pool : live) pool->request_stop();
  const auto deadline = std::chrono::steady_clock::now() + WorkerPool::kShutdownGrace;
  for (auto& pool : live) pool->finish_stop(deadline);
  persistent_pool.reset();
  pools.clear();
}

void WorkerPool::start_worker() {
  FERRY_ASSERT(workers_.size() < state_.options.num_workers && !stopped_);
  workers_.reserve(state_.options.num_workers);
  workers_.push_back(launch(workers_.size()));
}

void WorkerPool::restart_worker(std::size_t id) {
  FERRY_ASSERT(id < workers_.size() && !stopped_);
  WorkerSlot& old = workers_[id];
  // Unregistered and closed under one lock each, so no fork keeps them (as finish_stop does).
  if (old.index.valid()) workers::close_parent_only_fd(old.index.release());
  if (old.data.valid()) workers::close_parent_only_fd(old.data.release());
  (void)old.process.terminate(std::chrono::milliseconds(0));  // reaped already; made sure
  workers::close_parent_only_fd(old.process.take_pidfd());
  if (old.ready) --ready_;
  (void)finish_stderr(old, std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
  const std::uint64_t generation = old.generation + 1;
  WorkerSlot fresh = launch(id);
  fresh.generation = generation;
  workers_[id] = std::move(fresh);  // the old slot's segments stay mapped by their batches
}

std::optional<std::chrono::steady_clock::time_point> WorkerPool::startup_deadline() const {
  std::optional<std::chrono::steady_clock::time_point> earliest;
  for (const auto& w : workers_) {
    if (w.ready || w.dead) continue;
    const auto limit = w.started + startup_limit();
    if (!earliest || limit < *earliest) earliest = limit;
  }
  return earliest;
}

namespace {

// Closes whatever of a new worker's channels and pipe ends is still here, unregistering each.
void discard(workers::WorkerChannels& c, workers::StatusPage& status) noexcept {
  for (ipc::Channel* channel : {&c.main_index, &c.main_data, &c.worker_index, &c.worker_data}) {
    if (channel->valid()) workers::close_parent_only_fd(channel->release());
  }
  if (c.stderr_read) workers::close_parent_only_fd(std::move(c.stderr_read));
  if (c.stderr_write) workers::close_parent_only_fd(std::move(c.stderr_write));
  if (status.fd) workers::close_parent_only_fd(std::move(status.fd));
}

}  // namespace

WorkerSlot WorkerPool::launch(std::size_t id) {
  workers::reap_dead_forkserver();  // a forkserver that died meanwhile is no zombie for long
  // Before the process exists: an out-of-memory kill of it at start-up counts after this.
  const std::optional<std::uint64_t> oom_kills = cgroup_ ? cgroup_->oom_kills() : std::nullopt;
  const DataLoaderOptions& o = state_.options;
  workers::WorkerChannels channels = workers::make_worker_channels();
  workers::StatusPage status;
  std::uint64_t stderr_key = 0;
  try {
    status = workers::make_status_page();
    workers::register_parent_only_fd(status.fd.get());
    stderr_key = workers::relay_worker_stderr(channels.stderr_read);
  } catch (...) {
    discard(channels, status);
    throw;
  }

  workers::WorkerSpec spec;
  spec.worker_id = id;
  spec.num_workers = o.num_workers;
  spec.base_seed = *o.seed;
  // A base drawn from the seed and the epoch the pool starts in (a pool of its own per epoch
  // without persistent_workers, as PyTorch draws one per iterator), plus the worker's id.
  spec.torch_seed = SampleContext::mix_seed(*o.seed, first_epoch_, -1) + spec.worker_id;
  spec.dataset = state_.dataset;
  spec.iterable = state_.iterable;
  spec.batch_size = o.batch_size;
  spec.drop_last = o.drop_last;
  spec.collate_fn = state_.collate_fn;
  spec.worker_init_fn = o.worker_init_fn;
  spec.keep_free_segments = *o.prefetch_factor + 1;
  spec.parent_pid = ::getpid();
  spec.spin = spin_before_sleep(o);
  spec.sample_timeout = o.sample_timeout;
  spec.worker_threads = o.worker_threads;
  spec.skip_errors = o.on_error == OnError::kSkip;
  spec.trace = state_.tracer != nullptr;
  spec.cpus = state_.worker_cpus;
  spec.status = status.page();  // a fork worker's (inherited mapping); a fresh one maps its own
  pid_t pid = -1;
  try {
    if (*o.start_method != StartMethod::kFork) {
      pid = start_fresh_worker(channels, status);
    } else {
      workers::close_parent_only_fd(std::move(status.fd));  // the child inherits the mapping
      const int index_fd = channels.worker_index.fd();
      const int data_fd = channels.worker_data.fd();
      const int stderr_fd = channels.stderr_write.get();
      // The child's ends: the child adopts them; this process closes them right after the fork.
      std::vector<ipc::UniqueFd> child_ends;
      child_ends.push_back(channels.worker_index.release());
      child_ends.push_back(channels.worker_data.release());
      child_ends.push_back(std::move(channels.stderr_write));
      pid = workers::fork_worker(
          [spec, index_fd, data_fd, stderr_fd]() {
            if (stderr_fd != STDERR_FILENO) {  // its stderr: the pipe this process relays
              ::dup2(stderr_fd, STDERR_FILENO);
              ::close(stderr_fd);
            }
            workers::prepare_worker_process(spec);
            workers::run_worker(spec, ipc::Channel(ipc::UniqueFd(index_fd)),
                                ipc::Channel(ipc::UniqueFd(data_fd)));
          },
          std::move(child_ends));
    }
  } catch (...) {
    discard(channels, status);
    (void)workers::finish_worker_stderr(stderr_key, std::chrono::steady_clock::now());
    throw;
  }
  WorkerSlot slot;
  slot.id = id;
  slot.process = ipc::ChildProcess(pid);
  try {
    // Its pidfd is this process's alone (workers forked later must not hold it); SIGUSR1
    // reaches the worker through it.
    if (slot.process.pidfd() >= 0) workers::register_worker_pidfd(slot.process.pidfd());
  } catch (...) {
    (void)slot.process.terminate(std::chrono::milliseconds(0));  // killed and reaped
    discard(channels, status);
    (void)workers::finish_worker_stderr(stderr_key, std::chrono::steady_clock::now());
    throw;
  }
  slot.index = std::move(channels.main_index);
  slot.data = std::move(channels.main_data);
  // spawn and forkserver: not ready until its handshake (the dataset rebuilt) arrives.
  slot.ready = *o.start_method == StartMethod::kFork;
  ready_ += slot.ready ? 1 : 0;
  slot.oom_kills_at_start = oom_kills;
  slot.status = std::move(status);
  slot.stderr_key = stderr_key;
  if (*o.start_method == StartMethod::kFork) {
    // Allowed (workers never use CUDA); remembered for the advice an error naming CUDA gets.
    slot.forked_after_cuda = device::cuda_initialized();
  } else {
    // Queued: the worker reads it once it has started. If it died already, the death is
    // reported by the epoch's wait, with the "before its handshake" note. If it cannot be
    // queued (no memory), the slot is given up here: killed, reaped, every descriptor closed.
    try {
      ipc::SetupMessage setup =
          workers::setup_message(spec, state_.dataset_config, state_.collate_config);
      (void)slot.index.post(ipc::encode(ipc::IndexMessage(std::move(setup))));
    } catch (...) {
      (void)slot.process.terminate(std::chrono::milliseconds(0));
      workers::close_parent_only_fd(slot.index.release());
      workers::close_parent_only_fd(slot.data.release());
      workers::close_parent_only_fd(slot.process.take_pidfd());
      (void)finish_stderr(slot, std::chrono::steady_clock::now());
      ready_ -= slot.ready ? 1 : 0;
      throw;
    }
  }
  return slot;
}

pid_t WorkerPool::start_fresh_worker(workers::WorkerChannels& channels,
                                     workers::StatusPage& status) {
  // The worker's ends stay registered (a fork for another loader must not keep them) until
  // they are closed here, once the new process has its copies.
  const DataLoaderOptions& o = state_.options;
  const pid_t pid =
      *o.start_method == StartMethod::kSpawn
          ? workers::spawn_worker(state_.worker_program, channels.worker_index.fd(),
                                  channels.worker_data.fd(), status.fd.get(),
                                  channels.stderr_write.get())
          : workers::forkserver_worker(channels.worker_index.fd(), channels.worker_data.fd(),
                                       status.fd.get(), channels.stderr_write.get());
  workers::close_parent_only_fd(channels.worker_index.release());
  workers::close_parent_only_fd(channels.worker_data.release());
  workers::close_parent_only_fd(std::move(channels.stderr_write));
  workers::close_parent_only_fd(std::move(status.fd));
  return pid;
}

std::vector<std::string> WorkerPool::finish_stderr(
    WorkerSlot& w, std::chrono::steady_clock::time_point deadline) noexcept {
  if (w.stderr_key == 0) return {};
  try {
    return workers::finish_worker_stderr(std::exchange(w.stderr_key, 0), deadline);
  } catch (...) {  // no memory for the lines: the pipe is closed all the same
    return {};
  }
}

namespace {
std::atomic<std::int64_t> g_startup_limit_ms{60'000};
}  // namespace

std::chrono::milliseconds WorkerPool::startup_limit() noexcept {
  return std::chrono::milliseconds(g_startup_limit_ms.load());
}

void fault::set_startup_limit(std::chrono::milliseconds limit) noexcept {
  g_startup_limit_ms = limit.count();
}

void WorkerPool::shutdown() noexcept {
  request_stop();
  finish_stop(std::chrono::steady_clock::now() + kShutdownGrace);
}

void WorkerPool::request_stop() noexcept {
  if (stop_requested_) return;
  stop_requested_ = true;
  for (auto& w : workers_) {
    if (!w.index.valid()) continue;
    try {
      // Without blocking: a worker whose index channel is full gets the EOF below instead.
      (void)w.index.post(ipc::encode(ipc::IndexMessage(ipc::StopMessage{})));
    } catch (...) {
    }
    // EOF for a worker that missed the stop message; unregistered and closed under one lock,
    // so a fork for another loader cannot keep it open.
    workers::close_parent_only_fd(w.index.release());
    // Its next "batch ready" fails, so a worker with tasks queued behind the stop message
    // exits after the batch in hand instead of loading them all.
    w.data.shutdown();
  }
}

void WorkerPool::finish_stop(std::chrono::steady_clock::time_point deadline) noexcept {
  request_stop();
  if (stopped_) return;
  stopped_ = true;
  // Every worker's last output has until the same moment (a process a worker started may hold
  // its stderr open): shutting down many workers does not take longer for it.
  std::chrono::steady_clock::time_point stderr_deadline{};
  for (auto& w : workers_) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const bool was_dead = w.dead || w.process.reaped();
    (void)w.process.terminate(std::max(left, std::chrono::milliseconds(0)));
    // A worker asked to stop finishes the sample in hand and exits 0; one stuck in the
    // dataset's get had to be killed, which is worth saying.
    if (!was_dead && w.process.killed_by_terminate()) {
      std::fprintf(stderr,
                   "ferry: DataLoader worker %zu (pid %d) did not stop when asked and was killed "
                   "(%s)\n",
                   w.id, static_cast<int>(w.process.pid()),
                   w.ready ? "stuck in Dataset::get?"
                           : "stuck while starting: in the program before ferry::init, or in the "
                             "dataset's factory?");
    }
    if (w.data.valid()) workers::close_parent_only_fd(w.data.release());
    workers::close_parent_only_fd(w.process.take_pidfd());
    // Reaped: its last output is relayed before the pipe closes.
    if (stderr_deadline == std::chrono::steady_clock::time_point{}) {
      stderr_deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    }
    (void)finish_stderr(w, stderr_deadline);
    w.segments.clear();  // batches still held keep their own mappings
  }
}

void WorkerPool::collect_recycles() {
  std::vector<RecycleQueue::Item> items;
  {
    std::lock_guard<std::mutex> lock(recycle->mutex);
    items.swap(recycle->items);
  }
  for (const auto& item : items) {
    // A respawned worker's predecessor's segments are gone with it.
    if (item.worker < workers_.size() && workers_[item.worker].generation == item.generation) {
      workers_[item.worker].recycled.push_back(item.segment);
    }
  }
}

void WorkerPool::send_recycles() {
  for (auto& w : workers_) {
    if (w.recycled.empty()) continue;
    if (!w.dead && w.index.valid()) {
      // A worker found gone here is reported by the epoch's wait (its pidfd).
      (void)w.index.post(ipc::encode(ipc::IndexMessage(ipc::RecycleMessage{w.recycled})));
    }
    w.recycled.clear();
  }
}

}  // namespace ferry::detail
