#include "cli/run.h"

#include <unistd.h>

#include <CLI/Error.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "ferry/error.h"
#include "ferry/pipeline.h"

namespace ferry::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

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

}  // namespace

std::string json_string(const std::string& s) { return Config(s).to_text(); }

int run_pipeline(const RunOptions& options) {
  if (options.epochs == 0) throw CLI::ValidationError("--epochs", "must be at least 1");
  if (options.max_batches && *options.max_batches == 0) {
    throw CLI::ValidationError("--max-batches", "must be at least 1");
  }
  const Pipeline pipeline = read_pipeline(options.config, {.set = options.set});
  DataLoader loader = pipeline.make_loader();
  std::optional<std::ofstream> dump;
  if (!options.dump_indices.empty()) dump = open_output(options.dump_indices, "--dump-indices");
  std::optional<std::ofstream> json;
  if (!options.json.empty()) json = open_output(options.json, "--json");

  Progress progress;
  progress.log_every = options.log_every;
  try {
    std::size_t per_epoch = loader.size();
    if (options.max_batches) per_epoch = std::min(per_epoch, *options.max_batches);
    progress.planned = per_epoch * options.epochs;
  } catch (const Error&) {
    // An iterable dataset without a size hint: no total, no ETA.
  }
  std::fprintf(stderr, "ferry run %s: %s\n", options.config.c_str(),
               progress.planned ? (std::to_string(*progress.planned) + " batches").c_str()
                                : "batches until the stream ends");

  for (std::size_t epoch = 0; epoch < options.epochs; ++epoch) {
    std::size_t in_epoch = 0;
    for (auto it = loader.begin(); it != loader.end(); ++it) {
      const Batch& batch = *it;
      ++progress.batches;
      progress.samples += batch.size();
      for (const std::string& name : batch) {
        if (batch.is_tensor(name)) progress.bytes += batch[name].nbytes();
      }
      if (dump) {
        *dump << "{\"epoch\": " << batch.epoch() << ", \"batch\": " << batch.sequence()
              << ", \"indices\": [";
        const auto& indices = batch.indices();
        for (std::size_t i = 0; i < indices.size(); ++i) *dump << (i ? ", " : "") << indices[i];
        *dump << "]}\n";
      }
      progress.show(epoch, options.epochs, false);
      if (options.max_batches && ++in_epoch >= *options.max_batches) break;
    }
  }
  progress.show(options.epochs - 1, options.epochs, true);
  const double seconds = seconds_since(progress.start);
  const LoaderStats stats = loader.stats();
  const double rate = seconds > 0 ? static_cast<double>(progress.samples) / seconds : 0.0;
  const double mbps = seconds > 0 ? static_cast<double>(progress.bytes) / seconds / 1e6 : 0.0;

  std::printf(
      "%s: %zu epoch%s, %zu batches, %zu samples in %.2f s: %.1f samples/s, %.1f MB/s; "
      "%zu samples skipped\n",
      options.config.c_str(), options.epochs, options.epochs == 1 ? "" : "s", progress.batches,
      progress.samples, seconds, rate, mbps, stats.skipped);
  for (const SkippedSample& s : stats.skipped_samples) {
    std::printf("  skipped: epoch %llu, index %lld: %s\n", static_cast<unsigned long long>(s.epoch),
                static_cast<long long>(s.index), s.error.c_str());
  }
  std::fflush(stdout);
  if (dump && !dump->flush())
    throw Error("--dump-indices " + options.dump_indices + ": write failed");
  if (json) {
    std::ostringstream out;
    out << "{\n  \"config\": " << json_string(options.config)
        << ",\n  \"epochs\": " << options.epochs << ",\n  \"batches\": " << progress.batches
        << ",\n  \"samples\": " << progress.samples << ",\n  \"bytes\": " << progress.bytes
        << ",\n  \"seconds\": " << seconds << ",\n  \"samples_per_second\": " << rate
        << ",\n  \"mb_per_second\": " << mbps << ",\n  \"skipped\": " << stats.skipped
        << ",\n  \"skipped_samples\": [";
    for (std::size_t i = 0; i < stats.skipped_samples.size(); ++i) {
      const SkippedSample& s = stats.skipped_samples[i];
      out << (i ? "," : "") << "\n    {\"epoch\": " << s.epoch << ", \"index\": " << s.index
          << ", \"error\": " << json_string(s.error) << "}";
    }
    out << (stats.skipped_samples.empty() ? "" : "\n  ")
        << "],\n  \"seed\": " << *pipeline.options.seed << "\n}\n";
    *json << out.str();
    if (!json->flush()) throw Error("--json " + options.json + ": write failed");
  }
  return 0;
}

}  // namespace ferry::cli
