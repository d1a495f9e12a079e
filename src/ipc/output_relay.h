#pragma once

// Copies what other processes write into pipes on to one descriptor of this process (its
// stderr), as it comes, and keeps each pipe's last lines, so that an error about a process that
// died can quote what it said last. One thread serves every pipe.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ipc/unique_fd.h"

namespace ferry::ipc {

class OutputRelay {
 public:
  struct Options {
    int target_fd = 2;                       // where the bytes go (looked up at each write)
    std::size_t tail_lines = 20;             // kept per pipe
    std::size_t line_bytes = 400;            // a longer line is cut (the tail stays small)
    std::function<void()> on_wake;           // run on the relay's thread after each wake()
    std::function<void(UniqueFd)> close_fd;  // how to close a pipe (default: close it)
  };
  // Starts the thread. Throws std::system_error if its eventfds or thread cannot be made.
  explicit OutputRelay(Options options);
  // Stops the thread; pipes still open are closed, their last bytes not relayed.
  ~OutputRelay();
  OutputRelay(const OutputRelay&) = delete;
  OutputRelay& operator=(const OutputRelay&) = delete;

  // Relays the read end of a pipe from now on; returns its key. `read_end` is taken only on
  // success.
  std::uint64_t add(UniqueFd& read_end);
  // Waits until every writer of pipe `key` has closed it (its process ended), relaying what is
  // left, or until `deadline` (then 20 ms more at most, for the thread to let go of it); then
  // closes it (or leaves that to the thread) and returns its last lines, oldest first (a last
  // line with no newline included). An unknown key gives none.
  std::vector<std::string> finish(std::uint64_t key,
                                  std::chrono::steady_clock::time_point deadline);
  // Its last lines so far, without waiting or closing.
  std::vector<std::string> tail(std::uint64_t key) const;
  // Async-signal-safe: makes the thread run options.on_wake once soon.
  void wake() noexcept;
  // The relay's own descriptors (two eventfds), for a caller that keeps them from children.
  std::vector<int> own_fds() const { return {control_.get(), signal_.get()}; }

 private:
  struct Source {
    UniqueFd fd;
    // The last lines, a ring whose strings are reserved at add(): the thread never allocates
    // while it relays (a fork made meanwhile, under a sanitizer's allocator, could otherwise
    // inherit its lock held).
    std::vector<std::string> ring;
    std::size_t first = 0;  // the oldest line in `ring`
    std::size_t count = 0;  // lines in `ring`
    std::string partial;    // the line being written
    bool ended = false;     // EOF or an error: fd closed by the thread
    bool dropped = false;   // finish() gave up waiting: the thread closes it...
    bool orphaned = false;  // ...and, once finish() has returned, forgets it
  };
  void run(std::promise<void>& started);
  void relay(Source& source, const char* bytes, std::size_t n);  // unlocked: writes
  void keep(Source& source, const char* bytes, std::size_t n);   // under mutex_
  void close_source(Source& source);                             // under mutex_
  std::vector<std::string> lines_of(const Source& source) const;

  Options options_;
  UniqueFd control_;  // eventfd: the set of pipes changed, or stop
  UniqueFd signal_;   // eventfd: wake() was called
  mutable std::mutex mutex_;
  std::condition_variable changed_;  // a pipe ended or was closed
  std::map<std::uint64_t, Source> sources_;
  std::uint64_t next_key_ = 1;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ferry::ipc
