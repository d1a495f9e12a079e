#include "loader/multi_process_epoch.h"

#include <poll.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <functional>
#include <system_error>
#include <thread>

#include "ferry/error.h"

#include "device/accelerator.h"
#include "ipc/protocol.h"
#include "loader/batch_message.h"
#include "workers/worker_loop.h"

namespace ferry::detail {

namespace {

// Holds a segment's mapping for as long as any tensor of its batch lives; then sends the segment
// back to its worker (through the pool's recycle queue, if the pool still exists). With
// pin_memory alone, a batch in a page-locked segment may have non_blocking copies queued from it
// when the loop drops it: once delivered (the fence is armed then), the segment goes back only
// after the work queued on the dropping thread's current streams has completed (the device stage
// keeps it until then). If that cannot be known, the memory is kept rather than freed.
struct SegmentLease {
  std::shared_ptr<MappedSegment> mapping;
  std::weak_ptr<RecycleQueue> queue;
  std::size_t worker = 0;
  std::uint64_t generation = 0;  // of the worker's process
  std::uint64_t segment_id = 0;
  std::weak_ptr<device::DeviceStage> fence;  // armed at delivery when the stage fences_returns()
  const device::Accelerator* fence_accelerator = nullptr;  // its accelerator and device, for
  int fence_device = -1;                                   // when the stage is gone

