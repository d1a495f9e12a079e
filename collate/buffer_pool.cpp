#include "collate/buffer_pool.h"

#include <cstdlib>
#include <new>

#include "collate/batch_layout.h"

namespace ferry::collate {

BufferPool::~BufferPool() {
  for (auto& [data, capacity] : free_) std::free(data);
}

std::shared_ptr<void> BufferPool::acquire(std::size_t bytes) {
  bytes = std::max<std::size_t>(bytes, kFieldAlignment);
  void* data = nullptr;
  std::size_t capacity = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second >= bytes && (data == nullptr || it->second < capacity)) {
        data = it->first;
        capacity = it->second;
      }
    }
    if (data != nullptr) {
      std::erase_if(free_, [&](const auto& entry) { return entry.first == data; });
    }
  }
  if (data == nullptr) {
    capacity = (bytes + kFieldAlignment - 1) / kFieldAlignment * kFieldAlignment;
    data = std::aligned_alloc(kFieldAlignment, capacity);
    if (data == nullptr) throw std::bad_alloc();
  }
  std::weak_ptr<BufferPool> pool = weak_from_this();
  return std::shared_ptr<void>(data, [pool, capacity](void* p) {
    if (auto alive = pool.lock()) {
      alive->give_back(p, capacity);
    } else {
      std::free(p);
    }
  });
}

void BufferPool::give_back(void* data, std::size_t capacity) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.emplace_back(data, capacity);
  while (free_.size() > keep_free_) {  // drop the smallest beyond what the loop keeps reusing
    auto smallest = free_.begin();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < smallest->second) smallest = it;
    }
    std::free(smallest->first);
    free_.erase(smallest);
  }
}

}  // namespace ferry::collate
