// YAML pipelines: every error class with its place and suggestion, environment variables,
// relative paths, overrides, and load_pipeline against the same pipeline built in C++.

#include "ferry/pipeline.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/error.h"
#include "ferry/vision.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// A fresh folder per test, with a small sample ImageFolder in data/ (4 classes x 4 images).
class Pipelines : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("ferry_pipeline_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    vision::write_sample_images(dir_ / "data",
                                {.classes = 4, .images_per_class = 4, .width = 64, .height = 48});
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `text` to NAME in the test's folder and returns its path.
  fs::path file(const std::string& name, const std::string& text) {
    const fs::path path = dir_ / name;
    std::ofstream(path) << text;
    return path;
  }
  // The message read_pipeline throws for `text` (a ConfigError), or "" when it does not throw.
  std::string error_of(const std::string& text, const PipelineOverrides& overrides = {}) {
    try {
      (void)read_pipeline(file("p.yaml", text), overrides);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
};

constexpr const char* kDataset = "dataset: {type: image_folder, root: data}\n";

TEST_F(Pipelines, OnWorkerDeathAndItsBudgetsAreLoaderKeys) {
  const Pipeline p =
      read_pipeline(file("p.yaml", std::string(kDataset) + "loader:\n"
                                                           "  num_workers: 2\n"
                                                           "  on_worker_death: respawn\n"
                                                           "  max_worker_restarts: 5\n"
                                                           "  max_worker_restarts_total: 20\n"));
  EXPECT_EQ(p.options.on_worker_death, OnWorkerDeath::kRespawn);
  EXPECT_EQ(p.options.max_worker_restarts, 5u);
  EXPECT_EQ(p.options.max_worker_restarts_total, 20u);
  const Pipeline defaults = read_pipeline(file("d.yaml", kDataset));
  EXPECT_EQ(defaults.options.on_worker_death, OnWorkerDeath::kRaise);
  EXPECT_EQ(defaults.options.max_worker_restarts, 3u);
  EXPECT_EQ(defaults.options.max_worker_restarts_total, 10u);
  EXPECT_THAT(error_of(std::string(kDataset) + "loader: {on_worker_death: restart}\n"),
              AllOf(HasSubstr("on_worker_death"), HasSubstr("respawn")));
  EXPECT_THAT(error_of(std::string(kDataset) + "loader: {on_worker_death: respawn}\n"),
              HasSubstr("set num_workers > 0 or on_worker_death=raise"));
}

TEST_F(Pipelines, AnUnknownKeySuggestsTheNearestOneWithItsPlace) {
  EXPECT_THAT(error_of(std::string(kDataset) + "loader:\n  batch_sise: 4\n"),
              AllOf(HasSubstr("p.yaml:3:15: loader.batch_sise: unknown key"),
                    HasSubstr("did you mean 'batch_size'?")));
  EXPECT_THAT(error_of(std::string(kDataset) + "transforms:\n  - resize: {size: 8}\n"
                                               "  - center_crop: {sise: 4}\n"),
              AllOf(HasSubstr("p.yaml:4:25: transforms[1].sise: unknown key for transform "
                              "'center_crop'"),
                    HasSubstr("did you mean 'size'?")));
  EXPECT_THAT(
      error_of("datset: {type: image_folder}\n"),
      AllOf(HasSubstr("p.yaml:1:9: datset: unknown key"), HasSubstr("did you mean 'dataset'?")));
}

TEST_F(Pipelines, AnUnknownTypeNameSuggestsTheNearestType) {
  EXPECT_THAT(error_of("dataset: {type: image_foldr, root: data}\n"),
              AllOf(HasSubstr("p.yaml:1:17: dataset.type: unknown dataset type 'image_foldr'"),
                    HasSubstr("did you mean 'image_folder'?")));
  EXPECT_THAT(error_of(std::string(kDataset) + "transforms:\n  - random_resize_crop: {size: 8}\n"),
              AllOf(HasSubstr("p.yaml:3:25: transforms[0].type: unknown transform type"),
                    HasSubstr("did you mean 'random_resized_crop'?")));
  EXPECT_THAT(error_of(std::string(kDataset) + "sampler: {type: randm}\n"),
              HasSubstr("did you mean 'random'?"));
}

TEST_F(Pipelines, WrongTypesAndValuesOutOfRangeSayWhatWasExpectedAndFound) {
  EXPECT_THAT(error_of(std::string(kDataset) + "loader: {num_workers: two}\n"),
              HasSubstr("p.yaml:2:23: loader.num_workers: expected an integer >= 0, found 'two'"));
  EXPECT_THAT(error_of(std::string(kDataset) + "loader:\n  batch_size: 0\n"),
              HasSubstr("p.yaml:3:15: loader.batch_size: expected an integer >= 1, found '0'"));
  EXPECT_THAT(error_of(std::string(kDataset) + "loader: {shuffle: sometimes}\n"),
              HasSubstr("loader.shuffle: expected true or false, found 'sometimes'"));
  EXPECT_THAT(error_of(std::string(kDataset) + "loader: {on_error: ignore}\n"),
              HasSubstr("loader.on_error: expected one of raise, skip, found 'ignore'"));
  EXPECT_THAT(error_of(std::string(kDataset) + "loader: {seed: 99999999999999999999999}\n"),
              HasSubstr("loader.seed: expected an integer >= 0"));
  EXPECT_THAT(error_of(std::string(kDataset) + "loader: {timeout: -1}\n"),
              HasSubstr("loader.timeout: expected a number >= 0, found '-1'"));
  EXPECT_THAT(error_of(std::string(kDataset) + "transforms:\n  - resize: {size: [a, 2]}\n"),
              HasSubstr("p.yaml:3:21: transforms[0].size: expected each element to be an "
                        "integer >= 1, found 'a'"));
}

TEST_F(Pipelines, AMissingRequiredKeyIsNamed) {
  EXPECT_THAT(error_of("dataset: {type: image_folder}\n"),
              HasSubstr("p.yaml:1:10: dataset.root: missing; dataset 'image_folder' needs it"));
  EXPECT_THAT(error_of("loader: {batch_size: 2}\n"),
              HasSubstr("dataset: missing; a pipeline file needs it"));
}

TEST_F(Pipelines, ADuplicateKeyIsRefusedAtItsSecondPlace) {
  EXPECT_THAT(error_of(std::string(kDataset) + "loader:\n  batch_size: 4\n  batch_size: 5\n"),
              HasSubstr("p.yaml:4:3: duplicate key 'batch_size'"));
  EXPECT_THAT(error_of(std::string(kDataset) + "dataset: {type: synthetic, size: 4}\n"),
              HasSubstr("p.yaml:2:1: duplicate key 'dataset'"));
}

TEST_F(Pipelines, EmptyFilesListsWhereMapsBelongAndBrokenSyntaxAreCaught) {
  EXPECT_THAT(error_of(""), HasSubstr("p.yaml: the file is empty"));
  EXPECT_THAT(error_of("# only a comment\n"), HasSubstr("p.yaml: the file is empty"));
  EXPECT_THAT(
      error_of(std::string(kDataset) + "loader:\n  - batch_size: 4\n"),
      HasSubstr("p.yaml:3:3: loader: expected a map (the keys of the loader), found a list"));
  EXPECT_THAT(error_of("- dataset: {type: synthetic}\n"),
              HasSubstr("p.yaml:1:1: expected a map (the keys of a pipeline file), found a list"));
  EXPECT_THAT(error_of(std::string(kDataset) + "transforms: {resize: {size: 8}}\n"),
              HasSubstr("p.yaml:2:13: transforms: expected a list of transforms"));
  EXPECT_THAT(error_of("dataset: [1, 2\n"), HasSubstr("p.yaml:2:1: YAML syntax:"));
  EXPECT_THAT(error_of(std::string(kDataset) + "loader: {batch_size: 2}\n---\nmore: 1\n"),
              HasSubstr("a second YAML document"));
  EXPECT_THAT(error_of("dataset: {type: synthetic, size: 4}\nloader: {seed: \"\xff\"}\n"),
              HasSubstr("p.yaml:2:17: byte 0xFF is not UTF-8"));
}

TEST_F(Pipelines, AnAliasBombIsRefusedInsteadOfExpanded) {
  std::string text = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 8; ++i) {
    text += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int k = 0; k < 10; ++k) text += std::string(k ? ", " : "") + "*a" + std::to_string(i - 1);
    text += "]\n";
  }
  EXPECT_THAT(error_of(text), HasSubstr("more than 1000000 nodes"));
}

