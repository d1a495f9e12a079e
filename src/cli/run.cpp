#include "cli/run.h"

#include <signal.h>
#include <unistd.h>

#include <CLI/Error.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ferry/error.h"
#include "ferry/launch.h"
#include "ferry/pipeline.h"

#include "ipc/files.h"

namespace ferry::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::ofstream open_output(const std::string& path, const char* option) {
  std::ofstream out(path);
  if (!out) {
    throw Error(detail::str(option, " ", path,
                            ": cannot open for writing (check the folder exists and is "
                            "writable)"));
  }
  return out;
}

// Totals over the run, and what the progress display needs.
struct Progress {
  Clock::time_point start = Clock::now();
  Clock::time_point last_shown = start;
  std::size_t batches = 0;
  std::size_t samples = 0;
  std::size_t bytes = 0;
  std::optional<std::size_t> planned;  // batches in the whole run, when known
  bool terminal = ::isatty(STDERR_FILENO) == 1;
  double log_every = 5.0;

  void show(std::size_t epoch, std::size_t epochs, bool final) {
    const double now = seconds_since(start);
    const double since = std::chrono::duration<double>(Clock::now() - last_shown).count();
    if (!final && since < (terminal ? 0.1 : log_every)) return;
    last_shown = Clock::now();
    const double rate = now > 0 ? static_cast<double>(samples) / now : 0.0;
    const double mbps = now > 0 ? static_cast<double>(bytes) / now / 1e6 : 0.0;
    std::string eta = "?";
    std::string done = std::to_string(batches);
    if (planned) {
      done += "/" + std::to_string(*planned);
      if (batches > 0) {
        const double per_batch = now / static_cast<double>(batches);
        eta = duration(per_batch * static_cast<double>(*planned - std::min(*planned, batches)));
      }
    }
    char line[256];
    std::snprintf(line, sizeof line,
                  "epoch %zu/%zu  %s batches  %.0f samples/s  %.1f MB/s  elapsed %s  ETA %s",
                  epoch + 1, epochs, done.c_str(), rate, mbps, duration(now).c_str(), eta.c_str());
    if (terminal) {
      std::string bar;
      if (planned && *planned > 0) {
        constexpr std::size_t kWidth = 24;
        const std::size_t filled = std::min(kWidth, batches * kWidth / *planned);
        bar = "[" + std::string(filled, '#') + std::string(kWidth - filled, '.') + "] ";
      }
      std::fprintf(stderr, "\r\033[K%s%s%s", bar.c_str(), line, final ? "\n" : "");
    } else {
      std::fprintf(stderr, "%s\n", line);
    }
    std::fflush(stderr);
  }
};

// SIGTERM and SIGUSR1: once a batch was consumed, the run stops after the batch in hand and saves
// what was consumed. Before that, nothing was consumed and --save-state already holds the state
// the run started from (saved as soon as the loader was built): the signal's default action
// ends the process at once, rather than after a first batch that may be long in coming.
volatile std::sig_atomic_t g_stop_signal = 0;
volatile std::sig_atomic_t g_consumed_a_batch = 0;

extern "C" void on_stop_signal(int signal) {
  if (g_consumed_a_batch == 0) {
    ::signal(signal, SIG_DFL);  // async-signal-safe, as is raise
    ::raise(signal);
    return;
  }
  g_stop_signal = signal;
}

