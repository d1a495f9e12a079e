// Seeded chaos runs (ctest label chaos). Each run builds a random loader (workers, start method,
// order, persistence, batch size, prefetch, respawn or raise) over a ledger dataset, and injects
// one fault at a random moment: a worker killed (SIGKILL, SIGSEGV) or exiting by itself, a worker
// stopped and continued (or stopped for good, under a timeout), the main process killed, shared
// memory failing (ENOSPC), few descriptors (a low RLIMIT_NOFILE), or a storm of signals with
// handlers (EINTR). Every run must end with every index delivered exactly once (in order when
// asked) or with the typed error its fault allows, within its deadline, and leave no process,
// descriptor, mapping or shared-memory name behind. Each run is a forked child.
//
//   FERRY_CHAOS_RUNS   runs (default 50)      FERRY_CHAOS_SEED   the first seed (default 1)
//   FERRY_CHAOS_NO_FORKSERVER   set: runs drawn for the forkserver use spawn (tests/sanitize.sh
//                               thread sets it)
//
// A failing run prints its seed and plan; FERRY_CHAOS_SEED=S FERRY_CHAOS_RUNS=1 replays it alone.

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/data_loader.h"
#include "ferry/error.h"

#include "ipc/shared_memory.h"
#include "support/child_test.h"
#include "support/datasets.h"
#include "support/ledger.h"
#include "support/process_harness.h"
#include "support/registered.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using testing::LedgerDataset;

enum class Fault {
  kNone,
  kSigkill,         // a worker, from outside
  kSigsegv,         // a worker, from outside
  kExitInWorker,    // the dataset calls exit(3) on one index (every time it is loaded)
  kStopContinue,    // a worker stopped for a few ms, then continued
  kStopForGood,     // a worker stopped and never continued: the timeout must fire
  kKillMain,        // the main process SIGKILLs itself: its workers must die with it
  kShmEnospc,       // the next shared-memory allocations fail (fork workers inherit the hook)
  kFewDescriptors,  // RLIMIT_NOFILE a little above what the process holds
  kSignalStorm,     // SIGUSR2 (a handler without SA_RESTART) every 100 us while iterating
  kCount
};

const char* name(Fault f) {
  static const char* names[] = {
      "none",          "sigkill",   "sigsegv",    "exit-in-worker",  "stop-continue",
      "stop-for-good", "kill-main", "shm-enospc", "few-descriptors", "signal-storm"};
  return names[static_cast<int>(f)];
}

struct Plan {
  std::uint64_t seed = 0;
  StartMethod method = StartMethod::kFork;
  std::size_t workers = 1;
  bool in_order = true;
  bool persistent = false;
  std::size_t batch_size = 1;
  std::size_t prefetch = 2;
  bool respawn = false;
  std::size_t samples = 0;
  int epochs = 1;
  Fault fault = Fault::kNone;
  int fault_epoch = 0;
  int fault_batch = 0;

  std::string describe() const {
    std::ostringstream out;
    out << "seed " << seed << ": " << to_string(method) << ", " << workers << " workers, "
        << (in_order ? "in order" : "out of order") << (persistent ? ", persistent" : "")
        << ", batch " << batch_size << ", prefetch " << prefetch
        << (respawn ? ", respawn" : ", raise") << ", " << samples << " samples x " << epochs
        << " epochs; fault " << name(fault) << " at epoch " << fault_epoch << " batch "
        << fault_batch;
    return out.str();
  }
};