TEST_F(Pipelines, ASamplerWithShuffleIsRefused) {
  EXPECT_THAT(
      error_of(std::string(kDataset) + "sampler: {type: random}\nloader: {shuffle: true}\n"),
      AllOf(HasSubstr("p.yaml:3:19: loader.shuffle"), HasSubstr("mutually exclusive")));
}

TEST_F(Pipelines, AMissingDatasetFolderNamesTheFileAndTheFolder) {
  EXPECT_THAT(error_of("dataset: {type: image_folder, root: nowhere}\n"),
              AllOf(HasSubstr("p.yaml:1:10: dataset: "), HasSubstr("nowhere")));
}

TEST_F(Pipelines, EnvironmentVariablesExpandWithDefaults) {
  ::setenv("FERRY_TEST_BATCH", "6", 1);
  ::setenv("FERRY_TEST_EMPTY", "", 1);
  ::unsetenv("FERRY_TEST_UNSET");
  const Pipeline p =
      read_pipeline(file("p.yaml",
                         "dataset: {type: image_folder, root: \"${FERRY_TEST_UNSET:-da}ta\"}\n"
                         "loader:\n"
                         "  batch_size: ${FERRY_TEST_BATCH}\n"
                         "  num_workers: ${FERRY_TEST_EMPTY:-1}\n"
                         "  seed: ${FERRY_TEST_UNSET:-${FERRY_TEST_BATCH:-0}}7\n"));
  EXPECT_EQ(p.options.batch_size, 6u);
  EXPECT_EQ(p.options.num_workers, 1u) << "an empty variable takes the default, as in the shell";
  EXPECT_EQ(p.options.seed, 67u) << "a default may hold a variable";
  EXPECT_EQ(p.config.find("dataset")->find("root")->scalar(), (dir_ / "data").string());
  EXPECT_THAT(
      error_of("dataset: {type: synthetic, size: 4}\nloader:\n  seed: ${FERRY_TEST_UNSET}\n"),
      AllOf(HasSubstr("p.yaml:3:9: environment variable FERRY_TEST_UNSET is not set"),
            HasSubstr("${FERRY_TEST_UNSET:-value}")));
  EXPECT_THAT(error_of("dataset: {type: synthetic, size: 4}\nloader:\n  seed: ${1BAD}\n"),
              HasSubstr("expected ${NAME} or ${NAME:-default}"));
  EXPECT_THAT(error_of("dataset: {type: synthetic, size: 4}\nloader:\n  seed: ${OPEN\n"),
              HasSubstr("without a closing '}'"));
}

