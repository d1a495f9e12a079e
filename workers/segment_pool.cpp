#include "workers/segment_pool.h"

#include <algorithm>
#include <string>

namespace ferry::workers {

namespace {
constexpr std::size_t kPageBytes = 4096;
}

SegmentPool::Lease SegmentPool::acquire(std::size_t bytes) {
  Segment* best = nullptr;
  for (auto& s : segments_) {
    if (!s.in_use && s.mapping.size() >= bytes &&
        (best == nullptr || s.mapping.size() < best->mapping.size())) {
      best = &s;
    }
  }
  if (best == nullptr) {
    const std::size_t capacity =
        std::max(kPageBytes, (bytes + kPageBytes - 1) / kPageBytes * kPageBytes);
    const std::string name = "ferry-w" + std::to_string(worker_id_);
    ipc::SharedMemory memory = ipc::SharedMemory::create(capacity, name.c_str());
    Segment segment;
    segment.id = (static_cast<std::uint64_t>(worker_id_) << 40) | next_id_++;
    segment.mapping = ipc::MappedRegion::map_shared(memory.fd(), capacity, false);
    segment.fd = memory.release_fd();
    segments_.push_back(std::move(segment));
    best = &segments_.back();
  }
  best->in_use = true;
  return Lease{best->id, best->mapping.data(), best->mapping.size(), best->fd.get()};
}

void SegmentPool::sent(std::uint64_t id) {
  for (auto& s : segments_) {
    if (s.id == id) s.fd.reset();
  }
}

void SegmentPool::release(std::uint64_t id) {
  for (auto& s : segments_) {
    if (s.id == id) s.in_use = false;
  }
  retire_extra_free();
}

void SegmentPool::retire_extra_free() {
  for (;;) {
    std::size_t free_count = 0;
    auto smallest = segments_.end();
    for (auto it = segments_.begin(); it != segments_.end(); ++it) {
      if (it->in_use || it->fd.valid()) continue;  // an unsent segment stays: main lacks its fd
      ++free_count;
      if (smallest == segments_.end() || it->mapping.size() < smallest->mapping.size())
        smallest = it;
    }
    if (free_count <= keep_free_) return;
    retired_.push_back(smallest->id);
    segments_.erase(smallest);
  }
}

std::vector<std::uint64_t> SegmentPool::take_retired() { return std::exchange(retired_, {}); }

}  // namespace ferry::workers
