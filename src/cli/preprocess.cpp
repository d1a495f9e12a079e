// `ferry preprocess`: see preprocess.h. The worker side (EncodeDataset) reads, transforms,
// encodes and measures one image; the main process writes the parts in order, one at a time,
// and records each when its files are in place. The job's file and plan: preprocess_job.cpp.

#include "cli/preprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <thread>
#include <tuple>

#include <opencv2/core.hpp>

#include "ferry/error.h"
#include "ferry/ferry.h"
#include "ferry/launch.h"
#include "ferry/pipeline.h"
#include "ferry/vision.h"

#include "cli/preprocess_job.h"
#include "cli/run.h"
#include "datasets/tar.h"
#include "ipc/files.h"
#include "ipc/unique_fd.h"
#include "net/byte_source.h"
#include "net/http.h"
#include "transforms/image_state.h"

namespace ferry::cli {

using namespace prep;  // NOLINT: the job and its plan, private to this command

namespace {

namespace fs = std::filesystem;
using ferry::detail::str;
using nlohmann::json;

// ---- the worker side: one image read, transformed, encoded and measured ----

// Never throws for a bad input: the error travels back as the sample's `error`, so every input
// yields one row and the main process decides (skip and list, or stop).
class EncodeDataset : public Dataset {
 public:
  explicit EncodeDataset(const Job& job)
      : names_(&job.names),
        input_(job.input),
        mode_(job.mode),
        max_pixels_(job.max_pixels),
        format_(job.image_format),
        quality_(job.quality),
        pipeline_(job.transforms.empty()
                      ? nullptr
                      : std::make_shared<const vision::Compose>(job.transforms)) {}

  std::size_t size() const override { return input_->size(); }
  bool prefetch(std::span<const std::size_t> indices) const override {
    return input_->prefetch(indices);
  }

  Example get(std::size_t index, SampleContext& ctx) const override {
    torch::Tensor meta = torch::zeros({kMetaSize}, torch::kInt64);
    auto* m = meta.data_ptr<std::int64_t>();
    torch::Tensor data = torch::empty({0}, torch::kUInt8);
    std::string error;
    FERRY_CHECK(index < names_->size(), "preprocess: input ", index, " is out of range");
    input_fault((*names_)[index]);
    try {
      Example in = input_->get(index, ctx);
      const torch::Tensor bytes = in["image"].tensor();
      m[kLabel] = in.contains("label") ? in["label"].to_int() : -1;
      m[kBytesIn] = bytes.numel();
      const vision::ImageInfo info = vision::probe_image(vision::bytes_of(bytes));
      m[kWidthIn] = info.width;
      m[kHeightIn] = info.height;
      torch::Tensor image;
      if (pipeline_) {
        vision::detail::ImageState state =
            vision::detail::ImageState::encoded(bytes, mode_, max_pixels_);
        Example out = pipeline_->run(Example{{"image", bytes}}, state, ctx);
        image = out["image"].tensor();
      } else {
        image = vision::decode_image(vision::bytes_of(bytes), mode_, max_pixels_);
      }
      if (image.dim() == 2) image = image.unsqueeze(2);
      image = image.contiguous();
      m[kHeightOut] = image.size(0);
      m[kWidthOut] = image.size(1);
      const std::int64_t channels = image.size(2);
      m[kChannels] = channels;
      // Exact integer sums per channel: the statistics do not depend on the order they add in.
      const std::uint8_t* p = image.data_ptr<std::uint8_t>();
      const std::int64_t pixels = image.size(0) * image.size(1);
      for (std::int64_t c = 0; c < channels && c < 3; ++c) {
        std::int64_t sum = 0;
        std::int64_t squares = 0;
        for (std::int64_t i = 0; i < pixels; ++i) {
          const std::int64_t v = p[i * channels + c];
          sum += v;
          squares += v * v;
        }
        m[kSum0 + c] = sum;
        m[kSquares0 + c] = squares;
      }
      std::vector<std::uint8_t> encoded = vision::encode_image(image, format_, quality_);
      data = torch::empty({static_cast<std::int64_t>(encoded.size())}, torch::kUInt8);
      std::memcpy(data.data_ptr<std::uint8_t>(), encoded.data(), encoded.size());
    } catch (const DataError& e) {
      // A bad input. Anything else (out of memory, a bug) is not the input's fault: it stops
      // the job as a worker error, and a run again retries it.
      error = e.what();
    } catch (const cv::Exception& e) {
      error = str("OpenCV: ", e.what());
    }
    if (error.empty() && data.numel() == 0) error = "the encoder wrote no bytes";
    if (!error.empty()) {
      // What a bad header claimed (a width of 4 billion) is not sent on: a skipped input
      // carries its error alone.
      meta.zero_();
      data = torch::empty({0}, torch::kUInt8);
    }
    return Example{{"data", data}, {"meta", meta}, {"error", error}};
  }

 private:
  const std::vector<std::string>* names_;  // the job's, which outlives every loader
  std::shared_ptr<Dataset> input_;
  vision::ImageMode mode_;
  std::int64_t max_pixels_;
  vision::ImageFormat format_;
  int quality_;
  std::shared_ptr<const vision::Compose> pipeline_;
};

// Variable-length files in one batch: their bytes end to end, with the lengths.
Batch collate_encoded(std::vector<Example> samples) {
  std::vector<torch::Tensor> data;
  std::vector<torch::Tensor> meta;
  std::vector<std::string> errors;
  torch::Tensor lengths = torch::empty({static_cast<std::int64_t>(samples.size())}, torch::kInt64);
  for (std::size_t i = 0; i < samples.size(); ++i) {
    data.push_back(samples[i]["data"].tensor());
    meta.push_back(samples[i]["meta"].tensor());
    errors.push_back(samples[i]["error"].str());
    lengths[static_cast<std::int64_t>(i)] = samples[i]["data"].tensor().numel();
  }
  Batch batch(samples.size());
  batch.set("data", torch::cat(data));
  batch.set("lengths", lengths);
  batch.set("meta", torch::stack(meta));
  batch.set("error", std::move(errors));
  return batch;
}

// An order of positions given as a list (the parts of this rank that are left).
class ListSampler : public Sampler {
 public:
  explicit ListSampler(std::vector<std::int64_t> indices) : indices_(std::move(indices)) {}
  std::size_t size() const override { return indices_.size(); }
  std::vector<std::int64_t> indices(std::uint64_t) override { return indices_; }

