#pragma once

// Servers on 127.0.0.1 for the tests of remote shards (issue 29), each a child process that the
// test owns: an S3 object store (object_store/s3_server.js, s3rver; access key and secret
// "S3RVER"), nginx serving a folder (http_server.py) and a proxy that injects faults
// (fault_proxy.py; its plan format is at the top of that file).
//
// A server prints "listening 127.0.0.1 PORT" when it accepts connections and stops when its stdin
// reaches end of file. Its stdin is a pipe whose only write end this process holds, so however
// the test ends, SIGKILL included, the kernel closes that end and the server stops: no server
// outlives its test. Each listens on 127.0.0.1 only, on a port the OS picked.
//
// POSIX and the C++ standard library only, like process_harness.h. CMake defines
// FERRY_TEST_SUPPORT_DIR (this folder) and FERRY_OBJECT_STORE_DIR (BUILD_DIR/object_store, where
// object_store/install.sh puts node_modules).

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "support/timing.h"

#if !defined(FERRY_TEST_SUPPORT_DIR) || !defined(FERRY_OBJECT_STORE_DIR)
#error "servers.h needs FERRY_TEST_SUPPORT_DIR and FERRY_OBJECT_STORE_DIR (tests/CMakeLists.txt)"
#endif

extern char** environ;

namespace ferry::test {

/// Thrown when a server cannot run on this machine (its program is missing, or it exited with
/// 77, the skip code): the test should GTEST_SKIP() with what().
class ServerUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// How to start a `ServerProcess`.
struct ServerOptions {
  std::vector<std::pair<std::string, std::string>> env{};  // set or replaced in its environment
  double start_seconds = 30;  // for the "listening" line on an idle machine; times time_scale()
};

namespace server_internal {

inline std::string shell_quoted(const std::vector<std::string>& argv) {
  std::string line;
  for (const std::string& arg : argv) {
    if (!line.empty()) line += ' ';
    line += '\'';
    for (char c : arg) line += c == '\'' ? std::string("'\\''") : std::string(1, c);
    line += '\'';
  }
  return line;
}

// The executable that execvp would run for `program`, looked up before fork: after fork in a
// threaded test only async-signal-safe calls are allowed, and execve is one.
inline std::optional<std::string> find_program(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    return ::access(program.c_str(), X_OK) == 0 ? std::optional(program) : std::nullopt;
  }
  const char* path = std::getenv("PATH");
  const std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    const std::size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string dir = end > start ? dirs.substr(start, end - start) : ".";
    const std::string candidate = dir + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return std::nullopt;
}

// The environment of this process with `overrides` set.
inline std::vector<std::string> environment_with(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    bool replaced = false;
    for (const auto& [name, value] : overrides) {
      replaced = replaced || text.rfind(name + "=", 0) == 0;
    }
    if (!replaced) env.push_back(text);
  }
  for (const auto& [name, value] : overrides) env.push_back(name + "=" + value);
  return env;
}

inline std::vector<char*> pointers_to(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// The last `limit` bytes of the file at `path` ("" if it cannot be read).
inline std::string tail_of(const std::string& path, std::size_t limit = 4096) {
  std::string text;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return text;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > 2 * limit) text.erase(0, text.size() - limit);
  }
  ::close(fd);
  if (text.size() > limit) text.erase(0, text.size() - limit);
  return text;
}

inline void close_fd(int& fd) noexcept {
  if (fd >= 0) ::close(fd);  // never retried on EINTR: the fd is released either way on Linux
  fd = -1;
}

// Waits for `pid` to end, up to `limit`; returns its wait status, or -1 if it is still running.
inline int wait_for(pid_t pid, std::chrono::duration<double> limit) noexcept {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return 0;  // not our child any more: nothing to reap
    if (std::chrono::steady_clock::now() >= until) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

inline std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "ended (wait status " + std::to_string(status) + ")";
}

}  // namespace server_internal

