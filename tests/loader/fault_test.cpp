// RELIABILITY.md's failure scenarios. Each test runs in its own forked child with a deadline
// (support/process_harness.h), so a hang fails the test instead of stalling CI; inside the child,
// REQUIRE prints what failed and exits non-zero.

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/data_loader.h"
#include "ferry/error.h"
#include "ferry/registry.h"

#include "ipc/cgroup.h"
#include "ipc/shared_memory.h"
#include "support/child_test.h"
#include "support/datasets.h"
#include "support/ledger.h"
#include "support/process_harness.h"
#include "support/registered.h"
#include "support/start_methods.h"
#include "support/timing.h"
#include "workers/fetch.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::FaultyDataset;
using testing::LedgerDataset;
using testing::RangeDataset;

using testing::in_child;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

using testing::time_scale;

// Starts ferry's forker thread, so that leak baselines taken afterwards include it.
void warm_up() {
  DataLoader loader(testing::range(1), {.num_workers = 1});
  for (auto& batch : loader) (void)batch;
}

FERRY_EACH_START_METHOD(WorkerDeath);
FERRY_EACH_START_METHOD(Resources);
FERRY_EACH_START_METHOD(Timeout);
FERRY_EACH_START_METHOD(MainProcessDeath);
FERRY_EACH_START_METHOD(Shutdown);
FERRY_EACH_START_METHOD(Seeding);
FERRY_EACH_START_METHOD(ForkSafety);
FERRY_EACH_START_METHOD(Diagnostics);

// Iterates until a WorkerDiedError; returns it (or fails the child).
template <class Check>
int expect_death(FaultyDataset::Fault fault, Check&& check) {
  warm_up();
  const auto before = testing::snapshot();
  {
    DataLoader loader(testing::faulty(64, 21, fault), {.batch_size = 4, .num_workers = 2});
    bool died = false;
    try {
      for (auto& batch : loader) (void)batch;
    } catch (const WorkerDiedError& e) {
      died = true;
      if (int rc = check(e); rc != 0) return rc;
    }
    REQUIRE(died, "no WorkerDiedError");
  }
  const std::string leaks = testing::wait_for_no_leaks(before, 2s);
  REQUIRE(leaks.empty(), leaks);
  return 0;
}

TEST_P(WorkerDeath, SegfaultIsReportedWithSignalPidAndIndices) {  // row 1
  in_child([] {
    return expect_death(FaultyDataset::Fault::kSegfault, [](const WorkerDiedError& e) {
      const std::string what = e.what();
      REQUIRE(e.signal() == SIGSEGV, what);
      REQUIRE(what.find("SIGSEGV") != std::string::npos, what);
      REQUIRE(what.find("(pid " + std::to_string(e.failure().pid)) != std::string::npos, what);
      REQUIRE(what.find("indices 20, 21, 22, 23") != std::string::npos, what);
      // The sample it was loading, from its status page, and what it said last.
      REQUIRE(what.find("while loading index 21") != std::string::npos, what);
      REQUIRE(e.failure().index == 21, what);
      REQUIRE(what.find("its last lines on stderr:\n  | test.faulty: index 21 is bad") !=
                  std::string::npos,
              what);
      return 0;
    });
  });
}

TEST_P(WorkerDeath, ACrashingWorkerSaysSoOnStderr) {  // row 1
  const auto r = testing::run_in_child(
      [] {
        DataLoader loader(testing::faulty(8, 1, FaultyDataset::Fault::kSegfault),
                          {.batch_size = 2, .num_workers = 1});
        try {
          for (auto& batch : loader) (void)batch;
        } catch (const WorkerDiedError&) {
          return 0;
        }
        return 1;
      },
      60s);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr("ferry: DataLoader worker 0 (pid "));
  EXPECT_THAT(r.output, ::testing::HasSubstr(") got a fatal SIGSEGV while loading index 1"));
  EXPECT_THAT(r.output, ::testing::HasSubstr("test.faulty: index 1 is bad"));
}

// Issue 16: SIGUSR1 to the main process makes every worker print where it is (its batch, the
// sample in hand, a stack), and the epoch goes on: every index once, in order.
TEST_P(Diagnostics, SigusrOneMakesEveryWorkerSayWhereItIsWithoutStoppingIt) {
  const StartMethod method = GetParam();
  const auto r = testing::run_in_child(
      [method] {
        // Up to 20 ms a sample: the loop outruns the workers, which are always loading.
        DataLoader loader(testing::ledger(48, 64, 20000),
                          {.batch_size = 4, .num_workers = 2, .start_method = method});
        std::int64_t expected = 0;
        int batches = 0;
        for (auto& batch : loader) {
          if (batches++ == 2) REQUIRE(::kill(::getpid(), SIGUSR1) == 0);
          for (const std::int64_t i : batch.indices()) REQUIRE(i == expected++, "index ", i);
        }
        REQUIRE(expected == 48, expected);
        return 0;
      },
      60s);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("asked 2 DataLoader workers to print where they are"));
  for (const char* worker :
       {"ferry: DataLoader worker 0 (pid ", "ferry: DataLoader worker 1 (pid "})
    EXPECT_THAT(r.output, HasSubstr(worker));
  EXPECT_THAT(r.output, HasSubstr("), on SIGUSR1: "));  // busy or waiting: timing decides
  EXPECT_THAT(r.output, HasSubstr("stack of the thread that took the signal:\n"));
}

