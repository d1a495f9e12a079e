#include "loader/cuda_state.h"

#include <dlfcn.h>

#include <atomic>

#include "ferry/error.h"

namespace ferry::detail {

namespace {
std::atomic<bool> g_pretend{false};

// The driver API's types, as cuda.h declares them.
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
constexpr CUresult kCudaSuccess = 0;
}  // namespace

void fault::pretend_cuda_initialized(bool on) noexcept { g_pretend = on; }

bool cuda_initialized() noexcept {
  if (g_pretend) return true;
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (driver == nullptr) return false;  // never loaded: CUDA cannot have started
  bool initialised = false;
  auto* get_current =
      reinterpret_cast<CUresult (*)(CUcontext*)>(::dlsym(driver, "cuCtxGetCurrent"));
  auto* count = reinterpret_cast<CUresult (*)(int*)>(::dlsym(driver, "cuDeviceGetCount"));
  auto* state = reinterpret_cast<CUresult (*)(CUdevice, unsigned*, int*)>(
      ::dlsym(driver, "cuDevicePrimaryCtxGetState"));
  CUcontext current = nullptr;
  if (get_current != nullptr && get_current(&current) == kCudaSuccess && current != nullptr) {
    initialised = true;
  }
  int devices = 0;
  // Before cuInit, cuDeviceGetCount fails with CUDA_ERROR_NOT_INITIALIZED: not started.
  if (!initialised && count != nullptr && state != nullptr && count(&devices) == kCudaSuccess) {
    for (int d = 0; d < devices && !initialised; ++d) {
      unsigned flags = 0;
      int active = 0;
      if (state(d, &flags, &active) == kCudaSuccess && active != 0) initialised = true;
    }
  }
  ::dlclose(driver);
  return initialised;
}

void check_fork_is_safe() {
  FERRY_CHECK(!cuda_initialized(),
              "start_method=fork, but this process has initialised CUDA: a forked worker cannot "
              "use it, and forking a CUDA process can hang or crash (pytorch#40403). Use "
              "start_method=spawn or forkserver (with ferry::init(argc, argv) first thing in "
              "main); or, with fork, persistent_workers=true and iterate once before CUDA "
              "starts (workers are forked at the first begin())");
}

}  // namespace ferry::detail