Plan make_plan(std::uint64_t seed) {
  std::mt19937_64 r(seed);
  auto pick = [&](std::uint64_t n) { return static_cast<int>(r() % n); };
  Plan p;
  p.seed = seed;
  // Mostly fork (fast); spawn and forkserver in one run in eight each.
  const int m = pick(8);
  p.method = m < 6 ? StartMethod::kFork : (m == 6 ? StartMethod::kSpawn : StartMethod::kForkserver);
  if (p.method == StartMethod::kForkserver && std::getenv("FERRY_CHAOS_NO_FORKSERVER") != nullptr) {
    p.method = StartMethod::kSpawn;  // ThreadSanitizer: no forkserver can work there
  }
  p.workers = 1 + static_cast<std::size_t>(pick(3));
  p.in_order = pick(3) != 0;
  p.persistent = pick(2) == 0;
  p.batch_size = 1 + static_cast<std::size_t>(pick(6));
  p.prefetch = 1 + static_cast<std::size_t>(pick(3));
  p.respawn = pick(2) == 0;
  p.samples = 24 + static_cast<std::size_t>(pick(72));
  p.epochs = 1 + pick(3);
  p.fault = static_cast<Fault>(pick(static_cast<int>(Fault::kCount)));
  p.fault_epoch = pick(static_cast<std::uint64_t>(p.epochs));
  const auto batches = static_cast<int>((p.samples + p.batch_size - 1) / p.batch_size);
  p.fault_batch = pick(static_cast<std::uint64_t>(std::max(1, batches - 1)));
  return p;
}

void on_storm_signal(int) {}

