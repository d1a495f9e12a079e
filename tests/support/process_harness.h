#pragma once

// Process harness for fault tests (RELIABILITY.md (b), (c)): run a test body in a forked child
// with a hard deadline, so a hang fails the test instead of stalling CI, and count the process's
// resources (fds, threads, children, memfds, /dev/shm names) before and after to find leaks.
//
// POSIX and the C++ standard library only (no torch, no ferry headers), so it also serves tests
// of the lowest layers. Linux-specific: reads /proc.

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <iostream>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace ferry::testing {

/// How a child run by `run_in_child` ended.
struct ChildResult {
  bool timed_out = false;
  int exit_code = -1;  // -1 if killed by a signal
  int signal = 0;      // the signal that ended it, 0 if it exited
  std::string output;  // the child's stdout and stderr, interleaved
  double seconds = 0;  // wall time until it ended
};

/// Counts of what the calling process holds, for leak checks (RELIABILITY.md c3).
struct ResourceSnapshot {
  std::vector<std::string> fds;      // "N -> readlink target" for each /proc/self/fd entry
  int threads = 0;                   // "Threads:" of /proc/self/status
  std::vector<int> children;         // pids whose ppid is us (scan /proc/*/stat)
  int zombies = 0;                   // of those, in state Z
  int memfds = 0;                    // fds whose target starts with "/memfd:"
  std::vector<std::string> dev_shm;  // /dev/shm names with "ferry" (not another test's)
};

namespace harness_internal {

/// Exit status of a child whose `fn` threw.
inline constexpr int kExceptionExitCode = 101;
/// Time between SIGUSR1 (backtraces) and SIGKILL on a timeout.
inline constexpr std::chrono::milliseconds kBacktraceGrace{200};

inline std::string read_small_file(const std::string& path) {
  std::string text;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return text;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return text;
}

/// The state letter and ppid of `/proc/<pid>/stat`, or false if it cannot be read (gone). The
/// command name is in parentheses and may itself contain spaces and ')', so parse from the last
/// ')'.
inline bool read_stat(int pid, char* state, int* ppid) {
  const std::string stat = read_small_file("/proc/" + std::to_string(pid) + "/stat");
  const std::size_t close_paren = stat.rfind(')');
  if (close_paren == std::string::npos || close_paren + 4 >= stat.size()) return false;
  char s = 0;
  int pp = 0;
  if (std::sscanf(stat.c_str() + close_paren + 1, " %c %d", &s, &pp) != 2) return false;
  *state = s;
  *ppid = pp;
  return true;
}

/// Numeric entries of a directory, e.g. the pids of /proc.
inline std::vector<int> numeric_entries(const char* path) {
  std::vector<int> out;
  DIR* dir = ::opendir(path);
  if (dir == nullptr) return out;
  while (const dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long value = std::strtol(entry->d_name, &end, 10);
    if (end != entry->d_name && *end == '\0') out.push_back(static_cast<int>(value));
  }
  ::closedir(dir);
  std::sort(out.begin(), out.end());
  return out;
}

/// Appends what is readable now from non-blocking `fd`; returns false at EOF or on an error.
inline bool drain(int fd, std::string& out) {
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;  // 0: EOF
  }
}

/// A pidfd for `pid` (readable once it has exited), or -1 where the kernel lacks pidfd_open
/// (before Linux 5.3). The fd is close-on-exec.
inline int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

/// Reads `fd` into `out` until `pid` has exited (and is reaped into `status`) or `until` passes.
/// Returns true if the child was reaped. EOF on the pipe cannot tell that the child is done (a
/// grandchild may hold the pipe open, or the child may close its stdout and go on), so this waits
/// on the child's pidfd as well, or, without one, polls in 10 ms slices.
inline bool pump_until(int fd,
                       bool& pipe_open,
                       std::string& out,
                       pid_t pid,
                       int pidfd,
                       int& status,
                       std::chrono::steady_clock::time_point until) {
  using namespace std::chrono;
  constexpr milliseconds kSlice{10};
  for (;;) {
    pid_t r;
    do {
      r = ::waitpid(pid, &status, WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r == pid || (r < 0 && errno == ECHILD)) {
      // Whatever the child wrote before exiting is already in the pipe.
      if (pipe_open) pipe_open = drain(fd, out);
      return true;
    }
    const auto now = steady_clock::now();
    if (now >= until) return false;
    // Round up, so that a wait never ends just short of `until` and spins.
    milliseconds left = duration_cast<milliseconds>(until - now) + milliseconds(1);
    if (pidfd < 0) left = std::min(left, kSlice);
    const int wait_ms =
        static_cast<int>(std::min<milliseconds>(left, milliseconds(1 << 30)).count());
    pollfd p[2] = {{pipe_open ? fd : -1, POLLIN, 0}, {pidfd, POLLIN, 0}};
    const int n = ::poll(p, 2, wait_ms);
    if (n > 0 && p[0].revents != 0) pipe_open = drain(fd, out);
  }
}

/// Runs in the forked child: never returns.
[[noreturn]] inline void child_main(const std::function<int()>& fn, int write_fd) {
  // Async-signal-safe steps first: own process group (so a timeout kill takes our children
  // too), output to the pipe, default signal state.
  ::setpgid(0, 0);
  ::dup2(write_fd, STDOUT_FILENO);
  ::dup2(write_fd, STDERR_FILENO);
  if (write_fd != STDOUT_FILENO && write_fd != STDERR_FILENO) ::close(write_fd);
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::signal(SIGUSR1, SIG_DFL);
  ::signal(SIGPIPE, SIG_DFL);
  // Fault tests crash on purpose (abort, SIGSEGV); they should not litter CI with core files.
  const rlimit no_core{0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);

  int code = kExceptionExitCode;
  try {
    code = fn();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "run_in_child: uncaught exception: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "run_in_child: uncaught exception of unknown type\n");
  }
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  // _exit: no atexit handlers or static destructors of the parent's copy (gtest, torch).
  ::_exit(code);
}

}  // namespace harness_internal

/// Forks; the child runs fn() and _exit()s with its return value (an exception: prints what()
/// and exits 101). The parent captures the child's stdout+stderr through a pipe, waits up to
/// `deadline`; on timeout it sends SIGUSR1 to the child first (so a handler can print
/// backtraces), waits 200 ms, then SIGKILLs the child's whole process group (the child calls
/// setpgid(0,0) first thing, so its own children die too) and reaps it. Always reaps; never
/// leaves a zombie. The child runs without core dumps (RLIMIT_CORE 0). When the child ends by
/// itself, its process group is left alone, so a test can check that its workers went away on their
/// own. Throws `std::system_error` if pipe() or fork() fails.
inline ChildResult run_in_child(const std::function<int()>& fn,
                                std::chrono::milliseconds deadline) {
  using namespace std::chrono;
  namespace hi = harness_internal;

  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw std::system_error(errno, std::generic_category(), "run_in_child: pipe2");
  }
  // Buffered output would otherwise be written twice, once by each process.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);

  const auto start = steady_clock::now();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    throw std::system_error(err, std::generic_category(), "run_in_child: fork");
  }
  if (pid == 0) {
    ::close(fds[0]);
    hi::child_main(fn, fds[1]);
  }
  // Also from the parent, so the group exists before any kill below, whoever runs first.
  ::setpgid(pid, pid);
  ::close(fds[1]);
  const int read_fd = fds[0];
  ::fcntl(read_fd, F_SETFL, ::fcntl(read_fd, F_GETFL) | O_NONBLOCK);

  // Opened before the child can be reaped, so the pid cannot have been reused.
  const int pidfd = hi::open_pidfd(pid);

  ChildResult result;
  bool pipe_open = true;
  int status = 0;
  bool reaped =
      hi::pump_until(read_fd, pipe_open, result.output, pid, pidfd, status, start + deadline);
  if (!reaped) {
    result.timed_out = true;
    ::kill(pid, SIGUSR1);
    reaped = hi::pump_until(read_fd, pipe_open, result.output, pid, pidfd, status,
                            steady_clock::now() + hi::kBacktraceGrace);
  }
  if (result.timed_out) {
    // The whole group, even if the child already went: its children may still run.
    ::killpg(pid, SIGKILL);
    ::kill(pid, SIGKILL);  // in case setpgid failed
  }
  if (!reaped) {
    pid_t r;
    do {
      r = ::waitpid(pid, &status, 0);
    } while (r < 0 && errno == EINTR);
    if (pipe_open) pipe_open = hi::drain(read_fd, result.output);
  }
  result.seconds = duration<double>(steady_clock::now() - start).count();
  ::close(read_fd);
  if (pidfd >= 0) ::close(pidfd);

  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
    result.signal = 0;
  } else if (WIFSIGNALED(status)) {
    result.exit_code = -1;
    result.signal = WTERMSIG(status);
  }
  return result;
}

