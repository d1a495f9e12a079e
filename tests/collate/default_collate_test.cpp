#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/collate.h"
#include "ferry/error.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

Example sample(std::int64_t index, torch::Tensor image, std::int64_t label = 0) {
  Example ex{{"image", std::move(image)},
             {"label", label},
             {"score", 0.5 * static_cast<double>(index)},
             {"path", "img" + std::to_string(index) + ".jpg"}};
  ex.set_index(index);
  return ex;
}

TEST(DefaultCollate, StacksTensorsAndTurnsNumbersAndStringsIntoBatches) {
  std::vector<Example> samples;
  for (std::int64_t i = 0; i < 3; ++i) {
    samples.push_back(sample(10 + i, torch::full({2, 2}, static_cast<float>(i)), i * 2));
  }
  const Batch b = default_collate(samples);
  EXPECT_EQ(b.size(), 3u);
  EXPECT_EQ(b["image"].sizes(), (std::vector<std::int64_t>{3, 2, 2}));
  EXPECT_EQ(b["image"].scalar_type(), torch::kFloat);
  EXPECT_TRUE(b["image"].equal(torch::stack(
      {torch::full({2, 2}, 0.f), torch::full({2, 2}, 1.f), torch::full({2, 2}, 2.f)})));
  EXPECT_EQ(b["label"].scalar_type(), torch::kLong);
  EXPECT_TRUE(b["label"].equal(torch::tensor({0, 2, 4}, torch::kLong)));
  EXPECT_EQ(b["score"].scalar_type(), torch::kDouble);  // as PyTorch: Python floats -> float64
  EXPECT_TRUE(b["score"].equal(torch::tensor({5.0, 5.5, 6.0}, torch::kDouble)));
  EXPECT_EQ(b.strings("path"), (std::vector<std::string>{"img10.jpg", "img11.jpg", "img12.jpg"}));
  EXPECT_EQ(b.indices(), (std::vector<std::int64_t>{10, 11, 12}));
}

TEST(DefaultCollate, KeepsEveryDtypeAndScalarTensors) {
  for (auto dtype :
       {torch::kUInt8, torch::kInt16, torch::kInt32, torch::kFloat64, torch::kBool, torch::kHalf}) {
    std::vector<Example> samples;
    for (int i = 0; i < 4; ++i) {
      Example ex{{"x", torch::ones({5}, dtype)}, {"s", torch::scalar_tensor(i, dtype)}};
      samples.push_back(std::move(ex));
    }
    const Batch b = default_collate(samples);
    EXPECT_EQ(b["x"].scalar_type(), dtype);
    EXPECT_EQ(b["x"].sizes(), (std::vector<std::int64_t>{4, 5}));
    EXPECT_EQ(b["s"].sizes(), (std::vector<std::int64_t>{4}));
    EXPECT_TRUE(b["x"].equal(torch::ones({4, 5}, dtype)));
  }
}

TEST(DefaultCollate, CopiesNonContiguousSamplesCorrectly) {
  const auto base = torch::arange(12, torch::kFloat).view({3, 4});
  std::vector<Example> samples{Example{{"x", base.t()}}, Example{{"x", base.t() + 100}}};
  const Batch b = default_collate(samples);
  EXPECT_TRUE(b["x"].equal(torch::stack({base.t(), base.t() + 100})));
  EXPECT_TRUE(b["x"].is_contiguous());
}

TEST(DefaultCollate, BatchOutlivesItsSamplesAndFieldsOutliveTheBatch) {
  torch::Tensor labels;
  {
    std::vector<Example> samples;
    for (int i = 0; i < 64; ++i) samples.push_back(sample(i, torch::rand({3, 8, 8}), i));
    Batch b = default_collate(std::move(samples));
    labels = b["label"];
  }
  EXPECT_TRUE(labels.equal(torch::arange(64, torch::kLong)));
}

TEST(DefaultCollate, ShapeMismatchNamesFieldIndicesAndShapes) {
  std::vector<Example> samples{sample(4, torch::zeros({3, 224, 224})),
                               sample(9, torch::zeros({3, 200, 224}))};
  EXPECT_THAT([&] { default_collate(samples); },
              ThrowsMessage<CollateError>(
                  AllOf(HasSubstr("field 'image'"), HasSubstr("[3, 200, 224] Float in sample 9"),
                        HasSubstr("[3, 224, 224] Float in sample 4"), HasSubstr("pads"))));
}

TEST(DefaultCollate, DtypeMismatchNamesBothDtypes) {
  std::vector<Example> samples{sample(0, torch::zeros({2})),
                               sample(1, torch::zeros({2}, torch::kDouble))};
  EXPECT_THAT([&] { default_collate(samples); },
              ThrowsMessage<CollateError>(
                  AllOf(HasSubstr("[2] Double in sample 1"), HasSubstr("[2] Float in sample 0"))));
}

TEST(DefaultCollate, MissingOrExtraFieldsAndKindMismatches) {
  Example a{{"x", 1}, {"y", 2}};
  a.set_index(3);
  Example b{{"x", 1}};
  b.set_index(8);
  EXPECT_THAT(
      [&] {
        default_collate({a, b});
      },
      ThrowsMessage<CollateError>(HasSubstr("field 'y' is in sample 3 but missing from sample 8")));
  EXPECT_THAT(
      [&] {
        default_collate({b, a});
      },
      ThrowsMessage<CollateError>(HasSubstr("field 'y' is in sample 3 but not in sample 8")));
  Example c{{"x", "text"}};
  c.set_index(5);
  EXPECT_THAT(
      [&] {
        default_collate({b, c});
      },
      ThrowsMessage<CollateError>(HasSubstr("'x' is a int in sample 8 but a string in sample 5")));
  EXPECT_THAT([&] { default_collate({}); }, ThrowsMessage<CollateError>(HasSubstr("at least one")));
}

}  // namespace
}  // namespace ferry
