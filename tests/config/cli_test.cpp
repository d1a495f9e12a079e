// The ferry command, run as a user runs it: exit codes, the run summary and its JSON, the
// per-batch index dump, validate on every bundled config, describe, sample-data.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/command.h"
#include "support/files.h"

namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

using Result = ferry::test::CommandResult;
using ferry::test::BackgroundCommand;
using ferry::test::slurp;
using ferry::test::wait_until;

class Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = fs::temp_directory_path() / ("ferry_cli_test_data_" + std::to_string(::getpid()));
    fs::remove_all(data_);
    const Result r = run_ferry("sample-data " + data_.string() + " --per-class 6 --size 96x72");
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() { fs::remove_all(data_); }
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ferry_cli_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs `ferry ARGS` with the sample data as FERRY_SAMPLE_DATA (stdin closed, not a terminal).
  static Result run_ferry(const std::string& args, const std::string& env = "") {
    return ferry::test::run_command("FERRY_SAMPLE_DATA='" + data_.string() + "' FERRY_WORKERS=2 " +
                                    env + " " + FERRY_CLI + " " + args);
  }
  // The same, as a command line for BackgroundCommand.
  static std::string ferry_command(const std::string& args) {
    return "env FERRY_SAMPLE_DATA='" + data_.string() + "' FERRY_WORKERS=2 " + FERRY_CLI + " " +
           args;
  }
  static std::string config(const std::string& name) {
    return (fs::path(FERRY_SOURCE_DIR) / "configs" / name).string();
  }

  static fs::path data_;
  fs::path dir_;
};

fs::path Cli::data_;

TEST_F(Cli, VersionHelpAndUsageErrorsExitAsDocumented) {
  Result r = run_ferry("--version");
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("ferry 0."));
  for (const char* sub : {"run", "validate", "describe", "sample-data"}) {
    r = run_ferry(std::string(sub) + " --help");
    EXPECT_EQ(r.code, 0) << sub;
    EXPECT_THAT(r.out, HasSubstr("Usage:")) << sub;
  }
  EXPECT_EQ(run_ferry("").code, 2) << "no subcommand";
  EXPECT_EQ(run_ferry("frobnicate").code, 2);
  EXPECT_EQ(run_ferry("run").code, 2) << "no config";
  EXPECT_EQ(run_ferry("run x.yaml --epochs many").code, 2);
  EXPECT_EQ(run_ferry("run " + config("demo.yaml") + " --epochs 0").code, 2);
  EXPECT_EQ(run_ferry("run x.yaml --no-such-option").code, 2);
}

TEST_F(Cli, AFailureExitsWithOneAndTheErrorsPlace) {
  std::ofstream(dir_ / "bad.yaml") << "dataset: {type: image_folder, root: .}\n"
                                      "loader:\n  batch_sise: 4\n";
  Result r = run_ferry("run " + (dir_ / "bad.yaml").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr("bad.yaml:3:15: loader.batch_sise"),
                           HasSubstr("did you mean 'batch_size'?")));
  r = run_ferry("validate " + (dir_ / "missing.yaml").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("missing.yaml: no such file"));
}

