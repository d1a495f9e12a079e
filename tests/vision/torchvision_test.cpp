// ferry::vision against torchvision 0.14 + Pillow 9.4 on the images and outputs that
// tests/vision/make_reference.py writes (ctest runs it first, with Debian's /usr/bin/python3).
//
// With reduced_decode off, every deterministic pipeline matches bit for bit: decoding (same
// libjpeg-turbo settings, Pillow's colour conversions), resizing (Pillow's resampler, ported),
// crops, flips, ToTensor and Normalize (the same float32 operations) and the colour adjustments.
// With reduced_decode on (the default), resizes of JPEGs stay within the tolerance the README
// states; that is checked here too.

#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "ferry/vision.h"

namespace ferry::vision {
namespace {

const std::string kRef = FERRY_VISION_REF_DIR;

struct Case {
  std::string name, image, pipeline, dtype;
  std::int64_t c = 0, h = 0, w = 0;
  std::string ref;
};

std::vector<Case> manifest() {
  std::ifstream in(kRef + "/manifest.txt");
  EXPECT_TRUE(in) << "no " << kRef << "/manifest.txt: ctest runs make_reference.py first";
  std::vector<Case> cases;
  Case c;
  while (in >> c.name >> c.image >> c.pipeline >> c.dtype >> c.c >> c.h >> c.w >> c.ref) {
    cases.push_back(c);
  }
  return cases;
}

torch::Tensor load_ref(const Case& c) {
  std::ifstream in(kRef + "/" + c.ref, std::ios::binary);
  const auto dtype = c.dtype == "f32" ? torch::kFloat32 : torch::kUInt8;
  torch::Tensor t = torch::empty({c.c, c.h, c.w}, dtype);
  in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  EXPECT_EQ(in.gcount(), static_cast<std::streamsize>(t.nbytes())) << c.ref;
  return t;
}

torch::Tensor file(const std::string& image) { return read_file(kRef + "/images/" + image); }

// The image size from the case's `decode` reference (C, H, W of the file).
std::pair<std::int64_t, std::int64_t> file_size(const std::string& image) {
  const torch::Tensor decoded = decode_image(bytes_of(file(image)));
  return {decoded.size(0), decoded.size(1)};
}

torch::Tensor run(const TransformList& steps, const std::string& image) {
  SampleContext ctx(0, 0, 0);
  const Compose pipeline(steps);
  return pipeline(Example{{"image", file(image)}}, ctx)["image"].tensor();
}

template <class T, class... A>
std::shared_ptr<const Transform> make(A&&... a) {
  return std::make_shared<T>(std::forward<A>(a)...);
}

std::shared_ptr<const Transform> exact_resize(std::vector<std::int64_t> size,
                                              std::optional<std::int64_t> max_size = {},
                                              bool reduced = false) {
  return make<Resize>(
      Resize::Options{.size = std::move(size), .max_size = max_size, .reduced_decode = reduced});
}

const std::vector<double> kMean{0.485, 0.456, 0.406};
const std::vector<double> kStd{0.229, 0.224, 0.225};

// ferry's output for a case, as C x H x W; empty when the pipeline is not one ferry runs here.
torch::Tensor ferry_output(const Case& c, bool reduced) {
  const auto [h, w] = file_size(c.image);
  const auto u8 = make<ToTensor>(true);
  const std::string& p = c.pipeline;
  if (p == "decode") return run({u8}, c.image);
  if (p == "imagenet_eval") {
    return run({exact_resize({256}, {}, reduced), make<CenterCrop>(std::vector<std::int64_t>{224}),
                make<ToTensor>(false), make<Normalize>(kMean, kStd)},
               c.image);
  }
  if (p == "resize_short_100") return run({exact_resize({100}, {}, reduced), u8}, c.image);
  if (p == "resize_exact_120x90") return run({exact_resize({90, 120}, {}, reduced), u8}, c.image);
  if (p == "resize_up_64") return run({exact_resize({64}, {}, reduced), u8}, c.image);
  if (p == "resize_max_size") return run({exact_resize({100}, 120, reduced), u8}, c.image);
  if (p == "center_crop_pad") {
    return run({make<CenterCrop>(std::vector<std::int64_t>{h + 10, w + 7}), u8}, c.image);
  }
  if (p == "center_crop_odd") {
    return run({make<CenterCrop>(std::vector<std::int64_t>{h / 2 + 1, w / 3}), u8}, c.image);
  }
  if (p == "hflip") return run({make<RandomFlip>(true, 1.0), u8}, c.image);
  if (p == "vflip") return run({make<RandomFlip>(false, 1.0), u8}, c.image);
  if (p == "to_tensor") return run({make<ToTensor>(false)}, c.image);
  if (p == "gray") return run({make<Decode>(ImageMode::kGray), u8}, c.image);
  const auto adjust = [&](torch::Tensor (*fn)(const torch::Tensor&, double), double f) {
    return fn(decode_image(bytes_of(file(c.image))), f).permute({2, 0, 1}).contiguous();
  };
  if (p == "brightness_1.4") return adjust(adjust_brightness, 1.4);
  if (p == "contrast_0.6") return adjust(adjust_contrast, 0.6);
  if (p == "saturation_1.5") return adjust(adjust_saturation, 1.5);
  if (p == "hue_0.1") return adjust(adjust_hue, 0.1);
  if (p == "hue_-0.25") return adjust(adjust_hue, -0.25);
  if (p == "crop_fixed" || p == "pad_crop") {
    // Pillow's crop and pad are index arithmetic; the tensor slicing here checks only that the
    // decoded pixels under them agree.
    const torch::Tensor d = run({u8}, c.image);
    if (p == "crop_fixed") return d.narrow(1, 5, c.h).narrow(2, 7, c.w).contiguous();
    return torch::constant_pad_nd(d, {4, 4, 4, 4}).narrow(1, 3, c.h).narrow(2, 6, c.w).contiguous();
  }
  return {};
}

TEST(Torchvision, EveryDeterministicPipelineMatchesBitForBit) {
  const auto cases = manifest();
  ASSERT_GT(cases.size(), 100u);
  std::size_t checked = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const torch::Tensor mine = ferry_output(c, /*reduced=*/false);
    ASSERT_TRUE(mine.defined()) << "no ferry pipeline for " << c.pipeline;
    const torch::Tensor ref = load_ref(c);
    ASSERT_EQ(mine.sizes(), ref.sizes());
    ASSERT_EQ(mine.scalar_type(), ref.scalar_type());
    const auto diff = (mine.to(torch::kFloat64) - ref.to(torch::kFloat64)).abs();
    EXPECT_EQ(diff.max().item<double>(), 0.0)
        << "mismatching values: " << (diff > 0).sum().item<std::int64_t>() << " of " << diff.numel()
        << ", mean absolute difference " << diff.mean().item<double>();
    ++checked;
  }
  EXPECT_EQ(checked, cases.size());
}

// The README's tolerance for reduced_decode (the default): a JPEG decoded at M/8 scale before
// Pillow's resampler, against torchvision's full decode and resample, in 0..255 units.
TEST(Torchvision, ReducedDecodeStaysWithinTheStatedTolerance) {
  std::size_t reduced_cases = 0;
  for (const Case& c : manifest()) {
    const bool jpeg = c.image.ends_with(".jpg");
    const bool resizes = c.pipeline.starts_with("resize") || c.pipeline == "imagenet_eval";
    if (!jpeg || !resizes) continue;
    SCOPED_TRACE(c.name);
    const torch::Tensor mine = ferry_output(c, /*reduced=*/true).to(torch::kFloat64);
    torch::Tensor ref = load_ref(c).to(torch::kFloat64);
    torch::Tensor a = mine;
    if (c.dtype == "f32") {  // back to 0..255 units through the normalisation
      const auto m = torch::tensor(kMean, torch::kFloat64).view({3, 1, 1});
      const auto s = torch::tensor(kStd, torch::kFloat64).view({3, 1, 1});
      a = (mine * s + m) * 255.0;
      ref = (ref * s + m) * 255.0;
    }
    const double mad = (a - ref).abs().mean().item<double>();
    EXPECT_LE(mad, 2.0) << "mean absolute difference " << mad;
    std::cout << "[ reduced  ] " << c.name << ": mean absolute difference " << mad << "\n";
    reduced_cases += mad > 0 ? 1 : 0;
  }
  EXPECT_GT(reduced_cases, 0u) << "no case took the reduced path";
}

std::vector<std::vector<std::string>> lines(const std::string& name) {
  std::ifstream in(kRef + "/" + name);
  EXPECT_TRUE(in) << name;
  std::vector<std::vector<std::string>> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string s; words >> s;) w.push_back(s);
    if (!w.empty()) out.push_back(w);
  }
  return out;
}