  ~SegmentLease() {
    if (fence_device >= 0 && mapping && mapping->page_lock.locked()) {
      try {
        auto rest = std::make_shared<SegmentLease>();  // the same lease, without the fence
        rest->mapping = std::move(mapping);
        rest->queue = std::move(queue);
        rest->worker = worker;
        rest->generation = generation;
        rest->segment_id = segment_id;
        std::shared_ptr<void> held = std::move(rest);
        const auto stage = fence.lock();
        if (stage && stage->return_after_queued_work(held)) return;
        if (device::DeviceStage::wait_for_queued_work(*fence_accelerator, fence_device)) {
          return;  // `held` recycles
        }
        new std::shared_ptr<void>(std::move(held));  // NOLINT: kept on purpose, never freed
      } catch (...) {
        if (mapping) new std::shared_ptr<MappedSegment>(std::move(mapping));  // NOLINT: likewise
      }
      return;
    }
    if (auto q = queue.lock()) {
      std::lock_guard<std::mutex> lock(q->mutex);
      q->items.push_back({worker, generation, segment_id});
    }
  }
};

std::string list_indices(const std::vector<std::int64_t>& indices, std::size_t limit = 16) {
  std::string out;
  for (std::size_t i = 0; i < indices.size() && i < limit; ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(indices[i]);
  }
  if (indices.size() > limit) out += ", ... (" + std::to_string(indices.size()) + " in all)";
  return out;
}

}  // namespace

MultiProcessEpoch::MultiProcessEpoch(std::shared_ptr<LoaderState> state,
                                     std::uint64_t epoch,
                                     std::optional<LoaderState::Resume> resume)
    : state_(std::move(state)),
      resume_(std::move(resume)),
      progress_(state_, epoch, resume_),
      epoch_(epoch),
      iterable_(state_->dataset == nullptr),
      spin_(spin_before_sleep(state_->options)) {
  std::lock_guard<std::mutex> lock(state_->use_mutex);
  if (state_->closed) throw_loader_closed("before this epoch started");
  token_ = state_->next_token++;
  undelivered_.assign(state_->options.num_workers, 0);
  exhausted_.assign(state_->options.num_workers, false);
  stream_resumed_.assign(state_->options.num_workers, false);
  if (iterable_ && resume_) {
    // Resuming a stream epoch: streams that had ended stay ended, the others continue where
    // the loop stood (the first task of each carries its position), and the round robin and
    // the batches' numbers go on from there.
    for (std::size_t w = 0; w < exhausted_.size() && w < resume_->streams.size(); ++w) {
      exhausted_[w] = resume_->streams[w].ended;
    }
    round_robin_ = resume_->next_worker;
    next_task_ = next_delivery_ = resume_->prefix;
  }
  if (!iterable_) {
    plan_ = plan_epoch(*state_, epoch_);
    progress_.set_batches(plan_.size());
    to_deliver_ = plan_.size();
    if (resume_) {
      // Resuming: the batches consumed before the checkpoint are neither loaded nor delivered.
      next_task_ = next_delivery_ = std::min<std::size_t>(resume_->prefix, plan_.size());
      to_deliver_ -= next_task_;
      for (const auto b : resume_->beyond) to_deliver_ -= b >= next_task_ && b < plan_.size();
    }
  }
  std::erase_if(state_->pools, [](const auto& weak) { return weak.expired(); });
  if (state_->options.persistent_workers) {
    pool_ = state_->persistent_pool;
    if (!pool_ || pool_->broken() || pool_->stopped() || !pool_->all_started()) {
      pool_ = std::make_shared<WorkerPool>(*state_, epoch_);
      state_->persistent_pool = pool_;
      state_->pools.push_back(pool_);
      start_workers();
    } else {
      // The epoch handshake: tasks carry their epoch, and anything still in flight from an
      // earlier epoch is recycled on arrival, never delivered; iterable streams restart.
      for (auto& w : pool_->workers()) {
        if (!w.dead) post(w, ipc::encode(ipc::IndexMessage(ipc::NewEpochMessage{epoch_})));
      }
    }
  } else {
    pool_ = std::make_shared<WorkerPool>(*state_, epoch_);
    state_->pools.push_back(pool_);
    start_workers();
  }
  pool_->claim(token_);
  // Segments whose copies (or the loop's queued work) completed since the last epoch go back
  // with the first tasks.
  if (state_->stage) state_->stage->release_completed();
  pool_->collect_recycles();
  dispatch();  // prefetching starts now, as PyTorch's iterator does
}

void MultiProcessEpoch::start_workers() {
  pool_->claim(token_);
  try {
    while (!pool_->all_started()) {
      pool_->start_worker();
      // A map-style epoch hands each worker its tasks as soon as it exists, so the first batch
      // is loading while the next worker is forked (a fork of a LibTorch process costs
      // milliseconds). An iterable epoch waits for all: its round robin must not depend on it.
      if (!iterable_) dispatch_map();
    }
  } catch (...) {
    // A half-started pool must never be reused (an iterable dataset sharded by worker would
    // silently lose the missing workers' shards).
    pool_->mark_broken();
    if (state_->persistent_pool == pool_) state_->persistent_pool.reset();
    pool_->shutdown();
    throw;
  }
}

MultiProcessEpoch::~MultiProcessEpoch() {
  std::lock_guard<std::mutex> lock(state_->use_mutex);
  ready_.clear();
  arrived_.clear();
  if (!state_->options.persistent_workers || pool_->broken()) pool_->shutdown();
  if (state_->stage) state_->stage->release_completed();  // not held until the next epoch
}

std::optional<Batch> MultiProcessEpoch::next() {
  std::unique_lock<std::mutex> lock(state_->use_mutex);
  return next_locked();
}

std::optional<Batch> MultiProcessEpoch::next_locked() {
  if (state_->closed) {
    throw_loader_closed("while this iterator was in use");
  }
  if (failed_) return std::nullopt;
  if (pool_->owner() != token_) {
    // persistent_workers: a later begin() took the pool; this epoch's batches are gone.
    throw Error(detail::str(
        "DataLoader: this iterator's epoch ", epoch_,
        " was ended by a later begin() on the "
        "same loader (with persistent_workers, epochs share one set of workers), after ",
        next_delivery_,
        " of its batches; finish or drop one epoch's iterator before the next "
        "begin(), or use a second loader"));
  }
  const auto timeout = state_->options.timeout;
  std::optional<ipc::Clock::time_point> deadline;
  if (timeout.count() > 0) deadline = ipc::Clock::now() + timeout;
  for (;;) {
    if (state_->stage) state_->stage->release_completed();  // copies done: segments go back
    pool_->collect_recycles();
    dispatch();              // released segments ride along with the tasks...
    pool_->send_recycles();  // ...or go on their own to workers that got none
    if (std::optional<Result> r = pop_result()) {
      state_->record_skipped(epoch_, r->skipped);
      if (iterable_) {
        progress_.stream_result(r->worker, r->stream_end, r->stream_position,
                                std::move(r->stream_cursor), pool_->workers().size());
      } else {
        progress_.consumed(r->sequence);
      }
      if (r->stream_end) continue;
      if (r->empty) {
        // Every sample was skipped. Ranks of a distributed job must yield the same number of
        // batches, so there the loop gets an empty batch; elsewhere the batch is left out.
        if (state_->keep_empty_batches) return deliver_empty(epoch_, r->sequence, *state_);
        continue;
      }
      if (r->error) std::rethrow_exception(r->error);
      if (r->arm_fence) r->arm_fence();
      return deliver(std::move(*r->batch), *state_);
    }
    if (finished()) {
      progress_.finish();
      return std::nullopt;
    }
    // A spawn or forkserver worker's start-up (a fresh program, the dataset rebuilt) is not a
    // batch taking too long: the timeout counts from its handshake, and start-up gets its own,
    // generous bound.
    const std::size_t ready_before = pool_->ready_workers();
    const std::optional<ipc::Clock::time_point> startup = pool_->startup_deadline();
    std::optional<ipc::Clock::time_point> wait_until = deadline;
    if (startup && (!wait_until || *startup < *wait_until)) wait_until = startup;
    const std::size_t restarts_before = restarts_;
    const bool expired = wait_and_receive(wait_until);
    const auto now = ipc::Clock::now();
    if (expired && startup && now >= *startup) startup_timed_out();
    if (expired && deadline && now >= *deadline) {
      const WorkerSlot* culprit = waited_on().first;
      if (culprit == nullptr || culprit->ready) timed_out(timeout);
      deadline = now + timeout;  // the worker it waits for is still starting
    }
    if (deadline && pool_->ready_workers() > ready_before) deadline = now + timeout;
    // A respawned worker reloads what its predecessor held: the timeout counts from its start.
    if (deadline && restarts_ > restarts_before) deadline = now + timeout;
  }
}

std::pair<WorkerSlot*, const TaskRecord*> MultiProcessEpoch::waited_on() {
  // The task the loop waits for (in order: the next sequence), else this epoch's oldest task.
  for (auto& w : pool_->workers()) {
    if (w.dead) continue;
    for (const auto& task : w.in_flight) {
      if (task.token != token_) continue;
      if (!state_->options.in_order || task.sequence == next_delivery_) return {&w, &task};
    }
  }
  return {nullptr, nullptr};
}

void MultiProcessEpoch::startup_timed_out() {
  for (auto& w : pool_->workers()) {
    // The worker whose start-up ran out first (a respawned one started later than the others).
    if (w.ready || w.dead || w.started + WorkerPool::startup_limit() != pool_->startup_deadline())
      continue;
    pool_->mark_broken();
    WorkerFailure failure = failure_of(w);
    const std::string what = detail::str(
        "DataLoader worker ", w.id, " (pid ", w.process.pid(),
        ", start_method=", to_string(*state_->options.start_method),
        ") did not finish starting within ",
        static_cast<double>(WorkerPool::startup_limit().count()) / 1000.0,
        " s (the program up to ferry::init, then rebuilding the dataset) and was killed; look "
        "for what blocks there (a lock, a network wait) in the worker's stack");
    w.process.terminate(std::chrono::milliseconds(0));
    w.dead = true;
    fail(std::make_exception_ptr(TimeoutError(what, std::move(failure))));
  }
  // Only dead workers never became ready (their deaths were reported already): a plain timeout.
  timed_out(WorkerPool::startup_limit());
}

std::optional<MultiProcessEpoch::Result> MultiProcessEpoch::pop_result() {
  std::optional<Result> r;
  if (state_->options.in_order) {
    while (resume_ && !iterable_ && next_delivery_ < plan_.size() && resume_->skips(next_delivery_))
      ++next_delivery_;
    auto it = ready_.find(next_delivery_);
    if (it == ready_.end()) return std::nullopt;
    r = std::move(it->second);
    ready_.erase(it);
  } else {
    if (arrived_.empty()) return std::nullopt;
    r = std::move(arrived_.front());
    arrived_.pop_front();
  }
  ++next_delivery_;
  ++delivered_;
  --undelivered_[r->worker];  // a task counts against prefetch until delivered, as in PyTorch
  if (r->stream_end) exhausted_[r->worker] = true;
  return r;
}

bool MultiProcessEpoch::finished() const {
  if (!iterable_) return delivered_ >= to_deliver_;
  for (std::size_t i = 0; i < undelivered_.size(); ++i) {
    if (!exhausted_[i] || undelivered_[i] > 0) return false;
  }
  return true;
}

void MultiProcessEpoch::dispatch() {
  if (iterable_) {
    dispatch_iterable();
  } else {
    dispatch_map();
  }
}

void MultiProcessEpoch::dispatch_map() {
  const std::size_t cap = *state_->options.prefetch_factor;
  auto& workers = pool_->workers();
  while (next_task_ < plan_.size()) {
    if (resume_ && resume_->skips(next_task_)) {  // consumed before the checkpoint
      ++next_task_;
      continue;
    }
    WorkerSlot* best = nullptr;
    for (std::size_t k = 0; k < workers.size(); ++k) {
      WorkerSlot& w = workers[(round_robin_ + k) % workers.size()];
      // A task counts until the training loop receives its batch, so a straggler cannot let the
      // others fill the reorder buffer without bound.
      if (w.dead || undelivered_[w.id] >= cap || w.in_flight.size() >= cap) continue;
      if (best == nullptr || undelivered_[w.id] < undelivered_[best->id]) best = &w;
    }
    if (best == nullptr) return;
    round_robin_ = best->id + 1;
    ++undelivered_[best->id];
    const auto sequence = next_task_++;
    send_task(*best, sequence, plan_.batch(sequence));
  }
}

void MultiProcessEpoch::dispatch_iterable() {
  const std::size_t cap = *state_->options.prefetch_factor;
  auto& workers = pool_->workers();
  if (!state_->options.in_order) {
    // Out of order: every worker whose stream goes on keeps prefetch_factor tasks, so a slow
    // worker never holds a fast one back.
    for (auto& w : workers) {
      while (!exhausted_[w.id] && !w.dead && undelivered_[w.id] < cap) {
        ++undelivered_[w.id];
        send_task(w, next_task_++, {});
      }
    }
    return;
  }
  // In order: strict round robin over the workers whose stream has not ended, so which worker
  // produces batch k depends only on what has been delivered, never on timing: the output is
  // the same from run to run.
  for (;;) {
    WorkerSlot* w = nullptr;
    for (std::size_t k = 0; k < workers.size(); ++k) {
      WorkerSlot& candidate = workers[(round_robin_ + k) % workers.size()];
      if (!exhausted_[candidate.id]) {
        w = &candidate;
        break;
      }
    }
    if (w == nullptr || undelivered_[w->id] >= cap) return;
    round_robin_ = w->id + 1;
    ++undelivered_[w->id];
    send_task(*w, next_task_++, {});
  }
}

void MultiProcessEpoch::send_task(WorkerSlot& w,
                                  std::uint64_t sequence,
                                  std::vector<std::int64_t> indices) {
  std::vector<std::byte> bytes;
  try {
    // The indices travel into the message and back out into the task's record: never copied.
    ipc::TaskMessage task;
    task.epoch = epoch_;
    task.sequence = sequence;
    task.indices = std::move(indices);
    if (!state_->quarantined.empty()) {
      for (const std::int64_t index : task.indices) {
        const auto q = state_->quarantined.find(index);
        if (q == state_->quarantined.end()) continue;
        bool listed = false;
        for (const auto& record : task.leave_out) listed = listed || record.index == index;
        if (!listed) task.leave_out.push_back(q->second);
      }
    }
    task.recycled = std::move(w.recycled);
    ipc::IndexMessage message(std::move(task));
    if (iterable_ && resume_ && !stream_resumed_[w.id] && w.id < resume_->streams.size()) {
      // The worker's first task of a resumed epoch: where its stream continues.
      auto& first = std::get<ipc::TaskMessage>(message);
      const LoaderState::StreamProgress& at = resume_->streams[w.id];
      first.stream_position = at.position;
      first.has_stream_cursor = at.cursor.has_value();
      if (at.cursor) first.stream_cursor = *at.cursor;
    }
    stream_resumed_[w.id] = true;
    bytes = ipc::encode(message);
    w.recycled.clear();
    w.in_flight.push_back(TaskRecord{token_, epoch_, sequence,
                                     std::move(std::get<ipc::TaskMessage>(message).indices)});
    if (state_->tracer) state_->tracer->batch_dispatched(epoch_, sequence, w.id);
  } catch (...) {
    // The sequence number is taken: an epoch that went on would wait for it forever.
    fail(std::current_exception());
  }
  post(w, std::move(bytes));
}

void MultiProcessEpoch::account(const WorkerSlot& w, const ipc::BatchReadyMessage& m) {
  // Stats: the worker's time on the batch; the trace: its spans.
  if (tally) tally->recorder().worker_batch(tally->epoch(), w.id, m.timing, m.indices.size());
  if (!state_->tracer) return;
  Tracer& trace = *state_->tracer;
  for (const ipc::SpanRecord& span : m.spans) {
    if (span.index == ipc::kCollateSpan) {
      trace.worker_collate(w.id, span.start_ns, span.end_ns, m.epoch, m.sequence, m.indices.size());
    } else if (span.index == ipc::kLoadSpan) {
      trace.worker_load(w.id, span.start_ns, span.end_ns, m.epoch, m.sequence);
    } else if (span.index == ipc::kDownloadSpan) {
      trace.worker_download(w.id, span.start_ns, span.end_ns);
    } else {
      trace.worker_sample(w.id, span.start_ns, span.end_ns, m.epoch, m.sequence, span.index);
    }
  }
}

void MultiProcessEpoch::post(WorkerSlot& w, std::vector<std::byte> bytes) {
  // Never blocks: what the worker's index channel cannot take now waits in its queue and goes
  // out when the channel is writable, inside the same wait that reads the workers' replies. A
  // worker blocked sending a reply while this process blocked sending it a task would hang both.
  if (!w.index.post(std::move(bytes))) worker_gone(w);
}

bool MultiProcessEpoch::wait_and_receive(std::optional<ipc::Clock::time_point> deadline) {
  auto& workers = pool_->workers();
  std::vector<pollfd>& fds = pollfds_;  // reused: this runs once per batch waited for
  fds.clear();
  fds.push_back({state_->wake.get(), POLLIN, 0});
  for (const auto& w : workers) {
    fds.push_back({w.dead ? -1 : w.data.fd(), POLLIN, 0});
    fds.push_back({w.dead ? -1 : w.process.pidfd(), POLLIN, 0});
    // Its index channel, while tasks or recycles wait to go out on it.
    fds.push_back({w.dead || !w.index.has_queued() ? -1 : w.index.fd(), POLLOUT, 0});
  }
  // With a core to spare, poll briefly before sleeping (see ipc::kSpinBeforeSleep).
  if (spin_) (void)ipc::spin_poll(fds.data(), fds.size());
  int timeout_ms = -1;
  const auto started = ipc::Clock::now();
  if (deadline) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - started);
    timeout_ms = static_cast<int>(std::max<long long>(0, left.count()));
  }
  const int n = ::poll(fds.data(), fds.size(), timeout_ms);
  if (n < 0) {
    if (errno == EINTR) return false;
    throw std::system_error(errno, std::generic_category(), "poll on the DataLoader's workers");
  }
  if (n == 0) return true;
  if (fds[0].revents != 0 && state_->closed) {
    throw_loader_closed("while next() waited for a batch");
  }
  for (std::size_t i = 0; i < workers.size(); ++i) {
    WorkerSlot& w = workers[i];
    const short data = fds[1 + 3 * i].revents;
    const short death = fds[2 + 3 * i].revents;
    const short index = fds[3 + 3 * i].revents;
    // A worker respawned while this loop ran (on_worker_death=respawn) is a new process: the
    // events polled were its predecessor's.
    const std::uint64_t generation = w.generation;
    if (data & POLLIN) (void)receive_from(w);  // first: a worker sending a reply reads no task
    if (w.generation != generation) continue;
    if ((death & POLLIN) || (data & (POLLHUP | POLLERR)) || (index & (POLLHUP | POLLERR))) {
      worker_gone(w);
    }
    if (w.generation != generation) continue;
    if ((index & POLLOUT) && !w.index.flush()) worker_gone(w);
  }
  return false;
}

