#include "device/under_test.h"

#include <chrono>

#include <torch/cuda.h>

#include "device/cuda_driver.h"
#include "support/test_device.h"

namespace ferry::testing {

namespace {
DeviceUnderTest g_chosen;
}  // namespace

void choose_device_under_test(const std::string& name) {
  g_chosen.cuda = name == "cuda";
  g_chosen.device = g_chosen.cuda ? torch::Device("cuda:0") : test_device::device(0);
}

const DeviceUnderTest& device_under_test() { return g_chosen; }

void DeviceUnderTest::busy(int rounds) const {
  if (!cuda) {
    test_device::queue_busy(std::chrono::milliseconds(5 * rounds), device.index());
    return;
  }
  auto a = torch::full({2048, 2048}, 1e-3f, torch::TensorOptions().device(device));
  for (int i = 0; i < rounds * 4; ++i) a = a.matmul(a);
}

void DeviceUnderTest::synchronize() const {
  if (!cuda) {
    test_device::synchronize();
    return;
  }
  torch::cuda::synchronize();
}

bool DeviceUnderTest::is_pinned(const torch::Tensor& t) const {
  return cuda ? t.is_pinned() : test_device::is_pinned(t);
}

std::int64_t DeviceUnderTest::memory_used() const {
  return cuda ? device::device_memory_used(device.index()) : test_device::memory_used(device.index());
}

std::size_t DeviceUnderTest::live_events() const { return cuda ? 0 : test_device::live_events(); }

std::size_t DeviceUnderTest::raced_copies() const {
  return cuda ? 0 : test_device::raced_copies();
}

}  // namespace ferry::testing
