#pragma once

// The spawn and forkserver start methods, and what ferry::init does in a process that ferry
// started. A spawned worker is a fresh copy of a program (the user's, when it called
// ferry::init, or ferry-worker) that gets its two channel ends as descriptor numbers in argv,
// then its SetupMessage on the index channel: the dataset as configuration text, rebuilt here
// from the registry.

#include <sys/types.h>

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ferry/registry.h"

#include "ipc/channel.h"
#include "ipc/protocol.h"
#include "ipc/unique_fd.h"
#include "workers/worker_loop.h"

namespace ferry::workers {

inline constexpr const char* kSpawnedWorkerFlag = "--ferry-spawned-worker";
inline constexpr const char* kForkserverFlag = "--ferry-forkserver";

// Prints "ferry: MESSAGE" on stderr and exits 1 (a worker that cannot start).
[[noreturn]] void exit_with_message(const std::string& message);

// True once ferry::init ran in this process (not in a worker: there it never returns).
bool init_called() noexcept;

// This program, as /proc/self/exe names it (for messages and argv[0]; spawn itself runs
// "/proc/self/exe", the very file this process runs even if the path was replaced since).
std::string self_program();

// The ferry-worker program: $FERRY_WORKER_PROGRAM, else next to this program, else in the
// build tree, else in the install prefix. nullopt if none exists; `tried` lists the paths.
std::optional<std::string> find_ferry_worker(std::vector<std::string>& tried);

// Starts `program` (empty: this program, as /proc/self/exe) from the forker thread with
// arguments `flag`, the numbers `fds` got in the new process, and this process's pid; SIGINT
// blocked and every signal at its default. Throws ferry::Error naming `what` and the program.
// `stderr_fd` (when >= 0) becomes the new process's stderr. SIGUSR1 is blocked too, until the
// worker has its report handler (prepare_worker_process).
pid_t spawn_process(const std::string& program,
                    const char* flag,
                    std::span<const int> fds,
                    const char* what,
                    int stderr_fd = -1);

// Starts `program` (empty: this program) as a worker with the worker's channel ends, from the
// forker thread. Returns its pid. Throws ferry::Error naming the program when it cannot be started.
// Its arguments: the two channel ends and the status page's descriptor; `stderr_fd` becomes its
// stderr.
pid_t spawn_worker(
    const std::string& program, int index_fd, int data_fd, int status_fd, int stderr_fd);

// Asks this process's forkserver for a worker with these channel ends; the worker is a child
// of this process. Starts a forkserver first when this process has none (a forked copy of the
// process that called ferry::init spawns its own). Throws ferry::Error.
pid_t forkserver_worker(int index_fd, int data_fd, int status_fd, int stderr_fd);

// The forkserver's pid in this process, or -1 (tests exclude it when counting children).
pid_t forkserver_pid() noexcept;

// Reaps this process's forkserver if it has died (no zombie is left while only other start
// methods run); the next forkserver loader starts a fresh one. Called at every worker start.
void reap_dead_forkserver() noexcept;

// The SetupMessage that carries `spec`'s settings and the two configurations to a fresh worker,
// and the WorkerSpec (settings only; no dataset yet) a worker makes of it.
ipc::SetupMessage setup_message(const WorkerSpec& spec,
                                std::string dataset_config,
                                std::string collate_config);
WorkerSpec worker_spec(const ipc::SetupMessage& setup);

// In a spawned or forkserver worker: reads the SetupMessage, rebuilds the dataset (and
// collate) from `registry`, answers WorkerReadyMessage, and runs the worker loop. A failure
// is reported as a WorkerErrorMessage naming the type and key. Never returns.
// `status`: the worker's status page (may be invalid: none).
[[noreturn]] void serve_setup(const Registry& registry,
                              ipc::Channel index,
                              ipc::Channel data,
                              ipc::UniqueFd status);

// A spawned process starts with SIGINT blocked, so a Ctrl-C to the process group while it loads
// cannot kill it; this ignores SIGINT (Ctrl-C is the main process's decision) and unblocks it.
void ignore_sigint();

// ferry::init's work: in a process started as a worker or forkserver, serve and never return;
// otherwise remember that init ran and, if asked, fork the forkserver now, while the process
// is still single-threaded.
void init_process(int argc, char** argv, bool start_forkserver);

}  // namespace ferry::workers
