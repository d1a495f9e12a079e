#pragma once

// Tests whose body runs in a forked child (tests/support/process_harness.h): REQUIRE checks
// there, and in_child() to run a body and expect a clean exit.

#include <chrono>
#include <cstdio>
#include <functional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/error.h"

#include "support/process_harness.h"

// In a child's body: on failure, print where and why, and return 1 (the child's exit code).
#define REQUIRE(cond, ...)                                                                       \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      std::fprintf(stderr, "REQUIRE(%s) failed at line %d: ", #cond, __LINE__);                  \
      std::fprintf(stderr, "%s\n", ::ferry::detail::str("" __VA_OPT__(, ) __VA_ARGS__).c_str()); \
      return 1;                                                                                  \
    }                                                                                            \
  } while (false)

namespace ferry::testing {

// Runs `body` in a child with a generous deadline and expects it to exit 0. Unless the test
// leaves workers stuck on purpose, every worker must also have stopped when asked (exit 0).
inline void in_child(const std::function<int()>& body,
                     std::chrono::milliseconds deadline = std::chrono::seconds(60),
                     bool workers_may_be_killed = false) {
  const auto r = run_in_child(body, deadline);
  EXPECT_FALSE(r.timed_out) << "hung; output:\n" << r.output;
  EXPECT_EQ(r.signal, 0) << "killed by signal " << r.signal << "; output:\n" << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (!workers_may_be_killed) {
    EXPECT_THAT(r.output, ::testing::Not(::testing::HasSubstr("did not stop when asked")));
  }
}

}  // namespace ferry::testing
