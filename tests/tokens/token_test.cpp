// The token datasets (ferry/tokens.h) against files and values written by
// tests/tokens/make_token_reference.py: every .npy dtype and version, Megatron-LM's and fairseq's
// indexed datasets, nanoGPT's and llm.c's token files, a bad file of every kind, and Megatron-LM's
// GPTDataset indices and samples computed in Python as Megatron builds them.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/data_loader.h"
#include "ferry/error.h"
#include "ferry/registry.h"
#include "ferry/tokens.h"

#include "datasets/gpt_indices.h"
#include "datasets/token_files.h"
#include "ipc/mapped_file.h"
#include "support/files.h"
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

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The values of a tensor as int64 (integers, bool) or double (floats), for comparison with the
// manifest's numbers.
std::vector<double> values_of(const torch::Tensor& t) {
  const torch::Tensor flat = t.reshape({-1}).to(torch::kFloat64);
  return std::vector<double>(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
}

tokens::Element element(const std::string& name) { return *tokens::element_from_name(name); }

TEST(Npy, EveryDtypeAndVersionReadsAsNumPyWroteIt) {
  std::size_t files = 0;
  std::set<int> versions;
  for (const json& c : manifest()["npy"]) {
    const std::string file = (kRef / c["file"].get<std::string>()).string();
    SCOPED_TRACE(file);
    if (c["dtype"] == "uint64" && !tokens::has_unsigned_dtypes()) {
      // LibTorch 1.13 has no uint64, and int64 cannot hold these values: refused, saying so.
      EXPECT_THROW(NpyDataset{file}, ConfigError);
      ++files;
      versions.insert(c["version"].get<int>());
      continue;
    }
    const NpyDataset dataset(file);
    const auto shape = c["shape"].get<std::vector<std::int64_t>>();
    ASSERT_EQ(dataset.size(), static_cast<std::size_t>(shape[0]));
    const tokens::Element e = element(c["dtype"].get<std::string>());
    const torch::ScalarType dtype = tokens::delivered_dtype(e, TokenDtype::kAuto);
    const auto expected = c["values"].get<std::vector<double>>();
    const std::size_t per_sample =
        shape[0] == 0 ? 0 : expected.size() / static_cast<std::size_t>(shape[0]);
    SampleContext ctx(0, 0, 0);
    for (std::size_t i = 0; i < dataset.size(); ++i) {
      const Example ex = dataset.get(i, ctx);
      const torch::Tensor& t = ex["data"].tensor();
      ASSERT_EQ(t.scalar_type(), dtype);
      ASSERT_EQ(t.sizes().vec(), std::vector<std::int64_t>(shape.begin() + 1, shape.end()));
      const std::vector<double> want(
          expected.begin() + static_cast<std::ptrdiff_t>(i * per_sample),
          expected.begin() + static_cast<std::ptrdiff_t>((i + 1) * per_sample));
      ASSERT_EQ(values_of(t), want) << "sample " << i;
    }
    versions.insert(c["version"].get<int>());
    ++files;
  }
  EXPECT_EQ(versions, (std::set<int>{1, 2, 3}));
  EXPECT_GE(files, 36u);
}

TEST(Npy, TokensConvertToInt64OnRequestAndUnsignedKeepTheirValues) {
  const json* u16 = nullptr;
  for (const json& c : manifest()["npy"]) {
    if (c["dtype"] == "uint16" && c["version"] == 1) u16 = &c;
  }
  ASSERT_NE(u16, nullptr);
  const NpyDataset dataset((kRef / (*u16)["file"].get<std::string>()).string(),
                           {.field = "ids", .dtype = TokenDtype::kInt64});
  SampleContext ctx(0, 0, 0);
  const Example ex = dataset.get(0, ctx);
  EXPECT_EQ(ex["ids"].tensor().scalar_type(), torch::kInt64);
  const auto values = (*u16)["values"].get<std::vector<std::int64_t>>();
  EXPECT_EQ(ints_of(ex["ids"].tensor()),
            std::vector<std::int64_t>(values.begin(), values.begin() + 3));
  EXPECT_GT(*std::max_element(values.begin(), values.end()), 32767) << "the test needs a value "
                                                                       "above int16's range";
  EXPECT_THAT(
      [&] {
        NpyDataset((kRef / (*u16)["file"].get<std::string>()).string(),
                   {.dtype = TokenDtype::kInt32});
      },
      ::testing::Not(::testing::Throws<ConfigError>()));
}

// What a worker's fatal-signal handler prints for an address in a mapped token file: a read past
// a truncated end (SIGBUS), or a write to the read-only view (SIGSEGV).
TEST(MappedFile, AFaultsAddressIsNamedAsFileAndOffsetReadOrWrite) {
  const fs::path path = kRef / "nanogpt/train_u16.bin";
  const ipc::MappedFile mapped = ipc::MappedFile::open(path);
  ASSERT_GT(mapped.size(), 100u);
  auto described = [&](const void* address, bool segv) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    const bool found = ipc::describe_fault(address, fds[1], segv);
    ::close(fds[1]);
    std::string text;
    char buffer[512];
    for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) text.append(buffer, n);
    ::close(fds[0]);
    return std::make_pair(found, text);
  };
  const auto [read_found, read_text] = described(mapped.data() + 100, false);
  EXPECT_TRUE(read_found);
  EXPECT_THAT(read_text, HasSubstr("reading " + path.string() +
                                   " at offset 100 (the file is "
                                   "shorter than when it was mapped"));
  const auto [write_found, write_text] = described(mapped.data() + 7, true);
  EXPECT_TRUE(write_found);
  EXPECT_THAT(write_text, HasSubstr("writing to the read-only mapping of " + path.string() +
                                    " at offset 7 (samples that view a mapped file are "
                                    "read-only: clone() one to change it)"));
  int elsewhere = 0;
  EXPECT_EQ(described(&elsewhere, true), std::make_pair(false, std::string()));
}

