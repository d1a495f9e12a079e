// ferry::vision's types in the registry: the image datasets and torchvision's transforms, with
// torchvision's key names and defaults. Registered by ferry::register_builtins.

#include "ferry/error.h"
#include "ferry/registry.h"
#include "ferry/vision.h"

namespace ferry::vision {

namespace {

KeySpec mode_key() {
  return {.name = "mode",
          .type = ValueType::kString,
          .default_value = "rgb",
          .help =
              "rgb (as torchvision's loader), gray, or unchanged (the file's channels and "
              "depth)",
          .choices = {"rgb", "gray", "unchanged"}};
}

KeySpec max_pixels_key() {
  return {.name = "max_pixels",
          .type = ValueType::kInt,
          .default_value = kDefaultMaxPixels,
          .help = "larger images are refused from their header (Pillow's bomb limit)",
          .min = 1};
}

KeySpec interpolation_key() {
  return {.name = "interpolation",
          .type = ValueType::kString,
          .default_value = "bilinear",
          .help = "nearest, bilinear or bicubic (Pillow's filters)",
          .choices = {"nearest", "bilinear", "bicubic"}};
}

KeySpec reduced_decode_key() {
  return {.name = "reduced_decode",
          .type = ValueType::kBool,
          .default_value = true,
          .help =
              "a JPEG may decode at M/8 scale and only the needed region (faster; within "
              "the tolerance the README states); false: bit-exact with torchvision"};
}

KeySpec size_key(std::string help) {
  return {.name = "size",
          .type = ValueType::kIntList,
          .required = true,
          .help = std::move(help),
          .min = 1};
}

std::array<double, 2> pair_of(const Args& a, std::string_view key) {
  const auto v = a.get<std::vector<double>>(key);
  if (v.size() != 2)
    a.fail(key, ferry::detail::str("expected two numbers (min, max); got ", v.size()));
  return {v[0], v[1]};
}

ImageDatasetOptions image_options(const Args& a) {
  ImageDatasetOptions o;
  o.mode = parse_image_mode(a.get<std::string>("mode"));
  o.max_pixels = a.get<std::int64_t>("max_pixels");
  o.decode = a.get<bool>("decode");
  return o;
}

PaddingMode parse_padding_mode(const std::string& s) {
  if (s == "edge") return PaddingMode::kEdge;
  if (s == "reflect") return PaddingMode::kReflect;
  if (s == "symmetric") return PaddingMode::kSymmetric;
  return PaddingMode::kConstant;
}

}  // namespace

void register_vision_types(Registry& r) {
  if (!r.claim_group("ferry.vision")) return;

  const KeySpec decode_key{.name = "decode",
                           .type = ValueType::kBool,
                           .default_value = true,
                           .help = "false: 'image' is the file's bytes (a 1-D uint8 tensor)"};

  r.add_dataset(
      {.name = "image_folder",
       .summary = "torchvision's ImageFolder: root/<class>/**/<image>, classes sorted and "
                  "numbered from 0; fields image, label, index, path",
       .keys = {{.name = "root",
                 .type = ValueType::kString,
                 .required = true,
                 .help = "the folder with one sub-folder per class",
                 .is_path = true},
                {.name = "extensions",
                 .type = ValueType::kStringList,
                 .default_value =
                     [] {
                       std::vector<Config> v;
                       for (const auto& e : default_image_extensions()) v.emplace_back(e);
                       return Config::list(std::move(v));
                     }(),
                 .help = "file extensions kept (any case)"},
                mode_key(),
                max_pixels_key(),
                decode_key},
       .builtin = true},
      [](const Args& a) {
        ImageFolder::Options o;
        static_cast<ImageDatasetOptions&>(o) = image_options(a);
        o.extensions = a.get<std::vector<std::string>>("extensions");
        return std::make_shared<ImageFolder>(a.get<std::string>("root"), std::move(o));
      });

  r.add_dataset(
      {.name = "image_list",
       .summary = "images listed as 'path,label' lines of a text or CSV file (paths relative to "
                  "the file); fields image, label, index, path",
       .keys = {{.name = "file",
                 .type = ValueType::kString,
                 .required = true,
                 .help = "the list file",
                 .is_path = true},
                mode_key(),
                max_pixels_key(),
                decode_key},
       .builtin = true},
      [](const Args& a) {
        return std::make_shared<ImageList>(a.get<std::string>("file"), image_options(a));
      });

  const auto webdataset_keys = [&](bool stream) {
    std::vector<KeySpec> keys{
        {.name = "shards",
         .type = ValueType::kString,
         .required = true,
         .help = "a .tar file, a folder of them, or a brace pattern as "
                 "train-{000000..000099}.tar; remote: s3://bucket/train-{000000..000099}.tar, "
                 "s3://bucket/prefix/ (its .tar keys), https://host/train-{0..9}.tar, "
                 "pipe:COMMAND",
         .is_path = true},
        {.name = "download_retry",
         .type = ValueType::kInt,
         .default_value = 8,
         .help = "remote shards: attempts in a row without progress before a request fails",
         .min = 1,
         .max = 100},
        {.name = "download_timeout",
         .type = ValueType::kFloat,
         .default_value = 30.0,
         .help = "remote shards: seconds without a byte before a connection is cut and retried",
         .min = 1,
         .max = 3600},
        {.name = "cache_dir",
         .type = ValueType::kString,
         .default_value = "",
         .help = "remote shards: a node-local cache folder shared by the machine's processes; "
                 "'': none",
         .is_path = true},
        {.name = "cache_limit",
         .type = ValueType::kInt,
         .default_value = 0,
         .help = "the cache's size in bytes (least recently used shards evicted); 0: no limit",
         .min = 0},
        {.name = "prefetch",
         .type = ValueType::kInt,
         .default_value = 1,
         .help = "with a cache, shards a stream downloads ahead of the one it reads",
         .min = 0,
         .max = 64},
        {.name = "label",
         .type = ValueType::kString,
         .default_value = "cls",
         .help = "the extension of the member holding the integer label; '': no label"},
        mode_key(),
        max_pixels_key(),
        decode_key};
    if (!stream) {
      keys.push_back({.name = "use_index",
                      .type = ValueType::kBool,
                      .default_value = true,
                      .help = "read <shard>.idx (DALI's v1.2 index) when present; false: list "
                              "the shard's headers"});
    } else {
      keys.push_back({.name = "rank",
                      .type = ValueType::kInt,
                      .help = "this process's rank (default: the launcher's, else 0)",
                      .min = 0});
      keys.push_back({.name = "world_size",
                      .type = ValueType::kInt,
                      .help = "the ranks that split the shards (default: the launcher's, else 1)",
                      .min = 1});
    }
    return keys;
  };
  const auto webdataset_options = [](const Args& a, WebDatasetOptions& o) {
    static_cast<ImageDatasetOptions&>(o) = image_options(a);
    o.label_extension = a.get<std::string>("label");
    o.download_retry = static_cast<int>(a.get<std::int64_t>("download_retry"));
    o.download_timeout = a.get<double>("download_timeout");
    o.cache_dir = a.get<std::string>("cache_dir");
    o.cache_limit = static_cast<std::uint64_t>(a.get<std::int64_t>("cache_limit"));
    o.prefetch = a.get<std::size_t>("prefetch");
  };
  r.add_dataset({.name = "webdataset",
                 .summary = "WebDataset tar shards, map-style through each shard's index: "
                            "<key>.jpg/.png/.webp and <key>.cls; fields image, label, key, index",
                 .keys = webdataset_keys(false),
                 .builtin = true},
                [webdataset_options](const Args& a) {
                  WebDatasetOptions o;
                  webdataset_options(a, o);
                  o.use_index = a.get<bool>("use_index");
                  return std::make_shared<WebDataset>(expand_shards(a.get<std::string>("shards")),
                                                      std::move(o));
                });
  r.add_iterable_dataset(
      {.name = "webdataset_stream",
       .summary = "WebDataset tar shards read front to back, split over ranks then workers "
                  "(shards[rank::world][worker::workers]); fields image, label, key, index",
       .keys = webdataset_keys(true),
       .builtin = true},
      [webdataset_options](const Args& a) {
        WebDatasetStream::Options o;
        webdataset_options(a, o);
        if (a.has("rank")) o.rank = a.get<std::size_t>("rank");
        if (a.has("world_size")) o.world_size = a.get<std::size_t>("world_size");
        return std::make_shared<WebDatasetStream>(expand_shards(a.get<std::string>("shards")),
                                                  std::move(o));
      });

  r.add_transform({.name = "decode",
                   .summary = "decodes the file in 'image' (lazily: the next crop or resize "
                              "decodes only what it needs)",
                   .keys = {mode_key(), max_pixels_key()},
                   .builtin = true},
                  [](const Args& a) {
                    return std::make_shared<Decode>(parse_image_mode(a.get<std::string>("mode")),
                                                    a.get<std::int64_t>("max_pixels"));
                  });

  r.add_transform(
      {.name = "resize",
       .summary = "torchvision's Resize: [s] scales the shorter side to s, [h, w] exactly; "
                  "antialiased",
       .keys = {size_key("[shorter side] or [height, width]"),
                interpolation_key(),
                {.name = "max_size",
                 .type = ValueType::kInt,
                 .help = "cap on the longer side (only with one size)",
                 .min = 1},
                reduced_decode_key()},
       .builtin = true},
      [](const Args& a) {
        Resize::Options o;
        o.size = a.get<std::vector<std::int64_t>>("size");
        o.interpolation = parse_interpolation(a.get<std::string>("interpolation"));
        if (a.has("max_size")) o.max_size = a.get<std::int64_t>("max_size");
        o.reduced_decode = a.get<bool>("reduced_decode");
        return std::make_shared<Resize>(std::move(o));
      });

  r.add_transform({.name = "center_crop",
                   .summary = "torchvision's CenterCrop (pads with zeros when larger)",
                   .keys = {size_key("[side] or [height, width]")},
                   .builtin = true},
                  [](const Args& a) {
                    return std::make_shared<CenterCrop>(a.get<std::vector<std::int64_t>>("size"));
                  });

  r.add_transform(
      {.name = "random_crop",
       .summary = "torchvision's RandomCrop",
       .keys = {size_key("[side] or [height, width]"),
                {.name = "padding",
                 .type = ValueType::kIntList,
                 .default_value = Config::list(),
                 .help = "[all], [left/right, top/bottom] or [left, top, right, bottom]",
                 .min = 0},
                {.name = "pad_if_needed",
                 .type = ValueType::kBool,
                 .default_value = false,
                 .help = "pad an image smaller than the crop"},
                {.name = "fill",
                 .type = ValueType::kInt,
                 .default_value = 0,
                 .help = "constant padding value",
                 .min = 0,
                 .max = 255},
                {.name = "padding_mode",
                 .type = ValueType::kString,
                 .default_value = "constant",
                 .help = "constant, edge, reflect or symmetric",
                 .choices = {"constant", "edge", "reflect", "symmetric"}}},
       .builtin = true},
      [](const Args& a) {
        return std::make_shared<RandomCrop>(RandomCrop::Options{
            .size = a.get<std::vector<std::int64_t>>("size"),
            .padding = a.get<std::vector<std::int64_t>>("padding"),
            .pad_if_needed = a.get<bool>("pad_if_needed"),
            .fill = a.get<std::int64_t>("fill"),
            .padding_mode = parse_padding_mode(a.get<std::string>("padding_mode"))});
      });

  r.add_transform(
      {.name = "random_resized_crop",
       .summary = "torchvision's RandomResizedCrop: a box of random area and aspect ratio "
                  "(ten tries, then the centre), resized to size",
       .keys = {size_key("[side] or [height, width]"),
                {.name = "scale",
                 .type = ValueType::kFloatList,
                 .default_value = Config::list({0.08, 1.0}),
                 .help = "(min, max) fraction of the area",
                 .min = 0},
                {.name = "ratio",
                 .type = ValueType::kFloatList,
                 .default_value = Config::list({3.0 / 4.0, 4.0 / 3.0}),
                 .help = "(min, max) aspect ratio",
                 .min = 0},
                interpolation_key(),
                reduced_decode_key()},
       .builtin = true},
      [](const Args& a) {
        return std::make_shared<RandomResizedCrop>(RandomResizedCrop::Options{
            .size = a.get<std::vector<std::int64_t>>("size"),
            .scale = pair_of(a, "scale"),
            .ratio = pair_of(a, "ratio"),
            .interpolation = parse_interpolation(a.get<std::string>("interpolation")),
            .reduced_decode = a.get<bool>("reduced_decode")});
      });

  const KeySpec p_key{.name = "p",
                      .type = ValueType::kFloat,
                      .default_value = 0.5,
                      .help = "probability of flipping",
                      .min = 0,
                      .max = 1};
  r.add_transform(
      {.name = "random_horizontal_flip",
       .summary = "torchvision's RandomHorizontalFlip",
       .keys = {p_key},
       .builtin = true},
      [](const Args& a) { return std::make_shared<RandomFlip>(true, a.get<double>("p")); });
  r.add_transform(
      {.name = "random_vertical_flip",
       .summary = "torchvision's RandomVerticalFlip",
       .keys = {p_key},
       .builtin = true},
      [](const Args& a) { return std::make_shared<RandomFlip>(false, a.get<double>("p")); });

  const auto jitter_key = [](const char* name, const char* help, double max) {
    return KeySpec{.name = name,
                   .type = ValueType::kFloat,
                   .default_value = 0.0,
                   .help = help,
                   .min = 0,
                   .max = max};
  };
  r.add_transform(
      {.name = "color_jitter",
       .summary = "torchvision's ColorJitter (factors in [max(0, 1 - x), 1 + x], random order)",
       .keys = {jitter_key("brightness", "brightness jitter", 1e9),
                jitter_key("contrast", "contrast jitter", 1e9),
                jitter_key("saturation", "saturation jitter", 1e9),
                jitter_key("hue", "hue jitter, at most 0.5", 0.5)},
       .builtin = true},
      [](const Args& a) {
        return std::make_shared<ColorJitter>(
            ColorJitter::Options{.brightness = a.get<double>("brightness"),
                                 .contrast = a.get<double>("contrast"),
                                 .saturation = a.get<double>("saturation"),
                                 .hue = a.get<double>("hue")});
      });

  r.add_transform({.name = "to_tensor",
                   .summary = "torchvision's ToTensor: C x H x W float32 in [0, 1] (dtype uint8: "
                              "PILToTensor)",
                   .keys = {{.name = "dtype",
                             .type = ValueType::kString,
                             .default_value = "float32",
                             .help = "float32 (scaled to [0, 1]) or uint8 (as stored)",
                             .choices = {"float32", "uint8"}}},
                   .builtin = true},
                  [](const Args& a) {
                    return std::make_shared<ToTensor>(a.get<std::string>("dtype") == "uint8");
                  });
  r.add_transform({.name = "pil_to_tensor",
                   .summary = "torchvision's PILToTensor: C x H x W uint8, for pipelines that "
                              "normalise on the GPU",
                   .builtin = true},
                  [](const Args&) { return std::make_shared<ToTensor>(true); });

  r.add_transform({.name = "normalize",
                   .summary = "torchvision's Normalize: (x - mean) / std per channel",
                   .keys = {{.name = "mean",
                             .type = ValueType::kFloatList,
                             .required = true,
                             .help = "one per channel, e.g. [0.485, 0.456, 0.406]"},
                            {.name = "std",
                             .type = ValueType::kFloatList,
                             .required = true,
                             .help = "one per channel, e.g. [0.229, 0.224, 0.225]"}},
                   .builtin = true},
                  [](const Args& a) {
                    return std::make_shared<Normalize>(a.get<std::vector<double>>("mean"),
                                                       a.get<std::vector<double>>("std"));
                  });
}

}  // namespace ferry::vision
