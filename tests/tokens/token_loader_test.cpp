// Token datasets through the loader: workers under every start method, the registry, nanoGPT's
// windows, the pad and pack collates, a file truncated under a worker (SIGBUS, reported with the
// file and the offset) and a sparse 200 GB file whose first batch comes at once.

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/data_loader.h"
#include "ferry/error.h"
#include "ferry/registry.h"
#include "ferry/tokens.h"

#include "datasets/token_files.h"
#include "support/command.h"
#include "support/start_methods.h"
#include "support/timing.h"
#include "tokens/reference.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::HasSubstr;

using test::ints_of;
using test::kRef;
using test::manifest;

const json& gpt_case(std::size_t seq_length) {
  for (const json& c : manifest()["gpt"]) {
    if (c["seq_length"] == seq_length && c["add_extra_token"] == true) return c;
  }
  throw std::runtime_error("no case");
}

FERRY_EACH_START_METHOD(TokenLoader);

// A gpt dataset from the registry (as a YAML pipeline builds it), through workers: every sample
// exactly once, each equal to Megatron's.
TEST_P(TokenLoader, GptThroughTheRegistryAndWorkersEqualsMegatron) {
  const json& c = gpt_case(64);
  auto dataset = Registry::global().make_dataset(
      Config::map({{"type", "gpt"},
                   {"prefix", (kRef / c["prefix"].get<std::string>()).string()},
                   {"seq_length", c["seq_length"].get<std::int64_t>()},
                   {"num_samples", c["num_samples"].get<std::int64_t>()},
                   {"seed", c["seed"].get<std::int64_t>()},
                   {"split", c["split"].get<std::string>()}}));
  DataLoader loader(dataset, {.batch_size = 8, .num_workers = 2});
  const auto ids = c["sample_ids"].get<std::vector<std::size_t>>();
  const auto samples = c["samples"].get<std::vector<std::vector<std::int64_t>>>();
  std::set<std::int64_t> seen;
  std::size_t checked = 0;
  for (auto& batch : loader) {
    const torch::Tensor tokens = batch["tokens"];
    const torch::Tensor labels = batch["labels"];
    ASSERT_EQ(tokens.sizes().vec(),
              (std::vector<std::int64_t>{static_cast<std::int64_t>(batch.size()), 64}));
    for (std::size_t r = 0; r < batch.size(); ++r) {
      const std::int64_t index = batch.indices()[r];
      EXPECT_TRUE(seen.insert(index).second) << index;
      const auto at = std::find(ids.begin(), ids.end(), static_cast<std::size_t>(index));
      if (at == ids.end()) continue;
      const auto& text = samples[static_cast<std::size_t>(at - ids.begin())];
      ASSERT_EQ(ints_of(tokens[static_cast<std::int64_t>(r)]),
                std::vector<std::int64_t>(text.begin(), text.begin() + 64));
      ASSERT_EQ(ints_of(labels[static_cast<std::int64_t>(r)]),
                std::vector<std::int64_t>(text.begin() + 1, text.end()));
      ++checked;
    }
  }
  EXPECT_EQ(seen.size(), dataset->size());
  EXPECT_EQ(checked, ids.size());
}

// nanoGPT's windows: y is x shifted by one, both from the file at one offset, and the epoch is the
// same whatever the number of workers (each sample's offset comes from its own generator).
TEST_P(TokenLoader, TokenWindowsAreTheFilesTokensAndTheSameWithAnyWorkers) {
  const json& w = manifest()["windows"];
  const fs::path path = kRef / w["file"].get<std::string>();
  std::vector<std::int64_t> file;
  for (const json& c : manifest()["nanogpt"]) {
    if (c["file"] == w["file"]) file = c["values"].get<std::vector<std::int64_t>>();
  }
  ASSERT_FALSE(file.empty());
  // From the registry, so that spawn and forkserver workers can build it again.
  auto dataset = Registry::global().make_dataset(Config::map({{"type", "token_windows"},
                                                              {"path", path.string()},
                                                              {"block_size", 8},
                                                              {"epoch_length", 200}}));
  auto epoch_of = [&](std::size_t workers) {
    DataLoader loader(dataset, {.batch_size = 16, .num_workers = workers, .seed = 11});
    std::vector<std::vector<std::int64_t>> rows;
    for (auto& batch : loader) {
      for (std::int64_t r = 0; r < static_cast<std::int64_t>(batch.size()); ++r) {
        const auto x = ints_of(batch["x"][r]);
        const auto y = ints_of(batch["y"][r]);
        EXPECT_EQ(std::vector<std::int64_t>(x.begin() + 1, x.end()),
                  std::vector<std::int64_t>(y.begin(), y.end() - 1));
        // x is the file's tokens at some offset in [0, len - block_size).
        bool found = false;
        for (std::size_t o = 0; o + 8 < file.size() && !found; ++o) {
          found = std::equal(x.begin(), x.end(), file.begin() + static_cast<std::ptrdiff_t>(o)) &&
                  file[o + 8] == y.back();
        }
        EXPECT_TRUE(found);
        rows.push_back(x);
      }
    }
    return rows;
  };
  const auto two = epoch_of(2);
  EXPECT_EQ(two.size(), 200u);
  EXPECT_EQ(epoch_of(0), two) << "the same windows without workers";
  std::set<std::vector<std::int64_t>> distinct(two.begin(), two.end());
  EXPECT_GT(distinct.size(), 150u) << "offsets are drawn, not fixed";
}

