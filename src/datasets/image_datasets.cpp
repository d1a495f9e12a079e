#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include <opencv2/core.hpp>

#include "ferry/error.h"
#include "ferry/vision/datasets.h"
#include "ferry/vision/transforms.h"

#include "ipc/files.h"
#include "transforms/image_state.h"

namespace ferry::vision {

namespace fs = std::filesystem;
using ferry::detail::str;

const std::vector<std::string>& default_image_extensions() {
  static const std::vector<std::string> extensions{".jpg", ".jpeg", ".png",  ".ppm", ".bmp",
                                                   ".pgm", ".tif",  ".tiff", ".webp"};
  return extensions;
}

// ---- ImageDataset ----

ImageDataset::ImageDataset(std::string name, std::vector<Item> items, ImageDatasetOptions options)
    : name_(std::move(name)), items_(std::move(items)), options_(std::move(options)) {
  FERRY_CHECK(options_.max_pixels > 0, name_, ": max_pixels must be positive; got ",
              options_.max_pixels);
  build_pipeline();
}

void ImageDataset::build_pipeline() {
  pipeline_ =
      options_.transforms.empty() ? nullptr : std::make_shared<const Compose>(options_.transforms);
}

Example ImageDataset::get(std::size_t index, SampleContext& ctx) const {
  FERRY_CHECK(index < items_.size(), name_, ": index ", index, " is out of range (", items_.size(),
              " samples)");
  const Item& item = items_[index];
  try {
    torch::Tensor bytes = read_file(item.path);
    Example example{{"image", bytes},
                    {"label", item.label},
                    {"index", static_cast<std::int64_t>(index)},
                    {"path", item.path}};
    detail::ImageState image =
        detail::ImageState::encoded(std::move(bytes), options_.mode, options_.max_pixels);
    if (pipeline_) return pipeline_->run(std::move(example), image, ctx);
    if (options_.decode) example.set("image", image.to_field());
    return example;
  } catch (const DataError& e) {
    throw DataError(str(name_, " sample ", index, " (", item.path, "): ", e.what()));
  } catch (const cv::Exception& e) {
    throw DataError(str(name_, " sample ", index, " (", item.path, "): OpenCV: ", e.what()));
  }
}

std::shared_ptr<Dataset> ImageDataset::with_transforms(const TransformList& transforms) const {
  std::shared_ptr<ImageDataset> copy = clone();
  copy->clear_spec();  // the copy is a different dataset; whoever built it records its spec
  copy->options_.transforms.insert(copy->options_.transforms.end(), transforms.begin(),
                                   transforms.end());
  copy->build_pipeline();
  return copy;
}

// ---- ImageFolder ----

namespace {

bool has_extension(const std::string& name, const std::vector<std::string>& extensions) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return std::any_of(extensions.begin(), extensions.end(), [&](const std::string& e) {
    std::string ext = e;
    std::transform(ext.begin(), ext.end(), ext.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return lower.size() >= ext.size() &&
           lower.compare(lower.size() - ext.size(), ext.size(), ext) == 0;
  });
}

struct Scan {
  std::vector<std::string> classes;
  std::vector<ImageDataset::Item> items;
};

Scan scan_folder(const std::string& root, const std::vector<std::string>& extensions) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    throw DataError(str("ImageFolder: root ", root, " is not a folder",
                        ec ? str(" (", ec.message(), ")") : std::string(),
                        "; give the folder that holds one sub-folder per class"));
  }
  Scan scan;
  for (const ipc::DirectoryEntry& entry : ipc::list_directory(root, ec)) {
    if (entry.is_directory) scan.classes.push_back(entry.name);
  }
  if (ec) throw DataError(str("ImageFolder: cannot list ", root, ": ", ec.message()));
  std::sort(scan.classes.begin(), scan.classes.end());
  if (scan.classes.empty()) {
    throw DataError(str("ImageFolder: couldn't find any class folder in ", root,
                        " (it needs one sub-folder per class, e.g. ", root, "/cat/1.jpg)"));
  }
  std::vector<std::string> empty;
  for (std::size_t label = 0; label < scan.classes.size(); ++label) {
    // os.walk(followlinks=True), sorted: files grouped by folder, folders and names in order.
    const fs::path class_dir = fs::path(root) / scan.classes[label];
    std::vector<std::pair<std::string, std::string>> files;  // (folder, name)
    for (const fs::path& dir : ipc::folders_under(class_dir, ec)) {
      if (ec) break;
      for (const ipc::DirectoryEntry& f : ipc::list_directory(dir, ec)) {
        if (!f.is_directory && has_extension(f.name, extensions)) {
          files.emplace_back(dir.string(), f.name);
        }
      }
    }
    if (ec)
      throw DataError(str("ImageFolder: cannot list ", class_dir.string(), ": ", ec.message()));
    std::sort(files.begin(), files.end());
    if (files.empty()) empty.push_back(scan.classes[label]);
    for (const auto& [dir, name] : files) {
      scan.items.push_back({(fs::path(dir) / name).string(), static_cast<std::int64_t>(label)});
    }
  }
  if (!empty.empty()) {
    throw DataError(str("ImageFolder: found no valid file for the classes ",
                        ferry::detail::join(empty), " in ", root,
                        ". Supported extensions are: ", ferry::detail::join(extensions)));
  }
  return scan;
}

}  // namespace

