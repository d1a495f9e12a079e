// `ferry preprocess`, run as a user runs it: shards and trees the same with any number of
// workers, read back by Python's tarfile and by ferry's webdataset dataset; killed at every
// step of a part (and at random moments) and run again to the same bytes; a changed config
// refused; bad inputs skipped and listed, or stopping the job; config errors with their place.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/sample_context.h"
#include "ferry/vision.h"

#include "support/command.h"
#include "support/files.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

using Result = ferry::test::CommandResult;
using ferry::test::slurp;

// Every regular file under `dir` (hidden ones too), by relative path.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const fs::path& file : ferry::testing::files_under(dir)) {
    if (fs::is_regular_file(file)) files[fs::relative(file, dir).string()] = slurp(file);
  }
  return files;
}

std::vector<std::string> names_of(const std::map<std::string, std::string>& files) {
  std::vector<std::string> names;
  for (const auto& [name, unused] : files) names.push_back(name);
  return names;
}

bool has_temporaries(const fs::path& dir) {
  for (const fs::path& file : ferry::testing::files_under(dir)) {
    if (file.string().find(".partial") != std::string::npos) return true;
  }
  return false;
}

class Preprocess : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = fs::temp_directory_path() / ("ferry_pre_data_" + std::to_string(::getpid()));
    fs::remove_all(data_);
    const Result r = run_ferry("sample-data '" + data_.string() + "' --per-class 10 --size 120x90");
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() { fs::remove_all(data_); }
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ferry_pre_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static Result run_ferry(const std::string& args, const std::string& env = "") {
    return ferry::test::run_command(env + " " + FERRY_CLI + " " + args);
  }

  // A job over the sample data (40 images in 4 classes), in shards of 6: 7 parts.
  fs::path job(const std::string& name,
               const std::string& output_extra = "",
               const std::string& extra = "",
               const std::string& cut = "shard_samples: 6") const {
    const fs::path file = dir_ / (name + ".yaml");
    std::ofstream(file) << "input: {image_folder: {root: '" << data_.string() << "'}}\n"
                        << "transforms:\n  - resize: {size: 64}\n  - center_crop: {size: 56}\n"
                        << "output: {path: " << name << ", " << cut << output_extra << "}\n"
                        << extra;
    return file;
  }

  static fs::path data_;
  fs::path dir_;
};

fs::path Preprocess::data_;

TEST_F(Preprocess, OutputIsTheSameWithAnyNumberOfWorkers) {
  std::map<std::string, std::string> first;
  for (const char* workers : {"0", "1", "3"}) {
    const std::string name = std::string("w") + workers;
    const Result r = run_ferry("preprocess '" + job(name).string() + "' --set workers=" + workers);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("complete"));
    const auto files = snapshot(dir_ / name);
    if (first.empty()) {
      first = files;
      EXPECT_THAT(
          names_of(files),
          ::testing::IsSupersetOf({"shard-000000.tar", "shard-000000.tar.idx", "shard-000006.tar",
                                   "stats.json", ".ferry-preprocess/job.json"}));
      EXPECT_EQ(files.count("shard-000007.tar"), 0u);
    } else {
      EXPECT_EQ(names_of(files), names_of(first)) << workers << " workers";
      EXPECT_TRUE(files == first) << workers << " workers wrote other bytes";
    }
  }
  // The statistics: every image, per class, mean and std of the output pixels in [0, 1].
  const json stats = json::parse(first.at("stats.json"));
  EXPECT_EQ(stats["images"], 40);
  EXPECT_EQ(stats["skipped"], 0);
  EXPECT_EQ(stats["classes"]["class0"], 10);
  EXPECT_EQ(stats["pixels"], 40 * 56 * 56);
  EXPECT_EQ(stats["output_shorter_side"]["0-63"], 40);
  EXPECT_EQ(stats["input_shorter_side"]["64-127"], 40);
  ASSERT_EQ(stats["mean"].size(), 3u);
  for (int c = 0; c < 3; ++c) {
    EXPECT_GT(stats["mean"][c].get<double>(), 0.05);
    EXPECT_LT(stats["mean"][c].get<double>(), 0.95);
    EXPECT_GT(stats["std"][c].get<double>(), 0.01);
  }

  // A seeded shuffle: another order, the same with any number of workers, every key once.
  const Result a =
      run_ferry("preprocess '" + job("s0", "", "shuffle_seed: 7\nworkers: 0\n").string() + "'");
  const Result b =
      run_ferry("preprocess '" + job("s2", "", "shuffle_seed: 7\nworkers: 2\n").string() + "'");
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  const auto s0 = snapshot(dir_ / "s0");
  EXPECT_TRUE(s0 == snapshot(dir_ / "s2"));
  EXPECT_NE(s0.at("shard-000000.tar"), first.at("shard-000000.tar"));
}

