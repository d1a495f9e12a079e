// on_worker_death=respawn: a dead worker is replaced and its batches loaded again, delivery stays
// exactly once and in order, and the restart budget ends the epoch with the history. Each test's
// body runs in a forked child (support/child_test.h).

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "ferry/data_loader.h"
#include "ferry/error.h"

#include "support/child_test.h"
#include "support/datasets.h"
#include "support/ledger.h"
#include "support/process_harness.h"
#include "support/registered.h"
#include "support/start_methods.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using testing::FaultyDataset;
using testing::in_child;
using testing::LedgerDataset;

FERRY_EACH_START_METHOD(Respawn);

// Iterates `epochs` epochs of a 48-sample ledger (12 batches of 4, two workers, up to 2 ms a
// sample, so that the loop outruns them and each worker is always loading a task) and SIGKILLs
// the worker that loaded one batch of each epoch, chosen at random (seeded) among the first 8:
// the worker still holds tasks, so its death is seen in the same epoch. Checks that every index
// comes exactly once, in order, with its own bytes, and counts the kills in `kills`. Returns the
// child's exit code (REQUIRE).
int kill_one_worker_per_epoch(
    DataLoader& loader, int epochs, std::uint64_t seed, std::size_t& kills, int first_epoch = 0) {
  std::mt19937_64 random(seed);
  for (int epoch = first_epoch; epoch < first_epoch + epochs; ++epoch) {
    const auto kill_at = static_cast<std::int64_t>(random() % 8);  // batches 0..7 of 12
    std::int64_t expected = 0;
    std::int64_t batch_number = 0;
    for (auto& batch : loader) {
      const auto index = batch["index"];
      const auto payload = batch["payload"];
      for (std::int64_t r = 0; r < index.size(0); ++r) {
        const auto i = index[r].item<std::int64_t>();
        REQUIRE(i == expected, "epoch ", epoch, ": index ", i, " where ", expected,
                " was due (a batch lost, repeated or out of order)");
        REQUIRE(LedgerDataset::check_row(payload, r, i, static_cast<std::uint64_t>(epoch)).empty(),
                "epoch ", epoch, " index ", i, " has the wrong bytes");
        ++expected;
      }
      if (batch_number++ == kill_at) {
        REQUIRE(::kill(static_cast<pid_t>(batch["pid"][0].item<std::int64_t>()), SIGKILL) == 0,
                "kill");
        ++kills;
      }
    }
    REQUIRE(expected == 48, "epoch ", epoch, " delivered ", expected, " of 48 samples");
  }
  return 0;
}

// Issue 16: a worker killed at a random moment in each of 100 epochs; every index exactly once,
// in order, and the restarts in stats().
TEST(RespawnFork, AWorkerKilledInEachOf100EpochsLosesNothing) {
  in_child(
      [] {
        {  // starts ferry's forker thread, so that the baseline below includes it
          DataLoader warm(testing::range(1), {.num_workers = 1});
          for (auto& batch : warm) (void)batch;
        }
        const auto before = testing::snapshot();
        {
          DataLoader loader(testing::ledger(48, 64, 2000),
                            {.batch_size = 4,
                             .num_workers = 2,
                             .persistent_workers = true,
                             .start_method = StartMethod::kFork,
                             .on_worker_death = OnWorkerDeath::kRespawn,
                             .max_worker_restarts = 1,
                             .max_worker_restarts_total = 100});
          std::size_t kills = 0;
          if (int rc = kill_one_worker_per_epoch(loader, 100, 16, kills); rc != 0) return rc;
          REQUIRE(kills == 100, kills);
          const LoaderStats stats = loader.stats();
          REQUIRE(stats.worker_restarts.size() == kills, stats.worker_restarts.size(),
                  " restarts for ", kills, " kills");
          for (std::size_t e = 0; e < stats.worker_restarts.size(); ++e) {
            const WorkerRestart& r = stats.worker_restarts[e];
            REQUIRE(r.epoch == e, "restart ", e, " in epoch ", r.epoch);
            REQUIRE(r.signal == SIGKILL && r.exit_code == -1, r.message);
            REQUIRE(r.worker_id < 2 && r.pid > 0, r.message);
            REQUIRE(r.message.find("SIGKILL") != std::string::npos, r.message);
          }
          REQUIRE(stats.samples == 4800u, stats.samples);
        }
        const std::string leaks = testing::wait_for_no_leaks(before, 2s);
        REQUIRE(leaks.empty(), leaks);
        return 0;
      },
      240s);
}

