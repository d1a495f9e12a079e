#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/DeviceType.h>
#include <torch/types.h>

namespace ferry::device {

// A range of host memory page-locked for an accelerator's copies; unlocked on destruction (the
// accelerator's `unlock`, run once). Move-only. The range must stay mapped for as long as the
// registration lives, and no copy from it may be in flight when it is destroyed.
class HostRegistration {
 public:
  HostRegistration() = default;
  // `unlock` must not throw: it runs from destructors (it logs what fails).
  explicit HostRegistration(std::function<void()> unlock);
  HostRegistration(HostRegistration&& other) noexcept;
  HostRegistration& operator=(HostRegistration&& other) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  ~HostRegistration() { reset(); }

  explicit operator bool() const noexcept { return static_cast<bool>(unlock_); }
  void reset() noexcept;  // unlocks now

 private:
  std::function<void()> unlock_;
};

// Page-locked ranges alive in this process, every accelerator's (tests: 50 epochs must not grow
// it).
std::size_t live_host_registrations() noexcept;

// What the device stage needs of an accelerator beyond the streams, events and copies that
// LibTorch's device-generic API gives every device type: CUDA's is built in (through the driver
// loaded at run time), and an out-of-tree backend on LibTorch's PrivateUse1 device type (the
// test device of tests/support/ is one) registers its own. One per device type, alive for the
// life of the process. Thread-safe.
class Accelerator {
 public:
  virtual ~Accelerator() = default;
  virtual c10::DeviceType type() const noexcept = 0;
  // Empty when this process can use it; otherwise why not and what to do, to finish a sentence
  // "X needs <name>, but ...".
  virtual std::string unavailable_reason() const = 0;
  // Page-locks [data, data + size) for copies to `device_index`, memory this process mapped
  // itself (a worker's shared-memory segment). Throws ferry::Error naming what failed.
  virtual HostRegistration page_lock(void* data, std::size_t size, int device_index) const = 0;
  // The devices whose current streams a fence covers besides the loader's own: those this
  // process has used (CUDA: the active primary contexts). Starts nothing.
  virtual std::vector<int> devices_in_use() const = 0;
  // Whether a CPU tensor lies in memory page-locked for this accelerator (its own allocations, or
  // a range page_lock() registered).
  virtual bool is_pinned(const torch::Tensor& t) const = 0;
  // A new page-locked CPU tensor with `t`'s values and layout, even if `t` is pinned already.
  virtual torch::Tensor pinned_copy(const torch::Tensor& t) const = 0;
};

// CUDA's, present on every build: on a CPU-only LibTorch or a machine without a GPU its
// unavailable_reason() says why.
const Accelerator& cuda_accelerator();
// Makes `accelerator` the one for its device type (PrivateUse1 backends; CUDA's cannot be
// replaced). Kept for the life of the process.
void register_accelerator(std::unique_ptr<Accelerator> accelerator);
// The accelerator of a device type: CUDA's, or one registered; nullptr for any other type.
const Accelerator* accelerator_for(c10::DeviceType type) noexcept;
// The one pin_memory pins for when no device is given (PyTorch's current accelerator): CUDA
// where this LibTorch has it, else a registered one that is available, else CUDA's (whose
// unavailable_reason() says why pinning cannot work).
const Accelerator& default_accelerator() noexcept;

}  // namespace ferry::device
