#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ipc/unique_fd.h"

namespace ferry::ipc {

/// Owns one mmap()ed region and unmaps it on destruction. Move-only.
class MappedRegion {
 public:
  MappedRegion() = default;
  MappedRegion(void* data, std::size_t size) noexcept : data_(data), size_(size) {}
  MappedRegion(MappedRegion&& other) noexcept;
  MappedRegion& operator=(MappedRegion&& other) noexcept;
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  ~MappedRegion() { reset(); }

  /// Maps `size` bytes of `fd` shared and read-write, pre-faulting the pages (MAP_POPULATE), which
  /// costs far less than faulting them one by one on first touch. With `private_to_this_process`,
  /// forked children do not inherit the mapping (MADV_DONTFORK). Throws std::system_error.
  static MappedRegion map_shared(int fd, std::size_t size, bool private_to_this_process);

  std::byte* data() const noexcept { return static_cast<std::byte*>(data_); }
  std::size_t size() const noexcept { return size_; }
  void reset() noexcept;

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

/// An anonymous shared-memory segment: a memfd (close-on-exec) whose size is reserved with
/// fallocate before anyone writes, so a full machine is a `ferry::SharedMemoryError` naming the
/// bytes asked for and the room left, never a SIGBUS, and then sealed against shrinking and
/// growing, so a process that maps it at its size can trust that size for good. Where
/// memfd_create is missing, a POSIX shm object with a unique name, unlinked at once (it cannot
/// be sealed). Either way nothing is left in /dev/shm after a crash.
class SharedMemory {
 public:
  SharedMemory() = default;
  static SharedMemory create(std::size_t size, const char* name);
  /// A small region for bookkeeping (not a batch), sized with ftruncate and sealed the same way;
  /// fail_next_allocations() does not apply to it.
  static SharedMemory create_page(std::size_t size, const char* name);

  int fd() const noexcept { return fd_.get(); }
  std::size_t size() const noexcept { return size_; }
  UniqueFd release_fd() noexcept { return std::move(fd_); }

 private:
  SharedMemory(UniqueFd fd, std::size_t size) : fd_(std::move(fd)), size_(size) {}
  UniqueFd fd_;
  std::size_t size_ = 0;
};

/// The size of a segment received from another process, measured here (fstat), for mapping it
/// at no more than its real size. Throws ferry::Error if it is not a regular file, or if it is a
/// memfd that is not sealed against shrinking (the sender could cut it short under the mapping,
/// and reading there would be a SIGBUS); std::system_error if fstat fails.
std::size_t measure_received_segment(int fd);

namespace fault {
/// Test hook: the next `count` SharedMemory::create calls in this process (and in processes
/// forked from it afterwards) fail as if fallocate returned `error` (ENOSPC by default).
void fail_next_allocations(int count, int error = 28 /* ENOSPC */);
/// Test hook: behave as if memfd_create did not exist (the shm_open fallback).
void pretend_memfd_is_missing(bool missing);
}  // namespace fault

/// "38.5 MB", "512 KiB": sizes for messages.
std::string format_bytes(std::uint64_t bytes);

}  // namespace ferry::ipc