TEST(Npy, BadFilesAreDataErrorsNamingTheFileAndTheField) {
  for (const json& c : manifest()["npy_bad"]) {
    const std::string file = (kRef / c["file"].get<std::string>()).string();
    try {
      NpyDataset dataset(file);
      ADD_FAILURE() << file << " was read";
    } catch (const DataError& e) {
      EXPECT_THAT(lower(e.what()), HasSubstr(c["expect"].get<std::string>())) << file;
      EXPECT_THAT(e.what(), HasSubstr(file));
    }
  }
  EXPECT_THROW(NpyDataset((kRef / "no-such.npy").string()), DataError);
}

TEST(Indexed, MegatronAndFairseqSequencesAndDocumentsReadBack) {
  std::set<std::string> kinds;
  for (const json& c : manifest()["indexed"]) {
    const std::string prefix = (kRef / c["prefix"].get<std::string>()).string();
    SCOPED_TRACE(prefix);
    const IndexedDataset dataset(prefix);
    const auto sequences = c["sequences"].get<std::vector<std::vector<std::int64_t>>>();
    ASSERT_EQ(dataset.size(), sequences.size());
    SampleContext ctx(0, 0, 0);
    for (std::size_t i = 0; i < sequences.size(); ++i) {
      const Example ex = dataset.get(i, ctx);
      ASSERT_EQ(ints_of(ex["tokens"].tensor()), sequences[i]) << "sequence " << i;
      ASSERT_EQ(ex["tokens"].tensor().scalar_type(),
                tokens::delivered_dtype(element(c["dtype"].get<std::string>()), TokenDtype::kAuto));
    }
    const tokens::IndexedFile file = tokens::IndexedFile::open(prefix);
    EXPECT_EQ(file.layout() == tokens::IndexedFile::Layout::kMegatron ? "megatron" : "fairseq",
              c["kind"].get<std::string>());
    if (c.contains("document_indices")) {
      const auto documents = c["document_indices"].get<std::vector<std::int64_t>>();
      ASSERT_EQ(file.documents() + 1, documents.size());
      for (std::size_t d = 0; d < documents.size(); ++d) {
        EXPECT_EQ(file.document_start(d), documents[d]);
      }
    }
    kinds.insert(c["kind"].get<std::string>());
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"megatron", "fairseq"}));
}

