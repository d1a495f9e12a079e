#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ferry::device {

// The CUDA driver (libcuda.so.1), reached at run time through dlopen, so that the same sources
// build against a CPU-only LibTorch and, unchanged, against a CUDA one; nothing here needs nvcc
// or CUDA's headers. Only the main process calls into it: a worker never touches CUDA. CUDA's
// Accelerator (accelerator.h: page-locking with cuMemHostRegister, the devices in use) lives in
// cuda_driver.cpp.

// True if this process has initialised CUDA: the driver library is loaded and a context is
// current or a device's primary context is active. Asked through the driver itself (dlopen with
// RTLD_NOLOAD), so a CPU-only build can answer too and nothing gets initialised by asking.
// Forking workers after that is allowed (they never use CUDA); it only changes the advice an
// error gives when a worker tried to use CUDA anyway.
bool cuda_initialized() noexcept;

// The CUDA devices whose primary context is active in this process (the ones LibTorch has used),
// in index order; empty where there is no driver. Asks the driver only: starts nothing.
std::vector<int> cuda_devices_in_use() noexcept;

// Bytes in use on `device_index` as the driver sees them (total minus free), or -1 if the driver
// cannot say. For leak checks: it counts every allocation, LibTorch's cache included.
std::int64_t device_memory_used(int device_index) noexcept;

namespace fault {
// Tests of the fork-after-CUDA advice on a CPU-only machine: pretend CUDA is (or is not)
// initialised.
void pretend_cuda_initialized(bool on) noexcept;
}  // namespace fault

}  // namespace ferry::device
