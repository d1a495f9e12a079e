#pragma once

// Generated photo-like images: the bundled default dataset (`ferry sample-data DIR`) and the
// benchmark's images.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>

namespace ferry::vision {

struct SampleImagesOptions {
  std::size_t classes = 4;  // class0/, class1/, ...
  std::size_t images_per_class = 16;
  int width = 500;
  int height = 375;
  int quality = 90;  // JPEG quality
  std::uint32_t seed = 0;
  /// Called after each image with (written, total).
  std::function<void(std::size_t, std::size_t)> progress{};
};

/// Writes an ImageFolder of generated photo-like JPEGs under `root` (created if missing):
/// smooth gradients, overlapping soft-edged shapes, fine texture and sensor-like noise, so that
/// they decode, resize and compress like photographs. Image k of the set (class k % classes,
/// file `<k>.jpg`) depends only on (seed, k). Returns the files, sorted as ImageFolder walks them.
/// Throws ferry::DataError naming the path when a file cannot be written.
std::vector<std::filesystem::path> write_sample_images(const std::filesystem::path& root,
                                                       const SampleImagesOptions& options = {});

}  // namespace ferry::vision
