#include "ferry/collate.h"

#include "collate/batch_layout.h"
#include "collate/buffer_pool.h"

namespace ferry {

namespace collate {

Batch collate_into(const std::vector<Example>& samples, BufferPool& pool) {
  const BatchLayout layout = plan_batch(samples);
  // One aligned block for every field of the batch; it goes back to `pool` (or is freed) when
  // the last tensor viewing it dies.
  const std::shared_ptr<void> buffer = pool.acquire(layout.total_bytes);
  auto* base = static_cast<std::byte*>(buffer.get());
  write_batch(samples, layout, base);
  return view_batch(layout, base, buffer, samples);
}

const ferry::detail::SampleOutputs* InPlaceCollator::expect(std::size_t num_samples) {
  expected_.reset();
  buffer_.reset();
  if (!last_ || num_samples == 0) return nullptr;
  if (skip_ > 0) {
    --skip_;
    return nullptr;
  }
  BatchLayout layout = resize_layout(*last_, num_samples);
  const std::size_t bytes = layout.total_bytes;
  buffer_ = pool_.acquire(bytes);
  expected_.emplace(std::move(layout), static_cast<std::byte*>(buffer_.get()), bytes);
  return &*expected_;
}

Batch InPlaceCollator::collate(const std::vector<Example>& samples) {
  BatchLayout layout = plan_batch(samples);
  // The expected buffer stays alive until the batch is written: samples may lie in it even when
  // the batch goes elsewhere.
  const std::shared_ptr<void> expected_buffer = std::move(buffer_);
  const bool in_place = expected_ && expected_->can_write(samples, layout);
  if (expected_ && !expected_->handed_out()) skip_ = kProbeEvery - 1;
  expected_.reset();
  const std::shared_ptr<void> buffer =
      in_place ? expected_buffer : pool_.acquire(layout.total_bytes);
  auto* base = static_cast<std::byte*>(buffer.get());
  write_batch(samples, layout, base);
  Batch batch = view_batch(layout, base, buffer, samples);
  last_ = std::move(layout);
  return batch;
}

}  // namespace collate

Batch default_collate(std::vector<Example> samples) {
  // Called on its own, there is no loader to hand buffers back to: a pool that keeps none.
  static const auto fresh = std::make_shared<collate::BufferPool>(/*keep_free=*/0);
  return collate::collate_into(samples, *fresh);
}

}  // namespace ferry
