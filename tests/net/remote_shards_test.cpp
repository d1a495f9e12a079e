// WebDataset shards in object stores, read by the loader's workers from real servers on
// 127.0.0.1: an S3 server (s3rver, which checks SigV4 signatures), nginx for https-style URLs,
// and a fault proxy of the tests' own between them and ferry (tests/support/fault_proxy.py).
// Each epoch is compared with the same shards read from local disk: every sample once, each
// byte the same, whatever the network did.

#include <signal.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <opencv2/imgcodecs.hpp>

#include "ferry/data_loader.h"
#include "ferry/error.h"
#include "ferry/vision/webdataset.h"

#include "datasets/tar.h"
#include "net/aws.h"
#include "net/byte_source.h"
#include "net/http.h"
#include "net/shard_cache.h"
#include "net/url.h"
#include "support/command.h"
#include "support/servers.h"
#include "support/timing.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using vision::WebDataset;
using vision::WebDatasetOptions;
using vision::WebDatasetStream;

constexpr int kShards = 4;
constexpr int kPerShard = 24;
constexpr const char* kSecret = "S3RVER";

// One sample as the loop saw it.
struct Seen {
  std::int64_t label = 0;
  std::vector<std::uint8_t> pixels;
  bool operator==(const Seen&) const = default;
};
using Epoch = std::map<std::string, Seen>;  // by key; a key seen twice fails the test

Epoch run_epoch(DataLoader& loader, std::size_t* batches = nullptr) {
  Epoch out;
  for (auto& batch : loader) {
    const auto& keys = batch.strings("key");
    const torch::Tensor images = batch["image"].contiguous();
    for (std::size_t r = 0; r < batch.size(); ++r) {
      const torch::Tensor image = images[static_cast<std::int64_t>(r)].contiguous();
      Seen s{batch["label"][static_cast<std::int64_t>(r)].item<std::int64_t>(),
             std::vector<std::uint8_t>(image.data_ptr<std::uint8_t>(),
                                       image.data_ptr<std::uint8_t>() + image.numel())};
      EXPECT_TRUE(out.emplace(keys[r], std::move(s)).second) << "key " << keys[r] << " twice";
    }
    if (batches != nullptr) ++*batches;
  }
  return out;
}

std::vector<std::string> log_lines(const fs::path& log) {
  std::ifstream in(log);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Writes the fault proxy's plan at once (a rename), as it reads it at every request.
void write_plan(const fs::path& plan, const json& faults) {
  const fs::path tmp = plan.string() + ".tmp";
  std::ofstream(tmp) << json{{"faults", faults}}.dump();
  fs::rename(tmp, plan);
}

class RemoteShards : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::path(::testing::TempDir()) / ("ferry_remote_" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "local");
    fs::create_directories(dir_ / "store");
    std::mt19937 rng(7);
    for (int s = 0; s < kShards; ++s) {
      char name[32];
      std::snprintf(name, sizeof name, "shard-%06d.tar", s);
      vision::detail::TarWriter tar(dir_ / "local" / name);
      std::vector<vision::detail::TarMember> members;
      for (int i = 0; i < kPerShard; ++i) {
        cv::Mat image(12, 16, CV_8UC3);
        for (int k = 0; k < 12 * 16 * 3; ++k) image.data[k] = static_cast<std::uint8_t>(rng());
        std::vector<std::uint8_t> png;
        cv::imencode(".png", image, png);
        const std::string key = "s" + std::to_string(s) + "/" + std::to_string(1000 + i);
        members.push_back(tar.add(key + ".png", png));
        const std::string label = std::to_string((s * kPerShard + i) % 10);
        members.push_back(
            tar.add(key + ".cls",
                    std::span(reinterpret_cast<const std::uint8_t*>(label.data()), label.size())));
      }
      tar.finish();
      std::ofstream(dir_ / "local" / (std::string(name) + ".idx"))
          << vision::detail::webdataset_index(members);
    }
    if (auto why = test::object_store_unavailable()) {
      skip_ = "no S3 server: " + *why;
    } else {
      s3_ = std::make_unique<test::ServerProcess>(test::start_s3(dir_ / "store", {"data"}));
    }
    try {
      http_ = std::make_unique<test::ServerProcess>(test::start_http(dir_ / "local"));
    } catch (const test::ServerUnavailable& e) {
      http_skip_ = e.what();
    }
    if (s3_) {
      use_store(s3_->port(), kSecret);
      for (const auto& entry : fs::directory_iterator(dir_ / "local")) {
        net::http_put_file(net::request_for("s3://data/train/" + entry.path().filename().string()),
                           entry.path().string());
      }
      // A second bucket folder with one object that is not a shard, for the listing.
      net::http_put_file(net::request_for("s3://data/train-notes.txt"),
                         (dir_ / "local" / "shard-000000.tar.idx").string());
    }
  }
  static void TearDownTestSuite() {
    s3_.reset();
    http_.reset();
    fs::remove_all(dir_);
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    use_store(s3_->port(), kSecret);
  }

  // The S3 settings every process of the test reads (workers inherit them).
  static void use_store(int port, const std::string& secret) {
    ::setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", secret.c_str(), 1);
    ::setenv("AWS_ENDPOINT_URL", ("http://127.0.0.1:" + std::to_string(port)).c_str(), 1);
    ::setenv("AWS_REGION", "us-east-1", 1);
    ::unsetenv("AWS_PROFILE");
  }

  static Epoch local_stream(std::size_t workers) {
    auto dataset = std::make_shared<WebDatasetStream>(
        vision::expand_shards((dir_ / "local").string()), WebDatasetStream::Options{});
    DataLoader loader(dataset, {.batch_size = 5, .num_workers = workers});
    return run_epoch(loader);
  }

  static inline fs::path dir_;
  static inline std::string skip_;
  static inline std::string http_skip_;
  static inline std::unique_ptr<test::ServerProcess> s3_;
  static inline std::unique_ptr<test::ServerProcess> http_;
};

