#include "loader/loader_state.h"

#include <algorithm>
#include <thread>
#include <typeinfo>

#include "ferry/error.h"

namespace ferry::detail {

EpochPlan::EpochPlan(BatchSampler& batch_sampler, std::uint64_t epoch) {
  if (typeid(batch_sampler) == typeid(BatchSampler)) {
    order_ = batch_sampler.sampler()->order(epoch);
    batch_size_ = batch_sampler.batch_size();
    const std::size_t n = order_->size();
    count_ = batch_sampler.drop_last() ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
  } else {
    lists_ = batch_sampler.batches(epoch);
    count_ = lists_.size();
  }
}

std::vector<std::int64_t> EpochPlan::batch(std::size_t k) const {
  FERRY_ASSERT(k < count_);
  if (!order_) return lists_[k];
  const std::size_t start = k * batch_size_;
  std::vector<std::int64_t> out(std::min(batch_size_, order_->size() - start));
  order_->read(start, out);
  return out;
}

EpochPlan plan_epoch(const LoaderState& state, std::uint64_t epoch) {
  if (const auto& own = state.own_sampler) {
    const std::size_t n = state.dataset->size();
    if (auto* random = dynamic_cast<RandomSampler*>(own.get())) {
      random->set_data_size(n);
    } else if (auto* sequential = dynamic_cast<SequentialSampler*>(own.get())) {
      sequential->set_data_size(n);
    }
  }
  return EpochPlan(*state.batch_sampler, epoch);
}

void LoaderState::record_skipped(std::uint64_t epoch,
                                 const std::vector<workers::SkippedSample>& skipped) const {
  if (skipped.empty()) return;
  if (tracer) {
    for (const auto& s : skipped) {
      tracer->instant("skipped",
                      detail::str("index ", s.index, ": ", s.type_name, ": ", s.message));
    }
  }
  const std::lock_guard<std::mutex> lock(stats_mutex);
  this->skipped += skipped.size();
  const std::size_t keep = options.skipped_history;
  for (const auto& s : skipped) {
    recent_skipped.push_back({epoch, s.index, detail::str(s.type_name, ": ", s.message)});
    if (keep > 0 && recent_skipped.size() > keep) recent_skipped.pop_front();
  }
}

bool LoaderState::Resume::skips(std::uint64_t sequence) const noexcept {
  return sequence < prefix || std::binary_search(beyond.begin(), beyond.end(), sequence);
}

ProgressTracker::ProgressTracker(std::shared_ptr<const LoaderState> state,
                                 std::uint64_t epoch,
                                 const std::optional<LoaderState::Resume>& resume)
    : state_(std::move(state)) {
  const std::lock_guard<std::mutex> lock(state_->progress_mutex);
  owner_ = state_->next_progress_owner++;
  LoaderState::Progress& p = state_->progress;
  p = {};
  p.owner = owner_;
  p.epoch = epoch;
  if (resume) {
    p.prefix = resume->prefix;
    p.beyond.insert(resume->beyond.begin(), resume->beyond.end());
    p.streams = resume->streams;
    p.next_worker = resume->next_worker;
  }
  if (state_->iterable) p.streams.resize(std::max<std::size_t>(1, state_->options.num_workers));
}

void ProgressTracker::stream_result(std::size_t worker,
                                    bool ended,
                                    std::optional<std::uint64_t> position,
                                    std::optional<std::string> cursor,
                                    std::size_t workers) {
  const std::lock_guard<std::mutex> lock(state_->progress_mutex);
  LoaderState::Progress& p = state_->progress;
  if (p.owner != owner_ || worker >= p.streams.size()) return;
  ++p.prefix;
  p.next_worker = workers > 0 ? (worker + 1) % workers : 0;
  LoaderState::StreamProgress& s = p.streams[worker];
  if (ended) s.ended = true;
  if (!position) return;
  s.position = *position;
  s.cursor = std::move(cursor);
}

void ProgressTracker::finish() {
  const std::lock_guard<std::mutex> lock(state_->progress_mutex);
  if (state_->progress.owner == owner_) state_->progress.finished = true;
}

ProgressTracker::~ProgressTracker() {
  const std::lock_guard<std::mutex> lock(state_->progress_mutex);
  if (state_->progress.owner == owner_) state_->progress.owner = 0;
}

void ProgressTracker::set_batches(std::size_t batches) {
  const std::lock_guard<std::mutex> lock(state_->progress_mutex);
  if (state_->progress.owner == owner_) state_->progress.batches = batches;
}

void ProgressTracker::consumed(std::uint64_t sequence) {
  const std::lock_guard<std::mutex> lock(state_->progress_mutex);
  LoaderState::Progress& p = state_->progress;
  if (p.owner != owner_ || sequence < p.prefix) return;
  if (sequence == p.prefix) {
    ++p.prefix;
    while (!p.beyond.empty() && *p.beyond.begin() == p.prefix) {
      p.beyond.erase(p.beyond.begin());
      ++p.prefix;
    }
  } else {
    p.beyond.insert(sequence);
  }
}

void throw_loader_closed(const char* when) {
  throw LoaderClosed(detail::str("DataLoader: the loader was destroyed or closed ", when,
                                 "; keep the loader alive for as long as you iterate it"));
}

bool spin_before_sleep(const DataLoaderOptions& options) noexcept {
  return options.num_workers < std::thread::hardware_concurrency();
}

Batch deliver(device::StagedBatch staged, const LoaderState& state) {
  state.delivered_batches.fetch_add(1, std::memory_order_relaxed);
  state.delivered_samples.fetch_add(staged.batch.size(), std::memory_order_relaxed);
  if (!state.stage) return std::move(staged.batch);
  return state.stage->finish(std::move(staged));
}

Batch deliver_empty(std::uint64_t epoch, std::uint64_t sequence, const LoaderState& state) {
  state.delivered_batches.fetch_add(1, std::memory_order_relaxed);
  Batch batch(0);
  batch.set_position(epoch, sequence);
  return batch;
}

Batch deliver(Batch host, const LoaderState& state) {
  if (!state.stage) return deliver(device::StagedBatch{std::move(host), nullptr}, state);
  // The calling thread's own memory is never page-locked: a pinned copy, then the device copy.
  return deliver(state.stage->start(std::move(host), /*page_locked=*/false), state);
}

}  // namespace ferry::detail