std::shared_ptr<GptDataset> gpt_of(const json& c) {
  GptDataset::Options o;
  o.seq_length = c["seq_length"].get<std::size_t>();
  o.num_samples = c["num_samples"].get<std::size_t>();
  o.seed = c["seed"].get<std::uint32_t>();
  o.split = c["split"].get<std::string>();
  return std::make_shared<GptDataset>((kRef / c["prefix"].get<std::string>()).string(), o);
}

// Checkpoints: a state taken mid-epoch resumes to exactly the batches an uninterrupted run gives
// next (the state holds a position: the dataset's indices are its own, rebuilt the same).
TEST(TokenCheckpoint, AGptEpochStoppedMidwayResumesExactly) {
  auto dataset = gpt_of(gpt_case(64));
  const DataLoaderOptions options{.batch_size = 4, .shuffle = true, .num_workers = 2, .seed = 3};
  std::vector<std::vector<std::int64_t>> whole;
  {
    DataLoader loader(dataset, options);
    for (auto& b : loader) whole.push_back(ints_of(b["tokens"]));
  }
  std::vector<std::vector<std::int64_t>> resumed;
  std::string state;
  {
    DataLoader loader(dataset, options);
    int taken = 0;
    for (auto& b : loader) {
      resumed.push_back(ints_of(b["tokens"]));
      if (++taken == 7) {
        state = loader.state();
        break;
      }
    }
  }
  DataLoader again(gpt_of(gpt_case(64)),
                   {.batch_size = 4, .shuffle = true, .num_workers = 1, .seed = 3});
  again.load_state(state);
  for (auto& b : again) resumed.push_back(ints_of(b["tokens"]));
  EXPECT_EQ(resumed, whole);
}

// Ranks of a distributed job split the samples: disjoint, and together every one.
TEST(TokenDistributed, RanksSplitTheGptSamples) {
  auto dataset = gpt_of(gpt_case(64));
  std::set<std::int64_t> all;
  std::size_t total = 0;
  for (std::size_t rank = 0; rank < 3; ++rank) {
    auto sampler = std::make_shared<DistributedSampler>(
        dataset->size(), DistributedSampler::Options{.num_replicas = 3, .rank = rank, .seed = 1});
    DataLoader loader(dataset, {.batch_size = 8, .num_workers = 1}, sampler);
    for (auto& b : loader) {
      for (const std::int64_t i : b.indices()) {
        all.insert(i);
        ++total;
      }
    }
  }
  EXPECT_EQ(all.size(), dataset->size());
  EXPECT_LT(total - all.size(), 3u) << "PyTorch's padding only";
}