ImageFolder::ImageFolder(std::string root) : ImageFolder(std::move(root), Options{}) {}

ImageFolder::ImageFolder(std::string root, Options options)
    : ImageDataset("ImageFolder", {}, options), root_(std::move(root)) {
  Scan scan = scan_folder(root_, options.extensions);
  classes_ = std::move(scan.classes);
  for (std::size_t i = 0; i < classes_.size(); ++i) {
    class_to_idx_[classes_[i]] = static_cast<std::int64_t>(i);
  }
  set_items(std::move(scan.items));
}

std::shared_ptr<ImageDataset> ImageFolder::clone() const {
  return std::make_shared<ImageFolder>(*this);
}

// ---- ImageList ----

namespace {

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

std::vector<ImageDataset::Item> read_list(const std::string& list_file) {
  std::ifstream in(list_file);
  if (!in) {
    throw DataError(str("ImageList: cannot open ", list_file, ": ", std::strerror(errno)));
  }
  const fs::path base = fs::path(list_file).parent_path();
  std::vector<ImageDataset::Item> items;
  std::string line;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    const std::string text = trim(line);
    if (text.empty() || text[0] == '#') continue;
    if (number == 1) {
      std::string lower = text;
      std::transform(lower.begin(), lower.end(), lower.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      if (lower == "path,label") continue;
    }
    auto cut = text.find_last_of(',');
    if (cut == std::string::npos) cut = text.find_last_of(" \t");
    if (cut == std::string::npos) {
      throw DataError(str("ImageList: ", list_file, ":", number, ": expected 'path,label', found '",
                          text, "' (no label column)"));
    }
    const std::string path = trim(std::string_view(text).substr(0, cut));
    const std::string label_text = trim(std::string_view(text).substr(cut + 1));
    std::int64_t label = 0;
    const auto [end, err] =
        std::from_chars(label_text.data(), label_text.data() + label_text.size(), label);
    if (path.empty() || label_text.empty() || err != std::errc() ||
        end != label_text.data() + label_text.size()) {
      throw DataError(str("ImageList: ", list_file, ":", number,
                          ": expected 'path,label' with an integer label, found '", text, "'"));
    }
    const fs::path p(path);
    items.push_back({p.is_absolute() ? path : (base / p).string(), label});
  }
  if (items.empty()) throw DataError(str("ImageList: ", list_file, " lists no images"));
  return items;
}

}  // namespace

ImageList::ImageList(std::string list_file, ImageDatasetOptions options)
    : ImageDataset("ImageList", read_list(list_file), std::move(options)),
      list_file_(std::move(list_file)) {}

std::shared_ptr<ImageDataset> ImageList::clone() const {
  return std::make_shared<ImageList>(*this);
}

}  // namespace ferry::vision