/// A server started as a child process: stdin a pipe that only this object writes to, stdout
/// read until its "listening HOST PORT" line, stderr in a log file in a temp folder of its own.
/// The constructor returns once the server listens; it throws `ServerUnavailable` if the program
/// is missing or exits with 77, and std::runtime_error (the command and its log's tail) if it
/// exits or stays silent past the deadline. The destructor closes stdin, sends SIGTERM, waits up
/// to 5 s, then SIGKILLs, always reaps, and removes the temp folder. Move-only; not thread-safe.
class ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> argv, ServerOptions options = {})
      : command_(server_internal::shell_quoted(argv)) {
    namespace si = server_internal;
    if (argv.empty()) throw std::invalid_argument("ServerProcess: empty argv");
    const std::optional<std::string> program = si::find_program(argv[0]);
    if (!program) {
      throw ServerUnavailable(argv[0] + " not found on PATH, needed for: " + command_);
    }
    std::string folder_template =
        (std::filesystem::temp_directory_path() / "ferry-server-XXXXXX").string();
    if (::mkdtemp(folder_template.data()) == nullptr) {
      throw std::system_error(errno, std::generic_category(), "mkdtemp(" + folder_template + ")");
    }
    folder_ = folder_template;
    log_path_ = folder_ + "/stderr.log";
    try {
      start(*program, argv, options);
      wait_for_listening(options);
    } catch (...) {
      stop();
      throw;
    }
  }

  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ServerProcess(ServerProcess&& other) noexcept { take(other); }
  ServerProcess& operator=(ServerProcess&& other) noexcept {
    if (this != &other) {
      stop();
      take(other);
    }
    return *this;
  }
  ~ServerProcess() { stop(); }

  int port() const noexcept { return port_; }
  const std::string& host() const noexcept { return host_; }
  /// "http://127.0.0.1:PORT", no trailing slash.
  std::string url() const { return "http://" + host_ + ":" + std::to_string(port_); }
  pid_t pid() const noexcept { return pid_; }
  const std::string& command() const noexcept { return command_; }
  /// What the server wrote to stderr so far (its last 4 KiB).
  std::string log_tail() const { return server_internal::tail_of(log_path_); }

 private:
  void start(const std::string& program,
             std::vector<std::string> argv,
             const ServerOptions& options) {
    namespace si = server_internal;
    std::vector<std::string> env = si::environment_with(options.env);
    std::vector<char*> argv_pointers = si::pointers_to(argv);
    std::vector<char*> env_pointers = si::pointers_to(env);

    // Every fd here is O_CLOEXEC: the child gets only the copies dup2 makes onto 0, 1 and 2, and
    // no other child (another server started meanwhile) keeps a server's stdin open.
    int in[2] = {-1, -1};
    int out[2] = {-1, -1};
    if (::pipe2(in, O_CLOEXEC) != 0) {
      throw std::system_error(errno, std::generic_category(), "pipe2 for the stdin of " + command_);
    }
    stdin_ = in[1];
    if (::pipe2(out, O_CLOEXEC) != 0) {
      const int error = errno;
      si::close_fd(in[0]);
      throw std::system_error(error, std::generic_category(),
                              "pipe2 for the stdout of " + command_);
    }
    stdout_ = out[0];
    int log_fd = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      const int error = errno;
      si::close_fd(in[0]);
      si::close_fd(out[1]);
      throw std::system_error(error, std::generic_category(), "open(" + log_path_ + ")");
    }

    pid_ = ::fork();
    if (pid_ == 0) {
      // Async-signal-safe calls only. Signals the test blocked or ignored would stay so across
      // exec, and a server that ignores SIGTERM would cost every teardown 5 s.
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::dup2(log_fd, 2);
      sigset_t none;
      ::sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::signal(SIGTERM, SIG_DFL);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGPIPE, SIG_DFL);
#ifdef SYS_close_range
      ::syscall(SYS_close_range, 3U, ~0U, 0U);  // fds the test opened without O_CLOEXEC
