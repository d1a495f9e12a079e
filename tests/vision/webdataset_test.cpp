// WebDataset tar shards: ferry's tar writer read back by Python's tarfile, shards written by
// Python's tarfile in WebDataset's layout read by ferry (map-style through headers and through
// an index, and as a stream), the stream's cursor, and headers that lie.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/error.h"
#include "ferry/sample_context.h"
#include "ferry/vision.h"

#include "datasets/tar.h"
#include "support/command.h"

namespace {

namespace fs = std::filesystem;
using ferry::vision::detail::list_tar;
using ferry::vision::detail::TarWriter;
using ::testing::HasSubstr;

using ferry::test::slurp;

std::span<const std::uint8_t> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

std::string python() {
  const char* p = std::getenv("FERRY_REFERENCE_PYTHON");
  return p != nullptr ? p : "/usr/bin/python3";
}

// Runs a Python script with arguments; returns its stdout (fails the test on a non-zero exit).
std::string run_python(const fs::path& dir, const std::string& script, const std::string& args) {
  const fs::path file = dir / "script.py";
  std::ofstream(file) << script;
  const fs::path out = dir / "python.out";
  const std::string command =
      python() + " '" + file.string() + "' " + args + " > '" + out.string() + "'";
  const int status = std::system(command.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << command;
  return slurp(out);
}

torch::Tensor small_image(int width, int height, int seed) {
  torch::Tensor image = torch::empty({height, width, 3}, torch::kUInt8);
  auto* p = image.data_ptr<std::uint8_t>();
  for (int i = 0; i < width * height * 3; ++i)
    p[i] = static_cast<std::uint8_t>((i * 7 + seed * 31) % 251);
  return image;
}

std::string jpeg_of(int width, int height, int seed) {
  const auto bytes = ferry::vision::encode_image(small_image(width, height, seed),
                                                 ferry::vision::ImageFormat::kJpeg, 90);
  return std::string(bytes.begin(), bytes.end());
}

class WebDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ferry_wds_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(WebDatasetTest, PythonTarfileReadsWhatTheWriterWrote) {
  const fs::path shard = dir_ / "a.tar";
  std::vector<std::pair<std::string, std::string>> members{
      {"000000.cls", "3"},
      {"000000.jpg", jpeg_of(40, 30, 1)},
      {"000000.json", R"({"path":"x/y.png"})"},
      {"000001.cls", "12"},
      {"000001.jpg", std::string(512, 'z')},  // exactly one block: no padding
      {"empty.txt", ""},
      // Longer than ustar's 100-byte name: split into the 155-byte prefix.
      {std::string(80, 'd') + "/" + std::string(90, 'k') + ".bin", "long"}};
  {
    TarWriter writer(shard);
    for (const auto& [name, data] : members) writer.add(name, as_bytes(data));
    EXPECT_EQ(writer.finish() % 512, 0u);
  }
  const std::string listing = run_python(dir_, R"(
import hashlib, json, sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    out = []
    for m in t.getmembers():
        data = t.extractfile(m).read()
        out.append([m.name, m.offset_data, m.size, hashlib.sha256(data).hexdigest(), m.mode,
                    m.uid, m.mtime, m.isreg()])
print(json.dumps(out))
)",
                                         "'" + shard.string() + "'");
  const auto python_members = nlohmann::json::parse(listing);
  const auto ferry_members = list_tar(shard);
  ASSERT_EQ(python_members.size(), members.size());
  ASSERT_EQ(ferry_members.size(), members.size());
  for (std::size_t i = 0; i < members.size(); ++i) {
    const auto& p = python_members[i];
    EXPECT_EQ(p[0].get<std::string>(), members[i].first);
    EXPECT_EQ(p[1].get<std::uint64_t>(), ferry_members[i].data_offset) << members[i].first;
    EXPECT_EQ(p[2].get<std::uint64_t>(), members[i].second.size());
    EXPECT_EQ(ferry_members[i].name, members[i].first);
    EXPECT_EQ(p[4].get<int>(), 0644);
    EXPECT_EQ(p[5].get<int>(), 0);
    EXPECT_EQ(p[6].get<int>(), 0);
    EXPECT_TRUE(p[7].get<bool>());
    // The bytes: read back through ferry at the offset Python reports.
    std::string data(members[i].second.size(), '\0');
    ferry::vision::detail::TarReader(shard).read(p[1].get<std::uint64_t>(), data.size(),
                                                 reinterpret_cast<std::uint8_t*>(data.data()));
    EXPECT_EQ(data, members[i].second) << members[i].first;
  }
  // The same members written again: the same bytes.
  const fs::path again = dir_ / "b.tar";
  {
    TarWriter writer(again);
    for (const auto& [name, data] : members) writer.add(name, as_bytes(data));
    writer.finish();
  }
  EXPECT_EQ(slurp(shard), slurp(again));
}

// A shard as WebDataset's own writers lay it out, written by Python's tarfile (PAX format, the
// default since 3.8): a folder entry, keys with folders, a key whose name is long enough for a
// pax path record, a member without an extension, and an index-less read.
constexpr const char* kPythonShardWriter = R"(
import io, json, sys, tarfile
out, images = sys.argv[1], sys.argv[2:]
with tarfile.open(out, "w") as t:
    d = tarfile.TarInfo("train")
    d.type = tarfile.DIRTYPE
    t.addfile(d)
    def add(name, data):
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mtime = 1700000000
        info.uname = "someone"
        t.addfile(info, io.BytesIO(data))
    add("README", b"no extension: not part of a sample")
    keys = []
    for i, path in enumerate(images):
        key = "train/" + ("sample%03d" % i if i != 1 else "x" * 150)
        keys.append(key)
        add(key + ".cls", str(i * 10).encode())
        add(key + ".jpg", open(path, "rb").read())
        add(key + ".json", json.dumps({"i": i}).encode())
print(json.dumps(keys))
)";

