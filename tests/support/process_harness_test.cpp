// Tests of the fault-test harness itself: run_in_child's deadline, kill and capture, and the
// leak checks. No torch, no ferry: it must stay trustworthy when everything else is broken.

#include "support/process_harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/timing.h"

namespace ferry::testing {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// Polls `condition` every 5 ms until it holds or `within` (scaled to the machine's load) passes.
template <class F>
bool eventually(F&& condition, std::chrono::milliseconds within) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::milliseconds>(within * time_scale());
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// The first integer after `key` in `text`, or -1.
int int_after(const std::string& text, const std::string& key) {
  const std::size_t at = text.find(key);
  if (at == std::string::npos) return -1;
  return std::atoi(text.c_str() + at + key.size());
}

TEST(RunInChild, ReturnsTheExitCode) {
  const ChildResult r = run_in_child([] { return 3; }, 10s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.signal, 0);
  EXPECT_LT(r.seconds, 10.0);
}

TEST(RunInChild, CapturesStdoutAndStderr) {
  const ChildResult r = run_in_child(
      [] {
        std::printf("to stdout\n");
        std::fprintf(stderr, "to stderr\n");
        return 0;
      },
      10s);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("to stdout\n"));
  EXPECT_THAT(r.output, HasSubstr("to stderr\n"));
}

TEST(RunInChild, ReportsAnExceptionAsExitCode101) {
  const ChildResult r = run_in_child([]() -> int { throw std::runtime_error("boom"); }, 10s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 101);
  EXPECT_THAT(r.output, HasSubstr("boom"));
}

TEST(RunInChild, ReportsTheSignalOfAnAbort) {
  const ChildResult r = run_in_child([]() -> int { std::abort(); }, 10s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, -1);
  EXPECT_EQ(r.signal, SIGABRT);
}

TEST(RunInChild, KillsAChildThatHangsWithinTheDeadline) {
  const ChildResult r = run_in_child(
      [] {
        for (;;) ::pause();
        return 0;
      },
      300ms);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.exit_code, -1);
  EXPECT_NE(r.signal, 0);
  EXPECT_GE(r.seconds, 0.3);
  EXPECT_LT(r.seconds, 0.3 + 1.0 * time_scale());
}

