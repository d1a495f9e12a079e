// Token throughput: ferry's `gpt` dataset (Megatron-LM's windows, read in place) through its
// DataLoader, against PyTorch's DataLoader over a Dataset that reads the same windows from the
// same memmap and nanoGPT's get_batch loop (bench/token_peer.py, run with /usr/bin/python3), in
// one run; and the bytes ferry delivers against this machine's memcpy bandwidth, and its first
// batch from a small and a large file. It reports; it never fails on a timing.
//
// clang-format off
//   build/bench/ferry_token_bench            # 2048 and 8192 tokens, batch 8 and 32, 0-2 workers
//   build/bench/ferry_token_bench --seq-lengths 2048 --batches 8 --workers 2 --seconds 3 --repeat 3
//   build/bench/ferry_token_bench --no-peers --markdown
// clang-format on

#include <stdio.h>  // popen

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ferry/ferry.h"

#include "datasets/gpt_indices.h"
#include "datasets/token_files.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::vector<std::size_t> list(const std::string& text) {
  std::vector<std::size_t> out;
  std::stringstream s(text);
  for (std::string item; std::getline(s, item, ',');) out.push_back(std::stoul(item));
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Args {
  std::size_t tokens = 256u << 20;  // 512 MB of uint16
  std::vector<std::size_t> seq_lengths{2048, 8192};
  std::vector<std::size_t> batches{8, 32};
  std::vector<std::size_t> workers{0, 1, 2};
  double seconds = 2.0;
  int repeat = 1;
  bool peers = true;
  bool markdown = false;
  std::string dir = (fs::temp_directory_path() / "ferry_token_bench").string();
  std::string python = "/usr/bin/python3";
};

// A Megatron-LM indexed dataset of `tokens` uint16 tokens in documents of 20 to 4000 tokens,
// written once and reused.
std::string make_dataset(const Args& a) {
  const fs::path prefix = fs::path(a.dir) / ("tokens-" + std::to_string(a.tokens));
  if (fs::exists(prefix.string() + ".idx")) return prefix.string();
  fs::create_directories(a.dir);
  std::fprintf(stderr, "writing %zu tokens to %s.{idx,bin}\n", a.tokens, prefix.c_str());
  std::mt19937 rng(7);
  std::vector<std::int32_t> lengths;
  std::vector<std::int64_t> pointers;
  {
    std::ofstream bin(prefix.string() + ".bin", std::ios::binary);
    std::vector<std::uint16_t> doc;
    std::size_t written = 0;
    while (written < a.tokens) {
      const std::size_t n = std::min<std::size_t>(20 + rng() % 3981, a.tokens - written);
      doc.resize(n);
      for (auto& t : doc) t = static_cast<std::uint16_t>(rng() % 50257);
      pointers.push_back(static_cast<std::int64_t>(written * 2));
      lengths.push_back(static_cast<std::int32_t>(n));
      bin.write(reinterpret_cast<const char*>(doc.data()), static_cast<std::streamsize>(n * 2));
      written += n;
    }
  }
  std::ofstream idx(prefix.string() + ".idx", std::ios::binary);
  const std::uint64_t version = 1, n = lengths.size(), documents = n + 1;
  idx.write("MMIDIDX\0\0", 9);
  idx.write(reinterpret_cast<const char*>(&version), 8);
  const std::uint8_t code = 8;  // uint16
  idx.write(reinterpret_cast<const char*>(&code), 1);
  idx.write(reinterpret_cast<const char*>(&n), 8);
  idx.write(reinterpret_cast<const char*>(&documents), 8);
  idx.write(reinterpret_cast<const char*>(lengths.data()), static_cast<std::streamsize>(4 * n));
  idx.write(reinterpret_cast<const char*>(pointers.data()), static_cast<std::streamsize>(8 * n));
  for (std::uint64_t d = 0; d <= n; ++d) {
    const auto v = static_cast<std::int64_t>(d);
    idx.write(reinterpret_cast<const char*>(&v), 8);
  }
  return prefix.string();
}