// An elastic job: 4 ranks take 3 batches each and save; the job comes back on 3 ranks from rank
// 0's state. Across both runs every Megatron sample is delivered once (plus the padding a
// DistributedSampler adds at the new world size), each as Megatron's tokens, and every resumed
// rank yields the same number of batches.
TEST(TokenDistributed, AGptEpochResumedAtAnotherWorldSizeDeliversTheRestOnce) {
  const json& c = gpt_case(64);
  auto dataset = gpt_of(c);
  const std::size_t n = dataset->size();
  const auto ids = c["sample_ids"].get<std::vector<std::size_t>>();
  const auto samples = c["samples"].get<std::vector<std::vector<std::int64_t>>>();
  std::map<std::int64_t, int> times;
  std::size_t checked = 0;
  auto take = [&](Batch& batch) {
    for (std::size_t r = 0; r < batch.size(); ++r) {
      const std::int64_t index = batch.indices()[r];
      ++times[index];
      const auto at = std::find(ids.begin(), ids.end(), static_cast<std::size_t>(index));
      if (at == ids.end()) continue;
      const auto& text = samples[static_cast<std::size_t>(at - ids.begin())];
      ASSERT_EQ(ints_of(batch["tokens"][static_cast<std::int64_t>(r)]),
                std::vector<std::int64_t>(text.begin(), text.begin() + 64));
      ++checked;
    }
  };
  auto sampler_for = [&](std::size_t world, std::size_t rank) {
    return std::make_shared<DistributedSampler>(
        n, DistributedSampler::Options{.num_replicas = world, .rank = rank, .seed = 5});
  };
  const DataLoaderOptions options{.batch_size = 4, .num_workers = 2, .seed = 1};
  std::string state;
  std::size_t consumed = 0;
  for (std::size_t rank = 0; rank < 4; ++rank) {
    DataLoader loader(dataset, options, sampler_for(4, rank));
    int taken = 0;
    for (auto& batch : loader) {
      take(batch);
      consumed += batch.size();
      if (++taken == 3) {
        if (rank == 0) state = loader.state();
        break;
      }
    }
  }
  ASSERT_EQ(consumed, 4u * 3 * 4);
  std::vector<std::size_t> counts;
  std::size_t rest = 0;
  for (std::size_t rank = 0; rank < 3; ++rank) {
    DataLoader loader(gpt_of(c), {.batch_size = 4, .num_workers = 1, .seed = 1},
                      sampler_for(3, rank));
    loader.load_state(state);
    std::size_t batches = 0;
    for (auto& batch : loader) {
      ASSERT_EQ(batch.epoch(), 0u);
      take(batch);
      rest += batch.size();
      ++batches;
    }
    counts.push_back(batches);
  }
  EXPECT_EQ(std::count(counts.begin(), counts.end(), counts.front()), 3)
      << "ranks yield different numbers of batches";
  const std::size_t remaining = n - consumed;
  EXPECT_EQ(rest, (remaining + 2) / 3 * 3);
  std::size_t missing = 0;
  std::size_t repeated = 0;
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(n); ++i) {
    missing += times[i] == 0;
    repeated += times[i] > 1 ? static_cast<std::size_t>(times[i] - 1) : 0;
  }
  EXPECT_EQ(missing, 0u);
  EXPECT_EQ(repeated, rest - remaining) << "the padding, and nothing more";
  EXPECT_EQ(times.size(), n) << "an index outside the dataset";
  EXPECT_GT(checked, 0u) << "no delivered sample was among Megatron's reference samples";
}

// Variable-length sequences of an indexed dataset, padded or packed, through workers.
TEST_P(TokenLoader, IndexedSequencesPaddedAndPackedThroughWorkers) {
  const json& c = manifest()["indexed"][0];
  const auto sequences = c["sequences"].get<std::vector<std::vector<std::int64_t>>>();
  Registry& r = Registry::global();
  auto dataset = r.make_dataset(Config::map(
      {{"type", "indexed"}, {"prefix", (kRef / c["prefix"].get<std::string>()).string()}}));
  DataLoader padded(dataset, {.batch_size = 6, .num_workers = 2},
                    r.make_collate(Config::map({{"type", "pad"}, {"multiple_of", 8}})));
  std::size_t rows = 0;
  for (auto& b : padded) {
    ASSERT_EQ(b["tokens"].size(1) % 8, 0);
    for (std::int64_t r = 0; r < static_cast<std::int64_t>(b.size()); ++r) {
      const auto& want =
          sequences[static_cast<std::size_t>(b.indices()[static_cast<std::size_t>(r)])];
      const auto row = ints_of(b["tokens"][r]);
      ASSERT_EQ(std::vector<std::int64_t>(row.begin(),
                                          row.begin() + static_cast<std::ptrdiff_t>(want.size())),
                want);
      ASSERT_EQ(b["lengths"][r].item<std::int64_t>(), static_cast<std::int64_t>(want.size()));
      ++rows;
    }
  }
  EXPECT_EQ(rows, sequences.size());
  DataLoader packed(dataset, {.batch_size = 6, .num_workers = 2},
                    r.make_collate(Config::map({{"type", "pack"}, {"row_length", 256}})));
  std::size_t tokens = 0, total = 0;
  for (const auto& s : sequences) total += s.size();
  for (auto& b : packed) {
    const auto cu = ints_of(b["cu_seqlens"]);
    ASSERT_EQ(cu.back(), b["tokens"].numel());
    const auto documents = ints_of(b["document_ids"]);
    tokens += static_cast<std::size_t>(
        std::count_if(documents.begin(), documents.end(), [](std::int64_t d) { return d >= 0; }));
  }
  EXPECT_EQ(tokens, total) << "every token packed once";
}