TEST_F(Preprocess, ShardsReadBackByPythonTarfileAndByFerry) {
  ASSERT_EQ(run_ferry("preprocess '" + job("out").string() + "'").code, 0);
  const fs::path out = dir_ / "out";
  // Python's tarfile: names, order, offsets and bytes of every member.
  const fs::path script = dir_ / "read.py";
  std::ofstream(script) << R"(
import hashlib, json, sys, tarfile
shards = sys.argv[1:]
result = []
for path in shards:
    with tarfile.open(path) as t:
        result.append([[m.name, m.offset_data, m.size,
                        hashlib.sha256(t.extractfile(m).read()).hexdigest()]
                       for m in t.getmembers()])
print(json.dumps(result))
)";
  std::string args;
  for (int s = 0; s < 7; ++s)
    args += " '" + (out / ("shard-00000" + std::to_string(s) + ".tar")).string() + "'";
  const fs::path listing = dir_ / "listing.json";
  ASSERT_EQ(std::system(("/usr/bin/python3 '" + script.string() + "'" + args + " > '" +
                         listing.string() + "'")
                            .c_str()),
            0);
  const json shards = json::parse(slurp(listing));
  ASSERT_EQ(shards.size(), 7u);
  ferry::vision::ImageFolder folder(data_.string());
  const ferry::vision::WebDataset dataset(
      ferry::vision::expand_shards((out / "shard-{000000..000006}.tar").string()));
  ASSERT_EQ(dataset.size(), 40u);
  std::size_t sample = 0;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const auto& members = shards[s];
    EXPECT_EQ(members.size(), s < 6 ? 18u : 12u);  // 6 samples of 3 members; 4 in the last
    // The index beside the shard: DALI's v1.2, offsets as Python sees them.
    std::istringstream index(slurp(out / ("shard-00000" + std::to_string(s) + ".tar.idx")));
    std::string version;
    std::size_t count = 0;
    index >> version >> count;
    EXPECT_EQ(version, "v1.2");
    EXPECT_EQ(count, members.size() / 3);
    for (std::size_t m = 0; m < members.size(); m += 3, ++sample) {
      const std::string key = members[m][0].get<std::string>().substr(0, 6);
      char expected_key[16];
      std::snprintf(expected_key, sizeof expected_key, "%06zu", sample);
      EXPECT_EQ(key, expected_key);
      EXPECT_EQ(members[m][0].get<std::string>(), key + ".cls");
      EXPECT_EQ(members[m + 1][0].get<std::string>(), key + ".jpg");
      EXPECT_EQ(members[m + 2][0].get<std::string>(), key + ".json");
      for (std::size_t k = 0; k < 3; ++k) {
        std::string ext;
        std::uint64_t offset = 0;
        std::uint64_t size = 0;
        std::string name;
        index >> ext >> offset >> size >> name;
        EXPECT_EQ(name, members[m + k][0].get<std::string>());
        EXPECT_EQ(offset, members[m + k][1].get<std::uint64_t>());
        EXPECT_EQ(size, members[m + k][2].get<std::uint64_t>());
      }
      // ferry reads the same sample: its label, and the image the job made of the input.
      ferry::SampleContext ctx(0, 0, static_cast<std::int64_t>(sample));
      const ferry::Example ex = dataset.get(sample, ctx);
      EXPECT_EQ(ex["key"].str(), key);
      EXPECT_EQ(ex["label"].to_int(), folder.items()[sample].label);
      EXPECT_EQ(ex["image"].tensor().sizes(), (std::vector<std::int64_t>{56, 56, 3}));
      const torch::Tensor meta = dataset.read_field(sample, "json");
      const json j = json::parse(
          std::string(reinterpret_cast<const char*>(meta.data_ptr<std::uint8_t>()), meta.numel()));
      EXPECT_EQ(fs::path(data_ / j["path"].get<std::string>()),
                fs::path(folder.items()[sample].path));
      EXPECT_EQ(j["original_width"], 120);
      EXPECT_EQ(j["class"], "class" + std::to_string(folder.items()[sample].label));
    }
  }
  EXPECT_EQ(sample, 40u);
}

