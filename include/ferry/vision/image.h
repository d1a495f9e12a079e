#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <torch/types.h>

namespace ferry::vision {

/// How a file's pixels become a tensor, as torchvision's loaders do it.
enum class ImageMode {
  kRGB,        ///< 3 channels, 8 bits, as `Image.open(p).convert("RGB")`: gray is replicated,
               ///< alpha dropped, palettes expanded, CMYK converted; 16-bit keeps the high byte
  kGray,       ///< 1 channel, 8 bits, as `convert("L")` (ITU-R 601-2 luma of the RGB image)
  kUnchanged,  ///< the file's own channels (gray, gray+alpha, RGB, RGBA) and depth (8 or 16)
};
std::string_view to_string(ImageMode mode) noexcept;
/// "rgb", "gray" or "unchanged"; throws ConfigError naming the choices otherwise.
ImageMode parse_image_mode(std::string_view name);

/// Pillow's decompression-bomb limit (2 x Image.MAX_IMAGE_PIXELS): larger images are refused
/// from their header, before any pixel memory is allocated.
inline constexpr std::int64_t kDefaultMaxPixels = 178956970;

/// What a file's header says, read without decoding pixels.
struct ImageInfo {
  std::string format;  ///< "jpeg", "png", or "other" (decoded by OpenCV; no header check)
  std::int64_t width = 0;
  std::int64_t height = 0;
  int channels = 0;   ///< as stored: 1, 2, 3 or 4 (CMYK JPEGs: 4); 0 for "other"
  int bit_depth = 8;  ///< 8, or 16 for 16-bit PNGs
};

/// Reads the header of an encoded image. Throws ferry::DataError with the reason when the
/// bytes are empty, not an image, or the header is cut short or malformed.
ImageInfo probe_image(std::span<const std::uint8_t> bytes);

/// Decodes a JPEG, PNG (with libjpeg-turbo and libpng) or any other format OpenCV reads, into a
/// height x width x channels tensor (uint8; int32 for 16-bit files under kUnchanged). Throws
/// ferry::DataError with the decoder's reason for a corrupt or truncated file, and for an image
/// of more than `max_pixels` pixels: JPEGs and PNGs from their header, before allocating; other
/// formats after OpenCV decodes them (OpenCV refuses more than 2^30 pixels itself).
torch::Tensor decode_image(std::span<const std::uint8_t> bytes,
                           ImageMode mode = ImageMode::kRGB,
                           std::int64_t max_pixels = kDefaultMaxPixels);

/// The formats encode_image writes.
enum class ImageFormat { kJpeg, kPng, kWebp };
/// "jpeg" (or "jpg"), "png" or "webp"; throws ConfigError naming the choices otherwise.
ImageFormat parse_image_format(std::string_view name);
std::string_view to_string(ImageFormat format) noexcept;
/// The file extension WebDataset and image trees use: "jpg", "png", "webp".
std::string_view extension_of(ImageFormat format) noexcept;

/// Encodes an H x W x C (C = 1 or 3, RGB order) or H x W uint8 tensor. `quality` is JPEG's and
/// WebP's (1..100; WebP at 100 is lossless); PNG is lossless and takes none. The bytes are the
/// same on every run for the same pixels. Throws ferry::DataError when the encoder fails, and
/// ferry::Error when this OpenCV cannot write the format.
std::vector<std::uint8_t> encode_image(const torch::Tensor& hwc, ImageFormat format, int quality);
/// Whether this build's OpenCV writes `format` (JPEG and PNG always; WebP when built with it).
bool can_encode(ImageFormat format);

/// The bytes of a file, as a 1-D uint8 tensor (how image datasets hand an encoded file to the
/// transforms). Throws ferry::DataError naming the path and the system's reason.
torch::Tensor read_file(const std::string& path);

/// The bytes of a 1-D uint8 tensor, e.g. from read_file.
std::span<const std::uint8_t> bytes_of(const torch::Tensor& encoded);

}  // namespace ferry::vision