bool MultiProcessEpoch::receive_from(WorkerSlot& w) {
  std::vector<std::byte>& bytes = message_;  // reused: this runs once per message
  std::vector<ipc::UniqueFd> fds;
  ipc::Channel::Received got = ipc::Channel::Received::kNotYet;
  try {
    got = w.data.try_receive(bytes, fds);
  } catch (const std::exception& e) {
    fail(std::make_exception_ptr(
        Error(detail::str("DataLoader worker ", w.id, " (pid ", w.process.pid(),
                          ") sent a malformed message on its data channel: ", e.what(),
                          "; this is a bug in ferry or memory corruption in the worker"))));
  }
  if (got == ipc::Channel::Received::kNotYet) return false;  // the rest of it is on its way
  // Closed, even part-way through a message: the worker is gone; its exit says how (or, with
  // on_worker_death=respawn, a new worker now holds the slot).
  if (got == ipc::Channel::Received::kClosed) {
    worker_died(w);
    return false;
  }
  try {
    handle_message(w, bytes, fds);
  } catch (...) {
    // The task is already off in_flight: an unexpected error here (mmap failing, say) must end
    // the epoch, or its batch would be waited for forever.
    if (failed_) throw;
    fail(std::current_exception());
  }
  return true;
}

void MultiProcessEpoch::handle_message(WorkerSlot& w,
                                       std::vector<std::byte>& bytes,
                                       std::vector<ipc::UniqueFd>& fds) {
  ipc::DataMessage message;
  try {
    message = ipc::decode_data(bytes);
  } catch (...) {
    fail(std::current_exception());
  }
  std::vector<std::int64_t> answered;  // the indices of the task this message answers
  auto complete = [&](std::uint64_t epoch, std::uint64_t sequence) {
    if (w.in_flight.empty() || w.in_flight.front().epoch != epoch ||
        w.in_flight.front().sequence != sequence) {
      fail(std::make_exception_ptr(Error(detail::str(
          "DataLoader worker ", w.id, " (pid ", w.process.pid(), ") answered batch ", sequence,
          " of epoch ", epoch, ", which it was not asked for; this is a bug in ferry"))));
    }
    // A worker answers in order, so the front record says who asked: an earlier iterator's
    // answer is stale even when set_epoch() gave both iterators the same epoch number.
    const bool current = w.in_flight.front().token == token_;
    answered = std::move(w.in_flight.front().indices);
    w.in_flight.pop_front();
    return current;
  };
  if (auto* m = std::get_if<ipc::WorkerReadyMessage>(&message)) {
    check_handshake(w, *m);
    return;
  }
  Result result;
  result.worker = w.id;
  std::uint64_t& sequence = result.sequence;
  if (auto* m = std::get_if<ipc::BatchReadyMessage>(&message)) {
    sequence = m->sequence;
    const bool current = complete(m->epoch, m->sequence);
    account(w, *m);
    if (m->segment_id == ipc::kNoSegment) {  // every sample was skipped: nothing to map
      for (const auto id : m->retired_segments) w.segments.erase(id);
      if (!current) return;
      result.empty = true;
      result.skipped = std::move(m->skipped);
    } else {
      std::shared_ptr<MappedSegment> mapping;
      bool reused = false;
      const auto segment = w.segments.find(m->segment_id);
      if (fds.size() > 1 || (fds.size() == 1) == (segment != w.segments.end())) {
        fail(std::make_exception_ptr(Error(detail::str(
            worker_name(w), " sent batch ", m->sequence, " in segment ", m->segment_id, " with ",
            fds.size(), " descriptors, which ",
            segment != w.segments.end() ? "this process has mapped already" : "it never sent",
            "; the message is corrupt: a bug in ferry or memory corruption in the worker"))));
      }
      if (!fds.empty()) {
        // Mapped at the size measured here, never the size the message claims: a segment
        // sealed against shrinking cannot be cut short under the mapping (SIGBUS).
        std::size_t size = 0;
        try {
          size = ipc::measure_received_segment(fds.front().get());
        } catch (const Error& e) {
          fail(std::make_exception_ptr(Error(detail::str(worker_name(w), ": ", e.what()))));
        }
        if (size != m->segment_size) {
          fail(std::make_exception_ptr(
              Error(detail::str(worker_name(w), " sent segment ", m->segment_id, " as ",
                                m->segment_size, " bytes, but it is ", size,
                                "; the message is corrupt: a bug in ferry or memory corruption"))));
        }
        mapping = std::make_shared<MappedSegment>(
            ipc::MappedRegion::map_shared(fds.front().get(), size, true),
            state_->recorder->memory());
        w.segments[m->segment_id] = mapping;
      } else {
        mapping = segment->second;
        reused = true;
      }
      for (const auto id : m->retired_segments) {
        if (id != m->segment_id) w.segments.erase(id);
      }
      auto lease = std::make_shared<SegmentLease>();
      lease->mapping = mapping;
      lease->queue = pool_->recycle;
      lease->worker = w.id;
      lease->generation = w.generation;
      lease->segment_id = m->segment_id;
      if (!current) return;  // the lease recycles the segment as it goes
      const ipc::MappedRegion& region = mapping->region;
      const auto& stage = state_->stage;
      if (stage && stage->fences_returns()) {
        // Armed when the batch reaches the loop: one dropped before (a prefetched batch of an
        // epoch that ends early, a pinned copy's source) goes back at once.
        result.arm_fence = [lease, weak = std::weak_ptr<device::DeviceStage>(stage),
                            accelerator = &stage->accelerator(), device = stage->device_index()] {
          lease->fence = weak;
          lease->fence_accelerator = accelerator;
          lease->fence_device = device;
        };
      }
      // A segment is page-locked once it comes back for reuse, on the stage's own thread (about
      // 50 ms for 38.5 MB); until then, and for one-off segments, batches take a pinned copy.
      if (reused && stage && stage->page_locks_segments()) {
        stage->page_lock_later(
            std::shared_ptr<device::LockableRange>(mapping, &mapping->page_lock));
      }
      result.skipped = std::move(m->skipped);
      if (iterable_ && !m->indices.empty() && m->indices.back() >= 0) {
        result.stream_position = static_cast<std::uint64_t>(m->indices.back()) + 1;
        if (m->has_stream_cursor) result.stream_cursor = std::move(m->stream_cursor);
      }
      // Every field is checked against the segment as this process measured it.
      Batch batch = open_batch(*m, region.data(), region.size(), lease, worker_name(w));
      batch.set_position(epoch_, m->sequence);
      if (!stage) {
        result.batch = device::StagedBatch{std::move(batch), nullptr};
      } else {
        // Its copy to the device starts now, ahead of the loop; a failure fails this batch only.
        try {
          result.batch = stage->start(std::move(batch), mapping->page_lock.locked());
        } catch (...) {
          result.error = std::current_exception();
        }
      }
    }
  } else if (auto* m = std::get_if<ipc::SampleErrorMessage>(&message)) {
    sequence = m->sequence;
    const bool current = complete(m->epoch, m->sequence);
    if (!current) return;
    WorkerFailure failure = failure_of(w);
    failure.batch = static_cast<std::int64_t>(m->sequence);
    failure.indices = std::move(answered);  // the failed batch's, not the worker's other tasks
    failure.index = m->index;
    failure.type_name = m->type_name;
    failure.message = m->message;
    const std::string where =
        m->index >= 0 ? detail::str("loading index ", m->index, " of batch ", m->sequence)
                      : detail::str("collating batch ", m->sequence);
    const std::string what = detail::str("DataLoader worker ", w.id, " (pid ", w.process.pid(),
                                         ") raised ", m->type_name, " ", where, " of epoch ",
                                         epoch_, ": ", m->message, cuda_advice(w, m->message));
    if (m->type_name == "ferry::SharedMemoryError") {
      result.error =
          std::make_exception_ptr(SharedMemoryError(
              what + ". Lower batch_size, prefetch_factor or num_workers, or give the job more "
                     "memory (a container's memory limit)"));
    } else {
      result.error = std::make_exception_ptr(WorkerError(what, std::move(failure)));
    }
  } else if (auto* m = std::get_if<ipc::StreamEndMessage>(&message)) {
    sequence = m->sequence;
    if (!complete(m->epoch, m->sequence)) return;
    result.stream_end = true;
  } else if (auto* m = std::get_if<ipc::WorkerErrorMessage>(&message)) {
    w.dead = true;  // it exits after reporting (code 1), by design
    WorkerFailure failure = failure_of(w);
    failure.type_name = m->type_name;
    failure.message = m->message;
    const std::string what =
        detail::str("DataLoader worker ", w.id, " (pid ", w.process.pid(), ") failed (",
                    m->type_name, "): ", m->message, cuda_advice(w, m->message));
    fail(std::make_exception_ptr(WorkerError(what, std::move(failure))));
  }
  if (state_->options.in_order) {
    const std::uint64_t key = sequence;
    ready_.emplace(key, std::move(result));
  } else {
    arrived_.push_back(std::move(result));
  }
}