/// Pids whose parent is `pid`, ascending.
inline std::vector<int> children_of(int pid) {
  std::vector<int> out;
  for (const int candidate : harness_internal::numeric_entries("/proc")) {
    char state = 0;
    int ppid = 0;
    if (harness_internal::read_stat(candidate, &state, &ppid) && ppid == pid) {
      out.push_back(candidate);
    }
  }
  return out;
}

/// True if `pid` exists and is not a zombie (or dead).
inline bool pid_alive(int pid) {
  if (pid <= 0) return false;
  char state = 0;
  int ppid = 0;
  if (!harness_internal::read_stat(pid, &state, &ppid)) return false;
  return state != 'Z' && state != 'X' && state != 'x';
}

/// What the calling process holds now.
inline ResourceSnapshot snapshot() {
  ResourceSnapshot snap;

  // File descriptors. The directory stream has an fd of its own while we scan; leave it out.
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    const int own_fd = ::dirfd(dir);
    std::vector<std::pair<int, std::string>> entries;
    while (const dirent* entry = ::readdir(dir)) {
      char* end = nullptr;
      const long fd = std::strtol(entry->d_name, &end, 10);
      if (end == entry->d_name || *end != '\0' || fd == own_fd) continue;
      char target[4096];
      const std::string link = std::string("/proc/self/fd/") + entry->d_name;
      const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
      entries.emplace_back(static_cast<int>(fd),
                           n >= 0 ? std::string(target, static_cast<std::size_t>(n)) : "?");
    }
    ::closedir(dir);
    std::sort(entries.begin(), entries.end());
    for (const auto& [fd, target] : entries) {
      snap.fds.push_back(std::to_string(fd) + " -> " + target);
      if (target.rfind("/memfd:", 0) == 0) ++snap.memfds;
    }
  }

  const std::string status = harness_internal::read_small_file("/proc/self/status");
  if (const std::size_t at = status.find("\nThreads:"); at != std::string::npos) {
    snap.threads = std::atoi(status.c_str() + at + 9);
  }

  const int self = static_cast<int>(::getpid());
  for (const int pid : harness_internal::numeric_entries("/proc")) {
    char state = 0;
    int ppid = 0;
    if (harness_internal::read_stat(pid, &state, &ppid) && ppid == self) {
      snap.children.push_back(pid);
      if (state == 'Z') ++snap.zombies;
    }
  }

  // A name carries the pid of the process that made it (ferry's shm_open fallback writes
  // /ferry-PID-N-..., the harness's own test ferry-harness-test-PID): one made by a live process
  // outside this process's tree belongs to a test running beside this one, not to this process.
  auto made_elsewhere = [self](std::string_view name) {
    const std::size_t digit = name.find_first_of("0123456789");
    if (digit == std::string_view::npos) return false;
    const int maker = std::atoi(std::string(name.substr(digit)).c_str());
    if (maker <= 1 || maker == self || !pid_alive(maker)) return false;
    int pid = maker;
    for (int hops = 0; hops < 64 && pid > 1; ++hops) {
      char state = 0;
      int ppid = 0;
      if (!harness_internal::read_stat(pid, &state, &ppid)) return false;
      if (ppid == self) return false;
      pid = ppid;
    }
    return true;
  };
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (const dirent* entry = ::readdir(dir)) {
      const std::string_view name(entry->d_name);
      if (name.find("ferry") != std::string_view::npos && !made_elsewhere(name)) {
        snap.dev_shm.emplace_back(entry->d_name);
      }
    }
    ::closedir(dir);
    std::sort(snap.dev_shm.begin(), snap.dev_shm.end());
  }
  return snap;
}

