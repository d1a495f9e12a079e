// Image datasets, bad input, on_error = skip and worker_threads, with the images
// tests/vision/make_reference.py writes (ctest runs it first).

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/ferry.h"
#include "ferry/vision.h"

namespace ferry::vision {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kImages = std::string(FERRY_VISION_REF_DIR) + "/images";

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_bytes(const fs::path& path, std::string_view bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A scratch folder, removed afterwards.
class Scratch {
 public:
  Scratch()
      : path_(fs::temp_directory_path() /
              ("ferry_vision_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~Scratch() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  fs::path copy(const std::string& image, const fs::path& to) const {
    const fs::path dst = path_ / to;
    fs::create_directories(dst.parent_path());
    fs::copy_file(kImages + "/" + image, dst, fs::copy_options::overwrite_existing);
    return dst;
  }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

Example get(const Dataset& d, std::size_t i) {
  SampleContext ctx(0, 0, static_cast<std::int64_t>(i));
  return d.get(i, ctx);
}

TEST(ImageFolder, ClassesSortedFilesWalkedInOrderExtensionsFiltered) {
  Scratch s;
  s.copy("rgb_31x17.jpg", "dog/b.jpg");
  s.copy("rgb_31x17.jpg", "dog/A.JPG");  // any case
  s.copy("gray_320x240.png", "dog/sub/c.png");
  s.copy("rgb_257x131.png", "cat/z.png");
  s.copy("palette_120x80.png", "cat/a.png");
  write_bytes(s.path() / "cat" / "notes.txt", "not an image");
  fs::create_directories(s.path() / "bird");  // an empty class
  write_bytes(s.path() / "bird" / "x.jpeg", read_bytes(kImages + "/rgb_31x17.jpg"));

  ImageFolder folder(s.path().string());
  EXPECT_EQ(folder.classes(), (std::vector<std::string>{"bird", "cat", "dog"}));
  EXPECT_EQ(folder.class_to_idx().at("dog"), 2);
  ASSERT_EQ(folder.size(), 6u);
  std::vector<std::string> names;
  std::vector<std::int64_t> labels;
  for (const auto& item : folder.items()) {
    names.push_back(fs::relative(item.path, s.path()).string());
    labels.push_back(item.label);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"bird/x.jpeg", "cat/a.png", "cat/z.png", "dog/A.JPG",
                                             "dog/b.jpg", "dog/sub/c.png"}));
  EXPECT_EQ(labels, (std::vector<std::int64_t>{0, 1, 1, 2, 2, 2}));

  const Example ex = get(folder, 5);
  EXPECT_EQ(ex["label"].to_int(), 2);
  EXPECT_EQ(ex["index"].to_int(), 5);
  EXPECT_EQ(ex["path"].str(), folder.items()[5].path);
  const torch::Tensor image = ex["image"].tensor();
  EXPECT_EQ(image.sizes(), (std::vector<std::int64_t>{240, 320, 3}));  // gray file, rgb mode
  EXPECT_EQ(image.scalar_type(), torch::kUInt8);
}

TEST(ImageFolder, RefusesAMissingRootNoClassesAndAClassWithoutImages) {
  Scratch s;
  EXPECT_THAT([&] { ImageFolder((s.path() / "nope").string()); },
              testing::ThrowsMessage<DataError>(HasSubstr("is not a folder")));
  EXPECT_THAT([&] { ImageFolder(s.path().string()); },
              testing::ThrowsMessage<DataError>(HasSubstr("couldn't find any class folder")));
  s.copy("rgb_31x17.jpg", "cat/a.jpg");
  write_bytes(s.path() / "dog" / "readme.txt", "x");
  EXPECT_THAT([&] { ImageFolder(s.path().string()); },
              testing::ThrowsMessage<DataError>(testing::AllOf(
                  HasSubstr("no valid file for the classes dog"), HasSubstr(".jpg, .jpeg, .png"))));
}

TEST(ImageList, ReadsPathLabelLinesRelativeToTheFile) {
  Scratch s;
  s.copy("rgb_31x17.jpg", "img/a.jpg");
  s.copy("gray_320x240.png", "img/b.png");
  write_bytes(s.path() / "list.csv", "path,label\n# a comment\nimg/a.jpg,3\n\nimg/b.png , 7\n");
  ImageList list((s.path() / "list.csv").string());
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list.items()[1].path, (s.path() / "img/b.png").string());
  EXPECT_EQ(get(list, 1)["label"].to_int(), 7);
  EXPECT_EQ(get(list, 0)["image"].tensor().sizes(), (std::vector<std::int64_t>{17, 31, 3}));

  write_bytes(s.path() / "spaces.txt", "img/a.jpg 1\nimg/b.png\t2\n");
  EXPECT_EQ(ImageList((s.path() / "spaces.txt").string()).items()[1].label, 2);
}

TEST(ImageList, ALineWithoutALabelNamesTheFileAndLine) {
  Scratch s;
  write_bytes(s.path() / "bad.csv", "a.jpg,1\nb.jpg\n");
  const std::string file = (s.path() / "bad.csv").string();
  EXPECT_THAT([&] { ImageList{file}; }, testing::ThrowsMessage<DataError>(testing::AllOf(
                                            HasSubstr(file + ":2"), HasSubstr("no label column"))));
  write_bytes(s.path() / "bad2.csv", "a.jpg,cat\n");
  EXPECT_THAT([&] { ImageList((s.path() / "bad2.csv").string()); },
              testing::ThrowsMessage<DataError>(HasSubstr("bad2.csv:1: expected 'path,label' "
                                                          "with an integer label")));
  write_bytes(s.path() / "empty.csv", "path,label\n");
  EXPECT_THAT([&] { ImageList((s.path() / "empty.csv").string()); },
              testing::ThrowsMessage<DataError>(HasSubstr("lists no images")));
  EXPECT_THAT([&] { ImageList((s.path() / "missing.csv").string()); },
              testing::ThrowsMessage<DataError>(HasSubstr("cannot open")));
}

// ---- bad files: each raises DataError naming the path, the sample index and the reason ----

// A list dataset over `files` (name, bytes) written into `s`.
std::shared_ptr<ImageList> list_of(const Scratch& s,
                                   const std::vector<std::pair<std::string, std::string>>& files,
                                   ImageDatasetOptions options = {}) {
  std::string lines;
  for (const auto& [name, bytes] : files) {
    write_bytes(s.path() / name, bytes);
    lines += name + ",0\n";
  }
  write_bytes(s.path() / "list.csv", lines);
  return std::make_shared<ImageList>((s.path() / "list.csv").string(), std::move(options));
}

void expect_data_error(const Dataset& d,
                       std::size_t i,
                       const std::string& path,
                       const std::string& reason) {
  try {
    get(d, i);
    ADD_FAILURE() << "sample " << i << " (" << path << ") loaded; expected DataError: " << reason;
  } catch (const DataError& e) {
    const std::string what = e.what();
    EXPECT_THAT(what, HasSubstr("sample " + std::to_string(i) + " ("));
    EXPECT_THAT(what, HasSubstr(path));
    EXPECT_THAT(what, HasSubstr(reason));
  }
}

std::string with_dimensions(std::string bytes, bool png, int width, int height) {
  if (png) {  // IHDR: width and height, big-endian, at bytes 16 and 20
    for (int i = 0; i < 4; ++i) {
      bytes[16 + i] = static_cast<char>((width >> (24 - 8 * i)) & 0xFF);
      bytes[20 + i] = static_cast<char>((height >> (24 - 8 * i)) & 0xFF);
    }
    return bytes;
  }
  for (std::size_t i = 2; i + 8 < bytes.size(); ++i) {  // SOF0/SOF2: height, width at +5, +7
    const auto m = static_cast<unsigned char>(bytes[i + 1]);
    if (static_cast<unsigned char>(bytes[i]) == 0xFF && (m == 0xC0 || m == 0xC2)) {
      bytes[i + 5] = static_cast<char>(height >> 8);
      bytes[i + 6] = static_cast<char>(height & 0xFF);
      bytes[i + 7] = static_cast<char>(width >> 8);
      bytes[i + 8] = static_cast<char>(width & 0xFF);
      return bytes;
    }
  }
  ADD_FAILURE() << "no SOF marker";
  return bytes;
}

TEST(BadInput, EmptyTextBombAndMissingFilesRaiseDataErrorNamingPathIndexAndReason) {
  Scratch s;
  const std::string jpeg = read_bytes(kImages + "/rgb_31x17.jpg");
  const std::string png = read_bytes(kImages + "/palette_120x80.png");
  auto list = list_of(s, {{"empty.jpg", ""},
                          {"text.jpg", "hello, I am not a JPEG\n"},
                          {"bomb.png", with_dimensions(png, true, 65535, 65535)},
                          {"bomb.jpg", with_dimensions(jpeg, false, 65535, 65535)},
                          {"good.jpg", jpeg}});
  fs::remove(s.path() / "good.jpg");  // listed, then gone: unreadable
  expect_data_error(*list, 0, "empty.jpg", "empty file (0 bytes)");
  expect_data_error(*list, 1, "text.jpg", "not a JPEG or PNG, and OpenCV cannot decode it");
  expect_data_error(*list, 2, "bomb.png", "65535x65535 = 4294836225 pixels, over max_pixels");
  expect_data_error(*list, 3, "bomb.jpg", "over max_pixels");
  expect_data_error(*list, 4, "good.jpg", "cannot open");
  // max_pixels is the user's to set.
  auto strict = list_of(s, {{"small.jpg", jpeg}}, {.max_pixels = 100});
  expect_data_error(*strict, 0, "small.jpg", "31x17 = 527 pixels, over max_pixels (100)");
}

// A file cut at every byte offset either raises DataError (naming the decoder's reason) or, when
// only trailing bytes after the pixel data were cut, decodes to exactly the full image. Never a
// crash, a hang or partly decoded pixels.
void truncate_everywhere(const std::string& name, std::size_t min_failures) {
  Scratch s;
  const std::string bytes = read_bytes(kImages + "/" + name);
  const torch::Tensor full =
      decode_image({reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()});
  std::vector<std::pair<std::string, std::string>> files;
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    files.emplace_back("cut_" + std::to_string(cut) + "_" + name, bytes.substr(0, cut));
  }
  auto list = list_of(s, files);
  std::size_t failures = 0;
  std::set<std::string> reasons;
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    try {
      const torch::Tensor image = get(*list, cut)["image"].tensor();
      EXPECT_TRUE(image.equal(full)) << name << " cut at " << cut << " decoded to other pixels";
    } catch (const DataError& e) {
      ++failures;
      const std::string what = e.what();
      EXPECT_THAT(what, HasSubstr("sample " + std::to_string(cut) + " ("));
      EXPECT_THAT(what, HasSubstr(files[cut].first));
      reasons.insert(what.substr(what.rfind("): ") + 3, 40));
    }
  }
  EXPECT_GE(failures, min_failures) << name << ": " << bytes.size() << " offsets";
  std::string all;
  for (const auto& r : reasons) all += "\n  " + r;
  SCOPED_TRACE(all);
  EXPECT_GE(reasons.size(), 2u) << "the reasons should come from the decoder";
}

