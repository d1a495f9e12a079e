#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "ferry/batch.h"
#include "ferry/example.h"
#include "ferry/sample_context.h"

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

// The layout of a batch with the same fields as `layout`'s but `num_samples` samples.
BatchLayout resize_layout(const BatchLayout& layout, std::size_t num_samples);

// True when both place every field at the same offset, with the same kind, shape and dtype.
bool same_layout(const BatchLayout& a, const BatchLayout& b) noexcept;

// Writes every sample's numeric fields into `base` (layout.total_bytes bytes) exactly once. A
// contiguous tensor that already lies at its place (SampleContext::output) is not copied.
void write_batch(const std::vector<Example>& samples, const BatchLayout& layout, std::byte* base);

// The same for a batch a user collate_fn built: its tensors are laid out contiguously in one
// block, its string fields carried along. Throws ferry::CollateError for an undefined tensor.
BatchLayout plan_batch(const Batch& batch);
void write_batch(const Batch& batch, const BatchLayout& layout, std::byte* base);

// The batch a loader expects to assemble next, in `size` bytes at `base` (a shared-memory
// segment taken before its samples load), laid out as `layout` (the previous batch's, resized).
// Samples ask it for their tensors' memory through SampleContext::output.
class ExpectedBatch final : public ferry::detail::SampleOutputs {
 public:
  ExpectedBatch(BatchLayout layout, std::byte* base, std::size_t size)
      : layout_(std::move(layout)), base_(base), size_(size) {}

  void* find(std::size_t position,
             std::string_view field,
             c10::IntArrayRef sizes,
             c10::ScalarType dtype) const noexcept override;

  // Whether `samples`, planned as `actual`, may be written into this memory. Yes when no tensor
  // of theirs lies in it and it is large enough, or when `actual` is the expected layout and
  // every tensor that lies in it lies exactly at its own place, contiguous. No otherwise: the
  // batch's shape changed (a skipped sample, a different size) or a tensor was moved, viewed
  // differently or shared, and writing here could overwrite a sample before it is read. Then
  // the batch goes to other memory and this memory is only read.
  bool can_write(const std::vector<Example>& samples, const BatchLayout& actual) const;

  // Whether find() gave any sample memory here (samples of this dataset build their tensors in
  // place).
  bool handed_out() const noexcept { return handed_out_.load(std::memory_order_relaxed); }

 private:
  BatchLayout layout_;
  std::byte* base_;
  std::size_t size_;
  mutable std::atomic<bool> handed_out_{false};  // find() may run on several threads
};

class BufferPool;

// The default collate: plans the samples, writes them into one buffer from `pool`, and views it.
Batch collate_into(const std::vector<Example>& samples, BufferPool& pool);

// The default collate in the calling thread (num_workers = 0), as a worker does it with its
// segments: before a batch's samples load, expect() takes a buffer from `pool` laid out as the
// previous batch was, so that samples build their tensors in it (SampleContext::output); then
// collate() writes what is not in place yet, into that buffer when it may (ExpectedBatch::
// can_write), else into another, and views it.
class InPlaceCollator {
 public:
  explicit InPlaceCollator(BufferPool& pool) : pool_(pool) {}
  // Where the next batch's `num_samples` samples may build their tensors; null before the first
  // batch (no layout to expect yet).
  const ferry::detail::SampleOutputs* expect(std::size_t num_samples);
  Batch collate(const std::vector<Example>& samples);

 private:
  // A dataset whose samples took no memory from the expected buffer (they never call
  // SampleContext::output) gains nothing from it and pays for taking it early: expect() then
  // skips the next kProbeEvery - 1 batches, and tries again after.
  static constexpr std::size_t kProbeEvery = 64;
  BufferPool& pool_;
  std::optional<BatchLayout> last_;
  std::size_t skip_ = 0;
  std::shared_ptr<void> buffer_;  // expect()'s buffer, until collate() takes or drops it
  std::optional<ExpectedBatch> expected_;
};

// A Batch whose tensors view `base`; each keeps `owner` alive, so the memory lives as long as
// the last tensor that points into it. String fields are taken from `samples`.
Batch view_batch(const BatchLayout& layout,
                 std::byte* base,
                 const std::shared_ptr<void>& owner,
                 const std::vector<Example>& samples);

}  // namespace ferry::collate
