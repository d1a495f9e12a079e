// Device transforms (ferry/device_transforms.h): torchvision's semantics on whole batches, their
// errors, and a loader that runs them, in process and with workers. On the CPU here; the GPU
// suite (gpu_test.cpp) runs the same on a CUDA device.

#include "ferry/device_transforms.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/data_loader.h"
#include "ferry/error.h"

namespace ferry {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

const std::vector<double> kMean{0.485, 0.456, 0.406};
const std::vector<double> kStd{0.229, 0.224, 0.225};

torch::Tensor image_u8(std::size_t index) {
  return torch::arange(3 * 4 * 5, torch::kInt64)
      .add(static_cast<std::int64_t>(index) * 7)
      .remainder(256)
      .to(torch::kUInt8)
      .reshape({3, 4, 5});
}

// What torchvision's CPU pipeline computes (ToTensor: x / 255 in float32, then Normalize).
torch::Tensor reference(const torch::Tensor& u8) {
  const auto f = u8.to(torch::kFloat).div(255);
  const auto m = torch::tensor(kMean, torch::kDouble).to(torch::kFloat).reshape({-1, 1, 1});
  const auto s = torch::tensor(kStd, torch::kDouble).to(torch::kFloat).reshape({-1, 1, 1});
  return f.sub(m).div(s);
}

class Uint8Images : public Dataset {
 public:
  std::size_t size() const override { return 10; }
  Example get(std::size_t index, SampleContext&) const override {
    return {{"image", image_u8(index)}, {"label", static_cast<std::int64_t>(index % 3)}};
  }
};

BatchTransforms imagenet_steps() {
  return {std::make_shared<device_transforms::ToDtype>(),
          std::make_shared<device_transforms::Normalize>(kMean, kStd)};
}

TEST(DeviceTransforms, ToDtypeScalesIntegersAsToTensorAndLeavesOtherFields) {
  Batch b(2);
  b.set("image", torch::tensor({0, 51, 255}, torch::kUInt8));
  b.set("label", torch::tensor({1, 2}));
  device_transforms::ToDtype().apply(b);
  EXPECT_EQ(b["image"].scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(b["image"], torch::tensor({0.0f, 0.2f, 1.0f})));
  EXPECT_EQ(b["label"].scalar_type(), torch::kLong);

  Batch unscaled(1);
  unscaled.set("image", torch::tensor({3, 255}, torch::kUInt8));
  device_transforms::ToDtype(torch::kDouble, /*scale=*/false).apply(unscaled);
  EXPECT_TRUE(torch::equal(unscaled["image"], torch::tensor({3.0, 255.0}, torch::kDouble)));
}

TEST(DeviceTransforms, NormalizeMatchesTorchvisionPerChannel) {
  Batch b(2);
  const auto u8 = torch::stack({image_u8(0), image_u8(1)});
  b.set("image", u8);
  for (const auto& step : imagenet_steps()) step->apply(b);
  const auto expected = torch::stack({reference(image_u8(0)), reference(image_u8(1))});
  EXPECT_TRUE(torch::allclose(b["image"], expected, /*rtol=*/0, /*atol=*/1e-6))
      << (b["image"] - expected).abs().max().item<float>();
}

TEST(DeviceTransforms, ErrorsNameTheFieldAndTheFix) {
  Batch b(1);
  b.set("image", torch::zeros({1, 3, 2, 2}, torch::kUInt8));
  device_transforms::Normalize norm(kMean, kStd);
  EXPECT_THAT([&] { norm.apply(b); },
              ThrowsMessage<Error>(AllOf(HasSubstr("'image'"), HasSubstr("to_dtype"))));
  b.set("image", torch::zeros({1, 4, 2, 2}));
  EXPECT_THAT([&] { norm.apply(b); },
              ThrowsMessage<Error>(AllOf(HasSubstr("[1, 4, 2, 2]"), HasSubstr("3 channels"))));
  EXPECT_THAT([&] { device_transforms::ToDtype(torch::kFloat, true, {"pixels"}).apply(b); },
              ThrowsMessage<Error>(HasSubstr("no field 'pixels'")));
  EXPECT_THAT([&] { device_transforms::ToDtype(torch::kUInt8, true).apply(b); },
              ThrowsMessage<Error>(HasSubstr("set scale=false")));
  EXPECT_THAT([] { device_transforms::Normalize({0.5}, {0.0}); },
              ThrowsMessage<Error>(HasSubstr("divide by zero")));
  EXPECT_THAT(
      [] {
        device_transforms::Normalize({0.5, 0.5}, {0.2});
      },
      ThrowsMessage<Error>(HasSubstr("one of each per channel")));
  EXPECT_THAT([] { DataLoader(std::make_shared<Uint8Images>(), {.device_transforms = {nullptr}}); },
              ThrowsMessage<ConfigError>(HasSubstr("a transform is null")));
}

// uint8 through the loader (in process, and through workers' shared memory), converted and
// normalised after delivery: equal to the CPU pipeline within float rounding.
TEST(DeviceTransforms, ALoaderRunsThemOnEveryBatchWithAndWithoutWorkers) {
  for (const std::size_t workers : {0, 2}) {
    DataLoader loader(
        std::make_shared<Uint8Images>(),
        {.batch_size = 4, .num_workers = workers, .device_transforms = imagenet_steps()});
    std::size_t samples = 0;
    for (auto& batch : loader) {
      ASSERT_EQ(batch["image"].scalar_type(), torch::kFloat);
      for (std::size_t i = 0; i < batch.size(); ++i) {
        const auto index = static_cast<std::size_t>(batch.indices()[i]);
        EXPECT_TRUE(torch::allclose(batch["image"][static_cast<std::int64_t>(i)],
                                    reference(image_u8(index)), 0, 1e-6))
            << "workers=" << workers << " index " << index;
      }
      EXPECT_EQ(batch["label"].scalar_type(), torch::kLong);
      samples += batch.size();
    }
    EXPECT_EQ(samples, 10u) << "workers=" << workers;
  }
}

// A step that throws fails its batch only, as a dataset error does; the epoch goes on.
TEST(DeviceTransforms, AFailingStepFailsItsBatchAndTheEpochGoesOn) {
  class FailsOnBatch1 : public BatchTransform {
   public:
    void apply(Batch& batch) const override {
      if (batch.sequence() == 1) throw std::runtime_error("step failed on batch 1");
    }
    std::string describe() const override { return "fails_on_batch_1"; }
  };
  for (const std::size_t workers : {0, 2}) {
    DataLoader loader(std::make_shared<Uint8Images>(),
                      {.batch_size = 4,
                       .num_workers = workers,
                       .device_transforms = {std::make_shared<FailsOnBatch1>()}});
    std::size_t good = 0;
    std::size_t failed = 0;
    for (auto it = loader.begin(); it != loader.end(); ++it) {
      try {
        good += (*it).size();
      } catch (const std::runtime_error& e) {
        EXPECT_THAT(e.what(), AllOf(HasSubstr("device transform fails_on_batch_1 on batch 1 of "
                                              "epoch 0"),
                                    HasSubstr("step failed on batch 1")));
        ++failed;
      }
    }
    EXPECT_EQ(good, 6u) << "workers=" << workers;
    EXPECT_EQ(failed, 1u) << "workers=" << workers;
  }
}

}  // namespace
}  // namespace ferry