TEST(BadInput, JpegTruncatedAtEveryOffset) {
  const auto size = read_bytes(kImages + "/rgb_31x17.jpg").size();
  truncate_everywhere("rgb_31x17.jpg", size - 2);  // at most the end-of-image marker is optional
}

TEST(BadInput, PngTruncatedAtEveryOffset) {
  const auto size = read_bytes(kImages + "/palette_120x80.png").size();
  truncate_everywhere("palette_120x80.png", size - 12);  // the IEND chunk is not needed
}

// ---- the loader: on_error = skip, worker_threads ----

// Indices 3, 4, 5 and 9 are corrupt; batches of 3, so batch 1 (3, 4, 5) is all bad.
std::shared_ptr<ImageList> mixed(const Scratch& s) {
  const std::string jpeg = read_bytes(kImages + "/rgb_31x17.jpg");
  std::vector<std::pair<std::string, std::string>> files;
  for (int i = 0; i < 12; ++i) {
    const bool bad = i == 3 || i == 4 || i == 5 || i == 9;
    files.emplace_back("f" + std::to_string(i) + ".jpg", bad ? jpeg.substr(0, 200) : jpeg);
  }
  return list_of(s, files);
}

class Skip : public ::testing::TestWithParam<std::size_t> {};

TEST_P(Skip, SkippedSamplesAreCountedListedAndNeverDelivered) {
  Scratch s;
  auto dataset = mixed(s);
  DataLoader loader(
      dataset, {.batch_size = 3, .num_workers = GetParam(), .seed = 1, .on_error = OnError::kSkip});
  std::multiset<std::int64_t> delivered;
  std::vector<std::size_t> sizes;
  for (auto& batch : loader) {
    sizes.push_back(batch.size());
    for (const auto i : batch.indices()) delivered.insert(i);
    EXPECT_EQ(batch["image"].sizes()[0], static_cast<std::int64_t>(batch.size()));
  }
  EXPECT_EQ(sizes, (std::vector<std::size_t>{3, 3, 2}));  // batch 1 is not delivered
  const LoaderStats stats = loader.stats();
  EXPECT_EQ(stats.skipped, 4u);
  EXPECT_EQ(stats.batches, 3u);
  EXPECT_EQ(stats.samples, 8u);
  std::multiset<std::int64_t> skipped;
  for (const auto& k : stats.skipped_samples) {
    skipped.insert(k.index);
    EXPECT_EQ(k.epoch, 0u);
    EXPECT_THAT(k.error, HasSubstr("ferry::DataError"));
    EXPECT_THAT(k.error, HasSubstr("f" + std::to_string(k.index) + ".jpg"));
    EXPECT_THAT(k.error, HasSubstr("JPEG decoder"));
  }
  EXPECT_EQ(skipped, (std::multiset<std::int64_t>{3, 4, 5, 9}));
  std::multiset<std::int64_t> all = delivered;
  all.insert(skipped.begin(), skipped.end());
  std::multiset<std::int64_t> every;
  for (std::int64_t i = 0; i < 12; ++i) every.insert(i);
  EXPECT_EQ(all, every);  // delivered + skipped == the sampler's indices, disjoint
}

