// DataLoader::state() and load_state(): a checkpoint of what the training loop consumed, as JSON.
// Resuming computes the position in the epoch's order; nothing is loaded to get there.

#include <algorithm>
#include <typeinfo>

#include <c10/util/Exception.h>
#include <c10/util/Type.h>

#include "ferry/data_loader.h"
#include "ferry/error.h"
#include "ferry/version.h"

#include "ipc/files.h"
#include "loader/loader_state.h"
#include "loader/state_json.h"

namespace ferry {

namespace {

namespace sj = detail::state_json;
using sj::Json;
using OrderedJson = nlohmann::ordered_json;
using detail::LoaderState;

constexpr const char* kFormat = "ferry.loader_state";
constexpr std::uint64_t kVersion = 1;

bool stock_batching(const LoaderState& s) {
  return s.batch_sampler && typeid(*s.batch_sampler) == typeid(BatchSampler);
}

// Batches in epoch `epoch`, without drawing its order: what plan_epoch will find.
std::size_t expected_batches(const LoaderState& s, std::uint64_t epoch) {
  if (!stock_batching(s)) return s.batch_sampler->size();
  const Sampler& sampler = *s.batch_sampler->sampler();
  std::size_t n = sampler.size();
  if (s.own_sampler) {
    n = s.dataset->size();  // the loader's own sampler follows the dataset (plan_epoch)
  } else if (const auto* d = dynamic_cast<const DistributedSampler*>(&sampler)) {
    n = d->size_in_epoch(epoch);
  }
  const std::size_t b = s.batch_sampler->batch_size();
  return s.batch_sampler->drop_last() ? n / b : (n + b - 1) / b;
}

// The sampler's own text, kept as JSON when it is JSON (ferry's samplers), else as a string.
OrderedJson sampler_json(const std::string& text) {
  if (text.empty()) return nullptr;
  try {
    return OrderedJson::parse(text);
  } catch (const OrderedJson::parse_error&) {
    return text;
  }
}

std::string sampler_text(const Json& saved) {
  if (saved.is_null()) return {};
  if (saved.is_string()) return saved.get<std::string>();
  return saved.dump();
}

OrderedJson totals_of(const LoaderState& s) {
  const std::lock_guard<std::mutex> lock(s.stats_mutex);
  return {{"batches", s.delivered_batches.load(std::memory_order_relaxed)},
          {"samples", s.delivered_samples.load(std::memory_order_relaxed)},
          {"skipped", s.skipped}};
}

// The fields every state begins with: what it is, who wrote it, the dataset and the seed.
OrderedJson state_header(const LoaderState& s, OrderedJson dataset) {
  OrderedJson out;
  out["format"] = kFormat;
  out["version"] = kVersion;
  out["written_by"] = "ferry " FERRY_VERSION;
  out["dataset"] = std::move(dataset);
  out["seed"] = *s.options.seed;
  return out;
}

// An iterable dataset's state: where each worker's stream stands in what the loop consumed
// (samples read, the stream's cursor after them, whether it ended), and, in order, whose
// result comes next. Empty streams: at the start of an epoch.
std::string stream_state(const LoaderState& s) {
  std::uint64_t epoch = s.next_epoch;
  std::size_t results = 0;
  std::size_t next_worker = 0;
  std::vector<LoaderState::StreamProgress> streams;
  {
    const std::lock_guard<std::mutex> lock(s.progress_mutex);
    const LoaderState::Progress& p = s.progress;
    if (p.owner != 0 && !p.finished) {
      epoch = p.epoch;
      results = p.prefix;
      next_worker = p.next_worker;
      streams = p.streams;
    } else if (s.resume && s.resume->epoch == s.next_epoch) {
      results = s.resume->prefix;
      next_worker = s.resume->next_worker;
      streams = s.resume->streams;
    }
  }
  OrderedJson out = state_header(s, {{"kind", "iterable"}});
  out["batch_size"] = s.options.batch_size;
  out["drop_last"] = s.options.drop_last;
  out["epoch"] = epoch;
  out["results"] = results;
  out["next_worker"] = next_worker;
  out["streams"] = OrderedJson::array();
  for (const auto& stream : streams) {
    out["streams"].push_back({{"position", stream.position},
                              {"cursor", stream.cursor ? OrderedJson(*stream.cursor) : nullptr},
                              {"ended", stream.ended}});
  }
  out["totals"] = totals_of(s);
  return out.dump(2) + "\n";
}

struct Totals {
  std::size_t batches = 0, samples = 0, skipped = 0;
};

Totals read_totals(const Json& saved) {
  const Json totals = sj::get<Json>(saved, "", "totals");
  if (!totals.is_object()) throw ConfigError("'totals' is not an object");
  return {sj::get<std::uint64_t>(totals, "totals", "batches"),
          sj::get<std::uint64_t>(totals, "totals", "samples"),
          sj::get<std::uint64_t>(totals, "totals", "skipped")};
}

// Everything was checked: the next begin() continues from `resume`, and stats() from `totals`.
void commit(LoaderState& s, LoaderState::Resume resume, const Totals& totals) {
  s.next_epoch = resume.epoch;
  s.resume = std::move(resume);
  {
    const std::lock_guard<std::mutex> lock(s.progress_mutex);
    s.progress.owner = 0;
  }
  const std::lock_guard<std::mutex> lock(s.stats_mutex);
  s.delivered_batches.store(totals.batches, std::memory_order_relaxed);
  s.delivered_samples.store(totals.samples, std::memory_order_relaxed);
  s.skipped = totals.skipped;
  s.recent_skipped.clear();
}

// Restores an iterable dataset's state (see stream_state); everything is checked first.
void load_stream_state(LoaderState& s, const Json& saved) {
  sj::expect(saved, "", "seed", *s.options.seed);
  sj::expect(saved, "", "batch_size", s.options.batch_size);
  sj::expect(saved, "", "drop_last", s.options.drop_last);
  const std::uint64_t epoch = sj::get<std::uint64_t>(saved, "", "epoch");
  const std::size_t results = sj::get<std::uint64_t>(saved, "", "results");
  const std::size_t next_worker = sj::get<std::uint64_t>(saved, "", "next_worker");
  const Json list = sj::get<Json>(saved, "", "streams");
  if (!list.is_array()) throw ConfigError("'streams' is not a list");
  const std::size_t workers = std::max<std::size_t>(1, s.options.num_workers);
  std::vector<LoaderState::StreamProgress> streams;
  std::size_t replayed = 0;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const Json& item = list[i];
    const std::string path = detail::str("streams[", i, "]");
    if (!item.is_object()) throw ConfigError(detail::str("'", path, "' is not an object"));
    LoaderState::StreamProgress stream;
    stream.position = sj::get<std::uint64_t>(item, path, "position");
    stream.ended = sj::get<bool>(item, path, "ended");
    const Json cursor = sj::get<Json>(item, path, "cursor");
    if (cursor.is_string()) {
      stream.cursor = cursor.get<std::string>();
    } else if (!cursor.is_null()) {
      throw ConfigError(detail::str("'", path, ".cursor' is ", cursor.dump().substr(0, 60),
                                    ", not a string or null"));
    }
    if (!stream.cursor && !stream.ended) replayed += stream.position;
    streams.push_back(std::move(stream));
  }
  if (!streams.empty() && streams.size() != workers) {
    throw ConfigError(
        detail::str("'streams': the state holds ", streams.size(), " worker stream",
                    streams.size() == 1 ? "" : "s", " and this loader has ", workers,
                    " (num_workers = ", s.options.num_workers,
                    "); an iterable dataset is split by worker, so resume it with num_workers = ",
                    streams.size() == 1 ? std::string("0 or 1") : std::to_string(streams.size()),
                    ", or at the start of an epoch"));
  }
  if (next_worker >= workers) {
    throw ConfigError(
        detail::str("'next_worker' is ", next_worker, ", but there are ", workers, " workers"));
  }
  const Totals totals = read_totals(saved);
  if (replayed > 0) {
    TORCH_WARN(
        "ferry: resuming an IterableDataset whose stream gives no cursor "
        "(ExampleStream::cursor()): its workers read and drop the ",
        replayed,
        " samples they had delivered to get back to where the loop stood; give the "
        "stream a cursor and seek() to resume without reading them");
  }
  commit(s, LoaderState::Resume{epoch, results, {}, std::move(streams), next_worker}, totals);
}

}  // namespace

