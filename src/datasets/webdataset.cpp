#include "ferry/vision/webdataset.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <sstream>
#include <system_error>

#include <opencv2/core.hpp>

#include "ferry/error.h"
#include "ferry/launch.h"
#include "ferry/vision/transforms.h"

#include "datasets/tar.h"
#include "ipc/files.h"
#include "net/byte_source.h"
#include "net/prefetch.h"
#include "net/shard_cache.h"
#include "net/url.h"
#include "transforms/image_state.h"

namespace ferry::vision {

namespace fs = std::filesystem;
using ferry::detail::str;
using Sample = WebDataset::Sample;

// ---- shard lists ----

std::vector<std::string> expand_shards(const std::string& spec) {
  const std::size_t open = spec.find('{');
  if (open != std::string::npos) {
    const std::size_t close = spec.find('}', open);
    const std::size_t dots = spec.find("..", open);
    if (close == std::string::npos || dots == std::string::npos || dots > close) {
      throw DataError(str("shards '", spec, "': a brace pattern is {FIRST..LAST}, as in ",
                          "train-{000000..000099}.tar"));
    }
    const std::string first = spec.substr(open + 1, dots - open - 1);
    const std::string last = spec.substr(dots + 2, close - dots - 2);
    std::uint64_t a = 0;
    std::uint64_t b = 0;
    const auto pa = std::from_chars(first.data(), first.data() + first.size(), a);
    const auto pb = std::from_chars(last.data(), last.data() + last.size(), b);
    if (first.empty() || last.empty() || pa.ec != std::errc() ||
        pa.ptr != first.data() + first.size() || pb.ec != std::errc() ||
        pb.ptr != last.data() + last.size() || b < a) {
      throw DataError(str("shards '", spec, "': {", first, "..", last,
                          "} is not a range of numbers FIRST <= LAST"));
    }
    if (b - a >= 10'000'000) {
      throw DataError(str("shards '", spec, "': ", b - a + 1, " shards; at most 10 million"));
    }
    std::vector<std::string> out;
    const std::string head = spec.substr(0, open);
    for (std::uint64_t n = a; n <= b; ++n) {
      std::string number = std::to_string(n);
      if (number.size() < first.size()) number.insert(0, first.size() - number.size(), '0');
      for (std::string rest : expand_shards(spec.substr(close + 1) + "\x01")) {
        rest.pop_back();
        out.push_back(head + number + rest);
      }
    }
    return out;
  }
  if (!spec.empty() && spec.back() == '\x01') return {spec};  // the tail of a pattern
  if (net::is_remote(spec)) {
    const net::Location loc = net::parse_location(spec);
    if (loc.scheme == net::Scheme::kS3 && (loc.key.empty() || loc.key.back() == '/')) {
      return net::list_s3_tars(spec);
    }
    return {spec};
  }
  std::error_code ec;
  if (fs::is_directory(spec, ec)) {
    std::vector<std::string> out;
    for (const ipc::DirectoryEntry& entry : ipc::list_directory(spec, ec)) {
      if (fs::path(entry.name).extension() == ".tar" && !entry.is_directory) {
        out.push_back((fs::path(spec) / entry.name).string());
      }
    }
    if (ec) throw DataError(str("shards ", spec, ": cannot list the folder: ", ec.message()));
    std::sort(out.begin(), out.end());
    if (out.empty()) throw DataError(str("shards ", spec, ": the folder holds no .tar file"));
    return out;
  }
  return {spec};
}

namespace {

net::RetryPolicy retry_of(const WebDatasetOptions& o) {
  net::RetryPolicy p;
  p.max_attempts = std::max(1, o.download_retry);
  p.stall_timeout =
      std::chrono::seconds(std::max<std::int64_t>(1, std::llround(o.download_timeout)));
  return p;
}

// A reader of one shard: pread on a local file; ranged GETs pinned to the ETag construction
// found for a remote one.
vision::detail::TarReader reader_of(const std::string& shard,
                                    const std::pair<std::uint64_t, std::string>* remote,
                                    const net::RetryPolicy& retry) {
  if (remote == nullptr) return vision::detail::TarReader(shard);
  return vision::detail::TarReader(
      net::open_ranged(shard, net::ObjectInfo{remote->first, remote->second}, retry));
}

// The samples of one shard, from its index when asked and present, else from its headers.
// `remote` is the object's size and ETag for a remote shard, nullptr for a local one.
std::vector<Sample> read_shard(const std::string& shard,
                               std::uint32_t ordinal,
                               bool use_index,
                               const std::pair<std::uint64_t, std::string>* remote,
                               const net::RetryPolicy& retry,
                               const WebDatasetOptions& options) {
  std::uint64_t size = 0;
  std::optional<std::string> index_text;
  const std::string index_path = (remote ? net::redact(shard) : shard) + ".idx";
  if (remote != nullptr) {
    size = remote->first;
    if (use_index) {
      try {
        index_text = net::http_get(net::request_for(shard + ".idx", retry), true, 1u << 30);
      } catch (const net::HttpError& e) {
        // S3 answers 403, not 404, for a missing key to a role that may not list the bucket.
        if (e.status() != 403) throw;
      }
    }
  } else {
    std::error_code ec;
    size = fs::file_size(shard, ec);
    if (ec) throw DataError(str("shard ", shard, ": ", ec.message()));
    if (use_index && fs::exists(shard + ".idx", ec)) {
      std::ifstream file(shard + ".idx", std::ios::binary);
      std::stringstream text;
      text << file.rdbuf();
      index_text = text.str();
    }
  }
  std::vector<Sample> samples;
  if (index_text) {
    std::istringstream in(*index_text);
    std::string version;
    std::size_t count = 0;
    in >> version >> count;
    if (!in || version != "v1.2") {
      throw DataError(str(index_path, ": not a v1.2 WebDataset index (first line 'v1.2 N'); ",
                          "delete it to list the shard instead"));
    }
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      std::istringstream fields(line);
      Sample sample{ordinal, {}, {}};
      std::string ext;
      std::uint64_t offset = 0;
      std::uint64_t length = 0;
      std::string name;
      while (fields >> ext) {
        if (!(fields >> offset >> length >> name)) {
          throw DataError(str(index_path, ": malformed line '", line.substr(0, 200),
                              "' (each member is 'ext offset size name'); delete the index to ",
                              "list the shard instead"));
        }
        if (offset > size || length > size - offset) {
          throw DataError(str(index_path, ": member ", name, " (", length, " bytes at ", offset,
                              ") lies past the end of ", remote ? net::redact(shard) : shard, " (",
                              size,
                              " bytes): the index is stale or the shard truncated; delete the ",
                              "index to list the shard instead"));
        }
        if (sample.key.empty()) {
          const auto split = vision::detail::split_key(name);
          sample.key = split ? split->first : name;
        }
        sample.fields.push_back({ext, offset, length});
      }
      if (sample.fields.empty()) throw DataError(str(index_path, ": malformed line '", line, "'"));
      samples.push_back(std::move(sample));
    }
    if (samples.size() != count) {
      throw DataError(str(index_path, ": its header says ", count, " samples but it lists ",
                          samples.size(), "; delete it to list the shard instead"));
    }
    // An index made for another version of the shard: the first and last members' headers
    // must be where it says, with its sizes.
    if (!samples.empty()) {
      for (const Sample* s : {&samples.front(), &samples.back()}) {
        const WebDataset::Field& f = s == &samples.front() ? s->fields.front() : s->fields.back();
        vision::detail::TarReader probe = reader_of(shard, remote, retry);
        std::optional<vision::detail::TarMember> member;
        if (f.offset >= 512 && (f.offset - 512) % 512 == 0) {
          try {
            probe.seek(f.offset - 512);
            member = probe.next();
          } catch (const DataError&) {
            member.reset();
          }
        }
        if (!member || member->data_offset != f.offset || member->size != f.size) {
          throw DataError(str(index_path, ": stale: its member at offset ", f.offset, " (", f.size,
                              " bytes) is not a member of ", remote ? net::redact(shard) : shard,
                              " there; delete the index to list the shard instead, or write it "
                              "again"));
        }
      }
    }
    return samples;
  }
  // No index: the headers, read front to back: a remote shard is read once, into the cache
  // when there is one (the epoch reads it from there), else its bytes are dropped.
  std::string source = shard;
  if (remote != nullptr && !options.cache_dir.empty()) {
    source = net::ShardCache(options.cache_dir, options.cache_limit)
                 .ensure(shard, net::ObjectInfo{remote->first, remote->second}, retry);
  }
  vision::detail::TarReader reader(net::open_sequential(source, 0, retry));
  while (auto member = reader.next()) {
    auto split = vision::detail::split_key(member->name);
    if (!split) continue;  // no key: WebDataset passes such members over too
    if (samples.empty() || samples.back().key != split->first) {
      samples.push_back(Sample{ordinal, std::move(split->first), {}});
    }
    samples.back().fields.push_back({std::move(split->second), member->data_offset, member->size});
  }
  return samples;
}

torch::Tensor read_member(const vision::detail::TarReader& reader,
                          std::uint64_t offset,
                          std::uint64_t size) {
  torch::Tensor bytes = torch::empty({static_cast<std::int64_t>(size)}, torch::kUInt8);
  reader.read(offset, size, bytes.data_ptr<std::uint8_t>());
  return bytes;
}

std::int64_t parse_label(const torch::Tensor& bytes, const std::string& where) {
  if (bytes.numel() > 64) {
    throw DataError(str(where, ": the label member is ", bytes.numel(),
                        " bytes; a label is an integer in decimal"));
  }
  const auto* p = reinterpret_cast<const char*>(bytes.data_ptr<std::uint8_t>());
  std::string_view text(p, static_cast<std::size_t>(bytes.numel()));
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) {
    text.remove_prefix(1);
  }
  std::int64_t label = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), label);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    throw DataError(str(where, ": the label '", text.substr(0, 40), "' is not an integer"));
  }
  return label;
}

