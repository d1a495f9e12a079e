#pragma once

// WebDataset tar shards: each sample is the members of a shard that share a key
// (`<key>.jpg`, `<key>.cls`, `<key>.json`), in order. Read map-style through the index beside
// each shard (or by listing the shard's headers once), or as a stream that reads shards front to
// back, split over ranks and workers as WebDataset splits them (shards[rank::world], then
// shards[worker::num_workers]). Samples have `image` (decoded and transformed as the image
// datasets do), `label` (the integer in `<key>.cls`), `key` and `index`.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ferry/dataset.h"
#include "ferry/vision/datasets.h"

namespace ferry::net {
class PrefetcherSlot;
}  // namespace ferry::net

namespace ferry::vision {

class Compose;

/// Shards named by one string: a file, a folder (its `*.tar`, sorted), or a WebDataset brace
/// pattern (`data/train-{000000..000099}.tar`, each number as wide as the first). Remote shards
/// as WebDataset writes them: `s3://bucket/train/shard-{000000..000127}.tar`,
/// `https://host/path/shard-{00..09}.tar`, `s3://bucket/train/` (a prefix: its `.tar` keys,
/// listed with ListObjectsV2, sorted) and `pipe:COMMAND` (the command's standard output is the
/// shard). Throws ferry::DataError when the pattern is malformed or names no shard.
std::vector<std::string> expand_shards(const std::string& spec);

struct WebDatasetOptions : ImageDatasetOptions {
  /// The extensions tried for `image`, first match wins (WebDataset's lower-cased suffixes).
  std::vector<std::string> image_extensions{"jpg", "jpeg", "png", "webp", "ppm",
                                            "bmp", "pgm",  "tif", "tiff"};
  /// The member holding the label as decimal text; empty: samples have no `label`.
  std::string label_extension = "cls";
  /// Map-style: read `<shard>.idx` (DALI's v1.2 index, as ferry preprocess writes it) when it is
  /// there; false, or no index: list the shard's headers.
  bool use_index = true;
  /// Remote shards (s3://, http(s)://): attempts in a row that make no progress before a request
  /// fails (MosaicML Streaming's name), and seconds without a byte before a connection is cut
  /// and the read resumed with a Range request.
  int download_retry = 8;
  double download_timeout = 30;
  /// Remote shards: a folder for a node-local cache of whole shards, shared by every process on
  /// the machine (one download per shard; see README "Shards in object stores"); empty: none, and
  /// shards are read as they arrive (streams) or by byte ranges (map-style).
  std::string cache_dir{};
  /// The cache's size in bytes (least recently used shards evicted beyond it); 0: no limit.
  std::uint64_t cache_limit = 0;
  /// Reading ahead (0: off). A stream with a cache downloads this many of its next shards ahead
  /// of the one it reads; without one, it opens its next shard while it reads the current one.
  /// Map-style, told which samples come next (Dataset::prefetch), reads them ahead: without a
  /// cache by ranged GETs, up to 8 at once and 64 MiB held per process; with a cache, the shards
  /// they lie in come into it, this many at a time.
  std::size_t prefetch = 1;
};

/// Map-style: the samples of every shard, in shard order. Construction reads each shard's index
/// (or headers); `get` reads only the sample's members.
class WebDataset : public Dataset {
 public:
  explicit WebDataset(std::vector<std::string> shards, WebDatasetOptions options = {});
  std::size_t size() const override { return samples_.size(); }
  Example get(std::size_t index, SampleContext& ctx) const override;
  /// Remote shards: reads the samples ahead (see WebDatasetOptions::prefetch); false for local
  /// shards or `prefetch: 0`.
  bool prefetch(std::span<const std::size_t> indices) const override;
  std::shared_ptr<Dataset> with_transforms(const TransformList& transforms) const override;

  struct Field {
    std::string extension;
    std::uint64_t offset = 0;
    std::uint64_t size = 0;
  };
  struct Sample {
    std::uint32_t shard = 0;
    std::string key;
    std::vector<Field> fields;
  };
  const std::vector<std::string>& shards() const noexcept { return shards_; }
  const std::vector<Sample>& samples() const noexcept { return samples_; }
  const WebDatasetOptions& options() const noexcept { return options_; }
  /// The bytes of one member of a sample (DataError when it has none with that extension).
  torch::Tensor read_field(std::size_t index, const std::string& extension) const;

 private:
  std::vector<std::string> shards_;
  std::vector<Sample> samples_;
  WebDatasetOptions options_;
  std::shared_ptr<const Compose> pipeline_;
  // Remote shards: each object's size and ETag as construction found them (empty for local
  // shards); a sample's members are read with ranged GETs pinned to that ETag.
  std::vector<std::pair<std::uint64_t, std::string>> remote_;
  // What prefetch() started in this process (made on the first hint); a copy starts without.
  struct ReadAhead {
    ReadAhead();
    ReadAhead(const ReadAhead&);
    ReadAhead& operator=(const ReadAhead&);
    ~ReadAhead();
    std::unique_ptr<net::PrefetcherSlot> slot;
  };
  mutable ReadAhead read_ahead_;
};

/// The same shards as a stream (an iterable dataset). `rank` and `world_size` default to the
/// launcher's (torchrun, Open MPI, Slurm; see ferry/launch.h). Its cursor is the shard and the
/// offset of the next sample, so a checkpoint resumes without re-reading.
class WebDatasetStream : public IterableDataset {
 public:
  struct Options : WebDatasetOptions {
    std::optional<std::size_t> rank;
    std::optional<std::size_t> world_size;
  };
  explicit WebDatasetStream(std::vector<std::string> shards, Options options = {});
  std::unique_ptr<ExampleStream> stream(SampleContext& ctx) const override;
  /// The samples of this rank's shards, when every one of them has an index.
  std::optional<std::size_t> size_hint() const override { return size_hint_; }
  /// This rank's shards (before the split over workers).
  const std::vector<std::string>& shards() const noexcept { return mine_; }

 private:
  std::vector<std::string> mine_;
  Options options_;
  std::shared_ptr<const Compose> pipeline_;
  std::optional<std::size_t> size_hint_;
};

}  // namespace ferry::vision
