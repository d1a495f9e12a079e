#pragma once

// torchvision's transforms, on OpenCV and ported Pillow arithmetic, for the `image` field of a
// sample. Every random draw comes from the sample's SampleContext generator, with the same torch
// calls torchvision makes, so a transform given the same generator state picks the same
// parameters as torchvision's.
//
// The `image` field is an encoded file (a 1-D uint8 tensor, as image datasets and read_file
// give it), an H x W x C uint8 image, or, after ToTensor, a C x H x W tensor. Consecutive image
// transforms run as one pipeline (see Compose): an encoded JPEG is decoded straight into the
// first crop or resize, at reduced scale where that stays within the documented tolerance.

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/transform.h"
#include "ferry/vision/image.h"

namespace ferry::vision {

namespace detail {
class ImageState;
}

/// Resampling filters, with torchvision's (Pillow's) meaning.
enum class Interpolation { kNearest, kBilinear, kBicubic };
std::string_view to_string(Interpolation interpolation) noexcept;
Interpolation parse_interpolation(std::string_view name);  // "nearest", "bilinear", "bicubic"

/// (height, width); one number means a square.
struct Size2 {
  std::int64_t height = 0;
  std::int64_t width = 0;
};
/// From torchvision's `size` argument: [s] or [h, w]. Throws ConfigError otherwise.
Size2 square_or_pair(const std::vector<std::int64_t>& size, std::string_view what);

/// A transform of the `image` field. Subclasses implement `apply` on the pipeline's image state.
class ImageTransform : public Transform {
 public:
  /// Runs `apply` on the sample's `image` field.
  Example operator()(Example example, SampleContext& ctx) const override;
  /// Adjacent image transforms become one Compose, so the image stays in its working form.
  std::shared_ptr<const Transform> fuse(
      const std::shared_ptr<const Transform>& self,
      const std::shared_ptr<const Transform>& next) const override;
  virtual void apply(detail::ImageState& image, SampleContext& ctx) const = 0;
  /// A short description for messages, e.g. "Resize(size=[256])".
  virtual std::string describe() const = 0;
};

/// Decodes the file in `image` (lazily: a following crop or resize decodes only what it needs).
/// A pipeline without Decode decodes in RGB when a transform first needs pixels.
class Decode : public ImageTransform {
 public:
  explicit Decode(ImageMode mode = ImageMode::kRGB, std::int64_t max_pixels = kDefaultMaxPixels);
  void apply(detail::ImageState& image, SampleContext& ctx) const override;
  std::string describe() const override;

 private:
  ImageMode mode_;
  std::int64_t max_pixels_;
};

/// torchvision.transforms.Resize: `size` [s] scales the shorter side to s (the longer side
/// truncated, as torchvision; capped at `max_size` if given), [h, w] resizes exactly.
/// Antialiased when shrinking, as torchvision on PIL images.
class Resize : public ImageTransform {
 public:
  struct Options {
    std::vector<std::int64_t> size;
    Interpolation interpolation = Interpolation::kBilinear;
    std::optional<std::int64_t> max_size{};
    bool reduced_decode = true;  // a JPEG may decode at M/8 scale first (see README)
  };
  explicit Resize(Options options);
  void apply(detail::ImageState& image, SampleContext& ctx) const override;
  std::string describe() const override;
  /// The output (height, width) for an input of (height, width), as torchvision computes it.
  Size2 output_size(std::int64_t height, std::int64_t width) const;
  const Options& options() const noexcept { return options_; }

 private:
  Options options_;
};

/// torchvision.transforms.CenterCrop: pads with zeros first when the crop is larger.
class CenterCrop : public ImageTransform {
 public:
  explicit CenterCrop(std::vector<std::int64_t> size);
  void apply(detail::ImageState& image, SampleContext& ctx) const override;
  std::string describe() const override;
  Size2 size() const noexcept { return size_; }

 private:
  Size2 size_;
};

/// Padding modes of RandomCrop (torchvision's padding_mode).
enum class PaddingMode { kConstant, kEdge, kReflect, kSymmetric };

/// torchvision.transforms.RandomCrop.
class RandomCrop : public ImageTransform {
 public:
  struct Options {
    std::vector<std::int64_t> size;
    std::vector<std::int64_t> padding{};  // [all], [left/right, top/bottom] or [l, t, r, b]
    bool pad_if_needed = false;
    std::int64_t fill = 0;
    PaddingMode padding_mode = PaddingMode::kConstant;
  };
  explicit RandomCrop(Options options);
  void apply(detail::ImageState& image, SampleContext& ctx) const override;
  std::string describe() const override;
  /// torchvision's RandomCrop.get_params: (top, left) of a crop of `size` from (height, width).
  static std::array<std::int64_t, 2> get_params(std::int64_t height,
                                                std::int64_t width,
                                                Size2 size,
                                                at::Generator& generator);

