#pragma once

// Image datasets with torchvision's semantics: ImageFolder (one folder per class) and ImageList
// (a file of `path,label` lines). Each sample has `image`, `label`, `index` and `path`.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ferry/dataset.h"
#include "ferry/transform.h"
#include "ferry/vision/image.h"

namespace ferry::vision {

class Compose;

/// torchvision's IMG_EXTENSIONS.
const std::vector<std::string>& default_image_extensions();

/// What image datasets share.
struct ImageDatasetOptions {
  ImageMode mode = ImageMode::kRGB;  ///< how `image` is decoded (torchvision: RGB)
  std::int64_t max_pixels = kDefaultMaxPixels;
  /// false: `image` is the file's bytes (a 1-D uint8 tensor), left for the transforms to decode.
  bool decode = true;
  /// Applied to each sample, as torchvision's `transform=`. A file is decoded straight into the
  /// first crop or resize.
  TransformList transforms{};
};

/// A map-style dataset of image files with integer labels. Loading sample i reads the file and
/// runs the transforms; a file that cannot be read or decoded raises ferry::DataError naming the
/// sample, its path and the decoder's reason.
class ImageDataset : public Dataset {
 public:
  struct Item {
    std::string path;
    std::int64_t label = 0;
  };
  std::size_t size() const override { return items_.size(); }
  Example get(std::size_t index, SampleContext& ctx) const override;
  std::shared_ptr<Dataset> with_transforms(const TransformList& transforms) const override;
  const std::vector<Item>& items() const noexcept { return items_; }
  const ImageDatasetOptions& options() const noexcept { return options_; }

 protected:
  ImageDataset(std::string name, std::vector<Item> items, ImageDatasetOptions options);
  void set_items(std::vector<Item> items) { items_ = std::move(items); }
  virtual std::shared_ptr<ImageDataset> clone() const = 0;

 private:
  void build_pipeline();

  std::string name_;
  std::vector<Item> items_;
  ImageDatasetOptions options_;
  std::shared_ptr<const Compose> pipeline_;
};

/// torchvision.datasets.ImageFolder: `root/<class>/**/<file>`; classes are the sub-folders of
/// root, sorted, numbered from 0; files are walked in sorted order and kept when their
/// extension (any case) is in `extensions`.
class ImageFolder : public ImageDataset {
 public:
  struct Options : ImageDatasetOptions {
    std::vector<std::string> extensions = default_image_extensions();
  };
  /// Scans `root`; throws ferry::DataError when root is missing, has no class folder, or a
  /// class folder holds no image file.
  explicit ImageFolder(std::string root);
  ImageFolder(std::string root, Options options);
  const std::vector<std::string>& classes() const noexcept { return classes_; }
  const std::map<std::string, std::int64_t>& class_to_idx() const noexcept { return class_to_idx_; }
  const std::string& root() const noexcept { return root_; }

 private:
  std::shared_ptr<ImageDataset> clone() const override;
  std::string root_;
  std::vector<std::string> classes_;
  std::map<std::string, std::int64_t> class_to_idx_;
};

/// Images listed in a text or CSV file, one `path,label` per line (a tab or spaces also
/// separate); paths are relative to the file's folder unless absolute. Blank lines and lines
/// starting with '#' are skipped, and so is a first line `path,label`.
class ImageList : public ImageDataset {
 public:
  /// Reads `list_file`; throws ferry::DataError naming file:line for a line without a label or
  /// with a label that is not an integer, and when the file is missing or lists nothing.
  explicit ImageList(std::string list_file, ImageDatasetOptions options = {});
  const std::string& list_file() const noexcept { return list_file_; }

 private:
  std::shared_ptr<ImageDataset> clone() const override;
  std::string list_file_;
};

}  // namespace ferry::vision