TEST_F(RemoteShards, AStreamFromS3EqualsTheLocalShardsByteForByte) {
  const Epoch local = local_stream(2);
  ASSERT_EQ(local.size(), static_cast<std::size_t>(kShards * kPerShard));
  for (const std::size_t workers : {0, 2}) {
    auto dataset = std::make_shared<WebDatasetStream>(
        vision::expand_shards("s3://data/train/shard-{000000..000003}.tar"),
        WebDatasetStream::Options{});
    const fs::path trace = dir_ / ("stream-" + std::to_string(workers) + ".trace.json");
    {
      DataLoader loader(dataset,
                        {.batch_size = 5, .num_workers = workers, .trace_path = trace.string()});
      EXPECT_TRUE(run_epoch(loader) == local) << workers << " workers";
    }
    if (workers > 0) {  // the workers' transfers are spans of their tracks
      const json events = json::parse(test::slurp(trace))["traceEvents"];
      const auto downloads = std::count_if(events.begin(), events.end(), [](const json& e) {
        return e.value("name", "") == "download" && e.value("tid", 0) >= 1;
      });
      EXPECT_EQ(downloads, kShards) << "one span per shard's GET";
    }
  }
}

TEST_F(RemoteShards, MapStyleFromAListedPrefixEqualsTheLocalShardsInTheSameOrder) {
  const std::vector<std::string> listed = vision::expand_shards("s3://data/train/");
  EXPECT_EQ(listed, (std::vector<std::string>{
                        "s3://data/train/shard-000000.tar", "s3://data/train/shard-000001.tar",
                        "s3://data/train/shard-000002.tar", "s3://data/train/shard-000003.tar"}))
      << "the .tar keys under the prefix, sorted; not train-notes.txt, not the .idx files";
  const DataLoaderOptions options{.batch_size = 6, .shuffle = true, .num_workers = 2, .seed = 5};
  auto remote = std::make_shared<WebDataset>(listed, WebDatasetOptions{});
  auto local = std::make_shared<WebDataset>(vision::expand_shards((dir_ / "local").string()),
                                            WebDatasetOptions{});
  ASSERT_EQ(remote->size(), local->size());
  DataLoader a(remote, options);
  DataLoader b(local, options);
  std::vector<std::vector<std::int64_t>> order_a;
  std::vector<std::vector<std::int64_t>> order_b;
  Epoch ea;
  Epoch eb;
  for (auto& batch : a) order_a.push_back(batch.indices());
  for (auto& batch : b) order_b.push_back(batch.indices());
  EXPECT_EQ(order_a, order_b);
  EXPECT_TRUE(run_epoch(a) == run_epoch(b));
}