#endif
      ::execve(program.c_str(), argv_pointers.data(), env_pointers.data());
      const char message[] = "ServerProcess: execve failed\n";
      (void)!::write(2, message, sizeof message - 1);
      ::_exit(127);
    }
    const int fork_error = errno;
    si::close_fd(in[0]);
    si::close_fd(out[1]);
    si::close_fd(log_fd);
    if (pid_ < 0) {
      pid_ = -1;
      throw std::system_error(fork_error, std::generic_category(), "fork for " + command_);
    }
  }

  void wait_for_listening(const ServerOptions& options) {
    namespace si = server_internal;
    const double seconds = options.start_seconds * ferry::testing::time_scale();
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    std::string text;
    for (;;) {
      const std::size_t newline = text.find('\n');
      if (newline != std::string::npos) {
        const std::string line = text.substr(0, newline);
        text.erase(0, newline + 1);
        char host[64] = {};
        int port = 0;
        if (std::sscanf(line.c_str(), "listening %63s %d", host, &port) == 2 && port > 0) {
          host_ = host;
          port_ = port;
          return;
        }
        continue;  // anything else on stdout is not ours to judge
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        throw std::runtime_error(command_ + " printed no \"listening HOST PORT\" line within " +
                                 std::to_string(static_cast<int>(seconds)) + " s; its stderr (" +
                                 log_path_ + ") ends:\n" + log_tail());
      }
      pollfd p{stdout_, POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
      if (ready < 0 && errno != EINTR) {
        throw std::system_error(errno, std::generic_category(),
                                "poll on the stdout of " + command_);
      }
      if (ready <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(stdout_, buf, sizeof buf);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n > 0) {
        text.append(buf, static_cast<std::size_t>(n));
        continue;
      }
      // End of stdout: the server exited (or closed stdout) before it listened.
      int status = si::wait_for(pid_, std::chrono::seconds(5));
      if (status == -1) {
        throw std::runtime_error(command_ +
                                 " closed its stdout without a \"listening\" line; its "
                                 "stderr (" +
                                 log_path_ + ") ends:\n" + log_tail());
      }
      pid_ = -1;
      const std::string what = command_ + " " + si::describe_status(status) +
                               " before it listened; its stderr ends:\n" + log_tail();
      if (WIFEXITED(status) && WEXITSTATUS(status) == 77) throw ServerUnavailable(what);
      throw std::runtime_error(what);
    }
  }

  void stop() noexcept {
    namespace si = server_internal;
    si::close_fd(stdin_);  // end of file: the server's signal to stop
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      if (si::wait_for(pid_, std::chrono::seconds(5)) == -1) {
        ::kill(pid_, SIGKILL);
        int status = 0;
        while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
      }
      pid_ = -1;
    }
    si::close_fd(stdout_);
    if (!log_path_.empty()) ::unlink(log_path_.c_str());
    if (!folder_.empty()) ::rmdir(folder_.c_str());
    log_path_.clear();
    folder_.clear();
  }

  void take(ServerProcess& other) noexcept {
    command_ = std::move(other.command_);
    folder_ = std::exchange(other.folder_, std::string());
    log_path_ = std::exchange(other.log_path_, std::string());
    host_ = std::move(other.host_);
    port_ = std::exchange(other.port_, 0);
    pid_ = std::exchange(other.pid_, -1);
    stdin_ = std::exchange(other.stdin_, -1);
    stdout_ = std::exchange(other.stdout_, -1);
  }

  std::string command_;
  std::string folder_;
  std::string log_path_;
  std::string host_;
  int port_ = 0;
  pid_t pid_ = -1;
  int stdin_ = -1;   // write end; closing it stops the server
  int stdout_ = -1;  // read end, held open so the server's later writes never fail
};

