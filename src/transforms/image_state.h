#pragma once

// The working form of one sample's image while a pipeline of image transforms runs on it: the
// encoded file (not yet decoded, so that the first crop or resize can decode only what it
// needs), decoded pixels (cv::Mat, H x W x C, RGB order), or the final C x H x W tensor.

#include <optional>
#include <string>

#include <opencv2/core.hpp>

#include "ferry/vision/image.h"

#include "transforms/codec.h"

namespace ferry::vision::detail {

class ImageState {
 public:
  enum class Stage { kEncoded, kPixels, kTensor };

  // From an `image` field: a 1-D uint8 tensor is an encoded file, a 2-D or 3-D uint8 tensor
  // H x W (x C) pixels, anything else a tensor (as after ToTensor).
  static ImageState from_field(const torch::Tensor& field);
  static ImageState encoded(torch::Tensor bytes,
                            ImageMode mode = ImageMode::kRGB,
                            std::int64_t max_pixels = kDefaultMaxPixels);

  Stage stage() const noexcept { return stage_; }
  bool is_encoded() const noexcept { return stage_ == Stage::kEncoded; }

  // Encoded stage: how to decode, and the header (read once).
  void set_decoding(ImageMode mode, std::int64_t max_pixels);
  ImageMode mode() const noexcept { return mode_; }
  std::int64_t max_pixels() const noexcept { return max_pixels_; }
  std::span<const std::uint8_t> bytes() const;
  const ImageInfo& info();
  // Decodes as the request says (the mode and max_pixels of this state are filled in).
  DecodedRegion decode(DecodeRequest request);

  // The pixels, decoding the whole file first if needed. `who` names the transform for the
  // error raised after ToTensor.
  cv::Mat& pixels(const std::string& who);
  void set_pixels(cv::Mat pixels);
  // (height, width) of the image at its current stage.
  std::pair<std::int64_t, std::int64_t> size(const std::string& who);

  torch::Tensor& tensor(const std::string& who);
  void set_tensor(torch::Tensor tensor);

  // The `image` field: an encoded image is decoded, pixels become an H x W x C uint8 tensor.
  torch::Tensor to_field();

 private:
  Stage stage_ = Stage::kPixels;
  torch::Tensor encoded_;
  ImageMode mode_ = ImageMode::kRGB;
  std::int64_t max_pixels_ = kDefaultMaxPixels;
  std::optional<ImageInfo> info_;
  cv::Mat pixels_;
  torch::Tensor holder_;  // the incoming tensor that pixels_ (or a crop of it) may view
  torch::Tensor tensor_;
};

}  // namespace ferry::vision::detail
