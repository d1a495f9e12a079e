#include "loader/loader_stats.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>

#include "loader/cpu_placement.h"

namespace ferry::detail {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_of(std::uint64_t ns) { return static_cast<double>(ns) / 1e9; }

// No report of a worker's is believed past an hour per batch.
std::uint64_t clamp_ns(std::uint64_t ns) {
  constexpr std::uint64_t kHour = 3600ull * 1'000'000'000ull;
  return std::min(ns, kHour);
}

void add_worker(std::vector<WorkerTimeStats>& into, const WorkerTimeStats& w) {
  if (into.size() <= w.worker_id) {
    const std::size_t from = into.size();
    into.resize(w.worker_id + 1);
    for (std::size_t i = from; i < into.size(); ++i) into[i].worker_id = i;
  }
  WorkerTimeStats& t = into[w.worker_id];
  t.batches += w.batches;
  t.samples += w.samples;
  t.loading += w.loading;
  t.collating += w.collating;
  t.segment += w.segment;
  t.waiting += w.waiting;
  t.cpu += w.cpu;
  t.net_bytes += w.net_bytes;
  t.net_requests += w.net_requests;
  t.net_retries += w.net_retries;
  t.cache_hits += w.cache_hits;
  t.cache_downloads += w.cache_downloads;
}

// An epoch's sums into a total (the quantiles come from the merged histograms).
void add_epoch(EpochStats& into, const EpochStats& s) {
  into.batches += s.batches;
  into.samples += s.samples;
  into.seconds += s.seconds;
  into.wait.count += s.wait.count;
  into.wait.total += s.wait.total;
  into.shared_memory_peak = std::max(into.shared_memory_peak, s.shared_memory_peak);
  for (const WorkerTimeStats& w : s.workers) add_worker(into.workers, w);
}

double online_cpus() {
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<double>(n) : 1.0;
}

// The rates and shares that follow from the sums.
void derive(EpochStats& s) {
  s.worker_cpu_seconds = 0;
  for (const WorkerTimeStats& w : s.workers) s.worker_cpu_seconds += w.cpu;
  s.batches_per_second = s.seconds > 0 ? static_cast<double>(s.batches) / s.seconds : 0.0;
  s.worker_cpu_share = s.seconds > 0 ? s.worker_cpu_seconds / (s.seconds * online_cpus()) : 0.0;
}

}  // namespace

// ---- LatencyHistogram ----

std::size_t LatencyHistogram::bucket(std::uint64_t ns) noexcept {
  if (ns < kSub) return static_cast<std::size_t>(ns);
  const int e = 63 - __builtin_clzll(ns);  // >= 5
  const auto sub = static_cast<std::size_t>((ns >> (e - 5)) & (kSub - 1));
  return static_cast<std::size_t>(e - 4) * kSub + sub;
}

double LatencyHistogram::midpoint(std::size_t b) noexcept {
  if (b < kSub) return static_cast<double>(b);
  const int e = static_cast<int>(b / kSub) + 4;
  const double sub = static_cast<double>(b % kSub);
  const double width = std::ldexp(1.0, e - 5);
  return (kSub + sub) * width + width / 2;
}

void LatencyHistogram::record(std::uint64_t ns, std::uint64_t weight) noexcept {
  counts_[bucket(ns)].add(weight);
  count_.add(weight);
  if (ns > max_.get()) max_.set(ns);
}

void LatencyHistogram::merge(const LatencyHistogram& other) noexcept {
  for (std::size_t i = 0; i < counts_.size(); ++i) counts_[i].add(other.counts_[i].get());
  count_.add(other.count_.get());
  if (other.max_.get() > max_.get()) max_.set(other.max_.get());
}

double LatencyHistogram::quantile(double q) const noexcept {
  const std::uint64_t count = count_.get();
  if (count == 0) return 0;
  const auto target = std::max<std::uint64_t>(
      1, static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(count))));
  const double max = static_cast<double>(max_.get());
  std::uint64_t seen = 0;
  for (std::size_t b = 0; b < counts_.size(); ++b) {
    seen += counts_[b].get();
    if (seen >= target) return std::min(midpoint(b), max) / 1e9;
  }
  return max / 1e9;
}

// ---- MemoryGauge ----

