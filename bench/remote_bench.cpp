// Remote shards: the same WebDataset shards (JPEGs, decoded by the workers) read by
// webdataset_stream from local disk, from an S3 server on loopback (s3rver, as the tests run
// it) cold and through the node-local cache (cold: an empty cache; warm: a full one), and by a
// Python peer in WebDataset's style (bench/remote_peer.py: `curl` pipes, `tarfile`, PIL, PyTorch's
// DataLoader) from local disk and from the same server, at each worker count, in one run. It
// reports images/s and shard MB/s (medians of --repeat rounds, interleaved); it never fails on a
// timing.
//
// clang-format off
//   build/bench/ferry_remote_bench                          # 2048 images of 256x256, 1 and 2 workers
//   build/bench/ferry_remote_bench --images 4096 --repeat 5 --markdown
//   build/bench/ferry_remote_bench --map --latency-ms 20   # map-style by ranges, read ahead or not
// clang-format on
//
// --map compares map-style reading instead (webdataset, shuffled, one ranged GET per sample):
// local disk, and S3 by ranges with `prefetch: 0` and with reading ahead (the default); with
// --latency-ms, S3 is reached through the tests' fault proxy, which holds each GET that long
// before it goes on (a store's time to first byte; loopback has almost none).

#include <stdio.h>  // popen

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <opencv2/imgcodecs.hpp>

#include "ferry/ferry.h"
#include "ferry/vision/webdataset.h"

#include "datasets/tar.h"
#include "net/byte_source.h"
#include "net/http.h"
#include "support/servers.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Args {
  std::size_t images = 2048;
  std::size_t per_shard = 256;
  int side = 256;
  std::vector<std::size_t> workers{1, 2};
  int repeat = 3;
  bool markdown = false;
  std::string python = "/usr/bin/python3";
  fs::path dir;
  bool map = false;
  double latency_ms = 0;
};

// Shards of JPEGs (smooth gradients with noise: about the size of a photo's 256x256 crop).
std::uint64_t write_shards(const Args& a, const fs::path& out) {
  fs::create_directories(out);
  std::mt19937 rng(3);
  std::uint64_t bytes = 0;
  for (std::size_t s = 0; s * a.per_shard < a.images; ++s) {
    char name[32];
    std::snprintf(name, sizeof name, "shard-%06zu.tar", s);
    ferry::vision::detail::TarWriter tar(out / name);
    for (std::size_t i = s * a.per_shard; i < std::min(a.images, (s + 1) * a.per_shard); ++i) {
      cv::Mat image(a.side, a.side, CV_8UC3);
      const int r0 = static_cast<int>(rng() % 256), g0 = static_cast<int>(rng() % 256);
      for (int y = 0; y < a.side; ++y) {
        for (int x = 0; x < a.side; ++x) {
          auto* p = image.ptr<std::uint8_t>(y) + 3 * x;
          p[0] = static_cast<std::uint8_t>((r0 + x + static_cast<int>(rng() % 24)) & 255);
          p[1] = static_cast<std::uint8_t>((g0 + y + static_cast<int>(rng() % 24)) & 255);
          p[2] = static_cast<std::uint8_t>(((x ^ y) + static_cast<int>(rng() % 24)) & 255);
        }
      }
      std::vector<std::uint8_t> jpeg;
      cv::imencode(".jpg", image, jpeg, {cv::IMWRITE_JPEG_QUALITY, 90});
      const std::string key = std::to_string(100000 + i);
      tar.add(key + ".jpg", jpeg);
      const std::string label = std::to_string(i % 1000);
      tar.add(key + ".cls",
              std::span(reinterpret_cast<const std::uint8_t*>(label.data()), label.size()));
    }
    bytes += tar.finish();
  }
  return bytes;
}

// One epoch of webdataset_stream; images/s.
double ferry_epoch(const std::string& spec, std::size_t workers, const std::string& cache) {
  ferry::vision::WebDatasetStream::Options o;
  o.cache_dir = cache;
  auto dataset =
      std::make_shared<ferry::vision::WebDatasetStream>(ferry::vision::expand_shards(spec), o);
  ferry::DataLoader loader(dataset, {.batch_size = 32, .num_workers = workers});
  const auto start = Clock::now();
  std::size_t images = 0;
  for (auto& batch : loader) images += batch.size();
  return static_cast<double>(images) / std::chrono::duration<double>(Clock::now() - start).count();
}

