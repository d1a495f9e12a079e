#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ferry::device {

// The CUDA driver (libcuda.so.1), reached at run time through dlopen, so that the same sources
// build against a CPU-only LibTorch and, unchanged, against a CUDA one; nothing here needs nvcc
// or CUDA's headers. Only the main process calls into it: a worker never touches CUDA.

// True if this process has initialised CUDA: the driver library is loaded and a context is
// current or a device's primary context is active. Asked through the driver itself (dlopen with
// RTLD_NOLOAD), so a CPU-only build can answer too and nothing gets initialised by asking.
// Forking workers after that is allowed (they never use CUDA); it only changes the advice an
// error gives when a worker tried to use CUDA anyway.
bool cuda_initialized() noexcept;

// Page-locks a range of host memory for every CUDA context (cuMemHostRegister_v2 with
// CU_MEMHOSTREGISTER_PORTABLE) and unlocks it on destruction, so host-to-device copies from it
// run at the pinned rate with no staging copy. Move-only. The range must stay mapped for as long
// as the registration lives (the owner destroys this first, then unmaps), and no copy from it may
// be in flight when it is destroyed. Thread-safe: the primary context of `device_index` is pushed
// and popped around each call, so a tensor deleter on any thread may unlock.
class HostRegistration {
 public:
  HostRegistration() = default;
  // Throws ferry::Error naming the driver's error and the range's size.
  static HostRegistration page_lock(void* data, std::size_t size, int device_index);
  HostRegistration(HostRegistration&& other) noexcept;
  HostRegistration& operator=(HostRegistration&& other) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  ~HostRegistration() { reset(); }

  explicit operator bool() const noexcept { return data_ != nullptr; }
  void reset() noexcept;  // unlocks; logs (never throws) if the driver refuses

 private:
  HostRegistration(void* data, int device_index) noexcept
      : data_(data), device_index_(device_index) {}
  void* data_ = nullptr;
  int device_index_ = 0;
};

// The CUDA devices whose primary context is active in this process (the ones LibTorch has used),
// in index order; empty where there is no driver. Asks the driver only: starts nothing.
std::vector<int> devices_in_use() noexcept;

// Page-locked ranges alive in this process (tests: 50 epochs must not grow it).
std::size_t live_host_registrations() noexcept;

// Bytes in use on `device_index` as the driver sees them (total minus free), or -1 if the driver
// cannot say. For leak checks: it counts every allocation, LibTorch's cache included.
std::int64_t device_memory_used(int device_index) noexcept;

namespace fault {
// Tests of the fork-after-CUDA advice on a CPU-only machine: pretend CUDA is (or is not)
// initialised.
void pretend_cuda_initialized(bool on) noexcept;
}  // namespace fault

}  // namespace ferry::device