WorkerFailure MultiProcessEpoch::failure_of(const WorkerSlot& w) const {
  WorkerFailure failure;
  failure.worker_id = w.id;
  failure.pid = w.process.pid();
  failure.epoch = epoch_;
  for (const auto& task : w.in_flight) {
    if (task.token != token_) continue;
    if (failure.batch < 0) failure.batch = static_cast<std::int64_t>(task.sequence);
    failure.indices.insert(failure.indices.end(), task.indices.begin(), task.indices.end());
  }
  return failure;
}

std::string MultiProcessEpoch::worker_name(const WorkerSlot& w) {
  return detail::str("DataLoader worker ", w.id, " (pid ", w.process.pid(), ")");
}

std::string MultiProcessEpoch::cuda_advice(const WorkerSlot& w, const std::string& message) {
  if (!w.forked_after_cuda || message.find("CUDA") == std::string::npos) return {};
  return " (this worker was forked after this process initialised CUDA, so it cannot use CUDA: "
         "keep GPU work in the training loop or in device_transforms, which run on the GPU "
         "after the copy; or use start_method=spawn, whose workers start CUDA afresh)";
}

void MultiProcessEpoch::check_handshake(WorkerSlot& w, const ipc::WorkerReadyMessage& m) {
  const LoaderState& s = *state_;
  const auto start_method = to_string(*s.options.start_method);
  if (m.dataset_hash != s.dataset_hash || m.collate_hash != s.collate_hash) {
    const bool dataset = m.dataset_hash != s.dataset_hash;
    fail(std::make_exception_ptr(ConfigError(detail::str(
        "DataLoader worker ", w.id, " (pid ", w.process.pid(), ", start_method=", start_method,
        ") rebuilt the ", dataset ? "dataset" : "collate function", " with configuration hash ",
        hash_string(dataset ? m.dataset_hash : m.collate_hash), ", but this process has ",
        hash_string(dataset ? s.dataset_hash : s.collate_hash),
        ": the worker program registers the type differently (another build of the program or "
        "of ferry-worker, or defaults that depend on the environment). This process's "
        "configuration: ",
        dataset ? s.dataset_config : s.collate_config))));
  }
  const std::int64_t expected = s.dataset ? static_cast<std::int64_t>(s.dataset->size()) : -1;
  if (m.dataset_size != expected) {
    fail(std::make_exception_ptr(ConfigError(
        detail::str("DataLoader worker ", w.id, " (pid ", w.process.pid(),
                    ", start_method=", start_method, ") rebuilt a dataset of ", m.dataset_size,
                    " samples from the same configuration, but "
                    "this process's has ",
                    expected, "; did its files change? Configuration: ", s.dataset_config))));
  }
  pool_->mark_ready(w);
}