// Connections cut mid-body, a body cut short, a store that answers 503 SlowDown and a stall:
// the epoch still delivers every sample once, equal to the local one, and the cut bodies were
// resumed with Range requests, not read again from the start.
TEST_F(RemoteShards, CutsSlowDownsAndStallsAreRetriedAndResumedAndNothingIsLostOrTwice) {
  const fs::path plan = dir_ / "plan.json";
  const fs::path log = dir_ / "proxy.log";
  fs::remove(log);
  // A stall outlasts download_timeout by seconds, whatever the load.
  const double timeout = std::max(1.0, testing::time_scale());
  write_plan(plan, json::array({
                       {{"match", "shard-000000.tar"}, {"method", "GET"}, {"reset_after", 3000}},
                       {{"match", "shard-000001.tar"},
                        {"method", "GET"},
                        {"status", 503},
                        {"code", "SlowDown"},
                        {"times", 2}},
                       {{"match", "shard-000002.tar"}, {"method", "GET"}, {"truncate", 5000}},
                       {{"match", "shard-000003.tar"},
                        {"method", "GET"},
                        {"stall_after", 2000},
                        {"stall", timeout + 3}},
                   }));
  auto proxy = test::start_fault_proxy(s3_->port(), plan, log);
  use_store(proxy.port(), kSecret);
  WebDatasetStream::Options o;
  o.download_timeout = timeout;  // the stall outlasts it: the connection is cut and resumed
  auto dataset = std::make_shared<WebDatasetStream>(
      vision::expand_shards("s3://data/train/shard-{000000..000003}.tar"), o);
  DataLoader loader(dataset, {.batch_size = 5, .num_workers = 2});
  EXPECT_TRUE(run_epoch(loader) == local_stream(0));
  // The loader's stats count what the workers' requests did.
  std::uint64_t bytes = 0, retries = 0, made = 0;
  for (const WorkerTimeStats& w : loader.stats().total.workers) {
    bytes += w.net_bytes;
    retries += w.net_retries;
    made += w.net_requests;
  }
  EXPECT_GE(bytes, static_cast<std::uint64_t>(kShards) *
                       fs::file_size(dir_ / "local" / "shard-000000.tar") * 9 / 10);
  EXPECT_GE(retries, 5u) << "a reset, two SlowDowns, a truncation, a stall";
  EXPECT_EQ(made, kShards + retries);
  std::map<std::string, std::vector<json>> requests;
  for (const std::string& line : log_lines(log)) {
    const json r = json::parse(line);
    const std::string path = r["path"].get<std::string>();
    requests[path.substr(path.rfind('/') + 1)].push_back(r);
  }
  for (const char* cut : {"shard-000000.tar", "shard-000002.tar", "shard-000003.tar"}) {
    const auto& rs = requests[cut];
    ASSERT_GE(rs.size(), 2u) << cut << ": no second request after the fault";
    EXPECT_TRUE(rs[0]["range"].is_null()) << cut << ": the first GET reads from the start";
    const std::string range = rs[1]["range"].is_null() ? "" : rs[1]["range"].get<std::string>();
    EXPECT_THAT(range, AllOf(HasSubstr("bytes="), Not(HasSubstr("bytes=0-"))))
        << cut << ": the second GET resumes where the first was cut";
  }
  EXPECT_GE(requests["shard-000001.tar"].size(), 3u) << "two SlowDowns, then the body";
}

// A wrong secret (403 SignatureDoesNotMatch) and a missing key (404) are not retried: the error
// names the URL, the status, S3's code, one attempt and what to check, and never the secret.
TEST_F(RemoteShards, PermanentFailuresAreNotRetriedAndTheirErrorsNameAllButTheSecret) {
  use_store(s3_->port(), "sekrit-xyz-123");
  const auto start = std::chrono::steady_clock::now();
  try {
    WebDataset dataset({"s3://data/train/shard-000000.tar"}, WebDatasetOptions{});
    FAIL() << "a wrong secret was accepted";
  } catch (const net::HttpError& e) {
    // Map-style starts with a HEAD, whose 403 has no body to name S3's code.
    EXPECT_EQ(e.status(), 403);
    EXPECT_THAT(e.what(), AllOf(HasSubstr("s3://data/train/shard-000000.tar"),
                                HasSubstr("HTTP 403"), HasSubstr("after 1 attempt"),
                                HasSubstr("check the credentials"), Not(HasSubstr("sekrit"))));
  }
  {
    auto stream = std::make_shared<WebDatasetStream>(
        std::vector<std::string>{"s3://data/train/shard-000000.tar"}, WebDatasetStream::Options{});
    DataLoader loader(stream, {.batch_size = 5, .num_workers = 1});
    EXPECT_THAT([&] { run_epoch(loader); },
                ::testing::ThrowsMessage<WorkerError>(
                    AllOf(HasSubstr("HTTP 403 SignatureDoesNotMatch"), HasSubstr("after 1 attempt"),
                          HasSubstr("check the credentials"), Not(HasSubstr("sekrit")))));
  }
  use_store(s3_->port(), kSecret);
  auto dataset = std::make_shared<WebDatasetStream>(
      std::vector<std::string>{"s3://data/train/shard-000009.tar"}, WebDatasetStream::Options{});
  DataLoader loader(dataset, {.batch_size = 5, .num_workers = 1});
  EXPECT_THAT([&] { run_epoch(loader); },
              ::testing::ThrowsMessage<WorkerError>(
                  AllOf(HasSubstr("s3://data/train/shard-000009.tar"), HasSubstr("HTTP 404"),
                        HasSubstr("NoSuchKey"), HasSubstr("after 1 attempt"))));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
            10.0 * testing::time_scale())
      << "permanent failures waited on retries";
}