// Sample 9 takes 2 s; the others none.
class SlowNine : public Dataset {
 public:
  std::size_t size() const override { return 16; }
  Example get(std::size_t index, SampleContext&) const override {
    if (index == 9) std::this_thread::sleep_for(2s);
    return {{"x", static_cast<std::int64_t>(index)}};
  }
};

// The report names the sample in hand: worker 0 loads batch 2 (8 to 11) right after batch 0,
// and is inside sample 9 for 2 s when the loop asks, 300 ms after batch 0.
TEST(DiagnosticsFork, TheReportNamesTheSampleInHand) {
  const auto r = testing::run_in_child(
      [] {
        DataLoader loader(std::make_shared<SlowNine>(),
                          {.batch_size = 4, .num_workers = 2, .start_method = StartMethod::kFork});
        int batches = 0;
        for (auto& batch : loader) {
          (void)batch;
          if (batches++ == 0) {
            std::this_thread::sleep_for(300ms);
            REQUIRE(::kill(::getpid(), SIGUSR1) == 0);
          }
        }
        REQUIRE(batches == 4, batches);
        return 0;
      },
      60s);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("on SIGUSR1: epoch 0, batch 2, loading index 9;"));
}

// An application that handles SIGUSR1 itself keeps it; ferry::report_workers() does the same
// from its handler.
TEST(DiagnosticsFork, AnApplicationsOwnSigusrOneHandlerIsLeftAlone) {
  const auto r = testing::run_in_child(
      [] {
        static volatile sig_atomic_t got = 0;
        ::signal(SIGUSR1, [](int) {
          got = 1;
          report_workers();
        });
        DataLoader loader(testing::ledger(24, 64, 20000), {.batch_size = 4, .num_workers = 1});
        int batches = 0;
        for (auto& batch : loader) {
          (void)batch;
          if (batches++ == 1) REQUIRE(::kill(::getpid(), SIGUSR1) == 0);
        }
        REQUIRE(got == 1, "the application's handler did not run");
        return 0;
      },
      60s);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("asked 1 DataLoader worker to print where they are"));
  EXPECT_THAT(r.output, HasSubstr("ferry: DataLoader worker 0 (pid "));
}

TEST_P(Resources, EveryDescriptorTheLoaderOpensIsCloseOnExec) {
  in_child([] {
    const auto before = testing::snapshot();
    DataLoader loader(testing::ledger(100, 4096),
                      {.batch_size = 4, .num_workers = 2, .persistent_workers = true});
    auto it = loader.begin();
    ++it;
    for (const auto& entry : testing::snapshot().fds) {
      if (std::find(before.fds.begin(), before.fds.end(), entry) != before.fds.end()) continue;
      const int fd = std::stoi(entry.substr(0, entry.find(' ')));
      const int flags = ::fcntl(fd, F_GETFD);
      if (flags < 0) continue;  // the snapshot's own directory stream, closed since
      REQUIRE(flags & FD_CLOEXEC, "fd ", entry, " is not close-on-exec");
    }
    return 0;
  });
}

TEST_P(WorkerDeath, ExitCodesAbortTerminateAndQuickExit) {  // row 3
  struct Case {
    FaultyDataset::Fault fault;
    int code;
    int signal;
  };
  for (const Case c :
       {Case{FaultyDataset::Fault::kExit3, 3, 0}, Case{FaultyDataset::Fault::kAbort, -1, SIGABRT},
        Case{FaultyDataset::Fault::kTerminate, -1, SIGABRT},
        Case{FaultyDataset::Fault::kQuickExit, 4, 0}}) {
    in_child([c] {
      return expect_death(c.fault, [c](const WorkerDiedError& e) {
        REQUIRE(e.exit_code() == c.code && e.signal() == c.signal, e.what());
        const std::string expected =
            c.signal != 0 ? "SIGABRT" : "exited with code " + std::to_string(c.code);
        REQUIRE(std::string(e.what()).find(expected) != std::string::npos, e.what());
        // Row 3: the worker's last line on stderr, which ferry relayed and kept.
        const auto& tail = e.failure().stderr_tail;
        REQUIRE(std::find(tail.begin(), tail.end(), "test.faulty: index 21 is bad") != tail.end(),
                e.what());
        REQUIRE(std::string(e.what()).find("| test.faulty: index 21 is bad") != std::string::npos,
                e.what());
        // An exit inside Dataset::get, one sample in hand: that sample is named.
        REQUIRE(e.failure().index == 21, e.what());
        return 0;
      });
    });
  }
}

