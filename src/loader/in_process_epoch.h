#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "collate/batch_layout.h"
#include "loader/epoch_iterator.h"
#include "loader/loader_state.h"
#include "workers/fetch.h"

namespace ferry::detail {

// num_workers = 0 over a map-style dataset: load each batch in the calling thread.
class InProcessMapEpoch final : public EpochIterator {
 public:
  InProcessMapEpoch(std::shared_ptr<const LoaderState> state,
                    std::uint64_t epoch,
                    std::optional<LoaderState::Resume> resume = std::nullopt);
  std::optional<Batch> next() override;

 private:
  std::shared_ptr<const LoaderState> state_;
  std::optional<LoaderState::Resume> resume_;
  ProgressTracker progress_;
  std::uint64_t epoch_;
  EpochPlan plan_;
  std::size_t size_;
  workers::FetchOptions fetch_options_;
  collate::InPlaceCollator in_place_;  // the default collate's buffers, taken before loading
  std::size_t position_ = 0;
  // Dataset::prefetch: batches before this one were hinted; false once the dataset declines.
  void hint(std::size_t sequence);
  std::size_t hinted_ = 0;
  bool hints_ = true;
};

// num_workers = 0 over an iterable dataset: one stream, read in the calling thread.
class InProcessStreamEpoch final : public EpochIterator {
 public:
  InProcessStreamEpoch(std::shared_ptr<const LoaderState> state,
                       std::uint64_t epoch,
                       std::optional<LoaderState::Resume> resume = std::nullopt);
  std::optional<Batch> next() override;

 private:
  std::shared_ptr<const LoaderState> state_;
  ProgressTracker progress_;
  workers::StreamReader reader_;
  std::size_t sequence_ = 0;
  bool ended_ = false;
};

}  // namespace ferry::detail