bool MultiProcessEpoch::oom_killed(const WorkerSlot& w) const {
  const auto& cgroup = pool_->memory_cgroup();
  const std::optional<std::uint64_t> now = cgroup ? cgroup->oom_kills() : std::nullopt;
  return now && w.oom_kills_at_start && *now > *w.oom_kills_at_start;
}

std::string MultiProcessEpoch::sigkill_hint(const WorkerSlot& w) const {
  if (w.process.killed_by_terminate()) return "";  // ferry's own SIGKILL, said where it was sent
  const auto& cgroup = pool_->memory_cgroup();
  const std::optional<std::uint64_t> now = cgroup ? cgroup->oom_kills() : std::nullopt;
  if (!now || !w.oom_kills_at_start) {
    return "; SIGKILL that ferry did not send usually means the kernel's out-of-memory killer "
           "(check dmesg; lower batch_size, num_workers or prefetch_factor)";
  }
  if (*now > *w.oom_kills_at_start) {
    const auto limit = cgroup->limit_bytes();
    return detail::str(
        "; the memory cgroup's out-of-memory killer killed it, most likely (oom_kill in ",
        cgroup->events_file(), " went from ", *w.oom_kills_at_start, " to ", *now,
        " while it ran: an out-of-memory kill in this cgroup; ",
        limit ? detail::str("the cgroup's limit is ", *limit / (1024 * 1024), " MiB")
              : std::string("the cgroup has no limit of its own: a parent cgroup's applies"),
        "). Each worker holds up to prefetch_factor batches of shared memory plus what loading "
        "a batch takes: lower batch_size, prefetch_factor or num_workers, or give the job more "
        "memory (the container's memory limit)");
  }
  return detail::str(
      "; ferry did not send this SIGKILL, and the memory cgroup counted no out-of-memory kill "
      "while the worker ran (",
      cgroup->events_file(), "): another process killed it (check dmesg to be sure)");
}

