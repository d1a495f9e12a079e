#pragma once

// The test device: an accelerator that LibTorch drives like a GPU, so that the device stage
// (src/device/) is exercised on every CI run, on machines without one (ctest label testdevice).
//
// It is LibTorch's PrivateUse1 device type (the one meant for out-of-tree backends), registered
// from here: a device guard with streams and events, an allocator, copy kernels, views, and
// LibTorch's CPU fallback for every other op. Its memory is host memory. Each stream is a queue
// run by a thread of its own, so work queued on a stream completes later, in order, as a GPU's
// does: a copy from host memory page-locked for it (a range ferry registered, or its own pinned
// allocations) reads that memory when the stream reaches it, after the delay set_copy_delay()
// gives, not when it is issued; a copy from pageable memory is staged at once, as CUDA stages
// it. An event completes when its stream reaches it; a stream that waits on an event runs
// nothing after the wait until then. Device memory is freed only once the streams that used it
// have moved past its last use (the caching allocator's rule), and is filled with 0xA5 when
// handed out, so reading what no copy wrote shows.
//
// It also registers itself with ferry (device/accelerator.h), so `device = privateuseone:N` and
// `pin_memory` without a device use it, and it counts what must not happen: a copy whose
// page-locked source was unlocked or rewritten before the copy ran (the segment went back to its
// worker, or was unmapped, under the copy).

#include <chrono>
#include <cstddef>
#include <cstdint>

#include <torch/types.h>

namespace ferry::testing::test_device {

inline constexpr int kDevices = 2;

// Registers the device with LibTorch and with ferry; later calls do nothing.
void install();

// privateuseone:index.
torch::Device device(int index = 0);

// Host-to-device copies complete this long after their stream reaches them (0 by default).
void set_copy_delay(std::chrono::microseconds delay);

// Queues `duration` of busy work on the calling thread's current stream of `index` (a stand-in
// for kernels: the stream runs nothing else meanwhile; the host does not wait).
void queue_busy(std::chrono::microseconds duration, int index = 0);

// Waits until every stream of every device has run all that was queued on it so far.
void synchronize();

// Whether a CPU tensor lies in memory page-locked for the device.
bool is_pinned(const torch::Tensor& t);

// Bytes of device memory allocated and not yet freed, on `index`.
std::int64_t memory_used(int index = 0);

// Events recorded and not yet destroyed.
std::size_t live_events();

// Host ranges page-locked for the device (ferry's registrations) now.
std::size_t locked_ranges();

// Copies from page-locked memory whose source was unlocked or rewritten between their issue and
// the moment their stream ran them (a segment back with its worker, or unmapped, under a copy);
// each says so on stderr, and one whose source was unlocked writes 0xEE instead of reading it.
std::size_t raced_copies();

}  // namespace ferry::testing::test_device
