#include "ipc/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
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

// The first line of a small text file, or empty.
std::string read_line(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "re");
  if (f == nullptr) return {};
  char line[256] = {};
  const bool got = std::fgets(line, sizeof line, f) != nullptr;
  std::fclose(f);
  if (!got) return {};
  std::string out(line);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// Where a memfd's pages are counted: this process's memory cgroup (v2, or v1's memory
// controller), if it has a limit, and the memory the kernel reports available.
std::string memory_room() {
  std::string out;
  std::FILE* groups = std::fopen("/proc/self/cgroup", "re");
  std::string dir, max_file, current_file;
  if (groups != nullptr) {
    char line[512];
    while (std::fgets(line, sizeof line, groups) != nullptr) {
      std::string entry(line);
      while (!entry.empty() && entry.back() == '\n') entry.pop_back();
      if (entry.rfind("0::", 0) == 0 && dir.empty()) {  // v2: "0::/path"
        dir = "/sys/fs/cgroup" + entry.substr(3);
        max_file = "/memory.max";
        current_file = "/memory.current";
      } else if (const auto at = entry.find(":memory:"); at != std::string::npos) {  // v1
        dir = "/sys/fs/cgroup/memory" + entry.substr(at + 8);
        max_file = "/memory.limit_in_bytes";
        current_file = "/memory.usage_in_bytes";
        break;
      }
    }
    std::fclose(groups);
  }
  if (!dir.empty()) {
    const std::string max = read_line(dir + max_file);
    const std::string current = read_line(dir + current_file);
    // v1 says "no limit" with a huge number; v2 with "max".
    if (!max.empty() && max != "max" && max.size() < 19 && !current.empty()) {
      out = detail::str("this process's memory cgroup (", dir, ") uses ",
                        format_bytes(std::stoull(current)), " of its ",
                        format_bytes(std::stoull(max)), " limit; ");
    }
  }
  std::FILE* f = std::fopen("/proc/meminfo", "re");
  if (f != nullptr) {
    char line[256];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      unsigned long long kib = 0;
      if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
        out += format_bytes(kib * 1024) + " of memory available";
        break;
      }
    }
    std::fclose(f);
  }
  return out;
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

std::size_t measure_received_segment(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    throw std::system_error(errno, std::generic_category(), "fstat of a received segment");
  }
  if (!S_ISREG(st.st_mode)) throw Error("a received segment is not a shared-memory file");
  const int seals = ::fcntl(fd, F_GET_SEALS);
  // EINVAL: not a memfd (a POSIX shm object, which cannot be sealed); its size is taken as is.
  if (seals >= 0 && (seals & F_SEAL_SHRINK) == 0) {
    throw Error("a received memfd segment is not sealed against shrinking");
  }
  return static_cast<std::size_t>(st.st_size);
}

namespace {

// A memfd, or where there is none a POSIX shm object with a unique name, unlinked at once.
UniqueFd open_anonymous(const char* name, bool& memfd) {
  UniqueFd fd;
  if (g_no_memfd) {
    errno = ENOSYS;
  } else {
    fd.reset(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  }
  memfd = fd.valid();
  if (!fd && (errno == ENOSYS || errno == EINVAL)) {
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
  return fd;
}

}  // namespace

SharedMemory SharedMemory::create_page(std::size_t size, const char* name) {
  bool memfd = false;
  UniqueFd fd = open_anonymous(name, memfd);
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    throw std::system_error(errno, std::generic_category(),
                            "ftruncate of a " + format_bytes(size) + " shared page");
  }
  if (memfd && ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    throw std::system_error(errno, std::generic_category(),
                            "sealing a shared page (fcntl F_ADD_SEALS)");
  }
  return SharedMemory(std::move(fd), size);
}

SharedMemory SharedMemory::create(std::size_t size, const char* name) {
  bool memfd = false;
  UniqueFd fd = open_anonymous(name, memfd);
  if (size > 0) {
    int error = 0;
    if (g_fail_count.load() > 0 && g_fail_count.fetch_sub(1) > 0) {
      error = g_fail_error.load();
    } else {
      // Reserve every page now: a full tmpfs fails here, not with SIGBUS on first write.
      do {
        error = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(size));
      } while (error == EINTR);  // a signal with a handler, mid-reservation
    }
    if (error == ENOSPC || error == ENOMEM) {
      // memfd pages count against the memory cgroup and the machine's memory, not /dev/shm's
      // size; the fallback's shm object against /dev/shm.
      throw SharedMemoryError(detail::str(
          "cannot reserve ", format_bytes(size), " (", size, " bytes) of shared memory (",
          memfd ? "a memfd" : "a POSIX shm object in /dev/shm", "): ", std::strerror(error), "; ",
          memfd ? memory_room()
                : format_bytes(free_shm_bytes()) + " free in /dev/shm (a container's --shm-size)"));
    }
    if (error != 0) {
      throw std::system_error(error, std::generic_category(),
                              "fallocate of a " + format_bytes(size) + " shared-memory segment");
    }
  }
  // Its size is final: a process that maps it may trust that size.
  if (memfd && ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    throw std::system_error(errno, std::generic_category(),
                            "sealing a shared-memory segment (fcntl F_ADD_SEALS)");
  }
  return SharedMemory(std::move(fd), size);
}

}  // namespace ferry::ipc
