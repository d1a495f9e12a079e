#pragma once

// ferry::vision: image datasets and torchvision's transforms (built when OpenCV is found; link
// ferry::vision or ferry::ferry). See README "Images".

#include "ferry/registry.h"
#include "ferry/vision/datasets.h"
#include "ferry/vision/image.h"
#include "ferry/vision/sample_data.h"
#include "ferry/vision/transforms.h"
#include "ferry/vision/webdataset.h"

namespace ferry::vision {

/// Registers image_folder, image_list, webdataset, webdataset_stream and the transforms (resize,
/// center_crop, random_crop, random_resized_crop, random_horizontal_flip, random_vertical_flip,
/// color_jitter, decode, to_tensor, pil_to_tensor, normalize). Idempotent; ferry::register_builtins
/// calls it.
void register_vision_types(Registry& registry);

}  // namespace ferry::vision
