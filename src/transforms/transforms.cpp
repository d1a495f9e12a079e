// torchvision's geometric transforms, ToTensor, Normalize and Compose (ColorJitter is in
// color.cpp). Sizes, rounding and random draws follow torchvision 0.14 on PIL images; the
// resampling is Pillow's (resample.cpp).

#include "ferry/vision/transforms.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include <opencv2/core.hpp>

#include "ferry/error.h"

#include "transforms/image_state.h"
#include "transforms/resample.h"

namespace ferry::vision {

using ferry::detail::str;

std::string_view to_string(Interpolation interpolation) noexcept {
  switch (interpolation) {
    case Interpolation::kNearest:
      return "nearest";
    case Interpolation::kBilinear:
      return "bilinear";
    case Interpolation::kBicubic:
      return "bicubic";
  }
  return "?";
}

Interpolation parse_interpolation(std::string_view name) {
  if (name == "nearest") return Interpolation::kNearest;
  if (name == "bilinear") return Interpolation::kBilinear;
  if (name == "bicubic") return Interpolation::kBicubic;
  throw ConfigError(str("interpolation '", name, "' is not one of nearest, bilinear, bicubic"));
}

Size2 square_or_pair(const std::vector<std::int64_t>& size, std::string_view what) {
  FERRY_CHECK(size.size() == 1 || size.size() == 2, what,
              ": size takes one number (a square) or two (height, width); got ", size.size());
  for (const auto v : size) FERRY_CHECK(v > 0, what, ": size must be positive; got ", v);
  return size.size() == 1 ? Size2{size[0], size[0]} : Size2{size[0], size[1]};
}

namespace {

std::string list_text(const std::vector<std::int64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

// Python's round(): halves to even.
std::int64_t round_half_even(double v) { return static_cast<std::int64_t>(std::nearbyint(v)); }

// A crop of `image` that may reach outside it; the outside is `fill` (Pillow's crop gives 0).
cv::Mat crop_or_fill(const cv::Mat& image,
                     std::int64_t top,
                     std::int64_t left,
                     std::int64_t h,
                     std::int64_t w,
                     int fill = 0) {
  const cv::Rect want(static_cast<int>(left), static_cast<int>(top), static_cast<int>(w),
                      static_cast<int>(h));
  const cv::Rect inside = want & cv::Rect(0, 0, image.cols, image.rows);
  if (inside == want) return image(want);
  cv::Mat out(static_cast<int>(h), static_cast<int>(w), image.type(), cv::Scalar::all(fill));
  if (!inside.empty()) {
    image(inside).copyTo(
        out(cv::Rect(inside.x - want.x, inside.y - want.y, inside.width, inside.height)));
  }
  return out;
}

cv::Mat pad(
    const cv::Mat& image, int left, int top, int right, int bottom, PaddingMode mode, int fill) {
  int border = cv::BORDER_CONSTANT;
  switch (mode) {
    case PaddingMode::kConstant:
      border = cv::BORDER_CONSTANT;
      break;
    case PaddingMode::kEdge:
      border = cv::BORDER_REPLICATE;
      break;
    case PaddingMode::kReflect:
      border = cv::BORDER_REFLECT_101;
      break;  // numpy's reflect
    case PaddingMode::kSymmetric:
      border = cv::BORDER_REFLECT;
      break;  // numpy's symmetric
  }
  cv::Mat out;
  cv::copyMakeBorder(image, out, top, bottom, left, right, border, cv::Scalar::all(fill));
  return out;
}

// The JPEG scale M/8 (M in 1..8) at which the region (w x h) still has at least `factor` times
// the output's pixels in each direction: Pillow's filter then does the last step.
int reduced_scale(double w, double h, std::int64_t out_w, std::int64_t out_h) {
  constexpr double factor = 1.0;
  for (int m = 1; m < 8; ++m) {
    if (std::floor(w * m / 8.0) >= factor * static_cast<double>(out_w) &&
        std::floor(h * m / 8.0) >= factor * static_cast<double>(out_h)) {
      return m;
    }
  }
  return 8;
}

// Resizes the file-coordinate box (left, top, width, height) of a decoded region to out_w x out_h
// (Pillow's resize of that crop: the filter stays inside the box).
cv::Mat resize_box(const detail::DecodedRegion& r,
                   double left,
                   double top,
                   double width,
                   double height,
                   std::int64_t out_w,
                   std::int64_t out_h,
                   Interpolation interpolation) {
  const double x0 = left * r.sx - r.x0;
  const double x1 = (left + width) * r.sx - r.x0;
  const double y0 = top * r.sy - r.y0;
  const double y1 = (top + height) * r.sy - r.y0;
  const int cx0 = std::clamp(static_cast<int>(std::floor(x0)), 0, r.image.cols - 1);
  const int cy0 = std::clamp(static_cast<int>(std::floor(y0)), 0, r.image.rows - 1);
  const int cx1 = std::clamp(static_cast<int>(std::ceil(x1)), cx0 + 1, r.image.cols);
  const int cy1 = std::clamp(static_cast<int>(std::ceil(y1)), cy0 + 1, r.image.rows);
  const cv::Mat roi = r.image(cv::Rect(cx0, cy0, cx1 - cx0, cy1 - cy0));
  return detail::resample(roi, detail::box_axis(x0 - cx0, x1 - cx0, static_cast<int>(out_w)),
                          detail::box_axis(y0 - cy0, y1 - cy0, static_cast<int>(out_h)),
                          interpolation);
}

bool can_decode_region(detail::ImageState& image) {
  return image.is_encoded() && image.info().format == "jpeg";
}

}  // namespace

// ---- ImageTransform ----

Example ImageTransform::operator()(Example example, SampleContext& ctx) const {
  const Field* field = example.find("image");
  if (field == nullptr) {
    throw ConfigError(
        str(describe(), " needs an 'image' field; the sample has ", example.field_names()));
  }
  detail::ImageState state = detail::ImageState::from_field(field->tensor());
  apply(state, ctx);
  example.set("image", state.to_field());
  return example;
}

std::shared_ptr<const Transform> ImageTransform::fuse(
    const std::shared_ptr<const Transform>& self,
    const std::shared_ptr<const Transform>& next) const {
  if (dynamic_cast<const ImageTransform*>(next.get()) == nullptr) return nullptr;
  return std::make_shared<Compose>(TransformList{self, next});
}

// ---- Decode ----

Decode::Decode(ImageMode mode, std::int64_t max_pixels) : mode_(mode), max_pixels_(max_pixels) {
  FERRY_CHECK(max_pixels > 0, "Decode: max_pixels must be positive; got ", max_pixels);
}

void Decode::apply(detail::ImageState& image, SampleContext&) const {
  if (image.is_encoded()) image.set_decoding(mode_, max_pixels_);
}

std::string Decode::describe() const {
  return str("Decode(mode=", to_string(mode_), ", max_pixels=", max_pixels_, ")");
}

// ---- Resize ----

Resize::Resize(Options options) : options_(std::move(options)) {
  FERRY_CHECK(options_.size.size() == 1 || options_.size.size() == 2,
              "Resize: size takes one number (the shorter side) or two (height, width); got ",
              options_.size.size());
  for (const auto v : options_.size) FERRY_CHECK(v > 0, "Resize: size must be positive; got ", v);
  if (options_.max_size) {
    FERRY_CHECK(options_.size.size() == 1,
                "Resize: max_size is only allowed when size is one number (the shorter side), "
                "as in torchvision; got size=",
                list_text(options_.size));
    FERRY_CHECK(*options_.max_size > options_.size[0], "Resize: max_size = ", *options_.max_size,
                " must be strictly greater than the requested size ", options_.size[0]);
  }
}

Size2 Resize::output_size(std::int64_t height, std::int64_t width) const {
  if (options_.size.size() == 2) return {options_.size[0], options_.size[1]};
  const bool wide = width > height;
  const std::int64_t shorter = wide ? height : width;
  const std::int64_t longer = wide ? width : height;
  std::int64_t new_short = options_.size[0];
  std::int64_t new_long = static_cast<std::int64_t>(static_cast<double>(new_short * longer) /
                                                    static_cast<double>(shorter));
  if (options_.max_size && new_long > *options_.max_size) {
    new_short = static_cast<std::int64_t>(static_cast<double>(*options_.max_size * new_short) /
                                          static_cast<double>(new_long));
    new_long = *options_.max_size;
  }
  return wide ? Size2{new_short, new_long} : Size2{new_long, new_short};
}

void Resize::apply(detail::ImageState& image, SampleContext&) const {
  const auto [h, w] = image.size(describe());
  const Size2 out = output_size(h, w);
  if (out.height == h && out.width == w) return;  // torchvision returns the image as it is
  if (can_decode_region(image) && options_.reduced_decode &&
      options_.interpolation != Interpolation::kNearest) {
    const int m =
        reduced_scale(static_cast<double>(w), static_cast<double>(h), out.width, out.height);
    detail::DecodedRegion r = image.decode({.scale_eighths = m});
    image.set_pixels(resize_box(r, 0, 0, static_cast<double>(w), static_cast<double>(h), out.width,
                                out.height, options_.interpolation));
    return;
  }
  const cv::Mat& p = image.pixels(describe());
  image.set_pixels(detail::resample(p, detail::box_axis(0, p.cols, static_cast<int>(out.width)),
                                    detail::box_axis(0, p.rows, static_cast<int>(out.height)),
                                    options_.interpolation));
}

std::string Resize::describe() const {
  std::string s = str("Resize(size=", list_text(options_.size),
                      ", interpolation=", to_string(options_.interpolation));
  if (options_.max_size) s += str(", max_size=", *options_.max_size);
  return s + ")";
}

// ---- CenterCrop ----

CenterCrop::CenterCrop(std::vector<std::int64_t> size)
    : size_(square_or_pair(size, "CenterCrop")) {}

void CenterCrop::apply(detail::ImageState& image, SampleContext&) const {
  const auto [h, w] = image.size(describe());
  if (size_.height > h || size_.width > w) {
    // torchvision pads with zeros to the crop size first (the extra pixel goes right/bottom).
    const cv::Mat& p = image.pixels(describe());
    const std::int64_t pl = size_.width > w ? (size_.width - w) / 2 : 0;
    const std::int64_t pt = size_.height > h ? (size_.height - h) / 2 : 0;
    const std::int64_t pr = size_.width > w ? (size_.width - w + 1) / 2 : 0;
    const std::int64_t pb = size_.height > h ? (size_.height - h + 1) / 2 : 0;
    cv::Mat padded = pad(p, static_cast<int>(pl), static_cast<int>(pt), static_cast<int>(pr),
                         static_cast<int>(pb), PaddingMode::kConstant, 0);
    const std::int64_t top = round_half_even((padded.rows - size_.height) / 2.0);
    const std::int64_t left = round_half_even((padded.cols - size_.width) / 2.0);
    image.set_pixels(crop_or_fill(padded, top, left, size_.height, size_.width));
    return;
  }
  const std::int64_t top = round_half_even(static_cast<double>(h - size_.height) / 2.0);
  const std::int64_t left = round_half_even(static_cast<double>(w - size_.width) / 2.0);
  if (can_decode_region(image)) {
    detail::DecodedRegion r = image.decode(
        {.window = cv::Rect(static_cast<int>(left), static_cast<int>(top),
                            static_cast<int>(size_.width), static_cast<int>(size_.height))});
    image.set_pixels(
        r.image(cv::Rect(static_cast<int>(left) - r.x0, static_cast<int>(top) - r.y0,
                         static_cast<int>(size_.width), static_cast<int>(size_.height))));
    return;
  }
  image.set_pixels(crop_or_fill(image.pixels(describe()), top, left, size_.height, size_.width));
}

std::string CenterCrop::describe() const {
  return str("CenterCrop(size=[", size_.height, ", ", size_.width, "])");
}

namespace detail {

// Resize followed by CenterCrop, as one resample of only the kept pixels: output pixel i of the
// crop uses the very coefficients of pixel (i + left) of the full resize. A file decodes only the
// rows and columns those pixels draw on.
class ResizeCenterCrop : public ImageTransform {
 public:
  ResizeCenterCrop(std::shared_ptr<const Resize> resize, std::shared_ptr<const CenterCrop> crop)
      : resize_(std::move(resize)), crop_(std::move(crop)) {}