TEST(TokenCollates, PadPadsToTheLongestOrAMultipleAndMasks) {
  std::vector<Example> samples;
  for (std::int64_t n : {3, 5, 1}) {
    Example e{{"tokens", torch::arange(1, n + 1, torch::kInt64)},
              {"labels", torch::arange(10, 10 + n, torch::kInt64)},
              {"id", n}};
    samples.push_back(std::move(e));
  }
  Batch b = pad_collate({.value = 0, .label_value = -100, .multiple_of = 4})(samples);
  EXPECT_EQ(b["tokens"].sizes().vec(), (std::vector<std::int64_t>{3, 8}));
  EXPECT_EQ(ints_of(b["tokens"][0]), (std::vector<std::int64_t>{1, 2, 3, 0, 0, 0, 0, 0}));
  EXPECT_EQ(ints_of(b["labels"][2]),
            (std::vector<std::int64_t>{10, -100, -100, -100, -100, -100, -100, -100}));
  EXPECT_EQ(ints_of(b["lengths"]), (std::vector<std::int64_t>{3, 5, 1}));
  EXPECT_EQ(b["attention_mask"].scalar_type(), torch::kBool);
  EXPECT_EQ(ints_of(b["attention_mask"][1]), (std::vector<std::int64_t>{1, 1, 1, 1, 1, 0, 0, 0}));
  EXPECT_EQ(ints_of(b["id"]), (std::vector<std::int64_t>{3, 5, 1})) << "other fields collated";
}

TEST(TokenCollates, PackFillsRowsWithWholeDocumentsAndCutsLongOnes) {
  std::vector<Example> samples;
  for (std::int64_t n : {3, 4, 2, 11}) {
    samples.push_back(Example{{"tokens", torch::arange(100 * n, 100 * n + n, torch::kInt64)}});
  }
  Batch b = pack_collate({.row_length = 6, .value = -1})(samples);
  const torch::Tensor t = b["tokens"];
  ASSERT_EQ(t.size(1), 6);
  // In order: doc 0 (3) in row 0; doc 1 (4) does not fit in what is left (3), so row 1, where
  // doc 2 (2) fits after it; doc 3 (11) is longer than a row: cut into 6 (row 2) and 5 (row 3).
  ASSERT_EQ(t.size(0), 4);
  EXPECT_EQ(ints_of(t[0]), (std::vector<std::int64_t>{300, 301, 302, -1, -1, -1}));
  EXPECT_EQ(ints_of(t[1]), (std::vector<std::int64_t>{400, 401, 402, 403, 200, 201}));
  EXPECT_EQ(ints_of(t[2]), (std::vector<std::int64_t>{1100, 1101, 1102, 1103, 1104, 1105}));
  EXPECT_EQ(ints_of(t[3]), (std::vector<std::int64_t>{1106, 1107, 1108, 1109, 1110, -1}));
  EXPECT_EQ(ints_of(b["position_ids"][1]), (std::vector<std::int64_t>{0, 1, 2, 3, 0, 1}));
  EXPECT_EQ(ints_of(b["document_ids"][0]), (std::vector<std::int64_t>{0, 0, 0, -1, -1, -1}));
  // Sequences: doc 0, row 0's padding, doc 1, doc 2, doc 3's two pieces, row 3's padding.
  EXPECT_EQ(ints_of(b["cu_seqlens"]), (std::vector<std::int64_t>{0, 3, 6, 10, 12, 18, 23, 24}));
  EXPECT_EQ(b["cu_seqlens"].scalar_type(), torch::kInt32);
  EXPECT_EQ(b["max_seqlen"].item<std::int64_t>(), 6);
}

