#pragma once

#include <sys/types.h>

#include <functional>
#include <vector>

#include "ipc/channel.h"
#include "ipc/unique_fd.h"

namespace ferry::workers {

// Descriptors of the main process that no worker may keep: the loader's ends of every channel,
// its wake-up eventfds, the pidfds of workers and of the forkserver, and the forkserver's control
// channel. A forked worker closes all of them first thing and keeps every other descriptor of the
// process (a dataset's open files, say, as fork promises), so a worker of loader B never holds
// loader A's channels open (A's workers would never see EOF) (RELIABILITY row 26).
void register_parent_only_fd(int fd);
void unregister_parent_only_fd(int fd);
// Unregisters and closes `fd` in one step, under the registry's lock, so no fork in between
// leaves a copy of it in a worker.
void close_parent_only_fd(ipc::UniqueFd fd) noexcept;
// A channel pair whose two ends are registered as parent-only from the start.
std::pair<ipc::Channel, ipc::Channel> make_parent_only_pair();

// A new worker's two channel pairs. All four ends are created and registered as parent-only
// in one step, under the registry's lock, so a fork for another loader in between inherits
// none of them. fork_worker() hands the worker's ends to the child and unregisters them.
struct WorkerChannels {
  ipc::Channel main_index, main_data;      // stay in this process (unregister before closing)
  ipc::Channel worker_index, worker_data;  // pass to fork_worker() as close_after_fork
  // The worker's stderr: a pipe whose read end this process relays (relay_worker_stderr) and
  // whose write end becomes the worker's descriptor 2.
  ipc::UniqueFd stderr_read, stderr_write;
};
WorkerChannels make_worker_channels();

// A worker's pidfd: parent-only, and signalled by signal_workers() until it is closed with
// close_parent_only_fd().
void register_worker_pidfd(int fd);
// Sends `signal` to every worker process of this process that has a pidfd (pidfd_send_signal,
// under the registry's lock, so never to a process reaped meanwhile); returns how many.
std::size_t signal_workers(int signal) noexcept;

// Forks a worker from one long-lived internal thread. PR_SET_PDEATHSIG fires when the thread
// that forked exits, so forking from the caller's thread would kill the workers of a loader
// created on a short-lived thread; forking from this thread makes the signal mean "the process
// died". The thread blocks every signal, so the child starts with all of them blocked (it
// unblocks them once set up). In the child: the parent-only descriptors are closed, then
// `child_main` runs and must not return; it keeps `close_after_fork` (its own channel ends) open.
// In the parent, those are unregistered and closed before any other fork can happen. Returns the
// child's pid; throws std::system_error.
pid_t fork_worker(std::function<void()> child_main, std::vector<ipc::UniqueFd> close_after_fork);

// In a process ferry started (a fork worker, the forkserver, a spawned worker), first thing:
// SIGKILL when the parent dies (PR_SET_PDEATHSIG), and the race closed: if `parent` (when > 0)
// died before that took effect, exit now. No worker outlives the process that started it.
void follow_parent(pid_t parent) noexcept;

// Runs `start` (which starts a process: posix_spawn of a worker or of a forkserver) on the same
// long-lived thread, for the same reason: the new process's parent-death signal must mean "the
// process died", not "the thread that started it ended". Returns what `start` returns; rethrows.
pid_t start_on_forker_thread(std::function<pid_t()> start);

}  // namespace ferry::workers
