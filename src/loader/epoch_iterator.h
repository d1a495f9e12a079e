#pragma once

#include <exception>
#include <optional>

#include "ferry/batch.h"

namespace ferry::detail {

// One epoch's source of batches. The in-process kind lives in data_loader.cpp; the worker
// processes' kind joins it with the multi-process engine.
class EpochIterator {
 public:
  virtual ~EpochIterator() = default;
  // The next batch, or nullopt at the end of the epoch. After an exception the epoch continues
  // with the following batch.
  virtual std::optional<Batch> next() = 0;

  // What the iterator stands on: a batch, or the error that loading it raised (rethrown on
  // dereference, so the iterator stays usable and `++` goes on to the next batch).
  std::optional<Batch> current;
  std::exception_ptr error;
};

}  // namespace ferry::detail