TEST_P(Skip, RaiseNamesTheSampleAndGoesOn) {
  Scratch s;
  auto dataset = mixed(s);
  DataLoader loader(dataset, {.batch_size = 3, .num_workers = GetParam(), .seed = 1});
  std::size_t good = 0;
  std::size_t errors = 0;
  auto it = loader.begin();
  while (it != loader.end()) {
    try {
      good += it->size();
    } catch (const Error& e) {
      ++errors;
      EXPECT_THAT(e.what(), HasSubstr(".jpg"));
      EXPECT_THAT(e.what(), HasSubstr("JPEG decoder"));
    }
    ++it;
  }
  EXPECT_EQ(errors, 2u);  // batches 1 and 3
  EXPECT_EQ(good, 6u);
  EXPECT_EQ(loader.stats().skipped, 0u);
}

// worker_threads > 1 needs a build with TBB; without one the loader refuses it with this error
// (and the tests that need it skip).
bool worker_threads_built(const std::shared_ptr<const Dataset>& dataset) {
  try {
    DataLoader loader(dataset, {.worker_threads = 2});
    return true;
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("needs ferry built with TBB"));
    return false;
  }
}

TEST(SkipParallel, WorkerThreadsSkipTheSameSamplesInIndexOrder) {
  Scratch s;
  auto dataset = mixed(s);
  if (!worker_threads_built(dataset)) GTEST_SKIP() << "this build has no TBB (worker_threads)";
  for (const std::size_t workers : {0, 2}) {
    DataLoader loader(dataset, {.batch_size = 3,
                                .num_workers = workers,
                                .seed = 1,
                                .worker_threads = 2,
                                .on_error = OnError::kSkip});
    std::vector<std::int64_t> delivered;
    for (auto& batch : loader) {
      for (const auto i : batch.indices()) delivered.push_back(i);
    }
    EXPECT_EQ(delivered, (std::vector<std::int64_t>{0, 1, 2, 6, 7, 8, 10, 11}));
    std::vector<std::int64_t> skipped;
    for (const auto& k : loader.stats().skipped_samples) skipped.push_back(k.index);
    EXPECT_EQ(skipped, (std::vector<std::int64_t>{3, 4, 5, 9}));
  }
}

