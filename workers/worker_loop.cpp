#include "workers/worker_loop.h"

#include <cxxabi.h>
#include <malloc.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>

#include "ferry/error.h"

#include "collate/batch_layout.h"
#include "core/timing_stride.h"
#include "ipc/child_process.h"
#include "ipc/mapped_file.h"
#include "ipc/protocol.h"
#include "ipc/signal_safe.h"
#include "net/http.h"
#include "net/shard_cache.h"
#include "workers/fetch.h"
#include "workers/forker.h"
#include "workers/segment_pool.h"
#include "workers/worker_output.h"

namespace ferry::workers {

namespace {

// Written from the fatal-signal handler: prepared beforehand, only write() at crash time.
char g_crash_prefix[96];
std::size_t g_crash_prefix_len = 0;

// The sample being loaded, for the watchdog's message.
volatile std::int64_t g_current_index = -1;

// Remote shards' transfers that ended (net::set_transfer_observer), for the trace: from any
// thread that loads samples (worker_threads > 1), taken by the next batch's message.
std::mutex g_transfers_mutex;
std::vector<ipc::SpanRecord> g_transfers;

void on_transfer(std::uint64_t start_ns, std::uint64_t end_ns, std::uint64_t /*bytes*/) {
  const std::lock_guard<std::mutex> lock(g_transfers_mutex);
  if (g_transfers.size() < 4096) g_transfers.push_back({ipc::kDownloadSpan, start_ns, end_ns});
}
char g_watchdog_prefix[96];
std::size_t g_watchdog_prefix_len = 0;

WorkerStatusPage* g_status = nullptr;

std::uint64_t clock_ns(clockid_t clock) {
  timespec t{};
  ::clock_gettime(clock, &t);
  return static_cast<std::uint64_t>(t.tv_sec) * 1'000'000'000u +
         static_cast<std::uint64_t>(t.tv_nsec);
}
std::uint64_t now_ns() { return clock_ns(CLOCK_MONOTONIC); }

void write_number(std::int64_t v) {
  ipc::write_decimal(STDERR_FILENO, static_cast<std::uint64_t>(std::max<std::int64_t>(v, 0)));
}

void on_sample_timeout(int) {
  // Async-signal-safe: the prefix was formatted beforehand; the index is written by hand.
  (void)!::write(STDERR_FILENO, g_watchdog_prefix, g_watchdog_prefix_len);
  write_number(g_current_index);
  (void)!::write(STDERR_FILENO, "\n", 1);
  ::_exit(kSampleTimeoutExitCode);
}

// Arms the per-sample watchdog around one Dataset::get.
class SampleWatchdog {
 public:
  SampleWatchdog(std::chrono::milliseconds limit, std::int64_t index) : armed_(limit.count() > 0) {
    if (!armed_) return;
    g_current_index = index;
    itimerval timer{};
    timer.it_value.tv_sec = static_cast<time_t>(limit.count() / 1000);
    timer.it_value.tv_usec = static_cast<suseconds_t>(limit.count() % 1000 * 1000);
    ::setitimer(ITIMER_REAL, &timer, nullptr);
  }
  ~SampleWatchdog() {
    if (!armed_) return;
    itimerval off{};
    ::setitimer(ITIMER_REAL, &off, nullptr);
  }
  SampleWatchdog(const SampleWatchdog&) = delete;
  SampleWatchdog& operator=(const SampleWatchdog&) = delete;

