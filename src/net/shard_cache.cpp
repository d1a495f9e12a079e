#include "net/shard_cache.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ferry/error.h"

#include "core/hash.h"
#include "ipc/files.h"
#include "ipc/unique_fd.h"
#include "net/byte_source.h"
#include "net/url.h"

namespace ferry::net {

namespace fs = std::filesystem;
using ferry::detail::str;
using json = nlohmann::json;

namespace {

std::atomic<std::uint64_t> g_hits{0};
std::atomic<std::uint64_t> g_downloads{0};
std::atomic<std::uint64_t> g_evictions{0};

// The cache's name of a shard: its file name, after a hash of its location. A pre-signed URL is
// signed anew each time for the same object: its query identifies the object only when it holds
// no signature (X-Amz-*, Signature, Expires, ...), and is left out when it does.
std::string entry_name(const std::string& location) {
  std::string identity = location;
  if (const auto q = identity.find('?'); q != std::string::npos) {
    const std::string query = identity.substr(q);
    for (const char* signed_by : {"X-Amz-", "x-amz-", "Signature=", "Expires=", "sig=", "se="}) {
      if (query.find(signed_by) != std::string::npos) {
        identity.resize(q);
        break;
      }
    }
  }
  std::string base = identity.substr(identity.rfind('/') + 1);
  if (base.empty()) base = "object";
  for (char& c : base) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  }
  return ferry::detail::hex64(ferry::detail::fnv1a(identity)) + "-" + base.substr(0, 100);
}

// An flock on NAME.lock, released when this object (or the process) ends.
class EntryLock {
 public:
  explicit EntryLock(const std::string& path) {
    fd_.reset(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!fd_) {
      throw Error(str("shard cache: cannot open ", path, ": ", std::strerror(errno),
                      "; check that cache_dir is a writable folder"));
    }
  }
  bool try_lock() {
    while (true) {
      if (::flock(fd_.get(), LOCK_EX | LOCK_NB) == 0) return true;
      if (errno == EINTR) continue;
      if (errno == EWOULDBLOCK) return false;
      throw std::system_error(errno, std::generic_category(), "flock");
    }
  }

