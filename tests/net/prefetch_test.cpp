// Reading ahead (net/prefetch.h) without a network: jobs run on the Prefetcher's threads in the
// order asked, their bytes are held until taken, a failure is raised by the taker, the bounds
// hold, a Prefetcher going cancels what it runs, and a forked child gets its own.

#include "net/prefetch.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace ferry::net {
namespace {

using namespace std::chrono_literals;

// A gate jobs wait at until the test opens it (or the job is cancelled).
class Gate {
 public:
  void open() {
    const std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }
  // True when opened, false when cancelled first.
  bool pass(const std::atomic<bool>& cancel) {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!open_) {
      if (cancel.load()) return false;
      cv_.wait_for(lock, 10ms);
    }
    return true;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

std::vector<std::uint8_t> bytes_of(std::uint8_t value, std::size_t n) {
  return std::vector<std::uint8_t>(n, value);
}

TEST(Prefetcher, FetchedBytesAreHeldUntilTakenAndATakenKeyIsGone) {
  Prefetcher p(Prefetcher::Limits{});
  std::atomic<int> runs{0};
  for (std::uint64_t k = 0; k < 5; ++k) {
    EXPECT_TRUE(p.fetch(k, 3, [k, &runs](const std::atomic<bool>&) {
      ++runs;
      return bytes_of(static_cast<std::uint8_t>(k), 3);
    }));
  }
  EXPECT_FALSE(p.fetch(2, 3, [](const std::atomic<bool>&) { return bytes_of(9, 3); }))
      << "a key already asked for is not asked again";
  for (std::uint64_t k : {4, 0, 2, 1, 3}) {
    const auto got = p.take(k);
    ASSERT_TRUE(got.has_value()) << k;
    EXPECT_EQ(*got, bytes_of(static_cast<std::uint8_t>(k), 3));
  }
  EXPECT_EQ(runs.load(), 5);
  EXPECT_FALSE(p.take(2).has_value()) << "taken once";
  EXPECT_FALSE(p.take(77).has_value()) << "never asked for";
  EXPECT_EQ(p.bytes_in_use(), 0u);
}

TEST(Prefetcher, AFailureIsRaisedByTheTakerAndAQueuedJobRunsOnTheTakingThread) {
  Prefetcher p(Prefetcher::Limits{.threads = 1});
  Gate gate;
  ASSERT_TRUE(p.fetch(0, 1, [&](const std::atomic<bool>& cancel) {
    gate.pass(cancel);
    return bytes_of(0, 1);
  }));
  ASSERT_TRUE(p.fetch(1, 1, [](const std::atomic<bool>&) -> std::vector<std::uint8_t> {
    throw std::runtime_error("HTTP 403 AccessDenied");
  }));
  std::thread::id ran_on;
  ASSERT_TRUE(p.fetch(2, 1, [&](const std::atomic<bool>&) {
    ran_on = std::this_thread::get_id();
    return bytes_of(2, 1);
  }));
  // The one thread waits at the gate: job 2 is still queued, and the taker runs it itself.
  EXPECT_EQ(p.take(2), bytes_of(2, 1));
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_THROW((void)p.take(1), std::runtime_error) << "job 1 ran here too, and failed";
  gate.open();
  EXPECT_EQ(p.take(0), bytes_of(0, 1)) << "a running job is waited for";
}

TEST(Prefetcher, ByteAndWarmBoundsHoldAndStaleBytesMakeRoom) {
  Prefetcher p(Prefetcher::Limits{.threads = 2, .max_bytes = 10, .max_warm = 1});
  Gate gate;
  EXPECT_TRUE(p.fetch(0, 6, [](const std::atomic<bool>&) { return bytes_of(0, 6); }));
  EXPECT_FALSE(p.fetch(1, 6, [](const std::atomic<bool>&) { return bytes_of(1, 6); }))
      << "12 bytes would pass the bound of 10";
  EXPECT_TRUE(p.fetch(2, 4, [](const std::atomic<bool>&) { return bytes_of(2, 4); }));
  EXPECT_EQ(p.bytes_in_use(), 10u);
  EXPECT_TRUE(p.warm(0, [&](const std::atomic<bool>& cancel) { gate.pass(cancel); }));
  EXPECT_FALSE(p.warm(1, [](const std::atomic<bool>&) {})) << "one warm job at a time";
  gate.open();
  while (p.jobs_pending() > 0) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(p.warm(1, [](const std::atomic<bool>&) {})) << "the first one ended";
  // Held bytes nobody takes (keys 0 and 2, hint 0) give way to new ones only once bytes of a
  // hint kStaleRounds later have been taken: hints alone, far ahead, do not push them out.
  for (std::uint64_t r = 0; r < 2 * Prefetcher::kStaleRounds; ++r) p.new_round();
  EXPECT_FALSE(p.fetch(3, 6, [](const std::atomic<bool>&) { return bytes_of(3, 6); }));
  EXPECT_EQ(p.bytes_in_use(), 10u);
  p.take(99);  // nothing: takes only what was asked for
  Prefetcher q(Prefetcher::Limits{.threads = 1, .max_bytes = 10});
  ASSERT_TRUE(q.fetch(0, 6, [](const std::atomic<bool>&) { return bytes_of(0, 6); }));
  while (q.jobs_pending() > 0) std::this_thread::sleep_for(1ms);  // held, done
  for (std::uint64_t r = 0; r < Prefetcher::kStaleRounds; ++r) {
    q.new_round();
    ASSERT_TRUE(q.fetch(10 + r, 1, [](const std::atomic<bool>&) { return bytes_of(1, 1); }));
    EXPECT_FALSE(q.fetch(100 + r, 4, [](const std::atomic<bool>&) { return bytes_of(1, 4); }))
        << "hint " << r + 1 << ": key 0 is not stale yet";
    EXPECT_EQ(q.take(10 + r), bytes_of(1, 1));
  }
  EXPECT_TRUE(q.fetch(200, 10, [](const std::atomic<bool>&) { return bytes_of(2, 10); }))
      << "bytes of a hint kStaleRounds after key 0's were taken: key 0 gave way";
  EXPECT_FALSE(q.take(0).has_value());
  EXPECT_EQ(q.take(200), bytes_of(2, 10));
}

TEST(Prefetcher, GoingCancelsTheJobsItRunsAndWaitsForThem) {
  std::atomic<int> started{0};
  std::atomic<int> cancelled{0};
  Gate never;
  {
    Prefetcher p(Prefetcher::Limits{.threads = 3});
    for (std::uint64_t k = 0; k < 6; ++k) {
      ASSERT_TRUE(p.fetch(k, 1, [&](const std::atomic<bool>& cancel) {
        ++started;
        if (!never.pass(cancel)) ++cancelled;
        return bytes_of(0, 1);
      }));
    }
    const auto limit = std::chrono::steady_clock::now() + 60s;
    while (started.load() < 3 && std::chrono::steady_clock::now() < limit) {
      std::this_thread::sleep_for(1ms);
    }
    ASSERT_EQ(started.load(), 3) << "three threads, three jobs running";
  }
  EXPECT_EQ(started.load(), 3) << "the queued jobs never ran";
  EXPECT_EQ(cancelled.load(), 3) << "the running ones saw the cancel and ended";
}

// Threads do not survive a fork: the child's slot makes a Prefetcher of its own and leaves the
// parent's (whose job is running on a thread the child does not have) untouched.
TEST(Prefetcher, AForkedChildGetsItsOwnAndLeavesTheParentsUntouched) {
  PrefetcherSlot slot;
  Prefetcher& mine = slot.get(Prefetcher::Limits{});
  EXPECT_EQ(slot.find(), &mine);
  Gate gate;
  std::atomic<bool> running{false};
  ASSERT_TRUE(mine.fetch(1, 1, [&](const std::atomic<bool>& cancel) {
    running = true;
    gate.pass(cancel);
    return bytes_of(1, 1);
  }));
  while (!running.load()) std::this_thread::sleep_for(1ms);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int code = 0;
    if (slot.find() != nullptr) code |= 1;  // the parent's is not this process's
    Prefetcher& own = slot.get(Prefetcher::Limits{});
    if (&own == &mine) code |= 2;
    if (!own.fetch(1, 1, [](const std::atomic<bool>&) { return bytes_of(7, 1); })) code |= 4;
    if (own.take(1) != bytes_of(7, 1)) code |= 8;
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "bits: 1 found the parent's, 2 got it, 4/8 own failed";
  gate.open();
  EXPECT_EQ(mine.take(1), bytes_of(1, 1));
  PrefetcherSlot copy = slot;
  EXPECT_EQ(copy.find(), nullptr) << "a copy starts without";
}

}  // namespace
}  // namespace ferry::net