 private:
  bool armed_;
};

void on_fatal_signal(int signal, siginfo_t* info, void*) {
  // The sample this thread was loading, for the main process (quarantine) and the message: only
  // for a fault of this process (the kernel's, or raise and abort here), not for a signal that
  // another process sent.
  const bool own = info == nullptr || info->si_code > 0 || info->si_pid == ::getpid();
  const std::int64_t index = own ? record_crash(g_status, signal) : -1;
  (void)!::write(STDERR_FILENO, g_crash_prefix, g_crash_prefix_len);
  const char* name = ipc::signal_abbrev(signal);
  if (name != nullptr) {
    (void)!::write(STDERR_FILENO, "SIG", 3);
    (void)!::write(STDERR_FILENO, name, std::strlen(name));
  }
  if (index >= 0) {
    static const char kLoading[] = " while loading index ";
    (void)!::write(STDERR_FILENO, kLoading, sizeof kLoading - 1);
    write_number(index);
  }
  // A memory-mapped file that shrank under a reader (a token file truncated while in use): which
  // file, and where.
  if (own && info != nullptr && (signal == SIGBUS || signal == SIGSEGV)) {
    (void)ipc::describe_fault(info->si_addr, STDERR_FILENO, signal == SIGSEGV);
  }
  (void)!::write(STDERR_FILENO, "\n", 1);
  ::signal(signal, SIG_DFL);  // re-raise, so the parent sees the real signal
  ::raise(signal);
}

}  // namespace

void prepare_worker_process(const WorkerSpec& spec) {
  // First: nothing below may leave an orphan if it hangs (a lock a thread of the parent held
  // at the fork, say).
  follow_parent(spec.parent_pid);
  at::set_num_threads(1);
  if (!spec.cpus.empty()) {  // worker_cpus: checked against the main process's cores already
    cpu_set_t set;
    CPU_ZERO(&set);
    for (const int cpu : spec.cpus) {
      if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &set);
    }
    if (::sched_setaffinity(0, sizeof set, &set) != 0) {
      std::fprintf(stderr,
                   "ferry: DataLoader worker %zu (pid %d): sched_setaffinity for worker_cpus "
                   "failed (%s); it runs on any core\n",
                   spec.worker_id, static_cast<int>(::getpid()), std::strerror(errno));
    }
  }
  // A worker allocates and frees the same large sample buffers batch after batch. glibc would
  // hand them back to the kernel each time (mmap for blocks over 128 KiB, heap trimming), so
  // every batch would page-fault its samples in again; keep them instead. A worker's memory
  // then stays at its peak working set, which it needs again for the next batch anyway.
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 512 << 20);
  ::signal(SIGINT, SIG_IGN);  // Ctrl-C is the main process's decision
  ::signal(SIGPIPE, SIG_IGN);
  g_crash_prefix_len = static_cast<std::size_t>(std::snprintf(
      g_crash_prefix, sizeof g_crash_prefix, "ferry: DataLoader worker %zu (pid %d) got a fatal ",
      spec.worker_id, static_cast<int>(::getpid())));
  g_crash_prefix_len = std::min(g_crash_prefix_len, sizeof g_crash_prefix - 1);
  g_status = spec.status;
  struct sigaction fatal {};
  fatal.sa_sigaction = on_fatal_signal;
  fatal.sa_flags = SA_SIGINFO;
  ::sigemptyset(&fatal.sa_mask);
  for (const int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT})
    ::sigaction(sig, &fatal, nullptr);
  char report_prefix[128];
  std::snprintf(report_prefix, sizeof report_prefix,
                "ferry: DataLoader worker %zu (pid %d), on SIGUSR1: ", spec.worker_id,
                static_cast<int>(::getpid()));
  install_worker_report_handler(report_prefix, spec.status);
  if (spec.sample_timeout.count() > 0) {
    g_watchdog_prefix_len = static_cast<std::size_t>(std::snprintf(
        g_watchdog_prefix, sizeof g_watchdog_prefix,
        "ferry: DataLoader worker %zu (pid %d) exceeded sample_timeout loading index ",
        spec.worker_id, static_cast<int>(::getpid())));
    g_watchdog_prefix_len = std::min(g_watchdog_prefix_len, sizeof g_watchdog_prefix - 1);
    ::signal(SIGALRM, on_sample_timeout);
  }
  // A fork worker starts with every signal blocked (the forker thread's mask); from here on its
  // signals are its own. A SIGINT that came meanwhile is dropped (ignored above).
  sigset_t none;
  ::sigemptyset(&none);
  ::pthread_sigmask(SIG_SETMASK, &none, nullptr);
}

namespace {

// A segment taken before a batch's samples load, laid out as the batch is expected to be. It
// goes back to the pool when the batch was not sent in it.
class ExpectedSegment {
 public:
  explicit ExpectedSegment(SegmentPool& pool) : pool_(pool) {}
  ~ExpectedSegment() {
    if (lease_) pool_.release(lease_->id);
  }
  ExpectedSegment(const ExpectedSegment&) = delete;
  ExpectedSegment& operator=(const ExpectedSegment&) = delete;

