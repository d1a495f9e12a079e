#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ipc/shared_memory.h"

namespace ferry::workers {

// A worker's shared-memory segments: one per batch in flight or held by the training loop.
// A batch takes a free segment that is large enough (the smallest such) or a fresh one; the
// main process sends the segment back (recycle) when the last tensor of its batch dies. A
// segment's descriptor travels to the main process once and is then closed here, so neither
// side holds a descriptor per segment: the number of descriptors stays fixed however many
// batches run (pytorch#973, #11201). Free segments beyond `keep_free` are retired (unmapped),
// smallest first, and the main process is told so it unmaps them too.
class SegmentPool {
 public:
  SegmentPool(std::size_t worker_id, std::size_t keep_free)
      : worker_id_(worker_id), keep_free_(keep_free) {}

  struct Lease {
    std::uint64_t id = 0;
    std::byte* data = nullptr;
    std::size_t size = 0;
    int fd_to_send = -1;  // the segment's fd, the first time only; else -1
  };
  // Throws ferry::SharedMemoryError when the memory cannot be reserved.
  Lease acquire(std::size_t bytes);
  // Call once the lease's fd (if any) has been sent: closes it here.
  void sent(std::uint64_t id);
  // The main process returned the segment. Unknown ids are ignored (a retired segment).
  void release(std::uint64_t id);
  std::vector<std::uint64_t> take_retired();
  std::size_t size() const noexcept { return segments_.size(); }

 private:
  struct Segment {
    std::uint64_t id = 0;
    ipc::UniqueFd fd;  // until sent to the main process
    ipc::MappedRegion mapping;
    bool in_use = false;
  };
  void retire_extra_free();

  std::size_t worker_id_;
  std::size_t keep_free_;
  std::uint64_t next_id_ = 0;
  std::vector<Segment> segments_;
  std::vector<std::uint64_t> retired_;
};

}  // namespace ferry::workers