 private:
  std::vector<std::int64_t> indices_;
};

std::string size_bin(std::int64_t shorter) {
  if (shorter < 64) return "0-63";
  std::int64_t low = 64;
  while (low * 2 <= shorter && low < 4096) low *= 2;
  if (low >= 4096) return "4096+";
  return str(low, "-", low * 2 - 1);
}

// An exclusive lock on a file of the job's folder (flock: a killed holder releases it). The file
// is removed when the lock is let go, so a finished job leaves none behind.
class FolderLock {
 public:
  // nullopt when another process holds it.
  static std::optional<FolderLock> try_take(const fs::path& path) {
    ipc::UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!fd) {
      throw Error(str(path.string(), ": cannot create a lock file: ", std::strerror(errno),
                      "; check that the output folder is writable"));
    }
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) return std::nullopt;
      throw Error(str(path.string(), ": flock failed: ", std::strerror(errno),
                      " (a file system without locks? write the output to a local disk)"));
    }
    // Its holder may have let it go (and removed the file) between our open and flock: then a
    // lock on that removed file means nothing; count it as held, so the caller tries again.
    struct stat locked {};
    struct stat named {};
    if (::fstat(fd.get(), &locked) != 0 || ::stat(path.c_str(), &named) != 0 ||
        locked.st_ino != named.st_ino || locked.st_dev != named.st_dev) {
      return std::nullopt;
    }
    return FolderLock(path, std::move(fd));
  }
  FolderLock(FolderLock&&) noexcept = default;
  FolderLock& operator=(FolderLock&&) noexcept = default;
  ~FolderLock() {
    if (fd_) ::unlink(path_.c_str());  // while still held: nobody else holds this inode
  }

 private:
  FolderLock(fs::path path, ipc::UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}
  fs::path path_;
  ipc::UniqueFd fd_;
};

std::string lock_file(std::size_t part) {
  char name[32];
  std::snprintf(name, sizeof name, "part-%06zu.lock", part);
  return name;
}

// The lock of one part, held while it is written.
FolderLock take_part(const Job& job, std::size_t part) {
  std::optional<FolderLock> lock = FolderLock::try_take(job.out / kStateDir / lock_file(part));
  if (!lock) {
    throw Error(str(job.out.string(), ": part ", part, " is being written by another process ",
                    "right now (a rank started twice, or ranks started with different ",
                    "--world-size); let it finish or stop it, then run again"));
  }
  return std::move(*lock);
}

// ---- a part: its files, written under temporary names, then renamed; then its record ----

// Pixel sums of a whole dataset can pass 2^64 (squares of a billion large images).
__extension__ typedef unsigned __int128 Wide;

struct Totals {
  std::uint64_t images = 0;
  std::uint64_t bytes_in = 0;
  std::uint64_t bytes_out = 0;
  std::uint64_t pixels = 0;
  std::int64_t channels = 0;
  std::array<Wide, 3> sum{};
  std::array<Wide, 3> squares{};
  std::map<std::int64_t, std::uint64_t> classes;
  std::map<std::string, std::uint64_t> sizes_in;
  std::map<std::string, std::uint64_t> sizes_out;
  json skipped = json::array();
};

std::string u128(Wide v) {
  if (v == 0) return "0";
  std::string s;
  while (v > 0) {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  }
  return s;
}

Wide parse_u128(const std::string& s) {
  Wide v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') throw Error(str("not a number: '", s, "'"));
    v = v * 10 + static_cast<unsigned>(c - '0');
  }
  return v;
}

json totals_json(const Totals& t) {
  json sums = json::array();
  json squares = json::array();
  for (int c = 0; c < 3; ++c) {
    sums.push_back(u128(t.sum[c]));
    squares.push_back(u128(t.squares[c]));
  }
  json classes = json::object();
  for (const auto& [label, count] : t.classes) classes[std::to_string(label)] = count;
  return {{"images", t.images},       {"bytes_in", t.bytes_in}, {"bytes_out", t.bytes_out},
          {"pixels", t.pixels},       {"channels", t.channels}, {"sum", sums},
          {"squares", squares},       {"classes", classes},     {"sizes_in", t.sizes_in},
          {"sizes_out", t.sizes_out}, {"skipped", t.skipped}};
}

void add_totals(Totals& into, const json& j) {
  into.images += j.at("images").get<std::uint64_t>();
  into.bytes_in += j.at("bytes_in").get<std::uint64_t>();
  into.bytes_out += j.at("bytes_out").get<std::uint64_t>();
  into.pixels += j.at("pixels").get<std::uint64_t>();
  into.channels = std::max(into.channels, j.at("channels").get<std::int64_t>());
  for (int c = 0; c < 3; ++c) {
    into.sum[c] += parse_u128(j.at("sum").at(c).get<std::string>());
    into.squares[c] += parse_u128(j.at("squares").at(c).get<std::string>());
  }
  for (const auto& [label, count] : j.at("classes").items()) {
    into.classes[std::stoll(label)] += count.get<std::uint64_t>();
  }
  for (const auto& [bin, count] : j.at("sizes_in").items()) {
    into.sizes_in[bin] += count.get<std::uint64_t>();
  }
  for (const auto& [bin, count] : j.at("sizes_out").items()) {
    into.sizes_out[bin] += count.get<std::uint64_t>();
  }
  for (const auto& s : j.at("skipped")) into.skipped.push_back(s);
}

// A file being written: removed when the writer is dropped before it was renamed into place.
class Partial {
 public:
  explicit Partial(fs::path path) : path_(std::move(path)) {}
  Partial(const Partial&) = delete;
  Partial& operator=(const Partial&) = delete;
  ~Partial() {
    if (!path_.empty()) {
      std::error_code ec;
      fs::remove(path_, ec);
    }
  }
  const fs::path& path() const noexcept { return path_; }
  void keep() noexcept { path_.clear(); }  // renamed by the caller
  void commit(const fs::path& to, std::string_view what) {
    ipc::rename_durably(path_, to, what);
    path_.clear();
  }

 private:
  fs::path path_;
};

struct Row {
  std::int64_t index = 0;  // the input's
  std::span<const std::uint8_t> data;
  const std::int64_t* meta = nullptr;
  const std::string* error = nullptr;
};