// A sample's fields to an Example: the image decoded and transformed as image datasets do.
Example make_example(const WebDatasetOptions& options,
                     const std::shared_ptr<const Compose>& pipeline,
                     torch::Tensor image,
                     std::optional<torch::Tensor> label,
                     const std::string& key,
                     std::int64_t index,
                     const std::string& where,
                     SampleContext& ctx) {
  try {
    Example example{{"image", image}};
    if (!options.label_extension.empty()) {
      if (!label) {
        throw DataError(str("no .", options.label_extension, " member (set label: '' for ",
                            "shards without labels)"));
      }
      example.set("label", parse_label(*label, where));
    }
    example.set("key", key);
    example.set("index", index);
    vision::detail::ImageState state =
        vision::detail::ImageState::encoded(std::move(image), options.mode, options.max_pixels);
    if (pipeline) return pipeline->run(std::move(example), state, ctx);
    if (options.decode) example.set("image", state.to_field());
    return example;
  } catch (const DataError& e) {
    throw DataError(str(where, ": ", e.what()));
  } catch (const cv::Exception& e) {
    throw DataError(str(where, ": OpenCV: ", e.what()));
  }
}

const WebDataset::Field* find_image(const Sample& sample, const WebDatasetOptions& options) {
  for (const std::string& ext : options.image_extensions) {
    for (const auto& field : sample.fields) {
      if (field.extension == ext) return &field;
    }
  }
  return nullptr;
}