// SIGKILL at each step of writing a part, then the same command again: the same bytes as a run
// never stopped, no temporary left, and only the parts in progress done again.
TEST_F(Preprocess, KilledAtEveryStepResumesToTheSameBytes) {
  ASSERT_EQ(run_ferry("preprocess '" + job("reference").string() + "'").code, 0);
  const auto reference = snapshot(dir_ / "reference");
  const std::vector<std::string> points{"shard-written:1",  "shard-written:4",  "index-written:2",
                                        "record-written:1", "record-written:5", "part-done:3",
                                        "part-done:7"};
  for (const std::string& point : points) {
    const std::string name = "k" + std::to_string(&point - points.data());
    const fs::path file = job(name, "", "workers: 2\n");
    const Result killed =
        run_ferry("preprocess '" + file.string() + "'", "FERRY_PREPROCESS_KILL_AT=" + point);
    EXPECT_EQ(killed.code, 128 + SIGKILL) << point << ": " << killed.err;
    const Result resumed = run_ferry("preprocess '" + file.string() + "' --json '" +
                                     (dir_ / (name + ".json")).string() + "'");
    ASSERT_EQ(resumed.code, 0) << point << ": " << resumed.err;
    EXPECT_FALSE(has_temporaries(dir_ / name)) << point;
    const auto files = snapshot(dir_ / name);
    EXPECT_EQ(names_of(files), names_of(reference)) << point;
    EXPECT_TRUE(files == reference) << point << ": other bytes after resuming";
    const json summary = json::parse(slurp(dir_ / (name + ".json")));
    const int n = std::stoi(point.substr(point.find(':') + 1));
    // Parts recorded before the kill are not written again.
    const int done_before = point.rfind("part-done", 0) == 0 ? n : n - 1;
    EXPECT_EQ(summary["parts_done_before"], done_before) << point;
    EXPECT_EQ(summary["parts_written"], 7 - done_before) << point;
    EXPECT_TRUE(summary["complete"].get<bool>());
  }
  // A record that lies (cut short), and one whose shard is gone: both parts are written again.
  const fs::path k1 = dir_ / "k1";
  const std::string record = slurp(k1 / ".ferry-preprocess" / "part-000002.json");
  std::ofstream(k1 / ".ferry-preprocess" / "part-000002.json", std::ios::trunc)
      << record.substr(0, record.size() / 2);
  fs::remove(k1 / "shard-000005.tar");
  const Result repaired = run_ferry("preprocess '" + (dir_ / "k1.yaml").string() + "' --json '" +
                                    (dir_ / "repaired.json").string() + "'");
  ASSERT_EQ(repaired.code, 0) << repaired.err;
  EXPECT_THAT(repaired.err,
              AllOf(HasSubstr("part 2 is written again"), HasSubstr("part 5 is written again")));
  EXPECT_EQ(json::parse(slurp(dir_ / "repaired.json"))["parts_written"], 2);
  EXPECT_TRUE(snapshot(k1) == reference);
  // Run once more on a finished job: nothing to do, nothing changes.
  const Result again = run_ferry("preprocess '" + job("k0").string() + "'");
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_TRUE(snapshot(dir_ / "k0") == reference);
}