// The run, in a forked child: 0 when its outcome is one the fault allows.
int chaos_run(const Plan& p, const std::string& pid_file) {
  {  // ferry's forker thread, and the forkserver, start once per process: before the baseline
    const auto method = p.method == StartMethod::kForkserver ? p.method : StartMethod::kFork;
    DataLoader warm(testing::range(1), {.num_workers = 1, .start_method = method});
    for (auto& batch : warm) (void)batch;
  }
  const auto before = testing::snapshot();
  std::atomic<bool> storming{false};
  std::thread storm;
  if (p.fault == Fault::kSignalStorm) {
    struct sigaction action {};
    action.sa_handler = on_storm_signal;  // no SA_RESTART: system calls fail with EINTR
    ::sigaction(SIGUSR2, &action, nullptr);
  }
  if (p.fault == Fault::kFewDescriptors) {
    rlimit limit{};
    ::getrlimit(RLIMIT_NOFILE, &limit);
    // From too few for the loader's own descriptors to just enough (EMFILE somewhere, or not).
    limit.rlim_cur = before.fds.size() + p.seed % 16;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
  if (p.fault == Fault::kShmEnospc)
    ipc::fault::fail_next_allocations(1 + static_cast<int>(p.seed % 3));
  // Registered types, so that spawn and forkserver workers can rebuild them: a ledger with up to
  // 300 us a sample (faults land while workers hold tasks), or one whose sample `bad` exits.
  auto dataset =
      p.fault == Fault::kExitInWorker
          ? testing::faulty(p.samples, p.seed % p.samples, testing::FaultyDataset::Fault::kExit3)
          : testing::ledger(p.samples, 256, 300);
  const DataLoaderOptions options{
      .batch_size = p.batch_size,
      .num_workers = p.workers,
      .prefetch_factor = p.prefetch,
      .persistent_workers = p.persistent,
      .timeout = p.fault == Fault::kStopForGood ? std::chrono::milliseconds(1500) : 20s,
      .in_order = p.in_order,
      .seed = p.seed,
      .start_method = p.method,
      .on_worker_death = p.respawn ? OnWorkerDeath::kRespawn : OnWorkerDeath::kRaise};
  std::string outcome = "exactly once";
  {
    DataLoader loader(dataset, options);
    try {
      for (int epoch = 0; epoch < p.epochs; ++epoch) {
        std::vector<int> seen(p.samples, 0);
        std::int64_t last = -1;
        int batch_number = 0;
        for (auto& batch : loader) {
          const auto index = batch["index"];
          const auto payload = batch["payload"];
          for (std::int64_t r = 0; r < index.size(0); ++r) {
            const auto i = index[r].item<std::int64_t>();
            REQUIRE(i >= 0 && static_cast<std::size_t>(i) < p.samples, "index ", i);
            REQUIRE(++seen[static_cast<std::size_t>(i)] == 1, "index ", i, " delivered twice");
            REQUIRE(
                LedgerDataset::check_row(payload, r, i, static_cast<std::uint64_t>(epoch)).empty(),
                "index ", i, " has the wrong bytes");
            if (p.in_order) REQUIRE(i > last, "index ", i, " after ", last, " in order");
            last = i;
          }
          if (epoch == p.fault_epoch && batch_number++ == p.fault_batch) {
            const auto worker = static_cast<pid_t>(batch["pid"][0].item<std::int64_t>());
            switch (p.fault) {
              case Fault::kSigkill:
                ::kill(worker, SIGKILL);
                break;
              case Fault::kSigsegv:
                ::kill(worker, SIGSEGV);
                break;
              case Fault::kStopContinue:
                ::kill(worker, SIGSTOP);
                std::this_thread::sleep_for(std::chrono::milliseconds(5 + p.seed % 50));
                ::kill(worker, SIGCONT);
                break;
              case Fault::kStopForGood:
                ::kill(worker, SIGSTOP);
                break;
              case Fault::kKillMain: {
                std::ofstream(pid_file) << worker << "\n";  // for the parent to check it goes
                ::kill(::getpid(), SIGKILL);
                break;
              }
              case Fault::kSignalStorm:
                if (!storming.exchange(true)) {
                  storm = std::thread([&storming] {
                    while (storming) {
                      ::kill(::getpid(), SIGUSR2);
                      std::this_thread::sleep_for(100us);
                    }
                  });
                }
                break;
              default:
                break;
            }
          }
        }
        for (std::size_t i = 0; i < p.samples; ++i) {
          REQUIRE(seen[i] == 1, "epoch ", epoch, ": index ", i, " delivered ", seen[i], " times");
        }
      }
    } catch (const WorkerDiedError& e) {
      outcome = std::string("WorkerDiedError: ") + e.what();
    } catch (const TimeoutError& e) {
      outcome = std::string("TimeoutError: ") + e.what();
    } catch (const SharedMemoryError& e) {
      outcome = std::string("SharedMemoryError: ") + e.what();
    } catch (const Error& e) {
      outcome = std::string("ferry::Error: ") + e.what();
    } catch (const std::system_error& e) {
      outcome = std::string("std::system_error: ") + e.what();
    }
    storming = false;
    if (storm.joinable()) storm.join();
  }
  // What each fault allows besides exactly-once delivery.
  auto is = [&](const char* prefix) { return outcome.rfind(prefix, 0) == 0; };
  bool allowed = is("exactly once");
  switch (p.fault) {
    case Fault::kSigkill:
    case Fault::kSigsegv:
      // Raise: the death ends the epoch (or goes unseen if the worker had nothing left to do).
      // Respawn within its budget: nothing is lost.
      allowed = allowed || (!p.respawn && is("WorkerDiedError"));
      break;
    case Fault::kExitInWorker:
      // The sample kills every worker that loads it: raise ends the epoch, respawn spends its
      // budget first. Delivery cannot be complete.
      allowed = is("WorkerDiedError");
      break;
    case Fault::kStopForGood:
      allowed = allowed || is("TimeoutError");
      break;
    case Fault::kShmEnospc:
      allowed = allowed || is("SharedMemoryError");
      break;
    case Fault::kFewDescriptors:
      allowed = allowed || ((is("ferry::Error") || is("std::system_error") ||
                             is("WorkerDiedError") || is("SharedMemoryError")) &&
                            (outcome.find("descriptor") != std::string::npos ||
                             outcome.find("Too many open files") != std::string::npos ||
                             outcome.find("EMFILE") != std::string::npos));
      break;
    default:
      break;
  }
  REQUIRE(allowed, "outcome not allowed for fault ", name(p.fault), ": ", outcome);
  if (p.fault == Fault::kFewDescriptors) {
    rlimit limit{};
    ::getrlimit(RLIMIT_NOFILE, &limit);
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
  const std::string leaks = testing::wait_for_no_leaks(before, 3s);
  REQUIRE(leaks.empty(), "left behind: ", leaks);
  std::printf("chaos %s: %s\n", name(p.fault), outcome.substr(0, 160).c_str());
  return 0;
}

std::uint64_t env_number(const char* name, std::uint64_t fallback) {
  const char* text = std::getenv(name);
  return text != nullptr && *text != '\0' ? std::strtoull(text, nullptr, 10) : fallback;
}

// The runs are split into five blocks (five ctest entries, each under ctest's time limit).
constexpr int kBlocks = 5;
class Chaos : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(Blocks, Chaos, ::testing::Range(0, kBlocks));

TEST_P(Chaos, SeededRunsEndExactlyOnceOrWithTheirTypedErrorAndLeaveNothing) {
  const std::uint64_t all = env_number("FERRY_CHAOS_RUNS", 50);
  const std::uint64_t per_block = (all + kBlocks - 1) / kBlocks;
  const std::uint64_t first =
      env_number("FERRY_CHAOS_SEED", 1) + static_cast<std::uint64_t>(GetParam()) * per_block;
  const std::uint64_t done_before = static_cast<std::uint64_t>(GetParam()) * per_block;
  const std::uint64_t runs = done_before >= all ? 0 : std::min(per_block, all - done_before);
  if (runs == 0) GTEST_SKIP() << "no runs left for this block";
  std::size_t failures = 0;
  std::vector<int> per_fault(static_cast<int>(Fault::kCount), 0);
  const auto start = std::chrono::steady_clock::now();
  for (std::uint64_t seed = first; seed < first + runs; ++seed) {
    const Plan plan = make_plan(seed);
    ++per_fault[static_cast<int>(plan.fault)];
    const std::string pid_file =
        "/tmp/ferry-chaos-" + std::to_string(::getpid()) + "-" + std::to_string(seed);
    const auto r = testing::run_in_child([&] { return chaos_run(plan, pid_file); }, 90s);
    bool ok = !r.timed_out;
    std::string why = r.timed_out ? "hung past 90 s" : "";
    if (plan.fault == Fault::kKillMain) {
      // The child died by its own SIGKILL; its workers must follow within a second or two.
      ok = ok && r.signal == SIGKILL;
      int worker = 0;
      std::ifstream(pid_file) >> worker;
      std::remove(pid_file.c_str());
      if (worker <= 0) {
        ok = ok && r.exit_code == 0;  // the fault's batch never came (an error ended it first)
      } else {
        bool gone = false;
        for (int i = 0; i < 300 && !gone; ++i) {
          gone = !testing::pid_alive(worker);
          if (!gone) std::this_thread::sleep_for(10ms);
        }
        if (!gone) {
          ok = false;
          why = "worker " + std::to_string(worker) + " outlived its killed main process by 3 s";
          ::kill(worker, SIGKILL);
        }
      }
    } else {
      ok = ok && r.exit_code == 0 && r.signal == 0;
    }
    const auto outcome_at = r.output.rfind("chaos ");
    std::printf("  %s -> %s", plan.describe().c_str(),
                ok && outcome_at != std::string::npos ? r.output.substr(outcome_at).c_str()
                                                      : (ok ? "killed as planned\n" : "FAILED\n"));
    if (!ok) {
      ++failures;
      ADD_FAILURE() << "chaos run failed: " << plan.describe() << "\n  " << why
                    << "\n  replay: FERRY_CHAOS_SEED=" << seed
                    << " FERRY_CHAOS_RUNS=1 build/tests/ferry_chaos_tests\n  exit " << r.exit_code
                    << ", signal " << r.signal << "; output:\n"
                    << r.output;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string mix;
  for (int f = 0; f < static_cast<int>(Fault::kCount); ++f) {
    mix += std::string(f ? ", " : "") + name(static_cast<Fault>(f)) + " " +
           std::to_string(per_fault[f]);
  }
  std::printf("chaos: %llu runs from seed %llu in %.1f s, %zu failed (faults: %s)\n",
              static_cast<unsigned long long>(runs), static_cast<unsigned long long>(first),
              seconds, failures, mix.c_str());
}

}  // namespace
}  // namespace ferry
