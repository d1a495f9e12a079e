// ColorJitter and the adjust_* functions, with Pillow's arithmetic (ImageEnhance's blends,
// ImageStat's mean, the RGB <-> HSV conversions of Convert.c), as torchvision uses on PIL images.

#include <algorithm>
#include <cmath>

#include <opencv2/core.hpp>

#include "ferry/error.h"
#include "ferry/vision/transforms.h"

#include "transforms/codec.h"
#include "transforms/image_state.h"

namespace ferry::vision {

using ferry::detail::str;

namespace {

// Pillow's Image.blend(a, b, alpha) = a + alpha * (b - a), in float, truncated; clipped when
// alpha is outside [0, 1].
void blend_into(
    const std::uint8_t* a, const std::uint8_t* b, std::uint8_t* out, std::size_t n, float alpha) {
  if (alpha >= 0.0f && alpha <= 1.0f) {
    for (std::size_t i = 0; i < n; ++i) {
      out[i] = static_cast<std::uint8_t>(static_cast<float>(a[i]) +
                                         alpha * static_cast<float>(int{b[i]} - int{a[i]}));
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(a[i]) + alpha * static_cast<float>(int{b[i]} - int{a[i]});
      out[i] = v <= 0.0f ? 0 : v >= 255.0f ? 255 : static_cast<std::uint8_t>(v);
    }
  }
}

cv::Mat blend_with(const cv::Mat& degenerate, const cv::Mat& image, double factor) {
  cv::Mat out(image.rows, image.cols, image.type());
  const cv::Mat a = degenerate.isContinuous() ? degenerate : degenerate.clone();
  const cv::Mat b = image.isContinuous() ? image : image.clone();
  blend_into(a.data, b.data, out.data, b.total() * b.channels(), static_cast<float>(factor));
  return out;
}

cv::Mat gray_of(const cv::Mat& image) {
  return image.channels() == 1 ? image : detail::rgb_to_gray(image);
}

cv::Mat as_channels(const cv::Mat& gray, int channels) {
  if (channels == 1) return gray;
  std::vector<cv::Mat> planes(static_cast<std::size_t>(channels), gray);
  cv::Mat out;
  cv::merge(planes, out);
  return out;
}

void check_image(const cv::Mat& image, bool rgb_only, const char* who) {
  FERRY_CHECK(
      image.depth() == CV_8U && (image.channels() == 3 || (!rgb_only && image.channels() == 1)),
      who, " takes ", rgb_only ? "RGB" : "RGB or gray", " uint8 images; got ", image.channels(),
      " channels");
}

cv::Mat brightness(const cv::Mat& image, double factor) {
  check_image(image, false, "adjust_brightness");
  return blend_with(cv::Mat::zeros(image.size(), image.type()), image, factor);
}

cv::Mat contrast(const cv::Mat& image, double factor) {
  check_image(image, false, "adjust_contrast");
  // ImageStat's mean of the L image, rounded: int(mean + 0.5).
  const cv::Mat gray = gray_of(image);
  double sum = 0;
  for (int y = 0; y < gray.rows; ++y) {
    const std::uint8_t* row = gray.ptr<std::uint8_t>(y);
    for (int x = 0; x < gray.cols; ++x) sum += row[x];
  }
  const int mean = static_cast<int>(sum / static_cast<double>(gray.total()) + 0.5);
  return blend_with(cv::Mat(image.size(), image.type(), cv::Scalar::all(mean)), image, factor);
}

cv::Mat saturation(const cv::Mat& image, double factor) {
  check_image(image, false, "adjust_saturation");
  if (image.channels() == 1) return image.clone();  // Pillow: a gray image has no colour
  return blend_with(as_channels(gray_of(image), 3), image, factor);
}

inline std::uint8_t clip8(int v) { return static_cast<std::uint8_t>(std::clamp(v, 0, 255)); }

// Pillow's rgb2hsv_row (colorsys arithmetic, float).
void rgb_to_hsv(const std::uint8_t* in, std::uint8_t* out) {
  const std::uint8_t r = in[0], g = in[1], b = in[2];
  const std::uint8_t maxc = std::max(r, std::max(g, b));
  const std::uint8_t minc = std::min(r, std::min(g, b));
  out[2] = maxc;
  if (minc == maxc) {
    out[0] = 0;
    out[1] = 0;
    return;
  }
  const float cr = static_cast<float>(maxc - minc);
  const float s = cr / static_cast<float>(maxc);
  const float rc = static_cast<float>(maxc - r) / cr;
  const float gc = static_cast<float>(maxc - g) / cr;
  const float bc = static_cast<float>(maxc - b) / cr;
  float h;
  if (r == maxc) {
    h = bc - gc;
  } else if (g == maxc) {
    h = static_cast<float>(2.0 + rc - bc);
  } else {
    h = static_cast<float>(4.0 + gc - rc);
  }
  h = static_cast<float>(std::fmod(h / 6.0 + 1.0, 1.0));
  out[0] = clip8(static_cast<int>(h * 255.0));
  out[1] = clip8(static_cast<int>(s * 255.0));
}

// Pillow's hsv2rgb.
void hsv_to_rgb(const std::uint8_t* in, std::uint8_t* out) {
  const std::uint8_t h = in[0], s = in[1], v = in[2];
  if (s == 0) {
    out[0] = out[1] = out[2] = v;
    return;
  }
  const int i = static_cast<int>(std::floor(static_cast<float>(h) * 6.0 / 255.0));
  const float f = static_cast<float>(static_cast<float>(h) * 6.0 / 255.0 - static_cast<float>(i));
  const float fs = static_cast<float>(static_cast<float>(s) / 255.0);
  const std::uint8_t p = clip8(static_cast<int>(std::round(static_cast<float>(v) * (1.0 - fs))));
  const std::uint8_t q =
      clip8(static_cast<int>(std::round(static_cast<float>(v) * (1.0 - fs * f))));
  const std::uint8_t t =
      clip8(static_cast<int>(std::round(static_cast<float>(v) * (1.0 - fs * (1.0 - f)))));
  switch (i % 6) {
    case 0:
      out[0] = v;
      out[1] = t;
      out[2] = p;
      break;
    case 1:
      out[0] = q;
      out[1] = v;
      out[2] = p;
      break;
    case 2:
      out[0] = p;
      out[1] = v;
      out[2] = t;
      break;
    case 3:
      out[0] = p;
      out[1] = q;
      out[2] = v;
      break;
    case 4:
      out[0] = t;
      out[1] = p;
      out[2] = v;
      break;
    default:
      out[0] = v;
      out[1] = p;
      out[2] = q;
      break;
  }
}

cv::Mat hue(const cv::Mat& image, double factor) {
  FERRY_CHECK(factor >= -0.5 && factor <= 0.5, "adjust_hue: hue_factor ", factor,
              " is not in [-0.5, 0.5]");
  if (image.channels() == 1) return image.clone();  // torchvision leaves gray images alone
  check_image(image, true, "adjust_hue");
  // np.uint8(hue_factor * 255): truncated toward zero, then wrapped.
  const auto shift = static_cast<std::uint8_t>(static_cast<int>(factor * 255.0) & 0xFF);
  cv::Mat out(image.rows, image.cols, CV_8UC3);
  for (int y = 0; y < image.rows; ++y) {
    const std::uint8_t* in = image.ptr<std::uint8_t>(y);
    std::uint8_t* o = out.ptr<std::uint8_t>(y);
    for (int x = 0; x < image.cols; ++x, in += 3, o += 3) {
      std::uint8_t hsv[3];
      rgb_to_hsv(in, hsv);
      hsv[0] = static_cast<std::uint8_t>(hsv[0] + shift);
      hsv_to_rgb(hsv, o);
    }
  }
  return out;
}

torch::Tensor run_on_tensor(const torch::Tensor& image,
                            cv::Mat (*fn)(const cv::Mat&, double),
                            double factor) {
  const torch::Tensor hwc = image.contiguous();
  return detail::to_tensor(fn(detail::to_mat(hwc), factor).clone());
}

// torchvision's _check_input: [max(0, 1 - x), 1 + x] (hue: [-x, x]); nullopt when it is a no-op.
std::optional<std::array<double, 2>> jitter_range(double x, bool is_hue, const char* name) {
  FERRY_CHECK(x >= 0, "ColorJitter: ", name, " must be >= 0; got ", x);
  if (is_hue) {
    FERRY_CHECK(x <= 0.5, "ColorJitter: hue must be in [0, 0.5]; got ", x);
    if (x == 0) return std::nullopt;
    return std::array<double, 2>{-x, x};
  }
  const std::array<double, 2> range{std::max(0.0, 1.0 - x), 1.0 + x};
  if (range[0] == 1.0 && range[1] == 1.0) return std::nullopt;
  return range;
}

}  // namespace

torch::Tensor adjust_brightness(const torch::Tensor& image, double factor) {
  FERRY_CHECK(factor >= 0, "adjust_brightness: factor must be >= 0; got ", factor);
  return run_on_tensor(image, brightness, factor);
}
torch::Tensor adjust_contrast(const torch::Tensor& image, double factor) {
  FERRY_CHECK(factor >= 0, "adjust_contrast: factor must be >= 0; got ", factor);
  return run_on_tensor(image, contrast, factor);
}
torch::Tensor adjust_saturation(const torch::Tensor& image, double factor) {
  FERRY_CHECK(factor >= 0, "adjust_saturation: factor must be >= 0; got ", factor);
  return run_on_tensor(image, saturation, factor);
}
torch::Tensor adjust_hue(const torch::Tensor& image, double factor) {
  return run_on_tensor(image, hue, factor);
}

ColorJitter::ColorJitter(Options options) : options_(options) {
  jitter_range(options_.brightness, false, "brightness");
  jitter_range(options_.contrast, false, "contrast");
  jitter_range(options_.saturation, false, "saturation");
  jitter_range(options_.hue, true, "hue");
}

void ColorJitter::apply(detail::ImageState& image, SampleContext& ctx) const {
  at::Generator& gen = ctx.generator();
  // torchvision's get_params: a permutation, then one draw per property that is on.
  const torch::Tensor order = torch::randperm(4, gen);
  const auto draw = [&](const std::optional<std::array<double, 2>>& r) -> std::optional<double> {
    if (!r) return std::nullopt;
    return torch::empty({1}).uniform_((*r)[0], (*r)[1], gen).item<float>();
  };
  const auto b = draw(jitter_range(options_.brightness, false, "brightness"));
  const auto c = draw(jitter_range(options_.contrast, false, "contrast"));
  const auto s = draw(jitter_range(options_.saturation, false, "saturation"));
  const auto h = draw(jitter_range(options_.hue, true, "hue"));
  cv::Mat p = image.pixels(describe());
  for (int k = 0; k < 4; ++k) {
    switch (order[k].item<std::int64_t>()) {
      case 0:
        if (b) p = brightness(p, *b);
        break;
      case 1:
        if (c) p = contrast(p, *c);
        break;
      case 2:
        if (s) p = saturation(p, *s);
        break;
      default:
        if (h) p = hue(p, *h);
        break;
    }
  }
  image.set_pixels(std::move(p));
}

std::string ColorJitter::describe() const {
  return str("ColorJitter(brightness=", options_.brightness, ", contrast=", options_.contrast,
             ", saturation=", options_.saturation, ", hue=", options_.hue, ")");
}

}  // namespace ferry::vision