TEST_F(Preprocess, KilledAtRandomMomentsResumesToTheSameBytes) {
  ASSERT_EQ(run_ferry("preprocess '" + job("reference").string() + "'").code, 0);
  const auto reference = snapshot(dir_ / "reference");
  for (unsigned seed : {1u, 2u, 3u, 4u}) {
    std::mt19937 gen(seed);
    const std::string name = "r" + std::to_string(seed);
    const fs::path file = job(name, "", "workers: 2\n");
    // Two kills at random moments (between 0 and 0.6 s), then a run to the end.
    for (int k = 0; k < 2; ++k) {
      const double after = std::uniform_real_distribution<double>(0.0, 0.6)(gen);
      char t[32];
      std::snprintf(t, sizeof t, "%.3f", after);
      (void)run_ferry("preprocess '" + file.string() + "'", std::string("timeout -s KILL ") + t);
    }
    const Result resumed = run_ferry("preprocess '" + file.string() + "'");
    ASSERT_EQ(resumed.code, 0) << "seed " << seed << ": " << resumed.err;
    EXPECT_FALSE(has_temporaries(dir_ / name)) << "seed " << seed;
    EXPECT_TRUE(snapshot(dir_ / name) == reference) << "seed " << seed;
  }
}

TEST_F(Preprocess, ImageTreeMirrorsTheInputAndResumes) {
  const fs::path file = job("tree", ", format: tree, image_format: png", "workers: 2\n");
  const Result killed =
      run_ferry("preprocess '" + file.string() + "'", "FERRY_PREPROCESS_KILL_AT=image-written:9");
  EXPECT_EQ(killed.code, 128 + SIGKILL) << killed.err;
  const Result r = run_ferry("preprocess '" + file.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(has_temporaries(dir_ / "tree"));
  const Result again =
      run_ferry("preprocess '" +
                job("tree0", ", format: tree, image_format: png", "workers: 0\n").string() + "'");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_TRUE(snapshot(dir_ / "tree") == snapshot(dir_ / "tree0"));
  ferry::vision::ImageFolder folder(data_.string());
  for (const auto& item : folder.items()) {
    fs::path rel = fs::relative(item.path, data_);
    rel.replace_extension(".png");
    const fs::path written = dir_ / "tree" / rel;
    ASSERT_TRUE(fs::exists(written)) << written;
    const std::string bytes = slurp(written);
    const torch::Tensor image = ferry::vision::decode_image(
        {reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()});
    EXPECT_EQ(image.sizes(), (std::vector<std::int64_t>{56, 56, 3}));
  }
}

// Shards as the input of another job (WebP into a tree, when this OpenCV writes WebP).
TEST_F(Preprocess, ShardsAreAnInputAndWebPAnOutput) {
  ASSERT_EQ(run_ferry("preprocess '" + job("shards").string() + "'").code, 0);
  const bool webp = ferry::vision::can_encode(ferry::vision::ImageFormat::kWebp);
  const fs::path file = dir_ / "again.yaml";
  std::ofstream(file) << "input: {webdataset: {shards: shards}}\n"
                      << "transforms: [{resize: {size: 32}}]\n"
                      << "output: {path: again, format: tree, image_format: "
                      << (webp ? "webp" : "png") << ", quality: 80}\nworkers: 2\n";
  const Result r = run_ferry("preprocess '" + file.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string ext = webp ? ".webp" : ".png";
  const ferry::vision::WebDataset shards(ferry::vision::expand_shards((dir_ / "shards").string()));
  for (const auto& sample : shards.samples()) {
    const fs::path written = dir_ / "again" / (sample.key + ext);
    ASSERT_TRUE(fs::exists(written)) << written;
    const std::string bytes = slurp(written);
    const torch::Tensor image = ferry::vision::decode_image(
        {reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()});
    EXPECT_EQ(image.sizes(), (std::vector<std::int64_t>{32, 32, 3}));
  }
  const json stats = json::parse(slurp(dir_ / "again" / "stats.json"));
  EXPECT_EQ(stats["images"], 40);
  EXPECT_EQ(stats["classes"]["3"], 10);  // labels from <key>.cls; shards carry no class names
  // Writing into the input's own folder is refused: the next run would read its output.
  const Result inside = run_ferry("preprocess '" + job("x").string() + "' --set output.path='" +
                                  (data_ / "out").string() + "'");
  EXPECT_EQ(inside.code, 1);
  EXPECT_THAT(inside.err, HasSubstr("inside the input folder"));
  EXPECT_FALSE(fs::exists(data_ / "out"));
}

// An input that kills its worker (or hangs it past the timeout) is found, skipped and listed;
// with on_error: stop the job ends naming the worker's death.
TEST_F(Preprocess, AnInputThatKillsOrHangsItsWorkerIsSkippedOrStopsTheJob) {
  ASSERT_EQ(run_ferry("preprocess '" + job("reference").string() + "'").code, 0);
  const ferry::vision::WebDataset reference(
      ferry::vision::expand_shards((dir_ / "reference").string()));
  ferry::vision::ImageFolder folder(data_.string());
  const std::string victim = fs::relative(folder.items()[13].path, data_).string();
  const std::string hung = fs::relative(folder.items()[30].path, data_).string();
  const fs::path file = job("out", "", "workers: 2\ntimeout: 2\n");
  const Result r =
      run_ferry("preprocess '" + file.string() + "'",
                "FERRY_PREPROCESS_CRASH_INPUT=" + victim + " FERRY_PREPROCESS_HANG_INPUT=" + hung);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("one at a time"));
  const json stats = json::parse(slurp(dir_ / "out" / "stats.json"));
  EXPECT_EQ(stats["images"], 38);
  ASSERT_EQ(stats["skipped"], 2);
  EXPECT_EQ(stats["skipped_inputs"][0]["path"], victim);
  EXPECT_THAT(stats["skipped_inputs"][0]["error"].get<std::string>(),
              HasSubstr("died of signal 11"));
  EXPECT_EQ(stats["skipped_inputs"][1]["path"], hung);
  EXPECT_THAT(stats["skipped_inputs"][1]["error"].get<std::string>(),
              HasSubstr("hung past the timeout"));
  // Every other sample is there, with the bytes an undisturbed run wrote.
  const ferry::vision::WebDataset written(ferry::vision::expand_shards((dir_ / "out").string()));
  ASSERT_EQ(written.size(), 38u);
  std::size_t k = 0;
  for (std::size_t i = 0; i < reference.size(); ++i) {
    if (i == 13 || i == 30) continue;
    EXPECT_EQ(written.samples()[k].key, reference.samples()[i].key);
    EXPECT_TRUE(torch::equal(written.read_field(k, "jpg"), reference.read_field(i, "jpg")));
    ++k;
  }
  const Result stop = run_ferry(
      "preprocess '" + file.string() + "' --set on_error=stop " + "--set output.path=stopped",
      "FERRY_PREPROCESS_CRASH_INPUT=" + victim);
  EXPECT_EQ(stop.code, 1);
  EXPECT_THAT(stop.err, HasSubstr("SIGSEGV"));
}

// Names from a shard's members never lead outside the output folder.
TEST_F(Preprocess, TarMemberNamesStayInsideTheOutput) {
  const fs::path script = dir_ / "evil.py";
  std::ofstream(script) << R"(
import io, sys, tarfile
jpeg = open(sys.argv[2], "rb").read()
with tarfile.open(sys.argv[1], "w") as t:
    for i, key in enumerate(["../../escaped", "/tmp/ferry_absolute_escape", "ok"]):
        for ext, data in (("cls", str(i).encode()), ("jpg", jpeg)):
            info = tarfile.TarInfo(key + "." + ext)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
)";
  ferry::vision::ImageFolder folder(data_.string());
  fs::create_directories(dir_ / "in");
  ASSERT_EQ(std::system(("/usr/bin/python3 '" + script.string() + "' '" +
                         (dir_ / "in" / "evil.tar").string() + "' '" + folder.items()[0].path + "'")
                            .c_str()),
            0);
  const fs::path file = dir_ / "evil.yaml";
  std::ofstream(file) << "input: {webdataset: {shards: in/evil.tar}}\n"
                      << "output: {path: out/tree, format: tree}\nworkers: 1\n";
  const Result r = run_ferry("preprocess '" + file.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir_ / "out" / "tree" / "outside" / "escaped.jpg"));
  EXPECT_TRUE(fs::exists(dir_ / "out" / "tree" / "outside" / "tmp" / "ferry_absolute_escape.jpg"));
  EXPECT_TRUE(fs::exists(dir_ / "out" / "tree" / "ok.jpg"));
  EXPECT_FALSE(fs::exists(dir_ / "escaped.jpg"));
  EXPECT_FALSE(fs::exists("/tmp/ferry_absolute_escape.jpg"));
}