TEST_F(WebDatasetTest, ReadsAShardWrittenByPythonInWebDatasetLayout) {
  std::vector<std::string> jpegs;
  std::string args = "'" + (dir_ / "py.tar").string() + "'";
  for (int i = 0; i < 3; ++i) {
    jpegs.push_back(jpeg_of(48 + i, 32, i));
    const fs::path path = dir_ / ("in" + std::to_string(i) + ".jpg");
    std::ofstream(path, std::ios::binary) << jpegs.back();
    args += " '" + path.string() + "'";
  }
  const auto keys = nlohmann::json::parse(run_python(dir_, kPythonShardWriter, args));
  ASSERT_EQ(keys.size(), 3u);

  ferry::vision::WebDataset dataset({(dir_ / "py.tar").string()});
  ASSERT_EQ(dataset.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    ferry::SampleContext ctx(0, 0, static_cast<std::int64_t>(i));
    const ferry::Example ex = dataset.get(i, ctx);
    EXPECT_EQ(ex["key"].str(), keys[i].get<std::string>());
    EXPECT_EQ(ex["label"].to_int(), static_cast<std::int64_t>(i * 10));
    const torch::Tensor expected = ferry::vision::decode_image(as_bytes(jpegs[i]));
    EXPECT_TRUE(torch::equal(ex["image"].tensor(), expected)) << i;
    const torch::Tensor json = dataset.read_field(i, "json");
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(json.data_ptr<std::uint8_t>()),
                          static_cast<std::size_t>(json.numel())),
              "{\"i\": " + std::to_string(i) + "}");
  }

  // The same through an index (DALI's v1.2, as ferry preprocess writes it), and as a stream.
  std::ofstream(dir_ / "py.tar.idx")
      << ferry::vision::detail::webdataset_index(list_tar(dir_ / "py.tar"));
  ferry::vision::WebDataset indexed({(dir_ / "py.tar").string()});
  ASSERT_EQ(indexed.size(), 3u);
  ferry::vision::WebDatasetStream::Options options;
  options.rank = 0;
  options.world_size = 1;
  ferry::vision::WebDatasetStream stream_dataset({(dir_ / "py.tar").string()}, options);
  EXPECT_EQ(stream_dataset.size_hint(), std::optional<std::size_t>(3));
  auto ctx0 = ferry::SampleContext::for_stream(0, 0, -1, 0, 1);
  auto stream = stream_dataset.stream(ctx0);
  for (std::size_t i = 0; i < 3; ++i) {
    ferry::SampleContext ctx(0, 0, static_cast<std::int64_t>(i));
    const ferry::Example a = indexed.get(i, ctx);
    EXPECT_EQ(a["key"].str(), keys[i].get<std::string>());
    EXPECT_TRUE(torch::equal(a["image"].tensor(), dataset.get(i, ctx)["image"].tensor()));
    auto sctx = ferry::SampleContext::for_stream(0, 0, static_cast<std::int64_t>(i), 0, 1);
    const auto b = stream->next(sctx);
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ((*b)["key"].str(), keys[i].get<std::string>());
    EXPECT_EQ((*b)["label"].to_int(), static_cast<std::int64_t>(i * 10));
    EXPECT_TRUE(torch::equal((*b)["image"].tensor(), a["image"].tensor()));
  }
  auto end_ctx = ferry::SampleContext::for_stream(0, 0, 3, 0, 1);
  EXPECT_FALSE(stream->next(end_ctx).has_value());
}

