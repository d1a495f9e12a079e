#include "transforms/resample.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ferry/error.h"

namespace ferry::vision::detail {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // as Pillow

double bilinear_filter(double x) {
  x = std::abs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

double bicubic_filter(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// Pillow's precompute_coeffs and normalize_coeffs_8bpc: for each output pixel, the first
// source pixel, the tap count and `ksize` fixed-point weights.
struct Coefficients {
  int ksize = 0;
  std::vector<int> first;
  std::vector<int> count;
  std::vector<std::int32_t> weights;
};

Coefficients precompute(int in_size, const Axis& axis, Interpolation interpolation) {
  const double support_base = interpolation == Interpolation::kBicubic ? 2.0 : 1.0;
  const auto filter = interpolation == Interpolation::kBicubic ? bicubic_filter : bilinear_filter;
  const double filterscale = std::max(axis.scale, 1.0);
  const double support = support_base * filterscale;
  Coefficients c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.first.resize(static_cast<std::size_t>(axis.out_size));
  c.count.resize(static_cast<std::size_t>(axis.out_size));
  c.weights.assign(static_cast<std::size_t>(axis.out_size) * c.ksize, 0);
  std::vector<double> k(static_cast<std::size_t>(c.ksize));
  for (int xx = 0; xx < axis.out_size; ++xx) {
    const double center = axis.in0 + (xx + axis.out_offset + 0.5) * axis.scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double w = filter((x + xmin - center + 0.5) * ss);
      k[static_cast<std::size_t>(x)] = w;
      ww += w;
    }
    std::int32_t* out = &c.weights[static_cast<std::size_t>(xx) * c.ksize];
    for (int x = 0; x < xmax; ++x) {
      const double w =
          ww != 0.0 ? k[static_cast<std::size_t>(x)] / ww : k[static_cast<std::size_t>(x)];
      out[x] = static_cast<std::int32_t>(w < 0 ? -0.5 + w * (1 << kPrecisionBits)
                                               : 0.5 + w * (1 << kPrecisionBits));
    }
    c.first[static_cast<std::size_t>(xx)] = xmin;
    c.count[static_cast<std::size_t>(xx)] = std::max(xmax, 0);
  }
  return c;
}

inline std::uint8_t clip8(std::int32_t v) {
  return static_cast<std::uint8_t>(std::clamp(v >> kPrecisionBits, 0, 255));
}

// The same coefficients with exactly `ksize` taps per output pixel: a window that would run
// past the right edge starts earlier, with zero weights in front. Integer sums are unchanged,
// and a fixed tap count lets the compiler unroll the inner loops.
Coefficients fixed_taps(const Coefficients& c, int in_size) {
  Coefficients f;
  f.ksize = c.ksize;
  f.first.resize(c.first.size());
  f.count.assign(c.count.size(), c.ksize);
  f.weights.assign(c.weights.size(), 0);
  for (std::size_t i = 0; i < c.first.size(); ++i) {
    const int start = std::min(c.first[i], in_size - c.ksize);
    const int shift = c.first[i] - start;
    f.first[i] = start;
    for (int t = 0; t < c.count[i]; ++t) {
      f.weights[i * c.ksize + shift + t] = c.weights[i * c.ksize + t];
    }
  }
  return f;
}

template <int C, int KS>
void horizontal_fixed(const cv::Mat& src, cv::Mat& dst, int row0, const Coefficients& c) {
  for (int y = 0; y < dst.rows; ++y) {
    const std::uint8_t* __restrict in = src.ptr<std::uint8_t>(row0 + y);
    std::uint8_t* __restrict out = dst.ptr<std::uint8_t>(y);
    for (int xx = 0; xx < dst.cols; ++xx) {
      const std::int32_t* k = &c.weights[static_cast<std::size_t>(xx) * KS];
      const std::uint8_t* p = in + c.first[static_cast<std::size_t>(xx)] * C;
      std::int32_t ss[C];
      for (int ch = 0; ch < C; ++ch) ss[ch] = 1 << (kPrecisionBits - 1);
      for (int x = 0; x < KS; ++x) {
        for (int ch = 0; ch < C; ++ch) ss[ch] += p[x * C + ch] * k[x];
      }
      for (int ch = 0; ch < C; ++ch) out[xx * C + ch] = clip8(ss[ch]);
    }
  }
}

template <int C>
void horizontal(const cv::Mat& src, cv::Mat& dst, int row0, const Coefficients& c) {
  if (src.cols >= c.ksize && (c.ksize == 3 || c.ksize == 5 || c.ksize == 7)) {
    const Coefficients f = fixed_taps(c, src.cols);
    if (c.ksize == 3) return horizontal_fixed<C, 3>(src, dst, row0, f);
    if (c.ksize == 5) return horizontal_fixed<C, 5>(src, dst, row0, f);
    return horizontal_fixed<C, 7>(src, dst, row0, f);
  }
  for (int y = 0; y < dst.rows; ++y) {
    const std::uint8_t* in = src.ptr<std::uint8_t>(row0 + y);
    std::uint8_t* out = dst.ptr<std::uint8_t>(y);
    for (int xx = 0; xx < dst.cols; ++xx) {
      const std::int32_t* k = &c.weights[static_cast<std::size_t>(xx) * c.ksize];
      const std::uint8_t* p = in + c.first[static_cast<std::size_t>(xx)] * C;
      const int n = c.count[static_cast<std::size_t>(xx)];
      std::int32_t ss[C];
      for (int ch = 0; ch < C; ++ch) ss[ch] = 1 << (kPrecisionBits - 1);
      for (int x = 0; x < n; ++x, p += C) {
        for (int ch = 0; ch < C; ++ch) ss[ch] += p[ch] * k[x];
      }
      for (int ch = 0; ch < C; ++ch) out[xx * C + ch] = clip8(ss[ch]);
    }
  }
}

template <int C>
void vertical(const cv::Mat& src, cv::Mat& dst, int row_shift, const Coefficients& c) {
  const int width = dst.cols * C;
  std::vector<std::int32_t> acc(static_cast<std::size_t>(width));
  std::int32_t* __restrict a = acc.data();
  for (int yy = 0; yy < dst.rows; ++yy) {
    const std::int32_t* k = &c.weights[static_cast<std::size_t>(yy) * c.ksize];
    const int first = c.first[static_cast<std::size_t>(yy)] - row_shift;
    const int n = c.count[static_cast<std::size_t>(yy)];
    std::fill(acc.begin(), acc.end(), 1 << (kPrecisionBits - 1));
    for (int y = 0; y < n; ++y) {
      const std::uint8_t* __restrict in = src.ptr<std::uint8_t>(first + y);
      const std::int32_t w = k[y];
      for (int i = 0; i < width; ++i) a[i] += in[i] * w;
    }
    std::uint8_t* __restrict out = dst.ptr<std::uint8_t>(yy);
    for (int i = 0; i < width; ++i) out[i] = clip8(a[i]);
  }
}

template <int C>
cv::Mat resample_bands(const cv::Mat& src,
                       const Axis& x,
                       const Axis& y,
                       Interpolation interpolation) {
  const bool need_h =
      !(x.in0 == 0.0 && x.scale == 1.0 && x.out_offset == 0 && x.out_size == src.cols);
  const bool need_v =
      !(y.in0 == 0.0 && y.scale == 1.0 && y.out_offset == 0 && y.out_size == src.rows);
  const Coefficients cv_ = precompute(src.rows, y, interpolation);
  cv::Mat current = src;
  int row_shift = 0;
  if (need_h) {
    // Only the rows the vertical pass reads, as Pillow.
    const int first_row = y.out_size > 0 ? cv_.first.front() : 0;
    const int last_row = y.out_size > 0 ? cv_.first.back() + cv_.count.back() : 0;
    const Coefficients ch = precompute(src.cols, x, interpolation);
    cv::Mat temp(std::max(last_row - first_row, 0), x.out_size, src.type());
    horizontal<C>(src, temp, first_row, ch);
    current = temp;
    row_shift = first_row;
  }
  if (!need_v) return need_h ? current : src.clone();
  cv::Mat out(y.out_size, current.cols, src.type());
  vertical<C>(current, out, row_shift, cv_);
  return out;
}

cv::Mat nearest(const cv::Mat& src, const Axis& x, const Axis& y) {
  cv::Mat out(y.out_size, x.out_size, src.type());
  const std::size_t pixel = src.elemSize();
  std::vector<int> xs(static_cast<std::size_t>(x.out_size));
  for (int i = 0; i < x.out_size; ++i) {
    xs[static_cast<std::size_t>(i)] = std::clamp(
        static_cast<int>(std::floor(x.in0 + (i + x.out_offset + 0.5) * x.scale)), 0, src.cols - 1);
  }
  for (int j = 0; j < y.out_size; ++j) {
    const int sy = std::clamp(
        static_cast<int>(std::floor(y.in0 + (j + y.out_offset + 0.5) * y.scale)), 0, src.rows - 1);
    const std::uint8_t* in = src.ptr<std::uint8_t>(sy);
    std::uint8_t* o = out.ptr<std::uint8_t>(j);
    for (int i = 0; i < x.out_size; ++i) {
      std::memcpy(o + i * pixel, in + xs[static_cast<std::size_t>(i)] * pixel, pixel);
    }
  }
  return out;
}

}  // namespace

cv::Mat resample(const cv::Mat& src, const Axis& x, const Axis& y, Interpolation interpolation) {
  FERRY_ASSERT(src.depth() == CV_8U && src.channels() >= 1 && src.channels() <= 4,
               "resample takes 8-bit images of 1 to 4 channels");
  FERRY_CHECK(x.out_size > 0 && y.out_size > 0, "cannot resize to ", x.out_size, "x", y.out_size);
  if (interpolation == Interpolation::kNearest) return nearest(src, x, y);
  switch (src.channels()) {
    case 1:
      return resample_bands<1>(src, x, y, interpolation);
    case 2:
      return resample_bands<2>(src, x, y, interpolation);
    case 3:
      return resample_bands<3>(src, x, y, interpolation);
    default:
      return resample_bands<4>(src, x, y, interpolation);
  }
}

}  // namespace ferry::vision::detail