// A store that keeps failing: the error comes after download_retry attempts, each named.
TEST_F(RemoteShards, AStoreThatKeepsFailingEndsTheEpochAfterTheRetriesWithTheLastAnswer) {
  const fs::path plan = dir_ / "plan-down.json";
  write_plan(
      plan,
      json::array({{{"match", "shard-"}, {"status", 503}, {"code", "SlowDown"}, {"times", -1}}}));
  auto proxy = test::start_fault_proxy(s3_->port(), plan, dir_ / "down.log");
  use_store(proxy.port(), kSecret);
  WebDatasetStream::Options o;
  o.download_retry = 3;
  auto dataset = std::make_shared<WebDatasetStream>(
      std::vector<std::string>{"s3://data/train/shard-000000.tar"}, o);
  DataLoader loader(dataset, {.batch_size = 5, .num_workers = 1});
  EXPECT_THAT([&] { run_epoch(loader); },
              ::testing::ThrowsMessage<WorkerError>(
                  AllOf(HasSubstr("HTTP 503 SlowDown"), HasSubstr("after 3 attempts"))));
  // Each stream the worker opened made download_retry attempts (it may open the shard again
  // for a next batch after the error), none more.
  const std::size_t made = log_lines(dir_ / "down.log").size();
  EXPECT_TRUE(made >= 3u && made % 3 == 0) << made << " requests";
}

// The same shards over plain HTTP and through pipes: these need no S3 server (Debian 13's stage
// has no Node), only nginx.
class HttpShards : public RemoteShards {
 protected:
  void SetUp() override {}
};

// Plain HTTP (nginx, as a CDN or a static server serves shards) and pipe:COMMAND.
TEST_F(HttpShards, HttpUrlsAndPipesReadTheSameSamples) {
  if (!http_) GTEST_SKIP() << "no HTTP server: " << http_skip_;
  const Epoch local = local_stream(0);
  for (const std::string& spec :
       {http_->url() + "/shard-{000000..000003}.tar",
        "pipe:cat " + (dir_ / "local").string() + "/shard-{000000..000003}.tar"}) {
    auto dataset = std::make_shared<WebDatasetStream>(vision::expand_shards(spec),
                                                      WebDatasetStream::Options{});
    DataLoader loader(dataset, {.batch_size = 5, .num_workers = 2});
    EXPECT_TRUE(run_epoch(loader) == local) << spec;
  }
  auto mapped = std::make_shared<WebDataset>(
      vision::expand_shards(http_->url() + "/shard-{000000..000003}.tar"), WebDatasetOptions{});
  DataLoader loader(mapped, {.batch_size = 5, .num_workers = 2});
  EXPECT_TRUE(run_epoch(loader) == local) << "map-style over HTTP ranges";
}

// The Range header of sample `index`'s one GET (its image and its label, adjacent).
std::string range_of(const WebDataset& dataset, std::size_t index) {
  std::uint64_t lo = UINT64_MAX;
  std::uint64_t hi = 0;
  for (const WebDataset::Field& f : dataset.samples()[index].fields) {
    lo = std::min(lo, f.offset);
    hi = std::max(hi,
                  f.offset + (f.extension == "cls" ? std::min<std::uint64_t>(f.size, 65) : f.size));
  }
  return "bytes=" + std::to_string(lo) + "-" + std::to_string(hi - 1);
}

// Sample `index`'s GET as the proxy logs it: its shard's path and its Range (the shards are laid
// out alike, so a range alone names a sample of each).
std::string get_of(const WebDataset& dataset, std::size_t index) {
  const std::string& shard = dataset.shards()[dataset.samples()[index].shard];
  return shard.substr(shard.rfind('/')) + " " + range_of(dataset, index);
}