class PartWriter {
 public:
  // `inputs` (a tree's): the part's inputs, whose temporaries a killed run may have left.
  PartWriter(const Job& job,
             std::size_t part,
             std::size_t first,
             std::span<const std::int64_t> inputs = {})
      : job_(job), part_(part), first_(first), lock_(take_part(job, part)) {
    // Nobody else writes this part now: what its temporaries hold is a killed run's.
    std::error_code ec;
    fs::remove(job_.out / kStateDir / (part_file(part_) + ".partial"), ec);
    fs::remove(job_.out / (shard_name(job_, part_) + ".idx.partial"), ec);
    for (std::int64_t index : inputs) {
      fs::remove(job_.out / (tree_name(job_, index) + ".partial"), ec);
    }
    if (job_.shards) {
      shard_ = std::make_unique<Partial>(job_.out / (shard_name(job_, part_) + ".partial"));
      tar_.emplace(shard_->path());
    }
  }

  // Bytes a sample adds to the shard (headers and padding included).
  std::uint64_t cost(const Row& row) const {
    const auto padded = [](std::uint64_t n) { return 512 + (n + 511) / 512 * 512; };
    return padded(row.data.size()) + padded(32) + padded(sample_json(row).size());
  }
  std::uint64_t size() const { return tar_ ? tar_->size() : 0; }
  std::size_t inputs() const { return inputs_; }
  std::size_t part() const { return part_; }

  void add(const Row& row) {
    ++inputs_;
    const std::string& name = job_.names[static_cast<std::size_t>(row.index)];
    if (!row.error->empty()) {
      if (job_.stop_on_error) {
        throw DataError(str("input ", row.index, " (", name, "): ", *row.error,
                            " (on_error: stop; set on_error: skip to skip such files and list "
                            "them in the statistics)"));
      }
      totals_.skipped.push_back({{"index", row.index}, {"path", name}, {"error", *row.error}});
      return;
    }
    const std::int64_t* m = row.meta;
    ++totals_.images;
    totals_.bytes_in += static_cast<std::uint64_t>(m[kBytesIn]);
    totals_.bytes_out += row.data.size();
    totals_.pixels += static_cast<std::uint64_t>(m[kWidthOut] * m[kHeightOut]);
    totals_.channels = std::max(totals_.channels, m[kChannels]);
    for (int c = 0; c < 3; ++c) {
      totals_.sum[c] += static_cast<std::uint64_t>(m[kSum0 + c]);
      totals_.squares[c] += static_cast<std::uint64_t>(m[kSquares0 + c]);
    }
    ++totals_.classes[m[kLabel]];
    ++totals_.sizes_in[size_bin(std::min(m[kWidthIn], m[kHeightIn]))];
    ++totals_.sizes_out[size_bin(std::min(m[kWidthOut], m[kHeightOut]))];
    if (tar_) {
      const std::string key = key_of(row.index, job_.names.size());
      const std::string label = std::to_string(m[kLabel]);
      const std::string meta = sample_json(row);
      const auto as_bytes = [](const std::string& s) {
        return std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(s.data()),
                                             s.size());
      };
      members_.push_back(tar_->add(key + ".cls", as_bytes(label)));
      members_.push_back(
          tar_->add(key + "." + std::string(vision::extension_of(job_.image_format)), row.data));
      members_.push_back(tar_->add(key + ".json", as_bytes(meta)));
    } else {
      const fs::path final_path = job_.out / tree_name(job_, row.index);
      std::error_code ec;
      fs::create_directories(final_path.parent_path(), ec);
      if (ec) {
        throw Error(
            str(final_path.parent_path().string(), ": cannot create the folder: ", ec.message()));
      }
      Partial file(final_path.string() + ".partial");
      write_bytes(file.path(), row.data);
      kill_point("image-written");
      if (::rename(file.path().c_str(), final_path.c_str()) != 0) {
        throw Error(
            str(final_path.string(), ": renaming into place failed: ", std::strerror(errno)));
      }
      file.keep();
      files_.push_back(tree_name(job_, row.index));
    }
  }

  // Puts the part's files in place, then its record: the part is done when the record exists.
  void finish(const fs::path& state_dir) {
    json files = json::array();
    if (tar_) {
      const std::uint64_t bytes = tar_->finish();
      tar_.reset();
      kill_point("shard-written");
      const fs::path shard = job_.out / shard_name(job_, part_);
      shard_->commit(shard, "shard");
      const std::string index = vision::detail::webdataset_index(members_);
      ipc::write_file_durably(shard.string() + ".idx.partial", index, "shard index");
      kill_point("index-written");
      ipc::rename_durably(shard.string() + ".idx.partial", shard.string() + ".idx", "shard index");
      files.push_back({{"name", shard_name(job_, part_)}, {"bytes", bytes}});
    } else {
      // The images were renamed one by one; one syncfs puts them on disk before the record.
      ipc::UniqueFd dir(::open(job_.out.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (!dir || ::syncfs(dir.get()) != 0) {
        throw Error(str(job_.out.string(), ": flushing part ", part_, "'s images to disk failed: ",
                        std::strerror(errno), "; check the disk, then run again"));
      }
      files = files_;
    }
    const json record = {{"format", "ferry.preprocess.part"},
                         {"fingerprint", job_.fingerprint},
                         {"part", part_},
                         {"first", first_},
                         {"inputs", inputs_},
                         {"files", files},
                         {"totals", totals_json(totals_)}};
    const fs::path path = state_dir / part_file(part_);
    const fs::path temporary = path.string() + ".partial";
    ipc::write_file_durably(temporary, record.dump(1), "part record");
    kill_point("record-written");
    ipc::rename_durably(temporary, path, "part record");
    kill_point("part-done");
  }

  const Totals& totals() const { return totals_; }

 private:
  std::string sample_json(const Row& row) const {
    const std::int64_t* m = row.meta;
    json j = {{"path", job_.names[static_cast<std::size_t>(row.index)]},
              {"label", m[kLabel]},
              {"width", m[kWidthOut]},
              {"height", m[kHeightOut]},
              {"original_width", m[kWidthIn]},
              {"original_height", m[kHeightIn]},
              {"original_bytes", m[kBytesIn]}};
    if (m[kLabel] >= 0 && static_cast<std::size_t>(m[kLabel]) < job_.classes.size()) {
      j["class"] = job_.classes[static_cast<std::size_t>(m[kLabel])];
    }
    return j.dump();
  }

  static void write_bytes(const fs::path& path, std::span<const std::uint8_t> bytes) {
    ipc::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd) throw Error(str(path.string(), ": cannot create: ", std::strerror(errno)));
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        throw Error(str(path.string(), ": write failed: ", std::strerror(errno),
                        "; check that the disk has room"));
      }
      done += static_cast<std::size_t>(n);
    }
  }

  const Job& job_;
  std::size_t part_;
  std::size_t first_;  // its first position in the job's order
  FolderLock lock_;
  std::size_t inputs_ = 0;
  std::unique_ptr<Partial> shard_;
  std::optional<vision::detail::TarWriter> tar_;
  std::vector<vision::detail::TarMember> members_;
  json files_ = json::array();
  Totals totals_;
};

