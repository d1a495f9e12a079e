#include "ipc/protocol.h"

#include <cstring>
#include <type_traits>

#include "ferry/error.h"

namespace ferry::ipc {

namespace {

constexpr std::uint32_t kMagic = 0x46455259;   // "FERY"
constexpr std::uint32_t kMaxCount = 1u << 28;  // no array or string this long is real

class Writer {
 public:
  template <class T>
  void put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const std::byte*>(&value);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  void put(const std::string& s) {
    put(static_cast<std::uint32_t>(s.size()));
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out_.insert(out_.end(), p, p + s.size());
  }
  template <class T>
  void put(const std::vector<T>& v) {
    put(static_cast<std::uint32_t>(v.size()));
    if constexpr (std::is_trivially_copyable_v<T>) {
      const auto* p = reinterpret_cast<const std::byte*>(v.data());
      out_.insert(out_.end(), p, p + v.size() * sizeof(T));
    } else {
      for (const auto& item : v) put(item);
    }
  }
  void put(const std::vector<SkippedSampleRecord>& records) {
    put(static_cast<std::uint32_t>(records.size()));
    for (const SkippedSampleRecord& s : records) {
      put(s.index);
      put(s.type_name);
      put(s.message);
    }
  }
  void put(const FieldMeta& f) {
    put(f.name);
    put(f.kind);
    put(f.dtype);
    put(f.sizes);
    put(f.offset);
    put(f.nbytes);
    put(f.strings);
  }
  void header(std::uint16_t type) {
    put(kMagic);
    put(kProtocolVersion);
    put(type);
  }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  template <class T>
  T get(const char* what) {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T), what);
    T value;
    std::memcpy(&value, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  std::string get_string(const char* what) {
    const auto n = count(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  template <class T>
  std::vector<T> get_vector(const char* what) {
    const auto n = count(what);
    need(static_cast<std::size_t>(n) * sizeof(T), what);
    std::vector<T> v(n);
    if (n > 0) std::memcpy(v.data(), in_.data() + pos_, n * sizeof(T));  // data() may be null
    pos_ += n * sizeof(T);
    return v;
  }
  std::vector<std::string> get_strings(const char* what) {
    const auto n = count(what);
    std::vector<std::string> v;
    v.reserve(std::min<std::uint32_t>(n, 4096));
    for (std::uint32_t i = 0; i < n; ++i) v.push_back(get_string(what));
    return v;
  }
  // At most `limit` records (a count over it is refused before anything is read).
  std::vector<SkippedSampleRecord> get_skipped(std::size_t limit, const char* what) {
    const auto n = get<std::uint32_t>(what);
    if (n > limit) throw Error(std::string("ferry protocol: absurd ") + what);
    std::vector<SkippedSampleRecord> out;  // grown as records arrive: a count is no promise
    for (std::uint32_t i = 0; i < n; ++i) {
      SkippedSampleRecord s;
      s.index = get<std::int64_t>("skipped index");
      s.type_name = get_string("skipped type name");
      s.message = get_string("skipped message");
      out.push_back(std::move(s));
    }
    return out;
  }
  FieldMeta get_field() {
    FieldMeta f;
    f.name = get_string("field name");
    f.kind = get<std::uint8_t>("field kind");
    f.dtype = get<std::int8_t>("field dtype");
    f.sizes = get_vector<std::int64_t>("field sizes");
    f.offset = get<std::uint64_t>("field offset");
    f.nbytes = get<std::uint64_t>("field nbytes");
    f.strings = get_strings("field strings");
    return f;
  }
  std::uint16_t header() {
    const auto magic = get<std::uint32_t>("magic");
    if (magic != kMagic) throw Error("ferry protocol: bad magic; the peer is not a ferry worker");
    const auto version = get<std::uint16_t>("version");
    if (version != kProtocolVersion) {
      throw Error(detail::str("ferry protocol: version ", version, " from the peer, ",
                              kProtocolVersion,
                              " here; the worker executable and the program are out of step"));
    }
    return get<std::uint16_t>("type");
  }
  void done() const {
    if (pos_ != in_.size()) {
      throw Error(detail::str("ferry protocol: ", in_.size() - pos_, " unexpected trailing bytes"));
    }
  }

 private:
  std::uint32_t count(const char* what) {
    const auto n = get<std::uint32_t>(what);
    if (n > kMaxCount)
      throw Error(detail::str("ferry protocol: ", what, " count ", n, " is absurd"));
    return n;
  }
  void need(std::size_t n, const char* what) const {
    if (in_.size() - pos_ < n) {
      throw Error(detail::str("ferry protocol: message cut short reading ", what, " (needs ", n,
                              " bytes at offset ", pos_, " of ", in_.size(), ")"));
    }
  }
  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
};

enum IndexType : std::uint16_t { kTask = 1, kRecycle = 2, kNewEpoch = 3, kStop = 4, kSetup = 5 };
enum DataType : std::uint16_t {
  kBatchReady = 101,
  kSampleError = 102,
  kWorkerError = 103,
  kStreamEnd = 104,
  kWorkerReady = 105
};

}  // namespace

std::vector<std::byte> encode(const IndexMessage& message) {
  Writer w;
  if (const auto* m = std::get_if<TaskMessage>(&message)) {
    w.header(kTask);
    w.put(m->epoch);
    w.put(m->sequence);
    w.put(m->indices);
    w.put(m->recycled);
    w.put(m->stream_position);
    w.put(static_cast<std::uint8_t>(m->has_stream_cursor));
    w.put(m->stream_cursor);
    w.put(m->leave_out);
  } else if (const auto* m = std::get_if<RecycleMessage>(&message)) {
    w.header(kRecycle);
    w.put(m->segment_ids);
  } else if (const auto* m = std::get_if<NewEpochMessage>(&message)) {
    w.header(kNewEpoch);
    w.put(m->epoch);
  } else if (const auto* m = std::get_if<SetupMessage>(&message)) {
    w.header(kSetup);
    w.put(m->worker_id);
    w.put(m->num_workers);
    w.put(m->base_seed);
    w.put(m->torch_seed);
    w.put(m->batch_size);
    w.put(static_cast<std::uint8_t>(m->drop_last));
    w.put(m->keep_free_segments);
    w.put(static_cast<std::uint8_t>(m->spin));
    w.put(m->sample_timeout_ms);
    w.put(m->worker_threads);
    w.put(static_cast<std::uint8_t>(m->skip_errors));
    w.put(m->parent_pid);
    w.put(static_cast<std::uint8_t>(m->trace));
    w.put(m->cpus);
    w.put(m->dataset_config);
    w.put(m->collate_config);
  } else {
    w.header(kStop);
  }
  return w.take();
}

std::vector<std::byte> encode(const DataMessage& message) {
  Writer w;
  if (const auto* m = std::get_if<BatchReadyMessage>(&message)) {
    w.header(kBatchReady);
    w.put(m->epoch);
    w.put(m->sequence);
    w.put(m->segment_id);
    w.put(m->segment_size);
    w.put(m->num_samples);
    w.put(m->fields);
    w.put(m->indices);
    w.put(m->retired_segments);
    w.put(m->skipped);
    w.put(static_cast<std::uint8_t>(m->has_stream_cursor));
    w.put(m->stream_cursor);
    w.put(m->timing);
    w.put(m->spans);
  } else if (const auto* m = std::get_if<SampleErrorMessage>(&message)) {
    w.header(kSampleError);
    w.put(m->epoch);
    w.put(m->sequence);
    w.put(m->index);
    w.put(m->type_name);
    w.put(m->message);
  } else if (const auto* m = std::get_if<WorkerErrorMessage>(&message)) {
    w.header(kWorkerError);
    w.put(m->epoch);
    w.put(m->type_name);
    w.put(m->message);
  } else if (const auto* m = std::get_if<StreamEndMessage>(&message)) {
    w.header(kStreamEnd);
    w.put(m->epoch);
    w.put(m->sequence);
  } else if (const auto* m = std::get_if<WorkerReadyMessage>(&message)) {
    w.header(kWorkerReady);
    w.put(m->pid);
    w.put(m->dataset_hash);
    w.put(m->dataset_size);
    w.put(m->collate_hash);
  }
  return w.take();
}

IndexMessage decode_index(std::span<const std::byte> bytes) {
  Reader r(bytes);
  IndexMessage out;
  switch (r.header()) {
    case kTask: {
      TaskMessage m;
      m.epoch = r.get<std::uint64_t>("task epoch");
      m.sequence = r.get<std::uint64_t>("task sequence");
      m.indices = r.get_vector<std::int64_t>("task indices");
      m.recycled = r.get_vector<std::uint64_t>("recycled segments");
      m.stream_position = r.get<std::uint64_t>("stream position");
      m.has_stream_cursor = r.get<std::uint8_t>("stream cursor flag") != 0;
      m.stream_cursor = r.get_string("stream cursor");
      m.leave_out = r.get_skipped(m.indices.size(), "left-out count");
      out = std::move(m);
      break;
    }
    case kRecycle:
      out = RecycleMessage{r.get_vector<std::uint64_t>("segment ids")};
      break;
    case kNewEpoch:
      out = NewEpochMessage{r.get<std::uint64_t>("epoch")};
      break;
    case kStop:
      out = StopMessage{};
      break;
    case kSetup: {
      SetupMessage m;
      m.worker_id = r.get<std::uint64_t>("worker id");
      m.num_workers = r.get<std::uint64_t>("worker count");
      m.base_seed = r.get<std::uint64_t>("seed");
      m.torch_seed = r.get<std::uint64_t>("torch seed");
      m.batch_size = r.get<std::uint64_t>("batch size");
      m.drop_last = r.get<std::uint8_t>("drop_last") != 0;
      m.keep_free_segments = r.get<std::uint64_t>("free segments");
      m.spin = r.get<std::uint8_t>("spin") != 0;
      m.sample_timeout_ms = r.get<std::uint64_t>("sample timeout");
      m.worker_threads = r.get<std::uint64_t>("worker threads");
      m.skip_errors = r.get<std::uint8_t>("on_error") != 0;
      m.parent_pid = r.get<std::int64_t>("parent pid");
      m.trace = r.get<std::uint8_t>("trace flag") != 0;
      m.cpus = r.get_vector<std::int32_t>("cpus");
      m.dataset_config = r.get_string("dataset configuration");
      m.collate_config = r.get_string("collate configuration");
      out = std::move(m);
      break;
    }
    default:
      throw Error("ferry protocol: unknown message type on the index channel");
  }
  r.done();
  return out;
}

DataMessage decode_data(std::span<const std::byte> bytes) {
  Reader r(bytes);
  DataMessage out;
  switch (r.header()) {
    case kBatchReady: {
      BatchReadyMessage m;
      m.epoch = r.get<std::uint64_t>("epoch");
      m.sequence = r.get<std::uint64_t>("sequence");
      m.segment_id = r.get<std::uint64_t>("segment id");
      m.segment_size = r.get<std::uint64_t>("segment size");
      m.num_samples = r.get<std::uint32_t>("sample count");
      const auto nfields = r.get<std::uint32_t>("field count");
      if (nfields > 4096) throw Error("ferry protocol: absurd field count");
      for (std::uint32_t i = 0; i < nfields; ++i) m.fields.push_back(r.get_field());
      m.indices = r.get_vector<std::int64_t>("indices");
      m.retired_segments = r.get_vector<std::uint64_t>("retired segments");
      m.skipped = r.get_skipped(m.indices.size() + 1'000'000, "skipped count");
      m.has_stream_cursor = r.get<std::uint8_t>("stream cursor flag") != 0;
      m.stream_cursor = r.get_string("stream cursor");
      m.timing = r.get<WorkerTiming>("timing");
      m.spans = r.get_vector<SpanRecord>("spans");
      // A span per sample, one per batch for its collation and for its loading at most.
      if (m.spans.size() > m.indices.size() + m.skipped.size() + 2) {
        throw Error("ferry protocol: more trace spans than the batch has samples");
      }
      out = std::move(m);
      break;
    }
    case kSampleError: {
      SampleErrorMessage m;
      m.epoch = r.get<std::uint64_t>("epoch");
      m.sequence = r.get<std::uint64_t>("sequence");
      m.index = r.get<std::int64_t>("index");
      m.type_name = r.get_string("type name");
      m.message = r.get_string("message");
      out = std::move(m);
      break;
    }
    case kWorkerError: {
      WorkerErrorMessage m;
      m.epoch = r.get<std::uint64_t>("epoch");
      m.type_name = r.get_string("type name");
      m.message = r.get_string("message");
      out = std::move(m);
      break;
    }
    case kStreamEnd: {
      StreamEndMessage m;
      m.epoch = r.get<std::uint64_t>("epoch");
      m.sequence = r.get<std::uint64_t>("sequence");
      out = m;
      break;
    }
    case kWorkerReady: {
      WorkerReadyMessage m;
      m.pid = r.get<std::int64_t>("pid");
      m.dataset_hash = r.get<std::uint64_t>("dataset hash");
      m.dataset_size = r.get<std::int64_t>("dataset size");
      m.collate_hash = r.get<std::uint64_t>("collate hash");
      out = m;
      break;
    }
    default:
      throw Error("ferry protocol: unknown message type on the data channel");
  }
  r.done();
  return out;
}

}  // namespace ferry::ipc