// Brings the file into the page cache.
void warm(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> buffer(1 << 20);
  while (in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()))) {
  }
}

// This machine's memcpy bandwidth, one thread, 64 MB copies: bytes a second.
double memcpy_rate() {
  std::vector<char> from(64 << 20, 1), to(64 << 20);
  std::memcpy(to.data(), from.data(), from.size());
  const auto start = Clock::now();
  int rounds = 0;
  while (seconds_since(start) < 1.0) {
    std::memcpy(to.data(), from.data(), from.size());
    ++rounds;
  }
  return static_cast<double>(rounds) * static_cast<double>(from.size()) / seconds_since(start);
}

struct Run {
  double tokens_per_second = 0;
  double bytes_per_second = 0;  // tokens and labels as delivered
  double first_batch = 0;
};

Run ferry_run(const std::string& prefix,
              const ferry::GptDataset::Options& o,
              std::size_t batch,
              std::size_t workers,
              double seconds) {
  Run r;
  const auto start = Clock::now();
  auto dataset = std::make_shared<ferry::GptDataset>(prefix, o);
  ferry::DataLoader loader(
      dataset, {.batch_size = batch, .num_workers = workers, .persistent_workers = workers > 0});
  std::size_t tokens = 0, bytes = 0;
  Clock::time_point timed;
  bool first = true;
  for (int epoch = 0; epoch < 1000 && (first || seconds_since(timed) < seconds); ++epoch) {
    for (auto& b : loader) {
      if (first) {
        r.first_batch = seconds_since(start);
        first = false;
        timed = Clock::now();
        continue;
      }
      tokens += static_cast<std::size_t>(b["tokens"].numel());
      bytes += b["tokens"].nbytes() + b["labels"].nbytes();
      if (seconds_since(timed) >= seconds) break;
    }
  }
  const double elapsed = seconds_since(timed);
  r.tokens_per_second = static_cast<double>(tokens) / elapsed;
  r.bytes_per_second = static_cast<double>(bytes) / elapsed;
  return r;
}

