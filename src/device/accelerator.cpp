#include "device/accelerator.h"

#include <array>
#include <atomic>
#include <mutex>
#include <utility>

#include "ferry/error.h"

namespace ferry::device {

namespace {

std::atomic<std::size_t> g_live_registrations{0};

// Registered accelerators by device type; written under the mutex, read without it once set (an
// entry is never replaced or freed).
std::mutex g_registry_mutex;
std::array<std::atomic<const Accelerator*>, static_cast<std::size_t>(
                                                c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)>
    g_registered{};

}  // namespace

HostRegistration::HostRegistration(std::function<void()> unlock) : unlock_(std::move(unlock)) {
  if (unlock_) g_live_registrations.fetch_add(1, std::memory_order_relaxed);
}

HostRegistration::HostRegistration(HostRegistration&& other) noexcept
    : unlock_(std::exchange(other.unlock_, nullptr)) {}

HostRegistration& HostRegistration::operator=(HostRegistration&& other) noexcept {
  if (this != &other) {
    reset();
    unlock_ = std::exchange(other.unlock_, nullptr);
  }
  return *this;
}

void HostRegistration::reset() noexcept {
  std::function<void()> unlock = std::exchange(unlock_, nullptr);
  if (!unlock) return;
  g_live_registrations.fetch_sub(1, std::memory_order_relaxed);
  unlock();
}

std::size_t live_host_registrations() noexcept {
  return g_live_registrations.load(std::memory_order_relaxed);
}

void register_accelerator(std::unique_ptr<Accelerator> accelerator) {
  FERRY_CHECK(accelerator != nullptr, "register_accelerator: null");
  const c10::DeviceType type = accelerator->type();
  FERRY_CHECK(type != c10::DeviceType::CUDA && type != c10::DeviceType::CPU,
              "register_accelerator: ", c10::DeviceTypeName(type),
              " is built in or not an accelerator");
  const std::lock_guard<std::mutex> lock(g_registry_mutex);
  auto& slot = g_registered.at(static_cast<std::size_t>(type));
  FERRY_CHECK(slot.load() == nullptr, "register_accelerator: ", c10::DeviceTypeName(type),
              " has one already");
  slot.store(accelerator.release());  // kept for the life of the process
}

const Accelerator* accelerator_for(c10::DeviceType type) noexcept {
  if (type == c10::DeviceType::CUDA) return &cuda_accelerator();
  const auto index = static_cast<std::size_t>(type);
  return index < g_registered.size() ? g_registered[index].load() : nullptr;
}

const Accelerator& default_accelerator() noexcept {
  const Accelerator& cuda = cuda_accelerator();
  if (at::hasCUDA()) return cuda;
  if (const Accelerator* other = accelerator_for(c10::DeviceType::PrivateUse1)) {
    try {
      if (other->unavailable_reason().empty()) return *other;
    } catch (...) {
    }
  }
  return cuda;
}

}  // namespace ferry::device