std::string DataLoader::state() const {
  FERRY_CHECK(state_ != nullptr, "DataLoader: use of a moved-from loader");
  const LoaderState& s = *state_;
  if (s.iterable) return stream_state(s);
  std::uint64_t epoch = s.next_epoch;
  std::size_t position = 0;
  std::size_t batches = 0;
  std::vector<std::uint64_t> beyond;
  {
    const std::lock_guard<std::mutex> lock(s.progress_mutex);
    const LoaderState::Progress& p = s.progress;
    if (p.owner != 0 && !p.finished && p.prefix < p.batches) {  // inside an epoch
      epoch = p.epoch;
      position = p.prefix;
      batches = p.batches;
      beyond.assign(p.beyond.begin(), p.beyond.end());
    } else if (s.resume && s.resume->epoch == s.next_epoch) {  // loaded, not yet begun
      position = s.resume->prefix;
      beyond = s.resume->beyond;
    }
  }
  if (batches == 0) batches = expected_batches(s, epoch);
  OrderedJson out = state_header(s, {{"kind", "map"}, {"size", s.dataset->size()}});
  if (stock_batching(s)) {
    out["batch_size"] = s.batch_sampler->batch_size();
    out["drop_last"] = s.batch_sampler->drop_last();
  } else {
    out["batch_sampler"] = c10::demangle(typeid(*s.batch_sampler).name());
  }
  out["epoch"] = epoch;
  out["epoch_batches"] = batches;
  out["position"] = position;
  out["received_beyond"] = beyond;
  out["sampler"] = sampler_json(s.batch_sampler->state());
  out["totals"] = totals_of(s);
  return out.dump(2) + "\n";
}

