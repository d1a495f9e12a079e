#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <torch/types.h>

namespace ferry {

/// A batch of samples as named fields: tensors whose first dimension is the sample, and string
/// fields as lists. Copying a Batch shares its tensors (as copying a torch::Tensor does).
///
///   for (auto& batch : loader) {
///     torch::Tensor x = batch["image"];                      // [B, C, H, W]
///     const auto& paths = batch.strings("path");             // B strings
///     for (const std::string& name : batch) { ... }          // field names, in order
///   }
class Batch {
 public:
  using Value = std::variant<torch::Tensor, std::vector<std::string>>;

  Batch() = default;
  /// An empty batch of `size` samples; fields are added with `set`.
  explicit Batch(std::size_t size) : size_(size) {}

  /// Number of samples.
  std::size_t size() const noexcept { return size_; }

  /// The tensor field `name`. Throws `ferry::Error` if it is missing (listing the fields) or is a
  /// string field (pointing at `strings()`).
  const torch::Tensor& operator[](std::string_view name) const;
  /// The string field `name`, one string per sample.
  const std::vector<std::string>& strings(std::string_view name) const;
  bool contains(std::string_view name) const noexcept { return find(name) != nullptr; }
  bool is_tensor(std::string_view name) const;

  /// Adds or replaces a field (for user collate functions).
  Batch& set(std::string name, Value value);
  const Value* find(std::string_view name) const noexcept;

  /// Iteration over field names, in the order the samples declared them.
  auto begin() const noexcept { return names_.begin(); }
  auto end() const noexcept { return names_.end(); }
  std::size_t num_fields() const noexcept { return names_.size(); }
  const std::vector<std::string>& names() const noexcept { return names_; }

  /// The dataset index of each sample (empty for batches built by hand; the position in the
  /// worker's stream for iterable datasets).
  const std::vector<std::int64_t>& indices() const noexcept { return indices_; }
  void set_indices(std::vector<std::int64_t> indices) { indices_ = std::move(indices); }

  /// The epoch and the batch's position in it, set by the loader.
  std::uint64_t epoch() const noexcept { return epoch_; }
  std::size_t sequence() const noexcept { return sequence_; }
  void set_position(std::uint64_t epoch, std::size_t sequence) noexcept {
    epoch_ = epoch;
    sequence_ = sequence;
  }

  /// A batch whose tensors are on `device` (string fields unchanged).
  Batch to(const torch::Device& device, bool non_blocking = false) const;
  /// A batch whose CPU tensors live in page-locked memory. Needs a CUDA-enabled LibTorch.
  Batch pin_memory() const;

 private:
  std::size_t size_ = 0;
  std::vector<std::string> names_;
  std::vector<Value> values_;
  std::vector<std::int64_t> indices_;
  std::uint64_t epoch_ = 0;
  std::size_t sequence_ = 0;

  template <class F>
  Batch map_tensors(F&& f) const;
  std::string field_names() const;
};

}  // namespace ferry
