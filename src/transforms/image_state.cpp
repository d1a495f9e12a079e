#include "transforms/image_state.h"

#include "ferry/error.h"

namespace ferry::vision::detail {

ImageState ImageState::from_field(const torch::Tensor& field) {
  ImageState s;
  if (field.dim() == 1 && field.scalar_type() == torch::kUInt8) {
    s.stage_ = Stage::kEncoded;
    s.encoded_ = field.contiguous();
  } else if ((field.dim() == 2 || field.dim() == 3) && field.scalar_type() == torch::kUInt8) {
    s.stage_ = Stage::kPixels;
    torch::Tensor hwc = field.contiguous();
    // The Mat views the tensor's memory, and so may crops of it: the state keeps it alive.
    s.holder_ = hwc;
    s.pixels_ = to_mat(hwc);
  } else {
    s.stage_ = Stage::kTensor;
    s.tensor_ = field;
  }
  return s;
}

ImageState ImageState::encoded(torch::Tensor bytes, ImageMode mode, std::int64_t max_pixels) {
  ImageState s;
  s.stage_ = Stage::kEncoded;
  s.encoded_ = std::move(bytes);
  s.mode_ = mode;
  s.max_pixels_ = max_pixels;
  return s;
}

void ImageState::set_decoding(ImageMode mode, std::int64_t max_pixels) {
  mode_ = mode;
  max_pixels_ = max_pixels;
}

std::span<const std::uint8_t> ImageState::bytes() const { return bytes_of(encoded_); }

const ImageInfo& ImageState::info() {
  if (!info_) info_ = probe(bytes());
  return *info_;
}

DecodedRegion ImageState::decode(DecodeRequest request) {
  request.mode = mode_;
  request.max_pixels = max_pixels_;
  request.info = &info();  // probed once per image
  return detail::decode(bytes(), request);
}

cv::Mat& ImageState::pixels(const std::string& who) {
  if (stage_ == Stage::kEncoded) {
    set_pixels(decode({}).image);
  }
  if (stage_ == Stage::kPixels && pixels_.depth() != CV_8U) {
    throw DataError(ferry::detail::str(
        who,
        " takes 8-bit images; this one has 16-bit pixels (decoded with mode unchanged); "
        "decode with mode rgb or gray before image transforms"));
  }
  if (stage_ == Stage::kTensor) {
    throw ConfigError(ferry::detail::str(
        who, " works on images, but the image is already a tensor (", tensor_.scalar_type(), " ",
        tensor_.sizes(), "); put it before ToTensor"));
  }
  return pixels_;
}

void ImageState::set_pixels(cv::Mat pixels) {
  stage_ = Stage::kPixels;
  pixels_ = std::move(pixels);
  encoded_ = torch::Tensor();
  tensor_ = torch::Tensor();
}

std::pair<std::int64_t, std::int64_t> ImageState::size(const std::string& who) {
  if (stage_ == Stage::kEncoded && info().format != "other") {
    return {info().height, info().width};
  }
  const cv::Mat& p = pixels(who);
  return {p.rows, p.cols};
}

torch::Tensor& ImageState::tensor(const std::string& who) {
  FERRY_CHECK(stage_ == Stage::kTensor, who,
              " works on tensors; put ToTensor before it (the image is still ",
              stage_ == Stage::kEncoded ? "an encoded file" : "H x W x C uint8 pixels", ")");
  return tensor_;
}

void ImageState::set_tensor(torch::Tensor tensor) {
  stage_ = Stage::kTensor;
  tensor_ = std::move(tensor);
  pixels_ = cv::Mat();
  encoded_ = torch::Tensor();
}

torch::Tensor ImageState::to_field() {
  switch (stage_) {
    case Stage::kEncoded:
      return to_tensor(decode({}).image);
    case Stage::kPixels:
      // Pixels that are still the incoming tensor, untouched, are that tensor.
      if (holder_.defined() && pixels_.data == holder_.data_ptr() && pixels_.isContinuous() &&
          pixels_.total() * pixels_.elemSize() == holder_.nbytes()) {
        return holder_;
      }
      // Pixels viewing memory the state does not own (a crop of the incoming tensor) are copied.
      return to_tensor(pixels_.u == nullptr ? pixels_.clone() : pixels_);
    case Stage::kTensor:
      return tensor_;
  }
  return {};
}

}  // namespace ferry::vision::detail
