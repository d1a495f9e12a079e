#include "ipc/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>

#include "ferry/error.h"

namespace ferry::ipc {

namespace {

std::atomic<int> g_fail_count{0};
std::atomic<int> g_fail_error{ENOSPC};
std::atomic<bool> g_no_memfd{false};

std::uint64_t free_shm_bytes() {
  struct statvfs st {};
  if (::statvfs("/dev/shm", &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
}

}  // namespace

void fault::pretend_memfd_is_missing(bool missing) { g_no_memfd = missing; }

void fault::fail_next_allocations(int count, int error) {
  g_fail_error = error;
  g_fail_count = count;
}

std::string format_bytes(std::uint64_t bytes) {
  char text[32];
  if (bytes >= (1ULL << 30)) {
    std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1ULL << 30));
  } else if (bytes >= (1ULL << 20)) {
    std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1ULL << 20));
  } else if (bytes >= 1024) {
    std::snprintf(text, sizeof text, "%.1f KiB", static_cast<double>(bytes) / 1024);
  } else {
    std::snprintf(text, sizeof text, "%llu bytes", static_cast<unsigned long long>(bytes));
  }
  return text;
}

MappedRegion::MappedRegion(MappedRegion&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedRegion& MappedRegion::operator=(MappedRegion&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedRegion::reset() noexcept {
  if (data_ != nullptr) (void)::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

MappedRegion MappedRegion::map_shared(int fd, std::size_t size, bool private_to_this_process) {
  if (size == 0) return {};
  void* data = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (data == MAP_FAILED) {
    throw std::system_error(errno, std::generic_category(),
                            "mmap of a " + format_bytes(size) + " shared-memory segment");
  }
  if (private_to_this_process) (void)::madvise(data, size, MADV_DONTFORK);
  return MappedRegion(data, size);
}

SharedMemory SharedMemory::create(std::size_t size, const char* name) {
  UniqueFd fd;
  if (g_no_memfd) {
    errno = ENOSYS;
  } else {
    fd.reset(::memfd_create(name, MFD_CLOEXEC));
  }
  if (!fd && (errno == ENOSYS || errno == EINVAL)) {
    // No memfd: a POSIX shm object with a unique name, unlinked at once.
    static std::atomic<unsigned> counter{0};
    char shm_name[96];
    std::snprintf(shm_name, sizeof shm_name, "/ferry-%d-%u-%s", static_cast<int>(::getpid()),
                  counter++, name);
    fd.reset(::shm_open(shm_name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (fd) ::shm_unlink(shm_name);
  }
  if (!fd) {
    throw std::system_error(errno, std::generic_category(),
                            "memfd_create(" + std::string(name) + ")");
  }
  if (size > 0) {
    int error = 0;
    if (g_fail_count.load() > 0 && g_fail_count.fetch_sub(1) > 0) {
      error = g_fail_error.load();
    } else {
      // Reserve every page now: a full tmpfs fails here, not with SIGBUS on first write.
      error = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(size));
    }
    if (error == ENOSPC || error == ENOMEM) {
      throw SharedMemoryError(detail::str(
          "cannot reserve ", format_bytes(size), " (", size,
          " bytes) of shared memory for a batch: ", std::strerror(error), "; ",
          format_bytes(free_shm_bytes()),
          " free in /dev/shm. Make room (a container needs a larger --shm-size), or lower "
          "batch_size, prefetch_factor or num_workers"));
    }
    if (error != 0) {
      throw std::system_error(error, std::generic_category(),
                              "fallocate of a " + format_bytes(size) + " shared-memory segment");
    }
  }
  return SharedMemory(std::move(fd), size);
}

}  // namespace ferry::ipc
