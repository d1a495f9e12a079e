#pragma once

// Reading ahead: work a dataset was told it will need soon (the byte ranges of its next samples,
// the shards they lie in), done on threads of its own while the caller works on what it has.
//
// A Prefetcher runs keyed jobs in the order they were asked for, on up to `threads` threads it
// starts when work comes. "Fetch" jobs produce bytes, held until the caller takes them; at most
// `max_bytes` are asked for and held at once, and a job that would pass the bound is refused (the
// caller reads it itself when it gets there). "Warm" jobs produce nothing (a download into the
// node-local cache); at most `max_warm` are queued or running. Taking a key whose job has not
// started runs it on the taking thread; a running one is waited for; a failed one rethrows its
// error there, so a sample's error is raised by the sample. Held bytes that are never taken (a
// batch that failed part-way) are dropped when room is needed once bytes of a hint `kStaleRounds`
// later have been taken.
//
// A Prefetcher belongs to the process that made it: its threads do not survive a fork.
// PrefetcherSlot gives each process its own and leaves one that came through a fork untouched
// (its locks may have been held by threads that are not in the child), never freed.

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

namespace ferry::net {

class Prefetcher {
 public:
  struct Limits {
    std::size_t threads = 8;                // requests at once
    std::uint64_t max_bytes = 64ull << 20;  // fetched bytes asked for and held at once
    std::size_t max_warm = 1;               // warm jobs queued or running at once
  };
  // A job; `cancel` is set when the Prefetcher goes (pass it to the request: Request::cancel).
  using Fetch = std::function<std::vector<std::uint8_t>(const std::atomic<bool>& cancel)>;
  using Warm = std::function<void(const std::atomic<bool>& cancel)>;
  // Held bytes of a hint (new_round) may be dropped, when room is needed, once bytes of a hint
  // this many later have been taken: the loader has moved past them.
  static constexpr std::uint64_t kStaleRounds = 8;

  explicit Prefetcher(Limits limits);
  // Cancels what is queued or running and waits for the threads (a request that is waiting for
  // an answer notices within about a second; see Request::cancel).
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Starts a new hint: jobs asked for from now on belong to it.
  void new_round();
  // Queues `job` under `key`, which will produce `bytes` bytes. False (nothing queued) when the
  // key is queued, running or held already, or when it would pass max_bytes.
  bool fetch(std::uint64_t key, std::uint64_t bytes, Fetch job);
  // Queues a warm job under `key`; false when that key is queued or running, or max_warm are.
  bool warm(std::uint64_t key, Warm job);
  // The bytes of `key`'s fetch (see above); nullopt when none was asked for, or it was dropped.
  std::optional<std::vector<std::uint8_t>> take(std::uint64_t key);

  pid_t owner() const noexcept { return owner_; }
  // For tests: fetched bytes asked for or held now, and jobs queued or running.
  std::uint64_t bytes_in_use() const;
  std::size_t jobs_pending() const;

 private:
  enum class State { kQueued, kRunning, kDone };
  struct Entry {
    State state = State::kQueued;
    std::uint64_t bytes = 0;
    std::uint64_t round = 0;
    bool warm = false;
    Fetch fetch;
    Warm warm_job;
    std::vector<std::uint8_t> result;
    std::exception_ptr error;
  };
  // Keys of warm jobs live apart from fetches' (the high bit), so both can use small numbers.
  static constexpr std::uint64_t kWarmBit = std::uint64_t{1} << 63;

  void run();
  void start_thread_if_needed();        // with mutex_ held
  void drop_stale(std::uint64_t need);  // with mutex_ held
  static void execute(Entry& entry, const std::atomic<bool>& cancel);

  const Limits limits_;
  const pid_t owner_;
  mutable std::mutex mutex_;
  std::condition_variable work_;  // a job was queued, or the Prefetcher goes
  std::condition_variable done_;  // a job ended
  std::unordered_map<std::uint64_t, Entry> entries_;
  std::deque<std::uint64_t> queue_;
  std::uint64_t bytes_ = 0;
  std::size_t warm_ = 0;
  std::uint64_t round_ = 0;
  std::uint64_t taken_round_ = 0;  // the latest hint whose bytes were taken
  std::size_t idle_ = 0;           // threads waiting for work
  std::atomic<bool> cancel_{false};
  std::vector<std::thread> threads_;
};

// One Prefetcher per process, made on first use (see above). A copy starts empty.
class PrefetcherSlot {
 public:
  PrefetcherSlot() = default;
  PrefetcherSlot(const PrefetcherSlot&) noexcept {}
  PrefetcherSlot& operator=(const PrefetcherSlot&) noexcept { return *this; }
  ~PrefetcherSlot();

  // This process's Prefetcher, made with `limits` if it has none.
  Prefetcher& get(const Prefetcher::Limits& limits);
  // This process's Prefetcher, or null.
  Prefetcher* find() const noexcept;

 private:
  std::atomic<Prefetcher*> prefetcher_{nullptr};
};

}  // namespace ferry::net