const WebDataset::Field* find_label(const Sample& sample, const WebDatasetOptions& options) {
  const WebDataset::Field* label = nullptr;
  for (const auto& field : sample.fields) {
    if (field.extension == options.label_extension) label = &field;
  }
  return label;
}

// A label is decimal text: more than 64 bytes of one is an error, found reading 65.
std::uint64_t label_bytes(const WebDataset::Field* label) {
  return label ? std::min<std::uint64_t>(label->size, 65) : 0;
}

// What one ranged GET of a remote sample covers: its image, and its label with it when the two
// lie close (a WebDataset sample's members are adjacent), so that a sample costs one request.
struct ByteSpan {
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  bool contains(std::uint64_t at, std::uint64_t n) const {
    return at >= offset && at + n <= offset + size;
  }
};

ByteSpan span_of(const WebDataset::Field& image, const WebDataset::Field* label) {
  if (label != nullptr) {
    const std::uint64_t n = label_bytes(label);
    const std::uint64_t lo = std::min(image.offset, label->offset);
    const std::uint64_t hi = std::max(image.offset + image.size, label->offset + n);
    if (hi - lo <= image.size + n + 65536) return {lo, hi - lo};
  }
  return {image.offset, image.size};
}

// Bytes read ahead, as a tensor that owns them.
torch::Tensor tensor_of(std::vector<std::uint8_t> bytes) {
  auto* owned = new std::vector<std::uint8_t>(std::move(bytes));
  return torch::from_blob(
      owned->data(), {static_cast<std::int64_t>(owned->size())}, [owned](void*) { delete owned; },
      torch::kUInt8);
}

