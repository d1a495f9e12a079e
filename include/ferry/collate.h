#pragma once

#include <functional>
#include <vector>

#include "ferry/batch.h"
#include "ferry/example.h"

namespace ferry {

/// Turns the samples of one batch into a Batch. A user collate is any callable of this shape.
using CollateFn = std::function<Batch(std::vector<Example> samples)>;

/// PyTorch's default_collate for ferry's field kinds: tensors of equal shape and dtype are stacked
/// along a new first dimension, integers become an int64 tensor [B], reals a float64 tensor [B],
/// strings a list. All tensor fields of the batch share one allocation, and each sample is
/// copied exactly once. Throws `ferry::CollateError` naming the field, the two samples' dataset
/// indices and what differs (shape, dtype, kind, or a field missing).
Batch default_collate(std::vector<Example> samples);

}  // namespace ferry
