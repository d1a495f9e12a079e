#include "workers/worker_output.h"

#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "ipc/output_relay.h"
#include "ipc/signal_safe.h"
#include "workers/forker.h"
#include "workers/worker_status.h"

namespace ferry::workers {

namespace {

// Leaked on purpose, as the forker's state: the thread lives as long as the process. A copy of
// the process made by fork() has no relay thread and starts its own on first use.
std::mutex* g_mutex = nullptr;
std::atomic<ipc::OutputRelay*> g_relay{nullptr};

void reset_in_child() {
  g_mutex = new std::mutex;
  g_relay.store(nullptr);
}

std::mutex& relay_mutex() {
  static const bool installed = [] {
    g_mutex = new std::mutex;
    ::pthread_atfork(nullptr, nullptr, reset_in_child);
    return true;
  }();
  (void)installed;
  return *g_mutex;
}

// On the relay's thread, after a SIGUSR1: the workers report themselves.
void ask_workers_to_report() {
  const std::size_t asked = signal_workers(SIGUSR1);
  ::dprintf(STDERR_FILENO,
            "ferry: SIGUSR1 (pid %d): asked %zu DataLoader worker%s to print where they are\n",
            static_cast<int>(::getpid()), asked, asked == 1 ? "" : "s");
}

void on_sigusr1(int) {
  const int saved_errno = errno;
  request_worker_reports();
  errno = saved_errno;
}

// SIGUSR1 is the application's if it set a handler (or ignores it); otherwise ferry's.
void take_sigusr1_if_default() {
  struct sigaction old {};
  if (::sigaction(SIGUSR1, nullptr, &old) != 0) return;
  if ((old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) return;
  struct sigaction action {};
  action.sa_handler = on_sigusr1;
  action.sa_flags = SA_RESTART;
  ::sigemptyset(&action.sa_mask);
  (void)::sigaction(SIGUSR1, &action, nullptr);
}

ipc::OutputRelay& relay() {
  std::lock_guard<std::mutex> lock(relay_mutex());
  if (ipc::OutputRelay* existing = g_relay.load()) return *existing;
  ipc::OutputRelay::Options options;
  options.on_wake = ask_workers_to_report;
  options.close_fd = [](ipc::UniqueFd fd) { close_parent_only_fd(std::move(fd)); };
  auto* made = new ipc::OutputRelay(std::move(options));  // leaked: lives with the process
  for (const int fd : made->own_fds()) register_parent_only_fd(fd);
  g_relay.store(made);
  take_sigusr1_if_default();
  return *made;
}

// ---- in the worker -------------------------------------------------------------------------

char g_report_prefix[128];
std::size_t g_report_prefix_len = 0;
WorkerStatusPage* g_report_page = nullptr;

struct Text {  // async-signal-safe formatting into a fixed buffer
  char data[1024];
  std::size_t size = 0;
  void add(const char* s, std::size_t n) {
    n = std::min(n, sizeof data - size);
    std::memcpy(data + size, s, n);
    size += n;
  }
  void add(const char* s) { add(s, std::strlen(s)); }
  void add(std::uint64_t v) {
    char digits[24];
    const std::size_t n = ipc::format_decimal(v, digits);
    add(digits + sizeof digits - n, n);
  }
};

void on_report_request(int) {
  const int saved_errno = errno;
  Text text;
  text.add(g_report_prefix, g_report_prefix_len);
  WorkerStatusPage* page = g_report_page;
  if (page == nullptr || page->busy.load(std::memory_order_relaxed) == 0) {
    text.add("waiting for a task");
  } else {
    text.add("epoch ");
    text.add(page->epoch.load(std::memory_order_relaxed));
    text.add(", batch ");
    text.add(page->sequence.load(std::memory_order_relaxed));
    std::size_t shown = 0;
    for (const auto& slot : page->slots) {
      const std::int64_t index = slot.index.load(std::memory_order_relaxed);
      if (index < 0 || shown == 16) continue;
      text.add(shown++ == 0 ? ", loading index " : ", ");
      text.add(static_cast<std::uint64_t>(index));
    }
    if (shown == 0) text.add(", between samples (collating or sending)");
  }
  text.add("; stack of the thread that took the signal:\n");
  (void)!::write(STDERR_FILENO, text.data, text.size);
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, n, STDERR_FILENO);
  errno = saved_errno;
}

}  // namespace

std::uint64_t relay_worker_stderr(ipc::UniqueFd& read_end) { return relay().add(read_end); }

std::vector<std::string> finish_worker_stderr(std::uint64_t key,
                                              std::chrono::steady_clock::time_point deadline) {
  ipc::OutputRelay* r = g_relay.load();
  return r == nullptr ? std::vector<std::string>{} : r->finish(key, deadline);
}

void request_worker_reports() noexcept {
  const int saved_errno = errno;
  if (ipc::OutputRelay* r = g_relay.load()) r->wake();
  errno = saved_errno;
}

void install_worker_report_handler(const char* prefix, WorkerStatusPage* page) noexcept {
  const std::size_t n = std::min(std::strlen(prefix), sizeof g_report_prefix);
  std::memcpy(g_report_prefix, prefix, n);
  g_report_prefix_len = n;
  g_report_page = page;
  void* frame[1];
  (void)::backtrace(frame, 1);  // loads libgcc's unwinder now, not inside the handler
  struct sigaction action {};
  action.sa_handler = on_report_request;
  action.sa_flags = SA_RESTART;
  ::sigemptyset(&action.sa_mask);
  (void)::sigaction(SIGUSR1, &action, nullptr);
}

}  // namespace ferry::workers
