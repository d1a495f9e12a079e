#pragma once

// Files read in place: mapped read-only and shared, so that pages come in as they are touched
// (a 200 GB token file costs nothing to open) and every process that maps the file shares the
// page cache's one copy. Nothing here knows tensors.

#include <cstddef>
#include <filesystem>
#include <string>

namespace ferry::ipc {

/// A whole file mapped read-only (MAP_SHARED, PROT_READ) at the size it had when it was opened.
/// Move-only; unmaps on destruction. While it lives it is on a process-wide list, so that a
/// fatal SIGBUS in it (the file was truncated after it was mapped) can be reported with the
/// file's name and the offset (describe_fault). An empty file maps to nothing (data() null).
class MappedFile {
 public:
  MappedFile() = default;
  /// Throws std::system_error naming the path and the call that failed.
  static MappedFile open(const std::filesystem::path& path);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() { reset(); }

  const std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  const std::string& path() const noexcept { return path_; }
  void reset() noexcept;

 private:
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::string path_;
  int slot_ = -1;  // on the list of mapped files
};

/// Async-signal-safe: if `address` lies in a MappedFile of this process, writes
/// " reading FILE at offset N (the file is shorter than when it was mapped: truncated or
/// replaced while in use)" to `fd` (for a SIGBUS), or with `segv` " writing to the read-only
/// mapping of FILE at offset N (...)", and returns true; otherwise writes nothing.
bool describe_fault(const void* address, int fd, bool segv = false) noexcept;

}  // namespace ferry::ipc
