#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

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

/// The bytes of a file, as a 1-D uint8 tensor (how image datasets hand an encoded file to the
/// transforms). Throws ferry::DataError naming the path and the system's reason.
torch::Tensor read_file(const std::string& path);

/// The bytes of a 1-D uint8 tensor, e.g. from read_file.
std::span<const std::uint8_t> bytes_of(const torch::Tensor& encoded);

}  // namespace ferry::vision