  void expect(collate::BatchLayout layout) {
    lease_ = pool_.acquire(layout.total_bytes);
    batch_.emplace(std::move(layout), lease_->data, lease_->size);
  }
  const ferry::detail::SampleOutputs* outputs() const noexcept {
    return batch_ ? &*batch_ : nullptr;
  }
  bool can_write(const std::vector<Example>& samples, const collate::BatchLayout& actual) const {
    return lease_ && batch_->can_write(samples, actual);
  }
  // The segment, now the caller's (to send, or to release on failure).
  SegmentPool::Lease take() {
    SegmentPool::Lease lease = *lease_;
    lease_.reset();
    return lease;
  }

 private:
  SegmentPool& pool_;
  std::optional<SegmentPool::Lease> lease_;
  std::optional<collate::ExpectedBatch> batch_;
};

// Seeds LibTorch's default CPU generator only. at::manual_seed also seeds every CUDA generator,
// which starts CUDA: in a worker forked after the main process started it, that throws ("CUDA
// error: initialization error"); in any other worker it makes a CUDA context per worker (hundreds
// of MB of GPU memory, and descriptors) that no worker may use. PyTorch's workers likewise never
// seed CUDA: torch.manual_seed queues that lazily, and a forked worker never runs it.
void seed_cpu_generator(std::uint64_t seed) {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_current_seed(seed);
}

class Worker {
 public:
  Worker(const WorkerSpec& spec, ipc::Channel index, ipc::Channel data)
      : spec_(spec),
        index_(std::move(index)),
        data_(std::move(data)),
        pool_(spec.worker_id, spec.keep_free_segments),
        who_{spec.worker_id, spec.num_workers, spec.base_seed} {
    fetch_options_.threads = spec.worker_threads;
    fetch_options_.skip_errors = spec.skip_errors;
    if (spec.trace) net::set_transfer_observer(&on_transfer);
    const bool watch = spec.sample_timeout.count() > 0;
    if (watch || spec.trace) {
      fetch_options_.before_sample = [this, watch](std::int64_t index) {
        if (watch) watchdog_.emplace(spec_.sample_timeout, index);
        span_index_ = index;
        if (spec_.trace) span_start_ = now_ns();
      };
      fetch_options_.after_sample = [this, watch] {
        if (watch) watchdog_.reset();
        if (spec_.trace) spans_.push_back({span_index_, span_start_, now_ns()});
      };
    }
    fetch_options_.stop_requested = [this] { return index_.peer_hung_up(); };
    if (spec.dataset) {
      fetch_options_.between_samples = [this] { look_ahead(); };
    } else {
      hints_ = false;  // an iterable dataset reads its own way
    }
    fetch_options_.status = spec.status;
  }

  [[noreturn]] void run() {
    seed_cpu_generator(spec_.torch_seed);
    if (spec_.worker_init_fn) {
      try {
        spec_.worker_init_fn(spec_.worker_id);
      } catch (...) {
        fatal(0, "worker_init_fn(" + std::to_string(spec_.worker_id) + ") failed: ");
      }
    }
    std::vector<std::byte> bytes;
    std::vector<ipc::UniqueFd> fds;
    last_sent_ns_ = now_ns();
    for (;;) {
      ipc::IndexMessage message;
      if (!ahead_.empty()) {  // read earlier by look_ahead()
        message = std::move(ahead_.front());
        ahead_.pop_front();
      } else {
        if (closed_) exit_now(0);
        fds.clear();
        bool got = false;
        try {
          if (spec_.spin) (void)index_.spin_until_readable();
          got = index_.receive(bytes, fds);
        } catch (...) {
          fatal(0, "the index channel failed: ");
        }
        if (!got) exit_now(0);  // the main process closed its end: shut down
        message = decode(bytes);
        if (const auto* task = std::get_if<ipc::TaskMessage>(&message)) hint(*task);
      }
      if (auto* task = std::get_if<ipc::TaskMessage>(&message)) {
        timing_ = {};
        if (timed_) {
          timing_.start_ns = now_ns();
          timing_.waiting_ns = timing_.start_ns - std::min(timing_.start_ns, last_sent_ns_);
        }
        spans_.clear();
        for (const auto id : task->recycled) pool_.release(id);
        look_ahead();
        handle(*task);
      } else if (auto* recycle = std::get_if<ipc::RecycleMessage>(&message)) {
        for (const auto id : recycle->segment_ids) pool_.release(id);
      } else if (auto* epoch = std::get_if<ipc::NewEpochMessage>(&message)) {
        (void)epoch;
        stream_.reset();  // a new epoch iterator: the stream restarts, even for the same epoch
      } else {
        exit_now(0);
      }
    }
  }