TEST_F(WebDatasetTest, StreamCursorResumesWhereItStood) {
  // Three shards of four samples; the stream's cursor after each sample resumes exactly.
  std::vector<std::string> shards;
  for (int s = 0; s < 3; ++s) {
    const fs::path path = dir_ / ("s-00000" + std::to_string(s) + ".tar");
    TarWriter writer(path);
    for (int k = 0; k < 4; ++k) {
      const std::string key = "k" + std::to_string(s * 4 + k);
      writer.add(key + ".cls", as_bytes(std::to_string(s * 4 + k)));
      writer.add(key + ".jpg", as_bytes(jpeg_of(16, 16, s * 4 + k)));
    }
    writer.finish();
    shards.push_back(path.string());
  }
  EXPECT_EQ(ferry::vision::expand_shards((dir_ / "s-{000000..000002}.tar").string()), shards);
  EXPECT_EQ(ferry::vision::expand_shards(dir_.string()), shards);
  ferry::vision::WebDatasetStream::Options options;
  options.rank = 0;
  options.world_size = 1;
  options.decode = false;
  const ferry::vision::WebDatasetStream dataset(shards, options);
  auto labels_from = [&](std::optional<std::string> cursor, std::size_t skip_to) {
    auto ctx = ferry::SampleContext::for_stream(0, 0, -1, 0, 1);
    auto stream = dataset.stream(ctx);
    if (cursor) stream->seek(*cursor);
    std::vector<std::int64_t> labels;
    std::vector<std::string> cursors;
    for (std::size_t i = skip_to;; ++i) {
      auto sctx = ferry::SampleContext::for_stream(0, 0, static_cast<std::int64_t>(i), 0, 1);
      auto ex = stream->next(sctx);
      if (!ex) break;
      labels.push_back((*ex)["label"].to_int());
      cursors.push_back(stream->cursor().value());
    }
    return std::make_pair(labels, cursors);
  };
  const auto [all, cursors] = labels_from(std::nullopt, 0);
  ASSERT_EQ(all.size(), 12u);
  for (std::size_t i = 0; i < 12; ++i) EXPECT_EQ(all[i], static_cast<std::int64_t>(i));
  for (std::size_t i = 0; i < cursors.size(); ++i) {
    const auto [rest, unused] = labels_from(cursors[i], i + 1);
    EXPECT_EQ(rest, std::vector<std::int64_t>(all.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                                              all.end()))
        << "cursor " << cursors[i];
  }
  // Two workers split the shards: worker 1 reads the second shard only.
  auto ctx1 = ferry::SampleContext::for_stream(0, 0, -1, 1, 2);
  auto stream1 = dataset.stream(ctx1);
  std::vector<std::int64_t> labels;
  for (std::int64_t i = 0;; ++i) {
    auto sctx = ferry::SampleContext::for_stream(0, 0, i, 1, 2);
    auto ex = stream1->next(sctx);
    if (!ex) break;
    labels.push_back((*ex)["label"].to_int());
  }
  EXPECT_EQ(labels, (std::vector<std::int64_t>{4, 5, 6, 7}));
  auto bad = dataset.stream(ctx1);
  EXPECT_THROW(bad->seek("7:0"), ferry::Error);
  EXPECT_THROW(bad->seek("nonsense"), ferry::Error);
}