void MultiProcessEpoch::worker_gone(WorkerSlot& w) {
  const std::uint64_t generation = w.generation;
  while (w.generation == generation && w.data.valid() && receive_from(w)) {
  }
  if (w.generation == generation) worker_died(w);  // unless its channel's end said so already
}

std::optional<std::string> MultiProcessEpoch::restart_refused() const {
  const DataLoaderOptions& o = state_->options;
  if (restarts_ >= o.max_worker_restarts) {
    return detail::str("max_worker_restarts=", o.max_worker_restarts, " restarts in one epoch");
  }
  std::size_t total = 0;
  {
    const std::lock_guard<std::mutex> lock(state_->stats_mutex);
    total = state_->restarts.size();
  }
  if (total >= o.max_worker_restarts_total) {
    return detail::str("max_worker_restarts_total=", o.max_worker_restarts_total,
                       " restarts over the loader's life");
  }
  return std::nullopt;
}

void MultiProcessEpoch::respawn(WorkerSlot& w, WorkerRestart record) {
  // The tasks it held for this epoch, in the order it got them; an earlier epoch's are stale.
  std::vector<TaskRecord> tasks;
  for (auto& task : w.in_flight) {
    if (task.token == token_) tasks.push_back(std::move(task));
  }
  for (const auto& task : tasks) record.batches.push_back(task.sequence);
  const std::size_t id = w.id;
  try {
    pool_->restart_worker(id);
  } catch (const std::exception& e) {
    pool_->mark_broken();
    WorkerFailure failure = failure_of(w);
    failure.message = record.message;
    fail(std::make_exception_ptr(WorkerDiedError(
        detail::str(record.message,
                    "; on_worker_death=respawn could not start a new worker: ", e.what()),
        std::move(failure), record.exit_code, record.signal)));
  }
  std::fprintf(stderr,
               "ferry: %s; restarted it (on_worker_death=respawn, restart %zu of %zu this "
               "epoch) to load its %zu unfinished batches again\n",
               record.message.c_str(), restarts_ + 1, state_->options.max_worker_restarts,
               tasks.size());
  if (state_->tracer) state_->tracer->instant("worker restart", record.message);
  {
    const std::lock_guard<std::mutex> lock(state_->stats_mutex);
    state_->restarts.push_back(std::move(record));
  }
  ++restarts_;
  WorkerSlot& fresh = pool_->workers()[id];
  // Sent again under their own sequence numbers, so the order of delivery does not change; each
  // still counts against the worker's prefetch (undelivered_ is unchanged).
  for (auto& task : tasks) send_task(fresh, task.sequence, std::move(task.indices));
}