std::string image_choices(const WebDatasetOptions& options) {
  std::string s;
  for (const auto& e : options.image_extensions) s += (s.empty() ? "" : ", ") + e;
  return s;
}

}  // namespace

// ---- WebDataset ----

WebDataset::WebDataset(std::vector<std::string> shards, WebDatasetOptions options)
    : shards_(std::move(shards)), options_(std::move(options)) {
  FERRY_CHECK(!shards_.empty(), "WebDataset: no shard given");
  FERRY_CHECK(shards_.size() < (std::size_t{1} << 32), "WebDataset: too many shards");
  for (std::size_t s = 0; s < shards_.size(); ++s) {
    if (net::is_remote(shards_[s])) {
      const net::Location loc = net::parse_location(shards_[s]);
      if (loc.scheme == net::Scheme::kPipe) {
        throw DataError(str("webdataset: shard '", net::redact(shards_[s]),
                            "': a pipe is read front to back; ",
                            "use webdataset_stream, or an s3:// or https:// URL"));
      }
      if (remote_.empty()) remote_.resize(shards_.size());
      const net::ObjectInfo info = net::http_head(net::request_for(shards_[s], retry_of(options_)));
      remote_[s] = {info.size, info.etag};
    }
    auto samples = read_shard(shards_[s], static_cast<std::uint32_t>(s), options_.use_index,
                              net::is_remote(shards_[s]) ? &remote_[s] : nullptr,
                              retry_of(options_), options_);
    samples_.insert(samples_.end(), std::make_move_iterator(samples.begin()),
                    std::make_move_iterator(samples.end()));
  }
  if (!options_.transforms.empty()) {
    pipeline_ = std::make_shared<const Compose>(options_.transforms);
  }
}

torch::Tensor WebDataset::read_field(std::size_t index, const std::string& extension) const {
  FERRY_CHECK(index < samples_.size(), "WebDataset: index ", index, " is out of range (",
              samples_.size(), " samples)");
  const Sample& sample = samples_[index];
  for (const auto& field : sample.fields) {
    if (field.extension == extension) {
      return read_member(
          reader_of(shards_[sample.shard],
                    net::is_remote(shards_[sample.shard]) ? &remote_[sample.shard] : nullptr,
                    retry_of(options_)),
          field.offset, field.size);
    }
  }
  throw DataError(str("WebDataset sample ", index, " (", net::redact(shards_[sample.shard]),
                      " key ", sample.key, "): no .", extension, " member"));
}