TEST_P(WorkerDeath, KilledAtRandomMomentsIsAlwaysReportedNeverHangsNeverTorn) {  // rows 2, 13
  std::mt19937 rng(20261121);
  // What is drawn is the moment of the kill against the parent's state, which is the same code
  // whatever started the worker; spawn pays a program start per worker, so it draws fewer.
  const int rounds = GetParam() == StartMethod::kSpawn ? 8 : 20;
  for (int round = 0; round < rounds; ++round) {
    const int delay_us = static_cast<int>(rng() % 20000);
    in_child([delay_us] {
      warm_up();
      const auto before = testing::snapshot();
      {
        DataLoader loader(testing::ledger(400, 4096, 500),
                          {.batch_size = 4, .num_workers = 2, .prefetch_factor = 3});
        auto it = loader.begin();
        const auto victim = static_cast<pid_t>((*it)["pid"][0].item<std::int64_t>());
        std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
        ::kill(victim, SIGKILL);
        const auto killed = Clock::now();
        bool died = false;
        try {
          for (; it != loader.end(); ++it) {
            for (std::size_t r = 0; r < it->size(); ++r) {
              REQUIRE(LedgerDataset::check_row((*it)["payload"], static_cast<std::int64_t>(r),
                                               it->indices()[r], 0) == "");
            }
          }
        } catch (const WorkerDiedError& e) {
          died = true;
          REQUIRE(e.signal() == SIGKILL, e.what());
          REQUIRE(e.failure().pid == victim, e.what());
          REQUIRE(std::string(e.what()).find("out-of-memory") != std::string::npos, e.what());
          // Where the memory cgroup can be read, ferry knows this was not its OOM killer.
          const auto cgroup = ipc::MemoryCgroup::of_self();
          REQUIRE(
              !cgroup || !cgroup->oom_kills() ||
                  std::string(e.what()).find("counted no out-of-memory kill") != std::string::npos,
              e.what());
          REQUIRE(seconds_since(killed) < 1.0 * time_scale(), "detected after ",
                  seconds_since(killed), " s");
        }
        REQUIRE(died, "the kill went unnoticed");
      }
      const std::string leaks = testing::wait_for_no_leaks(before, 2s);
      REQUIRE(leaks.empty(), leaks);
      return 0;
    });
  }
}

TEST(WorkerInit, FailingWorkerInitFnIsRaisedAtTheFirstBatch) {  // row 5
  in_child([] {
    warm_up();
    const auto before = testing::snapshot();
    {
      DataLoader loader(testing::range(10),
                        {.batch_size = 2, .num_workers = 2, .worker_init_fn = [](std::size_t id) {
                           if (id == 1) throw std::invalid_argument("no GPU for worker 1");
                         }});
      bool raised = false;
      try {
        for (auto& batch : loader) (void)batch;
      } catch (const WorkerError& e) {
        raised = true;
        const std::string what = e.what();
        REQUIRE(what.find("worker_init_fn(1) failed") != std::string::npos, what);
        REQUIRE(what.find("no GPU for worker 1") != std::string::npos, what);
        REQUIRE(e.failure().type_name == "std::invalid_argument", e.failure().type_name);
      }
      REQUIRE(raised, "worker_init_fn's error was lost");
    }
    const std::string leaks = testing::wait_for_no_leaks(before, 2s);
    REQUIRE(leaks.empty(), leaks);
    return 0;
  });
}

TEST(WorkerInit, FailingIterableStreamIsRaisedAtTheFirstBatch) {  // row 5
  class Broken : public IterableDataset {
   public:
    std::unique_ptr<ExampleStream> stream(SampleContext&) const override {
      throw std::runtime_error("cannot open shard");
    }
  };
  in_child([] {
    DataLoader loader(std::make_shared<Broken>(), {.num_workers = 2});
    try {
      for (auto& batch : loader) (void)batch;
    } catch (const WorkerError& e) {
      REQUIRE(std::string(e.what()).find("cannot open shard") != std::string::npos, e.what());
      return 0;
    }
    std::fprintf(stderr, "no error\n");
    return 1;
  });
}

TEST_P(Timeout, AHungWorkerTimesOutIsNamedAndKilled) {  // row 6
  in_child([] {
    warm_up();
    const auto before = testing::snapshot();
    {
      DataLoader loader(testing::faulty(40, 9, FaultyDataset::Fault::kHang),
                        {.batch_size = 4, .num_workers = 2, .timeout = 500ms});
      // The timeout counts from the moment the loop asks for the batch that never comes (the
      // workers' start-up is not part of it): measured from there, not from the loop's start.
      auto asked = Clock::now();
      try {
        for (auto& batch : loader) {
          (void)batch;
          asked = Clock::now();
        }
        REQUIRE(false, "no timeout");
      } catch (const TimeoutError& e) {
        const double took = seconds_since(asked);
        const std::string what = e.what();
        REQUIRE(took >= 0.45 && took < 0.5 + 1.5 * time_scale(), "timed out after ", took, " s");
        REQUIRE(what.find("holds batch 2 of epoch 0 (indices 8, 9, 10, 11)") != std::string::npos,
                what);
        REQUIRE(what.find("was killed") != std::string::npos, what);
        REQUIRE(!testing::pid_alive(e.failure().pid), "the hung worker is still alive");
      }
      const auto stop = Clock::now();
      loader = DataLoader(testing::range(1));  // destroys the old loader
      REQUIRE(seconds_since(stop) < 2.0 * time_scale(), "shutdown took ", seconds_since(stop),
              " s");
    }
    const std::string leaks = testing::wait_for_no_leaks(before, 2s);
    REQUIRE(leaks.empty(), leaks);
    return 0;
  });
}

