// A program that never calls ferry::init (this binary's main is gtest's): spawn starts the
// ferry-worker program for pipelines of built-in types, and refuses the rest with the fix.

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/data_loader.h"
#include "ferry/error.h"
#include "ferry/init.h"
#include "ferry/registry.h"
#include "ferry/synthetic_dataset.h"

namespace ferry {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

std::shared_ptr<Dataset> synthetic() {
  register_builtins();
  return Registry::global().make_dataset(
      Config::map({{"type", "synthetic"}, {"size", 30}, {"shape", Config::list({4, 5})}}));
}

class EnvVar {
 public:
  EnvVar(const char* name, const std::string& value) : name_(name) {
    ::setenv(name, value.c_str(), 1);
  }
  ~EnvVar() { ::unsetenv(name_); }

 private:
  const char* name_;
};

TEST(SpawnWithoutInit, BuiltinTypesRunInTheFerryWorkerProgramWithIdenticalBatches) {
  ASSERT_FALSE(initialized());
  auto dataset = synthetic();
  DataLoader spawned(dataset,
                     {.batch_size = 7, .num_workers = 2, .start_method = StartMethod::kSpawn});
  DataLoader local(dataset, {.batch_size = 7});
  auto a = spawned.begin();
  auto b = local.begin();
  std::size_t batches = 0;
  for (; a != spawned.end() && b != local.end(); ++a, ++b, ++batches) {
    EXPECT_TRUE(torch::equal((*a)["data"], (*b)["data"]));
    EXPECT_TRUE(torch::equal((*a)["label"], (*b)["label"]));
  }
  EXPECT_EQ(batches, 5u);
}

TEST(SpawnWithoutInit, AProgramsOwnTypeNeedsInit) {
  if (Registry::global().find(ComponentKind::kDataset, "own") == nullptr) {
    Registry::global().add_dataset({.name = "own"}, [](const Args&) {
      return std::make_shared<SyntheticDataset>(SyntheticDataset::Options{.size = 4});
    });
  }
  auto dataset = Registry::global().make_dataset(Config("own"));
  EXPECT_THAT([&] { DataLoader(dataset, {.num_workers = 1, .start_method = StartMethod::kSpawn}); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("needs ferry::init(argc, argv)"),
                                               HasSubstr("dataset 'own' is not a built-in type"))));
}

TEST(SpawnWithoutInit, ForkserverNeedsInit) {
  EXPECT_THAT(
      [] { DataLoader(synthetic(), {.num_workers = 1, .start_method = StartMethod::kForkserver}); },
      ThrowsMessage<ConfigError>(HasSubstr("start_method=forkserver needs ferry::init")));
}

TEST(SpawnWithoutInit, AMissingFerryWorkerIsNamed) {
  const EnvVar env("FERRY_WORKER_PROGRAM", "/nonexistent/bin/ferry-worker");
  EXPECT_THAT(
      [] { DataLoader(synthetic(), {.num_workers = 1, .start_method = StartMethod::kSpawn}); },
      ThrowsMessage<ConfigError>(
          AllOf(HasSubstr("/nonexistent/bin/ferry-worker"), HasSubstr("FERRY_WORKER_PROGRAM"))));
}

TEST(SpawnWithoutInit, AWorkerProgramThatExitsBeforeItsHandshakeIsNamed) {
  // Next to this test program: the build tree is writable and, unlike /tmp, never noexec.
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT_GT(n, 0);
  std::string dir(self, static_cast<std::size_t>(n));
  dir.resize(dir.rfind('/'));
  const std::string path = dir + "/not-a-ferry-worker.sh";
  {
    std::ofstream script(path);
    script << "#!/bin/sh\necho 'not a worker' >&2\nexit 3\n";
  }
  ::chmod(path.c_str(), 0755);
  const EnvVar env("FERRY_WORKER_PROGRAM", path);
  DataLoader loader(synthetic(), {.num_workers = 2, .start_method = StartMethod::kSpawn});
  try {
    for (auto& b : loader) (void)b;
    FAIL() << "no error";
  } catch (const WorkerDiedError& e) {
    EXPECT_EQ(e.exit_code(), 3);
    EXPECT_THAT(e.what(), HasSubstr("before its handshake"));
  }
}

}  // namespace
}  // namespace ferry