TEST_P(Respawn, KilledWorkersAreReplacedPersistentOrNot) {
  in_child(
      [] {
        for (const bool persistent : {false, true}) {
          DataLoader loader(testing::ledger(48, 64, 2000),
                            {.batch_size = 4,
                             .num_workers = 2,
                             .persistent_workers = persistent,
                             .on_worker_death = OnWorkerDeath::kRespawn});
          std::size_t kills = 0;
          if (int rc = kill_one_worker_per_epoch(loader, 3, persistent ? 7 : 8, kills); rc != 0) {
            return rc;
          }
          REQUIRE(loader.stats().worker_restarts.size() == kills, "persistent=", persistent);
        }
        return 0;
      },
      120s);
}

// Deaths past the budget end the epoch with a WorkerDiedError listing every restart.
TEST(RespawnFork, TheBudgetEndsTheEpochWithTheHistory) {
  in_child([] {
    DataLoader loader(testing::ledger(48, 64, 2000), {.batch_size = 4,
                                                      .num_workers = 2,
                                                      .start_method = StartMethod::kFork,
                                                      .on_worker_death = OnWorkerDeath::kRespawn,
                                                      .max_worker_restarts = 2});
    bool died = false;
    int kills = 0;
    try {
      std::int64_t batch_number = 0;
      bool due = false;
      std::set<pid_t> killed;
      for (auto& batch : loader) {
        // The loop outruns the workers (2 ms a sample): the one killed still holds tasks. A
        // batch its process sent before it died may still come: its pid is not killed twice.
        due = due || batch_number++ % 3 == 0;
        const auto pid = static_cast<pid_t>(batch["pid"][0].item<std::int64_t>());
        if (due && killed.insert(pid).second) {
          REQUIRE(::kill(pid, SIGKILL) == 0);
          ++kills;
          due = false;
        }
      }
    } catch (const WorkerDiedError& e) {
      died = true;
      const std::string what = e.what();
      REQUIRE(e.signal() == SIGKILL, what);
      REQUIRE(what.find("not restarted: on_worker_death=respawn allows max_worker_restarts=2") !=
                  std::string::npos,
              what);
      REQUIRE(what.find("restart 1: epoch 0") != std::string::npos, what);
      REQUIRE(what.find("restart 2: epoch 0") != std::string::npos, what);
    }
    REQUIRE(died, "no WorkerDiedError after ", kills, " kills");
    REQUIRE(kills == 3, kills, " kills");
    const auto restarts = loader.stats().worker_restarts;
    REQUIRE(restarts.size() == 2u, restarts.size());
    REQUIRE(restarts[0].batches.size() >= 1 && restarts[0].signal == SIGKILL, restarts[0].message);
    return 0;
  });
}

// Issue 16, quarantine: sample 17 segfaults whatever worker loads it. With respawn and
// on_error=skip the epoch completes: 17 reported as skipped, two restarts, every other index
// exactly once and in order; the next epoch leaves it out at once (no more restarts).
TEST_P(Respawn, APoisonSampleCostsTwoRestartsNotTheRun) {
  const StartMethod method = GetParam();
  in_child(
      [method] {
        for (const bool persistent : {false, true}) {
          DataLoader loader(testing::faulty(40, 17, FaultyDataset::Fault::kSegfault),
                            {.batch_size = 4,
                             .num_workers = 2,
                             .persistent_workers = persistent,
                             .start_method = method,
                             .on_error = OnError::kSkip,
                             .on_worker_death = OnWorkerDeath::kRespawn});
          for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
            std::int64_t expected = 0;
            for (auto& batch : loader) {
              for (const std::int64_t i : batch.indices()) {
                if (expected == 17) ++expected;
                REQUIRE(i == expected, "epoch ", epoch, ": index ", i, " where ", expected,
                        " was due");
                ++expected;
              }
            }
            REQUIRE(expected == 40, "epoch ", epoch, " ended at ", expected);
            const LoaderStats stats = loader.stats();
            REQUIRE(stats.skipped == epoch + 1, stats.skipped, " skipped after epoch ", epoch);
            const SkippedSample& s = stats.skipped_samples.back();
            REQUIRE(s.index == 17 && s.epoch == epoch, s.index);
            REQUIRE(s.error.find("quarantined") != std::string::npos, s.error);
            REQUIRE(s.error.find("SIGSEGV") != std::string::npos, s.error);
            REQUIRE(s.error.find("test.faulty: index 17 is bad") != std::string::npos, s.error);
            REQUIRE(stats.worker_restarts.size() == 2u, stats.worker_restarts.size(),
                    " restarts after epoch ", epoch);
            for (const auto& r : stats.worker_restarts) {
              REQUIRE(r.index == 17 && r.signal == SIGSEGV, r.message);
              REQUIRE(!r.stderr_tail.empty(), r.message);
            }
          }
        }
        return 0;
      },
      120s);
}