std::map<std::string, double> peer_run(const Args& a,
                                       const std::string& prefix,
                                       const std::string& cache,
                                       const std::string& hash,
                                       std::size_t L,
                                       std::size_t batch,
                                       std::size_t workers,
                                       bool nanogpt) {
  std::ostringstream command;
  command << a.python << " " << FERRY_BENCH_DIR << "/token_peer.py --prefix " << prefix
          << " --cache " << cache << " --hash " << hash << " --seq-length " << L << " --batch "
          << batch << " --workers " << workers << " --seconds " << a.seconds
          << (nanogpt ? " --nanogpt" : "");
  std::map<std::string, double> out;
  FILE* pipe = ::popen(command.str().c_str(), "r");
  if (pipe == nullptr) return out;
  char line[4096];
  std::string text;
  while (std::fgets(line, sizeof line, pipe) != nullptr) text += line;
  ::pclose(pipe);
  // {"dataloader": X, "nanogpt": Y}
  for (const char* key : {"dataloader", "nanogpt"}) {
    const auto at = text.find(std::string("\"") + key + "\": ");
    if (at != std::string::npos) out[key] = std::stod(text.substr(at + std::strlen(key) + 4));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  ferry::init(argc, argv);
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (arg == "--tokens")
      a.tokens = std::stoul(value());
    else if (arg == "--seq-lengths")
      a.seq_lengths = list(value());
    else if (arg == "--batches")
      a.batches = list(value());
    else if (arg == "--workers")
      a.workers = list(value());
    else if (arg == "--seconds")
      a.seconds = std::stod(value());
    else if (arg == "--repeat")
      a.repeat = std::stoi(value());
    else if (arg == "--no-peers")
      a.peers = false;
    else if (arg == "--markdown")
      a.markdown = true;
    else if (arg == "--dir")
      a.dir = value();
    else if (arg == "--python")
      a.python = value();
    else {
      std::fprintf(stderr,
                   "usage: %s [--tokens N] [--seq-lengths L,..] [--batches B,..] "
                   "[--workers W,..] [--seconds S] [--repeat R] [--no-peers] "
                   "[--markdown] [--dir D] [--python P]\n",
                   argv[0]);
      return 2;
    }
  }
  const std::string prefix = make_dataset(a);
  warm(prefix + ".bin");
  const double memcpy_bytes = memcpy_rate();
  std::printf("memcpy (one thread, 64 MB): %.2f GB/s\n", memcpy_bytes / 1e9);
  const std::string cache = (fs::path(a.dir) / "cache").string();
  if (a.markdown) {
    std::printf(
        "\n| seq_length | batch | workers | ferry, tokens/s | PyTorch DataLoader | ferry / "
        "PyTorch | nanoGPT get_batch | ferry MB/s | of memcpy |\n");
    std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  }
  for (const std::size_t L : a.seq_lengths) {
    ferry::GptDataset::Options o;
    o.seq_length = L;
    o.cache = cache;
    const ferry::GptDataset indexed(prefix, o);  // builds (or reads) the indices once
    const std::string hash = indexed.cache_hash();
    for (const std::size_t batch : a.batches) {
      bool nanogpt_done = false;
      double nanogpt = 0;
      for (const std::size_t w : a.workers) {
        std::vector<double> ferry_tokens, ferry_bytes, peer_tokens, nano;
        for (int r = 0; r < a.repeat; ++r) {
          const Run f = ferry_run(prefix, o, batch, w, a.seconds);
          ferry_tokens.push_back(f.tokens_per_second);
          ferry_bytes.push_back(f.bytes_per_second);
          if (a.peers) {
            const auto p = peer_run(a, prefix, cache, hash, L, batch, w, !nanogpt_done);
            peer_tokens.push_back(p.count("dataloader") ? p.at("dataloader") : 0);
            if (p.count("nanogpt")) nano.push_back(p.at("nanogpt"));
          }
        }
        if (!nano.empty()) {
          nanogpt = median(nano);
          nanogpt_done = true;
        }
        const double ft = median(ferry_tokens), fb = median(ferry_bytes), pt = median(peer_tokens);
        std::fprintf(stderr, "L=%zu batch=%zu workers=%zu: ferry %.0f tokens/s, PyTorch %.0f\n", L,
                     batch, w, ft, pt);
        if (a.markdown) {
          std::printf("| %zu | %zu | %zu | %.0f | %.0f | %.2fx | %s | %.0f | %.0f%% |\n", L, batch,
                      w, ft, pt, pt > 0 ? ft / pt : 0.0,
                      nanogpt > 0 && w == a.workers.front()
                          ? std::to_string(static_cast<long long>(nanogpt)).c_str()
                          : "",
                      fb / 1e6, 100.0 * fb / memcpy_bytes);
        } else {
          std::printf(
              "L=%zu batch=%zu workers=%zu ferry=%.0f tokens/s (%.0f MB/s, %.0f%% of "
              "memcpy) pytorch=%.0f ratio=%.2f nanogpt=%.0f\n",
              L, batch, w, ft, fb / 1e6, 100.0 * fb / memcpy_bytes, pt, pt > 0 ? ft / pt : 0.0,
              nanogpt);
        }
      }
    }
  }
  // First batch: this file against one of a thousandth of its tokens.
  Args small = a;
  small.tokens = std::max<std::size_t>(a.tokens / 1000, 1 << 20);
  const std::string small_prefix = make_dataset(small);
  for (const auto& [name, p] :
       {std::pair{std::string("large"), prefix}, {std::string("small"), small_prefix}}) {
    ferry::GptDataset::Options o;
    o.seq_length = a.seq_lengths.front();
    o.cache = cache;
    const Run f = ferry_run(p, o, a.batches.front(), 2, 0.0);
    std::printf("first batch, %s file (%s): %.3f s\n", name.c_str(), p.c_str(), f.first_batch);
  }
  return 0;
}