TEST_F(Preprocess, ShardsCutByBytesStayUnderTheLimitAndResume) {
  const fs::path file = job("bytes", "", "workers: 2\n", "shard_bytes: 40000");
  const Result r = run_ferry("preprocess '" + file.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto reference = snapshot(dir_ / "bytes");
  std::size_t shards = 0;
  for (const auto& [name, bytes] : reference) {
    if (name.size() > 4 && name.substr(name.size() - 4) == ".tar") {
      ++shards;
      EXPECT_LE(bytes.size(), 40000u) << name;
    }
  }
  EXPECT_GE(shards, 3u);
  ferry::vision::WebDataset all(ferry::vision::expand_shards((dir_ / "bytes").string()));
  EXPECT_EQ(all.size(), 40u);
  fs::remove_all(dir_ / "bytes");
  const Result killed =
      run_ferry("preprocess '" + file.string() + "'", "FERRY_PREPROCESS_KILL_AT=record-written:2");
  EXPECT_EQ(killed.code, 128 + SIGKILL);
  ASSERT_EQ(run_ferry("preprocess '" + file.string() + "'").code, 0);
  EXPECT_TRUE(snapshot(dir_ / "bytes") == reference);
  // With ranks, byte cuts are refused with the reason.
  const Result ranks = run_ferry("preprocess '" + file.string() + "' --rank 0 --world-size 2");
  EXPECT_EQ(ranks.code, 1);
  EXPECT_THAT(ranks.err, AllOf(HasSubstr("shard_bytes"), HasSubstr("shard_samples")));
}

TEST_F(Preprocess, RanksSplitThePartsAndTheirUnionIsTheOneProcessOutput) {
  ASSERT_EQ(run_ferry("preprocess '" + job("one").string() + "'").code, 0);
  const fs::path file = job("ranks");
  for (int rank : {2, 0, 1}) {
    const Result r = run_ferry("preprocess '" + file.string() + "' --rank " + std::to_string(rank) +
                               " --world-size 3");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr(rank == 1 ? "complete" : "other ranks"));
  }
  EXPECT_TRUE(snapshot(dir_ / "ranks") == snapshot(dir_ / "one"));
  // Rank 1 lost its work: run alone again, it redoes its parts (1 and 4) and nothing else.
  for (const char* f :
       {"shard-000001.tar", "shard-000004.tar.idx", ".ferry-preprocess/part-000001.json",
        ".ferry-preprocess/part-000004.json"}) {
    fs::remove(dir_ / "ranks" / f);
  }
  const Result redo =
      run_ferry("preprocess '" + file.string() + "' --rank 1 --world-size 3 --json '" +
                (dir_ / "redo.json").string() + "'");
  ASSERT_EQ(redo.code, 0) << redo.err;
  EXPECT_EQ(json::parse(slurp(dir_ / "redo.json"))["parts_written"], 2);
  EXPECT_TRUE(snapshot(dir_ / "ranks") == snapshot(dir_ / "one"));
}