TEST_F(Pipelines, RelativePathsResolveAgainstTheFilesFolderNotTheWorkingDirectory) {
  fs::create_directories(dir_ / "configs");
  std::ofstream(dir_ / "list.txt") << "data/class0/0.jpg,0\ndata/class1/1.jpg,1\n";
  const fs::path folder =
      file("configs/folder.yaml", "dataset: {type: image_folder, root: ../data}\n");
  const fs::path list = file("configs/list.yaml", "dataset: {image_list: {file: ../list.txt}}\n");
  const fs::path cwd = fs::current_path();
  fs::current_path(fs::temp_directory_path());
  const Pipeline a = read_pipeline(folder);
  const Pipeline b = read_pipeline(list);
  fs::current_path(cwd);
  EXPECT_EQ(a.config.find("dataset")->find("root")->scalar(), (dir_ / "data").string());
  EXPECT_EQ(std::get<std::shared_ptr<Dataset>>(a.dataset)->size(), 16u);
  EXPECT_EQ(b.config.find("dataset")->find("file")->scalar(), (dir_ / "list.txt").string());
  EXPECT_EQ(std::get<std::shared_ptr<Dataset>>(b.dataset)->size(), 2u);
}

TEST_F(Pipelines, ASettingReachesAComponentsKeyWhicheverFormTheFileUses) {
  // configs/imagefolder-train.yaml writes `dataset: {image_folder: {root: ...}}`; --set
  // dataset.root=X must reach that root, not add a key beside the type.
  fs::create_directories(dir_ / "elsewhere");
  vision::write_sample_images(dir_ / "elsewhere",
                              {.classes = 2, .images_per_class = 3, .width = 32, .height = 32});
  const std::string text =
      "dataset: {image_folder: {root: data}}\n"
      "transforms:\n  - random_resized_crop: {size: 32}\n  - to_tensor\n";
  const Pipeline p = read_pipeline(file("p.yaml", text),
                                   {.set = {"dataset.root=elsewhere", "transforms.0.size=16"}});
  EXPECT_EQ(std::get<std::shared_ptr<Dataset>>(p.dataset)->size(), 6u);
  // The resolved size is [16, 16] (random_resized_crop's square form), not the file's 32.
  EXPECT_EQ(p.config.find("transforms")->items()[0].find("size")->items()[0].scalar(), "16");
  // The plain form's own path still works.
  const Pipeline q =
      read_pipeline(file("q.yaml", text), {.set = {"dataset.image_folder.root=elsewhere"}});
  EXPECT_EQ(std::get<std::shared_ptr<Dataset>>(q.dataset)->size(), 6u);
}

