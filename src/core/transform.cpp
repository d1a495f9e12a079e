#include "ferry/transform.h"

#include "ferry/error.h"

namespace ferry {

TransformList fuse_adjacent(const TransformList& transforms) {
  TransformList out;
  for (const auto& t : transforms) {
    FERRY_CHECK(t != nullptr, "a transform in the list is null");
    if (!out.empty()) {
      if (auto fused = out.back()->fuse(out.back(), t)) {
        out.back() = std::move(fused);
        continue;
      }
    }
    out.push_back(t);
  }
  return out;
}

std::shared_ptr<Dataset> apply_transforms(std::shared_ptr<const Dataset> dataset,
                                          const TransformList& transforms) {
  FERRY_CHECK(dataset != nullptr, "apply_transforms: the dataset is null");
  for (const auto& t : transforms)
    FERRY_CHECK(t != nullptr, "apply_transforms: a transform is null");
  if (auto own = dataset->with_transforms(transforms)) return own;
  return std::make_shared<TransformedDataset>(std::move(dataset), transforms);
}

TransformedDataset::TransformedDataset(std::shared_ptr<const Dataset> dataset,
                                       TransformList transforms)
    : dataset_(std::move(dataset)), transforms_(std::move(transforms)) {
  FERRY_CHECK(dataset_ != nullptr, "TransformedDataset: the dataset is null");
  for (const auto& t : transforms_)
    FERRY_CHECK(t != nullptr, "TransformedDataset: a transform is null");
  transforms_ = fuse_adjacent(transforms_);
}

Example TransformedDataset::get(std::size_t index, SampleContext& ctx) const {
  Example example = dataset_->get(index, ctx);
  for (const auto& t : transforms_) example = (*t)(std::move(example), ctx);
  return example;
}

TransformedIterableDataset::TransformedIterableDataset(
    std::shared_ptr<const IterableDataset> dataset, TransformList transforms)
    : dataset_(std::move(dataset)), transforms_(std::move(transforms)) {
  FERRY_CHECK(dataset_ != nullptr, "TransformedIterableDataset: the dataset is null");
  for (const auto& t : transforms_) {
    FERRY_CHECK(t != nullptr, "TransformedIterableDataset: a transform is null");
  }
  transforms_ = fuse_adjacent(transforms_);
}

std::unique_ptr<ExampleStream> TransformedIterableDataset::stream(SampleContext& ctx) const {
  struct Stream : ExampleStream {
    std::unique_ptr<ExampleStream> inner;
    const TransformList* transforms = nullptr;
    std::optional<Example> next(SampleContext& ctx) override {
      std::optional<Example> example = inner->next(ctx);
      if (!example) return example;
      for (const auto& t : *transforms) example = (*t)(std::move(*example), ctx);
      return example;
    }
    // Transforms draw from the sample's own context: the position is the inner stream's.
    std::optional<std::string> cursor() const override { return inner->cursor(); }
    void seek(const std::string& cursor) override { inner->seek(cursor); }
  };
  auto s = std::make_unique<Stream>();
  s->inner = dataset_->stream(ctx);
  s->transforms = &transforms_;
  return s;
}

void ExampleStream::seek(const std::string& cursor) {
  throw Error(detail::str("ExampleStream::seek('", cursor.substr(0, 60),
                          "'): this stream gives cursors but does not override seek(); override "
                          "both, or neither (the loader then replays the stream)"));
}

}  // namespace ferry