// Map-style over HTTP ranges reads ahead in the sampler's order: while the last sample of the
// first batch is held up at the proxy (2 s), the worker has already asked for every sample of the
// second batch, which it was sent behind the first (without workers, the loop's thread asks for
// the next batch's samples before it loads one). With `prefetch: 0` they are asked for only
// after the first batch is done. The epoch equals the local one.
TEST_F(HttpShards, MapStyleReadsTheNextBatchAheadInTheSamplersOrder) {
  if (!http_) GTEST_SKIP() << "no HTTP server: " << http_skip_;
  const fs::path plan = dir_ / "plan-ahead.json";
  write_plan(plan, json::array());
  for (const auto& [prefetch, workers] :
       std::vector<std::pair<std::size_t, std::size_t>>{{1, 1}, {1, 0}, {0, 1}}) {
    SCOPED_TRACE("prefetch " + std::to_string(prefetch) + ", " + std::to_string(workers) +
                 " workers");
    const fs::path log =
        dir_ / ("ahead-" + std::to_string(prefetch) + "-" + std::to_string(workers) + ".log");
    auto proxy = test::start_fault_proxy(http_->port(), plan, log);
    WebDatasetOptions o;
    o.prefetch = prefetch;
    auto remote = std::make_shared<WebDataset>(
        vision::expand_shards(proxy.url() + "/shard-{000000..000003}.tar"), o);
    const std::string held_up = range_of(*remote, 3);
    write_plan(
        plan,
        json::array({
            {{"method", "GET"}, {"match", "/shard-000000.tar"}, {"range", held_up}, {"stall", 2.0}},
            {{"method", "GET"}, {"times", -1}, {"stall", 0.05}},
        }));
    DataLoaderOptions options{.batch_size = 4, .num_workers = workers};
    if (workers > 0) options.prefetch_factor = 2;
    DataLoader loader(remote, options);
    if (prefetch > 0) {
      auto local = std::make_shared<WebDataset>(vision::expand_shards((dir_ / "local").string()),
                                                WebDatasetOptions{});
      DataLoader reference(local, options);
      EXPECT_TRUE(run_epoch(loader) == run_epoch(reference));
    } else {
      std::size_t batches = 0;
      for (auto& batch : loader) {
        (void)batch;
        if (++batches == 2) break;
      }
    }
    write_plan(plan, json::array());
    // The log's lines go out as each answer starts: the held-up one's 2 s after its request.
    std::map<std::string, std::size_t> line_of;
    std::map<std::string, int> gets;
    const auto lines = log_lines(log);
    for (std::size_t i = 0; i < lines.size(); ++i) {
      const json entry = json::parse(lines[i]);
      if (entry["method"] == "GET" && entry["range"].is_string()) {
        const std::string get =
            entry["path"].get<std::string>() + " " + entry["range"].get<std::string>();
        line_of.emplace(get, i);
        ++gets[get];
      }
    }
    ASSERT_TRUE(line_of.count(get_of(*remote, 3))) << "no GET for sample 3";
    const std::size_t held_line = line_of[get_of(*remote, 3)];
    for (std::size_t i = 0; i < (prefetch > 0 ? remote->size() : 8); ++i) {
      EXPECT_EQ(gets[get_of(*remote, i)], 1) << "GETs of sample " << i << ": read ahead, used once";
    }
    for (std::size_t i = 4; i < 8; ++i) {
      const std::string range = get_of(*remote, i);
      ASSERT_TRUE(line_of.count(range)) << "no GET for sample " << i;
      if (prefetch > 0) {
        EXPECT_LT(line_of[range], held_line)
            << "sample " << i << " of the second batch was asked for ahead";
      } else {
        EXPECT_GT(line_of[range], held_line) << "sample " << i << ", prefetch: 0";
      }
    }
  }
}

// A checkpoint taken mid-stream resumes from the shard and offset it names: a ranged GET, and
// the rest of the epoch is what an uninterrupted run gives.
TEST_F(RemoteShards, AStreamCheckpointResumesWithARangedGetAndLosesNothing) {
  auto make = [] {
    return std::make_shared<WebDatasetStream>(
        vision::expand_shards("s3://data/train/shard-{000000..000003}.tar"),
        WebDatasetStream::Options{});
  };
  const DataLoaderOptions options{.batch_size = 5, .num_workers = 2, .seed = 1};
  Epoch whole;
  {
    DataLoader loader(make(), options);
    whole = run_epoch(loader);
  }
  Epoch first;
  std::string state;
  {
    DataLoader loader(make(), options);
    int taken = 0;
    for (auto& batch : loader) {
      const auto& keys = batch.strings("key");
      for (const auto& k : keys) first[k] = whole[k];
      if (++taken == 7) {
        state = loader.state();
        break;
      }
    }
  }
  DataLoader resumed(make(), options);
  resumed.load_state(state);
  Epoch rest = run_epoch(resumed);
  for (const auto& [k, v] : rest) {
    EXPECT_TRUE(first.find(k) == first.end()) << k << " delivered twice";
  }
  rest.insert(first.begin(), first.end());
  EXPECT_TRUE(rest == whole);
}