Example WebDataset::get(std::size_t index, SampleContext& ctx) const {
  FERRY_CHECK(index < samples_.size(), "WebDataset: index ", index, " is out of range (",
              samples_.size(), " samples)");
  const Sample& sample = samples_[index];
  const std::string where = str("WebDataset sample ", index, " (",
                                net::redact(shards_[sample.shard]), " key ", sample.key, ")");
  const Field* image = find_image(sample, options_);
  if (image == nullptr) {
    throw DataError(str(where, ": no image member (tried ", image_choices(options_), ")"));
  }
  const std::string& shard = shards_[sample.shard];
  const bool remote = net::is_remote(shard);
  const Field* label_field = find_label(sample, options_);
  const std::uint64_t label_size = label_bytes(label_field);
  if (remote && options_.cache_dir.empty()) {
    // By byte ranges: read ahead when prefetch() asked for it, else now.
    const ByteSpan span = span_of(*image, label_field);
    torch::Tensor bytes;
    if (net::Prefetcher* ahead = read_ahead_.slot->find()) {
      if (auto held = ahead->take(index); held && held->size() == span.size) {
        bytes = tensor_of(std::move(*held));
      }
    }
    std::optional<vision::detail::TarReader> reader;
    const auto read = [&](std::uint64_t offset, std::uint64_t size) {
      if (!reader) reader.emplace(reader_of(shard, &remote_[sample.shard], retry_of(options_)));
      return read_member(*reader, offset, size);
    };
    if (!bytes.defined()) bytes = read(span.offset, span.size);
    const auto at = [&](std::uint64_t offset, std::uint64_t size) {
      return bytes
          .narrow(0, static_cast<std::int64_t>(offset - span.offset),
                  static_cast<std::int64_t>(size))
          .clone();
    };
    std::optional<torch::Tensor> label;
    if (label_field != nullptr) {
      label = span.contains(label_field->offset, label_size)
                  ? at(label_field->offset, label_size)
                  : read(label_field->offset, label_size);
    }
    torch::Tensor image_bytes = span.offset == image->offset && span.size == image->size
                                    ? bytes
                                    : at(image->offset, image->size);
    return make_example(options_, pipeline_, std::move(image_bytes), std::move(label), sample.key,
                        static_cast<std::int64_t>(index), where, ctx);
  }
  // A local file, or a remote shard's complete copy in the node-local cache.
  const vision::detail::TarReader reader =
      remote ? vision::detail::TarReader(net::ShardCache(options_.cache_dir, options_.cache_limit)
                                             .open(shard,
                                                   net::ObjectInfo{remote_[sample.shard].first,
                                                                   remote_[sample.shard].second},
                                                   retry_of(options_)))
             : vision::detail::TarReader(shard);
  std::optional<torch::Tensor> label;
  if (label_field != nullptr) label = read_member(reader, label_field->offset, label_size);
  return make_example(options_, pipeline_, read_member(reader, image->offset, image->size), label,
                      sample.key, static_cast<std::int64_t>(index), where, ctx);
}

bool WebDataset::prefetch(std::span<const std::size_t> indices) const {
  if (remote_.empty() || options_.prefetch == 0) return false;
  net::Prefetcher::Limits limits;
  limits.max_warm = options_.prefetch;
  net::Prefetcher& ahead = read_ahead_.slot->get(limits);
  ahead.new_round();
  const net::RetryPolicy retry = retry_of(options_);
  std::optional<net::ShardCache> cache;
  if (!options_.cache_dir.empty()) cache.emplace(options_.cache_dir, options_.cache_limit);
  for (const std::size_t index : indices) {
    if (index >= samples_.size()) continue;  // get() says what is wrong with it
    const Sample& sample = samples_[index];
    const std::string& shard = shards_[sample.shard];
    if (!net::is_remote(shard)) continue;
    const net::ObjectInfo info{remote_[sample.shard].first, remote_[sample.shard].second};
    if (cache) {  // the shard into the cache, unless this process knows it there
      if (cache->known_complete(shard, info)) continue;
      (void)ahead.warm(sample.shard, [dir = options_.cache_dir, limit = options_.cache_limit, shard,
                                      info, retry](const std::atomic<bool>& cancel) {
        (void)net::ShardCache(dir, limit).ensure(shard, info, retry, &cancel, false);
      });
      continue;
    }
    const Field* image = find_image(sample, options_);
    if (image == nullptr) continue;  // get() says so
    const ByteSpan span = span_of(*image, find_label(sample, options_));
    (void)ahead.fetch(index, span.size,
                      [request = net::request_for(shard, retry), etag = info.etag,
                       span](const std::atomic<bool>& cancel) {
                        net::Request r = request;
                        r.cancel = &cancel;
                        std::vector<std::uint8_t> bytes(span.size);
                        net::http_read_range(r, etag, span.offset, span.size, bytes.data());
                        return bytes;
                      });
  }
  return true;
}

