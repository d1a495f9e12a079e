#pragma once

namespace ferry::detail {

// True if this process has initialised CUDA: the driver library is loaded and a context is
// current or a device's primary context is active. Found through the driver library itself
// (dlopen with RTLD_NOLOAD), so a CPU-only build can answer too and nothing gets initialised
// by asking. A process in that state must not fork workers (RELIABILITY row 22).
bool cuda_initialized() noexcept;

// Throws ConfigError (recommending spawn or forkserver) if CUDA is initialised: run before
// forking workers, at construction and at each epoch that forks.
void check_fork_is_safe();

namespace fault {
// Tests of the CPU part of row 22: pretend CUDA is (or is not) initialised.
void pretend_cuda_initialized(bool on) noexcept;
}  // namespace fault

}  // namespace ferry::detail