#if defined(FERRY_CLI)
// `ferry preprocess` over shards in the bucket writes the same bytes as over the local shards.
TEST_F(RemoteShards, PreprocessFromABucketWritesTheBytesOfTheLocalRun) {
  auto job = [&](const std::string& name, const std::string& shards) {
    const fs::path file = dir_ / (name + ".yaml");
    std::ofstream(file) << "input: {webdataset: {shards: \"" << shards << "\"}}\n"
                        << "transforms: [{resize: {size: 8}}]\n"
                        << "output: {path: " << (dir_ / name).string()
                        << ", format: shards, shard_samples: 30}\nworkers: 2\n";
    const test::CommandResult r =
        test::run_command(std::string(FERRY_CLI) + " preprocess '" + file.string() + "'");
    EXPECT_EQ(r.code, 0) << r.err;
  };
  job("pre-s3", "s3://data/train/shard-{000000..000003}.tar");
  job("pre-local", (dir_ / "local" / "shard-{000000..000003}.tar").string());
  std::size_t compared = 0;
  for (const auto& e : fs::directory_iterator(dir_ / "pre-local")) {
    if (e.is_directory()) continue;  // the job's records name their input
    EXPECT_EQ(test::slurp(e.path()), test::slurp(dir_ / "pre-s3" / e.path().filename()))
        << e.path().filename();
    ++compared;
  }
  EXPECT_EQ(compared, 2u * 4 + 1) << "4 shards, their indexes and stats.json";
}

// Every key under `prefix` in bucket "data" with its bytes, keys relative to the prefix.
std::map<std::string, std::string> bucket_contents(const std::string& prefix) {
  const net::S3Settings settings = net::resolve_s3_settings();
  net::Request list;
  list.url =
      settings.bucket_url("data") + "?list-type=2&prefix=" + net::percent_encode(prefix, false);
  list.display = "list " + prefix;
  list.region = settings.region;
  list.credentials = std::make_shared<const net::S3Credentials>(*settings.credentials);
  const std::string xml = *net::http_get(list);
  std::map<std::string, std::string> out;
  for (std::size_t at = 0; (at = xml.find("<Key>", at)) != std::string::npos;) {
    const std::size_t end = xml.find("</Key>", at);
    const std::string key = xml.substr(at + 5, end - at - 5);
    out[key.substr(prefix.size())] = *net::http_get(net::request_for("s3://data/" + key));
    at = end;
  }
  return out;
}

// `ferry preprocess` writing to a bucket, killed at every step of its parts and of their uploads
// and run again: the bucket ends byte for byte as an uninterrupted run of the same job leaves it.
TEST_F(RemoteShards, PreprocessToABucketKilledAtEveryStepEndsWithTheSameObjects) {
  const fs::path file = dir_ / "upload.yaml";
  std::ofstream(file) << "input: {webdataset: {shards: \""
                      << (dir_ / "local" / "shard-{000000..000003}.tar").string() << "\"}}\n"
                      << "transforms: [{resize: {size: 8}}]\n"
                      << "output: {path: \"s3://data/up/\", staging: "
                      << (dir_ / "staging").string()
                      << ", format: shards, shard_samples: 20}\nworkers: 2\n";
  auto run = [&](const std::string& kill_at) {
    return test::run_command(
        (kill_at.empty() ? std::string() : "FERRY_PREPROCESS_KILL_AT=" + kill_at + " ") +
        std::string(FERRY_CLI) + " preprocess '" + file.string() + "'");
  };
  auto start_over = [&] {  // the bucket's objects and the staging folder gone
    for (const auto& [key, bytes] : bucket_contents("up/")) {
      net::http_delete(net::request_for("s3://data/up/" + key));
    }
    fs::remove_all(dir_ / "staging");
  };
  const test::CommandResult ref = run("");
  ASSERT_EQ(ref.code, 0) << ref.err;
  const auto reference = bucket_contents("up/");
  EXPECT_EQ(reference.size(), 5u * 3 + 1 + 1) << "5 shards, indexes and records; job.json; stats";
  EXPECT_TRUE(reference.count("stats.json"));
  for (const std::string point : {"part-uploaded:1", "part-uploaded:4", "record-written:2",
                                  "part-done:3", "shard-written:5"}) {
    start_over();
    const test::CommandResult killed = run(point);
    EXPECT_EQ(killed.code, 128 + SIGKILL) << point << ": " << killed.err;
    EXPECT_FALSE(bucket_contents("up/").count("stats.json")) << point;
    const test::CommandResult resumed = run("");
    ASSERT_EQ(resumed.code, 0) << point << ": " << resumed.err;
    EXPECT_TRUE(bucket_contents("up/") == reference)
        << point << ": other objects, or other bytes, after the resume";
  }
}
#endif

// ---- the node-local cache ----

WebDatasetStream::Options cached(const fs::path& cache, std::uint64_t limit = 0) {
  WebDatasetStream::Options o;
  o.cache_dir = cache.string();
  o.cache_limit = limit;
  return o;
}

// A stream epoch over the four shards in a child process: its exit code says whether it saw
// every sample as `expected` has it.
pid_t epoch_in_child(const WebDatasetStream::Options& o, const Epoch& expected) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  int code = 1;
  try {
    auto dataset = std::make_shared<WebDatasetStream>(
        vision::expand_shards("s3://data/train/shard-{000000..000003}.tar"), o);
    DataLoader loader(dataset, {.batch_size = 5, .num_workers = 1});
    code = run_epoch(loader) == expected ? 0 : 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child: %s\n", e.what());
    code = 3;
  }
  ::_exit(code);
}