WebDataset::ReadAhead::ReadAhead() : slot(std::make_unique<net::PrefetcherSlot>()) {}
WebDataset::ReadAhead::ReadAhead(const ReadAhead&) : ReadAhead() {}
WebDataset::ReadAhead& WebDataset::ReadAhead::operator=(const ReadAhead&) {
  slot = std::make_unique<net::PrefetcherSlot>();  // what was read ahead was for other samples
  return *this;
}
WebDataset::ReadAhead::~ReadAhead() = default;

std::shared_ptr<Dataset> WebDataset::with_transforms(const TransformList& transforms) const {
  auto copy = std::make_shared<WebDataset>(*this);
  copy->clear_spec();
  copy->options_.transforms.insert(copy->options_.transforms.end(), transforms.begin(),
                                   transforms.end());
  copy->pipeline_ = std::make_shared<const Compose>(copy->options_.transforms);
  return copy;
}

// ---- WebDatasetStream ----

namespace {

class ShardStream : public ExampleStream {
 public:
  ShardStream(std::vector<std::string> shards,
              WebDatasetStream::Options options,
              std::shared_ptr<const Compose> pipeline)
      : shards_(std::move(shards)), options_(std::move(options)), pipeline_(std::move(pipeline)) {}
  ~ShardStream() override { cancel_->store(true); }  // then prefetches_ waits for their ends

  std::optional<Example> next(SampleContext& ctx) override {
    while (shard_ < shards_.size()) {
      if (!reader_) {
        // One GET from the entry offset for a remote shard, or its copy in the node-local cache
        // (the next shards downloaded ahead); pread for a local one.
        std::string source = shards_[shard_];
        if (net::is_remote(source) && !options_.cache_dir.empty() &&
            net::parse_location(source).scheme != net::Scheme::kPipe) {
          prefetch_after(shard_);
          reader_.emplace(net::ShardCache(options_.cache_dir, options_.cache_limit)
                              .open(source, std::nullopt, retry_of(options_)));
        } else if (ahead_ && ahead_shard_ == shard_ && start_offset_ == 0) {
          reader_.emplace(std::move(ahead_));  // its first bytes came while the last shard was read
        } else {
          reader_.emplace(net::open_sequential(source, start_offset_, retry_of(options_)));
        }
        ahead_.reset();
        read_ahead_after(shard_);
        reader_->seek(start_offset_);
        start_offset_ = 0;
        pending_.reset();
      }
      // The members of one key, in order; the first member of the next key waits in pending_.
      // A member's bytes are read as soon as its header is (a remote shard is one stream, read
      // front to back), and only for the members a sample uses.
      std::optional<Member> first = pending_ ? std::move(pending_) : next_keyed();
      pending_.reset();
      if (!first) {
        reader_.reset();
        ++shard_;
        continue;
      }
      const std::string key = first->key;
      std::vector<Member> members;
      members.push_back(std::move(*first));
      while (auto m = next_keyed()) {
        if (m->key != key) {
          pending_ = std::move(m);
          break;
        }
        members.push_back(std::move(*m));
      }
      next_offset_ = pending_ ? pending_->header_offset : reader_->offset();
      const std::string where =
          str("WebDataset stream ", net::redact(shards_[shard_]), " key ", key);
      const Member* image = nullptr;
      for (const std::string& ext : options_.image_extensions) {
        for (const Member& m : members) {
          if (image == nullptr && m.extension == ext) image = &m;
        }
      }
      if (image == nullptr) {
        throw DataError(str(where, ": no image member (tried ", image_choices(options_), ")"));
      }
      std::optional<torch::Tensor> label;
      for (const Member& m : members) {
        if (m.extension == options_.label_extension) label = m.bytes;
      }
      return make_example(options_, pipeline_, *image->bytes, label, key, ctx.index(), where, ctx);
    }
    return std::nullopt;
  }