std::optional<std::int64_t> MultiProcessEpoch::crash_suspect(const WorkerSlot& w,
                                                             bool& by_signal) const {
  by_signal = false;
  const workers::WorkerStatusPage* page = w.status.page();
  if (page == nullptr) return std::nullopt;
  const auto held = [&](std::int64_t index) {
    for (const auto& task : w.in_flight) {
      if (task.token != token_) continue;
      for (const std::int64_t i : task.indices) {
        if (i == index) return true;
      }
    }
    return false;
  };
  // A fatal signal names the sample of the thread that raised it.
  const std::int64_t crashed = page->crashed_index.load(std::memory_order_acquire);
  if (crashed >= 0) {
    if (!held(crashed)) return std::nullopt;
    by_signal = true;
    return crashed;
  }
  // Otherwise (SIGKILL, an exit inside Dataset::get) only if one sample alone was in hand.
  std::optional<std::int64_t> only;
  for (const auto& slot : page->slots) {
    const std::int64_t index = slot.index.load(std::memory_order_relaxed);
    if (index < 0) continue;
    if (only && *only != index) return std::nullopt;
    only = index;
  }
  return only && held(*only) ? only : std::nullopt;
}

namespace {

// "; its last lines on stderr:" and up to `shown` of them, indented.
std::string quote_tail(const std::vector<std::string>& tail, std::size_t shown = 5) {
  if (tail.empty()) return {};
  std::string out = "; its last lines on stderr:";
  for (std::size_t i = tail.size() > shown ? tail.size() - shown : 0; i < tail.size(); ++i) {
    out += "\n  | " + tail[i];
  }
  return out;
}

}  // namespace

