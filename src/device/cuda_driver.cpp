#include "device/cuda_driver.h"

#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <utility>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/types.h>

#include "ferry/error.h"

#include "device/accelerator.h"
#include "ipc/shared_memory.h"

namespace ferry::device {

namespace {
std::atomic<bool> g_pretend{false};

// The driver API's types and constants, as cuda.h declares them.
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
constexpr CUresult kCudaSuccess = 0;
constexpr unsigned kMemHostRegisterPortable = 0x01;

// The driver's entry points that ferry uses, looked up once. `loaded` is false where there is no
// driver (a CPU-only machine); callers only get here after LibTorch found a GPU.
struct Driver {
  bool loaded = false;
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*ctx_push)(CUcontext) = nullptr;
  CUresult (*ctx_pop)(CUcontext*) = nullptr;
  CUresult (*host_register)(void*, std::size_t, unsigned) = nullptr;
  CUresult (*host_unregister)(void*) = nullptr;
  CUresult (*mem_get_info)(std::size_t*, std::size_t*) = nullptr;
  CUresult (*error_string)(CUresult, const char**) = nullptr;
  CUresult (*device_count)(int*) = nullptr;
  CUresult (*primary_ctx_state)(CUdevice, unsigned*, int*) = nullptr;

  static const Driver& get() {
    static const Driver driver = load();
    return driver;
  }

  std::string describe(CUresult r) const {
    const char* text = nullptr;
    if (error_string != nullptr && error_string(r, &text) == kCudaSuccess && text != nullptr) {
      return detail::str(text, " (CUresult ", r, ")");
    }
    return detail::str("CUresult ", r);
  }

 private:
  static Driver load() {
    Driver d;
    // Kept open for the life of the process: registrations may be undone at exit.
    void* lib = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (lib == nullptr) return d;
    auto sym = [lib](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
      return fn != nullptr;
    };
    d.loaded = sym(d.init, "cuInit") && sym(d.device_get, "cuDeviceGet") &&
               sym(d.primary_ctx_retain, "cuDevicePrimaryCtxRetain") &&
               sym(d.ctx_push, "cuCtxPushCurrent_v2") && sym(d.ctx_pop, "cuCtxPopCurrent_v2") &&
               sym(d.host_register, "cuMemHostRegister_v2") &&
               sym(d.host_unregister, "cuMemHostUnregister") &&
               sym(d.mem_get_info, "cuMemGetInfo_v2");
    sym(d.error_string, "cuGetErrorString");
    sym(d.device_count, "cuDeviceGetCount");
    sym(d.primary_ctx_state, "cuDevicePrimaryCtxGetState");
    return d;
  }
};

// The primary context of a device (the one LibTorch's runtime uses), retained once per process
// and made current around each driver call: the calling thread may have no context of its own.
class PrimaryContext {
 public:
  PrimaryContext(const Driver& driver, int device_index) : driver_(driver) {
    static std::mutex mutex;
    static std::array<CUcontext, 64> contexts{};
    FERRY_CHECK(device_index >= 0 && device_index < static_cast<int>(contexts.size()),
                "CUDA device index ", device_index, " is out of range");
    {
      const std::lock_guard<std::mutex> lock(mutex);
      CUcontext& ctx = contexts[static_cast<std::size_t>(device_index)];
      if (ctx == nullptr) {
        CUdevice device = 0;
        CUresult r = driver.init(0);
        if (r == kCudaSuccess) r = driver.device_get(&device, device_index);
        if (r == kCudaSuccess) r = driver.primary_ctx_retain(&ctx, device);
        if (r != kCudaSuccess) {
          ctx = nullptr;
          throw Error(detail::str("CUDA driver: cannot retain the primary context of device ",
                                  device_index, ": ", driver.describe(r)));
        }
      }
      ctx_ = ctx;
    }
    const CUresult r = driver.ctx_push(ctx_);
    if (r != kCudaSuccess) {
      throw Error(detail::str("CUDA driver: cannot make device ", device_index,
                              "'s context current: ", driver.describe(r)));
    }
  }
  ~PrimaryContext() {
    CUcontext popped = nullptr;
    (void)driver_.ctx_pop(&popped);
  }
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;