void MemoryGauge::add(std::size_t bytes) noexcept {
  const std::size_t now = now_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::size_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void MemoryGauge::sub(std::size_t bytes) noexcept {
  now_.fetch_sub(bytes, std::memory_order_relaxed);
}

// ---- StatsRecorder ----

// One worker's sums in an epoch, in nanoseconds.
struct WorkerTallies {
  Tally batches, samples, loading, collating, segment, waiting, cpu;
  Tally net_bytes, net_requests, net_retries, cache_hits, cache_downloads;
};

struct StatsRecorder::Epoch {
  Epoch(std::uint64_t number, std::size_t workers)
      : epoch(number), start_ns(now()), num_workers(workers), workers(new WorkerTallies[workers]) {
    last_ns.set(start_ns);
  }
  static std::uint64_t now() noexcept {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
            .count());
  }
  std::uint64_t epoch;
  std::uint64_t start_ns;  // steady_clock (CLOCK_MONOTONIC), as the callers' times
  Tally last_ns;           // the last batch, or the end
  Tally batches;
  Tally samples;
  Tally wait_total_ns;
  std::atomic<bool> finished{false};
  std::atomic<bool> closed{false};
  LatencyHistogram waits;
  std::size_t num_workers;
  std::unique_ptr<WorkerTallies[]> workers;
  std::atomic<std::size_t> memory_peak{0};  // once closed
};

StatsRecorder::StatsRecorder(std::size_t num_workers,
                             std::vector<int> worker_cores,
                             std::size_t history)
    : num_workers_(num_workers),
      worker_cores_(std::move(worker_cores)),
      history_(std::max<std::size_t>(1, history)) {
  std::sort(worker_cores_.begin(), worker_cores_.end());
}

std::shared_ptr<StatsRecorder::Epoch> StatsRecorder::open(std::uint64_t epoch) {
  auto e = std::make_shared<Epoch>(epoch, num_workers_);
  const std::lock_guard<std::mutex> lock(mutex_);
  memory_->reset_peak();
  epochs_.push_back(e);
  while (epochs_.size() > history_) {
    const Epoch& old = *epochs_.front();
    add_epoch(past_, snapshot(old));
    past_waits_->merge(old.waits);
    epochs_.pop_front();
  }
  return e;
}

void StatsRecorder::forget(const std::shared_ptr<Epoch>& epoch) {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::erase(epochs_, epoch);
}

void StatsRecorder::delivered(Epoch& epoch,
                              std::uint64_t start_ns,
                              std::uint64_t now_ns,
                              std::size_t samples,
                              std::uint32_t weight,
                              std::optional<std::uint64_t> total_ns) noexcept {
  const std::uint64_t waited = now_ns - std::min(now_ns, start_ns);
  epoch.last_ns.set(now_ns);
  epoch.batches.add(1);
  epoch.samples.add(samples);
  epoch.wait_total_ns.add(total_ns.value_or(waited * weight));
  epoch.waits.record(waited, weight);
}

void StatsRecorder::counted(Epoch& epoch, std::size_t samples) noexcept {
  epoch.batches.add(1);
  epoch.samples.add(samples);
}

void StatsRecorder::reached_end(Epoch& epoch, std::uint64_t start_ns, std::uint64_t now_ns) {
  epoch.last_ns.set(now_ns);
  epoch.wait_total_ns.add(now_ns - std::min(now_ns, start_ns));
  epoch.finished.store(true, std::memory_order_relaxed);
  EpochStats s;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (num_workers_ == 0 || worker_cores_.empty()) return;
    s = snapshot(epoch);
    if (!noisy_neighbour_.observe(s.worker_cpu_seconds, s.seconds, worker_cores_.size())) return;
  }
  const std::vector<int> loop = thread_cpus();
  std::vector<int> shared;
  std::set_intersection(loop.begin(), loop.end(), worker_cores_.begin(), worker_cores_.end(),
                        std::back_inserter(shared));
  if (shared.empty()) return;
  std::fprintf(
      stderr,
      "ferry: in epoch %llu the DataLoader's %zu workers kept their cores (%s) %.0f%% busy, and "
      "the training thread may run on %s of them: it competes with them for CPU, which can slow "
      "training more than loading helps (the noisy neighbour). Set worker_cpus to cores the "
      "training thread does not use (README: Where the time goes), or lower num_workers\n",
      static_cast<unsigned long long>(s.epoch), num_workers_,
      format_cpu_list(worker_cores_).c_str(),
      100.0 * s.worker_cpu_seconds / (s.seconds * static_cast<double>(worker_cores_.size())),
      format_cpu_list(shared).c_str());
}