int wait_exit(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::map<std::string, int> gets_by_shard(const fs::path& log) {
  std::map<std::string, int> n;
  for (const std::string& line : log_lines(log)) {
    const json r = json::parse(line);
    const std::string path = r["path"].get<std::string>();
    // Whole-object GETs: ranged ones (an index's check of its shard, a resumed body) aside.
    if (r["method"] == "GET" && r["range"].is_null()) ++n[path.substr(path.rfind('/') + 1)];
  }
  return n;
}

std::vector<std::string> cache_files(const fs::path& cache, const std::string& part) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(cache)) {
    if (e.path().filename().string().find(part) != std::string::npos) {
      out.push_back(e.path().filename().string());
    }
  }
  return out;
}

// Four processes on one machine read the same shards through one cache folder: each shard is
// downloaded once. Then a warm epoch reads no byte over the network.
TEST_F(RemoteShards, FourProcessesDownloadEachShardOnceAndAWarmEpochReadsNoByte) {
  const fs::path cache = dir_ / "cache-once";
  const fs::path log = dir_ / "once.log";
  write_plan(dir_ / "plan-once.json", json::array());
  auto proxy = test::start_fault_proxy(s3_->port(), dir_ / "plan-once.json", log);
  use_store(proxy.port(), kSecret);
  const Epoch local = local_stream(0);
  std::vector<pid_t> children;
  for (int p = 0; p < 4; ++p) children.push_back(epoch_in_child(cached(cache), local));
  for (const pid_t c : children) EXPECT_EQ(wait_exit(c), 0) << "a process saw other samples";
  const auto gets = gets_by_shard(log);
  EXPECT_EQ(gets.size(), static_cast<std::size_t>(kShards));
  for (const auto& [shard, n] : gets) EXPECT_EQ(n, 1) << shard << " downloaded " << n << " times";
  const std::size_t requests = log_lines(log).size();
  const auto before = net::cache_counters();
  auto dataset = std::make_shared<WebDatasetStream>(
      vision::expand_shards("s3://data/train/shard-{000000..000003}.tar"), cached(cache));
  DataLoader loader(dataset, {.batch_size = 5, .num_workers = 0});
  EXPECT_TRUE(run_epoch(loader) == local);
  EXPECT_EQ(log_lines(log).size(), requests) << "the warm epoch went to the network";
  EXPECT_EQ(net::cache_counters().downloads, before.downloads);
  EXPECT_GE(net::cache_counters().hits - before.hits, static_cast<std::uint64_t>(kShards));
}

// Processes killed with SIGKILL at random moments of their downloads (slowed by the proxy)
// leave a cache that the next run completes and uses: no temporary file left, no lock held.
TEST_F(RemoteShards, KilledAtRandomMomentsTheCacheIsNeverLeftHalfWrittenOrLocked) {
  const fs::path cache = dir_ / "cache-killed";
  fs::create_directories(cache);
  write_plan(dir_ / "plan-slow.json", json::array({{{"match", "shard-"},
                                                    {"method", "GET"},
                                                    {"stall_after", 6000},
                                                    {"stall", 0.2},
                                                    {"times", -1}}}));
  auto proxy = test::start_fault_proxy(s3_->port(), dir_ / "plan-slow.json", dir_ / "slow.log");
  use_store(proxy.port(), kSecret);
  const Epoch local = local_stream(0);
  std::mt19937 rng(29);
  int interrupted = 0;  // rounds whose kill left a download half done
  for (int round = 0; round < 12 && interrupted < 3; ++round) {
    // Temporary files are named by their process: this round's are the ones not seen before.
    const std::vector<std::string> before = cache_files(cache, ".tmp-");
    const auto new_download = [&] {
      for (const std::string& f : cache_files(cache, ".tmp-")) {
        if (std::find(before.begin(), before.end(), f) == before.end()) return true;
      }
      return false;
    };
    const pid_t child = epoch_in_child(cached(cache), local);
    // Once a download is under way (its temporary file is there), a random moment later.
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration<double>(20 * testing::time_scale());
    while (!new_download() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 300));
    ::kill(child, SIGKILL);
    wait_exit(child);
    interrupted += new_download();
    // Some complete entries made stale again, so the next round has downloads to be killed in.
    for (const std::string& meta : cache_files(cache, ".meta")) {
      if (rng() % 2 == 0) fs::remove(cache / meta);
    }
  }
  EXPECT_GT(interrupted, 0) << "no kill landed in a download: the test checked nothing";
  // Its workers die with it (their parent-death signal); give them the moment that takes.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(wait_exit(epoch_in_child(cached(cache), local)), 0);
  EXPECT_TRUE(cache_files(cache, ".tmp-").empty()) << "a temporary file outlived its download";
  EXPECT_EQ(cache_files(cache, ".meta").size(), static_cast<std::size_t>(kShards));
  for (const std::string& lock : cache_files(cache, ".lock")) {
    const int fd = ::open((cache / lock).c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0) << lock << " is still held";
    ::close(fd);
  }
}