void DataLoader::load_state(std::string_view text, std::string_view source) {
  FERRY_CHECK(state_ != nullptr, "DataLoader: use of a moved-from loader");
  LoaderState& s = *state_;
  try {
    const Json saved = sj::parse_object(text, "the text");
    const std::string format = sj::get<std::string>(saved, "", "format");
    if (format != kFormat) {
      throw ConfigError(detail::str("'format' is \"", format, "\", not \"", kFormat,
                                    "\": this is not a ferry loader state"));
    }
    const std::uint64_t version = sj::get<std::uint64_t>(saved, "", "version");
    if (version != kVersion) {
      throw ConfigError(detail::str(
          "'version' is ", version, ": ",
          version > kVersion ? "written by a newer ferry; this one (" FERRY_VERSION ") reads "
                             : "an unknown format version; this ferry reads ",
          "version ", kVersion, ". Resume with the ferry that wrote it"));
    }
    const Json& dataset = saved.contains("dataset") ? saved["dataset"] : Json();
    if (!dataset.is_object()) throw ConfigError("'dataset' is missing or not an object");
    sj::expect(dataset, "dataset", "kind", std::string(s.iterable ? "iterable" : "map"));
    if (s.iterable) {
      load_stream_state(s, saved);
      return;
    }
    sj::expect(dataset, "dataset", "size", s.dataset->size());
    sj::expect(saved, "", "seed", *s.options.seed);
    if (stock_batching(s)) {
      sj::expect(saved, "", "batch_size", s.batch_sampler->batch_size());
      sj::expect(saved, "", "drop_last", s.batch_sampler->drop_last());
    } else {
      sj::expect(saved, "", "batch_sampler", (c10::demangle(typeid(*s.batch_sampler).name())));
    }
    std::uint64_t epoch = sj::get<std::uint64_t>(saved, "", "epoch");
    const std::size_t batches = sj::get<std::uint64_t>(saved, "", "epoch_batches");
    std::size_t position = sj::get<std::uint64_t>(saved, "", "position");
    const Json list = sj::get<Json>(saved, "", "received_beyond");
    if (!list.is_array()) throw ConfigError("'received_beyond' is not a list of batch numbers");
    std::vector<std::uint64_t> beyond;
    for (const Json& b : list) {
      if (!b.is_number_unsigned() && !(b.is_number_integer() && b.get<std::int64_t>() >= 0)) {
        throw ConfigError(
            detail::str("'received_beyond' holds ", b.dump(), ", not a batch number"));
      }
      beyond.push_back(b.get<std::uint64_t>());
    }
    if (position > batches) {
      throw ConfigError(detail::str("'position' is ", position, ", past the epoch's ", batches,
                                    " batches ('epoch_batches')"));
    }
    for (std::size_t i = 0; i < beyond.size(); ++i) {
      if (beyond[i] <= position || beyond[i] >= batches || (i > 0 && beyond[i] <= beyond[i - 1])) {
        throw ConfigError(detail::str("'received_beyond' must list batches after 'position' (",
                                      position, ") and before 'epoch_batches' (", batches,
                                      "), each once and in order; it holds ", list.dump()));
      }
    }
    const Totals totals = read_totals(saved);
    const std::string sampler_state = sampler_text(sj::get<Json>(saved, "", "sampler"));
    if (position == batches) {  // the whole epoch was consumed: resume at the next one
      ++epoch;
      position = 0;
    }

    // The sampler checks its own arguments and may change the epoch's order (a
    // DistributedSampler at another world size); undone if the rest does not fit.
    BatchSampler& batching = *s.batch_sampler;
    if (!beyond.empty()) {
      // Batches received past a gap are positions in the saved world's split: they mean nothing
      // in another one.
      const auto* distributed =
          stock_batching(s) ? dynamic_cast<const DistributedSampler*>(batching.sampler().get())
                            : nullptr;
      const Json saved_sampler = sj::get<Json>(saved, "", "sampler");
      if (distributed != nullptr && saved_sampler.is_object() &&
          saved_sampler.value("num_replicas", Json()) != Json(distributed->num_replicas())) {
        throw ConfigError(detail::str(
            "'received_beyond': the state was saved out of order (in_order = false) with batches "
            "received past position ",
            position, " at world size ", saved_sampler.value("num_replicas", Json()).dump(),
            ", and this loader's world size is ", distributed->num_replicas(),
            "; resume at the same world size, or save in order"));
      }
    }
    const std::string before = batching.state();
    std::size_t resumed = position;
    try {
      resumed = batching.load_state(sampler_state, epoch, position);
      if (resumed == position && position > 0 && batches != expected_batches(s, epoch)) {
        throw ConfigError(detail::str("'epoch_batches' is ", batches, ", but epoch ", epoch,
                                      " of this loader has ", expected_batches(s, epoch),
                                      " batches; resume with the loader the state came from"));
      }
    } catch (...) {
      try {
        batching.load_state(before, epoch, position);
      } catch (...) {
        // before is what this sampler wrote itself: it fits
      }
      throw;
    }

    commit(s,
           LoaderState::Resume{
               epoch, resumed, resumed == position ? beyond : std::vector<std::uint64_t>{}, {}, 0},
           totals);
  } catch (const ConfigError& e) {
    throw ConfigError(detail::str(source, ": ", e.what()));
  }
}

void DataLoader::save_state(const std::filesystem::path& path) const {
  ipc::write_file_atomically(path, state(), "DataLoader::save_state:");
}

void DataLoader::load_state_file(const std::filesystem::path& path) {
  load_state(ipc::read_file(path, "DataLoader::load_state_file:"), path.string());
}

}  // namespace ferry