// Installs the handlers for the run's lifetime; restores the old ones after.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGTERM, &action, &old_term_);
    ::sigaction(SIGUSR1, &action, &old_usr1_);
  }
  ~StopSignals() {
    ::sigaction(SIGTERM, &old_term_, nullptr);
    ::sigaction(SIGUSR1, &old_usr1_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_term_ {};
  struct sigaction old_usr1_ {};
};

// The training loop's own work on one batch: it reads the size of every tensor (the bytes it
// returns), and with --step-ms keeps the thread busy that long, as a training step would.
std::size_t loop_step(const Batch& batch, double step_ms) {
  std::size_t bytes = 0;
  for (const std::string& name : batch) {
    if (batch.is_tensor(name)) bytes += batch[name].nbytes();
  }
  if (step_ms > 0) {
    const auto until = Clock::now() + std::chrono::duration<double, std::milli>(step_ms);
    while (Clock::now() < until) {
    }
  }
  return bytes;
}

// --headspace: the loop's rate with real loading (the run) and from memory (the replay).
struct Headspace {
  std::size_t held = 0;
  std::size_t replayed = 0;
  double loading_rate = 0;  // batches/s
  double memory_rate = 0;
  double speedup() const { return loading_rate > 0 ? memory_rate / loading_rate : 0.0; }
};

// Runs the loop over the held batches, round and round, as many times as the run delivered
// batches (and for at least half a second), as fast as the loop takes them.
Headspace replay(const std::vector<Batch>& held,
                 double step_ms,
                 std::size_t run_batches,
                 double run_seconds) {
  Headspace h;
  h.held = held.size();
  h.loading_rate = run_seconds > 0 ? static_cast<double>(run_batches) / run_seconds : 0.0;
  if (held.empty()) return h;
  const auto start = Clock::now();
  std::size_t sink = 0;
  while (h.replayed < std::max<std::size_t>(run_batches, held.size()) ||
         seconds_since(start) < 0.5) {
    sink += loop_step(held[h.replayed % held.size()], step_ms);
    ++h.replayed;
  }
  const double seconds = seconds_since(start);
  h.memory_rate = seconds > 0 ? static_cast<double>(h.replayed) / seconds : 0.0;
  if (sink == 1) std::fputc(' ', stderr);  // keeps the loop's reads from being optimised out
  return h;
}

void print_headspace(const Headspace& h) {
  std::printf(
      "  headspace: the loop ran %.1f batches/s with real loading and %.1f batches/s on %zu "
      "batches replayed from memory: %.2fx%s\n",
      h.loading_rate, h.memory_rate, h.held, h.speedup(),
      h.speedup() > 1.1 ? " (loading holds training back; more workers or a lighter pipeline "
                          "could help)"
                        : " (loading keeps up with the loop)");
}

std::string megabytes(std::size_t bytes) {
  char out[32];
  std::snprintf(out, sizeof out, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return out;
}

// Where the time went, from the loader's stats: the loop's waits, the workers' split, their CPU.
void print_time_split(const LoaderStats& stats) {
  const EpochStats& t = stats.total;
  if (t.seconds <= 0) return;
  std::printf(
      "  the loop waited for batches %.2f s of %.2f s (%.0f%%): p50 %.3f ms, p99 %.3f ms, max "
      "%.3f ms; %.1f batches/s\n",
      t.wait.total, t.seconds, 100.0 * t.wait.total / t.seconds, t.wait.p50 * 1e3, t.wait.p99 * 1e3,
      t.wait.max * 1e3, t.batches_per_second);
  if (t.workers.empty()) return;
  double loading = 0, collating = 0, segment = 0, waiting = 0;
  for (const WorkerTimeStats& w : t.workers) {
    loading += w.loading;
    collating += w.collating;
    segment += w.segment;
    waiting += w.waiting;
  }
  const double all = loading + collating + segment + waiting;
  if (all <= 0) return;
  std::printf(
      "  workers: loading %.0f%%, collating %.0f%%, getting segments %.0f%%, waiting for work "
      "%.0f%%; CPU %.2f cores (%.0f%% of the machine); shared memory peak %s\n",
      100 * loading / all, 100 * collating / all, 100 * segment / all, 100 * waiting / all,
      t.worker_cpu_seconds / t.seconds, 100 * t.worker_cpu_share,
      megabytes(t.shared_memory_peak).c_str());
  std::uint64_t bytes = 0, requests = 0, retries = 0, hits = 0, downloads = 0;
  for (const WorkerTimeStats& w : t.workers) {
    bytes += w.net_bytes;
    requests += w.net_requests;
    retries += w.net_retries;
    hits += w.cache_hits;
    downloads += w.cache_downloads;
  }
  if (requests + hits > 0) {
    std::printf(
        "  remote shards: %s in %llu requests (%llu retried), %.1f MB/s; cache: %llu shards "
        "read from it, %llu downloaded into it\n",
        megabytes(bytes).c_str(), static_cast<unsigned long long>(requests),
        static_cast<unsigned long long>(retries), static_cast<double>(bytes) / 1e6 / t.seconds,
        static_cast<unsigned long long>(hits), static_cast<unsigned long long>(downloads));
  }
}

nlohmann::ordered_json epoch_json(const EpochStats& s) {
  nlohmann::ordered_json workers = nlohmann::ordered_json::array();
  for (const WorkerTimeStats& w : s.workers) {
    workers.push_back({{"worker", w.worker_id},
                       {"batches", w.batches},
                       {"samples", w.samples},
                       {"loading_s", w.loading},
                       {"collating_s", w.collating},
                       {"segment_s", w.segment},
                       {"waiting_s", w.waiting},
                       {"cpu_s", w.cpu},
                       {"net_bytes", w.net_bytes},
                       {"net_requests", w.net_requests},
                       {"net_retries", w.net_retries},
                       {"cache_hits", w.cache_hits},
                       {"cache_downloads", w.cache_downloads}});
  }
  return {{"epoch", s.epoch},
          {"finished", s.finished},
          {"batches", s.batches},
          {"samples", s.samples},
          {"seconds", s.seconds},
          {"batches_per_second", s.batches_per_second},
          {"wait",
           {{"count", s.wait.count},
            {"total_s", s.wait.total},
            {"p50_s", s.wait.p50},
            {"p99_s", s.wait.p99},
            {"max_s", s.wait.max}}},
          {"workers", std::move(workers)},
          {"worker_cpu_s", s.worker_cpu_seconds},
          {"worker_cpu_share", s.worker_cpu_share},
          {"shared_memory_peak_bytes", s.shared_memory_peak}};
}

nlohmann::ordered_json stats_json(const LoaderStats& stats) {
  nlohmann::ordered_json epochs = nlohmann::ordered_json::array();
  for (const EpochStats& e : stats.epochs) epochs.push_back(epoch_json(e));
  return {{"total", epoch_json(stats.total)},
          {"epochs", std::move(epochs)},
          {"worker_cpus", stats.worker_cpus}};
}

}  // namespace

std::string duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<long long>(std::llround(seconds));
  char out[32];
  if (s >= 3600) {
    std::snprintf(out, sizeof out, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(out, sizeof out, "%lld:%02lld", s / 60, s % 60);
  }
  return out;
}

std::string for_this_rank(std::string path) {
  const auto at = path.find("{rank}");
  if (at == std::string::npos) return path;
  const std::optional<LaunchInfo> launch = launch_info();
  return path.replace(at, 6, std::to_string(launch ? launch->rank : 0));
}

int run_pipeline(const RunOptions& options) {
  if (options.epochs == 0) throw CLI::ValidationError("--epochs", "must be at least 1");
  if (options.max_batches && *options.max_batches == 0) {
    throw CLI::ValidationError("--max-batches", "must be at least 1");
  }
  if (options.save_every && *options.save_every == 0) {
    throw CLI::ValidationError("--save-every", "must be at least 1");
  }
  if (options.trace_events > 0 && options.trace.empty()) {
    throw CLI::ValidationError("--trace-events", "needs --trace FILE to write to");
  }
  if (options.save_every && options.save_state.empty()) {
    throw CLI::ValidationError("--save-every", "needs --save-state FILE to write to");
  }
  const std::string trace_path = for_this_rank(options.trace);
  const Pipeline pipeline =
      read_pipeline(options.config, {.set = options.set, .options = [&](DataLoaderOptions& o) {
                                       if (!trace_path.empty()) o.trace_path = trace_path;
                                       if (options.trace_events > 0)
                                         o.trace_events = options.trace_events;
                                     }});
  DataLoader loader = pipeline.make_loader();
  const std::string save_path = for_this_rank(options.save_state);
  std::size_t resumed_in_epoch = 0;  // batches of the first epoch consumed before --resume
  if (!options.resume.empty()) {
    const std::string path = for_this_rank(options.resume);
    loader.load_state_file(path);
    // Where the loader now stands (a DistributedSampler at another world size splits the rest
    // of the epoch anew and starts it at 0).
    const nlohmann::json state = nlohmann::json::parse(loader.state());
    // Map-style: the batches received; iterable: the results taken (stream ends included).
    resumed_in_epoch = state.contains("position")
                           ? state["position"].get<std::size_t>() +
                                 state.value("received_beyond", nlohmann::json::array()).size()
                           : state.value("results", std::size_t{0});
    std::fprintf(stderr, "ferry run: resuming from %s at epoch %llu, batch %zu\n", path.c_str(),
                 static_cast<unsigned long long>(loader.epoch()), resumed_in_epoch);
  }
  std::optional<std::ofstream> dump;
  if (!options.dump_indices.empty()) {
    dump = open_output(for_this_rank(options.dump_indices), "--dump-indices");
  }
  std::optional<std::ofstream> json;
  if (!options.json.empty()) json = open_output(for_this_rank(options.json), "--json");

  const std::uint64_t first_epoch = loader.epoch();
  const std::size_t epochs = first_epoch < options.epochs ? options.epochs - first_epoch : 0;
  Progress progress;
  progress.log_every = options.log_every;
  try {
    std::size_t per_epoch = loader.size();
    if (options.max_batches) per_epoch = std::min(per_epoch, *options.max_batches);
    progress.planned = per_epoch * epochs;
    progress.planned = *progress.planned - std::min(*progress.planned, resumed_in_epoch);
  } catch (const Error&) {
    // An iterable dataset without a size hint: no total, no ETA.
  }
  auto save = [&] {
    if (save_path.empty()) return;
    // The dump reaches the disk first, so it always holds at least what the state says.
    if (dump && !dump->flush())
      throw Error("--dump-indices " + options.dump_indices + ": write failed");
    loader.save_state(save_path);
  };
  // The state the run starts from, saved before any batch: a job stopped before its first batch
  // resumes from here (from --resume's state, not an older file at --save-state).
  save();
  std::fprintf(stderr, "ferry run %s: %s\n", options.config.c_str(),
               progress.planned ? (std::to_string(*progress.planned) + " batches").c_str()
                                : "batches until the stream ends");

  g_stop_signal = 0;
  g_consumed_a_batch = 0;
  const StopSignals signals;
  auto preempted = [&] {
    const int signal = g_stop_signal;
    save();
    std::fprintf(stderr, "\nferry run: stopped by %s after %zu batches; %s\n",
                 signal == SIGTERM ? "SIGTERM" : "SIGUSR1", progress.batches,
                 save_path.empty() ? "no --save-state was given, so nothing was saved"
                                   : ("the state of what was consumed is in " + save_path +
                                      " (resume with --resume)")
                                         .c_str());
    return kPreempted;
  };
  // --headspace: the first batches, held for the replay after the run.
  std::vector<Batch> held;
  if (options.headspace) held.reserve(options.headspace_batches);
  for (std::size_t e = 0; e < epochs; ++e) {
    std::size_t in_epoch = e == 0 ? resumed_in_epoch : 0;
    if (options.max_batches && in_epoch >= *options.max_batches) {  // resumed past the limit
      loader.set_epoch(loader.epoch() + 1);
      continue;
    }
    // The scheduler signals every process of the job, workers too: a worker that died of it is
    // the preemption, not a failure. The state is taken while the epoch's iterator still
    // stands, so what was consumed of this epoch is exact.
    auto stopped_or_rethrow = [&]() -> int {
      if (g_stop_signal != 0) return preempted();
      throw;
    };
    std::optional<DataLoader::Iterator> it;
    try {
      it = loader.begin();
    } catch (const Error&) {
      return stopped_or_rethrow();
    }
    for (; *it != loader.end(); ++*it) {
      const Batch* current = nullptr;
      try {
        current = &**it;
      } catch (const Error&) {
        return stopped_or_rethrow();
      }
      const Batch& batch = *current;
      g_consumed_a_batch = 1;  // from here a stop signal waits for this batch's save
      ++progress.batches;
      progress.samples += batch.size();
      progress.bytes += loop_step(batch, options.step_ms);
      if (options.headspace && held.size() < options.headspace_batches) held.push_back(batch);
      if (dump) {
        *dump << nlohmann::ordered_json{{"epoch", batch.epoch()},
                                        {"batch", batch.sequence()},
                                        {"indices", batch.indices()}}
                     .dump()
              << "\n";
      }
      progress.show(first_epoch + e, options.epochs, false);
      if (options.save_every && progress.batches % *options.save_every == 0) save();
      if (g_stop_signal != 0) return preempted();
      if (options.max_batches && ++in_epoch >= *options.max_batches) break;
    }
  }
  save();
  progress.show(options.epochs - 1, options.epochs, true);
  const double seconds = seconds_since(progress.start);
  const LoaderStats stats = loader.stats();
  std::optional<Headspace> headspace;
  if (options.headspace) headspace = replay(held, options.step_ms, progress.batches, seconds);
  held.clear();
  const double rate = seconds > 0 ? static_cast<double>(progress.samples) / seconds : 0.0;
  const double mbps = seconds > 0 ? static_cast<double>(progress.bytes) / seconds / 1e6 : 0.0;

  std::printf(
      "%s: %zu epoch%s, %zu batches, %zu samples in %.2f s: %.1f samples/s, %.1f MB/s; "
      "%zu samples skipped\n",
      options.config.c_str(), epochs, epochs == 1 ? "" : "s", progress.batches, progress.samples,
      seconds, rate, mbps, stats.skipped);
  for (const SkippedSample& s : stats.skipped_samples) {
    std::printf("  skipped: epoch %llu, index %lld: %s\n", static_cast<unsigned long long>(s.epoch),
                static_cast<long long>(s.index), s.error.c_str());
  }
  for (const WorkerRestart& r : stats.worker_restarts) {
    std::printf("  worker restarted: epoch %llu: %s\n", static_cast<unsigned long long>(r.epoch),
                r.message.c_str());
  }
  print_time_split(stats);
  if (headspace) print_headspace(*headspace);
  if (!trace_path.empty()) {
    std::printf(
        "  trace: %s (written when the loader goes: open it in https://ui.perfetto.dev or "
        "chrome://tracing)\n",
        trace_path.c_str());
  }
  std::fflush(stdout);
  if (dump && !dump->flush()) {
    throw Error("--dump-indices " + options.dump_indices + ": write failed");
  }
  if (json) {
    nlohmann::ordered_json out;
    out["config"] = options.config;
    out["epochs"] = epochs;
    out["batches"] = progress.batches;
    out["samples"] = progress.samples;
    out["bytes"] = progress.bytes;
    out["seconds"] = seconds;
    out["samples_per_second"] = rate;
    out["mb_per_second"] = mbps;
    out["skipped"] = stats.skipped;
    out["skipped_samples"] = nlohmann::ordered_json::array();
    for (const SkippedSample& s : stats.skipped_samples) {
      out["skipped_samples"].push_back(
          {{"epoch", s.epoch}, {"index", s.index}, {"error", s.error}});
    }
    out["worker_restarts"] = nlohmann::ordered_json::array();
    for (const WorkerRestart& r : stats.worker_restarts) {
      out["worker_restarts"].push_back({{"epoch", r.epoch},
                                        {"worker", r.worker_id},
                                        {"pid", r.pid},
                                        {"exit_code", r.exit_code},
                                        {"signal", r.signal},
                                        {"batches", r.batches},
                                        {"message", r.message}});
    }
    out["stats"] = stats_json(stats);
    if (headspace) {
      out["headspace"] = {{"batches_held", headspace->held},
                          {"replayed", headspace->replayed},
                          {"loading_batches_per_second", headspace->loading_rate},
                          {"memory_batches_per_second", headspace->memory_rate},
                          {"speedup", headspace->speedup()},
                          {"step_ms", options.step_ms}};
    }
    if (!trace_path.empty()) out["trace"] = trace_path;
    out["seed"] = *pipeline.options.seed;
    *json << out.dump(2) << "\n";
    if (!json->flush()) throw Error("--json " + options.json + ": write failed");
  }
  return 0;
}

}  // namespace ferry::cli