/// Human-readable difference, "" when the counts match (fd count, threads, children, zombies,
/// memfds, dev_shm names); names the leaked (and vanished) fd targets when the fd counts differ.
inline std::string leak_diff(const ResourceSnapshot& before, const ResourceSnapshot& after) {
  std::string out;
  auto join = [](const auto& items) {
    std::string s;
    for (const auto& item : items) {
      if (!s.empty()) s += ", ";
      if constexpr (std::is_same_v<std::decay_t<decltype(item)>, int>) {
        s += std::to_string(item);
      } else {
        s += item;
      }
    }
    return s.empty() ? std::string("none") : s;
  };
  auto minus = [](const auto& a, const auto& b) {
    using T = typename std::decay_t<decltype(a)>::value_type;
    const std::set<T> in_b(b.begin(), b.end());
    std::vector<T> only_a;
    for (const auto& x : a) {
      if (!in_b.count(x)) only_a.push_back(x);
    }
    return only_a;
  };
  auto line = [&out](const std::string& text) { out += text + "\n"; };

  if (before.fds.size() != after.fds.size()) {
    line("fds: " + std::to_string(before.fds.size()) + " -> " + std::to_string(after.fds.size()) +
         " (opened: " + join(minus(after.fds, before.fds)) +
         "; closed: " + join(minus(before.fds, after.fds)) + ")");
  }
  if (before.threads != after.threads) {
    line("threads: " + std::to_string(before.threads) + " -> " + std::to_string(after.threads));
  }
  if (before.children.size() != after.children.size()) {
    line("children: " + std::to_string(before.children.size()) + " -> " +
         std::to_string(after.children.size()) +
         " (new: " + join(minus(after.children, before.children)) +
         "; gone: " + join(minus(before.children, after.children)) + ")");
  }
  if (before.zombies != after.zombies) {
    line("zombies: " + std::to_string(before.zombies) + " -> " + std::to_string(after.zombies));
  }
  if (before.memfds != after.memfds) {
    line("memfds: " + std::to_string(before.memfds) + " -> " + std::to_string(after.memfds));
  }
  if (before.dev_shm != after.dev_shm) {
    line("/dev/shm: new: " + join(minus(after.dev_shm, before.dev_shm)) +
         "; gone: " + join(minus(before.dev_shm, after.dev_shm)));
  }
  return out;
}

/// Polls until leak_diff(before, snapshot()) is empty or `within` passes; returns the last diff.
inline std::string wait_for_no_leaks(const ResourceSnapshot& before,
                                     std::chrono::milliseconds within) {
  const auto until = std::chrono::steady_clock::now() + within;
  for (;;) {
    std::string diff = leak_diff(before, snapshot());
    if (diff.empty() || std::chrono::steady_clock::now() >= until) return diff;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace ferry::testing
