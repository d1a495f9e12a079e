#include "device/device_stage.h"

#include <algorithm>
#include <chrono>
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
std::atomic<bool> g_before_copy_armed{false};  // no lock per batch unless a test armed the hook

// How long destroying a stage waits for copies still in flight before it gives up on them.
constexpr std::chrono::seconds kShutdownWait{30};

// An exception's message; LibTorch's own without its C++ backtrace.
std::string message_of(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return c10->what_without_backtrace();
  return e.what();
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
  g_before_copy_armed = static_cast<bool>(g_before_copy);
}

DeviceStage::DeviceStage(std::optional<torch::Device> device,
                         bool pin_memory,
                         BatchTransforms transforms)
    : pin_(pin_memory), transforms_(std::move(transforms)) {
  for (const auto& t : transforms_) {
    FERRY_CHECK(t != nullptr, "device_transforms: a transform is null");
  }
  const bool to_device = device && !device->is_cpu();
  if (to_device) {
    accelerator_ = accelerator_for(device->type());
    FERRY_CHECK(accelerator_ != nullptr, "device=", device->str(),
                ": ferry copies batches to an accelerator that LibTorch drives with streams and "
                "events (CUDA, or a PrivateUse1 backend that registered itself with ferry), or "
                "leaves them on the CPU; use cuda, cuda:N or cpu");
    const std::string why = accelerator_->unavailable_reason();
    FERRY_CHECK(why.empty(), "device=", device->str(), " needs ",
                c10::DeviceTypeName(device->type(), device->type() != c10::DeviceType::CUDA),
                ", but ", why, "; or leave device unset");
  }
  if (pin_memory) {
    if (!to_device) accelerator_ = &default_accelerator();
    const std::string why = accelerator_->unavailable_reason();
    FERRY_CHECK(why.empty(), "pin_memory=true pins batches for copies to a GPU, but ", why,
                "; or set pin_memory=false");
  }
  if (accelerator_ == nullptr) return;
  guard_.emplace(accelerator_->type());
  const std::string name = c10::DeviceTypeName(accelerator_->type(), /*lower_case=*/true);
  device_index_ = to_device && device->has_index() ? device->index() : guard_->getDevice().index();
  FERRY_CHECK(device_index_ >= 0 && device_index_ < guard_->deviceCount(), "device=", name, ":",
              device_index_, ", but this machine has ", static_cast<int>(guard_->deviceCount()),
              " ", name, " devices (", name, ":0 to ", name, ":", guard_->deviceCount() - 1, ")");
  if (to_device) {
    device_ = torch::Device(accelerator_->type(), static_cast<c10::DeviceIndex>(device_index_));
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
  // Copies still in flight read host memory that goes back to the workers (or is unmapped) when
  // their batches go, and so may the loop's own queued copies from segments held in fenced_:
  // wait for them, with a bound, so a GPU that never finishes cannot hang the program's shutdown.
  // Past the bound, their host memory is deliberately kept (leaked).
  const auto deadline = std::chrono::steady_clock::now() + kShutdownWait;
  const std::lock_guard<std::mutex> lock(mutex_);
  try {
    for (;;) {
      while (!in_flight_.empty() && in_flight_.front().done->query()) in_flight_.pop_front();
      std::erase_if(fenced_, [](const Fenced& f) { return f.completed(); });
      if (in_flight_.empty() && fenced_.empty()) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        throw Error(detail::str(in_flight_.size(), " copies and ", fenced_.size(),
                                " batches' queued work on ",
                                torch::Device(accelerator_->type(),
                                              static_cast<c10::DeviceIndex>(device_index_)),
                                " did not complete within ", kShutdownWait.count(), " s"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "ferry: warning: closing the DataLoader's copy stage: %s; their host memory is "
                 "kept, not freed, so that no copy reads freed memory\n",
                 message_of(e).c_str());
    new std::deque<InFlight>(std::move(in_flight_));  // NOLINT: leaked on purpose
    new std::vector<Fenced>(std::move(fenced_));      // NOLINT: leaked on purpose
  }
}

namespace {

// The devices whose current streams a fence covers: `device_index` and every other in use.
std::vector<int> fenced_devices(const Accelerator& accelerator, int device_index) {
  std::vector<int> devices = accelerator.devices_in_use();
  if (std::find(devices.begin(), devices.end(), device_index) == devices.end()) {
    devices.push_back(device_index);
  }
  return devices;
}

// One event on the calling thread's current stream of each of `devices`.
std::vector<c10::Event> record_on_current_streams(const c10::impl::VirtualGuardImpl& guard,
                                                  const std::vector<int>& devices) {
  std::vector<c10::Event> events;
  events.reserve(devices.size());
  for (const int d : devices) {
    events.emplace_back(guard.type());
    events.back().record(
        guard.getStream(c10::Device(guard.type(), static_cast<c10::DeviceIndex>(d))));
  }
  return events;
}

}  // namespace

bool DeviceStage::Fenced::completed() const {
  return std::all_of(done.begin(), done.end(), [](const c10::Event& e) { return e.query(); });
}

bool DeviceStage::return_after_queued_work(std::shared_ptr<void>& held) noexcept {
  try {
    Fenced fenced{
        record_on_current_streams(*guard_, fenced_devices(*accelerator_, device_index_)),
        nullptr};
    const std::lock_guard<std::mutex> lock(mutex_);
    fenced_.reserve(fenced_.size() + 1);  // nothing below throws once `held` moves
    fenced.held = std::move(held);
    fenced_.push_back(std::move(fenced));
    return true;
  } catch (...) {
    return false;
  }
}

bool DeviceStage::wait_for_queued_work(const Accelerator& accelerator, int device_index) noexcept {
  try {
    const c10::impl::VirtualGuardImpl guard(accelerator.type());
    // c10::Event has no synchronize() in LibTorch 1.13: poll.
    const Fenced fenced{
        record_on_current_streams(guard, fenced_devices(accelerator, device_index)), nullptr};
    const auto deadline = std::chrono::steady_clock::now() + kShutdownWait;
    while (!fenced.completed()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        throw Error(detail::str("it did not complete within ", kShutdownWait.count(), " s"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "ferry: warning: could not wait for the device work queued from a pinned batch "
                 "(%s); its shared memory is kept, not freed, so that no copy reads freed "
                 "memory\n",
                 message_of(e).c_str());
  } catch (...) {
  }
  return false;
}

void DeviceStage::page_lock_later(std::shared_ptr<LockableRange> range) {
  if (!guard_ || range->requested_) return;
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
      range->registration_ = accelerator_->page_lock(range->data_, range->size_, device_index_);
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

// The batch with its CPU tensors in memory page-locked for the accelerator: those that lie in
// such memory already as they are, the rest as pinned copies; with `copy_all`, every one a pinned
// copy (same layout), since a segment whose page-lock the locking thread is just finishing must
// not be handed out unfenced.
Batch DeviceStage::pinned(Batch batch, bool copy_all) const {
  for (const auto& name : batch.names()) {
    const auto* t = std::get_if<torch::Tensor>(batch.find(name));
    if (t == nullptr || !t->is_cpu()) continue;
    if (copy_all || !accelerator_->is_pinned(*t)) batch.set(name, accelerator_->pinned_copy(*t));
  }
  return batch;
}

void DeviceStage::run_transforms(Batch& batch) const {
  for (const auto& t : transforms_) {
    try {
      t->apply(batch);
    } catch (const std::exception& e) {
      throw Error(detail::str("device transform ", t->describe(), " on batch ", batch.sequence(),
                              " of epoch ", batch.epoch(), ": ", message_of(e)));
    }
  }
}

StagedBatch DeviceStage::start(Batch host, bool page_locked) {
  release_completed();
  if (!device_) {
    run_transforms(host);
    if (pin_) {
      // pin_memory without a device. A batch in a page-locked segment is pinned as it is: its
      // segment goes back to its worker only after the GPU work the loop queued before dropping
      // it (the loader fences the return, return_after_queued_work). Anything else (a segment
      // not yet locked, a one-off segment, what a transform made) becomes a pinned copy from
      // LibTorch's caching host allocator, which records the loop's copies from it. `page_locked`
      // was read before this call and only ever turns true, so the fence sees it too.
      host = pinned(std::move(host), /*copy_all=*/!page_locked);
    }
    return {std::move(host), nullptr};
  }
  // The copy reads `source` asynchronously: keep it until the copy's event has completed.
  Batch source = page_locked ? std::move(host) : pinned(std::move(host), /*copy_all=*/false);
  host = Batch();  // a pinned copy was made: the shared memory can go back to its worker now
  const c10::StreamGuard on_copy_stream(*stream_);
  auto keep_until_done = [&] {
    auto done = std::make_shared<c10::Event>(accelerator_->type());
    done->record(*stream_);
    const std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.push_back({done, std::move(source)});
    return done;
  };
  Batch on_device;
  try {
    if (g_before_copy_armed.load(std::memory_order_relaxed)) {
      const std::lock_guard<std::mutex> lock(g_fault_mutex);
      if (g_before_copy) g_before_copy();
    }
    try {
      on_device = source.to(*device_, /*non_blocking=*/true);
    } catch (const std::exception& e) {
      throw Error(detail::str("copying batch ", source.sequence(), " of epoch ", source.epoch(),
                              " to ", device_->str(), " failed: ", message_of(e)));
    }
    run_transforms(on_device);
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
  std::vector<std::shared_ptr<void>> returned;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    while (!in_flight_.empty() && in_flight_.front().done->query()) {
      done.push_back(std::move(in_flight_.front()));
      in_flight_.pop_front();
    }
    for (auto& f : fenced_) {
      if (f.completed()) returned.push_back(std::move(f.held));
    }
    std::erase_if(fenced_, [](const Fenced& f) { return f.held == nullptr; });
  }
  // Dropped outside the lock: a host batch's last reference sends its segment back.
}

std::size_t DeviceStage::in_flight() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return in_flight_.size();
}

}  // namespace ferry::device