TEST_F(Pipelines, SettingsOverrideKeysListItemsAndAddMissingOnes) {
  const std::string text = std::string(kDataset) +
                           "transforms:\n  - random_resized_crop: {size: 32}\n  - to_tensor\n"
                           "loader: {batch_size: 4}\n";
  const Pipeline p = read_pipeline(file("p.yaml", text),
                                   {.set = {"loader.batch_size=8", "loader.num_workers=1",
                                            "transforms.0.random_resized_crop.size=[16, 24]"},
                                    .options = [](DataLoaderOptions& o) { o.drop_last = true; }});
  EXPECT_EQ(p.options.batch_size, 8u);
  EXPECT_EQ(p.options.num_workers, 1u);
  EXPECT_TRUE(p.options.drop_last);
  const Config& size = *p.config.find("transforms")->items()[0].find("size");
  EXPECT_EQ(size, Config::list({16, 24}));
  EXPECT_THAT(error_of(text, {.set = {"loader.batch_size=0"}}),
              HasSubstr("--set loader.batch_size=0: loader.batch_size: expected an integer >= 1"));
  EXPECT_THAT(error_of(text, {.set = {"transforms.5.size=3"}}),
              HasSubstr("transforms is a list of 2 items; '5' is not an index of it"));
  EXPECT_THAT(error_of(text, {.set = {"loader.batch_size"}}), HasSubstr("expected key.path=value"));
}

TEST_F(Pipelines, ThePlainAndTheTypeFormsOfAComponentAreTheSame) {
  const Pipeline plain =
      read_pipeline(file("a.yaml",
                         "dataset: {image_folder: {root: data}}\ntransforms:\n"
                         "  - resize: {size: 40}\n  - random_horizontal_flip\n  - to_tensor:\n"));
  const Pipeline typed =
      read_pipeline(file("b.yaml",
                         "dataset: {type: image_folder, root: data}\ntransforms:\n"
                         "  - {type: resize, size: 40}\n  - {type: random_horizontal_flip}\n"
                         "  - {type: to_tensor}\n"));
  const Pipeline nested =
      read_pipeline(file("c.yaml",
                         "dataset:\n  image_folder:\n    root: data\n    transforms:\n"
                         "      - resize: {size: 40}\n      - random_horizontal_flip\n"
                         "      - to_tensor\n"));
  for (const Pipeline* other : {&typed, &nested}) {
    EXPECT_EQ(plain.config.find("dataset")->to_text(), other->config.find("dataset")->to_text());
    EXPECT_EQ(plain.config.find("transforms")->to_text(),
              other->config.find("transforms")->to_text());
  }
  EXPECT_THAT(error_of("dataset: {type: image_folder, root: data, transforms: [to_tensor]}\n"
                       "transforms: [to_tensor]\n"),
              HasSubstr("p.yaml:1:55: dataset.transforms: the file also has a top-level"));
  EXPECT_THAT(error_of("dataset: {type: image_folder, root: data, transforms: [{resize: {}}]}\n"),
              HasSubstr("dataset.transforms[0].size: missing"));
}

TEST_F(Pipelines, TheResolvedConfigurationReadsBackAsItself) {
  const Pipeline p = read_pipeline(file("p.yaml", std::string(kDataset) +
                                                      "transforms:\n  - center_crop: {size: 32}\n"
                                                      "sampler: {type: sequential}\n"
                                                      "loader: {batch_size: 3, seed: 5}\n"));
  const Config again = parse_yaml(to_yaml(p.config));
  EXPECT_EQ(again, p.config) << to_yaml(p.config);
  const Pipeline rebuilt = build_pipeline(again, dir_);
  EXPECT_EQ(rebuilt.config, p.config);
}