TEST_F(Cli, RunOnTheDemoSummarisesAndDumpsEverySampleOncePerEpoch) {
  const fs::path json = dir_ / "summary.json";
  const fs::path dump = dir_ / "indices.jsonl";
  const Result r = run_ferry("run " + config("demo.yaml") + " --epochs 3 --json " + json.string() +
                             " --dump-indices " + dump.string() + " --log-every 0.01");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("3 epochs"), HasSubstr("72 samples"), HasSubstr("samples/s"),
                           HasSubstr("MB/s"), HasSubstr("0 samples skipped")));
  EXPECT_THAT(r.err, HasSubstr("batches")) << "progress lines when not on a terminal";
  EXPECT_THAT(r.err, Not(HasSubstr("\r"))) << "no bar unless stderr is a terminal";

  const std::string summary = slurp(json);
  for (const char* key : {"\"samples\": 72", "\"batches\": 6", "\"epochs\": 3", "\"seconds\": ",
                          "\"samples_per_second\": ", "\"mb_per_second\": ", "\"skipped\": 0",
                          "\"skipped_samples\": []"}) {
    EXPECT_THAT(summary, HasSubstr(key));
  }
  // 24 samples, batch_size 16: batches of 16 and 8, each epoch a new permutation.
  std::ifstream in(dump);
  std::string line;
  const std::regex pattern(R"(\{"epoch":(\d+),"batch":(\d+),"indices":\[([\d,]*)\]\})");
  std::vector<std::vector<int>> seen(3, std::vector<int>(24, 0));
  std::vector<std::vector<std::int64_t>> orders(3);
  std::size_t lines = 0;
  while (std::getline(in, line)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, pattern)) << line;
    const auto epoch = std::stoul(m[1]);
    ASSERT_LT(epoch, 3u);
    std::stringstream indices(m[3].str());
    std::string index;
    while (std::getline(indices, index, ',')) {
      const auto i = std::stol(index);
      ASSERT_LT(i, 24);
      ++seen[epoch][static_cast<std::size_t>(i)];
      orders[epoch].push_back(i);
    }
    ++lines;
  }
  EXPECT_EQ(lines, 6u);
  for (std::size_t e = 0; e < 3; ++e) {
    for (std::size_t i = 0; i < 24; ++i)
      EXPECT_EQ(seen[e][i], 1) << "epoch " << e << " index " << i;
  }
  EXPECT_NE(orders[0], orders[1]) << "shuffle: a new order each epoch";
}

TEST_F(Cli, RunSaysWhereTheTimeWentWritesATraceAndMeasuresHeadspace) {
  const fs::path json = dir_ / "summary.json";
  const fs::path trace = dir_ / "trace.json";
  const Result r =
      run_ferry("run " + config("demo.yaml") +
                " --epochs 2 --set loader.batch_size=4 --headspace --headspace-batches 2"
                " --step-ms 1 --json " +
                json.string() + " --trace " + trace.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("the loop waited for batches"), HasSubstr("p99"),
                           HasSubstr("workers: loading"), HasSubstr("shared memory peak"),
                           HasSubstr("headspace: the loop ran"), HasSubstr("trace: ")));
  const nlohmann::json summary = nlohmann::json::parse(slurp(json));
  const auto& stats = summary.at("stats");
  EXPECT_EQ(stats.at("total").at("batches"), 12);
  EXPECT_EQ(stats.at("total").at("samples"), 48);
  ASSERT_EQ(stats.at("epochs").size(), 2u);
  ASSERT_EQ(stats.at("total").at("workers").size(), 2u);
  std::size_t samples = 0;
  for (const auto& w : stats.at("total").at("workers"))
    samples += w.at("samples").get<std::size_t>();
  EXPECT_EQ(samples, 48u);
  EXPECT_GT(stats.at("total").at("wait").at("total_s").get<double>(), 0.0);
  const auto& headspace = summary.at("headspace");
  EXPECT_EQ(headspace.at("batches_held"), 2);
  EXPECT_GE(headspace.at("replayed").get<std::size_t>(), 12u);
  EXPECT_GT(headspace.at("memory_batches_per_second").get<double>(), 0.0);
  // The replay runs the same 1 ms step: from memory the loop can go at most 1000 batches/s.
  EXPECT_LT(headspace.at("memory_batches_per_second").get<double>(), 1000.0);
  // The trace went out as the loader went; its checker accepts it.
  ASSERT_TRUE(fs::exists(trace));
  const Result check = ferry::test::run_command(
      "/usr/bin/python3 " + (fs::path(FERRY_SOURCE_DIR) / "tests/tools/check_trace.py").string() +
      " " + trace.string() + " --expect-tids 0,1,2");
  EXPECT_EQ(check.code, 0) << check.out << check.err;
  EXPECT_EQ(run_ferry("run " + config("demo.yaml") + " --trace-events 10").code, 2)
      << "--trace-events without --trace";
}

TEST_F(Cli, MaxBatchesAndSetsChangeTheRun) {
  const fs::path dump = dir_ / "indices.jsonl";
  const Result r = run_ferry("run " + config("demo.yaml") +
                             " --epochs 2 --max-batches 2 --set loader.batch_size=5"
                             " --set loader.shuffle=false --dump-indices " +
                             dump.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("4 batches, 20 samples"));
  EXPECT_THAT(slurp(dump), HasSubstr("{\"epoch\":1,\"batch\":1,\"indices\":[5,6,7,8,9]}"));
}

