#include "device/nvml.h"

#include <dlfcn.h>

#include <climits>
#include <cstdio>

namespace ferry::device {

namespace {

// NVML's C API, as nvml.h declares it (ABI-stable since NVML 5): handles are opaque pointers,
// every call returns an int status (0: success).
using NvmlDevice = void*;
using InitFn = int (*)();
using ShutdownFn = int (*)();
using HandleFn = int (*)(unsigned int, NvmlDevice*);
using AffinityFn = int (*)(NvmlDevice, unsigned int, unsigned long*);
using ErrorStringFn = const char* (*)(int);

}  // namespace

std::vector<int> gpu_local_cpus(int gpu, std::string& why) {
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (lib == nullptr) {
    why = "NVIDIA's NVML (libnvidia-ml.so.1, from the NVIDIA driver) is not on this machine";
    return {};
  }
  const auto init = reinterpret_cast<InitFn>(::dlsym(lib, "nvmlInit_v2"));
  const auto shutdown = reinterpret_cast<ShutdownFn>(::dlsym(lib, "nvmlShutdown"));
  const auto handle = reinterpret_cast<HandleFn>(::dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
  const auto affinity = reinterpret_cast<AffinityFn>(::dlsym(lib, "nvmlDeviceGetCpuAffinity"));
  const auto error_string = reinterpret_cast<ErrorStringFn>(::dlsym(lib, "nvmlErrorString"));
  std::vector<int> cpus;
  const auto failed = [&](const char* call, int status) {
    char text[256];
    std::snprintf(text, sizeof text, "NVML's %s failed: %s (status %d)", call,
                  error_string != nullptr ? error_string(status) : "?", status);
    why = text;
  };
  if (init == nullptr || shutdown == nullptr || handle == nullptr || affinity == nullptr) {
    why =
        "libnvidia-ml.so.1 lacks nvmlInit_v2, nvmlDeviceGetHandleByIndex_v2 or "
        "nvmlDeviceGetCpuAffinity (an NVIDIA driver older than 2015?)";
  } else if (const int status = init(); status != 0) {
    failed("nvmlInit_v2", status);
  } else {
    NvmlDevice device = nullptr;
    constexpr unsigned kWords = 1024 / (sizeof(unsigned long) * CHAR_BIT);  // 1024 cores
    unsigned long mask[kWords] = {};
    if (const int s = handle(static_cast<unsigned>(gpu), &device); s != 0) {
      failed("nvmlDeviceGetHandleByIndex_v2", s);
    } else if (const int s2 = affinity(device, kWords, mask); s2 != 0) {
      failed("nvmlDeviceGetCpuAffinity", s2);
    } else {
      constexpr int kBits = sizeof(unsigned long) * CHAR_BIT;
      for (unsigned w = 0; w < kWords; ++w) {
        for (int b = 0; b < kBits; ++b) {
          if ((mask[w] >> b) & 1UL) cpus.push_back(static_cast<int>(w) * kBits + b);
        }
      }
      if (cpus.empty()) why = "NVML reports no cores local to the GPU";
    }
    shutdown();
  }
  ::dlclose(lib);
  return cpus;
}

}  // namespace ferry::device
