// Checkpoints with worker processes: the continuation matrix over start methods, order modes,
// persistence and stop points; state saved out of order past a gap; elastic in the number of
// workers and the start method; a process killed with SIGKILL and resumed from its file.

#include "support/resume.h"

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/data_loader.h"

#include "ipc/files.h"
#include "support/process_harness.h"
#include "support/registered.h"

namespace ferry {
namespace {

using testing::Delivered;
using ::testing::HasSubstr;

constexpr std::size_t kSize = 37;  // batches of 4: ten per epoch, the last one short
constexpr std::size_t kOnLast = 10;

struct Case {
  StartMethod method;
  bool in_order;
  bool persistent;
  std::size_t stop;  // batches consumed before the checkpoint
  bool after_loop;   // taken after the epoch's loop ended
};

DataLoaderOptions options_for(const Case& c, std::size_t workers) {
  return {.batch_size = 4,
          .shuffle = true,
          .num_workers = workers,
          .persistent_workers = c.persistent,
          .in_order = c.in_order,
          .seed = 21,
          .start_method = c.method};
}

class Resume : public ::testing::TestWithParam<Case> {};

TEST_P(Resume, EqualsTheUninterruptedRun) {
  const Case c = GetParam();
  auto data = testing::range(kSize);
  DataLoader reference_loader(data, options_for(c, 2));
  const auto reference = testing::run_through(reference_loader, 1);
  DataLoader first(data, options_for(c, 2));
  auto [before, state] = testing::run_until(first, c.stop, c.after_loop);
  DataLoader resumed(data, options_for(c, 2));
  resumed.load_state(state);
  SCOPED_TRACE(state);
  testing::expect_continuation(reference, before, testing::run_through(resumed, 1), c.in_order);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const auto method : {StartMethod::kFork, StartMethod::kForkserver, StartMethod::kSpawn}) {
    for (const bool in_order : {true, false}) {
      for (const bool persistent : {false, true}) {
        // spawn starts a program per worker: two stop points are enough there.
        const std::vector<std::pair<std::size_t, bool>> stops =
            method == StartMethod::kSpawn
                ? std::vector<std::pair<std::size_t, bool>>{{1, false}, {kOnLast, true}}
                : std::vector<std::pair<std::size_t, bool>>{
                      {1, false}, {2, false}, {5, false}, {kOnLast, false}, {kOnLast, true}};
        for (const auto& [stop, after] : stops) {
          out.push_back({method, in_order, persistent, stop, after});
        }
      }
    }
  }
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(to_string(c.method)) + (c.in_order ? "_InOrder" : "_OutOfOrder") +
         (c.persistent ? "_Persistent" : "") + "_After" + std::to_string(c.stop) +
         (c.after_loop ? "_EpochEnd" : "");
}

INSTANTIATE_TEST_SUITE_P(Matrix, Resume, ::testing::ValuesIn(cases()), case_name);

// Iterable datasets with workers: each worker's stream continues where the loop stood, at its
// cursor or by replaying; in order, the round robin and the batches' numbers go on too.
struct StreamCase {
  StartMethod method;
  bool in_order;
  bool persistent;
  bool cursor;
};

class StreamResume : public ::testing::TestWithParam<StreamCase> {};

TEST_P(StreamResume, EveryValueOnceAndInOrderTheSameBatches) {
  const StreamCase c = GetParam();
  auto data = testing::counting(61, true, c.cursor);
  const DataLoaderOptions o{.batch_size = 4,
                            .num_workers = 2,
                            .persistent_workers = c.persistent,
                            .in_order = c.in_order,
                            .seed = 5,
                            .start_method = c.method};
  auto collect = [](DataLoader& loader, std::uint64_t last, std::size_t stop, std::string* state) {
    std::vector<Batch> out;
    while (loader.epoch() <= last) {
      for (auto& batch : loader) {
        out.push_back(batch);
        if (out.size() == stop) {
          *state = loader.state();
          return out;
        }
      }
    }
    return out;
  };
  std::string unused;
  DataLoader reference_loader(data, o);
  const auto reference = collect(reference_loader, 1, 0, &unused);
  DataLoader first(data, o);
  std::string state;
  const auto before = collect(first, 1, 5, &state);
  ASSERT_FALSE(state.empty());
  DataLoader resumed(data, o);
  resumed.load_state(state);
  const auto after = collect(resumed, 1, 0, &unused);
  SCOPED_TRACE(state);
  testing::expect_same_values(reference, before, after);
  if (c.in_order) {
    auto records = [](const std::vector<Batch>& batches) {
      std::vector<Delivered> out;
      for (const Batch& b : batches) out.push_back(testing::record(b));
      return out;
    };
    testing::expect_continuation(records(reference), records(before), records(after), true);
  }
}

std::vector<StreamCase> stream_cases() {
  std::vector<StreamCase> out;
  for (const auto method : {StartMethod::kFork, StartMethod::kForkserver, StartMethod::kSpawn}) {
    for (const bool in_order : {true, false}) {
      out.push_back({method, in_order, false, true});
      if (method == StartMethod::kFork) {
        out.push_back({method, in_order, false, false});
        out.push_back({method, in_order, true, true});
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Streams,
                         StreamResume,
                         ::testing::ValuesIn(stream_cases()),
                         [](const ::testing::TestParamInfo<StreamCase>& info) {
                           const StreamCase& c = info.param;
                           return std::string(to_string(c.method)) +
                                  (c.in_order ? "_InOrder" : "_OutOfOrder") +
                                  (c.persistent ? "_Persistent" : "") +
                                  (c.cursor ? "_Cursor" : "_Replay");
                         });

// Out of order, a straggling worker leaves a gap: the state lists the batches received past
// it, and a loader resumed (in order, with another number of workers) loads only the others.
TEST(ResumeEngine, OutOfOrderGapsAreRemembered) {
  auto data = testing::ledger(48, 64, /*max_delay_us=*/3000, /*straggler_worker=*/0,
                              /*straggler_factor=*/40);
  DataLoaderOptions o{.batch_size = 4, .num_workers = 2, .in_order = false, .seed = 4};
  DataLoader reference_loader(data, o);
  const auto reference = testing::run_through(reference_loader, 0);
  DataLoader first(data, o);
  std::vector<Delivered> before;
  std::string state;
  for (auto it = first.begin(); it != first.end(); ++it) {
    before.push_back(testing::record(*it));
    state = first.state();
    if (state.find("\"received_beyond\": []") == std::string::npos && before.size() >= 3) break;
  }
  ASSERT_EQ(state.find("\"received_beyond\": []"), std::string::npos)
      << "the straggler never left a gap: " << state;
  o.in_order = true;
  o.num_workers = 3;
  DataLoader resumed(data, o);
  resumed.load_state(state);
  testing::expect_continuation(reference, before, testing::run_through(resumed, 0), false);
}

// Saved with 8 fork workers, resumed with 3 spawn workers or none: the same batches.
TEST(ResumeEngine, ElasticInWorkersAndStartMethod) {
  auto data = testing::range(kSize);
  const Case fork8{StartMethod::kFork, true, false, 3, false};
  DataLoader reference_loader(data, options_for(fork8, 8));
  const auto reference = testing::run_through(reference_loader, 1);
  DataLoader first(data, options_for(fork8, 8));
  auto [before, state] = testing::run_until(first, 3);
  for (const std::size_t workers : {3, 0}) {
    SCOPED_TRACE(workers);
    DataLoaderOptions o = options_for({StartMethod::kSpawn, true, false, 0, false}, workers);
    if (workers == 0) o.start_method.reset();
    DataLoader resumed(data, o);
    resumed.load_state(state);
    testing::expect_continuation(reference, before, testing::run_through(resumed, 1), true);
  }
}

// The training process is killed with SIGKILL right after saving its state: a new process
// resumes from the file and continues exactly where it stopped.
TEST(ResumeEngine, AfterSigkillFromTheSavedFile) {
  const std::filesystem::path file = std::filesystem::temp_directory_path() /
                                     ("ferry-resume-" + std::to_string(::getpid()) + ".json");
  auto data = testing::range(kSize);
  const DataLoaderOptions o{.batch_size = 4, .shuffle = true, .num_workers = 2, .seed = 8};
  DataLoader reference_loader(data, o);
  const auto reference = testing::run_through(reference_loader, 1);
  const auto child = testing::run_in_child(
      [&] {
        DataLoader loader(data, o);
        std::size_t seen = 0;
        for (;;) {
          for (auto it = loader.begin(); it != loader.end(); ++it) {
            loader.save_state(file);
            if (++seen == 13) ::raise(SIGKILL);  // batch 3 of epoch 1, workers busy
          }
        }
        return 0;
      },
      std::chrono::seconds(30));
  ASSERT_EQ(child.signal, SIGKILL) << child.output;
  const std::string state = ipc::read_file(file, "test");
  EXPECT_THAT(state, HasSubstr("\"epoch\": 1"));
  EXPECT_THAT(state, HasSubstr("\"position\": 3"));
  DataLoader resumed(data, o);
  resumed.load_state_file(file);
  const std::vector<Delivered> before(reference.begin(), reference.begin() + 13);
  testing::expect_continuation(reference, before, testing::run_through(resumed, 1), true);
  std::filesystem::remove(file);
}

}  // namespace
}  // namespace ferry
