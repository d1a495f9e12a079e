#pragma once

// A node-local cache of remote shards: one download of each shard per machine, whatever the
// number of ranks and workers on it, coordinated by file locks (no daemon).
//
// An entry is NAME (the shard's bytes), NAME.meta (its URL without secrets, size and ETag) and
// NAME.lock (flock'ed by the one process downloading or evicting it). A download goes to
// NAME.tmp-PID and is renamed to NAME once its size is the object's and its ETag held through
// the download; NAME.meta is written after (atomically), so an entry without one, or whose size
// is not its meta's, is incomplete and fetched again. A process killed at any moment leaves at
// most a temporary file, removed by the next process that takes the entry's lock (the kernel
// releases a dead process's locks). Entries used least recently (the meta's mtime, touched at each
// use) are evicted while the cache holds more than its limit, never one another process holds.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "net/byte_source.h"
#include "net/http.h"

namespace ferry::net {

struct CacheCounters {
  std::uint64_t hits = 0;
  std::uint64_t downloads = 0;
  std::uint64_t evictions = 0;
};
CacheCounters cache_counters() noexcept;

class ShardCache {
 public:
  // `limit` in bytes; 0: no limit.
  ShardCache(std::string dir, std::uint64_t limit);

  // The path of a complete local copy of `location` (s3:// or http(s)://), downloaded first when
  // missing or incomplete. `expected`, when known (a HEAD the caller made), must match the copy,
  // else it is fetched again. Waits for another process's download of the same shard while its
  // temporary file grows; throws ferry::Error when it stops growing for `retry`'s bounds.
  // `cancel`, when set while this process downloads, ends the download (a prefetch its stream no
  // longer wants) with ferry::Error; `count` false: a hit is not counted (a prefetch's check).
  std::string ensure(const std::string& location,
                     const std::optional<ObjectInfo>& expected,
                     const RetryPolicy& retry,
                     const std::atomic<bool>* cancel = nullptr,
                     bool count = true);

  // The complete copy, open: ensure() again if another process evicted it between the check and
  // the open.
  std::unique_ptr<ByteSource> open(const std::string& location,
                                   const std::optional<ObjectInfo>& expected,
                                   const RetryPolicy& retry);

  // Whether this process has already found (or made) a complete copy of `location` matching
  // `expected` that is still there: no download to start. A stat, no lock.
  bool known_complete(const std::string& location, const std::optional<ObjectInfo>& expected) const;

  const std::string& dir() const noexcept { return dir_; }

 private:
  void evict(const std::string& keep);

  std::string dir_;
  std::uint64_t limit_;
};

}  // namespace ferry::net
