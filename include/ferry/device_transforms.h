#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/types.h>

#include "ferry/batch.h"

namespace ferry {

/// A step that runs on whole batches once they are on the loader's `device`: on a CUDA device,
/// on the loader's copy stream right after the batch's copy, ahead of the training loop; on the
/// CPU (no `device`), in the calling thread before the batch is handed out. Image pipelines use it
/// to send uint8 through shared memory and over PCIe (four times fewer bytes than float) and to
/// convert and normalise on the GPU:
///
///   ferry::DataLoader loader(dataset, {.batch_size = 256, .num_workers = 8,
///       .device = torch::Device("cuda"),
///       .device_transforms = {std::make_shared<ferry::device_transforms::ToDtype>(),
///                             std::make_shared<ferry::device_transforms::Normalize>(
///                                 std::vector<double>{0.485, 0.456, 0.406},
///                                 std::vector<double>{0.229, 0.224, 0.225})}});
///
/// `apply` must not wait for the GPU (no `.item()`, no copy to the host): it would stall the
/// copy stream's look-ahead. Implementations must be thread-compatible (const, or locked).
class BatchTransform {
 public:
  virtual ~BatchTransform() = default;
  /// Transforms `batch` in place (replace fields with `Batch::set`). Throws to fail the batch.
  virtual void apply(Batch& batch) const = 0;
  /// The step as it would be written in YAML, for messages: "to_dtype(float32, scale)".
  virtual std::string describe() const = 0;
};

using BatchTransforms = std::vector<std::shared_ptr<const BatchTransform>>;

namespace device_transforms {

/// torchvision.transforms.v2.ToDtype: converts each of `fields` to `dtype`. With `scale`, an
/// integer tensor converted to floating point is divided by its type's maximum (uint8: 255, as
/// ToTensor does), so images land in [0, 1].
class ToDtype final : public BatchTransform {
 public:
  explicit ToDtype(torch::ScalarType dtype = torch::kFloat,
                   bool scale = true,
                   std::vector<std::string> fields = {"image"});
  void apply(Batch& batch) const override;
  std::string describe() const override;

 private:
  torch::ScalarType dtype_;
  bool scale_;
  std::vector<std::string> fields_;
};

/// torchvision.transforms.Normalize over dimension 1 of each of `fields` ([B, C, ...]):
/// (x - mean[c]) / std[c], in the tensor's floating-point dtype. The constants go to the device
/// once and are reused.
class Normalize final : public BatchTransform {
 public:
  Normalize(std::vector<double> mean,
            std::vector<double> std,
            std::vector<std::string> fields = {"image"});
  void apply(Batch& batch) const override;
  std::string describe() const override;

 private:
  std::vector<double> mean_;
  std::vector<double> std_;
  std::vector<std::string> fields_;
  // (device, dtype) -> mean and std shaped [1, C, 1, ...]; made once, on the copy stream.
  mutable std::mutex mutex_;
  mutable std::vector<std::pair<torch::Tensor, torch::Tensor>> constants_;
};

}  // namespace device_transforms
}  // namespace ferry
