#pragma once

// Running a program as a user runs it, from the tests of the ferry command: its exit code (128 +
// the signal when a signal ended it), its stdout and its stderr.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace ferry::test {

struct CommandResult {
  int code = -1;
  std::string out;
  std::string err;
};

inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `command` with the shell, stdin closed (so not a terminal), output captured.
inline CommandResult run_command(const std::string& command) {
  namespace fs = std::filesystem;
  const std::string tag = std::to_string(::getpid());
  const fs::path out = fs::temp_directory_path() / ("ferry_command_out_" + tag);
  const fs::path err = fs::temp_directory_path() / ("ferry_command_err_" + tag);
  const int status = std::system(
      (command + " > '" + out.string() + "' 2> '" + err.string() + "' < /dev/null").c_str());
  CommandResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out);
  r.err = slurp(err);
  fs::remove(out);
  fs::remove(err);
  return r;
}

// Polls `ready` every 10 ms until it holds (true) or `limit` has passed (false): tests wait for
// an event, not for a clock, so a busy machine only makes them slower.
template <class Ready>
bool wait_until(Ready&& ready, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// `command` (a shell command line whose last word runs with exec, so signals reach it and not a
// shell) started in the background, stdin closed, its stdout and stderr in files that the test
// may read while it runs. Killed (SIGKILL) and reaped if still running when destroyed.
class BackgroundCommand {
 public:
  explicit BackgroundCommand(const std::string& command) {
    namespace fs = std::filesystem;
    static int n = 0;
    const std::string tag = std::to_string(::getpid()) + "_" + std::to_string(n++);
    out_ = fs::temp_directory_path() / ("ferry_background_out_" + tag);
    err_ = fs::temp_directory_path() / ("ferry_background_err_" + tag);
    const std::string line =
        "exec " + command + " > '" + out_.string() + "' 2> '" + err_.string() + "' < /dev/null";
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  BackgroundCommand(const BackgroundCommand&) = delete;
  BackgroundCommand& operator=(const BackgroundCommand&) = delete;
  ~BackgroundCommand() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
    std::filesystem::remove(out_);
    std::filesystem::remove(err_);
  }

  bool started() const { return pid_ > 0; }
  // What it has written to stderr so far.
  std::string err_so_far() const { return slurp(err_); }
  void signal(int sig) const {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  // Waits for it to end (a test's ctest TIMEOUT bounds this) and returns what it did.
  CommandResult wait() {
    CommandResult r;
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = slurp(out_);
    r.err = slurp(err_);
    return r;
  }

 private:
  pid_t pid_ = -1;
  std::filesystem::path out_;
  std::filesystem::path err_;
};

}  // namespace ferry::test