TEST(RunInChild, SendsSigusr1BeforeKilling) {
  const ChildResult r = run_in_child(
      [] {
        // A handler that reports and goes on hanging, as a backtrace dumper would.
        struct sigaction sa {};
        sa.sa_handler = [](int) {
          static const char msg[] = "SIGUSR1: backtraces here\n";
          (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
        };
        ::sigaction(SIGUSR1, &sa, nullptr);
        for (;;) ::pause();
        return 0;
      },
      200ms);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_THAT(r.output, HasSubstr("SIGUSR1: backtraces here"));
  EXPECT_LT(r.seconds, 0.2 + 1.0 * time_scale());
}

TEST(RunInChild, CapturesAMegabyteWithoutDeadlock) {
  constexpr std::size_t kBytes = 1 << 20;
  const ChildResult r = run_in_child(
      [] {
        const std::string line(1023, 'x');
        for (std::size_t i = 0; i < kBytes / 1024; ++i) std::printf("%s\n", line.c_str());
        return 0;
      },
      20s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output.size(), kBytes);
  EXPECT_EQ(r.output.find_first_not_of("x\n"), std::string::npos);
}

TEST(RunInChild, KillsGrandchildrenOnTimeout) {
  const ChildResult r = run_in_child(
      [] {
        const pid_t grandchild = ::fork();
        if (grandchild == 0) {
          for (;;) ::pause();
        }
        std::printf("grandchild=%d\n", static_cast<int>(grandchild));
        std::fflush(stdout);
        for (;;) ::pause();
        return 0;
      },
      300ms);
  EXPECT_TRUE(r.timed_out);
  const int grandchild = int_after(r.output, "grandchild=");
  ASSERT_GT(grandchild, 0) << r.output;
  EXPECT_TRUE(eventually([&] { return !pid_alive(grandchild); }, 1s))
      << "grandchild " << grandchild << " survived the timeout kill";
}

TEST(RunInChild, ReturnsWhenTheChildExitsEvenIfAGrandchildHoldsThePipe) {
  const ChildResult r = run_in_child(
      [] {
        const pid_t grandchild = ::fork();
        if (grandchild == 0) {
          ::sleep(30);
          ::_exit(0);
        }
        std::printf("grandchild=%d\n", static_cast<int>(grandchild));
        return 0;
      },
      10s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_LT(r.seconds, 2.0 * time_scale());
  const int grandchild = int_after(r.output, "grandchild=");
  ASSERT_GT(grandchild, 0) << r.output;
  // Left alone on a normal exit (a test may check that workers die by themselves): clean up.
  EXPECT_TRUE(pid_alive(grandchild));
  ::kill(grandchild, SIGKILL);
}

TEST(RunInChild, LeavesNoZombieAndNoFd) {
  const ResourceSnapshot before = snapshot();
  (void)run_in_child([] { return 0; }, 10s);
  (void)run_in_child(
      [] {
        for (;;) ::pause();
        return 0;
      },
      100ms);
  EXPECT_EQ(wait_for_no_leaks(before, 1s), "");
}

TEST(Snapshot, IsStableAndLeavesOutItsOwnDirectoryFd) {
  const ResourceSnapshot a = snapshot();
  const ResourceSnapshot b = snapshot();
  EXPECT_EQ(leak_diff(a, b), "");
  EXPECT_EQ(a.fds, b.fds);
  EXPECT_GE(a.threads, 1);
  const std::string own_dir = "/proc/" + std::to_string(::getpid()) + "/fd";
  for (const std::string& fd : a.fds) EXPECT_THAT(fd, ::testing::Not(HasSubstr(own_dir)));
}

TEST(Snapshot, DetectsAnFdLeftOpen) {
  const ResourceSnapshot before = snapshot();
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const std::string diff = leak_diff(before, snapshot());
  EXPECT_THAT(diff, HasSubstr("fds:"));
  EXPECT_THAT(diff, HasSubstr(std::to_string(fd) + " -> /dev/null"));
  ::close(fd);
  EXPECT_EQ(wait_for_no_leaks(before, 1s), "");
}

TEST(Snapshot, DetectsAMemfdAndADevShmName) {
  const ResourceSnapshot before = snapshot();
  const int memfd = ::memfd_create("ferry-harness-test", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  const std::string name = "/ferry-harness-test-" + std::to_string(::getpid());
  const int shm = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_GE(shm, 0);
  ::close(shm);

  const ResourceSnapshot during = snapshot();
  EXPECT_EQ(during.memfds, before.memfds + 1);
  const std::string diff = leak_diff(before, during);
  EXPECT_THAT(diff, HasSubstr("memfds:"));
  EXPECT_THAT(diff, HasSubstr("/memfd:ferry-harness-test"));
  EXPECT_THAT(diff, HasSubstr("/dev/shm: new: " + name.substr(1)));

  ::close(memfd);
  ::shm_unlink(name.c_str());
  EXPECT_EQ(wait_for_no_leaks(before, 1s), "");
}

TEST(Snapshot, DetectsAChildNotReaped) {
  const ResourceSnapshot before = snapshot();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) ::_exit(0);

  // It exits at once and stays a zombie until reaped.
  ASSERT_TRUE(eventually([&] { return snapshot().zombies == before.zombies + 1; }, 2s));
  const std::string diff = leak_diff(before, snapshot());
  EXPECT_THAT(diff, HasSubstr("children:"));
  EXPECT_THAT(diff, HasSubstr(std::to_string(pid)));
  EXPECT_THAT(diff, HasSubstr("zombies:"));
  EXPECT_FALSE(pid_alive(pid));  // a zombie is not alive

  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_EQ(wait_for_no_leaks(before, 1s), "");
}

TEST(Snapshot, DetectsAThreadNotJoined) {
  // A thread started and joined first: a runtime that starts a helper thread of its own with the
  // process's first thread (ThreadSanitizer does) has it in both snapshots, not in the difference.
  std::thread([] {}).join();
  const ResourceSnapshot before = snapshot();
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::thread thread([&] {
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return done; });
  });
  EXPECT_THAT(leak_diff(before, snapshot()),
              HasSubstr("threads: " + std::to_string(before.threads) + " -> " +
                        std::to_string(before.threads + 1)));
  {
    std::lock_guard lock(mutex);
    done = true;
  }
  cv.notify_all();
  thread.join();
  EXPECT_EQ(wait_for_no_leaks(before, 1s), "");
}

TEST(Snapshot, WaitForNoLeaksReturnsTheDiffWhenStillLeaking) {
  const ResourceSnapshot before = snapshot();
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(wait_for_no_leaks(before, 50ms), HasSubstr("/dev/null"));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 50ms);
  ::close(fd);
}

TEST(Processes, ChildrenOfAndPidAlive) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    for (;;) ::pause();
  }
  EXPECT_THAT(children_of(::getpid()), ::testing::Contains(pid));
  EXPECT_TRUE(pid_alive(pid));
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_FALSE(pid_alive(pid));
  EXPECT_THAT(children_of(::getpid()), ::testing::Not(::testing::Contains(pid)));
  EXPECT_FALSE(pid_alive(-1));
}

}  // namespace
}  // namespace ferry::testing