// A part another process is writing (its lock held) is not written twice: the job stops and
// says why; once the lock is free the same command finishes the job.
TEST_F(Preprocess, APartBeingWrittenElsewhereStopsTheJob) {
  const fs::path file = job("out");
  fs::create_directories(dir_ / "out" / ".ferry-preprocess");
  const fs::path lock = dir_ / "out" / ".ferry-preprocess" / "part-000003.lock";
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  const Result r = run_ferry("preprocess '" + file.string() + "'");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr("part 3 is being written by another process"),
                           HasSubstr("--world-size")));
  ::close(fd);  // the other writer died without finishing: its lock file stays, unlocked
  const Result again = run_ferry("preprocess '" + file.string() + "'");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_FALSE(fs::exists(lock));
  ASSERT_EQ(run_ferry("preprocess '" + job("reference").string() + "'").code, 0);
  EXPECT_TRUE(snapshot(dir_ / "out") == snapshot(dir_ / "reference"));
}

TEST_F(Preprocess, AChangedConfigIsRefusedAndTheOutputKept) {
  const fs::path file = job("out");
  ASSERT_EQ(run_ferry("preprocess '" + file.string() + "'").code, 0);
  const auto before = snapshot(dir_ / "out");
  const Result r = run_ferry("preprocess '" + file.string() + "' --set output.quality=80");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr("another preprocess job"), HasSubstr("output"),
                           HasSubstr("another output.path")));
  const Result t =
      run_ferry("preprocess '" + file.string() + "' --set transforms.1.center_crop.size=[48]");
  EXPECT_EQ(t.code, 1);
  EXPECT_THAT(t.err, HasSubstr("transforms"));
  EXPECT_TRUE(snapshot(dir_ / "out") == before);
}

