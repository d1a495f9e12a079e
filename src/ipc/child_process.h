#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>

#include "ipc/unique_fd.h"

namespace ferry::ipc {

/// How a child process ended.
struct ExitStatus {
  int exit_code = -1;  ///< -1 if a signal ended it
  int signal = 0;      ///< 0 if it exited
  bool core_dumped = false;
  /// "exited with code 3", "was killed by signal SIGSEGV (Segmentation fault)".
  std::string describe() const;
};

/// "SIGKILL" for 9.
std::string signal_name(int signal);
/// "KILL" for SIGKILL, or nullptr when unknown or on a glibc without sigabbrev_np (< 2.32).
/// Async-signal-safe (no allocation): for crash handlers.
const char* signal_abbrev(int signal) noexcept;

/// Owns a child process: its pid, a pidfd where the kernel has one (readable once the child
/// exits, so a death is an event, not a poll), and the duty to reap it. The destructor kills a
/// child still running (SIGKILL) and reaps it, so no zombie outlives its owner. Move-only.
class ChildProcess {
 public:
  ChildProcess() = default;
  explicit ChildProcess(pid_t pid);
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() { terminate(std::chrono::milliseconds(0)); }

  pid_t pid() const noexcept { return pid_; }
  /// -1 where pidfd_open is missing; then death shows as a hang-up of the child's channel.
  int pidfd() const noexcept { return pidfd_.get(); }
  bool reaped() const noexcept { return status_.has_value(); }

  /// Reaps the child if it has exited; its status, or nullopt while it runs.
  std::optional<ExitStatus> try_wait() noexcept;
  /// Waits up to `grace` for the child to exit on its own, then SIGKILLs it and reaps it,
  /// waiting at most kKillWait for the kernel to end it (a child in uninterruptible sleep can
  /// outlast a SIGKILL: it is then left unreaped, and said so on stderr, rather than hang the
  /// caller). Returns how it ended. noexcept: failures are logged.
  ExitStatus terminate(std::chrono::milliseconds grace) noexcept;
  static constexpr std::chrono::milliseconds kKillWait{5000};
  /// The pidfd, now the caller's (to close it when it is registered elsewhere); -1 if none.
  UniqueFd take_pidfd() noexcept { return std::move(pidfd_); }
  void kill(int signal) noexcept;
  /// The status of a reaped child.
  const std::optional<ExitStatus>& status() const noexcept { return status_; }
  /// True if terminate() had to SIGKILL the child because it had not exited within the grace.
  bool killed_by_terminate() const noexcept { return killed_by_terminate_; }

 private:
  pid_t pid_ = -1;
  UniqueFd pidfd_;
  std::optional<ExitStatus> status_;
  bool killed_by_terminate_ = false;
};

}  // namespace ferry::ipc
