#include "workers/forkserver.h"

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio_ext.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "ferry/error.h"
#include "ferry/registry.h"

#include "ipc/child_process.h"
#include "ipc/files.h"
#include "workers/forker.h"
#include "workers/spawn.h"

namespace ferry::workers {

namespace {

struct Server {
  pid_t owner = -1;  // the process this server works for
  ipc::Channel control;
  ipc::ChildProcess process;
};

// Leaked on purpose, as the forker's state: a copy of this process made by fork() gets a fresh
// mutex and no server (the parent's server works for the parent only).
std::mutex* g_mutex = nullptr;
Server* g_server = nullptr;

void reset_in_child() {
  g_mutex = new std::mutex;
  g_server = nullptr;  // the parent's; never touched here
}

std::mutex& server_mutex() {
  static const bool installed = [] {
    g_mutex = new std::mutex;
    ::pthread_atfork(nullptr, nullptr, reset_in_child);
    return true;
  }();
  (void)installed;
  return *g_mutex;
}

std::size_t thread_count() {
  std::error_code ec;
  return ipc::list_directory("/proc/self/task", ec).size();
}

void adopt(ipc::Channel control, pid_t pid) {
  register_parent_only_fd(control.fd());  // forked workers must not hold it
  g_server = new Server{::getpid(), std::move(control), ipc::ChildProcess(pid)};
  // Its pidfd too: a fork worker (of any loader) must not hold the forkserver's pidfd.
  if (g_server->process.pidfd() >= 0) register_parent_only_fd(g_server->process.pidfd());
}

// A fresh copy of this program that turns into a server in ferry::init.
void spawn_server() {
  FERRY_CHECK(init_called(),
              "start_method=forkserver needs ferry::init(argc, argv) called first "
              "thing in main (it starts the fork server); or use start_method=spawn or fork");
  auto [mine, theirs] = make_parent_only_pair();
  const int fd = theirs.fd();
  const pid_t pid = spawn_process("", kForkserverFlag, {&fd, 1}, "the forkserver");
  close_parent_only_fd(theirs.release());
  adopt(std::move(mine), pid);
}

// One request to the server: the worker's pid, or 0 with `error` set (the server's errno), or
// -1 if the server was gone before the request reached it (safe to ask another server), or
// -2 if it took the request and did not answer (not safe: it may have started a worker).
pid_t request(Server& server, int index_fd, int data_fd, int status_fd, int stderr_fd, int& error) {
  const std::byte ask[1] = {std::byte{1}};
  const int fds[4] = {index_fd, data_fd, status_fd, stderr_fd};
  const auto deadline = ipc::Clock::now() + std::chrono::seconds(5);
  if (server.control.send(ask, fds, deadline) != ipc::Channel::SendResult::kSent) return -1;
  pollfd p{server.control.fd(), POLLIN, 0};
  for (;;) {
    const int rc = ::poll(&p, 1, 5000);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return -2;
    break;
  }
  std::vector<std::byte> reply;
  std::vector<ipc::UniqueFd> ignored;
  if (!server.control.receive(reply, ignored) || reply.size() != sizeof(std::int64_t)) return -2;
  std::int64_t value = 0;
  std::memcpy(&value, reply.data(), sizeof value);
  if (value < 0) {
    error = static_cast<int>(-value);
    return 0;
  }
  return static_cast<pid_t>(value);
}

}  // namespace

void run_forkserver(ipc::Channel control, pid_t parent) {
  ::signal(SIGINT, SIG_IGN);  // Ctrl-C is the main process's decision
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGUSR1, SIG_IGN);  // a report request to the process group is for the workers
  ::prctl(PR_SET_NAME, "ferry-forksrv");
  ::__fpurge(stdout);  // output the program buffered before ferry::init is its own to write
  ::__fpurge(stderr);
  // The raw clone below skips glibc's fork-time resets, which only a single-threaded process
  // can do without (code before ferry::init that started a thread breaks that).
  const bool single_threaded = thread_count() == 1;
  std::vector<std::byte> bytes;
  std::vector<ipc::UniqueFd> fds;
  for (;;) {
    fds.clear();
    bool got = false;
    try {
      got = control.receive(bytes, fds);
    } catch (...) {
      ::_exit(1);
    }
    if (!got) ::_exit(0);  // the loader's process closed its end or died
    std::int64_t reply = single_threaded ? -EINVAL : -ENOTSUP;
    if (fds.size() == 4 && single_threaded) {
      // A raw clone: fork() has no CLONE_PARENT. This process is single-threaded, so the
      // child needs none of glibc's fork-time resets.
      const long pid = ::syscall(SYS_clone, CLONE_PARENT | SIGCHLD, nullptr, nullptr, nullptr, 0);
      if (pid == 0) {
        control.close();
        ::signal(SIGPIPE, SIG_DFL);
        ::__fpurge(stdout);
        ::__fpurge(stderr);
        ::prctl(PR_SET_NAME, "ferry-worker");
        if (fds[3].get() != STDERR_FILENO) {  // its stderr: the pipe the loader relays
          ::dup2(fds[3].get(), STDERR_FILENO);
          fds[3].reset();
        } else {
          (void)fds[3].release();
        }
        serve_setup(Registry::global(), ipc::Channel(std::move(fds[0])),
                    ipc::Channel(std::move(fds[1])), std::move(fds[2]));
      }
      reply = pid < 0 ? -static_cast<std::int64_t>(errno) : pid;
    }
    fds.clear();
    const auto* p = reinterpret_cast<const std::byte*>(&reply);
    if (control.send(std::span<const std::byte>(p, sizeof reply), {},
                     ipc::Clock::now() + std::chrono::seconds(5)) !=
        ipc::Channel::SendResult::kSent) {
      ::_exit(0);
    }
    (void)parent;
  }
}