void StatsRecorder::close(Epoch& epoch) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (epoch.closed.load(std::memory_order_relaxed)) return;
  epoch.memory_peak.store(std::max(epoch.memory_peak.load(), memory_->peak()));
  epoch.closed.store(true, std::memory_order_relaxed);
}

void StatsRecorder::worker_batch(Epoch& epoch,
                                 std::size_t worker,
                                 const ipc::WorkerTiming& timing,
                                 std::size_t samples) noexcept {
  if (worker >= epoch.num_workers) return;
  WorkerTallies& w = epoch.workers[worker];
  w.batches.add(1);
  w.samples.add(samples);
  w.loading.add(clamp_ns(timing.loading_ns));
  w.collating.add(clamp_ns(timing.collating_ns));
  w.segment.add(clamp_ns(timing.segment_ns));
  w.waiting.add(clamp_ns(timing.waiting_ns));
  w.cpu.add(clamp_ns(timing.cpu_ns));
  w.net_bytes.add(timing.net_bytes);
  w.net_requests.add(timing.net_requests);
  w.net_retries.add(timing.net_retries);
  w.cache_hits.add(timing.cache_hits);
  w.cache_downloads.add(timing.cache_downloads);
}

EpochStats StatsRecorder::snapshot(const Epoch& e) const {
  EpochStats s;
  s.epoch = e.epoch;
  s.finished = e.finished.load(std::memory_order_relaxed);
  s.batches = e.batches.get();
  s.samples = e.samples.get();
  const bool over = e.closed.load(std::memory_order_relaxed) || s.finished;
  const std::uint64_t until = over ? e.last_ns.get() : Epoch::now();
  s.seconds = seconds_of(until - std::min(until, e.start_ns));
  s.wait.count = e.waits.count();
  s.wait.total = seconds_of(e.wait_total_ns.get());
  s.wait.p50 = e.waits.quantile(0.50);
  s.wait.p99 = e.waits.quantile(0.99);
  s.wait.max = seconds_of(e.waits.max_ns());
  for (std::size_t i = 0; i < e.num_workers; ++i) {
    const WorkerTallies& w = e.workers[i];
    s.workers.push_back({.worker_id = i,
                         .batches = w.batches.get(),
                         .samples = w.samples.get(),
                         .loading = seconds_of(w.loading.get()),
                         .collating = seconds_of(w.collating.get()),
                         .segment = seconds_of(w.segment.get()),
                         .waiting = seconds_of(w.waiting.get()),
                         .cpu = seconds_of(w.cpu.get()),
                         .net_bytes = w.net_bytes.get(),
                         .net_requests = w.net_requests.get(),
                         .net_retries = w.net_retries.get(),
                         .cache_hits = w.cache_hits.get(),
                         .cache_downloads = w.cache_downloads.get()});
  }
  const std::size_t peak = e.memory_peak.load(std::memory_order_relaxed);
  s.shared_memory_peak =
      e.closed.load(std::memory_order_relaxed) ? peak : std::max(peak, memory_->peak());
  derive(s);
  return s;
}

EpochStats StatsRecorder::epoch_stats(const Epoch& epoch) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return snapshot(epoch);
}

void StatsRecorder::fill(LoaderStats& out) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  EpochStats total = past_;
  LatencyHistogram waits;
  waits.merge(*past_waits_);
  for (const auto& e : epochs_) {
    EpochStats s = snapshot(*e);
    waits.merge(e->waits);
    add_epoch(total, s);
    total.epoch = s.epoch;
    total.finished = s.finished;
    out.epochs.push_back(std::move(s));
  }
  total.wait.p50 = waits.quantile(0.50);
  total.wait.p99 = waits.quantile(0.99);
  total.wait.max = seconds_of(waits.max_ns());
  derive(total);
  out.total = std::move(total);
}

bool workers_saturate(double cpu_seconds, double seconds, std::size_t worker_cores) noexcept {
  return seconds > 0 && worker_cores > 0 &&
         cpu_seconds >= 0.9 * seconds * static_cast<double>(worker_cores);
}

}  // namespace ferry::detail