TEST(SkipParallel, AMisconfiguredPipelineRaisesEvenUnderSkip) {
  Scratch s;
  s.copy("gray_320x240.png", "img/a.png");
  write_bytes(s.path() / "list.csv", "img/a.png,0\n");
  // Gray images with a three-channel Normalize: a ConfigError, not bad data.
  auto dataset = std::make_shared<ImageList>(
      (s.path() / "list.csv").string(),
      ImageDatasetOptions{.mode = ImageMode::kGray,
                          .transforms = {std::make_shared<ToTensor>(),
                                         std::make_shared<Normalize>(std::vector{0.5, 0.5, 0.5},
                                                                     std::vector{0.2, 0.2, 0.2})}});
  DataLoader loader(dataset, {.batch_size = 1, .on_error = OnError::kSkip});
  auto it = loader.begin();
  EXPECT_THROW((void)*it, ConfigError);
  EXPECT_EQ(loader.stats().skipped, 0u);
}

TEST(BadInput, SixteenBitPixelsAreRefusedByImageTransformsNotMisread) {
  Scratch s;
  s.copy("rgb16_200x150.png", "a.png");
  write_bytes(s.path() / "list.csv", "a.png,0\n");
  ImageList unchanged((s.path() / "list.csv").string(), {.mode = ImageMode::kUnchanged});
  const torch::Tensor raw = get(unchanged, 0)["image"].tensor();
  EXPECT_EQ(raw.scalar_type(), torch::kInt32);  // 16-bit values, widened
  EXPECT_GT(raw.max().item<std::int32_t>(), 255);
  ImageList transformed(
      (s.path() / "list.csv").string(),
      {.mode = ImageMode::kUnchanged, .transforms = {std::make_shared<ToTensor>()}});
  expect_data_error(transformed, 0, "a.png", "16-bit pixels");
}

