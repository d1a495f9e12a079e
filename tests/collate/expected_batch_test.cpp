// Samples built in place: a batch's memory handed out before its samples load
// (SampleContext::output), and the check that decides whether that memory may then be written.

#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/collate.h"
#include "ferry/sample_context.h"

#include "collate/batch_layout.h"

namespace ferry {
namespace {

using collate::BatchLayout;
using collate::ExpectedBatch;

// Sample i: "x" a [2, 3] float tensor of i*100 + k, "label" i.
Example sample(std::int64_t i, torch::Tensor x) {
  x.copy_(torch::arange(6, torch::kFloat32).view({2, 3}) + 100.0f * static_cast<float>(i));
  Example ex{{"x", std::move(x)}, {"label", i}};
  ex.set_index(i);
  return ex;
}

std::vector<Example> fresh_samples(std::size_t n) {
  std::vector<Example> out;
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back(sample(static_cast<std::int64_t>(i), torch::empty({2, 3})));
  }
  return out;
}

// A batch's memory, laid out for `n` samples like fresh_samples(n).
struct Memory {
  explicit Memory(std::size_t n, std::size_t extra = 0)
      : layout(collate::plan_batch(fresh_samples(n))),
        bytes(layout.total_bytes + extra),
        batch(layout, bytes.data(), bytes.size()) {}
  // Sample i built through a context that the loader pointed at this memory.
  Example in_place(std::int64_t i, std::size_t position) {
    SampleContext ctx(1, 0, i);
    ctx.set_outputs(&batch, position);
    return sample(i, ctx.output("x", {2, 3}, torch::kFloat32));
  }
  const std::byte* slot(std::size_t position) const {
    return bytes.data() + layout.fields[0].offset + position * layout.fields[0].sample_bytes;
  }
  BatchLayout layout;
  std::vector<std::byte> bytes;
  ExpectedBatch batch;
};

TEST(ExpectedBatch, ResizingALayoutPlansWhatTheSmallerBatchWouldHave) {
  const BatchLayout eight = collate::plan_batch(fresh_samples(8));
  const BatchLayout three = collate::plan_batch(fresh_samples(3));
  EXPECT_FALSE(collate::same_layout(eight, three));
  EXPECT_TRUE(collate::same_layout(collate::resize_layout(eight, 3), three));
  EXPECT_TRUE(collate::same_layout(collate::resize_layout(three, 8), eight));
}

TEST(ExpectedBatch, OutputLiesInTheBatchOnlyForTheExpectedFieldShapeAndDtype) {
  Memory m(4);
  SampleContext ctx(1, 0, 7);
  ctx.set_outputs(&m.batch, 2);
  EXPECT_EQ(ctx.output("x", {2, 3}, torch::kFloat32).data_ptr(), m.slot(2));
  // Anything else is fresh memory, outside the batch.
  for (const auto& t :
       {ctx.output("x", {3, 2}, torch::kFloat32), ctx.output("x", {6}, torch::kFloat32),
        ctx.output("x", {2, 3}, torch::kFloat64), ctx.output("y", {2, 3}, torch::kFloat32),
        ctx.output("label", {}, torch::kInt64)}) {
    const auto* p = static_cast<const std::byte*>(t.data_ptr());
    EXPECT_TRUE(p < m.bytes.data() || p >= m.bytes.data() + m.bytes.size());
  }
  ctx.set_outputs(&m.batch, 4);  // past the expected batch
  EXPECT_NE(ctx.output("x", {2, 3}, torch::kFloat32).data_ptr(), m.slot(4));
  SampleContext plain(1, 0, 7);  // no loader: always fresh
  EXPECT_EQ(plain.output("x", {2, 3}, torch::kFloat32).sizes(), (c10::IntArrayRef{2, 3}));
}

TEST(ExpectedBatch, SamplesInPlaceAreWrittenThereWithoutBeingCopied) {
  Memory m(4);
  std::vector<Example> samples;
  for (std::size_t i = 0; i < 4; ++i) samples.push_back(m.in_place(static_cast<int>(i) + 10, i));
  const BatchLayout actual = collate::plan_batch(samples);
  ASSERT_TRUE(m.batch.can_write(samples, actual));
  collate::write_batch(samples, actual, m.bytes.data());
  const Batch batch = collate::view_batch(actual, m.bytes.data(), nullptr, samples);
  const Batch expected = default_collate(fresh_samples(4));
  EXPECT_TRUE(batch["x"].equal(expected["x"] + 1000.0f));
  EXPECT_TRUE(batch["label"].equal(expected["label"] + 10));
}

TEST(ExpectedBatch, MemoryNoSampleLiesInIsWritableWhenLargeEnough) {
  Memory m(4);
  EXPECT_TRUE(m.batch.can_write(fresh_samples(4), collate::plan_batch(fresh_samples(4))));
  EXPECT_TRUE(m.batch.can_write(fresh_samples(2), collate::plan_batch(fresh_samples(2))));
  EXPECT_FALSE(m.batch.can_write(fresh_samples(8), collate::plan_batch(fresh_samples(8))));
}

TEST(ExpectedBatch, ABatchWhoseShapeChangedIsNeverWrittenOverItsOwnSamples) {
  Memory m(4, 4096);  // room to spare: size is not the reason
  // A sample was skipped: three samples at positions 0, 1 and 3 would move.
  std::vector<Example> skipped{m.in_place(0, 0), m.in_place(1, 1), m.in_place(3, 3)};
  EXPECT_FALSE(m.batch.can_write(skipped, collate::plan_batch(skipped)));
  // Two samples of a batch swapped places.
  std::vector<Example> swapped{m.in_place(0, 1), m.in_place(1, 0), m.in_place(2, 2),
                               m.in_place(3, 3)};
  EXPECT_FALSE(m.batch.can_write(swapped, collate::plan_batch(swapped)));
}

TEST(ExpectedBatch, ATensorViewedDifferentlyOrSharedIsNeverWrittenOver) {
  Memory m(4);
  std::vector<Example> samples;
  for (std::size_t i = 0; i < 4; ++i) samples.push_back(m.in_place(static_cast<int>(i), i));
  ASSERT_TRUE(m.batch.can_write(samples, collate::plan_batch(samples)));

  // Sample 1 returns its memory read column-major: same shape, same place, not contiguous.
  std::vector<Example> strided = samples;
  strided[1].set("x", strided[1]["x"].tensor().as_strided({2, 3}, {1, 2}));
  EXPECT_FALSE(m.batch.can_write(strided, collate::plan_batch(strided)));
  std::vector<Example> transposed = samples;
  transposed[1].set("x", transposed[1]["x"].tensor().t().contiguous().view({2, 3}));
  EXPECT_TRUE(m.batch.can_write(transposed, collate::plan_batch(transposed)))
      << "a copy elsewhere is only read";
  // Sample 2 returns sample 3's place (a dataset that caches, or shares one tensor).
  std::vector<Example> shared = samples;
  shared[2].set("x", shared[3]["x"].tensor());
  EXPECT_FALSE(m.batch.can_write(shared, collate::plan_batch(shared)));
  // Every sample returns part of its place: the shape changed.
  std::vector<Example> part = samples;
  for (Example& s : part) s.set("x", s["x"].tensor().view({6}).narrow(0, 1, 5));
  EXPECT_FALSE(m.batch.can_write(part, collate::plan_batch(part)));
}

}  // namespace
}  // namespace ferry