// SIGTERM (a scheduler's preemption notice) mid-epoch: the run writes the state of what it
// consumed and exits 75; resumed from it, the run continues with exactly the batches that the
// uninterrupted run delivers after that point.
TEST_F(Cli, SigtermSavesTheStateAndResumeContinuesExactly) {
  std::ofstream(dir_ / "slow.yaml") << "dataset: {type: synthetic, size: 1003, shape: [2], "
                                       "load_us: 3000}\n"
                                       "loader: {batch_size: 4, num_workers: 2, shuffle: true, "
                                       "seed: 3}\n";
  const std::string config = (dir_ / "slow.yaml").string();
  const fs::path full = dir_ / "full.jsonl";
  const fs::path part = dir_ / "part.jsonl";
  const fs::path rest = dir_ / "rest.jsonl";
  const fs::path state = dir_ / "state.json";
  Result r = run_ferry("run " + config + " --epochs 2 --dump-indices " + full.string());
  ASSERT_EQ(r.code, 0) << r.err;
  {
    // The signal comes once the run has consumed a batch (--save-every 1 flushes its dump line
    // before saving): an event, not a clock, so a busy machine only makes the test slower.
    BackgroundCommand run(ferry_command("run " + config + " --epochs 2 --save-state " +
                                        state.string() + " --save-every 1 --dump-indices " +
                                        part.string()));
    ASSERT_TRUE(wait_until([&] { return fs::exists(part) && fs::file_size(part) > 0; },
                           std::chrono::minutes(2)))
        << run.err_so_far();
    run.signal(SIGTERM);
    r = run.wait();
  }
  ASSERT_EQ(r.code, 75) << r.err;
  EXPECT_THAT(r.err, AllOf(HasSubstr("stopped by SIGTERM"), HasSubstr(state.string())));
  const std::string saved = slurp(state);
  EXPECT_THAT(saved, HasSubstr("\"epoch\": 0")) << "stopped inside the first epoch";
  r = run_ferry("run " + config + " --epochs 2 --resume " + state.string() + " --dump-indices " +
                rest.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("resuming from"));
  EXPECT_FALSE(slurp(part).empty());
  EXPECT_EQ(slurp(part) + slurp(rest), slurp(full));
  // A state that is not one: a clear error naming the file, exit 1.
  std::ofstream(dir_ / "bad.json") << saved.substr(0, saved.size() / 2);
  r = run_ferry("run " + config + " --resume " + (dir_ / "bad.json").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr("bad.json"), HasSubstr("not valid JSON")));
}

// Preempted during start-up, before any batch: the signal ends the run at once (its default
// action, exit 143), and the state it started from, saved when the loader was built, resumes to
// exactly the uninterrupted run.
TEST_F(Cli, SigtermBeforeTheFirstBatchEndsTheRunAndItsStartingStateResumes) {
  // Each sample takes a minute: no batch can arrive before the signal.
  std::ofstream(dir_ / "slow.yaml") << "dataset: {type: synthetic, size: 30, shape: [2], "
                                       "load_us: 60000000}\n"
                                       "loader: {batch_size: 4, num_workers: 1, shuffle: true, "
                                       "seed: 3}\n";
  const std::string config = (dir_ / "slow.yaml").string();
  const std::string fast = " --set dataset.load_us=0";
  const fs::path full = dir_ / "full.jsonl";
  const fs::path rest = dir_ / "rest.jsonl";
  const fs::path state = dir_ / "state.json";
  Result r = run_ferry("run " + config + fast + " --epochs 2 --dump-indices " + full.string());
  ASSERT_EQ(r.code, 0) << r.err;
  {
    BackgroundCommand run(
        ferry_command("run " + config + " --epochs 2 --save-state " + state.string()));
    // Printed once the loader is made and its starting state saved, before its first batch.
    ASSERT_TRUE(wait_until([&] { return run.err_so_far().find(" batches\n") != std::string::npos; },
                           std::chrono::minutes(2)))
        << run.err_so_far();
    run.signal(SIGTERM);
    r = run.wait();
  }
  ASSERT_EQ(r.code, 128 + SIGTERM) << r.err;
  ASSERT_TRUE(fs::exists(state));
  r = run_ferry("run " + config + fast + " --epochs 2 --resume " + state.string() +
                " --dump-indices " + rest.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("resuming from"));
  EXPECT_EQ(slurp(rest), slurp(full));
}

