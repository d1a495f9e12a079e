#include "ferry/data_loader_options.h"

#include <atomic>
#include <random>

#include "ferry/error.h"

#include "workers/fetch.h"

namespace ferry {

std::string_view to_string(StartMethod method) noexcept {
  switch (method) {
    case StartMethod::kFork:
      return "fork";
    case StartMethod::kSpawn:
      return "spawn";
    case StartMethod::kForkserver:
      return "forkserver";
  }
  return "unknown";
}

std::string_view to_string(OnError policy) noexcept {
  return policy == OnError::kSkip ? "skip" : "raise";
}

std::string_view to_string(OnWorkerDeath policy) noexcept {
  return policy == OnWorkerDeath::kRespawn ? "respawn" : "raise";
}

namespace {
std::atomic<StartMethod> g_default_start_method{StartMethod::kFork};
}  // namespace

void set_default_start_method(StartMethod method) noexcept { g_default_start_method = method; }
StartMethod default_start_method() noexcept { return g_default_start_method.load(); }

DataLoaderOptions resolve(DataLoaderOptions o) {
  FERRY_CHECK(o.batch_size > 0, "batch_size=0 is invalid; use a positive batch_size");
  FERRY_CHECK(o.timeout.count() >= 0, "timeout=", o.timeout.count(),
              " ms is negative; use 0 to wait forever or a positive duration");
  FERRY_CHECK(o.sample_timeout.count() >= 0, "sample_timeout=", o.sample_timeout.count(),
              " ms is negative; use 0 for no limit or a positive duration");
  FERRY_CHECK(!(o.num_workers == 0 && o.sample_timeout.count() > 0),
              "sample_timeout=", o.sample_timeout.count(),
              " ms needs worker processes (a stuck sample cannot be stopped in the calling "
              "thread); set num_workers > 0 or leave it 0");
  FERRY_CHECK(!(o.num_workers == 0 && o.prefetch_factor), "prefetch_factor=", *o.prefetch_factor,
              " has no effect with num_workers=0; set num_workers > 0 or leave it unset");
  FERRY_CHECK(!(o.num_workers == 0 && o.persistent_workers),
              "persistent_workers=true needs worker processes; set num_workers > 0 or "
              "persistent_workers=false");
  FERRY_CHECK(!o.prefetch_factor || *o.prefetch_factor > 0,
              "prefetch_factor=0 is invalid; use a positive prefetch_factor (default 2)");
  FERRY_CHECK(o.worker_threads > 0,
              "worker_threads=0 is invalid; use 1 (one sample at a time) "
              "or more");
  FERRY_CHECK(o.worker_threads == 1 || workers::parallel_fetch_available(),
              "worker_threads=", o.worker_threads,
              " needs ferry built with TBB (libtbb-dev); use worker_threads=1");
  FERRY_CHECK(o.worker_threads == 1 || o.sample_timeout.count() == 0,
              "sample_timeout=", o.sample_timeout.count(),
              " ms watches one sample at a time, so it cannot be "
              "combined with worker_threads=",
              o.worker_threads, "; use timeout (per batch) instead, or worker_threads=1");
  // As PyTorch's multiprocessing_context: only for multi-process loading.
  FERRY_CHECK(!(o.num_workers == 0 && o.start_method),
              "start_method=", o.start_method ? to_string(*o.start_method) : "",
              " needs worker processes; set "
              "num_workers > 0 or leave start_method unset");
  FERRY_CHECK(!(o.num_workers == 0 && o.on_worker_death == OnWorkerDeath::kRespawn),
              "on_worker_death=respawn needs worker processes (with num_workers=0 nothing can "
              "die but the program); set num_workers > 0 or on_worker_death=raise");
  if (o.num_workers > 0 && !o.prefetch_factor) o.prefetch_factor = kDefaultPrefetchFactor;
  if (o.num_workers > 0 && !o.start_method) o.start_method = default_start_method();
  if (!o.seed) {
    // As PyTorch without a generator: a fresh seed per loader, fixed for its lifetime.
    std::random_device device;
    o.seed = (static_cast<std::uint64_t>(device()) << 32) ^ device();
  }
  return o;
}

}  // namespace ferry