 private:
  // Says on the status page which task is in hand, for the task's lifetime.
  class Busy {
   public:
    Busy(WorkerStatusPage* page, const ipc::TaskMessage& task) : page_(page) {
      if (page_ == nullptr) return;
      page_->epoch.store(task.epoch, std::memory_order_relaxed);
      page_->sequence.store(task.sequence, std::memory_order_relaxed);
      page_->busy.store(1, std::memory_order_relaxed);
    }
    ~Busy() {
      if (page_ != nullptr) page_->busy.store(0, std::memory_order_relaxed);
    }
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;

   private:
    WorkerStatusPage* page_;
  };

  ipc::IndexMessage decode(const std::vector<std::byte>& bytes) {
    try {
      return ipc::decode_index(bytes);
    } catch (...) {
      fatal(0, "a malformed message arrived on the index channel: ");
    }
  }

  // Tells the dataset which samples this worker loads next (Dataset::prefetch), until it says
  // hints are of no use to it.
  void hint(const ipc::TaskMessage& task) {
    if (!hints_ || !spec_.dataset) return;
    std::vector<SkippedSample> left_out;
    const std::vector<std::int64_t> indices = indices_to_load(task, left_out);
    std::vector<std::size_t> wanted;
    wanted.reserve(indices.size());
    for (const std::int64_t i : indices) {
      if (i >= 0) wanted.push_back(static_cast<std::size_t>(i));
    }
    try {
      hints_ = spec_.dataset->prefetch(wanted);
    } catch (...) {
      // A hint that fails is dropped: the samples load when their turn comes, and say then
      // what is wrong.
    }
  }

  // Reads the messages already waiting behind the task in hand (the main process sends up to
  // prefetch_factor tasks ahead), without waiting, and hints their samples in order. They are
  // handled in the order they came, as if read one by one.
  void look_ahead() {
    if (!hints_ || closed_) return;
    std::vector<std::byte> bytes;
    std::vector<ipc::UniqueFd> fds;
    while (index_.readable_now()) {
      ipc::Channel::Received got = ipc::Channel::Received::kNotYet;
      try {
        got = index_.try_receive(bytes, fds);
      } catch (...) {
        fatal(0, "the index channel failed: ");
      }
      if (got == ipc::Channel::Received::kClosed) {
        closed_ = true;  // shut down once the messages read are handled
        return;
      }
      if (got != ipc::Channel::Received::kMessage) return;
      ahead_.push_back(decode(bytes));
      if (const auto* task = std::get_if<ipc::TaskMessage>(&ahead_.back())) hint(*task);
      if (!hints_) return;
    }
  }

  // The task's indices less those it says to leave out (quarantined samples), which go to
  // `skipped` with their records, once per occurrence.
  static std::vector<std::int64_t> indices_to_load(const ipc::TaskMessage& task,
                                                   std::vector<SkippedSample>& skipped) {
    if (task.leave_out.empty()) return task.indices;
    std::vector<std::int64_t> kept;
    kept.reserve(task.indices.size());
    for (const std::int64_t index : task.indices) {
      const ipc::SkippedSampleRecord* left = nullptr;
      for (const auto& record : task.leave_out) left = record.index == index ? &record : left;
      if (left != nullptr) {
        skipped.push_back(*left);
      } else {
        kept.push_back(index);
      }
    }
    return kept;
  }