// One shuffled epoch of map-style webdataset; images/s.
double ferry_map_epoch(const std::string& spec, std::size_t workers, std::size_t prefetch) {
  ferry::vision::WebDatasetOptions o;
  o.prefetch = prefetch;
  auto dataset = std::make_shared<ferry::vision::WebDataset>(ferry::vision::expand_shards(spec), o);
  ferry::DataLoader loader(dataset,
                           {.batch_size = 32, .shuffle = true, .num_workers = workers, .seed = 1});
  const auto start = Clock::now();
  std::size_t images = 0;
  for (auto& batch : loader) images += batch.size();
  return static_cast<double>(images) / std::chrono::duration<double>(Clock::now() - start).count();
}

// CPU seconds a process has used (user + system), from /proc/PID/stat.
double cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string f;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(f);
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

double peer_epoch(const Args& a, const std::vector<std::string>& shards, std::size_t workers) {
  std::ostringstream command;
  command << a.python << " " << FERRY_BENCH_DIR << "/remote_peer.py --workers " << workers;
  for (const auto& s : shards) command << " '" << s << "'";
  FILE* pipe = ::popen(command.str().c_str(), "r");
  if (pipe == nullptr) return 0;
  std::string out;
  char buffer[256];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) out += buffer;  // read to its end
  ::pclose(pipe);
  return std::atof(out.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  ferry::init(argc, argv);
  Args a;
  a.dir = fs::temp_directory_path() / ("ferry_remote_bench_" + std::to_string(::getpid()));
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (arg == "--images") {
      a.images = std::stoul(value());
    } else if (arg == "--shard-images") {
      a.per_shard = std::stoul(value());
    } else if (arg == "--workers") {
      a.workers.clear();
      std::stringstream s(value());
      for (std::string w; std::getline(s, w, ',');) a.workers.push_back(std::stoul(w));
    } else if (arg == "--repeat") {
      a.repeat = std::stoi(value());
    } else if (arg == "--markdown") {
      a.markdown = true;
    } else if (arg == "--python") {
      a.python = value();
    } else if (arg == "--map") {
      a.map = true;
    } else if (arg == "--latency-ms") {
      a.latency_ms = std::stod(value());
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--images N] [--shard-images N] [--workers W,..] [--repeat R] [--markdown] "
          "[--python P] [--map [--latency-ms L]]\n",
          argv[0]);
      return 2;
    }
  }
  if (auto why = ferry::test::object_store_unavailable()) {
    std::fprintf(stderr, "no S3 server: %s\n", why->c_str());
    return 77;
  }
  const fs::path local = a.dir / "local";
  const std::uint64_t bytes = write_shards(a, local);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(local)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  auto s3 = ferry::test::start_s3(a.dir / "store", {"bench"});
  ::setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
  ::setenv("AWS_REGION", "us-east-1", 1);
  ::setenv("AWS_ENDPOINT_URL", s3.url().c_str(), 1);
  std::vector<std::string> local_paths, urls;
  for (const auto& n : names) {
    ferry::net::http_put_file(ferry::net::request_for("s3://bench/" + n), (local / n).string());
    local_paths.push_back((local / n).string());
    urls.push_back(s3.url() + "/bench/" + n);
  }
  char range[64];
  std::snprintf(range, sizeof range, "shard-{000000..%06zu}.tar", names.size() - 1);
  const std::string local_spec = (local / range).string();
  const std::string s3_spec = std::string("s3://bench/") + range;
  std::printf("%zu images of %dx%d in %zu shards, %.1f MB; S3 server %s; median of %d\n", a.images,
              a.side, a.side, names.size(), static_cast<double>(bytes) / 1e6, s3.url().c_str(),
              a.repeat);

  if (a.map) {
    // The same shards through the fault proxy, which holds each GET latency_ms.
    std::optional<ferry::test::ServerProcess> proxy;
    std::string map_spec = s3_spec;
    if (a.latency_ms > 0) {
      const fs::path plan = a.dir / "plan.json";
      std::ofstream(plan) << "{\"faults\": [{\"method\": \"GET\", \"times\": -1, \"stall\": "
                          << a.latency_ms / 1000 << "}]}";
      proxy.emplace(ferry::test::start_fault_proxy(s3.port(), plan, a.dir / "proxy.log"));
      ::setenv("AWS_ENDPOINT_URL", proxy->url().c_str(), 1);
    }
    const char* map_rows[] = {"ferry map-style, local disk",
                              "ferry map-style, S3 ranges, prefetch: 0",
                              "ferry map-style, S3 ranges, read ahead"};
    std::map<std::pair<int, std::size_t>, std::vector<double>> map_rates;
    for (int r = 0; r < a.repeat; ++r) {
      for (const std::size_t w : a.workers) {
        map_rates[{0, w}].push_back(ferry_map_epoch(local_spec, w, 1));
        map_rates[{1, w}].push_back(ferry_map_epoch(map_spec, w, 0));
        map_rates[{2, w}].push_back(ferry_map_epoch(map_spec, w, 1));
      }
    }
    std::printf("map-style, shuffled, batch 32; S3 %s\n",
                a.latency_ms > 0 ? ("through a proxy holding each GET " +
                                    std::to_string(static_cast<int>(a.latency_ms)) + " ms")
                                       .c_str()
                                 : "on loopback (no added latency)");
    if (a.markdown) {
      std::printf(
          "\n| reader | workers | images/s | vs local | vs prefetch: 0 |\n"
          "|---|---:|---:|---:|---:|\n");
    }
    for (const std::size_t w : a.workers) {
      const double base = median(map_rates[{0, w}]);
      const double off = median(map_rates[{1, w}]);
      for (int k = 0; k < 3; ++k) {
        const double v = median(map_rates[{k, w}]);
        if (a.markdown) {
          std::printf(
              "| %s | %zu | %.0f | %.2fx | %s |\n", map_rows[k], w, v, base > 0 ? v / base : 0,
              k == 0 ? "" : (std::to_string(off > 0 ? v / off : 0).substr(0, 4) + "x").c_str());
        } else {
          std::printf("%-42s workers %zu: %8.0f images/s  %.2fx local  %.2fx prefetch: 0\n",
                      map_rows[k], w, v, base > 0 ? v / base : 0, off > 0 ? v / off : 0);
        }
      }
    }
    std::error_code ec;
    fs::remove_all(a.dir, ec);
    return 0;
  }

  const char* rows[] = {"ferry, local disk",
                        "ferry, S3 stream (no cache)",
                        "ferry, S3 through a cold cache",
                        "ferry, S3 from a warm cache",
                        "Python peer, local disk",
                        "Python peer, S3 (curl pipes)"};
  std::map<std::pair<int, std::size_t>, std::vector<double>> rates;
  std::map<std::size_t, std::vector<double>> server_cores;  // the S3 server's CPU, cold stream
  for (int r = 0; r < a.repeat; ++r) {
    for (const std::size_t w : a.workers) {
      const fs::path cache = a.dir / ("cache-" + std::to_string(r) + "-" + std::to_string(w));
      rates[{0, w}].push_back(ferry_epoch(local_spec, w, ""));
      const double cpu0 = cpu_seconds(s3.pid());
      const auto t0 = Clock::now();
      rates[{1, w}].push_back(ferry_epoch(s3_spec, w, ""));
      server_cores[w].push_back((cpu_seconds(s3.pid()) - cpu0) /
                                std::chrono::duration<double>(Clock::now() - t0).count());
      rates[{2, w}].push_back(ferry_epoch(s3_spec, w, cache.string()));
      rates[{3, w}].push_back(ferry_epoch(s3_spec, w, cache.string()));
      rates[{4, w}].push_back(peer_epoch(a, local_paths, w));
      rates[{5, w}].push_back(peer_epoch(a, urls, w));
    }
  }
  const double mb_per_image = static_cast<double>(bytes) / 1e6 / static_cast<double>(a.images);
  if (a.markdown) {
    std::printf(
        "\n| reader | workers | images/s | MB/s | vs ferry local |\n|---|---:|---:|---:|---:|\n");
  }
  for (const std::size_t w : a.workers) {
    const double base = median(rates[{0, w}]);
    for (int k = 0; k < 6; ++k) {
      const double v = median(rates[{k, w}]);
      if (a.markdown) {
        std::printf("| %s | %zu | %.0f | %.1f | %.2fx |\n", rows[k], w, v, v * mb_per_image,
                    base > 0 ? v / base : 0);
      } else {
        std::printf("%-32s workers %zu: %8.0f images/s %7.1f MB/s  %.2fx ferry local\n", rows[k], w,
                    v, v * mb_per_image, base > 0 ? v / base : 0);
      }
    }
    const double peer_local = median(rates[{4, w}]), peer_s3 = median(rates[{5, w}]);
    std::printf(
        "%s%zu workers: ferry/peer %.2fx on local disk, %.2fx over S3 (cold stream); the S3 "
        "server used %.2f cores of this machine's %ld during ferry's cold stream\n",
        a.markdown ? "\n" : "", w, peer_local > 0 ? base / peer_local : 0,
        peer_s3 > 0 ? median(rates[{1, w}]) / peer_s3 : 0, median(server_cores[w]),
        ::sysconf(_SC_NPROCESSORS_ONLN));
  }
  std::error_code ec;
  fs::remove_all(a.dir, ec);
  return 0;
}