TEST_F(WebDatasetTest, LyingHeadersAndStaleIndexesAreErrorsNotCrashes) {
  const fs::path shard = dir_ / "t.tar";
  {
    TarWriter writer(shard);
    writer.add("a.cls", as_bytes("1"));
    writer.add("a.jpg", as_bytes(jpeg_of(16, 16, 0)));
    writer.finish();
  }
  const std::string good = slurp(shard);
  // Cut at every block boundary and in the middle of blocks: an error or fewer members, never
  // a read past the end.
  for (std::size_t cut = 0; cut < good.size(); cut += 97) {
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << good.substr(0, cut);
    try {
      const auto members = list_tar(shard);
      EXPECT_LE(members.size(), 2u);
    } catch (const ferry::DataError& e) {
      EXPECT_THAT(e.what(), HasSubstr("t.tar"));
    }
  }
  // A size field that claims more than the file holds.
  std::string lying = good;
  lying.replace(124, 11, "77777777777");
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << lying;
  EXPECT_THROW(list_tar(shard), ferry::DataError);  // the checksum no longer matches
  // An index that points past the end of its shard.
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << good;
  std::ofstream(dir_ / "t.tar.idx") << "v1.2 1\ncls 512 1 a.cls jpg 1536 999999 a.jpg\n";
  try {
    ferry::vision::WebDataset dataset({shard.string()});
    ADD_FAILURE() << "a stale index was accepted";
  } catch (const ferry::DataError& e) {
    EXPECT_THAT(e.what(), HasSubstr("stale"));
  }
  // An index whose offsets lie inside the shard but on no member's bytes: stale.
  std::ofstream(dir_ / "t.tar.idx", std::ios::trunc)
      << "v1.2 1\ncls 100 1 a.cls jpg 1536 10 a.jpg\n";
  EXPECT_THROW(ferry::vision::WebDataset({shard.string()}), ferry::DataError);
  // A pax record whose length wraps around: an error, not an endless loop.
  {
    TarWriter writer(shard);
    writer.add("PaxHeader/a", as_bytes(std::string("18446744073709551615 path=x\n")));
    writer.add("a.jpg", as_bytes("x"));
    writer.finish();
  }
  std::string pax = slurp(shard);
  pax[156] = 'x';
  unsigned sum = 0;
  for (int i = 0; i < 512; ++i)
    sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(pax[i]);
  char digits[8];
  std::snprintf(digits, sizeof digits, "%06o", sum);
  pax.replace(148, 6, digits, 6);
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << pax;
  try {
    list_tar(shard);
    ADD_FAILURE() << "a malformed pax record was accepted";
  } catch (const ferry::DataError& e) {
    EXPECT_THAT(e.what(), HasSubstr("pax"));
  }
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << good;
  fs::remove(dir_ / "t.tar.idx");
  ferry::vision::WebDatasetOptions no_index;
  no_index.use_index = false;
  EXPECT_EQ(ferry::vision::WebDataset({shard.string()}, no_index).size(), 1u);
  EXPECT_THROW(ferry::vision::expand_shards(dir_.string() + "/x-{3..1}.tar"), ferry::DataError);
}

// A shard with bytes flipped, inserted and cut at random (a seeded run of 3,000): listing it,
// reading it map-style and streaming it either works or raises ferry::DataError; nothing reads
// out of bounds (run under ASan: FERRY_SANITIZE=address,undefined) or loops.
TEST_F(WebDatasetTest, MutatedShardsAreErrorsOrSamplesNeverCrashes) {
  const fs::path shard = dir_ / "m.tar";
  {
    TarWriter writer(shard);
    for (int k = 0; k < 3; ++k) {
      const std::string key = "dir/k" + std::to_string(k);
      writer.add(key + ".cls", as_bytes(std::to_string(k)));
      writer.add(key + ".jpg", as_bytes(jpeg_of(16, 12, k)));
    }
    writer.finish();
  }
  const std::string good = slurp(shard);
  std::mt19937 gen(15);
  std::size_t errors = 0;
  std::size_t read = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string bytes = good;
    const int edits = 1 + static_cast<int>(gen() % 4);
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = gen() % bytes.size();
      switch (gen() % 4) {
        case 0:  // a byte flipped, often in a header
          bytes[round % 2 == 0 ? at % 512 + (gen() % 4) * 512 : at] ^=
              static_cast<char>(1 + gen() % 255);
          break;
        case 1:  // a digit of a size field
          bytes[124 + gen() % 11] = static_cast<char>('0' + gen() % 8);
          break;
        case 2:
          bytes.resize(at);
          break;
        default:
          bytes.insert(at, std::string(1 + gen() % 700, static_cast<char>(gen())));
      }
      if (bytes.empty()) bytes = "x";
    }
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;
    try {
      (void)list_tar(shard);
      ferry::vision::WebDatasetOptions options;
      options.use_index = false;
      ferry::vision::WebDataset dataset({shard.string()}, options);
      for (std::size_t i = 0; i < dataset.size(); ++i) {
        ferry::SampleContext ctx(0, 0, static_cast<std::int64_t>(i));
        try {
          (void)dataset.get(i, ctx);
          ++read;
        } catch (const ferry::DataError&) {
          ++errors;
        }
      }
    } catch (const ferry::DataError&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 100u);
  EXPECT_GT(read, 100u);
}

}  // namespace
