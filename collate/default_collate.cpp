#include <cstdlib>
#include <new>

#include "ferry/collate.h"

#include "collate/batch_layout.h"

namespace ferry {

Batch default_collate(std::vector<Example> samples) {
  const collate::BatchLayout layout = collate::plan_batch(samples);
  // One aligned block for every field of the batch; freed when the last tensor viewing it dies.
  const std::size_t bytes = std::max<std::size_t>(layout.total_bytes, collate::kFieldAlignment);
  void* memory = std::aligned_alloc(collate::kFieldAlignment, bytes);
  if (memory == nullptr) throw std::bad_alloc();
  std::shared_ptr<void> owner(memory, [](void* p) { std::free(p); });
  auto* base = static_cast<std::byte*>(memory);
  collate::write_batch(samples, layout, base);
  return collate::view_batch(layout, base, owner, samples);
}

}  // namespace ferry
