#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "ferry/batch.h"
#include "ferry/example.h"

namespace ferry::collate {

// Offsets of batch fields are aligned to this many bytes (a cache line; AVX-512 friendly).
inline constexpr std::size_t kFieldAlignment = 64;

enum class FieldKind { kTensor, kInt, kDouble, kString };

struct FieldLayout {
  std::string name;
  FieldKind kind = FieldKind::kTensor;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<std::int64_t> sizes;  // batched: [B, sample sizes...]
  std::size_t sample_bytes = 0;     // bytes of one sample's part
  std::size_t offset = 0;           // from the start of the batch's memory
  std::size_t nbytes = 0;           // B * sample_bytes (0 for strings)
};

// Where every field of a batch goes in ONE block of memory. Planned from the samples alone, so
// a worker can size a shared-memory segment before writing anything.
struct BatchLayout {
  std::size_t num_samples = 0;
  std::vector<FieldLayout> fields;
  std::size_t total_bytes = 0;
};

// Checks that the samples agree (same fields, kinds, shapes, dtypes) and plans their layout.
// Throws ferry::CollateError naming the field, the samples' dataset indices and what differs.
BatchLayout plan_batch(const std::vector<Example>& samples);

// Writes every sample's numeric fields into `base` (layout.total_bytes bytes) exactly once.
void write_batch(const std::vector<Example>& samples, const BatchLayout& layout, std::byte* base);

// The same for a batch a user collate_fn built: its tensors are laid out contiguously in one
// block, its string fields carried along. Throws ferry::CollateError for an undefined tensor.
BatchLayout plan_batch(const Batch& batch);
void write_batch(const Batch& batch, const BatchLayout& layout, std::byte* base);

class BufferPool;

// The default collate: plans the samples, writes them into one buffer from `pool`, and views it.
Batch collate_into(const std::vector<Example>& samples, BufferPool& pool);

// A Batch whose tensors view `base`; each keeps `owner` alive, so the memory lives as long as
// the last tensor that points into it. String fields are taken from `samples`.
Batch view_batch(const BatchLayout& layout,
                 std::byte* base,
                 const std::shared_ptr<void>& owner,
                 const std::vector<Example>& samples);

}  // namespace ferry::collate
