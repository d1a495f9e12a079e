// main() of the device stage's tests. FERRY_TEST_DEVICE picks the device under test:
// `testdevice` (support/test_device.h, installed here) or `cuda` (a real GPU; without one the
// whole run is skipped: exit 77). Then, as the engine tests' main does: the test types, then
// ferry::init, so spawned workers (copies of this binary) rebuild the same datasets.

#include <cstdio>
#include <cstdlib>
#include <string>

#include <gmock/gmock.h>

#include "ferry/init.h"

#include "device/under_test.h"
#include "support/registered.h"
#include "support/test_device.h"

int main(int argc, char** argv) {
  ferry::testing::register_test_types(ferry::Registry::global());
  ferry::init(argc, argv);  // a spawned worker never returns from here
  const char* chosen = std::getenv("FERRY_TEST_DEVICE");
  const std::string name = chosen != nullptr ? chosen : "testdevice";
  if (name == "testdevice") {
    ferry::testing::test_device::install();
  } else if (name == "cuda") {
    if (!at::hasCUDA()) {
      std::printf("skipped: no CUDA here (this variant runs with a CUDA LibTorch on a GPU)\n");
      return 77;
    }
  } else {
    std::fprintf(stderr, "FERRY_TEST_DEVICE=%s: expected testdevice or cuda\n", name.c_str());
    return 2;
  }
  ferry::testing::choose_device_under_test(name);
  ::testing::InitGoogleMock(&argc, argv);
  return RUN_ALL_TESTS();
}