// ---- the job's folder: job.json, the records, locks, leftovers ----

// Writes job.json, or checks that the one there is this job's. Ranks started together race
// here: the file is published with link(), which fails if another rank published first, and
// then theirs is compared.
void claim_folder(const Job& job, std::size_t rank) {
  std::error_code ec;
  const fs::path path = job.out / kStateDir / "job.json";
  if (!fs::exists(path, ec) && fs::exists(job.out, ec)) {
    for (const ipc::DirectoryEntry& entry : ipc::list_directory(job.out, ec)) {
      if (entry.name != kStateDir) {
        throw ConfigError(str(job.out.string(), " holds files (", entry.name, ", ...) but no ",
                              kStateDir, "/job.json, so it is not the output of ",
                              "a preprocess job; write to an empty or new output.path"));
      }
    }
  }
  fs::create_directories(job.out / kStateDir, ec);
  if (ec) {
    throw Error(str(job.out.string(), ": cannot create the output folder: ", ec.message()));
  }
  const json mine = {{"format", "ferry.preprocess"},
                     {"version", 1},
                     {"fingerprint", job.fingerprint},
                     {"settings", job.settings}};
  if (!fs::exists(path, ec)) {
    const fs::path temporary = str(path.string(), ".partial-rank", rank, "-", ::getpid());
    ipc::write_file_durably(temporary, mine.dump(1), "job file");
    const int linked = ::link(temporary.c_str(), path.c_str());
    const int error = errno;
    ::unlink(temporary.c_str());
    if (linked == 0) return;
    if (error != EEXIST) {
      throw Error(str(path.string(), ": cannot publish the job file: ", std::strerror(error)));
    }
  }
  json theirs;
  try {
    theirs = json::parse(ipc::read_file(path, "job file"));
  } catch (const json::exception& e) {
    throw Error(str(path.string(), ": unreadable (", e.what(), "); it is not from ferry, or ",
                    "was edited: delete ", job.out.string(), " to start the job over"));
  }
  if (theirs.value("fingerprint", "") == job.fingerprint) return;
  std::string differs;
  const json their_settings = theirs.value("settings", json::object());
  for (const auto& [key, value] : job.settings.items()) {
    if (!their_settings.contains(key) || their_settings[key] != value) {
      differs += (differs.empty() ? "" : ", ") + key;
    }
  }
  if (differs.empty()) differs = "its format";
  throw ConfigError(str(job.out.string(), " holds the output of another preprocess job (",
                        "they differ in: ", differs, "); the outputs cannot be mixed: write to ",
                        "another output.path, or delete ", job.out.string(),
                        " to start this job over"));
}

struct Record {
  std::size_t first = 0;
  std::size_t inputs = 0;
  json files;
  json totals;
};

// Checks a record against the plan and the files it names; throws Error saying what is off.
Record check_record(const Job& job, std::size_t part, const json& j, bool check_files) {
  if (j.at("fingerprint").get<std::string>() != job.fingerprint) {
    throw Error("written by another job");
  }
  if (j.at("part").get<std::size_t>() != part) throw Error("its part number is another");
  Record r{j.at("first").get<std::size_t>(), j.at("inputs").get<std::size_t>(), j.at("files"),
           j.at("totals")};
  const std::size_t n = job.names.size();
  if (r.first > n || r.inputs > n - r.first) throw Error("it covers inputs past the last");
  if (!job.shard_bytes &&
      (r.first != part * job.part_size || r.inputs != std::min(job.part_size, n - r.first))) {
    throw Error(str("it covers inputs ", r.first, "+", r.inputs, ", not this part's"));
  }
  Totals scratch;
  add_totals(scratch, r.totals);  // well-formed numbers
  if (scratch.images + scratch.skipped.size() != r.inputs) throw Error("its counts do not add up");
  std::error_code ec;
  for (const auto& f : check_files ? r.files : json::array()) {
    const std::string name = job.shards ? f.at("name").get<std::string>() : f.get<std::string>();
    const fs::path named(name);
    if (name.empty() || named.is_absolute() ||
        std::any_of(named.begin(), named.end(), [](const fs::path& p) { return p == ".."; })) {
      throw Error(str("it names the file '", name, "'"));
    }
    const fs::path file = job.out / name;
    if (job.shards) {
      if (fs::file_size(file, ec) != f.at("bytes").get<std::uint64_t>() || ec) {
        throw Error(str(file.string(), " is missing or not the size recorded"));
      }
      if (!fs::exists(file.string() + ".idx", ec))
        throw Error(str(file.string(), ".idx is missing"));
    } else if (!fs::is_regular_file(file, ec)) {
      throw Error(str(file.string(), " is missing"));
    }
  }
  return r;
}

// The records of finished parts, by part number; a record that does not check out is reported
// and its part written again.
// `check_files`: also that the files a record names are there (a stat each).
std::map<std::size_t, Record> read_records(const Job& job, bool check_files = true) {
  std::map<std::size_t, Record> records;
  const fs::path dir = job.out / kStateDir;
  std::error_code ec;
  for (const ipc::DirectoryEntry& entry : ipc::list_directory(dir, ec)) {
    const std::string& name = entry.name;
    std::size_t part = 0;
    char tail = 0;
    if (std::sscanf(name.c_str(), "part-%zu.json%c", &part, &tail) != 1 ||
        name != part_file(part)) {
      continue;
    }
    const fs::path path = dir / name;
    try {
      records[part] =
          check_record(job, part, json::parse(ipc::read_file(path, "record")), check_files);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ferry: warning: %s: %s; part %zu is written again\n", path.c_str(),
                   e.what(), part);
    }
  }
  return records;
}

