#pragma once

// The device the device stage's tests run against: the test device (support/test_device.h) on
// every CI run, or a real GPU (CUDA) where there is one. What the tests need of it beyond
// LibTorch's device-generic API is here.

#include <cstddef>
#include <cstdint>
#include <string>

#include <torch/types.h>

namespace ferry::testing {

struct DeviceUnderTest {
  torch::Device device{torch::kCPU};
  bool cuda = false;  // a real GPU; otherwise the test device

  // Queues about `rounds` x 5 ms of work on the calling thread's current stream (CUDA: chains of
  // matmuls): later work on that stream waits behind it; the host does not.
  void busy(int rounds) const;
  // Waits for every stream of the device.
  void synchronize() const;
  // Whether a CPU tensor is page-locked for the device.
  bool is_pinned(const torch::Tensor& t) const;
  // Device memory in use (CUDA: as the driver sees it, LibTorch's cache included).
  std::int64_t memory_used() const;
  // Events alive (the test device's count; CUDA: not known, 0).
  std::size_t live_events() const;
  // Copies whose page-locked source was unlocked or rewritten before they ran (the test
  // device's count; CUDA: not known, 0).
  std::size_t raced_copies() const;
};

// Set once by main() from FERRY_TEST_DEVICE (testdevice or cuda).
void choose_device_under_test(const std::string& name);
const DeviceUnderTest& device_under_test();

}  // namespace ferry::testing
