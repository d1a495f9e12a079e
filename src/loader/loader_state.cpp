#include "loader/loader_state.h"

#include <typeinfo>

#include "ferry/error.h"

namespace ferry::detail {

EpochPlan::EpochPlan(BatchSampler& batch_sampler, std::uint64_t epoch) {
  if (typeid(batch_sampler) == typeid(BatchSampler)) {
    flat_ = batch_sampler.sampler()->indices(epoch);
    batch_size_ = batch_sampler.batch_size();
    count_ = batch_sampler.drop_last() ? flat_.size() / batch_size_
                                       : (flat_.size() + batch_size_ - 1) / batch_size_;
  } else {
    lists_ = batch_sampler.batches(epoch);
    count_ = lists_.size();
  }
}

std::span<const std::int64_t> EpochPlan::batch(std::size_t k) const {
  if (!lists_.empty() || flat_.empty()) return lists_.at(k);
  const std::size_t start = k * batch_size_;
  return std::span<const std::int64_t>(flat_).subspan(start,
                                                      std::min(batch_size_, flat_.size() - start));
}

void LoaderState::record_skipped(std::uint64_t epoch,
                                 const std::vector<workers::SkippedSample>& skipped) const {
  if (skipped.empty()) return;
  const std::lock_guard<std::mutex> lock(stats_mutex);
  stats.skipped += skipped.size();
  for (const auto& s : skipped) {
    stats.skipped_samples.push_back({epoch, s.index, detail::str(s.type_name, ": ", s.message)});
  }
}

Batch deliver(device::StagedBatch staged, const LoaderState& state) {
  state.delivered_batches.fetch_add(1, std::memory_order_relaxed);
  state.delivered_samples.fetch_add(staged.batch.size(), std::memory_order_relaxed);
  if (!state.stage) return std::move(staged.batch);
  return state.stage->finish(std::move(staged));
}

Batch deliver(Batch host, const LoaderState& state) {
  if (!state.stage) return deliver(device::StagedBatch{std::move(host), nullptr}, state);
  // The calling thread's own memory is never page-locked: a pinned copy, then the device copy.
  return deliver(state.stage->start(std::move(host), /*page_locked=*/false), state);
}

}  // namespace ferry::detail
