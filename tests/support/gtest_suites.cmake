# Run after a GoogleTest binary is built (cmake -P): lists its tests and writes CTEST_FILE, which
# ctest includes. Each suite becomes one ctest entry that runs the whole suite in one process
# (named after the suite, `--gtest_filter=SUITE.*`), except the suites named in ISOLATED, whose
# tests each get a process of their own (named SUITE.TEST), as gtest_discover_tests would make.
#
# Variables: TEST_EXECUTABLE, CTEST_FILE, LABELS and ISOLATED (lists separated by '|', which
# survive a command line), FIXTURES (required fixtures, or empty), TEST_TIMEOUT (seconds a test),
# PREFIX (starts every entry's name), ENVIRONMENT (VAR=value for every entry, or empty). An entry
# that exits 77 is skipped (a variant whose device this machine lacks).
cmake_minimum_required(VERSION 3.21)
string(REPLACE "|" ";" LABELS "${LABELS}")
string(REPLACE "|" ";" ISOLATED "${ISOLATED}")

execute_process(COMMAND "${TEST_EXECUTABLE}" --gtest_list_tests
                OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE result TIMEOUT 120)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${TEST_EXECUTABLE} --gtest_list_tests failed (${result}):\n${errors}")
endif()

# Lines "Suite." (a parameterised one "Prefix/Suite.", maybe "  # TypeParam = ...") start a suite;
# lines "  Test" (maybe "  # GetParam() = ...") name its tests.
string(REPLACE "\n" ";" lines "${listing}")
set(suites)
set(current)
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ #][^ ]*)\\.( .*)?$")
    set(current "${CMAKE_MATCH_1}")
    list(APPEND suites "${current}")
    set(tests_of_${current})
  elseif(current AND line MATCHES "^  ([^ ]+)")
    list(APPEND tests_of_${current} "${CMAKE_MATCH_1}")
  endif()
endforeach()

string(REPLACE ";" "\\;" labels_escaped "${LABELS}")
set(properties "LABELS [==[${labels_escaped}]==] SKIP_RETURN_CODE 77")
if(ENVIRONMENT)
  string(APPEND properties " ENVIRONMENT [==[${ENVIRONMENT}]==]")
endif()
if(FIXTURES)
  string(APPEND properties " FIXTURES_REQUIRED [==[${FIXTURES}]==]")
endif()

set(out "# Written by tests/support/gtest_suites.cmake from ${TEST_EXECUTABLE}\n")
foreach(suite IN LISTS suites)
  list(LENGTH tests_of_${suite} count)
  if(count EQUAL 0)
    continue()
  endif()
  if(suite IN_LIST ISOLATED)
    foreach(test IN LISTS tests_of_${suite})
      set(name "${PREFIX}${suite}.${test}")
      string(APPEND out
             "add_test([==[${name}]==] [==[${TEST_EXECUTABLE}]==] [==[--gtest_filter=${suite}.${test}]==])\n"
             "set_tests_properties([==[${name}]==] PROPERTIES ${properties} "
             "TIMEOUT ${TEST_TIMEOUT} SKIP_REGULAR_EXPRESSION [==[\\[  SKIPPED \\]]==])\n")
    endforeach()
  else()
    # One process for the suite: its time bound is every test's, up to half an hour. (No skip
    # pattern: gtest's summary cannot tell "all skipped" from "none passed" to a regex, and a
    # failure must never read as a skip.)
    math(EXPR timeout "${TEST_TIMEOUT} * ${count}")
    if(timeout GREATER 1800)
      set(timeout 1800)
    endif()
    string(APPEND out
           "add_test([==[${PREFIX}${suite}]==] [==[${TEST_EXECUTABLE}]==] [==[--gtest_filter=${suite}.*]==])\n"
           "set_tests_properties([==[${PREFIX}${suite}]==] PROPERTIES ${properties} TIMEOUT ${timeout})\n")
  endif()
endforeach()
file(WRITE "${CTEST_FILE}" "${out}")
