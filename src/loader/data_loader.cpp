#include "ferry/data_loader.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include <c10/util/Exception.h>

#include "ferry/error.h"
#include "ferry/registry.h"

#include "loader/cpu_placement.h"
#include "loader/epoch_iterator.h"
#include "loader/in_process_epoch.h"
#include "loader/loader_state.h"
#include "loader/multi_process_epoch.h"
#include "workers/fetch.h"
#include "workers/spawn.h"
#include "workers/worker_output.h"

namespace ferry {

namespace {

using detail::LoaderState;

// The checks every constructor shares, after resolve(): what PyTorch's DataLoader also refuses,
// plus what ferry cannot do yet on this machine.
std::shared_ptr<LoaderState> make_state(DataLoaderOptions options, CollateFn collate_fn) {
  auto state = std::make_shared<LoaderState>();
  state->options = resolve(std::move(options));
  // The registry's `default` collate is default collation: give it the workers' direct path
  // (samples written straight into the segment), not the generic one for a user's function.
  if (const ComponentSpec* c = collate_spec(collate_fn);
      c != nullptr && c->config.find("type")->scalar() == "default") {
    collate_fn = nullptr;
  }
  state->collate_fn = std::move(collate_fn);
  const DataLoaderOptions& o = state->options;
  if (o.pin_memory || (o.device && !o.device->is_cpu()) || !o.device_transforms.empty()) {
    state->stage =
        std::make_shared<device::DeviceStage>(o.device, o.pin_memory, o.device_transforms);
  }
  if (!o.worker_cpus.empty()) {
    FERRY_CHECK(o.num_workers > 0, "worker_cpus=\"", o.worker_cpus,
                "\" places worker processes, but num_workers=0 loads in the calling thread; set "
                "num_workers, or drop worker_cpus");
    state->worker_cpus =
        detail::resolve_worker_cpus(o.worker_cpus, detail::this_thread_placement());
  }
  state->recorder = std::make_shared<detail::StatsRecorder>(
      o.num_workers, state->worker_cpus.empty() ? detail::thread_cpus() : state->worker_cpus);
  if (!o.trace_path.empty() || o.trace_events > 0) {
    constexpr std::size_t kDefaultTraceEvents = 131072;
    state->tracer = std::make_shared<detail::Tracer>(
        o.trace_events > 0 ? o.trace_events : kDefaultTraceEvents, o.num_workers);
  }
  if (o.num_workers > std::thread::hardware_concurrency()) {
    TORCH_WARN_ONCE("ferry: num_workers=", o.num_workers, " but this machine has ",
                    std::thread::hardware_concurrency(),
                    " hardware threads; more workers than cores usually slows loading down");
  }
  return state;
}

// Start-method checks that need the dataset, and what spawn and forkserver send each worker.
// Run by every constructor, so a loader that cannot start its workers fails at construction.
void prepare_workers(LoaderState& s) {
  const DataLoaderOptions& o = s.options;
  if (o.num_workers == 0) return;
  const StartMethod method = *o.start_method;
  const std::string name(to_string(method));
  // fork is allowed after this process initialised CUDA, as in PyTorch: workers never use it
  // (DESIGN.md, "Processes and threads").
  if (method == StartMethod::kFork) return;
  const ComponentSpec* spec = s.dataset ? s.dataset->spec() : s.iterable->spec();
  FERRY_CHECK(spec != nullptr, "start_method=", name,
              " rebuilds the dataset in each worker from its registered type and configuration, "
              "but this dataset was constructed directly in C++. Build it with "
              "ferry::Registry::global().make_dataset(...) from a registered type (register "
              "the type before ferry::init), or use start_method=fork");
  FERRY_CHECK(!o.worker_init_fn, "worker_init_fn cannot travel to a ", name,
              " worker (it is a closure in this process's memory); do per-worker setup in the "
              "dataset's registered factory or with SampleContext::worker_id(), or use "
              "start_method=fork");
  s.dataset_config = spec->config.to_text();
  s.dataset_hash = spec->hash;
  bool builtin = spec->builtin;
  if (s.collate_fn) {
    const ComponentSpec* c = collate_spec(s.collate_fn);
    FERRY_CHECK(c != nullptr, "a collate_fn given as a C++ function cannot travel to a ", name,
                " worker; register it and pass ferry::Registry::global().make_collate(...), or "
                "use start_method=fork");
    s.collate_config = c->config.to_text();
    s.collate_hash = c->hash;
    builtin = builtin && c->builtin;
  }
  if (method == StartMethod::kForkserver) {
    FERRY_CHECK(workers::init_called(),
                "start_method=forkserver needs ferry::init(argc, argv) called first thing in "
                "main: the fork server is a copy of the program made there, before any thread "
                "starts. Add the call, or use start_method=fork");
    return;
  }
  if (workers::init_called()) return;  // worker_program empty: this program
  FERRY_CHECK(builtin,
              "start_method=spawn needs ferry::init(argc, argv) called first thing in "
              "main (after registering your types): a spawned worker is a fresh copy of this "
              "program, and dataset '",
              spec->config.find("type")->scalar(),
              "' is not a built-in type that the ferry-worker program could rebuild instead");
  std::vector<std::string> tried;
  const auto program = workers::find_ferry_worker(tried);
  FERRY_CHECK(program.has_value(),
              "start_method=spawn: this program did not call "
              "ferry::init(argc, argv), and the ferry-worker program is not at ",
              detail::join(tried),
              "; call ferry::init first thing in main, or set FERRY_WORKER_PROGRAM to the path "
              "of ferry-worker");
  s.worker_program = *program;
}

void check_map_options(const DataLoaderOptions& o, bool has_sampler, bool has_batch_sampler) {
  if (has_batch_sampler) {
    FERRY_CHECK(o.batch_size == 1 && !o.shuffle && !o.drop_last,
                "batch_sampler is mutually exclusive with batch_size, shuffle, sampler and "
                "drop_last (got batch_size=",
                o.batch_size, ", shuffle=", o.shuffle, ", drop_last=", o.drop_last,
                "); leave them at their defaults and set them on the BatchSampler instead");
  }
  if (has_sampler) {
    FERRY_CHECK(!o.shuffle,
                "shuffle=true together with a sampler: the sampler decides the "
                "order; drop shuffle, or drop the sampler and keep shuffle");
  }
}

void check_iterable_options(const DataLoaderOptions& o) {
  FERRY_CHECK(!o.shuffle,
              "shuffle=true with an IterableDataset: an iterable dataset decides its "
              "own order; shuffle inside the dataset's stream and set shuffle=false");
  FERRY_CHECK(o.on_error == OnError::kRaise,
              "on_error=skip with an IterableDataset: a stream knows its own records, so skip "
              "bad ones inside the stream; on_error=skip is for map-style datasets");
  FERRY_CHECK(o.on_worker_death == OnWorkerDeath::kRaise,
              "on_worker_death=respawn with an IterableDataset: a new worker cannot tell where "
              "the dead one's stream stood, so batches could repeat; use a map-style dataset "
              "(or save a checkpoint often and resume from it) or on_worker_death=raise");
  FERRY_CHECK(o.worker_threads == 1, "worker_threads=", o.worker_threads,
              " with an IterableDataset: a stream is read "
              "in order by one thread; parallelise inside the stream or use worker_threads=1");
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset,
                       DataLoaderOptions options,
                       CollateFn collate_fn)
    : DataLoader(std::move(dataset),
                 std::move(options),
                 std::shared_ptr<Sampler>(),
                 std::move(collate_fn)) {}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset,
                       DataLoaderOptions options,
                       std::shared_ptr<Sampler> sampler,
                       CollateFn collate_fn) {
  FERRY_CHECK(dataset != nullptr, "DataLoader: the dataset is null");
  check_map_options(options, sampler != nullptr, false);
  state_ = make_state(std::move(options), std::move(collate_fn));
  const DataLoaderOptions& o = state_->options;
  if (!sampler) {
    if (o.shuffle) {
      // The orders of DataLoader(shuffle=True, generator=torch.Generator().manual_seed(seed)),
      // whose iterators draw their workers' base seed from the same generator.
      sampler = std::make_shared<RandomSampler>(
          dataset->size(), *o.seed,
          RandomSampler::Options{.loader_draw = o.persistent_workers
                                                    ? RandomSampler::LoaderDraw::kFirstEpoch
                                                    : RandomSampler::LoaderDraw::kEveryEpoch});
    } else {
      sampler = std::make_shared<SequentialSampler>(dataset->size());
    }
    state_->own_sampler = sampler;
  }
  state_->keep_empty_batches = dynamic_cast<const DistributedSampler*>(sampler.get()) != nullptr;
  state_->batch_sampler =
      std::make_shared<BatchSampler>(std::move(sampler), o.batch_size, o.drop_last);
  state_->dataset = std::move(dataset);
  prepare_workers(*state_);
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset,
                       DataLoaderOptions options,
                       std::shared_ptr<BatchSampler> batch_sampler,
                       CollateFn collate_fn) {
  FERRY_CHECK(dataset != nullptr, "DataLoader: the dataset is null");
  FERRY_CHECK(batch_sampler != nullptr, "DataLoader: the batch_sampler is null");
  check_map_options(options, false, true);
  state_ = make_state(std::move(options), std::move(collate_fn));
  state_->keep_empty_batches =
      dynamic_cast<const DistributedSampler*>(batch_sampler->sampler().get()) != nullptr;
  state_->batch_sampler = std::move(batch_sampler);
  state_->dataset = std::move(dataset);
  prepare_workers(*state_);
}

DataLoader::DataLoader(std::shared_ptr<const IterableDataset> dataset,
                       DataLoaderOptions options,
                       CollateFn collate_fn) {
  FERRY_CHECK(dataset != nullptr, "DataLoader: the dataset is null");
  check_iterable_options(options);
  state_ = make_state(std::move(options), std::move(collate_fn));
  state_->iterable = std::move(dataset);
  prepare_workers(*state_);
}

DataLoader::DataLoader(std::shared_ptr<const IterableDataset> /*dataset*/,
                       DataLoaderOptions /*options*/,
                       std::shared_ptr<Sampler> /*sampler*/,
                       CollateFn /*collate_fn*/) {
  throw ConfigError(
      "sampler given with an IterableDataset: an iterable dataset has no indices to sample; drop "
      "the sampler, or use a map-style Dataset");
}

DataLoader::DataLoader(std::shared_ptr<const IterableDataset> /*dataset*/,
                       DataLoaderOptions /*options*/,
                       std::shared_ptr<BatchSampler> /*sampler*/,
                       CollateFn /*collate_fn*/) {
  throw ConfigError(
      "batch_sampler given with an IterableDataset: an iterable dataset has no indices to "
      "batch; drop the batch_sampler and set batch_size, or use a map-style Dataset");
}

namespace {

// A loader goes: its workers stop, and its trace goes to trace_path (a failure is said, not
// thrown: this runs in a destructor).
void finish(LoaderState& s) noexcept {
  s.close();
  if (!s.tracer || s.options.trace_path.empty()) return;
  try {
    s.tracer->write(s.options.trace_path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry: DataLoader trace_path: %s\n", e.what());
  }
}

}  // namespace

DataLoader::DataLoader(DataLoader&&) noexcept = default;
DataLoader& DataLoader::operator=(DataLoader&& other) noexcept {
  if (this != &other) {
    if (state_) finish(*state_);
    state_ = std::move(other.state_);
  }
  return *this;
}
DataLoader::~DataLoader() {
  if (state_) finish(*state_);
}

DataLoader::Iterator DataLoader::begin() {
  FERRY_CHECK(state_ != nullptr, "DataLoader: use of a moved-from loader");
  // The epoch, and a checkpoint loaded for it (its consumed batches are skipped, once). Both
  // advance only once the epoch has started: a begin() that fails (a worker that cannot start)
  // leaves them, so state() still says where the loop stands and a retry runs the same epoch.
  const std::uint64_t epoch = state_->next_epoch;
  std::optional<LoaderState::Resume> resume;
  if (state_->resume && state_->resume->epoch == epoch) resume = state_->resume;
  // The loop's wait for the first batch runs from here: starting workers is part of it.
  const std::uint64_t started = detail::Tracer::now_ns();
  const auto record = state_->recorder->open(epoch);
  if (state_->tracer) state_->tracer->instant(detail::str("epoch ", epoch, " begins"));
  std::shared_ptr<detail::EpochIterator> impl;
  try {
    if (state_->options.num_workers > 0) {
      impl = std::make_shared<detail::MultiProcessEpoch>(state_, epoch, std::move(resume));
    } else if (state_->dataset) {
      impl = std::make_shared<detail::InProcessMapEpoch>(state_, epoch, std::move(resume));
    } else {
      impl = std::make_shared<detail::InProcessStreamEpoch>(state_, epoch, std::move(resume));
    }
  } catch (...) {
    state_->recorder->forget(record);
    if (state_->tracer)
      state_->tracer->instant("error", detail::str("epoch ", epoch, " did not start"));
    throw;
  }
  impl->tally = std::make_unique<detail::EpochTally>(state_->recorder, record);
  impl->tracer = state_->tracer;
  impl->epoch_number = epoch;
  state_->next_epoch = epoch + 1;
  state_->resume.reset();
  Iterator it(std::move(impl));
  it.advance(started);
  return it;
}

std::size_t DataLoader::size() const {
  if (state_->own_sampler) {  // the dataset's length now, as len(DataLoader) reads it
    const std::size_t n = state_->dataset->size();
    const std::size_t b = state_->options.batch_size;
    return state_->options.drop_last ? n / b : (n + b - 1) / b;
  }
  if (state_->batch_sampler) return state_->batch_sampler->size();
  const std::optional<std::size_t> n = state_->iterable->size_hint();
  if (!n) {
    throw Error(
        "DataLoader::size(): the IterableDataset does not know its size; override "
        "IterableDataset::size_hint(), or count batches while iterating");
  }
  const std::size_t b = state_->options.batch_size;
  return state_->options.drop_last ? *n / b : (*n + b - 1) / b;
}

void DataLoader::set_epoch(std::uint64_t epoch) noexcept { state_->next_epoch = epoch; }
std::uint64_t DataLoader::epoch() const noexcept { return state_->next_epoch; }
const DataLoaderOptions& DataLoader::options() const noexcept { return state_->options; }

LoaderStats DataLoader::stats() const {
  LoaderStats out;
  {
    const std::lock_guard<std::mutex> lock(state_->stats_mutex);
    out.skipped = state_->skipped;
    out.skipped_samples.assign(state_->recent_skipped.begin(), state_->recent_skipped.end());
    out.worker_restarts = state_->restarts;
  }
  out.batches = state_->delivered_batches.load(std::memory_order_relaxed);
  out.samples = state_->delivered_samples.load(std::memory_order_relaxed);
  state_->recorder->fill(out);
  out.worker_cpus = state_->worker_cpus;
  return out;
}

void DataLoader::write_trace(const std::filesystem::path& path) const {
  FERRY_CHECK(state_ != nullptr, "DataLoader: use of a moved-from loader");
  if (!state_->tracer) {
    throw Error(detail::str("DataLoader::write_trace(", path.string(),
                            "): this loader records no trace; set DataLoaderOptions::trace_path "
                            "or trace_events when you build it"));
  }
  state_->tracer->write(path);
}

DataLoader::Iterator::Iterator(std::shared_ptr<detail::EpochIterator> epoch)
    : epoch_(std::move(epoch)) {}

Batch& DataLoader::Iterator::operator*() const {
  FERRY_CHECK(!at_end(), "DataLoader::Iterator: dereferenced at the end of the epoch");
  if (epoch_->error) std::rethrow_exception(epoch_->error);
  return *epoch_->current;
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  FERRY_CHECK(epoch_ != nullptr, "DataLoader::Iterator: advanced a default-constructed iterator");
  // A trace shows every wait; the stats time one batch in a stride when batches come too fast
  // for a clock read each (TimingStride).
  const detail::EpochIterator& e = *epoch_;
  const bool timed = e.tracer || !e.tally || e.tally->stride().due();
  advance(timed ? detail::Tracer::now_ns() : 0);
  return *this;
}

void DataLoader::Iterator::advance(std::uint64_t started_ns) {
  detail::EpochIterator& e = *epoch_;
  e.current.reset();
  e.error = nullptr;
  try {
    e.current = e.next();
  } catch (...) {
    e.error = std::current_exception();
  }
  if (started_ns == 0 && (e.current || e.error)) {  // a wait not timed (operator++): counted
    detail::StatsRecorder::counted(e.tally->epoch(), e.current ? e.current->size() : 0);
    return;
  }
  // How long the loop waited, for the stats and the trace. At the end the epoch's clock stops
  // now, even after a wait that was not timed.
  const std::uint64_t now = detail::Tracer::now_ns();
  if (started_ns == 0) started_ns = now;
  if (e.tally) {
    if (e.current || e.error) {
      detail::TimingStride& stride = e.tally->stride();
      const std::uint32_t weight = stride.timed(started_ns, now);
      detail::StatsRecorder::delivered(e.tally->epoch(), started_ns, now,
                                       e.current ? e.current->size() : 0, weight,
                                       stride.scaled(now - std::min(now, started_ns)));
    } else {
      e.tally->recorder().reached_end(e.tally->epoch(), started_ns, now);
    }
  }
  if (!e.tracer) return;
  if (e.current) {
    e.tracer->wait(started_ns, now, e.current->epoch(),
                   static_cast<std::int64_t>(e.current->sequence()));
    e.tracer->batch_delivered(e.current->epoch(), e.current->sequence());
  } else if (e.error) {
    e.tracer->wait(started_ns, now, e.epoch_number, -1);
    std::string what = "an exception not derived from std::exception";
    try {
      std::rethrow_exception(e.error);
    } catch (const std::exception& x) {
      what = x.what();
    } catch (...) {
    }
    e.tracer->instant("error", std::move(what));
  } else {
    e.tracer->wait(started_ns, now, e.epoch_number, -1);
    e.tracer->instant(detail::str("epoch ", e.epoch_number, " ends"));
  }
}

bool DataLoader::Iterator::at_end() const noexcept {
  return !epoch_ || (!epoch_->current && !epoch_->error);
}

void report_workers() noexcept { workers::request_worker_reports(); }

}  // namespace ferry
