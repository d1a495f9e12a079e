#pragma once

// The messages between the loader (main process) and its workers. Fixed binary layout: a header
// (magic, version, type) and little-endian fields; strings and arrays carry their length; every
// read is length-checked and a malformed message is a ferry::Error naming what was cut short.
// The protocol knows nothing of tensors: a field is a name, a dtype code, sizes and an offset.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace ferry::ipc {

inline constexpr std::uint16_t kProtocolVersion = 8;

// ---- index channel: main to worker ----
struct SkippedSampleRecord {  // on_error = skip: a sample left out of its batch, and why
  std::int64_t index = -1;
  std::string type_name;
  std::string message;
};
struct TaskMessage {  // load batch `sequence` of `epoch` (map-style: these indices)
  std::uint64_t epoch = 0;
  std::uint64_t sequence = 0;
  std::vector<std::int64_t> indices;    // empty for an iterable dataset: "your next batch"
  std::vector<std::uint64_t> recycled;  // segments to reuse, riding along (saves a message)
  // Iterable datasets, resuming from a checkpoint: where this worker's stream of this epoch
  // continues, read when the stream is made (its first task of the epoch): after
  // `stream_position` samples, at `stream_cursor` when the stream gave one (else by reading and
  // dropping that many).
  std::uint64_t stream_position = 0;
  bool has_stream_cursor = false;
  std::string stream_cursor;
  // Samples of `indices` not to load (quarantined: their loading killed workers), reported back
  // as skipped with these records.
  std::vector<SkippedSampleRecord> leave_out;
};
struct RecycleMessage {  // the training loop let go of these segments: reuse them
  std::vector<std::uint64_t> segment_ids;
};
struct NewEpochMessage {  // persistent workers: epoch `epoch` starts (iterable: new streams)
  std::uint64_t epoch = 0;
};
struct StopMessage {};
// spawn and forkserver: the first message a new worker gets. The dataset (and collate) travel
// as canonical configuration text; the worker rebuilds them from its registry and answers with
// WorkerReadyMessage carrying the hash of what it built.
struct SetupMessage {
  std::uint64_t worker_id = 0;
  std::uint64_t num_workers = 1;
  std::uint64_t base_seed = 0;
  std::uint64_t torch_seed = 0;  // LibTorch's default generator in the worker
  std::uint64_t batch_size = 1;
  bool drop_last = false;
  std::uint64_t keep_free_segments = 2;
  bool spin = false;
  std::uint64_t sample_timeout_ms = 0;
  std::uint64_t worker_threads = 1;
  bool skip_errors = false;  // on_error = skip
  std::int64_t parent_pid = 0;
  bool trace = false;              // send a span per sample with each batch (a trace is on)
  std::vector<std::int32_t> cpus;  // the cores the worker runs on; empty: any
  std::string dataset_config;      // Config::to_text()
  std::string collate_config;      // empty: default collate
};
using IndexMessage =
    std::variant<TaskMessage, RecycleMessage, NewEpochMessage, StopMessage, SetupMessage>;

// ---- data channel: worker to main ----
struct FieldMeta {
  std::string name;
  std::uint8_t kind = 0;   // collate::FieldKind
  std::int8_t dtype = -1;  // c10::ScalarType code; -1 for strings
  std::vector<std::int64_t> sizes;
  std::uint64_t offset = 0;
  std::uint64_t nbytes = 0;
  std::vector<std::string> strings;  // string fields only
};
// A batch whose every sample was skipped has num_samples = 0, no fields and no segment.
inline constexpr std::uint64_t kNoSegment = ~std::uint64_t{0};
// Where a worker's time went on one batch (stats), in nanoseconds. Only reported: the main
// process clamps what it adds up, and nothing it decides depends on them.
struct WorkerTiming {
  std::uint64_t start_ns = 0;      // CLOCK_MONOTONIC when the task arrived
  std::uint64_t waiting_ns = 0;    // since the previous batch was sent: waiting for this task
  std::uint64_t loading_ns = 0;    // Dataset::get (or the stream) for the batch's samples
  std::uint64_t collating_ns = 0;  // laying the batch out and writing it into shared memory
  std::uint64_t segment_ns = 0;    // getting a segment (a fresh one: memfd, fallocate, mmap)
  std::uint64_t cpu_ns = 0;        // CPU the process used since its previous batch
  // Remote shards, since the previous batch (exact counts, every batch): bytes received,
  // requests made, of them retries, and shards served from / downloaded into the cache.
  std::uint64_t net_bytes = 0;
  std::uint64_t net_requests = 0;
  std::uint64_t net_retries = 0;
  std::uint64_t cache_hits = 0;
  std::uint64_t cache_downloads = 0;
};
// A trace's span of the worker's: a sample it loaded (index >= 0), or the batch's collation
// (index -1) or whole loading (index -2, when samples are not timed one by one).
struct SpanRecord {
  std::int64_t index = 0;
  std::uint64_t start_ns = 0;  // CLOCK_MONOTONIC
  std::uint64_t end_ns = 0;
};
inline constexpr std::int64_t kCollateSpan = -1;
inline constexpr std::int64_t kLoadSpan = -2;
inline constexpr std::int64_t kDownloadSpan = -3;  // a remote shard's transfer (net/http.h)
struct BatchReadyMessage {  // batch `sequence` is in segment `segment_id` (its fd attached once)
  std::uint64_t epoch = 0;
  std::uint64_t sequence = 0;
  std::uint64_t segment_id = 0;
  std::uint64_t segment_size = 0;
  std::uint32_t num_samples = 0;
  std::vector<FieldMeta> fields;
  std::vector<std::int64_t> indices;
  std::vector<std::uint64_t> retired_segments;  // segments the worker has freed for good
  std::vector<SkippedSampleRecord> skipped;
  // Iterable datasets: the stream's cursor after this batch, when it gives one (checkpoints).
  bool has_stream_cursor = false;
  std::string stream_cursor;
  WorkerTiming timing;
  std::vector<SpanRecord> spans;  // a trace is on: the batch's samples and collation
};
struct SampleErrorMessage {  // batch `sequence` failed; the worker goes on
  std::uint64_t epoch = 0;
  std::uint64_t sequence = 0;
  std::int64_t index = -1;  // the sample that failed; -1 for the batch as a whole
  std::string type_name;
  std::string message;
};
struct WorkerErrorMessage {  // the worker cannot go on (worker_init_fn, stream creation failed)
  std::uint64_t epoch = 0;
  std::string type_name;
  std::string message;
};
struct StreamEndMessage {  // iterable datasets: this worker's stream has ended
  std::uint64_t epoch = 0;
  std::uint64_t sequence = 0;
};
struct WorkerReadyMessage {  // spawn and forkserver: the dataset is rebuilt; tasks may come
  std::int64_t pid = 0;
  std::uint64_t dataset_hash = 0;  // of the configuration the worker resolved
  std::int64_t dataset_size = -1;  // -1: an iterable dataset
  std::uint64_t collate_hash = 0;  // 0: default collate
};
using DataMessage = std::variant<BatchReadyMessage,
                                 SampleErrorMessage,
                                 WorkerErrorMessage,
                                 StreamEndMessage,
                                 WorkerReadyMessage>;

std::vector<std::byte> encode(const IndexMessage& message);
std::vector<std::byte> encode(const DataMessage& message);
IndexMessage decode_index(std::span<const std::byte> bytes);
DataMessage decode_data(std::span<const std::byte> bytes);

}  // namespace ferry::ipc
