#include "ipc/child_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

namespace ferry::ipc {

namespace {

ExitStatus from_wait_status(int status) {
  ExitStatus out;
  if (WIFEXITED(status)) {
    out.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    out.signal = WTERMSIG(status);
    out.core_dumped = WCOREDUMP(status);
  }
  return out;
}

}  // namespace

const char* signal_abbrev(int signal) noexcept {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  return ::sigabbrev_np(signal);
#else
  (void)signal;
  return nullptr;
#endif
}

std::string signal_name(int signal) {
  if (const char* abbrev = signal_abbrev(signal)) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(signal);
}

std::string ExitStatus::describe() const {
  if (signal != 0) {
    return "was killed by signal " + signal_name(signal) + " (" + ::strsignal(signal) + ")" +
           (core_dumped ? ", core dumped" : "");
  }
  return "exited with code " + std::to_string(exit_code);
}

ChildProcess::ChildProcess(pid_t pid) : pid_(pid) {
#ifdef SYS_pidfd_open
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd >= 0) {
    pidfd_.reset(static_cast<int>(fd));
    // pidfds are created close-on-exec by the kernel.
  }
#endif
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      pidfd_(std::move(other.pidfd_)),
      status_(std::move(other.status_)),
      killed_by_terminate_(other.killed_by_terminate_) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    terminate(std::chrono::milliseconds(0));
    pid_ = std::exchange(other.pid_, -1);
    pidfd_ = std::move(other.pidfd_);
    status_ = std::move(other.status_);
    killed_by_terminate_ = other.killed_by_terminate_;
  }
  return *this;
}

std::optional<ExitStatus> ChildProcess::try_wait() noexcept {
  if (status_ || pid_ <= 0) return status_;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    status_ = from_wait_status(status);
  } else if (r < 0 && errno == ECHILD) {
    // The application reaps children itself (SIGCHLD ignored): the status is gone.
    status_ = ExitStatus{};
  }
  return status_;
}

void ChildProcess::kill(int signal) noexcept {
  if (pid_ > 0 && !status_) (void)::kill(pid_, signal);
}

ExitStatus ChildProcess::terminate(std::chrono::milliseconds grace) noexcept {
  if (pid_ <= 0) return status_.value_or(ExitStatus{});
  if (try_wait()) return *status_;
  if (grace.count() > 0) {
    const auto deadline = std::chrono::steady_clock::now() + grace;
    while (!try_wait() && std::chrono::steady_clock::now() < deadline) {
      if (pidfd_) {
        pollfd p{pidfd_.get(), POLLIN, 0};
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        (void)::poll(&p, 1, static_cast<int>(std::max<long long>(0, left.count())));
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
    if (status_) return *status_;
  }
  killed_by_terminate_ = true;
  (void)::kill(pid_, SIGKILL);  // works on stopped processes too
  // Dies at once, unless in uninterruptible sleep (a hung NFS read, a GPU driver call).
  const auto deadline = std::chrono::steady_clock::now() + kKillWait;
  while (!try_wait() && std::chrono::steady_clock::now() < deadline) {
    if (pidfd_) {
      pollfd p{pidfd_.get(), POLLIN, 0};
      (void)::poll(&p, 1, 50);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  if (status_) return *status_;
  std::fprintf(stderr,
               "ferry: process %d did not end within %.0f s of SIGKILL (uninterruptible sleep?); "
               "not waiting for it any longer, it stays a zombie until this process exits\n",
               static_cast<int>(pid_), static_cast<double>(kKillWait.count()) / 1000.0);
  status_ = ExitStatus{};
  status_->signal = SIGKILL;
  return *status_;
}

}  // namespace ferry::ipc