TEST_F(Cli, ValidateAcceptsEveryBundledConfig) {
  // configs/preprocess.yaml runs as it is, and writes the shards webdataset-train.yaml reads.
  const std::string shards = "FERRY_PREPROCESS_OUT='" + (dir_ / "shards").string() + "'";
  const Result pre = run_ferry("preprocess " + config("preprocess.yaml"), shards);
  ASSERT_EQ(pre.code, 0) << pre.err;
  EXPECT_THAT(pre.out, HasSubstr("complete"));
  std::size_t checked = 0;
  for (const std::string& name :
       ferry::testing::names_in(fs::path(FERRY_SOURCE_DIR) / "configs")) {
    const fs::path entry = fs::path(FERRY_SOURCE_DIR) / "configs" / name;
    if (entry.extension() != ".yaml") continue;
    std::string env = shards;
    if (name.find("gpu") != std::string::npos && !at::hasCUDA()) {
      // Without CUDA the GPU pipeline is refused with the reason; on the CPU it is valid.
      const Result refused = run_ferry("validate " + entry.string());
      EXPECT_EQ(refused.code, 1) << entry;
      EXPECT_THAT(refused.err, HasSubstr("device=cuda needs CUDA")) << entry;
      env += " FERRY_DEVICE=cpu";
    }
    const Result r = run_ferry("validate " + entry.string(), env);
    EXPECT_EQ(r.code, 0) << entry << ": " << r.err;
    if (name == "preprocess.yaml") {
      EXPECT_THAT(r.out, AllOf(HasSubstr("valid preprocess job (24 inputs"),
                               HasSubstr("type: image_folder"), HasSubstr("output:")));
    } else {
      EXPECT_THAT(r.out, AllOf(HasSubstr(": valid (24 samples"), HasSubstr("dataset:"),
                               HasSubstr(name == "webdataset-train.yaml" ? "type: webdataset"
                                                                         : "type: image_folder"),
                               HasSubstr("loader:")))
          << entry;
    }
    ++checked;
  }
  EXPECT_GE(checked, 6u);
}

TEST_F(Cli, DescribeListsTypesAndShowsOnesKeys) {
  Result r = run_ferry("describe");
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, AllOf(HasSubstr("image_folder"), HasSubstr("random_resized_crop"),
                           HasSubstr("weighted_random"), HasSubstr("loader")));
  r = run_ferry("describe random_resized_crop");
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, AllOf(HasSubstr("size"), HasSubstr("required"), HasSubstr("scale"),
                           HasSubstr("default: [0.08, 1]")));
  r = run_ferry("describe to_dtype");
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, AllOf(HasSubstr("device transform to_dtype"), HasSubstr("float32 | float16"),
                           HasSubstr("scale")));
  r = run_ferry("describe");
  EXPECT_THAT(r.out, AllOf(HasSubstr("device transforms:"), HasSubstr("normalize")));
  r = run_ferry("describe loader");
  EXPECT_THAT(r.out, AllOf(HasSubstr("num_workers"), HasSubstr("int >= 0; default: 0"),
                           HasSubstr("on_error"), HasSubstr("raise | skip")));
  r = run_ferry("describe random_resize_crop");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("did you mean 'random_resized_crop'?"));
}

TEST_F(Cli, SampleDataWritesAnImageFolderOnceAndNeverOverAnotherFolder) {
  const fs::path out = dir_ / "images";
  Result r = run_ferry("sample-data " + out.string() + " --classes 3 --per-class 2 --size 40x30");
  ASSERT_EQ(r.code, 0) << r.err;
  std::size_t jpegs = 0;
  for (const fs::path& file : ferry::testing::files_under(out)) jpegs += file.extension() == ".jpg";
  EXPECT_EQ(jpegs, 6u);
  EXPECT_TRUE(fs::exists(out / "class2" / "5.jpg"));
  r = run_ferry("sample-data " + out.string() + " --classes 3 --per-class 2 --size 40x30");
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("already there"));

  fs::create_directories(dir_ / "mine");
  std::ofstream(dir_ / "mine" / "notes.txt") << "keep me\n";
  r = run_ferry("sample-data " + (dir_ / "mine").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("--force"));
  EXPECT_EQ(run_ferry("sample-data " + out.string() + " --size big").code, 2);
}

}  // namespace