TEST(Indexed, BadFilesAreDataErrorsAtOpenNamingTheFileAndTheField) {
  for (const json& c : manifest()["indexed_bad"]) {
    const std::string prefix = (kRef / c["prefix"].get<std::string>()).string();
    try {
      IndexedDataset dataset(prefix);
      ADD_FAILURE() << prefix << " was read (" << c["note"] << ")";
    } catch (const DataError& e) {
      EXPECT_THAT(lower(e.what()), HasSubstr(c["expect"].get<std::string>()))
          << prefix << ": " << c["note"];
      EXPECT_THAT(e.what(), HasSubstr(prefix));
    }
  }
}

TEST(TokenFiles, NanoGptAndLlmcFilesReadBack) {
  for (const char* key : {"nanogpt", "llmc"}) {
    for (const json& c : manifest()[key]) {
      const fs::path path = kRef / c["file"].get<std::string>();
      SCOPED_TRACE(path.string());
      const tokens::TokenFile file =
          tokens::TokenFile::open(path, "auto", element(c["dtype"].get<std::string>()));
      EXPECT_EQ(file.format(), std::string(key) == "llmc" ? "llmc" : "bin");
      EXPECT_EQ(file.element(), element(c["dtype"].get<std::string>()));
      const auto values = c["values"].get<std::vector<std::int64_t>>();
      ASSERT_EQ(file.count(), values.size());
      std::vector<std::int64_t> read(file.count());
      tokens::convert(file.data(), file.element(), file.count(), read.data(), torch::kInt64);
      EXPECT_EQ(read, values);
    }
  }
}

TEST(TokenFiles, BadLlmcShardsAndRawFilesOfTheWrongSizeAreDataErrors) {
  for (const json& c : manifest()["llmc_bad"]) {
    const fs::path path = kRef / c["file"].get<std::string>();
    try {
      (void)tokens::TokenFile::open(path, "llmc", tokens::Element::kUInt16);
      ADD_FAILURE() << path << " was read";
    } catch (const DataError& e) {
      EXPECT_THAT(lower(e.what()), HasSubstr(c["expect"].get<std::string>())) << path;
      EXPECT_THAT(e.what(), HasSubstr(path.string()));
    }
  }
  // A raw uint16 file read as uint32 whose size is not a multiple of 4.
  const fs::path odd = fs::path(::testing::TempDir()) / "ferry_odd_tokens.bin";
  std::ofstream(odd, std::ios::binary) << std::string(6, '\1');
  EXPECT_THROW((void)tokens::TokenFile::open(odd, "bin", tokens::Element::kUInt32), DataError);
  fs::remove(odd);
}

// ---- GPT ----

GptDataset::Options options_of(const json& c) {
  GptDataset::Options o;
  o.seq_length = c["seq_length"].get<std::size_t>();
  o.num_samples = c["num_samples"].get<std::size_t>();
  o.seed = c["seed"].get<std::uint32_t>();
  o.split = c["split"].get<std::string>();
  o.split_name = tokens::split_name(c["split_index"].get<int>());
  o.add_extra_token = c["add_extra_token"].get<bool>();
  return o;
}

std::vector<std::int64_t> ints(const tokens::IntArray& a) {
  std::vector<std::int64_t> out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) out[i] = a[i];
  return out;
}

void expect_case(const GptDataset& dataset, const json& c) {
  ASSERT_EQ(dataset.size(), c["num_samples_built"].get<std::size_t>());
  const tokens::GptIndices& x = dataset.indices();
  EXPECT_EQ(ints(x.document_index), c["document_index"].get<std::vector<std::int64_t>>());
  std::vector<std::int64_t> sample_index;
  for (const auto& row : c["sample_index"]) {
    sample_index.push_back(row[0].get<std::int64_t>());
    sample_index.push_back(row[1].get<std::int64_t>());
  }
  EXPECT_EQ(ints(x.sample_index), sample_index);
  EXPECT_EQ(ints(x.shuffle_index), c["shuffle_index"].get<std::vector<std::int64_t>>());
  const auto ids = c["sample_ids"].get<std::vector<std::size_t>>();
  const auto samples = c["samples"].get<std::vector<std::vector<std::int64_t>>>();
  ASSERT_EQ(ids.size(), samples.size());
  const std::size_t L = c["seq_length"].get<std::size_t>();
  const bool extra = c["add_extra_token"].get<bool>();
  for (std::size_t k = 0; k < ids.size(); ++k) {
    ASSERT_EQ(dataset.window(ids[k]), samples[k]) << "sample " << ids[k];
    SampleContext ctx(0, 0, static_cast<std::int64_t>(ids[k]));
    const Example ex = dataset.get(ids[k], ctx);
    const auto tokens = ints_of(ex["tokens"].tensor());
    const auto labels = ints_of(ex["labels"].tensor());
    ASSERT_EQ(tokens, std::vector<std::int64_t>(
                          samples[k].begin(), samples[k].begin() + static_cast<std::ptrdiff_t>(L)));
    std::vector<std::int64_t> want(samples[k].begin() + 1, samples[k].end());
    if (!extra) want.push_back(0);  // the pad token
    ASSERT_EQ(labels, want) << "sample " << ids[k];
  }
}