TEST_P(Timeout, ASampleThatOutrunsSampleTimeoutStopsItsWorker) {  // row 6, per-sample watchdog
  const auto r = testing::run_in_child(
      [] {
        DataLoader loader(testing::faulty(40, 9, FaultyDataset::Fault::kHang),
                          {.batch_size = 4, .num_workers = 2, .sample_timeout = 300ms});
        // The worker starts index 9 right after its first batch, so before the loop asks for
        // batch 2: from then, the watchdog's 0.3 s and the report (start-up not included).
        auto asked = Clock::now();
        try {
          for (auto& batch : loader) {
            (void)batch;
            asked = Clock::now();
          }
        } catch (const TimeoutError& e) {
          const std::string what = e.what();
          REQUIRE(seconds_since(asked) < 0.3 + 1.7 * time_scale(), "took ", seconds_since(asked),
                  " s");
          REQUIRE(what.find("more than sample_timeout (0.3 s) on one sample of batch 2") !=
                      std::string::npos,
                  what);
          REQUIRE(what.find("indices 8, 9, 10, 11") != std::string::npos, what);
          REQUIRE(!testing::pid_alive(e.failure().pid), "the worker is still alive");
          return 0;
        }
        std::fprintf(stderr, "no TimeoutError\n");
        return 1;
      },
      60s);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr("exceeded sample_timeout loading index 9"));
}

TEST_P(Timeout, SampleTimeoutLeavesFastSamplesAlone) {
  in_child([] {
    DataLoader loader(testing::ledger(200, 64, 2000),
                      {.batch_size = 4, .num_workers = 2, .sample_timeout = 200ms});
    std::size_t n = 0;
    for (auto& batch : loader) n += batch.size();
    REQUIRE(n == 200, n);
    return 0;
  });
}

TEST_P(Timeout, AStoppedWorkerTimesOutAndShutdownStillFinishes) {  // row 6, SIGSTOP
  in_child([] {
    DataLoader loader(testing::ledger(400, 64, 2000),
                      {.batch_size = 2, .num_workers = 2, .timeout = 400ms});
    auto it = loader.begin();
    const auto victim = static_cast<pid_t>((*it)["pid"][0].item<std::int64_t>());
    ::kill(victim, SIGSTOP);
    try {
      for (; it != loader.end(); ++it) (void)*it;
      REQUIRE(false, "no timeout");
    } catch (const TimeoutError& e) {
      REQUIRE(e.failure().pid == victim, e.what());
    }
    const auto stop = Clock::now();
    { DataLoader gone = std::move(loader); }
    REQUIRE(seconds_since(stop) < 2.0 * time_scale(), "shutdown took ", seconds_since(stop), " s");
    REQUIRE(!testing::pid_alive(victim), "the stopped worker survived");
    return 0;
  });
}

// Forks a "training process" that starts a loader, reports its worker pids on a pipe, then
// runs `then`. Returns (training pid, worker pids).
std::pair<pid_t, std::vector<pid_t>> start_training(std::size_t workers,
                                                    const std::function<void()>& then) {
  int fds[2];
  if (::pipe(fds) != 0) return {-1, {}};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    DataLoader loader(testing::ledger(100000, 64, 1000),
                      {.batch_size = 1, .num_workers = workers, .persistent_workers = true});
    std::set<std::int64_t> pids;
    auto it = loader.begin();
    while (pids.size() < workers) {
      pids.insert((*it)["pid"][0].item<std::int64_t>());
      ++it;
    }
    for (auto p : pids) {
      const int v = static_cast<int>(p);
      (void)!::write(fds[1], &v, sizeof v);
    }
    ::close(fds[1]);
    then();
    for (; it != loader.end(); ++it) (void)*it;  // keep iterating until killed
    ::_exit(0);
  }
  ::close(fds[1]);
  // Read exactly one pid per worker: the workers hold the pipe's write end too, so waiting for
  // EOF would wait for the whole training run.
  std::vector<pid_t> workers_pids;
  int v;
  while (workers_pids.size() < workers && ::read(fds[0], &v, sizeof v) == sizeof v) {
    workers_pids.push_back(v);
  }
  ::close(fds[0]);
  return {pid, workers_pids};
}