  // "<shard position in this worker's list>:<offset of the next sample's first header>".
  std::optional<std::string> cursor() const override {
    if (shard_ >= shards_.size()) return str(shard_, ":0");
    return str(shard_, ":", reader_ ? next_offset_ : start_offset_);
  }

  void seek(const std::string& cursor) override {
    std::size_t shard = 0;
    std::uint64_t offset = 0;
    const std::size_t colon = cursor.find(':');
    const char* begin = cursor.data();
    const char* end = begin + cursor.size();
    bool ok = colon != std::string::npos && colon > 0;
    if (ok) {
      const auto a = std::from_chars(begin, begin + colon, shard);
      const auto b = std::from_chars(begin + colon + 1, end, offset);
      ok = a.ec == std::errc() && a.ptr == begin + colon && b.ec == std::errc() && b.ptr == end &&
           colon + 1 < cursor.size() && shard <= shards_.size();
    }
    if (!ok) {
      throw Error(str("WebDataset stream: cursor '", cursor, "' is not one of this worker's (",
                      shards_.size(), " shards); was the checkpoint made with other shards?"));
    }
    shard_ = shard;
    start_offset_ = offset;
    reader_.reset();
    pending_.reset();
    ahead_.reset();
  }

 private:
  // Downloads the `prefetch` shards after `shard` into the cache on threads of their own (each
  // makes its own curl handles), so the reader finds them there. A failed prefetch is left to
  // the reader's own ensure(), which retries and reports.
  void prefetch_after(std::size_t shard) {
    for (std::size_t k = shard + 1; k <= shard + options_.prefetch && k < shards_.size(); ++k) {
      if (k < prefetched_) continue;
      prefetched_ = k + 1;
      if (net::parse_location(shards_[k]).scheme == net::Scheme::kPipe) continue;
      prefetches_.push_back(
          std::async(std::launch::async,
                     [location = shards_[k], dir = options_.cache_dir, limit = options_.cache_limit,
                      retry = retry_of(options_), cancel = cancel_] {
                       try {
                         net::ShardCache(dir, limit)
                             .ensure(location, std::nullopt, retry, cancel.get(),
                                     /*count=*/false);
                       } catch (const std::exception&) {
                       }
                     }));
    }
    // Finished ones go (their threads have ended).
    prefetches_.erase(std::remove_if(prefetches_.begin(), prefetches_.end(),
                                     [](std::future<void>& f) {
                                       return f.wait_for(std::chrono::seconds(0)) ==
                                              std::future_status::ready;
                                     }),
                      prefetches_.end());
  }

  // Without a cache, the next remote shard is opened while this one is read, by a thread that
  // keeps up to kReadAhead of its bytes: the first byte's round trip and the first megabytes come
  // while the worker decodes.
  static constexpr std::size_t kReadAhead = 16u << 20;
  void read_ahead_after(std::size_t shard) {
    const std::size_t next = shard + 1;
    if (options_.prefetch == 0 || !options_.cache_dir.empty() || next >= shards_.size() ||
        !net::is_remote(shards_[next]) ||
        net::parse_location(shards_[next]).scheme == net::Scheme::kPipe) {
      return;
    }
    ahead_ = net::open_read_ahead(shards_[next], kReadAhead, retry_of(options_));
    ahead_shard_ = next;
  }