 private:
  ipc::UniqueFd fd_;
};

std::optional<json> read_meta(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  try {
    return json::parse(ipc::read_file(path, "shard cache meta"));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// A copy is complete when its meta names its size, and matches what the caller expects.
bool complete(const fs::path& data,
              const fs::path& meta,
              const std::optional<ObjectInfo>& expected) {
  const auto m = read_meta(meta);
  if (!m || !m->contains("size") || !m->contains("etag")) return false;
  std::error_code ec;
  const auto size = fs::file_size(data, ec);
  if (ec || size != (*m)["size"].get<std::uint64_t>()) return false;
  if (expected && (expected->size != size || (!expected->etag.empty() &&
                                              expected->etag != (*m)["etag"].get<std::string>()))) {
    return false;
  }
  return true;
}

void touch(const fs::path& path) noexcept { ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0); }

// What this process has verified: a map-style dataset asks for its shard at every sample, and the
// meta (a read and a JSON parse) is checked once; after that one stat of the data file's size.
// Checking the size again catches a copy cut short or evicted (then gone) since.
struct Verified {
  std::uint64_t size = 0;
  std::string etag;
};
std::mutex g_verified_mutex;
std::unordered_map<std::string, Verified> g_verified;  // by data path
std::unordered_set<std::string> g_created;             // cache folders made or found
// The mutex is held across fork() (pthread_atfork): a child never inherits it locked by another
// thread of the parent (one reading ahead: net/prefetch.h), nor the memo half-written.
const bool g_verified_atfork = [] {
  ::pthread_atfork([] { g_verified_mutex.lock(); }, [] { g_verified_mutex.unlock(); },
                   [] { g_verified_mutex.unlock(); });
  return true;
}();

bool verified(const fs::path& data, const std::optional<ObjectInfo>& expected) {
  Verified v;
  {
    const std::lock_guard<std::mutex> lock(g_verified_mutex);
    const auto it = g_verified.find(data.string());
    if (it == g_verified.end()) return false;
    v = it->second;
  }
  if (expected &&
      (expected->size != v.size || (!expected->etag.empty() && expected->etag != v.etag))) {
    return false;
  }
  struct stat st {};
  return ::stat(data.c_str(), &st) == 0 && static_cast<std::uint64_t>(st.st_size) == v.size;
}

void remember(const fs::path& data, const fs::path& meta) {
  const auto m = read_meta(meta);
  if (!m) return;
  const std::lock_guard<std::mutex> lock(g_verified_mutex);
  g_verified[data.string()] = {(*m)["size"].get<std::uint64_t>(), (*m)["etag"].get<std::string>()};
}

}  // namespace

CacheCounters cache_counters() noexcept {
  return {g_hits.load(), g_downloads.load(), g_evictions.load()};
}

ShardCache::ShardCache(std::string dir, std::uint64_t limit) : dir_(std::move(dir)), limit_(limit) {
  {
    const std::lock_guard<std::mutex> lock(g_verified_mutex);
    if (g_created.count(dir_) != 0) return;
  }
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (!ec) {
    const std::lock_guard<std::mutex> lock(g_verified_mutex);
    g_created.insert(dir_);
  }
  if (ec) {
    throw ConfigError(str("cache_dir ", dir_, ": cannot create it: ", ec.message()));
  }
}

std::unique_ptr<ByteSource> ShardCache::open(const std::string& location,
                                             const std::optional<ObjectInfo>& expected,
                                             const RetryPolicy& retry) {
  for (int attempt = 0;; ++attempt) {
    const std::string path = ensure(location, expected, retry);
    try {
      return open_sequential(path);
    } catch (const DataError&) {
      std::error_code ec;
      if (fs::exists(path, ec) || attempt == 3) throw;  // gone: evicted meanwhile
    }
  }
}

bool ShardCache::known_complete(const std::string& location,
                                const std::optional<ObjectInfo>& expected) const {
  return verified(fs::path(dir_) / entry_name(location), expected);
}

std::string ShardCache::ensure(const std::string& location,
                               const std::optional<ObjectInfo>& expected,
                               const RetryPolicy& retry,
                               const std::atomic<bool>* cancel,
                               bool count) {
  const std::string name = entry_name(location);
  const fs::path data = fs::path(dir_) / name;
  const fs::path meta = fs::path(dir_) / (name + ".meta");
  if (verified(data, expected)) {
    if (count) ++g_hits;
    return data.string();
  }
  if (complete(data, meta, expected)) {
    if (count) ++g_hits;
    touch(meta);
    remember(data, meta);
    return data.string();
  }
  EntryLock lock((fs::path(dir_) / (name + ".lock")).string());
  // Another process may be downloading it: wait while its temporary file grows.
  const auto quiet_limit =
      retry.stall_timeout * std::max(1, retry.max_attempts) + std::chrono::seconds(30);
  std::uintmax_t last_size = 0;
  auto last_change = std::chrono::steady_clock::now();
  while (!lock.try_lock()) {
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      throw Error(str("shard cache: the wait for ", redact(location), " was cancelled"));
    }
    std::uintmax_t size = 0;
    std::error_code ec;
    for (const ipc::DirectoryEntry& e : ipc::list_directory(dir_, ec)) {
      if (e.name.rfind(name + ".tmp-", 0) == 0) size += fs::file_size(fs::path(dir_) / e.name, ec);
    }
    if (size != last_size) {
      last_size = size;
      last_change = std::chrono::steady_clock::now();
    } else if (std::chrono::steady_clock::now() - last_change > quiet_limit) {
      throw Error(str("shard cache ", dir_, ": another process holds the lock of ",
                      redact(location), " and its download made no progress for ",
                      std::chrono::duration_cast<std::chrono::seconds>(quiet_limit).count(),
                      " s; is a process of this job stopped (SIGSTOP)?"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (complete(data, meta, expected)) {  // it came while this process waited
    if (count) ++g_hits;
    touch(meta);
    remember(data, meta);
    return data.string();
  }
  // This process downloads it. What a killed one left is removed first.
  std::error_code ec;
  for (const ipc::DirectoryEntry& e : ipc::list_directory(dir_, ec)) {
    if (e.name.rfind(name + ".tmp-", 0) == 0) fs::remove(fs::path(dir_) / e.name, ec);
  }
  fs::remove(meta, ec);
  fs::remove(data, ec);
  const fs::path tmp = fs::path(dir_) / str(name, ".tmp-", ::getpid());
  {
    ipc::UniqueFd out(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!out) {
      throw Error(str("shard cache: cannot create ", tmp.string(), ": ", std::strerror(errno)));
    }
    try {
      Request request = request_for(location, retry);
      request.cancel = cancel;  // ends a wait for an answer too, not only between chunks
      HttpStream stream(std::move(request), 0);
      std::vector<std::uint8_t> buffer(1 << 20);
      std::uint64_t total = 0;
      while (const std::size_t n = stream.read(buffer.data(), buffer.size())) {
        if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
          throw Error(str("shard cache: the download of ", redact(location), " was cancelled"));
        }
        std::size_t done = 0;
        while (done < n) {
          const ssize_t k = ::write(out.get(), buffer.data() + done, n - done);
          if (k < 0 && errno == EINTR) continue;
          if (k < 0) {
            throw Error(str("shard cache: writing ", tmp.string(), " failed: ",
                            std::strerror(errno), errno == ENOSPC ? "; lower cache_limit" : ""));
          }
          done += static_cast<std::size_t>(k);
        }
        total += n;
      }
      const auto size = stream.size();
      if (size && *size != total) {
        throw DataError(str(redact(location), ": ", total, " bytes came of ", *size));
      }
      if (expected &&
          (expected->size != total || (!expected->etag.empty() && !stream.etag().empty() &&
                                       expected->etag != stream.etag()))) {
        throw DataError(str(redact(location), ": the object changed since the dataset was opened (",
                            "size ", total, ", ETag ", stream.etag(), "; expected ", expected->size,
                            ", ", expected->etag, "); build the dataset again"));
      }
      ipc::rename_durably(tmp, data, "shard cache");
      ipc::write_file_atomically(
          meta, json{{"url", redact(location)}, {"size", total}, {"etag", stream.etag()}}.dump(),
          "shard cache meta");
    } catch (...) {
      fs::remove(tmp, ec);
      throw;
    }
  }
  remember(data, meta);
  ++g_downloads;
  if (limit_ > 0) evict(name);
  return data.string();
}

// Least recently used entries go while the cache holds more than its limit; never `keep` (just
// downloaded) nor an entry whose lock another process holds.
void ShardCache::evict(const std::string& keep) {
  struct Entry {
    std::string name;
    std::uint64_t size;
    fs::file_time_type used;
  };
  std::vector<Entry> entries;
  std::uint64_t total = 0;
  std::error_code ec;
  for (const ipc::DirectoryEntry& e : ipc::list_directory(dir_, ec)) {
    if (e.is_directory || e.name.size() < 6 || e.name.compare(e.name.size() - 5, 5, ".meta") != 0) {
      continue;
    }
    const std::string name = e.name.substr(0, e.name.size() - 5);
    std::error_code e1;
    std::error_code e2;
    const auto size = fs::file_size(fs::path(dir_) / name, e1);
    const auto used = fs::last_write_time(fs::path(dir_) / e.name, e2);
    if (e1 || e2) continue;
    total += size;
    if (name != keep) entries.push_back({name, size, used});
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.used < b.used; });
  for (const Entry& e : entries) {
    if (total <= limit_) break;
    EntryLock lock((fs::path(dir_) / (e.name + ".lock")).string());
    if (!lock.try_lock()) continue;
    // The meta goes first: an entry without one is incomplete to every reader. A process that
    // has the data open reads on; the bytes go when it closes them.
    fs::remove(fs::path(dir_) / (e.name + ".meta"), ec);
    fs::remove(fs::path(dir_) / e.name, ec);
    total -= std::min(total, e.size);
    ++g_evictions;
  }
}

}  // namespace ferry::net