  void apply(ImageState& image, SampleContext& ctx) const override {
    const auto [h, w] = image.size(describe());
    const Size2 out = resize_->output_size(h, w);
    const Size2 c = crop_->size();
    const Interpolation interpolation = resize_->options().interpolation;
    if (c.height > out.height || c.width > out.width || (out.height == h && out.width == w) ||
        interpolation == Interpolation::kNearest) {
      resize_->apply(image, ctx);  // padding or nothing to resize: the two steps as they are
      crop_->apply(image, ctx);
      return;
    }
    const std::int64_t top = round_half_even(static_cast<double>(out.height - c.height) / 2.0);
    const std::int64_t left = round_half_even(static_cast<double>(out.width - c.width) / 2.0);
    if (can_decode_region(image)) {
      // The file region the kept pixels draw on (the filter's support, plus one for rounding).
      const double scale_x = static_cast<double>(w) / static_cast<double>(out.width);
      const double scale_y = static_cast<double>(h) / static_cast<double>(out.height);
      const double support = interpolation == Interpolation::kBicubic ? 2.0 : 1.0;
      const double mx = support * std::max(scale_x, 1.0) + 1.0;
      const double my = support * std::max(scale_y, 1.0) + 1.0;
      const int x0 = std::max(0, static_cast<int>(std::floor(left * scale_x - mx)));
      const int y0 = std::max(0, static_cast<int>(std::floor(top * scale_y - my)));
      const int x1 = std::min<int>(static_cast<int>(w),
                                   static_cast<int>(std::ceil((left + c.width) * scale_x + mx)));
      const int y1 = std::min<int>(static_cast<int>(h),
                                   static_cast<int>(std::ceil((top + c.height) * scale_y + my)));
      const int m =
          resize_->options().reduced_decode
              ? reduced_scale(static_cast<double>(w), static_cast<double>(h), out.width, out.height)
              : 8;
      DecodedRegion r = image.decode({.scale_eighths = m, .window = {x0, y0, x1 - x0, y1 - y0}});
      // The full resize of the decoded image, cropped: coordinates relative to the region.
      const double full_w = static_cast<double>(w) * r.sx;  // decoded width of the whole file
      const double full_h = static_cast<double>(h) * r.sy;
      const Axis ax{-static_cast<double>(r.x0), full_w / static_cast<double>(out.width),
                    static_cast<int>(left), static_cast<int>(c.width)};
      const Axis ay{-static_cast<double>(r.y0), full_h / static_cast<double>(out.height),
                    static_cast<int>(top), static_cast<int>(c.height)};
      image.set_pixels(resample(r.image, ax, ay, interpolation));
      return;
    }
    const cv::Mat& p = image.pixels(describe());
    const Axis ax{0.0, static_cast<double>(p.cols) / static_cast<double>(out.width),
                  static_cast<int>(left), static_cast<int>(c.width)};
    const Axis ay{0.0, static_cast<double>(p.rows) / static_cast<double>(out.height),
                  static_cast<int>(top), static_cast<int>(c.height)};
    image.set_pixels(resample(p, ax, ay, interpolation));
  }

