#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ferry/config.h"
#include "ferry/example.h"
#include "ferry/sample_context.h"

namespace ferry {

namespace detail {
// What the registry records on a component it built: how to build it again elsewhere.
class Registered {
 public:
  /// How `ferry::Registry` built this object (type and resolved configuration), so that a
  /// spawned worker can build it again; null for an object constructed directly in C++.
  const ComponentSpec* spec() const noexcept { return spec_ ? &*spec_ : nullptr; }
  void set_spec(ComponentSpec spec) { spec_ = std::move(spec); }
  void clear_spec() noexcept { spec_.reset(); }

 private:
  std::optional<ComponentSpec> spec_;
};
}  // namespace detail

/// A map-style dataset: `size()` samples, loaded by index.
///
/// `get` may run in a worker process (a forked copy of this object, or one rebuilt from its
/// configuration under spawn) and, with `worker_threads > 1`, on several threads at once, so it
/// is `const` and must not rely on state shared with the training loop. Changes made to the
/// dataset in the main process after workers start do not reach them.
class Transform;

class Dataset : public detail::Registered {
 public:
  virtual ~Dataset() = default;
  virtual std::size_t size() const = 0;
  /// Loads sample `index` (0 <= index < size()). Throw to report a bad sample: the loader raises
  /// the error in the training loop with the index, worker and batch attached.
  virtual Example get(std::size_t index, SampleContext& ctx) const = 0;
  /// A hint: the samples this process will load next, in the order it will load them (a worker
  /// gives its batch's indices when it starts it, then those of the batches queued behind it).
  /// A dataset that reads over a network may start reading them on threads of its own; `get`
  /// must still return the same sample for any index at any time, hinted or not. Return false
  /// when hints are of no use to this dataset (the default): the loader then stops giving them.
  virtual bool prefetch([[maybe_unused]] std::span<const std::size_t> indices) const {
    return false;
  }
  /// A copy of this dataset that applies `transforms` to each sample itself, or null (the
  /// default) to have a TransformedDataset apply them after `get`. Image datasets take them so
  /// that a file is decoded straight into the first crop or resize (see ferry::apply_transforms).
  virtual std::shared_ptr<Dataset> with_transforms(
      [[maybe_unused]] const std::vector<std::shared_ptr<const Transform>>& transforms) const {
    return nullptr;
  }
};

/// The stream of samples one worker produces for an iterable dataset.
class ExampleStream {
 public:
  virtual ~ExampleStream() = default;
  /// The next sample, or nullopt when this worker's stream has ended. `ctx.index()` is the
  /// position in this stream.
  virtual std::optional<Example> next(SampleContext& ctx) = 0;

  /// Checkpoints (`DataLoader::state()`): where the stream stands after the last sample `next()`
  /// returned, as a short text (a shard and a record number, a file offset), or nullopt when it
  /// cannot say (the default). A loader resuming a stream with a cursor calls `seek`; without
  /// one it reads and drops the samples up to the saved position, and warns that it does.
  virtual std::optional<std::string> cursor() const { return std::nullopt; }
  /// Continues after `cursor`, which `cursor()` returned for the same worker and epoch, in a
  /// stream just made by `IterableDataset::stream()`. Throw to refuse it (ferry::Error).
  virtual void seek(const std::string& cursor);
};

/// An iterable dataset: each worker runs its own stream and the epoch ends when every stream
/// has ended. Split the data between workers with `ctx.worker_id()` and `ctx.num_workers()`, as
/// with torch.utils.data.get_worker_info(); otherwise each worker yields every sample.
class IterableDataset : public detail::Registered {
 public:
  virtual ~IterableDataset() = default;
  /// A new stream for the worker and epoch that `ctx` describes (`ctx.index()` is -1).
  virtual std::unique_ptr<ExampleStream> stream(SampleContext& ctx) const = 0;
  /// The number of samples in an epoch, when known; `DataLoader::size()` needs it.
  virtual std::optional<std::size_t> size_hint() const { return std::nullopt; }
};

}  // namespace ferry
