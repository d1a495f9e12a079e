#pragma once

#include <memory>
#include <vector>

#include "ferry/dataset.h"

namespace ferry {

/// One step applied to each sample after the dataset loads it (torchvision's transforms). Runs
/// in the worker that loads the sample; randomness comes from `ctx.generator()`, so the result
/// depends on (seed, epoch, index) only. `const` and thread-safe, as `Dataset::get`.
class Transform : public detail::Registered {
 public:
  virtual ~Transform() = default;
  virtual Example operator()(Example example, SampleContext& ctx) const = 0;
  /// One transform doing the work of `self` (this object) followed by `next`, or null to run
  /// them one after the other. Datasets call it on adjacent pairs when they are built, so that,
  /// for example, image transforms keep their working image between steps.
  virtual std::shared_ptr<const Transform> fuse(
      [[maybe_unused]] const std::shared_ptr<const Transform>& self,
      [[maybe_unused]] const std::shared_ptr<const Transform>& next) const {
    return nullptr;
  }
};

using TransformList = std::vector<std::shared_ptr<const Transform>>;

/// `transforms` with adjacent pairs fused where they allow it (see Transform::fuse).
TransformList fuse_adjacent(const TransformList& transforms);

/// `dataset` with `transforms` applied to each sample: the dataset itself when it can take them
/// over (Dataset::with_transforms; an image dataset decodes straight into the first crop), else a
/// TransformedDataset.
std::shared_ptr<Dataset> apply_transforms(std::shared_ptr<const Dataset> dataset,
                                          const TransformList& transforms);

/// A map-style dataset whose samples pass through `transforms` in order.
class TransformedDataset : public Dataset {
 public:
  TransformedDataset(std::shared_ptr<const Dataset> dataset, TransformList transforms);
  std::size_t size() const override { return dataset_->size(); }
  Example get(std::size_t index, SampleContext& ctx) const override;
  bool prefetch(std::span<const std::size_t> indices) const override {
    return dataset_->prefetch(indices);
  }
  const Dataset& base() const noexcept { return *dataset_; }

 private:
  std::shared_ptr<const Dataset> dataset_;
  TransformList transforms_;
};

/// An iterable dataset whose samples pass through `transforms` in order.
class TransformedIterableDataset : public IterableDataset {
 public:
  TransformedIterableDataset(std::shared_ptr<const IterableDataset> dataset,
                             TransformList transforms);
  std::unique_ptr<ExampleStream> stream(SampleContext& ctx) const override;
  std::optional<std::size_t> size_hint() const override { return dataset_->size_hint(); }

 private:
  std::shared_ptr<const IterableDataset> dataset_;
  TransformList transforms_;
};

}  // namespace ferry