/// std::nullopt if the object store's node packages are installed in FERRY_OBJECT_STORE_DIR (it
/// runs object_store/install.sh, which installs them once with npm ci), else why not: node or npm
/// missing or too old, or npm ci failed; the test should GTEST_SKIP() with it. Throws if
/// install.sh fails otherwise.
inline std::optional<std::string> object_store_unavailable(
    const std::filesystem::path& build_dir =
        std::filesystem::path(FERRY_OBJECT_STORE_DIR).parent_path()) {
  namespace si = server_internal;
  const std::string script = std::string(FERRY_TEST_SUPPORT_DIR) + "/object_store/install.sh";
  std::vector<std::string> argv = {"/bin/sh", script, build_dir.string()};
  std::vector<char*> argv_pointers = si::pointers_to(argv);
  std::string folder = (std::filesystem::temp_directory_path() / "ferry-install-XXXXXX").string();
  if (::mkdtemp(folder.data()) == nullptr) {
    throw std::system_error(errno, std::generic_category(), "mkdtemp(" + folder + ")");
  }
  const std::string log_path = folder + "/stderr.log";
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  const pid_t pid = log_fd >= 0 && null >= 0 ? ::fork() : -1;
  const int error = errno;
  if (pid == 0) {
    ::dup2(null, 0);
    ::dup2(null, 1);
    ::dup2(log_fd, 2);
    ::execve(argv[0].c_str(), argv_pointers.data(), environ);
    ::_exit(127);
  }
  if (log_fd >= 0) ::close(log_fd);
  if (null >= 0) ::close(null);
  int status = 0;
  if (pid > 0) {
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  std::string output = si::tail_of(log_path);
  ::unlink(log_path.c_str());
  ::rmdir(folder.c_str());
  if (pid < 0) throw std::system_error(error, std::generic_category(), "running " + script);
  while (!output.empty() && (output.back() == '\n' || output.back() == '\r')) output.pop_back();
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return std::nullopt;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) return output;
  throw std::runtime_error(si::shell_quoted(argv) + " " + si::describe_status(status) + ":\n" +
                           output);
}

/// An S3 object store (s3rver) on 127.0.0.1 storing in `dir`, with `buckets` created. Path-style
/// URLs: url() + "/BUCKET/KEY"; SigV4 with access key "S3RVER", secret "S3RVER", any region.
/// Call object_store_unavailable() first: without the node packages it throws.
inline ServerProcess start_s3(const std::filesystem::path& dir,
                              const std::vector<std::string>& buckets = {}) {
  std::vector<std::string> argv = {
      "node", std::string(FERRY_TEST_SUPPORT_DIR) + "/object_store/s3_server.js", "--dir",
      dir.string()};
  for (const std::string& bucket : buckets) {
    argv.push_back("--bucket");
    argv.push_back(bucket);
  }
  // require() looks beside the script, not in the build folder, unless NODE_PATH says where.
  return ServerProcess(
      std::move(argv),
      {.env = {{"NODE_PATH", std::string(FERRY_OBJECT_STORE_DIR) + "/node_modules"}}});
}

/// nginx serving the files under `dir` at url() + "/RELATIVE/PATH", with ranges, ETag and
/// keep-alive. Throws ServerUnavailable without python3 or nginx.
inline ServerProcess start_http(const std::filesystem::path& dir) {
  return ServerProcess(
      {"python3", std::string(FERRY_TEST_SUPPORT_DIR) + "/http_server.py", "--dir", dir.string()});
}

/// A proxy to 127.0.0.1:`upstream_port` that applies the faults in the JSON file `plan` (read at
/// every request; see fault_proxy.py) and appends one JSON line per request to `log`.
inline ServerProcess start_fault_proxy(int upstream_port,
                                       const std::filesystem::path& plan,
                                       const std::filesystem::path& log) {
  return ServerProcess({"python3", std::string(FERRY_TEST_SUPPORT_DIR) + "/fault_proxy.py",
                        "--upstream", "127.0.0.1:" + std::to_string(upstream_port), "--plan",
                        plan.string(), "--log", log.string()});
}

}  // namespace ferry::test