TEST_F(Preprocess, ConfigErrorsNameThePlaceAndTheReason) {
  const fs::path random = dir_ / "random.yaml";
  std::ofstream(random) << "input: {image_folder: {root: '" << data_.string() << "'}}\n"
                        << "transforms:\n  - random_resized_crop: {size: 56}\n"
                        << "output: {path: out}\n";
  Result r = run_ferry("preprocess '" + random.string() + "'");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr("random.yaml:3:"), HasSubstr("random_resized_crop"),
                           HasSubstr("training pipeline")));
  EXPECT_FALSE(fs::exists(dir_ / "out"));
  r = run_ferry("preprocess '" + job("x", ", qualty: 3").string() + "'");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr("x.yaml:5:"), HasSubstr("quality")));
  r = run_ferry("preprocess '" + job("y", "", "transforms: [to_tensor]\n").string() + "'");
  EXPECT_EQ(r.code, 1);
  // A folder that holds other files and is not a job's output is not written into.
  fs::create_directories(dir_ / "taken");
  std::ofstream(dir_ / "taken" / "notes.txt") << "mine";
  r = run_ferry("preprocess '" + job("taken").string() + "'");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err,
              AllOf(HasSubstr("notes.txt"), HasSubstr("not the output of a preprocess job")));
  r = run_ferry("validate '" + job("z").string() + "'");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("valid preprocess job (40 inputs"), HasSubstr("7 shards")));
}