  struct Member {
    std::string key;
    std::string extension;
    std::uint64_t header_offset = 0;
    std::optional<torch::Tensor> bytes;  // read when a sample may use it
  };

  std::optional<Member> next_keyed() {
    while (auto m = reader_->next()) {
      auto split = vision::detail::split_key(m->name);
      if (!split) continue;
      Member member{std::move(split->first), std::move(split->second), m->header_offset, {}};
      const auto& images = options_.image_extensions;
      if (member.extension == options_.label_extension) {
        member.bytes = read_member(*reader_, m->data_offset, std::min<std::uint64_t>(m->size, 65));
      } else if (std::find(images.begin(), images.end(), member.extension) != images.end()) {
        member.bytes = read_member(*reader_, m->data_offset, m->size);
      }
      return member;
    }
    return std::nullopt;
  }

  std::vector<std::string> shards_;
  WebDatasetStream::Options options_;
  std::shared_ptr<const Compose> pipeline_;
  std::size_t shard_ = 0;
  std::uint64_t start_offset_ = 0;  // where the current shard is entered
  std::uint64_t next_offset_ = 0;   // the header of the sample after the last one returned
  std::optional<vision::detail::TarReader> reader_;
  std::optional<Member> pending_;
  std::size_t prefetched_ = 0;              // shards before this one have a prefetch started
  std::unique_ptr<net::ByteSource> ahead_;  // the next shard, read ahead (no cache)
  std::size_t ahead_shard_ = 0;
  // Set when the stream goes: a prefetch still downloading stops at its next chunk.
  std::shared_ptr<std::atomic<bool>> cancel_ = std::make_shared<std::atomic<bool>>(false);
  // Declared last: destroyed first, so a prefetch running at destruction is waited for while
  // everything it may read is still here.
  std::vector<std::future<void>> prefetches_;
};

}  // namespace

WebDatasetStream::WebDatasetStream(std::vector<std::string> shards, Options options)
    : options_(std::move(options)) {
  FERRY_CHECK(!shards.empty(), "WebDatasetStream: no shard given");
  if (!options_.rank || !options_.world_size) {
    const std::optional<LaunchInfo> launch = launch_info();
    if (!options_.rank) options_.rank = launch ? launch->rank : 0;
    if (!options_.world_size) options_.world_size = launch ? launch->world_size : 1;
  }
  FERRY_CHECK(*options_.world_size >= 1 && *options_.rank < *options_.world_size,
              "WebDatasetStream: rank ", *options_.rank, " is outside world size ",
              *options_.world_size);
  for (std::size_t i = *options_.rank; i < shards.size(); i += *options_.world_size) {
    mine_.push_back(shards[i]);
  }
  if (mine_.empty()) {
    TORCH_WARN("WebDatasetStream: rank ", *options_.rank, " of ", *options_.world_size,
               " gets no shard (there are ", shards.size(), "); its epochs are empty");
  }
  if (!options_.transforms.empty()) {
    pipeline_ = std::make_shared<const Compose>(options_.transforms);
  }
  std::size_t total = 0;
  std::error_code ec;
  for (const std::string& shard : mine_) {
    std::ifstream in(shard + ".idx");
    std::string version;
    std::size_t count = 0;
    if (!options_.use_index || !(in >> version >> count) || version != "v1.2") return;
    if (count > std::numeric_limits<std::size_t>::max() - total) return;
    total += count;
  }
  size_hint_ = total;
}

std::unique_ptr<ExampleStream> WebDatasetStream::stream(SampleContext& ctx) const {
  std::vector<std::string> shards;
  for (std::size_t i = ctx.worker_id(); i < mine_.size();
       i += std::max<std::size_t>(1, ctx.num_workers())) {
    shards.push_back(mine_[i]);
  }
  return std::make_unique<ShardStream>(std::move(shards), options_, pipeline_);
}

}  // namespace ferry::vision