  void handle(const ipc::TaskMessage& task) {
    const Busy busy(spec_.status, task);
    ExpectedSegment expected(pool_);  // outlives the samples, whose tensors may lie in it
    std::vector<Example> samples;
    std::vector<SkippedSample> skipped;
    std::int64_t failing_index = -1;
    try {
      if (spec_.dataset) {
        const std::vector<std::int64_t> indices = indices_to_load(task, skipped);
        // With the default collate, the batch will most likely be laid out as the previous one
        // was: take its segment now, so that samples can build their tensors in place.
        // Four clock reads a timed batch in all (about 20 ns each): each step starts where the
        // last ended. A batch not timed reads none (clock()).
        std::uint64_t t0 = timing_.start_ns;
        if (!spec_.collate_fn && last_layout_ && !indices.empty()) {
          expected.expect(collate::resize_layout(*last_layout_, indices.size()));
          const std::uint64_t taken = clock();
          timing_.segment_ns += taken - t0;
          t0 = taken;
        }
        fetch_options_.outputs = expected.outputs();
        FetchedBatch fetched = fetch_batch(*spec_.dataset, dataset_size_, indices, task.epoch, who_,
                                           fetch_options_, &failing_index);
        const std::uint64_t t1 = clock();
        timing_.loading_ns = t1 - t0;
        collate_start_ns_ = t1;
        // Samples loaded in parallel are not timed one by one: one span for them all.
        if (spec_.trace && spans_.empty() && !indices.empty())
          spans_.push_back({ipc::kLoadSpan, t0, t1});
        fetch_options_.outputs = nullptr;
        // A loader that is shutting down has hung up: stop now rather than after the whole
        // batch (a slow dataset could outlast the grace period).
        if (fetched.stopped) exit_now(0);
        samples = std::move(fetched.samples);
        for (auto& s : fetched.skipped) skipped.push_back(std::move(s));
        if (samples.empty()) {  // every sample was skipped: nothing to collate
          ipc::BatchReadyMessage ready;
          ready.epoch = task.epoch;
          ready.sequence = task.sequence;
          ready.segment_id = ipc::kNoSegment;
          ready.skipped = std::move(skipped);
          stamp(ready);
          send(ipc::DataMessage(std::move(ready)));
          return;
        }
      } else {
        const std::uint64_t t0 = timing_.start_ns;
        const bool more = read_stream(task, samples);
        const std::uint64_t t1 = clock();
        timing_.loading_ns = t1 - t0;
        collate_start_ns_ = t1;
        if (!more) return;
        if (spec_.trace) spans_.push_back({ipc::kLoadSpan, t0, t1});
      }
      send_batch(task, std::move(samples), std::move(skipped), expected);
    } catch (...) {
      ipc::SampleErrorMessage error;
      error.epoch = task.epoch;
      error.sequence = task.sequence;
      error.index = failing_index;
      error.type_name = current_exception_type_name();
      error.message = current_exception_message();
      send(ipc::DataMessage(std::move(error)));
    }
  }

  // Reads the next batch of this worker's stream; false (after telling the main process) when
  // the stream has ended with nothing more to send.
  bool read_stream(const ipc::TaskMessage& task, std::vector<Example>& samples) {
    if (!stream_ || stream_->epoch() != task.epoch) {
      try {
        stream_.emplace(*spec_.iterable, task.epoch, who_);
      } catch (...) {
        fatal(task.epoch, "IterableDataset::stream() failed: ");
      }
      if (task.stream_position > 0 || task.has_stream_cursor) {  // resuming a checkpoint
        try {
          stream_->resume(task.stream_position, task.has_stream_cursor
                                                    ? std::optional<std::string>(task.stream_cursor)
                                                    : std::nullopt);
        } catch (...) {
          fatal(task.epoch, ferry::detail::str("resuming the stream after ", task.stream_position,
                                               " samples failed: "));
        }
      }
    }
    samples = stream_->next_batch(spec_.batch_size, spec_.drop_last);
    stream_cursor_ = stream_->cursor();
    if (samples.empty()) {
      send(ipc::DataMessage(ipc::StreamEndMessage{task.epoch, task.sequence}));
      return false;
    }
    return true;
  }

  void send_batch(const ipc::TaskMessage& task,
                  std::vector<Example> samples,
                  std::vector<SkippedSample> skipped,
                  ExpectedSegment& expected) {
    ipc::BatchReadyMessage ready;
    ready.epoch = task.epoch;
    ready.sequence = task.sequence;
    ready.skipped = std::move(skipped);
    if (spec_.iterable && stream_cursor_) {
      ready.has_stream_cursor = true;
      ready.stream_cursor = std::move(*stream_cursor_);
      stream_cursor_.reset();
    }
    ready.indices.reserve(samples.size());
    for (const Example& s : samples) ready.indices.push_back(s.index());

    collate::BatchLayout layout;
    std::optional<Batch> user_batch;
    if (spec_.collate_fn) {
      user_batch = spec_.collate_fn(std::move(samples));
      layout = collate::plan_batch(*user_batch);
    } else {
      layout = collate::plan_batch(samples);
      last_layout_ = layout;
    }
    // The expected segment when the samples may be written there (most are already in place);
    // otherwise another, and the expected one is only read from, then freed.
    std::optional<SegmentPool::Lease> taken;
    if (expected.can_write(samples, layout)) {
      taken = expected.take();  // taken (and timed) before loading
    } else {
      const std::uint64_t segment_start = clock();
      taken = pool_.acquire(layout.total_bytes);
      const std::uint64_t segment_ns = clock() - segment_start;
      timing_.segment_ns += segment_ns;
      collate_start_ns_ += segment_ns;  // the collation's time and span leave it out
    }
    const SegmentPool::Lease lease = *taken;
    try {
      fill_and_send(ready, layout, lease, samples, user_batch);
    } catch (...) {
      pool_.release(lease.id);  // not sent: the segment is free again
      throw;
    }
  }