at::Generator seeded(std::uint64_t seed) { return at::detail::createCPUGenerator(seed); }

TEST(Torchvision, RandomResizedCropPicksTorchvisionsBoxForTheSameDraws) {
  const auto rows = lines("rrc_boxes.txt");
  ASSERT_GT(rows.size(), 1000u);
  for (const auto& r : rows) {
    at::Generator g = seeded(std::stoull(r[0]));
    const Box box = RandomResizedCrop::get_params(std::stoll(r[1]), std::stoll(r[2]),
                                                  {std::stod(r[3]), std::stod(r[4])},
                                                  {std::stod(r[5]), std::stod(r[6])}, g);
    const Box want{std::stoll(r[7]), std::stoll(r[8]), std::stoll(r[9]), std::stoll(r[10])};
    ASSERT_EQ(box, want) << "seed " << r[0] << " image " << r[1] << "x" << r[2] << " scale ("
                         << r[3] << ", " << r[4] << ") ratio (" << r[5] << ", " << r[6] << ")";
  }
}

TEST(Torchvision, RandomCropAndFlipDrawLikeTorchvision) {
  ASSERT_GT(lines("random_crop.txt").size(), 100u);
  ASSERT_GT(lines("flips.txt").size(), 100u);
  for (const auto& r : lines("random_crop.txt")) {
    at::Generator g = seeded(std::stoull(r[0]));
    const auto ij = RandomCrop::get_params(std::stoll(r[1]), std::stoll(r[2]),
                                           {std::stoll(r[3]), std::stoll(r[4])}, g);
    EXPECT_EQ(ij[0], std::stoll(r[5])) << "seed " << r[0];
    EXPECT_EQ(ij[1], std::stoll(r[6])) << "seed " << r[0];
  }
  // RandomHorizontalFlip with p: seeded like the sample's generator, flipped as torchvision.
  const torch::Tensor image = torch::arange(2 * 3 * 3, torch::kUInt8).view({2, 3, 3});
  for (const auto& r : lines("flips.txt")) {
    const RandomFlip flip(true, std::stod(r[1]));
    SampleContext ctx(0, 0, 0);
    ctx.generator() = seeded(std::stoull(r[0]));
    const torch::Tensor out = flip(Example{{"image", image}}, ctx)["image"].tensor();
    EXPECT_EQ(out.equal(image), r[2] == "0") << "seed " << r[0] << " p " << r[1];
  }
}

}  // namespace
}  // namespace ferry::vision
