#pragma once

/// ferry: multi-process data loading for LibTorch training loops. This umbrella header brings in
/// the whole public API; each header can also be included on its own.

#include "ferry/batch.h"
#include "ferry/collate.h"
#include "ferry/config.h"
#include "ferry/data_loader.h"
#include "ferry/data_loader_options.h"
#include "ferry/dataset.h"
#include "ferry/error.h"
#include "ferry/example.h"
#include "ferry/init.h"
#include "ferry/launch.h"
#include "ferry/registry.h"
#include "ferry/sample_context.h"
#include "ferry/sampler.h"
#include "ferry/synthetic_dataset.h"
#include "ferry/tokens.h"
#include "ferry/transform.h"
#include "ferry/version.h"
#if defined(FERRY_HAS_VISION)
#include "ferry/vision.h"
#endif
#if defined(FERRY_HAS_CONFIG)
#include "ferry/pipeline.h"
#endif
