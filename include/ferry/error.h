#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ferry {

/// Base of every error ferry raises itself. Messages name what failed, the value seen, and
/// what to do about it.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An invalid option, option combination or configuration value. Raised before anything runs.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// Samples that cannot be collated into one batch (a field missing, shapes or dtypes differ).
class CollateError : public Error {
 public:
  using Error::Error;
};

/// A sample that cannot be loaded (a missing or corrupt file, a bad index).
class DataError : public Error {
 public:
  using Error::Error;
};

/// Shared memory for a batch cannot be reserved (a full /dev/shm or memory limit). Raised
/// before anything is written, never as a SIGBUS.
class SharedMemoryError : public Error {
 public:
  using Error::Error;
};

/// What the training loop learns about a failure inside a worker process.
struct WorkerFailure {
  std::size_t worker_id = 0;
  int pid = 0;
  std::uint64_t epoch = 0;
  std::int64_t batch = -1;            ///< the batch's position in the epoch; -1 if none
  std::int64_t index = -1;            ///< the dataset index that failed; -1 if not one sample
  std::string type_name;              ///< the C++ type of the original exception
  std::string message;                ///< the original what()
  std::vector<std::int64_t> indices;  ///< the indices of the batch(es) the worker held
  /// A worker that died: the last lines it wrote to stderr (at most 20, oldest first).
  std::vector<std::string> stderr_tail;
};

/// An exception raised inside a worker (by the dataset, collate, or worker_init_fn), raised
/// again in the training loop with its original message and type name. Iteration can go on
/// after an error of one batch, as in PyTorch.
class WorkerError : public Error {
 public:
  WorkerError(const std::string& what, WorkerFailure failure)
      : Error(what), failure_(std::move(failure)) {}
  const WorkerFailure& failure() const noexcept { return failure_; }

 private:
  WorkerFailure failure_;
};

/// A worker process died (a signal, or an exit the loader did not ask for). The epoch ends.
class WorkerDiedError : public WorkerError {
 public:
  WorkerDiedError(const std::string& what, WorkerFailure failure, int exit_code, int signal)
      : WorkerError(what, std::move(failure)), exit_code_(exit_code), signal_(signal) {}
  int exit_code() const noexcept { return exit_code_; }  ///< -1 if killed by a signal
  int signal() const noexcept { return signal_; }        ///< 0 if it exited

 private:
  int exit_code_;
  int signal_;
};

/// No batch arrived within `timeout`. The worker that held it has been killed; the epoch ends.
class TimeoutError : public Error {
 public:
  TimeoutError(const std::string& what, WorkerFailure failure)
      : Error(what), failure_(std::move(failure)) {}
  const WorkerFailure& failure() const noexcept { return failure_; }

 private:
  WorkerFailure failure_;
};

/// The DataLoader was destroyed (or closed) while an iterator of it was still in use.
class LoaderClosed : public Error {
 public:
  using Error::Error;
};

namespace detail {

template <class... Args>
std::string str(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

// "a, b, c" (for messages that list names).
std::string join(const std::vector<std::string>& items, std::string_view separator = ", ");
// Appends `text` as a JSON string literal: quoted, with quotes, backslashes and control
// characters escaped.
void append_quoted(std::string& out, std::string_view text);

[[noreturn]] void assert_fail(const char* condition,
                              const char* file,
                              int line,
                              const std::string& message);

}  // namespace detail
}  // namespace ferry

/// Checks user input; throws `ferry::ConfigError` with the concatenated message.
#define FERRY_CHECK(condition, ...)                                  \
  do {                                                               \
    if (!(condition)) {                                              \
      throw ::ferry::ConfigError(::ferry::detail::str(__VA_ARGS__)); \
    }                                                                \
  } while (false)

/// Checks one of ferry's own invariants; a failure is a bug in ferry.
#define FERRY_ASSERT(condition, ...)                                                     \
  do {                                                                                   \
    if (!(condition)) {                                                                  \
      ::ferry::detail::assert_fail(#condition, __FILE__, __LINE__,                       \
                                   ::ferry::detail::str("" __VA_OPT__(, ) __VA_ARGS__)); \
    }                                                                                    \
  } while (false)
