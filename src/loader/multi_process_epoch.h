#pragma once

#include <poll.h>

#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/error.h"

#include "ipc/protocol.h"
#include "loader/epoch_iterator.h"
#include "loader/loader_state.h"
#include "loader/worker_pool.h"

namespace ferry::detail {

// One epoch over worker processes: dispatches tasks (at most prefetch_factor in flight per
// worker), turns "batch ready" messages into zero-copy batches, reorders them into sampler order
// (unless in_order is false), and turns a worker's death, a hang past `timeout`, or a closed
// loader into an exception instead of a hang.
class MultiProcessEpoch final : public EpochIterator {
 public:
  // `resume`: batches of this epoch the loop consumed before a checkpoint; they are not loaded.
  MultiProcessEpoch(std::shared_ptr<LoaderState> state,
                    std::uint64_t epoch,
                    std::optional<LoaderState::Resume> resume = std::nullopt);
  ~MultiProcessEpoch() override;
  std::optional<Batch> next() override;

 private:
  struct Result {
    std::optional<device::StagedBatch> batch;  // started through the device stage on arrival
    std::exception_ptr error;
    bool stream_end = false;  // iterable: the worker's stream ended; nothing to deliver
    bool empty = false;       // every sample of the batch was skipped; nothing to deliver
    std::vector<workers::SkippedSample> skipped;
    std::size_t worker = 0;
    std::uint64_t sequence = 0;
    // Iterable: the worker's stream position after this batch, and its cursor (checkpoints).
    std::optional<std::uint64_t> stream_position;
    std::optional<std::string> stream_cursor;
    // pin_memory alone: makes the batch's segment wait, once dropped, for the loop's GPU work.
    std::function<void()> arm_fence;
  };

  std::optional<Batch> next_locked();
  void start_workers();
  void check_handshake(WorkerSlot& w, const ipc::WorkerReadyMessage& m);
  std::optional<Result> pop_result();
  bool finished() const;
  void dispatch();
  void dispatch_map();
  void dispatch_iterable();
  void send_task(WorkerSlot& w, std::uint64_t sequence, std::vector<std::int64_t> indices);
  // Queues a message to worker `w` without blocking; a worker found gone is reported.
  void post(WorkerSlot& w, std::vector<std::byte> bytes);
  // A batch's report: the worker's time (stats) and spans (trace).
  void account(const WorkerSlot& w, const ipc::BatchReadyMessage& m);
  // Waits for messages until `deadline`; true if it passed with none.
  bool wait_and_receive(std::optional<ipc::Clock::time_point> deadline);
  // The worker and task the loop waits for (in order: the next batch), or nulls.
  std::pair<WorkerSlot*, const TaskRecord*> waited_on();
  [[noreturn]] void startup_timed_out();
  // Reads what worker `w` sent; true if a whole message was handled.
  bool receive_from(WorkerSlot& w);
  void handle_message(WorkerSlot& w,
                      std::vector<std::byte>& bytes,
                      std::vector<ipc::UniqueFd>& fds);
  // Worker `w`'s process is gone: the epoch fails with a WorkerDiedError, or, with
  // on_worker_death=respawn and restarts left, a new process takes the slot and the tasks.
  void worker_died(WorkerSlot& w);
  // A worker is gone (its pidfd fired, its channel hung up, or a send found no peer): first
  // handle what it sent before it died (its own error report, say), then report the death.
  void worker_gone(WorkerSlot& w);
  // What a SIGKILL of `w` means: the memory cgroup's OOM killer (its count went up), or not.
  std::string sigkill_hint(const WorkerSlot& w) const;
  // Whether the memory cgroup counted an out-of-memory kill while `w` ran.
  bool oom_killed(const WorkerSlot& w) const;
  // The sample whose loading killed `w`, when its status page says so and `w` held it;
  // `by_signal`: a fatal signal of its own named it (else it was the one sample in hand).
  std::optional<std::int64_t> crash_suspect(const WorkerSlot& w, bool& by_signal) const;
  // Whether the budget allows one more restart; if not, the reason.
  std::optional<std::string> restart_refused() const;
  // Replaces `w` by a new worker and sends it the unfinished tasks `w` held for this epoch.
  void respawn(WorkerSlot& w, WorkerRestart record);
  [[noreturn]] void timed_out(std::chrono::milliseconds waited);
  [[noreturn]] void fail(std::exception_ptr error);
  WorkerFailure failure_of(const WorkerSlot& w) const;
  static std::string worker_name(const WorkerSlot& w);  // "DataLoader worker 2 (pid 4121)"
  // Advice for an error of worker `w` that names CUDA, if `w` was forked after CUDA started.
  static std::string cuda_advice(const WorkerSlot& w, const std::string& message);

  std::shared_ptr<LoaderState> state_;
  std::optional<LoaderState::Resume> resume_;
  ProgressTracker progress_;
  std::shared_ptr<WorkerPool> pool_;
  std::uint64_t epoch_;
  std::uint64_t token_;
  bool iterable_;
  EpochPlan plan_;                         // map-style: the epoch's batches
  std::uint64_t next_task_ = 0;            // next sequence number to dispatch
  std::uint64_t next_delivery_ = 0;        // in order: next sequence to deliver
  std::size_t delivered_ = 0;              // map-style: results handed to the loop...
  std::size_t to_deliver_ = 0;             // ...of these (the plan, less what a resume skips)
  std::map<std::uint64_t, Result> ready_;  // in order: results by sequence
  std::deque<Result> arrived_;             // out of order: results as they came
  std::size_t round_robin_ = 0;
  // Per worker, this epoch: tasks sent whose batch the loop has not received yet (bounded by
  // prefetch_factor), and for an iterable dataset whether its stream has ended.
  std::vector<std::size_t> undelivered_;
  std::vector<bool> exhausted_;
  std::vector<bool> stream_resumed_;  // iterable, resuming: the worker got its stream's position
  bool spin_;  // poll briefly before sleeping: only when main and workers each have a core
  bool failed_ = false;
  std::size_t restarts_ = 0;  // workers respawned in this epoch
  std::vector<pollfd> pollfds_;
  std::vector<std::byte> message_;  // the last message received, its buffer reused
};

}  // namespace ferry::detail
