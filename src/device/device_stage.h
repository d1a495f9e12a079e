#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/types.h>

#include "ferry/batch.h"
#include "ferry/device_transforms.h"

#include "device/accelerator.h"

namespace ferry::device {

// A batch on its way to the training loop: its tensors on the loader's device, and on an
// accelerator the event that its copy and device transforms end with.
struct StagedBatch {
  Batch batch;
  std::shared_ptr<c10::Event> ready;  // null: nothing to wait for
};

// A range of host memory (a worker's shared-memory segment as the main process maps it) that the
// device stage may page-lock in the background. Its owner keeps the memory mapped for as long as
// this object lives, and destroys it (which unlocks) before unmapping.
class LockableRange {
 public:
  LockableRange(void* data, std::size_t size) noexcept : data_(data), size_(size) {}
  LockableRange(const LockableRange&) = delete;
  LockableRange& operator=(const LockableRange&) = delete;
  // True once the range is page-locked: copies from it need no staging. Any thread.
  bool locked() const noexcept { return locked_.load(std::memory_order_acquire); }

 private:
  friend class DeviceStage;
  void* data_;
  std::size_t size_;
  HostRegistration registration_;  // written by the stage's locking thread, before locked_
  std::atomic<bool> locked_{false};
  bool requested_ = false;  // the iterating thread's: asked once
};

// The device stage (DESIGN.md): between the loader, which assembles host batches, and the
// training loop. With pin_memory or an accelerator device it page-locks recycled shared-memory
// segments. With an accelerator device (CUDA, or a PrivateUse1 backend that registered its
// Accelerator) it copies batches there on one long-lived side stream as soon as they arrive,
// runs the device transforms there, and hands each batch over with an event that the loop's
// stream waits on. With pin_memory alone it hands over batches pinned in place and keeps their
// segments, once dropped, until the device work queued before the drop has completed. It knows
// tensors and accelerators (through LibTorch's device-generic streams and events, and
// accelerator.h for the rest: CUDA's driver loaded at run time), nothing of workers.
//
// Not thread-safe except where noted: the loader calls it from the iterating thread.
class DeviceStage {
 public:
  // `device` unset or the CPU: no copy. Throws ConfigError when pin_memory or an accelerator
  // device is asked of a LibTorch or a machine without one (CUDA: a CPU-only LibTorch, no GPU).
  DeviceStage(std::optional<torch::Device> device, bool pin_memory, BatchTransforms transforms);
  // Waits for the copies in flight and the work queued before fenced segments were dropped (at
  // most 30 s; past that their host memory is kept, not freed), then lets them go.
  ~DeviceStage();
  DeviceStage(const DeviceStage&) = delete;
  DeviceStage& operator=(const DeviceStage&) = delete;

  // Whether the loader should page-lock the shared-memory segments it maps: with pin_memory or an
  // accelerator device. Batches in page-locked segments are pinned without a copy.
  bool page_locks_segments() const noexcept { return guard_.has_value(); }
  // pin_memory without a device: host batches reach the loop in page-locked shared memory, and
  // the loop may queue non_blocking copies from them that the stage cannot see. A segment such a
  // batch held must go back to its worker only after that work: see return_after_queued_work.
  bool fences_returns() const noexcept { return pin_ && !device_; }
  // The accelerator and its device that segments are page-locked for (with pin_memory or a
  // device); accelerator() only then.
  const Accelerator& accelerator() const noexcept { return *accelerator_; }
  int device_index() const noexcept { return device_index_; }
  // Takes `held` (whose destruction sends a segment back to its worker) and keeps it until the
  // GPU work queued so far on the calling thread's current streams has completed: one event on
  // the current stream of each device in use (the loader's and any other with an active
  // context). The loop's own non_blocking copies from a batch are queued there before it drops
  // the batch, if made on the current stream. Any thread; never blocks on the GPU. Returns false,
  // leaving `held` alone, if the events cannot be recorded.
  bool return_after_queued_work(std::shared_ptr<void>& held) noexcept;
  // The same on the calling thread, for when no stage is left (the loader is gone but the loop
  // still held a batch) or return_after_queued_work failed: waits (at most 30 s) for the work
  // queued so far on its current streams. False if that could not be known: the caller must then
  // keep the memory rather than free it under a copy.
  static bool wait_for_queued_work(const Accelerator& accelerator, int device_index) noexcept;
  // Asks for `range` to be page-locked, once, on the stage's own thread (about 50 ms for 38.5 MB,
  // which the training loop must not wait for); until then its batches take a pinned copy. The
  // pointer keeps the memory alive while the request waits (an aliasing shared_ptr to its owner).
  // If the driver refuses, warns once: that range's batches keep taking a pinned copy.
  void page_lock_later(std::shared_ptr<LockableRange> range);

  // Starts `host` on its way. On an accelerator its copy (straight from `host` when it lies in
  // page-locked memory, `page_locked`, else from a pinned copy) and the device transforms are
  // issued on the stage's stream now, and `host` is kept until they have completed, so its
  // shared memory cannot be recycled under the copy. Without a device, the transforms run here,
  // then pin_memory keeps `host` where it is when `page_locked` (the loader fences its
  // segment's return), else makes a pinned copy. Throws ferry::Error naming the batch (and the
  // transform) if a copy or transform fails.
  StagedBatch start(Batch host, bool page_locked);
  // Hands a started batch to the training loop, on the calling thread: the thread's current
  // stream waits for the batch's event, and its device tensors are recorded on that stream, so
  // LibTorch's caching allocator does not reuse their memory while the loop's work is queued.
  Batch finish(StagedBatch staged) const;
  // Lets go of host batches whose copies have completed, and of segments held for the loop's
  // queued work that has completed (their segments return to the workers).
  void release_completed();
  // Host batches whose copies are still in flight (tests).
  std::size_t in_flight() const;

 private:
  void run_transforms(Batch& batch) const;  // errors name the transform and the batch
  struct InFlight {
    std::shared_ptr<c10::Event> done;
    Batch host;
  };
  std::optional<torch::Device> device_;  // an accelerator device with its index, or unset
  bool pin_ = false;                     // without a device: host batches in pinned memory
  const Accelerator* accelerator_ = nullptr;  // with pin_memory or a device
  int device_index_ = 0;                      // its device that segments are page-locked for
  BatchTransforms transforms_;
  std::optional<c10::impl::VirtualGuardImpl> guard_;  // the accelerator's, with accelerator_
  std::optional<c10::Stream> stream_;                 // the copy stream
  mutable std::mutex mutex_;
  std::deque<InFlight> in_flight_;  // in stream order, so completion is in order too
  struct Fenced {
    std::vector<c10::Event> done;  // one per device in use
    std::shared_ptr<void> held;
    bool completed() const;
  };
  std::vector<Fenced> fenced_;  // return_after_queued_work's; on any streams, so in no order
  Batch pinned(Batch batch, bool copy_all) const;  // CPU tensors pinned for accelerator_

  // The page-locking thread, started at the first request, and its queue.
  void lock_ranges() noexcept;
  std::mutex lock_mutex_;
  std::condition_variable lock_wake_;
  std::deque<std::shared_ptr<LockableRange>> lock_queue_;
  bool lock_stop_ = false;
  std::thread locker_;  // last: joined in the destructor before anything else goes
};

namespace fault {
// Tests: `work` runs on the copy stream (it is current) before each batch's copy, so a test can
// hold copies in flight for as long as it likes (a chain of GPU matmuls, or the test device's
// busy work). Empty: none.
void set_before_copy(std::function<void()> work);
}  // namespace fault

}  // namespace ferry::device
