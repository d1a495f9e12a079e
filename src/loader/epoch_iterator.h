#pragma once

#include <exception>
#include <memory>
#include <optional>

#include "ferry/batch.h"

#include "loader/loader_stats.h"
#include "loader/trace.h"

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

  // Set by begin(): the epoch's figures (stats), the loader's trace (null: none), its number.
  std::unique_ptr<EpochTally> tally;
  std::shared_ptr<Tracer> tracer;
  std::uint64_t epoch_number = 0;
};

}  // namespace ferry::detail
