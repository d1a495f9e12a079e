#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ferry::ipc {

// A memory cgroup, as the kernel's files for it: cgroup v2 (memory.events, memory.max) or v1's
// memory controller (memory.oom_control, memory.limit_in_bytes). Read-only; every read goes to
// the files, so a count is current.
class MemoryCgroup {
 public:
  // The memory cgroup of this process, or nullopt where none can be read (no cgroup file system
  // mounted, a path outside this mount namespace's view).
  static std::optional<MemoryCgroup> of_self();
  // The cgroup in `directory` (tests).
  MemoryCgroup(std::string directory, bool v2) : dir_(std::move(directory)), v2_(v2) {}

  const std::string& directory() const noexcept { return dir_; }
  bool v2() const noexcept { return v2_; }
  // Processes the OOM killer killed in this cgroup so far ("oom_kill" in memory.events, or in
  // v1's memory.oom_control), or nullopt if the kernel does not count them.
  std::optional<std::uint64_t> oom_kills() const;
  // Its memory limit in bytes, or nullopt when unlimited or unreadable.
  std::optional<std::uint64_t> limit_bytes() const;
  // The file that oom_kills() reads.
  std::string events_file() const;

 private:
  std::string dir_;
  bool v2_ = true;
};

}  // namespace ferry::ipc
