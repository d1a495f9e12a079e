// main() of the engine tests: registers the test types, then ferry::init, as a user's program
// does, so spawned workers (copies of this binary) rebuild the same datasets.

#include <gmock/gmock.h>

#include "ferry/init.h"

#include "support/registered.h"

int main(int argc, char** argv) {
  ferry::testing::register_test_types(ferry::Registry::global());
  ferry::init(argc, argv);  // a spawned worker never returns from here
  ::testing::InitGoogleMock(&argc, argv);
  return RUN_ALL_TESTS();
}