  std::string describe() const override { return resize_->describe() + ", " + crop_->describe(); }

 private:
  std::shared_ptr<const Resize> resize_;
  std::shared_ptr<const CenterCrop> crop_;
};

}  // namespace detail

// ---- RandomCrop ----

RandomCrop::RandomCrop(Options options)
    : options_(std::move(options)), size_(square_or_pair(options_.size, "RandomCrop")) {
  const auto n = options_.padding.size();
  FERRY_CHECK(n == 0 || n == 1 || n == 2 || n == 4,
              "RandomCrop: padding takes 1, 2 or 4 numbers (all sides; left/right and "
              "top/bottom; or left, top, right, bottom); got ",
              n);
  for (const auto p : options_.padding) {
    FERRY_CHECK(p >= 0, "RandomCrop: padding must be >= 0; got ", p);
  }
  FERRY_CHECK(options_.fill >= 0 && options_.fill <= 255,
              "RandomCrop: fill must be in 0..255; got ", options_.fill);
}

std::array<std::int64_t, 2> RandomCrop::get_params(std::int64_t height,
                                                   std::int64_t width,
                                                   Size2 size,
                                                   at::Generator& generator) {
  if (height < size.height || width < size.width) {
    throw DataError(str("RandomCrop: the crop (", size.height, "x", size.width,
                        ") is larger than the image (", height, "x", width,
                        "); set pad_if_needed or padding"));
  }
  if (height == size.height && width == size.width) return {0, 0};
  const std::int64_t i =
      torch::randint(0, height - size.height + 1, {1}, generator).item<std::int64_t>();
  const std::int64_t j =
      torch::randint(0, width - size.width + 1, {1}, generator).item<std::int64_t>();
  return {i, j};
}

void RandomCrop::apply(detail::ImageState& image, SampleContext& ctx) const {
  cv::Mat p = image.pixels(describe());
  const int fill = static_cast<int>(options_.fill);
  const auto& pd = options_.padding;
  if (!pd.empty()) {
    int l = 0, t = 0, r = 0, b = 0;
    if (pd.size() == 1) l = t = r = b = static_cast<int>(pd[0]);
    if (pd.size() == 2) {
      l = r = static_cast<int>(pd[0]);
      t = b = static_cast<int>(pd[1]);
    }
    if (pd.size() == 4) {
      l = static_cast<int>(pd[0]);
      t = static_cast<int>(pd[1]);
      r = static_cast<int>(pd[2]);
      b = static_cast<int>(pd[3]);
    }
    p = pad(p, l, t, r, b, options_.padding_mode, fill);
  }
  if (options_.pad_if_needed && p.cols < size_.width) {
    const int d = static_cast<int>(size_.width - p.cols);
    p = pad(p, d, 0, d, 0, options_.padding_mode, fill);
  }
  if (options_.pad_if_needed && p.rows < size_.height) {
    const int d = static_cast<int>(size_.height - p.rows);
    p = pad(p, 0, d, 0, d, options_.padding_mode, fill);
  }
  const auto [i, j] = get_params(p.rows, p.cols, size_, ctx.generator());
  image.set_pixels(p(cv::Rect(static_cast<int>(j), static_cast<int>(i),
                              static_cast<int>(size_.width), static_cast<int>(size_.height))));
}

std::string RandomCrop::describe() const {
  return str("RandomCrop(size=[", size_.height, ", ", size_.width, "])");
}

// ---- RandomResizedCrop ----

RandomResizedCrop::RandomResizedCrop(Options options)
    : options_(std::move(options)), size_(square_or_pair(options_.size, "RandomResizedCrop")) {
  FERRY_CHECK(options_.scale[0] > 0 && options_.scale[0] <= options_.scale[1],
              "RandomResizedCrop: scale must be (min, max) with 0 < min <= max; got (",
              options_.scale[0], ", ", options_.scale[1], ")");
  FERRY_CHECK(options_.ratio[0] > 0 && options_.ratio[0] <= options_.ratio[1],
              "RandomResizedCrop: ratio must be (min, max) with 0 < min <= max; got (",
              options_.ratio[0], ", ", options_.ratio[1], ")");
}

Box RandomResizedCrop::get_params(std::int64_t height,
                                  std::int64_t width,
                                  std::array<double, 2> scale,
                                  std::array<double, 2> ratio,
                                  at::Generator& generator) {
  const double area = static_cast<double>(height * width);
  // torch.log(torch.tensor(ratio)): float32.
  const torch::Tensor log_ratio =
      torch::log(torch::tensor({static_cast<float>(ratio[0]), static_cast<float>(ratio[1])}));
  const double log_lo = log_ratio[0].item<float>();
  const double log_hi = log_ratio[1].item<float>();
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area =
        area * torch::empty({1}).uniform_(scale[0], scale[1], generator).item<float>();
    const double aspect_ratio =
        torch::exp(torch::empty({1}).uniform_(log_lo, log_hi, generator)).item<float>();
    const std::int64_t w = round_half_even(std::sqrt(target_area * aspect_ratio));
    const std::int64_t h = round_half_even(std::sqrt(target_area / aspect_ratio));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const std::int64_t i = torch::randint(0, height - h + 1, {1}, generator).item<std::int64_t>();
      const std::int64_t j = torch::randint(0, width - w + 1, {1}, generator).item<std::int64_t>();
      return {i, j, h, w};
    }
  }
  // The central fallback.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  const double lo = std::min(ratio[0], ratio[1]);
  const double hi = std::max(ratio[0], ratio[1]);
  std::int64_t w = width;
  std::int64_t h = height;
  if (in_ratio < lo) {
    h = round_half_even(static_cast<double>(w) / lo);
  } else if (in_ratio > hi) {
    w = round_half_even(static_cast<double>(h) * hi);
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

void RandomResizedCrop::apply(detail::ImageState& image, SampleContext& ctx) const {
  const auto [h, w] = image.size(describe());
  const Box box = get_params(h, w, options_.scale, options_.ratio, ctx.generator());
  if (can_decode_region(image) && options_.interpolation != Interpolation::kNearest) {
    const int m = options_.reduced_decode
                      ? reduced_scale(static_cast<double>(box.width),
                                      static_cast<double>(box.height), size_.width, size_.height)
                      : 8;
    detail::DecodedRegion r = image.decode(
        {.scale_eighths = m,
         .window = cv::Rect(static_cast<int>(box.left), static_cast<int>(box.top),
                            static_cast<int>(box.width), static_cast<int>(box.height))});
    image.set_pixels(resize_box(r, static_cast<double>(box.left), static_cast<double>(box.top),
                                static_cast<double>(box.width), static_cast<double>(box.height),
                                size_.width, size_.height, options_.interpolation));
    return;
  }
  const cv::Mat& p = image.pixels(describe());
  const cv::Mat crop = p(cv::Rect(static_cast<int>(box.left), static_cast<int>(box.top),
                                  static_cast<int>(box.width), static_cast<int>(box.height)));
  if (box.height == size_.height && box.width == size_.width) {
    image.set_pixels(crop);
    return;
  }
  image.set_pixels(detail::resample(
      crop, detail::box_axis(0, crop.cols, static_cast<int>(size_.width)),
      detail::box_axis(0, crop.rows, static_cast<int>(size_.height)), options_.interpolation));
}

std::string RandomResizedCrop::describe() const {
  return str("RandomResizedCrop(size=[", size_.height, ", ", size_.width, "], scale=(",
             options_.scale[0], ", ", options_.scale[1], "), ratio=(", options_.ratio[0], ", ",
             options_.ratio[1], "))");
}

// ---- flips ----

RandomFlip::RandomFlip(bool horizontal, double p) : horizontal_(horizontal), p_(p) {
  FERRY_CHECK(p >= 0.0 && p <= 1.0, describe(), ": p must be in [0, 1]; got ", p);
}

void RandomFlip::apply(detail::ImageState& image, SampleContext& ctx) const {
  // torchvision: `if torch.rand(1) < self.p` (a float32 comparison).
  if (!(torch::rand({1}, ctx.generator()) < p_).item<bool>()) return;
  cv::Mat flipped;
  cv::flip(image.pixels(describe()), flipped, horizontal_ ? 1 : 0);
  image.set_pixels(std::move(flipped));
}

std::string RandomFlip::describe() const {
  return str(horizontal_ ? "RandomHorizontalFlip" : "RandomVerticalFlip", "(p=", p_, ")");
}

// ---- ToTensor, Normalize ----

namespace {

// C x H x W float32 from H x W x C uint8 through a per-channel table of 256 values, written
// where the sample's `image` field will lie in its batch when the loader knows (ctx.output).
torch::Tensor planar_from_table(const cv::Mat& p,
                                const std::vector<std::array<float, 256>>& lut,
                                SampleContext& ctx) {
  const int c = p.channels();
  torch::Tensor out = ctx.output("image", {c, p.rows, p.cols}, torch::kFloat32);
  float* o = out.data_ptr<float>();
  const std::size_t plane = static_cast<std::size_t>(p.rows) * p.cols;
  for (int y = 0; y < p.rows; ++y) {
    const std::uint8_t* in = p.ptr<std::uint8_t>(y);
    const std::size_t row = static_cast<std::size_t>(y) * p.cols;
    for (int ch = 0; ch < c; ++ch) {
      const std::array<float, 256>& t = lut[static_cast<std::size_t>(ch)];
      float* dst = o + ch * plane + row;
      for (int x = 0; x < p.cols; ++x) dst[x] = t[in[x * c + ch]];
    }
  }
  return out;
}

std::vector<std::array<float, 256>> table(int channels,
                                          const std::vector<double>* mean,
                                          const std::vector<double>* std) {
  std::vector<std::array<float, 256>> lut(static_cast<std::size_t>(channels));
  for (int ch = 0; ch < channels; ++ch) {
    for (int u = 0; u < 256; ++u) {
      // The float32 operations torchvision performs: x.div(255), then sub_(mean).div_(std).
      float v = static_cast<float>(u) / 255.0f;
      if (mean != nullptr) {
        const std::size_t k = mean->size() == 1 ? 0 : static_cast<std::size_t>(ch);
        v = (v - static_cast<float>((*mean)[k])) / static_cast<float>((*std)[k]);
      }
      lut[static_cast<std::size_t>(ch)][static_cast<std::size_t>(u)] = v;
    }
  }
  return lut;
}

void check_channels(const std::vector<double>& v, int channels, const std::string& who) {
  FERRY_CHECK(v.size() == 1 || static_cast<int>(v.size()) == channels, who, ": ", v.size(),
              " values for an image of ", channels, " channels; give 1 or ", channels);
}

}  // namespace

ToTensor::ToTensor(bool uint8) : uint8_(uint8) {}

void ToTensor::apply(detail::ImageState& image, SampleContext& ctx) const {
  const cv::Mat& p = image.pixels(describe());
  if (uint8_) {
    torch::Tensor hwc = detail::to_tensor(p.isContinuous() && p.u != nullptr ? p : p.clone());
    torch::Tensor chw = ctx.output("image", {p.channels(), p.rows, p.cols}, torch::kUInt8);
    chw.copy_(hwc.permute({2, 0, 1}));
    image.set_tensor(std::move(chw));
    return;
  }
  image.set_tensor(planar_from_table(p, table(p.channels(), nullptr, nullptr), ctx));
}

std::string ToTensor::describe() const { return uint8_ ? "PILToTensor()" : "ToTensor()"; }

Normalize::Normalize(std::vector<double> mean, std::vector<double> std)
    : mean_(std::move(mean)), std_(std::move(std)) {
  FERRY_CHECK(!mean_.empty() && !std_.empty() &&
                  (mean_.size() == std_.size() || std_.size() == 1 || mean_.size() == 1),
              "Normalize: mean and std need one value per channel (or one for all); got ",
              mean_.size(), " and ", std_.size());
  for (const double s : std_) {
    FERRY_CHECK(s != 0.0, "Normalize: std evaluated to zero, leading to division by zero");
  }
}

void Normalize::apply(detail::ImageState& image, SampleContext&) const {
  torch::Tensor& t = image.tensor(describe());
  FERRY_CHECK(t.is_floating_point(), describe(), " needs a floating-point tensor; got ",
              t.scalar_type(), " (use ToTensor, not PILToTensor, before it)");
  FERRY_CHECK(t.dim() >= 3, describe(), " needs a C x H x W tensor; got shape ", t.sizes());
  const int channels = static_cast<int>(t.size(-3));
  check_channels(mean_, channels, describe());
  check_channels(std_, channels, describe());
  const auto options = torch::TensorOptions().dtype(t.scalar_type());
  const torch::Tensor m = torch::tensor(mean_, torch::kFloat64).to(options).view({-1, 1, 1});
  const torch::Tensor s = torch::tensor(std_, torch::kFloat64).to(options).view({-1, 1, 1});
  image.set_tensor(t.sub(m).div_(s));
}

std::string Normalize::describe() const {
  std::ostringstream os;
  os << "Normalize(mean=[";
  for (std::size_t i = 0; i < mean_.size(); ++i) os << (i ? ", " : "") << mean_[i];
  os << "], std=[";
  for (std::size_t i = 0; i < std_.size(); ++i) os << (i ? ", " : "") << std_[i];
  os << "])";
  return os.str();
}

namespace detail {

// ToTensor then Normalize in one pass over the pixels (a table of the same float32 results).
class NormalizedToTensor : public ImageTransform {
 public:
  explicit NormalizedToTensor(std::shared_ptr<const Normalize> normalize)
      : normalize_(std::move(normalize)) {}

  void apply(ImageState& image, SampleContext& ctx) const override {
    const cv::Mat& p = image.pixels(describe());
    check_channels(normalize_->mean(), p.channels(), normalize_->describe());
    check_channels(normalize_->std(), p.channels(), normalize_->describe());
    image.set_tensor(
        planar_from_table(p, table(p.channels(), &normalize_->mean(), &normalize_->std()), ctx));
  }

  std::string describe() const override { return "ToTensor(), " + normalize_->describe(); }

 private:
  std::shared_ptr<const Normalize> normalize_;
};

}  // namespace detail

// ---- Compose ----

Compose::Compose(TransformList transforms) : transforms_(std::move(transforms)) {
  TransformList flat;
  for (const auto& t : transforms_) {
    FERRY_CHECK(t != nullptr, "Compose: a transform is null");
    if (const auto* inner = dynamic_cast<const Compose*>(t.get())) {
      flat.insert(flat.end(), inner->steps_.begin(), inner->steps_.end());
    } else {
      flat.push_back(t);
    }
  }
  for (const auto& t : flat) {
    if (!steps_.empty()) {
      const auto& prev = steps_.back();
      const auto resize = std::dynamic_pointer_cast<const Resize>(prev);
      const auto crop = std::dynamic_pointer_cast<const CenterCrop>(t);
      if (resize && crop) {
        steps_.back() = std::make_shared<detail::ResizeCenterCrop>(resize, crop);
        continue;
      }
      const auto to_tensor = std::dynamic_pointer_cast<const ToTensor>(prev);
      const auto normalize = std::dynamic_pointer_cast<const Normalize>(t);
      if (to_tensor && !to_tensor->uint8() && normalize) {
        steps_.back() = std::make_shared<detail::NormalizedToTensor>(normalize);
        continue;
      }
    }
    steps_.push_back(t);
  }
}

Example Compose::operator()(Example example, SampleContext& ctx) const {
  return run_steps(std::move(example), nullptr, ctx);
}

Example Compose::run(Example example, detail::ImageState& image, SampleContext& ctx) const {
  return run_steps(std::move(example), &image, ctx);
}

Example Compose::run_steps(Example example, detail::ImageState* start, SampleContext& ctx) const {
  std::optional<detail::ImageState> own;
  detail::ImageState* image = start;  // the current image, or null: the sample's field holds it
  for (const auto& step : steps_) {
    if (const auto* it = dynamic_cast<const ImageTransform*>(step.get())) {
      if (image == nullptr) {
        const Field* field = example.find("image");
        if (field == nullptr) {
          throw ConfigError(str(it->describe(), " needs an 'image' field; the sample has ",
                                example.field_names()));
        }
        own = detail::ImageState::from_field(field->tensor());
        image = &*own;
      }
      it->apply(*image, ctx);
    } else {
      if (image != nullptr) example.set("image", image->to_field());
      image = nullptr;
      example = (*step)(std::move(example), ctx);
    }
  }
  if (image != nullptr) example.set("image", image->to_field());
  return example;
}

void Compose::apply(detail::ImageState& image, SampleContext& ctx) const {
  for (const auto& step : steps_) {
    const auto* it = dynamic_cast<const ImageTransform*>(step.get());
    FERRY_CHECK(it != nullptr,
                "Compose: a transform that is not an image transform cannot run "
                "inside a nested image pipeline");
    it->apply(image, ctx);
  }
}

std::string Compose::describe() const {
  std::string s = "Compose(";
  for (std::size_t i = 0; i < steps_.size(); ++i) {
    const auto* it = dynamic_cast<const ImageTransform*>(steps_[i].get());
    s += (i ? ", " : "") + (it ? it->describe() : std::string("<transform>"));
  }
  return s + ")";
}

}  // namespace ferry::vision