 private:
  const Driver& driver_;
  CUcontext ctx_ = nullptr;
};

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

std::vector<int> cuda_devices_in_use() noexcept {
  std::vector<int> in_use;
  const Driver& driver = Driver::get();
  if (!driver.loaded || driver.device_count == nullptr || driver.primary_ctx_state == nullptr) {
    return in_use;
  }
  int devices = 0;
  if (driver.device_count(&devices) != kCudaSuccess) return in_use;
  for (int d = 0; d < devices; ++d) {
    unsigned flags = 0;
    int active = 0;
    if (driver.primary_ctx_state(d, &flags, &active) == kCudaSuccess && active != 0) {
      in_use.push_back(d);
    }
  }
  return in_use;
}

namespace {

// Why CUDA cannot be used here, for the option that needed it.
std::string why_no_cuda() {
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) {
    return "this LibTorch was built without CUDA (Debian's libtorch-dev is CPU-only); link "
           "PyTorch's CUDA LibTorch (CMAKE_PREFIX_PATH from python3 -c 'import torch; "
           "print(torch.utils.cmake_prefix_path)')";
  }
  return "this LibTorch has CUDA but sees no GPU (check nvidia-smi, the driver and "
         "CUDA_VISIBLE_DEVICES)";
}

// Page-locks through cuMemHostRegister_v2 with CU_MEMHOSTREGISTER_PORTABLE (for every context);
// the primary context of `device_index` is pushed and popped around each call, so a tensor
// deleter on any thread may unlock.
class CudaAccelerator final : public Accelerator {
 public:
  c10::DeviceType type() const noexcept override { return c10::DeviceType::CUDA; }
  std::string unavailable_reason() const override { return at::hasCUDA() ? "" : why_no_cuda(); }

  HostRegistration page_lock(void* data, std::size_t size, int device_index) const override {
    const Driver& driver = Driver::get();
    FERRY_CHECK(driver.loaded,
                "the CUDA driver (libcuda.so.1) could not be loaded, so shared memory cannot be "
                "page-locked for copies to the GPU; check the NVIDIA driver's installation");
    const PrimaryContext context(driver, device_index);
    const CUresult r = driver.host_register(data, size, kMemHostRegisterPortable);
    if (r != kCudaSuccess) {
      throw Error(detail::str("CUDA driver: cuMemHostRegister of ", ipc::format_bytes(size),
                              " of shared memory failed: ", driver.describe(r)));
    }
    return HostRegistration([data, device_index]() noexcept {
      const Driver& d = Driver::get();
      try {
        const PrimaryContext unlock_context(d, device_index);
        const CUresult u = d.host_unregister(data);
        if (u != kCudaSuccess) {
          std::fprintf(stderr, "ferry: cuMemHostUnregister failed: %s\n", d.describe(u).c_str());
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "ferry: cannot unlock page-locked shared memory: %s\n", e.what());
      }
    });
  }

  std::vector<int> devices_in_use() const override { return cuda_devices_in_use(); }

  bool is_pinned(const torch::Tensor& t) const override { return t.is_pinned(); }

  torch::Tensor pinned_copy(const torch::Tensor& t) const override {
    return torch::empty_like(t, t.options().pinned_memory(true), c10::MemoryFormat::Preserve)
        .copy_(t);
  }
};

}  // namespace

const Accelerator& cuda_accelerator() {
  static const CudaAccelerator accelerator;
  return accelerator;
}

std::int64_t device_memory_used(int device_index) noexcept {
  try {
    const Driver& driver = Driver::get();
    if (!driver.loaded) return -1;
    const PrimaryContext context(driver, device_index);
    std::size_t free = 0;
    std::size_t total = 0;
    if (driver.mem_get_info(&free, &total) != kCudaSuccess) return -1;
    return static_cast<std::int64_t>(total - free);
  } catch (...) {
    return -1;
  }
}

}  // namespace ferry::device
