#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

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

namespace detail {

template <class... Args>
std::string str(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

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