// With respawn but on_error=raise, a sample that killed two workers ends the epoch, naming it
// and what to do, rather than spending the whole budget on it.
TEST(RespawnFork, APoisonSampleUnderRaiseEndsTheEpochOnItsSecondKill) {
  in_child([] {
    DataLoader loader(testing::faulty(40, 17, FaultyDataset::Fault::kSegfault),
                      {.batch_size = 4,
                       .num_workers = 2,
                       .start_method = StartMethod::kFork,
                       .on_worker_death = OnWorkerDeath::kRespawn});
    try {
      for (auto& batch : loader) (void)batch;
    } catch (const WorkerDiedError& e) {
      const std::string what = e.what();
      REQUIRE(what.find("index 17 has now killed 2 workers") != std::string::npos, what);
      REQUIRE(what.find("Set on_error=skip") != std::string::npos, what);
      REQUIRE(e.failure().index == 17, what);
      REQUIRE(loader.stats().worker_restarts.size() == 1u, loader.stats().worker_restarts.size());
      REQUIRE(loader.stats().skipped == 0u, loader.stats().skipped);
      return 0;
    }
    REQUIRE(false, "no WorkerDiedError");
    return 1;
  });
}

TEST(RespawnFork, TheTotalBudgetCountsAcrossEpochs) {
  in_child([] {
    DataLoader loader(testing::ledger(48, 64, 2000), {.batch_size = 4,
                                                      .num_workers = 2,
                                                      .persistent_workers = true,
                                                      .start_method = StartMethod::kFork,
                                                      .on_worker_death = OnWorkerDeath::kRespawn,
                                                      .max_worker_restarts = 5,
                                                      .max_worker_restarts_total = 2});
    std::size_t kills = 0;
    if (int rc = kill_one_worker_per_epoch(loader, 2, 3, kills); rc != 0) return rc;
    REQUIRE(loader.stats().worker_restarts.size() == 2u, "two restarts");
    bool died = false;
    try {
      (void)kill_one_worker_per_epoch(loader, 1, 4, kills, /*first_epoch=*/2);
    } catch (const WorkerDiedError& e) {
      died = true;
      REQUIRE(std::string(e.what()).find("max_worker_restarts_total=2") != std::string::npos,
              e.what());
    }
    REQUIRE(died, "a third death was not refused");
    return 0;
  });
}

// With raise (the default) the first death ends the epoch, as before.
TEST(RespawnFork, RaiseIsTheDefault) {
  in_child([] {
    DataLoader loader(testing::faulty(64, 21, FaultyDataset::Fault::kSegfault),
                      {.batch_size = 4, .num_workers = 2, .start_method = StartMethod::kFork});
    try {
      for (auto& batch : loader) (void)batch;
    } catch (const WorkerDiedError& e) {
      REQUIRE(loader.stats().worker_restarts.empty(), "restarted under raise");
      REQUIRE(std::string(e.what()).find("not restarted") == std::string::npos, e.what());
      REQUIRE(std::string(e.what()).find("while loading index 21") != std::string::npos, e.what());
      return 0;
    }
    REQUIRE(false, "no WorkerDiedError");
    return 1;
  });
}

TEST(RespawnOptions, NeedWorkersAndAMapStyleDataset) {
  try {
    DataLoader loader(testing::range(4), {.on_worker_death = OnWorkerDeath::kRespawn});
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("set num_workers > 0 or on_worker_death=raise"),
              std::string::npos)
        << e.what();
  }
  try {
    DataLoader loader(testing::counting(4),
                      {.num_workers = 1, .on_worker_death = OnWorkerDeath::kRespawn});
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("on_worker_death=respawn with an IterableDataset"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ferry