TEST(Gpt, IndicesAndSamplesEqualMegatronsForSeedsLengthsEpochsAndSplits) {
  std::set<bool> separate;
  std::set<std::size_t> epochs, lengths;
  for (const json& c : manifest()["gpt"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const GptDataset dataset((kRef / c["prefix"].get<std::string>()).string(), options_of(c));
    EXPECT_EQ(dataset.indices().num_epochs, c["num_epochs"].get<std::size_t>());
    EXPECT_EQ(dataset.indices().separate_final_epoch, c["separate_final_epoch"].get<bool>());
    expect_case(dataset, c);
    separate.insert(c["separate_final_epoch"].get<bool>());
    epochs.insert(c["num_epochs"].get<std::size_t>());
    lengths.insert(c["seq_length"].get<std::size_t>());
  }
  EXPECT_EQ(separate, (std::set<bool>{false, true}));
  EXPECT_GE(epochs.size(), 3u);
  EXPECT_GE(lengths.size(), 3u);
}

TEST(Gpt, MegatronsCachedIndicesAreReadAndFerrysOwnAreWrittenInTheSameForm) {
  for (const json& c : manifest()["gpt"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    // Megatron's cache folder: the arrays are read (not built) and give the same samples.
    GptDataset::Options o = options_of(c);
    o.cache = (kRef / c["cache"].get<std::string>()).string();
    const GptDataset cached((kRef / c["prefix"].get<std::string>()).string(), o);
    EXPECT_EQ(cached.indices().num_epochs, 0u) << "read, not built";
    expect_case(cached, c);
  }
  // Written by ferry where there is none, then read back by another instance.
  const json& c = manifest()["gpt"][1];
  const fs::path folder =
      fs::path(::testing::TempDir()) / ("ferry_gpt_cache_" + std::to_string(::getpid()));
  fs::remove_all(folder);
  GptDataset::Options o = options_of(c);
  o.cache = folder.string();
  const GptDataset built((kRef / c["prefix"].get<std::string>()).string(), o);
  EXPECT_GT(built.indices().num_epochs, 0u) << "built";
  const auto names = testing::names_in(folder);
  EXPECT_EQ(names.size(), 4u);
  for (const char* file :
       {"document_index.npy", "sample_index.npy", "shuffle_index.npy", "description.txt"}) {
    EXPECT_TRUE(std::any_of(names.begin(), names.end(), [&](const std::string& n) {
      return n == built.cache_hash() + "-GPTDataset-" +
                      tokens::split_name(c["split_index"].get<int>()) + "-" + file;
    })) << file;
  }
  const GptDataset reread((kRef / c["prefix"].get<std::string>()).string(), o);
  EXPECT_EQ(reread.indices().num_epochs, 0u) << "read back";
  expect_case(reread, c);
  // The files are .npy arrays of Megatron's dtypes.
  const auto document = tokens::NpyArray::open(
      folder / (built.cache_hash() + "-GPTDataset-train-document_index.npy"));
  EXPECT_EQ(document.element(), tokens::Element::kInt32);
  const auto sample =
      tokens::NpyArray::open(folder / (built.cache_hash() + "-GPTDataset-train-sample_index.npy"));
  EXPECT_EQ(sample.shape().size(), 2u);
  const auto shuffle =
      tokens::NpyArray::open(folder / (built.cache_hash() + "-GPTDataset-train-shuffle_index.npy"));
  EXPECT_EQ(shuffle.element(), tokens::Element::kUInt32);
  fs::remove_all(folder);
}

TEST(Gpt, ACacheOfAnotherConfigurationIsNeverTakenForThisOne) {
  const json* a = nullptr;
  for (const json& c : manifest()["gpt"]) {
    if (c["seq_length"] == 64 && c["add_extra_token"] == true) a = &c;
  }
  ASSERT_NE(a, nullptr);
  const fs::path cache = kRef / (*a)["cache"].get<std::string>();
  // Its description says seq_length 64: for 16 the indices are built instead, and are right.
  GptDataset::Options o = options_of(*a);
  o.seq_length = 16;
  o.num_samples.reset();
  o.cache = cache.string();
  const fs::path scratch =
      fs::path(::testing::TempDir()) / ("ferry_gpt_other_" + std::to_string(::getpid()));
  fs::remove_all(scratch);
  fs::create_directories(scratch);
  for (const std::string& name : testing::names_in(cache)) fs::copy(cache / name, scratch / name);
  o.cache = scratch.string();
  const GptDataset rebuilt((kRef / (*a)["prefix"].get<std::string>()).string(), o);
  EXPECT_GT(rebuilt.indices().num_epochs, 0u) << "built, not read";
  o.cache.clear();
  const GptDataset fresh((kRef / (*a)["prefix"].get<std::string>()).string(), o);
  EXPECT_EQ(rebuilt.window(3), fresh.window(3));
  // Without a description nothing says whose they are: they are taken, and found at open not
  // to fit this .idx (their windows are not this split's tokens), a DataError saying so.
  fs::remove_all(scratch);
  fs::create_directories(scratch);
  for (const std::string& name : testing::names_in(cache)) {
    if (name.find("description") == std::string::npos) fs::copy(cache / name, scratch / name);
  }
  o.cache = scratch.string();
  EXPECT_THAT([&] { (void)GptDataset((kRef / (*a)["prefix"].get<std::string>()).string(), o); },
              ::testing::ThrowsMessage<DataError>(
                  ::testing::AllOf(HasSubstr("do not fit"), HasSubstr(scratch.string()),
                                   HasSubstr("they were built from other files"))));
  fs::remove_all(scratch);
}

// A corpus tokenized again keeps its sequences' count, not their lengths: ferry's own cached
// indices of the old files are never read for the new ones (its hash covers every length),
// and a set asked for by name that does not fit is a DataError at open.
TEST(Gpt, IndicesCachedForOtherFilesOfTheSameNameAreNeverServed) {
  const json* a = nullptr;
  for (const json& c : manifest()["gpt"]) {
    if (c["seq_length"] == 64 && c["add_extra_token"] == true) a = &c;
  }
  ASSERT_NE(a, nullptr);
  const fs::path from = kRef / (*a)["prefix"].get<std::string>();
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("ferry_gpt_retokenized_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "cache");
  const std::string prefix = (dir / "corpus").string();
  fs::copy(from.string() + ".idx", prefix + ".idx");
  fs::copy(from.string() + ".bin", prefix + ".bin");
  GptDataset::Options o = options_of(*a);
  o.cache = (dir / "cache").string();
  const GptDataset before(prefix, o);
  const std::string old_hash = before.cache_hash();
  ASSERT_FALSE(testing::names_in(dir / "cache").empty()) << "ferry wrote its indices";

  // "Retokenized": the same number of sequences, the first two lengths moved by one token.
  tokens::IndexedFile file = tokens::IndexedFile::open(prefix);
  ASSERT_GT(file.sequences(), 2u);
  const std::int64_t first = file.length(0);
  const std::int64_t second = file.length(1);
  {
    std::fstream idx(prefix + ".idx", std::ios::in | std::ios::out | std::ios::binary);
    // Megatron's .idx: 9 magic + 8 version + 1 dtype + 8 sequences + 8 documents, then int32
    // lengths.
    idx.seekp(34);
    const std::int32_t moved[2] = {static_cast<std::int32_t>(first - 1),
                                   static_cast<std::int32_t>(second + 1)};
    idx.write(reinterpret_cast<const char*>(moved), sizeof moved);
  }
  // Megatron's pointers follow the lengths: the second sequence now starts a token earlier.
  {
    std::fstream idx(prefix + ".idx", std::ios::in | std::ios::out | std::ios::binary);
    idx.seekg(34 + 4 * static_cast<std::streamoff>(file.sequences()) + 8);
    std::int64_t pointer = 0;
    idx.read(reinterpret_cast<char*>(&pointer), sizeof pointer);
    pointer -= static_cast<std::int64_t>(tokens::element_size(file.element()));
    idx.seekp(34 + 4 * static_cast<std::streamoff>(file.sequences()) + 8);
    idx.write(reinterpret_cast<const char*>(&pointer), sizeof pointer);
  }
  const GptDataset after(prefix, o);
  EXPECT_NE(after.cache_hash(), old_hash);
  GptDataset::Options fresh_options = o;
  fresh_options.cache.clear();
  const GptDataset fresh(prefix, fresh_options);
  ASSERT_EQ(after.size(), fresh.size());
  for (std::size_t i = 0; i < after.size(); ++i) {
    ASSERT_EQ(after.window(i), fresh.window(i)) << "sample " << i;
  }
  // The old set asked for by name: its description records other files.
  o.cache_hash = old_hash;
  EXPECT_THAT(
      [&] { (void)GptDataset(prefix, o); },
      ::testing::ThrowsMessage<ConfigError>(::testing::AllOf(
          HasSubstr(old_hash), HasSubstr("ferry_files"), HasSubstr("are not this dataset's"))));
  fs::remove_all(dir);
}

TEST(NumpyRandomState, ShufflesAsNumPysLegacyGeneratorDoes) {
  // numpy.random.RandomState(0).permutation(10) and (42): [2 8 4 9 1 6 7 3 0 5],
  // [8 1 5 0 7 2 9 4 3 6].
  for (const auto& [seed, want] :
       {std::pair<std::uint32_t, std::vector<int>>{0, {2, 8, 4, 9, 1, 6, 7, 3, 0, 5}},
        {42, {8, 1, 5, 0, 7, 2, 9, 4, 3, 6}}}) {
    tokens::NumpyRandomState random(seed);
    std::vector<int> v(10);
    for (int i = 0; i < 10; ++i) v[static_cast<std::size_t>(i)] = i;
    random.shuffle(v.data(), v.size());
    EXPECT_EQ(v, want) << "seed " << seed;
  }
}

// Without the extra token the last label is pad_token, in the labels' dtype (uint16 where
// LibTorch has it, int32 on 1.13): one it cannot hold is a ConfigError, not a wrapped value.
TEST(Gpt, APadTokenTheLabelsCannotHoldIsAConfigError) {
  const json* c = nullptr;
  for (const json& g : manifest()["gpt"]) {
    if (g["add_extra_token"] == false) c = &g;
  }
  ASSERT_NE(c, nullptr);
  const std::string prefix = (kRef / (*c)["prefix"].get<std::string>()).string();
  GptDataset::Options o = options_of(*c);
  o.pad_token = std::int64_t{1} << 40;
  EXPECT_THAT([&] { (void)GptDataset(prefix, o); },
              ::testing::ThrowsMessage<ConfigError>(::testing::AllOf(
                  HasSubstr("pad_token=1099511627776 does not fit"), HasSubstr(prefix))));
  o.dtype = TokenDtype::kInt64;  // int64 labels hold it
  const GptDataset wide(prefix, o);
  SampleContext ctx(0, 0, 0);
  const Example ex = wide.get(0, ctx);
  EXPECT_EQ(ex["labels"].tensor()[-1].item<std::int64_t>(), std::int64_t{1} << 40);
}

TEST(Gpt, ASplitThatIsNotNumbersIsAConfigErrorNamingIt) {
  const json& c = manifest()["gpt"][0];
  GptDataset::Options o = options_of(c);
  for (const std::string split : {"1,.,1", "1.2.3,1", "9,a"}) {
    o.split = split;
    if (split == "9,a") {  // Megatron reads the numbers in it: 9 and nothing, all train
      EXPECT_NO_THROW((void)GptDataset((kRef / c["prefix"].get<std::string>()).string(), o));
      continue;
    }
    EXPECT_THAT([&] { (void)GptDataset((kRef / c["prefix"].get<std::string>()).string(), o); },
                ::testing::ThrowsMessage<ConfigError>(::testing::AllOf(
                    HasSubstr("split='" + split + "'"), HasSubstr("not a number"))))
        << split;
  }
}

}  // namespace
}  // namespace ferry