void MultiProcessEpoch::worker_died(WorkerSlot& w) {
  w.dead = true;
  std::optional<ipc::ExitStatus> status = w.process.try_wait();
  if (!status) status = w.process.terminate(std::chrono::milliseconds(200));
  WorkerFailure failure = failure_of(w);
  // Its process is gone: what it wrote last is in the pipe, or soon (a process it started may
  // still hold the pipe: not waited for long).
  failure.stderr_tail = WorkerPool::finish_stderr(
      w, std::chrono::steady_clock::now() + std::chrono::milliseconds(200));
  if (status->exit_code == workers::kSampleTimeoutExitCode &&
      state_->options.sample_timeout.count() > 0) {
    const std::string what = detail::str(
        "DataLoader worker ", w.id, " (pid ", w.process.pid(), ") spent more than sample_timeout (",
        static_cast<double>(state_->options.sample_timeout.count()) / 1000.0,
        " s) on one sample of batch ", failure.batch, " of epoch ", epoch_, " (indices ",
        list_indices(failure.indices), "; the worker's stderr names the index) and was stopped",
        quote_tail(failure.stderr_tail, 2));
    fail(std::make_exception_ptr(TimeoutError(what, std::move(failure))));
  }
  bool raised_in_sample = false;  // a fatal signal of its own while loading the suspect
  const std::optional<std::int64_t> suspect = crash_suspect(w, raised_in_sample);
  if (suspect) failure.index = *suspect;
  std::string held;
  for (const auto& task : w.in_flight) {
    if (task.token != token_) continue;
    held += held.empty() ? "" : "; ";
    held +=
        detail::str("batch ", task.sequence,
                    iterable_ ? std::string() : " (indices " + list_indices(task.indices) + ")");
  }
  std::string hint;
  if (status->signal == SIGKILL)
    hint = sigkill_hint(w);
  else if (status->signal == SIGBUS) {
    hint =
        "; SIGBUS in a worker usually means memory for shared segments ran out (the memory "
        "cgroup's limit, or /dev/shm without memfd)";
  }
  if (!w.ready) {
    hint += detail::str("; it died before its handshake, while starting (start_method=",
                        to_string(*state_->options.start_method),
                        ") and rebuilding the dataset from its configuration: its stderr says why");
  }
  std::string what =
      detail::str("DataLoader worker ", w.id, " (pid ", w.process.pid(), ") ", status->describe(),
                  suspect ? detail::str(" while loading index ", *suspect) : std::string(),
                  held.empty() ? std::string(" while idle") : " while holding " + held, ", epoch ",
                  epoch_, hint);
  const bool respawning = state_->options.on_worker_death == OnWorkerDeath::kRespawn;
  // A sample that killed a worker once may be unlucky; twice, it is the sample. Deaths the
  // sample caused count: a fatal signal the worker raised itself while loading it, an exit from
  // inside its Dataset::get, a SIGKILL while it alone was in hand and the memory cgroup's OOM
  // killer counted a kill during the worker's life. A signal sent from elsewhere (a user, a
  // scheduler, ferry's own timeout) says nothing about the sample and does not count.
  const bool sample_caused =
      suspect && (raised_in_sample || (status->signal == 0 && status->exit_code != 0) ||
                  (status->signal == SIGKILL && !w.process.killed_by_terminate() && oom_killed(w)));
  std::size_t kills = 0;
  if (respawning && sample_caused) {
    // The last line the worker wrote itself (the crash line ferry's handler adds says no more
    // than the signal and index already given).
    std::string said;
    for (auto line = failure.stderr_tail.rbegin(); line != failure.stderr_tail.rend(); ++line) {
      if (line->rfind("ferry: DataLoader worker ", 0) == 0) continue;
      said = "; its last line on stderr: " + *line;
      break;
    }
    auto& deaths = state_->worker_kills[*suspect];
    deaths.push_back(detail::str("worker ", w.id, " (pid ", w.process.pid(), ") ",
                                 status->describe(), " in epoch ", epoch_, said));
    kills = deaths.size();
  }
  if (respawning && kills >= 2) {
    const std::string deaths = detail::join(state_->worker_kills[*suspect], "; ");
    if (state_->options.on_error != OnError::kSkip) {
      what += detail::str("; index ", *suspect, " has now killed ", kills, " workers (", deaths,
                          "), so it is not loaded again and the epoch ends. Set on_error=skip to "
                          "leave such a sample out (quarantine) and go on, or fix what crashes "
                          "on it");
      pool_->mark_broken();
      failure.message = status->describe();
      fail(std::make_exception_ptr(WorkerDiedError(what + quote_tail(failure.stderr_tail),
                                                   std::move(failure), status->exit_code,
                                                   status->signal)));
    }
    state_->quarantined[*suspect] = workers::SkippedSample{
        *suspect, "quarantined",
        detail::str("its loading killed ", kills, " DataLoader workers (", deaths,
                    "); on_worker_death=respawn leaves it out from then on")};
    what += detail::str("; index ", *suspect, " has killed ", kills,
                        " workers: quarantined, left out from now on and reported as skipped");
  }
  if (respawning) {
    const auto refused = restart_refused();
    if (!refused) {
      respawn(w, WorkerRestart{.epoch = epoch_,
                               .worker_id = w.id,
                               .pid = static_cast<int>(w.process.pid()),
                               .exit_code = status->exit_code,
                               .signal = status->signal,
                               .batches = {},
                               .index = suspect.value_or(-1),
                               .message = what,
                               .stderr_tail = failure.stderr_tail});
      return;
    }
    std::string history;
    {
      const std::lock_guard<std::mutex> lock(state_->stats_mutex);
      const std::size_t shown = 10;  // the last ones; stats() lists them all
      const std::size_t from =
          state_->restarts.size() > shown ? state_->restarts.size() - shown : 0;
      if (from > 0) history += detail::str("\n  (", from, " earlier ones in stats())");
      for (std::size_t i = from; i < state_->restarts.size(); ++i) {
        history += detail::str("\n  restart ", i + 1, ": epoch ", state_->restarts[i].epoch, ": ",
                               state_->restarts[i].message);
      }
    }
    what += detail::str("; not restarted: on_worker_death=respawn allows ", *refused,
                        ", and they are spent (raise the limit if the deaths are transient, or "
                        "find what kills the workers; DataLoader::stats() lists the restarts). "
                        "Restarts so far:",
                        history.empty() ? std::string(" none") : history);
  }
  pool_->mark_broken();
  failure.message = status->describe();
  what += quote_tail(failure.stderr_tail);
  fail(std::make_exception_ptr(
      WorkerDiedError(what, std::move(failure), status->exit_code, status->signal)));
}

void MultiProcessEpoch::timed_out(std::chrono::milliseconds waited) {
  auto [culprit, held] = waited_on();
  pool_->mark_broken();
  WorkerFailure failure;
  std::string what = detail::str("DataLoader timed out: no batch within ",
                                 static_cast<double>(waited.count()) / 1000.0, " s");
  if (culprit != nullptr) {
    failure = failure_of(*culprit);
    failure.batch = static_cast<std::int64_t>(held->sequence);
    what +=
        detail::str(" from worker ", culprit->id, " (pid ", culprit->process.pid(),
                    "), which holds batch ", held->sequence, " of epoch ", held->epoch,
                    iterable_ ? std::string() : " (indices " + list_indices(held->indices) + ")",
                    "; the worker was killed. Raise timeout, or look at what the dataset does "
                    "for these indices");
    if (!culprit->ready) {
      what += detail::str(
          " (it had not finished starting: start_method=", to_string(*state_->options.start_method),
          " gives a worker ", static_cast<double>(WorkerPool::startup_limit().count()) / 1000.0,
          " s to start)");
    }
    culprit->process.terminate(std::chrono::milliseconds(0));
    culprit->dead = true;
  }
  fail(std::make_exception_ptr(TimeoutError(what, std::move(failure))));
}

void MultiProcessEpoch::fail(std::exception_ptr error) {
  failed_ = true;
  pool_->mark_broken();
  if (state_->persistent_pool == pool_) state_->persistent_pool.reset();
  pool_->shutdown();
  std::rethrow_exception(error);
}

}  // namespace ferry::detail
