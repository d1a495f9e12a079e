#include "transforms/codec.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>

// libjpeg and libpng are C; jpeglib.h needs <cstdio> first.
#include <jpeglib.h>
// After jpeglib.h: the message codes (JWRN_JPEG_EOF).
#include <jerror.h>
#include <png.h>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "ferry/error.h"

namespace ferry::vision {

std::string_view to_string(ImageMode mode) noexcept {
  switch (mode) {
    case ImageMode::kRGB:
      return "rgb";
    case ImageMode::kGray:
      return "gray";
    case ImageMode::kUnchanged:
      return "unchanged";
  }
  return "?";
}

ImageMode parse_image_mode(std::string_view name) {
  if (name == "rgb") return ImageMode::kRGB;
  if (name == "gray") return ImageMode::kGray;
  if (name == "unchanged") return ImageMode::kUnchanged;
  throw ConfigError(
      ferry::detail::str("image mode '", name, "' is not one of rgb, gray, unchanged"));
}

namespace detail {
namespace {

using ferry::detail::str;

constexpr std::uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

bool is_png(std::span<const std::uint8_t> b) {
  return b.size() >= 8 && std::memcmp(b.data(), kPngSignature, 8) == 0;
}
bool is_jpeg(std::span<const std::uint8_t> b) {
  return b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF;
}

std::uint32_t be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         p[3];
}
std::uint16_t be16(const std::uint8_t* p) { return static_cast<std::uint16_t>((p[0] << 8) | p[1]); }

ImageInfo probe_png(std::span<const std::uint8_t> b) {
  // signature (8), IHDR length (4) and type (4), then width, height, depth, colour type.
  if (b.size() < 8 + 8 + 13) {
    throw DataError(str("PNG header cut short: ", b.size(), " bytes, the header needs 29"));
  }
  if (std::memcmp(b.data() + 12, "IHDR", 4) != 0) {
    throw DataError("PNG is malformed: its first chunk is not IHDR");
  }
  ImageInfo info{.format = "png"};
  info.width = be32(b.data() + 16);
  info.height = be32(b.data() + 20);
  info.bit_depth = b[24];
  switch (b[25]) {
    case 0:
      info.channels = 1;
      break;  // gray
    case 2:
      info.channels = 3;
      break;  // RGB
    case 3:
      info.channels = 3;
      break;  // palette
    case 4:
      info.channels = 2;
      break;  // gray + alpha
    case 6:
      info.channels = 4;
      break;  // RGBA
    default:
      throw DataError(str("PNG is malformed: colour type ", int{b[25]}, " is not defined"));
  }
  if (info.width == 0 || info.height == 0) {
    throw DataError(str("PNG header declares ", info.width, "x", info.height, " pixels"));
  }
  return info;
}

ImageInfo probe_jpeg(std::span<const std::uint8_t> b) {
  std::size_t pos = 2;
  while (true) {
    while (pos < b.size() && b[pos] != 0xFF) ++pos;  // tolerate fill bytes, as libjpeg does
    while (pos < b.size() && b[pos] == 0xFF) ++pos;
    if (pos >= b.size()) {
      throw DataError(str("JPEG cut short: no frame header (SOF) in its ", b.size(), " bytes"));
    }
    const std::uint8_t marker = b[pos++];
    if (marker == 0xD8 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;
    if (marker == 0xD9 || marker == 0xDA) {
      throw DataError("JPEG is malformed: image data starts before the frame header (SOF)");
    }
    if (pos + 2 > b.size()) throw DataError(str("JPEG cut short at byte ", pos));
    const std::size_t length = be16(b.data() + pos);
    const bool sof =
        marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
    if (sof) {
      if (pos + 8 > b.size()) throw DataError(str("JPEG frame header cut short at byte ", pos));
      ImageInfo info{.format = "jpeg"};
      info.height = be16(b.data() + pos + 3);
      info.width = be16(b.data() + pos + 5);
      info.channels = b[pos + 7];
      info.bit_depth = b[pos + 2];
      if (info.width == 0 || info.height == 0) {
        throw DataError(
            str("JPEG frame header declares ", info.width, "x", info.height, " pixels"));
      }
      return info;
    }
    if (length < 2) throw DataError(str("JPEG is malformed: segment length ", length));
    pos += length;
  }
}

void check_pixels(const ImageInfo& info, std::int64_t max_pixels) {
  const double pixels = static_cast<double>(info.width) * static_cast<double>(info.height);
  if (pixels > static_cast<double>(max_pixels)) {
    throw DataError(str(info.format, " header declares ", info.width, "x", info.height, " = ",
                        static_cast<std::int64_t>(pixels), " pixels, over max_pixels (", max_pixels,
                        "); refused before decoding (a decompression bomb, or raise "
                        "max_pixels for really large images)"));
  }
}

// ---- JPEG (libjpeg-turbo) ----
// libjpeg reports errors by calling error_exit, which must not return: it longjmps back to the
// function that called into libjpeg. Those functions hold only trivially destructible locals.

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void jpeg_emit_message(j_common_ptr cinfo, int level) {
  // A truncated file is a warning to libjpeg (it pads with gray); like Pillow, make it an error.
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) jpeg_error_exit(cinfo);
}

struct JpegDecoder {
  jpeg_decompress_struct cinfo{};
  JpegError error{};
  bool created = false;
  ~JpegDecoder() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

bool jpeg_start(JpegDecoder& d,
                std::span<const std::uint8_t> bytes,
                J_COLOR_SPACE out_space,
                int scale_eighths) {
  d.cinfo.err = jpeg_std_error(&d.error.mgr);
  d.error.mgr.error_exit = jpeg_error_exit;
  d.error.mgr.emit_message = jpeg_emit_message;
  if (setjmp(d.error.jump)) return false;
  jpeg_create_decompress(&d.cinfo);
  d.created = true;
  jpeg_mem_src(&d.cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&d.cinfo, TRUE);
  d.cinfo.out_color_space = out_space;
  d.cinfo.scale_num = static_cast<unsigned>(scale_eighths);
  d.cinfo.scale_denom = 8;
  jpeg_start_decompress(&d.cinfo);
  return true;
}

bool jpeg_crop(JpegDecoder& d, JDIMENSION* x, JDIMENSION* width, JDIMENSION skip_rows) {
  if (setjmp(d.error.jump)) return false;
  if (*width < d.cinfo.output_width) jpeg_crop_scanline(&d.cinfo, x, width);
  if (skip_rows > 0) jpeg_skip_scanlines(&d.cinfo, skip_rows);
  return true;
}

bool jpeg_read_rows(JpegDecoder& d, std::uint8_t* out, std::size_t stride, JDIMENSION rows) {
  if (setjmp(d.error.jump)) return false;
  for (JDIMENSION r = 0; r < rows;) {
    JSAMPROW row = out + r * stride;
    const JDIMENSION n = jpeg_read_scanlines(&d.cinfo, &row, 1);
    if (n == 0) {  // no more rows where the window expected some: never spin
      std::snprintf(d.error.message, sizeof d.error.message, "image data ended at row %u of %u",
                    static_cast<unsigned>(r), static_cast<unsigned>(rows));
      return false;
    }
    r += n;
  }
  jpeg_abort_decompress(&d.cinfo);  // the rest of the file is not needed
  return true;
}

// Pillow's CMYK to RGB: inverted (Adobe) CMYK is first un-inverted, then each channel is
// (255 - k) - c * (255 - k) / 255, rounded as Pillow's MULDIV255.
cv::Mat cmyk_to_rgb(const cv::Mat& cmyk, bool adobe_inverted) {
  cv::Mat rgb(cmyk.rows, cmyk.cols, CV_8UC3);
  for (int y = 0; y < cmyk.rows; ++y) {
    const std::uint8_t* in = cmyk.ptr<std::uint8_t>(y);
    std::uint8_t* out = rgb.ptr<std::uint8_t>(y);
    for (int x = 0; x < cmyk.cols; ++x, in += 4, out += 3) {
      const int inv = adobe_inverted ? 255 : 0;
      const int nk = 255 - (in[3] ^ inv);
      for (int c = 0; c < 3; ++c) {
        const int tmp = (in[c] ^ inv) * nk + 128;
        out[c] = static_cast<std::uint8_t>(std::clamp(nk - (((tmp >> 8) + tmp) >> 8), 0, 255));
      }
    }
  }
  return rgb;
}

DecodedRegion decode_jpeg(std::span<const std::uint8_t> bytes,
                          const ImageInfo& info,
                          const DecodeRequest& request) {
  const bool gray_file = info.channels == 1;
  const bool cmyk = info.channels == 4;
  J_COLOR_SPACE space = JCS_RGB;
  if (gray_file) space = JCS_GRAYSCALE;
  if (cmyk) space = JCS_CMYK;
  JpegDecoder d;
  if (!jpeg_start(d, bytes, space, std::clamp(request.scale_eighths, 1, 8))) {
    throw DataError(str("JPEG decoder: ", d.error.message));
  }
  DecodedRegion region;
  region.full_width = d.cinfo.image_width;
  region.full_height = d.cinfo.image_height;
  region.sx = static_cast<double>(d.cinfo.output_width) / d.cinfo.image_width;
  region.sy = static_cast<double>(d.cinfo.output_height) / d.cinfo.image_height;

  // The window in scaled pixels, widened to whole pixels.
  JDIMENSION x = 0;
  JDIMENSION width = d.cinfo.output_width;
  JDIMENSION top = 0;
  JDIMENSION rows = d.cinfo.output_height;
  if (!request.window.empty()) {
    const cv::Rect& w = request.window;
    const auto lo = [](double v, JDIMENSION limit) {
      return static_cast<JDIMENSION>(std::clamp(std::floor(v), 0.0, double(limit)));
    };
    const auto hi = [](double v, JDIMENSION limit) {
      return static_cast<JDIMENSION>(std::clamp(std::ceil(v), 0.0, double(limit)));
    };
    // Chroma upsampling reads neighbouring samples, so pixels at the edge of a cropped decode
    // differ from a full decode's; a margin of one iMCU keeps the wanted pixels identical.
    constexpr double margin = 16;
    x = lo(w.x * region.sx - margin, d.cinfo.output_width);
    const JDIMENSION x_end = hi((w.x + w.width) * region.sx + margin, d.cinfo.output_width);
    top = lo(w.y * region.sy - margin, d.cinfo.output_height);
    const JDIMENSION y_end = hi((w.y + w.height) * region.sy + margin, d.cinfo.output_height);
    width = std::max<JDIMENSION>(1, x_end - x);
    rows = std::max<JDIMENSION>(1, y_end - top);
    if (!jpeg_crop(d, &x, &width, top)) throw DataError(str("JPEG decoder: ", d.error.message));
  }
  const int channels = d.cinfo.output_components;
  cv::Mat out(static_cast<int>(rows), static_cast<int>(d.cinfo.output_width), CV_8UC(channels));
  if (!jpeg_read_rows(d, out.data, out.step, rows)) {
    throw DataError(str("JPEG decoder: ", d.error.message));
  }
  // Pillow reads every CMYK JPEG as inverted (Adobe's convention), marker or not.
  if (cmyk) out = cmyk_to_rgb(out, /*adobe_inverted=*/true);
  region.x0 = static_cast<int>(x);
  region.y0 = static_cast<int>(top);

  if (gray_file && request.mode == ImageMode::kRGB) {
    cv::cvtColor(out, out, cv::COLOR_GRAY2RGB);
  } else if (!gray_file && request.mode == ImageMode::kGray) {
    out = rgb_to_gray(out);
  }
  region.image = std::move(out);
  return region;
}

// ---- PNG (libpng) ----

struct PngSource {
  std::span<const std::uint8_t> bytes;
  std::size_t offset = 0;
};

struct PngError {
  std::jmp_buf jump;
  char message[256];
};

void png_on_error(png_structp png, png_const_charp message) {
  auto* err = static_cast<PngError*>(png_get_error_ptr(png));
  std::snprintf(err->message, sizeof err->message, "%s", message);
  std::longjmp(err->jump, 1);
}
void png_on_warning(png_structp, png_const_charp) {}

void png_read_from(png_structp png, png_bytep out, png_size_t length) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (src->offset + length > src->bytes.size()) {
    char message[128];
    std::snprintf(message, sizeof message, "file cut short: %zu bytes needed at byte %zu of %zu",
                  static_cast<std::size_t>(length), src->offset, src->bytes.size());
    png_error(png, message);
  }
  std::memcpy(out, src->bytes.data() + src->offset, length);
  src->offset += length;
}

struct PngDecoder {
  png_structp png = nullptr;
  png_infop info = nullptr;
  PngError error{};
  PngSource source;
  ~PngDecoder() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
};

// Sets up the transformations and returns the output's channels and depth.
bool png_prepare(PngDecoder& d, ImageMode mode, int* channels, int* depth) {
  if (setjmp(d.error.jump)) return false;
  png_set_read_fn(d.png, &d.source, png_read_from);
  png_read_info(d.png, d.info);
  const int type = png_get_color_type(d.png, d.info);
  const int bits = png_get_bit_depth(d.png, d.info);
  if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(d.png);
  if (type == PNG_COLOR_TYPE_GRAY && bits < 8) png_set_expand_gray_1_2_4_to_8(d.png);
  if (mode == ImageMode::kUnchanged) {
    if (png_get_valid(d.png, d.info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(d.png);
    if (bits == 16) png_set_swap(d.png);  // host order for uint16
  } else {
    if (bits == 16) png_set_strip_16(d.png);  // keep the high byte, as Pillow
    png_set_strip_alpha(d.png);               // Pillow's convert drops alpha
    if (mode == ImageMode::kRGB) png_set_gray_to_rgb(d.png);
  }
  png_set_interlace_handling(d.png);
  png_read_update_info(d.png, d.info);
  *channels = png_get_channels(d.png, d.info);
  *depth = png_get_bit_depth(d.png, d.info);
  return true;
}

bool png_read_pixels(PngDecoder& d, png_bytepp rows) {
  if (setjmp(d.error.jump)) return false;
  png_read_image(d.png, rows);
  return true;
}

DecodedRegion decode_png(std::span<const std::uint8_t> bytes, const DecodeRequest& request) {
  PngDecoder d;
  d.source.bytes = bytes;
  d.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &d.error, png_on_error, png_on_warning);
  if (d.png == nullptr) throw DataError("PNG decoder: out of memory");
  d.info = png_create_info_struct(d.png);
  if (d.info == nullptr) throw DataError("PNG decoder: out of memory");
  int channels = 0;
  int depth = 0;
  if (!png_prepare(d, request.mode, &channels, &depth)) {
    throw DataError(str("PNG decoder: ", d.error.message));
  }
  const int height = static_cast<int>(png_get_image_height(d.png, d.info));
  const int width = static_cast<int>(png_get_image_width(d.png, d.info));
  cv::Mat out(height, width, CV_MAKETYPE(depth == 16 ? CV_16U : CV_8U, channels));
  std::vector<png_bytep> rows(static_cast<std::size_t>(height));
  for (int y = 0; y < height; ++y) rows[static_cast<std::size_t>(y)] = out.ptr<png_byte>(y);
  FERRY_ASSERT(png_get_rowbytes(d.png, d.info) == out.step[0],
               "libpng's row size differs from the planned image row");
  if (!png_read_pixels(d, rows.data())) throw DataError(str("PNG decoder: ", d.error.message));
  if (request.mode == ImageMode::kGray && channels == 3) out = rgb_to_gray(out);
  DecodedRegion region;
  region.full_width = width;
  region.full_height = height;
  region.image = std::move(out);
  return region;
}

// ---- everything else (BMP, PPM, TIFF, WebP): OpenCV ----

DecodedRegion decode_other(std::span<const std::uint8_t> bytes, const DecodeRequest& request) {
  const cv::Mat raw(1, static_cast<int>(bytes.size()), CV_8U,
                    const_cast<std::uint8_t*>(bytes.data()));
  cv::Mat image;
  try {
    image = cv::imdecode(raw, cv::IMREAD_UNCHANGED);
  } catch (const cv::Exception& e) {
    throw DataError(str("OpenCV decoder: ", e.what()));
  }
  if (image.empty()) {
    throw DataError(
        "not a JPEG or PNG, and OpenCV cannot decode it either (unknown format, or "
        "the file is corrupt or truncated)");
  }
  if (static_cast<double>(image.rows) * image.cols > static_cast<double>(request.max_pixels)) {
    throw DataError(str("image has ", image.cols, "x", image.rows, " pixels, over max_pixels (",
                        request.max_pixels, ")"));
  }
  const bool keep16 = request.mode == ImageMode::kUnchanged;
  if (image.depth() == CV_16U && !keep16) image.convertTo(image, CV_8U, 1.0 / 256.0);
  if (image.depth() != CV_8U && image.depth() != CV_16U) {
    throw DataError(str("OpenCV decoded pixels of depth ", image.depth(),
                        "; only 8- and 16-bit images are supported"));
  }
  const int c = image.channels();
  cv::Mat out;
  if (request.mode == ImageMode::kUnchanged) {
    if (c == 3)
      cv::cvtColor(image, out, cv::COLOR_BGR2RGB);
    else if (c == 4)
      cv::cvtColor(image, out, cv::COLOR_BGRA2RGBA);
    else
      out = image;
  } else {
    if (c == 1)
      out = image;
    else if (c == 3)
      cv::cvtColor(image, out, cv::COLOR_BGR2RGB);
    else
      cv::cvtColor(image, out, cv::COLOR_BGRA2RGB);
    if (request.mode == ImageMode::kRGB && out.channels() == 1) {
      cv::cvtColor(out, out, cv::COLOR_GRAY2RGB);
    } else if (request.mode == ImageMode::kGray && out.channels() == 3) {
      out = rgb_to_gray(out);
    }
  }
  DecodedRegion region;
  region.full_width = out.cols;
  region.full_height = out.rows;
  region.image = std::move(out);
  return region;
}

}  // namespace

ImageInfo probe(std::span<const std::uint8_t> bytes) {
  if (bytes.empty()) throw DataError("empty file (0 bytes)");
  if (is_jpeg(bytes)) return probe_jpeg(bytes);
  if (is_png(bytes)) return probe_png(bytes);
  return ImageInfo{.format = "other", .channels = 0};
}

DecodedRegion decode(std::span<const std::uint8_t> bytes, const DecodeRequest& request) {
  const ImageInfo info = request.info != nullptr ? *request.info : probe(bytes);
  if (info.format != "other") check_pixels(info, request.max_pixels);
  if (info.format == "jpeg") return decode_jpeg(bytes, info, request);
  if (info.format == "png") return decode_png(bytes, request);
  return decode_other(bytes, request);
}

cv::Mat rgb_to_gray(const cv::Mat& rgb) {
  FERRY_ASSERT(rgb.type() == CV_8UC3, "rgb_to_gray needs 8-bit RGB");
  cv::Mat gray(rgb.rows, rgb.cols, CV_8UC1);
  for (int y = 0; y < rgb.rows; ++y) {
    const std::uint8_t* in = rgb.ptr<std::uint8_t>(y);
    std::uint8_t* out = gray.ptr<std::uint8_t>(y);
    for (int x = 0; x < rgb.cols; ++x, in += 3) {
      out[x] =
          static_cast<std::uint8_t>((in[0] * 19595 + in[1] * 38470 + in[2] * 7471 + 0x8000) >> 16);
    }
  }
  return gray;
}

torch::Tensor to_tensor(cv::Mat image) {
  FERRY_ASSERT(image.depth() == CV_8U || image.depth() == CV_16U, "8- or 16-bit image expected");
  // LibTorch 1.13 has no uint16: 16-bit pixels widen to int32, as torchvision's decode_png.
  if (image.depth() == CV_16U) image.convertTo(image, CV_32S);
  if (!image.isContinuous()) image = image.clone();
  const auto dtype = image.depth() == CV_8U ? torch::kUInt8 : torch::kInt32;
  auto* keep = new cv::Mat(image);
  return torch::from_blob(
      keep->data, {image.rows, image.cols, image.channels()}, [keep](void*) { delete keep; },
      torch::TensorOptions().dtype(dtype));
}

cv::Mat to_mat(const torch::Tensor& hwc) {
  FERRY_CHECK(hwc.dim() == 3 || hwc.dim() == 2,
              "an image tensor is H x W x C (or H x W); got shape ", hwc.sizes());
  FERRY_CHECK(hwc.scalar_type() == torch::kUInt8, "image transforms take uint8 images; got ",
              hwc.scalar_type(), " (decode with mode rgb or gray, or convert first)");
  FERRY_CHECK(hwc.is_contiguous() && hwc.device().is_cpu(),
              "an image tensor must be a contiguous CPU tensor");
  const int channels = hwc.dim() == 3 ? static_cast<int>(hwc.size(2)) : 1;
  FERRY_CHECK(channels >= 1 && channels <= 4, "an image has 1 to 4 channels; got ", channels);
  return cv::Mat(static_cast<int>(hwc.size(0)), static_cast<int>(hwc.size(1)), CV_8UC(channels),
                 hwc.data_ptr());
}

}  // namespace detail

ImageInfo probe_image(std::span<const std::uint8_t> bytes) { return detail::probe(bytes); }

torch::Tensor decode_image(std::span<const std::uint8_t> bytes,
                           ImageMode mode,
                           std::int64_t max_pixels) {
  cv::Mat image = detail::decode(bytes, {.mode = mode, .max_pixels = max_pixels}).image;
  return detail::to_tensor(std::move(image));
}

ImageFormat parse_image_format(std::string_view name) {
  if (name == "jpeg" || name == "jpg") return ImageFormat::kJpeg;
  if (name == "png") return ImageFormat::kPng;
  if (name == "webp") return ImageFormat::kWebp;
  throw ConfigError(
      ferry::detail::str("image format '", name, "': expected one of jpeg, png, webp"));
}

std::string_view to_string(ImageFormat format) noexcept {
  switch (format) {
    case ImageFormat::kPng:
      return "png";
    case ImageFormat::kWebp:
      return "webp";
    case ImageFormat::kJpeg:
      break;
  }
  return "jpeg";
}

std::string_view extension_of(ImageFormat format) noexcept {
  return format == ImageFormat::kJpeg ? "jpg" : to_string(format);
}

bool can_encode(ImageFormat format) {
  return cv::haveImageWriter(ferry::detail::str(".", extension_of(format)));
}

std::vector<std::uint8_t> encode_image(const torch::Tensor& hwc, ImageFormat format, int quality) {
  FERRY_CHECK(hwc.scalar_type() == torch::kUInt8 && (hwc.dim() == 2 || hwc.dim() == 3),
              "encode_image: expected an H x W x C uint8 image; got ", hwc.scalar_type(),
              " of shape ", hwc.sizes(), " (the job writes 8-bit images: leave to_tensor and ",
              "normalize to the training pipeline)");
  const torch::Tensor pixels = hwc.contiguous();
  cv::Mat image = detail::to_mat(pixels);
  FERRY_CHECK(image.channels() == 1 || image.channels() == 3, "encode_image: ", image.channels(),
              " channels; JPEG, PNG and WebP are written ", "from 1 (gray) or 3 (RGB)");
  cv::Mat bgr;
  if (image.channels() == 3) {
    cv::cvtColor(image, bgr, cv::COLOR_RGB2BGR);
  } else {
    bgr = image;
  }
  std::vector<int> params;
  const char* ext = ".jpg";
  switch (format) {
    case ImageFormat::kJpeg:
      FERRY_CHECK(quality >= 1 && quality <= 100, "JPEG quality must be in [1, 100]; got ",
                  quality);
      params = {cv::IMWRITE_JPEG_QUALITY, quality};
      break;
    case ImageFormat::kPng:
      ext = ".png";
      params = {cv::IMWRITE_PNG_COMPRESSION, 6};  // Pillow's and zlib's default level
      break;
    case ImageFormat::kWebp:
      FERRY_CHECK(quality >= 1 && quality <= 100, "WebP quality must be in [1, 100]; got ",
                  quality);
      ext = ".webp";
      params = {cv::IMWRITE_WEBP_QUALITY, quality};
      break;
  }
  if (!cv::haveImageWriter(ext)) {
    throw Error(ferry::detail::str("this OpenCV cannot write ", to_string(format),
                                   " images; choose jpeg or png"));
  }
  std::vector<std::uint8_t> out;
  if (!cv::imencode(ext, bgr, out, params)) {
    throw DataError(ferry::detail::str("encoding a ", image.cols, "x", image.rows, " image as ",
                                       to_string(format), " failed"));
  }
  return out;
}

torch::Tensor read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(ferry::detail::str("cannot open ", path, ": ", std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    throw DataError(ferry::detail::str("cannot stat ", path, ": ", std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) throw DataError(ferry::detail::str(path, " is a directory"));
  torch::Tensor bytes = torch::empty({static_cast<std::int64_t>(st.st_size)}, torch::kUInt8);
  auto* out = bytes.data_ptr<std::uint8_t>();
  std::size_t done = 0;
  while (done < static_cast<std::size_t>(st.st_size)) {
    const ssize_t n = ::read(fd, out + done, static_cast<std::size_t>(st.st_size) - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw DataError(ferry::detail::str("cannot read ", path, ": ", std::strerror(errno)));
    }
    if (n == 0) break;  // shrank while reading
    done += static_cast<std::size_t>(n);
  }
  return done == static_cast<std::size_t>(st.st_size) ? bytes : bytes.narrow(0, 0, done).clone();
}

std::span<const std::uint8_t> bytes_of(const torch::Tensor& encoded) {
  FERRY_CHECK(encoded.dim() == 1 && encoded.scalar_type() == torch::kUInt8 &&
                  encoded.is_contiguous() && encoded.device().is_cpu(),
              "an encoded image is a contiguous 1-D uint8 CPU tensor; got ", encoded.scalar_type(),
              " of shape ", encoded.sizes());
  return {encoded.data_ptr<std::uint8_t>(), static_cast<std::size_t>(encoded.numel())};
}

}  // namespace ferry::vision