bool all_dead_within(const std::vector<pid_t>& pids, std::chrono::milliseconds within) {
  const auto deadline = Clock::now() + within;
  for (;;) {
    bool any = false;
    for (pid_t p : pids) any = any || testing::pid_alive(p);
    if (!any) return true;
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
}

TEST_P(MainProcessDeath, WorkersDieWithinASecondOfASigkilledMain) {  // row 7
  in_child([] {
    const auto shm_before = testing::snapshot().dev_shm;
    auto [main_pid, workers] = start_training(3, [] {});
    REQUIRE(workers.size() == 3, "got ", workers.size(), " worker pids");
    ::kill(main_pid, SIGKILL);
    const auto killed = Clock::now();
    ::waitpid(main_pid, nullptr, 0);
    REQUIRE(all_dead_within(workers, 1s), "a worker outlived its killed parent");
    REQUIRE(seconds_since(killed) < 1.0);
    REQUIRE(testing::snapshot().dev_shm == shm_before, "/dev/shm changed");
    return 0;
  });
}

TEST_P(MainProcessDeath, CtrlCToTheProcessGroupAndSigtermToMain) {  // row 8 (a), (b), (d)
  for (const int sig : {SIGINT, SIGTERM}) {
    in_child([sig] {
      auto [main_pid, workers] = start_training(2, [] {});
      REQUIRE(workers.size() == 2);
      if (sig == SIGINT) {
        // Ctrl-C reaches the whole group: workers ignore it; main takes the default action.
        ::signal(SIGINT, SIG_IGN);
        ::kill(0, SIGINT);
      } else {
        ::kill(main_pid, SIGTERM);
      }
      int status = 0;
      ::waitpid(main_pid, &status, 0);
      REQUIRE(WIFSIGNALED(status) && WTERMSIG(status) == sig, "main ended with status ", status);
      REQUIRE(all_dead_within(workers, 1s), "a worker outlived main");
      return 0;
    });
  }
}

TEST_P(MainProcessDeath, AnApplicationThatHandlesSigintBreaksAndExitsCleanly) {  // row 8 (c)
  in_child([] {
    static std::atomic<bool> stop{false};
    struct sigaction sa {};
    sa.sa_handler = [](int) { stop = true; };
    ::sigaction(SIGINT, &sa, nullptr);
    warm_up();
    const auto before = testing::snapshot();
    std::thread ctrl_c([] {
      std::this_thread::sleep_for(200ms);
      ::kill(0, SIGINT);  // the whole group, workers included
    });
    {
      DataLoader loader(testing::ledger(100000, 64, 500), {.batch_size = 2, .num_workers = 2});
      for (auto& batch : loader) {
        (void)batch;
        if (stop) break;
      }
    }
    ctrl_c.join();
    REQUIRE(stop.load(), "the handler never ran");
    const std::string leaks = testing::wait_for_no_leaks(before, 2s);
    REQUIRE(leaks.empty(), leaks);
    return 0;
  });
}

TEST_P(Shutdown, DestroyingAtEveryStageIsBoundedAndLeavesNothing) {  // rows 9, 10, 11
  enum Stage { kConstructed, kFirstBatch, kPrefetchFull, kEndOfEpoch, kAfterError, kThrowInLoop };
  for (const Stage stage :
       {kConstructed, kFirstBatch, kPrefetchFull, kEndOfEpoch, kAfterError, kThrowInLoop}) {
    for (const bool persistent : {false, true}) {
      // Three workers give every stage a pool with more than one batch in flight; spawn, which
      // starts a program per worker, checks the same with two.
      const std::size_t workers = GetParam() == StartMethod::kSpawn ? 2 : 3;
      in_child([stage, persistent, workers] {
        warm_up();
        const auto before = testing::snapshot();
        Clock::time_point start;
        {
          auto dataset = stage == kAfterError
                             ? std::shared_ptr<const Dataset>(testing::failing(40, 0, 40))
                             : testing::ledger(40, 1 << 16, stage == kPrefetchFull ? 0 : 300);
          DataLoader loader(dataset, {.batch_size = 2,
                                      .num_workers = workers,
                                      .prefetch_factor = 4,
                                      .persistent_workers = persistent});
          if (stage == kFirstBatch || stage == kPrefetchFull || stage == kAfterError) {
            auto it = loader.begin();
            if (stage == kPrefetchFull) std::this_thread::sleep_for(300ms);  // every slot full
            try {
              (void)*it;
            } catch (const WorkerError&) {
              REQUIRE(stage == kAfterError);
            }
            start = Clock::now();
            // `it` and `loader` die here, mid-epoch
          } else if (stage == kEndOfEpoch) {
            for (auto& batch : loader) (void)batch;
            start = Clock::now();
          } else if (stage == kThrowInLoop) {
            try {
              for (auto& batch : loader) {
                (void)batch;
                throw std::runtime_error("loss is NaN");
              }
            } catch (const std::runtime_error&) {
            }
          }
          if (stage != kFirstBatch && stage != kPrefetchFull && stage != kAfterError)
            start = Clock::now();
        }
        REQUIRE(seconds_since(start) < 2.0, "stage ", stage, ": destruction took ",
                seconds_since(start), " s");
        const std::string leaks = testing::wait_for_no_leaks(before, 2s);
        REQUIRE(leaks.empty(), "stage ", stage, ": ", leaks);
        return 0;
      });
    }
  }
}

TEST_P(Shutdown, DestroyingTheLoaderWakesAThreadBlockedInNext) {  // row 11
  in_child(
      [] {
        auto loader =
            std::make_unique<DataLoader>(testing::faulty(40, 0, FaultyDataset::Fault::kHang),
                                         DataLoaderOptions{.batch_size = 2, .num_workers = 1});
        std::atomic<bool> closed_seen{false};
        Clock::time_point woke;
        // The thread gets the loader itself, not the unique_ptr that this thread resets.
        DataLoader* const shared = loader.get();
        std::thread consumer([&closed_seen, &woke, shared] {
          auto it = shared->begin();  // batch 0 never comes: blocks in next()
          woke = Clock::now();
          try {
            (void)*it;
          } catch (const LoaderClosed&) {
            closed_seen = true;
          }
        });
        std::this_thread::sleep_for(300ms);
        const auto start = Clock::now();
        loader.reset();
        consumer.join();
        REQUIRE(closed_seen.load(), "the blocked consumer did not get LoaderClosed");
        REQUIRE(seconds_since(start) < 2.0, "closing took ", seconds_since(start), " s");
        REQUIRE(std::chrono::duration<double>(woke - start).count() < 2.0);
        return 0;
      },
      60s, /*workers_may_be_killed=*/true);
}

// A ledger of 400 samples that takes `delay` for each one.
class SlowLedger : public LedgerDataset {
 public:
  explicit SlowLedger(std::chrono::milliseconds delay) : LedgerDataset(400, 64), delay_(delay) {}
  Example get(std::size_t i, SampleContext& ctx) const override {
    std::this_thread::sleep_for(delay_);
    return LedgerDataset::get(i, ctx);
  }

 private:
  std::chrono::milliseconds delay_;
};

TEST(ShutdownFork, WorkersAskedToStopLeaveQueuedWorkUndone) {  // row 10: exit 0, promptly
  in_child([] {
    // 2 workers x 4 tasks x 8 samples x 40 ms: over a second of queued work each.
    auto loader = std::make_unique<DataLoader>(
        std::make_shared<SlowLedger>(40ms),
        DataLoaderOptions{.batch_size = 8, .num_workers = 2, .prefetch_factor = 4});
    auto it = loader->begin();
    const auto start = Clock::now();
    it = DataLoader::Iterator();
    loader.reset();
    REQUIRE(seconds_since(start) < 0.5, "stopping took ", seconds_since(start), " s");
    return 0;
  });  // and in_child checks that no worker had to be killed
}

TEST(ShutdownFork, WorkersLoadingWithSeveralThreadsStopWhenAskedToo) {  // row 10
  if (!workers::parallel_fetch_available()) GTEST_SKIP() << "a build without TBB";
  in_child([] {
    // A batch of 64 samples x 50 ms over 2 threads: 1.6 s each, longer than the shutdown grace;
    // stopped after the samples in hand, no worker is killed.
    auto loader = std::make_unique<DataLoader>(
        std::make_shared<SlowLedger>(50ms),
        DataLoaderOptions{.batch_size = 64, .num_workers = 2, .worker_threads = 2});
    auto it = loader->begin();
    (void)it;
    std::this_thread::sleep_for(200ms);
    const auto start = Clock::now();
    loader.reset();
    REQUIRE(seconds_since(start) < 0.9, "stopping took ", seconds_since(start), " s");
    return 0;
  });  // and in_child checks that no worker had to be killed
}

TEST_P(Shutdown, SeveralStuckPoolsShareOneGracePeriod) {
  // Two iterators of one loader (each with its own workers), each with a worker stuck in get():
  // destroying the loader waits one grace period for all of them, not one each.
  in_child(
      [] {
        auto loader = std::make_unique<DataLoader>(
            testing::faulty(40, 5, FaultyDataset::Fault::kHang),
            DataLoaderOptions{.batch_size = 1, .num_workers = 1, .prefetch_factor = 8});
        auto first = loader->begin();   // its worker runs ahead into index 5 and hangs there
        auto second = loader->begin();  // and so does this one's
        std::this_thread::sleep_for(200ms);
        const auto start = Clock::now();
        loader.reset();
        REQUIRE(seconds_since(start) < 1.6, "closing took ", seconds_since(start), " s");
        return 0;
      },
      60s, /*workers_may_be_killed=*/true);
}

TEST_P(Resources, DescriptorsStayFixedUnderALowLimitAndHeldBatches) {  // row 19
  in_child(
      [] {
        warm_up();
        const auto base = testing::snapshot().fds.size();
        rlimit limit{base + 32, base + 32};
        REQUIRE(::setrlimit(RLIMIT_NOFILE, &limit) == 0);
        DataLoader loader(testing::ledger(10000, 16), {.batch_size = 1, .num_workers = 2});
        std::vector<Batch> held;
        std::size_t n = 0;
        for (auto& batch : loader) {
          if (held.size() < 500) held.push_back(batch);  // held batches cost no descriptors
          ++n;
        }
        REQUIRE(n == 10000, n);
        for (const Batch& b : held) {
          REQUIRE(LedgerDataset::check_row(b["payload"], 0, b.indices()[0], 0) == "");
        }
        return 0;
      },
      120s);
}

TEST(ResourcesFork, ABatchThatCannotGetSharedMemoryIsAClearErrorNeverSigbus) {  // row 18
  in_child([] {
    ipc::fault::fail_next_allocations(1);  // inherited by the workers forked next
    DataLoader loader(testing::ledger(8, 1 << 20), {.batch_size = 2, .num_workers = 1});
    auto it = loader.begin();
    try {
      (void)*it;
      REQUIRE(false, "no error");
    } catch (const SharedMemoryError& e) {
      const std::string what = e.what();
      // memfd pages count against memory (and the memory cgroup), not /dev/shm.
      REQUIRE(what.find("cannot reserve 2.0 MiB") != std::string::npos, what);
      REQUIRE(what.find("of memory available") != std::string::npos, what);
      REQUIRE(what.find("/dev/shm") == std::string::npos, what);
      REQUIRE(what.find("Lower batch_size") != std::string::npos, what);
    }
    ++it;  // the next batch gets its memory
    REQUIRE(it->size() == 2);
    return 0;
  });
}

TEST_P(Resources, AWorkerHoldsOnlyItsOwnChannels) {  // row 26: no worker keeps another's pipes
  in_child([] {
    auto count = [](pid_t pid, const std::string& kind) {
      int n = 0;
      for (int fd : testing::harness_internal::numeric_entries(
               ("/proc/" + std::to_string(pid) + "/fd").c_str())) {
        char target[256];
        const auto len =
            ::readlink(("/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd)).c_str(),
                       target, sizeof target - 1);
        if (len > 0 && std::string(target, static_cast<std::size_t>(len)).rfind(kind, 0) == 0) ++n;
      }
      return n;
    };
    auto count_sockets = [&](pid_t pid) { return count(pid, "socket:"); };
    DataLoader a(testing::ledger(100),
                 {.batch_size = 1, .num_workers = 2, .persistent_workers = true});
    DataLoader b(testing::ledger(100),
                 {.batch_size = 1, .num_workers = 2, .persistent_workers = true});
    auto ia = a.begin();
    auto ib = b.begin();
    for (auto* it : {&ia, &ib}) {
      const auto pid = static_cast<pid_t>((**it)["pid"][0].item<std::int64_t>());
      REQUIRE(count_sockets(pid) == 2, "worker ", pid, " holds ", count_sockets(pid), " sockets");
      // Nor the pidfds of the workers forked before it.
      REQUIRE(count(pid, "anon_inode:[pidfd]") == 0, "worker ", pid, " holds ",
              count(pid, "anon_inode:[pidfd]"), " pidfds");
    }
    return 0;
  });
}

// Loads one sample that takes memory until something stops it.
class MemoryHog : public Dataset {
 public:
  std::size_t size() const override { return 1; }
  Example get(std::size_t, SampleContext&) const override {
    std::vector<std::unique_ptr<char[]>> blocks;
    for (int i = 0; i < 64; ++i) {  // 4 GiB at most
      blocks.emplace_back(new char[64 << 20]);
      std::memset(blocks.back().get(), i + 1, 64 << 20);
    }
    return {{"x", static_cast<std::int64_t>(blocks.size())}};
  }
};

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  return static_cast<bool>(out);
}

// Issue 16: a worker that the memory cgroup's OOM killer kills is said to be, with the limit.
// Runs in a memory cgroup of 256 MiB that the test makes under this process's own, where the
// machine allows it; skipped with the reason where it does not.
TEST(OomKill, AWorkerTheMemoryCgroupKillsIsSaidToBeWithTheLimit) {
  const auto self = ipc::MemoryCgroup::of_self();
  if (!self) GTEST_SKIP() << "no memory cgroup can be read here (/proc/self/cgroup, mountinfo)";
  const std::string dir = self->directory() + "/ferry-oom-test-" + std::to_string(::getpid());
  if (::mkdir(dir.c_str(), 0755) != 0) {
    GTEST_SKIP() << "cannot make a memory cgroup under " << self->directory() << ": "
                 << std::strerror(errno) << " (needs root, or a delegated cgroup)";
  }
  const ipc::MemoryCgroup cgroup(dir, self->v2());
  const std::string limit_file = dir + (self->v2() ? "/memory.max" : "/memory.limit_in_bytes");
  if (!write_file(limit_file, std::to_string(256 << 20)) || cgroup.limit_bytes() != (256u << 20)) {
    ::rmdir(dir.c_str());
    GTEST_SKIP() << "cannot set " << limit_file;
  }
  if (self->v2()) (void)write_file(dir + "/memory.swap.max", "0");
  const auto r = testing::run_in_child(
      [&] {
        REQUIRE(write_file(dir + "/cgroup.procs", std::to_string(::getpid())), "joining ", dir);
        DataLoader loader(std::make_shared<MemoryHog>(),
                          {.batch_size = 1,
                           .num_workers = 1,
                           // The worker, not this process, is the one the OOM killer picks.
                           .worker_init_fn = [](std::size_t) {
                             (void)write_file("/proc/self/oom_score_adj", "1000");
                           }});
        try {
          for (auto& batch : loader) (void)batch;
        } catch (const WorkerDiedError& e) {
          const std::string what = e.what();
          REQUIRE(e.signal() == SIGKILL, what);
          REQUIRE(
              what.find("the memory cgroup's out-of-memory killer killed it") != std::string::npos,
              what);
          REQUIRE(what.find("the cgroup's limit is 256 MiB") != std::string::npos, what);
          REQUIRE(what.find(cgroup.events_file()) != std::string::npos, what);
          return 0;
        }
        REQUIRE(false, "the worker was not killed: no WorkerDiedError");
        return 1;
      },
      120s);
  // The child has exited; the cgroup empties once the kernel has let go of it.
  for (int i = 0; i < 200 && ::rmdir(dir.c_str()) != 0 && errno == EBUSY; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(Soak, ResourcesStayConstantFromTheSecondEpochOn) {  // row 28, bounded for CI
  in_child(
      [] {
        DataLoader loader(testing::ledger(64, 1 << 14),
                          {.batch_size = 4, .num_workers = 2, .persistent_workers = true});
        std::optional<testing::ResourceSnapshot> at_epoch_2;
        for (int epoch = 0; epoch < 60; ++epoch) {
          for (auto& batch : loader) (void)batch;
          if (epoch == 2) at_epoch_2 = testing::snapshot();
          if (epoch > 2) {
            const std::string diff = testing::leak_diff(*at_epoch_2, testing::snapshot());
            REQUIRE(diff.empty(), "epoch ", epoch, ": ", diff);
          }
        }
        warm_up();
        const auto before = testing::snapshot();
        for (int cycle = 0; cycle < 100; ++cycle) {
          DataLoader transient(testing::ledger(8), {.batch_size = 4, .num_workers = 2});
          for (auto& batch : transient) (void)batch;
        }
        const std::string leaks = testing::wait_for_no_leaks(before, 2s);
        REQUIRE(leaks.empty(), "after 100 create/destroy cycles: ", leaks);
        return 0;
      },
      120s);
}

TEST_P(ForkSafety, WorkersRunAtenOpsAfterTheParentRanThreadedOnes) {  // rows 21, 23
  in_child(
      [] {
        // The parent runs LibTorch's intra-op pool (GNU OpenMP in Debian's build) and a
        // parallel_for, and another thread holds a lock while workers are forked.
        at::set_num_threads(4);
        auto a = torch::rand({512, 512});
        for (int i = 0; i < 5; ++i) a = torch::tanh(a.matmul(a));
        std::atomic<int> sum{0};
        at::parallel_for(0, 1 << 16, 1024,
                         [&](std::int64_t b, std::int64_t e) { sum += static_cast<int>(e - b); });
        REQUIRE(sum == 1 << 16);
        std::mutex held;
        std::atomic<bool> locked{false}, release{false};
        std::thread holder([&] {
          std::lock_guard<std::mutex> lock(held);
          locked = true;
          while (!release) std::this_thread::sleep_for(1ms);
        });
        while (!locked) std::this_thread::yield();
        DataLoader loader(Registry::global().make_dataset(Config::map({{"type", "test.convolve"}})),
                          {.batch_size = 4, .num_workers = 2});
        std::size_t n = 0;
        for (auto& batch : loader) {
          REQUIRE(batch["threads"].eq(1).all().item<bool>(),
                  "a worker runs more than one intra-op thread");
          n += batch.size();
        }
        release = true;
        holder.join();
        REQUIRE(n == 16, n);
        return 0;
      },
      60s);
}

TEST_P(Seeding, OutputIsIdenticalWhateverTheWorkerCountAndTiming) {  // row 29
  in_child([] {
    auto run = [](std::size_t workers) {
      DataLoader loader(testing::ledger(60, 32, 2000, 0, 10),
                        {.batch_size = 3, .shuffle = true, .num_workers = workers, .seed = 99});
      std::vector<torch::Tensor> noise;
      for (auto& batch : loader) noise.push_back(batch["noise"].clone());
      return torch::cat(noise);
    };
    const auto one = run(1);
    REQUIRE(one.equal(run(4)), "1 vs 4 workers differ");
    REQUIRE(one.equal(run(0)), "workers vs in-process differ");
    return 0;
  });
}

TEST(Prefetch, AtMostPrefetchFactorTasksPerWorkerAreInFlight) {  // row 30
  in_child([] {
    // Workers count the samples they load in memory shared with this process.
    auto* loaded = static_cast<std::atomic<int>*>(::mmap(nullptr, sizeof(std::atomic<int>),
                                                         PROT_READ | PROT_WRITE,
                                                         MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    new (loaded) std::atomic<int>(0);
    class Counting : public LedgerDataset {
     public:
      explicit Counting(std::atomic<int>* c) : LedgerDataset(1000, 8), c_(c) {}
      Example get(std::size_t i, SampleContext& ctx) const override {
        ++*c_;
        return LedgerDataset::get(i, ctx);
      }
      std::atomic<int>* c_;
    };
    DataLoader loader(std::make_shared<Counting>(loaded),
                      {.batch_size = 5, .num_workers = 3, .prefetch_factor = 2});
    auto it = loader.begin();  // takes batch 0; the rest stay in flight, unread
    std::this_thread::sleep_for(500ms);
    const int n = loaded->load();
    // 3 workers x 2 tasks x 5 samples, plus the batch delivered and its replacement.
    REQUIRE(n <= 3 * 2 * 5 + 5, n, " samples loaded with 30 in flight allowed");
    REQUIRE(n >= 3 * 2 * 5, n, " samples loaded: prefetch did not fill");
    return 0;
  });
}

}  // namespace
}  // namespace ferry