// A token file truncated while workers read it: the worker that touches a page past the new end
// dies of SIGBUS, and the error names the file and the offset; the training process lives on.
TEST(TokenFault, AFileTruncatedUnderAWorkerIsASigbusNamingTheFileAndOffset) {
  const fs::path path =
      fs::path(::testing::TempDir()) / ("ferry_truncated_" + std::to_string(::getpid()) + ".bin");
  {
    std::vector<std::uint16_t> tokens(8 << 20);  // 16 MB
    std::iota(tokens.begin(), tokens.end(), 0);
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens.data()),
               static_cast<std::streamsize>(tokens.size() * 2));
  }
  auto dataset = std::make_shared<TokenWindows>(
      path.string(), TokenWindows::Options{.block_size = 256, .epoch_length = 4096});
  DataLoader loader(dataset, {.batch_size = 8, .num_workers = 2, .persistent_workers = true});
  auto it = loader.begin();
  ASSERT_EQ((*it)["x"].size(1), 256);
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
  try {
    for (; it != loader.end(); ++it) (void)*it;
    FAIL() << "no error";
  } catch (const WorkerDiedError& e) {
    EXPECT_THAT(e.what(), HasSubstr("SIGBUS"));
    EXPECT_THAT(e.what(), HasSubstr("reading " + path.string() + " at offset"));
    EXPECT_THAT(e.what(), HasSubstr("truncated"));
  }
  fs::remove(path);
}

// A 200 GB token file (sparse: it costs no disk): opening maps it, reading nothing, so the first
// batch comes as soon as from a small file.
TEST(TokenScale, ASparse200GbFilesFirstBatchComesAtOnce) {
  const fs::path path =
      fs::path(::testing::TempDir()) / ("ferry_sparse_" + std::to_string(::getpid()) + ".bin");
  { std::ofstream(path, std::ios::binary) << ""; }
  if (::truncate(path.c_str(), 200LL << 30) != 0) {
    fs::remove(path);
    GTEST_SKIP() << "cannot make a 200 GB sparse file in " << ::testing::TempDir();
  }
  const auto start = std::chrono::steady_clock::now();
  auto dataset = std::make_shared<TokenWindows>(
      path.string(), TokenWindows::Options{.block_size = 2048, .epoch_length = 1000});
  DataLoader loader(dataset, {.batch_size = 8, .num_workers = 2});
  auto it = loader.begin();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ((*it)["x"].sizes().vec(), (std::vector<std::int64_t>{8, 2048}));
  EXPECT_EQ((*it)["x"].sum().item<std::int64_t>(), 0) << "a sparse file reads as zeros";
  // Reading it would take minutes; mapping it, nothing (a hang guard, scaled to the load).
  EXPECT_LT(seconds, 5.0 * testing::time_scale());
  EXPECT_EQ(dataset->size(), 1000u);
  fs::remove(path);
}

#if defined(FERRY_CLI)
// As a user runs it: `ferry describe gpt` lists its keys, and a YAML pipeline with a gpt dataset
// runs with `ferry run`, every sample once.
TEST(TokenCli, DescribeAndRunAGptPipeline) {
  auto r = test::run_command(std::string(FERRY_CLI) + " describe gpt");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::AllOf(HasSubstr("seq_length"), HasSubstr("num_samples"),
                                      HasSubstr("split"), HasSubstr("cache")));
  const json& c = gpt_case(64);
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("ferry_gpt_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "gpt.yaml") << "dataset:\n  type: gpt\n  prefix: "
                                  << (kRef / c["prefix"].get<std::string>()).string()
                                  << "\n  seq_length: 64\n  num_samples: "
                                  << c["num_samples"].get<std::size_t>()
                                  << "\n  seed: " << c["seed"].get<std::size_t>()
                                  << "\nloader: {batch_size: 8, num_workers: 2}\n";
  r = test::run_command(std::string(FERRY_CLI) + " run " + (dir / "gpt.yaml").string() +
                        " --dump-indices " + (dir / "dump.jsonl").string());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string dump = test::slurp(dir / "dump.jsonl");
  std::set<std::int64_t> seen;
  std::istringstream lines(dump);
  for (std::string line; std::getline(lines, line);) {
    const json batch = json::parse(line);
    for (const auto& i : batch["indices"]) seen.insert(i.get<std::int64_t>());
  }
  EXPECT_EQ(seen.size(), c["num_samples_built"].get<std::size_t>());
  fs::remove_all(dir);
}
#endif

}  // namespace
}  // namespace ferry
