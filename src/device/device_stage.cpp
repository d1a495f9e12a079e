#include "device/device_stage.h"

#include <cstdio>
#include <utility>
#include <vector>

#include <ATen/Context.h>
#include <c10/core/StreamGuard.h>

#include "ferry/error.h"

namespace ferry::device {

namespace {

std::mutex g_fault_mutex;
std::function<void()> g_before_copy;

// Why CUDA is not there, for the option that needed it.
std::string why_no_cuda() {
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) {
    return "this LibTorch was built without CUDA (Debian's libtorch-dev is CPU-only); link "
           "PyTorch's CUDA LibTorch (CMAKE_PREFIX_PATH from python3 -c 'import torch; "
           "print(torch.utils.cmake_prefix_path)')";
  }
  return "this LibTorch has CUDA but sees no GPU (check nvidia-smi, the driver and "
         "CUDA_VISIBLE_DEVICES)";
}

template <class F>
void for_each_tensor(const Batch& batch, F&& f) {
  for (const auto& name : batch) {
    if (const auto* t = std::get_if<torch::Tensor>(batch.find(name))) f(*t);
  }
}

}  // namespace

void fault::set_before_copy(std::function<void()> work) {
  const std::lock_guard<std::mutex> lock(g_fault_mutex);
  g_before_copy = std::move(work);
}

DeviceStage::DeviceStage(std::optional<torch::Device> device,
                         bool pin_memory,
                         BatchTransforms transforms)
    : pin_(pin_memory), transforms_(std::move(transforms)) {
  for (const auto& t : transforms_) {
    FERRY_CHECK(t != nullptr, "device_transforms: a transform is null");
  }
  const bool to_cuda = device && device->is_cuda();
  FERRY_CHECK(!device || device->is_cpu() || to_cuda, "device=", device->str(),
              ": ferry copies batches to CUDA devices (or leaves them on the CPU); use cuda, "
              "cuda:N or cpu");
  if (to_cuda) {
    FERRY_CHECK(at::hasCUDA(), "device=", device->str(), " needs CUDA, but ", why_no_cuda(),
                "; or leave device unset");
  }
  if (pin_memory) {
    FERRY_CHECK(at::hasCUDA(), "pin_memory=true page-locks batches for copies to a GPU, but ",
                why_no_cuda(), "; or set pin_memory=false");
  }
  cuda_ = to_cuda || pin_memory;
  if (!cuda_) return;
  guard_.emplace(c10::DeviceType::CUDA);
  device_index_ = to_cuda && device->has_index() ? device->index() : guard_->getDevice().index();
  FERRY_CHECK(device_index_ >= 0 && device_index_ < guard_->deviceCount(),
              "device=cuda:", device_index_, ", but this machine has ",
              static_cast<int>(guard_->deviceCount()),
              " CUDA devices (cuda:0 to cuda:", guard_->deviceCount() - 1, ")");
  if (to_cuda) {
    device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device_index_));
    // One long-lived stream for every copy of this loader, apart from the loop's own stream.
    stream_ = guard_->getStreamFromGlobalPool(*device_, /*isHighPriority=*/false);
  }
}

DeviceStage::~DeviceStage() {
  if (locker_.joinable()) {
    {
      const std::lock_guard<std::mutex> lock(lock_mutex_);
      lock_stop_ = true;
    }
    lock_wake_.notify_all();
    locker_.join();
  }
  lock_queue_.clear();
  try {
    if (stream_) guard_->synchronizeStream(*stream_);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry: waiting for the copy stream failed: %s\n", e.what());
  }
  const std::lock_guard<std::mutex> lock(mutex_);
  in_flight_.clear();
}

void DeviceStage::page_lock_later(std::shared_ptr<LockableRange> range) {
  if (!cuda_ || range->requested_) return;
  range->requested_ = true;
  {
    const std::lock_guard<std::mutex> lock(lock_mutex_);
    lock_queue_.push_back(std::move(range));
  }
  if (!locker_.joinable()) locker_ = std::thread([this] { lock_ranges(); });
  lock_wake_.notify_one();
}

void DeviceStage::lock_ranges() noexcept {
  for (;;) {
    std::shared_ptr<LockableRange> range;
    {
      std::unique_lock<std::mutex> lock(lock_mutex_);
      lock_wake_.wait(lock, [&] { return lock_stop_ || !lock_queue_.empty(); });
      if (lock_stop_) return;
      range = std::move(lock_queue_.front());
      lock_queue_.pop_front();
    }
    // Nobody else holds it (its segment was retired and its batches are gone): not worth 50 ms.
    if (range.use_count() == 1) continue;
    try {
      range->registration_ = HostRegistration::page_lock(range->data_, range->size_, device_index_);
      range->locked_.store(true, std::memory_order_release);
    } catch (const std::exception& e) {
      static std::once_flag warned;
      std::call_once(warned, [&] {
        std::fprintf(stderr,
                     "ferry: warning: %s; batches in shared memory that cannot be page-locked are "
                     "copied into pinned memory instead (slower)\n",
                     e.what());
      });
    }
    // `range` may be the last owner of its segment: it is then unlocked and unmapped here.
  }
}

StagedBatch DeviceStage::start(Batch host, bool page_locked) {
  release_completed();
  if (!device_) {
    // The CPU, or pinned host batches (pin_memory without a device).
    if (pin_ && !page_locked) host = host.pin_memory();
    for (const auto& t : transforms_) t->apply(host);
    return {std::move(host), nullptr};
  }
  // The copy reads `source` asynchronously: keep it until the copy's event has completed.
  Batch source = page_locked ? std::move(host) : host.pin_memory();
  host = Batch();  // a pinned copy was made: the shared memory can go back to its worker now
  const c10::StreamGuard on_copy_stream(*stream_);
  auto keep_until_done = [&] {
    auto done = std::make_shared<c10::Event>(c10::DeviceType::CUDA);
    done->record(*stream_);
    const std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.push_back({done, std::move(source)});
    return done;
  };
  Batch on_device;
  try {
    {
      const std::lock_guard<std::mutex> lock(g_fault_mutex);
      if (g_before_copy) g_before_copy();
    }
    on_device = source.to(*device_, /*non_blocking=*/true);
    for (const auto& t : transforms_) t->apply(on_device);
  } catch (...) {
    keep_until_done();  // copies may have been issued before the failure
    throw;
  }
  return {std::move(on_device), keep_until_done()};
}

Batch DeviceStage::finish(StagedBatch staged) const {
  if (!staged.ready) return std::move(staged.batch);
  const c10::Stream consumer = guard_->getStream(*device_);
  staged.ready->block(consumer);
  for_each_tensor(staged.batch, [&](const torch::Tensor& t) {
    if (t.device() == *device_) t.record_stream(consumer);
  });
  return std::move(staged.batch);
}

void DeviceStage::release_completed() {
  std::vector<InFlight> done;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    while (!in_flight_.empty() && in_flight_.front().done->query()) {
      done.push_back(std::move(in_flight_.front()));
      in_flight_.pop_front();
    }
  }
  // Dropped outside the lock: a host batch's last reference sends its segment back.
}

std::size_t DeviceStage::in_flight() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return in_flight_.size();
}

}  // namespace ferry::device