void start_forkserver_now() {
  std::lock_guard<std::mutex> lock(server_mutex());
  if (g_server != nullptr || thread_count() > 1) return;  // threads: a fork is not clean
  auto [mine, theirs] = ipc::Channel::pair();
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    mine.close();
    follow_parent(parent);
    run_forkserver(std::move(theirs), parent);
  }
  if (pid < 0) return;  // the first forkserver loader spawns one instead
  theirs.close();
  adopt(std::move(mine), pid);
}

// Stops (if need be), reaps and forgets this process's server. Under server_mutex().
static void drop_server() noexcept {
  close_parent_only_fd(g_server->control.release());
  (void)g_server->process.terminate(std::chrono::milliseconds(0));
  close_parent_only_fd(g_server->process.take_pidfd());
  delete g_server;
  g_server = nullptr;
}

pid_t forkserver_worker(int index_fd, int data_fd, int status_fd, int stderr_fd) {
  std::lock_guard<std::mutex> lock(server_mutex());
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (g_server == nullptr || g_server->owner != ::getpid()) {
      g_server = nullptr;  // a copy of our parent's, after fork(): not ours to use
      spawn_server();
    }
    int error = 0;
    const pid_t pid = request(*g_server, index_fd, data_fd, status_fd, stderr_fd, error);
    if (pid > 0) return pid;
    const pid_t server = g_server->process.pid();
    if (pid == 0) {
      throw Error(detail::str(
          "the forkserver (pid ", server, ") could not fork a DataLoader worker: ",
          error == ENOTSUP ? "it is not single-threaded (code before ferry::init started a "
                             "thread); call ferry::init first thing in main"
                           : std::strerror(error)));
    }
    // The server died or hung: reap it. Ask a fresh one only if this one never took the
    // request; otherwise it may have started a worker on these channel ends.
    drop_server();
    if (pid == -2) {
      throw Error(detail::str("the forkserver (pid ", server,
                              ") took a request for a DataLoader worker and did not answer "
                              "within 5 s; it was killed. Retry, or use start_method=spawn"));
    }
  }
  throw Error(
      "the forkserver was gone twice in a row; DataLoader workers cannot start (use "
      "start_method=spawn or fork)");
}

void reap_dead_forkserver() noexcept {
  std::lock_guard<std::mutex> lock(server_mutex());
  if (g_server == nullptr || g_server->owner != ::getpid()) return;
  if (g_server->process.try_wait()) drop_server();
}

pid_t forkserver_pid() noexcept {
  std::lock_guard<std::mutex> lock(server_mutex());
  return g_server != nullptr && g_server->owner == ::getpid() ? g_server->process.pid() : -1;
}

}  // namespace ferry::workers
