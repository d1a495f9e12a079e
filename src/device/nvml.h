#pragma once

#include <string>
#include <vector>

namespace ferry::device {

// The cores local to GPU `gpu` (its NUMA node's), as NVIDIA's management library reports them
// (nvmlDeviceGetCpuAffinity), reached at run time through dlopen of libnvidia-ml.so.1: nothing
// needs NVML's headers, and a machine without it gets an answer, not a link error. Starts no
// CUDA context. Empty, with `why` set, when NVML is missing or does not know the device.
std::vector<int> gpu_local_cpus(int gpu, std::string& why);

}  // namespace ferry::device