INSTANTIATE_TEST_SUITE_P(Workers, Skip, ::testing::Values(0, 2), [](const auto& info) {
  return "num_workers_" + std::to_string(info.param);
});

// The README's example, as written there.
TEST(Pipeline, TheReadmeExampleRuns) {
  Scratch s;
  for (int i = 0; i < 6; ++i) {
    s.copy("rgb_500x375.jpg", fs::path(i % 2 ? "cat" : "dog") / ("p" + std::to_string(i) + ".jpg"));
  }
  namespace fv = ferry::vision;
  auto train = std::make_shared<fv::ImageFolder>(
      s.path().string(),
      fv::ImageFolder::Options{
          {.transforms = {std::make_shared<fv::RandomResizedCrop>(
                              fv::RandomResizedCrop::Options{.size = {224}}),
                          std::make_shared<fv::RandomHorizontalFlip>(),
                          std::make_shared<fv::ToTensor>(),
                          std::make_shared<fv::Normalize>(std::vector{0.485, 0.456, 0.406},
                                                          std::vector{0.229, 0.224, 0.225})}}});
  ferry::DataLoader loader(train, {.batch_size = 4, .shuffle = true, .num_workers = 2});
  std::vector<std::int64_t> labels;
  for (auto& batch : loader) {
    EXPECT_EQ(batch["image"].sizes()[1], 3);
    EXPECT_EQ(batch["image"].sizes()[2], 224);
    EXPECT_EQ(batch["image"].scalar_type(), torch::kFloat32);
    for (std::int64_t i = 0; i < batch["label"].numel(); ++i) {
      labels.push_back(batch["label"][i].item<std::int64_t>());
    }
  }
  std::sort(labels.begin(), labels.end());
  EXPECT_EQ(labels, (std::vector<std::int64_t>{0, 0, 0, 1, 1, 1}));
}