// Temporaries a killed run left in the folder, by the names the job gives them: a part's (its
// shard's, its index's, its record's, its lock), taken only when that part's lock is free, and
// job.json's and the statistics' (whose writers run under the finish lock this caller holds).
std::size_t sweep_folder(const Job& job) {
  std::size_t removed = 0;
  std::error_code ec;
  const auto part_of = [](const std::string& name,
                          const char* format) -> std::optional<std::size_t> {
    std::size_t part = 0;
    int end = 0;
    if (std::sscanf(name.c_str(), format, &part, &end) == 1 && end > 0 &&
        static_cast<std::size_t>(end) == name.size()) {
      return part;
    }
    return std::nullopt;
  };
  const std::string shard_format = job.prefix + "-%zu.tar%n";
  std::map<std::size_t, std::vector<fs::path>> parts;  // part -> its temporaries
  std::vector<fs::path> others;
  for (const fs::path& dir : {job.out, job.out / kStateDir}) {
    for (const ipc::DirectoryEntry& entry : ipc::list_directory(dir, ec)) {
      const fs::path path = dir / entry.name;
      const std::string& name = entry.name;
      std::optional<std::size_t> part;
      if (dir == job.out) {
        for (const char* tail : {".partial", ".idx.partial"}) {
          if (name.size() > std::strlen(tail) &&
              name.compare(name.size() - std::strlen(tail), std::strlen(tail), tail) == 0) {
            const std::string stem = name.substr(0, name.size() - std::strlen(tail));
            if (auto p = part_of(stem, shard_format.c_str()); p && stem == shard_name(job, *p)) {
              part = p;
            }
          }
        }
        if (name.rfind(job.stats_name + ".partial", 0) == 0) others.push_back(path);
      } else {
        if (auto p = part_of(name, "part-%zu.json.partial%n");
            p && name == part_file(*p) + ".partial") {
          part = p;
        }
        if (auto p = part_of(name, "part-%zu.lock%n")) part = p;
        if (name.rfind("job.json.partial", 0) == 0) others.push_back(path);
      }
      if (part) parts[*part].push_back(path);
    }
  }
  for (const auto& [part, paths] : parts) {
    // Free: its writer is gone. (Taking it, then letting it go, removes the lock file.)
    std::optional<FolderLock> lock = FolderLock::try_take(job.out / kStateDir / lock_file(part));
    if (!lock) continue;
    for (const fs::path& path : paths) {
      if (path.extension() != ".lock" && fs::remove(path, ec)) ++removed;
    }
  }
  for (const fs::path& path : others) {
    if (fs::remove(path, ec)) ++removed;
  }
  return removed;
}

// ---- progress ----

struct Progress {
  std::size_t total = 0;  // inputs this run will read
  std::size_t done = 0;
  std::uint64_t bytes_in = 0;
  double log_every = 5.0;
  bool terminal = ::isatty(STDERR_FILENO) == 1;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double last = -1e9;

  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  void show(bool final) {
    const double now = elapsed();
    if (!final && now - last < (terminal ? 0.1 : log_every)) return;
    last = now;
    const double rate = now > 0 ? static_cast<double>(done) / now : 0.0;
    const double mbps = now > 0 ? static_cast<double>(bytes_in) / now / 1e6 : 0.0;
    const std::string eta =
        rate > 0 ? duration(static_cast<double>(total - std::min(total, done)) / rate) : "?";
    char line[256];
    std::snprintf(line, sizeof line, "%zu/%zu images  %.0f images/s  %.1f MB/s  elapsed %s  ETA %s",
                  done, total, rate, mbps, duration(now).c_str(), eta.c_str());
    if (terminal) {
      const int width = 24;
      const int filled =
          total == 0 ? width : static_cast<int>(width * static_cast<double>(done) / total);
      std::string bar = "[" + std::string(filled, '#') + std::string(width - filled, '.') + "] ";
      std::fprintf(stderr, "\r\033[K%s%s%s", bar.c_str(), line, final ? "\n" : "");
    } else {
      std::fprintf(stderr, "preprocess: %s\n", line);
    }
    std::fflush(stderr);
  }
};

// ---- the statistics file ----

json statistics(const Job& job, const std::map<std::size_t, Record>& records) {
  Totals t;
  json files = json::array();
  for (const auto& [part, record] : records) {
    add_totals(t, record.totals);
    for (const auto& f : record.files) files.push_back(f);
  }
  json mean = json::array();
  json stddev = json::array();
  for (std::int64_t c = 0; c < std::min<std::int64_t>(t.channels, 3); ++c) {
    const long double n = static_cast<long double>(t.pixels);
    const long double m = n > 0 ? static_cast<long double>(t.sum[c]) / n : 0.0L;
    const long double v = n > 0 ? static_cast<long double>(t.squares[c]) / n - m * m : 0.0L;
    mean.push_back(static_cast<double>(m / 255.0L));
    stddev.push_back(static_cast<double>(std::sqrt(std::max(v, 0.0L)) / 255.0L));
  }
  json classes = json::object();
  for (const auto& [label, count] : t.classes) {
    const std::string name = label >= 0 && static_cast<std::size_t>(label) < job.classes.size()
                                 ? job.classes[static_cast<std::size_t>(label)]
                                 : std::to_string(label);
    classes[name] = count;
  }
  return {{"format", "ferry.preprocess.stats"},
          {"inputs", job.names.size()},
          {"images", t.images},
          {"skipped", t.skipped.size()},
          {"skipped_inputs", t.skipped},
          {"mean", mean},
          {"std", stddev},
          {"scale", "pixel values / 255, per channel (RGB or gray), over every output pixel"},
          {"pixels", t.pixels},
          {"classes", classes},
          {"input_shorter_side", t.sizes_in},
          {"output_shorter_side", t.sizes_out},
          {"bytes_in", t.bytes_in},
          {"bytes_out", t.bytes_out},
          {"files", job.shards ? files : json(files.size())}};
}

}  // namespace

// A worker died or hung. While loading one at a time, the input in hand is blamed only when the
// worker held it (not one that failed to start) and it takes a fresh worker down a second time:
// a death from outside (the OOM killer, a stray SIGKILL) seldom strikes the same input twice.
// Otherwise the inputs it may have held (`window` from the cursor) are loaded again one at a time.
struct LostWorker {
  std::string what;    // the loader's message (pid, worker, batch: not for the output)
  std::string reason;  // for the statistics: the same on every run
  std::vector<std::int64_t> held;
};

template <class Take>
void handle_lost_worker(const LostWorker& lost,
                        bool isolating,
                        std::size_t& cursor,
                        std::size_t& isolate_until,
                        std::size_t& strikes,
                        const std::vector<std::int64_t>& positions,
                        Take& take,
                        std::size_t window) {
  const std::string first_line = lost.what.substr(0, lost.what.find('\n'));
  const bool held =
      std::find(lost.held.begin(), lost.held.end(), positions[cursor]) != lost.held.end();
  if (isolating && held && ++strikes >= 2) {
    const std::int64_t meta[kMetaSize] = {};
    take(Row{positions[cursor], {}, meta, &lost.reason});
    ++cursor;
    strikes = 0;
    return;
  }
  if (isolating && !held) {
    throw Error(str("preprocess: a worker was lost while it held no input (", first_line,
                    "); run again to resume"));
  }
  if (!isolating) {
    isolate_until = std::min(positions.size(), cursor + window);
    strikes = 0;
  }
  std::fprintf(stderr,
               "ferry: warning: %s\npreprocess: loading the next %zu inputs one at a time, to "
               "find the one that caused it\n",
               first_line.c_str(), isolate_until - cursor);
}

