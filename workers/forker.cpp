#include "workers/forker.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio_ext.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <exception>
#include <future>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>

namespace ferry::workers {

namespace {

// Leaked on purpose: usable until the very end of the process. A process forked by the
// application (not by ferry) gets a fresh mutex and no forker thread (threads do not survive
// fork), so it starts its own forker on first use instead of waiting on one that is not there.
std::mutex* g_registry_mutex = nullptr;
class Forker;
Forker* g_forker = nullptr;

void after_fork_in_child() {
  g_registry_mutex = new std::mutex;
  g_forker = nullptr;
}

std::mutex& registry_mutex() {
  static const bool installed = [] {
    g_registry_mutex = new std::mutex;
    ::pthread_atfork(nullptr, nullptr, after_fork_in_child);
    return true;
  }();
  (void)installed;
  return *g_registry_mutex;
}
std::set<int>& registry() {
  static auto* s = new std::set<int>;
  return *s;
}
std::set<int>& worker_pidfds() {  // a subset of registry()
  static auto* s = new std::set<int>;
  return *s;
}

struct ForkRequest {
  std::function<pid_t()> start;  // set: run this instead of forking
  std::function<void()> child_main;
  std::vector<ipc::UniqueFd> close_after_fork;
  std::promise<pid_t> result;
};

class Forker {
 public:
  static Forker& instance() {
    static std::mutex creation;
    (void)registry_mutex();  // installs the fork handler first
    std::lock_guard<std::mutex> lock(creation);
    if (g_forker == nullptr) g_forker = new Forker;  // leaked: its thread lives with the process
    return *g_forker;
  }

  pid_t fork(std::function<void()> child_main, std::vector<ipc::UniqueFd> close_after_fork) {
    return submit(ForkRequest{{}, std::move(child_main), std::move(close_after_fork), {}});
  }
  pid_t start(std::function<pid_t()> start) {
    return submit(ForkRequest{std::move(start), {}, {}, {}});
  }

 private:
  pid_t submit(ForkRequest request) {
    auto future = request.result.get_future();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(&request);
    }
    cv_.notify_one();
    return future.get();
  }

  Forker() : thread_([this] { run(); }) { thread_.detach(); }

  void run() {
    // No signal is handled on this thread, and a child forked here starts with every signal
    // blocked, so a Ctrl-C to the process group between its fork and its set-up (SIGINT
    // ignored) stays pending and is dropped, never killing a half-made worker. The worker
    // unblocks them at the end of prepare_worker_process.
    sigset_t all;
    ::sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
    for (;;) {
      ForkRequest* request;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        request = queue_.front();
        queue_.pop_front();
      }
      if (request->start) {
        try {
          request->result.set_value(request->start());
        } catch (...) {
          request->result.set_exception(std::current_exception());
        }
        continue;
      }
      // Hold the registry while forking, so the child's snapshot is exact. The child never
      // touches the (copied, locked) mutex: it uses the set as it was at fork time.
      std::unique_lock<std::mutex> registry_lock(registry_mutex());
      const pid_t pid = ::fork();
      if (pid == 0) {
        // Output the parent buffered but had not written yet is the parent's to write.
        ::__fpurge(stdout);
        ::__fpurge(stderr);
        for (const int fd : registry()) {
          bool own = false;
          for (const auto& mine : request->close_after_fork) own = own || mine.get() == fd;
          if (!own) (void)::close(fd);
        }
        request->child_main();
        ::_exit(0);  // child_main must not return; never run the parent's atexit handlers
      }
      const int fork_errno = errno;
      for (const auto& fd : request->close_after_fork) registry().erase(fd.get());
      request->close_after_fork.clear();
      registry_lock.unlock();
      if (pid < 0) {
        request->result.set_exception(std::make_exception_ptr(std::system_error(
            fork_errno, std::generic_category(), "fork() of a DataLoader worker")));
      } else {
        request->result.set_value(pid);
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<ForkRequest*> queue_;
  std::thread thread_;
};

}  // namespace

void follow_parent(pid_t parent) noexcept {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (parent > 0 && ::getppid() != parent) ::_exit(0);
}

void register_parent_only_fd(int fd) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().insert(fd);
}

void unregister_parent_only_fd(int fd) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().erase(fd);
}

void close_parent_only_fd(ipc::UniqueFd fd) noexcept {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().erase(fd.get());
  worker_pidfds().erase(fd.get());
  fd.reset();
}

void register_worker_pidfd(int fd) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().insert(fd);
  worker_pidfds().insert(fd);
}

std::size_t signal_workers(int signal) noexcept {
  std::size_t sent = 0;
#ifdef SYS_pidfd_send_signal
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (const int fd : worker_pidfds()) {
    if (::syscall(SYS_pidfd_send_signal, fd, signal, nullptr, 0) == 0) ++sent;
  }
#else
  (void)signal;
#endif
  return sent;
}

std::pair<ipc::Channel, ipc::Channel> make_parent_only_pair() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto pair = ipc::Channel::pair();
  registry().insert(pair.first.fd());
  registry().insert(pair.second.fd());
  return pair;
}

WorkerChannels make_worker_channels() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto [main_index, worker_index] = ipc::Channel::pair();
  auto [main_data, worker_data] = ipc::Channel::pair();
  int err[2] = {-1, -1};
  if (::pipe2(err, O_CLOEXEC) != 0) {
    throw std::system_error(errno, std::generic_category(),
                            "pipe2 for a DataLoader worker's stderr");
  }
  WorkerChannels out{std::move(main_index),  std::move(main_data),  std::move(worker_index),
                     std::move(worker_data), ipc::UniqueFd(err[0]), ipc::UniqueFd(err[1])};
  for (const auto* c : {&out.main_index, &out.main_data, &out.worker_index, &out.worker_data}) {
    registry().insert(c->fd());
  }
  registry().insert(err[0]);
  registry().insert(err[1]);
  return out;
}

pid_t fork_worker(std::function<void()> child_main, std::vector<ipc::UniqueFd> close_after_fork) {
  return Forker::instance().fork(std::move(child_main), std::move(close_after_fork));
}

pid_t start_on_forker_thread(std::function<pid_t()> start) {
  return Forker::instance().start(std::move(start));
}

}  // namespace ferry::workers
