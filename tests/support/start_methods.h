#pragma once

// Runs a test once per start method: the fixture sets the process's default start method, so
// every loader the test builds (in this process or in a forked test child) uses it.

#include <string>

#include <gtest/gtest.h>

#include "ferry/data_loader_options.h"

namespace ferry::testing {

class EachStartMethod : public ::testing::TestWithParam<StartMethod> {
 protected:
  void SetUp() override { set_default_start_method(GetParam()); }
  void TearDown() override { set_default_start_method(StartMethod::kFork); }
};

inline std::string start_method_name(const ::testing::TestParamInfo<StartMethod>& info) {
  return std::string(to_string(info.param));
}

inline auto all_start_methods() {
  return ::testing::Values(StartMethod::kFork, StartMethod::kSpawn, StartMethod::kForkserver);
}

}  // namespace ferry::testing

// Declares suite `Suite` as a fixture parameterised by start method and instantiates it.
#define FERRY_EACH_START_METHOD(Suite)                                            \
  class Suite : public ::ferry::testing::EachStartMethod {};                      \
  INSTANTIATE_TEST_SUITE_P(Methods, Suite, ::ferry::testing::all_start_methods(), \
                           ::ferry::testing::start_method_name)