// shard_bytes: the records that chain from input 0 (each starting where the one before ended):
// how many parts, and how many inputs they cover.
std::pair<std::size_t, std::size_t> chain_of(const std::map<std::size_t, Record>& records) {
  std::size_t part = 0;
  std::size_t covered = 0;
  for (auto it = records.find(0);
       it != records.end() && it->first == part && it->second.first == covered; ++it, ++part) {
    covered += it->second.inputs;
  }
  return {part, covered};
}

// ---- a bucket output: the staging folder's finished parts, uploaded ----

// An output in a bucket is written into a local staging folder as any output is, and mirrored:
// job.json first, then each part's files and after them its record (a part is done in the
// bucket when its record is there, as on disk), stats.json last. Each object appears whole or not
// at all (an S3 PUT), so a job killed at any moment leaves nothing in the bucket that looks
// complete and is not, and the next run uploads what a record in the staging folder has and the
// bucket lacks.
class Mirror {
 public:
  explicit Mirror(const Job& job) : job_(job) {}
  bool active() const noexcept { return !job_.upload.empty(); }

  void put(const std::string& relative) const {
    net::http_put_file(request(relative), (job_.out / relative).string());
  }
  bool has(const std::string& relative) const { return net::http_exists(request(relative)); }
  std::optional<std::string> get(const std::string& relative) const {
    return net::http_get(request(relative), /*missing_ok=*/true, 1u << 20);
  }
  void remove(const std::string& relative) const { net::http_delete(request(relative)); }

  // A finished part: its files (a shard and its index, or images), then its record.
  void put_part(std::size_t part, const Record& record) const {
    for (const auto& f : record.files) {
      if (job_.shards) {
        put(f.at("name").get<std::string>());
        put(f.at("name").get<std::string>() + ".idx");
      } else {
        put(f.get<std::string>());
      }
    }
    kill_point("part-uploaded");
    put(std::string(kStateDir) + "/" + part_file(part));
  }

 private:
  net::Request request(const std::string& relative) const {
    return net::request_for(job_.upload + "/" + relative);
  }
  const Job& job_;
};

// ---- the job ----