// A training pipeline built from configuration, as YAML will: the same batches with 0 or 2
// workers, fork or spawn (a fresh ferry-worker rebuilding it), 1 or 3 worker_threads.
TEST(Pipeline, BatchesIdenticalAcrossWorkersStartMethodsAndWorkerThreads) {
  Scratch s;
  for (int i = 0; i < 10; ++i) {
    s.copy(i % 2 ? "rgb_500x375.jpg" : "rgb_375x500.jpg",
           fs::path(i % 3 ? "a" : "b") / ("p" + std::to_string(i) + ".jpg"));
  }
  register_builtins();
  const Config node = Config::map(
      {{"type", "image_folder"},
       {"root", s.path().string()},
       {"transforms",
        Config::list({Config::map({{"type", "random_resized_crop"}, {"size", 64}}),
                      Config::map({{"type", "random_horizontal_flip"}}),
                      Config::map({{"type", "color_jitter"}, {"brightness", 0.3}, {"hue", 0.05}}),
                      Config::map({{"type", "to_tensor"}}),
                      Config::map({{"type", "normalize"},
                                   {"mean", Config::list({0.5, 0.5, 0.5})},
                                   {"std", Config::list({0.2, 0.2, 0.2})}})})}});
  auto dataset = Registry::global().make_dataset(node);
  const auto run = [&](std::size_t workers, StartMethod method, std::size_t threads) {
    DataLoader loader(dataset, {.batch_size = 4,
                                .shuffle = true,
                                .num_workers = workers,
                                .seed = 7,
                                .start_method = workers > 0 ? std::optional(method) : std::nullopt,
                                .worker_threads = threads});
    std::vector<torch::Tensor> images;
    for (auto& batch : loader) images.push_back(batch["image"].clone());
    return images;
  };
  const bool parallel = worker_threads_built(dataset);
  const auto reference = run(0, StartMethod::kFork, 1);
  ASSERT_EQ(reference.size(), 3u);
  EXPECT_EQ(reference[0].sizes(), (std::vector<std::int64_t>{4, 3, 64, 64}));
  for (const auto& [workers, method, threads] :
       std::vector<std::tuple<std::size_t, StartMethod, std::size_t>>{
           {0, StartMethod::kFork, 3},
           {2, StartMethod::kFork, 1},
           {2, StartMethod::kFork, 3},
           {2, StartMethod::kSpawn, 2}}) {
    if (threads > 1 && !parallel) continue;  // a build without TBB
    SCOPED_TRACE(testing::Message()
                 << workers << " workers, " << to_string(method) << ", " << threads << " threads");
    const auto images = run(workers, method, threads);
    ASSERT_EQ(images.size(), reference.size());
    for (std::size_t k = 0; k < images.size(); ++k) EXPECT_TRUE(images[k].equal(reference[k]));
  }
}

}  // namespace
}  // namespace ferry::vision
