#include <algorithm>
#include <fstream>
#include <string>
#include <system_error>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "ferry/error.h"
#include "ferry/vision/sample_data.h"

namespace ferry::vision {

namespace {

cv::Mat photo_like(std::uint32_t seed, int w, int h) {
  cv::RNG rng(seed);
  cv::Mat img(h, w, CV_32FC3);
  const cv::Vec3f a(rng.uniform(0.f, 255.f), rng.uniform(0.f, 255.f), rng.uniform(0.f, 255.f));
  const cv::Vec3f b(rng.uniform(0.f, 255.f), rng.uniform(0.f, 255.f), rng.uniform(0.f, 255.f));
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const float t = 0.5f * (static_cast<float>(x) / w + static_cast<float>(y) / h);
      img.at<cv::Vec3f>(y, x) = a * (1 - t) + b * t;
    }
  }
  const int max_w = std::max(11, w * 3 / 10);
  const int max_h = std::max(11, h * 2 / 5);
  for (int i = 0; i < 40; ++i) {
    const cv::Scalar colour(rng.uniform(0, 255), rng.uniform(0, 255), rng.uniform(0, 255));
    const cv::Point centre(rng.uniform(0, w), rng.uniform(0, h));
    if (i % 3 == 0) {
      cv::rectangle(img, centre, centre + cv::Point(rng.uniform(10, max_w), rng.uniform(10, max_h)),
                    colour, cv::FILLED, cv::LINE_AA);
    } else {
      cv::ellipse(img, centre, cv::Size(rng.uniform(5, max_w), rng.uniform(5, max_h)),
                  rng.uniform(0, 180), 0, 360, colour, cv::FILLED, cv::LINE_AA);
    }
  }
  cv::GaussianBlur(img, img, cv::Size(0, 0), 1.2);
  cv::Mat texture(h, w, CV_32FC3);
  cv::randn(texture, cv::Scalar::all(0), cv::Scalar::all(26));
  cv::GaussianBlur(texture, texture, cv::Size(0, 0), 0.8);
  cv::Mat noise(h, w, CV_32FC3);
  cv::randn(noise, cv::Scalar::all(0), cv::Scalar::all(6));
  img += texture + noise;
  cv::Mat out;
  img.convertTo(out, CV_8UC3);
  return out;
}

}  // namespace

std::vector<std::filesystem::path> write_sample_images(const std::filesystem::path& root,
                                                       const SampleImagesOptions& options) {
  namespace fs = std::filesystem;
  FERRY_CHECK(options.classes > 0 && options.images_per_class > 0,
              "sample images: classes and images_per_class must be positive; got ", options.classes,
              " and ", options.images_per_class);
  FERRY_CHECK(options.width >= 16 && options.height >= 16, "sample images: ", options.width, "x",
              options.height, " is too small; use at least 16x16");
  FERRY_CHECK(options.quality >= 1 && options.quality <= 100,
              "sample images: JPEG quality must be in [1, 100]; got ", options.quality);
  const std::size_t total = options.classes * options.images_per_class;
  std::vector<fs::path> files;
  files.reserve(total);
  for (std::size_t k = 0; k < total; ++k) {
    const fs::path path =
        root / ("class" + std::to_string(k % options.classes)) / (std::to_string(k) + ".jpg");
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    if (ec) {
      throw DataError(detail::str("sample images: cannot create ", path.parent_path().string(),
                                  ": ", ec.message()));
    }
    const cv::Mat image = photo_like(options.seed * 1000003u + static_cast<std::uint32_t>(k),
                                     options.width, options.height);
    std::vector<std::uint8_t> jpeg;
    if (!cv::imencode(".jpg", image, jpeg, {cv::IMWRITE_JPEG_QUALITY, options.quality})) {
      throw DataError(detail::str("sample images: cannot encode ", path.string()));
    }
    // Written under a temporary name first: an interrupted run never leaves a truncated image.
    const fs::path partial = path.string() + ".partial";
    {
      std::ofstream out(partial, std::ios::binary);
      out.write(reinterpret_cast<const char*>(jpeg.data()),
                static_cast<std::streamsize>(jpeg.size()));
      if (!out.flush()) {
        throw DataError(detail::str("sample images: cannot write ", partial.string(),
                                    " (check that the folder is writable and has space)"));
      }
    }
    fs::rename(partial, path, ec);
    if (ec) {
      throw DataError(detail::str("sample images: cannot rename ", partial.string(), " to ",
                                  path.string(), ": ", ec.message()));
    }
    files.push_back(path);
    if (options.progress) options.progress(k + 1, total);
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace ferry::vision