  void fill_and_send(ipc::BatchReadyMessage& ready,
                     const collate::BatchLayout& layout,
                     const SegmentPool::Lease& lease,
                     const std::vector<Example>& samples,
                     const std::optional<Batch>& user_batch) {
    if (user_batch) {
      collate::write_batch(*user_batch, layout, lease.data);
    } else {
      collate::write_batch(samples, layout, lease.data);
    }
    ready.segment_id = lease.id;
    ready.segment_size = lease.size;
    ready.num_samples = static_cast<std::uint32_t>(layout.num_samples);
    for (const collate::FieldLayout& f : layout.fields) {
      ipc::FieldMeta meta;
      meta.name = f.name;
      meta.kind = static_cast<std::uint8_t>(f.kind);
      meta.sizes = f.sizes;
      meta.offset = f.offset;
      meta.nbytes = f.nbytes;
      if (f.kind == collate::FieldKind::kString) {
        meta.strings = user_batch ? user_batch->strings(f.name) : strings_of(samples, f.name);
      } else {
        meta.dtype = static_cast<std::int8_t>(f.dtype);
      }
      ready.fields.push_back(std::move(meta));
    }
    ready.retired_segments = pool_.take_retired();
    const std::uint64_t collated = clock();
    timing_.collating_ns = collated - std::min(collated, collate_start_ns_);
    if (spec_.trace) spans_.push_back({ipc::kCollateSpan, collate_start_ns_, collated});
    stamp(ready, collated);
    const int fd = lease.fd_to_send;
    send(ipc::DataMessage(std::move(ready)), fd);
    if (fd >= 0) pool_.sent(lease.id);
  }

  // The batch's timing and spans into its message; the clock for the next task's wait starts
  // at `now` (the batch's last clock read; 0: read it). The process's CPU time is a system call
  // (hundreds of ns): it is read every 10 ms at most, and the batch that reads it reports what
  // the process used since the last read.
  //
  // Batches faster than TimingStride::kFastNs are timed one in a stride: the timed one (from the
  // previous batch's send to its own) reports its figures for the batches it stands for (they
  // fill the time since the previous timed one: TimingStride::tiled), the others report none. A
  // trace times every batch.
  void stamp(ipc::BatchReadyMessage& ready, std::uint64_t now = 0) {
    if (timed_) {
      if (now == 0) now = now_ns();
      (void)stride_.timed(last_sent_ns_, now);
      timing_.waiting_ns = stride_.tiled(timing_.waiting_ns);
      timing_.loading_ns = stride_.tiled(timing_.loading_ns);
      timing_.collating_ns = stride_.tiled(timing_.collating_ns);
      timing_.segment_ns = stride_.tiled(timing_.segment_ns);
      if (last_cpu_ns_ == 0 || now - std::min(now, last_cpu_read_ns_) >= 10'000'000) {
        const std::uint64_t cpu = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
        timing_.cpu_ns = cpu - std::min(cpu, last_cpu_ns_);
        last_cpu_ns_ = cpu;
        last_cpu_read_ns_ = now;
      }
    }
    if (spec_.trace) {  // remote shards' transfers that ended since the previous batch
      const std::lock_guard<std::mutex> lock(g_transfers_mutex);
      spans_.insert(spans_.end(), g_transfers.begin(), g_transfers.end());
      g_transfers.clear();
    }
    // Remote shards' counters, exact: what this process did since the previous batch.
    const net::HttpCounters http = net::http_counters();
    const net::CacheCounters cache = net::cache_counters();
    timing_.net_bytes = http.bytes - net_.bytes;
    timing_.net_requests = http.requests - net_.requests;
    timing_.net_retries = http.retries - net_.retries;
    timing_.cache_hits = cache.hits - cache_.hits;
    timing_.cache_downloads = cache.downloads - cache_.downloads;
    net_ = http;
    cache_ = cache;
    ready.timing = timing_;
    ready.spans = std::move(spans_);
    spans_.clear();
    // Whether the next batch is timed; if so, its wait for work starts now.
    timed_ = spec_.trace || stride_.due();
    if (timed_) last_sent_ns_ = now != 0 ? now : now_ns();
  }