// Bad inputs: a JPEG and a PNG cut at every offset, bytes flipped, an empty file, a GIF, a
// folder named like an image, a path that cannot be opened. Skipped and listed, or the job
// stops naming the file; never a crash.
TEST_F(Preprocess, BadInputsAreSkippedAndListedOrStopTheJob) {
  const fs::path in = dir_ / "in";
  fs::create_directories(in);
  torch::Tensor pixels = torch::randint(0, 256, {20, 28, 3}, torch::kUInt8);
  const auto jpeg = ferry::vision::encode_image(pixels, ferry::vision::ImageFormat::kJpeg, 80);
  const auto png = ferry::vision::encode_image(pixels, ferry::vision::ImageFormat::kPng, 0);
  std::ofstream list(dir_ / "list.txt");
  std::size_t inputs = 0;
  const auto write = [&](const std::string& name, const std::uint8_t* p, std::size_t n) {
    std::ofstream(in / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n));
    list << "in/" << name << ",0\n";
    ++inputs;
  };
  for (std::size_t cut = 0; cut <= jpeg.size(); ++cut)
    write("j" + std::to_string(cut) + ".jpg", jpeg.data(), cut);
  for (std::size_t cut = 0; cut <= png.size(); ++cut)
    write("p" + std::to_string(cut) + ".png", png.data(), cut);
  // A header that claims a width of 4 billion: refused (max_pixels), and the claim goes nowhere.
  std::vector<std::uint8_t> wide = png;
  wide[16] = wide[17] = wide[18] = 0xff;
  write("wide.png", wide.data(), wide.size());
  std::vector<std::uint8_t> flipped = jpeg;
  for (std::size_t i = 2; i < flipped.size(); i += 3) flipped[i] ^= 0x5a;
  write("flipped.jpg", flipped.data(), flipped.size());
  const std::string gif =
      "GIF89a\x01\x00\x01\x00\x80\x00\x00\xff\xff\xff\x00\x00\x00!\xf9\x04\x01\x00\x00\x00\x00,"
      "\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;";
  write("tiny.gif", reinterpret_cast<const std::uint8_t*>(gif.data()), gif.size());
  fs::create_directories(in / "folder.jpg");
  list << "in/folder.jpg,0\n";
  fs::create_symlink(in / "nowhere.jpg", in / "dangling.jpg");
  list << "in/dangling.jpg,0\n";
  inputs += 2;
  list.close();

  const fs::path file = dir_ / "bad.yaml";
  std::ofstream(file) << "input: {image_list: {file: list.txt}}\n"
                      << "transforms: [{resize: {size: 16}}]\n"
                      << "output: {path: out, shard_samples: 500}\nworkers: 2\n";
  const Result r = run_ferry("preprocess '" + file.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("inputs were skipped"));
  const json stats = json::parse(slurp(dir_ / "out" / "stats.json"));
  EXPECT_EQ(stats["images"].get<std::size_t>() + stats["skipped"].get<std::size_t>(), inputs);
  std::map<std::string, std::string> reasons;
  for (const auto& s : stats["skipped_inputs"]) {
    EXPECT_FALSE(s["error"].get<std::string>().empty());
    reasons[s["path"].get<std::string>()] = s["error"].get<std::string>();
  }
  EXPECT_THAT(reasons["in/j0.jpg"], HasSubstr("empty"));
  EXPECT_THAT(reasons["in/folder.jpg"], HasSubstr("directory"));
  EXPECT_THAT(reasons["in/dangling.jpg"], HasSubstr("cannot open"));
  EXPECT_EQ(reasons.count("in/wide.png"), 1u);
  EXPECT_EQ(reasons.count("in/j" + std::to_string(jpeg.size()) + ".jpg"), 0u);  // whole files
  EXPECT_EQ(reasons.count("in/p" + std::to_string(png.size()) + ".png"), 0u);
  EXPECT_GT(reasons.size(), png.size() / 2);  // most cuts of the PNG are refused
  // What was written reads back, every image 16 pixels on its shorter side.
  ferry::vision::WebDataset written(ferry::vision::expand_shards((dir_ / "out").string()));
  EXPECT_EQ(written.size(), stats["images"].get<std::size_t>());

  // on_error: stop ends the job at the first bad input, naming it and the fix.
  const Result stop =
      run_ferry("preprocess '" + file.string() + "' --set on_error=stop --set output.path=stop");
  EXPECT_EQ(stop.code, 1);
  EXPECT_THAT(stop.err, AllOf(HasSubstr("in/j0.jpg"), HasSubstr("on_error: skip")));
  EXPECT_FALSE(has_temporaries(dir_ / "stop"));
}

}  // namespace
