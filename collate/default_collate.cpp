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

}  // namespace collate

Batch default_collate(std::vector<Example> samples) {
  // Called on its own, there is no loader to hand buffers back to: a pool that keeps none.
  static const auto fresh = std::make_shared<collate::BufferPool>(/*keep_free=*/0);
  return collate::collate_into(samples, *fresh);
}

}  // namespace ferry