 private:
  Options options_;
  Size2 size_;
};

/// A crop box: top, left, height, width.
struct Box {
  std::int64_t top = 0;
  std::int64_t left = 0;
  std::int64_t height = 0;
  std::int64_t width = 0;
  bool operator==(const Box&) const = default;
};

/// torchvision.transforms.RandomResizedCrop.
class RandomResizedCrop : public ImageTransform {
 public:
  struct Options {
    std::vector<std::int64_t> size;
    std::array<double, 2> scale{0.08, 1.0};
    std::array<double, 2> ratio{3.0 / 4.0, 4.0 / 3.0};
    Interpolation interpolation = Interpolation::kBilinear;
    bool reduced_decode = true;  // a JPEG may decode only the box, at M/8 scale (see README)
  };
  explicit RandomResizedCrop(Options options);
  void apply(detail::ImageState& image, SampleContext& ctx) const override;
  std::string describe() const override;
  /// torchvision's RandomResizedCrop.get_params: ten tries at a box of random area and aspect
  /// ratio, then the central fallback; the same draws in the same order.
  static Box get_params(std::int64_t height,
                        std::int64_t width,
                        std::array<double, 2> scale,
                        std::array<double, 2> ratio,
                        at::Generator& generator);

 private:
  Options options_;
  Size2 size_;
};

/// torchvision.transforms.RandomHorizontalFlip / RandomVerticalFlip.
class RandomFlip : public ImageTransform {
 public:
  RandomFlip(bool horizontal, double p);
  void apply(detail::ImageState& image, SampleContext& ctx) const override;
  std::string describe() const override;

 private:
  bool horizontal_;
  double p_;
};

class RandomHorizontalFlip : public RandomFlip {
 public:
  explicit RandomHorizontalFlip(double p = 0.5) : RandomFlip(true, p) {}
};
class RandomVerticalFlip : public RandomFlip {
 public:
  explicit RandomVerticalFlip(double p = 0.5) : RandomFlip(false, p) {}
};

/// torchvision.transforms.ColorJitter: each factor is drawn uniformly from
/// [max(0, 1 - x), 1 + x] (hue from [-x, x]) and applied in a random order, with Pillow's
/// arithmetic. 0 leaves that property alone.
class ColorJitter : public ImageTransform {
 public:
  struct Options {
    double brightness = 0;
    double contrast = 0;
    double saturation = 0;
    double hue = 0;  // at most 0.5
  };
  explicit ColorJitter(Options options);
  void apply(detail::ImageState& image, SampleContext& ctx) const override;
  std::string describe() const override;

 private:
  Options options_;
};

/// One ColorJitter step with a fixed factor, as torchvision.transforms.functional.adjust_*.
/// `image` is H x W x 3 uint8 (H x W x 1 for brightness and contrast).
torch::Tensor adjust_brightness(const torch::Tensor& image, double factor);
torch::Tensor adjust_contrast(const torch::Tensor& image, double factor);
torch::Tensor adjust_saturation(const torch::Tensor& image, double factor);
torch::Tensor adjust_hue(const torch::Tensor& image, double factor);

/// torchvision.transforms.ToTensor (float32 C x H x W in [0, 1]) or, with uint8, PILToTensor
/// (uint8 C x H x W, for pipelines that normalise on the GPU).
class ToTensor : public ImageTransform {
 public:
  explicit ToTensor(bool uint8 = false);
  void apply(detail::ImageState& image, SampleContext& ctx) const override;
  std::string describe() const override;
  bool uint8() const noexcept { return uint8_; }

 private:
  bool uint8_;
};

/// torchvision.transforms.Normalize: (x - mean) / std per channel of a float C x H x W tensor.
/// Right after ToTensor it runs in the same pass (one lookup per pixel, same float32 results).
class Normalize : public ImageTransform {
 public:
  Normalize(std::vector<double> mean, std::vector<double> std);
  void apply(detail::ImageState& image, SampleContext& ctx) const override;
  std::string describe() const override;
  const std::vector<double>& mean() const noexcept { return mean_; }
  const std::vector<double>& std() const noexcept { return std_; }

 private:
  std::vector<double> mean_;
  std::vector<double> std_;
};

/// torchvision.transforms.Compose. Adjacent image transforms share one working image (no
/// tensor round trips); Resize then CenterCrop computes only the kept pixels; ToTensor then
/// Normalize is one pass. Other transforms in the list run on the sample between them. Nested
/// Composes are flattened.
class Compose : public ImageTransform {
 public:
  explicit Compose(TransformList transforms);
  Example operator()(Example example, SampleContext& ctx) const override;
  /// Runs the steps on `image`; every step must then be an image transform.
  void apply(detail::ImageState& image, SampleContext& ctx) const override;
  std::string describe() const override;
  const TransformList& transforms() const noexcept { return transforms_; }
  /// Runs the pipeline on `example` starting from `image` (how image datasets call it).
  Example run(Example example, detail::ImageState& image, SampleContext& ctx) const;

 private:
  // The steps, from `start` (null: from the sample's `image` field, read when a step needs it).
  Example run_steps(Example example, detail::ImageState* start, SampleContext& ctx) const;

  TransformList transforms_;  // as given
  TransformList steps_;       // after fusing
};

}  // namespace ferry::vision
