#pragma once

// Decoding files into cv::Mat (HWC, RGB order), with the two shortcuts the transforms use on
// JPEGs: libjpeg-turbo's scaled IDCT (decode at M/8 of the size) and a decode window (rows
// above and below skipped, columns outside cropped at iMCU granularity).

#include <cstdint>
#include <span>

#include <opencv2/core.hpp>

#include "ferry/vision/image.h"

namespace ferry::vision::detail {

// A decoded region of an image: `image` holds, at scale (sx, sy) of the file's own pixels, the
// pixels whose scaled coordinates start at (x0, y0). A file coordinate x maps to image column
// x * sx - x0.
struct DecodedRegion {
  cv::Mat image;
  double sx = 1.0;
  double sy = 1.0;
  int x0 = 0;
  int y0 = 0;
  std::int64_t full_width = 0;  // the file's size
  std::int64_t full_height = 0;
};

struct DecodeRequest {
  ImageMode mode = ImageMode::kRGB;
  std::int64_t max_pixels = kDefaultMaxPixels;
  int scale_eighths = 8;  // JPEG: decode at scale_eighths/8 (1..8); other formats ignore it
  cv::Rect window{};      // JPEG: the part needed, in file pixels; empty: all of it
  const ImageInfo* info = nullptr;  // the header, when the caller has probed it already
};

// The file's header (see probe_image).
ImageInfo probe(std::span<const std::uint8_t> bytes);

// Decodes `bytes` as `request` says. Throws DataError with the decoder's reason.
DecodedRegion decode(std::span<const std::uint8_t> bytes, const DecodeRequest& request);

// Pillow's RGB to L conversion (ITU-R 601-2 luma, 16-bit fixed point, rounded).
cv::Mat rgb_to_gray(const cv::Mat& rgb);

// A tensor (H x W x C, or H x W) sharing the Mat's pixels (the Mat is kept alive), and a Mat
// header over a tensor's pixels (the tensor must outlive it; made contiguous first).
torch::Tensor to_tensor(cv::Mat image);
cv::Mat to_mat(const torch::Tensor& hwc);

}  // namespace ferry::vision::detail