// Under a small limit the least recently used shards go; a cached copy of the wrong size (cut
// short, or replaced) is fetched again.
TEST_F(RemoteShards, EvictionKeepsTheLimitAndACorruptCopyIsFetchedAgain) {
  const fs::path cache = dir_ / "cache-small";
  const fs::path log = dir_ / "small.log";
  write_plan(dir_ / "plan-small.json", json::array());
  auto proxy = test::start_fault_proxy(s3_->port(), dir_ / "plan-small.json", log);
  use_store(proxy.port(), kSecret);
  const Epoch local = local_stream(0);
  const std::uint64_t shard_size = fs::file_size(dir_ / "local" / "shard-000000.tar");
  const std::uint64_t limit = shard_size * 5 / 2;
  auto cached_size = [&] {
    std::uint64_t total = 0;
    for (const std::string& meta : cache_files(cache, ".meta")) {
      total += fs::file_size(cache / meta.substr(0, meta.size() - 5));
    }
    return total;
  };
  const auto before = net::cache_counters();
  {
    auto dataset = std::make_shared<WebDatasetStream>(
        vision::expand_shards("s3://data/train/shard-{000000..000003}.tar"), cached(cache, limit));
    DataLoader loader(dataset, {.batch_size = 5, .num_workers = 0});
    EXPECT_TRUE(run_epoch(loader) == local);
  }
  EXPECT_LE(cached_size(), limit);
  EXPECT_GE(net::cache_counters().evictions - before.evictions, 2u);

  // Unlimited now: all four cached, then one cut short behind the cache's back.
  {
    auto dataset = std::make_shared<WebDatasetStream>(
        vision::expand_shards("s3://data/train/shard-{000000..000003}.tar"), cached(cache));
    DataLoader loader(dataset, {.batch_size = 5, .num_workers = 0});
    EXPECT_TRUE(run_epoch(loader) == local);
  }
  const std::vector<std::string> metas = cache_files(cache, ".meta");
  ASSERT_EQ(metas.size(), static_cast<std::size_t>(kShards));
  const std::string victim = metas.front().substr(0, metas.front().size() - 5);
  fs::resize_file(cache / victim, shard_size / 2);
  const auto gets_before = gets_by_shard(log);
  {
    auto dataset = std::make_shared<WebDatasetStream>(
        vision::expand_shards("s3://data/train/shard-{000000..000003}.tar"), cached(cache));
    DataLoader loader(dataset, {.batch_size = 5, .num_workers = 0});
    EXPECT_TRUE(run_epoch(loader) == local);
  }
  auto gets_after = gets_by_shard(log);
  int fetched = 0;
  for (auto& [shard, n] : gets_after) fetched += n - gets_before.at(shard);
  EXPECT_EQ(fetched, 1) << "only the corrupt copy is fetched again";
  EXPECT_EQ(fs::file_size(cache / victim), shard_size);
}

// Map-style with a cache: whole shards come into the cache (one GET each), then samples are
// read from there; the epoch equals the local one.
TEST_F(RemoteShards, MapStyleWithACacheReadsWholeShardsOnceAndEqualsLocal) {
  const fs::path cache = dir_ / "cache-map";
  const fs::path log = dir_ / "map.log";
  write_plan(dir_ / "plan-map.json", json::array());
  auto proxy = test::start_fault_proxy(s3_->port(), dir_ / "plan-map.json", log);
  use_store(proxy.port(), kSecret);
  WebDatasetOptions o;
  o.cache_dir = cache.string();
  auto remote = std::make_shared<WebDataset>(
      vision::expand_shards("s3://data/train/shard-{000000..000003}.tar"), o);
  auto local = std::make_shared<WebDataset>(vision::expand_shards((dir_ / "local").string()),
                                            WebDatasetOptions{});
  const DataLoaderOptions options{.batch_size = 6, .shuffle = true, .num_workers = 2, .seed = 5};
  DataLoader a(remote, options);
  DataLoader b(local, options);
  EXPECT_TRUE(run_epoch(a) == run_epoch(b));
  const auto gets = gets_by_shard(log);
  for (int s = 0; s < kShards; ++s) {
    char name[32];
    std::snprintf(name, sizeof name, "shard-%06d.tar", s);
    EXPECT_EQ(gets.count(name) ? gets.at(name) : 0, 1) << name;
  }
}

}  // namespace
}  // namespace ferry