TEST_F(Pipelines, LoadPipelineGivesTheBatchesOfTheSamePipelineBuiltInCpp) {
  const fs::path yaml = file("train.yaml",
                             "dataset: {type: image_folder, root: data}\n"
                             "transforms:\n"
                             "  - random_resized_crop: {size: 24}\n"
                             "  - random_horizontal_flip\n"
                             "  - to_tensor\n"
                             "  - normalize: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, "
                             "0.225]}\n"
                             "loader: {batch_size: 5, shuffle: true, num_workers: 2, seed: 3}\n");
  DataLoader from_yaml = load_pipeline(yaml);

  auto folder = std::make_shared<vision::ImageFolder>((dir_ / "data").string());
  vision::RandomResizedCrop::Options crop;
  crop.size = {24};
  const TransformList transforms{
      std::make_shared<vision::RandomResizedCrop>(crop),
      std::make_shared<vision::RandomHorizontalFlip>(), std::make_shared<vision::ToTensor>(),
      std::make_shared<vision::Normalize>(std::vector<double>{0.485, 0.456, 0.406},
                                          std::vector<double>{0.229, 0.224, 0.225})};
  DataLoader in_cpp(apply_transforms(folder, transforms),
                    {.batch_size = 5, .shuffle = true, .num_workers = 2, .seed = 3});

  for (int epoch = 0; epoch < 2; ++epoch) {
    auto a = from_yaml.begin();
    auto b = in_cpp.begin();
    std::size_t n = 0;
    for (; a != from_yaml.end(); ++a, ++b, ++n) {
      ASSERT_FALSE(b == in_cpp.end());
      EXPECT_EQ(a->indices(), b->indices());
      EXPECT_TRUE((*a)["image"].equal((*b)["image"])) << "epoch " << epoch << " batch " << n;
      EXPECT_TRUE((*a)["label"].equal((*b)["label"]));
    }
    EXPECT_TRUE(b == in_cpp.end());
    EXPECT_EQ(n, 4u);
  }
}

// device_transforms: uint8 images through shared memory, converted and normalised after the
// copy (on the CPU here: no device). Equal to the CPU pipeline's to_tensor + normalize within
// float rounding, over 2 workers.
TEST_F(Pipelines, DeviceTransformsMatchTheCpuPipelineWithinFloatRounding) {
  const std::string common = std::string(kDataset) +
                             "loader: {batch_size: 4, num_workers: 2, seed: 3}\n"
                             "transforms:\n  - resize: {size: [24, 32]}\n";
  const std::string mean_std = "{mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}";
  auto cpu =
      load_pipeline(file("cpu.yaml", common + "  - to_tensor\n  - normalize: " + mean_std + "\n"));
  const Pipeline gpu_style =
      read_pipeline(file("dev.yaml", common +
                                         "  - pil_to_tensor\ndevice_transforms:\n  - to_dtype\n"
                                         "  - normalize: " +
                                         mean_std + "\n"));
  ASSERT_NE(gpu_style.config.find("device_transforms"), nullptr);
  EXPECT_EQ(gpu_style.config.find("device_transforms")->items().size(), 2u);
  auto dev = gpu_style.make_loader();
  std::vector<torch::Tensor> expected;
  for (auto& b : cpu) expected.push_back(b["image"].clone());
  std::size_t k = 0;
  for (auto& b : dev) {
    ASSERT_EQ(b["image"].scalar_type(), torch::kFloat);
    EXPECT_TRUE(torch::allclose(b["image"], expected.at(k), 0, 1e-5))
        << (b["image"] - expected.at(k)).abs().max().item<float>();
    ++k;
  }
  EXPECT_EQ(k, expected.size());
  EXPECT_EQ(k, 4u);
}

TEST_F(Pipelines, DeviceTransformErrorsNameTheirPlace) {
  EXPECT_THAT(error_of(std::string(kDataset) + "device_transforms:\n  - normalise: {}\n"),
              AllOf(HasSubstr("p.yaml:3:5: device_transforms[0]: unknown device transform "
                              "'normalise'"),
                    HasSubstr("did you mean 'normalize'?")));
  EXPECT_THAT(error_of(std::string(kDataset) + "device_transforms:\n  - to_dtype: {dtype: int8}\n"),
              AllOf(HasSubstr("device_transforms[0].dtype"), HasSubstr("float32")));
  EXPECT_THAT(
      error_of(std::string(kDataset) + "device_transforms:\n  - normalize: {mean: [0.5]}\n"),
      HasSubstr("device_transforms[0].std"));
  EXPECT_THAT(error_of(std::string(kDataset) +
                       "device_transforms:\n  - normalize: {mean: [0.5], std: [0]}\n"),
              AllOf(HasSubstr("p.yaml:3:5: device_transforms[0]: normalize: std has a 0")));
  EXPECT_THAT(error_of(std::string(kDataset) + "device_transforms: {to_dtype: {}}\n"),
              HasSubstr("device_transforms: expected a list of steps"));
}

}  // namespace
}  // namespace ferry
