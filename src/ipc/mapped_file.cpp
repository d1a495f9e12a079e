#include "ipc/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <system_error>
#include <utility>

#include "ipc/signal_safe.h"
#include "ipc/unique_fd.h"

namespace ferry::ipc {

namespace {

// The mapped files of this process, for the fatal-signal handler: fixed slots it can read without
// a lock (a slot's path is set before its range is published, and the range is withdrawn before
// the path goes).
struct Slot {
  std::atomic<std::uintptr_t> begin{0};
  std::atomic<std::uintptr_t> end{0};
  std::atomic<const char*> path{nullptr};
};
constexpr std::size_t kSlots = 1024;
std::array<Slot, kSlots> g_slots;
std::mutex g_slots_mutex;  // for claiming and freeing slots (not for the handler)

int claim_slot(const std::byte* data, std::size_t size, const char* path) noexcept {
  const std::lock_guard<std::mutex> lock(g_slots_mutex);
  for (std::size_t i = 0; i < kSlots; ++i) {
    if (g_slots[i].path.load(std::memory_order_relaxed) != nullptr) continue;
    g_slots[i].path.store(path, std::memory_order_relaxed);
    g_slots[i].end.store(reinterpret_cast<std::uintptr_t>(data) + size, std::memory_order_relaxed);
    g_slots[i].begin.store(reinterpret_cast<std::uintptr_t>(data), std::memory_order_release);
    return static_cast<int>(i);
  }
  return -1;  // more files than slots: still mapped, only not described on a fault
}

void free_slot(int slot) noexcept {
  if (slot < 0) return;
  const std::lock_guard<std::mutex> lock(g_slots_mutex);
  Slot& s = g_slots[static_cast<std::size_t>(slot)];
  s.begin.store(0, std::memory_order_release);
  s.end.store(0, std::memory_order_relaxed);
  s.path.store(nullptr, std::memory_order_release);
}

}  // namespace

MappedFile MappedFile::open(const std::filesystem::path& path) {
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) throw std::system_error(errno, std::generic_category(), "open(" + path.string() + ")");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw std::system_error(errno, std::generic_category(), "fstat(" + path.string() + ")");
  }
  MappedFile file;
  file.path_ = path.string();
  file.size_ = static_cast<std::size_t>(st.st_size);
  if (file.size_ == 0) return file;
  void* data = ::mmap(nullptr, file.size_, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (data == MAP_FAILED) {
    throw std::system_error(errno, std::generic_category(), "mmap(" + path.string() + ")");
  }
  file.data_ = static_cast<const std::byte*>(data);
  file.slot_ = claim_slot(file.data_, file.size_, file.path_.c_str());
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      path_(std::move(other.path_)),
      slot_(std::exchange(other.slot_, -1)) {
  // The slot's path points into the string's buffer, which a move may relocate (a short path is
  // stored inside the object): publish it again.
  if (slot_ >= 0) {
    g_slots[static_cast<std::size_t>(slot_)].path.store(path_.c_str(), std::memory_order_release);
  }
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
    slot_ = std::exchange(other.slot_, -1);
    if (slot_ >= 0) {
      g_slots[static_cast<std::size_t>(slot_)].path.store(path_.c_str(), std::memory_order_release);
    }
  }
  return *this;
}

void MappedFile::reset() noexcept {
  free_slot(std::exchange(slot_, -1));
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

bool describe_fault(const void* address, int fd, bool segv) noexcept {
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  for (const Slot& s : g_slots) {
    const std::uintptr_t begin = s.begin.load(std::memory_order_acquire);
    if (begin == 0 || at < begin || at >= s.end.load(std::memory_order_relaxed)) continue;
    const char* path = s.path.load(std::memory_order_acquire);
    if (path == nullptr) continue;
    if (segv) {  // a read-only mapping written to (a view of the file changed in place)
      write_text(fd, " writing to the read-only mapping of ");
      write_text(fd, path);
      write_text(fd, " at offset ");
      write_decimal(fd, at - begin);
      write_text(fd, " (samples that view a mapped file are read-only: clone() one to change it)");
      return true;
    }
    write_text(fd, " reading ");
    write_text(fd, path);
    write_text(fd, " at offset ");
    write_decimal(fd, at - begin);
    write_text(fd,
               " (the file is shorter than when it was mapped: truncated or replaced while in "
               "use)");
    return true;
  }
  return false;
}

}  // namespace ferry::ipc