  // The time now when this batch is timed, else 0 (no clock read).
  std::uint64_t clock() const { return timed_ ? now_ns() : 0; }

  static std::vector<std::string> strings_of(const std::vector<Example>& samples,
                                             const std::string& name) {
    std::vector<std::string> out;
    out.reserve(samples.size());
    for (const Example& s : samples) out.push_back(s[name].str());
    return out;
  }

  void send(const ipc::DataMessage& message, int fd = -1) {
    const auto bytes = ipc::encode(message);
    const int fds[1] = {fd};
    // Blocks while the main process has not read earlier replies (it always reads, and never
    // blocks sending to this worker), but not past its loader stopping: the index channel's
    // hang-up ends the wait as its data channel's would.
    const auto result =
        data_.send(bytes, fd >= 0 ? std::span<const int>(fds, 1) : std::span<const int>(),
                   std::nullopt, index_.fd());
    if (result != ipc::Channel::SendResult::kSent) exit_now(0);  // the loader is gone
  }

  [[noreturn]] void fatal(std::uint64_t epoch, const std::string& context) {
    ipc::WorkerErrorMessage error;
    error.epoch = epoch;
    error.type_name = current_exception_type_name();
    error.message = context + current_exception_message();
    try {
      send(ipc::DataMessage(std::move(error)));
    } catch (...) {
    }
    exit_now(1);
  }

  [[noreturn]] static void exit_now(int code) {
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(code);  // never the parent's atexit handlers or static destructors
  }

  const WorkerSpec& spec_;
  ipc::Channel index_;
  ipc::Channel data_;
  SegmentPool pool_;
  WorkerIdentity who_;
  std::optional<StreamReader> stream_;
  std::optional<std::string> stream_cursor_;  // after the batch being sent (checkpoints)
  FetchOptions fetch_options_;
  std::optional<collate::BatchLayout> last_layout_;  // the last default-collated batch's
  std::optional<SampleWatchdog> watchdog_;           // armed around each sample (sample_timeout)
  // Reading ahead: messages look_ahead() read behind the task in hand, whether the dataset
  // takes hints, and whether the main process has closed the index channel.
  std::deque<ipc::IndexMessage> ahead_;
  bool hints_ = true;
  bool closed_ = false;
  // Stats and the trace: the task in hand's timing and spans, when the last batch went out.
  ipc::WorkerTiming timing_;
  std::vector<ipc::SpanRecord> spans_;
  std::int64_t span_index_ = -1;
  std::uint64_t span_start_ = 0;
  std::uint64_t collate_start_ns_ = 0;
  std::uint64_t last_sent_ns_ = 0;
  bool timed_ = true;  // the batch in hand is timed (TimingStride)
  detail::TimingStride stride_;
  std::uint64_t last_cpu_ns_ = 0;
  net::HttpCounters net_ = net::http_counters();  // as of the previous batch
  net::CacheCounters cache_ = net::cache_counters();
  std::uint64_t last_cpu_read_ns_ = 0;
  std::size_t dataset_size_ = spec_.dataset ? spec_.dataset->size() : 0;
};

}  // namespace

std::string current_exception_message() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "(an exception not derived from std::exception)";
  }
}

std::string current_exception_type_name() {
  const std::type_info* type = abi::__cxa_current_exception_type();
  if (type == nullptr) return "unknown";
  int status = 0;
  char* demangled = abi::__cxa_demangle(type->name(), nullptr, nullptr, &status);
  std::string name = (status == 0 && demangled != nullptr) ? demangled : type->name();
  std::free(demangled);
  return name;
}

void run_worker(const WorkerSpec& spec, ipc::Channel index, ipc::Channel data) {
  try {
    Worker worker(spec, std::move(index), std::move(data));
    worker.run();
  } catch (...) {
    std::fprintf(stderr, "ferry: DataLoader worker %zu: unexpected error (%s): %s\n",
                 spec.worker_id, current_exception_type_name().c_str(),
                 current_exception_message().c_str());
  }
  std::fflush(stderr);
  ::_exit(1);
}

}  // namespace ferry::workers
