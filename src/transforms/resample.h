#pragma once

// Pillow's Image.resize, ported: a separable convolution, horizontal pass first, 8-bit fixed
// point (22 fractional bits), whose filter support widens with the shrink factor, so shrinking
// is antialiased. torchvision's transforms on PIL images call exactly this, which is why ferry's
// resize matches torchvision's bit for bit when it starts from the same pixels.

#include <opencv2/core.hpp>

#include "ferry/vision/transforms.h"

namespace ferry::vision::detail {

// One axis of a resize: output pixel i samples around source coordinate
// in0 + (i + out_offset + 0.5) * scale, drawing only on the source's own pixels (the filter is
// cut and renormalised at its edges, as Pillow's). out_offset lets a crop of a resize's output
// be computed alone, with the very same coefficients as the full resize.
struct Axis {
  double in0 = 0.0;
  double scale = 1.0;
  int out_offset = 0;
  int out_size = 0;
};

// The axis that maps [in0, in1) onto `out_size` pixels (Pillow's `box`).
inline Axis box_axis(double in0, double in1, int out_size) {
  return {in0, (in1 - in0) / out_size, 0, out_size};
}

// Resamples an 8-bit image of 1 to 4 channels.
cv::Mat resample(const cv::Mat& src, const Axis& x, const Axis& y, Interpolation interpolation);

}  // namespace ferry::vision::detail
