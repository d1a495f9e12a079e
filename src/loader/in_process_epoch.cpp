#include "loader/in_process_epoch.h"

#include "ferry/error.h"

namespace ferry::detail {

namespace {

void check_open(const LoaderState& state) {
  if (state.closed) throw_loader_closed("while this iterator was in use");
}

}  // namespace

InProcessMapEpoch::InProcessMapEpoch(std::shared_ptr<const LoaderState> state,
                                     std::uint64_t epoch,
                                     std::optional<LoaderState::Resume> resume)
    : state_(std::move(state)),
      resume_(std::move(resume)),
      progress_(state_, epoch, resume_),
      epoch_(epoch),
      plan_(plan_epoch(*state_, epoch)),
      size_(state_->dataset->size()),
      in_place_(*state_->buffers) {
  progress_.set_batches(plan_.size());
  fetch_options_.threads = state_->options.worker_threads;
  fetch_options_.skip_errors = state_->options.on_error == OnError::kSkip;
}

void InProcessMapEpoch::hint(std::size_t sequence) {
  if (!hints_ || sequence < hinted_ || sequence >= plan_.size()) return;
  hinted_ = sequence + 1;
  std::vector<std::size_t> wanted;
  for (const std::int64_t i : plan_.batch(sequence)) {
    if (i >= 0) wanted.push_back(static_cast<std::size_t>(i));
  }
  try {
    hints_ = state_->dataset->prefetch(wanted);
  } catch (...) {
    // Dropped: the samples load when their turn comes, and say then what is wrong.
  }
}

std::optional<Batch> InProcessMapEpoch::next() {
  for (;;) {
    check_open(*state_);
    while (resume_ && position_ < plan_.size() && resume_->skips(position_)) ++position_;
    if (position_ >= plan_.size()) {
      progress_.finish();
      return std::nullopt;
    }
    const std::size_t sequence = position_++;  // past this batch even if it fails
    progress_.consumed(sequence);              // the loop gets it, or its error
    const workers::WorkerIdentity who{0, 1, *state_->options.seed};
    const auto indices = plan_.batch(sequence);
    hint(sequence);  // this batch's samples, if not yet told, and the next one's to load
    std::size_t next = sequence + 1;
    while (resume_ && next < plan_.size() && resume_->skips(next)) ++next;
    hint(next);
    // With the default collate, samples build their tensors straight in the batch's buffer (laid
    // out as the previous batch was), as they do in a worker's segment.
    fetch_options_.outputs = state_->collate_fn ? nullptr : in_place_.expect(indices.size());
    workers::FetchedBatch fetched = workers::fetch_batch(*state_->dataset, size_, indices, epoch_,
                                                         who, fetch_options_, nullptr);
    fetch_options_.outputs = nullptr;
    state_->record_skipped(epoch_, fetched.skipped);
    if (fetched.samples.empty()) {  // every sample was skipped (see MultiProcessEpoch)
      if (state_->keep_empty_batches) return deliver_empty(epoch_, sequence, *state_);
      continue;
    }
    return deliver(workers::collate_samples(std::move(fetched.samples), state_->collate_fn,
                                            *state_->buffers, epoch_, sequence, &in_place_),
                   *state_);
  }
}

InProcessStreamEpoch::InProcessStreamEpoch(std::shared_ptr<const LoaderState> state,
                                           std::uint64_t epoch,
                                           std::optional<LoaderState::Resume> resume)
    : state_(std::move(state)),
      progress_(state_, epoch, resume),
      reader_(*state_->iterable, epoch, workers::WorkerIdentity{0, 1, *state_->options.seed}) {
  if (resume && !resume->streams.empty()) {
    const LoaderState::StreamProgress& at = resume->streams.front();
    sequence_ = resume->prefix;
    ended_ = at.ended;
    if (!ended_ && (at.position > 0 || at.cursor)) reader_.resume(at.position, at.cursor);
  }
}

std::optional<Batch> InProcessStreamEpoch::next() {
  check_open(*state_);
  std::vector<Example> samples;
  if (!ended_) samples = reader_.next_batch(state_->options.batch_size, state_->options.drop_last);
  if (samples.empty()) {
    ended_ = true;
    progress_.finish();
    return std::nullopt;
  }
  const auto position = static_cast<std::uint64_t>(samples.back().index()) + 1;
  progress_.stream_result(0, false, position, reader_.cursor(), 1);
  return deliver(workers::collate_samples(std::move(samples), state_->collate_fn, *state_->buffers,
                                          reader_.epoch(), sequence_++),
                 *state_);
}

}  // namespace ferry::detail
