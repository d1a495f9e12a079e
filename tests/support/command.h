#pragma once

// Running a program as a user runs it, from the tests of the ferry command: its exit code (128 +
// the signal when a signal ended it), its stdout and its stderr.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

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

}  // namespace ferry::test