int run_preprocess(const PreprocessOptions& options) {
  Job job = read_job(options);
  std::size_t rank = 0;
  std::size_t world = 1;
  std::string launcher = "one process";
  if (const std::optional<LaunchInfo> launch = launch_info()) {
    rank = launch->rank;
    world = launch->world_size;
    launcher = launch->source;
  }
  if (options.rank) rank = *options.rank;
  if (options.world_size) world = *options.world_size;
  if (options.rank || options.world_size) launcher = "--rank/--world-size";
  if (world == 0 || rank >= world) {
    throw ConfigError(
        str("rank ", rank, " is outside world size ", world, " (--rank counts from 0)"));
  }
  if (job.shard_bytes && world > 1) {
    throw ConfigError(str(options.config, ": output.shard_bytes cuts each shard where the ",
                          "images before it end, so one process must write them all; with ", world,
                          " ranks use output.shard_samples (each rank then takes fixed ",
                          "shards)"));
  }
  const std::size_t n = job.names.size();
  claim_folder(job, rank);
  const std::vector<std::int64_t> order = input_order(n, job.shuffle_seed);
  std::map<std::size_t, Record> records = read_records(job);
  const Mirror mirror(job);
  if (mirror.active()) {
    // What a killed run finished here but did not upload goes up first.
    const std::string job_file = std::string(kStateDir) + "/job.json";
    if (const auto theirs = mirror.get(job_file)) {
      // The prefix holds a job's output: this one's, or the run would mix two jobs' parts.
      const json bucket_job = json::parse(*theirs);
      if (bucket_job.value("fingerprint", "") != job.fingerprint) {
        throw ConfigError(str(job.upload, " holds the output of another preprocess job (its ",
                              kStateDir, "/job.json has fingerprint ",
                              bucket_job.value("fingerprint", "?"), ", this job's is ",
                              job.fingerprint, "); write to another output.path, or delete ",
                              "that prefix's objects"));
      }
    } else {
      mirror.put(job_file);
    }
    std::size_t uploaded = 0;
    for (const auto& [part, record] : records) {
      if (!mirror.has(std::string(kStateDir) + "/" + part_file(part))) {
        mirror.put_part(part, record);
        ++uploaded;
      }
    }
    if (uploaded > 0) {
      std::fprintf(stderr,
                   "preprocess: uploaded %zu parts a killed run had finished but not "
                   "uploaded, to %s\n",
                   uploaded, job.upload.c_str());
    }
  }

  // The parts this rank writes, and where each starts in the order.
  std::vector<std::pair<std::size_t, std::size_t>> todo;  // (part, first position)
  std::size_t resumed_parts = 0;
  std::size_t total_parts = 0;  // 0: not known ahead (shards cut by bytes)
  std::size_t start = 0;        // bytes: the position after the last finished shard
  if (!job.shard_bytes) {
    total_parts = (n + job.part_size - 1) / job.part_size;
    for (std::size_t part = rank; part < total_parts; part += world) {
      if (records.count(part) != 0) {
        ++resumed_parts;
      } else {
        todo.emplace_back(part, part * job.part_size);
      }
    }
  } else {
    std::size_t part = 0;
    std::tie(part, start) = chain_of(records);
    // Records past a gap belong to a run that did not finish before them: never the case for
    // one writer, but a record that does not continue the chain is not trusted.
    for (auto it = records.lower_bound(part); it != records.end();) it = records.erase(it);
    resumed_parts = part;
    if (start < n || n == 0) todo.emplace_back(part, start);
  }
  std::vector<std::int64_t> positions;   // this run's inputs, in order
  std::vector<std::size_t> part_starts;  // where each part of `todo` starts in `positions`
  for (const auto& [part, first] : todo) {
    part_starts.push_back(positions.size());
    const std::size_t end = job.shard_bytes ? n : std::min(n, first + job.part_size);
    for (std::size_t pos = first; pos < end; ++pos) positions.push_back(order[pos]);
  }

  std::fprintf(stderr,
               "preprocess %s: %zu inputs -> %s (%s); rank %zu of %zu (%s): %zu parts to write, "
               "%zu done before\n",
               options.config.c_str(), n, job.out.c_str(), job.shards ? "shards" : "image tree",
               rank, world, launcher.c_str(),
               job.shard_bytes ? (start < n ? std::size_t{1} : std::size_t{0}) : todo.size(),
               resumed_parts);

  Progress progress;
  progress.total = positions.size();
  progress.log_every = options.log_every;
  std::size_t written_parts = 0;
  std::uint64_t images = 0;
  std::uint64_t skipped = 0;
  const fs::path state_dir = job.out / kStateDir;
  std::size_t next_todo = 0;
  std::size_t position = todo.empty() ? 0 : todo.front().second;  // in the job's order
  std::unique_ptr<PartWriter> writer;
  const auto finish_part = [&] {
    writer->finish(state_dir);
    if (mirror.active()) {
      const std::size_t part = writer->part();
      mirror.put_part(
          part, check_record(job, part,
                             json::parse(ipc::read_file(state_dir / part_file(part), "record")),
                             /*check_files=*/false));
    }
    images += writer->totals().images;
    skipped += writer->totals().skipped.size();
    ++written_parts;
    writer.reset();
  };
  // One input: into the part it belongs to, which is finished when full.
  const auto take = [&](const Row& row) {
    if (job.shard_bytes) {
      if (!writer)
        writer = std::make_unique<PartWriter>(job, resumed_parts + written_parts, position);
      if (writer->inputs() > 0 && row.error->empty() &&
          writer->size() + writer->cost(row) + 1024 > *job.shard_bytes) {
        finish_part();
        writer = std::make_unique<PartWriter>(job, resumed_parts + written_parts, position);
      }
    } else if (!writer) {
      const std::size_t from = part_starts[next_todo];
      const std::size_t to =
          next_todo + 1 < part_starts.size() ? part_starts[next_todo + 1] : positions.size();
      writer = std::make_unique<PartWriter>(
          job, todo[next_todo].first, todo[next_todo].second,
          job.shards ? std::span<const std::int64_t>()
                     : std::span<const std::int64_t>(positions.data() + from, to - from));
      position = todo[next_todo].second;
      ++next_todo;
    }
    writer->add(row);
    ++position;
    ++progress.done;
    progress.bytes_in += static_cast<std::uint64_t>(row.meta[kBytesIn]);
    if (!job.shard_bytes &&
        writer->inputs() == std::min(job.part_size, n - writer->part() * job.part_size)) {
      finish_part();
    }
  };

  // The loaders: normally batches from every worker; after a worker died (or hung past the
  // timeout), the inputs it may have held are loaded one at a time by one worker, so the one
  // that kills its worker is found and skipped (on_error: skip) and the rest are written.
  std::size_t cursor = 0;         // into positions: the next input to write
  std::size_t isolate_until = 0;  // [cursor, isolate_until) load one at a time
  std::size_t strikes = 0;        // lost workers while the input at the cursor was loading
  const std::size_t prefetch = 2;
  while (cursor < positions.size()) {
    const bool isolating = cursor < isolate_until;
    const std::size_t end = isolating ? isolate_until : positions.size();
    DataLoaderOptions loader_options{
        .batch_size = isolating ? 1 : job.batch_size,
        .num_workers = isolating ? std::min<std::size_t>(job.workers, 1) : job.workers,
        .in_order = true,
        .seed = 0};
    if (loader_options.num_workers > 0) {
      // The job's dataset is built here, not from the registry: workers are forked copies.
      loader_options.start_method = StartMethod::kFork;
      loader_options.prefetch_factor = isolating ? 1 : prefetch;
      loader_options.timeout = job.timeout;
    }
    DataLoader loader(std::make_shared<EncodeDataset>(job), loader_options,
                      std::make_shared<ListSampler>(std::vector<std::int64_t>(
                          positions.begin() + static_cast<std::ptrdiff_t>(cursor),
                          positions.begin() + static_cast<std::ptrdiff_t>(end))),
                      collate_encoded);
    try {
      for (const Batch& batch : loader) {
        // Nothing a worker sends is trusted: the shapes, the lengths and the inputs it answers.
        const std::size_t b = batch.size();
        const torch::Tensor data = batch["data"];
        const torch::Tensor lengths = batch["lengths"];
        const torch::Tensor meta = batch["meta"].contiguous();
        const auto& errors = batch.strings("error");
        const auto bad = [&](const std::string& what) {
          return Error(str("preprocess: a worker's batch ", batch.sequence(), " is malformed (",
                           what, "); run again to resume"));
        };
        if (data.dim() != 1 || data.scalar_type() != torch::kUInt8 || lengths.dim() != 1 ||
            lengths.scalar_type() != torch::kInt64 ||
            lengths.size(0) != static_cast<std::int64_t>(b) || meta.dim() != 2 ||
            meta.scalar_type() != torch::kInt64 || meta.size(0) != static_cast<std::int64_t>(b) ||
            meta.size(1) != kMetaSize || errors.size() != b || batch.indices().size() != b) {
          throw bad("its fields' shapes");
        }
        const auto* length = lengths.data_ptr<std::int64_t>();
        std::uint64_t total = 0;
        for (std::size_t i = 0; i < b; ++i) {
          if (length[i] < 0 || static_cast<std::uint64_t>(length[i]) >
                                   static_cast<std::uint64_t>(data.numel()) - total) {
            throw bad("lengths past its data");
          }
          total += static_cast<std::uint64_t>(length[i]);
        }
        if (total != static_cast<std::uint64_t>(data.numel()))
          throw bad("lengths short of its data");
        const auto* bytes = data.data_ptr<std::uint8_t>();
        std::size_t offset = 0;
        for (std::size_t i = 0; i < b; ++i) {
          if (cursor >= end || batch.indices()[i] != positions[cursor]) {
            throw bad(str("input ", batch.indices()[i], " where ",
                          positions[std::min(cursor, end - 1)], " was due"));
          }
          const std::int64_t* m = meta.data_ptr<std::int64_t>() + i * kMetaSize;
          for (std::int64_t k = 0; k < kMetaSize; ++k) {
            const bool size = k >= kWidthIn && k <= kHeightOut;
            if (k != kLabel && (m[k] < 0 || (size && m[k] > (std::int64_t{1} << 31)))) {
              throw bad("a negative or huge number");
            }
          }
          if (m[kChannels] > 4) throw bad("more than 4 channels");
          Row row{batch.indices()[i],
                  {bytes + offset, static_cast<std::size_t>(length[i])},
                  m,
                  &errors[i]};
          offset += static_cast<std::size_t>(length[i]);
          take(row);
          ++cursor;
          strikes = 0;
        }
        progress.show(false);
      }
    } catch (const WorkerError& e) {
      const auto* died = dynamic_cast<const WorkerDiedError*>(&e);
      if (died == nullptr || job.stop_on_error) throw;
      const std::string reason =
          died->signal() != 0
              ? str("its worker died of signal ", died->signal(), " (", ::strsignal(died->signal()),
                    ") while loading it, twice")
              : str("its worker exited with code ", died->exit_code(), " while loading it, twice");
      handle_lost_worker({e.what(), reason, e.failure().indices}, isolating, cursor, isolate_until,
                         strikes, positions, take, job.batch_size * (job.workers * prefetch + 1));
    } catch (const TimeoutError& e) {
      if (job.stop_on_error) throw;
      handle_lost_worker({e.what(), "its worker hung past the timeout while loading it, twice",
                          e.failure().indices},
                         isolating, cursor, isolate_until, strikes, positions, take,
                         job.batch_size * (job.workers * prefetch + 1));
    }
  }
  if (writer) finish_part();
  if (positions.empty() && job.shard_bytes && n == 0 && records.empty()) {
    PartWriter(job, 0, 0).finish(state_dir);
    ++written_parts;
  }
  progress.show(true);

  // Done when every part has its record: a rank that finds them all (under the finish lock,
  // one at a time) removes what killed runs left and writes the statistics.
  const fs::path stats_path = job.out / job.stats_name;
  json stats;
  bool complete = false;
  // Ranks that finish together take turns (a turn reads the records and writes one file).
  const auto waited_since = std::chrono::steady_clock::now();
  std::optional<FolderLock> finishing;
  while (!(finishing = FolderLock::try_take(state_dir / "finish.lock"))) {
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - waited_since).count();
    if (waited > 600) {
      throw Error(str(state_dir.string(), "/finish.lock: held by another process for 10 ",
                      "minutes; this rank's parts are done: run it again to write the statistics"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // This run's parts were checked as they were written, the others' by their ranks.
  records = read_records(job, /*check_files=*/false);
  if (job.shard_bytes) {
    // One chain of shards from input 0; records past its end are from a run that cut
    // differently (a worker lost in one run and not the other): they and their files go.
    const auto [part, covered] = chain_of(records);
    complete = covered == n;
    if (complete) {
      std::error_code ec;
      for (auto it = records.lower_bound(part); it != records.end();) {
        fs::remove(job.out / shard_name(job, it->first), ec);
        fs::remove(job.out / (shard_name(job, it->first) + ".idx"), ec);
        fs::remove(state_dir / part_file(it->first), ec);
        if (mirror.active()) {  // the record first: the part is not done in the bucket either
          mirror.remove(std::string(kStateDir) + "/" + part_file(it->first));
          mirror.remove(shard_name(job, it->first));
          mirror.remove(shard_name(job, it->first) + ".idx");
        }
        it = records.erase(it);
      }
      for (std::size_t later = part;; ++later) {  // shards past the end with no record
        const bool shard = fs::remove(job.out / shard_name(job, later), ec);
        const bool index = fs::remove(job.out / (shard_name(job, later) + ".idx"), ec);
        if (mirror.active() && (shard || index)) {
          mirror.remove(shard_name(job, later));
          mirror.remove(shard_name(job, later) + ".idx");
        }
        if (!shard && !index) break;
      }
    }
  } else {
    complete = records.size() == total_parts;
    for (std::size_t part = 0; complete && part < total_parts; ++part) {
      complete = records.count(part) != 0;
    }
  }
  if (complete) {
    const std::size_t removed = sweep_folder(job);
    if (removed > 0) {
      std::fprintf(stderr, "preprocess: removed %zu temporary files that killed runs left\n",
                   removed);
    }
    stats = statistics(job, records);
    ipc::write_file_atomically(stats_path, stats.dump(1) + "\n", "statistics",
                               str(stats_path.string(), ".partial-", ::getpid()));
    if (mirror.active()) mirror.put(job.stats_name);
  }
  finishing.reset();
  const double seconds = progress.elapsed();
  const double rate = seconds > 0 ? static_cast<double>(progress.done) / seconds : 0.0;
  std::printf(
      "preprocess: rank %zu of %zu wrote %zu parts (%llu images, %llu skipped) in %.1f s, "
      "%.0f images/s; %zu parts were done before\n",
      rank, world, written_parts, static_cast<unsigned long long>(images),
      static_cast<unsigned long long>(skipped), seconds, rate, resumed_parts);
  if (complete) {
    std::printf(
        "preprocess: complete: %s (%llu images, %llu inputs skipped; statistics in %s)\n",
        job.out.c_str(), static_cast<unsigned long long>(stats["images"].get<std::uint64_t>()),
        static_cast<unsigned long long>(stats["skipped"].get<std::uint64_t>()), stats_path.c_str());
    if (stats["skipped"].get<std::uint64_t>() > 0) {
      std::fprintf(stderr,
                   "ferry: warning: %llu inputs were skipped; %s lists them with the reason\n",
                   static_cast<unsigned long long>(stats["skipped"].get<std::uint64_t>()),
                   stats_path.c_str());
    }
  } else {
    std::printf(
        "preprocess: this rank's parts are done; other ranks' parts are not yet (%zu of "
        "%zu recorded); the last rank to finish writes %s\n",
        records.size(), total_parts, stats_path.c_str());
  }
  if (!options.json.empty()) {
    const json summary = {{"config", options.config},
                          {"output", job.out.string()},
                          {"rank", rank},
                          {"world_size", world},
                          {"launcher", launcher},
                          {"inputs", n},
                          {"parts_total", total_parts == 0 ? json(nullptr) : json(total_parts)},
                          {"parts_done_before", resumed_parts},
                          {"parts_written", written_parts},
                          {"inputs_read", progress.done},
                          {"images_written", images},
                          {"skipped", skipped},
                          {"bytes_in", progress.bytes_in},
                          {"seconds", seconds},
                          {"images_per_second", rate},
                          {"complete", complete},
                          {"statistics", complete ? json(stats_path.string()) : json(nullptr)}};
    ipc::write_file_atomically(options.json, summary.dump(1) + "\n", "--json",
                               options.json + ".partial");
  }
  return 0;
}

}  // namespace ferry::cli
